/*
 * step.c - steps of a function: a PushBatch is one step, and due timers
 * beyond what that step may fire run in follow-on steps the engine starts
 * by itself (the shape of a step is in functions.h).
 *
 *   kf_functions_push --(function busy: a step active or due timers
 *        waiting)--> queue (fn_drain starts it later)
 *        |
 *   push_begin: producer check, decode and check rows --> step_advance
 *   kf_functions_run_due --> due_begin: a follow-on step (no rows, no
 *        command) --> step_advance
 *   step_advance: take the answered calls, oldest first (take_response);
 *        while the host has room, next_call builds a call (rows phase,
 *        then the watermark advances, then the timers phase, at most
 *        max_timer_callbacks_per_step callbacks) --> kf__call_send (host.c)
 *        KF__CALL_ANSWERED --> taken at the next turn of the loop
 *        KF__CALL_OUT      --> wait; kf__step_resume --> step_advance
 *   no call left and none out, or take_response refused --> step_finish:
 *        commit (and, for a PushBatch, acknowledge and remember the ack
 *        for retries), or abandon the calls out + rollback + refuse (a
 *        follow-on step records the refusal in fn->due_error)
 *
 * Invariants
 *   1. The first time a step touches a key (touch) it snapshots it; every
 *      change a step makes goes through that key's snapshot or the
 *      function's counters saved in the step, so rollback restores memory
 *      exactly and commit writes only what changed.
 *   2. A response is validated whole before anything of it is applied, and
 *      the function's limits are checked after each apply; the per-step
 *      limits (output rows and bytes, timer callbacks) count the whole
 *      step, however its keys split into calls. A refusal anywhere rolls
 *      back the whole step (functions.h invariant 1).
 *   3. At most one step per function is active. Batches that arrive while
 *      a step is active, or while due timers wait for follow-on steps, wait
 *      in arrival order (bounded by KF_FN_QUEUED_MAX): input pushed after a
 *      watermark is processed after every timer that watermark made due.
 *   4. A step's writes (state, timers, output chunks, checkpoint, producer)
 *      go into the context's one batch: all or nothing on disk. Timers
 *      fire in (at_us, key, name) order, so every stored timers_by_time
 *      record due before the last fired timer's time is one the step fired
 *      or removed, and they go with one range delete. Within that last due
 *      time the stored order (key and name each behind its length) is not
 *      the firing order (names by text), so those records are deleted one
 *      by one.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/bytes.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/partition.h"
#include "base/text.h"
#include "functions/functions_int.h"

/* ---- undo -------------------------------------------------------------- */

static void touch(step_t *s, fn_key_t *k, bool existed) {
    if (k->step_mark == s->mark) {
        return;
    }
    k->step_mark = s->mark;
    if (s->nundo == s->undo_cap) {
        s->undo_cap = s->undo_cap ? s->undo_cap * 2 : 256;
        s->undo = kf_xrealloc(s->undo, s->undo_cap * sizeof *s->undo);
    }
    undo_t *u = &s->undo[s->nundo++];
    u->key = k;
    u->existed = existed;
    u->state = k->state;
    u->value = k->value;
    u->expires_us = k->expires_us;
    for (size_t i = 0; i < s->fn->desc->n_timer_names; i++) {
        u->at[i] = k->timers && k->timers[i] ? k->timers[i]->at_us : KF__NO_TIME;
    }
}

static void rollback(step_t *s) {
    function_t *fn = s->fn;
    for (size_t i = s->nundo; i-- > 0;) {
        undo_t *u = &s->undo[i];
        fn_key_t *k = u->key;
        for (size_t t = 0; t < fn->desc->n_timer_names; t++) {
            kf__key_set_timer(fn, k, (uint8_t)t, u->at[t]);
        }
        kf__key_set_state(fn, k, u->state, u->value, u->expires_us);
        k->step_mark = 0;
        if (!u->existed) {
            kf_map_remove(&fn->keys, &k->node);
            kf__key_free(fn, k);
        }
    }
    fn->live_keys = s->live_keys0;
    fn->timer_count = s->timer_count0;
    fn->state_bytes = s->state_bytes0;
    fn->next_activation = s->next_activation0;
}

/* ---- producers --------------------------------------------------------- */

producer_t *kf__producer_get(function_t *fn, const char *id, bool create) {
    kf_map_node_t *n = kf_map_get(&fn->producers, id, strlen(id));
    if (n != NULL || !create) {
        return n ? KF_CONTAINER_OF(n, producer_t, node) : NULL;
    }
    producer_t *p = kf_xcalloc(1, sizeof *p);
    p->id = kf_xstrdup(id);
    kf_map_insert(&fn->producers, &p->node, p->id, strlen(p->id));
    return p; /* in the idle order from its first batch (kf__producer_touch) */
}

/* What a PushBatch holds, for telling a retry from a conflict: its rows
 * (in canonical form, so JSON and columnar rows compare equal) and its
 * watermark. */
static void batch_digest(const kf_rows_t *rows, const Keyflow__V1__PushBatchRequest *req,
                         uint8_t out[KF_SHA256_BYTES]) {
    kf_sha256_ctx_t h;
    kf_sha256_begin(&h);
    static const char domain[] = "keyflow.PushBatch.v1";
    kf_sha256_update(&h, domain, sizeof domain);
    uint8_t wm[9] = {0};
    if (req->watermark_present_case ==
        KEYFLOW__V1__PUSH_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US) {
        wm[0] = 1;
        kf_put_be64(wm + 1, (uint64_t)req->watermark_us);
    }
    kf_sha256_update(&h, wm, sizeof wm);
    kf_rows_digest(rows, &h);
    kf_sha256_finish(&h, out);
}

typedef enum retry {
    RETRY_UNKNOWN,  /* no acknowledgement kept for the sequence */
    RETRY_SAME,     /* the original acknowledgement, in cmd->response */
    RETRY_CONFLICT, /* the sequence was accepted with other content */
} retry_t;

/* A retry of an accepted sequence: the stored acknowledgement when the
 * batch is the same (or its ack predates digests), a conflict otherwise. */
static retry_t replay_ack(producer_t *p, int64_t seq, const uint8_t digest[KF_SHA256_BYTES],
                          kf_cmd_t *cmd) {
    for (uint32_t i = 0; i < p->nacks; i++) {
        if (p->ack_seq[i] != seq) {
            continue;
        }
        if (p->ack_has_digest[i] && memcmp(p->ack_digest[i], digest, KF_SHA256_BYTES) != 0) {
            return RETRY_CONFLICT;
        }
        Keyflow__V1__PushBatchResponse *ack = keyflow__v1__push_batch_response__unpack(
            kf_arena_pb(cmd->arena), p->ack_len[i], p->ack[i]);
        KF_ASSERT(ack != NULL);
        ack->duplicate = true;
        cmd->response = &ack->base;
        return RETRY_SAME;
    }
    return RETRY_UNKNOWN;
}

static void put_producer(kf_ctx_t *ctx, const function_t *fn, const producer_t *p) {
    Keyflow__Records__ProducerRec rec = KEYFLOW__RECORDS__PRODUCER_REC__INIT;
    Keyflow__Records__ProducerAckRec acks[KF_PRODUCER_ACKS_KEPT];
    Keyflow__Records__ProducerAckRec *ptrs[KF_PRODUCER_ACKS_KEPT];
    rec.producer_id = p->id;
    rec.owner = (char *)p->owner;
    rec.last_sequence = p->last_sequence;
    rec.last_used_ms = p->last_used_ms;
    for (uint32_t i = 0; i < p->nacks; i++) {
        keyflow__records__producer_ack_rec__init(&acks[i]);
        acks[i].sequence = p->ack_seq[i];
        acks[i].ack.data = p->ack[i];
        acks[i].ack.len = p->ack_len[i];
        if (p->ack_has_digest[i]) {
            acks[i].digest.data = (uint8_t *)p->ack_digest[i];
            acks[i].digest.len = KF_SHA256_BYTES;
        }
        ptrs[i] = &acks[i];
    }
    rec.n_acks = p->nacks;
    rec.acks = ptrs;
    kf_key_t k;
    kf__key_prefix(&k, fn);
    kf_key_raw(&k, p->id, strlen(p->id));
    kf_ctx_put_msg(ctx, KF_CF_PRODUCERS, &k, &rec.base);
}

