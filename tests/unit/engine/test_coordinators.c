/*
 * test_coordinators.c - deterministic tests of debounce and batch
 * coordinators over the engine core: window arithmetic end to end, dedup,
 * continue-as-new, recovery after a crash, flush and cancel, bad input.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord/window.h"
#include "records/records.pb-c.h"
#include "sim.h"
#include "storage/keys.h"

static sim_t sim;
static void setup(void) {
    sim_open(&sim, 42);
}
static void teardown(void) {
    sim_close(&sim);
}

TestSuite(coordinators, .init = setup, .fini = teardown, .timeout = 60);

static const char *run_id_of(kf_cmd_t *cmd) {
    cr_assert_eq(cmd->error.status, KF_OK, "%s", cmd->error.message);
    return SEND_RESP(cmd)->receipt->run_id;
}

/* Takes every pending run of `workflow` (lease 60 s). */
static Keyflow__V1__PollRunsResponse *take_runs(const char *workflow) {
    kf_cmd_t *p = sim_poll(&sim, workflow, 60000, 100, 0);
    cr_assert_eq(p->error.status, KF_OK, "%s", p->error.message);
    return POLL_RESP(p);
}

Test(coordinators, debounce_trailing_edge_moves_and_fires_once) {
    int64_t t0 = sim.now_ms;
    kf_cmd_t *a = sim_send(&sim, "wf", "k1", NULL, sim_debounce(&sim, 100, -1), "1");
    cr_assert_eq(SEND_RESP(a)->receipt->due_ms, t0 + 100);
    cr_assert_not(SEND_RESP(a)->duplicate);
    const char *run_id = run_id_of(a);
    cr_assert(strncmp(run_id, "k1@", 3) == 0 && strlen(run_id) == 3 + 36, "run id %s", run_id);

    sim_advance(&sim, t0 + 50);
    kf_cmd_t *b = sim_send(&sim, "wf", "k1", NULL, sim_debounce(&sim, 100, -1), "{\"v\":2}");
    cr_assert_str_eq(run_id_of(b), run_id, "a later event joins the same window");
    cr_assert_eq(SEND_RESP(b)->receipt->due_ms, t0 + 150, "the due time moves");

    sim_advance(&sim, t0 + 149);
    cr_assert_eq(take_runs("wf")->n_runs, 0, "not due yet");
    sim_advance(&sim, t0 + 150);
    Keyflow__V1__PollRunsResponse *runs = take_runs("wf");
    cr_assert_eq(runs->n_runs, 1);
    cr_assert_str_eq(runs->runs[0]->run_id, run_id);
    cr_assert_str_eq(runs->runs[0]->input_json, "{\"v\":2}", "the latest input wins");
    cr_assert_eq(runs->runs[0]->event_count, 2);
    sim_advance(&sim, t0 + 10000);
    cr_assert_eq(take_runs("wf")->n_runs, 0, "one window, one run");
}

Test(coordinators, debounce_max_wait_bounds_the_window) {
    int64_t t0 = sim.now_ms;
    int64_t due[3];
    for (int i = 0; i < 3; i++) {
        sim_advance(&sim, t0 + 90 * i);
        kf_cmd_t *c = sim_send(&sim, "wf", "k", NULL, sim_debounce(&sim, 100, 250), "null");
        due[i] = SEND_RESP(c)->receipt->due_ms;
    }
    cr_assert_eq(due[0], t0 + 100);
    cr_assert_eq(due[1], t0 + 190);
    cr_assert_eq(due[2], t0 + 250, "min(last + window, opened + max_wait)");
}

Test(coordinators, batch_fires_at_max_events_inside_the_request) {
    Keyflow__V1__Rule *rule = sim_batch(&sim, 3, 60000);
    const char *first = run_id_of(sim_send(&sim, "wf", "k", NULL, rule, "\"a\""));
    run_id_of(sim_send(&sim, "wf", "k", NULL, rule, "{\"b\": [1, 2]}"));
    kf_cmd_t *third = sim_send(&sim, "wf", "k", NULL, rule, "3");
    cr_assert_str_eq(run_id_of(third), first);
    cr_assert(SEND_RESP(third)->run_started);
    cr_assert_eq(SEND_RESP(third)->receipt->due_ms, sim.now_ms, "due at the last event");
    Keyflow__V1__PollRunsResponse *runs = take_runs("wf");
    cr_assert_eq(runs->n_runs, 1);
    cr_assert_str_eq(runs->runs[0]->input_json, "[\"a\",{\"b\": [1, 2]},3]");
    cr_assert_eq(runs->runs[0]->kind, KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH);
    /* The next event opens a new window with a new run ID. */
    const char *next = run_id_of(sim_send(&sim, "wf", "k", NULL, rule, "4"));
    cr_assert_str_neq(next, first);
}

