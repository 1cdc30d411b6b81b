/*
 * test_steps.c - what one step of a process function may do, and the steps
 * the engine runs by itself:
 *   - the per-step limits (input rows and bytes, output rows and bytes,
 *     timer callbacks) give the same verdict for the same rows whether they
 *     share one key (several handler calls) or spread over many (one call);
 *   - max_state_bytes counts keys, values and timers;
 *   - due timers past max_timer_callbacks_per_step fire in follow-on steps,
 *     in order, each atomic, with later batches of the function waiting and
 *     other work going on; GetFunction counts them; a crash in between
 *     loses nothing; a refused follow-on step is reported and stops them;
 *   - timers by name (timer_names.so): cancel by name, and the
 *     (at_us, key, name) order of timers due together.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "fn_harness.h"

TestSuite(steps, .init = fnh_setup, .fini = fnh_teardown, .timeout = 60);

#define ROW(k, ts, mode, amount)                                                                   \
    "{\"k\":\"" k "\",\"ts\":" #ts ",\"mode\":\"" mode "\",\"amount\":" #amount "}"

/* n rows of misbehaving's `mode`, over one key ("a") or n one-letter keys
 * ("a", "b", ...): the rows weigh the same either way. */
static char *rows_of(const char *mode, int n, bool one_key) {
    size_t cap = 64 + (size_t)n * 128;
    char *rows = kf_arena_alloc(&sim.arena, cap);
    size_t o = (size_t)snprintf(rows, cap, "[");
    for (int i = 0; i < n; i++) {
        char key[2] = {(char)(one_key ? 'a' : 'a' + i), '\0'};
        o += (size_t)snprintf(rows + o, cap - o,
                              "%s{\"k\":\"%s\",\"ts\":%d,\"mode\":\"%s\",\"amount\":1}",
                              i ? "," : "", key, 10 + i, mode);
    }
    snprintf(rows + o, cap - o, "]");
    return rows;
}

typedef struct per_step_case {
    const char *limit;
    int64_t value;
    const char *mode; /* each row's mode */
    int fits;         /* rows that fit; fits + 1 are refused */
    kf_status_t refusal;
} per_step_case_t;

/* Output rows of misbehaving's "ok": 1 byte of key text plus 8 bytes per
 * column (3 columns) = 25 bytes each, so 100 bytes hold four. Input rows of
 * "ok": key 1, ts 8, mode 2, amount 8: 19 bytes each, 76 for four. */
static const per_step_case_t per_step_cases[] = {
    {"max_input_rows", 4, "ok", 4, KF_E_TOO_LARGE},
    {"max_input_bytes", 80, "ok", 4, KF_E_TOO_LARGE},
    {"max_output_rows", 4, "ok", 4, KF_E_LIMIT},
    {"max_output_bytes", 100, "ok", 4, KF_E_LIMIT},
    {"max_output_rows", 10, "many_rows", 2, KF_E_LIMIT}, /* 5 output rows per input row */
};

/* The same rows, over one key (one handler call per row) and over as many
 * keys (one call): the same verdict, at the limit and just past it. */
Test(steps, per_step_limits_do_not_depend_on_how_keys_split_into_calls) {
    for (size_t c = 0; c < sizeof per_step_cases / sizeof per_step_cases[0]; c++) {
        const per_step_case_t *pc = &per_step_cases[c];
        for (int one_key = 0; one_key <= 1; one_key++) {
            char fid[32];
            snprintf(fid, sizeof fid, "f%zu%s", c, one_key ? "one" : "many");
            char sid[40];
            snprintf(sid, sizeof sid, "%s.state", fid);
            Keyflow__V1__FunctionDescriptor *d = fnh_descriptor(fid, sid);
            fnh_limit(d, pc->limit, pc->value);
            fnh_limit(d, "max_batch_rows", 64);
            cr_assert_eq(fnh_register(d)->error.status, KF_OK);
            kf_cmd_t *over =
                fnh_push(fid, "p", 1, rows_of(pc->mode, pc->fits + 1, one_key), INT64_MIN);
            cr_assert_eq(over->error.status, pc->refusal, "%s, %s key(s): %s: %s", pc->limit,
                         one_key ? "one" : "many", kf_status_name(over->error.status),
                         over->error.message);
            cr_assert(strstr(over->error.message, pc->limit) != NULL, "%s", over->error.message);
            cr_assert_eq(fnh_info(fid)->keys, 0, "nothing applied");
            Keyflow__V1__PushBatchResponse *ack =
                fnh_push_ok(fid, 1, rows_of(pc->mode, pc->fits, one_key), INT64_MIN);
            cr_assert_eq(ack->rows_accepted, pc->fits);
            cr_assert_eq(ack->handler_calls, one_key ? pc->fits : 1, "%s", pc->limit);
        }
    }
}

/* max_timer_callbacks_per_step bounds the callbacks of a step, whether the
 * due timers belong to one key (several names: one call each) or to many
 * keys (one call). */
