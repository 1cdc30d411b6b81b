/* fn_harness.c - see fn_harness.h. */
#include "fn_harness.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

sim_t sim;
static char misbehaving_digest[KF_SHA256_HEX_BYTES + 1];
static char timer_names_digest[KF_SHA256_HEX_BYTES + 1];

static void digest_of(const char *path, char *hex) {
    uint8_t d[KF_SHA256_BYTES];
    kf_error_t err;
    cr_assert_eq(kf_sha256_file(path, d, &err), KF_OK, "%s", err.message);
    kf_hex_encode(d, sizeof d, hex);
}

void fnh_setup(void) {
    sim_open_plugins(&sim, 11, KF_TEST_PLUGIN_DIR);
    digest_of(KF_TEST_MISBEHAVING, misbehaving_digest);
    digest_of(KF_TEST_TIMER_NAMES, timer_names_digest);
}

void fnh_teardown(void) {
    sim_close(&sim);
}

#define A(T) kf_arena_zalloc(&sim.arena, sizeof(T))

static Keyflow__V1__Field *field(const char *name, Keyflow__V1__FieldType t, bool nullable) {
    Keyflow__V1__Field *f = A(Keyflow__V1__Field);
    keyflow__v1__field__init(f);
    f->name = (char *)name;
    f->type = t;
    f->nullable = nullable;
    return f;
}

static Keyflow__V1__Schema *schema(size_t n) {
    Keyflow__V1__Schema *s = A(Keyflow__V1__Schema);
    keyflow__v1__schema__init(s);
    s->n_fields = n;
    s->fields = kf_arena_zalloc(&sim.arena, n * sizeof *s->fields);
    return s;
}

/* Everything but the schemas, the digest and the timers. */
static Keyflow__V1__FunctionDescriptor *base(const char *id, const char *state_id) {
    Keyflow__V1__FunctionDescriptor *d = A(Keyflow__V1__FunctionDescriptor);
    keyflow__v1__function_descriptor__init(d);
    d->version = 1;
    d->function_id = kf_arena_strdup(&sim.arena, id);
    d->pipeline_state_id = kf_arena_strdup(&sim.arena, state_id);
    d->runtime = KEYFLOW__V1__RUNTIME__RUNTIME_NATIVE;
    static char *keys[] = {"k"};
    d->n_key_columns = 1;
    d->key_columns = keys;
    d->event_time_column = "ts";
    d->output_event_time_column = "ts";
    d->value_state_name = "v";
    d->limits = A(Keyflow__V1__FunctionLimits);
    keyflow__v1__function_limits__init(d->limits);
    return d;
}

Keyflow__V1__FunctionDescriptor *fnh_descriptor(const char *id, const char *state_id) {
    Keyflow__V1__FunctionDescriptor *d = base(id, state_id);
    d->implementation_digest = misbehaving_digest;
    Keyflow__V1__Schema *in = schema(4), *out = schema(3);
    in->fields[0] = field("k", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, false);
    in->fields[1] = field("ts", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US, false);
    in->fields[2] = field("mode", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, false);
    in->fields[3] = field("amount", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64, true);
    out->fields[0] = field("key", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, false);
    out->fields[1] = field("ts", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US, false);
    out->fields[2] = field("n", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64, false);
    d->input_schema = in;
    d->output_schema = out;
    static char *timers[] = {"t"};
    d->n_timer_names = 1;
    d->timer_names = timers;
    return d;
}

Keyflow__V1__FunctionDescriptor *fnh_timer_names_descriptor(const char *id, const char *state_id,
                                                            const char *const *names,
                                                            size_t count) {
    Keyflow__V1__FunctionDescriptor *d = base(id, state_id);
    d->implementation_digest = timer_names_digest;
    Keyflow__V1__Schema *in = schema(5), *out = schema(3);
    in->fields[0] = field("k", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, false);
    in->fields[1] = field("ts", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US, false);
    in->fields[2] = field("op", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, false);
    in->fields[3] = field("names", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, false);
    in->fields[4] = field("at", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64, false);
    out->fields[0] = field("key", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, false);
    out->fields[1] = field("ts", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US, false);
    out->fields[2] = field("name", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, false);
    d->input_schema = in;
    d->output_schema = out;
    d->n_timer_names = count;
    d->timer_names = kf_arena_zalloc(&sim.arena, (count + 1) * sizeof(char *));
    for (size_t i = 0; i < count; i++) {
        d->timer_names[i] = kf_arena_strdup(&sim.arena, names[i]);
    }
    return d;
}

/* Through protobuf-c's reflection: a limit is a one-field oneof, whose
 * case is the field's number. */
