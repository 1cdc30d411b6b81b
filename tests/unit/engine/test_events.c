/*
 * test_events.c - what one event does, deterministically over the engine
 * core: dispositions, commit sequences, another payload under a remembered
 * ID, debounce edges (LEADING, BOTH), per-event flush and batch max_bytes,
 * each also across a crash where it stores state (docs/semantics.md).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord/window.h"
#include "base/bytes.h"
#include "records/records.pb-c.h"
#include "sim.h"
#include "storage/keys.h"

static sim_t sim;
static void setup(void) {
    sim_open(&sim, 7);
}
static void teardown(void) {
    sim_close(&sim);
}

TestSuite(events, .init = setup, .fini = teardown, .timeout = 60);

#define D(x) KEYFLOW__V1__DISPOSITION__DISPOSITION_##x

static Keyflow__V1__SendEventResponse *ok(kf_cmd_t *cmd) {
    cr_assert_eq(cmd->error.status, KF_OK, "%s", cmd->error.message);
    return SEND_RESP(cmd);
}

static Keyflow__V1__Rule *edge(Keyflow__V1__Rule *rule, Keyflow__V1__Edge e) {
    rule->edge = e;
    return rule;
}

static Keyflow__V1__Rule *leading(int64_t window_ms, int64_t max_wait_ms) {
    return edge(sim_debounce(&sim, window_ms, max_wait_ms), KEYFLOW__V1__EDGE__EDGE_LEADING);
}

static Keyflow__V1__Rule *both(int64_t window_ms) {
    return edge(sim_debounce(&sim, window_ms, -1), KEYFLOW__V1__EDGE__EDGE_BOTH);
}

static kf_cmd_t *send_flush(const char *key, const char *id, Keyflow__V1__Rule *rule,
                            const char *input) {
    Keyflow__V1__Event *ev = sim_event(&sim, id, rule, input);
    ev->flush = true;
    return sim_send_event(&sim, "wf", key, ev);
}

/* Takes every pending run (lease 60 s). */
static Keyflow__V1__PollRunsResponse *take_runs(void) {
    kf_cmd_t *p = sim_poll(&sim, "wf", 60000, 100, 0);
    cr_assert_eq(p->error.status, KF_OK, "%s", p->error.message);
    return POLL_RESP(p);
}

static Keyflow__V1__DescribeCoordinatorResponse *describe(int kind, const char *key) {
    kf_cmd_t *d = sim_describe(&sim, kind, "wf", key);
    cr_assert_eq(d->error.status, KF_OK, "%s", d->error.message);
    return DESCRIBE_RESP(d);
}

/* ---- dispositions ----------------------------------------------------- */

Test(events, each_request_says_what_it_did_to_the_window) {
    Keyflow__V1__Rule *rule = sim_batch(&sim, 3, 60000);
    Keyflow__V1__SendEventResponse *a = ok(sim_send(&sim, "wf", "k", "a", rule, "1"));
    cr_assert_eq(a->disposition, D(OPENED));
    cr_assert_not(a->run_started);
    Keyflow__V1__SendEventResponse *b = ok(sim_send(&sim, "wf", "k", "b", rule, "2"));
    cr_assert_eq(b->disposition, D(JOINED));
    cr_assert_str_eq(b->receipt->run_id, a->receipt->run_id);
    Keyflow__V1__SendEventResponse *retry = ok(sim_send(&sim, "wf", "k", "a", rule, "1"));
    cr_assert_eq(retry->disposition, D(DUPLICATE));
    cr_assert(retry->duplicate);
    cr_assert_str_eq(retry->receipt->run_id, a->receipt->run_id);
    cr_assert_eq(retry->receipt->due_ms, a->receipt->due_ms);
    cr_assert_eq(retry->receipt->commit_seq, a->receipt->commit_seq, "the first event's write");
    Keyflow__V1__SendEventResponse *c = ok(sim_send(&sim, "wf", "k", "c", rule, "3"));
    cr_assert_eq(c->disposition, D(CLOSED), "the batch filled");
    cr_assert(c->run_started);
    cr_assert_eq(take_runs()->n_runs, 1);

    Keyflow__V1__FlushWindowResponse *f = FLUSH_RESP(sim_flush(&sim, 'b', "wf", "k"));
    cr_assert_eq(f->disposition, D(NO_WINDOW));
    cr_assert_not(f->flushed);
    Keyflow__V1__CancelWindowResponse *x = CANCEL_RESP(sim_cancel(&sim, 'b', "wf", "k"));
    cr_assert_eq(x->disposition, D(NO_WINDOW));
    cr_assert_not(x->cancelled);

    const char *second = ok(sim_send(&sim, "wf", "k", NULL, rule, "4"))->receipt->run_id;
    f = FLUSH_RESP(sim_flush(&sim, 'b', "wf", "k"));
    cr_assert_eq(f->disposition, D(CLOSED));
    cr_assert_str_eq(f->run_id, second);
    const char *third = ok(sim_send(&sim, "wf", "k", NULL, rule, "5"))->receipt->run_id;
    x = CANCEL_RESP(sim_cancel(&sim, 'b', "wf", "k"));
    cr_assert_eq(x->disposition, D(CANCELLED));
    cr_assert_str_eq(x->run_id, third);
    cr_assert_eq(x->events_dropped, 1);
    Keyflow__V1__PollRunsResponse *runs = take_runs();
    cr_assert_eq(runs->n_runs, 1, "the flushed window's run, not the cancelled one");
    cr_assert_str_eq(runs->runs[0]->run_id, second);
}

