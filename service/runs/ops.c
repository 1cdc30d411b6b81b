/*
 * ops.c - the Runs RPCs: PollRuns (and its parked long polls), HeartbeatRun,
 * CompleteRun, ReleaseRun, CancelRun, GetRun (and its waits for a run to
 * finish), ListRuns. Each validates its request completely before it
 * changes anything (step/ctx.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/bytes.h"
#include "base/clock.h"
#include "base/crypto.h"
#include "base/json.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/text.h"
#include "runs/runs_int.h"

static const char *status_word(int status) {
    switch (status) {
    case ST_PENDING: return "PENDING";
    case ST_LEASED: return "LEASED";
    case ST_COMPLETED: return "COMPLETED";
    case ST_FAILED: return "FAILED";
    case ST_CANCELLED: return "CANCELLED";
    case ST_DELAYED: return "DELAYED";
    default: return "UNKNOWN";
    }
}

/* A tombstone (see kf_runs_fire) answers like a run that does not exist;
 * it must not fall through to the older stored record. */
static bool refuse_deleted(kf_ctx_t *ctx, kf_cmd_t *cmd, const run_t *r, const char *run_id) {
    if (r == NULL || !(r->flags & RUN_DELETED)) {
        return false;
    }
    kf_error_set(&cmd->error, KF_E_NOT_FOUND, "run_id: no run %s", run_id);
    kf_ctx_fail(ctx, cmd);
    return true;
}

/* ---- long polls ------------------------------------------------------------ */

void kf__poll_unlink(kf_runs_t *rs, poller_t *p) {
    if (p->prev) {
        p->prev->next = p->next;
    } else {
        rs->polls_head = p->next;
    }
    if (p->next) {
        p->next->prev = p->prev;
    } else {
        rs->polls_tail = p->prev;
    }
    rs->polls--;
}

/* Leases one ready run to the poll: its body and texts are read first, so
 * that a failed read leases nothing. */
static kf_status_t lease_one(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd, run_t *r,
                             int64_t lease_ms, kf_error_t *err) {
    const Keyflow__V1__PollRunsRequest *req = (const Keyflow__V1__PollRunsRequest *)cmd->request;
    Keyflow__V1__PollRunsResponse *resp = (Keyflow__V1__PollRunsResponse *)cmd->response;
    run_view_t v;
    kf_status_t st = kf__run_detail(rs, ctx, r, err);
    if (st == KF_OK) {
        st = kf__run_view_open(ctx, r, true, &v, err);
    }
    if (st != KF_OK) {
        return st;
    }
    kf__run_lease(rs, ctx, r, req->worker_id, cmd->principal, lease_ms);
    kf__run_view_refresh(&v, r);
    resp->runs[resp->n_runs++] = kf__rec_to_pb(cmd->arena, ctx, &v.rec, true);
    kf__run_view_close(&v);
    return KF_OK;
}

/* Leases up to the poll's max_runs into its response; returns how many.
 * A ready run whose key has no free slot moves to its key's blocked queue
 * on the way (each run at most once per poll). A run that cannot be read
 * ends the filling: *err says why (the runs leased before it stand). */
static size_t fill_poll(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd, kf_error_t *err) {
    const Keyflow__V1__PollRunsRequest *req = (const Keyflow__V1__PollRunsRequest *)cmd->request;
    Keyflow__V1__PollRunsResponse *resp = (Keyflow__V1__PollRunsResponse *)cmd->response;
    int64_t max_runs = req->max_runs > 0 ? req->max_runs : 1;
    int64_t lease_ms = req->lease_ms > 0 ? req->lease_ms : KF_LEASE_MS_DEFAULT;
    size_t got = 0;
    kf_error_clear(err);
    while ((int64_t)resp->n_runs < max_runs) {
        run_t *r = kf__runs_oldest_ready(rs, req->workflows, req->n_workflows);
        if (r == NULL) {
            break;
        }
        if (!kf__run_may_lease(rs, r)) {
            kf__run_block(rs, r);
            continue;
        }
        if (lease_one(rs, ctx, cmd, r, lease_ms, err) != KF_OK) {
            kf_log_kv(KF_LOG_ERROR, "runs", "cannot lease a run", KF_LOG_STR("run_id", r->run_id),
                      KF_LOG_STR("error", err->message));
            break;
        }
        got++;
    }
    return got;
}

void kf__runs_serve_parked(kf_runs_t *rs, kf_ctx_t *ctx) {
    poller_t *p = rs->polls_head;
    while (p != NULL && rs->ready > 0) {
        poller_t *next = p->next;
        /* A poll whose key was revoked since it parked leases nothing: the
         * sweep (kf_runs_end_revoked) answers it at this engine's next turn. */
        if (kf_principal_revoked(p->cmd->principal)) {
            p = next;
            continue;
        }
        kf_error_t err;
        size_t got = fill_poll(rs, ctx, p->cmd, &err);
        if (got > 0 || err.status != KF_OK) {
            kf__poll_unlink(rs, p);
            kf_heap_disarm(&ctx->heap, &p->timer);
            p->cmd->parked = NULL;
            if (got == 0) {
                p->cmd->error = err;
                kf_ctx_fail(ctx, p->cmd);
                break; /* the store cannot be read: the next poll would fail too */
            }
            kf_ctx_ready(ctx, p->cmd);
        }
        p = next;
    }
    kf__runs_publish(rs);
}

bool kf_runs_cancel_poll(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd, uint64_t id) {
    for (poller_t *p = rs->polls_head; p != NULL; p = p->next) {
        if (p->cmd == cmd && cmd->id == id) {
            kf__poll_unlink(rs, p);
            kf_heap_disarm(&ctx->heap, &p->timer);
            cmd->parked = NULL;
            cmd->response = NULL;
            kf_error_set(&cmd->error, KF_E_CANCELLED, "PollRuns: the client went away");
            kf_ctx_ready(ctx, cmd);
            kf__runs_publish(rs);
            return true;
        }
    }
    return kf__waiter_cancel(rs, ctx, cmd, id);
}

static void waiter_unlink(kf_runs_t *rs, kf_ctx_t *ctx, waiter_t *w);

