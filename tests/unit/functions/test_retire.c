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
#include "base/metrics.h"
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

/* ---- DeleteFunction, DeleteProducer, producer expiry --------------------- */

static kf_cmd_t *delete_fn(const char *fid, bool allow_missing) {
    Keyflow__V1__DeleteFunctionRequest *req = A(Keyflow__V1__DeleteFunctionRequest);
    keyflow__v1__delete_function_request__init(req);
    req->function_id = (char *)fid;
    req->allow_missing = allow_missing;
    return sim_exec(&sim, KF_OP_DELETE_FUNCTION, &req->base);
}

static kf_cmd_t *delete_producer(const char *fid, const char *producer, bool allow_missing) {
    Keyflow__V1__DeleteProducerRequest *req = A(Keyflow__V1__DeleteProducerRequest);
    keyflow__v1__delete_producer_request__init(req);
    req->function_id = (char *)fid;
    req->producer_id = (char *)producer;
    req->allow_missing = allow_missing;
    return sim_exec(&sim, KF_OP_DELETE_PRODUCER, &req->base);
}

static kf_status_t get_status(const char *fid) {
    Keyflow__V1__GetFunctionRequest *req = A(Keyflow__V1__GetFunctionRequest);
    keyflow__v1__get_function_request__init(req);
    req->function_id = (char *)fid;
    return sim_exec(&sim, KF_OP_GET_FUNCTION, &req->base)->error.status;
}

/* Records of every function in the families a function writes. */
static size_t function_records(void) {
    static const kf_cf_t cfs[] = {KF_CF_FUNCTIONS,     KF_CF_CHECKPOINTS,    KF_CF_STATE,
                                  KF_CF_TIMERS_BY_KEY, KF_CF_TIMERS_BY_TIME, KF_CF_OUTPUT,
                                  KF_CF_OUTPUT_MARKS,  KF_CF_PRODUCERS};
    size_t n = 0;
    for (size_t i = 0; i < sizeof cfs / sizeof cfs[0]; i++) {
        n += stored(cfs[i]);
    }
    return n;
}

Test(retire, delete_function_removes_everything_and_frees_its_id) {
    register_ok(descriptor("f", "f.v1"));
    push_rows("f", 1, 3, 4);
    cr_assert_eq(push("f", "q", 1, "[{\"k\":\"t\",\"ts\":10,\"mode\":\"timer\",\"amount\":50}]")
                     ->error.status,
                 KF_OK);
    register_ok(descriptor("other", "other.v1"));
    push_rows("other", 1, 1, 2);
    size_t other_records = 0;
    {
        kf_cmd_t *d = delete_fn("other", false); /* measure what one function holds */
        cr_assert_eq(d->error.status, KF_OK, "%s", d->error.message);
        other_records = function_records();
        register_ok(descriptor("other", "other.v1"));
        push_rows("other", 1, 1, 2);
    }
    size_t before = function_records();
    kf_cmd_t *d = delete_fn("f", false);
    cr_assert_eq(d->error.status, KF_OK, "%s", d->error.message);
    Keyflow__V1__DeleteFunctionResponse *r = (Keyflow__V1__DeleteFunctionResponse *)d->response;
    cr_assert(r->deleted);
    cr_assert_eq(r->keys, 5);
    cr_assert_eq(r->timers, 1);
    cr_assert_eq(r->output_rows, 12);
    cr_assert_eq(r->producers, 2);
    cr_assert_lt(function_records(), before);
    cr_assert_eq(get_status("f"), KF_E_NOT_FOUND);
    cr_assert_eq(read_output("f", 0)->error.status, KF_E_NOT_FOUND);
    cr_assert_eq(delete_fn("f", false)->error.status, KF_E_NOT_FOUND);
    kf_cmd_t *again = delete_fn("f", true);
    cr_assert_eq(again->error.status, KF_OK, "allow_missing");
    cr_assert_not(((Keyflow__V1__DeleteFunctionResponse *)again->response)->deleted);
    cr_assert_eq(get_status("other"), KF_OK, "the other function is untouched");
    cr_assert_eq(read_ok("other", 0)->last_seq, 2);

    /* The id and the pipeline state id are free again, for any descriptor. */
    Keyflow__V1__FunctionDescriptor *changed =
        with_retention(descriptor("f", "f.v1"), OUT, 100, OUT);
    changed->value_state_name = "w";
    register_ok(changed);
    cr_assert_eq(info("f")->output_seq, 0, "a new function starts empty");
    cr_assert_eq(info("f")->keys, 0);
    push_rows("f", 1, 1, 1);
    cr_assert_eq(read_ok("f", 0)->first_seq, 1);
    sim_crash(&sim);
    cr_assert_eq(info("f")->output_seq, 1);
    cr_assert_eq(info("f")->producers, 1, "q is gone with the old function");
    cr_assert_eq(read_ok("other", 0)->last_seq, 2);
    cr_assert_eq(delete_fn("f", false)->error.status, KF_OK);
    cr_assert_eq(delete_fn("other", false)->error.status, KF_OK);
    cr_assert_eq(function_records(), 0, "nothing of either is left (%zu)", other_records);
}