/* ---- commit sequences -------------------------------------------------- */

/* Executes a SendEvent into the open group without writing it. */
static kf_cmd_t *execute_unwritten(const char *key, const char *input) {
    Keyflow__V1__SendEventRequest *req = sim_send_request(
        &sim, "wf", key, sim_event(&sim, NULL, sim_batch(&sim, 100, 60000), input));
    kf_cmd_t *cmd = kf_arena_zalloc(&sim.arena, sizeof *cmd);
    cmd->op = KF_OP_SEND_EVENT;
    cmd->request = &req->base;
    cmd->arena = &sim.arena;
    kf_core_begin(sim.core, sim.batch, sim.group, sim.now_ms);
    kf_core_execute(sim.core, cmd);
    return cmd;
}

Test(events, commit_seq_names_the_write_and_keeps_increasing_across_a_crash) {
    Keyflow__V1__Rule *rule = sim_batch(&sim, 100, 60000);
    int64_t a = ok(sim_send(&sim, "wf", "k1", NULL, rule, "1"))->receipt->commit_seq;
    int64_t b = ok(sim_send(&sim, "wf", "k2", NULL, rule, "2"))->receipt->commit_seq;
    cr_assert_gt(a, 0);
    cr_assert_gt(b, a, "a later write, a larger sequence");
    /* Two events in one group share its sequence. */
    kf_cmd_t *c = execute_unwritten("k1", "3");
    kf_cmd_t *d = execute_unwritten("k3", "4");
    sim_step(&sim);
    cr_assert_eq(ok(c)->receipt->commit_seq, ok(d)->receipt->commit_seq);
    cr_assert_gt(ok(c)->receipt->commit_seq, b);
    int64_t last_acked = ok(d)->receipt->commit_seq;
    /* An unwritten group is lost in a crash; what comes after it is still
     * above everything acknowledged. */
    kf_cmd_t *lost = execute_unwritten("k1", "5");
    cr_assert_gt(ok(lost)->receipt->commit_seq, last_acked);
    sim_crash(&sim);
    int64_t e = ok(sim_send(&sim, "wf", "k4", NULL, rule, "6"))->receipt->commit_seq;
    cr_assert_gt(e, last_acked, "strictly increasing across the restart");
    sim_crash(&sim);
    int64_t f = ok(sim_send(&sim, "wf", "k4", NULL, rule, "7"))->receipt->commit_seq;
    cr_assert_gt(f, e);
    /* Describe shows each remembered ID's sequence too. */
    ok(sim_send(&sim, "wf", "k5", "id", rule, "8"));
    Keyflow__V1__DescribeCoordinatorResponse *desc = describe('b', "k5");
    cr_assert_gt(desc->remembered_ids[0]->receipt->commit_seq, f);
}

/* ---- another payload under a remembered ID ------------------------------ */

static void expect_conflict(kf_cmd_t *cmd) {
    cr_assert_eq(cmd->error.status, KF_E_EXISTS, "got %s: %s", kf_status_name(cmd->error.status),
                 cmd->error.message);
    cr_assert_null(cmd->response);
    cr_assert(strstr(cmd->error.message, "event.id") != NULL, "%s", cmd->error.message);
    cr_assert(strstr(cmd->error.message, "another payload") != NULL, "%s", cmd->error.message);
}