static void producer_remember(producer_t *p, int64_t seq, const ProtobufCMessage *ack,
                              const uint8_t digest[KF_SHA256_BYTES]) {
    if (p->nacks == KF_PRODUCER_ACKS_KEPT) {
        free(p->ack[0]);
        memmove(&p->ack[0], &p->ack[1], (KF_PRODUCER_ACKS_KEPT - 1) * sizeof p->ack[0]);
        memmove(&p->ack_seq[0], &p->ack_seq[1], (KF_PRODUCER_ACKS_KEPT - 1) * sizeof p->ack_seq[0]);
        memmove(&p->ack_len[0], &p->ack_len[1], (KF_PRODUCER_ACKS_KEPT - 1) * sizeof p->ack_len[0]);
        memmove(&p->ack_digest[0], &p->ack_digest[1],
                (KF_PRODUCER_ACKS_KEPT - 1) * sizeof p->ack_digest[0]);
        memmove(&p->ack_has_digest[0], &p->ack_has_digest[1],
                (KF_PRODUCER_ACKS_KEPT - 1) * sizeof p->ack_has_digest[0]);
        p->nacks--;
    }
    memcpy(p->ack_digest[p->nacks], digest, KF_SHA256_BYTES);
    p->ack_has_digest[p->nacks] = true;
    size_t len = protobuf_c_message_get_packed_size(ack);
    uint8_t *buf = kf_xmalloc(len);
    protobuf_c_message_pack(ack, buf);
    p->ack_seq[p->nacks] = seq;
    p->ack[p->nacks] = buf;
    p->ack_len[p->nacks] = len;
    p->nacks++;
    p->last_sequence = seq;
}

/* ---- commit: the step's one atomic write ------------------------------- */

/* The stored value: kind u8 | value be64, then its expiry be64 when it has
 * one (state_ttl_us). */
static void put_state(kf_ctx_t *ctx, const function_t *fn, const fn_key_t *k) {
    kf_key_t key;
    kf__key_prefix(&key, fn);
    kf_key_raw(&key, k->key, k->key_len);
    if (k->state == KF_STATE_ABSENT) {
        kf_ctx_delete(ctx, KF_CF_STATE, &key);
        return;
    }
    uint8_t v[17];
    v[0] = k->state;
    kf_put_be64(v + 1, (uint64_t)k->value);
    size_t len = 9;
    if (k->expires_us != KF__NO_TIME) {
        kf_put_be64(v + 9, (uint64_t)k->expires_us);
        len = 17;
    }
    kf_ctx_put(ctx, KF_CF_STATE, &key, v, len);
}

static void timer_keys(const function_t *fn, const uint8_t *key, uint32_t key_len, size_t name,
                       int64_t at_us, kf_key_t *by_key, kf_key_t *by_time) {
    const char *n = fn->desc->timer_names[name];
    if (by_key != NULL) {
        kf__key_prefix(by_key, fn);
        kf_key_lp(by_key, (const char *)key, key_len);
        kf_key_lp(by_key, n, fn->timer_name_len[name]);
    }
    kf__key_prefix(by_time, fn);
    kf_key_time(by_time, at_us);
    kf_key_lp(by_time, (const char *)key, key_len);
    kf_key_lp(by_time, n, fn->timer_name_len[name]);
}

/* Whether a timer record due at at_us is inside the step's range delete. */
static bool fired_span_covers(const step_t *s, int64_t at_us) {
    return at_us < s->fired_before_us; /* never when KF__NO_TIME (INT64_MIN) */
}

static void write_timer_diff(const step_t *s, const fn_key_t *k, uint8_t name, int64_t old_at,
                             int64_t new_at) {
    kf_ctx_t *ctx = s->ctx;
    const function_t *fn = s->fn;
    kf_key_t by_key, by_time;
    if (old_at != KF__NO_TIME) {
        if (!fired_span_covers(s, old_at)) {
            timer_keys(fn, k->key, k->key_len, name, old_at, NULL, &by_time);
            kf_ctx_delete(ctx, KF_CF_TIMERS_BY_TIME, &by_time);
        }
        if (new_at == KF__NO_TIME) {
            timer_keys(fn, k->key, k->key_len, name, old_at, &by_key, &by_time);
            kf_ctx_delete(ctx, KF_CF_TIMERS_BY_KEY, &by_key);
        }
    }
    if (new_at != KF__NO_TIME) {
        timer_keys(fn, k->key, k->key_len, name, new_at, &by_key, &by_time);
        uint8_t v[8];
        kf_put_be64(v, kf_i64_ordered(new_at));
        kf_ctx_put(ctx, KF_CF_TIMERS_BY_KEY, &by_key, v, sizeof v);
        kf_ctx_put(ctx, KF_CF_TIMERS_BY_TIME, &by_time, "", 0);
    }
}

/* The stored timers_by_time records due before the last fired timer's
 * time: every timer due then fired or was removed (invariant 4). Not that
 * due time itself: its records lie by key and name length first, and a
 * step that stops inside it (max_timer_callbacks_per_step, a key in a
 * call) fired a prefix in (at_us, key, name) order that is no range on
 * disk; write_timer_diff deletes those one by one.
 * The range starts at the due time of the earliest timer the step started
 * with, not at the function's first possible key: every record before it
 * was deleted by an earlier step. Ranges that all began at the function's
 * prefix nested inside each other, and RocksDB 7.8 fragments a memtable's
 * range tombstones at flush keeping every overlapping sequence number:
 * quadratic in the tombstones, it took over 1 GiB of RSS at one flush of
 * a soak's timers (bench/README.md, "Soak"). Starting at the step's first
 * timer makes consecutive steps' ranges disjoint. */
static void delete_fired_span(const step_t *s) {
    if (s->first_timer_at0 != KF__NO_TIME && s->first_timer_at0 >= s->fired_before_us) {
        return; /* the step fired only timers of its first due time */
    }
    kf_key_t begin, end;
    kf__key_prefix(&begin, s->fn);
    if (s->first_timer_at0 != KF__NO_TIME) {
        kf_key_time(&begin, s->first_timer_at0);
    }
    kf__key_prefix(&end, s->fn);
    kf_key_time(&end, s->fired_before_us);
    kf_batch_delete_range(s->ctx->batch, KF_CF_TIMERS_BY_TIME, begin.bytes, begin.len, end.bytes,
                          end.len);
}

void kf__put_checkpoint(kf_ctx_t *ctx, const function_t *fn) {
    Keyflow__Records__CheckpointRec cp = KEYFLOW__RECORDS__CHECKPOINT_REC__INIT;
    cp.codec_version = KF__STATE_CODEC_VERSION;
    cp.descriptor_sha256 = (char *)fn->sha256;
    cp.has_watermark = fn->has_watermark;
    cp.watermark_us = fn->watermark_us;
    /* A step in progress has moved next_activation; what is stored is the
     * state before it (the step's commit writes the checkpoint again). */
    cp.next_activation_id = fn->active != NULL ? fn->active->next_activation0 : fn->next_activation;
    cp.output_seq = fn->output_seq;
    cp.trimmed_seq = fn->trimmed_seq;
    cp.purged_seq = fn->purged_seq;
    cp.retained_bytes = fn->retained_bytes;
    kf_key_t k;
    kf__key_prefix(&k, fn);
    kf_ctx_put_msg(ctx, KF_CF_CHECKPOINTS, &k, &cp.base);
}

/* Writes everything the step changed, in the context's batch; the output
 * sequence numbers it wrote go into first/last (0 when none). */
