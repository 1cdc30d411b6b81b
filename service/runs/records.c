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

#include "base/assert.h"
#include "runs/runs_int.h"

/* ---- writing --------------------------------------------------------------- */

void kf__run_to_body(const run_t *r, Keyflow__Records__RunRec *rec,
                     Keyflow__Records__RetryRec *retry) {
    keyflow__records__run_rec__init(rec);
    rec->layout = KF_RUN_LAYOUT_SPLIT;
    rec->run_id = r->run_id;
    rec->workflow = r->workflow;
    rec->key = r->key;
    rec->kind = r->kind;
    rec->input_json = r->input;
    rec->event_count = r->event_count;
    rec->created_ms = r->created_ms;
    rec->seq = r->seq;
    rec->key_concurrency = r->key_concurrency;
    kf__retry_to_rec(&r->retry, retry, &rec->retry);
    rec->n_event_ids = r->event_id_count;
    rec->event_ids = r->event_ids;
    rec->event_ids_dropped = r->event_ids_dropped;
}

void kf__run_to_live(const run_t *r, Keyflow__Records__RunLiveRec *rec,
                     Keyflow__Records__RetryRec *retry) {
    KF_ASSERT(!kf__run_finished(r->status));
    keyflow__records__run_live_rec__init(rec);
    rec->run_id = r->run_id;
    rec->workflow = r->workflow;
    rec->status = r->status;
    rec->attempts = r->attempts;
    rec->updated_ms = r->updated_ms;
    rec->key_concurrency = r->key_concurrency;
    kf__retry_to_rec(&r->retry, retry, &rec->retry);
    rec->due_ms = r->status == ST_DELAYED ? r->due_ms : 0;
    rec->cancel_requested = r->cancel_requested;
    rec->worker_id = r->worker_id ? r->worker_id : "";
    rec->lease = (char *)r->lease;
    rec->lease_owner = (char *)r->lease_owner;
    rec->lease_ms = r->lease_ms;
    rec->lease_expires_ms = r->status == ST_LEASED ? r->lease_expires_ms : 0;
    rec->last_error = r->last_error ? r->last_error : "";
}

void kf__run_to_state(const run_t *r, Keyflow__Records__RunStateRec *rec) {
    KF_ASSERT(kf__run_finished(r->status));
    keyflow__records__run_state_rec__init(rec);
    rec->status = r->status;
    rec->attempts = r->attempts;
    rec->updated_ms = r->updated_ms;
    rec->worker_id = r->worker_id ? r->worker_id : "";
    rec->lease = (char *)r->lease;
    rec->lease_owner = (char *)r->lease_owner;
    rec->lease_ms = r->lease_ms;
    rec->result_json = r->result_json ? r->result_json : "";
    rec->error = r->error ? r->error : "";
    rec->finished_ms = r->finished_ms;
    rec->cancel_requested = r->cancel_requested;
    rec->last_error = r->last_error ? r->last_error : "";
    rec->workflow = r->workflow;
    rec->seq = r->seq;
}

void kf__run_save_body(kf_ctx_t *ctx, const run_t *r) {
    Keyflow__Records__RunRec rec;
    Keyflow__Records__RetryRec retry;
    kf__run_to_body(r, &rec, &retry);
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_raw(&k, r->run_id, strlen(r->run_id));
    kf_ctx_put_msg(ctx, KF_CF_RUNS, &k, &rec.base);
}

void kf__run_save(kf_ctx_t *ctx, const run_t *r) {
    kf_key_t k;
    if (kf__run_finished(r->status)) {
        Keyflow__Records__RunStateRec rec;
        kf__run_to_state(r, &rec);
        kf_key_reset(&k);
        kf_key_raw(&k, r->run_id, strlen(r->run_id));
        kf_ctx_put_msg(ctx, KF_CF_RUN_STATE, &k, &rec.base);
        kf_key_run_live(&k, r->seq);
        kf_ctx_delete(ctx, KF_CF_RUN_LIVE, &k);
        return;
    }
    Keyflow__Records__RunLiveRec rec;
    Keyflow__Records__RetryRec retry;
    kf__run_to_live(r, &rec, &retry);
    kf_key_run_live(&k, r->seq);
    kf_ctx_put_msg(ctx, KF_CF_RUN_LIVE, &k, &rec.base);
}

