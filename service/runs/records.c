/*
 * records.c - how runs are stored, and every read of them back (runs_int.h,
 * "stored forms"). Each record read passes a check here, so nothing past
 * this file meets an identifier, status, kind, policy or lease that the
 * engine could not have written.
 *
 * A run of RUN_LAYOUT_SPLIT is three records, none of which a state change
 * rewrites together with the input:
 *
 *   runs       run_id -> RunRec, the body (layout 1): written once at start
 *   run_live   seq    -> RunLiveRec: the state while live; each change
 *                        rewrites it, the finish deletes it
 *   run_state  run_id -> RunStateRec: the final state, written at the finish
 *
 * Older builds wrote one RunRec per run (layout 0, RUN_LAYOUT_WHOLE), state
 * included, and kept live runs' IDs in run_queue. Such a record still reads
 * as a body (its body fields are the same); while its run is live (migrated
 * at start, kf_runs_recover) or once it finished under this build, its
 * state is in run_live or run_state like any other run's.
 */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "runs/runs_int.h"

/* ---- writing --------------------------------------------------------------- */

void kf__run_save_body(kf_ctx_t *ctx, const run_t *r) {
    const run_body_t *b = r->body;
    KF_ASSERT(b != NULL);
    Keyflow__Records__RunRec rec;
    Keyflow__Records__RetryRec retry;
    keyflow__records__run_rec__init(&rec);
    rec.layout = KF_RUN_LAYOUT_SPLIT;
    rec.run_id = (char *)r->run_id;
    rec.workflow = r->wf->workflow;
    char key[KF_KEY_BYTES_MAX + 1];
    memcpy(key, r->run_id, r->key_len);
    key[r->key_len] = '\0';
    rec.key = key;
    rec.kind = b->kind;
    rec.input_json = b->input;
    rec.event_count = b->event_count;
    rec.created_ms = b->created_ms;
    rec.seq = r->seq;
    rec.key_concurrency = r->key_concurrency;
    kf__retry_to_rec(&b->retry, &retry, &rec.retry);
    rec.n_event_ids = b->event_id_count;
    rec.event_ids = b->event_ids;
    rec.event_ids_dropped = b->event_ids_dropped;
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_raw(&k, r->run_id, strlen(r->run_id));
    kf_ctx_put_msg(ctx, KF_CF_RUNS, &k, &rec.base);
}

static char *text_or_empty(char *s) {
    return s ? s : "";
}

void kf__run_save(kf_ctx_t *ctx, const run_t *r) {
    const run_detail_t *d = r->detail;
    KF_ASSERT(d != NULL);
    kf_key_t k;
    if (kf__run_finished(r->status)) {
        Keyflow__Records__RunStateRec rec;
        keyflow__records__run_state_rec__init(&rec);
        rec.status = r->status;
        rec.attempts = r->attempts;
        rec.updated_ms = r->updated_ms;
        rec.worker_id = text_or_empty(d->worker_id);
        rec.lease = (char *)d->lease;
        rec.lease_owner = (char *)d->lease_owner;
        rec.lease_ms = d->lease_ms;
        rec.result_json = text_or_empty(d->result_json);
        rec.error = text_or_empty(d->error);
        rec.finished_ms = d->finished_ms;
        rec.cancel_requested = (r->flags & RUN_CANCEL_REQUESTED) != 0;
        rec.last_error = text_or_empty(d->last_error);
        rec.workflow = r->wf->workflow;
        rec.seq = r->seq;
        kf_key_reset(&k);
        kf_key_raw(&k, r->run_id, strlen(r->run_id));
        kf_ctx_put_msg(ctx, KF_CF_RUN_STATE, &k, &rec.base);
        kf_key_run_live(&k, r->seq);
        kf_ctx_delete(ctx, KF_CF_RUN_LIVE, &k);
        return;
    }
    Keyflow__Records__RunLiveRec rec;
    Keyflow__Records__RetryRec retry;
    keyflow__records__run_live_rec__init(&rec);
    rec.run_id = (char *)r->run_id;
    rec.workflow = r->wf->workflow;
    rec.status = r->status;
    rec.attempts = r->attempts;
    rec.updated_ms = r->updated_ms;
    rec.key_concurrency = r->key_concurrency;
    kf__retry_to_rec(&d->retry, &retry, &rec.retry);
    rec.due_ms = r->status == ST_DELAYED ? d->due_ms : 0;
    rec.cancel_requested = (r->flags & RUN_CANCEL_REQUESTED) != 0;
    rec.worker_id = text_or_empty(d->worker_id);
    rec.lease = (char *)d->lease;
    rec.lease_owner = (char *)d->lease_owner;
    rec.lease_ms = d->lease_ms;
    rec.lease_expires_ms = r->status == ST_LEASED ? d->lease_expires_ms : 0;
    rec.last_error = text_or_empty(d->last_error);
    kf_key_run_live(&k, r->seq);
    kf_ctx_put_msg(ctx, KF_CF_RUN_LIVE, &k, &rec.base);
}