void kf_runs_end_revoked(kf_runs_t *rs, kf_ctx_t *ctx) {
    for (poller_t *p = rs->polls_head; p != NULL;) {
        poller_t *next = p->next;
        kf_cmd_t *cmd = p->cmd;
        if (kf_principal_check_open(cmd->principal, &cmd->error) != KF_OK) {
            kf__poll_unlink(rs, p);
            kf_heap_disarm(&ctx->heap, &p->timer);
            cmd->parked = NULL;
            cmd->response = NULL;
            kf_ctx_fail(ctx, cmd);
        }
        p = next;
    }
    for (waiter_t *w = rs->waiters; w != NULL;) {
        waiter_t *next = w->all_next;
        kf_cmd_t *cmd = w->cmd;
        if (kf_principal_check_open(cmd->principal, &cmd->error) != KF_OK) {
            waiter_unlink(rs, ctx, w);
            cmd->response = NULL;
            kf_ctx_fail(ctx, cmd);
        }
        w = next;
    }
    kf__runs_publish(rs);
}

void kf_runs_release_polls(kf_runs_t *rs, kf_ctx_t *ctx) {
    while (rs->polls_head != NULL) {
        poller_t *p = rs->polls_head;
        kf__poll_unlink(rs, p);
        kf_heap_disarm(&ctx->heap, &p->timer);
        p->cmd->parked = NULL;
        kf_ctx_ready(ctx, p->cmd);
    }
    while (rs->waiters != NULL) {
        kf__waiter_answer(rs, ctx, rs->waiters);
    }
    kf__runs_publish(rs);
}

static kf_status_t check_workflows(const Keyflow__V1__PollRunsRequest *req, kf_error_t *err) {
    if (req->n_workflows > KF_POLL_WORKFLOWS_MAX) {
        return kf_error_set(err, KF_E_INVALID, "workflows: at most %d, got %zu",
                            KF_POLL_WORKFLOWS_MAX, req->n_workflows);
    }
    for (size_t i = 0; i < req->n_workflows; i++) {
        char field[32];
        snprintf(field, sizeof field, "workflows[%zu]", i);
        kf_status_t st =
            kf_check_identifier(field, req->workflows[i], KF_WORKFLOW_BYTES_MAX, true, err);
        if (st != KF_OK) {
            return st;
        }
    }
    return KF_OK;
}

