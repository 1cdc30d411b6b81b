/*
 * output.c - ReadOutput: a function's output stream and the reads parked
 * on it.
 *
 * Invariants
 *   1. Reads see only rows whose write is durable (durable_output_seq):
 *      a step's output is written in a group (kf__output_written) and
 *      becomes readable when the engine reports the group durable
 *      (kf_functions_durable).
 *   2. Output rows carry contiguous per-function sequence numbers; a chunk
 *      is keyed by its last row's, so a read finds a gap or a malformed
 *      chunk and reports it as corruption rather than skipping rows.
 *   3. Parked reads are bounded (KF_PARKED_READS_MAX); each ends exactly
 *      once: new durable output, its deadline, a cancel or shutdown.
 */
#include <inttypes.h>
#include <string.h>

#include "base/alloc.h"
#include "base/bytes.h"
#include "base/metrics.h"
#include "functions/functions_int.h"

/* ---- durable output ---------------------------------------------------- */

void kf__output_written(kf_functions_t *fns, function_t *fn, uint64_t group) {
    if (fns->npending > 0 && fns->pending[fns->npending - 1].fn == fn &&
        fns->pending[fns->npending - 1].group == group) {
        fns->pending[fns->npending - 1].output_seq = fn->output_seq;
        return;
    }
    if (fns->npending == fns->pending_cap) {
        fns->pending_cap = fns->pending_cap ? fns->pending_cap * 2 : 64;
        fns->pending = kf_xrealloc(fns->pending, fns->pending_cap * sizeof *fns->pending);
    }
    fns->pending[fns->npending++] = (pending_durable_t){fn, group, fn->output_seq};
}

/* ---- reads ------------------------------------------------------------- */

