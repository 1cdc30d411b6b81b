/* ctx.c - helpers shared by the modules of one engine step. */
#include "engine/ctx.h"

#include <stdlib.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/bytes.h"
#include "base/metrics.h"

void kf_ctx_ready(kf_ctx_t *ctx, kf_cmd_t *cmd) {
    cmd->next = NULL;
    if (ctx->ready_tail) {
        ctx->ready_tail->next = cmd;
    } else {
        ctx->ready_head = cmd;
    }
    ctx->ready_tail = cmd;
}

void kf_ctx_fail(kf_ctx_t *ctx, kf_cmd_t *cmd) {
    KF_ASSERT(cmd->error.status != KF_OK);
    cmd->response = NULL;
    kf_ctx_ready(ctx, cmd);
}

void kf_ctx_put(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *key, const void *value, size_t len) {
    kf_batch_put(ctx->batch, cf, key->bytes, key->len, value, len);
}

void kf_ctx_delete(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *key) {
    kf_batch_delete(ctx->batch, cf, key->bytes, key->len);
}

void kf_ctx_delete_range(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *begin, const kf_key_t *end) {
    kf_batch_delete_range(ctx->batch, cf, begin->bytes, begin->len, end->bytes, end->len);
}

size_t kf_ctx_put_msg(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *key, const ProtobufCMessage *msg) {
    size_t len = protobuf_c_message_get_packed_size(msg);
    if (len > ctx->scratch_cap) {
        size_t cap = ctx->scratch_cap ? ctx->scratch_cap : 4096;
        while (cap < len) {
            cap *= 2;
        }
        uint8_t *p = kf_xrealloc(ctx->scratch, cap);
        ctx->scratch = p;
        ctx->scratch_cap = cap;
    }
    size_t packed = protobuf_c_message_pack(msg, ctx->scratch);
    KF_ASSERT(packed == len);
    kf_batch_put(ctx->batch, cf, key->bytes, key->len, ctx->scratch, len);
    return len;
}

void kf_ctx_wakeup_move(kf_ctx_t *ctx, kf_timer_t *timer, kf_wakeup_type_t type,
                        const void *identity, size_t identity_len, int64_t *stored_due_ms,
                        int64_t new_due_ms) {
    kf_key_t k;
    if (*stored_due_ms == new_due_ms) {
        if (new_due_ms == KF_NO_WAKEUP) {
            kf_heap_disarm(&ctx->heap, timer);
        } else if (!kf_timer_armed(timer) || timer->due_ms != new_due_ms) {
            kf_heap_arm(&ctx->heap, timer, new_due_ms);
        }
        return;
    }
    if (type == KF_WAKEUP_COORDINATOR) {
        /* Keyed by the coordinator: one put moves it, one delete removes it.
         * A stored wake-up may be earlier than the in-memory due time (it
         * then fires early after a restart and is re-armed), so a due time
         * that only moves later - every debounce event - writes nothing.
         * Nor does it move the in-memory timer while that is still at or
         * before the new due time: it fires early, the coordinator sees
         * its window is not due yet and settles again (one re-arm per
         * window_ms instead of a heap update per event). */
        kf_key_wakeup(&k, 0, type, identity, identity_len);
        if (new_due_ms != KF_NO_WAKEUP && *stored_due_ms != KF_NO_WAKEUP &&
            *stored_due_ms <= new_due_ms && *stored_due_ms > ctx->now_ms) {
            if (!kf_timer_armed(timer) || timer->due_ms > new_due_ms) {
                kf_heap_arm(&ctx->heap, timer, new_due_ms);
            }
            return;
        }
        if (new_due_ms != KF_NO_WAKEUP) {
            uint8_t v[8];
            kf_put_be64(v, kf_i64_ordered(new_due_ms));
            kf_batch_put(ctx->batch, KF_CF_WAKEUPS, k.bytes, k.len, v, sizeof v);
        } else {
            kf_batch_delete(ctx->batch, KF_CF_WAKEUPS, k.bytes, k.len);
        }
    } else {
        if (*stored_due_ms != KF_NO_WAKEUP) {
            kf_key_wakeup(&k, *stored_due_ms, type, identity, identity_len);
            kf_batch_delete(ctx->batch, KF_CF_WAKEUPS, k.bytes, k.len);
        }
        if (new_due_ms != KF_NO_WAKEUP) {
            kf_key_wakeup(&k, new_due_ms, type, identity, identity_len);
            kf_batch_put(ctx->batch, KF_CF_WAKEUPS, k.bytes, k.len, "", 0);
        }
    }
    if (new_due_ms != KF_NO_WAKEUP) {
        kf_heap_arm(&ctx->heap, timer, new_due_ms);
    } else {
        kf_heap_disarm(&ctx->heap, timer);
    }
    *stored_due_ms = new_due_ms;
}

kf_status_t kf_ctx_admit(kf_ctx_t *ctx, uint64_t bytes, const char *what, kf_error_t *err) {
    kf_status_t st = kf_ctx_memory_check(ctx, bytes, what, err);
    if (st == KF_OK) {
        ctx->memory.used_bytes += bytes;
    }
    return st;
}

kf_status_t kf_ctx_memory_check(const kf_ctx_t *ctx, uint64_t bytes, const char *what,
                                kf_error_t *err) {
    const kf_memory_t *m = &ctx->memory;
    if (m->budget_bytes == 0 || m->used_bytes + bytes <= m->budget_bytes) {
        return KF_OK;
    }
    kf_counter_add(KF_C_REJECTED_MEMORY_BUDGET, 1);
    return kf_error_set(err, KF_E_LIMIT,
                        "memory budget: %s would take the engine's tables past --memory-budget "
                        "%llu bytes (%llu in use); existing windows, runs and keys keep working",
                        what, (unsigned long long)m->budget_bytes,
                        (unsigned long long)m->used_bytes);
}
