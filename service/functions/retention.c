/*
 * retention.c - output retention: which of a function's output rows are
 * kept, TrimOutput, and the sweep that deletes the rest.
 *
 * Two points on a function's output stream split it in three:
 *
 *   1 ........ purged_seq ........ trimmed_seq ........ output_seq
 *   deleted from disk    | gone for readers | retained (readable)
 *
 * Invariants
 *   1. purged_seq <= trimmed_seq <= durable_output_seq; neither ever goes
 *      back. Both are in the function's checkpoint with retained_bytes,
 *      written in the same batch as the deletes they describe, so a crash
 *      finds them agreeing with the disk.
 *   2. Every chunk has a mark (output_marks, under the chunk's key) written
 *      in the same batch: when its step was written, its stored bytes and
 *      its rows. Retention reads marks, never chunks. Chunks written before
 *      marks existed have none: a gap before the first mark counts as one
 *      chunk of unknown age (no age bound takes it) and no bytes.
 *   3. Trimming is logical first: TrimOutput and the row bound move
 *      trimmed_seq at once (reads below it are OUT_OF_RANGE from then on).
 *      Deleting is the sweep's: it walks marks from purged_seq, at most
 *      KF_OUTPUT_TRIM_CHUNKS_PER_TURN per turn over all functions, takes
 *      every whole chunk before trimmed_seq, past the age bound or over the
 *      byte bound, and deletes them with one range delete per family: the
 *      write is the same size whatever it deletes, and reads that start
 *      after the range never walk its tombstones.
 */
#include <inttypes.h>
#include <string.h>

#include "base/bytes.h"
#include "base/log.h"
#include "functions/functions_int.h"

#define MARK_BYTES       20 /* written_ms be64 | bytes be64 | rows be32 */
#define OUTPUT_KEY_BYTES 12 /* prefix be32 | last_seq be64 */

void kf__output_retention(const kf_functions_t *fns, const function_t *fn, kf_retention_t *out) {
    kf_retention_t server = {KF_OUTPUT_RETENTION_MS_DEFAULT, 0, 0};
    if (fns->config != NULL && fns->config->output_retention_set) {
        server = fns->config->output_retention;
    }
    kf_descriptor_retention(fn->desc, &server, out);
}

static void output_key(kf_key_t *k, const function_t *fn, uint64_t seq) {
    kf__key_prefix(k, fn);
    kf_key_be64(k, seq);
}

void kf__output_put_chunk(kf_ctx_t *ctx, function_t *fn, const Keyflow__V1__RowBatch *chunk,
                          uint32_t rows) {
    kf_key_t k;
    output_key(&k, fn, fn->output_seq);
    size_t bytes = kf_ctx_put_msg(ctx, KF_CF_OUTPUT, &k, &chunk->base);
    uint8_t mark[MARK_BYTES];
    kf_put_be64(mark, (uint64_t)ctx->now_ms);
    kf_put_be64(mark + 8, bytes);
    kf_put_be32(mark + 16, rows);
    kf_ctx_put(ctx, KF_CF_OUTPUT_MARKS, &k, mark, sizeof mark);
    fn->retained_bytes += bytes;
}

kf_status_t kf__output_check_range(const function_t *fn, int64_t after_seq, kf_cmd_t *cmd) {
    if ((uint64_t)after_seq >= fn->trimmed_seq) {
        return KF_OK;
    }
    cmd->resume_after_seq = (int64_t)fn->trimmed_seq;
    return kf_error_set(&cmd->error, KF_E_RANGE,
                        "after_seq: %" PRId64 " is before the retained output of %s: rows up to "
                        "%" PRIu64 " were trimmed; the first retained sequence is %" PRIu64,
                        after_seq, fn->id, fn->trimmed_seq, fn->trimmed_seq + 1);
}

/* ---- TrimOutput -------------------------------------------------------- */

