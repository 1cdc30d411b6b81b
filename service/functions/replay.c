/*
 * replay.c - ReplayBatch: the last input batches of REPLAY_SAFE functions,
 * kept with the state their step started from and what it did, and run
 * again on request in a scratch copy of those keys.
 *
 *   step_finish (a committed PushBatch step) --kf__replay_keep--> a record
 *        (ReplayRec, packed) at the tail of the function's list and of the
 *        engine's; the oldest go past --replay-batches per function or
 *        --replay-bytes in all
 *   kf_functions_replay: find the record --> a scratch function (no map
 *        entry, no store, the native host) holding only the keys the step
 *        touched, as they were, the watermark and activation ids as they
 *        were --> the same step machine on the recorded rows and watermark
 *        (s->replay) --> kf__replay_answer compares output and state with
 *        the record --> rollback, the scratch function is freed
 *
 * Invariants
 *   1. Nothing a replay does reaches the real function, the store or the
 *      output: its step runs on the scratch function, which is freed when
 *      the step ends, and step_finish never commits a replay.
 *   2. The scratch function holds every key the recorded step touched
 *      (its undo log), so the due timers among them are exactly the ones
 *      the step fired first: the replay fires the same timers in the same
 *      order, up to max_timer_callbacks_per_step.
 *   3. Records are bounded: per function by config->replay_batches, in all
 *      by config->replay_bytes (this partition's share of --replay-bytes)
 *      and by the room the engine's tables leave in the memory budget
 *      (replay_room); the oldest is forgotten first. They are a debugging
 *      aid, so they yield to the tables: a table admission never counts
 *      them, and whenever the tables grow into their room
 *      (kf_functions_replay_fit, at every refresh of the count) the oldest
 *      go.
 *
 * Records are kept in memory only: a restart forgets them (docs/semantics.md).
 * Engine-thread only.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/metrics.h"
#include "functions/functions_int.h"

/* ---- the records ------------------------------------------------------- */

static void rec_unlink(kf_functions_t *fns, replay_rec_t *r) {
    function_t *fn = r->fn;
    if (r->prev) {
        r->prev->next = r->next;
    } else {
        fns->replay_head = r->next;
    }
    if (r->next) {
        r->next->prev = r->prev;
    } else {
        fns->replay_tail = r->prev;
    }
    if (r->fn_prev) {
        r->fn_prev->fn_next = r->fn_next;
    } else {
        fn->replay_head = r->fn_next;
    }
    if (r->fn_next) {
        r->fn_next->fn_prev = r->fn_prev;
    } else {
        fn->replay_tail = r->fn_prev;
    }
    fn->replay_count--;
    fns->replay_bytes -= r->len;
    kf_gauge_set(KF_G_REPLAY_BYTES, (int64_t)fns->replay_bytes);
    free(r->producer_id);
    free(r->bytes);
    free(r);
}

/* The bytes records may hold while the engine's tables take tables_bytes
 * (invariant 3). */
static uint64_t replay_room(const kf_functions_t *fns, const kf_memory_t *m,
                            uint64_t tables_bytes) {
    int64_t share = fns->config->replay_bytes;
    uint64_t room = share > 0 ? (uint64_t)share : (uint64_t)KF_REPLAY_BYTES_DEFAULT;
    if (m->budget_bytes != 0) {
        uint64_t left = m->budget_bytes > tables_bytes ? m->budget_bytes - tables_bytes : 0;
        room = left < room ? left : room;
    }
    return room;
}

void kf_functions_replay_fit(kf_functions_t *fns, const kf_memory_t *m) {
    uint64_t room = replay_room(fns, m, m->used_bytes);
    while (fns->replay_bytes > room) {
        rec_unlink(fns, fns->replay_head);
    }
}

void kf__replay_forget(kf_functions_t *fns, function_t *fn) {
    while (fn->replay_head != NULL) {
        rec_unlink(fns, fn->replay_head);
    }
}

static Keyflow__Records__ReplayKeyRec *key_rec(kf_arena_t *a, const function_t *fn,
                                               const fn_key_t *k, uint8_t state, int64_t value,
                                               int64_t expires_us, const int64_t *at) {
    Keyflow__Records__ReplayKeyRec *kr = kf_arena_new(a, sizeof *kr);
    keyflow__records__replay_key_rec__init(kr);
    kr->key.data = k->key;
    kr->key.len = k->key_len;
    kr->state = state;
    kr->value = value;
    kr->expires_us = expires_us;
    kr->n_timers_at = fn->desc->n_timer_names;
    kr->timers_at = kf_arena_new(a, (kr->n_timers_at + 1) * sizeof *kr->timers_at);
    memcpy(kr->timers_at, at, kr->n_timers_at * sizeof *kr->timers_at);
    return kr;
}

