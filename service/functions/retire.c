/*
 * retire.c - what makes a function's tables shrink again: DeleteFunction,
 * DeleteProducer and the idle expiry of producers (DESIGN.md section 8:
 * every table a client can grow can also be shrunk).
 *
 * DeleteFunction, in order (each step leaves nothing pointing at the
 * function for the next):
 *
 *   the active step  --kf__step_abort--> refused ABORTED, rolled back
 *   queued batches   --kf__push_release_queued--> ABORTED
 *   remote workers   --kf__remote_close_function--> streams end NOT_FOUND
 *   parked reads, pending output --kf__output_forget--> NOT_FOUND
 *   the due list     --kf__due_unlink
 *   the store        one atomic write: the descriptor, the checkpoint, and a
 *                    range delete per family over the function's index
 *                    prefix (state, timers, output, marks, producers)
 *   memory           out of the table, kf__fn_free
 *
 * Invariants
 *   1. A function's index is never reused (registry.c), so a range delete
 *      over its prefix deletes exactly its records, and a function
 *      registered again under the same id (a new index) never sees them.
 *   2. The delete is one write with the function's records: after a crash
 *      the function is either all there or all gone.
 *   3. A function's producers are in a list by last use, oldest first
 *      (kf__producer_touch moves one to the end), so expiry looks only at
 *      the oldest of each function.
 *
 * Engine-thread only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/metrics.h"
#include "functions/functions_int.h"

/* ---- producers by last use --------------------------------------------- */

static bool producer_linked(const function_t *fn, const producer_t *p) {
    return p->older != NULL || fn->oldest_producer == p;
}

static void producer_unlink(function_t *fn, producer_t *p) {
    if (!producer_linked(fn, p)) {
        return;
    }
    if (p->older != NULL) {
        p->older->newer = p->newer;
    } else {
        fn->oldest_producer = p->newer;
    }
    if (p->newer != NULL) {
        p->newer->older = p->older;
    } else {
        fn->newest_producer = p->older;
    }
    p->older = p->newer = NULL;
}

static void producer_append(function_t *fn, producer_t *p) {
    p->older = fn->newest_producer;
    p->newer = NULL;
    if (fn->newest_producer != NULL) {
        fn->newest_producer->newer = p;
    } else {
        fn->oldest_producer = p;
    }
    fn->newest_producer = p;
}

void kf__producer_touch(function_t *fn, producer_t *p, int64_t now_ms) {
    producer_unlink(fn, p);
    p->last_used_ms = now_ms;
    producer_append(fn, p);
}

void kf__producer_free(function_t *fn, producer_t *p) {
    producer_unlink(fn, p);
    kf_map_remove(&fn->producers, &p->node);
    for (uint32_t i = 0; i < p->nacks; i++) {
        free(p->ack[i]);
    }
    free(p->id);
    free(p);
}

static int by_last_use(const void *a, const void *b) {
    const producer_t *x = *(producer_t *const *)a, *y = *(producer_t *const *)b;
    return x->last_used_ms < y->last_used_ms ? -1 : x->last_used_ms > y->last_used_ms;
}

void kf__producers_recovered(function_t *fn, int64_t now_ms) {
    size_t n = fn->producers.count, i = 0, b;
    if (n == 0) {
        return;
    }
    producer_t **all = kf_xmalloc(n * sizeof *all);
    for (kf_map_node_t *m = kf_map_first(&fn->producers, &b); m;
         m = kf_map_next(&fn->producers, &b, m)) {
        producer_t *p = KF_CONTAINER_OF(m, producer_t, node);
        if (p->last_used_ms == 0) {
            p->last_used_ms = now_ms; /* stored before expiry: idle from this start */
        }
        all[i++] = p;
    }
    qsort(all, n, sizeof *all, by_last_use);
    fn->oldest_producer = fn->newest_producer = NULL;
    for (i = 0; i < n; i++) {
        all[i]->older = all[i]->newer = NULL;
        producer_append(fn, all[i]);
    }
    free(all);
}

/* Deletes a producer's record and forgets it. */
static void producer_delete(kf_ctx_t *ctx, function_t *fn, producer_t *p) {
    kf_key_t k;
    kf__key_prefix(&k, fn);
    kf_key_raw(&k, p->id, strlen(p->id));
    kf_ctx_delete(ctx, KF_CF_PRODUCERS, &k);
    kf__producer_free(fn, p);
}

uint32_t kf__producers_expire(kf_functions_t *fns, kf_ctx_t *ctx, uint32_t limit) {
    int64_t expiry = fns->config->producer_idle_expiry_ms > 0 ? fns->config->producer_idle_expiry_ms
                                                              : KF_PRODUCER_IDLE_EXPIRY_MS_DEFAULT;
    uint32_t expired = 0;
    size_t b;
    for (kf_map_node_t *n = kf_map_first(&fns->by_id, &b); n != NULL && expired < limit;
         n = kf_map_next(&fns->by_id, &b, n)) {
        function_t *fn = KF_CONTAINER_OF(n, function_t, node);
        producer_t *p;
        while (expired < limit && (p = fn->oldest_producer) != NULL &&
               kf_time_add_sat(p->last_used_ms, expiry) <= ctx->now_ms) {
            kf_log_kv(KF_LOG_DEBUG, "functions", "producer expired",
                      KF_LOG_STR("function_id", fn->id), KF_LOG_STR("producer_id", p->id),
                      KF_LOG_INT("last_sequence", p->last_sequence));
            producer_delete(ctx, fn, p);
            expired++;
        }
    }
    if (expired > 0) {
        kf_counter_add(KF_C_PRODUCERS_EXPIRED, expired);
    }
    return expired;
}

