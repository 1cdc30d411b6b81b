/*
 * test_functions.c - process functions over the deterministic engine core
 * with a real plugin (misbehaving.c): registration rules, absent / null /
 * value state, every response rule (each refused batch changes nothing),
 * idempotent retries, timers in order and in chunks, limits, recovery.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "fn_harness.h"
#include "records/records.pb-c.h"

TestSuite(functions, .init = fnh_setup, .fini = fnh_teardown, .timeout = 60);

/* The tests here use one function, "f", of the misbehaving plugin. */
static Keyflow__V1__FunctionDescriptor *descriptor(const char *id, const char *state_id) {
    return fnh_descriptor(id, state_id);
}
static kf_cmd_t *register_fn(Keyflow__V1__FunctionDescriptor *d) {
    return fnh_register(d);
}
static void register_ok(void) {
    kf_cmd_t *c = register_fn(descriptor("f", "f.v1"));
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
}
static kf_cmd_t *push(const char *producer, int64_t seq, const char *rows, int64_t watermark) {
    return fnh_push("f", producer, seq, rows, watermark);
}
static Keyflow__V1__PushBatchResponse *push_ok(int64_t seq, const char *rows, int64_t watermark) {
    return fnh_push_ok("f", seq, rows, watermark);
}
static Keyflow__V1__GetKeyStateResponse *state_of(const char *key) {
    return fnh_state("f", key);
}
static json_t *output(int64_t after, int64_t limit, Keyflow__V1__ReadOutputResponse **resp_out) {
    return fnh_output("f", after, limit, resp_out);
}
static int64_t out_int(json_t *rows, size_t i, const char *col) {
    return fnh_out_int(rows, i, col);
}

#define ROW(k, ts, mode, amount)                                                                   \
    "{\"k\":\"" k "\",\"ts\":" #ts ",\"mode\":\"" mode "\",\"amount\":" #amount "}"

Test(functions, registration_is_idempotent_and_refuses_changes) {
    kf_cmd_t *a = register_fn(descriptor("f", "f.v1"));
    cr_assert_eq(a->error.status, KF_OK, "%s", a->error.message);
    Keyflow__V1__RegisterFunctionResponse *ra =
        (Keyflow__V1__RegisterFunctionResponse *)a->response;
    cr_assert(ra->function->available, "%s", ra->function->unavailable_reason);
    cr_assert_eq(strlen(ra->function->descriptor_sha256), 64);
    cr_assert_not(ra->already_registered);
    kf_cmd_t *b = register_fn(descriptor("f", "f.v1"));
    cr_assert_eq(b->error.status, KF_OK);
    Keyflow__V1__RegisterFunctionResponse *rb =
        (Keyflow__V1__RegisterFunctionResponse *)b->response;
    cr_assert(rb->already_registered);
    cr_assert_str_eq(rb->function->descriptor_sha256, ra->function->descriptor_sha256);
    Keyflow__V1__FunctionDescriptor *changed = descriptor("f", "f.v1");
    changed->value_state_name = "other";
    kf_cmd_t *c = register_fn(changed);
    cr_assert_eq(c->error.status, KF_E_EXISTS);
    cr_assert(strstr(c->error.message, "function_id") != NULL, "%s", c->error.message);
    kf_cmd_t *d = register_fn(descriptor("g", "f.v1"));
    cr_assert_eq(d->error.status, KF_E_EXISTS);
    cr_assert(strstr(d->error.message, "pipeline_state_id") != NULL, "%s", d->error.message);
    Keyflow__V1__FunctionDescriptor *missing = descriptor("h", "h.v1");
    missing->implementation_digest =
        "1111111111111111111111111111111111111111111111111111111111111111";
    kf_cmd_t *e = register_fn(missing);
    cr_assert_eq(e->error.status, KF_E_PRECONDITION);
    cr_assert(strstr(e->error.message, "implementation_digest") != NULL, "%s", e->error.message);
    Keyflow__V1__ListFunctionsRequest lr = KEYFLOW__V1__LIST_FUNCTIONS_REQUEST__INIT;
    kf_cmd_t *l = sim_exec(&sim, KF_OP_LIST_FUNCTIONS, &lr.base);
    cr_assert_eq(((Keyflow__V1__ListFunctionsResponse *)l->response)->n_functions, 1);
}

