/*
 * test_run_store.c - deterministic tests of how runs are stored
 * (runs/records.c): a state change writes the run's small state, never its
 * body again; memory keeps a pending run's compact state only, and
 * whatever a group wrote until that group is durable; a store written by
 * the build before the split opens, its runs move to the new records once
 * and keep working across later restarts.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "base/metrics.h"
#include "records/records.pb-c.h"
#include "sim.h"
#include "storage/keys.h"

static sim_t sim;
static void setup(void) {
    sim_open(&sim, 23);
    sim.config.run_attempts_max = 2;
    sim.config.run_retention_ms = 60000;
}
static void teardown(void) {
    sim_close(&sim);
}

TestSuite(run_store, .init = setup, .fini = teardown, .timeout = 60);

#define ST(x) KEYFLOW__V1__RUN_STATUS__RUN_STATUS_##x

static Keyflow__V1__Run *get(const char *run_id) {
    kf_cmd_t *c = sim_get(&sim, run_id);
    cr_assert_eq(c->error.status, KF_OK, "%s: %s", run_id, c->error.message);
    return RUN_RESP(c);
}

static void ok(const kf_cmd_t *c, const char *what) {
    cr_assert_eq(c->error.status, KF_OK, "%s: %s", what, c->error.message);
}

/* The stored body of `run_id`, as bytes. */
static kf_value_t body_bytes(const char *run_id) {
    kf_value_t v;
    cr_assert(sim_get_raw(&sim, KF_CF_RUNS, run_id, strlen(run_id), &v), "no body for %s", run_id);
    return v;
}

static void assert_same_body(const kf_value_t *before, const char *run_id, const char *after) {
    kf_value_t now = body_bytes(run_id);
    cr_assert(now.len == before->len && memcmp(now.data, before->data, now.len) == 0,
              "the body of %s was rewritten by %s", run_id, after);
    kf_store_value_free(&now);
}

/* A lease, heartbeat, retry, release or cancel request writes the run's
 * state (its live record and wake-up), not its input: each of those groups
 * stays far below the input's size, and the stored body keeps its bytes. */
