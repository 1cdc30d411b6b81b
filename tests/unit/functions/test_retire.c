/*
 * test_retire.c - retiring what process functions accumulate, over the
 * deterministic engine core with the misbehaving plugin: output retention
 * (row, age and byte bounds, TrimOutput, reads below the retained range),
 * each durable across a crash.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "../engine/sim.h"
#include "base/crypto.h"
#include "keyflow/v1/functions.pb-c.h"

static sim_t sim;
static char digest[KF_SHA256_HEX_BYTES + 1];

static void setup(void) {
    sim_open_plugins(&sim, 7, KF_TEST_PLUGIN_DIR);
    uint8_t d[KF_SHA256_BYTES];
    kf_error_t err;
    cr_assert_eq(kf_sha256_file(KF_TEST_MISBEHAVING, d, &err), KF_OK, "%s", err.message);
    kf_hex_encode(d, sizeof d, digest);
}
static void teardown(void) {
    sim_close(&sim);
}

TestSuite(retire, .init = setup, .fini = teardown, .timeout = 60);

#define A(T) kf_arena_zalloc(&sim.arena, sizeof(T))

static Keyflow__V1__Field *field(const char *name, Keyflow__V1__FieldType t, bool nullable) {
    Keyflow__V1__Field *f = A(Keyflow__V1__Field);
    keyflow__v1__field__init(f);
    f->name = (char *)name;
    f->type = t;
    f->nullable = nullable;
    return f;
}

/* The misbehaving plugin's descriptor (tests/unit/functions/misbehaving.c). */
static Keyflow__V1__FunctionDescriptor *descriptor(const char *id, const char *state_id) {
    Keyflow__V1__FunctionDescriptor *d = A(Keyflow__V1__FunctionDescriptor);
    keyflow__v1__function_descriptor__init(d);
    d->version = 1;
    d->function_id = (char *)id;
    d->pipeline_state_id = (char *)state_id;
    d->runtime = KEYFLOW__V1__RUNTIME__RUNTIME_NATIVE;
    d->implementation_digest = digest;
    Keyflow__V1__Schema *in = A(Keyflow__V1__Schema), *out = A(Keyflow__V1__Schema);
    keyflow__v1__schema__init(in);
    keyflow__v1__schema__init(out);
    in->n_fields = 4;
    in->fields = kf_arena_zalloc(&sim.arena, 4 * sizeof *in->fields);
    in->fields[0] = field("k", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, false);
    in->fields[1] = field("ts", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US, false);
    in->fields[2] = field("mode", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, false);
    in->fields[3] = field("amount", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64, true);
    out->n_fields = 3;
    out->fields = kf_arena_zalloc(&sim.arena, 3 * sizeof *out->fields);
    out->fields[0] = field("key", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, false);
    out->fields[1] = field("ts", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US, false);
    out->fields[2] = field("n", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64, false);
    d->input_schema = in;
    d->output_schema = out;
    static char *keys[] = {"k"};
    static char *timers[] = {"t"};
    d->n_key_columns = 1;
    d->key_columns = keys;
    d->event_time_column = "ts";
    d->output_event_time_column = "ts";
    d->value_state_name = "v";
    d->n_timer_names = 1;
    d->timer_names = timers;
    return d;
}

/* Retention bounds: OUT leaves one out (the server's default). */
#define OUT INT64_MIN
static Keyflow__V1__FunctionDescriptor *
with_retention(Keyflow__V1__FunctionDescriptor *d, int64_t age_ms, int64_t rows, int64_t bytes) {
    Keyflow__V1__OutputRetention *r = A(Keyflow__V1__OutputRetention);
    keyflow__v1__output_retention__init(r);
    if (age_ms != OUT) {
        r->max_age_ms_present_case = KEYFLOW__V1__OUTPUT_RETENTION__MAX_AGE_MS_PRESENT_MAX_AGE_MS;
        r->max_age_ms = age_ms;
    }
    if (rows != OUT) {
        r->max_rows_present_case = KEYFLOW__V1__OUTPUT_RETENTION__MAX_ROWS_PRESENT_MAX_ROWS;
        r->max_rows = rows;
    }
    if (bytes != OUT) {
        r->max_bytes_present_case = KEYFLOW__V1__OUTPUT_RETENTION__MAX_BYTES_PRESENT_MAX_BYTES;
        r->max_bytes = bytes;
    }
    d->output_retention = r;
    return d;
}

static kf_cmd_t *register_fn(Keyflow__V1__FunctionDescriptor *d) {
    Keyflow__V1__RegisterFunctionRequest *req = A(Keyflow__V1__RegisterFunctionRequest);
    keyflow__v1__register_function_request__init(req);
    req->descriptor = d;
    return sim_exec(&sim, KF_OP_REGISTER_FUNCTION, &req->base);
}