void fnh_limit(Keyflow__V1__FunctionDescriptor *d, const char *name, int64_t value) {
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(
        &keyflow__v1__function_limits__descriptor, name);
    cr_assert_not_null(f, "no limit %s", name);
    char *base_ptr = (char *)d->limits;
    *(uint32_t *)(base_ptr + f->quantifier_offset) = f->id;
    *(int64_t *)(base_ptr + f->offset) = value;
}

kf_cmd_t *fnh_register(Keyflow__V1__FunctionDescriptor *d) {
    Keyflow__V1__RegisterFunctionRequest *req = A(Keyflow__V1__RegisterFunctionRequest);
    keyflow__v1__register_function_request__init(req);
    req->descriptor = d;
    return sim_exec(&sim, KF_OP_REGISTER_FUNCTION, &req->base);
}

kf_cmd_t *fnh_push(const char *fid, const char *producer, int64_t seq, const char *rows,
                   int64_t watermark) {
    Keyflow__V1__PushBatchRequest *req = A(Keyflow__V1__PushBatchRequest);
    keyflow__v1__push_batch_request__init(req);
    req->function_id = kf_arena_strdup(&sim.arena, fid);
    req->producer_id = kf_arena_strdup(&sim.arena, producer);
    req->sequence = seq;
    if (rows != NULL) {
        req->rows_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_ROWS_JSON;
        req->rows_json = kf_arena_strdup(&sim.arena, rows);
    }
    if (watermark != INT64_MIN) {
        req->watermark_present_case =
            KEYFLOW__V1__PUSH_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US;
        req->watermark_us = watermark;
    }
    return sim_exec(&sim, KF_OP_PUSH_BATCH, &req->base);
}

Keyflow__V1__PushBatchResponse *fnh_push_ok(const char *fid, int64_t seq, const char *rows,
                                            int64_t watermark) {
    kf_cmd_t *c = fnh_push(fid, "p", seq, rows, watermark);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    cr_assert_not_null(c->response, "batch %lld was answered", (long long)seq);
    return (Keyflow__V1__PushBatchResponse *)c->response;
}

Keyflow__V1__GetKeyStateResponse *fnh_state(const char *fid, const char *key) {
    Keyflow__V1__GetKeyStateRequest *req = A(Keyflow__V1__GetKeyStateRequest);
    keyflow__v1__get_key_state_request__init(req);
    req->function_id = kf_arena_strdup(&sim.arena, fid);
    req->key = kf_arena_strdup(&sim.arena, key);
    kf_cmd_t *c = sim_exec(&sim, KF_OP_GET_KEY_STATE, &req->base);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    return (Keyflow__V1__GetKeyStateResponse *)c->response;
}

Keyflow__V1__FunctionInfo *fnh_info(const char *fid) {
    Keyflow__V1__GetFunctionRequest *req = A(Keyflow__V1__GetFunctionRequest);
    keyflow__v1__get_function_request__init(req);
    req->function_id = kf_arena_strdup(&sim.arena, fid);
    kf_cmd_t *c = sim_exec(&sim, KF_OP_GET_FUNCTION, &req->base);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    return (Keyflow__V1__FunctionInfo *)c->response;
}

json_t *fnh_output(const char *fid, int64_t after, int64_t limit,
                   Keyflow__V1__ReadOutputResponse **resp_out) {
    Keyflow__V1__ReadOutputRequest *req = A(Keyflow__V1__ReadOutputRequest);
    keyflow__v1__read_output_request__init(req);
    req->function_id = kf_arena_strdup(&sim.arena, fid);
    req->after_seq = after;
    req->limit = limit;
    req->format = KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON;
    kf_cmd_t *c = sim_exec(&sim, KF_OP_READ_OUTPUT, &req->base);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    Keyflow__V1__ReadOutputResponse *resp = (Keyflow__V1__ReadOutputResponse *)c->response;
    if (resp_out) {
        *resp_out = resp;
    }
    json_t *rows = json_loads(resp->rows_json[0] ? resp->rows_json : "[]", 0, NULL);
    cr_assert_not_null(rows);
    return rows;
}

int64_t fnh_out_int(json_t *rows, size_t i, const char *col) {
    json_t *v = json_object_get(json_array_get(rows, i), col);
    cr_assert_not_null(v, "row %zu has %s", i, col);
    return strtoll(json_string_value(v), NULL, 10);
}

const char *fnh_out_str(json_t *rows, size_t i, const char *col) {
    json_t *v = json_object_get(json_array_get(rows, i), col);
    cr_assert_not_null(v, "row %zu has %s", i, col);
    return json_string_value(v);
}