kf_status_t kf__run_load_live(kf_ctx_t *ctx, uint64_t seq, const char *run_id,
                              Keyflow__Records__RunLiveRec **out, kf_error_t *err) {
    *out = NULL;
    kf_key_t k;
    kf_key_run_live(&k, seq);
    kf_value_t v;
    bool found;
    kf_status_t st = kf_store_get(ctx->store, KF_CF_RUN_LIVE, k.bytes, k.len, &v, &found, err);
    if (st != KF_OK) {
        return st;
    }
    Keyflow__Records__RunLiveRec *live =
        found ? keyflow__records__run_live_rec__unpack(NULL, v.len, v.data) : NULL;
    kf_store_value_free(&v);
    if (live == NULL || !kf__run_live_valid(live) || strcmp(live->run_id, run_id) != 0) {
        if (live != NULL) {
            keyflow__records__run_live_rec__free_unpacked(live, NULL);
        }
        return kf_error_set(err, KF_E_CORRUPT, "run_live: no record of its own for %s", run_id);
    }
    *out = live;
    return KF_OK;
}

/* ---- checks ------------------------------------------------------------------ */

static bool lease_valid(int status, const char *lease) {
    size_t len = strlen(lease);
    return status == ST_LEASED ? len == KF_LEASE_BYTES : len == 0 || len == KF_LEASE_BYTES;
}

static bool text_valid(const char *s, size_t max) {
    return strlen(s) <= max;
}

bool kf__run_id_split(const char *run_id, size_t *key_len) {
    size_t len = strlen(run_id);
    if (len <= KF_UUID_TEXT_BYTES || len > KF_RUN_ID_BYTES_MAX ||
        run_id[len - KF_UUID_TEXT_BYTES - 1] != '@') {
        return false;
    }
    *key_len = len - KF_UUID_TEXT_BYTES - 1;
    return true;
}

/* The body's fields, whatever the layout. */
static bool body_valid(const Keyflow__Records__RunRec *rec) {
    kf_retry_policy_t retry;
    bool ids_ok = rec->n_event_ids <= KF_RUN_EVENT_IDS_MAX && rec->event_ids_dropped >= 0;
    for (size_t i = 0; ids_ok && i < rec->n_event_ids; i++) {
        size_t len = strlen(rec->event_ids[i]);
        ids_ok = len > 0 && len <= KF_EVENT_ID_BYTES_MAX;
    }
    size_t key_len;
    return (rec->layout == KF_RUN_LAYOUT_WHOLE || rec->layout == KF_RUN_LAYOUT_SPLIT) &&
           kf__run_id_split(rec->run_id, &key_len) && key_len == strlen(rec->key) &&
           memcmp(rec->run_id, rec->key, key_len) == 0 &&
           text_valid(rec->workflow, KF_WORKFLOW_BYTES_MAX) &&
           text_valid(rec->key, KF_KEY_BYTES_MAX) &&
           (rec->kind == KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE ||
            rec->kind == KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH) &&
           rec->key_concurrency >= 0 && rec->key_concurrency <= KF_KEY_CONCURRENCY_MAX &&
           kf__retry_from_rec(rec->retry, &retry) && ids_ok;
}

/* A whole record (layout 0) read as the run: its state fields too. Records
 * of older builds lack the later fields; their zero values are valid (no
 * key limit, no policy, not delayed, not cancelled). */