static void register_ok(Keyflow__V1__FunctionDescriptor *d) {
    kf_cmd_t *c = register_fn(d);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
}

static kf_cmd_t *push(const char *fid, const char *producer, int64_t seq, const char *rows) {
    Keyflow__V1__PushBatchRequest *req = A(Keyflow__V1__PushBatchRequest);
    keyflow__v1__push_batch_request__init(req);
    req->function_id = (char *)fid;
    req->producer_id = (char *)producer;
    req->sequence = seq;
    req->rows_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_ROWS_JSON;
    req->rows_json = kf_arena_strdup(&sim.arena, rows);
    return sim_exec(&sim, KF_OP_PUSH_BATCH, &req->base);
}

/* Pushes `batches` batches of `rows` output rows each from producer "p",
 * starting at sequence `seq`, one step (and one output chunk) each. */
static void push_rows(const char *fid, int64_t seq, int batches, int rows) {
    for (int b = 0; b < batches; b++) {
        char text[4096] = "[";
        for (int r = 0; r < rows; r++) {
            size_t len = strlen(text);
            snprintf(text + len, sizeof text - len,
                     "%s{\"k\":\"k%d\",\"ts\":10,\"mode\":\"ok\",\"amount\":%d}", r ? "," : "", r,
                     r);
        }
        strcat(text, "]");
        kf_cmd_t *c = push(fid, "p", seq + b, text);
        cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    }
}

static kf_cmd_t *read_output(const char *fid, int64_t after) {
    Keyflow__V1__ReadOutputRequest *req = A(Keyflow__V1__ReadOutputRequest);
    keyflow__v1__read_output_request__init(req);
    req->function_id = (char *)fid;
    req->after_seq = after;
    req->limit = 1000;
    req->format = KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON;
    return sim_exec(&sim, KF_OP_READ_OUTPUT, &req->base);
}

static Keyflow__V1__ReadOutputResponse *read_ok(const char *fid, int64_t after) {
    kf_cmd_t *c = read_output(fid, after);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    return (Keyflow__V1__ReadOutputResponse *)c->response;
}

static kf_cmd_t *trim(const char *fid, int64_t before) {
    Keyflow__V1__TrimOutputRequest *req = A(Keyflow__V1__TrimOutputRequest);
    keyflow__v1__trim_output_request__init(req);
    req->function_id = (char *)fid;
    req->before_seq = before;
    return sim_exec(&sim, KF_OP_TRIM_OUTPUT, &req->base);
}

static Keyflow__V1__FunctionInfo *info(const char *fid) {
    Keyflow__V1__GetFunctionRequest *req = A(Keyflow__V1__GetFunctionRequest);
    keyflow__v1__get_function_request__init(req);
    req->function_id = (char *)fid;
    kf_cmd_t *c = sim_exec(&sim, KF_OP_GET_FUNCTION, &req->base);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    return (Keyflow__V1__FunctionInfo *)c->response;
}

/* Output chunks of any function still stored. */
static size_t stored(kf_cf_t cf) {
    kf_iter_t *it;
    kf_error_t err;
    cr_assert_eq(kf_iter_create(sim.store, cf, NULL, 0, NULL, 0, &it, &err), KF_OK);
    size_t n = 0;
    for (kf_iter_seek_first(it); kf_iter_valid(it); kf_iter_next(it)) {
        n++;
    }
    kf_iter_destroy(it);
    return n;
}

/* Lets the retention sweep run (it runs from timer turns). */
static void sweep(void) {
    sim_advance(&sim, sim.now_ms + KF_RETENTION_SWEEP_INTERVAL_MS);
}

