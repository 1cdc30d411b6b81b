/*
 * test_coord_store.c - coordinators on disk (coord/coord.c, "Layout"): a
 * store of format 1 written by the previous build is upgraded and keeps
 * working; recovery reads only the index; commands in one group read each
 * other's records before the group is written; remembered IDs stay exact
 * at the cap whatever their expiries.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bytes.h"
#include "coord/window.h"
#include "sim.h"
#include "storage/keys.h"

static sim_t sim;
static void setup(void) {
    sim_open(&sim, 7);
}
static void teardown(void) {
    sim_close(&sim);
}

TestSuite(coord_store, .init = setup, .fini = teardown, .timeout = 60);

#define D(x)  KEYFLOW__V1__DISPOSITION__DISPOSITION_##x
#define ST(x) KEYFLOW__V1__RUN_STATUS__RUN_STATUS_##x

static Keyflow__V1__SendEventResponse *ok(kf_cmd_t *cmd) {
    cr_assert_eq(cmd->error.status, KF_OK, "%s", cmd->error.message);
    return SEND_RESP(cmd);
}

static Keyflow__V1__DescribeCoordinatorResponse *describe(int kind, const char *key) {
    kf_cmd_t *c = sim_describe(&sim, kind, "wf", key);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    return DESCRIBE_RESP(c);
}

static Keyflow__V1__PollRunsResponse *take_runs(void) {
    kf_cmd_t *p = sim_poll(&sim, "wf", 60000, 100, 0);
    cr_assert_eq(p->error.status, KF_OK, "%s", p->error.message);
    return POLL_RESP(p);
}

static const Keyflow__V1__Run *find_run(const Keyflow__V1__PollRunsResponse *runs,
                                        const char *run_id) {
    for (size_t i = 0; i < runs->n_runs; i++) {
        if (strcmp(runs->runs[i]->run_id, run_id) == 0) {
            return runs->runs[i];
        }
    }
    cr_assert_fail("no run %s among %zu", run_id, runs->n_runs);
    return NULL;
}

/* ---- a store of format 1 ----------------------------------------------------
 *
 * Written by keyflowd at ea649e1 (the last build of format 1) through its
 * engine core, at PREV_NOW, then every coordinator record dumped as it was:
 *   d     debounce 60 s (the last event's max_wait 120 s): {"n":1} id d-1,
 *         {"n":2}, {"n":3} id d-3, 10 ms apart; open
 *   b     batch of 10 / 60 s: {"a":1} id b-1, 2, "x" id b-3; open
 *   l     debounce, one event id l-1, flushed: no window, l-1 remembered
 *   lead  debounce LEADING: its run started at the first event, the second
 *         absorbed; open
 *   c     258 debounce events (ids c-250 .. c-257 on the last eight): a
 *         snapshot at 256 entries and two journal entries after it */