Test(retire, delete_function_ends_batches_and_reads_in_flight) {
    sim.config.defer_handler_calls = true;
    sim_crash(&sim);
    register_ok(descriptor("f", "f.v1"));
    kf_cmd_t *a = push("f", "p", 1, "[{\"k\":\"a\",\"ts\":10,\"mode\":\"ok\",\"amount\":1}]");
    cr_assert_null(a->response, "its call is out");
    kf_cmd_t *b = push("f", "p", 2, "[{\"k\":\"a\",\"ts\":11,\"mode\":\"ok\",\"amount\":2}]");
    cr_assert_not_null(b->parked, "queued behind a");
    Keyflow__V1__ReadOutputRequest *rr = A(Keyflow__V1__ReadOutputRequest);
    keyflow__v1__read_output_request__init(rr);
    rr->function_id = "f";
    rr->wait_ms = 30000;
    kf_cmd_t *parked = sim_exec(&sim, KF_OP_READ_OUTPUT, &rr->base);
    cr_assert_not_null(parked->parked);
    cr_assert_eq(delete_fn("f", false)->error.status, KF_OK);
    cr_assert_eq(a->error.status, KF_E_ABORTED, "%s", a->error.message);
    cr_assert(strstr(a->error.message, "deleted") != NULL, "%s", a->error.message);
    cr_assert_eq(b->error.status, KF_E_ABORTED);
    cr_assert_eq(parked->error.status, KF_E_NOT_FOUND, "%s", parked->error.message);
    cr_assert_null(parked->parked);
    sim_pump(&sim); /* nothing is out any more */
    cr_assert_eq(function_records(), 0);
    register_ok(descriptor("f", "f.v1"));
    kf_cmd_t *c = push("f", "p", 1, "[{\"k\":\"a\",\"ts\":10,\"mode\":\"ok\",\"amount\":3}]");
    sim_pump(&sim);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    cr_assert_eq(((Keyflow__V1__PushBatchResponse *)c->response)->first_output_seq, 1);
}

Test(retire, delete_producer_forgets_its_sequence) {
    register_ok(descriptor("f", "f.v1"));
    push_rows("f", 5, 1, 1);
    cr_assert_eq(info("f")->producers, 1);
    kf_cmd_t *d = delete_producer("f", "p", false);
    cr_assert_eq(d->error.status, KF_OK, "%s", d->error.message);
    cr_assert_eq(((Keyflow__V1__DeleteProducerResponse *)d->response)->last_sequence, 5);
    cr_assert_eq(stored(KF_CF_PRODUCERS), 0);
    cr_assert_eq(info("f")->producers, 0);
    cr_assert_eq(delete_producer("f", "p", false)->error.status, KF_E_NOT_FOUND);
    cr_assert_eq(delete_producer("f", "p", true)->error.status, KF_OK);
    cr_assert_eq(delete_producer("f", "", true)->error.status, KF_E_INVALID);
    cr_assert_eq(delete_producer("g", "p", true)->error.status, KF_E_NOT_FOUND);
    sim_crash(&sim);
    cr_assert_eq(info("f")->producers, 0);
    kf_cmd_t *c = push("f", "p", 1, "[{\"k\":\"a\",\"ts\":10,\"mode\":\"ok\",\"amount\":3}]");
    cr_assert_eq(c->error.status, KF_OK, "a new producer starts at any sequence");
    cr_assert_not(((Keyflow__V1__PushBatchResponse *)c->response)->duplicate);
}