/* Reads rows (after, high] into the response, at most `limit`. */
static kf_status_t read_rows(kf_ctx_t *ctx, function_t *fn, int64_t after, int64_t limit,
                             Keyflow__V1__RowFormat format, kf_arena_t *arena,
                             Keyflow__V1__ReadOutputResponse *resp, kf_error_t *err) {
    uint64_t high = fn->durable_output_seq;
    resp->high_water_seq = (int64_t)high;
    resp->first_retained_seq = (int64_t)fn->trimmed_seq + 1;
    resp->next_after_seq = after;
    if (format == KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON) {
        /* An empty page is the empty array, not an absent field: over HTTP
         * "rows" is then [] like every other list (json_map.h). */
        resp->rows_json = kf_arena_strdup(arena, "[]");
        if (resp->rows_json == NULL) {
            return kf_error_set(err, KF_E_TOO_LARGE, "limit: the page is too large");
        }
    }
    if ((uint64_t)after >= high) {
        return KF_OK;
    }
    kf_key_t lower, upper;
    kf__key_prefix(&lower, fn);
    kf__key_prefix(&upper, fn);
    kf_key_be64(&lower, (uint64_t)after + 1);
    kf_key_be64(&upper, high + 1); /* chunks written after `high` are not durable yet */
    kf_iter_t *it;
    kf_status_t st = kf_iter_create(ctx->store, KF_CF_OUTPUT, lower.bytes, lower.len, upper.bytes,
                                    upper.len, &it, err);
    if (st != KF_OK) {
        return st;
    }
    kf_outbuf_t out;
    kf_outbuf_init(&out, fn->desc->output_schema, arena);
    int64_t first = 0;
    uint64_t next = (uint64_t)after + 1;
    for (kf_iter_seek_first(it); kf_iter_valid(it) && (int64_t)out.rows < limit; kf_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = kf_iter_key(it, &klen);
        const void *v = kf_iter_value(it, &vlen);
        if (klen != 12) {
            st = kf_error_set(err, KF_E_CORRUPT, "output: malformed key");
            break;
        }
        uint64_t last = kf_get_be64(k + 4);
        Keyflow__V1__RowBatch *chunk = keyflow__v1__row_batch__unpack(kf_arena_pb(arena), vlen, v);
        kf_rows_t rows;
        if (chunk == NULL ||
            kf_rows_from_batch(chunk, fn->desc->output_schema, INT64_MAX, INT64_MAX, arena, &rows,
                               err) != KF_OK ||
            rows.count == 0 || last + 1 < rows.count) {
            st = kf_error_set(err, KF_E_CORRUPT, "output: undecodable chunk ending at %" PRIu64,
                              last);
            break;
        }
        uint64_t chunk_first = last + 1 - rows.count;
        if (next < chunk_first || next > last) {
            st = kf_error_set(err, KF_E_CORRUPT, "output: gap before row %" PRIu64, next);
            break;
        }
        uint32_t from = (uint32_t)(next - chunk_first);
        uint32_t n = rows.count - from;
        if ((int64_t)n > limit - (int64_t)out.rows) {
            n = (uint32_t)(limit - (int64_t)out.rows);
        }
        if (first == 0) {
            first = (int64_t)next;
        }
        if ((st = kf_outbuf_append_rows(&out, &rows, from, n, err)) != KF_OK) {
            break;
        }
        next += n;
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    if (st != KF_OK || out.rows == 0) {
        return st;
    }
    resp->first_seq = first;
    resp->last_seq = first + out.rows - 1;
    resp->next_after_seq = resp->last_seq;
    if (format == KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON) {
        size_t len;
        resp->rows_json = kf_outbuf_to_json(&out, 0, out.rows, first, arena, &len);
    } else {
        resp->batch = kf_outbuf_to_batch(&out, 0, out.rows, arena);
    }
    if ((format == KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON && resp->rows_json == NULL) ||
        (format != KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON && resp->batch == NULL)) {
        return kf_error_set(err, KF_E_TOO_LARGE,
                            "limit: the page is too large; ask for fewer rows");
    }
    return KF_OK;
}

static void reader_unlink(kf_functions_t *fns, reader_t *r) {
    if (r->prev) {
        r->prev->next = r->next;
    } else {
        r->fn->readers = r->next;
    }
    if (r->next) {
        r->next->prev = r->prev;
    }
    fns->nreaders--;
    kf_gauge_set(KF_G_PARKED_READS, fns->nreaders);
}

static void answer_read(kf_ctx_t *ctx, function_t *fn, kf_cmd_t *cmd) {
    const Keyflow__V1__ReadOutputRequest *req =
        (const Keyflow__V1__ReadOutputRequest *)cmd->request;
    Keyflow__V1__ReadOutputResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__read_output_response__init(resp);
    int64_t limit = req->limit ? req->limit : KF_READ_OUTPUT_LIMIT_DEFAULT;
    /* Again when a parked read wakes: a trim may have passed it meanwhile. */
    if (kf__output_check_range(fn, req->after_seq, cmd) != KF_OK ||
        read_rows(ctx, fn, req->after_seq, limit, req->format, cmd->arena, resp, &cmd->error) !=
            KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

void kf_functions_read(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__ReadOutputRequest *req =
        (const Keyflow__V1__ReadOutputRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    function_t *fn = kf__fn_require(fns, req->function_id, err);
    if (fn == NULL) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (req->after_seq < 0 || req->limit < 0 || req->limit > KF_READ_OUTPUT_LIMIT_MAX ||
        req->wait_ms < 0 || req->wait_ms > KF_POLL_WAIT_MS_MAX || (int)req->format < 0 ||
        req->format > KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON) {
        kf_error_set(err, KF_E_INVALID, "%s",
                     req->after_seq < 0 ? "after_seq: must not be negative"
                     : (req->limit < 0 || req->limit > KF_READ_OUTPUT_LIMIT_MAX)
                         ? "limit: must be in 0..65536 (0 = 1000)"
                     : (req->wait_ms < 0 || req->wait_ms > KF_POLL_WAIT_MS_MAX)
                         ? "wait_ms: must be in 0..60000"
                         : "format: must be COLUMNAR or JSON");
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (kf__output_check_range(fn, req->after_seq, cmd) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if ((uint64_t)req->after_seq >= fn->durable_output_seq && req->wait_ms > 0) {
        if (fns->nreaders >= KF_PARKED_READS_MAX) {
            kf_error_set(err, KF_E_LIMIT,
                         "ReadOutput: %d reads already waiting (KF_PARKED_READS_MAX)",
                         KF_PARKED_READS_MAX);
            kf_ctx_fail(ctx, cmd);
            return;
        }
        reader_t *r = kf_arena_new(cmd->arena, sizeof *r);
        r->cmd = cmd;
        r->fn = fn;
        kf_timer_init(&r->timer, KF_TIMER_FUNCTION);
        kf_heap_arm(&ctx->heap, &r->timer, kf_time_add_sat(ctx->now_ms, req->wait_ms));
        r->next = fn->readers;
        if (fn->readers) {
            fn->readers->prev = r;
        }
        fn->readers = r;
        fns->nreaders++;
        kf_gauge_set(KF_G_PARKED_READS, fns->nreaders);
        cmd->parked = r;
        return;
    }
    answer_read(ctx, fn, cmd);
}

void kf_functions_fire(kf_functions_t *fns, kf_ctx_t *ctx, kf_timer_t *timer) {
    reader_t *r = KF_CONTAINER_OF(timer, reader_t, timer);
    reader_unlink(fns, r);
    r->cmd->parked = NULL;
    answer_read(ctx, r->fn, r->cmd);
}

void kf_functions_durable(kf_functions_t *fns, kf_ctx_t *ctx) {
    size_t done = 0;
    while (done < fns->npending && fns->pending[done].group <= ctx->durable_group_id) {
        pending_durable_t *p = &fns->pending[done++];
        function_t *fn = p->fn;
        if (p->output_seq <= fn->durable_output_seq) {
            continue;
        }
        fn->durable_output_seq = p->output_seq;
        reader_t *r = fn->readers;
        while (r != NULL) {
            reader_t *next = r->next;
            const Keyflow__V1__ReadOutputRequest *req =
                (const Keyflow__V1__ReadOutputRequest *)r->cmd->request;
            if ((uint64_t)req->after_seq < fn->durable_output_seq) {
                reader_unlink(fns, r);
                kf_heap_disarm(&ctx->heap, &r->timer);
                r->cmd->parked = NULL;
                answer_read(ctx, fn, r->cmd);
            }
            r = next;
        }
    }
    if (done > 0) {
        memmove(fns->pending, fns->pending + done, (fns->npending - done) * sizeof *fns->pending);
        fns->npending -= done;
    }
}

bool kf_functions_cancel_read(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd, uint64_t id) {
    size_t b;
    for (kf_map_node_t *n = kf_map_first(&fns->by_id, &b); n; n = kf_map_next(&fns->by_id, &b, n)) {
        function_t *fn = KF_CONTAINER_OF(n, function_t, node);
        for (reader_t *r = fn->readers; r != NULL; r = r->next) {
            if (r->cmd == cmd && cmd->id == id) {
                reader_unlink(fns, r);
                kf_heap_disarm(&ctx->heap, &r->timer);
                cmd->parked = NULL;
                cmd->response = NULL;
                kf_error_set(&cmd->error, KF_E_CANCELLED, "ReadOutput: the client went away");
                kf_ctx_ready(ctx, cmd);
                return true;
            }
        }
    }
    return false;
}

void kf__output_end_revoked(kf_functions_t *fns, kf_ctx_t *ctx) {
    size_t b;
    for (kf_map_node_t *n = kf_map_first(&fns->by_id, &b); n; n = kf_map_next(&fns->by_id, &b, n)) {
        function_t *fn = KF_CONTAINER_OF(n, function_t, node);
        for (reader_t *r = fn->readers; r != NULL;) {
            reader_t *next = r->next;
            kf_cmd_t *cmd = r->cmd;
            if (kf_principal_check_open(cmd->principal, &cmd->error) != KF_OK) {
                reader_unlink(fns, r);
                kf_heap_disarm(&ctx->heap, &r->timer);
                cmd->parked = NULL;
                cmd->response = NULL;
                kf_ctx_fail(ctx, cmd);
            }
            r = next;
        }
    }
}

void kf_functions_release_reads(kf_functions_t *fns, kf_ctx_t *ctx) {
    size_t b;
    for (kf_map_node_t *n = kf_map_first(&fns->by_id, &b); n; n = kf_map_next(&fns->by_id, &b, n)) {
        function_t *fn = KF_CONTAINER_OF(n, function_t, node);
        /* batches waiting behind a call that is out */
        kf__push_release_queued(ctx, fn, KF_E_UNAVAILABLE, "the server is shutting down");
        while (fn->readers != NULL) {
            reader_t *r = fn->readers;
            reader_unlink(fns, r);
            kf_heap_disarm(&ctx->heap, &r->timer);
            r->cmd->parked = NULL;
            answer_read(ctx, fn, r->cmd);
        }
    }
}

void kf__output_forget(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn, kf_status_t status,
                       const char *message) {
    while (fn->readers != NULL) {
        reader_t *r = fn->readers;
        reader_unlink(fns, r);
        kf_heap_disarm(&ctx->heap, &r->timer);
        r->cmd->parked = NULL;
        kf_error_set(&r->cmd->error, status, "%s", message);
        kf_ctx_fail(ctx, r->cmd);
    }
    size_t kept = 0;
    for (size_t i = 0; i < fns->npending; i++) {
        if (fns->pending[i].fn != fn) {
            fns->pending[kept++] = fns->pending[i];
        }
    }
    fns->npending = kept;
}
