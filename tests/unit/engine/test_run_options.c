/*
 * test_run_options.c - deterministic tests of what a rule's run options and
 * the later Runs RPCs do: key concurrency, retries with backoff, delayed
 * start, cancel, release, GetRun of a window's run and its waits, ListRuns
 * by key, the event IDs a run holds - each through a crash where it stores
 * state - and the backoff formula.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "base/limits.h"
#include "runs/runs.h"
#include "sim.h"

static sim_t sim;
static void setup(void) {
    sim_open(&sim, 11);
    sim.config.run_attempts_max = 2;
    sim.config.run_retention_ms = 60000;
}
static void teardown(void) {
    sim_close(&sim);
}

TestSuite(run_options, .init = setup, .fini = teardown, .timeout = 60);

#define ST(x) KEYFLOW__V1__RUN_STATUS__RUN_STATUS_##x

static Keyflow__V1__Rule *one(void) {
    return sim_batch(&sim, 1, 1000);
}

static const char *make_run_with(const char *workflow, const char *key, Keyflow__V1__Rule *rule) {
    kf_cmd_t *c = sim_send(&sim, workflow, key, NULL, rule, "1");
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    cr_assert(SEND_RESP(c)->run_started);
    return SEND_RESP(c)->receipt->run_id;
}

static Keyflow__V1__Rule *limited(int64_t key_concurrency) {
    Keyflow__V1__Rule *r = one();
    r->key_concurrency = key_concurrency;
    return r;
}

static Keyflow__V1__Rule *retrying(int64_t max_attempts, int64_t initial_ms, int64_t max_ms,
                                   double multiplier) {
    Keyflow__V1__Rule *r = one();
    Keyflow__V1__RetryPolicy *p = kf_arena_zalloc(&sim.arena, sizeof *p);
    keyflow__v1__retry_policy__init(p);
    p->max_attempts = max_attempts;
    if (initial_ms >= 0) {
        p->initial_backoff_ms_present_case =
            KEYFLOW__V1__RETRY_POLICY__INITIAL_BACKOFF_MS_PRESENT_INITIAL_BACKOFF_MS;
        p->initial_backoff_ms = initial_ms;
    }
    p->max_backoff_ms = max_ms;
    p->multiplier = multiplier;
    r->retry = p;
    return r;
}

static Keyflow__V1__PollRunsResponse *poll_all(const char *workflow) {
    kf_cmd_t *c = sim_poll(&sim, workflow, 10000, 100, 0);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    return POLL_RESP(c);
}

static bool has_run(const Keyflow__V1__PollRunsResponse *p, const char *run_id) {
    for (size_t i = 0; i < p->n_runs; i++) {
        if (strcmp(p->runs[i]->run_id, run_id) == 0) {
            return true;
        }
    }
    return false;
}

static kf_cmd_t *complete_error(const char *run_id, const char *lease, const char *error,
                                bool retryable) {
    Keyflow__V1__CompleteRunRequest *req = kf_arena_zalloc(&sim.arena, sizeof *req);
    keyflow__v1__complete_run_request__init(req);
    req->run_id = kf_arena_strdup(&sim.arena, run_id);
    req->lease = kf_arena_strdup(&sim.arena, lease);
    req->outcome_case = KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_ERROR;
    req->error = kf_arena_strdup(&sim.arena, error);
    req->retryable = retryable;
    return sim_exec(&sim, KF_OP_COMPLETE_RUN, &req->base);
}

static kf_cmd_t *cancel(const char *run_id) {
    return sim_cancel_run(&sim, run_id);
}

static kf_cmd_t *release(const char *run_id, const char *lease) {
    return sim_release(&sim, run_id, lease);
}

static kf_cmd_t *heartbeat(const char *run_id, const char *lease) {
    return sim_heartbeat(&sim, run_id, lease);
}

static kf_cmd_t *get_wait(const char *run_id, int64_t wait_ms) {
    Keyflow__V1__GetRunRequest *req = kf_arena_zalloc(&sim.arena, sizeof *req);
    keyflow__v1__get_run_request__init(req);
    req->run_id = kf_arena_strdup(&sim.arena, run_id);
    req->wait_ms = wait_ms;
    return sim_exec(&sim, KF_OP_GET_RUN, &req->base);
}

static Keyflow__V1__Run *get(const char *run_id) {
    kf_cmd_t *c = sim_get(&sim, run_id);
    cr_assert_eq(c->error.status, KF_OK, "%s: %s", run_id, c->error.message);
    return RUN_RESP(c);
}

#define CANCEL_RUN(c) (((Keyflow__V1__CancelRunResponse *)(c)->response)->run)

/* ---- key concurrency ------------------------------------------------------ */