Test(events, another_payload_under_a_remembered_id_is_refused_and_changes_nothing) {
    Keyflow__V1__Rule *rule = sim_batch(&sim, 1000, 60000);
    Keyflow__V1__SendEventResponse *first = ok(sim_send(&sim, "wf", "k", "e-1", rule, "{\"n\":1}"));
    uint64_t writes = kf_memdisk_writes(sim.disk);
    expect_conflict(sim_send(&sim, "wf", "k", "e-1", rule, "{\"n\":2}"));
    expect_conflict(sim_send(&sim, "wf", "k", "e-1", sim_batch(&sim, 999, 60000), "{\"n\":1}"));
    Keyflow__V1__Rule *dedup = sim_batch(&sim, 1000, 60000);
    dedup->dedup_ms_present_case = KEYFLOW__V1__RULE__DEDUP_MS_PRESENT_DEDUP_MS;
    dedup->dedup_ms = 1000;
    expect_conflict(sim_send(&sim, "wf", "k", "e-1", dedup, "{\"n\":1}"));
    expect_conflict(send_flush("k", "e-1", rule, "{\"n\":1}"));
    cr_assert_eq(kf_memdisk_writes(sim.disk), writes, "a refused retry writes nothing");
    /* Surrounding whitespace is not part of the payload; defaults resolved
     * are the same rule as spelled out. */
    Keyflow__V1__Rule *spelled = sim_batch(&sim, 1000, 60000);
    spelled->dedup_ms_present_case = KEYFLOW__V1__RULE__DEDUP_MS_PRESENT_DEDUP_MS;
    spelled->dedup_ms = KF_DEDUP_MS_DEFAULT;
    spelled->max_bytes_present_case = KEYFLOW__V1__RULE__MAX_BYTES_PRESENT_MAX_BYTES;
    spelled->max_bytes = KF_WINDOW_INPUT_BYTES_MAX;
    cr_assert(ok(sim_send(&sim, "wf", "k", "e-1", spelled, " {\"n\":1}\n"))->duplicate);
    cr_assert_eq(describe('b', "k")->window->event_count, 1);

    /* The digest is stored: the refusal survives a crash, and a compaction
     * (the snapshot carries it). */
    sim_crash(&sim);
    expect_conflict(sim_send(&sim, "wf", "k", "e-1", rule, "{\"n\":2}"));
    for (int i = 0; i < KF_JOURNAL_ENTRIES_MAX + 10; i++) {
        ok(sim_send(&sim, "wf", "k", NULL, rule, "0"));
    }
    cr_assert_geq(describe('b', "k")->compactions, 1);
    sim_crash(&sim);
    expect_conflict(sim_send(&sim, "wf", "k", "e-1", rule, "{\"n\":2}"));
    Keyflow__V1__SendEventResponse *again = ok(sim_send(&sim, "wf", "k", "e-1", rule, "{\"n\":1}"));
    cr_assert_eq(again->disposition, D(DUPLICATE));
    cr_assert_eq(again->receipt->commit_seq, first->receipt->commit_seq);
}

Test(events, a_conflict_ends_with_the_dedup_span) {
    Keyflow__V1__Rule *rule = sim_debounce(&sim, 100, -1);
    rule->dedup_ms_present_case = KEYFLOW__V1__RULE__DEDUP_MS_PRESENT_DEDUP_MS;
    rule->dedup_ms = 500;
    int64_t t0 = sim.now_ms;
    ok(sim_send(&sim, "wf", "k", "x", rule, "1"));
    sim_advance(&sim, t0 + 499);
    expect_conflict(sim_send(&sim, "wf", "k", "x", rule, "2"));
    sim_advance(&sim, t0 + 500);
    cr_assert_eq(ok(sim_send(&sim, "wf", "k", "x", rule, "2"))->disposition, D(OPENED));
}

/* A journal entry as a build without digests wrote it: no digest, no
 * commit sequence, no edge or max_bytes in its rule. */
static void put_old_entry(const char *key, const char *event_id, const char *uuid) {
    Keyflow__Records__RuleRec rule = KEYFLOW__RECORDS__RULE_REC__INIT;
    rule.kind = KF_RULE_BATCH;
    rule.max_events = 100;
    rule.max_wait_ms = 3600000;
    rule.dedup_ms = 600000;
    Keyflow__Records__EventAcceptedRec acc = KEYFLOW__RECORDS__EVENT_ACCEPTED_REC__INIT;
    acc.event_id = (char *)event_id;
    acc.rule = &rule;
    acc.input_json = "\"old\"";
    acc.run_uuid = (char *)uuid;
    acc.opened = true;
    acc.due_ms = sim.now_ms + 3600000;
    Keyflow__Records__JournalEntryRec e = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__INIT;
    e.seq = 0;
    e.at_ms = sim.now_ms;
    e.entry_case = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_ACCEPTED;
    e.accepted = &acc;
    uint8_t buf[512];
    size_t len = keyflow__records__journal_entry_rec__pack(&e, buf);
    kf_key_t ckey, jkey;
    kf_key_coord(&ckey, KF_RULE_BATCH, "wf", 2, key, strlen(key));
    kf_key_journal(&jkey, &ckey, 0);
    sim_put_raw(&sim, KF_CF_COORD_JOURNAL, jkey.bytes, jkey.len, buf, len);
    kf_key_t wkey;
    kf_key_wakeup(&wkey, 0, KF_WAKEUP_COORDINATOR, ckey.bytes, ckey.len);
    uint8_t due[8];
    kf_put_be64(due, kf_i64_ordered(acc.due_ms));
    sim_put_raw(&sim, KF_CF_WAKEUPS, wkey.bytes, wkey.len, due, sizeof due);
}

