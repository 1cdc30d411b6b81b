/*
 * test_runs.c - deterministic tests of runs: leases, expiry and attempts,
 * completion and its retries, long polls, listing, retention.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "sim.h"
#include "base/limits.h"
#include "runs/runs.h"
#include "records/records.pb-c.h"
#include "storage/keys.h"

static sim_t sim;
static void setup(void) {
    sim_open(&sim, 7);
    sim.config.run_attempts_max = 2;
    sim.config.run_retention_ms = 10000;
}
static void teardown(void) {
    sim_close(&sim);
}

TestSuite(runs, .init = setup, .fini = teardown, .timeout = 60);

/* Creates one pending run in `workflow` (batch of one) and returns its ID. */
static const char *make_run(const char *workflow, const char *key, const char *input) {
    kf_cmd_t *c = sim_send(&sim, workflow, key, NULL, sim_batch(&sim, 1, 1000), input);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    cr_assert(SEND_RESP(c)->run_started);
    return SEND_RESP(c)->receipt->run_id;
}

Test(runs, lease_expiry_requeues_then_fails_after_max_attempts) {
    int64_t t0 = sim.now_ms;
    const char *id = make_run("wf", "k", "1");
    kf_cmd_t *p1 = sim_poll(&sim, "wf", 1000, 1, 0);
    cr_assert_eq(POLL_RESP(p1)->n_runs, 1);
    Keyflow__V1__Run *r1 = POLL_RESP(p1)->runs[0];
    cr_assert_str_eq(r1->run_id, id);
    cr_assert_eq(r1->attempts, 1);
    cr_assert_eq(r1->status, KEYFLOW__V1__RUN_STATUS__RUN_STATUS_LEASED);
    cr_assert_eq(strlen(r1->lease), 36);
    cr_assert_eq(r1->lease_expires_ms, t0 + 1000);
    cr_assert_eq(POLL_RESP(sim_poll(&sim, "wf", 1000, 1, 0))->n_runs, 0,
                 "leased runs are not handed out");

    sim_advance(&sim, t0 + 1000);
    cr_assert_eq(RUN_RESP(sim_get(&sim, id))->status, KEYFLOW__V1__RUN_STATUS__RUN_STATUS_PENDING);
    kf_cmd_t *p2 = sim_poll(&sim, "wf", 1000, 1, 0);
    Keyflow__V1__Run *r2 = POLL_RESP(p2)->runs[0];
    cr_assert_eq(r2->attempts, 2);
    cr_assert_str_neq(r2->lease, r1->lease, "a new lease per attempt");
    kf_cmd_t *stale = sim_complete(&sim, id, r1->lease, "1", NULL);
    cr_assert_eq(stale->error.status, KF_E_PRECONDITION, "%s", stale->error.message);
    cr_assert(strstr(stale->error.message, "lease") != NULL);

    sim_advance(&sim, t0 + 2000);
    Keyflow__V1__Run *failed = RUN_RESP(sim_get(&sim, id));
    cr_assert_eq(failed->status, KEYFLOW__V1__RUN_STATUS__RUN_STATUS_FAILED);
    cr_assert(strstr(failed->error, "attempt 2 of 2") != NULL, "%s", failed->error);
}