static void commit(step_t *s, int64_t *first_seq, int64_t *last_seq) {
    function_t *fn = s->fn;
    kf_ctx_t *ctx = s->ctx;
    s->fired_before_us = s->last_fired.owner != NULL ? s->last_fired.at_us : KF__NO_TIME;
    if (s->fired_before_us != KF__NO_TIME) {
        delete_fired_span(s);
    }
    /* The keys this step leaves empty are freed below, in the step's order,
     * which is random over the key map's buckets: fetch those buckets
     * first, so their cache misses overlap (bench/README.md: the removals
     * were half the engine's time while a backlog of timers fired). */
    for (size_t i = 0; i < s->nundo; i++) {
        if (!kf__key_live(fn, s->undo[i].key)) {
            kf_map_prefetch(&fn->keys, &s->undo[i].key->node);
        }
    }
    for (size_t i = 0; i < s->nundo; i++) {
        undo_t *u = &s->undo[i];
        fn_key_t *k = u->key;
        k->step_mark = 0;
        if (u->state != k->state || (k->state == KF_STATE_VALUE && u->value != k->value) ||
            u->expires_us != k->expires_us) {
            put_state(ctx, fn, k);
        }
        for (size_t t = 0; t < fn->desc->n_timer_names; t++) {
            int64_t now_at = k->timers && k->timers[t] ? k->timers[t]->at_us : KF__NO_TIME;
            if (now_at != u->at[t]) {
                write_timer_diff(s, k, (uint8_t)t, u->at[t], now_at);
            }
        }
        if (!kf__key_live(fn, k)) {
            kf_map_remove(&fn->keys, &k->node);
            kf__key_free(fn, k);
        }
    }
    *first_seq = *last_seq = 0;
    if (s->out.rows > 0) {
        *first_seq = (int64_t)fn->output_seq + 1;
        for (uint32_t from = 0; from < s->out.rows; from += KF_OUTPUT_CHUNK_ROWS_MAX) {
            uint32_t n = s->out.rows - from;
            if (n > KF_OUTPUT_CHUNK_ROWS_MAX) {
                n = KF_OUTPUT_CHUNK_ROWS_MAX;
            }
            /* Each chunk is encoded in its own short-lived arena, so a step
             * with many output rows needs memory for one chunk's encoding
             * at a time. */
            kf_arena_t chunk_arena;
            kf_arena_init(&chunk_arena, 0);
            Keyflow__V1__RowBatch *chunk = kf_outbuf_to_batch(&s->out, from, n, &chunk_arena);
            KF_ASSERT(chunk != NULL); /* one chunk is bounded by KF_OUTPUT_CHUNK_ROWS_MAX rows */
            fn->output_seq += n;
            kf__output_put_chunk(ctx, fn, chunk, n);
            kf_arena_deinit(&chunk_arena);
        }
        *last_seq = (int64_t)fn->output_seq;
        kf_counter_add(KF_C_OUTPUT_ROWS, s->out.rows);
        kf__output_written(s->fns, fn, ctx->group_id);
    }
    kf__put_checkpoint(ctx, fn);
}

/* ---- a call's response: validate, then apply --------------------------- */

/* Checks the whole response (invariant 1) before anything is applied. */
static kf_status_t validate(kf_call_t *call) {
    step_t *s = call->step;
    function_t *fn = s->fn;
    if (call->failed) {
        return kf_error_set(s->err, call->fail_status,
                            "handler response rejected, nothing applied: %s", call->message);
    }
    if (call->cur_row >= 0) {
        return kf_error_set(
            s->err, KF_E_PRECONDITION,
            "handler response rejected, nothing applied: an output row was begun but "
            "not ended");
    }
    /* Per step: with calls out at once (a pipelining host) the host's own
     * checks saw only the calls taken before; this one is exact. */
    if ((int64_t)s->out.rows + call->out.rows > fn->limits.max_output_rows) {
        return kf_error_set(s->err, KF_E_LIMIT,
                            "handler response rejected, nothing applied: max_output_rows: the "
                            "step would write %llu output rows (limit %lld per step)",
                            (unsigned long long)s->out.rows + call->out.rows,
                            (long long)fn->limits.max_output_rows);
    }
    if ((int64_t)(s->out.bytes + call->out.bytes) > fn->limits.max_output_bytes) {
        return kf_error_set(s->err, KF_E_LIMIT,
                            "handler response rejected, nothing applied: max_output_bytes: the "
                            "step would write %llu bytes of output (limit %lld per step)",
                            (unsigned long long)(s->out.bytes + call->out.bytes),
                            (long long)fn->limits.max_output_bytes);
    }
    const Keyflow__V1__Schema *os = fn->desc->output_schema;
    for (uint32_t r = 0; r < call->out.rows; r++) {
        const kf_cell_t *cells = kf_outbuf_row(&call->out, r);
        const kf_activation_t *a = &call->acts[call->row_act[r]];
        for (size_t c = 0; c < os->n_fields; c++) {
            if (!os->fields[c]->nullable && (!cells[c].set || cells[c].null)) {
                return kf_error_set(s->err, KF_E_PRECONDITION,
                                    "handler response rejected, nothing applied: output row of "
                                    "activation %" PRIu64 " (key %s) has no value for non-nullable "
                                    "column %s",
                                    a->id, a->key_text, os->fields[c]->name);
            }
        }
        int64_t ts = cells[fn->out_event_col].v.i;
        if (ts < a->event_time_us) {
            return kf_error_set(s->err, KF_E_PRECONDITION,
                                "handler response rejected, nothing applied: output row of "
                                "activation %" PRIu64 " has %s %" PRId64
                                ", before the activation's "
                                "event time %" PRId64,
                                a->id, os->fields[fn->out_event_col]->name, ts, a->event_time_us);
        }
    }
    return KF_OK;
}

/* When a value written by activation `a` expires: state_ttl_us after its
 * event time (saturating), or never. */
static int64_t expiry_of(const function_t *fn, const kf_activation_t *a) {
    int64_t ttl = fn->desc->state_ttl_us;
    return ttl > 0 ? kf_time_add_sat(a->event_time_us, ttl) : KF__NO_TIME;
}

static void apply(kf_call_t *call) {
    step_t *s = call->step;
    function_t *fn = s->fn;
    for (uint32_t i = 0; i < call->ntops; i++) {
        timer_op_t *t = &call->tops[i];
        fn_key_t *k = call->keys[t->act];
        touch(s, k, true);
        kf__key_set_timer(fn, k, (uint8_t)t->name, t->op == KF__TOP_SET ? t->at_us : KF__NO_TIME);
    }
    for (uint32_t i = 0; i < call->count; i++) {
        result_t *r = &call->res[i];
        fn_key_t *k = call->keys[i];
        switch (r->mutation) {
        case KF__MUT_UNCHANGED: break;
        case KF__MUT_SET:
            touch(s, k, true);
            kf__key_set_state(fn, k, KF_STATE_VALUE, r->value, expiry_of(fn, &call->acts[i]));
            break;
        case KF__MUT_SET_NULL:
            touch(s, k, true);
            kf__key_set_state(fn, k, KF_STATE_NULL, 0, expiry_of(fn, &call->acts[i]));
            break;
        case KF__MUT_CLEAR:
            touch(s, k, true);
            kf__key_set_state(fn, k, KF_STATE_ABSENT, 0, KF__NO_TIME);
            break;
        default: KF_UNREACHABLE();
        }
    }
}

/* One aggregate limit after a call was applied: refused when the count
 * passed the limit (a SPLIT function's: this partition's share of it) and
 * grew in this step, so that a function already past a share it did not
 * have before (registered before placement existed) still takes batches
 * that do not add to it. */
static kf_status_t check_limit(step_t *s, const char *name, const char *what, uint64_t now,
                               uint64_t before, int64_t share, int64_t limit) {
    if ((int64_t)now <= share || now <= before) {
        return KF_OK;
    }
    const function_t *fn = s->fn;
    if (!fn->split) {
        return kf_error_set(s->err, KF_E_LIMIT,
                            "%s: the batch would leave %llu %s (limit %lld); nothing applied", name,
                            (unsigned long long)now, what, (long long)limit);
    }
    return kf_error_set(s->err, KF_E_LIMIT,
                        "%s: the batch would leave %llu %s in partition %u, whose share of the "
                        "SPLIT function's limit of %lld is %lld (docs/scaling.md); nothing applied "
                        "in this partition",
                        name, (unsigned long long)now, what, s->fns->config->partition_index,
                        (long long)limit, (long long)share);
}

/* Aggregate limits after a call was applied (rolled back by the caller). */
static kf_status_t check_limits(step_t *s) {
    function_t *fn = s->fn;
    kf_status_t st;
    if ((st = check_limit(s, "max_keys", "keys with state or timers", fn->live_keys, s->live_keys0,
                          fn->share_keys, fn->limits.max_keys)) != KF_OK ||
        (st = check_limit(s, "max_timers", "timers", fn->timer_count, s->timer_count0,
                          fn->share_timers, fn->limits.max_timers)) != KF_OK ||
        (st = check_limit(s, "max_state_bytes", "bytes of state", fn->state_bytes, s->state_bytes0,
                          fn->share_state_bytes, fn->limits.max_state_bytes)) != KF_OK) {
        return st;
    }
    return kf__step_memory_check(s);
}