Test(events, ids_remembered_without_a_digest_answer_any_retry_as_a_duplicate) {
    const char *uuid = "01890000-0000-7000-8000-000000000001";
    put_old_entry("old", "e-1", uuid);
    sim_crash(&sim); /* recover what the older build wrote */
    Keyflow__V1__Rule *rule = sim_batch(&sim, 100, 3600000);
    Keyflow__V1__SendEventResponse *r = ok(sim_send(&sim, "wf", "old", "e-1", rule, "\"other\""));
    cr_assert_eq(r->disposition, D(DUPLICATE), "unknown payload: taken as the same event");
    cr_assert_eq(r->receipt->commit_seq, 0, "unknown sequence");
    cr_assert_str_eq(r->receipt->run_id, "old@01890000-0000-7000-8000-000000000001");
    Keyflow__V1__DescribeCoordinatorResponse *d = describe('b', "old");
    cr_assert_eq(d->window->rule->max_bytes, KF_WINDOW_INPUT_BYTES_MAX, "older rule: 4 MiB");
    cr_assert_eq(d->window->event_count, 1);
    /* New events next to it get digests of their own. */
    ok(sim_send(&sim, "wf", "old", "e-2", rule, "2"));
    expect_conflict(sim_send(&sim, "wf", "old", "e-2", rule, "3"));
}

/* ---- edges ------------------------------------------------------------- */

Test(events, leading_edge_starts_a_run_at_once_and_absorbs_the_quiet_window) {
    int64_t t0 = sim.now_ms;
    /* IDs keep the coordinator (and its journal) after the window ends. */
    Keyflow__V1__SendEventResponse *a = ok(sim_send(&sim, "wf", "k", "a", leading(100, -1), "1"));
    cr_assert_eq(a->disposition, D(CLOSED), "its run started at once");
    cr_assert(a->run_started);
    cr_assert_eq(a->receipt->due_ms, t0 + 100, "the quiet window ends then");
    Keyflow__V1__PollRunsResponse *runs = take_runs();
    cr_assert_eq(runs->n_runs, 1);
    cr_assert_str_eq(runs->runs[0]->run_id, a->receipt->run_id);
    cr_assert_str_eq(runs->runs[0]->input_json, "1");
    cr_assert_eq(runs->runs[0]->event_count, 1);

    sim_advance(&sim, t0 + 60);
    Keyflow__V1__SendEventResponse *b = ok(sim_send(&sim, "wf", "k", "b", leading(100, -1), "2"));
    cr_assert_eq(b->disposition, D(JOINED));
    cr_assert_str_eq(b->receipt->run_id, a->receipt->run_id, "covered by the started run");
    cr_assert_eq(b->receipt->due_ms, t0 + 160, "the quiet window moves");
    Keyflow__V1__DescribeCoordinatorResponse *d = describe('d', "k");
    cr_assert(d->window->run_started);
    cr_assert_eq(d->window->events_absorbed, 1);
    cr_assert_eq(d->window->rule->edge, KEYFLOW__V1__EDGE__EDGE_LEADING);

    sim_advance(&sim, t0 + 160);
    cr_assert_eq(take_runs()->n_runs, 0, "absorbed events start no run");
    d = describe('d', "k");
    cr_assert_null(d->window);
    cr_assert_eq(d->n_journal, 4);
    cr_assert_str_eq(d->journal[1]->what, "run_started");
    cr_assert_str_eq(d->journal[1]->detail, "reason=leading");
    cr_assert(strncmp(d->journal[2]->detail, "absorbed ", 9) == 0, "%s", d->journal[2]->detail);
    cr_assert_str_eq(d->journal[3]->what, "window_closed");
    cr_assert_str_eq(d->journal[3]->detail, "reason=due events_absorbed=1");

    Keyflow__V1__SendEventResponse *c = ok(sim_send(&sim, "wf", "k", NULL, leading(100, -1), "3"));
    cr_assert_eq(c->disposition, D(CLOSED), "after the window, the next event starts a run");
    cr_assert_str_neq(c->receipt->run_id, a->receipt->run_id);
    runs = take_runs();
    cr_assert_eq(runs->n_runs, 1);
    cr_assert_str_eq(runs->runs[0]->input_json, "3");
}