Test(run_store, state_changes_never_rewrite_the_body) {
    static char input[64 * 1024 + 3];
    input[0] = '"';
    memset(input + 1, 'x', sizeof input - 3);
    input[sizeof input - 2] = '"';
    Keyflow__V1__Rule *rule = sim_batch(&sim, 1, 1000);
    Keyflow__V1__RetryPolicy *retry = kf_arena_zalloc(&sim.arena, sizeof *retry);
    keyflow__v1__retry_policy__init(retry);
    retry->max_attempts = 5;
    retry->initial_backoff_ms_present_case =
        KEYFLOW__V1__RETRY_POLICY__INITIAL_BACKOFF_MS_PRESENT_INITIAL_BACKOFF_MS;
    rule->retry = retry; /* initial_backoff_ms 0: a retry is PENDING at once */
    kf_cmd_t *sent = sim_send(&sim, "wf", "k", NULL, rule, input);
    ok(sent, "SendEvent");
    const char *id = SEND_RESP(sent)->receipt->run_id;
    cr_assert_gt(sim.step_bytes, sizeof input, "the start writes the body once");
    kf_value_t body = body_bytes(id);
    Keyflow__Records__RunRec *rec = keyflow__records__run_rec__unpack(NULL, body.len, body.data);
    cr_assert_not_null(rec);
    cr_assert_eq(rec->layout, 1, "a body of the split layout");
    cr_assert_eq(rec->status, 0, "no state in the body");
    keyflow__records__run_rec__free_unpacked(rec, NULL);
    const size_t small = 1024;

    kf_cmd_t *p = sim_poll(&sim, "wf", 10000, 1, 0);
    ok(p, "PollRuns");
    const char *lease = POLL_RESP(p)->runs[0]->lease;
    cr_assert_lt(sim.step_bytes, small, "a lease wrote %zu bytes", sim.step_bytes);
    assert_same_body(&body, id, "a lease");
    ok(sim_heartbeat(&sim, id, lease), "HeartbeatRun");
    cr_assert_lt(sim.step_bytes, small, "a heartbeat wrote %zu bytes", sim.step_bytes);
    sim_advance(&sim, sim.now_ms + 10000); /* the lease expires: a retry, PENDING */
    cr_assert_lt(sim.step_bytes, small, "a retry wrote %zu bytes", sim.step_bytes);
    cr_assert_eq(get(id)->status, ST(PENDING));
    cr_assert(strstr(get(id)->last_error, "lease expired") != NULL);
    p = sim_poll(&sim, "wf", 10000, 1, 0);
    lease = POLL_RESP(p)->runs[0]->lease;
    ok(sim_complete(&sim, id, lease, NULL, "no"), "CompleteRun");
    cr_assert_eq(get(id)->status, ST(FAILED));
    cr_assert_lt(sim.step_bytes, small, "a finish wrote %zu bytes", sim.step_bytes);
    assert_same_body(&body, id, "a finish");
    kf_store_value_free(&body);

    sent = sim_send(&sim, "wf", "k2", NULL, rule, input);
    ok(sent, "SendEvent");
    id = SEND_RESP(sent)->receipt->run_id;
    body = body_bytes(id);
    p = sim_poll(&sim, "wf", 10000, 1, 0);
    lease = POLL_RESP(p)->runs[0]->lease;
    ok(sim_release(&sim, id, lease), "ReleaseRun");
    cr_assert_lt(sim.step_bytes, small, "a release wrote %zu bytes", sim.step_bytes);
    p = sim_poll(&sim, "wf", 10000, 1, 0);
    lease = POLL_RESP(p)->runs[0]->lease;
    ok(sim_cancel_run(&sim, id), "CancelRun");
    cr_assert(get(id)->cancel_requested);
    cr_assert_lt(sim.step_bytes, small, "a cancel request wrote %zu bytes", sim.step_bytes);
    sim_advance(&sim, sim.now_ms + 10000); /* the lease expires: CANCELLED */
    cr_assert_eq(get(id)->status, ST(CANCELLED));
    assert_same_body(&body, id, "a release, a cancel request and an expiry");
    kf_store_value_free(&body);
    cr_assert_eq(sim_count_raw(&sim, KF_CF_RUN_LIVE), 0, "finished runs have no live record");
    cr_assert_eq(sim_count_raw(&sim, KF_CF_RUN_STATE), 2, "each finished run has its state");
    cr_assert_eq(sim_count_raw(&sim, KF_CF_RUN_QUEUE), 0, "nothing goes to the older family");

    /* Retention deletes every record of both. */
    sim_advance(&sim, sim.now_ms + 61000);
    sim_advance(&sim, sim.now_ms + 2000);
    cr_assert_eq(sim_count_raw(&sim, KF_CF_RUNS), 0);
    cr_assert_eq(sim_count_raw(&sim, KF_CF_RUN_STATE), 0);
    cr_assert_eq(sim_count_raw(&sim, KF_CF_RUN_INDEX), 0);
}

/* ---- what memory keeps ---------------------------------------------------------- */

static const char *send_input(const char *key, const char *input) {
    kf_cmd_t *c = sim_send(&sim, "wf", key, NULL, sim_batch(&sim, 1, 1000), input);
    ok(c, "SendEvent");
    return SEND_RESP(c)->receipt->run_id;
}

static char *big_input(size_t bytes) {
    char *s = kf_arena_alloc(&sim.arena, bytes + 1);
    s[0] = '"';
    memset(s + 1, 'i', bytes - 2);
    s[bytes - 1] = '"';
    s[bytes] = '\0';
    return s;
}

/* Once its start is durable a pending run holds no body and no texts in
 * memory: keyflow_runs_memory_bytes grows by a small, fixed amount per run
 * whatever its input, and leasing and releasing runs leaves it as it was.
 * Until the start is durable the body is held (the store does not have it
 * yet). */