Test(steps, timer_callbacks_per_step_do_not_depend_on_how_keys_split) {
    static const char *const names[] = {"a", "b", "c", "d", "e"};
    const char *rows[2] = {
        "[{\"k\":\"x\",\"ts\":1,\"op\":\"set\",\"names\":\"a,b,c,d,e\",\"at\":100}]",
        "[" /* five keys, one timer each */
        "{\"k\":\"x1\",\"ts\":1,\"op\":\"set\",\"names\":\"a\",\"at\":100},"
        "{\"k\":\"x2\",\"ts\":1,\"op\":\"set\",\"names\":\"a\",\"at\":100},"
        "{\"k\":\"x3\",\"ts\":1,\"op\":\"set\",\"names\":\"a\",\"at\":100},"
        "{\"k\":\"x4\",\"ts\":1,\"op\":\"set\",\"names\":\"a\",\"at\":100},"
        "{\"k\":\"x5\",\"ts\":1,\"op\":\"set\",\"names\":\"a\",\"at\":100}]"};
    for (int one_key = 0; one_key <= 1; one_key++) {
        const char *fid = one_key ? "one" : "many";
        Keyflow__V1__FunctionDescriptor *d =
            fnh_timer_names_descriptor(fid, one_key ? "one.s" : "many.s", names, 5);
        fnh_limit(d, "max_timer_callbacks_per_step", 3);
        cr_assert_eq(fnh_register(d)->error.status, KF_OK);
        fnh_push_ok(fid, 1, rows[one_key ? 0 : 1], INT64_MIN);
        Keyflow__V1__PushBatchResponse *ack = fnh_push_ok(fid, 2, NULL, 100);
        cr_assert_eq(ack->timer_callbacks, 3, "%s key(s)", fid);
        cr_assert_eq(ack->due_timers, 2);
        cr_assert_eq(ack->handler_calls, one_key ? 3 : 1);
        cr_assert_eq(fnh_info(fid)->due_timers, 2);
        cr_assert_eq(sim_run_work(&sim, 10), 1);
        cr_assert_eq(fnh_info(fid)->due_timers, 0);
        cr_assert_eq(fnh_info(fid)->output_seq, 5);
    }
}

/* A key costs its canonical key, 9 bytes for a value and, per timer, its
 * name and 8 bytes: a key that holds only timers is not free. */
Test(steps, max_state_bytes_counts_keys_values_and_timers) {
    Keyflow__V1__FunctionDescriptor *d = fnh_descriptor("f", "f.v1");
    /* Key "a": 4 + 1 = 5 bytes; timer "t": 1 + 8; value: 9. */
    fnh_limit(d, "max_state_bytes", 30);
    cr_assert_eq(fnh_register(d)->error.status, KF_OK);
    fnh_push_ok("f", 1, "[" ROW("a", 10, "timer", 5) "," ROW("b", 10, "timer", 5) "]", INT64_MIN);
    Keyflow__V1__FunctionInfo *info = fnh_info("f");
    cr_assert_eq(info->state_bytes, 2 * (5 + 9), "two keys with one timer each");
    cr_assert_eq(info->keys, 2);
    kf_cmd_t *c = fnh_push("f", "p", 2, "[" ROW("c", 10, "timer", 5) "]", INT64_MIN);
    cr_assert_eq(c->error.status, KF_E_LIMIT, "%s", c->error.message);
    cr_assert(strstr(c->error.message, "max_state_bytes") != NULL, "%s", c->error.message);
    cr_assert_eq(fnh_info("f")->state_bytes, 28, "nothing applied");
    /* A value on a key that has a timer adds 9 bytes: 14 + 14 + 9 > 30. */
    c = fnh_push("f", "p", 2, "[" ROW("a", 11, "ok", 5) "]", INT64_MIN);
    cr_assert_eq(c->error.status, KF_E_LIMIT, "%s", c->error.message);
    /* Firing the timers frees the bytes; a value alone costs 5 + 9. */
    fnh_push_ok("f", 2, NULL, 100);
    cr_assert_eq(fnh_info("f")->state_bytes, 0);
    fnh_push_ok("f", 3, "[" ROW("a", 200, "ok", 5) "," ROW("b", 200, "ok", 5) "]", INT64_MIN);
    cr_assert_eq(fnh_info("f")->state_bytes, 28);
    /* After a crash the same count comes back from the store. */
    sim_crash(&sim);
    cr_assert_eq(fnh_info("f")->state_bytes, 28);
}

/* Records of a column family in the store (every function's). */
static size_t stored(kf_cf_t cf) {
    kf_iter_t *it;
    kf_error_t err;
    cr_assert_eq(kf_iter_create(sim.store, cf, NULL, 0, NULL, 0, &it, &err), KF_OK, "%s",
                 err.message);
    size_t n = 0;
    for (kf_iter_seek_first(it); kf_iter_valid(it); kf_iter_next(it)) {
        n++;
    }
    cr_assert_eq(kf_iter_status(it, &err), KF_OK, "%s", err.message);
    kf_iter_destroy(it);
    return n;
}