Test(runs, complete_then_retry_is_idempotent_and_other_outcomes_refused) {
    const char *id = make_run("wf", "k", "{\"x\":1}");
    Keyflow__V1__Run *r = POLL_RESP(sim_poll(&sim, "wf", 30000, 1, 0))->runs[0];
    cr_assert_str_eq(r->input_json, "[{\"x\":1}]");
    kf_cmd_t *bad = sim_complete(&sim, id, r->lease, "{oops", NULL);
    cr_assert_eq(bad->error.status, KF_E_INVALID);
    cr_assert(strstr(bad->error.message, "result") != NULL);
    kf_cmd_t *none = sim_complete(&sim, id, r->lease, NULL, NULL);
    cr_assert_eq(none->error.status, KF_E_INVALID);
    cr_assert(strstr(none->error.message, "outcome") != NULL);

    kf_cmd_t *ok = sim_complete(&sim, id, r->lease, "{\"done\":true}", NULL);
    cr_assert_eq(ok->error.status, KF_OK, "%s", ok->error.message);
    Keyflow__V1__CompleteRunResponse *resp = (Keyflow__V1__CompleteRunResponse *)ok->response;
    cr_assert_eq(resp->run->status, KEYFLOW__V1__RUN_STATUS__RUN_STATUS_COMPLETED);
    cr_assert_not(resp->already_finished);
    kf_cmd_t *again = sim_complete(&sim, id, r->lease, "{\"done\":true}", NULL);
    cr_assert_eq(again->error.status, KF_OK);
    cr_assert(((Keyflow__V1__CompleteRunResponse *)again->response)->already_finished);
    kf_cmd_t *flip = sim_complete(&sim, id, r->lease, NULL, "boom");
    cr_assert_eq(flip->error.status, KF_E_PRECONDITION);
    cr_assert(strstr(flip->error.message, "already finished COMPLETED with this lease") != NULL,
              "the message says why: %s", flip->error.message);
    Keyflow__V1__Run *got = RUN_RESP(sim_get(&sim, id));
    cr_assert_str_eq(got->result_json, "{\"done\":true}");
    cr_assert_str_eq(got->lease, "", "the lease token is only for its holder");
    /* The same answers after a crash (the run now lives on disk only). */
    sim_crash(&sim);
    again = sim_complete(&sim, id, r->lease, "{\"done\":true}", NULL);
    cr_assert_eq(again->error.status, KF_OK, "%s", again->error.message);
    cr_assert(((Keyflow__V1__CompleteRunResponse *)again->response)->already_finished);
    cr_assert_eq(RUN_RESP(sim_get(&sim, id))->status,
                 KEYFLOW__V1__RUN_STATUS__RUN_STATUS_COMPLETED);
}

Test(runs, error_completion_fails_the_run) {
    const char *id = make_run("wf", "k", "1");
    Keyflow__V1__Run *r = POLL_RESP(sim_poll(&sim, "wf", 30000, 1, 0))->runs[0];
    cr_assert_eq(sim_complete(&sim, id, r->lease, NULL, "worker crashed")->error.status, KF_OK);
    Keyflow__V1__Run *got = RUN_RESP(sim_get(&sim, id));
    cr_assert_eq(got->status, KEYFLOW__V1__RUN_STATUS__RUN_STATUS_FAILED);
    cr_assert_str_eq(got->error, "worker crashed");
}

Test(runs, oldest_first_across_workflows_and_filtered_by_workflow) {
    const char *a = make_run("wf-a", "k", "1");
    const char *b = make_run("wf-b", "k", "2");
    const char *c = make_run("wf-a", "k2", "3");
    cr_assert_str_eq(POLL_RESP(sim_poll(&sim, "wf-b", 30000, 5, 0))->runs[0]->run_id, b);
    Keyflow__V1__PollRunsResponse *rest = POLL_RESP(sim_poll(&sim, NULL, 30000, 5, 0));
    cr_assert_eq(rest->n_runs, 2);
    cr_assert_str_eq(rest->runs[0]->run_id, a);
    cr_assert_str_eq(rest->runs[1]->run_id, c);
}