Test(run_store, memory_keeps_no_body_of_a_pending_run) {
    const int runs = 200;
    const char *input = big_input(4096);
    char *as_run = kf_arena_alloc(&sim.arena, strlen(input) + 3); /* a batch of one */
    sprintf(as_run, "[%s]", input);
    int64_t empty = kf_gauge_get(KF_G_RUNS_MEMORY_BYTES);
    char key[16];
    sim.hold_group = true; /* the first ten in one group, not durable yet */
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof key, "k%03d", i);
        send_input(key, input);
    }
    int64_t held = kf_gauge_get(KF_G_RUNS_MEMORY_BYTES) - empty;
    cr_assert_gt(held, 10 * 4096, "bodies are held until durable (%lld bytes)", (long long)held);
    sim.hold_group = false;
    sim_step(&sim);
    for (int i = 10; i < runs; i++) {
        snprintf(key, sizeof key, "k%03d", i);
        send_input(key, input);
    }
    int64_t per_run = (kf_gauge_get(KF_G_RUNS_MEMORY_BYTES) - empty) / runs;
    cr_assert_lt(per_run, 200, "a pending run holds %lld bytes", (long long)per_run);
    int64_t settled = kf_gauge_get(KF_G_RUNS_MEMORY_BYTES);

    kf_cmd_t *p = sim_poll(&sim, "wf", 10000, 20, 0);
    ok(p, "PollRuns");
    cr_assert_eq(POLL_RESP(p)->n_runs, 20);
    cr_assert_str_eq(POLL_RESP(p)->runs[0]->input_json, as_run, "a lease reads the body back");
    for (size_t i = 0; i < POLL_RESP(p)->n_runs; i++) {
        ok(sim_release(&sim, POLL_RESP(p)->runs[i]->run_id, POLL_RESP(p)->runs[i]->lease),
           "ReleaseRun");
    }
    sim_step(&sim); /* the group after the last release */
    cr_assert_eq(kf_gauge_get(KF_G_RUNS_MEMORY_BYTES), settled,
                 "released runs keep no detail once the release is durable");
    Keyflow__V1__Run *r = get(POLL_RESP(p)->runs[3]->run_id);
    cr_assert_eq(r->status, ST(PENDING));
    cr_assert_str_eq(r->worker_id, "worker-1", "its texts are read from its live record");
    cr_assert_str_eq(r->input_json, as_run);
}

/* Commands of one group see each other's effects: the store has none of
 * them until the group is written, so they are served from memory. */
Test(run_store, a_group_sees_its_own_writes_before_they_are_durable) {
    sim.hold_group = true;
    const char *id = send_input("k", "{\"n\":1}");
    Keyflow__V1__Run *r = get(id);
    cr_assert_eq(r->status, ST(PENDING));
    cr_assert_str_eq(r->input_json, "[{\"n\":1}]");
    kf_cmd_t *p = sim_poll(&sim, "wf", 10000, 1, 0);
    ok(p, "PollRuns");
    cr_assert_eq(POLL_RESP(p)->n_runs, 1);
    cr_assert_str_eq(POLL_RESP(p)->runs[0]->input_json, "[{\"n\":1}]");
    ok(sim_release(&sim, id, POLL_RESP(p)->runs[0]->lease), "ReleaseRun");
    r = get(id);
    cr_assert_eq(r->status, ST(PENDING));
    cr_assert_str_eq(r->worker_id, "worker-1");
    ok(sim_cancel_run(&sim, id), "CancelRun");
    cr_assert_eq(get(id)->status, ST(CANCELLED));
    cr_assert_eq(sim_count_raw(&sim, KF_CF_RUNS), 0, "nothing is in the store yet");
    sim.hold_group = false;
    sim_step(&sim);
    sim_crash(&sim);
    r = get(id);
    cr_assert_eq(r->status, ST(CANCELLED));
    cr_assert_str_eq(r->input_json, "[{\"n\":1}]");
    cr_assert_str_eq(r->worker_id, "worker-1");
}

/* A lease reads the run's body before it changes anything: a body that
 * cannot be read fails the poll and leaves the run PENDING. */
Test(run_store, a_body_that_cannot_be_read_leases_nothing) {
    const char *id = send_input("k", "1");
    sim_put_raw(&sim, KF_CF_RUNS, id, strlen(id), "\xff\xff", 2);
    kf_cmd_t *p = sim_poll(&sim, "wf", 10000, 1, 0);
    cr_assert_eq(p->error.status, KF_E_CORRUPT, "%s", p->error.message);
    cr_assert(strstr(p->error.message, id) != NULL, "%s", p->error.message);
    cr_assert_eq(kf_gauge_get(KF_G_RUNS_PENDING), 1);
    cr_assert_eq(kf_gauge_get(KF_G_RUNS_LEASED), 0);
}