Test(events, leading_edge_with_max_wait_starts_one_run_per_max_wait) {
    int64_t t0 = sim.now_ms;
    int started = 0;
    /* An event every 50 ms for 1 s: the quiet window (100 ms) never ends by
     * itself; max_wait (300 ms) ends it. */
    for (int64_t t = 0; t <= 1000; t += 50) {
        sim_advance(&sim, t0 + t);
        Keyflow__V1__SendEventResponse *r =
            ok(sim_send(&sim, "wf", "k", NULL, leading(100, 300), "0"));
        started += r->disposition == D(CLOSED);
        cr_assert((r->disposition == D(CLOSED)) == (t % 300 == 0), "t=%lld: disposition %d",
                  (long long)t, (int)r->disposition);
    }
    cr_assert_eq(started, 4, "at 0, 300, 600 and 900 ms");
    cr_assert_eq(take_runs()->n_runs, 4);
}

Test(events, both_edges_start_the_first_and_the_latest) {
    int64_t t0 = sim.now_ms;
    Keyflow__V1__SendEventResponse *a = ok(sim_send(&sim, "wf", "k", NULL, both(100), "1"));
    cr_assert_eq(a->disposition, D(CLOSED));
    sim_advance(&sim, t0 + 50);
    Keyflow__V1__SendEventResponse *b = ok(sim_send(&sim, "wf", "k", NULL, both(100), "2"));
    cr_assert_eq(b->disposition, D(OPENED), "it begins the window's trailing run");
    cr_assert_str_neq(b->receipt->run_id, a->receipt->run_id);
    sim_advance(&sim, t0 + 80);
    Keyflow__V1__SendEventResponse *c = ok(sim_send(&sim, "wf", "k", NULL, both(100), "3"));
    cr_assert_eq(c->disposition, D(JOINED));
    cr_assert_str_eq(c->receipt->run_id, b->receipt->run_id);
    cr_assert_eq(c->receipt->due_ms, t0 + 180);
    sim_advance(&sim, t0 + 179);
    Keyflow__V1__PollRunsResponse *runs = take_runs();
    cr_assert_eq(runs->n_runs, 1, "only the leading run so far");
    cr_assert_str_eq(runs->runs[0]->run_id, a->receipt->run_id);
    sim_advance(&sim, t0 + 180);
    runs = take_runs();
    cr_assert_eq(runs->n_runs, 1);
    cr_assert_str_eq(runs->runs[0]->run_id, b->receipt->run_id);
    cr_assert_str_eq(runs->runs[0]->input_json, "3", "the latest input");
    cr_assert_eq(runs->runs[0]->event_count, 2);

    /* A lone event under BOTH starts one run, not two. */
    sim_advance(&sim, t0 + 1000);
    ok(sim_send(&sim, "wf", "lone", NULL, both(100), "9"));
    sim_advance(&sim, t0 + 2000);
    cr_assert_eq(take_runs()->n_runs, 1);
}

Test(events, edges_keep_their_state_across_a_crash) {
    int64_t t0 = sim.now_ms;
    Keyflow__V1__SendEventResponse *l =
        ok(sim_send(&sim, "wf", "lead", NULL, leading(100, -1), "1"));
    Keyflow__V1__SendEventResponse *b1 = ok(sim_send(&sim, "wf", "both", NULL, both(100), "1"));
    sim_advance(&sim, t0 + 10);
    Keyflow__V1__SendEventResponse *b2 = ok(sim_send(&sim, "wf", "both", NULL, both(100), "2"));
    cr_assert_eq(take_runs()->n_runs, 2, "two leading runs");
    sim_crash(&sim);
    Keyflow__V1__DescribeCoordinatorResponse *d = describe('d', "lead");
    cr_assert(d->window->run_started);
    cr_assert_str_eq(d->window->run_id, l->receipt->run_id);
    Keyflow__V1__SendEventResponse *l2 =
        ok(sim_send(&sim, "wf", "lead", NULL, leading(100, -1), "2"));
    cr_assert_eq(l2->disposition, D(JOINED), "still absorbing after the crash");
    cr_assert_str_eq(l2->receipt->run_id, l->receipt->run_id);
    d = describe('d', "both");
    cr_assert_not(d->window->run_started);
    cr_assert_str_eq(d->window->run_id, b2->receipt->run_id);
    sim_crash(&sim);
    sim_advance(&sim, t0 + 1000);
    Keyflow__V1__PollRunsResponse *runs = take_runs();
    cr_assert_eq(runs->n_runs, 1, "the trailing run of BOTH, nothing for LEADING");
    cr_assert_str_eq(runs->runs[0]->run_id, b2->receipt->run_id);
    cr_assert_str_eq(runs->runs[0]->input_json, "2");
    cr_assert_str_neq(b1->receipt->run_id, b2->receipt->run_id);
}