Test(run_options, key_concurrency_leases_a_keys_runs_one_at_a_time_in_order) {
    const char *k1 = make_run_with("wf", "k", limited(1));
    const char *k2 = make_run_with("wf", "k", limited(1));
    const char *k3 = make_run_with("wf", "k", limited(1));
    const char *j1 = make_run_with("wf", "j", limited(1));
    Keyflow__V1__PollRunsResponse *p = poll_all("wf");
    cr_assert_eq(p->n_runs, 2, "one run of each key");
    cr_assert_str_eq(p->runs[0]->run_id, k1);
    cr_assert_str_eq(p->runs[1]->run_id, j1);
    cr_assert_eq(get(k2)->status, ST(PENDING), "a run waiting for its key stays PENDING");
    cr_assert_eq(poll_all("wf")->n_runs, 0);
    cr_assert_eq(sim_complete(&sim, j1, p->runs[1]->lease, "1", NULL)->error.status, KF_OK);

    /* A parked poll gets the key's next run when its slot frees. */
    kf_cmd_t *parked = sim_poll(&sim, "wf", 10000, 10, 5000);
    cr_assert_not_null(parked->parked);
    cr_assert_eq(sim_complete(&sim, k1, p->runs[0]->lease, "1", NULL)->error.status, KF_OK);
    cr_assert_null(parked->parked, "the freed slot woke the poll");
    cr_assert_eq(POLL_RESP(parked)->n_runs, 1);
    cr_assert_str_eq(POLL_RESP(parked)->runs[0]->run_id, k2, "in order");

    /* The leased run survives a crash, and still holds the key's slot. */
    sim_crash(&sim);
    cr_assert_eq(poll_all("wf")->n_runs, 0);
    cr_assert_eq(get(k3)->status, ST(PENDING));
    /* Its lease expires: k2 goes back ahead of k3 (invariant 4). */
    sim_advance(&sim, sim.now_ms + 10000);
    p = poll_all("wf");
    cr_assert_eq(p->n_runs, 1);
    cr_assert_str_eq(p->runs[0]->run_id, k2);
    cr_assert_eq(p->runs[0]->attempts, 2);
}

Test(run_options, key_concurrency_two_and_unlimited_keys) {
    const char *ids[4];
    for (int i = 0; i < 4; i++) {
        ids[i] = make_run_with("wf", "k", limited(2));
    }
    const char *free_runs[3];
    for (int i = 0; i < 3; i++) {
        free_runs[i] = make_run_with("wf", "u", one());
    }
    Keyflow__V1__PollRunsResponse *p = poll_all("wf");
    cr_assert_eq(p->n_runs, 5);
    cr_assert(has_run(p, ids[0]) && has_run(p, ids[1]) && !has_run(p, ids[2]));
    for (int i = 0; i < 3; i++) {
        cr_assert(has_run(p, free_runs[i]), "a key without a limit leases all its runs");
    }
    /* Releasing one frees a slot for the key's oldest waiting run... which
     * is the released one (it is older than ids[2]). */
    const char *lease0 = NULL;
    for (size_t i = 0; i < p->n_runs; i++) {
        if (strcmp(p->runs[i]->run_id, ids[0]) == 0) {
            lease0 = p->runs[i]->lease;
        }
    }
    cr_assert_eq(release(ids[0], lease0)->error.status, KF_OK);
    p = poll_all("wf");
    cr_assert_eq(p->n_runs, 1);
    cr_assert_str_eq(p->runs[0]->run_id, ids[0]);
}

Test(run_options, run_options_are_validated) {
    Keyflow__V1__Rule *r = limited(KF_KEY_CONCURRENCY_MAX + 1);
    kf_cmd_t *c = sim_send(&sim, "wf", "k", NULL, r, "1");
    cr_assert_eq(c->error.status, KF_E_INVALID);
    cr_assert_str_eq(c->error.message,
                     "event.rule.key_concurrency: must be in 0..10000, got 10001");
    r = one();
    r->start_after_ms = -1;
    c = sim_send(&sim, "wf", "k", NULL, r, "1");
    cr_assert_str_eq(c->error.message,
                     "event.rule.start_after_ms: must be in 0..604800000, got -1");
    c = sim_send(&sim, "wf", "k", NULL, retrying(101, -1, 0, 0), "1");
    cr_assert_str_eq(c->error.message, "event.rule.retry.max_attempts: must be in 0..100, got 101");
    c = sim_send(&sim, "wf", "k", NULL, retrying(3, 5000, 1000, 0), "1");
    cr_assert_str_eq(c->error.message,
                     "event.rule.retry.max_backoff_ms: must be in 5000..604800000, got 1000");
    c = sim_send(&sim, "wf", "k", NULL, retrying(3, -1, 0, 0.5), "1");
    cr_assert_str_eq(c->error.message, "event.rule.retry.multiplier: must be in 1..100, got 0.5");
    cr_assert_eq(sim_describe(&sim, 'b', "wf", "k")->error.status, KF_OK);
    cr_assert_not(DESCRIBE_RESP(sim_describe(&sim, 'b', "wf", "k"))->exists,
                  "refused events change nothing");
}