/* Arms n timers, one per key k0000.., at 100 + i. */
static void arm_timers(const char *fid, int64_t seq, int n) {
    size_t cap = 64 + (size_t)n * 80;
    char *rows = kf_arena_alloc(&sim.arena, cap);
    size_t o = (size_t)snprintf(rows, cap, "[");
    for (int i = 0; i < n; i++) {
        o += (size_t)snprintf(rows + o, cap - o,
                              "%s{\"k\":\"k%04d\",\"ts\":100,\"mode\":\"timer\",\"amount\":%d}",
                              i ? "," : "", i, i);
    }
    snprintf(rows + o, cap - o, "]");
    fnh_push_ok(fid, seq, rows, INT64_MIN);
}

/* Each step's range delete of the timers it fired starts at the earliest
 * timer the step began with, not at the function's first key: ranges that
 * all began there nested, and RocksDB's flush of nested range tombstones
 * costs memory quadratic in their number (bench/README.md, "Soak"). */
Test(steps, fired_timer_range_deletes_of_consecutive_steps_do_not_overlap) {
    Keyflow__V1__FunctionDescriptor *d = fnh_descriptor("f", "f.v1");
    fnh_limit(d, "max_timer_callbacks_per_step", 4);
    cr_assert_eq(fnh_register(d)->error.status, KF_OK);
    arm_timers("f", 1, 10); /* k0000@100 .. k0009@109 */
    fnh_push_ok("f", 2, NULL, 1000);
    sim_drain_work(&sim, 10); /* two follow-on steps */
    cr_assert_eq(fnh_info("f")->output_seq, 10, "every timer fired");
    cr_assert_eq(stored(KF_CF_TIMERS_BY_TIME), 0, "and each one's record is gone");
    cr_assert_eq(kf_memdisk_range_overlaps(sim.disk, KF_CF_TIMERS_BY_TIME), 0,
                 "three steps, three disjoint ranges");
}

Test(steps, due_timers_past_the_bound_fire_in_follow_on_steps) {
    Keyflow__V1__FunctionDescriptor *d = fnh_descriptor("f", "f.v1");
    fnh_limit(d, "max_timer_callbacks_per_step", 4);
    cr_assert_eq(fnh_register(d)->error.status, KF_OK);
    cr_assert_eq(fnh_register(fnh_descriptor("g", "g.v1"))->error.status, KF_OK);
    arm_timers("f", 1, 10); /* k0000@100 .. k0009@109 */
    Keyflow__V1__PushBatchResponse *ack = fnh_push_ok("f", 2, NULL, 1000);
    cr_assert_eq(ack->timer_callbacks, 4);
    cr_assert_eq((ack->first_output_seq), 1);
    cr_assert_eq((ack->last_output_seq), 4, "the step's own output");
    cr_assert_eq(ack->due_timers, 6);
    Keyflow__V1__FunctionInfo *info = fnh_info("f");
    cr_assert_eq(info->due_timers, 6);
    cr_assert_eq(info->timers, 6);
    cr_assert_eq(info->watermark_us, 1000, "the watermark advanced in the batch's step");
    /* The function's next batch waits behind its due timers; other
     * functions go on. */
    kf_cmd_t *later = fnh_push("f", "p", 3, "[" ROW("k0009", 2000, "ok", 7) "]", INT64_MIN);
    cr_assert_not_null(later->parked, "queued behind the due timers");
    cr_assert_null(later->response);
    cr_assert_eq(fnh_push_ok("g", 1, "[" ROW("z", 1, "ok", 3) "]", INT64_MIN)->rows_accepted, 1);
    /* One follow-on step: four more, each step in its own group. */
    uint64_t writes = kf_memdisk_writes(sim.disk);
    cr_assert_eq(sim_run_work(&sim, 1), 1);
    cr_assert_eq(kf_memdisk_writes(sim.disk), writes + 1, "one atomic write per step");
    cr_assert_eq(fnh_info("f")->due_timers, 2);
    cr_assert_null(later->response, "still waiting");
    /* Each step deleted the stored time index of what it fired (a range
     * delete up to its last due time, that due time's records one by one)
     * and nothing else. */
    cr_assert_eq(stored(KF_CF_TIMERS_BY_TIME), 2);
    cr_assert_eq(stored(KF_CF_TIMERS_BY_KEY), 2);
    /* A crash between follow-on steps: the rest fire after recovery. */
    sim_crash(&sim);
    cr_assert_eq(fnh_info("f")->due_timers, 2);
    cr_assert_eq(fnh_state("f", "k0008")->n_timers, 1);
    sim_drain_work(&sim, 10);
    info = fnh_info("f");
    cr_assert_eq(info->due_timers, 0);
    cr_assert_eq(info->timers, 0);
    cr_assert_eq(info->output_seq, 10);
    cr_assert_eq(stored(KF_CF_TIMERS_BY_TIME), 0);
    cr_assert_eq(stored(KF_CF_TIMERS_BY_KEY), 0);
    json_t *rows = fnh_output("f", 0, 100, NULL);
    cr_assert_eq(json_array_size(rows), 10);
    for (size_t i = 0; i < 10; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%04zu", i);
        cr_assert_str_eq(fnh_out_str(rows, i, "key"), key, "in (at_us, key, name) order");
        cr_assert_eq(fnh_out_int(rows, i, "ts"), 100 + (int64_t)i);
        cr_assert_eq(fnh_out_int(rows, i, "_seq"), 1 + (int64_t)i);
    }
    json_decref(rows);
    /* The batch queued before the crash was never acknowledged; its retry
     * now runs after every due timer fired. */
    ack = fnh_push_ok("f", 3, "[" ROW("k0009", 2000, "ok", 7) "]", INT64_MIN);
    cr_assert_eq(ack->first_output_seq, 11);
    cr_assert_eq(fnh_state("f", "k0009")->value, 7);
}