static const struct {
    kf_cf_t cf;
    const char *key;
    const char *value;
} prev_records[] = {
    {KF_CF_COORD_SNAPSHOTS, "0100027766000163",
     "08800212790a2430316132333237332d613337632d373030302d396164652d6631636562353439366531"
     "3710fcc6ce93a33418fcc6ce93a33420dc9bd293a3342a0c080110e0d40328c0cf243001320130388002"
     "5205632d3235305205632d3235315205632d3235325205632d3235335205632d3235345205632d323535"
     "1a500a05632d323530122430316132333237332d613337632d373030302d396164652d66316365623534"
     "393665313718dc9bd293a33420bc96f393a3342a10d58787d9054fa36cb98ce141908d22183085021a50"
     "0a05632d323531122430316132333237332d613337632d373030302d396164652d663163656235343936"
     "65313718dc9bd293a33420bc96f393a3342a10d58787d9054fa36cb98ce141908d22183086021a500a05"
     "632d323532122430316132333237332d613337632d373030302d396164652d6631636562353439366531"
     "3718dc9bd293a33420bc96f393a3342a10d58787d9054fa36cb98ce141908d22183087021a500a05632d"
     "323533122430316132333237332d613337632d373030302d396164652d66316365623534393665313718"
     "dc9bd293a33420bc96f393a3342a10d58787d9054fa36cb98ce141908d22183088021a500a05632d3235"
     "34122430316132333237332d613337632d373030302d396164652d66316365623534393665313718dc9b"
     "d293a33420bc96f393a3342a10d58787d9054fa36cb98ce141908d22183089021a500a05632d32353512"
     "2430316132333237332d613337632d373030302d396164652d66316365623534393665313718dc9bd293"
     "a33420bc96f393a3342a10d58787d9054fa36cb98ce141908d2218308a023001"},
    {KF_CF_COORD_JOURNAL, "01000277660001630000000000000100",
     "08800210fcc6ce93a3341a5a0a05632d323536120c080110e0d40328c0cf2430011a0130222430316132"
     "333237332d613337632d373030302d396164652d66316365623534393665313730dc9bd293a3343a10d5"
     "8787d9054fa36cb98ce141908d2218408b02"},
    {KF_CF_COORD_JOURNAL, "01000277660001630000000000000101",
     "08810210fcc6ce93a3341a5a0a05632d323537120c080110e0d40328c0cf2430011a0130222430316132"
     "333237332d613337632d373030302d396164652d66316365623534393665313730dc9bd293a3343a10d5"
     "8787d9054fa36cb98ce141908d2218408c02"},
    {KF_CF_COORD_JOURNAL, "01000277660001640000000000000000",
     "10e8c6ce93a3341a5f0a03642d31120c080110e0d40328c0cf2430011a077b226e223a317d2224303161"
     "32333237332d613336382d373030302d386530352d643635363233373266396266280130c89bd293a334"
     "3a1054dfdceb17f040079ab2379cc9bf242c4001"},
    {KF_CF_COORD_JOURNAL, "01000277660001640000000000000001",
     "080110f2c6ce93a3341a46120c080110e0d40328c0cf2430011a077b226e223a327d2224303161323332"
     "37332d613336382d373030302d386530352d64363536323337326639626630d29bd293a3344002"},
    {KF_CF_COORD_JOURNAL, "01000277660001640000000000000002",
     "080210fcc6ce93a3341a610a03642d331210080110e0d40318c0a90728c0cf2430011a077b226e223a33"
     "7d222430316132333237332d613336382d373030302d386530352d64363536323337326639626630dc9b"
     "d293a3343a10bfad407b359e48cabe8a5bc328701feb4003"},
    {KF_CF_COORD_JOURNAL, "010002776600016c0000000000000000",
     "10fcc6ce93a3341a590a036c2d31120c080110e0d40328c0cf2430011a0137222430316132333237332d"
     "613337632d373030302d393933352d653330646363663935323832280130dc9bd293a3343a10cb9f1800"
     "9ee03b34dc363ea21409484d4007"},
    {KF_CF_COORD_JOURNAL, "010002776600016c0000000000000001",
     "080110fcc6ce93a334222d0a2430316132333237332d613337632d373030302d393933352d6533306463"
     "636639353238321205666c757368"},
    {KF_CF_COORD_JOURNAL, "010002776600046c6561640000000000000000",
     "10fcc6ce93a3341a42120c080110e0d40328c0cf2430021a0131222430316132333237332d613337632d"
     "373030302d626665352d626565666265366531353038280130dc9bd293a3344009"},
    {KF_CF_COORD_JOURNAL, "010002776600046c6561640000000000000001",
     "080110fcc6ce93a33422330a2430316132333237332d613337632d373030302d626665352d6265656662"
     "6536653135303812076c656164696e6718012001"},
    {KF_CF_COORD_JOURNAL, "010002776600046c6561640000000000000002",
     "080210fcc6ce93a3341a3f120c080110e0d40328c0cf243002222430316132333237332d613337632d37"
     "3030302d626665352d62656566626536653135303830dc9bd293a334400a4801"},
    {KF_CF_COORD_JOURNAL, "02000277660001620000000000000000",
     "10fcc6ce93a3341a660a03622d311213080218e0d403200a28c0cf24300138808080021a077b2261223a"
     "317d222430316132333237332d613337632d373030302d393930372d6162343536636135353536642801"
     "30dc9bd293a3343a10193e8e19d714ccf6d90cfe96dc14eee54004"},
    {KF_CF_COORD_JOURNAL, "02000277660001620000000000000001",
     "080110fcc6ce93a3341a471213080218e0d403200a28c0cf24300138808080021a013222243031613233"
     "3237332d613337632d373030302d393930372d61623435366361353535366430dc9bd293a3344005"},
    {KF_CF_COORD_JOURNAL, "02000277660001620000000000000002",
     "080210fcc6ce93a3341a600a03622d331213080218e0d403200a28c0cf24300138808080021a03227822"
     "222430316132333237332d613337632d373030302d393930372d61623435366361353535366430dc9bd2"
     "93a3343a104d2e8e2cdb4dce1a033ee6609862392d4006"},
    {KF_CF_WAKEUPS, "010100027766000163", "800001a232748ddc"},
    {KF_CF_WAKEUPS, "010100027766000164", "800001a232748dc8"},
    {KF_CF_WAKEUPS, "01010002776600016c", "800001a232748ddc"},
    {KF_CF_WAKEUPS, "01010002776600046c656164", "800001a232748ddc"},
    {KF_CF_WAKEUPS, "010200027766000162", "800001a232748ddc"},
};