Test(events, cancelling_a_leading_window_drops_no_run) {
    Keyflow__V1__SendEventResponse *a = ok(sim_send(&sim, "wf", "k", NULL, leading(1000, -1), "1"));
    ok(sim_send(&sim, "wf", "k", NULL, leading(1000, -1), "2"));
    Keyflow__V1__CancelWindowResponse *x = CANCEL_RESP(sim_cancel(&sim, 'd', "wf", "k"));
    cr_assert_eq(x->disposition, D(CANCELLED));
    cr_assert_str_eq(x->run_id, "", "its run had already started");
    cr_assert_eq(x->events_dropped, 0);
    Keyflow__V1__PollRunsResponse *runs = take_runs();
    cr_assert_eq(runs->n_runs, 1);
    cr_assert_str_eq(runs->runs[0]->run_id, a->receipt->run_id);
    Keyflow__V1__SendEventResponse *c = ok(sim_send(&sim, "wf", "k", NULL, leading(1000, -1), "3"));
    cr_assert_eq(c->disposition, D(CLOSED), "the next event starts a new run");
}

/* ---- flush: true ------------------------------------------------------- */

Test(events, a_flushing_event_closes_its_window_with_it_inside) {
    Keyflow__V1__Rule *rule = sim_batch(&sim, 100, 60000);
    Keyflow__V1__SendEventResponse *a = ok(sim_send(&sim, "wf", "b", "a", rule, "1"));
    Keyflow__V1__SendEventResponse *b = ok(send_flush("b", "b", rule, "2"));
    cr_assert_eq(b->disposition, D(CLOSED));
    cr_assert(b->run_started);
    cr_assert_str_eq(b->receipt->run_id, a->receipt->run_id);
    cr_assert_eq(b->receipt->due_ms, sim.now_ms, "due at once");
    Keyflow__V1__PollRunsResponse *runs = take_runs();
    cr_assert_eq(runs->n_runs, 1);
    cr_assert_str_eq(runs->runs[0]->input_json, "[1,2]");
    /* A retry of the flushing event is a duplicate: no second flush. */
    cr_assert_eq(ok(send_flush("b", "b", rule, "2"))->disposition, D(DUPLICATE));
    cr_assert_eq(take_runs()->n_runs, 0);

    /* The first event of a debounce window, flushing: a run of one. */
    Keyflow__V1__SendEventResponse *d =
        ok(send_flush("d", NULL, sim_debounce(&sim, 60000, -1), "7"));
    cr_assert_eq(d->disposition, D(CLOSED));
    runs = take_runs();
    cr_assert_eq(runs->n_runs, 1);
    cr_assert_str_eq(runs->runs[0]->input_json, "7");

    /* Into a leading window that already started its run: the quiet window
     * ends (no second run), so the next event starts a run again. */
    ok(sim_send(&sim, "wf", "l", NULL, leading(60000, -1), "1"));
    cr_assert_eq(ok(send_flush("l", NULL, leading(60000, -1), "2"))->disposition, D(CLOSED));
    cr_assert_eq(take_runs()->n_runs, 1, "only the leading run");
    cr_assert_null(describe('d', "l")->window);
    cr_assert_eq(ok(sim_send(&sim, "wf", "l", NULL, leading(60000, -1), "3"))->disposition,
                 D(CLOSED));
}

/* ---- batch max_bytes --------------------------------------------------- */

static Keyflow__V1__Rule *bytes_rule(int64_t max_bytes) {
    Keyflow__V1__Rule *r = sim_batch(&sim, 100, 60000);
    r->max_bytes_present_case = KEYFLOW__V1__RULE__MAX_BYTES_PRESENT_MAX_BYTES;
    r->max_bytes = max_bytes;
    return r;
}

Test(events, max_bytes_starts_the_window_before_its_input_would_pass_it) {
    /* "[1234]" is 6 bytes, "[1234,567]" 10: at the bound, still one window. */
    Keyflow__V1__SendEventResponse *a = ok(sim_send(&sim, "wf", "k", NULL, bytes_rule(10), "1234"));
    Keyflow__V1__SendEventResponse *b = ok(sim_send(&sim, "wf", "k", NULL, bytes_rule(10), "567"));
    cr_assert_eq(b->disposition, D(JOINED));
    cr_assert_eq(describe('b', "k")->window->input_bytes, 10);
    /* "[1234,567,8]" would be 12: the window starts, the event opens the next. */
    Keyflow__V1__SendEventResponse *c = ok(sim_send(&sim, "wf", "k", NULL, bytes_rule(10), "8"));
    cr_assert_eq(c->disposition, D(OPENED));
    cr_assert_str_neq(c->receipt->run_id, a->receipt->run_id);
    Keyflow__V1__PollRunsResponse *runs = take_runs();
    cr_assert_eq(runs->n_runs, 1);
    cr_assert_str_eq(runs->runs[0]->input_json, "[1234,567]");
    Keyflow__V1__DescribeCoordinatorResponse *d = describe('b', "k");
    cr_assert_eq(d->window->rule->max_bytes, 10);
    bool size = false;
    for (size_t i = 0; i < d->n_journal; i++) {
        size = size || strstr(d->journal[i]->detail, "reason=size") != NULL;
    }
    cr_assert(size, "journalled as reason size");
}