Test(coordinators, batch_max_wait_closes_a_partial_batch) {
    int64_t t0 = sim.now_ms;
    Keyflow__V1__Rule *rule = sim_batch(&sim, 10, 1000);
    kf_cmd_t *a = sim_send(&sim, "wf", "k", NULL, rule, "1");
    cr_assert_eq(SEND_RESP(a)->receipt->due_ms, t0 + 1000);
    sim_advance(&sim, t0 + 500);
    kf_cmd_t *b = sim_send(&sim, "wf", "k", NULL, rule, "2");
    cr_assert_eq(SEND_RESP(b)->receipt->due_ms, t0 + 1000, "batch due time is opened + max_wait");
    sim_advance(&sim, t0 + 999);
    cr_assert_eq(take_runs("wf")->n_runs, 0);
    sim_advance(&sim, t0 + 1000);
    Keyflow__V1__PollRunsResponse *runs = take_runs("wf");
    cr_assert_eq(runs->n_runs, 1);
    cr_assert_str_eq(runs->runs[0]->input_json, "[1,2]");
}

Test(coordinators, defaults_apply_when_fields_are_absent) {
    int64_t t0 = sim.now_ms;
    kf_cmd_t *c = sim_send(&sim, "wf", "k", "e1", sim_batch(&sim, -1, -1), "1");
    cr_assert_eq(SEND_RESP(c)->receipt->due_ms, t0 + 1000, "batch max_wait_ms defaults to 1000");
    kf_cmd_t *d = sim_describe(&sim, 'b', "wf", "k");
    Keyflow__V1__DescribeCoordinatorResponse *desc = DESCRIBE_RESP(d);
    cr_assert(desc->exists);
    cr_assert_eq(desc->window->rule->max_events, 100);
    cr_assert_eq(desc->window->rule->dedup_ms, 600000);
    cr_assert_eq(desc->n_remembered_ids, 1);
    cr_assert_eq(desc->remembered_ids[0]->expires_ms, t0 + 600000);
}

Test(coordinators, dedup_returns_the_first_receipt_and_adds_nothing) {
    int64_t t0 = sim.now_ms;
    Keyflow__V1__Rule *rule = sim_debounce(&sim, 100, -1);
    rule->dedup_ms_present_case = KEYFLOW__V1__RULE__DEDUP_MS_PRESENT_DEDUP_MS;
    rule->dedup_ms = 5000;
    kf_cmd_t *a = sim_send(&sim, "wf", "k", "evt-1", rule, "\"first\"");
    sim_advance(&sim, t0 + 40);
    uint64_t writes = kf_memdisk_writes(sim.disk);
    kf_cmd_t *b = sim_send(&sim, "wf", "k", "evt-1", rule, "\"first\"");
    cr_assert(SEND_RESP(b)->duplicate);
    cr_assert_str_eq(run_id_of(b), run_id_of(a));
    cr_assert_eq(SEND_RESP(b)->receipt->due_ms, t0 + 100, "the first receipt, unmoved");
    cr_assert_eq(kf_memdisk_writes(sim.disk), writes, "a duplicate writes nothing");
    sim_advance(&sim, t0 + 100);
    Keyflow__V1__PollRunsResponse *runs = take_runs("wf");
    cr_assert_eq(runs->n_runs, 1);
    cr_assert_str_eq(runs->runs[0]->input_json, "\"first\"");
    cr_assert_eq(runs->runs[0]->event_count, 1);
    /* Still remembered after its window closed, until dedup_ms passes. */
    kf_cmd_t *c = sim_send(&sim, "wf", "k", "evt-1", rule, "\"first\"");
    cr_assert(SEND_RESP(c)->duplicate);
    cr_assert_str_eq(run_id_of(c), run_id_of(a));
    sim_advance(&sim, t0 + 5000);
    kf_cmd_t *d = sim_send(&sim, "wf", "k", "evt-1", rule, "\"later\"");
    cr_assert_not(SEND_RESP(d)->duplicate, "expired after dedup_ms");
    cr_assert_str_neq(run_id_of(d), run_id_of(a));
}