/* Remembers the input row of each output row a call added to the step's
 * output, so that restore_row_order can put a pipelined step's output back
 * in input order. Timer activations sort after every row. */
static kf_status_t note_output_rows(step_t *s, const kf_call_t *call, uint32_t first) {
    if (s->out.rows > s->out_row_cap) {
        uint32_t cap = s->out_row_cap ? s->out_row_cap : 1024;
        while (cap < s->out.rows) {
            cap *= 2;
        }
        uint32_t *p = kf_arena_alloc(s->arena, (size_t)cap * sizeof *p);
        if (p == NULL) {
            return kf_error_set(s->err, KF_E_LIMIT, "output: out of memory for this step");
        }
        if (first > 0) {
            memcpy(p, s->out_row, (size_t)first * sizeof *p);
        }
        s->out_row = p;
        s->out_row_cap = cap;
    }
    for (uint32_t r = 0; r < call->out.rows; r++) {
        const kf_activation_t *a = &call->acts[call->row_act[r]];
        s->out_row[first + r] = a->callback == KF_CALLBACK_ROW ? a->row : UINT32_MAX;
    }
    return KF_OK;
}

/* Validates a call's response, then applies it (invariant 1). */
static kf_status_t take_response(kf_call_t *call) {
    step_t *s = call->step;
    kf_status_t st = validate(call);
    if (st != KF_OK) {
        return st;
    }
    apply(call);
    if ((st = check_limits(s)) != KF_OK) {
        return st;
    }
    if (call->out.rows > 0) {
        uint32_t first = s->out.rows;
        st = kf_outbuf_append_from(&s->out, &call->out, 0, call->out.rows, s->err);
        if (st == KF_OK && s->lookahead) {
            st = note_output_rows(s, call, first);
        }
    }
    return st;
}

/* A pipelined step took rows out of order (a call took a row while an
 * earlier one waited for its key): a stable counting sort of the output by
 * input row restores what one call at a time would have produced. */
static kf_status_t restore_row_order(step_t *s) {
    uint32_t n = s->out.rows;
    uint32_t nrows = s->rows->count;
    uint32_t *start = kf_arena_zalloc(s->arena, ((size_t)nrows + 2) * sizeof *start);
    kf_cell_t *cells = kf_arena_alloc(s->arena, (size_t)n * s->out.ncols * sizeof *cells);
    if (start == NULL || (cells == NULL && n > 0)) {
        return kf_error_set(s->err, KF_E_LIMIT, "output: out of memory for this step");
    }
    for (uint32_t r = 0; r < n; r++) {
        uint32_t key = s->out_row[r] == UINT32_MAX ? nrows : s->out_row[r];
        start[key + 1]++;
    }
    for (uint32_t k = 0; k <= nrows; k++) {
        start[k + 1] += start[k];
    }
    for (uint32_t r = 0; r < n; r++) {
        uint32_t key = s->out_row[r] == UINT32_MAX ? nrows : s->out_row[r];
        memcpy(cells + (size_t)start[key]++ * s->out.ncols, kf_outbuf_row(&s->out, r),
               s->out.ncols * sizeof *cells);
    }
    s->out.cells = cells;
    s->out.cap = n;
    return KF_OK;
}

/* ---- the step machine -------------------------------------------------- */

/* A call object of the step, reused once taken. */
static kf_call_t *call_get(step_t *s) {
    kf_call_t *call = s->spare;
    if (call != NULL) {
        s->spare = call->next_spare;
    } else {
        call = kf_arena_new(s->arena, sizeof *call);
        kf__call_init(call, s, (uint32_t)s->fn->limits.max_batch_rows);
    }
    kf__call_reset(call);
    return call;
}

/* The call's keys may go into other calls again. */
static void call_put(step_t *s, kf_call_t *call) {
    for (uint32_t i = 0; i < call->count; i++) {
        call->keys[i]->in_call = 0;
    }
    call->count = 0;
    call->next_spare = s->spare;
    s->spare = call;
}

/* The key of input row i, created (and snapshotted) on first sight. */
static fn_key_t *row_key(step_t *s, uint32_t i) {
    if (s->lookahead && s->row_key[i] != NULL) {
        return s->row_key[i];
    }
    function_t *fn = s->fn;
    char *text;
    size_t text_len;
    bool owned;
    size_t klen = kf__key_of_row(s->fns, fn, s->rows, i, &text, &text_len, &owned);
    fn_key_t *k = kf__key_find(fn, s->fns->scratch, klen);
    if (k == NULL) {
        k = kf__key_new(fn, s->fns->scratch, klen, text, text_len);
        touch(s, k, false);
    }
    if (owned) {
        free(text);
    }
    if (s->lookahead) {
        s->row_key[i] = k;
    }
    return k;
}

/* Rows phase, one call at a time: rows in arrival order; a call ends at
 * max_batch_rows activations or when the next row's key already has an
 * activation in it. */
static void build_row_call(step_t *s, kf_call_t *call) {
    function_t *fn = s->fn;
    const kf_rows_t *rows = s->rows;
    uint32_t stamp = ++s->fns->call_counter;
    while (s->row_pos < rows->count && call->count < (uint32_t)fn->limits.max_batch_rows) {
        uint32_t i = s->row_pos;
        fn_key_t *k = row_key(s, i);
        if (k->call_mark == stamp) {
            break; /* a second row of this key: next call */
        }
        k->call_mark = stamp;
        kf_cell_t event_time; /* TIMESTAMP_US, not nullable */
        kf_rows_value(rows, i, (uint32_t)fn->event_col, &event_time);
        kf__call_add(call, k, s->next_activation0 + i, KF_CALLBACK_ROW, i, event_time.v.i, NULL);
        s->row_pos++;
    }
}

/* Rows phase, pipelined: the unassigned rows in arrival order, skipping a
 * row whose key is in a call out, or was skipped or taken earlier in this
 * scan (a key's rows stay in order: each activation sees the state its
 * previous row left). At most max_batch_rows rows are skipped per call,
 * which bounds the scan. Activation ids are the rows' (base + row index),
 * as one call at a time would number them. */
static void build_row_call_ahead(step_t *s, kf_call_t *call) {
    function_t *fn = s->fn;
    const kf_rows_t *rows = s->rows;
    uint32_t cap = (uint32_t)fn->limits.max_batch_rows;
    uint32_t stamp = ++s->fns->call_counter;
    uint32_t skipped = 0;
    uint32_t prev = UINT32_MAX;
    for (uint32_t i = s->first_row; i < rows->count && call->count < cap && skipped < cap;) {
        uint32_t next = s->next_row[i];
        fn_key_t *k = row_key(s, i);
        bool blocked = k->call_mark == stamp || k->in_call;
        k->call_mark = stamp;
        if (blocked) {
            skipped++;
            prev = i;
            i = next;
            continue;
        }
        if (prev == UINT32_MAX) {
            s->first_row = next;
        } else {
            s->next_row[prev] = next;
            s->reordered = true;
        }
        kf_cell_t event_time; /* TIMESTAMP_US, not nullable */
        kf_rows_value(rows, i, (uint32_t)fn->event_col, &event_time);
        kf__call_add(call, k, s->next_activation0 + i, KF_CALLBACK_ROW, i, event_time.v.i, NULL);
        i = next;
    }
}

/* The next call of the timers phase: due timers in (at_us, key, name)
 * order, one per key, until the step has fired max_timer_callbacks_per_step
 * (the rest wait for the next step); it stops at a timer whose key is in a
 * call out (that call may cancel or move it). */