static bool whole_valid(const Keyflow__Records__RunRec *rec) {
    bool status_ok = rec->status == ST_PENDING || rec->status == ST_LEASED ||
                     rec->status == ST_DELAYED || kf__run_finished(rec->status);
    return status_ok && lease_valid(rec->status, rec->lease) &&
           text_valid(rec->worker_id, KF_WORKER_ID_BYTES_MAX) &&
           text_valid(rec->lease_owner, KF_API_KEY_ID_CHARS) &&
           text_valid(rec->last_error, KF_RUN_ERROR_BYTES_MAX);
}

static bool state_valid(const Keyflow__Records__RunStateRec *s) {
    return kf__run_finished(s->status) && lease_valid(s->status, s->lease) &&
           text_valid(s->worker_id, KF_WORKER_ID_BYTES_MAX) &&
           text_valid(s->lease_owner, KF_API_KEY_ID_CHARS) &&
           text_valid(s->last_error, KF_RUN_ERROR_BYTES_MAX) &&
           text_valid(s->workflow, KF_WORKFLOW_BYTES_MAX);
}

bool kf__run_live_valid(const Keyflow__Records__RunLiveRec *l) {
    kf_retry_policy_t retry;
    size_t key_len;
    return (l->status == ST_PENDING || l->status == ST_LEASED || l->status == ST_DELAYED) &&
           kf__run_id_split(l->run_id, &key_len) && key_len <= KF_KEY_BYTES_MAX &&
           text_valid(l->workflow, KF_WORKFLOW_BYTES_MAX) && l->attempts >= 0 &&
           l->attempts <= KF_RUN_ATTEMPTS_MAX && l->key_concurrency >= 0 &&
           l->key_concurrency <= KF_KEY_CONCURRENCY_MAX && kf__retry_from_rec(l->retry, &retry) &&
           lease_valid(l->status, l->lease) && text_valid(l->worker_id, KF_WORKER_ID_BYTES_MAX) &&
           text_valid(l->lease_owner, KF_API_KEY_ID_CHARS) &&
           text_valid(l->last_error, KF_RUN_ERROR_BYTES_MAX);
}

/* ---- reading ------------------------------------------------------------------ */

void kf__stored_run_free(kf_stored_run_t *s) {
    if (s == NULL) {
        return;
    }
    if (s->body != NULL) {
        keyflow__records__run_rec__free_unpacked(s->body, NULL);
    }
    if (s->state != NULL) {
        keyflow__records__run_state_rec__free_unpacked(s->state, NULL);
    }
    free(s);
}

static kf_status_t corrupt(kf_error_t *err, const char *family, const char *run_id) {
    return kf_error_set(err, KF_E_CORRUPT, "%s: undecodable record for %s", family, run_id);
}

/* The final state of a finished run into the view, over the body's. */
static void overlay_state(Keyflow__Records__RunRec *v, const Keyflow__Records__RunStateRec *s) {
    v->status = s->status;
    v->attempts = s->attempts;
    v->updated_ms = s->updated_ms;
    v->worker_id = s->worker_id;
    v->lease = s->lease;
    v->lease_owner = s->lease_owner;
    v->lease_ms = s->lease_ms;
    v->lease_expires_ms = 0;
    v->result_json = s->result_json;
    v->error = s->error;
    v->finished_ms = s->finished_ms;
    v->due_ms = 0;
    v->cancel_requested = s->cancel_requested;
    v->last_error = s->last_error;
}

kf_status_t kf__run_load_body(kf_ctx_t *ctx, const char *run_id, Keyflow__Records__RunRec **out,
                              kf_error_t *err) {
    *out = NULL;
    kf_value_t v;
    bool found;
    kf_status_t st = kf_store_get(ctx->store, KF_CF_RUNS, run_id, strlen(run_id), &v, &found, err);
    if (st != KF_OK || !found) {
        return st;
    }
    Keyflow__Records__RunRec *body = keyflow__records__run_rec__unpack(NULL, v.len, v.data);
    kf_store_value_free(&v);
    if (body == NULL || !body_valid(body) || strcmp(body->run_id, run_id) != 0) {
        if (body != NULL) {
            keyflow__records__run_rec__free_unpacked(body, NULL);
        }
        return corrupt(err, "runs", run_id);
    }
    *out = body;
    return KF_OK;
}

/* A finished run's final state, checked; *out is NULL when run_id has none
 * (a live run, a whole record of an older build, or no run). The caller
 * frees *out. */