Test(runs, parked_poll_is_woken_by_a_new_run_and_expires_empty) {
    kf_cmd_t *parked = sim_poll(&sim, "wf", 30000, 1, 5000);
    cr_assert_not_null(parked->parked, "nothing to hand out: the poll waits");
    const char *id = make_run("wf", "k", "1");
    cr_assert_null(parked->parked);
    cr_assert_eq(POLL_RESP(parked)->n_runs, 1);
    cr_assert_str_eq(POLL_RESP(parked)->runs[0]->run_id, id);

    int64_t t0 = sim.now_ms;
    kf_cmd_t *empty = sim_poll(&sim, "other", 30000, 1, 200);
    cr_assert_not_null(empty->parked);
    sim_advance(&sim, t0 + 199);
    cr_assert_not_null(empty->parked);
    sim_advance(&sim, t0 + 200);
    cr_assert_null(empty->parked);
    cr_assert_eq(empty->error.status, KF_OK);
    cr_assert_eq(POLL_RESP(empty)->n_runs, 0);
}

Test(runs, poll_validates_its_fields) {
    kf_cmd_t *c = sim_poll(&sim, "wf", 5, 1, 0);
    cr_assert_eq(c->error.status, KF_E_INVALID);
    cr_assert(strstr(c->error.message, "lease_ms") != NULL);
    c = sim_poll(&sim, "wf", 1000, 1000, 0);
    cr_assert_eq(c->error.status, KF_E_INVALID);
    cr_assert(strstr(c->error.message, "max_runs") != NULL);
    c = sim_poll(&sim, "wf", 1000, 1, KF_POLL_WAIT_MS_MAX + 1);
    cr_assert(strstr(c->error.message, "wait_ms") != NULL);
}

Test(runs, list_pages_through_runs_with_a_status_filter) {
    const char *ids[5];
    for (int i = 0; i < 5; i++) {
        char key[8];
        snprintf(key, sizeof key, "k%d", i);
        ids[i] = make_run("wf", key, "1");
    }
    /* Lease the first two. */
    cr_assert_eq(POLL_RESP(sim_poll(&sim, "wf", 30000, 2, 0))->n_runs, 2);
    Keyflow__V1__ListRunsRequest req = KEYFLOW__V1__LIST_RUNS_REQUEST__INIT;
    req.workflow = "wf";
    req.page_size = 2;
    const char *seen[5];
    int n = 0;
    for (;;) {
        kf_cmd_t *c = sim_exec(&sim, KF_OP_LIST_RUNS, &req.base);
        cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
        Keyflow__V1__ListRunsResponse *resp = (Keyflow__V1__ListRunsResponse *)c->response;
        for (size_t i = 0; i < resp->n_runs; i++) {
            cr_assert_lt(n, 5);
            seen[n++] = resp->runs[i]->run_id;
        }
        if (resp->next_page_token[0] == '\0') {
            break;
        }
        req.page_token = resp->next_page_token;
    }
    cr_assert_eq(n, 5);
    for (int i = 0; i < 5; i++) {
        cr_assert_str_eq(seen[i], ids[i], "creation order");
    }
    req.page_token = "";
    req.page_size = 100;
    req.status = KEYFLOW__V1__RUN_STATUS__RUN_STATUS_PENDING;
    Keyflow__V1__ListRunsResponse *pending =
        (Keyflow__V1__ListRunsResponse *)sim_exec(&sim, KF_OP_LIST_RUNS, &req.base)->response;
    cr_assert_eq(pending->n_runs, 3);
    cr_assert_str_eq(pending->runs[0]->run_id, ids[2]);
    req.page_token = "zz";
    cr_assert_eq(sim_exec(&sim, KF_OP_LIST_RUNS, &req.base)->error.status, KF_E_INVALID);
}