static uint8_t *pack_batch(const Keyflow__V1__RowBatch *b, size_t *len) {
    *len = keyflow__v1__row_batch__get_packed_size(b);
    uint8_t *bytes = kf_xmalloc(*len);
    keyflow__v1__row_batch__pack(b, bytes);
    return bytes;
}

void kf__replay_keep(step_t *s) {
    kf_functions_t *fns = s->fns;
    function_t *fn = s->fn;
    int64_t per_fn = fns->config->replay_batches;
    if (per_fn <= 0 || fn->desc->determinism != KEYFLOW__V1__DETERMINISM__DETERMINISM_REPLAY_SAFE) {
        return;
    }
    kf_arena_t a;
    kf_arena_init(&a, 0);
    Keyflow__Records__ReplayRec rec = KEYFLOW__RECORDS__REPLAY_REC__INIT;
    rec.producer_id = s->req->producer_id;
    rec.sequence = s->req->sequence;
    uint8_t *rows_bytes = NULL, *out_bytes = NULL;
    size_t rows_len = 0, out_len = 0;
    if (s->rows->count > 0) {
        Keyflow__V1__RowBatch b = KEYFLOW__V1__ROW_BATCH__INIT;
        b.row_count = s->rows->count;
        b.n_columns = s->rows->ncols;
        b.columns = kf_arena_new(&a, (b.n_columns + 1) * sizeof *b.columns);
        for (uint32_t c = 0; c < s->rows->ncols; c++) {
            b.columns[c] = (Keyflow__V1__Column *)s->rows->cols[c].values;
        }
        rows_bytes = pack_batch(&b, &rows_len);
        rec.has_rows = true;
        rec.rows.data = rows_bytes;
        rec.rows.len = rows_len;
    }
    rec.has_watermark_request = s->req->watermark_present_case ==
                                KEYFLOW__V1__PUSH_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US;
    rec.watermark_request_us = s->req->watermark_us;
    rec.has_watermark_before = fn->has_watermark; /* step_finish has not moved it yet */
    rec.watermark_before_us = fn->watermark_us;
    rec.next_activation = s->next_activation0;
    rec.output_seq_before = fn->output_seq;
    rec.before = kf_arena_new(&a, (s->nundo + 1) * sizeof *rec.before);
    rec.after = kf_arena_new(&a, (s->nundo + 1) * sizeof *rec.after);
    for (size_t i = 0; i < s->nundo; i++) {
        const undo_t *u = &s->undo[i];
        const fn_key_t *k = u->key;
        int64_t at[KF_TIMER_NAMES_MAX];
        for (size_t t = 0; t < fn->desc->n_timer_names; t++) {
            at[t] = k->timers && k->timers[t] ? k->timers[t]->at_us : KF__NO_TIME;
        }
        rec.before[rec.n_before++] = key_rec(&a, fn, k, u->state, u->value, u->expires_us, u->at);
        rec.after[rec.n_after++] = key_rec(&a, fn, k, k->state, k->value, k->expires_us, at);
    }
    rec.output_rows = s->out.rows;
    if (s->out.rows > 0) {
        Keyflow__V1__RowBatch *out = kf_outbuf_to_batch(&s->out, 0, s->out.rows, &a);
        if (out == NULL) {
            /* Past what one arena holds: too large to keep. */
            free(rows_bytes);
            kf_arena_deinit(&a);
            return;
        }
        out_bytes = pack_batch(out, &out_len);
        rec.output.data = out_bytes;
        rec.output.len = out_len;
    }
    replay_rec_t *r = kf_xcalloc(1, sizeof *r);
    r->len = keyflow__records__replay_rec__get_packed_size(&rec);
    r->bytes = kf_xmalloc(r->len);
    keyflow__records__replay_rec__pack(&rec, r->bytes);
    free(rows_bytes);
    free(out_bytes);
    kf_arena_deinit(&a);
    /* The tables as they will be once this step commits. */
    uint64_t room =
        replay_room(fns, &s->ctx->memory, s->ctx->memory.used_bytes + kf__step_memory_growth(s));
    if (r->len > room) {
        free(r->bytes);
        free(r);
        return; /* larger than every record together may be now */
    }
    r->fn = fn;
    r->producer_id = kf_xstrdup(s->req->producer_id);
    r->sequence = s->req->sequence;
    r->prev = fns->replay_tail;
    if (fns->replay_tail) {
        fns->replay_tail->next = r;
    } else {
        fns->replay_head = r;
    }
    fns->replay_tail = r;
    r->fn_prev = fn->replay_tail;
    if (fn->replay_tail) {
        fn->replay_tail->fn_next = r;
    } else {
        fn->replay_head = r;
    }
    fn->replay_tail = r;
    fn->replay_count++;
    fns->replay_bytes += r->len;
    while (fn->replay_count > (uint32_t)per_fn) {
        rec_unlink(fns, fn->replay_head);
    }
    while (fns->replay_bytes > room) {
        rec_unlink(fns, fns->replay_head); /* never r: r->len <= room */
    }
    kf_gauge_set(KF_G_REPLAY_BYTES, (int64_t)fns->replay_bytes);
}