/* ---- checks ------------------------------------------------------------------ */

static bool lease_valid(int status, const char *lease) {
    size_t len = strlen(lease);
    return status == ST_LEASED ? len == KF_LEASE_BYTES : len == 0 || len == KF_LEASE_BYTES;
}

static bool text_valid(const char *s, size_t max) {
    return strlen(s) <= max;
}

/* The body's fields, whatever the layout. */
static bool body_valid(const Keyflow__Records__RunRec *rec) {
    kf_retry_policy_t retry;
    bool ids_ok = rec->n_event_ids <= KF_RUN_EVENT_IDS_MAX && rec->event_ids_dropped >= 0;
    for (size_t i = 0; ids_ok && i < rec->n_event_ids; i++) {
        size_t len = strlen(rec->event_ids[i]);
        ids_ok = len > 0 && len <= KF_EVENT_ID_BYTES_MAX;
    }
    return (rec->layout == KF_RUN_LAYOUT_WHOLE || rec->layout == KF_RUN_LAYOUT_SPLIT) &&
           rec->run_id[0] != '\0' && text_valid(rec->run_id, KF_RUN_ID_BYTES_MAX) &&
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
    return (l->status == ST_PENDING || l->status == ST_LEASED || l->status == ST_DELAYED) &&
           l->run_id[0] != '\0' && text_valid(l->run_id, KF_RUN_ID_BYTES_MAX) &&
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

void kf__overlay_live(Keyflow__Records__RunRec *v, const Keyflow__Records__RunLiveRec *l) {
    v->status = l->status;
    v->attempts = l->attempts;
    v->updated_ms = l->updated_ms;
    v->key_concurrency = l->key_concurrency;
    v->retry = l->retry;
    v->due_ms = l->due_ms;
    v->cancel_requested = l->cancel_requested;
    v->worker_id = l->worker_id;
    v->lease = l->lease;
    v->lease_owner = l->lease_owner;
    v->lease_ms = l->lease_ms;
    v->lease_expires_ms = l->lease_expires_ms;
    v->last_error = l->last_error;
    v->result_json = "";
    v->error = "";
    v->finished_ms = 0;
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

kf_status_t kf__run_load(kf_ctx_t *ctx, const char *run_id, kf_stored_run_t **out,
                         kf_error_t *err) {
    *out = NULL;
    Keyflow__Records__RunRec *body;
    kf_status_t st = kf__run_load_body(ctx, run_id, &body, err);
    if (st != KF_OK || body == NULL) {
        return st;
    }
    kf_stored_run_t *s = calloc(1, sizeof *s);
    if (s == NULL) {
        keyflow__records__run_rec__free_unpacked(body, NULL);
        return kf_error_set(err, KF_E_NOMEM, "runs: cannot read %s", run_id);
    }
    s->body = body;
    kf_value_t v;
    bool found;
    if ((st = kf_store_get(ctx->store, KF_CF_RUN_STATE, run_id, strlen(run_id), &v, &found, err)) !=
        KF_OK) {
        kf__stored_run_free(s);
        return st;
    }
    s->view = *s->body;
    if (found) {
        s->state = keyflow__records__run_state_rec__unpack(NULL, v.len, v.data);
        kf_store_value_free(&v);
        if (s->state == NULL || !state_valid(s->state) ||
            strcmp(s->state->workflow, s->body->workflow) != 0 || s->state->seq != s->body->seq) {
            kf__stored_run_free(s);
            return corrupt(err, "run_state", run_id);
        }
        overlay_state(&s->view, s->state);
    } else if (s->body->layout != KF_RUN_LAYOUT_WHOLE || !whole_valid(s->body)) {
        /* A body without a final state is a live run's, and every live run
         * is in memory: not a record this engine leaves behind. */
        kf__stored_run_free(s);
        return corrupt(err, "runs", run_id);
    }
    *out = s;
    return KF_OK;
}