static void build_timer_call(step_t *s, kf_call_t *call) {
    function_t *fn = s->fn;
    int64_t left = fn->limits.max_timer_callbacks - s->timer_callbacks;
    uint32_t per_call = (uint32_t)fn->limits.max_batch_rows;
    if (left < (int64_t)per_call) {
        per_call = (uint32_t)left;
    }
    uint32_t stamp = ++s->fns->call_counter;
    ev_timer_t *t;
    while ((t = kf__timer_top(fn)) != NULL && t->at_us <= s->watermark && call->count < per_call) {
        fn_key_t *k = t->owner;
        if (k->call_mark == stamp || k->in_call) {
            break; /* another timer of a key already in a call */
        }
        k->call_mark = stamp;
        int64_t at = t->at_us;
        uint8_t name = t->name;
        touch(s, k, true);
        s->last_fired.owner = k;
        s->last_fired.name = name;
        s->last_fired.at_us = at;
        kf__key_set_timer(fn, k, name, KF__NO_TIME); /* fired: gone unless set again */
        kf__call_add(call, k, fn->next_activation++, KF_CALLBACK_TIMER, 0, at,
                     fn->desc->timer_names[name]);
        s->timer_callbacks++;
    }
}

/* The watermark advanced: values whose expiry it reached are cleared now,
 * in (expires_us, key) order, before the due timers of the step fire (they
 * see the value absent). No handler call; each is one stored delete. */
static void expire_values(step_t *s) {
    function_t *fn = s->fn;
    fn_key_t *k;
    while ((k = kf__expiry_top(fn)) != NULL && k->expires_us <= s->watermark) {
        touch(s, k, true);
        kf__key_set_state(fn, k, KF_STATE_ABSENT, 0, KF__NO_TIME);
        s->expired++;
    }
}

typedef enum next_call {
    NEXT_CALL,    /* `call` holds activations: send it */
    NEXT_BLOCKED, /* the next activation's key is in a call out: wait */
    NEXT_DONE,    /* nothing left to call */
} next_call_t;

/* Builds the step's next call into `call`. The watermark advances between
 * the rows and the timers, once no row call is out. */
static next_call_t next_call(step_t *s, kf_call_t *call) {
    if (!s->timers_phase) {
        bool rows_left = s->lookahead ? s->first_row < s->rows->count : s->row_pos < s->rows->count;
        if (rows_left) {
            if (s->lookahead) {
                build_row_call_ahead(s, call);
            } else {
                build_row_call(s, call);
            }
            return call->count > 0 ? NEXT_CALL : NEXT_BLOCKED;
        }
        if (s->nout > 0) {
            return NEXT_BLOCKED; /* their responses may set timers due in this step */
        }
        const Keyflow__V1__PushBatchRequest *req = s->req;
        if (req != NULL &&
            req->watermark_present_case ==
                KEYFLOW__V1__PUSH_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US &&
            (!s->has_watermark || req->watermark_us > s->watermark)) {
            s->has_watermark = true; /* watermarks never go back: a lower one is ignored */
            s->watermark = req->watermark_us;
            expire_values(s);
        }
        s->timers_phase = true;
        s->fn->next_activation = s->next_activation0 + s->rows->count;
    }
    ev_timer_t *top = kf__timer_top(s->fn);
    if (s->has_watermark && top != NULL && top->at_us <= s->watermark &&
        s->timer_callbacks < s->fn->limits.max_timer_callbacks) {
        build_timer_call(s, call);
        return call->count > 0 ? NEXT_CALL : NEXT_BLOCKED;
    }
    return NEXT_DONE;
}

static void step_finish(step_t *s, kf_status_t st);

/* Runs the step as far as it can: takes the answered calls in the order
 * they went out, sends new ones while the host has room, and finishes when
 * nothing is left, or waits (s->awaiting) for a response or for room. */
static void step_advance(step_t *s) {
    function_t *fn = s->fn;
    for (;;) {
        while (s->nout > 0 && s->calls_out[s->out_head]->answered) {
            kf_call_t *call = s->calls_out[s->out_head];
            s->out_head = (s->out_head + 1) % KF_FN_CALLS_IN_FLIGHT_MAX;
            s->nout--;
            kf_status_t st = take_response(call);
            call_put(s, call);
            if (st != KF_OK) {
                step_finish(s, st);
                return;
            }
        }
        int room = fn->host->room(s->fns, fn);
        if (room < 0 && s->nout == 0) {
            step_finish(s, kf_error_set(s->err, KF_E_UNAVAILABLE,
                                        "function %s is unavailable: %s; nothing applied", fn->id,
                                        fn->unavailable));
            return;
        }
        if (room > 0 && s->nout < KF_FN_CALLS_IN_FLIGHT_MAX) {
            kf_call_t *call = call_get(s);
            next_call_t next = next_call(s, call);
            if (next == NEXT_CALL) {
                s->calls_out[(s->out_head + s->nout) % KF_FN_CALLS_IN_FLIGHT_MAX] = call;
                s->nout++;
                if (kf__call_send(call) == KF__CALL_ANSWERED) {
                    call->answered = true;
                }
                continue;
            }
            call_put(s, call);
            if (next == NEXT_DONE && s->nout == 0) {
                step_finish(s, KF_OK);
                return;
            }
            /* NEXT_BLOCKED waits for a call out; so does NEXT_DONE. */
            KF_ASSERT(s->nout > 0);
        }
        s->awaiting = true; /* kf__step_resume() goes on */
        s->busy_us += kf_mono_us() - s->resumed_us;
        return;
    }
}

/* ---- due timers: the list of functions with follow-on steps to run ----- */

static bool at_or_before(const kf_ostree_node_t *n, const void *watermark) {
    return KF_CONTAINER_OF(n, ev_timer_t, node)->at_us <= *(const int64_t *)watermark;
}

uint64_t kf__due_timers(const function_t *fn) {
    if (!fn->has_watermark) {
        return 0;
    }
    return kf_ostree_count_prefix(&fn->timers, at_or_before, &fn->watermark_us);
}

static bool has_due(const function_t *fn) {
    const ev_timer_t *top = kf__timer_top(fn);
    return fn->has_watermark && top != NULL && top->at_us <= fn->watermark_us;
}

void kf__due_unlink(kf_functions_t *fns, function_t *fn) {
    if (!fn->in_due) {
        return;
    }
    if (fn->due_prev) {
        fn->due_prev->due_next = fn->due_next;
    } else {
        fns->due_head = fn->due_next;
    }
    if (fn->due_next) {
        fn->due_next->due_prev = fn->due_prev;
    } else {
        fns->due_tail = fn->due_prev;
    }
    fn->due_next = fn->due_prev = NULL;
    fn->in_due = false;
}

/* Follow-on steps may run: due timers, no refusal pending (a lost worker is
 * none: due_refused), and a host that takes calls (a remote function
 * without a worker waits, and re-enters the list through kf__step_resume
 * when one says hello). */
void kf__due_update(kf_functions_t *fns, function_t *fn) {
    bool runnable = fn->host != NULL && (fn->due_error[0] == '\0' || fn->due_retry) &&
                    has_due(fn) && fn->host->room(fns, fn) >= 0;
    if (runnable == fn->in_due) {
        return;
    }
    if (!runnable) {
        kf__due_unlink(fns, fn);
        return;
    }
    fn->due_prev = fns->due_tail;
    fn->due_next = NULL;
    if (fns->due_tail) {
        fns->due_tail->due_next = fn;
    } else {
        fns->due_head = fn;
    }
    fns->due_tail = fn;
    fn->in_due = true;
}

/* Whether a PushBatch must wait (invariant 3): a step is active, or due
 * timers wait for follow-on steps that can run. */
static bool fn_busy(const function_t *fn) {
    return fn->active != NULL || fn->in_due;
}

/* ---- the end of a step ------------------------------------------------- */

/* A refused follow-on step: nothing of it is applied, and GetFunction shows
 * why. A refusal of the handler's (or a limit's) stops the follow-on steps:
 * the due timers wait for the function's next PushBatch, whose step fires
 * them first and reports the refusal to its producer. UNAVAILABLE is no
 * verdict on the timers (its remote worker was lost): the follow-on steps
 * run again as soon as a worker can take them, as they do for timers that
 * fell due while no worker was connected, since the producers may have
 * nothing more to push. */
static void due_refused(step_t *s) {
    function_t *fn = s->fn;
    snprintf(fn->due_error, sizeof fn->due_error, "%s", s->err->message);
    fn->due_retry = s->err->status == KF_E_UNAVAILABLE;
    kf_log_kv(KF_LOG_WARN, "functions",
              fn->due_retry ? "timer step failed; due timers wait for a worker"
                            : "timer step refused; due timers wait for the next batch",
              KF_LOG_STR("function_id", fn->id), KF_LOG_STR("reason", s->err->message),
              KF_LOG_INT("due_timers", (int64_t)kf__due_timers(fn)));
}