Test(coordinators, remembered_ids_are_bounded_oldest_forgotten_first) {
    Keyflow__V1__Rule *rule = sim_batch(&sim, 10000, 60000);
    char id[32];
    for (int i = 0; i <= KF_REMEMBERED_IDS_MAX; i++) {
        snprintf(id, sizeof id, "id-%d", i);
        kf_cmd_t *c = sim_send(&sim, "wf", "k", id, rule, "0");
        cr_assert_not(SEND_RESP(c)->duplicate);
    }
    kf_cmd_t *d = sim_describe(&sim, 'b', "wf", "k");
    cr_assert_eq(DESCRIBE_RESP(d)->n_remembered_ids, KF_REMEMBERED_IDS_MAX);
    cr_assert_str_eq(DESCRIBE_RESP(d)->remembered_ids[0]->id, "id-1");
    cr_assert_not(SEND_RESP(sim_send(&sim, "wf", "k", "id-0", rule, "0"))->duplicate,
                  "the oldest was forgotten");
    cr_assert(SEND_RESP(sim_send(&sim, "wf", "k", "id-2", rule, "0"))->duplicate);
}

Test(coordinators, continue_as_new_keeps_state_across_compaction_and_crash) {
    Keyflow__V1__Rule *rule = sim_batch(&sim, 10000, 3600000);
    char input[32];
    int n = KF_JOURNAL_ENTRIES_MAX * 2 + 17;
    for (int i = 0; i < n; i++) {
        snprintf(input, sizeof input, "%d", i);
        run_id_of(sim_send(&sim, "wf", "k", NULL, rule, input));
    }
    Keyflow__V1__DescribeCoordinatorResponse *before =
        DESCRIBE_RESP(sim_describe(&sim, 'b', "wf", "k"));
    cr_assert_eq(before->compactions, 2);
    cr_assert_eq(before->journal_seq, n);
    cr_assert_eq(before->journal_length, n - 2 * KF_JOURNAL_ENTRIES_MAX);
    cr_assert_eq(before->n_journal, (size_t)before->journal_length, "only live entries are stored");
    cr_assert_eq(before->window->event_count, n);
    sim_crash(&sim);
    Keyflow__V1__DescribeCoordinatorResponse *after =
        DESCRIBE_RESP(sim_describe(&sim, 'b', "wf", "k"));
    cr_assert_str_eq(after->window->run_id, before->window->run_id);
    cr_assert_eq(after->window->event_count, n);
    cr_assert_eq(after->window->due_ms, before->window->due_ms);
    cr_assert_eq(after->journal_seq, before->journal_seq);
    cr_assert_eq(after->compactions, 2);
    Keyflow__V1__FlushWindowRequest fl = KEYFLOW__V1__FLUSH_WINDOW_REQUEST__INIT;
    Keyflow__V1__CoordinatorRef ref = KEYFLOW__V1__COORDINATOR_REF__INIT;
    ref.kind = KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH;
    ref.workflow = "wf";
    ref.key = "k";
    fl.coordinator = &ref;
    kf_cmd_t *f = sim_exec(&sim, KF_OP_FLUSH_WINDOW, &fl.base);
    cr_assert(((Keyflow__V1__FlushWindowResponse *)f->response)->flushed);
    Keyflow__V1__PollRunsResponse *runs = take_runs("wf");
    cr_assert_eq(runs->n_runs, 1);
    /* Every input, in order, exactly once. */
    const char *p = runs->runs[0]->input_json;
    cr_assert_eq(*p++, '[');
    for (int i = 0; i < n; i++) {
        char *end;
        long v = strtol(p, &end, 10);
        cr_assert_eq(v, i);
        cr_assert_eq(*end, i == n - 1 ? ']' : ',');
        p = end + 1;
    }
}