/* ---- retries -------------------------------------------------------------- */

Test(run_options, retryable_errors_back_off_then_fail_when_attempts_run_out) {
    const char *id = make_run_with("wf", "k", retrying(3, 100, 150, 2.0));
    int64_t t0 = sim.now_ms;
    Keyflow__V1__Run *r = poll_all("wf")->runs[0];
    cr_assert_eq(r->max_attempts, 3);
    kf_cmd_t *c = complete_error(id, r->lease, "timeout talking to S3", true);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    Keyflow__V1__Run *after = ((Keyflow__V1__CompleteRunResponse *)c->response)->run;
    cr_assert_eq(after->status, ST(DELAYED));
    cr_assert_eq(after->due_ms, t0 + 100, "the first backoff is the initial one");
    cr_assert_str_eq(after->last_error, "timeout talking to S3");
    cr_assert_str_eq(after->error, "", "not failed");
    /* A retry of that completion is recognised. */
    kf_cmd_t *again = complete_error(id, r->lease, "timeout talking to S3", true);
    cr_assert_eq(again->error.status, KF_OK, "%s", again->error.message);
    cr_assert(((Keyflow__V1__CompleteRunResponse *)again->response)->already_finished);
    cr_assert_eq(poll_all("wf")->n_runs, 0, "not before its backoff");

    sim_crash(&sim); /* DELAYED survives */
    cr_assert_eq(get(id)->status, ST(DELAYED));
    sim_advance(&sim, t0 + 100);
    cr_assert_eq(get(id)->status, ST(PENDING));
    r = poll_all("wf")->runs[0];
    cr_assert_eq(r->attempts, 2);
    int64_t t1 = sim.now_ms;
    c = complete_error(id, r->lease, "again", true);
    cr_assert_eq(((Keyflow__V1__CompleteRunResponse *)c->response)->run->due_ms, t1 + 150,
                 "100 * 2 capped at 150");
    sim_advance(&sim, t1 + 150);
    r = poll_all("wf")->runs[0];
    cr_assert_eq(r->attempts, 3);
    c = complete_error(id, r->lease, "still failing", true);
    Keyflow__V1__Run *failed = ((Keyflow__V1__CompleteRunResponse *)c->response)->run;
    cr_assert_eq(failed->status, ST(FAILED), "the last attempt's failure is final");
    cr_assert_str_eq(failed->error, "still failing");
    cr_assert_eq(failed->attempts, 3);
}

Test(run_options, a_non_retryable_error_fails_at_once_and_expiry_backs_off_too) {
    const char *a = make_run_with("wf", "a", retrying(3, 1000, 0, 0));
    const char *b = make_run_with("wf", "b", retrying(3, 1000, 0, 0));
    Keyflow__V1__PollRunsResponse *p = poll_all("wf");
    cr_assert_eq(complete_error(a, p->runs[0]->lease, "bad input", false)->error.status, KF_OK);
    cr_assert_eq(get(a)->status, ST(FAILED));
    int64_t expiry = p->runs[1]->lease_expires_ms;
    sim_advance(&sim, expiry);
    Keyflow__V1__Run *r = get(b);
    cr_assert_eq(r->status, ST(DELAYED), "an expired lease counts as a failed attempt");
    cr_assert_eq(r->due_ms, expiry + 1000);
    cr_assert_str_eq(r->last_error, "lease expired on attempt 1 of 3");
}

Test(run_options, without_a_policy_a_retryable_error_retries_at_once_up_to_run_attempts) {
    const char *id = make_run_with("wf", "k", one());
    Keyflow__V1__Run *r = poll_all("wf")->runs[0];
    cr_assert_eq(r->max_attempts, 2, "--run-attempts");
    cr_assert_eq(complete_error(id, r->lease, "flaky", true)->error.status, KF_OK);
    cr_assert_eq(get(id)->status, ST(PENDING));
    r = poll_all("wf")->runs[0];
    cr_assert_eq(complete_error(id, r->lease, "flaky again", true)->error.status, KF_OK);
    cr_assert_eq(get(id)->status, ST(FAILED));
    kf_cmd_t *c = sim_complete(&sim, id, r->lease, "1", NULL);
    cr_assert_eq(c->error.status, KF_E_PRECONDITION);
    Keyflow__V1__CompleteRunRequest bad = KEYFLOW__V1__COMPLETE_RUN_REQUEST__INIT;
    bad.run_id = (char *)id;
    bad.lease = r->lease;
    bad.outcome_case = KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_RESULT_JSON;
    bad.result_json = "1";
    bad.retryable = true;
    c = sim_exec(&sim, KF_OP_COMPLETE_RUN, &bad.base);
    cr_assert_eq(c->error.status, KF_E_INVALID);
    cr_assert_str_eq(c->error.message, "retryable: applies to an error, not to a result");
}

