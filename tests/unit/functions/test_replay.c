/*
 * test_replay.c - ReplayBatch (service/functions/replay.c): a kept input
 * batch of a REPLAY_SAFE function runs again against the state its step
 * started from, and the answer says whether the handler reproduced the
 * recorded output and state changes, with the first difference;
 *   - nothing a replay does reaches the function, its state or the store;
 *   - a batch is replayed against the state before it, not the current one
 *     (later batches changed the keys since), fired timers and expired
 *     values included;
 *   - a handler that is not deterministic (misbehaving's drift modes) is
 *     caught, in its output and in its state;
 *   - only REPLAY_SAFE functions, only the last --replay-batches batches,
 *     and only since the server started.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "base/metrics.h"
#include "fn_harness.h"

static void setup(void) {
    fnh_setup();
    sim.config.replay_batches = 3; /* the core borrows the config: read live */
}

TestSuite(replay, .init = setup, .fini = fnh_teardown, .timeout = 60);

#define ROW(k, ts, mode, amount)                                                                   \
    "{\"k\":\"" k "\",\"ts\":" #ts ",\"mode\":\"" mode "\",\"amount\":" #amount "}"

static void register_fn(const char *id, bool replay_safe, int64_t ttl_us) {
    Keyflow__V1__FunctionDescriptor *d = fnh_descriptor(id, id);
    d->determinism = replay_safe ? KEYFLOW__V1__DETERMINISM__DETERMINISM_REPLAY_SAFE
                                 : KEYFLOW__V1__DETERMINISM__DETERMINISM_UNDECLARED;
    d->state_ttl_us = ttl_us;
    kf_cmd_t *c = fnh_register(d);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
}

static kf_cmd_t *replay(const char *fid, const char *producer, int64_t seq) {
    Keyflow__V1__ReplayBatchRequest *req =
        kf_arena_zalloc(&sim.arena, sizeof(Keyflow__V1__ReplayBatchRequest));
    keyflow__v1__replay_batch_request__init(req);
    req->function_id = kf_arena_strdup(&sim.arena, fid);
    req->producer_id = kf_arena_strdup(&sim.arena, producer);
    req->sequence = seq;
    return sim_exec(&sim, KF_OP_REPLAY_BATCH, &req->base);
}

static Keyflow__V1__ReplayBatchResponse *replay_ok(const char *fid, int64_t seq) {
    kf_cmd_t *c = replay(fid, "p", seq);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    cr_assert_not_null(c->response);
    return (Keyflow__V1__ReplayBatchResponse *)c->response;
}

/* A batch replays against the state its step started from: later batches
 * changed a, fired b's timer and let c's value expire, and the replay of
 * batch 2 still reproduces it; nothing of the replay is applied. */