/* ---- a dry run's answer ------------------------------------------------ */

static Keyflow__V1__TimerState **timers_of(kf_arena_t *a, const function_t *fn, const int64_t *at,
                                           size_t *n) {
    Keyflow__V1__TimerState **out = kf_arena_new(a, (fn->desc->n_timer_names + 1) * sizeof *out);
    *n = 0;
    for (size_t t = 0; t < fn->desc->n_timer_names; t++) {
        if (at[t] == KF__NO_TIME) {
            continue;
        }
        Keyflow__V1__TimerState *ts = kf_arena_new(a, sizeof *ts);
        keyflow__v1__timer_state__init(ts);
        ts->name = fn->desc->timer_names[t];
        ts->at_us = at[t];
        out[(*n)++] = ts;
    }
    return out;
}

static int undo_key_cmp(const void *a, const void *b) {
    const fn_key_t *x = (*(const undo_t *const *)a)->key, *y = (*(const undo_t *const *)b)->key;
    uint32_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, n);
    return c != 0 ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

/* What the step would write, read off its undo log and output before the
 * rollback: the step's counters, its output, and every key it changed. */
static kf_status_t dry_answer(step_t *s) {
    function_t *fn = s->fn;
    kf_cmd_t *cmd = s->cmd;
    kf_arena_t *a = cmd->arena;
    const Keyflow__V1__DryRunBatchRequest *dry =
        (const Keyflow__V1__DryRunBatchRequest *)cmd->request;
    Keyflow__V1__DryRunBatchResponse *r = kf_arena_new(a, sizeof *r);
    keyflow__v1__dry_run_batch_response__init(r);
    r->rows_accepted = s->rows->count;
    r->activations = s->activations;
    r->timer_callbacks = s->timer_callbacks;
    r->handler_calls = s->calls;
    r->watermark_us = s->has_watermark ? s->watermark : 0;
    r->due_timers =
        s->has_watermark ? kf_ostree_count_prefix(&fn->timers, at_or_before, &s->watermark) : 0;
    if (s->out.rows > 0) {
        r->first_output_seq = (int64_t)fn->output_seq + 1;
        bool json = dry->format == KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON;
        size_t len;
        if (json) {
            r->output_json =
                kf_outbuf_to_json(&s->out, 0, s->out.rows, r->first_output_seq, a, &len);
        } else {
            r->output = kf_outbuf_to_batch(&s->out, 0, s->out.rows, a);
        }
        if ((json && r->output_json == NULL) || (!json && r->output == NULL)) {
            return kf_error_set(s->err, KF_E_TOO_LARGE,
                                "the dry run's output (%u rows) is too large to answer",
                                s->out.rows);
        }
    }
    const undo_t **order = kf_arena_new(a, (s->nundo + 1) * sizeof *order);
    for (size_t i = 0; i < s->nundo; i++) {
        order[i] = &s->undo[i];
    }
    qsort(order, s->nundo, sizeof *order, undo_key_cmp);
    r->changes = kf_arena_new(a, (s->nundo + 1) * sizeof *r->changes);
    for (size_t i = 0; i < s->nundo; i++) {
        const undo_t *u = order[i];
        const fn_key_t *k = u->key;
        int64_t at[KF_TIMER_NAMES_MAX];
        bool changed =
            u->state != k->state || u->value != k->value || u->expires_us != k->expires_us;
        for (size_t t = 0; t < fn->desc->n_timer_names; t++) {
            at[t] = k->timers && k->timers[t] ? k->timers[t]->at_us : KF__NO_TIME;
            changed = changed || at[t] != u->at[t];
        }
        if (!changed) {
            continue;
        }
        Keyflow__V1__KeyChange *c = kf_arena_new(a, sizeof *c);
        keyflow__v1__key_change__init(c);
        c->key_text = kf_arena_strndup(a, k->key_text, k->key_text_len);
        c->state_before = (Keyflow__V1__StateKind)u->state;
        c->value_before = u->value;
        c->state_after = (Keyflow__V1__StateKind)k->state;
        c->value_after = k->value;
        c->state_expires_us = k->expires_us != KF__NO_TIME ? k->expires_us : 0;
        c->timers_before = timers_of(a, fn, u->at, &c->n_timers_before);
        c->timers_after = timers_of(a, fn, at, &c->n_timers_after);
        r->changes[r->n_changes++] = c;
    }
    cmd->response = &r->base;
    return KF_OK;
}

/* Ends a step: commit (and acknowledge a PushBatch), or abandon the calls
 * out, roll back and refuse; a dry run answers with its effects and rolls
 * back either way. Then frees a follow-on step. */
static void step_finish(step_t *s, kf_status_t st) {
    kf_functions_t *fns = s->fns;
    function_t *fn = s->fn;
    kf_ctx_t *ctx = s->ctx;
    kf_cmd_t *cmd = s->cmd;
    s->awaiting = false;
    if (st == KF_OK && s->reordered) {
        st = restore_row_order(s);
    }
    if (s->replay != NULL) {
        /* Invariant 1 of replay.c: compared, rolled back, never committed;
         * its scratch function goes with it. The native host it runs on
         * has no call out. */
        KF_ASSERT(s->nout == 0);
        kf__replay_answer(s, st);
        fn->active = NULL;
        rollback(s);
        free(s->undo);
        s->undo = NULL;
        kf_ctx_ready(ctx, cmd);
        kf__replay_scratch_free(fn);
        return;
    }
    if (st == KF_OK && s->dry) {
        KF_ASSERT(s->nout == 0);
        st = dry_answer(s);
        fn->active = NULL;
        rollback(s);
        if (st == KF_OK) {
            kf_ctx_ready(ctx, cmd);
        } else {
            kf_ctx_fail(ctx, cmd);
        }
    } else if (st != KF_OK) {
        /* Calls still out are forgotten: their responses, if any come, are
         * dropped by the host; their keys are free before rollback frees
         * the keys this step made. */
        for (; s->nout > 0; s->nout--) {
            kf_call_t *call = s->calls_out[s->out_head];
            s->out_head = (s->out_head + 1) % KF_FN_CALLS_IN_FLIGHT_MAX;
            if (!call->answered) {
                fn->host->abandon(fns, fn, call);
            }
            call_put(s, call);
        }
        fn->active = NULL;
        rollback(s);
        if (cmd != NULL) {
            kf_ctx_fail(ctx, cmd);
        } else {
            due_refused(s);
        }
    } else {
        KF_ASSERT(s->nout == 0);
        fn->active = NULL;
        if (cmd != NULL) {
            kf__replay_keep(s); /* before commit frees keys and moves the watermark */
        }
        fn->has_watermark = s->has_watermark;
        fn->watermark_us = s->watermark;
        fn->due_error[0] = '\0';
        fn->due_retry = false;
        int64_t first_seq, last_seq;
        commit(s, &first_seq, &last_seq);
        kf__step_memory_commit(s);
        kf_counter_add(KF_C_EVENT_TIMERS_FIRED, (uint64_t)s->timer_callbacks);
        if (cmd != NULL) {
            Keyflow__V1__PushBatchResponse *ack = kf_arena_new(cmd->arena, sizeof *ack);
            keyflow__v1__push_batch_response__init(ack);
            ack->rows_accepted = s->rows->count;
            ack->activations = s->activations;
            ack->timer_callbacks = s->timer_callbacks;
            ack->handler_calls = s->calls;
            ack->watermark_us = fn->has_watermark ? fn->watermark_us : 0;
            ack->sequence = s->req->sequence;
            ack->first_output_seq = first_seq;
            ack->last_output_seq = last_seq;
            if (fns->config->partition_count > 1 && first_seq > 0) {
                /* Sequences are this partition's own: a batch passed on to
                 * one partition as it is must still say which (the router
                 * merges these ranges when a batch reaches several). */
                Keyflow__V1__OutputRange *range = kf_arena_new(cmd->arena, sizeof *range);
                keyflow__v1__output_range__init(range);
                range->partition = (int32_t)fns->config->partition_index;
                range->first_seq = first_seq;
                range->last_seq = last_seq;
                ack->output_ranges = kf_arena_new(cmd->arena, sizeof *ack->output_ranges);
                ack->output_ranges[0] = range;
                ack->n_output_ranges = 1;
            }
            ack->due_timers = (int64_t)kf__due_timers(fn);
            producer_t *p = kf__producer_get(fn, s->req->producer_id, true);
            if (p->owner[0] == '\0') {
                /* The first key to push under a producer owns it from then on. */
                strcpy(p->owner, kf_principal_id(cmd->principal));
            }
            producer_remember(p, s->req->sequence, &ack->base, s->digest);
            kf__producer_touch(fn, p, ctx->now_ms);
            put_producer(ctx, fn, p);
            kf_counter_add(KF_C_INPUT_ROWS, s->rows->count);
            cmd->response = &ack->base;
            kf_ctx_ready(ctx, cmd);
        }
    }
    free(s->undo);
    s->undo = NULL;
    kf__due_update(fns, fn);
    kf_histogram_observe_us(KF_H_FN_STEP_SECONDS, s->busy_us + kf_mono_us() - s->resumed_us);
    if (cmd == NULL) {
        kf_arena_deinit(&s->own_arena);
        free(s);
    }
}

