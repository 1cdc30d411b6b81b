/*
 * memory.c - what process functions hold in memory, as the memory budget
 * counts it (step/ctx.h, kf_memory_t; docs/semantics.md, "Memory
 * budget"), and the admission of new functions, producers and keys.
 *
 * Estimates, each allocation with malloc's 16-byte header: a function is
 * its struct, its descriptor's arena and about 1 KiB of host and maps; a
 * key is its struct, its canonical key and key text (state_bytes counts
 * the canonical key, so twice state_bytes covers both and the values), and
 * map slots; a timer is its struct; a producer is its struct, its ID and
 * its kept acknowledgements (about 64 bytes each).
 *
 * Engine-thread only.
 */
#include "functions/functions_int.h"

#define FUNCTION_BYTES (sizeof(function_t) + 1024)
#define KEY_BYTES      (sizeof(fn_key_t) + 3 * 16 + 2 * sizeof(void *))
#define TIMER_BYTES    (sizeof(ev_timer_t) + 16)
#define PRODUCER_BYTES (sizeof(producer_t) + 2 * 16 + 64 + KF_PRODUCER_ACKS_KEPT * (16 + 64))

static uint64_t function_bytes(const function_t *fn) {
    return FUNCTION_BYTES + fn->arena.used_bytes + fn->live_keys * KEY_BYTES + 2 * fn->state_bytes +
           fn->timer_count * TIMER_BYTES + fn->producers.count * PRODUCER_BYTES;
}

uint64_t kf_functions_memory_bytes(const kf_functions_t *fns) {
    uint64_t total = 0;
    size_t b;
    for (kf_map_node_t *n = kf_map_first(&fns->by_id, &b); n != NULL;
         n = kf_map_next(&fns->by_id, &b, n)) {
        total += function_bytes(KF_CONTAINER_OF(n, function_t, node));
    }
    return total;
}

kf_status_t kf__fn_admit(kf_ctx_t *ctx, size_t descriptor_bytes, kf_error_t *err) {
    /* The descriptor's arena holds the canonical descriptor, about twice
     * its encoding. */
    return kf_ctx_admit(ctx, FUNCTION_BYTES + 2 * descriptor_bytes, "a new function", err);
}

kf_status_t kf__producer_admit(kf_ctx_t *ctx, kf_error_t *err) {
    return kf_ctx_admit(ctx, PRODUCER_BYTES, "a new producer", err);
}

/* What the step added, when it added keys (the budget admits new keys;
 * a step that only changes existing ones always goes through). */
uint64_t kf__step_memory_growth(const step_t *s) {
    const function_t *fn = s->fn;
    if (fn->live_keys <= s->live_keys0) {
        return 0;
    }
    uint64_t bytes = (fn->live_keys - s->live_keys0) * KEY_BYTES;
    if (fn->state_bytes > s->state_bytes0) {
        bytes += 2 * (fn->state_bytes - s->state_bytes0);
    }
    if (fn->timer_count > s->timer_count0) {
        bytes += (fn->timer_count - s->timer_count0) * TIMER_BYTES;
    }
    return bytes;
}

kf_status_t kf__step_memory_check(const step_t *s) {
    uint64_t bytes = kf__step_memory_growth(s);
    return bytes > 0 ? kf_ctx_memory_check(s->ctx, bytes, "new keys", s->err) : KF_OK;
}

void kf__step_memory_commit(step_t *s) {
    s->ctx->memory.used_bytes += kf__step_memory_growth(s);
}