Test(replay, a_batch_reproduces_against_the_state_before_it) {
    register_fn("f", true, 1000);
    fnh_push_ok("f", 1, "[" ROW("a", 100, "ok", 5) "," ROW("b", 100, "timer", 50) "]", INT64_MIN);
    /* Batch 2: a changes, c appears, the watermark fires b's timer. */
    fnh_push_ok("f", 2, "[" ROW("a", 200, "ok", 7) "," ROW("c", 200, "ok", 1) "]", 160);
    /* Later: a changes again, c expires (written at 200, TTL 1000). */
    fnh_push_ok("f", 3, "[" ROW("a", 300, "ok", 9) "]", 1250);
    cr_assert_eq(fnh_state("f", "c")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
    Keyflow__V1__FunctionInfo before = *fnh_info("f");
    uint64_t writes = kf_memdisk_writes(sim.disk);

    Keyflow__V1__ReplayBatchResponse *r = replay_ok("f", 2);
    cr_assert(r->reproduced, "%s", r->first_difference);
    cr_assert_str_eq(r->first_difference, "");
    cr_assert_eq(r->recorded_output_rows, 3, "a, c and b's timer");
    cr_assert_eq(r->replayed_output_rows, 3);
    cr_assert_eq(r->keys_compared, 3);
    r = replay_ok("f", 3);
    cr_assert(r->reproduced, "%s", r->first_difference);
    cr_assert_eq(r->keys_compared, 2, "a written, c expired");

    /* Nothing happened. */
    cr_assert_eq(kf_memdisk_writes(sim.disk), writes);
    Keyflow__V1__FunctionInfo *after = fnh_info("f");
    cr_assert_eq(after->output_seq, before.output_seq);
    cr_assert_eq(after->watermark_us, before.watermark_us);
    cr_assert_eq(after->keys, before.keys);
    cr_assert_eq(after->timers, before.timers);
    cr_assert_eq(after->state_bytes, before.state_bytes);
    cr_assert_eq(fnh_state("f", "a")->value, 9);
    cr_assert_eq(fnh_state("f", "c")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
    /* The function goes on as if no replay had run. */
    Keyflow__V1__PushBatchResponse *ack = fnh_push_ok("f", 4, "[" ROW("a", 400, "ok", 1) "]", 1250);
    cr_assert_eq(ack->first_output_seq, before.output_seq + 1);
}

/* A handler that is not deterministic is caught, and the answer names the
 * first difference: an output row's column, or a key's value. */
Test(replay, a_handler_that_drifts_is_named) {
    register_fn("f", true, 0);
    fnh_push_ok("f", 1, "[" ROW("a", 10, "ok", 1) "," ROW("b", 10, "drift", 0) "]", INT64_MIN);
    Keyflow__V1__ReplayBatchResponse *r = replay_ok("f", 1);
    cr_assert(!r->reproduced);
    cr_assert(strstr(r->first_difference, "output row 2") != NULL, "%s", r->first_difference);
    cr_assert(strstr(r->first_difference, "column n") != NULL, "%s", r->first_difference);
    cr_assert_eq(r->recorded_output_rows, 2);
    cr_assert_eq(r->replayed_output_rows, 2);

    fnh_push_ok("f", 2, "[" ROW("x", 20, "drift_state", 0) "]", INT64_MIN);
    int64_t stored = fnh_state("f", "x")->value;
    r = replay_ok("f", 2);
    cr_assert(!r->reproduced);
    cr_assert(strstr(r->first_difference, "key x: recorded value") != NULL, "%s",
              r->first_difference);
    cr_assert_eq(fnh_state("f", "x")->value, stored, "the replay's value is not applied");
}

/* A replay the handler refuses (the recorded step was accepted) is a
 * difference, not an error of the call. */
Test(replay, a_replay_the_handler_refuses_is_a_difference) {
    register_fn("f", true, 0);
    fnh_push_ok("f", 1, "[" ROW("a", 10, "ok", 1) "," ROW("a", 11, "flaky", 0) "]", INT64_MIN);
    Keyflow__V1__ReplayBatchResponse *r = replay_ok("f", 1);
    cr_assert(!r->reproduced);
    cr_assert(strstr(r->first_difference, "the replay was refused") != NULL, "%s",
              r->first_difference);
    cr_assert(strstr(r->first_difference, "mode flaky") != NULL, "%s", r->first_difference);
    cr_assert_eq(r->replayed_output_rows, 0);
    cr_assert_eq(fnh_state("f", "a")->value, 1);
}

/* Only REPLAY_SAFE functions; only kept batches (the last replay_batches,
 * since the server started); unknown functions as everywhere. Each error
 * names what it refuses and changes nothing. */
Test(replay, what_cannot_be_replayed_is_refused_by_name) {
    register_fn("plain", false, 0);
    fnh_push_ok("plain", 1, "[" ROW("a", 10, "ok", 1) "]", INT64_MIN);
    kf_cmd_t *c = replay("plain", "p", 1);
    cr_assert_eq(c->error.status, KF_E_PRECONDITION);
    cr_assert(strstr(c->error.message, "REPLAY_SAFE") != NULL, "%s", c->error.message);

    c = replay("nope", "p", 1);
    cr_assert_eq(c->error.status, KF_E_NOT_FOUND, "%s", c->error.message);

    register_fn("f", true, 0);
    for (int seq = 1; seq <= 5; seq++) {
        fnh_push_ok("f", seq, "[" ROW("a", 10, "ok", 1) "]", INT64_MIN);
    }
    c = replay("f", "p", 2);
    cr_assert_eq(c->error.status, KF_E_NOT_FOUND);
    cr_assert(strstr(c->error.message, "sequence 2") != NULL, "%s", c->error.message);
    cr_assert(strstr(c->error.message, "--replay-batches") != NULL, "%s", c->error.message);
    cr_assert_eq(replay("f", "other", 5)->error.status, KF_E_NOT_FOUND, "another producer's");
    for (int seq = 3; seq <= 5; seq++) {
        cr_assert(replay_ok("f", seq)->reproduced, "batch %d", seq);
    }
    /* A retry of an acknowledged batch runs no step: nothing new is kept. */
    fnh_push_ok("f", 5, "[" ROW("a", 10, "ok", 1) "]", INT64_MIN);
    cr_assert(replay_ok("f", 3)->reproduced);
    /* In memory only: a restart forgets them. */
    sim_crash(&sim);
    c = replay("f", "p", 5);
    cr_assert_eq(c->error.status, KF_E_NOT_FOUND);
}

/* replay_batches 0 keeps none; the byte budget forgets the oldest first. */
Test(replay, the_records_are_bounded) {
    register_fn("f", true, 0);
    sim.config.replay_batches = 0;
    fnh_push_ok("f", 1, "[" ROW("a", 10, "ok", 1) "]", INT64_MIN);
    cr_assert_eq(replay("f", "p", 1)->error.status, KF_E_NOT_FOUND);
    sim.config.replay_batches = 3;
    fnh_push_ok("f", 2, "[" ROW("a", 10, "ok", 1) "]", INT64_MIN);
    cr_assert(replay_ok("f", 2)->reproduced);
    /* A budget of one record's bytes: each new record pushes out the last. */
    sim.config.replay_bytes = 200;
    fnh_push_ok("f", 3, "[" ROW("a", 10, "ok", 1) "]", INT64_MIN);
    cr_assert(replay_ok("f", 3)->reproduced);
    cr_assert_eq(replay("f", "p", 2)->error.status, KF_E_NOT_FOUND);
    /* One larger than the whole budget is not kept at all. */
    sim.config.replay_bytes = 10;
    fnh_push_ok("f", 4, "[" ROW("a", 10, "ok", 1) "]", INT64_MIN);
    cr_assert_eq(replay("f", "p", 4)->error.status, KF_E_NOT_FOUND);
}

static int64_t gauge_now(kf_gauge_t g) {
    sim_advance(&sim, sim.now_ms); /* a turn refreshes the memory count */
    return kf_gauge_get(g);
}

/* Kept batches live in the room the tables leave in the memory budget:
 * with room for two and a half, two are kept (replay_batches would keep
 * three); a step that adds a key is admitted into their room, and the
 * oldest go, so that tables and records stay within the budget. */
Test(replay, the_records_yield_to_the_tables_in_the_memory_budget) {
    register_fn("f", true, 0);
    fnh_push_ok("f", 1, "[" ROW("a", 10, "ok", 1) "]", INT64_MIN);
    int64_t record = kf_gauge_get(KF_G_REPLAY_BYTES);
    cr_assert_gt(record, 0);
    int64_t tables = gauge_now(KF_G_MEMORY_USED_BYTES);
    fnh_push_ok("f", 2, "[" ROW("b", 10, "ok", 1) "]", INT64_MIN);
    int64_t per_key = gauge_now(KF_G_MEMORY_USED_BYTES) - tables;
    cr_assert_gt(per_key, 0);
    sim_crash(&sim); /* the tables as recovery makes them */
    cr_assert_eq(kf_gauge_get(KF_G_REPLAY_BYTES), 0, "a restart forgets them");
    int64_t budget = gauge_now(KF_G_MEMORY_USED_BYTES) + 2 * record + record / 2;
    sim.config.memory_budget_bytes = (uint64_t)budget;
    sim_crash(&sim);
    for (int seq = 3; seq <= 5; seq++) {
        fnh_push_ok("f", seq, "[" ROW("a", 10, "ok", 1) "]", INT64_MIN);
    }
    cr_assert_eq(replay("f", "p", 3)->error.status, KF_E_NOT_FOUND, "no room for a third");
    cr_assert(replay_ok("f", 4)->reproduced);
    cr_assert(replay_ok("f", 5)->reproduced);
    cr_assert_leq(gauge_now(KF_G_MEMORY_USED_BYTES) + kf_gauge_get(KF_G_REPLAY_BYTES), budget);
    /* A new key fits the budget only in the room the records held. */
    cr_assert_leq(per_key, 2 * record, "the test assumes a key is smaller than two records");
    cr_assert_eq(fnh_push("f", "p", 6, "[" ROW("c", 10, "ok", 1) "]", INT64_MIN)->error.status,
                 KF_OK, "a new key is admitted whatever the records hold");
    cr_assert_eq(replay("f", "p", 4)->error.status, KF_E_NOT_FOUND, "the oldest went");
    cr_assert_leq(gauge_now(KF_G_MEMORY_USED_BYTES) + kf_gauge_get(KF_G_REPLAY_BYTES), budget);
}

/* A replay runs while a batch of the function waits (the scratch copy is
 * not the function), and a deleted function's records go with it. */
Test(replay, records_go_with_their_function) {
    register_fn("f", true, 0);
    fnh_push_ok("f", 1, "[" ROW("a", 10, "ok", 1) "]", INT64_MIN);
    Keyflow__V1__DeleteFunctionRequest *req =
        kf_arena_zalloc(&sim.arena, sizeof(Keyflow__V1__DeleteFunctionRequest));
    keyflow__v1__delete_function_request__init(req);
    req->function_id = "f";
    kf_cmd_t *c = sim_exec(&sim, KF_OP_DELETE_FUNCTION, &req->base);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    sim_drain_work(&sim, 10);
    cr_assert_eq(replay("f", "p", 1)->error.status, KF_E_NOT_FOUND);
}