/* ---- a store of the build before the split ---------------------------------
 *
 * Written by keyflowd at 48f5350 (the last build with whole run records):
 * five runs of workflow "wf" - p PENDING (a retry policy of 5 attempts, two
 * event IDs, leased once and released), r PENDING after a retryable error
 * "boom" (policy of 4), l LEASED by "w-l" for an hour with cancel requested
 * (key_concurrency 2), d DELAYED an hour (start_after_ms), c COMPLETED with
 * "ok" - then the records dumped as they were on disk. */
static const char prev_c[] =
    "0a26634030316132333237332d613237642d373131302d626630352d646334313435656165313136120277661a01"
    "6320022a055b2263225d30013803400148fdc4ce93a3345080c5ce93a3345a03772d63622430316132333237332d"
    "613237662d376665322d383063392d64323933333863633235363668e0d40370df99d293a3347a04226f6b228801"
    "80c5ce93a334900104";
static const char prev_d[] =
    "0a26644030316132333237332d613237632d376439622d396537362d623161616338636631346534120277661a01"
    "6420022a055b2264225d3001380648fcc4ce93a33450fcc4ce93a334900103b001fca1aa95a334";
static const char prev_l[] =
    "0a266c4030316132333237332d613234632d373537312d386566632d383964613730383665636538120277661a01"
    "6c20022a055b226c225d30013802400148ccc4ce93a33450f8c4ce93a3345a03772d6c622430316132333237332d"
    "613236382d376365362d626637662d3436636332393162346262396880dddb0170e8a1aa95a334900102a00102b8"
    "0101";
static const char prev_p[] =
    "0a26704030316132333237332d613232622d373234342d393539352d666237363738376665663162120277661a01"
    "7020022a115b7b2261223a317d2c7b2261223a327d5d3002380148acc4ce93a33450ffc4ce93a3345a03772d6368"
    "e0d403aa010f080518e0d403210000000000000040ca01026531ca01026532";
static const char prev_r[] =
    "0a26724030316132333237332d613233322d373537342d396534642d323733346631393465646262120277661a01"
    "7220022a055b2272225d30013801400148b2c4ce93a3345080c5ce93a3345a03772d6368e0d403900101aa010f08"
    "0418e0d403210000000000000040c20104626f6f6d";

#define PREV_P     "p@01a23273-a22b-7244-9595-fb76787fef1b"
#define PREV_R     "r@01a23273-a232-7574-9e4d-2734f194edbb"
#define PREV_L     "l@01a23273-a24c-7571-8efc-89da7086ece8"
#define PREV_D     "d@01a23273-a27c-7d9b-9e76-b1aac8cf14e4"
#define PREV_C     "c@01a23273-a27d-7110-bf05-dc4145eae116"
#define PREV_LEASE "01a23273-a268-7ce6-bf7f-46cc291b4bb9" /* l's */
#define PREV_NOW   INT64_C(1796142769000)

static void put_prev_run(const char *run_id, uint64_t seq, const char *hex, bool live) {
    uint8_t value[512];
    size_t n = strlen(hex) / 2;
    cr_assert(n <= sizeof value);
    for (size_t i = 0; i < n; i++) {
        unsigned byte;
        cr_assert_eq(sscanf(hex + 2 * i, "%2x", &byte), 1);
        value[i] = (uint8_t)byte;
    }
    sim_put_raw(&sim, KF_CF_RUNS, run_id, strlen(run_id), value, n);
    kf_key_t k;
    kf_key_run_index(&k, "wf", 2, seq);
    sim_put_raw(&sim, KF_CF_RUN_INDEX, k.bytes, k.len, run_id, strlen(run_id));
    if (live) {
        kf_key_run_queue(&k, seq);
        sim_put_raw(&sim, KF_CF_RUN_QUEUE, k.bytes, k.len, run_id, strlen(run_id));
    }
}

static void put_prev_wakeup(int64_t due_ms, const char *run_id) {
    kf_key_t k;
    kf_key_wakeup(&k, due_ms, KF_WAKEUP_RUN, run_id, strlen(run_id));
    sim_put_raw(&sim, KF_CF_WAKEUPS, k.bytes, k.len, "", 0);
}

