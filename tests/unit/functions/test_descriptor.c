/*
 * test_descriptor.c - every descriptor rule, one test each, plus the
 * canonical encoding (defaults resolved, equal descriptors hash equal).
 */
#include <criterion/criterion.h>
#include <string.h>

#include "functions/descriptor.h"

static kf_arena_t arena;
static Keyflow__V1__FunctionDescriptor d;
static Keyflow__V1__Schema in_schema, out_schema;
static Keyflow__V1__Field in_fields[3], out_fields[3];
static Keyflow__V1__Field *in_ptrs[4], *out_ptrs[4];
static char *keys[2] = {"user", "ts"};
static char *timers[3] = {"idle", "flush", "idle"};

static void field(Keyflow__V1__Field *f, const char *name, Keyflow__V1__FieldType t,
                  bool nullable) {
    keyflow__v1__field__init(f);
    f->name = (char *)name;
    f->type = t;
    f->nullable = nullable;
}

static void setup(void) {
    kf_arena_init(&arena, 0);
    keyflow__v1__function_descriptor__init(&d);
    d.version = 1;
    d.function_id = "sum";
    d.pipeline_state_id = "sum.v1";
    d.runtime = KEYFLOW__V1__RUNTIME__RUNTIME_NATIVE;
    d.implementation_digest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    field(&in_fields[0], "user", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, false);
    field(&in_fields[1], "ts", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US, false);
    field(&in_fields[2], "amount", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64, true);
    field(&out_fields[0], "key", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, false);
    field(&out_fields[1], "ts", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US, false);
    field(&out_fields[2], "sum", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64, true);
    for (int i = 0; i < 3; i++) {
        in_ptrs[i] = &in_fields[i];
        out_ptrs[i] = &out_fields[i];
    }
    keyflow__v1__schema__init(&in_schema);
    keyflow__v1__schema__init(&out_schema);
    in_schema.n_fields = 3;
    in_schema.fields = in_ptrs;
    out_schema.n_fields = 3;
    out_schema.fields = out_ptrs;
    d.input_schema = &in_schema;
    d.output_schema = &out_schema;
    d.n_key_columns = 1;
    d.key_columns = keys;
    d.event_time_column = "ts";
    d.output_event_time_column = "ts";
    d.value_state_name = "sum";
    d.n_timer_names = 2;
    d.timer_names = timers;
}

static void teardown(void) {
    kf_arena_deinit(&arena);
}

TestSuite(descriptor, .init = setup, .fini = teardown);

static void expect_error(const char *field_name) {
    Keyflow__V1__FunctionDescriptor *c;
    kf_error_t err;
    kf_status_t st = kf_descriptor_canonicalize(&d, &arena, &c, &err);
    cr_assert_eq(st, KF_E_INVALID, "expected INVALID naming %s, got %s", field_name,
                 kf_status_name(st));
    cr_assert(strstr(err.message, field_name) != NULL, "'%s' should name %s", err.message,
              field_name);
}

Test(descriptor, a_valid_descriptor_is_canonicalized_with_defaults) {
    Keyflow__V1__FunctionDescriptor *c;
    kf_error_t err;
    cr_assert_eq(kf_descriptor_canonicalize(&d, &arena, &c, &err), KF_OK, "%s", err.message);
    cr_assert_eq(c->determinism, KEYFLOW__V1__DETERMINISM__DETERMINISM_UNDECLARED);
    kf_fn_limits_t l;
    kf_descriptor_limits(c, &l);
    cr_assert_eq(l.max_keys, 100000);
    cr_assert_eq(l.max_timers, 100000);
    cr_assert_eq(l.max_state_bytes, 64LL * 1024 * 1024);
    cr_assert_eq(l.max_batch_rows, 256);
    cr_assert_eq(l.max_input_rows, 4096);
    cr_assert_eq(l.max_input_bytes, 16LL * 1024 * 1024);
    cr_assert_eq(l.max_output_rows, 4096);
    cr_assert_eq(l.max_output_bytes, 16LL * 1024 * 1024);
    cr_assert_eq(l.max_timer_callbacks, 256);
}

Test(descriptor, version_must_be_1) {
    d.version = 2;
    expect_error("descriptor.version");
}

Test(descriptor, ids_are_required_and_url_safe) {
    d.function_id = "";
    expect_error("descriptor.function_id");
    d.function_id = "a/b";
    expect_error("descriptor.function_id");
    d.function_id = "ok";
    d.pipeline_state_id = "-x";
    expect_error("descriptor.pipeline_state_id");
}

Test(descriptor, runtime_must_be_known) {
    d.runtime = KEYFLOW__V1__RUNTIME__RUNTIME_UNSPECIFIED;
    expect_error("descriptor.runtime");
}

Test(descriptor, digest_is_lowercase_hex_sha256) {
    d.implementation_digest = "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef";
    expect_error("descriptor.implementation_digest");
    d.implementation_digest = "abc";
    expect_error("descriptor.implementation_digest");
}

Test(descriptor, unknown_field_types_are_refused) {
    in_fields[2].type = 42;
    expect_error("descriptor.input_schema.fields[2].type");
}

Test(descriptor, duplicate_field_names_are_refused) {
    out_fields[2].name = "ts";
    expect_error("descriptor.output_schema.fields[2].name");
}

Test(descriptor, empty_schema_is_refused) {
    in_schema.n_fields = 0;
    expect_error("descriptor.input_schema.fields");
}

Test(descriptor, key_columns_must_exist) {
    keys[0] = "nobody";
    expect_error("descriptor.key_columns[0]");
    keys[0] = "user";
}