/* ---- the scratch function ---------------------------------------------- */

/* A function with fn's descriptor, limits and handler (native), no keys,
 * and nothing in the function table or the store (invariant 1). */
static function_t *scratch_new(const function_t *fn) {
    function_t *x = kf_xcalloc(1, sizeof *x);
    x->id = fn->id;
    x->index = fn->index;
    x->desc = fn->desc;
    memcpy(x->sha256, fn->sha256, sizeof x->sha256);
    x->limits = fn->limits;
    x->split = fn->split;
    x->home = fn->home;
    x->share_keys = fn->share_keys;
    x->share_timers = fn->share_timers;
    x->share_state_bytes = fn->share_state_bytes;
    memcpy(x->key_cols, fn->key_cols, sizeof x->key_cols);
    x->nkey_cols = fn->nkey_cols;
    x->event_col = fn->event_col;
    x->out_event_col = fn->out_event_col;
    x->host = kf__host_native();
    x->handler = fn->handler;
    x->watch_what = fn->watch_what;
    memcpy(x->timer_name_len, fn->timer_name_len, sizeof x->timer_name_len);
    kf_map_init(&x->keys);
    kf_map_init(&x->producers);
    kf_ostree_init(&x->timers, kf__timer_cmp, x);
    kf_pq_init(&x->expiries, kf__expiry_before, x);
    return x;
}

void kf__replay_scratch_free(function_t *x) {
    kf_ostree_deinit(&x->timers);
    kf_pq_deinit(&x->expiries);
    size_t b;
    kf_map_node_t *n = kf_map_first(&x->keys, &b);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&x->keys, &b, n);
        kf__key_free(x, KF_CONTAINER_OF(n, fn_key_t, node));
        n = next;
    }
    kf_map_deinit(&x->keys);
    kf_map_deinit(&x->producers);
    free(x);
}

/* Puts a recorded key into the scratch function as it was. */
static bool scratch_key(function_t *x, const Keyflow__Records__ReplayKeyRec *kr) {
    if (kr->n_timers_at != x->desc->n_timer_names) {
        return false;
    }
    char *text;
    size_t text_len;
    if (!kf__key_text_of(x, kr->key.data, kr->key.len, &text, &text_len)) {
        return false;
    }
    fn_key_t *k = kf__key_new(x, kr->key.data, kr->key.len, text, text_len);
    free(text);
    if (kr->state != KF_STATE_ABSENT) {
        kf__key_set_state(x, k, (uint8_t)kr->state, kr->value, kr->expires_us);
    }
    for (size_t t = 0; t < kr->n_timers_at; t++) {
        if (kr->timers_at[t] != KF__NO_TIME) {
            kf__key_set_timer(x, k, (uint8_t)t, kr->timers_at[t]);
        }
    }
    return true;
}

/* ---- ReplayBatch ------------------------------------------------------- */