Test(coordinators, crash_loses_only_the_unsynced_group) {
    run_id_of(sim_send(&sim, "wf", "k", "a", sim_batch(&sim, 10, 60000), "1"));
    /* Execute without stepping: the group is never written. */
    Keyflow__V1__SendEventRequest *req = kf_arena_zalloc(&sim.arena, sizeof *req);
    keyflow__v1__send_event_request__init(req);
    req->workflow = "wf";
    req->key = "k";
    Keyflow__V1__Event ev = KEYFLOW__V1__EVENT__INIT;
    ev.id = "b";
    ev.rule = sim_batch(&sim, 10, 60000);
    ev.input_json = "2";
    req->event = &ev;
    kf_cmd_t cmd = {.op = KF_OP_SEND_EVENT, .request = &req->base, .arena = &sim.arena};
    kf_core_execute(sim.core, &cmd);
    cr_assert_eq(cmd.error.status, KF_OK);
    sim_crash(&sim);
    Keyflow__V1__DescribeCoordinatorResponse *d = DESCRIBE_RESP(sim_describe(&sim, 'b', "wf", "k"));
    cr_assert_eq(d->window->event_count, 1, "the unacknowledged event is gone");
    cr_assert_eq(d->n_remembered_ids, 1);
    cr_assert_str_eq(d->remembered_ids[0]->id, "a");
}

Test(coordinators, overdue_window_closes_at_once_after_restart_and_never_twice) {
    int64_t t0 = sim.now_ms;
    const char *run_id =
        run_id_of(sim_send(&sim, "wf", "k", NULL, sim_debounce(&sim, 100, -1), "7"));
    sim_crash(&sim);
    sim.now_ms = t0 + 5000; /* down while it fell due */
    sim_crash(&sim);
    sim_advance(&sim, t0 + 5000);
    Keyflow__V1__PollRunsResponse *runs = take_runs("wf");
    cr_assert_eq(runs->n_runs, 1);
    cr_assert_str_eq(runs->runs[0]->run_id, run_id);
    sim_crash(&sim);
    sim_advance(&sim, t0 + 9000);
    kf_cmd_t *p = sim_poll(&sim, "wf", 60000, 100, 0);
    cr_assert_eq(POLL_RESP(p)->n_runs, 0, "the leased run is not handed out again, no new run");
    cr_assert(DESCRIBE_RESP(sim_describe(&sim, 'd', "wf", "k"))->exists == false,
              "a coordinator with no window and no IDs is deleted");
}

Test(coordinators, cancel_drops_the_window_and_its_events) {
    const char *run_id = run_id_of(sim_send(&sim, "wf", "k", NULL, sim_batch(&sim, 5, 60000), "1"));
    run_id_of(sim_send(&sim, "wf", "k", NULL, sim_batch(&sim, 5, 60000), "2"));
    Keyflow__V1__CancelWindowRequest req = KEYFLOW__V1__CANCEL_WINDOW_REQUEST__INIT;
    Keyflow__V1__CoordinatorRef ref = KEYFLOW__V1__COORDINATOR_REF__INIT;
    ref.kind = KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH;
    ref.workflow = "wf";
    ref.key = "k";
    req.coordinator = &ref;
    kf_cmd_t *c = sim_exec(&sim, KF_OP_CANCEL_WINDOW, &req.base);
    Keyflow__V1__CancelWindowResponse *resp = (Keyflow__V1__CancelWindowResponse *)c->response;
    cr_assert(resp->cancelled);
    cr_assert_str_eq(resp->run_id, run_id);
    cr_assert_eq(resp->events_dropped, 2);
    sim_advance(&sim, sim.now_ms + 120000);
    cr_assert_eq(take_runs("wf")->n_runs, 0);
    c = sim_exec(&sim, KF_OP_CANCEL_WINDOW, &req.base);
    cr_assert_not(((Keyflow__V1__CancelWindowResponse *)c->response)->cancelled);
}

Test(coordinators, debounce_and_batch_of_one_key_are_distinct) {
    const char *d = run_id_of(sim_send(&sim, "wf", "k", "x", sim_debounce(&sim, 100, -1), "1"));
    kf_cmd_t *b = sim_send(&sim, "wf", "k", "x", sim_batch(&sim, 5, 1000), "2");
    cr_assert_not(SEND_RESP(b)->duplicate, "IDs are per coordinator (kind, workflow, key)");
    cr_assert_str_neq(run_id_of(b), d);
}