Test(run_options, backoff_formula) {
    kf_retry_policy_t p = {
        .max_attempts = 5, .initial_backoff_ms = 1000, .max_backoff_ms = 60000, .multiplier = 2.0};
    cr_assert_eq(kf_retry_backoff_ms(&p, 1), 1000);
    cr_assert_eq(kf_retry_backoff_ms(&p, 2), 2000);
    cr_assert_eq(kf_retry_backoff_ms(&p, 6), 32000);
    cr_assert_eq(kf_retry_backoff_ms(&p, 7), 60000, "capped");
    cr_assert_eq(kf_retry_backoff_ms(&p, 100), 60000, "no overflow");
    p.multiplier = 1.5;
    cr_assert_eq(kf_retry_backoff_ms(&p, 3), 2250);
    kf_retry_policy_t none = KF_RETRY_POLICY_NONE;
    cr_assert_eq(kf_retry_backoff_ms(&none, 3), 0);
    cr_assert_eq(kf_retry_attempts_max(&none, 7), 7);
    cr_assert_eq(kf_retry_attempts_max(&p, 7), 5);
}

/* ---- delayed start ---------------------------------------------------------- */

Test(run_options, start_after_delays_the_run_across_a_crash) {
    Keyflow__V1__Rule *rule = one();
    rule->start_after_ms = 500;
    int64_t t0 = sim.now_ms;
    const char *id = make_run_with("wf", "k", rule);
    Keyflow__V1__Run *r = get(id);
    cr_assert_eq(r->status, ST(DELAYED));
    cr_assert_eq(r->due_ms, t0 + 500);
    cr_assert_eq(poll_all("wf")->n_runs, 0);
    sim_crash(&sim);
    sim_advance(&sim, t0 + 499);
    cr_assert_eq(get(id)->status, ST(DELAYED));
    sim_advance(&sim, t0 + 500);
    cr_assert_eq(get(id)->status, ST(PENDING));
    cr_assert_eq(get(id)->due_ms, 0);
    cr_assert_str_eq(poll_all("wf")->runs[0]->run_id, id);
}

/* ---- cancel ----------------------------------------------------------------- */

Test(run_options, cancel_pending_and_delayed_runs_at_once) {
    const char *a = make_run_with("wf", "a", one());
    Keyflow__V1__Rule *later = one();
    later->start_after_ms = 1000;
    const char *b = make_run_with("wf", "b", later);
    kf_cmd_t *c = cancel(a);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    cr_assert_eq(CANCEL_RUN(c)->status, ST(CANCELLED));
    cr_assert_eq(CANCEL_RUN(cancel(b))->status, ST(CANCELLED));
    cr_assert_eq(CANCEL_RUN(cancel(a))->status, ST(CANCELLED), "a retry answers the same");
    cr_assert_eq(poll_all("wf")->n_runs, 0);
    sim_crash(&sim);
    cr_assert_eq(get(a)->status, ST(CANCELLED));
    cr_assert_eq(CANCEL_RUN(cancel(b))->status, ST(CANCELLED), "and from the stored record");
    sim_advance(&sim, sim.now_ms + 2000);
    cr_assert_eq(get(b)->status, ST(CANCELLED), "its start delay is gone");
}

Test(run_options, cancel_a_leased_run_asks_its_worker) {
    const char *id = make_run_with("wf", "k", limited(1));
    const char *next = make_run_with("wf", "k", limited(1));
    Keyflow__V1__Run *r = poll_all("wf")->runs[0];
    kf_cmd_t *c = cancel(id);
    cr_assert_eq(c->error.status, KF_OK);
    cr_assert_eq(CANCEL_RUN(c)->status, ST(LEASED));
    cr_assert(CANCEL_RUN(c)->cancel_requested);
    sim_crash(&sim);
    kf_cmd_t *hb = heartbeat(id, r->lease);
    cr_assert_eq(hb->error.status, KF_OK, "%s", hb->error.message);
    cr_assert(((Keyflow__V1__HeartbeatRunResponse *)hb->response)->cancel_requested,
              "the request survives a crash");
    c = sim_complete(&sim, id, r->lease, "{\"partial\":true}", NULL);
    cr_assert_eq(c->error.status, KF_OK);
    Keyflow__V1__Run *done = ((Keyflow__V1__CompleteRunResponse *)c->response)->run;
    cr_assert_eq(done->status, ST(CANCELLED));
    cr_assert_str_eq(done->result_json, "{\"partial\":true}", "the worker's report is kept");
    c = sim_complete(&sim, id, r->lease, NULL, "other");
    cr_assert_eq(c->error.status, KF_OK, "a retry of the completion");
    cr_assert(((Keyflow__V1__CompleteRunResponse *)c->response)->already_finished);
    cr_assert_str_eq(poll_all("wf")->runs[0]->run_id, next, "the key's slot is free");
    c = cancel(id);
    cr_assert_eq(CANCEL_RUN(c)->status, ST(CANCELLED));
}