Test(runs, finished_runs_are_deleted_after_retention) {
    int64_t t0 = sim.now_ms;
    const char *id = make_run("wf", "k", "1");
    Keyflow__V1__Run *r = POLL_RESP(sim_poll(&sim, "wf", 30000, 1, 0))->runs[0];
    cr_assert_eq(sim_complete(&sim, id, r->lease, "2", NULL)->error.status, KF_OK);
    sim_advance(&sim, t0 + 9000);
    cr_assert_eq(sim_get(&sim, id)->error.status, KF_OK, "kept during retention");
    sim_crash(&sim); /* retention must also work for runs known only on disk */
    sim_advance(&sim, t0 + 10000 + 1);
    sim_advance(&sim, t0 + 12000);
    kf_cmd_t *g = sim_get(&sim, id);
    cr_assert_eq(g->error.status, KF_E_NOT_FOUND, "%s", g->error.message);
    Keyflow__V1__ListRunsRequest req = KEYFLOW__V1__LIST_RUNS_REQUEST__INIT;
    cr_assert_eq(
        ((Keyflow__V1__ListRunsResponse *)sim_exec(&sim, KF_OP_LIST_RUNS, &req.base)->response)
            ->n_runs,
        0);
}

/* Runs one command in the open group without ending it (its effects are
 * not durable yet; sim_exec would write them). */
static kf_cmd_t *exec_in_group(kf_op_t op, const ProtobufCMessage *request) {
    kf_cmd_t *cmd = kf_arena_zalloc(&sim.arena, sizeof *cmd);
    cmd->op = op;
    cmd->request = request;
    cmd->arena = &sim.arena;
    kf_core_begin(sim.core, sim.batch, sim.group, sim.now_ms);
    kf_core_execute(sim.core, cmd);
    return cmd;
}

/* Found by the seeded simulation (tests/sim): a run whose retention ended
 * while the write that finished it was still in flight was forgotten in
 * memory, and reads fell through to the stored record from before it
 * finished - GetRun and ListRuns showed it LEASED again. */
Test(runs, retention_ending_before_the_finish_is_durable_never_shows_the_older_state) {
    int64_t t0 = sim.now_ms;
    const char *id = make_run("wf", "k", "1");
    Keyflow__V1__Run *r = POLL_RESP(sim_poll(&sim, "wf", 30000, 1, 0))->runs[0];
    Keyflow__V1__CompleteRunRequest done = KEYFLOW__V1__COMPLETE_RUN_REQUEST__INIT;
    done.run_id = (char *)id;
    done.lease = r->lease;
    done.outcome_case = KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_RESULT_JSON;
    done.result_json = "2";
    cr_assert_eq(exec_in_group(KF_OP_COMPLETE_RUN, &done.base)->error.status, KF_OK);
    /* The same group goes on past the retention (10 s here). */
    sim.now_ms = t0 + 10001;
    kf_core_begin(sim.core, sim.batch, sim.group, sim.now_ms);
    while (kf_core_tick(sim.core, KF_TIMERS_PER_TURN_MAX) == KF_TIMERS_PER_TURN_MAX) {
    }
    Keyflow__V1__GetRunRequest get = KEYFLOW__V1__GET_RUN_REQUEST__INIT;
    get.run_id = (char *)id;
    kf_cmd_t *g = exec_in_group(KF_OP_GET_RUN, &get.base);
    cr_assert_eq(g->error.status, KF_E_NOT_FOUND, "%s (status %d)", g->error.message,
                 g->response ? (int)((Keyflow__V1__Run *)g->response)->status : -1);
    Keyflow__V1__ListRunsRequest list = KEYFLOW__V1__LIST_RUNS_REQUEST__INIT;
    kf_cmd_t *l = exec_in_group(KF_OP_LIST_RUNS, &list.base);
    cr_assert_eq(l->error.status, KF_OK, "%s", l->error.message);
    cr_assert_eq(((Keyflow__V1__ListRunsResponse *)l->response)->n_runs, 0);
    kf_cmd_t *again = exec_in_group(KF_OP_COMPLETE_RUN, &done.base);
    cr_assert_eq(again->error.status, KF_E_NOT_FOUND, "%s", again->error.message);
    sim_step(&sim); /* the finish and the deletion are durable together */
    cr_assert_eq(sim_get(&sim, id)->error.status, KF_E_NOT_FOUND);
    sim_crash(&sim);
    cr_assert_eq(sim_get(&sim, id)->error.status, KF_E_NOT_FOUND);
}