static kf_status_t load_state(kf_ctx_t *ctx, const char *run_id,
                              Keyflow__Records__RunStateRec **out, kf_error_t *err) {
    *out = NULL;
    kf_value_t v;
    bool found;
    kf_status_t st =
        kf_store_get(ctx->store, KF_CF_RUN_STATE, run_id, strlen(run_id), &v, &found, err);
    if (st != KF_OK || !found) {
        return st;
    }
    Keyflow__Records__RunStateRec *state =
        keyflow__records__run_state_rec__unpack(NULL, v.len, v.data);
    kf_store_value_free(&v);
    if (state == NULL || !state_valid(state)) {
        if (state != NULL) {
            keyflow__records__run_state_rec__free_unpacked(state, NULL);
        }
        return corrupt(err, "run_state", run_id);
    }
    *out = state;
    return KF_OK;
}

kf_status_t kf__run_load(kf_ctx_t *ctx, const char *run_id, kf_stored_run_t **out,
                         kf_error_t *err) {
    *out = NULL;
    /* The final state first, then the body. A run read here is not in
     * memory, so it is finished and its records change only when
     * retention's sweep deletes both in one write, which the committer may
     * apply between these two reads (the engine reads while it commits).
     * In this order that write can only hide the body: read as "no such
     * run". Body first, it could hide the state and a deleted run would
     * read as a corrupt live one (ListRuns answered DATA_LOSS in a soak). */
    Keyflow__Records__RunStateRec *state;
    kf_status_t st = load_state(ctx, run_id, &state, err);
    if (st != KF_OK) {
        return st;
    }
    Keyflow__Records__RunRec *body;
    st = kf__run_load_body(ctx, run_id, &body, err);
    if (st != KF_OK || body == NULL) {
        if (state != NULL) {
            keyflow__records__run_state_rec__free_unpacked(state, NULL);
        }
        return st;
    }
    kf_stored_run_t *s = calloc(1, sizeof *s);
    if (s == NULL) {
        keyflow__records__run_rec__free_unpacked(body, NULL);
        if (state != NULL) {
            keyflow__records__run_state_rec__free_unpacked(state, NULL);
        }
        return kf_error_set(err, KF_E_NOMEM, "runs: cannot read %s", run_id);
    }
    s->body = body;
    s->state = state;
    s->view = *s->body;
    if (state != NULL) {
        if (strcmp(state->workflow, body->workflow) != 0 || state->seq != body->seq) {
            kf__stored_run_free(s);
            return corrupt(err, "run_state", run_id);
        }
        overlay_state(&s->view, state);
    } else if (body->layout != KF_RUN_LAYOUT_WHOLE || !whole_valid(body)) {
        /* A body without a final state is a live run's, and every live run
         * is in memory: not a record this engine leaves behind. */
        kf__stored_run_free(s);
        return corrupt(err, "runs", run_id);
    }
    *out = s;
    return KF_OK;
}

/* ---- the detail of a live run, from its live record ------------------------------- */

static char *text_dup_or_null(const char *s) {
    return s[0] != '\0' ? kf_xstrdup(s) : NULL;
}

void kf__detail_from_live(run_detail_t *d, const Keyflow__Records__RunLiveRec *l) {
    bool ok = kf__retry_from_rec(l->retry, &d->retry);
    KF_ASSERT(ok); /* checked by kf__run_live_valid */
    d->due_ms = l->due_ms;
    d->lease_ms = l->lease_ms;
    d->lease_expires_ms = l->lease_expires_ms;
    KF_ASSERT(strlen(l->lease) <= KF_LEASE_BYTES && strlen(l->lease_owner) <= KF_API_KEY_ID_CHARS);
    strcpy(d->lease, l->lease);
    strcpy(d->lease_owner, l->lease_owner);
    d->worker_id = text_dup_or_null(l->worker_id);
    d->last_error = text_dup_or_null(l->last_error);
}

/* ---- views: memory plus what is read for it -------------------------------------- */