Test(run_options, a_cancelled_lease_that_expires_or_is_released_ends_cancelled) {
    const char *a = make_run_with("wf", "a", one());
    const char *b = make_run_with("wf", "b", one());
    Keyflow__V1__PollRunsResponse *p = poll_all("wf");
    cr_assert_eq(cancel(a)->error.status, KF_OK);
    cr_assert_eq(cancel(b)->error.status, KF_OK);
    kf_cmd_t *rel = release(b, p->runs[1]->lease);
    cr_assert_eq(rel->error.status, KF_OK, "%s", rel->error.message);
    cr_assert_eq(((Keyflow__V1__ReleaseRunResponse *)rel->response)->run->status, ST(CANCELLED));
    sim_advance(&sim, p->runs[0]->lease_expires_ms);
    Keyflow__V1__Run *r = get(a);
    cr_assert_eq(r->status, ST(CANCELLED));
    cr_assert_str_eq(r->error, "lease expired on attempt 1 of 2");
    cr_assert_eq(sim_complete(&sim, a, p->runs[0]->lease, "1", NULL)->error.status,
                 KF_E_PRECONDITION, "the expired lease completes nothing");
}

Test(run_options, cancel_refuses_finished_runs_and_open_windows) {
    const char *id = make_run_with("wf", "k", one());
    Keyflow__V1__Run *r = poll_all("wf")->runs[0];
    cr_assert_eq(sim_complete(&sim, id, r->lease, "1", NULL)->error.status, KF_OK);
    kf_cmd_t *c = cancel(id);
    cr_assert_eq(c->error.status, KF_E_PRECONDITION);
    cr_assert(strstr(c->error.message, "already finished COMPLETED") != NULL, "%s",
              c->error.message);
    kf_cmd_t *open = sim_send(&sim, "wf", "w", NULL, sim_batch(&sim, 5, 1000), "1");
    c = cancel(SEND_RESP(open)->receipt->run_id);
    cr_assert_eq(c->error.status, KF_E_PRECONDITION);
    cr_assert(strstr(c->error.message, "CancelWindow") != NULL, "%s", c->error.message);
    cr_assert_eq(cancel("nope@018bcfe5-6800-7dbb-9935-e30dccf95282")->error.status, KF_E_NOT_FOUND);
}

/* ---- release ---------------------------------------------------------------- */

Test(run_options, release_gives_a_run_back_without_counting_the_attempt) {
    const char *id = make_run_with("wf", "k", one());
    Keyflow__V1__Run *r = poll_all("wf")->runs[0];
    kf_cmd_t *c = release(id, r->lease);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    Keyflow__V1__Run *back = ((Keyflow__V1__ReleaseRunResponse *)c->response)->run;
    cr_assert_eq(back->status, ST(PENDING));
    cr_assert_eq(back->attempts, 0);
    cr_assert_eq(release(id, r->lease)->error.status, KF_E_PRECONDITION, "the lease is gone");
    cr_assert_eq(heartbeat(id, r->lease)->error.status, KF_E_PRECONDITION);
    /* Released runs never use up attempts (2 here). */
    for (int i = 0; i < 3; i++) {
        r = poll_all("wf")->runs[0];
        cr_assert_eq(r->attempts, 1);
        cr_assert_eq(release(id, r->lease)->error.status, KF_OK);
    }
    sim_crash(&sim);
    r = poll_all("wf")->runs[0];
    cr_assert_eq(r->attempts, 1);
}

/* ---- GetRun: windows and waits -------------------------------------------- */