Test(runs, leased_runs_survive_a_crash_with_their_lease) {
    int64_t t0 = sim.now_ms;
    const char *id = make_run("wf", "k", "1");
    Keyflow__V1__Run *r = POLL_RESP(sim_poll(&sim, "wf", 3000, 1, 0))->runs[0];
    char lease[40];
    strcpy(lease, r->lease);
    sim_crash(&sim);
    cr_assert_eq(RUN_RESP(sim_get(&sim, id))->status, KEYFLOW__V1__RUN_STATUS__RUN_STATUS_LEASED);
    cr_assert_eq(sim_complete(&sim, id, lease, "1", NULL)->error.status, KF_OK);
    (void)t0;
}

Test(runs, lease_expiry_survives_a_crash) {
    int64_t t0 = sim.now_ms;
    const char *id = make_run("wf", "k", "1");
    cr_assert_eq(POLL_RESP(sim_poll(&sim, "wf", 3000, 1, 0))->n_runs, 1);
    sim_crash(&sim);
    sim_advance(&sim, t0 + 3000);
    cr_assert_eq(RUN_RESP(sim_get(&sim, id))->status, KEYFLOW__V1__RUN_STATUS__RUN_STATUS_PENDING);
    cr_assert_eq(POLL_RESP(sim_poll(&sim, "wf", 3000, 1, 0))->runs[0]->attempts, 2);
}

/* Teardown destroys the core with pending and leased runs in two queues and
 * armed timers: under ASan this checks the destroy order (queues and the
 * timer heap before the runs whose nodes they hold). */
Test(runs, destroying_with_live_runs_is_clean) {
    make_run("wf-a", "k1", "1");
    make_run("wf-b", "k2", "2");
    make_run("wf-a", "k3", "3");
    cr_assert_eq(POLL_RESP(sim_poll(&sim, "wf-a", 30000, 1, 0))->n_runs, 1);
    cr_assert_eq(POLL_RESP(sim_poll(&sim, "none", 30000, 1, 0))->n_runs, 0);
}

/* A lease that expired on the last attempt failed the run without the
 * worker: the worker's late report (result or error) is refused, never
 * taken for a retry of a completion that did not happen, and crash recovery
 * keeps it that way. */
Test(runs, a_late_report_after_the_final_expiry_is_refused) {
    int64_t t0 = sim.now_ms;
    const char *id = make_run("wf", "k", "1");
    const char *lease = NULL;
    for (int attempt = 1; attempt <= 2; attempt++) {
        kf_cmd_t *p = sim_poll(&sim, "wf", 1000, 1, 0);
        cr_assert_eq(POLL_RESP(p)->n_runs, 1);
        lease = POLL_RESP(p)->runs[0]->lease;
        sim_advance(&sim, t0 + 1000 * attempt);
    }
    cr_assert_eq(RUN_RESP(sim_get(&sim, id))->status, KEYFLOW__V1__RUN_STATUS__RUN_STATUS_FAILED);
    for (int round = 0; round < 2; round++) {
        kf_cmd_t *err = sim_complete(&sim, id, lease, NULL, "worker failure");
        cr_assert_eq(err->error.status, KF_E_PRECONDITION, "%s", err->error.message);
        kf_cmd_t *ok = sim_complete(&sim, id, lease, "1", NULL);
        cr_assert_eq(ok->error.status, KF_E_PRECONDITION, "%s", ok->error.message);
        Keyflow__V1__Run *r = RUN_RESP(sim_get(&sim, id));
        cr_assert(strstr(r->error, "lease expired on attempt 2 of 2") != NULL, "%s", r->error);
        sim_crash(&sim); /* the second round runs against the recovered state */
    }
}

/* HeartbeatRun without lease_ms extends by the length the lease was granted
 * with, not by whatever an earlier heartbeat asked for. */