static void open_prev_store(void) {
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_raw(&k, "run_seq", 7);
    uint8_t seq_be[8] = {0, 0, 0, 0, 0, 0, 0, 5};
    sim_put_raw(&sim, KF_CF_META, k.bytes, k.len, seq_be, sizeof seq_be);
    put_prev_run(PREV_P, 0, prev_p, true);
    put_prev_run(PREV_R, 1, prev_r, true);
    put_prev_run(PREV_L, 2, prev_l, true);
    put_prev_run(PREV_D, 3, prev_d, true);
    put_prev_run(PREV_C, 4, prev_c, false);
    put_prev_wakeup(1796146368744, PREV_L); /* its lease's expiry */
    put_prev_wakeup(1796146368764, PREV_D); /* its delay's end */
    put_prev_wakeup(1796747568768, PREV_C); /* its retention's end */
    sim.now_ms = PREV_NOW;
    sim_crash(&sim); /* opens the store as a restart would */
}

static void check_prev_runs(void) {
    Keyflow__V1__Run *r = get(PREV_P);
    cr_assert_eq(r->status, ST(PENDING));
    cr_assert_str_eq(r->input_json, "[{\"a\":1},{\"a\":2}]");
    cr_assert_eq(r->max_attempts, 5);
    cr_assert_eq(r->n_event_ids, 2);
    cr_assert_str_eq(r->event_ids[1], "e2");
    cr_assert_str_eq(r->worker_id, "w-c", "the latest lease's worker");
    r = get(PREV_R);
    cr_assert_eq(r->status, ST(PENDING));
    cr_assert_eq(r->attempts, 1);
    cr_assert_str_eq(r->last_error, "boom");
    cr_assert_eq(r->max_attempts, 4);
    r = get(PREV_L);
    cr_assert_eq(r->status, ST(LEASED));
    cr_assert(r->cancel_requested);
    cr_assert_eq(r->lease_expires_ms, 1796146368744);
    cr_assert_str_eq(r->worker_id, "w-l");
    r = get(PREV_D);
    cr_assert_eq(r->status, ST(DELAYED));
    cr_assert_eq(r->due_ms, 1796146368764);
    r = get(PREV_C);
    cr_assert_eq(r->status, ST(COMPLETED));
    cr_assert_str_eq(r->result_json, "\"ok\"");
    cr_assert_str_eq(r->input_json, "[\"c\"]");
}

Test(run_store, a_store_of_the_build_before_the_split_opens_and_moves_its_live_runs) {
    open_prev_store();
    check_prev_runs();
    cr_assert_eq(sim_count_raw(&sim, KF_CF_RUN_QUEUE), 0, "the older live list is gone");
    cr_assert_eq(sim_count_raw(&sim, KF_CF_RUN_LIVE), 4, "one live record per live run");
    sim_crash(&sim); /* the moved runs recover from their new records */
    check_prev_runs();

    /* They work as runs of this build do: the cancelled lease completes
     * CANCELLED, the delay ends, the completed run is deleted on time. */
    kf_cmd_t *c = sim_complete(&sim, PREV_L, PREV_LEASE, "1", NULL);
    ok(c, "CompleteRun of the older lease");
    cr_assert_eq(get(PREV_L)->status, ST(CANCELLED));
    sim_advance(&sim, 1796146368764);
    cr_assert_eq(get(PREV_D)->status, ST(PENDING));
    kf_cmd_t *p = sim_poll(&sim, "wf", 10000, 10, 0);
    ok(p, "PollRuns");
    cr_assert_eq(POLL_RESP(p)->n_runs, 3, "p, r and d");
    cr_assert_str_eq(POLL_RESP(p)->runs[0]->run_id, PREV_P, "oldest first");
    sim_crash(&sim);
    cr_assert_eq(get(PREV_P)->status, ST(LEASED));
    sim_advance(&sim, 1796747568768);
    sim_advance(&sim, 1796747568768 + 2000);
    cr_assert_eq(sim_get(&sim, PREV_C)->error.status, KF_E_NOT_FOUND, "deleted by retention");
}