void kf_functions_trim(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__TrimOutputRequest *req =
        (const Keyflow__V1__TrimOutputRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    function_t *fn = kf__fn_require(fns, req->function_id, err);
    if (fn == NULL) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (req->before_seq < 0) {
        kf_error_set(err, KF_E_INVALID, "before_seq: must not be negative, got %" PRId64,
                     req->before_seq);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    /* A consumer commits a position it has read: at most the last durable
     * row + 1 (everything read). */
    if ((uint64_t)req->before_seq > fn->durable_output_seq + 1) {
        kf_error_set(err, KF_E_RANGE,
                     "before_seq: %" PRId64 " is past the output of %s (its last row is %" PRIu64
                     "; at most %" PRIu64 ")",
                     req->before_seq, fn->id, fn->durable_output_seq, fn->durable_output_seq + 1);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (req->before_seq > 0 && (uint64_t)req->before_seq - 1 > fn->trimmed_seq) {
        fn->trimmed_seq = (uint64_t)req->before_seq - 1; /* the sweep deletes them */
        kf__put_checkpoint(ctx, fn);
    }
    Keyflow__V1__TrimOutputResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__trim_output_response__init(resp);
    resp->first_retained_seq = (int64_t)fn->trimmed_seq + 1;
    resp->output_seq = (int64_t)fn->durable_output_seq;
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

/* ---- the sweep --------------------------------------------------------- */

typedef struct chunk_mark {
    uint64_t last;
    uint64_t first;
    int64_t written_ms;
    uint64_t bytes;
} chunk_mark_t;

/* Whether the chunk goes: wholly before the trim point, older than the age
 * bound, or the oldest while the retained bytes pass the byte bound. */
static bool chunk_expired(const function_t *fn, const kf_retention_t *r, int64_t now_ms,
                          uint64_t target, const chunk_mark_t *m) {
    if (m->last <= target) {
        return true;
    }
    if (r->max_age_ms > 0 && kf_time_add_sat(m->written_ms, r->max_age_ms) <= now_ms) {
        return true;
    }
    return r->max_bytes > 0 && fn->retained_bytes > (uint64_t)r->max_bytes;
}

static bool decode_mark(const uint8_t *k, size_t klen, const uint8_t *v, size_t vlen,
                        chunk_mark_t *m) {
    if (klen != OUTPUT_KEY_BYTES || vlen != MARK_BYTES) {
        return false;
    }
    m->last = kf_get_be64(k + 4);
    m->written_ms = (int64_t)kf_get_be64(v);
    m->bytes = kf_get_be64(v + 8);
    uint32_t rows = kf_get_be32(v + 16);
    if (rows == 0 || rows > m->last) {
        return false;
    }
    m->first = m->last - rows + 1;
    return true;
}

/* Takes one expired chunk (or a gap of unmarked ones): it will be deleted
 * with the range this sweep writes. */
static void take_chunk(function_t *fn, const chunk_mark_t *m, uint64_t *target) {
    fn->purged_seq = m->last;
    fn->retained_bytes -= m->bytes < fn->retained_bytes ? m->bytes : fn->retained_bytes;
    if (m->last > *target) {
        *target = m->last;
    }
}

/* Walks fn's marks from purged_seq, taking expired chunks, examining at
 * most `budget`. *more: the budget ran out before the walk ended. */
static uint32_t walk_marks(kf_ctx_t *ctx, function_t *fn, const kf_retention_t *r, uint64_t *target,
                           uint32_t budget, bool *more) {
    kf_key_t lower, upper;
    output_key(&lower, fn, fn->purged_seq + 1);
    output_key(&upper, fn, fn->durable_output_seq + 1);
    kf_iter_t *it;
    kf_error_t err;
    *more = false;
    if (kf_iter_create(ctx->store, KF_CF_OUTPUT_MARKS, lower.bytes, lower.len, upper.bytes,
                       upper.len, &it, &err) != KF_OK) {
        kf_log(KF_LOG_ERROR, "functions", "retention of %s: %s", fn->id, err.message);
        return 1;
    }
    uint32_t examined = 0;
    bool ended = true;
    for (kf_iter_seek_first(it); kf_iter_valid(it); kf_iter_next(it)) {
        if (examined == budget) {
            *more = true;
            ended = false;
            break;
        }
        examined++;
        size_t klen, vlen;
        const uint8_t *k = kf_iter_key(it, &klen);
        const uint8_t *v = kf_iter_value(it, &vlen);
        chunk_mark_t m;
        if (!decode_mark(k, klen, v, vlen, &m) || m.first <= fn->purged_seq) {
            kf_log(KF_LOG_ERROR, "functions",
                   "retention of %s: malformed output mark after %" PRIu64, fn->id, fn->purged_seq);
            ended = false;
            break;
        }
        chunk_mark_t gap = {m.first - 1, fn->purged_seq + 1, INT64_MAX, 0}; /* unmarked */
        if (m.first > fn->purged_seq + 1 && chunk_expired(fn, r, ctx->now_ms, *target, &gap)) {
            take_chunk(fn, &gap, target);
        }
        if (m.first != fn->purged_seq + 1 || !chunk_expired(fn, r, ctx->now_ms, *target, &m)) {
            ended = false;
            break;
        }
        take_chunk(fn, &m, target);
    }
    if (kf_iter_status(it, &err) != KF_OK) {
        kf_log(KF_LOG_ERROR, "functions", "retention of %s: %s", fn->id, err.message);
        ended = false;
    }
    kf_iter_destroy(it);
    /* No mark up to the durable end: unmarked chunks from before marks. */
    chunk_mark_t tail = {fn->durable_output_seq, fn->purged_seq + 1, INT64_MAX, 0};
    if (ended && fn->purged_seq < fn->durable_output_seq &&
        chunk_expired(fn, r, ctx->now_ms, *target, &tail)) {
        take_chunk(fn, &tail, target);
    }
    return examined;
}

/* One function's share of a sweep: moves the trim point for the row bound,
 * takes what expired, and writes the deletes with the checkpoint. */
static uint32_t sweep_function(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn, uint32_t budget,
                               bool *more) {
    kf_retention_t r;
    kf__output_retention(fns, fn, &r);
    uint64_t high = fn->durable_output_seq;
    uint64_t target = fn->trimmed_seq;
    if (r.max_rows > 0 && high > (uint64_t)r.max_rows && high - (uint64_t)r.max_rows > target) {
        target = high - (uint64_t)r.max_rows;
    }
    uint64_t purged0 = fn->purged_seq;
    uint32_t examined = 0;
    *more = false;
    if (fn->purged_seq < high) {
        examined = walk_marks(ctx, fn, &r, &target, budget, more);
    }
    if (fn->purged_seq > purged0) {
        kf_key_t begin, end;
        output_key(&begin, fn, purged0 + 1);
        output_key(&end, fn, fn->purged_seq + 1);
        kf_ctx_delete_range(ctx, KF_CF_OUTPUT, &begin, &end);
        kf_ctx_delete_range(ctx, KF_CF_OUTPUT_MARKS, &begin, &end);
    }
    if (target > fn->trimmed_seq || fn->purged_seq > purged0) {
        fn->trimmed_seq = target;
        kf__put_checkpoint(ctx, fn);
    }
    KF_ASSERT(fn->purged_seq <= fn->trimmed_seq && fn->trimmed_seq <= high);
    return examined;
}

/* Output retention over every function, at most `limit` chunks. */
static uint32_t sweep_output(kf_functions_t *fns, kf_ctx_t *ctx, uint32_t limit) {
    size_t count = fns->by_id.count, b, i = 0;
    if (count == 0) {
        return 0;
    }
    /* Start where the last sweep ran out, so one function's backlog does
     * not starve the others. */
    size_t start = fns->sweep_start % count;
    uint32_t examined = 0;
    kf_map_node_t *n = kf_map_first(&fns->by_id, &b);
    for (; i < start; i++) {
        n = kf_map_next(&fns->by_id, &b, n);
    }
    for (size_t visited = 0; visited < count; visited++) {
        if (n == NULL) {
            n = kf_map_first(&fns->by_id, &b);
        }
        function_t *fn = KF_CONTAINER_OF(n, function_t, node);
        bool more;
        examined += sweep_function(fns, ctx, fn, limit - examined, &more);
        if (more || examined >= limit) {
            fns->sweep_start = (uint32_t)((start + visited) % count);
            return limit;
        }
        n = kf_map_next(&fns->by_id, &b, n);
    }
    fns->sweep_start = 0;
    return examined;
}

uint32_t kf_functions_sweep(kf_functions_t *fns, kf_ctx_t *ctx, uint32_t limit) {
    bool more_producers = kf__producers_expire(fns, ctx, KF_PRODUCERS_EXPIRED_PER_TURN) ==
                          KF_PRODUCERS_EXPIRED_PER_TURN;
    uint32_t examined = sweep_output(fns, ctx, limit);
    return more_producers ? limit : examined;
}