Test(coordinators, the_latest_rule_applies_to_the_open_window) {
    int64_t t0 = sim.now_ms;
    run_id_of(sim_send(&sim, "wf", "k", NULL, sim_debounce(&sim, 1000, -1), "1"));
    kf_cmd_t *b = sim_send(&sim, "wf", "k", NULL, sim_debounce(&sim, 10, -1), "2");
    cr_assert_eq(SEND_RESP(b)->receipt->due_ms, t0 + 10);
    sim_advance(&sim, t0 + 10);
    cr_assert_eq(take_runs("wf")->n_runs, 1);
}

Test(coordinators, saturating_arithmetic_never_overflows) {
    kf_rule_t rule = {.kind = KF_RULE_DEBOUNCE, .window_ms = KF_WINDOW_MS_MAX};
    cr_assert_eq(kf_window_due_ms(&rule, INT64_MAX - 5, INT64_MAX - 5, 1), INT64_MAX);
    rule.max_wait_ms = 10;
    cr_assert_eq(kf_window_due_ms(&rule, INT64_MAX - 20, INT64_MAX - 5, 2), INT64_MAX - 10);
    kf_rule_t batch = {.kind = KF_RULE_BATCH, .max_events = 3, .max_wait_ms = KF_WINDOW_MS_MAX};
    cr_assert_eq(kf_window_due_ms(&batch, INT64_MAX - 1, INT64_MAX - 1, 1), INT64_MAX);
    cr_assert_eq(kf_window_due_ms(&batch, 10, 20, 3), 20);
}

static void expect_invalid(kf_cmd_t *cmd, kf_status_t status, const char *field) {
    cr_assert_eq(cmd->error.status, status, "got %s: %s", kf_status_name(cmd->error.status),
                 cmd->error.message);
    cr_assert_null(cmd->response);
    cr_assert(strstr(cmd->error.message, field) != NULL, "message '%s' names %s",
              cmd->error.message, field);
}

Test(coordinators, bad_input_is_refused_naming_the_field_and_changes_nothing) {
    uint64_t writes = kf_memdisk_writes(sim.disk);
    expect_invalid(sim_send(&sim, "wf", "", NULL, sim_debounce(&sim, 100, -1), "1"), KF_E_INVALID,
                   "key");
    expect_invalid(sim_send(&sim, "", "k", NULL, sim_debounce(&sim, 100, -1), "1"), KF_E_INVALID,
                   "workflow");
    expect_invalid(sim_send(&sim, "wf", "k", NULL, sim_batch(&sim, 0, 100), "1"), KF_E_INVALID,
                   "event.rule.max_events");
    expect_invalid(sim_send(&sim, "wf", "k", NULL, sim_batch(&sim, 10001, 100), "1"), KF_E_INVALID,
                   "event.rule.max_events");
    expect_invalid(sim_send(&sim, "wf", "k", NULL, sim_debounce(&sim, 0, -1), "1"), KF_E_INVALID,
                   "event.rule.window_ms");
    expect_invalid(sim_send(&sim, "wf", "k", NULL, sim_debounce(&sim, 100, -1), "{nope"),
                   KF_E_INVALID, "event.input");
    expect_invalid(sim_send(&sim, "wf", "k", NULL, NULL, "1"), KF_E_INVALID, "event.rule");
    Keyflow__V1__Rule *unknown = sim_debounce(&sim, 100, -1);
    unknown->kind = 7;
    expect_invalid(sim_send(&sim, "wf", "k", NULL, unknown, "1"), KF_E_INVALID, "event.rule.kind");
    char big_key[KF_KEY_BYTES_MAX + 2];
    memset(big_key, 'x', sizeof big_key - 1);
    big_key[sizeof big_key - 1] = '\0';
    expect_invalid(sim_send(&sim, "wf", big_key, NULL, sim_debounce(&sim, 100, -1), "1"),
                   KF_E_TOO_LARGE, "key");
    expect_invalid(sim_send(&sim, "wf", "k\x01", NULL, sim_debounce(&sim, 100, -1), "1"),
                   KF_E_INVALID, "key");
    cr_assert_eq(kf_memdisk_writes(sim.disk), writes, "nothing was written");
    cr_assert_not(DESCRIBE_RESP(sim_describe(&sim, 'd', "wf", "k"))->exists);
}