#define PREV_NOW      INT64_C(1796142769000)
#define PREV_D_RUN    "d@01a23273-a368-7000-8e05-d6562372f9bf"
#define PREV_B_RUN    "b@01a23273-a37c-7000-9907-ab456ca5556d"
#define PREV_L_RUN    "l@01a23273-a37c-7000-9935-e30dccf95282"
#define PREV_LEAD_RUN "lead@01a23273-a37c-7000-bfe5-beefbe6e1508"
#define PREV_C_RUN    "c@01a23273-a37c-7000-9ade-f1ceb5496e17"

static size_t unhex(const char *hex, uint8_t *out, size_t cap) {
    size_t n = strlen(hex) / 2;
    cr_assert(n <= cap);
    for (size_t i = 0; i < n; i++) {
        unsigned byte;
        cr_assert_eq(sscanf(hex + 2 * i, "%2x", &byte), 1);
        out[i] = (uint8_t)byte;
    }
    return n;
}

static void put_format_version(uint32_t version) {
    uint8_t v[4];
    kf_put_be32(v, version);
    sim_put_raw(&sim, KF_CF_META, "format_version", 14, v, sizeof v);
}

static void put_prev_store(void) {
    for (size_t i = 0; i < sizeof prev_records / sizeof prev_records[0]; i++) {
        uint8_t k[256], v[2048];
        size_t kl = unhex(prev_records[i].key, k, sizeof k);
        size_t vl = unhex(prev_records[i].value, v, sizeof v);
        sim_put_raw(&sim, prev_records[i].cf, k, kl, v, vl);
    }
    put_format_version(1);
}