Test(retire, trim_output_drops_rows_for_readers_then_from_disk) {
    register_ok(descriptor("f", "f.v1"));
    push_rows("f", 1, 10, 3); /* rows 1..30 in 10 chunks */
    cr_assert_eq(info("f")->first_retained_seq, 1);
    cr_assert_eq(info("f")->retained_rows, 30);
    cr_assert_gt(info("f")->retained_bytes, 0);
    int64_t bytes0 = info("f")->retained_bytes;

    kf_cmd_t *t = trim("f", 8); /* rows 1..7: chunks 1-3 and 4-6 wholly, 7 of 7-9 */
    cr_assert_eq(t->error.status, KF_OK, "%s", t->error.message);
    cr_assert_eq(((Keyflow__V1__TrimOutputResponse *)t->response)->first_retained_seq, 8);
    kf_cmd_t *r = read_output("f", 0);
    cr_assert_eq(r->error.status, KF_E_RANGE);
    cr_assert(strstr(r->error.message, "first retained sequence is 8") != NULL, "%s",
              r->error.message);
    cr_assert_eq(read_output("f", 6)->error.status, KF_E_RANGE);
    Keyflow__V1__ReadOutputResponse *ok = read_ok("f", 7);
    cr_assert_eq(ok->first_seq, 8);
    cr_assert_eq(ok->last_seq, 30);
    cr_assert_eq(ok->first_retained_seq, 8);
    cr_assert_eq(info("f")->retained_rows, 23);

    cr_assert_eq(stored(KF_CF_OUTPUT), 10, "trimming is logical until the sweep");
    sweep();
    cr_assert_eq(stored(KF_CF_OUTPUT), 8, "the two whole chunks before row 8 are deleted");
    cr_assert_eq(stored(KF_CF_OUTPUT_MARKS), 8);
    cr_assert_lt(info("f")->retained_bytes, bytes0);
    cr_assert_eq(read_ok("f", 7)->first_seq, 8, "the straddling chunk still serves row 8");

    /* Idempotent, durable, and never backwards. */
    cr_assert_eq(trim("f", 3)->error.status, KF_OK);
    cr_assert_eq(trim("f", 8)->error.status, KF_OK);
    sim_crash(&sim);
    cr_assert_eq(info("f")->first_retained_seq, 8);
    cr_assert_eq(read_output("f", 6)->error.status, KF_E_RANGE);
    cr_assert_eq(read_ok("f", 7)->first_seq, 8);
    cr_assert_eq(trim("f", 31)->error.status, KF_OK, "everything read");
    sweep();
    cr_assert_eq(stored(KF_CF_OUTPUT), 0);
    cr_assert_eq(info("f")->retained_bytes, 0);
    cr_assert_eq(info("f")->retained_rows, 0);
    cr_assert_eq(info("f")->first_retained_seq, 31);
    Keyflow__V1__ReadOutputResponse *empty = read_ok("f", 30);
    cr_assert_eq(empty->first_seq, 0);
    cr_assert_eq(empty->high_water_seq, 30);
    push_rows("f", 11, 1, 2);
    cr_assert_eq(read_ok("f", 30)->first_seq, 31, "new rows follow on");
}

Test(retire, trim_output_refuses_positions_past_the_output) {
    register_ok(descriptor("f", "f.v1"));
    push_rows("f", 1, 1, 3);
    kf_cmd_t *t = trim("f", 5);
    cr_assert_eq(t->error.status, KF_E_RANGE);
    cr_assert(strstr(t->error.message, "before_seq") != NULL, "%s", t->error.message);
    cr_assert_eq(trim("f", -1)->error.status, KF_E_INVALID);
    cr_assert_eq(trim("nope", 1)->error.status, KF_E_NOT_FOUND);
    cr_assert_eq(info("f")->first_retained_seq, 1, "nothing changed");
}

Test(retire, the_row_bound_keeps_the_newest_rows) {
    register_ok(with_retention(descriptor("f", "f.v1"), OUT, 10, OUT));
    cr_assert_eq(info("f")->output_retention->max_rows, 10);
    cr_assert_eq(info("f")->output_retention->max_age_ms, KF_OUTPUT_RETENTION_MS_DEFAULT,
                 "the bound left out is the server's");
    push_rows("f", 1, 8, 4); /* rows 1..32 */
    sweep();
    cr_assert_eq(info("f")->first_retained_seq, 23);
    cr_assert_eq(read_output("f", 21)->error.status, KF_E_RANGE);
    cr_assert_eq(read_ok("f", 22)->first_seq, 23);
    cr_assert_eq(stored(KF_CF_OUTPUT), 3, "chunks 21-24 (partly kept), 25-28, 29-32");
    sim_crash(&sim);
    cr_assert_eq(info("f")->first_retained_seq, 23);
    cr_assert_eq(stored(KF_CF_OUTPUT), 3);
}

Test(retire, the_age_bound_drops_chunks_written_before_it) {
    register_ok(with_retention(descriptor("f", "f.v1"), 60000, 0, 0));
    push_rows("f", 1, 2, 3); /* rows 1..6 at t0 */
    sim_advance(&sim, sim.now_ms + 30000);
    push_rows("f", 3, 1, 3); /* rows 7..9 at t0 + 30 s */
    sim_advance(&sim, sim.now_ms + 30000);
    cr_assert_eq(info("f")->first_retained_seq, 7, "the first two chunks are a minute old");
    cr_assert_eq(stored(KF_CF_OUTPUT), 1);
    sim_advance(&sim, sim.now_ms + 30000);
    cr_assert_eq(info("f")->first_retained_seq, 10);
    cr_assert_eq(stored(KF_CF_OUTPUT), 0);
    cr_assert_eq(info("f")->retained_bytes, 0);
}