/* ---- DeleteProducer ---------------------------------------------------- */

void kf_functions_delete_producer(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__DeleteProducerRequest *req =
        (const Keyflow__V1__DeleteProducerRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    function_t *fn = kf__fn_require(fns, req->function_id, err);
    if (fn == NULL) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (req->producer_id[0] == '\0') {
        kf_error_set(err, KF_E_INVALID, "producer_id: required");
        kf_ctx_fail(ctx, cmd);
        return;
    }
    Keyflow__V1__DeleteProducerResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__delete_producer_response__init(resp);
    producer_t *p = kf__producer_get(fn, req->producer_id, false);
    if (p == NULL && !req->allow_missing) {
        kf_error_set(err, KF_E_NOT_FOUND, "producer_id: function %s has no producer %.128s", fn->id,
                     req->producer_id);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (p != NULL) {
        resp->deleted = true;
        resp->last_sequence = p->last_sequence;
        producer_delete(ctx, fn, p);
    }
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

/* ---- DeleteFunction ---------------------------------------------------- */

/* One write deletes every record of the function (invariant 2). */
static void delete_records(kf_ctx_t *ctx, const function_t *fn) {
    static const kf_cf_t by_prefix[] = {
        KF_CF_STATE,        KF_CF_TIMERS_BY_TIME, KF_CF_TIMERS_BY_KEY, KF_CF_OUTPUT,
        KF_CF_OUTPUT_MARKS, KF_CF_PRODUCERS,      KF_CF_CHECKPOINTS,
    };
    kf_key_t begin, end;
    kf__key_prefix(&begin, fn);
    bool bounded = kf_key_prefix_end(&begin, &end);
    KF_ASSERT(bounded); /* an index below UINT32_MAX (registry.c) */
    for (size_t i = 0; i < sizeof by_prefix / sizeof by_prefix[0]; i++) {
        kf_ctx_delete_range(ctx, by_prefix[i], &begin, &end);
    }
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_raw(&k, fn->id, strlen(fn->id));
    kf_ctx_delete(ctx, KF_CF_FUNCTIONS, &k);
}

/* Ends everything in flight on the function before it is freed. */
static void release_function(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn) {
    char aborted[KF_ERROR_MESSAGE_BYTES_MAX], gone[KF_ERROR_MESSAGE_BYTES_MAX];
    snprintf(aborted, sizeof aborted, "function %s was deleted; nothing of this batch applied",
             fn->id);
    snprintf(gone, sizeof gone, "function_id: %s was deleted", fn->id);
    kf__step_abort(fns, ctx, fn, KF_E_ABORTED, aborted);
    kf__push_release_queued(ctx, fn, KF_E_ABORTED, aborted);
    kf__remote_close_function(fns, ctx, fn, KF_E_NOT_FOUND, gone);
    kf__output_forget(fns, ctx, fn, KF_E_NOT_FOUND, gone);
    kf__due_unlink(fns, fn);
    kf__replay_forget(fns, fn);
    KF_ASSERT(fn->active == NULL && fn->queue_head == NULL && fn->readers == NULL &&
              fn->workers == NULL);
}

void kf_functions_delete(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__DeleteFunctionRequest *req =
        (const Keyflow__V1__DeleteFunctionRequest *)cmd->request;
    Keyflow__V1__DeleteFunctionResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__delete_function_response__init(resp);
    function_t *fn = kf__fn_require(fns, req->function_id, &cmd->error);
    if (fn == NULL) {
        if (cmd->error.status == KF_E_NOT_FOUND && req->allow_missing) {
            kf_error_clear(&cmd->error);
            cmd->response = &resp->base;
            kf_ctx_ready(ctx, cmd);
            return;
        }
        kf_ctx_fail(ctx, cmd);
        return;
    }
    release_function(fns, ctx, fn);
    resp->deleted = true;
    resp->keys = (int64_t)fn->live_keys;
    resp->timers = (int64_t)fn->timer_count;
    resp->output_rows = (int64_t)(fn->output_seq - fn->trimmed_seq);
    resp->producers = (int64_t)fn->producers.count;
    delete_records(ctx, fn);
    kf_log_kv(KF_LOG_INFO, "functions", "function deleted", KF_LOG_STR("function_id", fn->id),
              KF_LOG_STR("descriptor_sha256", fn->sha256), KF_LOG_INT("keys", resp->keys),
              KF_LOG_INT("output_rows", resp->output_rows));
    kf_map_remove(&fns->by_id, &fn->node);
    kf_gauge_set(KF_G_FUNCTIONS, (int64_t)fns->by_id.count);
    kf__fn_free(fn);
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}