static void check_prev_coordinators(void) {
    Keyflow__V1__DescribeCoordinatorResponse *d = describe('d', "d");
    cr_assert(d->exists && d->window != NULL);
    cr_assert_str_eq(d->window->run_id, PREV_D_RUN);
    cr_assert_eq(d->window->event_count, 3);
    cr_assert_eq(d->window->opened_ms, PREV_NOW);
    cr_assert_eq(d->window->last_ms, PREV_NOW + 20);
    cr_assert_eq(d->window->due_ms, PREV_NOW + 60020);
    cr_assert_eq(d->window->rule->max_wait_ms, 120000);
    cr_assert_eq(d->window->input_bytes, 7, "{\"n\":3}");
    cr_assert_eq(d->n_remembered_ids, 2);
    cr_assert_str_eq(d->remembered_ids[0]->id, "d-1");
    cr_assert_str_eq(d->remembered_ids[1]->id, "d-3");
    cr_assert_eq(d->journal_length, 3);
    cr_assert_eq(d->n_journal, 3, "the journal moved with it");

    d = describe('b', "b");
    cr_assert(d->exists && d->window != NULL);
    cr_assert_str_eq(d->window->run_id, PREV_B_RUN);
    cr_assert_eq(d->window->event_count, 3);
    cr_assert_eq(d->window->input_bytes, (int64_t)strlen("[{\"a\":1},2,\"x\"]"));
    cr_assert_eq(d->n_remembered_ids, 2);

    d = describe('d', "l");
    cr_assert(d->exists);
    cr_assert_null(d->window);
    cr_assert_eq(d->runs_started, 1);
    cr_assert_eq(d->n_recent_run_ids, 1);
    cr_assert_str_eq(d->recent_run_ids[0], PREV_L_RUN);
    cr_assert_eq(d->n_remembered_ids, 1);
    cr_assert_str_eq(d->remembered_ids[0]->id, "l-1");

    d = describe('d', "lead");
    cr_assert(d->window != NULL && d->window->run_started);
    cr_assert_eq(d->window->events_absorbed, 1);
    cr_assert_str_eq(d->recent_run_ids[0], PREV_LEAD_RUN);

    d = describe('d', "c");
    cr_assert_eq(d->journal_length, 2);
    cr_assert_eq(d->journal_seq, 258);
    cr_assert_eq(d->compactions, 1);
    cr_assert_eq(d->n_journal, 2);
    cr_assert_eq(d->window->event_count, 258);
    cr_assert_eq(d->n_remembered_ids, 8);
    cr_assert_str_eq(d->remembered_ids[0]->id, "c-250");
    cr_assert_str_eq(d->remembered_ids[7]->id, "c-257");
}

Test(coord_store, a_store_of_format_1_is_upgraded_and_keeps_working) {
    put_prev_store();
    sim.now_ms = PREV_NOW + 1000;
    sim_crash(&sim); /* opens the store as a restart would */
    cr_assert_eq(kf_store_format_version(sim.store), 1, "opened as found");
    cr_assert_eq(sim_count_raw(&sim, KF_CF_COORD_SNAPSHOTS), 0, "format 1's records are gone");
    cr_assert_eq(sim_count_raw(&sim, KF_CF_COORD_JOURNAL), 0);
    cr_assert_eq(sim_count_raw(&sim, KF_CF_WAKEUPS), 0);
    cr_assert_eq(sim_count_raw(&sim, KF_CF_COORD_INDEX), 5);
    check_prev_coordinators();
    sim_crash(&sim);
    cr_assert_eq(kf_store_format_version(sim.store), KF_STORE_FORMAT_VERSION, "recorded");
    check_prev_coordinators();

    /* The windows go on: GetRun sees d's; a retry of d-1 is a duplicate;
     * b takes more events and closes with all of them. */
    kf_cmd_t *g = sim_get(&sim, PREV_D_RUN);
    cr_assert_eq(g->error.status, KF_OK, "%s", g->error.message);
    cr_assert_eq(RUN_RESP(g)->status, ST(WINDOW_OPEN));
    cr_assert_eq(RUN_RESP(g)->event_count, 3);
    Keyflow__V1__SendEventResponse *r =
        ok(sim_send(&sim, "wf", "d", "d-1", sim_debounce(&sim, 60000, 0), "{\"n\":1}"));
    cr_assert_eq(r->disposition, D(DUPLICATE));
    cr_assert_str_eq(r->receipt->run_id, PREV_D_RUN);
    r = ok(sim_send(&sim, "wf", "b", "b-4", sim_batch(&sim, 10, 60000), "4"));
    cr_assert_eq(r->disposition, D(JOINED));
    cr_assert_str_eq(r->receipt->run_id, PREV_B_RUN);
    cr_assert_eq(sim_flush(&sim, 'b', "wf", "b")->error.status, KF_OK);
    cr_assert_eq(sim_flush(&sim, 'd', "wf", "d")->error.status, KF_OK);
    Keyflow__V1__PollRunsResponse *runs = take_runs();
    const Keyflow__V1__Run *b = find_run(runs, PREV_B_RUN);
    cr_assert_str_eq(b->input_json, "[{\"a\":1},2,\"x\",4]");
    cr_assert_eq(b->event_count, 4);
    cr_assert_eq(b->n_event_ids, 3);
    cr_assert_str_eq(b->event_ids[0], "b-1");
    cr_assert_str_eq(b->event_ids[2], "b-4");
    const Keyflow__V1__Run *d = find_run(runs, PREV_D_RUN);
    cr_assert_str_eq(d->input_json, "{\"n\":3}");
    cr_assert_eq(d->n_event_ids, 2);
    cr_assert_str_eq(d->event_ids[1], "d-3");
    /* The leading window absorbs until its due time, then ends. */
    sim_advance(&sim, PREV_NOW + 60020);
    cr_assert_null(describe('d', "lead")->window);
    cr_assert_null(describe('d', "c")->window, "c closed at its due time");
    (void)PREV_C_RUN;
}