Test(retire, the_byte_bound_drops_the_oldest_chunks) {
    register_ok(with_retention(descriptor("f", "f.v1"), 0, 0, 1));
    push_rows("f", 1, 1, 2);
    int64_t chunk = info("f")->retained_bytes;
    cr_assert_gt(chunk, 0);
    sim_close(&sim);
    setup();
    register_ok(with_retention(descriptor("f", "f.v1"), 0, 0, 3 * chunk));
    push_rows("f", 1, 5, 2); /* five chunks of the same size */
    sweep();
    cr_assert_eq(stored(KF_CF_OUTPUT), 3);
    cr_assert_eq(info("f")->retained_bytes, 3 * chunk);
    cr_assert_eq(info("f")->first_retained_seq, 5);
}

Test(retire, a_backlog_is_trimmed_in_bounded_slices) {
    register_ok(descriptor("f", "f.v1"));
    int batches = KF_OUTPUT_TRIM_CHUNKS_PER_TURN + 10;
    for (int b = 0; b < batches; b++) {
        cr_assert_eq(push("f", "p", b + 1, "[{\"k\":\"a\",\"ts\":1,\"mode\":\"ok\",\"amount\":1}]")
                         ->error.status,
                     KF_OK);
    }
    cr_assert_eq(trim("f", batches + 1)->error.status, KF_OK);
    kf_core_begin(sim.core, sim.batch, sim.group, sim.now_ms + KF_RETENTION_SWEEP_INTERVAL_MS);
    sim.now_ms += KF_RETENTION_SWEEP_INTERVAL_MS;
    kf_core_tick(sim.core, KF_TIMERS_PER_TURN_MAX);
    sim_step(&sim);
    cr_assert_eq(stored(KF_CF_OUTPUT), 10, "one slice deleted KF_OUTPUT_TRIM_CHUNKS_PER_TURN");
    cr_assert_eq(kf_core_next_due_ms(sim.core), sim.now_ms, "the rest goes next turn");
    sweep();
    cr_assert_eq(stored(KF_CF_OUTPUT), 0);
}

Test(retire, the_server_default_applies_to_bounds_a_descriptor_leaves_out) {
    sim_close(&sim);
    setup();
    sim.config.output_retention_set = true;
    sim.config.output_retention = (kf_retention_t){0, 5, 0};
    sim_crash(&sim); /* a core with the new configuration */
    register_ok(descriptor("f", "f.v1"));
    register_ok(with_retention(descriptor("g", "g.v1"), OUT, 0, OUT));
    push_rows("f", 1, 3, 4);
    push_rows("g", 1, 3, 4);
    sweep();
    cr_assert_eq(info("f")->first_retained_seq, 8);
    cr_assert_eq(info("f")->output_retention->max_age_ms, 0);
    cr_assert_eq(info("g")->first_retained_seq, 1, "g keeps every row");
}

Test(retire, retention_is_checked_and_leaves_the_descriptor_identity_alone) {
    kf_cmd_t *c = register_fn(with_retention(descriptor("f", "f.v1"), -5, OUT, OUT));
    cr_assert_eq(c->error.status, KF_E_INVALID);
    cr_assert(strstr(c->error.message, "output_retention.max_age_ms") != NULL, "%s",
              c->error.message);
    c = register_fn(with_retention(descriptor("f", "f.v1"), OUT, -2, OUT));
    cr_assert(strstr(c->error.message, "output_retention.max_rows") != NULL, "%s",
              c->error.message);
    register_ok(descriptor("f", "f.v1"));
    /* An empty retention is no retention: the same descriptor. */
    c = register_fn(with_retention(descriptor("f", "f.v1"), OUT, OUT, OUT));
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    cr_assert(((Keyflow__V1__RegisterFunctionResponse *)c->response)->already_registered);
    c = register_fn(with_retention(descriptor("f", "f.v1"), OUT, 10, OUT));
    cr_assert_eq(c->error.status, KF_E_EXISTS, "a retention is part of the descriptor");
}

/* Output written before marks existed has none: it goes as one old chunk. */
Test(retire, chunks_without_marks_are_trimmed_too) {
    register_ok(descriptor("f", "f.v1"));
    push_rows("f", 1, 4, 2); /* rows 1..8 */
    kf_batch_t *b = kf_batch_create(sim.store);
    kf_batch_delete_range(b, KF_CF_OUTPUT_MARKS, "", 0, "\xff", 1);
    kf_error_t err;
    cr_assert_eq(kf_store_write(sim.store, b, &err), KF_OK);
    kf_batch_destroy(b);
    push_rows("f", 5, 2, 2); /* rows 9..12, with marks */
    cr_assert_eq(trim("f", 3)->error.status, KF_OK);
    sweep();
    cr_assert_eq(stored(KF_CF_OUTPUT), 6, "unmarked chunks go only as a whole");
    cr_assert_eq(trim("f", 11)->error.status, KF_OK);
    sweep();
    cr_assert_eq(stored(KF_CF_OUTPUT), 1);
    cr_assert_eq(read_ok("f", 10)->first_seq, 11);
}