void kf_functions_replay(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__ReplayBatchRequest *req =
        (const Keyflow__V1__ReplayBatchRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    function_t *fn = kf__fn_require(fns, req->function_id, err);
    if (fn == NULL) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (fn->desc->determinism != KEYFLOW__V1__DETERMINISM__DETERMINISM_REPLAY_SAFE) {
        kf_error_set(err, KF_E_PRECONDITION,
                     "function %s: determinism is not REPLAY_SAFE; only a function declared "
                     "REPLAY_SAFE can be replayed",
                     fn->id);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (fn->handler == NULL) {
        kf_error_set(err,
                     fn->desc->runtime == KEYFLOW__V1__RUNTIME__RUNTIME_REMOTE ? KF_E_UNIMPLEMENTED
                                                                               : KF_E_UNAVAILABLE,
                     "function %s: %s", fn->id,
                     fn->desc->runtime == KEYFLOW__V1__RUNTIME__RUNTIME_REMOTE
                         ? "ReplayBatch runs NATIVE handlers only"
                         : fn->unavailable);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    const replay_rec_t *r = fn->replay_tail;
    while (r != NULL &&
           (r->sequence != req->sequence || strcmp(r->producer_id, req->producer_id))) {
        r = r->fn_prev;
    }
    if (r == NULL) {
        kf_error_set(err, KF_E_NOT_FOUND,
                     "producer_id %.128s, sequence %lld: no input batch kept for function %s "
                     "(kept: the last %lld per function since the server started, "
                     "--replay-batches)",
                     req->producer_id, (long long)req->sequence, fn->id,
                     (long long)fns->config->replay_batches);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    Keyflow__Records__ReplayRec *rec =
        keyflow__records__replay_rec__unpack(kf_arena_pb(cmd->arena), r->len, r->bytes);
    KF_ASSERT(rec != NULL); /* packed by kf__replay_keep */
    Keyflow__V1__PushBatchRequest *push = kf_arena_new(cmd->arena, sizeof *push);
    keyflow__v1__push_batch_request__init(push);
    push->function_id = fn->id;
    push->producer_id = rec->producer_id;
    push->sequence = rec->sequence;
    if (rec->has_watermark_request) {
        push->watermark_present_case =
            KEYFLOW__V1__PUSH_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US;
        push->watermark_us = rec->watermark_request_us;
    }
    step_t *s = kf_arena_new(cmd->arena, sizeof *s);
    kf_rows_t *rows = &s->rows_storage;
    rows->ncols = (uint32_t)fn->desc->input_schema->n_fields;
    if (rec->has_rows) {
        Keyflow__V1__RowBatch *batch =
            keyflow__v1__row_batch__unpack(kf_arena_pb(cmd->arena), rec->rows.len, rec->rows.data);
        KF_ASSERT(batch != NULL);
        kf_status_t st = kf_rows_from_batch(batch, fn->desc->input_schema, INT64_MAX, INT64_MAX,
                                            cmd->arena, rows, err);
        KF_ASSERT(st == KF_OK); /* the batch was accepted by this very function */
        push->rows_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_BATCH;
        push->batch = batch;
    }
    function_t *x = scratch_new(fn);
    x->has_watermark = rec->has_watermark_before;
    x->watermark_us = rec->watermark_before_us;
    x->next_activation = rec->next_activation;
    x->output_seq = rec->output_seq_before;
    for (size_t i = 0; i < rec->n_before; i++) {
        bool ok = scratch_key(x, rec->before[i]);
        KF_ASSERT(ok); /* recorded from this function's own keys */
    }
    s->rows = rows;
    s->cmd = cmd;
    s->req = push;
    s->replay = rec;
    kf__step_begin(s, fns, ctx, x);
}

/* ---- the comparison ---------------------------------------------------- */

static const char *kind_name(int32_t kind) {
    switch (kind) {
    case KF_STATE_ABSENT: return "absent";
    case KF_STATE_NULL: return "null";
    case KF_STATE_VALUE: return "a value";
    }
    return "?";
}

/* The first difference between a recorded key and the replay's, written
 * into diff; false when they agree. */
static bool key_differs(const function_t *x, const Keyflow__Records__ReplayKeyRec *want,
                        const fn_key_t *k, char *diff, size_t cap) {
    uint8_t state = k ? k->state : KF_STATE_ABSENT;
    int64_t value = k ? k->value : 0;
    int64_t expires = k ? k->expires_us : KF__NO_TIME;
    char *text = NULL;
    size_t text_len = 0;
    bool ok = kf__key_text_of(x, want->key.data, want->key.len, &text, &text_len);
    KF_ASSERT(ok);
    bool differs = true;
    if (state != want->state) {
        snprintf(diff, cap, "key %.128s: recorded state %s, replayed %s", text,
                 kind_name(want->state), kind_name(state));
    } else if (state == KF_STATE_VALUE && value != want->value) {
        snprintf(diff, cap, "key %.128s: recorded value %" PRId64 ", replayed %" PRId64, text,
                 want->value, value);
    } else if (expires != want->expires_us) {
        snprintf(diff, cap, "key %.128s: recorded expiry %" PRId64 ", replayed %" PRId64, text,
                 want->expires_us, expires);
    } else {
        differs = false;
        for (size_t t = 0; t < x->desc->n_timer_names && !differs; t++) {
            int64_t at = k && k->timers && k->timers[t] ? k->timers[t]->at_us : KF__NO_TIME;
            if (at != want->timers_at[t]) {
                differs = true;
                char rec_at[32] = "not set", rep_at[32] = "not set";
                if (want->timers_at[t] != KF__NO_TIME) {
                    snprintf(rec_at, sizeof rec_at, "at %" PRId64, want->timers_at[t]);
                }
                if (at != KF__NO_TIME) {
                    snprintf(rep_at, sizeof rep_at, "at %" PRId64, at);
                }
                snprintf(diff, cap, "key %.128s: timer %s recorded %s, replayed %s", text,
                         x->desc->timer_names[t], rec_at, rep_at);
            }
        }
    }
    free(text);
    return differs;
}

static bool cells_equal(const kf_column_type_t *t, const kf_cell_t *a, const kf_cell_t *b) {
    if (t->value_bytes == 0) {
        return a->len == b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
    }
    if (t->type == KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64) {
        return memcmp(&a->v.f, &b->v.f, sizeof a->v.f) == 0;
    }
    return a->v.i == b->v.i;
}

/* The first differing output row, written into diff; false when equal. */
static bool output_differs(step_t *s, const Keyflow__Records__ReplayRec *rec, char *diff,
                           size_t cap) {
    const function_t *x = s->fn;
    if ((int64_t)s->out.rows != rec->output_rows) {
        snprintf(diff, cap, "output: the recorded step wrote %" PRId64 " rows, the replay %u",
                 rec->output_rows, s->out.rows);
        return true;
    }
    if (rec->output_rows == 0) {
        return false;
    }
    kf_arena_t *a = s->cmd->arena;
    Keyflow__V1__RowBatch *b =
        keyflow__v1__row_batch__unpack(kf_arena_pb(a), rec->output.len, rec->output.data);
    kf_rows_t want;
    kf_error_t err;
    KF_ASSERT(b != NULL && kf_rows_from_batch(b, x->desc->output_schema, INT64_MAX, INT64_MAX, a,
                                              &want, &err) == KF_OK);
    const Keyflow__V1__Schema *os = x->desc->output_schema;
    for (uint32_t r = 0; r < want.count; r++) {
        const kf_cell_t *got = kf_outbuf_row(&s->out, r);
        for (uint32_t c = 0; c < want.ncols; c++) {
            bool want_null = kf_rows_is_null(&want, r, c);
            bool got_null = !got[c].set || got[c].null;
            kf_cell_t w;
            kf_rows_value(&want, r, c, &w);
            if (want_null != got_null ||
                (!want_null && !cells_equal(want.cols[c].type, &w, &got[c]))) {
                snprintf(diff, cap,
                         "output row %u (sequence %" PRIu64 "), column %s: the replay differs "
                         "from the record",
                         r + 1, rec->output_seq_before + r + 1, os->fields[c]->name);
                return true;
            }
        }
    }
    return false;
}

void kf__replay_answer(step_t *s, kf_status_t st) {
    const Keyflow__Records__ReplayRec *rec = s->replay;
    function_t *x = s->fn;
    kf_cmd_t *cmd = s->cmd;
    Keyflow__V1__ReplayBatchResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__replay_batch_response__init(resp);
    resp->recorded_output_rows = rec->output_rows;
    resp->replayed_output_rows = st == KF_OK ? s->out.rows : 0;
    char diff[KF_ERROR_MESSAGE_BYTES_MAX] = "";
    bool differs = false;
    if (st != KF_OK) {
        snprintf(diff, sizeof diff, "the replay was refused (the recorded step was not): %.400s",
                 s->err->message);
        differs = true;
    }
    if (!differs) {
        differs = output_differs(s, rec, diff, sizeof diff);
    }
    /* Every key the recorded step touched, as it left it... */
    for (size_t i = 0; i < rec->n_after; i++) {
        resp->keys_compared++;
        if (!differs) {
            const fn_key_t *k = kf__key_find(x, rec->after[i]->key.data, rec->after[i]->key.len);
            differs = key_differs(x, rec->after[i], k, diff, sizeof diff);
        }
    }
    /* ...and every key only the replay touched must be as it was. */
    for (size_t i = 0; i < s->nundo; i++) {
        const fn_key_t *k = s->undo[i].key;
        bool recorded = false;
        for (size_t j = 0; j < rec->n_after && !recorded; j++) {
            recorded = rec->after[j]->key.len == k->key_len &&
                       memcmp(rec->after[j]->key.data, k->key, k->key_len) == 0;
        }
        if (recorded) {
            continue;
        }
        resp->keys_compared++;
        if (!differs && (k->state != KF_STATE_ABSENT || k->ntimers > 0)) {
            snprintf(diff, sizeof diff,
                     "key %.128s: changed by the replay, not by the recorded step", k->key_text);
            differs = true;
        }
    }
    resp->reproduced = !differs;
    resp->first_difference = kf_arena_strdup(cmd->arena, diff);
    cmd->response = &resp->base;
    kf_error_clear(&cmd->error);
}