Test(runs, heartbeat_default_is_the_granted_length) {
    const char *id = make_run("wf", "k", "1");
    kf_cmd_t *p = sim_poll(&sim, "wf", 1000, 1, 0);
    const char *lease = POLL_RESP(p)->runs[0]->lease;
    Keyflow__V1__HeartbeatRunRequest hb = KEYFLOW__V1__HEARTBEAT_RUN_REQUEST__INIT;
    hb.run_id = (char *)id;
    hb.lease = (char *)lease;
    hb.lease_ms = 20000;
    kf_cmd_t *h1 = sim_exec(&sim, KF_OP_HEARTBEAT_RUN, &hb.base);
    cr_assert_eq(h1->error.status, KF_OK, "%s", h1->error.message);
    cr_assert_eq(((Keyflow__V1__HeartbeatRunResponse *)h1->response)->lease_expires_ms,
                 sim.now_ms + 20000);
    sim_advance(&sim, sim.now_ms + 500);
    hb.lease_ms = 0;
    kf_cmd_t *h2 = sim_exec(&sim, KF_OP_HEARTBEAT_RUN, &hb.base);
    cr_assert_eq(h2->error.status, KF_OK, "%s", h2->error.message);
    cr_assert_eq(((Keyflow__V1__HeartbeatRunResponse *)h2->response)->lease_expires_ms,
                 sim.now_ms + 1000);
}

/* A page token carries its query: a token of another workflow or status
 * filter, a made-up one, or a truncated one is refused (the listing would
 * otherwise silently end or restart); the token a query returned goes on. */
Test(runs, page_tokens_of_other_queries_or_made_up_are_refused) {
    for (int i = 0; i < 3; i++) {
        char key[8];
        snprintf(key, sizeof key, "k%d", i);
        make_run("wf", key, "1");
        make_run("other", key, "1");
    }
    Keyflow__V1__ListRunsRequest req = KEYFLOW__V1__LIST_RUNS_REQUEST__INIT;
    req.workflow = "wf";
    req.page_size = 1;
    kf_cmd_t *first = sim_exec(&sim, KF_OP_LIST_RUNS, &req.base);
    cr_assert_eq(first->error.status, KF_OK, "%s", first->error.message);
    char *token = ((Keyflow__V1__ListRunsResponse *)first->response)->next_page_token;
    cr_assert_neq(token[0], '\0');

    req.page_token = token;
    kf_cmd_t *next = sim_exec(&sim, KF_OP_LIST_RUNS, &req.base);
    cr_assert_eq(next->error.status, KF_OK, "%s", next->error.message);
    cr_assert_eq(((Keyflow__V1__ListRunsResponse *)next->response)->n_runs, 1);

    char truncated[256];
    snprintf(truncated, sizeof truncated, "%.*s", (int)strlen(token) - 2, token);
    const char *bad[] = {"ff", "00", "4c00", truncated, "zz"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        req.page_token = (char *)bad[i];
        kf_cmd_t *c = sim_exec(&sim, KF_OP_LIST_RUNS, &req.base);
        cr_assert_eq(c->error.status, KF_E_INVALID, "token %s: %s", bad[i], c->error.message);
        cr_assert(strstr(c->error.message, "page_token") != NULL);
    }
    req.page_token = token;
    req.workflow = "other";
    cr_assert_eq(sim_exec(&sim, KF_OP_LIST_RUNS, &req.base)->error.status, KF_E_INVALID,
                 "a token of another workflow");
    req.workflow = "wf";
    req.status = KEYFLOW__V1__RUN_STATUS__RUN_STATUS_PENDING;
    cr_assert_eq(sim_exec(&sim, KF_OP_LIST_RUNS, &req.base)->error.status, KF_E_INVALID,
                 "a token of another status filter");
    req.workflow = "";
    req.status = 0;
    cr_assert_eq(sim_exec(&sim, KF_OP_LIST_RUNS, &req.base)->error.status, KF_OK,
                 "a listing of every workflow may go on from any workflow's position");
    req.page_token = "";
    req.status = (Keyflow__V1__RunStatus)-1;
    kf_cmd_t *neg = sim_exec(&sim, KF_OP_LIST_RUNS, &req.base);
    cr_assert_eq(neg->error.status, KF_E_INVALID);
    cr_assert_str_eq(neg->error.message, "status: must be in 0..6, got -1");
}