Test(events, an_input_that_cannot_fit_max_bytes_is_refused) {
    uint64_t writes = kf_memdisk_writes(sim.disk);
    kf_cmd_t *c = sim_send(&sim, "wf", "k", NULL, bytes_rule(10), "123456789");
    cr_assert_eq(c->error.status, KF_E_INVALID, "%s", c->error.message);
    cr_assert(strstr(c->error.message, "event.rule.max_bytes") != NULL, "%s", c->error.message);
    cr_assert_eq(kf_memdisk_writes(sim.disk), writes);
    cr_assert_not(describe('b', "k")->exists);
    /* Exactly at the bound fits: "[12345678]" is 10 bytes. */
    ok(sim_send(&sim, "wf", "k", NULL, bytes_rule(10), "12345678"));
}

/* ---- SendEvents -------------------------------------------------------- */

static Keyflow__V1__SendEventsRequest *many(size_t n) {
    Keyflow__V1__SendEventsRequest *req = kf_arena_zalloc(&sim.arena, sizeof *req);
    keyflow__v1__send_events_request__init(req);
    req->events = kf_arena_zalloc(&sim.arena, (n + 1) * sizeof *req->events);
    return req;
}

static void add(Keyflow__V1__SendEventsRequest *req, const char *key, const char *id,
                Keyflow__V1__Rule *rule, const char *input) {
    req->events[req->n_events++] =
        sim_send_request(&sim, "wf", key, sim_event(&sim, id, rule, input));
}

#define RESULT(cmd, i) (((Keyflow__V1__SendEventsResponse *)(cmd)->response)->results[i])

Test(events, send_events_answers_every_event_in_order_from_one_write) {
    Keyflow__V1__Rule *pair = sim_batch(&sim, 2, 60000);
    Keyflow__V1__SendEventResponse *known = ok(sim_send(&sim, "wf", "k3", "e-1", pair, "1"));
    Keyflow__V1__SendEventsRequest *req = many(7);
    add(req, "k1", NULL, pair, "\"a\"");
    add(req, "k2", NULL, sim_debounce(&sim, 1000, -1), "\"b\"");
    add(req, "k1", NULL, pair, "\"c\""); /* the same key again: it fills k1's window */
    add(req, "", NULL, pair, "1");       /* refused: no key */
    add(req, "k3", "e-1", pair, "2");    /* refused: another payload */
    add(req, "k3", "e-1", pair, "1");    /* a duplicate */
    add(req, "k4", NULL, leading(1000, -1), "\"d\"");
    uint64_t writes = kf_memdisk_writes(sim.disk);
    kf_cmd_t *cmd = sim_exec(&sim, KF_OP_SEND_EVENTS, &req->base);
    cr_assert_eq(cmd->error.status, KF_OK, "%s", cmd->error.message);
    cr_assert_eq(kf_memdisk_writes(sim.disk), writes + 1, "every event in one write");
    Keyflow__V1__SendEventsResponse *resp = (Keyflow__V1__SendEventsResponse *)cmd->response;
    cr_assert_eq(resp->n_results, 7);
    const int want[] = {D(OPENED), D(OPENED), D(CLOSED), -1, -1, D(DUPLICATE), D(CLOSED)};
    int64_t seq = 0;
    for (size_t i = 0; i < 7; i++) {
        Keyflow__V1__SendEventsResult *r = resp->results[i];
        if (want[i] < 0) {
            cr_assert_eq(r->outcome_case, KEYFLOW__V1__SEND_EVENTS_RESULT__OUTCOME_ERROR, "%zu", i);
            continue;
        }
        cr_assert_eq(r->outcome_case, KEYFLOW__V1__SEND_EVENTS_RESULT__OUTCOME_RESPONSE, "%zu", i);
        cr_assert_eq((int)r->response->disposition, want[i], "event %zu", i);
        if (want[i] != D(DUPLICATE)) {
            seq = seq ? seq : r->response->receipt->commit_seq;
            cr_assert_eq(r->response->receipt->commit_seq, seq, "one write, one sequence");
        }
    }
    cr_assert_gt(seq, known->receipt->commit_seq);
    cr_assert_str_eq(RESULT(cmd, 2)->response->receipt->run_id,
                     RESULT(cmd, 0)->response->receipt->run_id);
    Keyflow__V1__EventError *e = RESULT(cmd, 3)->error;
    cr_assert_eq(e->code, 3);
    cr_assert_str_eq(e->status, "INVALID_ARGUMENT");
    cr_assert(strstr(e->message, "key") != NULL, "%s", e->message);
    e = RESULT(cmd, 4)->error;
    cr_assert_eq(e->code, 6);
    cr_assert_str_eq(e->status, "ALREADY_EXISTS");
    cr_assert_str_eq(RESULT(cmd, 5)->response->receipt->run_id, known->receipt->run_id);
    /* Durable: after a crash every accepted event is there. */
    sim_crash(&sim);
    cr_assert_eq(describe('d', "k2")->window->event_count, 1);
    cr_assert(describe('d', "k4")->window->run_started);
    Keyflow__V1__PollRunsResponse *runs = take_runs();
    cr_assert_eq(runs->n_runs, 2, "k1's filled batch and k4's leading run");
    cr_assert_eq(describe('b', "k3")->window->event_count, 1,
                 "the refused and duplicate added none");
}