Test(run_options, get_of_a_receipts_run_is_window_open_until_it_closes) {
    int64_t t0 = sim.now_ms;
    kf_cmd_t *s = sim_send(&sim, "wf", "k", NULL, sim_debounce(&sim, 1000, 0), "1");
    const char *id = SEND_RESP(s)->receipt->run_id;
    Keyflow__V1__Run *r = get(id);
    cr_assert_eq(r->status, ST(WINDOW_OPEN));
    cr_assert_eq(r->due_ms, t0 + 1000);
    cr_assert_str_eq(r->workflow, "wf");
    cr_assert_str_eq(r->key, "k");
    cr_assert_eq(r->event_count, 1);
    sim_crash(&sim);
    cr_assert_eq(get(id)->status, ST(WINDOW_OPEN), "rebuilt by recovery");
    char other[128];
    snprintf(other, sizeof other, "j@%s", strchr(id, '@') + 1);
    cr_assert_eq(sim_get(&sim, other)->error.status, KF_E_NOT_FOUND, "the key is part of the ID");
    sim_advance(&sim, t0 + 1000);
    cr_assert_eq(get(id)->status, ST(PENDING));
}

Test(run_options, get_waits_for_the_run_to_finish) {
    kf_cmd_t *s = sim_send(&sim, "wf", "k", NULL, sim_debounce(&sim, 1000, 0), "1");
    const char *id = SEND_RESP(s)->receipt->run_id;
    kf_cmd_t *w = get_wait(id, 30000);
    cr_assert_not_null(w->parked, "a window's run: the call waits");
    kf_cmd_t *short_wait = get_wait(id, 500);
    sim_advance(&sim, sim.now_ms + 500);
    cr_assert_null(short_wait->parked);
    cr_assert_eq(short_wait->error.status, KF_OK);
    cr_assert_eq(RUN_RESP(short_wait)->status, ST(WINDOW_OPEN), "the wait ends as it is");
    sim_advance(&sim, sim.now_ms + 500);
    cr_assert_not_null(w->parked, "still waiting: the run started, it did not finish");
    Keyflow__V1__Run *r = poll_all("wf")->runs[0];
    cr_assert_not_null(w->parked);
    cr_assert_eq(sim_complete(&sim, id, r->lease, "{\"ok\":1}", NULL)->error.status, KF_OK);
    cr_assert_null(w->parked);
    cr_assert_eq(w->error.status, KF_OK);
    cr_assert_eq(RUN_RESP(w)->status, ST(COMPLETED));
    cr_assert_str_eq(RUN_RESP(w)->result_json, "{\"ok\":1}");
    kf_cmd_t *done = get_wait(id, 30000);
    cr_assert_null(done->parked, "a finished run answers at once");
}

Test(run_options, a_wait_on_a_cancelled_window_is_not_found_and_waits_can_be_cancelled) {
    kf_cmd_t *s = sim_send(&sim, "wf", "k", NULL, sim_batch(&sim, 5, 10000), "1");
    const char *id = SEND_RESP(s)->receipt->run_id;
    kf_cmd_t *w1 = get_wait(id, 30000);
    kf_cmd_t *w2 = get_wait(id, 30000);
    cr_assert_not_null(w1->parked);
    kf_core_begin(sim.core, sim.batch, sim.group, sim.now_ms);
    kf_core_cancel(sim.core, w2, w2->id);
    sim_step(&sim);
    cr_assert_null(w2->parked);
    cr_assert_eq(w2->error.status, KF_E_CANCELLED);
    Keyflow__V1__CancelWindowRequest cw = KEYFLOW__V1__CANCEL_WINDOW_REQUEST__INIT;
    Keyflow__V1__CoordinatorRef ref = KEYFLOW__V1__COORDINATOR_REF__INIT;
    ref.kind = KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH;
    ref.workflow = "wf";
    ref.key = "k";
    cw.coordinator = &ref;
    cr_assert_eq(sim_exec(&sim, KF_OP_CANCEL_WINDOW, &cw.base)->error.status, KF_OK);
    cr_assert_null(w1->parked);
    cr_assert_eq(w1->error.status, KF_E_NOT_FOUND);
    cr_assert(strstr(w1->error.message, "cancelled") != NULL, "%s", w1->error.message);
    cr_assert_eq(get_wait(id, 1000)->error.status, KF_E_NOT_FOUND);
    kf_cmd_t *bad = get_wait(id, KF_POLL_WAIT_MS_MAX + 1);
    cr_assert_eq(bad->error.status, KF_E_INVALID);
    cr_assert_str_eq(bad->error.message, "wait_ms: must be in 0..60000, got 60001");
}

/* ---- ListRuns by key, and the event IDs a run holds ------------------------ */

static Keyflow__V1__ListRunsResponse *list(const char *workflow, const char *key, int64_t page_size,
                                           const char *token) {
    Keyflow__V1__ListRunsRequest *req = kf_arena_zalloc(&sim.arena, sizeof *req);
    keyflow__v1__list_runs_request__init(req);
    req->workflow = (char *)workflow;
    req->key = (char *)key;
    req->page_size = page_size;
    req->page_token = (char *)token;
    kf_cmd_t *c = sim_exec(&sim, KF_OP_LIST_RUNS, &req->base);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    return (Keyflow__V1__ListRunsResponse *)c->response;
}