/* ---- PushBatch --------------------------------------------------------- */

/* The parts of a step every kind shares; the function must be idle. */
static void step_start(step_t *s, kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn,
                       kf_arena_t *arena, kf_error_t *err) {
    KF_ASSERT(fn->active == NULL);
    s->fns = fns;
    s->fn = fn;
    s->ctx = ctx;
    s->arena = arena;
    s->has_watermark = fn->has_watermark;
    s->watermark = fn->watermark_us;
    s->mark = ++fns->step_counter;
    if (s->mark == 0) {
        s->mark = ++fns->step_counter; /* 0 means "not touched" */
    }
    s->live_keys0 = fn->live_keys;
    s->timer_count0 = fn->timer_count;
    s->state_bytes0 = fn->state_bytes;
    s->next_activation0 = fn->next_activation;
    s->due_timers0 = kf__due_timers(fn);
    const ev_timer_t *top = kf__timer_top(fn);
    s->first_timer_at0 = top != NULL ? top->at_us : KF__NO_TIME;
    s->err = err;
    s->resumed_us = kf_mono_us();
    kf_outbuf_init(&s->out, fn->desc->output_schema, arena);
    fn->active = s;
}

void kf__step_begin(step_t *s, kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn) {
    step_start(s, fns, ctx, fn, s->cmd->arena, &s->cmd->error);
    step_advance(s);
}

/* Decodes a batch's rows against the input schema and checks its keys; the
 * step (in the command's arena) holds them. NULL when they are refused
 * (the command is answered). */
static step_t *batch_rows(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn, kf_cmd_t *cmd,
                          const Keyflow__V1__PushBatchRequest *req) {
    kf_error_t *err = &cmd->error;
    step_t *s = kf_arena_new(cmd->arena, sizeof *s);
    kf_rows_t *rows = &s->rows_storage;
    kf_status_t st = KF_OK;
    const Keyflow__V1__Schema *schema = fn->desc->input_schema;
    if (req->rows_case == KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_BATCH) {
        st = kf_rows_from_batch(req->batch, schema, fn->limits.max_input_rows,
                                fn->limits.max_input_bytes, cmd->arena, rows, err);
    } else if (req->rows_case == KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_ROWS_JSON) {
        st = kf_rows_from_json(req->rows_json, strlen(req->rows_json), schema,
                               fn->limits.max_input_rows, fn->limits.max_input_bytes, cmd->arena,
                               rows, err);
    } else {
        rows->ncols = (uint32_t)schema->n_fields; /* a watermark-only batch */
    }
    uint32_t partitions = fns->config->partition_count;
    if (st == KF_OK && !fn->split && partitions > 1 && fn->home != fns->config->partition_index) {
        /* The router sends a SINGLE function's batches to its home
         * (docs/scaling.md); anything here would split the function. */
        cmd->foreign_partition = (int32_t)fn->home;
        st = kf_error_set(err, KF_E_NOT_OWNER,
                          "function %s keeps every key in its home, partition %u of %u, not in "
                          "partition %u, which took the batch",
                          fn->id, fn->home, partitions, fns->config->partition_index);
    }
    for (uint32_t i = 0; st == KF_OK && i < rows->count; i++) {
        size_t klen = 0;
        kf_partition_hasher_t hasher;
        kf_partition_hasher_init(&hasher);
        for (int c = 0; c < fn->nkey_cols; c++) {
            kf_cell_t value; /* UTF8 */
            kf_rows_value(rows, i, (uint32_t)fn->key_cols[c], &value);
            klen += 4 + value.len;
            kf_partition_hasher_column(&hasher, value.p, value.len);
        }
        uint32_t partition = fn->split ? kf_partition_hasher_partition(&hasher, partitions)
                                       : fns->config->partition_index;
        if (klen > KF_FUNCTION_KEY_BYTES_MAX) {
            st = kf_error_set(err, KF_E_TOO_LARGE, "rows[%u]: the key is %zu bytes (at most %d)", i,
                              klen, KF_FUNCTION_KEY_BYTES_MAX);
        } else if (partition != fns->config->partition_index) {
            /* The router splits a batch by key (docs/scaling.md); a row of
             * another partition here would split its key's state. */
            cmd->foreign_partition = (int32_t)partition;
            st = kf_error_set(err, KF_E_NOT_OWNER,
                              "rows[%u]: its key belongs to partition %u of %u, not to partition "
                              "%u, which took the batch",
                              i, partition, partitions, fns->config->partition_index);
        }
    }
    if (st != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return NULL;
    }
    s->rows = rows;
    s->cmd = cmd;
    s->req = req;
    return s;
}