Test(coord_store, a_failed_upgrade_write_changes_nothing_and_the_next_start_finishes_it) {
    put_prev_store();
    sim.now_ms = PREV_NOW + 1000;
    kf_mem_faults_t faults = {.fail_write_at = 1}; /* the upgrade's write */
    kf_error_t err;
    kf_status_t st = sim_restart_faulty(&sim, &faults, &err);
    cr_assert_eq(st, KF_E_IO, "%s", err.message);
    cr_assert_eq(sim_count_raw(&sim, KF_CF_COORD_SNAPSHOTS), 1, "nothing rewritten");
    cr_assert_eq(sim_count_raw(&sim, KF_CF_COORD_INDEX), 0);
    st = sim_restart_status(&sim, &err);
    cr_assert_eq(st, KF_OK, "%s", err.message);
    check_prev_coordinators();
}

/* ---- format 2 ---------------------------------------------------------------- */

/* Recovery rebuilds memory from the index without reading a state: an
 * undecodable state record is found only when its coordinator is used. */
Test(coord_store, recovery_reads_the_index_only) {
    ok(sim_send(&sim, "wf", "a", "", sim_debounce(&sim, 60000, 0), "1"));
    ok(sim_send(&sim, "wf", "z", "", sim_debounce(&sim, 60000, 0), "2"));
    cr_assert_eq(sim_count_raw(&sim, KF_CF_COORD_INDEX), 2);
    kf_iter_t *it;
    kf_error_t err;
    cr_assert_eq(kf_iter_create(sim.store, KF_CF_COORD_STATE, NULL, 0, NULL, 0, &it, &err), KF_OK);
    kf_iter_seek_first(it);
    cr_assert(kf_iter_valid(it));
    size_t kl;
    uint8_t key[KF_COORD_ID_BYTES];
    memcpy(key, kf_iter_key(it, &kl), sizeof key);
    kf_iter_destroy(it);
    sim_put_raw(&sim, KF_CF_COORD_STATE, key, sizeof key, "\xff\xff\xff", 3);
    sim_crash(&sim);
    /* One of the two is unreadable; the other works. */
    kf_cmd_t *da = sim_describe(&sim, 'd', "wf", "a");
    kf_cmd_t *dz = sim_describe(&sim, 'd', "wf", "z");
    kf_cmd_t *bad = da->error.status != KF_OK ? da : dz;
    kf_cmd_t *good = bad == da ? dz : da;
    cr_assert_eq(bad->error.status, KF_E_CORRUPT);
    cr_assert(strstr(bad->error.message, "coord_state") != NULL, "%s", bad->error.message);
    cr_assert_eq(good->error.status, KF_OK, "%s", good->error.message);
    cr_assert(DESCRIBE_RESP(good)->window != NULL);
}

/* A journal entry that does not decode is corruption: DescribeCoordinator
 * fails naming it (it used to be skipped without a word). */