Test(run_options, list_filters_by_key_with_tokens_of_that_key) {
    const char *mine[3];
    for (int i = 0; i < 3; i++) {
        mine[i] = make_run_with("wf", "k", one());
        make_run_with("wf", "k2", one()); /* "k" is a prefix of it: not k's */
        make_run_with("other", "k", one());
    }
    Keyflow__V1__ListRunsResponse *page = list("wf", "k", 2, "");
    cr_assert_eq(page->n_runs, 2);
    cr_assert_str_eq(page->runs[0]->run_id, mine[0]);
    cr_assert_str_eq(page->runs[1]->run_id, mine[1]);
    page = list("wf", "k", 2, page->next_page_token);
    cr_assert_eq(page->n_runs, 1);
    cr_assert_str_eq(page->runs[0]->run_id, mine[2]);
    cr_assert_str_eq(page->next_page_token, "");
    cr_assert_eq(list("", "k", 100, "")->n_runs, 6, "every workflow's runs of the key");
    Keyflow__V1__ListRunsResponse *first = list("wf", "k", 1, "");
    Keyflow__V1__ListRunsRequest req = KEYFLOW__V1__LIST_RUNS_REQUEST__INIT;
    req.workflow = "wf";
    req.key = "k2";
    req.page_token = first->next_page_token;
    kf_cmd_t *c = sim_exec(&sim, KF_OP_LIST_RUNS, &req.base);
    cr_assert_eq(c->error.status, KF_E_INVALID, "a token of another key");
}

Test(run_options, a_run_records_the_ids_of_its_events) {
    Keyflow__V1__Rule *rule = sim_batch(&sim, 3, 10000);
    cr_assert_eq(sim_send(&sim, "wf", "k", "e-1", rule, "1")->error.status, KF_OK);
    cr_assert_eq(sim_send(&sim, "wf", "k", NULL, rule, "2")->error.status, KF_OK);
    sim_crash(&sim); /* the window's IDs come back from the journal */
    kf_cmd_t *c = sim_send(&sim, "wf", "k", "e-3", rule, "3");
    const char *id = SEND_RESP(c)->receipt->run_id;
    Keyflow__V1__Run *r = get(id);
    cr_assert_eq(r->n_event_ids, 2, "events without an ID have none");
    cr_assert_str_eq(r->event_ids[0], "e-1");
    cr_assert_str_eq(r->event_ids[1], "e-3");
    cr_assert_eq(r->event_ids_dropped, 0);
}

Test(run_options, a_run_keeps_the_latest_ids_and_counts_the_rest, .timeout = 120) {
    Keyflow__V1__Rule *rule = sim_batch(&sim, 300, 100000);
    const char *id = NULL;
    for (int i = 0; i < 300; i++) {
        char eid[16];
        snprintf(eid, sizeof eid, "e-%d", i);
        kf_cmd_t *c = sim_send(&sim, "wf", "k", eid, rule, "1");
        cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
        id = SEND_RESP(c)->receipt->run_id;
        if (i == 280) {
            sim_crash(&sim); /* past a snapshot (256 journal entries) */
        }
    }
    Keyflow__V1__Run *r = get(id);
    cr_assert_eq(r->n_event_ids, KF_RUN_EVENT_IDS_MAX);
    cr_assert_eq(r->event_ids_dropped, 300 - KF_RUN_EVENT_IDS_MAX);
    cr_assert_str_eq(r->event_ids[0], "e-44");
    cr_assert_str_eq(r->event_ids[KF_RUN_EVENT_IDS_MAX - 1], "e-299");
}

/* ---- a store of the previous build ------------------------------------------ */

/* Records as the build before run options wrote them (records.proto of
 * 661b084: no key_concurrency, retry, due_ms, cancel_requested, last_error
 * or event_ids), encoded with that schema by protoc's Python runtime. */
static const char old_pending[] =
    "0a26614030313862636665352d363830302d373030302d383030302d303030303030303030303030120277661a01"
    "6120022a035b315d300138014880d095ffbc315080d095ffbc31";
static const char old_leased[] =
    "0a26624030313862636665352d363830302d373030302d383030302d303030303030303030303031120277661a01"
    "6220022a035b325d3001380240014880d095ffbc315080d095ffbc315a027731622430313862636665352d363830"
    "302d376161612d386161612d61616161616161616161616168b0ea0170b0ba97ffbc31900101";
static const char old_completed[] =
    "0a26634030313862636665352d363830302d373030302d383030302d303030303030303030303032120277661a01"
    "6320022a035b335d3001380340014880d095ffbc3150e8d795ffbc315a027731622430313862636665352d363830"
    "302d376262622d386262622d62626262626262626262626268b0ea0170b0ba97ffbc317a04226f6b228801e8d795"
    "ffbc31900102";