static void view_state(run_view_t *v, const run_t *r) {
    Keyflow__Records__RunRec *rec = &v->rec;
    rec->run_id = (char *)r->run_id;
    rec->workflow = r->wf->workflow;
    rec->key = v->key;
    rec->seq = r->seq;
    rec->status = r->status;
    rec->attempts = r->attempts;
    rec->updated_ms = r->updated_ms;
    rec->key_concurrency = r->key_concurrency;
    rec->cancel_requested = (r->flags & RUN_CANCEL_REQUESTED) != 0;
    const run_detail_t *d = r->detail;
    if (d != NULL) {
        rec->worker_id = text_or_empty(d->worker_id);
        rec->lease = (char *)d->lease;
        rec->lease_owner = (char *)d->lease_owner;
        rec->lease_ms = d->lease_ms;
        rec->lease_expires_ms = d->lease_expires_ms;
        rec->due_ms = d->due_ms;
        rec->finished_ms = d->finished_ms;
        rec->result_json = text_or_empty(d->result_json);
        rec->error = text_or_empty(d->error);
        rec->last_error = text_or_empty(d->last_error);
        kf__retry_to_rec(&d->retry, &v->retry, &rec->retry);
        return;
    }
    const Keyflow__Records__RunLiveRec *l = v->stored_live;
    KF_ASSERT(l != NULL && r->status == ST_PENDING);
    rec->worker_id = l->worker_id;
    rec->lease = l->lease;
    rec->lease_owner = l->lease_owner;
    rec->lease_ms = l->lease_ms;
    rec->lease_expires_ms = 0;
    rec->due_ms = 0;
    rec->finished_ms = 0;
    rec->result_json = "";
    rec->error = "";
    rec->last_error = l->last_error;
    rec->retry = l->retry;
}

static void view_body(run_view_t *v, const run_t *r) {
    Keyflow__Records__RunRec *rec = &v->rec;
    const run_body_t *b = r->body;
    if (b != NULL) {
        rec->kind = b->kind;
        rec->input_json = b->input;
        rec->event_count = b->event_count;
        rec->created_ms = b->created_ms;
        rec->n_event_ids = b->event_id_count;
        rec->event_ids = b->event_ids;
        rec->event_ids_dropped = b->event_ids_dropped;
    } else if (v->stored_body != NULL) {
        const Keyflow__Records__RunRec *s = v->stored_body;
        rec->kind = s->kind;
        rec->input_json = s->input_json;
        rec->event_count = s->event_count;
        rec->created_ms = s->created_ms;
        rec->n_event_ids = s->n_event_ids;
        rec->event_ids = s->event_ids;
        rec->event_ids_dropped = s->event_ids_dropped;
    }
}

kf_status_t kf__run_view_open(kf_ctx_t *ctx, const run_t *r, bool with_body, run_view_t *v,
                              kf_error_t *err) {
    memset(v, 0, sizeof *v);
    keyflow__records__run_rec__init(&v->rec);
    memcpy(v->key, r->run_id, r->key_len);
    v->key[r->key_len] = '\0';
    kf_status_t st = KF_OK;
    if (r->detail == NULL) {
        st = kf__run_load_live(ctx, r->seq, r->run_id, &v->stored_live, err);
    }
    if (st == KF_OK && with_body && r->body == NULL) {
        st = kf__run_load_body(ctx, r->run_id, &v->stored_body, err);
        if (st == KF_OK && (v->stored_body == NULL || v->stored_body->seq != r->seq ||
                            strcmp(v->stored_body->workflow, r->wf->workflow) != 0)) {
            st = kf_error_set(err, KF_E_CORRUPT, "runs: no body of its own for %s", r->run_id);
        }
    }
    if (st != KF_OK) {
        kf__run_view_close(v);
        return st;
    }
    view_state(v, r);
    view_body(v, r);
    return KF_OK;
}

void kf__run_view_refresh(run_view_t *v, const run_t *r) {
    KF_ASSERT(r->detail != NULL);
    view_state(v, r);
}

void kf__run_view_close(run_view_t *v) {
    if (v->stored_body != NULL) {
        keyflow__records__run_rec__free_unpacked(v->stored_body, NULL);
        v->stored_body = NULL;
    }
    if (v->stored_live != NULL) {
        keyflow__records__run_live_rec__free_unpacked(v->stored_live, NULL);
        v->stored_live = NULL;
    }
}