/* Recovery checks what it reads: a live run listed twice in the run queue
 * (never written by the engine; corruption or a bug) stops the start with
 * KF_E_CORRUPT naming it, instead of an assertion deep in recovery. */
Test(runs, recovery_refuses_a_run_queued_twice) {
    const char *id = make_run("wf", "k", "1");
    kf_key_t k;
    kf_key_run_queue(&k, 12345);
    sim_put_raw(&sim, KF_CF_RUN_QUEUE, k.bytes, k.len, id, strlen(id));
    kf_error_t err;
    cr_assert_eq(sim_restart_status(&sim, &err), KF_E_CORRUPT, "%s", err.message);
    cr_assert(strstr(err.message, id) != NULL && strstr(err.message, "listed twice") != NULL, "%s",
              err.message);
}

/* The disk boundary: every run record read back is checked (load_rec). One
 * the engine could not have written (an unknown status, a leased run without
 * its lease) is KF_E_CORRUPT naming the run, never an assertion further on. */
Test(runs, a_malformed_stored_run_is_corrupt_when_read) {
    const char *id = "k@0190f5c0-1234-7abc-8def-0123456789ab";
    Keyflow__Records__RunRec rec = KEYFLOW__RECORDS__RUN_REC__INIT;
    rec.run_id = (char *)id;
    rec.workflow = "wf";
    rec.key = "k";
    rec.kind = KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH;
    struct {
        int status;
        char *lease;
        kf_status_t want;
    } cases[] = {
        {KEYFLOW__V1__RUN_STATUS__RUN_STATUS_COMPLETED, "", KF_OK}, /* well formed */
        {9, "", KF_E_CORRUPT},
        {KEYFLOW__V1__RUN_STATUS__RUN_STATUS_LEASED, "", KF_E_CORRUPT},
        {KEYFLOW__V1__RUN_STATUS__RUN_STATUS_COMPLETED, "short", KF_E_CORRUPT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rec.status = cases[i].status;
        rec.lease = cases[i].lease;
        uint8_t buf[512];
        size_t len = keyflow__records__run_rec__pack(&rec, buf);
        sim_put_raw(&sim, KF_CF_RUNS, id, strlen(id), buf, len);
        kf_cmd_t *c = sim_get(&sim, id);
        cr_assert_eq(c->error.status, cases[i].want, "case %zu: %s", i, c->error.message);
        if (cases[i].want != KF_OK) {
            cr_assert(strstr(c->error.message, id) != NULL, "%s", c->error.message);
        }
    }
}

/* ---- ListRuns's shortcuts past deleted index entries ------------------------ */

#define SHORTCUT_RUNS 64

typedef struct listed_run {
    const char *id;
    const char *workflow;
    bool gone;
} listed_run_t;

/* Every listing (of every workflow and of each one, at several page sizes)
 * shows exactly the runs not gone, each once, by workflow then creation. */
static void check_listings(const listed_run_t *runs, int n) {
    const char *filters[] = {"", "a", "b", "c", "d", "e"};
    const int64_t page_sizes[] = {1, 3, 100};
    for (size_t f = 0; f < sizeof filters / sizeof *filters; f++) {
        const char *expected[SHORTCUT_RUNS];
        int want = 0;
        for (char w = 'a'; w <= 'e'; w++) {
            for (int i = 0; i < n; i++) {
                if (!runs[i].gone && runs[i].workflow[0] == w &&
                    (filters[f][0] == '\0' || filters[f][0] == w)) {
                    expected[want++] = runs[i].id;
                }
            }
        }
        for (size_t p = 0; p < sizeof page_sizes / sizeof *page_sizes; p++) {
            Keyflow__V1__ListRunsRequest req = KEYFLOW__V1__LIST_RUNS_REQUEST__INIT;
            req.workflow = (char *)filters[f];
            req.page_size = page_sizes[p];
            int got = 0;
            for (int calls = 0; calls <= SHORTCUT_RUNS; calls++) {
                kf_cmd_t *c = sim_exec(&sim, KF_OP_LIST_RUNS, &req.base);
                cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
                Keyflow__V1__ListRunsResponse *resp = (Keyflow__V1__ListRunsResponse *)c->response;
                for (size_t i = 0; i < resp->n_runs; i++) {
                    cr_assert_lt(got, want, "workflow '%s', page %lld: more runs than %d",
                                 filters[f], (long long)page_sizes[p], want);
                    cr_assert_str_eq(resp->runs[i]->run_id, expected[got],
                                     "workflow '%s', page %lld, run %d", filters[f],
                                     (long long)page_sizes[p], got);
                    got++;
                }
                if (resp->next_page_token[0] == '\0') {
                    break;
                }
                req.page_token = resp->next_page_token;
            }
            cr_assert_eq(got, want, "workflow '%s', page %lld", filters[f],
                         (long long)page_sizes[p]);
        }
    }
}

/* Here every move of a listing's iterator leaves a shortcut (the server
 * leaves one only after a slow move): listings must still show every run
 * once, in order, after the shortcuts' targets are deleted and after new
 * runs join old workflows and new workflows between the old ones. */
Test(runs, list_shortcuts_past_deleted_runs_never_hide_or_repeat_a_run) {
    kf_runs_list_hints_learn_us(0);
    listed_run_t runs[SHORTCUT_RUNS];
    int n = 0;
    const char *old_workflows[] = {"a", "c", "e"};
    for (int i = 0; i < 30; i++) {
        char key[8];
        snprintf(key, sizeof key, "k%d", i);
        runs[n].workflow = old_workflows[i % 3];
        runs[n].id = make_run(runs[n].workflow, key, "1");
        runs[n++].gone = false;
    }
    check_listings(runs, n); /* leaves shortcuts between neighbours */

    /* In each workflow the oldest and the youngest run stay leased; the
     * eight between them finish, and retention deletes them. */
    int64_t t0 = sim.now_ms;
    for (int w = 0; w < 3; w++) {
        Keyflow__V1__PollRunsResponse *p =
            POLL_RESP(sim_poll(&sim, old_workflows[w], KF_LEASE_MS_MAX, 10, 0));
        cr_assert_eq(p->n_runs, 10);
        for (size_t i = 1; i + 1 < p->n_runs; i++) {
            kf_cmd_t *c = sim_complete(&sim, p->runs[i]->run_id, p->runs[i]->lease, "2", NULL);
            cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
            for (int j = 0; j < n; j++) {
                runs[j].gone |= strcmp(runs[j].id, p->runs[i]->run_id) == 0;
            }
        }
    }
    sim_advance(&sim, t0 + 10000 + 1);
    sim_advance(&sim, t0 + 12000);
    check_listings(runs, n); /* the shortcuts' targets are gone */
    check_listings(runs, n); /* through the shortcuts the last listings left */

    const char *new_workflows[] = {"a", "b", "c", "d", "e"};
    for (int i = 0; i < 20; i++) {
        char key[8];
        snprintf(key, sizeof key, "n%d", i);
        runs[n].workflow = new_workflows[i % 5];
        runs[n].id = make_run(runs[n].workflow, key, "1");
        runs[n++].gone = false;
    }
    check_listings(runs, n);
    kf_runs_list_hints_learn_us(KF_LIST_HINT_LEARN_US);
}