static const char old_snapshot[] =
    "080112520a2430313862636665352d363830302d373030302d383030302d3030303030303030303030331080d095"
    "ffbc311880d095ffbc3120e0a499ffbc312a0a080110e0d40328c0cf2432077b2278223a317d38011a390a03652d"
    "31122430313862636665352d363830302d373030302d383030302d30303030303030303030303318e0a499ffbc31"
    "20c09fbaffbc31";

static void put_hex(kf_cf_t cf, const kf_key_t *k, const char *hex) {
    uint8_t value[512];
    size_t n = strlen(hex) / 2;
    cr_assert(n <= sizeof value);
    for (size_t i = 0; i < n; i++) {
        unsigned byte;
        cr_assert_eq(sscanf(hex + 2 * i, "%2x", &byte), 1);
        value[i] = (uint8_t)byte;
    }
    sim_put_raw(&sim, cf, k->bytes, k->len, value, n);
}

static void put_run(const char *run_id, uint64_t seq, const char *hex, bool live) {
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_raw(&k, run_id, strlen(run_id));
    put_hex(KF_CF_RUNS, &k, hex);
    kf_key_run_index(&k, "wf", 2, seq);
    sim_put_raw(&sim, KF_CF_RUN_INDEX, k.bytes, k.len, run_id, strlen(run_id));
    if (live) {
        kf_key_run_queue(&k, seq);
        sim_put_raw(&sim, KF_CF_RUN_QUEUE, k.bytes, k.len, run_id, strlen(run_id));
    }
}

Test(run_options, a_store_of_the_previous_build_opens_and_its_runs_work) {
    const char *pending = "a@018bcfe5-6800-7000-8000-000000000000";
    const char *leased = "b@018bcfe5-6800-7000-8000-000000000001";
    const char *completed = "c@018bcfe5-6800-7000-8000-000000000002";
    const char *window = "w@018bcfe5-6800-7000-8000-000000000003";
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_raw(&k, "run_seq", 7);
    uint8_t seq_be[8] = {0, 0, 0, 0, 0, 0, 0, 3};
    sim_put_raw(&sim, KF_CF_META, k.bytes, k.len, seq_be, sizeof seq_be);
    put_run(pending, 0, old_pending, true);
    put_run(leased, 1, old_leased, true);
    put_run(completed, 2, old_completed, false);
    kf_key_wakeup(&k, 1700000030000, KF_WAKEUP_RUN, leased, strlen(leased));
    sim_put_raw(&sim, KF_CF_WAKEUPS, k.bytes, k.len, "", 0);
    kf_key_coord(&k, KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE, "wf", 2, "w", 1);
    put_hex(KF_CF_COORD_SNAPSHOTS, &k, old_snapshot);
    sim_crash(&sim); /* opens the store as a restart would */

    Keyflow__V1__Run *r = get(pending);
    cr_assert_eq(r->status, ST(PENDING));
    cr_assert_eq(r->max_attempts, 2, "no policy: --run-attempts");
    cr_assert_eq(r->n_event_ids, 0);
    r = get(leased);
    cr_assert_eq(r->status, ST(LEASED));
    cr_assert_not(r->cancel_requested);
    cr_assert_eq(get(completed)->status, ST(COMPLETED));
    cr_assert_str_eq(get(completed)->result_json, "\"ok\"");
    r = get(window);
    cr_assert_eq(r->status, ST(WINDOW_OPEN));
    cr_assert_eq(r->due_ms, 1700000060000);

    /* The old leased run completes with its lease; the old pending one is
     * leased, and both retry and cancel as new runs do. */
    kf_cmd_t *c = sim_complete(&sim, leased, "018bcfe5-6800-7aaa-8aaa-aaaaaaaaaaaa", "1", NULL);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    Keyflow__V1__Run *p = poll_all("wf")->runs[0];
    cr_assert_str_eq(p->run_id, pending);
    cr_assert_eq(complete_error(pending, p->lease, "later", true)->error.status, KF_OK);
    cr_assert_eq(get(pending)->status, ST(PENDING), "no backoff without a policy");
    cr_assert_eq(CANCEL_RUN(cancel(pending))->status, ST(CANCELLED));
    /* The old window closes into a run of the old rule, without event IDs
     * (the old snapshot recorded none). */
    sim_advance(&sim, 1700000060000);
    r = get(window);
    cr_assert_eq(r->status, ST(PENDING));
    cr_assert_str_eq(r->input_json, "{\"x\":1}");
    cr_assert_eq(r->n_event_ids, 0);
    cr_assert_eq(r->max_attempts, 2);
}