Test(coordinators, describe_lists_the_journal) {
    run_id_of(sim_send(&sim, "wf", "k", "e1", sim_batch(&sim, 2, 60000), "1"));
    run_id_of(sim_send(&sim, "wf", "k", "e2", sim_batch(&sim, 2, 60000), "2"));
    Keyflow__V1__DescribeCoordinatorResponse *d = DESCRIBE_RESP(sim_describe(&sim, 'b', "wf", "k"));
    cr_assert(d->exists);
    cr_assert_null(d->window);
    cr_assert_eq(d->runs_started, 1);
    cr_assert_eq(d->n_recent_run_ids, 1);
    cr_assert_eq(d->n_journal, 3);
    cr_assert_str_eq(d->journal[0]->what, "event_accepted");
    cr_assert_str_eq(d->journal[0]->event_id, "e1");
    cr_assert_str_eq(d->journal[1]->what, "event_accepted");
    cr_assert_str_eq(d->journal[2]->what, "run_started");
    cr_assert_str_eq(d->journal[2]->run_id, d->recent_run_ids[0]);
}

Test(coordinators, a_moved_window_neither_closes_early_nor_late_after_a_crash) {
    /* The stored wake-up may stay at the first due time while events move
     * the window later; after a restart it fires early and must re-arm. */
    int64_t t0 = sim.now_ms;
    const char *run_id =
        run_id_of(sim_send(&sim, "wf", "k", NULL, sim_debounce(&sim, 100, -1), "1"));
    sim_advance(&sim, t0 + 60);
    run_id_of(sim_send(&sim, "wf", "k", NULL, sim_debounce(&sim, 100, -1), "2"));
    sim_advance(&sim, t0 + 120);
    kf_cmd_t *c = sim_send(&sim, "wf", "k", NULL, sim_debounce(&sim, 100, -1), "3");
    cr_assert_eq(SEND_RESP(c)->receipt->due_ms, t0 + 220);
    sim_crash(&sim);
    sim_advance(&sim, t0 + 150); /* past the first due time, before the real one */
    cr_assert_eq(take_runs("wf")->n_runs, 0, "the window must not close early");
    Keyflow__V1__DescribeCoordinatorResponse *d = DESCRIBE_RESP(sim_describe(&sim, 'd', "wf", "k"));
    cr_assert_eq(d->window->due_ms, t0 + 220);
    sim_crash(&sim);
    sim_advance(&sim, t0 + 220);
    Keyflow__V1__PollRunsResponse *runs = take_runs("wf");
    cr_assert_eq(runs->n_runs, 1, "and it closes on time");
    cr_assert_str_eq(runs->runs[0]->run_id, run_id);
    cr_assert_str_eq(runs->runs[0]->input_json, "3");
}

/* The engine fires at most KF_TIMERS_PER_TURN_MAX timers before a turn's
 * commands, so a request can meet a window whose due time has passed before
 * its timer fired. It must find that window closed: an event opens the next
 * window (it never joins a run that should have started), and cancel, flush
 * and describe see no open window. The clock moves here without firing
 * timers, which is that situation. */