void kf_runs_poll(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__PollRunsRequest *req = (const Keyflow__V1__PollRunsRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    if (check_workflows(req, err) != KF_OK ||
        kf_check_identifier("worker_id", req->worker_id, KF_WORKER_ID_BYTES_MAX, true, err) !=
            KF_OK ||
        (req->lease_ms != 0 && kf_check_range("lease_ms", req->lease_ms, KF_LEASE_MS_MIN,
                                              KF_LEASE_MS_MAX, err) != KF_OK) ||
        (req->max_runs != 0 &&
         kf_check_range("max_runs", req->max_runs, 1, KF_POLL_RUNS_MAX, err) != KF_OK) ||
        kf_check_range("wait_ms", req->wait_ms, 0, KF_POLL_WAIT_MS_MAX, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    int64_t max_runs = req->max_runs > 0 ? req->max_runs : 1;
    Keyflow__V1__PollRunsResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__poll_runs_response__init(resp);
    resp->runs = kf_arena_new(cmd->arena, (size_t)max_runs * sizeof *resp->runs);
    cmd->response = &resp->base;
    kf_error_t read_err;
    size_t got = fill_poll(rs, ctx, cmd, &read_err);
    if (got == 0 && read_err.status != KF_OK) {
        cmd->error = read_err;
        kf_ctx_fail(ctx, cmd);
        kf__runs_publish(rs);
        return;
    }
    if (got > 0 || req->wait_ms == 0) {
        kf__runs_publish(rs);
        kf_ctx_ready(ctx, cmd);
        return;
    }
    if (rs->polls >= KF_PARKED_POLLS_MAX) {
        cmd->response = NULL;
        kf_error_set(err, KF_E_LIMIT,
                     "PollRuns: %d long polls already waiting (KF_PARKED_POLLS_MAX)",
                     KF_PARKED_POLLS_MAX);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    poller_t *p = kf_arena_new(cmd->arena, sizeof *p);
    p->cmd = cmd;
    kf_timer_init(&p->timer, KF_TIMER_POLL);
    kf_heap_arm(&ctx->heap, &p->timer, kf_time_add_sat(ctx->now_ms, req->wait_ms));
    p->prev = rs->polls_tail;
    if (rs->polls_tail) {
        rs->polls_tail->next = p;
    } else {
        rs->polls_head = p;
    }
    rs->polls_tail = p;
    rs->polls++;
    cmd->parked = p;
    kf__runs_publish(rs);
}

/* ---- leases ------------------------------------------------------------------ */

static kf_status_t check_run_ref(const char *run_id, const char *lease, bool need_lease,
                                 kf_error_t *err) {
    kf_status_t st = kf_check_identifier("run_id", run_id, KF_RUN_ID_BYTES_MAX, true, err);
    if (st != KF_OK) {
        return st;
    }
    if (need_lease && strlen(lease) != KF_LEASE_BYTES) {
        return kf_error_set(err, KF_E_INVALID,
                            "lease: required, the %d-character token PollRuns returned",
                            KF_LEASE_BYTES);
    }
    return KF_OK;
}

/* The caller's grants cover the run's workflow (the request names only the
 * run). On refusal cmd->error is set to exactly what an unknown run id gets
 * (docs/security.md): a key limited to other workflows learns neither that
 * the run exists nor which workflow it belongs to. */
static bool workflow_allowed(kf_cmd_t *cmd, kf_scope_t scope, const char *run_id,
                             const char *workflow) {
    if (kf_principal_allows(cmd->principal, scope, workflow)) {
        return true;
    }
    kf_error_set(&cmd->error, KF_E_NOT_FOUND, "run_id: no run %s", run_id);
    return false;
}

/* Work on a lease (heartbeat, complete, release) that the caller presents:
 * only the key that took the lease may do it, so that another tenant
 * holding the token cannot forge the run's result. A lease taken without a
 * key (auth was off) is anyone's. */
static bool lease_owner_is_caller(kf_cmd_t *cmd, const char *run_id, const char *owner) {
    if (cmd->principal == NULL || owner[0] == '\0' ||
        strcmp(owner, kf_principal_id(cmd->principal)) == 0) {
        return true;
    }
    kf_error_set(&cmd->error, KF_E_PERMISSION,
                 "lease: run %s was leased with another API key; only that key may heartbeat, "
                 "complete or release it",
                 run_id);
    return false;
}

static void fail_stale_lease(kf_cmd_t *cmd, const char *run_id, int status) {
    kf_error_set(&cmd->error, KF_E_PRECONDITION,
                 "lease: does not hold run %s (it is %s; the lease expired or belongs to "
                 "another attempt)",
                 run_id, status_word(status));
}

/* The run a lease RPC (heartbeat, release) names, held by that lease now:
 * NULL with cmd->error set otherwise. */
static run_t *leased_run(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd, const char *run_id,
                         const char *lease) {
    kf_error_t *err = &cmd->error;
    run_t *r = kf__run_find(rs, run_id);
    if (r != NULL && (r->flags & RUN_DELETED)) {
        kf_error_set(err, KF_E_NOT_FOUND, "run_id: no run %s", run_id);
        return NULL;
    }
    if (r == NULL) {
        kf_stored_run_t *sr;
        if (kf__run_load(ctx, run_id, &sr, err) == KF_OK) {
            if (sr == NULL) {
                kf_error_set(err, KF_E_NOT_FOUND, "run_id: no run %s", run_id);
            } else {
                if (workflow_allowed(cmd, KF_SCOPE_RUNS_WORK, run_id, sr->view.workflow)) {
                    kf_error_set(err, KF_E_PRECONDITION, "run %s is %s", run_id,
                                 status_word(sr->view.status));
                }
                kf__stored_run_free(sr);
            }
        }
        return NULL;
    }
    if (!workflow_allowed(cmd, KF_SCOPE_RUNS_WORK, run_id, kf__run_workflow(r))) {
        return NULL;
    }
    run_view_t v; /* the run's latest lease: a PENDING run's is read */
    if (kf__run_view_open(ctx, r, false, &v, err) != KF_OK) {
        return NULL;
    }
    bool same_lease = strcmp(v.rec.lease, lease) == 0;
    bool owner_ok = !same_lease || lease_owner_is_caller(cmd, run_id, v.rec.lease_owner);
    kf__run_view_close(&v);
    if (!owner_ok) {
        return NULL;
    }
    if (r->status != ST_LEASED || !same_lease || ctx->now_ms >= r->detail->lease_expires_ms) {
        fail_stale_lease(cmd, run_id, r->status);
        return NULL;
    }
    return r;
}

void kf_runs_heartbeat(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__HeartbeatRunRequest *req =
        (const Keyflow__V1__HeartbeatRunRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    if (check_run_ref(req->run_id, req->lease, true, err) != KF_OK ||
        (req->lease_ms != 0 && kf_check_range("lease_ms", req->lease_ms, KF_LEASE_MS_MIN,
                                              KF_LEASE_MS_MAX, err) != KF_OK)) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    run_t *r = leased_run(rs, ctx, cmd, req->run_id, req->lease);
    if (r == NULL) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    /* The detail's lease_ms stays the length the lease was granted with: a
     * heartbeat without lease_ms extends by that, whatever earlier
     * heartbeats asked. */
    int64_t lease_ms = req->lease_ms ? req->lease_ms : r->detail->lease_ms;
    kf__run_heartbeat(rs, ctx, r, lease_ms);
    Keyflow__V1__HeartbeatRunResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__heartbeat_run_response__init(resp);
    resp->lease_expires_ms = r->detail->lease_expires_ms;
    resp->cancel_requested = (r->flags & RUN_CANCEL_REQUESTED) != 0;
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

void kf_runs_release(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__ReleaseRunRequest *req =
        (const Keyflow__V1__ReleaseRunRequest *)cmd->request;
    if (check_run_ref(req->run_id, req->lease, true, &cmd->error) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    run_t *r = leased_run(rs, ctx, cmd, req->run_id, req->lease);
    run_view_t v; /* read before the change: a failed read changes nothing */
    if (r == NULL || kf__run_view_open(ctx, r, true, &v, &cmd->error) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    kf__run_release(rs, ctx, r);
    kf__run_view_refresh(&v, r);
    Keyflow__V1__ReleaseRunResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__release_run_response__init(resp);
    resp->run = kf__rec_to_pb(cmd->arena, ctx, &v.rec, false);
    kf__run_view_close(&v);
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

static kf_status_t check_outcome(const Keyflow__V1__CompleteRunRequest *req, kf_error_t *err) {
    if (req->outcome_case == KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_RESULT_JSON) {
        if (req->retryable) {
            return kf_error_set(err, KF_E_INVALID,
                                "retryable: applies to an error, not to a result");
        }
        return kf_json_check("result", req->result_json, strlen(req->result_json),
                             KF_RUN_RESULT_BYTES_MAX, err);
    }
    if (req->outcome_case == KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_ERROR) {
        size_t len = strlen(req->error);
        if (len == 0) {
            return kf_error_set(err, KF_E_INVALID, "error: must not be empty when the run failed");
        }
        if (len > KF_RUN_ERROR_BYTES_MAX) {
            return kf_error_set(err, KF_E_TOO_LARGE, "error: at most %d bytes, got %zu",
                                KF_RUN_ERROR_BYTES_MAX, len);
        }
        return KF_OK;
    }
    return kf_error_set(err, KF_E_INVALID, "outcome: one of result or error is required");
}

static void complete_answer(kf_ctx_t *ctx, kf_cmd_t *cmd, Keyflow__V1__Run *run, bool already) {
    Keyflow__V1__CompleteRunResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__complete_run_response__init(resp);
    resp->run = run;
    resp->already_finished = already;
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

/* A completion whose lease no longer holds the run: a retry of the
 * completion that ended that lease (same lease; the same kind of outcome,
 * or any outcome of a cancelled run, or a retryable error that scheduled
 * the next attempt) answers OK with already_finished; anything else is
 * FAILED_PRECONDITION. */
static void complete_stale(kf_ctx_t *ctx, kf_cmd_t *cmd, const Keyflow__Records__RunRec *rec) {
    const Keyflow__V1__CompleteRunRequest *req =
        (const Keyflow__V1__CompleteRunRequest *)cmd->request;
    bool wants_success =
        req->outcome_case == KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_RESULT_JSON;
    bool same_lease = strcmp(rec->lease, req->lease) == 0;
    if (!workflow_allowed(cmd, KF_SCOPE_RUNS_WORK, rec->run_id, rec->workflow) ||
        (same_lease && !lease_owner_is_caller(cmd, rec->run_id, rec->lease_owner))) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    bool retry_of_retryable = same_lease && req->retryable && !wants_success &&
                              (rec->status == ST_PENDING || rec->status == ST_DELAYED);
    bool retry_of_final =
        same_lease && kf__run_finished(rec->status) &&
        (rec->status == ST_CANCELLED || (rec->status == ST_COMPLETED) == wants_success);
    if (retry_of_retryable || retry_of_final) {
        complete_answer(ctx, cmd, kf__rec_to_pb(cmd->arena, ctx, rec, false), true);
        return;
    }
    if (same_lease && kf__run_finished(rec->status)) {
        kf_error_set(&cmd->error, KF_E_PRECONDITION,
                     "outcome: run %s already finished %s with this lease; a %s cannot replace it",
                     rec->run_id, status_word(rec->status), wants_success ? "result" : "error");
    } else {
        fail_stale_lease(cmd, rec->run_id, rec->status);
    }
    kf_ctx_fail(ctx, cmd);
}

void kf_runs_complete(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__CompleteRunRequest *req =
        (const Keyflow__V1__CompleteRunRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    if (check_run_ref(req->run_id, req->lease, true, err) != KF_OK ||
        check_outcome(req, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    run_t *r = kf__run_find(rs, req->run_id);
    if (refuse_deleted(ctx, cmd, r, req->run_id)) {
        return;
    }
    if (r == NULL) {
        kf_stored_run_t *sr;
        if (kf__run_load(ctx, req->run_id, &sr, err) != KF_OK) {
            kf_ctx_fail(ctx, cmd);
            return;
        }
        if (sr == NULL) {
            kf_error_set(err, KF_E_NOT_FOUND, "run_id: no run %s", req->run_id);
            kf_ctx_fail(ctx, cmd);
            return;
        }
        complete_stale(ctx, cmd, &sr->view);
        kf__stored_run_free(sr);
        return;
    }
    if (!workflow_allowed(cmd, KF_SCOPE_RUNS_WORK, req->run_id, kf__run_workflow(r))) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    run_view_t v; /* read before any change: a failed read changes nothing */
    if (kf__run_view_open(ctx, r, true, &v, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    bool same_lease = strcmp(v.rec.lease, req->lease) == 0;
    if (same_lease && !lease_owner_is_caller(cmd, req->run_id, v.rec.lease_owner)) {
        kf__run_view_close(&v);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (r->status == ST_LEASED && same_lease && ctx->now_ms >= r->detail->lease_expires_ms) {
        /* Expired by the clock though its timer has not fired yet this turn. */
        kf_error_set(err, KF_E_PRECONDITION, "lease: expired at %lld for run %s",
                     (long long)r->detail->lease_expires_ms, req->run_id);
        kf__run_view_close(&v);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (r->status != ST_LEASED || !same_lease) {
        complete_stale(ctx, cmd, &v.rec);
        kf__run_view_close(&v);
        return;
    }
    bool success = req->outcome_case == KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_RESULT_JSON;
    const char *result = success ? (req->result_json[0] ? req->result_json : "null") : NULL;
    if (r->flags & RUN_CANCEL_REQUESTED) {
        kf__run_finish(rs, ctx, r, ST_CANCELLED, result, success ? NULL : req->error);
    } else if (success) {
        kf__run_finish(rs, ctx, r, ST_COMPLETED, result, NULL);
    } else if (req->retryable) {
        kf__run_attempt_failed(rs, ctx, r, req->error, true);
    } else {
        kf__run_finish(rs, ctx, r, ST_FAILED, NULL, req->error);
    }
    kf__run_view_refresh(&v, r);
    complete_answer(ctx, cmd, kf__rec_to_pb(cmd->arena, ctx, &v.rec, false), false);
    kf__run_view_close(&v);
}

/* ---- cancel --------------------------------------------------------------------- */

void kf_runs_cancel(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__CancelRunRequest *req = (const Keyflow__V1__CancelRunRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    if (check_run_ref(req->run_id, "", false, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    Keyflow__V1__CancelRunResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__cancel_run_response__init(resp);
    run_t *r = kf__run_find(rs, req->run_id);
    kf_stored_run_t *sr = NULL;
    kf_open_window_t window;
    if (refuse_deleted(ctx, cmd, r, req->run_id)) {
        return;
    }
    if (r != NULL) {
        if (!workflow_allowed(cmd, KF_SCOPE_COORDINATORS_WRITE, req->run_id, kf__run_workflow(r))) {
            kf_ctx_fail(ctx, cmd);
            return;
        }
        if (kf__run_finished(r->status) && r->status != ST_CANCELLED) {
            kf_error_set(err, KF_E_PRECONDITION, "run_id: run %s already finished %s", req->run_id,
                         status_word(r->status));
            kf_ctx_fail(ctx, cmd);
            return;
        }
        /* Read before the change (a PENDING run's texts, the body): a
         * failed read changes nothing. */
        run_view_t v;
        if ((r->status == ST_PENDING && kf__run_detail(rs, ctx, r, err) != KF_OK) ||
            kf__run_view_open(ctx, r, true, &v, err) != KF_OK) {
            kf_ctx_fail(ctx, cmd);
            return;
        }
        switch (r->status) {
        case ST_PENDING:
        case ST_DELAYED: kf__run_finish(rs, ctx, r, ST_CANCELLED, NULL, NULL); break;
        case ST_LEASED: kf__run_request_cancel(rs, ctx, r); break;
        default: break; /* CANCELLED: a retry, the same answer */
        }
        kf__run_view_refresh(&v, r);
        resp->run = kf__rec_to_pb(cmd->arena, ctx, &v.rec, false);
        kf__run_view_close(&v);
    } else if (kf__run_load(ctx, req->run_id, &sr, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    } else if (sr != NULL) {
        /* Live runs are all in memory: this one finished. */
        bool allowed =
            workflow_allowed(cmd, KF_SCOPE_COORDINATORS_WRITE, req->run_id, sr->view.workflow);
        if (allowed && sr->view.status != ST_CANCELLED) {
            kf_error_set(err, KF_E_PRECONDITION, "run_id: run %s already finished %s", req->run_id,
                         status_word(sr->view.status));
        } else if (allowed) {
            resp->run = kf__rec_to_pb(cmd->arena, ctx, &sr->view, false);
        }
        kf__stored_run_free(sr);
        if (resp->run == NULL) {
            kf_ctx_fail(ctx, cmd);
            return;
        }
    } else {
        if (rs->window_lookup != NULL &&
            rs->window_lookup(rs->window_owner, req->run_id, &window)) {
            if (workflow_allowed(cmd, KF_SCOPE_COORDINATORS_WRITE, req->run_id, window.workflow)) {
                kf_error_set(err, KF_E_PRECONDITION,
                             "run_id: the window of run %s is still open, so the run does not "
                             "exist yet; CancelWindow drops the window",
                             req->run_id);
            }
        } else {
            kf_error_set(err, KF_E_NOT_FOUND, "run_id: no run %s", req->run_id);
        }
        kf_ctx_fail(ctx, cmd);
        return;
    }
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

/* ---- get, and waiting for a run to finish ------------------------------------------ */

/* What GetRun answers for `run_id` now: the run (in memory or stored), its
 * open window (WINDOW_OPEN), or an error in cmd->error. *finished says
 * whether waiting could change the answer no more. */
static Keyflow__V1__Run *resolve(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd, const char *run_id,
                                 bool *finished) {
    kf_error_t *err = &cmd->error;
    *finished = true;
    run_t *r = kf__run_find(rs, run_id);
    if (r != NULL && (r->flags & RUN_DELETED)) {
        kf_error_set(err, KF_E_NOT_FOUND, "run_id: no run %s", run_id);
        return NULL;
    }
    if (r != NULL) {
        if (!workflow_allowed(cmd, KF_SCOPE_RUNS_READ, run_id, kf__run_workflow(r))) {
            return NULL;
        }
        *finished = kf__run_finished(r->status);
        return kf__run_to_pb(cmd->arena, ctx, r, false, err);
    }
    kf_stored_run_t *sr;
    if (kf__run_load(ctx, run_id, &sr, err) != KF_OK) {
        return NULL;
    }
    if (sr != NULL) {
        Keyflow__V1__Run *p = NULL;
        if (workflow_allowed(cmd, KF_SCOPE_RUNS_READ, run_id, sr->view.workflow)) {
            p = kf__rec_to_pb(cmd->arena, ctx, &sr->view, false);
        }
        kf__stored_run_free(sr);
        return p;
    }
    kf_open_window_t w;
    if (rs->window_lookup == NULL || !rs->window_lookup(rs->window_owner, run_id, &w)) {
        kf_error_set(err, KF_E_NOT_FOUND, "run_id: no run %s", run_id);
        return NULL;
    }
    if (!workflow_allowed(cmd, KF_SCOPE_RUNS_READ, run_id, w.workflow)) {
        return NULL;
    }
    Keyflow__V1__Run *p = kf_arena_new(cmd->arena, sizeof *p);
    keyflow__v1__run__init(p);
    p->run_id = kf_arena_strdup(cmd->arena, run_id);
    p->workflow = kf_arena_strdup(cmd->arena, w.workflow);
    p->key = kf_arena_strdup(cmd->arena, w.key);
    KF_ASSERT(p->run_id && p->workflow && p->key);
    p->kind = (Keyflow__V1__RuleKind)w.kind;
    p->status = KEYFLOW__V1__RUN_STATUS__RUN_STATUS_WINDOW_OPEN;
    p->event_count = w.event_count;
    p->created_ms = w.opened_ms;
    p->updated_ms = w.last_ms;
    p->due_ms = w.due_ms;
    *finished = false;
    return p;
}

static void waiter_unlink(kf_runs_t *rs, kf_ctx_t *ctx, waiter_t *w) {
    waitlist_t *l = w->list;
    if (w->prev) {
        w->prev->next = w->next;
    } else {
        l->head = w->next;
    }
    if (w->next) {
        w->next->prev = w->prev;
    }
    if (w->all_prev) {
        w->all_prev->all_next = w->all_next;
    } else {
        rs->waiters = w->all_next;
    }
    if (w->all_next) {
        w->all_next->all_prev = w->all_prev;
    }
    kf_heap_disarm(&ctx->heap, &w->timer);
    w->cmd->parked = NULL;
    rs->waiting--;
    if (l->head == NULL) {
        kf_map_remove(&rs->waitlists, &l->node);
        free(l->run_id);
        free(l);
    }
}

void kf__waiter_answer(kf_runs_t *rs, kf_ctx_t *ctx, waiter_t *w) {
    kf_cmd_t *cmd = w->cmd;
    const Keyflow__V1__GetRunRequest *req = (const Keyflow__V1__GetRunRequest *)cmd->request;
    waiter_unlink(rs, ctx, w);
    bool finished;
    Keyflow__V1__Run *p = resolve(rs, ctx, cmd, req->run_id, &finished);
    if (p == NULL) {
        kf_ctx_fail(ctx, cmd);
    } else {
        cmd->response = &p->base;
        kf_ctx_ready(ctx, cmd);
    }
    kf__runs_publish(rs);
}

void kf__runs_wake(kf_runs_t *rs, kf_ctx_t *ctx, const char *run_id, const run_t *r) {
    kf_map_node_t *n = kf_map_get(&rs->waitlists, run_id, strlen(run_id));
    if (n == NULL) {
        return;
    }
    waitlist_t *l = KF_CONTAINER_OF(n, waitlist_t, node);
    while (l->head != NULL) {
        waiter_t *w = l->head;
        kf_cmd_t *cmd = w->cmd;
        bool last = w->next == NULL;
        waiter_unlink(rs, ctx, w); /* frees l after the last one */
        Keyflow__V1__Run *p;
        if (r != NULL && (p = kf__run_to_pb(cmd->arena, ctx, r, false, &cmd->error)) != NULL) {
            cmd->response = &p->base;
            kf_ctx_ready(ctx, cmd);
        } else if (r != NULL) {
            kf_ctx_fail(ctx, cmd); /* the store could not be read */
        } else {
            kf_error_set(&cmd->error, KF_E_NOT_FOUND,
                         "run_id: the window of run %s was cancelled; the run will not exist",
                         run_id);
            kf_ctx_fail(ctx, cmd);
        }
        if (last) {
            break;
        }
    }
    kf__runs_publish(rs);
}

void kf_runs_window_dropped(kf_runs_t *rs, kf_ctx_t *ctx, const char *run_id) {
    kf__runs_wake(rs, ctx, run_id, NULL);
}

bool kf__waiter_cancel(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd, uint64_t id) {
    for (waiter_t *w = rs->waiters; w != NULL; w = w->all_next) {
        if (w->cmd == cmd && cmd->id == id) {
            waiter_unlink(rs, ctx, w);
            cmd->response = NULL;
            kf_error_set(&cmd->error, KF_E_CANCELLED, "GetRun: the client went away");
            kf_ctx_ready(ctx, cmd);
            kf__runs_publish(rs);
            return true;
        }
    }
    return false;
}

/* Parks a GetRun until its run finishes or wait_ms passes. */
static void park_get(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd, const char *run_id,
                     int64_t wait_ms) {
    size_t len = strlen(run_id);
    kf_map_node_t *n = kf_map_get(&rs->waitlists, run_id, len);
    waitlist_t *l;
    if (n != NULL) {
        l = KF_CONTAINER_OF(n, waitlist_t, node);
    } else {
        l = kf_xcalloc(1, sizeof *l);
        l->run_id = kf_xstrndup(run_id, len);
        kf_map_insert(&rs->waitlists, &l->node, l->run_id, len);
    }
    waiter_t *w = kf_arena_new(cmd->arena, sizeof *w);
    w->cmd = cmd;
    w->list = l;
    kf_timer_init(&w->timer, KF_TIMER_RUN_WAIT);
    kf_heap_arm(&ctx->heap, &w->timer, kf_time_add_sat(ctx->now_ms, wait_ms));
    w->next = l->head;
    if (l->head) {
        l->head->prev = w;
    }
    l->head = w;
    w->all_next = rs->waiters;
    if (rs->waiters) {
        rs->waiters->all_prev = w;
    }
    rs->waiters = w;
    rs->waiting++;
    cmd->parked = w;
    cmd->response = NULL;
    kf__runs_publish(rs);
}

void kf_runs_get(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__GetRunRequest *req = (const Keyflow__V1__GetRunRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    if (check_run_ref(req->run_id, "", false, err) != KF_OK ||
        kf_check_range("wait_ms", req->wait_ms, 0, KF_POLL_WAIT_MS_MAX, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    bool finished;
    Keyflow__V1__Run *p = resolve(rs, ctx, cmd, req->run_id, &finished);
    if (p == NULL) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (finished || req->wait_ms == 0) {
        cmd->response = &p->base;
        kf_ctx_ready(ctx, cmd);
        return;
    }
    if (rs->waiting >= KF_RUN_WAITS_MAX) {
        kf_error_set(err, KF_E_LIMIT,
                     "GetRun: %d calls already wait for runs to finish (KF_RUN_WAITS_MAX)",
                     KF_RUN_WAITS_MAX);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    park_get(rs, ctx, cmd, req->run_id, req->wait_ms);
}

/* ---- list ---------------------------------------------------------------------------- */

static bool hex_decode(const char *hex, kf_key_t *out) {
    size_t n = strlen(hex);
    if (n % 2 != 0 || n / 2 > KF_STORE_KEY_BYTES_MAX) {
        return false;
    }
    kf_key_reset(out);
    for (size_t i = 0; i < n; i += 2) {
        int v = 0;
        for (int j = 0; j < 2; j++) {
            char c = hex[i + (size_t)j];
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (d < 0) {
                return false;
            }
            v = v * 16 + d;
        }
        kf_key_u8(out, (uint8_t)v);
    }
    return true;
}

/* A page token is the hex of: a magic byte, the status filter, for a
 * key-filtered listing the key's 64-bit hash, and the last run index key
 * returned. The filters and the index key's shape (and its workflow, when
 * the listing names one) are checked on the way back, so a token of another
 * query, or made up, is refused instead of silently ending or restarting
 * the listing. Tokens without a key filter are as older builds wrote them. */
#define TOKEN_MAGIC     0x4c /* 'L' */
#define TOKEN_MAGIC_KEY 0x4b /* 'K': a key filter's hash follows the status */

static char *token_encode(kf_arena_t *arena, uint8_t status, const char *key, const void *last,
                          size_t len) {
    uint8_t head[2 + 8] = {key[0] ? TOKEN_MAGIC_KEY : TOKEN_MAGIC, status};
    size_t head_len = 2;
    if (key[0]) {
        kf_put_be64(head + 2, kf_hash_bytes(key, strlen(key)));
        head_len += 8;
    }
    char *hex = kf_arena_new(arena, (head_len + len) * 2 + 1);
    kf_hex_encode(head, head_len, hex);
    kf_hex_encode(last, len, hex + head_len * 2);
    return hex;
}

static bool token_decode(const char *hex, uint8_t status, const char *key, const kf_key_t *prefix,
                         kf_key_t *out) {
    kf_key_t raw;
    size_t head_len = key[0] ? 10 : 2;
    if (!hex_decode(hex, &raw) || raw.len < head_len ||
        raw.bytes[0] != (key[0] ? TOKEN_MAGIC_KEY : TOKEN_MAGIC) || raw.bytes[1] != status ||
        (key[0] && kf_get_be64(raw.bytes + 2) != kf_hash_bytes(key, strlen(key)))) {
        return false;
    }
    kf_key_reset(out);
    kf_key_raw(out, raw.bytes + head_len, raw.len - head_len);
    /* lp(workflow) | run_seq be64, nothing more */
    kf_key_reader_t r = kf_key_reader(out->bytes, out->len);
    const char *workflow;
    size_t workflow_len;
    uint64_t seq;
    if (!kf_key_read_lp(&r, &workflow, &workflow_len) || workflow_len == 0 ||
        !kf_key_read_be64(&r, &seq) || r.left != 0) {
        return false;
    }
    return prefix == NULL ||
           (out->len > prefix->len && memcmp(out->bytes, prefix->bytes, prefix->len) == 0);
}

/* Whether an index entry's run ID ("<key>@<uuid>") is one of `key`'s. */
static bool run_id_of_key(const char *run_id, size_t len, const char *key, size_t key_len) {
    return len == key_len + 1 + KF_UUID_TEXT_BYTES && memcmp(run_id, key, key_len) == 0 &&
           run_id[key_len] == '@';
}

/* ---- ListRuns's shortcuts past deleted index entries ----------------------
 *
 * Retention deletes runs oldest first, so their index entries pile up, as
 * tombstones until compaction drops them, at the head of each workflow's
 * range; an iterator steps over every one of them, and a listing that starts
 * there got slower with every run deleted (p50 7 -> 44 ms over a soak). When
 * one move of a listing's iterator is slow, the listing remembers where the
 * move came from (a workflow's start, an index entry, or the start of every
 * workflow) and the entry it landed on; the next listing that comes from
 * there seeks to that entry instead. Within one workflow a shortcut stays
 * right for good: run sequences only grow, so a new entry of the workflow
 * comes after every existing one and none can appear between a shortcut's
 * ends (a group is read only once written, and groups are written in
 * order); deletions only widen the gap, and a seek to a deleted target
 * lands on the entry after it. So each listing steps only over what was
 * deleted since the last one. A shortcut into another workflow could jump
 * over a workflow (or runs of its own) indexed since: it is taken only once
 * a bounded look finds nothing between its start and the target
 * workflow's start (what lies in the target workflow before the target
 * stays gone, as above). */

typedef struct list_hint {
    kf_map_node_t node; /* by from */
    uint16_t from_len;
    uint16_t target_len;
    bool across;     /* the target is in another workflow than `from` */
    uint8_t bytes[]; /* from, then the target entry's index key */
} list_hint_t;

static int64_t list_hint_learn_us = KF_LIST_HINT_LEARN_US;

void kf_runs_list_hints_learn_us(int64_t us) {
    list_hint_learn_us = us;
}

static size_t hint_bytes(const list_hint_t *h) {
    return ALLOC(sizeof *h + h->from_len + h->target_len) + SLOTS;
}

static void hint_drop(kf_runs_t *rs, list_hint_t *h) {
    kf_map_remove(&rs->list_hints, &h->node);
    KF_ASSERT(rs->memory_bytes >= hint_bytes(h));
    rs->memory_bytes -= hint_bytes(h);
    free(h);
}

void kf__list_hints_clear(kf_runs_t *rs) {
    size_t b;
    kf_map_node_t *n = kf_map_first(&rs->list_hints, &b);
    while (n != NULL) {
        list_hint_t *h = KF_CONTAINER_OF(n, list_hint_t, node);
        n = kf_map_next(&rs->list_hints, &b, n);
        hint_drop(rs, h);
    }
}

/* The length of an index key's (or a workflow start's) lp(workflow) head;
 * 0 when it has none (the start of every workflow: an empty key). */
static size_t workflow_head_len(const uint8_t *key, size_t len) {
    kf_key_reader_t r = kf_key_reader(key, len);
    const char *workflow;
    size_t workflow_len;
    return kf_key_read_lp(&r, &workflow, &workflow_len) ? len - r.left : 0;
}

static void hint_put(kf_runs_t *rs, const uint8_t *from, size_t from_len, const uint8_t *target,
                     size_t target_len, bool across) {
    kf_map_node_t *n = kf_map_get(&rs->list_hints, from, from_len);
    if (n != NULL) {
        hint_drop(rs, KF_CONTAINER_OF(n, list_hint_t, node)); /* the latest landing is right */
    } else if (rs->list_hints.count >= KF_LIST_HINTS_MAX) {
        kf__list_hints_clear(rs); /* bounded; the next slow moves learn again */
    }
    list_hint_t *h = kf_xmalloc(sizeof *h + from_len + target_len);
    h->from_len = (uint16_t)from_len;
    h->target_len = (uint16_t)target_len;
    h->across = across;
    memcpy(h->bytes, from, from_len);
    memcpy(h->bytes + from_len, target, target_len);
    kf_map_insert(&rs->list_hints, &h->node, h->bytes, h->from_len);
    rs->memory_bytes += hint_bytes(h);
}

/* A slow move from `from` landed on `landed`. */
static void hint_learn(kf_runs_t *rs, const uint8_t *from, size_t from_len, const uint8_t *landed,
                       size_t landed_len) {
    size_t head = workflow_head_len(landed, landed_len);
    if (head == 0 || landed_len != head + 8) {
        return; /* not an index key: the store is read as it is, not trusted */
    }
    bool across = workflow_head_len(from, from_len) != head || memcmp(from, landed, head) != 0;
    hint_put(rs, from, from_len, landed, landed_len, across);
    if (across) {
        /* What it stepped over may be the head of the landing's workflow:
         * a listing of that workflow alone starts there. */
        hint_put(rs, landed, head, landed, landed_len, false);
    }
}

/* Whether no index entry lies after `from` and before the start of the
 * workflow of `h`'s target. */
static bool nothing_between(kf_ctx_t *ctx, const kf_key_t *from, const list_hint_t *h) {
    const uint8_t *target = h->bytes + h->from_len;
    kf_iter_t *look;
    kf_error_t err;
    if (kf_iter_create(ctx->store, KF_CF_RUN_INDEX, from->len ? from->bytes : NULL, from->len,
                       target, workflow_head_len(target, h->target_len), &look, &err) != KF_OK) {
        return false;
    }
    kf_iter_seek_first(look);
    size_t klen;
    const void *k = kf_iter_valid(look) ? kf_iter_key(look, &klen) : NULL;
    if (k != NULL && klen == from->len && memcmp(k, from->bytes, klen) == 0) {
        kf_iter_next(look);
    }
    bool none = !kf_iter_valid(look) && kf_iter_status(look, &err) == KF_OK;
    kf_iter_destroy(look);
    return none;
}

/* Moves `it` to the first entry after `from` (an index key, a workflow's
 * start: lp(workflow), or the start of every workflow: empty): through a
 * shortcut when there is one, else by a step when `it` is on `from`, else
 * by a seek. A slow move leaves a shortcut. */
static void list_move(kf_runs_t *rs, kf_ctx_t *ctx, kf_iter_t *it, const kf_key_t *from,
                      bool on_from) {
    int64_t t0_us = kf_mono_us();
    kf_map_node_t *n = kf_map_get(&rs->list_hints, from->bytes, from->len);
    list_hint_t *h = n ? KF_CONTAINER_OF(n, list_hint_t, node) : NULL;
    if (h != NULL && (!h->across || nothing_between(ctx, from, h))) {
        kf_iter_seek(it, h->bytes + h->from_len, h->target_len);
    } else if (on_from) {
        kf_iter_next(it);
    } else if (from->len == 0) {
        kf_iter_seek_first(it);
    } else {
        kf_iter_seek(it, from->bytes, from->len);
        size_t klen;
        const void *k = kf_iter_valid(it) ? kf_iter_key(it, &klen) : NULL;
        if (k != NULL && klen == from->len && memcmp(k, from->bytes, klen) == 0) {
            kf_iter_next(it); /* a token names the last entry already returned */
        }
    }
    if (kf_iter_valid(it) && kf_mono_us() - t0_us >= list_hint_learn_us) {
        size_t klen;
        const uint8_t *k = kf_iter_key(it, &klen);
        hint_learn(rs, from->bytes, from->len, k, klen);
    }
}

/* Lists runs in (workflow, creation) order through the run index. Runs in
 * memory are shown as they are now; others as stored. Examines at most
 * KF_LIST_SCAN_MAX index entries per call and returns a token to go on. A
 * key filter is applied to the index entries' run IDs, so runs of other
 * keys cost no record read. */
void kf_runs_list(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__ListRunsRequest *req = (const Keyflow__V1__ListRunsRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    if (kf_check_identifier("workflow", req->workflow, KF_WORKFLOW_BYTES_MAX, false, err) !=
            KF_OK ||
        kf_check_identifier("key", req->key, KF_KEY_BYTES_MAX, false, err) != KF_OK ||
        (req->page_size != 0 &&
         kf_check_range("page_size", req->page_size, 1, KF_LIST_PAGE_MAX, err) != KF_OK)) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if ((int)req->status == ST_WINDOW_OPEN) {
        kf_error_set(err, KF_E_INVALID,
                     "status: WINDOW_OPEN runs do not exist yet (GetRun shows them); list "
                     "PENDING, LEASED, DELAYED, COMPLETED, FAILED or CANCELLED runs");
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (kf_check_range("status", (int)req->status, 0, ST_DELAYED, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    kf_key_t lower, upper, after;
    bool bounded = req->workflow[0] != '\0';
    kf_key_reset(&lower);
    if (bounded) {
        kf_key_lp(&lower, req->workflow, strlen(req->workflow));
        bool ok = kf_key_prefix_end(&lower, &upper);
        KF_ASSERT(ok);
    }
    if (req->page_token[0] && !token_decode(req->page_token, (uint8_t)req->status, req->key,
                                            bounded ? &lower : NULL, &after)) {
        kf_error_set(err, KF_E_INVALID,
                     "page_token: not a token this server returned for this "
                     "workflow, key and status");
        kf_ctx_fail(ctx, cmd);
        return;
    }
    kf_iter_t *it;
    if (kf_iter_create(ctx->store, KF_CF_RUN_INDEX, bounded ? lower.bytes : NULL, lower.len,
                       bounded ? upper.bytes : NULL, bounded ? upper.len : 0, &it, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    int64_t page = req->page_size ? req->page_size : KF_LIST_PAGE_DEFAULT;
    Keyflow__V1__ListRunsResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__list_runs_response__init(resp);
    resp->runs = kf_arena_new(cmd->arena, (size_t)page * sizeof *resp->runs);
    /* From the token's entry, else from the workflow's start (lower), else
     * from the start of every workflow (lower is empty). */
    list_move(rs, ctx, it, req->page_token[0] ? &after : &lower, false);
    kf_key_t from;
    size_t examined = 0, bytes = 0, key_len = strlen(req->key);
    bool more = false;
    while (kf_iter_valid(it)) {
        size_t klen, vlen;
        const void *k = kf_iter_key(it, &klen);
        const char *v = kf_iter_value(it, &vlen);
        if ((int64_t)resp->n_runs >= page || examined >= KF_LIST_SCAN_MAX ||
            bytes >= KF_RESPONSE_BYTES_MAX / 4) {
            more = true;
            break;
        }
        examined++;
        resp->next_page_token = token_encode(cmd->arena, (uint8_t)req->status, req->key, k, klen);
        kf_key_reset(&from);
        kf_key_raw(&from, k, klen);
        if (key_len > 0 && !run_id_of_key(v, vlen, req->key, key_len)) {
            list_move(rs, ctx, it, &from, true);
            continue;
        }
        char *run_id = kf_arena_strndup(cmd->arena, v, vlen);
        KF_ASSERT(run_id != NULL);
        Keyflow__V1__Run *p = NULL;
        run_t *r = kf__run_find(rs, run_id);
        if (r != NULL && !(r->flags & RUN_DELETED)) {
            if ((p = kf__run_to_pb(cmd->arena, ctx, r, false, err)) == NULL) {
                kf_iter_destroy(it);
                kf_ctx_fail(ctx, cmd);
                return;
            }
        } else if (r == NULL) {
            kf_stored_run_t *sr;
            if (kf__run_load(ctx, run_id, &sr, err) != KF_OK) {
                kf_iter_destroy(it);
                kf_ctx_fail(ctx, cmd);
                return;
            }
            if (sr != NULL) {
                p = kf__rec_to_pb(cmd->arena, ctx, &sr->view, false);
                kf__stored_run_free(sr);
            }
        }
        if (p != NULL && (req->status == 0 || (int)p->status == (int)req->status)) {
            resp->runs[resp->n_runs++] = p;
            bytes += strlen(p->input_json) + strlen(p->result_json) + 256;
        }
        list_move(rs, ctx, it, &from, true);
    }
    if (!more) {
        resp->next_page_token = ""; /* reached the end */
    }
    kf_status_t st = kf_iter_status(it, err);
    kf_iter_destroy(it);
    if (st != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}