/* Without a crash, the queued batch starts as soon as the last follow-on
 * step is done. */
Test(steps, a_batch_queued_behind_due_timers_starts_after_them) {
    Keyflow__V1__FunctionDescriptor *d = fnh_descriptor("f", "f.v1");
    fnh_limit(d, "max_timer_callbacks_per_step", 3);
    cr_assert_eq(fnh_register(d)->error.status, KF_OK);
    arm_timers("f", 1, 7);
    cr_assert_eq(fnh_push_ok("f", 2, NULL, 1000)->due_timers, 4);
    kf_cmd_t *later = fnh_push("f", "p", 3, "[" ROW("k0001", 2000, "ok", 7) "]", INT64_MIN);
    cr_assert_null(later->response);
    cr_assert_eq(sim_run_work(&sim, 10), 2);
    cr_assert_eq(later->error.status, KF_OK, "%s", later->error.message);
    cr_assert_not_null(later->response);
    cr_assert_eq(((Keyflow__V1__PushBatchResponse *)later->response)->first_output_seq, 8);
    cr_assert_eq(fnh_info("f")->due_timers, 0);
}

/* A follow-on step the host refuses (here: a long key's output passes
 * max_output_bytes) changes nothing and stops the follow-on steps; the
 * refusal is in GetFunction, and the function's next batch, whose step
 * fires the same timer, is refused with it. */
Test(steps, a_refused_follow_on_step_is_reported_and_stops_them) {
    Keyflow__V1__FunctionDescriptor *d = fnh_descriptor("f", "f.v1");
    fnh_limit(d, "max_timer_callbacks_per_step", 1);
    fnh_limit(d, "max_output_bytes", 100);
    cr_assert_eq(fnh_register(d)->error.status, KF_OK);
    fnh_push_ok("f", 1,
                "[" ROW("a", 10, "timer", 5) "," ROW(
                    "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
                    "bbbbbbbbbbbbbbbbbbbbbbbb",
                    10, "timer", 6) "]",
                INT64_MIN);
    Keyflow__V1__PushBatchResponse *ack = fnh_push_ok("f", 2, NULL, 100);
    cr_assert_eq(ack->timer_callbacks, 1, "a's timer fits");
    cr_assert_eq(ack->due_timers, 1);
    uint64_t writes = kf_memdisk_writes(sim.disk);
    cr_assert_eq(sim_run_work(&sim, 10), 1, "tried once, then stopped");
    cr_assert_eq(kf_memdisk_writes(sim.disk), writes, "nothing written");
    Keyflow__V1__FunctionInfo *info = fnh_info("f");
    cr_assert_eq(info->due_timers, 1);
    cr_assert(strstr(info->due_timers_error, "max_output_bytes") != NULL, "%s",
              info->due_timers_error);
    kf_cmd_t *c = fnh_push("f", "p", 3, "[" ROW("a", 200, "ok", 1) "]", INT64_MIN);
    cr_assert_eq(c->error.status, KF_E_LIMIT, "%s", c->error.message);
    cr_assert(strstr(c->error.message, "max_output_bytes") != NULL, "%s", c->error.message);
    cr_assert_eq(fnh_info("f")->output_seq, 1);
}

/* With handler calls answered later (as a remote handler's are), a
 * follow-on step holds the function while its call is out. */