Test(coordinators, a_request_after_the_due_time_finds_the_window_closed) {
    int64_t t0 = sim.now_ms;
    Keyflow__V1__Rule *rule = sim_batch(&sim, 10, 1000);
    const char *first = run_id_of(sim_send(&sim, "wf", "k", NULL, rule, "\"a\""));
    run_id_of(sim_send(&sim, "wf", "cancel", NULL, rule, "1"));
    run_id_of(sim_send(&sim, "wf", "flush", NULL, rule, "2"));
    run_id_of(sim_send(&sim, "wf", "describe", NULL, sim_debounce(&sim, 1000, -1), "3"));
    sim.now_ms = t0 + 1000; /* due, no timer fired */

    kf_cmd_t *b = sim_send(&sim, "wf", "k", NULL, rule, "\"b\"");
    cr_assert_str_neq(run_id_of(b), first, "a late event opens the next window");
    cr_assert_eq(SEND_RESP(b)->receipt->due_ms, t0 + 2000);

    Keyflow__V1__CoordinatorRef ref = KEYFLOW__V1__COORDINATOR_REF__INIT;
    ref.kind = KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH;
    ref.workflow = "wf";
    ref.key = "cancel";
    Keyflow__V1__CancelWindowRequest cancel = KEYFLOW__V1__CANCEL_WINDOW_REQUEST__INIT;
    cancel.coordinator = &ref;
    kf_cmd_t *c = sim_exec(&sim, KF_OP_CANCEL_WINDOW, &cancel.base);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    cr_assert_not(((Keyflow__V1__CancelWindowResponse *)c->response)->cancelled,
                  "the window was over: its run started, nothing to cancel");

    Keyflow__V1__CoordinatorRef fref = ref;
    fref.key = "flush";
    Keyflow__V1__FlushWindowRequest flush = KEYFLOW__V1__FLUSH_WINDOW_REQUEST__INIT;
    flush.coordinator = &fref;
    kf_cmd_t *f = sim_exec(&sim, KF_OP_FLUSH_WINDOW, &flush.base);
    cr_assert_eq(f->error.status, KF_OK, "%s", f->error.message);
    cr_assert_not(((Keyflow__V1__FlushWindowResponse *)f->response)->flushed);

    Keyflow__V1__DescribeCoordinatorResponse *d =
        DESCRIBE_RESP(sim_describe(&sim, 'd', "wf", "describe"));
    cr_assert_null(d->window, "describe shows no open window after the due time");

    /* Each of the four windows started exactly one run, with its own input;
     * the late event's window is still open. */
    Keyflow__V1__PollRunsResponse *runs = take_runs("wf");
    cr_assert_eq(runs->n_runs, 4);
    int seen_first = 0;
    for (size_t i = 0; i < runs->n_runs; i++) {
        if (strcmp(runs->runs[i]->run_id, first) == 0) {
            seen_first++;
            cr_assert_str_eq(runs->runs[i]->input_json, "[\"a\"]");
        }
    }
    cr_assert_eq(seen_first, 1);
    sim_advance(&sim, t0 + 1500);
    cr_assert_eq(take_runs("wf")->n_runs, 0, "no run started twice when the timers fire late");
}

/* The disk boundary: a journal entry is replayed only if the engine could
 * have written it. A rule outside the ranges a request may ask for (here a
 * debounce window of 0 ms) stops recovery with KF_E_CORRUPT; the same entry
 * with a valid window recovers. */
Test(coordinators, recovery_refuses_a_stored_rule_out_of_range) {
    kf_key_t ckey, jkey;
    kf_key_coord(&ckey, KF_RULE_DEBOUNCE, "wf", 2, "k", 1);
    kf_key_journal(&jkey, &ckey, 0);
    Keyflow__Records__RuleRec rule = KEYFLOW__RECORDS__RULE_REC__INIT;
    rule.kind = KF_RULE_DEBOUNCE;
    rule.dedup_ms = KF_DEDUP_MS_DEFAULT;
    Keyflow__Records__EventAcceptedRec acc = KEYFLOW__RECORDS__EVENT_ACCEPTED_REC__INIT;
    acc.rule = &rule;
    acc.input_json = "1";
    acc.run_uuid = "0190f5c0-1234-7abc-8def-0123456789ab";
    acc.opened = true;
    acc.due_ms = sim.now_ms + 100;
    Keyflow__Records__JournalEntryRec entry = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__INIT;
    entry.seq = 0;
    entry.at_ms = sim.now_ms;
    entry.entry_case = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_ACCEPTED;
    entry.accepted = &acc;
    int64_t windows_ms[] = {100, 0, -5, KF_WINDOW_MS_MAX + 1};
    for (size_t i = 0; i < sizeof windows_ms / sizeof windows_ms[0]; i++) {
        rule.window_ms = windows_ms[i];
        uint8_t buf[256];
        size_t len = keyflow__records__journal_entry_rec__pack(&entry, buf);
        sim_put_raw(&sim, KF_CF_COORD_JOURNAL, jkey.bytes, jkey.len, buf, len);
        kf_error_t err;
        kf_status_t st = sim_restart_status(&sim, &err);
        if (i == 0) {
            cr_assert_eq(st, KF_OK, "%s", err.message);
        } else {
            cr_assert_eq(st, KF_E_CORRUPT, "window_ms %lld", (long long)windows_ms[i]);
            cr_assert(strstr(err.message, "malformed event_accepted") != NULL, "%s", err.message);
        }
    }
}