Keyflow__V1__Run *kf__rec_to_pb(kf_arena_t *arena, const kf_ctx_t *ctx,
                                const Keyflow__Records__RunRec *rec, bool with_lease) {
    Keyflow__V1__Run *p = kf_arena_new(arena, sizeof *p);
    keyflow__v1__run__init(p);
    p->run_id = kf_arena_strdup(arena, rec->run_id);
    p->workflow = kf_arena_strdup(arena, rec->workflow);
    p->key = kf_arena_strdup(arena, rec->key);
    p->kind = (Keyflow__V1__RuleKind)rec->kind;
    p->input_json = kf_arena_strdup(arena, rec->input_json);
    p->event_count = rec->event_count;
    p->status = (Keyflow__V1__RunStatus)rec->status;
    p->attempts = rec->attempts;
    p->created_ms = rec->created_ms;
    p->updated_ms = rec->updated_ms;
    p->worker_id = kf_arena_strdup(arena, rec->worker_id);
    p->lease = with_lease ? kf_arena_strdup(arena, rec->lease) : "";
    p->lease_expires_ms = rec->status == ST_LEASED ? rec->lease_expires_ms : 0;
    p->result_json = kf_arena_strdup(arena, rec->result_json);
    p->error = kf_arena_strdup(arena, rec->error);
    p->finished_ms = rec->finished_ms;
    p->due_ms = rec->status == ST_DELAYED ? rec->due_ms : 0;
    p->cancel_requested = rec->cancel_requested;
    p->last_error = kf_arena_strdup(arena, rec->last_error);
    kf_retry_policy_t retry;
    bool ok = kf__retry_from_rec(rec->retry, &retry);
    KF_ASSERT(ok); /* records are checked where they are read */
    p->max_attempts = kf_retry_attempts_max(&retry, kf__runs_server_attempts_max(ctx));
    p->n_event_ids = rec->n_event_ids;
    p->event_ids = kf_arena_new(arena, (rec->n_event_ids + 1) * sizeof *p->event_ids);
    for (size_t i = 0; i < rec->n_event_ids; i++) {
        p->event_ids[i] = kf_arena_strdup(arena, rec->event_ids[i]);
        KF_ASSERT(p->event_ids[i] != NULL);
    }
    p->event_ids_dropped = rec->event_ids_dropped;
    KF_ASSERT(p->run_id && p->workflow && p->key && p->input_json && p->worker_id && p->lease &&
              p->result_json && p->error && p->last_error);
    return p;
}

Keyflow__V1__Run *kf__run_to_pb(kf_arena_t *arena, kf_ctx_t *ctx, const run_t *r, bool with_lease,
                                kf_error_t *err) {
    run_view_t v;
    if (kf__run_view_open(ctx, r, true, &v, err) != KF_OK) {
        return NULL;
    }
    Keyflow__V1__Run *p = kf__rec_to_pb(arena, ctx, &v.rec, with_lease);
    kf__run_view_close(&v);
    return p;
}

/* ---- what retention needs of a stored run ------------------------------------ */

kf_status_t kf__run_load_final(kf_ctx_t *ctx, const char *run_id, kf_stored_final_t *out,
                               kf_error_t *err) {
    memset(out, 0, sizeof *out);
    kf_status_t st = load_state(ctx, run_id, &out->state, err);
    if (st != KF_OK) {
        return st;
    }
    if (out->state != NULL) {
        out->found = out->finished = true;
        out->workflow = out->state->workflow;
        out->seq = out->state->seq;
        return KF_OK;
    }
    /* No final state: a whole record of an older build, or nothing. */
    if ((st = kf__run_load_body(ctx, run_id, &out->whole, err)) != KF_OK || out->whole == NULL) {
        return st;
    }
    out->found = true;
    out->finished = out->whole->layout == KF_RUN_LAYOUT_WHOLE && whole_valid(out->whole) &&
                    kf__run_finished(out->whole->status);
    out->workflow = out->whole->workflow;
    out->seq = out->whole->seq;
    return KF_OK;
}

void kf__stored_final_free(kf_stored_final_t *f) {
    if (f->state != NULL) {
        keyflow__records__run_state_rec__free_unpacked(f->state, NULL);
    }
    if (f->whole != NULL) {
        keyflow__records__run_rec__free_unpacked(f->whole, NULL);
    }
    memset(f, 0, sizeof *f);
}