Test(steps, follow_on_steps_wait_for_calls_answered_later) {
    sim.config.defer_handler_calls = true;
    sim_crash(&sim);
    Keyflow__V1__FunctionDescriptor *d = fnh_descriptor("f", "f.v1");
    fnh_limit(d, "max_timer_callbacks_per_step", 2);
    cr_assert_eq(fnh_register(d)->error.status, KF_OK);
    kf_cmd_t *arm = fnh_push(
        "f", "p", 1,
        "[" ROW("a", 10, "timer", 1) "," ROW("b", 10, "timer", 2) "," ROW("c", 10, "timer", 3) "]",
        INT64_MIN);
    sim_pump(&sim);
    cr_assert_not_null(arm->response);
    kf_cmd_t *wm = fnh_push("f", "p", 2, NULL, 100);
    sim_pump(&sim); /* a, b fire in the batch's step */
    cr_assert_eq(((Keyflow__V1__PushBatchResponse *)wm->response)->due_timers, 1);
    cr_assert_eq(sim_run_work(&sim, 10), 1, "the follow-on step's call is out");
    kf_cmd_t *later = fnh_push("f", "p", 3, "[" ROW("a", 200, "ok", 1) "]", INT64_MIN);
    cr_assert_null(later->response);
    cr_assert_eq(sim_run_work(&sim, 10), 0, "no second step while one is out");
    sim_pump(&sim); /* c fires; the queued batch starts, its call goes out */
    cr_assert_eq(fnh_info("f")->output_seq, 3);
    cr_assert_null(later->response);
    sim_pump(&sim);
    cr_assert_not_null(later->response, "%s", later->error.message);
    cr_assert_eq(((Keyflow__V1__PushBatchResponse *)later->response)->first_output_seq, 4);
}

/* ---- timers by name (timer_names.so) ----------------------------------- */

#define TROW(k, ts, op, names, at)                                                                 \
    "{\"k\":\"" k "\",\"ts\":" #ts ",\"op\":\"" op "\",\"names\":\"" names "\",\"at\":" #at "}"

/* Cancelling one name leaves the key's other timers; cancelling a timer
 * that is not set changes nothing; setting again replaces. */
Test(steps, timers_are_cancelled_by_name) {
    static const char *const names[] = {"alpha", "beta"};
    cr_assert_eq(fnh_register(fnh_timer_names_descriptor("f", "f.v1", names, 2))->error.status,
                 KF_OK);
    fnh_push_ok("f", 1, "[" TROW("x", 1, "set", "alpha,beta", 50) "]", INT64_MIN);
    Keyflow__V1__GetKeyStateResponse *st = fnh_state("f", "x");
    cr_assert_eq(st->n_timers, 2);
    fnh_push_ok("f", 2, "[" TROW("x", 2, "cancel", "alpha", 0) "]", INT64_MIN);
    st = fnh_state("f", "x");
    cr_assert_eq(st->n_timers, 1);
    cr_assert_str_eq(st->timers[0]->name, "beta");
    cr_assert_eq(st->timers[0]->at_us, 50);
    /* alpha is absent now: cancelling it again is a no-op, not an error. */
    fnh_push_ok("f", 3, "[" TROW("x", 3, "cancel", "alpha", 0) "]", INT64_MIN);
    fnh_push_ok("f", 4, "[" TROW("x", 4, "set", "beta", 70) "]", INT64_MIN);
    st = fnh_state("f", "x");
    cr_assert_eq(st->n_timers, 1);
    cr_assert_eq(st->timers[0]->at_us, 70, "setting replaces");
    /* Survives a crash the same way. */
    sim_crash(&sim);
    st = fnh_state("f", "x");
    cr_assert_eq(st->n_timers, 1);
    cr_assert_str_eq(st->timers[0]->name, "beta");
    Keyflow__V1__PushBatchResponse *ack = fnh_push_ok("f", 5, NULL, 100);
    cr_assert_eq(ack->timer_callbacks, 1, "only beta fires");
    json_t *rows = fnh_output("f", 0, 10, NULL);
    cr_assert_eq(json_array_size(rows), 1);
    cr_assert_str_eq(fnh_out_str(rows, 0, "name"), "beta");
    cr_assert_eq(fnh_out_int(rows, 0, "ts"), 70);
    json_decref(rows);
    cr_assert_eq(fnh_info("f")->timers, 0);
}

/* Timers due together fire by time, then canonical key, then name (by the
 * name's text, not its place in timer_names), one activation per key per
 * call, so two names of one key fire in two calls. The same holds when the
 * watermark reaches them in one step and when it takes follow-on steps. */