Test(coord_store, an_undecodable_journal_entry_fails_describe) {
    ok(sim_send(&sim, "wf", "j", "", sim_debounce(&sim, 60000, 0), "1"));
    kf_cmd_t *d = sim_describe(&sim, 'd', "wf", "j");
    cr_assert_eq(d->error.status, KF_OK, "%s", d->error.message);
    cr_assert_gt(DESCRIBE_RESP(d)->n_journal, 0);
    kf_iter_t *it;
    kf_error_t err;
    cr_assert_eq(kf_iter_create(sim.store, KF_CF_COORD_HISTORY, NULL, 0, NULL, 0, &it, &err),
                 KF_OK);
    kf_iter_seek_first(it);
    cr_assert(kf_iter_valid(it));
    size_t kl;
    uint8_t key[KF_STORE_KEY_BYTES_MAX];
    const void *k = kf_iter_key(it, &kl);
    cr_assert(kl <= sizeof key);
    memcpy(key, k, kl);
    kf_iter_destroy(it);
    sim_put_raw(&sim, KF_CF_COORD_HISTORY, key, kl, "\xff\xff\xff", 3);
    d = sim_describe(&sim, 'd', "wf", "j");
    cr_assert_eq(d->error.status, KF_E_CORRUPT, "%s", d->error.message);
    cr_assert(strstr(d->error.message, "coord_history") != NULL, "%s", d->error.message);
    cr_assert(strstr(d->error.message, "does not decode") != NULL, "%s", d->error.message);
}

/* Commands of one group read what the ones before them wrote, before the
 * group is written (the engine's overlay). */
Test(coord_store, commands_in_one_group_see_each_other_before_it_is_written) {
    sim.hold_group = true;
    Keyflow__V1__Rule *rule = sim_batch(&sim, 10, 60000);
    Keyflow__V1__SendEventResponse *a = ok(sim_send(&sim, "wf", "k", "e-1", rule, "1"));
    ok(sim_send(&sim, "wf", "k", "e-2", rule, "2"));
    cr_assert_eq(sim_count_raw(&sim, KF_CF_COORD_STATE), 0, "nothing written yet");
    Keyflow__V1__DescribeCoordinatorResponse *d = describe('b', "k");
    cr_assert_eq(d->window->event_count, 2);
    cr_assert_eq(d->n_remembered_ids, 2);
    kf_cmd_t *g = sim_get(&sim, a->receipt->run_id);
    cr_assert_eq(g->error.status, KF_OK, "%s", g->error.message);
    cr_assert_eq(RUN_RESP(g)->status, ST(WINDOW_OPEN));
    Keyflow__V1__SendEventResponse *dup = ok(sim_send(&sim, "wf", "k", "e-1", rule, "1"));
    cr_assert_eq(dup->disposition, D(DUPLICATE));
    cr_assert_eq(sim_flush(&sim, 'b', "wf", "k")->error.status, KF_OK);
    sim.hold_group = false;
    sim_step(&sim);
    Keyflow__V1__PollRunsResponse *runs = take_runs();
    cr_assert_eq(runs->n_runs, 1);
    cr_assert_str_eq(runs->runs[0]->input_json, "[1,2]");
    cr_assert_eq(runs->runs[0]->n_event_ids, 2);
}

/* At the cap the oldest live ID goes, whatever the expiries of the others:
 * with two dedup spans, expired IDs sit between live ones. */
Test(coord_store, the_cap_forgets_the_oldest_live_id_when_expiries_interleave) {
    char id[32];
    for (int i = 0; i < KF_REMEMBERED_IDS_MAX; i++) {
        Keyflow__V1__Rule *rule = sim_debounce(&sim, 3600000, 0);
        rule->dedup_ms_present_case = KEYFLOW__V1__RULE__DEDUP_MS_PRESENT_DEDUP_MS;
        rule->dedup_ms = i % 2 ? 1000 : 600000;
        snprintf(id, sizeof id, "e-%d", i);
        ok(sim_send(&sim, "wf", "k", id, rule, "1"));
    }
    sim_advance(&sim, sim.now_ms + 1500); /* the odd ones expire */
    cr_assert_eq(describe('d', "k")->n_remembered_ids, KF_REMEMBERED_IDS_MAX / 2);
    for (int i = KF_REMEMBERED_IDS_MAX; i < KF_REMEMBERED_IDS_MAX + 600; i++) {
        snprintf(id, sizeof id, "e-%d", i);
        ok(sim_send(&sim, "wf", "k", id, sim_debounce(&sim, 3600000, 0), "1"));
    }
    /* 512 live + 600 new: the 88 oldest live (e-0, e-2, ... e-174) went. */
    Keyflow__V1__DescribeCoordinatorResponse *d = describe('d', "k");
    cr_assert_eq(d->n_remembered_ids, KF_REMEMBERED_IDS_MAX);
    cr_assert_str_eq(d->remembered_ids[0]->id, "e-176");
    Keyflow__V1__Rule *rule = sim_debounce(&sim, 3600000, 0);
    rule->dedup_ms_present_case = KEYFLOW__V1__RULE__DEDUP_MS_PRESENT_DEDUP_MS;
    rule->dedup_ms = 600000;
    cr_assert_eq(ok(sim_send(&sim, "wf", "k", "e-176", rule, "1"))->disposition, D(DUPLICATE));
    cr_assert_eq(ok(sim_send(&sim, "wf", "k", "e-174", rule, "1"))->disposition, D(JOINED),
                 "forgotten");
    sim_crash(&sim);
    d = describe('d', "k");
    cr_assert_eq(d->n_remembered_ids, KF_REMEMBERED_IDS_MAX);
    cr_assert_str_eq(d->remembered_ids[0]->id, "e-178", "e-174 came back and e-176 went");
}