Test(retire, idle_producers_expire_oldest_first_across_restarts) {
    sim.config.producer_idle_expiry_ms = 60000;
    sim_crash(&sim);
    register_ok(descriptor("f", "f.v1"));
    cr_assert_eq(push("f", "old", 1, "[]")->error.status, KF_OK);
    sim_advance(&sim, sim.now_ms + 30000);
    cr_assert_eq(push("f", "new", 1, "[]")->error.status, KF_OK);
    cr_assert_eq(push("f", "old", 1, "[]")->error.status, KF_OK, "a retry");
    sim_advance(&sim, sim.now_ms + 29000);
    cr_assert_eq(info("f")->producers, 2, "a retry keeps a producer alive too");
    sim_crash(&sim); /* the retry was not written: "old" is idle since t0 */
    sim_advance(&sim, sim.now_ms + 1000);
    cr_assert_eq(info("f")->producers, 1);
    cr_assert_eq(delete_producer("f", "old", false)->error.status, KF_E_NOT_FOUND);
    cr_assert_eq(stored(KF_CF_PRODUCERS), 1);
    sim_advance(&sim, sim.now_ms + 30000);
    cr_assert_eq(info("f")->producers, 0);
    cr_assert_eq(stored(KF_CF_PRODUCERS), 0);
}

/* ---- the memory budget --------------------------------------------------- */

static int64_t memory_used(void) {
    sim_advance(&sim, sim.now_ms); /* a turn refreshes the count */
    return kf_gauge_get(KF_G_MEMORY_USED_BYTES);
}

static kf_cmd_t *push_key(const char *producer, int64_t seq, int key) {
    char rows[128];
    snprintf(rows, sizeof rows, "[{\"k\":\"key%d\",\"ts\":10,\"mode\":\"ok\",\"amount\":1}]", key);
    return push("f", producer, seq, rows);
}

Test(retire, the_memory_budget_admits_only_new_keys_producers_and_functions) {
    register_ok(descriptor("f", "f.v1"));
    cr_assert_eq(push_key("p", 1, 0)->error.status, KF_OK);
    int64_t one_key = memory_used();
    cr_assert_eq(push_key("p", 2, 1)->error.status, KF_OK);
    int64_t per_key = memory_used() - one_key;
    cr_assert_gt(per_key, 0);
    /* Room for about three more keys. */
    sim.config.memory_budget_bytes = (uint64_t)(memory_used() + 3 * per_key + per_key / 2);
    sim_crash(&sim);
    cr_assert_eq(kf_gauge_get(KF_G_MEMORY_BUDGET_BYTES), (int64_t)sim.config.memory_budget_bytes);
    int64_t seq = 3, key = 2;
    kf_cmd_t *c;
    while ((c = push_key("p", seq, (int)key))->error.status == KF_OK) {
        seq++, key++;
        cr_assert_lt(key, 100, "the budget never refused a key");
    }
    cr_assert_eq(key, 5, "three more keys fit");
    cr_assert_eq(c->error.status, KF_E_LIMIT);
    cr_assert(strstr(c->error.message, "memory budget: new keys") != NULL, "%s", c->error.message);
    cr_assert_eq(info("f")->keys, 5, "the refused batch applied nothing");
    cr_assert_eq(push_key("p", seq, 0)->error.status, KF_OK, "an existing key keeps working");
    c = push_key("q", 1, 1);
    cr_assert_eq(c->error.status, KF_E_LIMIT);
    cr_assert(strstr(c->error.message, "a new producer") != NULL, "%s", c->error.message);
    c = register_fn(descriptor("g", "g.v1"));
    cr_assert_eq(c->error.status, KF_E_LIMIT);
    cr_assert(strstr(c->error.message, "a new function") != NULL, "%s", c->error.message);
    /* Retiring makes room again. */
    cr_assert_eq(delete_fn("f", false)->error.status, KF_OK);
    register_ok(descriptor("g", "g.v1"));
}