Test(steps, timers_due_together_fire_in_at_key_name_order) {
    static const char *const names[] = {"zeta", "alpha"}; /* declared out of order */
    for (int bound = 0; bound <= 1; bound++) {
        const char *fid = bound ? "small" : "big";
        Keyflow__V1__FunctionDescriptor *d =
            fnh_timer_names_descriptor(fid, bound ? "small.s" : "big.s", names, 2);
        fnh_limit(d, "max_timer_callbacks_per_step", bound ? 1 : 256);
        cr_assert_eq(fnh_register(d)->error.status, KF_OK);
        /* Keys y and x, both names at 50; x's alpha also at 40. */
        fnh_push_ok(
            fid, 1,
            "[" TROW("y", 1, "set", "zeta,alpha", 50) "," TROW("x", 1, "set", "zeta,alpha", 50) "]",
            INT64_MIN);
        fnh_push_ok(fid, 2, "[" TROW("x", 2, "set", "alpha", 40) "]", INT64_MIN);
        fnh_push_ok(fid, 3, NULL, 60);
        sim_drain_work(&sim, 10);
        json_t *rows = fnh_output(fid, 0, 10, NULL);
        cr_assert_eq(json_array_size(rows), 4);
        const char *keys[] = {"x", "x", "y", "y"};
        const char *order[] = {"alpha", "zeta", "alpha", "zeta"};
        const int64_t at[] = {40, 50, 50, 50};
        for (size_t i = 0; i < 4; i++) {
            cr_assert_str_eq(fnh_out_str(rows, i, "key"), keys[i], "%s row %zu", fid, i);
            cr_assert_str_eq(fnh_out_str(rows, i, "name"), order[i], "%s row %zu", fid, i);
            cr_assert_eq(fnh_out_int(rows, i, "ts"), at[i], "%s row %zu", fid, i);
        }
        json_decref(rows);
    }
}

/* The stored time index is length-prefixed (timers_by_time: at_us, then
 * key and name each behind its length), so timers due together lie on
 * disk by the name's length first (b, c, aa), while they fire by the
 * name's text (aa, b, c). A step that stops inside one due time must
 * delete the records of exactly the timers it fired: with one callback per
 * step the records of b and c must stay, with two the record of aa must
 * go. After each crash every live timer is indexed, no fired one is, and
 * each timer fires once. */
Test(steps, a_step_stopping_inside_a_due_time_deletes_exactly_what_it_fired) {
    static const char *const names[] = {"b", "c", "aa"};
    for (int64_t per_step = 1; per_step <= 2; per_step++) {
        const char *fid = per_step == 1 ? "one" : "two";
        Keyflow__V1__FunctionDescriptor *d =
            fnh_timer_names_descriptor(fid, per_step == 1 ? "one.s" : "two.s", names, 3);
        fnh_limit(d, "max_timer_callbacks_per_step", per_step);
        cr_assert_eq(fnh_register(d)->error.status, KF_OK);
        size_t before = stored(KF_CF_TIMERS_BY_TIME);
        fnh_push_ok(fid, 1, "[" TROW("x", 1, "set", "b,c,aa", 50) "]", INT64_MIN);
        cr_assert_eq(stored(KF_CF_TIMERS_BY_TIME), before + 3);
        Keyflow__V1__PushBatchResponse *ack = fnh_push_ok(fid, 2, NULL, 60);
        cr_assert_eq(ack->timer_callbacks, per_step, "%s: the limit stops the step", fid);
        sim_crash(&sim);
        cr_assert_eq(fnh_info(fid)->timers, 3 - per_step, "%s", fid);
        cr_assert_eq(stored(KF_CF_TIMERS_BY_TIME), before + 3 - (size_t)per_step,
                     "%s: exactly the live timers are indexed", fid);
        sim_drain_work(&sim, 10);
        sim_crash(&sim);
        cr_assert_eq(fnh_info(fid)->timers, 0, "%s", fid);
        cr_assert_eq(stored(KF_CF_TIMERS_BY_TIME), before, "%s: no fired timer's record is left",
                     fid);
        json_t *rows = fnh_output(fid, 0, 10, NULL);
        cr_assert_eq(json_array_size(rows), 3, "%s: each timer fires once", fid);
        const char *order[] = {"aa", "b", "c"};
        for (size_t i = 0; i < 3; i++) {
            cr_assert_str_eq(fnh_out_str(rows, i, "name"), order[i], "%s row %zu", fid, i);
        }
        json_decref(rows);
    }
}

/* ---- state_ttl_us ------------------------------------------------------ */

static void register_ttl(int64_t ttl_us) {
    Keyflow__V1__FunctionDescriptor *d = fnh_descriptor("f", "f.v1");
    d->state_ttl_us = ttl_us;
    kf_cmd_t *c = fnh_register(d);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
}

/* A value expires when the watermark reaches its last write's event time
 * + state_ttl_us, in the step that advances it; GetKeyState shows when. */