Test(events, send_events_takes_at_most_the_bound) {
    Keyflow__V1__SendEventsRequest *req = many(KF_SEND_EVENTS_MAX + 1);
    Keyflow__V1__Rule *rule = sim_batch(&sim, 100, 60000);
    for (int i = 0; i <= KF_SEND_EVENTS_MAX; i++) {
        add(req, "k", NULL, rule, "1");
    }
    uint64_t writes = kf_memdisk_writes(sim.disk);
    kf_cmd_t *cmd = sim_exec(&sim, KF_OP_SEND_EVENTS, &req->base);
    cr_assert_eq(cmd->error.status, KF_E_INVALID);
    cr_assert(strstr(cmd->error.message, "events: at most 1000") != NULL, "%s", cmd->error.message);
    cr_assert_eq(kf_memdisk_writes(sim.disk), writes);
    req->n_events = KF_SEND_EVENTS_MAX;
    cmd = sim_exec(&sim, KF_OP_SEND_EVENTS, &req->base);
    cr_assert_eq(cmd->error.status, KF_OK, "%s", cmd->error.message);
    cr_assert_null(describe('b', "k")->window, "ten full batches of 100");
    cr_assert_eq(take_runs()->n_runs, 10);
    /* An empty call is answered with no results. */
    cmd = sim_exec(&sim, KF_OP_SEND_EVENTS, &many(0)->base);
    cr_assert_eq(cmd->error.status, KF_OK);
    cr_assert_eq(((Keyflow__V1__SendEventsResponse *)cmd->response)->n_results, 0);
}

/* Near the disk reserve a group takes new writes only into the room its
 * engine may still write (kf_core_set_disk_room: the free space above the
 * reserve, its partition's share, less what its committer still writes):
 * each is admitted while the group holds less than that, so the group
 * passes the room by its last write at most. It used to admit writes up to
 * a whole group (64 MiB) whenever the last measure was above the reserve.
 * Reads go on; with the room measured again, the next group admits. */
Test(events, a_group_admits_new_writes_only_into_the_room_above_the_reserve) {
    enum { INPUT_BYTES = 100 * 1024, ROOM_BYTES = 512 * 1024 };
    char *input = kf_arena_new(&sim.arena, INPUT_BYTES + 3);
    input[0] = '"';
    memset(input + 1, 'x', INPUT_BYTES);
    strcpy(input + 1 + INPUT_BYTES, "\"");
    ok(sim_send(&sim, "wf", "first", NULL, sim_debounce(&sim, 60000, -1), input));
    size_t one_write = sim.step_bytes; /* what each event below writes, about */
    kf_core_set_disk_room(sim.core, ROOM_BYTES);
    sim.hold_group = true;
    int admitted = 0, refused = 0;
    for (int i = 0; i < 20; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%d", i);
        kf_cmd_t *cmd = sim_send(&sim, "wf", key, NULL, sim_debounce(&sim, 60000, -1), input);
        if (cmd->error.status == KF_OK) {
            cr_assert_eq(refused, 0, "event %d admitted after a refusal", i);
            admitted++;
            continue;
        }
        cr_assert_eq(cmd->error.status, KF_E_NO_SPACE, "%s", cmd->error.message);
        cr_assert(strstr(cmd->error.message, "disk reserve reached") != NULL, "%s",
                  cmd->error.message);
        cr_assert(strstr(cmd->error.message, "--disk-reserve") != NULL, "%s", cmd->error.message);
        refused++;
    }
    cr_assert_eq(describe('d', "k0")->window->event_count, 1, "reads go on");
    sim.hold_group = false;
    sim_step(&sim);
    cr_assert_gt(admitted, 1);
    cr_assert_gt(refused, 0, "20 events of 100 KB in a room of 512 KiB");
    cr_assert_geq(sim.step_bytes, ROOM_BYTES);
    cr_assert_lt(sim.step_bytes, ROOM_BYTES + one_write + one_write / 10,
                 "past the room by one write at most");
    cr_assert_null(describe('d', "k19")->window, "a refused event changed nothing");
    kf_core_set_disk_room(sim.core, ROOM_BYTES);
    ok(sim_send(&sim, "wf", "k19", NULL, sim_debounce(&sim, 60000, -1), input));
}