Test(functions, absent_null_and_value_are_distinct) {
    register_ok();
    cr_assert_eq(state_of("a")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
    push_ok(1, "[" ROW("a", 10, "ok", 5) "," ROW("b", 10, "null", 0) "]", INT64_MIN);
    Keyflow__V1__GetKeyStateResponse *a = state_of("a");
    cr_assert_eq(a->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_VALUE);
    cr_assert_eq(a->value, 5);
    cr_assert_eq(state_of("b")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_NULL);
    push_ok(2, "[" ROW("a", 11, "clear", 0) "]", INT64_MIN);
    cr_assert_eq(state_of("a")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
    cr_assert_eq(state_of("b")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_NULL);
    sim_crash(&sim);
    cr_assert_eq(state_of("a")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
    cr_assert_eq(state_of("b")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_NULL);
}

/* A batch with a good row and one breaking `mode` is refused as a whole. */
static void expect_refused(const char *mode, kf_status_t status, const char *words) {
    register_ok();
    Keyflow__V1__PushBatchResponse *first = push_ok(1, "[" ROW("a", 10, "ok", 5) "]", 100);
    uint64_t writes = kf_memdisk_writes(sim.disk);
    char rows[512];
    /* The bad row is a's second row, so it lands in a second handler call:
     * the first call (a=9, c=4) was applied and must be rolled back. */
    snprintf(rows, sizeof rows,
             "[" ROW("a", 20, "ok", 9) "," ROW(
                 "c", 20, "ok", 4) ",{\"k\":\"a\",\"ts\":30,\"mode\":\"%s\",\"amount\":1}]",
             mode);
    kf_cmd_t *c = push("p", 2, rows, 500);
    cr_assert_eq(c->error.status, status, "%s: got %s: %s", mode, kf_status_name(c->error.status),
                 c->error.message);
    cr_assert(strstr(c->error.message, words) != NULL, "'%s' should say '%s'", c->error.message,
              words);
    cr_assert_eq(kf_memdisk_writes(sim.disk), writes, "nothing was written");
    cr_assert_eq(state_of("a")->value, 5, "the good rows of the refused batch were rolled back");
    cr_assert_eq(state_of("c")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
    cr_assert_eq(state_of("a")->n_timers, 0);
    Keyflow__V1__ReadOutputResponse *r;
    json_t *rows_out = output(0, 100, &r);
    cr_assert_eq(json_array_size(rows_out), 1);
    cr_assert_eq(r->high_water_seq, first->last_output_seq);
    json_decref(rows_out);
    Keyflow__V1__GetFunctionRequest g = KEYFLOW__V1__GET_FUNCTION_REQUEST__INIT;
    g.function_id = "f";
    Keyflow__V1__FunctionInfo *info =
        (Keyflow__V1__FunctionInfo *)sim_exec(&sim, KF_OP_GET_FUNCTION, &g.base)->response;
    cr_assert_eq(info->watermark_us, 100, "the watermark did not move");
    /* The sequence was not consumed: the same sequence now succeeds. */
    Keyflow__V1__PushBatchResponse *ok = push_ok(2, "[" ROW("a", 20, "ok", 9) "]", INT64_MIN);
    cr_assert_eq(ok->first_output_seq, 2);
    cr_assert_eq(state_of("a")->value, 9);
}

Test(functions, refuses_an_undeclared_timer) {
    expect_refused("undeclared_timer", KF_E_PRECONDITION, "not declared");
}
Test(functions, refuses_a_timer_at_the_watermark) {
    expect_refused("past_timer", KF_E_PRECONDITION, "not after the watermark");
}
Test(functions, refuses_output_before_the_event_time) {
    expect_refused("early_output", KF_E_PRECONDITION, "before the activation");
}
Test(functions, refuses_a_missing_non_nullable_column) {
    expect_refused("missing_column", KF_E_PRECONDITION, "non-nullable column key");
}
Test(functions, refuses_two_mutations) {
    expect_refused("two_mutations", KF_E_PRECONDITION, "already has a state mutation");
}
Test(functions, refuses_a_wrong_type) {
    expect_refused("wrong_type", KF_E_PRECONDITION, "not of that type");
}
Test(functions, refuses_an_unended_row) {
    expect_refused("unended_row", KF_E_PRECONDITION, "not ended");
}
Test(functions, refuses_an_unknown_activation) {
    expect_refused("bad_index", KF_E_PRECONDITION, "activation index");
}
Test(functions, refuses_a_failed_call) {
    expect_refused("fail", KF_E_PRECONDITION, "mode fail");
}
Test(functions, refuses_a_nonzero_return) {
    expect_refused("return", KF_E_PRECONDITION, "returned 7");
}

Test(functions, refuses_output_bytes_as_they_come_not_only_at_the_end) {
    expect_refused("fill_bytes", KF_E_LIMIT, "max_output_bytes");
}
Test(functions, refuses_unbounded_timer_operations) {
    expect_refused("many_timer_ops", KF_E_LIMIT, "timer operations");
}

/* Before the first watermark nothing is "not after" it but a real time:
 * INT64_MIN (which is also the engine's "no timer") is refused, and an
 * existing timer is not silently cancelled by it. */
Test(functions, refuses_a_timer_at_int64_min_before_any_watermark) {
    register_ok();
    push_ok(1, "[" ROW("a", 10, "timer", 990) "]", INT64_MIN);
    cr_assert_eq(state_of("a")->n_timers, 1);
    kf_cmd_t *c = push("p", 2, "[" ROW("a", 20, "min_timer", 0) "]", INT64_MIN);
    cr_assert_eq(c->error.status, KF_E_PRECONDITION, "%s", c->error.message);
    cr_assert(strstr(c->error.message, "not after the watermark") != NULL, "%s", c->error.message);
    cr_assert_eq(state_of("a")->n_timers, 1, "the timer at 1000 is still there");
}

Test(functions, refuses_too_many_output_rows_with_the_limit_named) {
    Keyflow__V1__FunctionDescriptor *d = descriptor("f", "f.v1");
    fnh_limit(d, "max_output_rows", 4);
    cr_assert_eq(register_fn(d)->error.status, KF_OK);
    kf_cmd_t *c = push("p", 1, "[" ROW("a", 10, "many_rows", 0) "]", INT64_MIN);
    cr_assert_eq(c->error.status, KF_E_LIMIT, "%s", c->error.message);
    cr_assert(strstr(c->error.message, "max_output_rows") != NULL, "%s", c->error.message);
}

#define TWO_ROWS "[" ROW("a", 10, "ok", 5) "," ROW("b", 10, "ok", 6) "]"

Test(functions, a_retry_returns_the_original_ack_and_changes_nothing) {
    register_ok();
    Keyflow__V1__PushBatchResponse *a = push_ok(1, TWO_ROWS, INT64_MIN);
    cr_assert_eq(a->rows_accepted, 2);
    cr_assert_eq(a->first_output_seq, 1);
    cr_assert_eq(a->last_output_seq, 2);
    uint64_t writes = kf_memdisk_writes(sim.disk);
    kf_cmd_t *again = push("p", 1, TWO_ROWS, INT64_MIN);
    cr_assert_eq(again->error.status, KF_OK, "%s", again->error.message);
    Keyflow__V1__PushBatchResponse *b = (Keyflow__V1__PushBatchResponse *)again->response;
    cr_assert(b->duplicate);
    cr_assert_eq(b->rows_accepted, 2);
    cr_assert_eq(b->last_output_seq, 2);
    cr_assert_eq(kf_memdisk_writes(sim.disk), writes);
    cr_assert_eq(state_of("a")->value, 5);
    /* Another producer has its own sequence. */
    cr_assert_eq(push("q", 1, "[" ROW("a", 10, "ok", 7) "]", INT64_MIN)->error.status, KF_OK);
    /* After a crash the acknowledgement is still there. */
    sim_crash(&sim);
    again = push("p", 1, TWO_ROWS, INT64_MIN);
    cr_assert_eq(again->error.status, KF_OK, "%s", again->error.message);
    cr_assert(((Keyflow__V1__PushBatchResponse *)again->response)->duplicate);
    cr_assert_eq(((Keyflow__V1__PushBatchResponse *)again->response)->last_output_seq, 2);
    /* Sequences must go forward; very old ones are refused. */
    for (int64_t s = 2; s < 2 + KF_PRODUCER_ACKS_KEPT; s++) {
        push_ok(s, "[]", INT64_MIN);
    }
    kf_cmd_t *old = push("p", 1, TWO_ROWS, INT64_MIN);
    cr_assert_eq(old->error.status, KF_E_PRECONDITION, "%s", old->error.message);
    cr_assert(strstr(old->error.message, "sequence") != NULL);
    cr_assert_eq(push("p", 0, "[]", INT64_MIN)->error.status, KF_E_INVALID);
}

/* A retry of an acknowledged sequence with other content is a conflict,
 * not a retry: refused naming the sequence, nothing changed; the first
 * acknowledgement still answers the real retry. */
Test(functions, a_retry_with_other_content_is_refused_naming_the_sequence) {
    register_ok();
    push_ok(1, TWO_ROWS, 100);
    uint64_t writes = kf_memdisk_writes(sim.disk);
    const char *others[] = {
        "[" ROW("a", 10, "ok", 5) "," ROW("b", 10, "ok", 7) "]",    /* a value */
        "[" ROW("b", 10, "ok", 6) "," ROW("a", 10, "ok", 5) "]",    /* the order */
        "[" ROW("a", 10, "ok", 5) "]",                              /* a row fewer */
        "[" ROW("a", 10, "ok", 5) "," ROW("b", 10, "ok", null) "]", /* a null */
    };
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        kf_cmd_t *c = push("p", 1, others[i], 100);
        cr_assert_eq(c->error.status, KF_E_EXISTS, "%zu: %s", i, c->error.message);
        cr_assert(strstr(c->error.message, "sequence: 1 of producer p") != NULL, "%s",
                  c->error.message);
    }
    /* The same rows with another watermark, or none, differ too. */
    cr_assert_eq(push("p", 1, TWO_ROWS, 101)->error.status, KF_E_EXISTS);
    cr_assert_eq(push("p", 1, TWO_ROWS, INT64_MIN)->error.status, KF_E_EXISTS);
    cr_assert_eq(kf_memdisk_writes(sim.disk), writes, "nothing written");
    cr_assert_eq(state_of("b")->value, 6);
    /* The same rows sent as a columnar batch are the same content. */
    Keyflow__V1__PushBatchRequest req = KEYFLOW__V1__PUSH_BATCH_REQUEST__INIT;
    req.function_id = "f";
    req.producer_id = "p";
    req.sequence = 1;
    req.watermark_present_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US;
    req.watermark_us = 100;
    req.rows_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_BATCH;
    Keyflow__V1__RowBatch b = KEYFLOW__V1__ROW_BATCH__INIT;
    Keyflow__V1__Column cols[4], *ptrs[4];
    Keyflow__V1__StringValues keys = KEYFLOW__V1__STRING_VALUES__INIT,
                              modes = KEYFLOW__V1__STRING_VALUES__INIT;
    Keyflow__V1__Int64Values ts = KEYFLOW__V1__INT64_VALUES__INIT,
                             amounts = KEYFLOW__V1__INT64_VALUES__INIT;
    char *kv[] = {"a", "b"}, *mv[] = {"ok", "ok"};
    int64_t tv[] = {10, 10}, av[] = {5, 6};
    keys.n_values = modes.n_values = ts.n_values = amounts.n_values = 2;
    keys.values = kv;
    modes.values = mv;
    ts.values = tv;
    amounts.values = av;
    for (int i = 0; i < 4; i++) {
        keyflow__v1__column__init(&cols[i]);
        ptrs[i] = &cols[i];
    }
    cols[0].values_case = cols[2].values_case = KEYFLOW__V1__COLUMN__VALUES_STRINGS;
    cols[0].strings = &keys;
    cols[2].strings = &modes;
    cols[1].values_case = cols[3].values_case = KEYFLOW__V1__COLUMN__VALUES_INT64S;
    cols[1].int64s = &ts;
    cols[3].int64s = &amounts;
    b.row_count = 2;
    b.n_columns = 4;
    b.columns = ptrs;
    req.batch = &b;
    kf_cmd_t *c = sim_exec(&sim, KF_OP_PUSH_BATCH, &req.base);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    cr_assert(((Keyflow__V1__PushBatchResponse *)c->response)->duplicate);
    /* A null's placeholder value is not content. */
    push_ok(2, "[" ROW("c", 10, "ok", null) "]", INT64_MIN);
    Keyflow__V1__StringValues ck = KEYFLOW__V1__STRING_VALUES__INIT,
                              cm = KEYFLOW__V1__STRING_VALUES__INIT;
    Keyflow__V1__Int64Values cts = KEYFLOW__V1__INT64_VALUES__INIT,
                             cam = KEYFLOW__V1__INT64_VALUES__INIT;
    char *ckv[] = {"c"}, *cmv[] = {"ok"};
    int64_t ctv[] = {10}, cav[] = {12345};
    protobuf_c_boolean cnull[] = {1};
    ck.n_values = cm.n_values = cts.n_values = cam.n_values = 1;
    ck.values = ckv;
    cm.values = cmv;
    cts.values = ctv;
    cam.values = cav;
    cols[0].strings = &ck;
    cols[2].strings = &cm;
    cols[1].int64s = &cts;
    cols[3].int64s = &cam;
    cols[3].n_nulls = 1;
    cols[3].nulls = cnull;
    b.row_count = 1;
    req.sequence = 2;
    req.watermark_present_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__WATERMARK_PRESENT__NOT_SET;
    c = sim_exec(&sim, KF_OP_PUSH_BATCH, &req.base);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    cr_assert(((Keyflow__V1__PushBatchResponse *)c->response)->duplicate);
    /* The digests are stored with the acknowledgements. */
    sim_crash(&sim);
    cr_assert_eq(push("p", 1, others[0], 100)->error.status, KF_E_EXISTS);
    cr_assert_eq(push("p", 1, TWO_ROWS, 100)->error.status, KF_OK);
}

/* Acknowledgements stored before digests were kept have none: a retry of
 * their sequence gets the acknowledgement back whatever it holds, as it
 * did when they were written (docs/semantics.md). */
Test(functions, an_ack_stored_without_a_digest_answers_any_retry) {
    register_ok();
    push_ok(1, TWO_ROWS, INT64_MIN);
    /* Rewrite the stored producer as an older build wrote it. */
    const uint8_t key[5] = {0, 0, 0, 0, 'p'}; /* the first function's index, then "p" */
    kf_value_t v;
    bool found = false;
    kf_error_t err;
    cr_assert_eq(kf_store_get(sim.store, KF_CF_PRODUCERS, key, sizeof key, &v, &found, &err),
                 KF_OK);
    cr_assert(found);
    Keyflow__Records__ProducerRec *rec =
        keyflow__records__producer_rec__unpack(NULL, v.len, v.data);
    kf_store_value_free(&v);
    cr_assert_not_null(rec);
    cr_assert_eq(rec->n_acks, 1);
    cr_assert_eq(rec->acks[0]->digest.len, KF_SHA256_BYTES, "stored with its digest");
    rec->acks[0]->digest.len = 0;
    uint8_t buf[4096];
    size_t len = keyflow__records__producer_rec__pack(rec, buf);
    keyflow__records__producer_rec__free_unpacked(rec, NULL);
    sim_put_raw(&sim, KF_CF_PRODUCERS, key, sizeof key, buf, len);
    sim_crash(&sim);
    kf_cmd_t *c = push("p", 1, "[" ROW("z", 1, "ok", 1) "]", INT64_MIN);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    cr_assert(((Keyflow__V1__PushBatchResponse *)c->response)->duplicate);
    cr_assert_eq(((Keyflow__V1__PushBatchResponse *)c->response)->rows_accepted, 2);
    cr_assert_eq(state_of("z")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
}

Test(functions, rows_of_one_key_take_separate_calls_in_arrival_order) {
    Keyflow__V1__FunctionDescriptor *d = descriptor("f", "f.v1");
    fnh_limit(d, "max_batch_rows", 2);
    cr_assert_eq(register_fn(d)->error.status, KF_OK);
    Keyflow__V1__PushBatchResponse *r =
        push_ok(1,
                "[" ROW("a", 1, "ok", 1) "," ROW("b", 2, "ok", 2) "," ROW("c", 3, "ok", 3) "," ROW(
                    "d", 4, "ok", 4) "," ROW("e", 5, "ok", 5) "]",
                INT64_MIN);
    cr_assert_eq(r->handler_calls, 3, "5 distinct keys in calls of 2");
    r = push_ok(2,
                "[" ROW("a", 1, "ok", 10) "," ROW("a", 2, "ok", 11) "," ROW("a", 3, "ok", 12) "]",
                INT64_MIN);
    cr_assert_eq(r->handler_calls, 3, "one activation per key per call");
    cr_assert_eq(state_of("a")->value, 12, "the last row wins: arrival order kept");
    json_t *rows = output(5, 100, NULL);
    cr_assert_eq(json_array_size(rows), 3);
    for (size_t i = 0; i < 3; i++) {
        cr_assert_eq(out_int(rows, i, "n"), 10 + (int64_t)i);
        cr_assert_eq(out_int(rows, i, "_seq"), 6 + (int64_t)i);
    }
    json_decref(rows);
}

Test(functions, timers_fire_in_order_when_the_watermark_passes_them) {
    Keyflow__V1__FunctionDescriptor *d = descriptor("f", "f.v1");
    fnh_limit(d, "max_timer_callbacks_per_step", 2);
    cr_assert_eq(register_fn(d)->error.status, KF_OK);
    /* a@150, b@120, c@150, d@300, e@150 */
    push_ok(1,
            "[" ROW("a", 100, "timer", 50) "," ROW("b", 100, "timer", 20) "," ROW(
                "c", 100, "timer", 50) "," ROW("d", 100, "timer", 200) "," ROW("e", 100, "timer",
                                                                               50) "]",
            INT64_MIN);
    Keyflow__V1__GetKeyStateResponse *b = state_of("b");
    cr_assert_eq(b->n_timers, 1);
    cr_assert_eq(b->timers[0]->at_us, 120);
    Keyflow__V1__PushBatchResponse *r = push_ok(2, NULL, 200);
    cr_assert_eq(r->timer_callbacks, 2, "max_timer_callbacks_per_step in the batch's step");
    cr_assert_eq(r->due_timers, 2, "the rest wait for follow-on steps");
    cr_assert_eq(r->watermark_us, 200);
    cr_assert_eq(sim_run_work(&sim, 10), 1, "one follow-on step fires the other two");
    json_t *rows = output(0, 100, NULL);
    cr_assert_eq(json_array_size(rows), 4);
    const char *order[] = {"b", "a", "c", "e"};
    int64_t at[] = {120, 150, 150, 150};
    for (size_t i = 0; i < 4; i++) {
        cr_assert_str_eq(json_string_value(json_object_get(json_array_get(rows, i), "key")),
                         order[i]);
        cr_assert_eq(out_int(rows, i, "ts"), at[i]);
    }
    json_decref(rows);
    cr_assert_eq(state_of("a")->n_timers, 0, "a fired timer is gone");
    cr_assert_eq(state_of("d")->n_timers, 1);
    /* The watermark never goes back; a lower one changes nothing. */
    r = push_ok(3, NULL, 150);
    cr_assert_eq(r->watermark_us, 200);
    cr_assert_eq(r->timer_callbacks, 0);
    /* Timers survive a crash. */
    sim_crash(&sim);
    cr_assert_eq(state_of("d")->timers[0]->at_us, 300);
    r = push_ok(4, NULL, 1000);
    cr_assert_eq(r->timer_callbacks, 1);
}

Test(functions, input_must_match_the_schema_and_limits) {
    Keyflow__V1__FunctionDescriptor *d = descriptor("f", "f.v1");
    fnh_limit(d, "max_input_rows", 2);
    cr_assert_eq(register_fn(d)->error.status, KF_OK);
    kf_cmd_t *c = push("p", 1, "[{\"k\":\"a\",\"ts\":1}]", INT64_MIN);
    cr_assert_eq(c->error.status, KF_E_INVALID);
    cr_assert(strstr(c->error.message, "rows[0].mode") != NULL, "%s", c->error.message);
    c = push("p", 1, "[{\"k\":\"a\",\"ts\":\"soon\",\"mode\":\"ok\"}]", INT64_MIN);
    cr_assert(strstr(c->error.message, "rows[0].ts") != NULL, "%s", c->error.message);
    c = push("p", 1, "[{\"k\":\"a\",\"ts\":1,\"mode\":\"ok\",\"extra\":1}]", INT64_MIN);
    cr_assert(strstr(c->error.message, "rows[0].extra") != NULL, "%s", c->error.message);
    c = push("p", 1, "[" ROW("a", 1, "ok", 1) "," ROW("b", 1, "ok", 1) "," ROW("c", 1, "ok", 1) "]",
             INT64_MIN);
    cr_assert_eq(c->error.status, KF_E_TOO_LARGE);
    cr_assert(strstr(c->error.message, "max_input_rows") != NULL, "%s", c->error.message);
    cr_assert_eq(state_of("a")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
}

Test(functions, columnar_batches_are_checked_against_the_schema) {
    register_ok();
    Keyflow__V1__PushBatchRequest req = KEYFLOW__V1__PUSH_BATCH_REQUEST__INIT;
    req.function_id = "f";
    req.producer_id = "p";
    req.sequence = 1;
    req.rows_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_BATCH;
    Keyflow__V1__RowBatch b = KEYFLOW__V1__ROW_BATCH__INIT;
    Keyflow__V1__Column cols[4], *ptrs[4];
    Keyflow__V1__StringValues keys = KEYFLOW__V1__STRING_VALUES__INIT,
                              modes = KEYFLOW__V1__STRING_VALUES__INIT;
    Keyflow__V1__Int64Values ts = KEYFLOW__V1__INT64_VALUES__INIT,
                             amounts = KEYFLOW__V1__INT64_VALUES__INIT;
    char *kv[] = {"x", "y"}, *mv[] = {"ok", "ok"};
    int64_t tv[] = {5, 6}, av[] = {40, 2};
    protobuf_c_boolean nulls[] = {0, 1};
    keys.n_values = 2;
    keys.values = kv;
    modes.n_values = 2;
    modes.values = mv;
    ts.n_values = 2;
    ts.values = tv;
    amounts.n_values = 2;
    amounts.values = av;
    for (int i = 0; i < 4; i++) {
        keyflow__v1__column__init(&cols[i]);
        ptrs[i] = &cols[i];
    }
    cols[0].values_case = KEYFLOW__V1__COLUMN__VALUES_STRINGS;
    cols[0].strings = &keys;
    cols[1].values_case = KEYFLOW__V1__COLUMN__VALUES_INT64S;
    cols[1].int64s = &ts;
    cols[2].values_case = KEYFLOW__V1__COLUMN__VALUES_STRINGS;
    cols[2].strings = &modes;
    cols[3].values_case = KEYFLOW__V1__COLUMN__VALUES_INT64S;
    cols[3].int64s = &amounts;
    cols[3].n_nulls = 2;
    cols[3].nulls = nulls;
    b.row_count = 2;
    b.n_columns = 4;
    b.columns = ptrs;
    req.batch = &b;
    kf_cmd_t *c = sim_exec(&sim, KF_OP_PUSH_BATCH, &req.base);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    cr_assert_eq(state_of("x")->value, 40);
    cr_assert_eq(state_of("y")->value, 0, "a null amount reads as 0 in this handler");
    /* A null in a non-nullable column is refused. */
    cols[0].n_nulls = 2;
    cols[0].nulls = nulls;
    req.sequence = 2;
    c = sim_exec(&sim, KF_OP_PUSH_BATCH, &req.base);
    cr_assert_eq(c->error.status, KF_E_INVALID);
    cr_assert(strstr(c->error.message, "(k)") != NULL, "%s", c->error.message);
    /* A column of the wrong type is refused. */
    cols[0].n_nulls = 0;
    cols[1].values_case = KEYFLOW__V1__COLUMN__VALUES_STRINGS;
    cols[1].strings = &keys;
    c = sim_exec(&sim, KF_OP_PUSH_BATCH, &req.base);
    cr_assert_eq(c->error.status, KF_E_INVALID);
    cr_assert(strstr(c->error.message, "ts") != NULL, "%s", c->error.message);
}

Test(functions, max_keys_is_enforced_with_nothing_applied) {
    Keyflow__V1__FunctionDescriptor *d = descriptor("f", "f.v1");
    fnh_limit(d, "max_keys", 2);
    cr_assert_eq(register_fn(d)->error.status, KF_OK);
    push_ok(1, "[" ROW("a", 1, "ok", 1) "," ROW("b", 1, "ok", 1) "]", INT64_MIN);
    kf_cmd_t *c = push("p", 2, "[" ROW("a", 2, "ok", 2) "," ROW("c", 2, "ok", 1) "]", INT64_MIN);
    cr_assert_eq(c->error.status, KF_E_LIMIT);
    cr_assert(strstr(c->error.message, "max_keys") != NULL, "%s", c->error.message);
    cr_assert_eq(state_of("a")->value, 1);
    cr_assert_eq(state_of("c")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
    /* Clearing a key frees its slot. */
    push_ok(2, "[" ROW("a", 2, "clear", 0) "," ROW("c", 2, "ok", 3) "]", INT64_MIN);
    cr_assert_eq(state_of("c")->value, 3);
}

Test(functions, output_pages_across_chunks) {
    register_ok();
    char rows[64 * 1024];
    size_t o = 0;
    o += (size_t)snprintf(rows + o, sizeof rows - o, "[");
    for (int i = 0; i < 300; i++) {
        o += (size_t)snprintf(rows + o, sizeof rows - o,
                              "%s{\"k\":\"k%d\",\"ts\":%d,\"mode\":\"ok\",\"amount\":%d}",
                              i ? "," : "", i, i, i);
    }
    snprintf(rows + o, sizeof rows - o, "]");
    for (int64_t s = 1; s <= 3; s++) {
        push_ok(s, rows, INT64_MIN);
    }
    int64_t after = 0, seen = 0;
    for (;;) {
        Keyflow__V1__ReadOutputResponse *r;
        json_t *page = output(after, 128, &r);
        if (json_array_size(page) == 0) {
            json_decref(page);
            break;
        }
        for (size_t i = 0; i < json_array_size(page); i++) {
            cr_assert_eq(out_int(page, i, "_seq"), after + 1 + (int64_t)i);
            cr_assert_eq(out_int(page, i, "n"), (after + (int64_t)i) % 300);
        }
        seen += (int64_t)json_array_size(page);
        after = r->next_after_seq;
        json_decref(page);
    }
    cr_assert_eq(seen, 900);
    sim_crash(&sim);
    Keyflow__V1__ReadOutputResponse *r;
    json_t *tail = output(899, 10, &r);
    cr_assert_eq(json_array_size(tail), 1);
    cr_assert_eq(r->high_water_seq, 900);
    json_decref(tail);
}

/* The step as a resumable machine: with calls deferred (as a remote
 * handler's would be), a batch waits for its call's response, later batches
 * of the function queue behind it in order, and a refused response still
 * changes nothing. */
Test(functions, calls_answered_later_keep_order_and_atomicity) {
    sim.config.defer_handler_calls = true;
    sim_crash(&sim); /* the core again, with the seam on */
    register_ok();
    kf_cmd_t *a = push("p", 1, "[" ROW("a", 10, "ok", 5) "]", INT64_MIN);
    cr_assert_null(a->response, "the call is out: no reply yet");
    cr_assert_eq(a->error.status, KF_OK);
    kf_cmd_t *b = push("p", 2, "[" ROW("a", 11, "ok", 7) "]", INT64_MIN);
    cr_assert_not_null(b->parked, "queued behind the step in progress");
    cr_assert_null(b->response);
    cr_assert_eq(state_of("a")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT,
                 "nothing is applied before the response");
    sim_pump(&sim); /* a's response arrives; b starts and its call goes out */
    cr_assert_not_null(a->response, "%s", a->error.message);
    cr_assert_eq(((Keyflow__V1__PushBatchResponse *)a->response)->last_output_seq, 1);
    cr_assert_null(b->response);
    cr_assert_eq(state_of("a")->value, 5);
    sim_pump(&sim);
    cr_assert_not_null(b->response, "%s", b->error.message);
    cr_assert_eq(((Keyflow__V1__PushBatchResponse *)b->response)->first_output_seq, 2);
    cr_assert_eq(state_of("a")->value, 7);
    /* A refused response, taken later, still leaves nothing behind. */
    kf_cmd_t *c =
        push("p", 3, "[" ROW("a", 12, "ok", 9) "," ROW("a", 13, "fail", 0) "]", INT64_MIN);
    cr_assert_null(c->response);
    sim_pump(&sim); /* first call (a=9) answered and applied; the second goes out */
    cr_assert_null(c->response);
    sim_pump(&sim); /* the second is refused: the whole batch rolls back */
    cr_assert_eq(c->error.status, KF_E_PRECONDITION, "%s", c->error.message);
    cr_assert_eq(state_of("a")->value, 7);
    json_t *rows = output(0, 100, NULL);
    cr_assert_eq(json_array_size(rows), 2);
    json_decref(rows);
}

static Keyflow__V1__FunctionInfo *function_info(void) {
    return fnh_info("f");
}

/* Found by the seeded simulation (tests/sim): while a step waited for a
 * handler call, GetKeyState and GetFunction showed the calls it had
 * already applied - state the step could still roll back, and here does. */
Test(functions, reads_during_a_step_show_the_state_before_it) {
    sim.config.defer_handler_calls = true;
    sim_crash(&sim);
    register_ok();
    push("p", 1, "[" ROW("a", 10, "ok", 5) "]", INT64_MIN);
    sim_pump(&sim);
    cr_assert_eq(state_of("a")->value, 5);
    Keyflow__V1__FunctionInfo before = *function_info();
    kf_cmd_t *c = push("p", 2,
                       "[" ROW("a", 12, "ok", 9) "," ROW("a", 13, "timer", 100) "," ROW(
                           "b", 14, "ok", 1) "," ROW("a", 15, "fail", 0) "]",
                       INT64_MIN);
    for (int call = 1; call <= 2; call++) {
        sim_pump(&sim); /* one more call answered and applied; the next goes out */
        cr_assert_null(c->response, "call %d", call);
        Keyflow__V1__GetKeyStateResponse *a = state_of("a");
        cr_assert_eq(a->value, 5, "call %d: a shows %lld", call, (long long)a->value);
        cr_assert_eq(a->n_timers, 0, "call %d", call);
        cr_assert_eq(state_of("b")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
        Keyflow__V1__FunctionInfo *now = function_info();
        cr_assert_eq(now->keys, before.keys, "call %d", call);
        cr_assert_eq(now->timers, before.timers, "call %d", call);
        cr_assert_eq(now->state_bytes, before.state_bytes, "call %d", call);
    }
    cr_assert_eq(c->error.status, KF_OK, "the third call is still out");
    sim_pump(&sim); /* the third call is refused: the whole step rolls back */
    cr_assert_eq(c->error.status, KF_E_PRECONDITION, "%s", c->error.message);
    cr_assert_eq(state_of("a")->value, 5);
    cr_assert_eq(function_info()->keys, before.keys);
}

/* A core dropped while a step waits for its handler frees the step (the
 * ASan run's leak check fails otherwise; found by the seeded simulation). */
Test(functions, dropping_the_core_with_a_step_out_is_clean) {
    sim.config.defer_handler_calls = true;
    sim_crash(&sim);
    register_ok();
    kf_cmd_t *c = push("p", 1, "[" ROW("a", 10, "ok", 5) "," ROW("a", 11, "ok", 6) "]", INT64_MIN);
    sim_pump(&sim); /* the first call applied, the second out */
    cr_assert_null(c->response);
    sim_crash(&sim);
    cr_assert_eq(state_of("a")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
}

/* Rewrites the stored index of function `id` (its key prefix in every
 * state family), as a corrupt store or a buggy build could. */
static void set_stored_index(const char *id, uint32_t index) {
    kf_value_t v;
    bool found = false;
    kf_error_t err;
    cr_assert_eq(kf_store_get(sim.store, KF_CF_FUNCTIONS, id, strlen(id), &v, &found, &err), KF_OK);
    cr_assert(found);
    Keyflow__Records__FunctionRec *rec =
        keyflow__records__function_rec__unpack(NULL, v.len, v.data);
    kf_store_value_free(&v);
    cr_assert_not_null(rec);
    rec->index = index;
    uint8_t buf[8192];
    size_t len = keyflow__records__function_rec__pack(rec, buf);
    keyflow__records__function_rec__free_unpacked(rec, NULL);
    sim_put_raw(&sim, KF_CF_FUNCTIONS, id, strlen(id), buf, len);
}

/* Two functions under one index would read and write each other's state;
 * an index at or past the stored counter would be handed out again. */
Test(functions, recovery_refuses_a_function_index_in_use_or_past_the_counter) {
    register_ok();
    kf_cmd_t *g = register_fn(descriptor("g", "g.v1"));
    cr_assert_eq(g->error.status, KF_OK, "%s", g->error.message);
    push_ok(1, "[" ROW("a", 10, "ok", 5) "]", INT64_MIN);
    uint32_t indexes[] = {0, 2, UINT32_MAX};
    for (size_t i = 0; i < sizeof indexes / sizeof indexes[0]; i++) {
        set_stored_index("g", indexes[i]);
        kf_error_t err;
        cr_assert_eq(sim_restart_status(&sim, &err), KF_E_CORRUPT, "index %u", indexes[i]);
        cr_assert(strstr(err.message, "index") != NULL, "%s", err.message);
        set_stored_index("g", 1);
        cr_assert_eq(sim_restart_status(&sim, &err), KF_OK, "%s", err.message);
    }
    cr_assert_eq(state_of("a")->value, 5);
}
