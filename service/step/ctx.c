/* ctx.c - helpers shared by the modules of one engine step, and the one
 * function of the vocabulary (engine_types.h). */
#include "step/ctx.h"

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

static bool staged(const kf_ctx_t *ctx, kf_cf_t cf) {
    return ctx->overlay != NULL && kf_overlay_tracks(ctx->overlay, cf);
}

void kf_ctx_put(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *key, const void *value, size_t len) {
    kf_batch_put(ctx->batch, cf, key->bytes, key->len, value, len);
    if (staged(ctx, cf)) {
        kf_overlay_put(ctx->overlay, ctx->group_id, cf, key->bytes, key->len, value, len);
    }
}

void kf_ctx_delete(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *key) {
    kf_batch_delete(ctx->batch, cf, key->bytes, key->len);
    if (staged(ctx, cf)) {
        kf_overlay_delete(ctx->overlay, ctx->group_id, cf, key->bytes, key->len);
    }
}

void kf_ctx_delete_range(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *begin, const kf_key_t *end) {
    KF_ASSERT(!staged(ctx, cf)); /* the overlay stages prefix deletes only */
    kf_batch_delete_range(ctx->batch, cf, begin->bytes, begin->len, end->bytes, end->len);
}

void kf_ctx_delete_prefix(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *prefix) {
    kf_key_t end;
    bool has_end = kf_key_prefix_end(prefix, &end);
    KF_ASSERT(has_end); /* callers' prefixes are never all 0xff */
    kf_batch_delete_range(ctx->batch, cf, prefix->bytes, prefix->len, end.bytes, end.len);
    if (staged(ctx, cf)) {
        kf_overlay_delete_prefix(ctx->overlay, ctx->group_id, cf, prefix->bytes, prefix->len);
    }
}

kf_status_t kf_ctx_get(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *key, kf_value_t *value,
                       bool *found, kf_error_t *err) {
    if (ctx->overlay == NULL) {
        return kf_store_get(ctx->store, cf, key->bytes, key->len, value, found, err);
    }
    return kf_overlay_get(ctx->overlay, cf, key->bytes, key->len, value, found, err);
}

kf_status_t kf_ctx_iter_create(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *lower,
                               const kf_key_t *upper, kf_iter_t **out, kf_error_t *err) {
    const void *lo = lower ? lower->bytes : NULL, *up = upper ? upper->bytes : NULL;
    size_t lo_len = lower ? lower->len : 0, up_len = upper ? upper->len : 0;
    if (ctx->overlay == NULL) {
        return kf_iter_create(ctx->store, cf, lo, lo_len, up, up_len, out, err);
    }
    return kf_overlay_iter_create(ctx->overlay, cf, lo, lo_len, up, up_len, out, err);
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
    kf_ctx_put(ctx, cf, key, ctx->scratch, len);
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
    KF_ASSERT(type == KF_WAKEUP_RUN); /* coordinators keep their own (coord_index) */
    if (*stored_due_ms != KF_NO_WAKEUP) {
        kf_key_wakeup(&k, *stored_due_ms, type, identity, identity_len);
        kf_batch_delete(ctx->batch, KF_CF_WAKEUPS, k.bytes, k.len);
    }
    if (new_due_ms != KF_NO_WAKEUP) {
        kf_key_wakeup(&k, new_due_ms, type, identity, identity_len);
        kf_batch_put(ctx->batch, KF_CF_WAKEUPS, k.bytes, k.len, "", 0);
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

bool kf_ctx_disk_room_left(const kf_ctx_t *ctx) {
    return kf_batch_bytes(ctx->batch) < ctx->disk_room_bytes;
}

kf_status_t kf_ctx_memory_check(const kf_ctx_t *ctx, uint64_t bytes, const char *what,
                                kf_error_t *err) {
    const kf_memory_t *m = &ctx->memory;
    if (m->budget_bytes == 0 || m->used_bytes + bytes <= m->budget_bytes) {
        return KF_OK;
    }
    kf_counter_add(KF_C_REJECTED_MEMORY_BUDGET, 1);
    const kf_engine_config_t *c = ctx->config;
    if (c != NULL && c->memory_budget_partitions > 1) {
        return kf_error_set(
            err, KF_E_LIMIT,
            "memory budget: %s would take this partition's tables past its share of "
            "--memory-budget %llu bytes, %llu bytes for each of the %u partitions this process "
            "serves (%llu in use); existing windows, runs and keys keep working",
            what, (unsigned long long)c->memory_budget_process_bytes,
            (unsigned long long)m->budget_bytes, c->memory_budget_partitions,
            (unsigned long long)m->used_bytes);
    }
    return kf_error_set(err, KF_E_LIMIT,
                        "memory budget: %s would take the engine's tables past --memory-budget "
                        "%llu bytes (%llu in use); existing windows, runs and keys keep working",
                        what, (unsigned long long)m->budget_bytes,
                        (unsigned long long)m->used_bytes);
}

void kf_worker_event_free(kf_worker_event_t *ev) {
    if (ev == NULL) {
        return;
    }
    if (ev->message != NULL) {
        protobuf_c_message_free_unpacked(ev->message, NULL);
    }
    free(ev);
}