Test(steps, a_value_expires_when_the_watermark_passes_its_ttl) {
    register_ttl(50);
    fnh_push_ok("f", 1, "[" ROW("a", 100, "ok", 5) "," ROW("b", 120, "null", 0) "]", INT64_MIN);
    Keyflow__V1__GetKeyStateResponse *a = fnh_state("f", "a");
    cr_assert_eq(a->value, 5);
    cr_assert_eq(a->state_expires_us, 150);
    cr_assert_eq(fnh_state("f", "b")->state_expires_us, 170, "SET_NULL has a ttl too");
    /* 5 + 9 + 8 bytes per key with an expiring value. */
    cr_assert_eq(fnh_info("f")->state_bytes, 2 * 22);
    fnh_push_ok("f", 2, NULL, 149);
    cr_assert_eq(fnh_state("f", "a")->value, 5, "not yet");
    /* A write moves the expiry (event time 130 -> 180). */
    fnh_push_ok("f", 3, "[" ROW("a", 130, "ok", 6) "]", INT64_MIN);
    cr_assert_eq(fnh_state("f", "a")->state_expires_us, 180);
    Keyflow__V1__PushBatchResponse *ack = fnh_push_ok("f", 4, NULL, 175);
    cr_assert_eq(ack->timer_callbacks, 0, "expiry is no handler call");
    cr_assert_eq(fnh_state("f", "b")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
    cr_assert_eq(fnh_state("f", "b")->state_expires_us, 0);
    cr_assert_eq(fnh_state("f", "a")->value, 6);
    /* The expiry is stored with the value. */
    sim_crash(&sim);
    cr_assert_eq(fnh_state("f", "a")->state_expires_us, 180);
    cr_assert_eq(fnh_info("f")->keys, 1);
    fnh_push_ok("f", 5, NULL, 180);
    cr_assert_eq(fnh_state("f", "a")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
    cr_assert_eq(fnh_info("f")->keys, 0);
    cr_assert_eq(fnh_info("f")->state_bytes, 0);
    sim_crash(&sim);
    cr_assert_eq(fnh_state("f", "a")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT,
                 "the clear was stored");
}

/* Values expire at the watermark advance, before the step's due timers
 * fire: a timer past the expiry sees the value absent (misbehaving emits
 * n = -1 for an absent value). */
Test(steps, values_expire_before_the_due_timers_of_the_step) {
    register_ttl(50);
    fnh_push_ok("f", 1, "[" ROW("a", 100, "ok", 5) "," ROW("a", 100, "timer", 60) "]", INT64_MIN);
    fnh_push_ok("f", 2, NULL, 200);
    json_t *rows = fnh_output("f", 0, 10, NULL);
    cr_assert_eq(json_array_size(rows), 2);
    cr_assert_eq(fnh_out_int(rows, 1, "n"), -1, "expired at 150, the timer fired at 160");
    json_decref(rows);
}

/* A late write whose expiry is already behind the watermark lives until
 * the next step that advances the watermark (docs/semantics.md). */
Test(steps, a_late_write_expires_at_the_next_advance) {
    register_ttl(50);
    fnh_push_ok("f", 1, NULL, 1000);
    fnh_push_ok("f", 2, "[" ROW("a", 500, "ok", 5) "]", INT64_MIN);
    Keyflow__V1__GetKeyStateResponse *a = fnh_state("f", "a");
    cr_assert_eq(a->value, 5);
    cr_assert_eq(a->state_expires_us, 550);
    fnh_push_ok("f", 3, NULL, 1000); /* the same watermark: no advance */
    cr_assert_eq(fnh_state("f", "a")->value, 5);
    fnh_push_ok("f", 4, NULL, 1001);
    cr_assert_eq(fnh_state("f", "a")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
}

Test(steps, a_negative_ttl_is_refused) {
    Keyflow__V1__FunctionDescriptor *d = fnh_descriptor("f", "f.v1");
    d->state_ttl_us = -1;
    kf_cmd_t *c = fnh_register(d);
    cr_assert_eq(c->error.status, KF_E_INVALID);
    cr_assert(strstr(c->error.message, "descriptor.state_ttl_us") != NULL, "%s", c->error.message);
}

/* ---- DryRunBatch ------------------------------------------------------- */

static kf_cmd_t *dry_run(const char *rows, int64_t watermark, bool json) {
    Keyflow__V1__DryRunBatchRequest *req =
        kf_arena_zalloc(&sim.arena, sizeof(Keyflow__V1__DryRunBatchRequest));
    keyflow__v1__dry_run_batch_request__init(req);
    req->function_id = "f";
    if (rows != NULL) {
        req->rows_case = KEYFLOW__V1__DRY_RUN_BATCH_REQUEST__ROWS_ROWS_JSON;
        req->rows_json = kf_arena_strdup(&sim.arena, rows);
    }
    if (watermark != INT64_MIN) {
        req->watermark_present_case =
            KEYFLOW__V1__DRY_RUN_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US;
        req->watermark_us = watermark;
    }
    req->format = json ? KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON
                       : KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_COLUMNAR;
    return sim_exec(&sim, KF_OP_DRY_RUN_BATCH, &req->base);
}

/* A dry run answers what the step would write and writes nothing: the
 * output (with the sequence numbers it would get), each key's value and
 * timers before and after, fired timers and expired values included. */
Test(steps, a_dry_run_answers_the_effects_and_applies_nothing) {
    register_ttl(1000);
    fnh_push_ok("f", 1, "[" ROW("a", 100, "ok", 5) "," ROW("b", 100, "timer", 50) "]", INT64_MIN);
    Keyflow__V1__FunctionInfo before = *fnh_info("f");
    uint64_t writes = kf_memdisk_writes(sim.disk);
    kf_cmd_t *c = dry_run("[" ROW("a", 200, "ok", 7) "," ROW("c", 200, "ok", 1) "]", 160, true);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    Keyflow__V1__DryRunBatchResponse *r = (Keyflow__V1__DryRunBatchResponse *)c->response;
    cr_assert_eq(r->rows_accepted, 2);
    cr_assert_eq(r->timer_callbacks, 1, "b's timer at 150 would fire");
    cr_assert_eq(r->watermark_us, 160);
    cr_assert_eq(r->due_timers, 0);
    cr_assert_eq(r->first_output_seq, before.output_seq + 1);
    json_t *rows = json_loads(r->output_json, 0, NULL);
    cr_assert_eq(json_array_size(rows), 3, "%s", r->output_json);
    cr_assert_str_eq(fnh_out_str(rows, 0, "key"), "a");
    cr_assert_eq(fnh_out_int(rows, 0, "n"), 7);
    cr_assert_str_eq(fnh_out_str(rows, 2, "key"), "b");
    cr_assert_eq(fnh_out_int(rows, 2, "_seq"), before.output_seq + 3);
    json_decref(rows);
    cr_assert_eq(r->n_changes, 3, "a, b and c, in key order");
    Keyflow__V1__KeyChange *a = r->changes[0], *b = r->changes[1], *cc = r->changes[2];
    cr_assert_str_eq(a->key_text, "a");
    cr_assert_eq(a->value_before, 5);
    cr_assert_eq(a->value_after, 7);
    cr_assert_eq(a->state_expires_us, 1200);
    cr_assert_str_eq(b->key_text, "b");
    cr_assert_eq(b->n_timers_before, 1);
    cr_assert_eq(b->timers_before[0]->at_us, 150);
    cr_assert_eq(b->n_timers_after, 0, "fired");
    cr_assert_str_eq(cc->key_text, "c");
    cr_assert_eq(cc->state_before, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
    cr_assert_eq(cc->state_after, KEYFLOW__V1__STATE_KIND__STATE_KIND_VALUE);
    /* Nothing happened. */
    cr_assert_eq(kf_memdisk_writes(sim.disk), writes);
    Keyflow__V1__FunctionInfo *after = fnh_info("f");
    cr_assert_eq(after->output_seq, before.output_seq);
    cr_assert_eq(after->watermark_us, before.watermark_us);
    cr_assert_eq(after->keys, before.keys);
    cr_assert_eq(after->state_bytes, before.state_bytes);
    cr_assert_eq(fnh_state("f", "a")->value, 5);
    cr_assert_eq(fnh_state("f", "b")->n_timers, 1);
    cr_assert_eq(fnh_state("f", "c")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
    /* The same batch pushed does what the dry run said. */
    Keyflow__V1__PushBatchResponse *ack =
        fnh_push_ok("f", 2, "[" ROW("a", 200, "ok", 7) "," ROW("c", 200, "ok", 1) "]", 160);
    cr_assert_eq(ack->first_output_seq, r->first_output_seq);
    cr_assert_eq(ack->timer_callbacks, r->timer_callbacks);
    cr_assert_eq(fnh_state("f", "a")->value, 7);
    /* Columnar output too. */
    c = dry_run("[" ROW("a", 300, "ok", 1) "]", INT64_MIN, false);
    r = (Keyflow__V1__DryRunBatchResponse *)c->response;
    cr_assert_not_null(r->output);
    cr_assert_eq(r->output->row_count, 1);
}

/* A dry run fails exactly when the push would: same status, same message,
 * and still nothing applied. */
Test(steps, a_dry_run_fails_like_the_push_would) {
    Keyflow__V1__FunctionDescriptor *d = fnh_descriptor("f", "f.v1");
    fnh_limit(d, "max_output_rows", 2);
    cr_assert_eq(fnh_register(d)->error.status, KF_OK);
    const char *bad[] = {
        "[" ROW("a", 10, "ok", 1) "," ROW("a", 11, "fail", 0) "]",
        "[" ROW("a", 10, "ok", 1) "," ROW("b", 10, "ok", 1) "," ROW("c", 10, "ok", 1) "]",
        "[{\"k\":\"a\",\"ts\":\"soon\",\"mode\":\"ok\"}]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kf_cmd_t *dry = dry_run(bad[i], INT64_MIN, true);
        kf_cmd_t *push = fnh_push("f", "p", 1, bad[i], INT64_MIN);
        cr_assert_neq(push->error.status, KF_OK);
        cr_assert_eq(dry->error.status, push->error.status, "%zu: %s / %s", i, dry->error.message,
                     push->error.message);
        cr_assert_str_eq(dry->error.message, push->error.message);
    }
    cr_assert_eq(fnh_info("f")->keys, 0);
}