/* Starts the step of a decoded batch (the function is idle). */
static void batch_run(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn, step_t *s) {
    kf_cmd_t *cmd = s->cmd;
    kf_error_t *err = &cmd->error;
    if (fn->host == NULL || fn->host->room(fns, fn) < 0) {
        kf_error_set(err, KF_E_UNAVAILABLE, "function %s is unavailable: %s", fn->id,
                     fn->unavailable);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    const kf_rows_t *rows = s->rows;
    s->lookahead = fn->host->pipelines;
    if (s->lookahead) {
        /* The unassigned rows as a list: row i is followed by row i + 1. */
        s->next_row = kf_arena_alloc(cmd->arena, ((size_t)rows->count + 1) * sizeof *s->next_row);
        s->row_key = kf_arena_zalloc(cmd->arena, ((size_t)rows->count + 1) * sizeof *s->row_key);
        if (s->next_row == NULL || s->row_key == NULL) {
            kf_error_set(err, KF_E_LIMIT, "rows: out of memory for this batch");
            kf_ctx_fail(ctx, cmd);
            return;
        }
        for (uint32_t i = 0; i < rows->count; i++) {
            s->next_row[i] = i + 1;
        }
        s->first_row = 0;
    }
    step_start(s, fns, ctx, fn, cmd->arena, err);
    step_advance(s);
}

/* Checks a PushBatch and starts its step (the function is idle). */
static void push_begin(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn, kf_cmd_t *cmd) {
    const Keyflow__V1__PushBatchRequest *req = (const Keyflow__V1__PushBatchRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    KF_ASSERT(fn->active == NULL);
    if (kf_check_identifier("producer_id", req->producer_id, KF_PRODUCER_ID_BYTES_MAX, true, err) !=
        KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (req->sequence < 1) {
        kf_error_set(err, KF_E_INVALID, "sequence: must be at least 1, got %lld",
                     (long long)req->sequence);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    producer_t *p = kf__producer_get(fn, req->producer_id, false);
    if (p != NULL && cmd->principal != NULL && p->owner[0] != '\0' &&
        strcmp(p->owner, kf_principal_id(cmd->principal)) != 0) {
        /* Else another tenant could push sequence INT64_MAX under it and
         * lock its producer out for good. */
        kf_error_set(err, KF_E_PERMISSION,
                     "producer_id: producer %s of function %s belongs to another API key", p->id,
                     fn->id);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    step_t *s = batch_rows(fns, ctx, fn, cmd, req);
    if (s == NULL) {
        return;
    }
    batch_digest(s->rows, req, s->digest);
    if (p != NULL && req->sequence <= p->last_sequence) {
        retry_t r = replay_ack(p, req->sequence, s->digest, cmd);
        if (r == RETRY_SAME) {
            kf__producer_touch(fn, p, ctx->now_ms); /* in memory: a retry writes nothing */
            kf_ctx_ready(ctx, cmd);
            return;
        }
        if (r == RETRY_CONFLICT) {
            kf_error_set(err, KF_E_EXISTS,
                         "sequence: %lld of producer %s was accepted with other rows or another "
                         "watermark; a retry must repeat its batch exactly (new content needs a "
                         "new sequence)",
                         (long long)req->sequence, p->id);
        } else {
            kf_error_set(err, KF_E_PRECONDITION,
                         "sequence: %lld is not after %lld, the last accepted from producer %s (if "
                         "%lld was accepted, its acknowledgement is no longer kept: only the last "
                         "%d are)",
                         (long long)req->sequence, (long long)p->last_sequence, p->id,
                         (long long)req->sequence, KF_PRODUCER_ACKS_KEPT);
        }
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (p == NULL && fn->producers.count >= KF_PRODUCERS_MAX) {
        kf_error_set(err, KF_E_LIMIT,
                     "producer_id: at most %d producers per function (KF_PRODUCERS_MAX)",
                     KF_PRODUCERS_MAX);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (p == NULL && kf__producer_admit(ctx, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    batch_run(fns, ctx, fn, s);
}

/* A DryRunBatch: its rows and watermark as the PushBatch they would be
 * (no producer: nothing is remembered), then the same step, marked dry
 * (step_finish answers with its effects and rolls it back). */
static void dry_begin(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn, kf_cmd_t *cmd) {
    const Keyflow__V1__DryRunBatchRequest *dry =
        (const Keyflow__V1__DryRunBatchRequest *)cmd->request;
    KF_ASSERT(fn->active == NULL);
    if ((int)dry->format < 0 || dry->format > KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON) {
        kf_error_set(&cmd->error, KF_E_INVALID, "format: must be COLUMNAR or JSON");
        kf_ctx_fail(ctx, cmd);
        return;
    }
    Keyflow__V1__PushBatchRequest *req = kf_arena_new(cmd->arena, sizeof *req);
    keyflow__v1__push_batch_request__init(req);
    req->function_id = dry->function_id;
    if (dry->rows_case == KEYFLOW__V1__DRY_RUN_BATCH_REQUEST__ROWS_BATCH) {
        req->rows_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_BATCH;
        req->batch = dry->batch;
    } else if (dry->rows_case == KEYFLOW__V1__DRY_RUN_BATCH_REQUEST__ROWS_ROWS_JSON) {
        req->rows_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_ROWS_JSON;
        req->rows_json = dry->rows_json;
    }
    if (dry->watermark_present_case ==
        KEYFLOW__V1__DRY_RUN_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US) {
        req->watermark_present_case =
            KEYFLOW__V1__PUSH_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US;
        req->watermark_us = dry->watermark_us;
    }
    step_t *s = batch_rows(fns, ctx, fn, cmd, req);
    if (s == NULL) {
        return;
    }
    s->dry = true;
    batch_run(fns, ctx, fn, s);
}

/* A queued command's step: a batch or a dry run. */
static void cmd_begin(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn, kf_cmd_t *cmd) {
    if (cmd->op == KF_OP_DRY_RUN_BATCH) {
        dry_begin(fns, ctx, fn, cmd);
    } else {
        KF_ASSERT(cmd->op == KF_OP_PUSH_BATCH);
        push_begin(fns, ctx, fn, cmd);
    }
}

/* Starts queued batches while the function is free (a step that finishes
 * at once leaves it free again). */
static void fn_drain(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn) {
    while (!fn_busy(fn) && fn->queue_head != NULL) {
        kf_cmd_t *cmd = fn->queue_head;
        fn->queue_head = cmd->next;
        if (fn->queue_head == NULL) {
            fn->queue_tail = NULL;
        }
        fn->queued--;
        kf_gauge_add(KF_G_BATCHES_QUEUED, -1);
        cmd->next = NULL;
        cmd->parked = NULL;
        cmd_begin(fns, ctx, fn, cmd);
    }
}

/* A busy function (invariant 3) holds later batches and dry runs: they
 * wait in order (bounded by KF_FN_QUEUED_MAX), since each step starts from
 * the state the previous one left. */
static void enter(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd, const char *function_id) {
    function_t *fn = kf__fn_require(fns, function_id, &cmd->error);
    if (fn == NULL) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (fn_busy(fn) || fn->queue_head != NULL) {
        if (fn->queued >= KF_FN_QUEUED_MAX) {
            kf_error_set(&cmd->error, KF_E_LIMIT,
                         "function %s: %d batches already wait for its handler or its due "
                         "timers",
                         fn->id, KF_FN_QUEUED_MAX);
            kf_ctx_fail(ctx, cmd);
            return;
        }
        cmd->next = NULL;
        cmd->parked = fn;
        if (fn->queue_tail) {
            fn->queue_tail->next = cmd;
        } else {
            fn->queue_head = cmd;
        }
        fn->queue_tail = cmd;
        fn->queued++;
        kf_gauge_add(KF_G_BATCHES_QUEUED, 1);
        return;
    }
    cmd_begin(fns, ctx, fn, cmd);
    fn_drain(fns, ctx, fn);
}

void kf_functions_push(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    enter(fns, ctx, cmd, ((const Keyflow__V1__PushBatchRequest *)cmd->request)->function_id);
}

void kf_functions_dry_run(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    enter(fns, ctx, cmd, ((const Keyflow__V1__DryRunBatchRequest *)cmd->request)->function_id);
}

/* ---- follow-on steps --------------------------------------------------- */

/* Starts a follow-on step of a function with due timers (it is free). */
static void due_begin(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn) {
    step_t *s = kf_xcalloc(1, sizeof *s);
    kf_arena_init(&s->own_arena, 0);
    s->rows = &s->rows_storage; /* none */
    s->rows_storage.ncols = (uint32_t)fn->desc->input_schema->n_fields;
    s->timers_phase = true;
    step_start(s, fns, ctx, fn, &s->own_arena, &s->own_error);
    step_advance(s);
}

bool kf_functions_has_due(const kf_functions_t *fns) {
    return fns->due_head != NULL;
}

uint32_t kf_functions_run_due(kf_functions_t *fns, kf_ctx_t *ctx, uint32_t steps_max) {
    uint32_t steps = 0;
    while (steps < steps_max && fns->due_head != NULL) {
        function_t *fn = fns->due_head;
        kf__due_unlink(fns, fn);
        if (fn->active != NULL) {
            continue; /* when that step ends it re-enters the list */
        }
        due_begin(fns, ctx, fn); /* re-enters the list (at the tail) while timers stay due */
        steps++;
        fn_drain(fns, ctx, fn);
    }
    return steps;
}

/* A response of the active step came in, or the host's room changed (a
 * remote worker came or went): go on, start batches queued behind the step
 * if it finished, and let due timers run again when they can. */
void kf__step_resume(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn) {
    step_t *s = fn->active;
    if (s == NULL || !s->awaiting) {
        kf__due_update(fns, fn);
        return;
    }
    s->awaiting = false;
    s->ctx = ctx;
    s->resumed_us = kf_mono_us();
    step_advance(s);
    fn_drain(fns, ctx, fn);
}

void kf__push_release_queued(kf_ctx_t *ctx, function_t *fn, kf_status_t status,
                             const char *message) {
    while (fn->queue_head != NULL) {
        kf_cmd_t *cmd = fn->queue_head;
        fn->queue_head = cmd->next;
        fn->queued--;
        kf_gauge_add(KF_G_BATCHES_QUEUED, -1);
        cmd->next = NULL;
        cmd->parked = NULL;
        kf_error_set(&cmd->error, status, "%s", message);
        kf_ctx_fail(ctx, cmd);
    }
    fn->queue_tail = NULL;
}

void kf__step_abort(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn, kf_status_t status,
                    const char *message) {
    step_t *s = fn->active;
    if (s == NULL) {
        return;
    }
    KF_ASSERT(s->fns == fns);
    s->ctx = ctx;
    s->resumed_us = kf_mono_us();
    step_finish(s, kf_error_set(s->err, status, "%s", message));
}