Test(descriptor, key_columns_must_be_utf8) {
    keys[0] = "amount";
    in_fields[2].nullable = false;
    expect_error("descriptor.key_columns[0]");
    keys[0] = "user";
}

Test(descriptor, key_columns_must_not_be_nullable) {
    in_fields[0].nullable = true;
    expect_error("descriptor.key_columns[0]");
}

Test(descriptor, key_columns_may_not_repeat) {
    d.n_key_columns = 2;
    keys[1] = "user";
    expect_error("descriptor.key_columns[1]");
    keys[1] = "ts";
}

Test(descriptor, event_time_column_is_a_non_nullable_timestamp) {
    d.event_time_column = "amount";
    expect_error("descriptor.event_time_column");
    d.event_time_column = "ts";
    in_fields[1].nullable = true;
    expect_error("descriptor.event_time_column");
}

Test(descriptor, output_event_time_column_is_an_output_timestamp) {
    d.output_event_time_column = "sum";
    expect_error("descriptor.output_event_time_column");
}

Test(descriptor, value_state_name_is_required) {
    d.value_state_name = "";
    expect_error("descriptor.value_state_name: required");
}

/* A name one byte too long is refused with the limit named, not as
 * "required" or as a pattern mismatch alone. */
Test(descriptor, overlong_names_name_the_64_byte_limit) {
    char longest[66];
    memset(longest, 'n', 65);
    longest[65] = '\0';
    d.value_state_name = longest;
    expect_error(
        "descriptor.value_state_name: must match [A-Za-z_][A-Za-z0-9_]* and be at most 64 bytes");
    d.value_state_name = "sum";
    char *names[] = {"a", longest};
    d.timer_names = names;
    d.n_timer_names = 2;
    expect_error(
        "descriptor.timer_names[1]: must match [A-Za-z_][A-Za-z0-9_]* and be at most 64 bytes");
    longest[64] = '\0';
    d.value_state_name = longest;
    names[1] = "b";
    Keyflow__V1__FunctionDescriptor *c;
    kf_error_t err;
    cr_assert_eq(kf_descriptor_canonicalize(&d, &arena, &c, &err), KF_OK, "64 bytes is fine: %s",
                 err.message);
}

Test(descriptor, timer_names_are_unique) {
    d.n_timer_names = 3;
    expect_error("descriptor.timer_names[2]");
}

Test(descriptor, zero_or_oversized_limits_are_refused) {
    Keyflow__V1__FunctionLimits l = KEYFLOW__V1__FUNCTION_LIMITS__INIT;
    d.limits = &l;
    l.max_batch_rows_present_case =
        KEYFLOW__V1__FUNCTION_LIMITS__MAX_BATCH_ROWS_PRESENT_MAX_BATCH_ROWS;
    l.max_batch_rows = 0;
    expect_error("descriptor.limits.max_batch_rows");
    l.max_batch_rows = 5000;
    expect_error("descriptor.limits.max_batch_rows");
    l.max_batch_rows = 16;
    l.max_keys_present_case = KEYFLOW__V1__FUNCTION_LIMITS__MAX_KEYS_PRESENT_MAX_KEYS;
    l.max_keys = -1;
    expect_error("descriptor.limits.max_keys");
    l.max_keys = 10;
    Keyflow__V1__FunctionDescriptor *c;
    kf_error_t err;
    cr_assert_eq(kf_descriptor_canonicalize(&d, &arena, &c, &err), KF_OK, "%s", err.message);
    kf_fn_limits_t out;
    kf_descriptor_limits(c, &out);
    cr_assert_eq(out.max_batch_rows, 16);
    cr_assert_eq(out.max_keys, 10);
    cr_assert_eq(out.max_timers, 100000, "absent limits keep their defaults");
}

Test(descriptor, canonical_encoding_is_stable_and_binds_every_field) {
    Keyflow__V1__FunctionDescriptor *c1, *c2, *c3;
    kf_error_t err;
    uint8_t *b1, *b2, *b3;
    size_t l1, l2, l3;
    char h1[65], h2[65], h3[65];
    cr_assert_eq(kf_descriptor_canonicalize(&d, &arena, &c1, &err), KF_OK);
    cr_assert_eq(kf_descriptor_encode(c1, &arena, &b1, &l1, h1, &err), KF_OK);
    /* Spelling out the defaults gives the same identity. */
    Keyflow__V1__FunctionLimits l = KEYFLOW__V1__FUNCTION_LIMITS__INIT;
    l.max_keys_present_case = KEYFLOW__V1__FUNCTION_LIMITS__MAX_KEYS_PRESENT_MAX_KEYS;
    l.max_keys = 100000;
    d.limits = &l;
    d.determinism = KEYFLOW__V1__DETERMINISM__DETERMINISM_UNDECLARED;
    cr_assert_eq(kf_descriptor_canonicalize(&d, &arena, &c2, &err), KF_OK);
    cr_assert_eq(kf_descriptor_encode(c2, &arena, &b2, &l2, h2, &err), KF_OK);
    cr_assert_eq(l1, l2);
    cr_assert_eq(memcmp(b1, b2, l1), 0);
    cr_assert_str_eq(h1, h2);
    /* Any change is a different identity. */
    out_fields[2].nullable = false;
    cr_assert_eq(kf_descriptor_canonicalize(&d, &arena, &c3, &err), KF_OK);
    cr_assert_eq(kf_descriptor_encode(c3, &arena, &b3, &l3, h3, &err), KF_OK);
    cr_assert_str_neq(h1, h3);
    cr_assert_eq(strlen(h1), 64);
}