/* A coordinator whose events keep coming always has a live ID, so it is
 * never deleted; its expired IDs must still go. Events 100 ms apart with a
 * dedup span of 1 s: about 10 live at any time. Without the sweep every
 * expired ID stayed until the cap (1024 records by seq, 1024 by name). */
Test(coord_store, expired_ids_of_a_busy_coordinator_are_deleted_before_the_cap) {
    enum { EVENTS = 600, STEP_MS = 100, DEDUP_MS = 1000 };
    char id[32];
    for (int i = 0; i < EVENTS; i++) {
        Keyflow__V1__Rule *rule = sim_debounce(&sim, 50, 0);
        rule->dedup_ms_present_case = KEYFLOW__V1__RULE__DEDUP_MS_PRESENT_DEDUP_MS;
        rule->dedup_ms = DEDUP_MS;
        snprintf(id, sizeof id, "e-%d", i);
        ok(sim_send(&sim, "wf", "k", id, rule, "1"));
        sim_advance(&sim, sim.now_ms + STEP_MS);
    }
    size_t live = describe('d', "k")->n_remembered_ids;
    cr_assert_leq(live, DEDUP_MS / STEP_MS + 1);
    /* Two records per remembered ID, a recent-runs record, and the window's
     * event if one is open. */
    size_t most = 2 * (KF_REMEMBERED_IDS_SWEEP_EVERY + live) + 2;
    size_t items = sim_count_raw(&sim, KF_CF_COORD_ITEMS);
    cr_assert_leq(items, most, "%zu records for %zu live IDs", items, live);
    /* Dedup is what it was: the newest ID answers DUPLICATE, one past its
     * span joins as new, and so does one the sweep deleted. */
    Keyflow__V1__Rule *rule = sim_debounce(&sim, 50, 0);
    rule->dedup_ms_present_case = KEYFLOW__V1__RULE__DEDUP_MS_PRESENT_DEDUP_MS;
    rule->dedup_ms = DEDUP_MS;
    snprintf(id, sizeof id, "e-%d", EVENTS - 1);
    cr_assert_eq(ok(sim_send(&sim, "wf", "k", id, rule, "1"))->disposition, D(DUPLICATE));
    snprintf(id, sizeof id, "e-%d", EVENTS - 2 * DEDUP_MS / STEP_MS);
    cr_assert_neq(ok(sim_send(&sim, "wf", "k", id, rule, "1"))->disposition, D(DUPLICATE));
    cr_assert_neq(ok(sim_send(&sim, "wf", "k", "e-0", rule, "1"))->disposition, D(DUPLICATE));
    /* What the sweeps left is consistent after a restart. */
    sim_crash(&sim);
    cr_assert_eq(describe('d', "k")->n_remembered_ids, live + 2);
    cr_assert_eq(ok(sim_send(&sim, "wf", "k", "e-0", rule, "1"))->disposition, D(DUPLICATE));
}
