/*
 * test_json_map.c - unit tests of service/proto/json_map.c, the API's
 * descriptor-driven JSON <-> protobuf mapping.
 *
 * Two sets of messages: the test-only keyflow.test protos next to this file
 * (every scalar type, enums with an alias and without a common prefix,
 * repeated fields, oneofs, `_json` fields, a proto2 message) and the real
 * keyflow.v1 API messages, decoded from the JSON forms DESIGN.md shows.
 *
 * Every error test compares the whole message, so a change in wording or in
 * the path shows up here. Each test gets a fresh arena (per-test fixture);
 * Criterion runs each test in its own process.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "proto/json_map.h"
#include "keyflow/v1/coordinators.pb-c.h"
#include "keyflow/v1/functions.pb-c.h"
#include "keyflow/v1/runs.pb-c.h"
#include "mapping_test.pb-c.h"
#include "mapping_test2.pb-c.h"

static kf_arena_t arena;
static kf_error_t err;

static void setup(void) {
    kf_arena_init(&arena, 0);
    kf_error_clear(&err);
}

static void teardown(void) {
    kf_arena_deinit(&arena);
}

TestSuite(names, .init = setup, .fini = teardown);
TestSuite(scalars, .init = setup, .fini = teardown);
TestSuite(integers, .init = setup, .fini = teardown);
TestSuite(floats, .init = setup, .fini = teardown);
TestSuite(bytes, .init = setup, .fini = teardown);
TestSuite(enums, .init = setup, .fini = teardown);
TestSuite(messages, .init = setup, .fini = teardown);
TestSuite(repeated, .init = setup, .fini = teardown);
TestSuite(oneofs, .init = setup, .fini = teardown);
TestSuite(json_fields, .init = setup, .fini = teardown);
TestSuite(documents, .init = setup, .fini = teardown);
TestSuite(depth, .init = setup, .fini = teardown);
TestSuite(api, .init = setup, .fini = teardown);
TestSuite(set_text, .init = setup, .fini = teardown);
TestSuite(merge, .init = setup, .fini = teardown);
TestSuite(encode, .init = setup, .fini = teardown);
TestSuite(proto2, .init = setup, .fini = teardown);

/* ---- helpers ---------------------------------------------------------- */

static ProtobufCMessage *decode(const ProtobufCMessageDescriptor *desc, const char *json) {
    ProtobufCMessage *msg = NULL;
    kf_status_t status = kf_json_to_message(json, strlen(json), desc, &arena, &msg, &err);
    cr_assert_eq(status, KF_OK, "decoding %s: %s", json, err.message);
    cr_assert_not_null(msg);
    cr_assert_eq(msg->descriptor, desc);
    return msg;
}

/* Decoding must fail with KF_E_INVALID and exactly this message. */
static void expect_error(const ProtobufCMessageDescriptor *desc, const char *json,
                         const char *message) {
    ProtobufCMessage *msg = (ProtobufCMessage *)(uintptr_t)0x1;
    kf_error_clear(&err);
    kf_status_t status = kf_json_to_message(json, strlen(json), desc, &arena, &msg, &err);
    cr_assert_eq(status, KF_E_INVALID, "decoding %s gave %d (%s)", json, status, err.message);
    cr_assert_eq(err.status, KF_E_INVALID);
    cr_assert_str_eq(err.message, message, "decoding %s", json);
    cr_assert_eq(msg, (ProtobufCMessage *)(uintptr_t)0x1, "*out written on failure");
}

static const char *encode(const void *msg) {
    size_t len = 0;
    char *text = kf_message_to_json(msg, &arena, &len);
    cr_assert_not_null(text);
    cr_assert_eq(len, strlen(text));
    return text;
}

/* JSON -> message -> JSON must give `expected`. */
static void expect_round_trip(const ProtobufCMessageDescriptor *desc, const char *json,
                              const char *expected) {
    cr_assert_str_eq(encode(decode(desc, json)), expected, "from %s", json);
}

/* The message survives protobuf-c's own pack/unpack unchanged, which shows
 * that what the decoder built is a well-formed protobuf-c struct. */
static void expect_binary_round_trip(const ProtobufCMessage *msg) {
    size_t size = protobuf_c_message_get_packed_size(msg);
    uint8_t *wire = malloc(size + 1);
    cr_assert_not_null(wire);
    cr_assert_eq(protobuf_c_message_pack(msg, wire), size);
    ProtobufCMessage *back = protobuf_c_message_unpack(msg->descriptor, NULL, size, wire);
    cr_assert_not_null(back);
    cr_assert_str_eq(encode(back), encode(msg));
    protobuf_c_message_free_unpacked(back, NULL);
    free(wire);
}

static void expect_set_text(ProtobufCMessage *msg, const char *name, const char *text) {
    kf_error_clear(&err);
    kf_status_t status = kf_message_set_text(msg, name, text, &arena, &err);
    cr_assert_eq(status, KF_OK, "setting %s=%s: %s", name, text, err.message);
}

static void expect_set_text_error(ProtobufCMessage *msg, const char *name, const char *text,
                                  const char *message) {
    kf_error_clear(&err);
    kf_status_t status = kf_message_set_text(msg, name, text, &arena, &err);
    cr_assert_eq(status, KF_E_INVALID, "setting %s=%s gave %d", name, text, status);
    cr_assert_str_eq(err.message, message);
}

static Keyflow__Test__Scalars *decode_scalars(const char *json) {
    return (Keyflow__Test__Scalars *)decode(&keyflow__test__scalars__descriptor, json);
}

static Keyflow__Test__Lists *decode_lists(const char *json) {
    return (Keyflow__Test__Lists *)decode(&keyflow__test__lists__descriptor, json);
}

static Keyflow__Test__Choice *decode_choice(const char *json) {
    return (Keyflow__Test__Choice *)decode(&keyflow__test__choice__descriptor, json);
}

#define SCALARS (&keyflow__test__scalars__descriptor)
#define LISTS   (&keyflow__test__lists__descriptor)
#define CHOICE  (&keyflow__test__choice__descriptor)
#define DEEP    (&keyflow__test__deep__descriptor)
#define EVENT   (&keyflow__v1__event__descriptor)

/* ---- names ------------------------------------------------------------ */

Test(names, camel_and_snake_names_are_both_accepted) {
    Keyflow__Test__Scalars *m = decode_scalars("{\"fInt32\": 1, \"f_int64\": 2, \"fUint32\": 3}");
    cr_assert_eq(m->f_int32, 1);
    cr_assert_eq(m->f_int64, 2);
    cr_assert_eq(m->f_uint32, 3u);
}

Test(names, output_uses_camel_names) {
    Keyflow__Test__Scalars m = KEYFLOW__TEST__SCALARS__INIT;
    m.f_sfixed32 = -4;
    m.f_bool = 1;
    cr_assert_str_eq(encode(&m), "{\"fSfixed32\":-4,\"fBool\":true}");
}

Test(names, case_of_field_names_matters) {
    expect_error(SCALARS, "{\"FInt32\": 1}",
                 "FInt32: unknown field (known: fDouble, fFloat, fInt32, fInt64, fUint32, "
                 "fUint64, fSint32, fSint64, fFixed32, fFixed64, fSfixed32, fSfixed64, fBool, "
                 "fString, fBytes, color, level, inner)");
}

Test(names, one_field_under_two_spellings_is_an_error) {
    expect_error(SCALARS, "{\"f_int32\": 1, \"fInt32\": 2}",
                 "fInt32: the same field as \"f_int32\"; give it once");
}

/* ---- scalars ---------------------------------------------------------- */

Test(scalars, every_type_decodes) {
    Keyflow__Test__Scalars *m = decode_scalars(
        "{\"fDouble\": 2.5, \"fFloat\": -1.25, \"fInt32\": -7, \"fInt64\": \"-9000000000\","
        " \"fUint32\": 4000000000, \"fUint64\": \"18000000000000000000\", \"fSint32\": -3,"
        " \"fSint64\": -4, \"fFixed32\": 5, \"fFixed64\": \"6\", \"fSfixed32\": -8,"
        " \"fSfixed64\": \"-9\", \"fBool\": true, \"fString\": \"h\\u00e9llo\","
        " \"fBytes\": \"AAEC\", \"color\": \"COLOR_GREEN\", \"level\": \"HIGH\","
        " \"inner\": {\"name\": \"n\", \"count\": 2}}");
    cr_assert(m->f_double == 2.5);
    cr_assert(m->f_float == -1.25f);
    cr_assert_eq(m->f_int32, -7);
    cr_assert_eq(m->f_int64, -9000000000LL);
    cr_assert_eq(m->f_uint32, 4000000000u);
    cr_assert_eq(m->f_uint64, 18000000000000000000ULL);
    cr_assert_eq(m->f_sint32, -3);
    cr_assert_eq(m->f_sint64, -4);
    cr_assert_eq(m->f_fixed32, 5u);
    cr_assert_eq(m->f_fixed64, 6u);
    cr_assert_eq(m->f_sfixed32, -8);
    cr_assert_eq(m->f_sfixed64, -9);
    cr_assert_eq(m->f_bool, 1);
    cr_assert_str_eq(m->f_string, "h\xc3\xa9llo");
    cr_assert_eq(m->f_bytes.len, 3u);
    cr_assert_eq(memcmp(m->f_bytes.data, "\x00\x01\x02", 3), 0);
    cr_assert_eq(m->color, KEYFLOW__TEST__COLOR__COLOR_GREEN);
    cr_assert_eq(m->level, KEYFLOW__TEST__LEVEL__HIGH);
    cr_assert_not_null(m->inner);
    cr_assert_str_eq(m->inner->name, "n");
    cr_assert_eq(m->inner->count, 2);
    cr_assert_null(m->inner->child);
    expect_binary_round_trip(&m->base);
}

Test(scalars, every_type_encodes) {
    Keyflow__Test__Scalars *m = decode_scalars(
        "{\"fDouble\": 2.5, \"fFloat\": -1.25, \"fInt32\": -7, \"fInt64\": -9000000000,"
        " \"fUint32\": 4000000000, \"fUint64\": \"18000000000000000000\", \"fSint32\": -3,"
        " \"fSint64\": -4, \"fFixed32\": 5, \"fFixed64\": 6, \"fSfixed32\": -8,"
        " \"fSfixed64\": -9, \"fBool\": true, \"fString\": \"s\", \"fBytes\": \"AAEC\","
        " \"color\": 2, \"level\": 1, \"inner\": {\"count\": 2}}");
    cr_assert_str_eq(encode(m),
                     "{\"fDouble\":2.5,\"fFloat\":-1.25,\"fInt32\":-7,\"fInt64\":\"-9000000000\","
                     "\"fUint32\":4000000000,\"fUint64\":\"18000000000000000000\","
                     "\"fSint32\":-3,\"fSint64\":\"-4\",\"fFixed32\":5,\"fFixed64\":\"6\","
                     "\"fSfixed32\":-8,\"fSfixed64\":\"-9\",\"fBool\":true,\"fString\":\"s\","
                     "\"fBytes\":\"AAEC\",\"color\":\"COLOR_GREEN\",\"level\":\"HIGH\","
                     "\"inner\":{\"count\":2}}");
}

Test(scalars, defaults_are_omitted) {
    Keyflow__Test__Scalars *m =
        decode_scalars("{\"fDouble\": 0, \"fInt32\": 0, \"fInt64\": \"0\", \"fBool\": false,"
                       " \"fString\": \"\", \"fBytes\": \"\", \"color\": \"COLOR_UNSPECIFIED\"}");
    cr_assert_str_eq(m->f_string, "");
    cr_assert_eq(m->f_bytes.len, 0u);
    cr_assert_str_eq(encode(m), "{}");
}

Test(scalars, fresh_message_has_empty_strings_not_null) {
    Keyflow__Test__Scalars *m = decode_scalars("{}");
    cr_assert_not_null(m->f_string);
    cr_assert_str_eq(m->f_string, "");
    cr_assert_null(m->inner);
}

Test(scalars, bools_take_only_true_and_false) {
    cr_assert_eq(decode_scalars("{\"fBool\": false}")->f_bool, 0);
    expect_error(SCALARS, "{\"fBool\": \"true\"}", "fBool: expected true or false, got \"true\"");
    expect_error(SCALARS, "{\"fBool\": 1}", "fBool: expected true or false, got 1");
}

Test(scalars, strings_take_only_strings) {
    expect_error(SCALARS, "{\"fString\": 5}", "fString: expected a string, got 5");
    expect_error(SCALARS, "{\"fString\": {\"a\": 1}}", "fString: expected a string, got an object");
    expect_error(SCALARS, "{\"fString\": [\"a\"]}", "fString: expected a string, got an array");
}

Test(scalars, long_strings_are_cut_in_messages) {
    expect_error(SCALARS, "{\"fInt32\": \"0123456789012345678901234567890123456789xyz\"}",
                 "fInt32: expected an integer, got \"0123456789012345678901234567890123456789x"
                 "yz\"");
    expect_error(SCALARS, "{\"fInt32\": \"01234567890123456789012345678901234567890123456789\"}",
                 "fInt32: out of range for int32, got \"012345678901234567890123456789012345678"
                 "9012...\"");
}

/* ---- integers --------------------------------------------------------- */

Test(integers, int64_extremes_round_trip_as_strings) {
    expect_round_trip(SCALARS,
                      "{\"fInt64\": \"9223372036854775807\", \"fSint64\": \"-9223372036854775808\","
                      " \"fSfixed64\": -9223372036854775808}",
                      "{\"fInt64\":\"9223372036854775807\",\"fSint64\":\"-9223372036854775808\","
                      "\"fSfixed64\":\"-9223372036854775808\"}");
    Keyflow__Test__Scalars *m = decode_scalars("{\"fInt64\": 9223372036854775807}");
    cr_assert_eq(m->f_int64, INT64_MAX);
}

Test(integers, uint64_above_int64_max_round_trips_through_strings) {
    Keyflow__Test__Scalars *m = decode_scalars("{\"fUint64\": \"18446744073709551615\","
                                               " \"fFixed64\": \"9223372036854775808\"}");
    cr_assert_eq(m->f_uint64, UINT64_MAX);
    cr_assert_eq(m->f_fixed64, (uint64_t)INT64_MAX + 1);
    cr_assert_str_eq(encode(m), "{\"fUint64\":\"18446744073709551615\","
                                "\"fFixed64\":\"9223372036854775808\"}");
    expect_binary_round_trip(&m->base);
}

Test(integers, out_of_range_values_name_the_type) {
    expect_error(SCALARS, "{\"fInt64\": \"9223372036854775808\"}",
                 "fInt64: out of range for int64, got \"9223372036854775808\"");
    expect_error(SCALARS, "{\"fInt64\": \"-9223372036854775809\"}",
                 "fInt64: out of range for int64, got \"-9223372036854775809\"");
    expect_error(SCALARS, "{\"fUint64\": \"18446744073709551616\"}",
                 "fUint64: out of range for uint64, got \"18446744073709551616\"");
    expect_error(SCALARS, "{\"fUint64\": \"99999999999999999999999\"}",
                 "fUint64: out of range for uint64, got \"99999999999999999999999\"");
    expect_error(SCALARS, "{\"fUint64\": \"-1\"}", "fUint64: out of range for uint64, got \"-1\"");
    expect_error(SCALARS, "{\"fUint64\": -1}", "fUint64: out of range for uint64, got -1");
    expect_error(SCALARS, "{\"fInt32\": 2147483648}",
                 "fInt32: out of range for int32, got 2147483648");
    expect_error(SCALARS, "{\"fSint32\": -2147483649}",
                 "fSint32: out of range for sint32, got -2147483649");
    expect_error(SCALARS, "{\"fUint32\": 4294967296}",
                 "fUint32: out of range for uint32, got 4294967296");
    expect_error(SCALARS, "{\"fFixed32\": -1}", "fFixed32: out of range for fixed32, got -1");
}

Test(integers, range_edges_are_accepted) {
    Keyflow__Test__Scalars *m = decode_scalars(
        "{\"fInt32\": 2147483647, \"fSint32\": -2147483648, \"fUint32\": \"4294967295\","
        " \"fSfixed32\": \"-2147483648\", \"fUint64\": \"-0\"}");
    cr_assert_eq(m->f_int32, INT32_MAX);
    cr_assert_eq(m->f_sint32, INT32_MIN);
    cr_assert_eq(m->f_uint32, UINT32_MAX);
    cr_assert_eq(m->f_sfixed32, INT32_MIN);
    cr_assert_eq(m->f_uint64, 0u);
}

Test(integers, integer_strings_are_accepted) {
    Keyflow__Test__Scalars *m = decode_scalars("{\"fInt32\": \"123\", \"fInt64\": \"-5\","
                                               " \"fUint32\": \"007\"}");
    cr_assert_eq(m->f_int32, 123);
    cr_assert_eq(m->f_int64, -5);
    cr_assert_eq(m->f_uint32, 7u);
}

Test(integers, malformed_integer_strings_are_refused) {
    const char *bad[] = {"\"ten\"", "\"\"",    "\" 1\"", "\"1 \"",   "\"+1\"",
                         "\"1.0\"", "\"1e3\"", "\"-\"",  "\"0x10\"", "\"--1\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char json[64];
        char message[96];
        snprintf(json, sizeof json, "{\"fInt64\": %s}", bad[i]);
        snprintf(message, sizeof message, "fInt64: expected an integer, got %s", bad[i]);
        expect_error(SCALARS, json, message);
    }
}

Test(integers, integral_reals_are_accepted) {
    Keyflow__Test__Scalars *m =
        decode_scalars("{\"fInt32\": 10.0, \"fInt64\": 1e3, \"fUint64\": 9007199254740992.0,"
                       " \"fSint64\": -9007199254740992.0}");
    cr_assert_eq(m->f_int32, 10);
    cr_assert_eq(m->f_int64, 1000);
    cr_assert_eq(m->f_uint64, 9007199254740992ULL);
    cr_assert_eq(m->f_sint64, -9007199254740992LL);
}

Test(integers, fractional_and_inexact_reals_are_refused) {
    expect_error(SCALARS, "{\"fInt32\": 1.5}", "fInt32: expected an integer, got 1.5");
    expect_error(SCALARS, "{\"fInt64\": -0.25}", "fInt64: expected an integer, got -0.25");
    expect_error(SCALARS, "{\"fInt64\": 1e19}",
                 "fInt64: 1e+19 is past 2^53, where JSON numbers are not exact; "
                 "send it as a string");
    expect_error(SCALARS, "{\"fUint64\": 9007199254740994.0}",
                 "fUint64: 9007199254740994 is past 2^53, where JSON numbers are not exact; "
                 "send it as a string");
}

Test(integers, other_json_types_are_refused) {
    expect_error(SCALARS, "{\"fInt32\": true}", "fInt32: expected an integer, got true");
    expect_error(SCALARS, "{\"fInt32\": [1]}", "fInt32: expected an integer, got an array");
    expect_error(SCALARS, "{\"fUint64\": {}}", "fUint64: expected an integer, got an object");
}

/* ---- floats ----------------------------------------------------------- */

Test(floats, numbers_and_numeric_strings) {
    Keyflow__Test__Scalars *m = decode_scalars("{\"fDouble\": 3, \"fFloat\": \"0.5\"}");
    cr_assert(m->f_double == 3.0);
    cr_assert(m->f_float == 0.5f);
    m = decode_scalars("{\"fDouble\": \"-1e-3\"}");
    cr_assert(m->f_double == -1e-3);
}

Test(floats, non_finite_names) {
    Keyflow__Test__Scalars *m = decode_scalars("{\"fDouble\": \"NaN\", \"fFloat\": \"-Infinity\"}");
    cr_assert(isnan(m->f_double));
    cr_assert(isinf(m->f_float) && m->f_float < 0);
    cr_assert_str_eq(encode(m), "{\"fDouble\":\"NaN\",\"fFloat\":\"-Infinity\"}");
    m = decode_scalars("{\"fDouble\": \"Infinity\"}");
    cr_assert(isinf(m->f_double) && m->f_double > 0);
    cr_assert_str_eq(encode(m), "{\"fDouble\":\"Infinity\"}");
}

Test(floats, malformed_numbers_are_refused) {
    const char *bad[] = {"\"nan\"",  "\"inf\"", "\"0x10\"", "\" 1\"",
                         "\"1.5x\"", "\"\"",    "\"+1\"",   "\".5\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char json[64];
        char message[96];
        snprintf(json, sizeof json, "{\"fDouble\": %s}", bad[i]);
        snprintf(message, sizeof message, "fDouble: expected a number, got %s", bad[i]);
        expect_error(SCALARS, json, message);
    }
    expect_error(SCALARS, "{\"fDouble\": true}", "fDouble: expected a number, got true");
}

Test(floats, out_of_range) {
    expect_error(SCALARS, "{\"fFloat\": 1e39}", "fFloat: out of range for float, got 1e+39");
    expect_error(SCALARS, "{\"fDouble\": \"1e999\"}",
                 "fDouble: out of range for double, got \"1e999\"");
    Keyflow__Test__Scalars *m = decode_scalars("{\"fFloat\": 3.4028234663852886e38}");
    cr_assert(m->f_float == FLT_MAX);
}

Test(floats, values_round_trip_exactly) {
    Keyflow__Test__Scalars *m = decode_scalars("{\"fDouble\": 0.1, \"fFloat\": 0.1}");
    cr_assert(m->f_double == 0.1);
    cr_assert(m->f_float == 0.1f);
    /* Reals are written in the fewest digits that read back exactly. */
    const char *json = encode(m);
    cr_assert_str_eq(json, "{\"fDouble\":0.1,\"fFloat\":0.1}");
    Keyflow__Test__Scalars *back = decode_scalars(json);
    cr_assert(back->f_double == 0.1);
    cr_assert(back->f_float == 0.1f);
}

Test(floats, negative_zero_is_kept) {
    Keyflow__Test__Scalars *m = decode_scalars("{\"fDouble\": -0.0}");
    cr_assert(m->f_double == 0.0 && signbit(m->f_double));
    cr_assert_str_eq(encode(m), "{\"fDouble\":-0.0}");
}

/* ---- bytes ------------------------------------------------------------ */

Test(bytes, every_length_round_trips) {
    const char *encoded[] = {"", "AA==", "AAE=", "AAEC", "AAECAw==", "AAECAwQ="};
    for (size_t n = 0; n < sizeof encoded / sizeof encoded[0]; n++) {
        Keyflow__Test__Scalars m = KEYFLOW__TEST__SCALARS__INIT;
        uint8_t data[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        m.f_bytes.len = n;
        m.f_bytes.data = data;
        char expected[64];
        snprintf(expected, sizeof expected, n == 0 ? "{}" : "{\"fBytes\":\"%s\"}", encoded[n]);
        const char *json = encode(&m);
        cr_assert_str_eq(json, expected);
        Keyflow__Test__Scalars *back = decode_scalars(json);
        cr_assert_eq(back->f_bytes.len, n);
        cr_assert(n == 0 || memcmp(back->f_bytes.data, data, n) == 0);
    }
}

Test(bytes, every_byte_value_round_trips) {
    uint8_t data[256];
    for (int i = 0; i < 256; i++) {
        data[i] = (uint8_t)(255 - i);
    }
    Keyflow__Test__Scalars m = KEYFLOW__TEST__SCALARS__INIT;
    m.f_bytes.len = sizeof data;
    m.f_bytes.data = data;
    Keyflow__Test__Scalars *back = decode_scalars(encode(&m));
    cr_assert_eq(back->f_bytes.len, sizeof data);
    cr_assert_eq(memcmp(back->f_bytes.data, data, sizeof data), 0);
}

Test(bytes, url_safe_and_unpadded_input) {
    /* 0xfb 0xff 0xfe: "+//+" in the standard alphabet, "-__-" URL-safe. */
    const char *forms[] = {"+//+", "-__-", "+/8", "-_8", "+/8="};
    const uint8_t expect_long[] = {0xfb, 0xff, 0xfe};
    const uint8_t expect_short[] = {0xfb, 0xff};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        char json[64];
        snprintf(json, sizeof json, "{\"fBytes\": \"%s\"}", forms[i]);
        Keyflow__Test__Scalars *m = decode_scalars(json);
        if (i < 2) {
            cr_assert_eq(m->f_bytes.len, 3u, "%s", forms[i]);
            cr_assert_eq(memcmp(m->f_bytes.data, expect_long, 3), 0, "%s", forms[i]);
        } else {
            cr_assert_eq(m->f_bytes.len, 2u, "%s", forms[i]);
            cr_assert_eq(memcmp(m->f_bytes.data, expect_short, 2), 0, "%s", forms[i]);
        }
    }
    Keyflow__Test__Scalars *m = decode_scalars("{\"fBytes\": \"-__-\"}");
    cr_assert_str_eq(encode(m), "{\"fBytes\":\"+//+\"}");
    m = decode_scalars("{\"fBytes\": \"QQ\"}");
    cr_assert_eq(m->f_bytes.len, 1u);
    cr_assert_eq(m->f_bytes.data[0], 'A');
}

Test(bytes, malformed_base64_is_refused) {
    const char *bad[] = {"\"Q\"",    "\"QUJDR\"", "\"QQ=\"",  "\"QUI==\"",   "\"QQ===\"",
                         "\"====\"", "\"QU JD\"", "\"QU=D\"", "\"QUJD\\n\"", "\"QUJ*\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char json[64];
        char message[96];
        snprintf(json, sizeof json, "{\"fBytes\": %s}", bad[i]);
        snprintf(message, sizeof message, "fBytes: expected base64, got %s", bad[i]);
        expect_error(SCALARS, json, message);
    }
    expect_error(SCALARS, "{\"fBytes\": 12}", "fBytes: expected a base64 string, got 12");
}

/* ---- enums ------------------------------------------------------------ */

/* Exactly the full name, the short name (lowercase, without the prefix) or,
 * in a body, the number as a JSON integer: the spellings the OpenAPI
 * document lists, and no others. */
Test(enums, accepted_spellings) {
    const char *forms[] = {"\"COLOR_GREEN\"", "\"green\"", "2"};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        char json[64];
        snprintf(json, sizeof json, "{\"color\": %s}", forms[i]);
        cr_assert_eq(decode_scalars(json)->color, KEYFLOW__TEST__COLOR__COLOR_GREEN, "%s",
                     forms[i]);
    }
    cr_assert_eq(decode_scalars("{\"color\": \"deep_blue\"}")->color,
                 KEYFLOW__TEST__COLOR__COLOR_DEEP_BLUE);
    const char *refused[] = {"\"color_green\"", "\"Color_Green\"", "\"GREEN\"",    "\"gReEn\"",
                             "\"2\"",           "\"Green\"",       "\"DEEP_BLUE\""};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char json[64], message[256];
        snprintf(json, sizeof json, "{\"color\": %s}", refused[i]);
        snprintf(message, sizeof message,
                 "color: expected one of COLOR_UNSPECIFIED, COLOR_RED, COLOR_GREEN, "
                 "COLOR_DEEP_BLUE (or unspecified, red, green, deep_blue), got %s",
                 refused[i]);
        expect_error(SCALARS, json, message);
    }
}

Test(enums, short_names) {
    char out[KF_JSON_NAME_BYTES_MAX];
    const ProtobufCEnumDescriptor *color = &keyflow__test__color__descriptor;
    kf_json_enum_short_name(color, "COLOR_DEEP_BLUE", out);
    cr_assert_str_eq(out, "deep_blue");
    kf_json_enum_short_name(color, "COLOR_CRIMSON", out);
    cr_assert_str_eq(out, "crimson");
    kf_json_enum_short_name(&keyflow__test__level__descriptor, "HIGH", out);
    cr_assert_str_eq(out, "high", "no common prefix: the whole name");
    kf_json_enum_short_name(&keyflow__v1__rule_kind__descriptor, "RULE_KIND_BATCH", out);
    cr_assert_str_eq(out, "batch");
}

Test(enums, aliases_decode_and_encode_by_the_first_name) {
    Keyflow__Test__Scalars *m = decode_scalars("{\"color\": \"COLOR_CRIMSON\"}");
    cr_assert_eq(m->color, KEYFLOW__TEST__COLOR__COLOR_RED);
    cr_assert_str_eq(encode(m), "{\"color\":\"COLOR_RED\"}");
    cr_assert_eq(decode_scalars("{\"color\": \"crimson\"}")->color,
                 KEYFLOW__TEST__COLOR__COLOR_RED);
}

Test(enums, no_common_prefix_means_full_names_only) {
    cr_assert_eq(decode_scalars("{\"level\": \"high\"}")->level, KEYFLOW__TEST__LEVEL__HIGH);
    cr_assert_eq(decode_scalars("{\"level\": \"HIGH\"}")->level, KEYFLOW__TEST__LEVEL__HIGH);
    expect_error(SCALARS, "{\"level\": \"IGH\"}",
                 "level: expected one of LOW, HIGH (or low, high), got \"IGH\"");
    expect_error(SCALARS, "{\"level\": \"High\"}",
                 "level: expected one of LOW, HIGH (or low, high), got \"High\"");
}

Test(enums, unknown_values_are_refused_with_the_choices) {
    const char *choices = "expected one of COLOR_UNSPECIFIED, COLOR_RED, COLOR_GREEN, "
                          "COLOR_DEEP_BLUE (or unspecified, red, green, deep_blue), got ";
    char message[256];
    snprintf(message, sizeof message, "color: %s\"purple\"", choices);
    expect_error(SCALARS, "{\"color\": \"purple\"}", message);
    snprintf(message, sizeof message, "color: %s9", choices);
    expect_error(SCALARS, "{\"color\": 9}", message);
    snprintf(message, sizeof message, "color: %s\"-1\"", choices);
    expect_error(SCALARS, "{\"color\": \"-1\"}", message);
    snprintf(message, sizeof message, "color: %s4294967297", choices);
    expect_error(SCALARS, "{\"color\": 4294967297}", message);
    snprintf(message, sizeof message, "color: %s1.5", choices);
    expect_error(SCALARS, "{\"color\": 1.5}", message);
    snprintf(message, sizeof message, "color: %s\"COLOR_\"", choices);
    expect_error(SCALARS, "{\"color\": \"COLOR_\"}", message);
}

Test(enums, unknown_numbers_are_emitted_as_numbers) {
    Keyflow__Test__Scalars m = KEYFLOW__TEST__SCALARS__INIT;
    m.color = (Keyflow__Test__Color)42;
    cr_assert_str_eq(encode(&m), "{\"color\":42}");
}

/* ---- messages --------------------------------------------------------- */

Test(messages, nested_messages_decode_and_encode) {
    expect_round_trip(&keyflow__test__inner__descriptor,
                      "{\"name\": \"a\", \"child\": {\"name\": \"b\", \"child\": {\"count\": 3}}}",
                      "{\"name\":\"a\",\"child\":{\"name\":\"b\",\"child\":{\"count\":3}}}");
}

Test(messages, empty_object_makes_an_empty_present_message) {
    Keyflow__Test__Scalars *m = decode_scalars("{\"inner\": {}}");
    cr_assert_not_null(m->inner);
    cr_assert_str_eq(m->inner->name, "");
    cr_assert_str_eq(encode(m), "{\"inner\":{}}");
}

Test(messages, null_means_absent) {
    Keyflow__Test__Scalars *m =
        decode_scalars("{\"inner\": null, \"fInt32\": null, \"fString\": null, \"color\": null,"
                       " \"fBytes\": null}");
    cr_assert_null(m->inner);
    cr_assert_eq(m->f_int32, 0);
    cr_assert_str_eq(m->f_string, "");
    cr_assert_str_eq(encode(m), "{}");
}

Test(messages, errors_name_the_nested_path) {
    expect_error(SCALARS, "{\"inner\": {\"child\": {\"count\": \"x\"}}}",
                 "inner.child.count: expected an integer, got \"x\"");
    expect_error(SCALARS, "{\"inner\": {\"child\": {\"nope\": 1}}}",
                 "inner.child.nope: unknown field (known: name, count, child)");
    expect_error(SCALARS, "{\"inner\": 5}", "inner: expected an object, got 5");
    expect_error(SCALARS, "{\"inner\": [{}]}", "inner: expected an object, got an array");
}

/* ---- repeated --------------------------------------------------------- */

Test(repeated, every_kind_decodes) {
    Keyflow__Test__Lists *m = decode_lists(
        "{\"rInt32\": [1, -2, \"3\"], \"rSint32\": [-1, 2], \"rInt64\": [\"-9000000000\", 4],"
        " \"rUint64\": [\"18446744073709551615\"], \"rFixed32\": [7], \"rDouble\": [0.5, \"NaN\"],"
        " \"rFloat\": [1.5], \"rBool\": [true, false, true], \"rString\": [\"a\", \"\", \"c\"],"
        " \"rBytes\": [\"AA==\", \"\"], \"rColor\": [\"red\", \"COLOR_GREEN\", 3],"
        " \"rInner\": [{\"name\": \"x\"}, {}, {\"count\": 2}]}");
    cr_assert_eq(m->n_r_int32, 3u);
    cr_assert_eq(m->r_int32[0], 1);
    cr_assert_eq(m->r_int32[1], -2);
    cr_assert_eq(m->r_int32[2], 3);
    cr_assert_eq(m->n_r_sint32, 2u);
    cr_assert_eq(m->r_sint32[0], -1);
    cr_assert_eq(m->n_r_int64, 2u);
    cr_assert_eq(m->r_int64[0], -9000000000LL);
    cr_assert_eq(m->r_int64[1], 4);
    cr_assert_eq(m->n_r_uint64, 1u);
    cr_assert_eq(m->r_uint64[0], UINT64_MAX);
    cr_assert_eq(m->r_fixed32[0], 7u);
    cr_assert_eq(m->n_r_double, 2u);
    cr_assert(m->r_double[0] == 0.5 && isnan(m->r_double[1]));
    cr_assert(m->r_float[0] == 1.5f);
    cr_assert_eq(m->n_r_bool, 3u);
    cr_assert(m->r_bool[0] && !m->r_bool[1] && m->r_bool[2]);
    cr_assert_eq(m->n_r_string, 3u);
    cr_assert_str_eq(m->r_string[0], "a");
    cr_assert_str_eq(m->r_string[1], "");
    cr_assert_str_eq(m->r_string[2], "c");
    cr_assert_eq(m->n_r_bytes, 2u);
    cr_assert_eq(m->r_bytes[0].len, 1u);
    cr_assert_eq(m->r_bytes[1].len, 0u);
    cr_assert_eq(m->n_r_color, 3u);
    cr_assert_eq(m->r_color[0], KEYFLOW__TEST__COLOR__COLOR_RED);
    cr_assert_eq(m->r_color[2], KEYFLOW__TEST__COLOR__COLOR_DEEP_BLUE);
    cr_assert_eq(m->n_r_inner, 3u);
    cr_assert_str_eq(m->r_inner[0]->name, "x");
    cr_assert_str_eq(m->r_inner[1]->name, "");
    cr_assert_eq(m->r_inner[2]->count, 2);
    expect_binary_round_trip(&m->base);
}

Test(repeated, every_kind_encodes) {
    expect_round_trip(LISTS,
                      "{\"rInt32\": [1, -2], \"rSint32\": [0, 0], \"rInt64\": [5],"
                      " \"rUint64\": [\"18446744073709551615\"], \"rFixed32\": [7],"
                      " \"rDouble\": [0.5, \"-Infinity\"], \"rFloat\": [1.5], \"rBool\": [false],"
                      " \"rString\": [\"a\", \"\"], \"rBytes\": [\"AA==\", \"\"],"
                      " \"rColor\": [\"red\", 0], \"rInner\": [{\"name\": \"x\"}, {}]}",
                      "{\"rInt32\":[1,-2],\"rSint32\":[0,0],\"rInt64\":[\"5\"],"
                      "\"rUint64\":[\"18446744073709551615\"],\"rFixed32\":[7],"
                      "\"rDouble\":[0.5,\"-Infinity\"],\"rFloat\":[1.5],\"rBool\":[false],"
                      "\"rString\":[\"a\",\"\"],\"rBytes\":[\"AA==\",\"\"],"
                      "\"rColor\":[\"COLOR_RED\",\"COLOR_UNSPECIFIED\"],"
                      "\"rInner\":[{\"name\":\"x\"},{}]}");
}

/* On input an empty or null array is absent; on output every list is
 * there, so a client can iterate it without checking (json_map.h). */
Test(repeated, empty_and_null_arrays_are_absent_and_emitted_as_empty) {
    Keyflow__Test__Lists *m = decode_lists("{\"rInt32\": [], \"rString\": null, \"rInner\": []}");
    cr_assert_eq(m->n_r_int32, 0u);
    cr_assert_eq(m->n_r_string, 0u);
    cr_assert_eq(m->n_r_inner, 0u);
    cr_assert_str_eq(encode(m), "{\"rInt32\":[],\"rSint32\":[],\"rInt64\":[],\"rUint64\":[],"
                                "\"rFixed32\":[],\"rDouble\":[],\"rFloat\":[],\"rBool\":[],"
                                "\"rString\":[],\"rBytes\":[],\"rColor\":[],\"rInner\":[]}");
    Keyflow__Test__Deep deep = KEYFLOW__TEST__DEEP__INIT;
    cr_assert_str_eq(encode(&deep), "{\"many\":[]}", "empty lists even in an empty message");
}

Test(repeated, errors_name_the_element) {
    expect_error(LISTS, "{\"rInt64\": [1, \"x\"]}", "rInt64[1]: expected an integer, got \"x\"");
    expect_error(LISTS, "{\"rInt32\": [1, 2, null]}",
                 "rInt32[2]: null is not allowed in a repeated field");
    expect_error(LISTS, "{\"rInner\": [{}, {\"nope\": 1}]}",
                 "rInner[1].nope: unknown field (known: name, count, child)");
    expect_error(LISTS, "{\"rInner\": [{}, 3]}", "rInner[1]: expected an object, got 3");
    expect_error(LISTS, "{\"rString\": \"a\"}", "rString: expected an array, got \"a\"");
    expect_error(LISTS, "{\"rColor\": [\"red\", \"blue\"]}",
                 "rColor[1]: expected one of COLOR_UNSPECIFIED, COLOR_RED, COLOR_GREEN, "
                 "COLOR_DEEP_BLUE (or unspecified, red, green, deep_blue), got \"blue\"");
    expect_error(LISTS, "{\"rInt32\": [[1]]}", "rInt32[0]: expected an integer, got an array");
}

Test(repeated, packed_and_unpacked_fields_pack_like_protobuf_c) {
    /* r_int32 is packed (proto3 default), r_sint32 is not: both must come
     * back from protobuf-c's own wire format. */
    const ProtobufCFieldDescriptor *packed =
        protobuf_c_message_descriptor_get_field_by_name(LISTS, "r_int32");
    const ProtobufCFieldDescriptor *unpacked =
        protobuf_c_message_descriptor_get_field_by_name(LISTS, "r_sint32");
    cr_assert(packed->flags & PROTOBUF_C_FIELD_FLAG_PACKED);
    cr_assert_not(unpacked->flags & PROTOBUF_C_FIELD_FLAG_PACKED);
    Keyflow__Test__Lists *m = decode_lists("{\"rInt32\": [1, 2, 3], \"rSint32\": [-1, -2]}");
    expect_binary_round_trip(&m->base);
}

/* ---- oneofs ----------------------------------------------------------- */

Test(oneofs, a_member_sets_the_case) {
    Keyflow__Test__Choice *m = decode_choice("{\"number\": \"12\"}");
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK_NUMBER);
    cr_assert_eq(m->number, 12);
    cr_assert_eq(m->single_case, KEYFLOW__TEST__CHOICE__SINGLE__NOT_SET);
    m = decode_choice("{\"text\": \"t\"}");
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK_TEXT);
    cr_assert_str_eq(m->text, "t");
    m = decode_choice("{\"inner\": {\"name\": \"i\"}}");
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK_INNER);
    cr_assert_str_eq(m->inner->name, "i");
    m = decode_choice("{\"blob\": \"AQI=\"}");
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK_BLOB);
    cr_assert_eq(m->blob.len, 2u);
    m = decode_choice("{\"color\": \"green\"}");
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK_COLOR);
    cr_assert_eq(m->color, KEYFLOW__TEST__COLOR__COLOR_GREEN);
}

Test(oneofs, explicit_zero_is_distinct_from_absent) {
    Keyflow__Test__Choice *m = decode_choice("{\"number\": 0, \"only\": 0}");
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK_NUMBER);
    cr_assert_eq(m->number, 0);
    cr_assert_eq(m->single_case, KEYFLOW__TEST__CHOICE__SINGLE_ONLY);
    cr_assert_str_eq(encode(m), "{\"number\":\"0\",\"only\":0}");
    m = decode_choice("{}");
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK__NOT_SET);
    cr_assert_eq(m->single_case, KEYFLOW__TEST__CHOICE__SINGLE__NOT_SET);
    cr_assert_str_eq(encode(m), "{}");
    expect_round_trip(CHOICE, "{\"flag\": false}", "{\"flag\":false}");
    expect_round_trip(CHOICE, "{\"ratio\": 0}", "{\"ratio\":0.0}");
    expect_round_trip(CHOICE, "{\"text\": \"\"}", "{\"text\":\"\"}");
    expect_round_trip(CHOICE, "{\"color\": \"COLOR_UNSPECIFIED\"}",
                      "{\"color\":\"COLOR_UNSPECIFIED\"}");
    expect_round_trip(CHOICE, "{\"blob\": \"\"}", "{\"blob\":\"\"}");
    expect_round_trip(CHOICE, "{\"inner\": {}}", "{\"inner\":{}}");
}

Test(oneofs, two_members_are_an_error) {
    expect_error(CHOICE, "{\"number\": 1, \"text\": \"a\"}",
                 "text: \"number\" and \"text\" are members of one oneof; set at most one");
    expect_error(CHOICE, "{\"inner\": {}, \"flag\": true}",
                 "flag: \"inner\" and \"flag\" are members of one oneof; set at most one");
    /* Members of different oneofs do not conflict. */
    Keyflow__Test__Choice *m = decode_choice("{\"number\": 1, \"only\": 2}");
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK_NUMBER);
    cr_assert_eq(m->single_case, KEYFLOW__TEST__CHOICE__SINGLE_ONLY);
}

Test(oneofs, a_null_member_does_not_count) {
    Keyflow__Test__Choice *m = decode_choice("{\"number\": 1, \"text\": null}");
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK_NUMBER);
    cr_assert_eq(m->number, 1);
    m = decode_choice("{\"text\": null, \"number\": 1}");
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK_NUMBER);
    m = decode_choice("{\"text\": null}");
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK__NOT_SET);
}

Test(oneofs, json_member_sets_the_case) {
    Keyflow__Test__Choice *m = decode_choice("{\"payload\": {\"a\": [1, 2]}}");
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK_PAYLOAD_JSON);
    cr_assert_str_eq(m->payload_json, "{\"a\":[1,2]}");
    m = decode_choice("{\"payloadJson\": \"[1, 2]\"}");
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK_PAYLOAD_JSON);
    cr_assert_str_eq(m->payload_json, "[1, 2]");
    m = decode_choice("{\"payload_json\": \"x\"}");
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK_PAYLOAD_JSON);
    /* Embedded null is a value: the case is set. */
    m = decode_choice("{\"payload\": null}");
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK_PAYLOAD_JSON);
    cr_assert_str_eq(m->payload_json, "null");
    cr_assert_str_eq(encode(m), "{\"payload\":null}");
    /* Under the full name, null means absent. */
    m = decode_choice("{\"payloadJson\": null}");
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK__NOT_SET);
}

Test(oneofs, json_member_conflicts_like_any_member) {
    expect_error(CHOICE, "{\"payload\": 1, \"number\": 2}",
                 "number: \"payload\" and \"number\" are members of one oneof; set at most one");
    expect_error(CHOICE, "{\"payload\": null, \"text\": \"a\"}",
                 "text: \"payload\" and \"text\" are members of one oneof; set at most one");
    expect_error(CHOICE, "{\"payload\": 1, \"payloadJson\": \"2\"}",
                 "payloadJson: the same field as \"payload\"; give it once");
}

Test(oneofs, json_member_encodes) {
    Keyflow__Test__Choice m = KEYFLOW__TEST__CHOICE__INIT;
    m.pick_case = KEYFLOW__TEST__CHOICE__PICK_PAYLOAD_JSON;
    m.payload_json = "{\"b\": true}";
    cr_assert_str_eq(encode(&m), "{\"payload\":{\"b\":true}}");
    m.payload_json = "not json";
    cr_assert_str_eq(encode(&m), "{\"payloadJson\":\"not json\"}");
    m.payload_json = "";
    cr_assert_str_eq(encode(&m), "{\"payload\":null}");
}

/* ---- `_json` fields outside oneofs ------------------------------------ */

Test(json_fields, embedded_values_of_every_type_become_compact_text) {
    const char *values[][2] = {
        {"{\"a\": 1, \"b\": [true, null]}", "{\"a\":1,\"b\":[true,null]}"},
        {"[ ]", "[]"},
        {"\"str\"", "\"str\""},
        {"7", "7"},
        {"-2.5", "-2.5"},
        {"true", "true"},
        {"null", "null"},
        {"\"caf\\u00e9\"", "\"caf\xc3\xa9\""},
        {"{\"z\": 1, \"a\": 2}", "{\"z\":1,\"a\":2}"},
    };
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        char json[128];
        snprintf(json, sizeof json, "{\"meta\": %s}", values[i][0]);
        Keyflow__Test__Choice *m = decode_choice(json);
        cr_assert_str_eq(m->meta_json, values[i][1], "from %s", json);
    }
}

Test(json_fields, string_form_under_the_full_name) {
    Keyflow__Test__Choice *m = decode_choice("{\"metaJson\": \"{\\\"a\\\": 1}\"}");
    cr_assert_str_eq(m->meta_json, "{\"a\": 1}");
    m = decode_choice("{\"meta_json\": \"anything\"}");
    cr_assert_str_eq(m->meta_json, "anything");
    expect_error(CHOICE, "{\"metaJson\": {}}", "metaJson: expected a string, got an object");
    expect_error(CHOICE, "{\"meta\": 1, \"metaJson\": \"1\"}",
                 "metaJson: the same field as \"meta\"; give it once");
}

Test(json_fields, output_embeds_the_text) {
    Keyflow__Test__Choice m = KEYFLOW__TEST__CHOICE__INIT;
    m.meta_json = "[1, {\"x\": \"y\"}]";
    cr_assert_str_eq(encode(&m), "{\"meta\":[1,{\"x\":\"y\"}]}");
    m.meta_json = "";
    cr_assert_str_eq(encode(&m), "{}");
    m.meta_json = "{broken";
    cr_assert_str_eq(encode(&m), "{\"metaJson\":\"{broken\"}");
    m.meta_json = "\"s\"";
    cr_assert_str_eq(encode(&m), "{\"meta\":\"s\"}");
}

Test(json_fields, round_trip) {
    expect_round_trip(CHOICE, "{\"id\": \"x\", \"meta\": {\"k\": [1, 2.5, \"s\"]}}",
                      "{\"id\":\"x\",\"meta\":{\"k\":[1,2.5,\"s\"]}}");
}

Test(json_fields, short_name_taken_by_another_field_keeps_string_form) {
    const ProtobufCMessageDescriptor *desc = &keyflow__test__collide__descriptor;
    Keyflow__Test__Collide *m =
        (Keyflow__Test__Collide *)decode(desc, "{\"input\": \"i\", \"inputJson\": \"[1]\"}");
    cr_assert_str_eq(m->input, "i");
    cr_assert_str_eq(m->input_json, "[1]");
    cr_assert_str_eq(encode(m), "{\"input\":\"i\",\"inputJson\":\"[1]\"}");
    expect_error(desc, "{\"input\": {}}", "input: expected a string, got an object");
}

/* ---- documents -------------------------------------------------------- */

Test(documents, empty_body_is_an_empty_object) {
    ProtobufCMessage *msg = NULL;
    cr_assert_eq(kf_json_to_message("", 0, SCALARS, &arena, &msg, &err), KF_OK);
    cr_assert_str_eq(encode(msg), "{}");
    msg = NULL;
    cr_assert_eq(kf_json_to_message(NULL, 0, SCALARS, &arena, &msg, &err), KF_OK);
    cr_assert_not_null(msg);
    msg = NULL;
    cr_assert_eq(kf_json_to_message(" \r\n\t", 4, SCALARS, &arena, &msg, &err), KF_OK);
    cr_assert_not_null(msg);
}

Test(documents, length_bounds_the_input) {
    /* Only the first len bytes are read: no NUL terminator needed. */
    const char body[] = "{\"fInt32\": 4}garbage";
    ProtobufCMessage *msg = NULL;
    cr_assert_eq(kf_json_to_message(body, 13, SCALARS, &arena, &msg, &err), KF_OK, "%s",
                 err.message);
    cr_assert_eq(((Keyflow__Test__Scalars *)msg)->f_int32, 4);
}

Test(documents, the_body_must_be_an_object) {
    expect_error(SCALARS, "[1]", "body: expected an object, got an array");
    expect_error(SCALARS, "\"s\"", "body: expected an object, got \"s\"");
    expect_error(SCALARS, "3", "body: expected an object, got 3");
    expect_error(SCALARS, "null", "body: expected an object, got null");
}

Test(documents, invalid_json_is_reported_with_its_position) {
    expect_error(SCALARS, "{\"fInt32\": }",
                 "body: not valid JSON: unexpected token near '}' (line 1, column 12)");
    expect_error(SCALARS, "{} x",
                 "body: not valid JSON: end of file expected near 'x' (line 1, column 4)");
    expect_error(SCALARS, "{\"a\": 1, \"a\": 2}",
                 "body: not valid JSON: duplicate object key near '\"a\"' (line 1, column 12)");
    /* "\u0000" is valid JSON (embedded values may hold it, as over gRPC);
     * a string field refuses it by name. */
    expect_error(SCALARS, "{\"fString\": \"a\\u0000b\"}",
                 "fString: must not contain a NUL character");
}

Test(documents, unknown_fields_are_named) {
    expect_error(&keyflow__test__inner__descriptor, "{\"name\": \"a\", \"nmae\": \"b\"}",
                 "nmae: unknown field (known: name, count, child)");
    expect_error(EVENT, "{\"inputs\": 1}", "inputs: unknown field (known: id, rule, input, flush)");
}

Test(documents, an_overlong_key_is_shortened_in_the_message) {
    char key[301];
    memset(key, 'k', 300);
    key[300] = '\0';
    char json[400];
    snprintf(json, sizeof json, "{\"child\": {\"%s\": 1}}", key);
    char expected[512];
    snprintf(expected, sizeof expected, "%.252s...: unknown field (known: name, count, child)",
             key);
    expect_error(&keyflow__test__inner__descriptor, json, expected);
}

Test(documents, arena_exhaustion_is_too_large) {
    kf_arena_t small;
    kf_arena_init(&small, 4096);
    char body[8192];
    int n = snprintf(body, sizeof body, "{\"fString\": \"");
    memset(body + n, 'x', 6000);
    snprintf(body + n + 6000, sizeof body - (size_t)n - 6000, "\"}");
    ProtobufCMessage *msg = NULL;
    kf_status_t status = kf_json_to_message(body, strlen(body), SCALARS, &small, &msg, &err);
    cr_assert_eq(status, KF_E_TOO_LARGE);
    cr_assert_str_eq(err.message,
                     "fString: the request does not fit in its 4096-byte memory limit");
    cr_assert_null(msg);
    kf_arena_deinit(&small);
}

Test(documents, a_null_error_pointer_is_allowed) {
    ProtobufCMessage *msg = NULL;
    cr_assert_eq(kf_json_to_message("[", 1, SCALARS, &arena, &msg, NULL), KF_E_INVALID);
    cr_assert_null(msg);
}

/* ---- depth ------------------------------------------------------------ */

/* A body with `levels` objects nested through Deep.next (the body itself
 * is the first). */
static char *nested_next(int levels) {
    size_t cap = (size_t)levels * 16 + 16;
    char *json = malloc(cap);
    cr_assert_not_null(json);
    size_t o = 0;
    for (int i = 1; i < levels; i++) {
        o += (size_t)snprintf(json + o, cap - o, "{\"next\": ");
    }
    o += (size_t)snprintf(json + o, cap - o, "{\"value\": 1}");
    for (int i = 1; i < levels; i++) {
        json[o++] = '}';
    }
    json[o] = '\0';
    return json;
}

/* {"data": [[...]]} with `arrays` nested arrays. */
static char *nested_data(int arrays) {
    size_t cap = (size_t)arrays * 2 + 32;
    char *json = malloc(cap);
    cr_assert_not_null(json);
    size_t o = (size_t)snprintf(json, cap, "{\"data\": ");
    memset(json + o, '[', (size_t)arrays);
    o += (size_t)arrays;
    memset(json + o, ']', (size_t)arrays);
    o += (size_t)arrays;
    snprintf(json + o, cap - o, "}");
    return json;
}

Test(depth, messages_nest_up_to_the_limit) {
    char *json = nested_next(KF_JSON_DEPTH_MAX);
    Keyflow__Test__Deep *m = (Keyflow__Test__Deep *)decode(DEEP, json);
    int levels = 1;
    while (m->next != NULL) {
        m = m->next;
        levels++;
    }
    cr_assert_eq(levels, KF_JSON_DEPTH_MAX);
    cr_assert_eq(m->value, 1);
    free(json);
}

Test(depth, one_level_more_is_an_error_naming_the_path) {
    char *json = nested_next(KF_JSON_DEPTH_MAX + 1);
    ProtobufCMessage *msg = NULL;
    cr_assert_eq(kf_json_to_message(json, strlen(json), DEEP, &arena, &msg, &err), KF_E_INVALID);
    /* 64 "next" segments do not fit in the path's 255 bytes: the end is
     * kept, after "...", since it names the offending value. */
    char expected[512] = "...next";
    for (int i = 0; i < 49; i++) {
        strcat(expected, ".next");
    }
    strcat(expected, ": JSON nested deeper than 64 levels");
    cr_assert_str_eq(err.message, expected);
    free(json);
}

/* The deepest message a request may hold encodes with an empty list at
 * the bottom ("many": []), one level deeper than the body: it must read
 * back, as every response must. */
Test(depth, an_empty_array_adds_no_level) {
    char *json = nested_next(KF_JSON_DEPTH_MAX);
    ProtobufCMessage *msg = decode(DEEP, json);
    const char *out = encode(msg);
    cr_assert_not_null(strstr(out, "{\"value\":1,\"many\":[]}"), "%s", out);
    decode(DEEP, out);
    free(json);
}

Test(depth, embedded_json_has_the_limit_of_its_own) {
    /* An embedded value may nest KF_JSON_DEPTH_MAX levels wherever it sits,
     * the same bound the engine applies to the text over gRPC. */
    char *json = nested_data(KF_JSON_DEPTH_MAX);
    Keyflow__Test__Deep *m = (Keyflow__Test__Deep *)decode(DEEP, json);
    cr_assert_eq(strlen(m->data_json), (size_t)KF_JSON_DEPTH_MAX * 2);
    free(json);
    json = nested_data(KF_JSON_DEPTH_MAX + 1);
    expect_error(DEEP, json, "data: JSON nested deeper than 64 levels");
    free(json);
}

/* Text deeper than the decoder takes back is emitted in the string form, so
 * that every response can be read again as a request (found by fuzzing). */
Test(depth, deep_embedded_text_is_emitted_as_a_string) {
    char *json = nested_data(KF_JSON_DEPTH_MAX + 1);
    Keyflow__Test__Deep m = KEYFLOW__TEST__DEEP__INIT;
    m.data_json = strchr(json, '[');
    json[strlen(json) - 1] = '\0'; /* drop the closing brace of the body */
    const char *out = encode(&m);
    cr_assert(strncmp(out, "{\"many\":[],\"dataJson\":\"[[[", 26) == 0, "%.40s", out);
    Keyflow__Test__Deep *back = (Keyflow__Test__Deep *)decode(DEEP, out);
    cr_assert_str_eq(back->data_json, m.data_json);
    free(json);
}

Test(depth, arrays_of_messages_count_both_levels) {
    /* Level 1 body, 2 "many" array, 3 its object, 4 array, 5 object. */
    expect_round_trip(DEEP, "{\"many\": [{\"many\": [{\"value\": 5}]}]}",
                      "{\"many\":[{\"many\":[{\"value\":5,\"many\":[]}]}]}");
    size_t cap = (size_t)KF_JSON_DEPTH_MAX * 16;
    char *json = malloc(cap);
    size_t o = 0;
    /* 32 array+object pairs inside the body: level 65 at the innermost. */
    for (int i = 0; i < KF_JSON_DEPTH_MAX / 2; i++) {
        o += (size_t)snprintf(json + o, cap - o, "{\"many\": [");
    }
    o += (size_t)snprintf(json + o, cap - o, "{}");
    for (int i = 0; i < KF_JSON_DEPTH_MAX / 2; i++) {
        o += (size_t)snprintf(json + o, cap - o, "]}");
    }
    ProtobufCMessage *msg = NULL;
    cr_assert_eq(kf_json_to_message(json, o, DEEP, &arena, &msg, &err), KF_E_INVALID);
    const char *tail = ".many[0]: JSON nested deeper than 64 levels";
    size_t len = strlen(err.message);
    cr_assert_str_eq(err.message + len - strlen(tail), tail, "%s", err.message);
    free(json);
}

Test(depth, an_array_past_the_limit_is_an_error_unless_empty) {
    /* The innermost object is at level 64; its array would be level 65:
     * refused when it holds something, accepted empty (it nests nothing). */
    char *json = nested_next(KF_JSON_DEPTH_MAX);
    char *inner = strstr(json, "{\"value\": 1}");
    cr_assert_not_null(inner);
    const char *empty = "{\"many\": []}";
    cr_assert_eq(strlen(empty), strlen("{\"value\": 1}"));
    memcpy(inner, empty, strlen(empty));
    decode(DEEP, json);
    const char *full = "{\"many\":[1]}"; /* refused for its depth before its type */
    cr_assert_eq(strlen(full), strlen(empty));
    memcpy(inner, full, strlen(full));
    ProtobufCMessage *msg = NULL;
    cr_assert_eq(kf_json_to_message(json, strlen(json), DEEP, &arena, &msg, &err), KF_E_INVALID,
                 "%s", json);
    const char *tail = ".next.many: JSON nested deeper than 64 levels";
    size_t len = strlen(err.message);
    cr_assert(len > strlen(tail));
    cr_assert_str_eq(err.message + len - strlen(tail), tail, "%s", err.message);
    free(json);
}

Test(depth, jansson_limit_is_reported_as_invalid_json) {
    char *json = nested_data(5000);
    ProtobufCMessage *msg = NULL;
    cr_assert_eq(kf_json_to_message(json, strlen(json), DEEP, &arena, &msg, &err), KF_E_INVALID);
    cr_assert_eq(strncmp(err.message, "body: not valid JSON: ", 22), 0, "%s", err.message);
    free(json);
}

/* ---- the real API ----------------------------------------------------- */

Test(api, batch_event_from_the_design) {
    Keyflow__V1__Event *e = (Keyflow__V1__Event *)decode(
        EVENT, "{\"id\": \"e-1\", \"rule\": {\"kind\": \"batch\", \"maxEvents\": 10,"
               " \"maxWaitMs\": 1000, \"dedupMs\": 600000}, \"input\": {\"a\": 1}}");
    cr_assert_str_eq(e->id, "e-1");
    cr_assert_not_null(e->rule);
    cr_assert_eq(e->rule->kind, KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH);
    cr_assert_eq(e->rule->max_events_present_case,
                 KEYFLOW__V1__RULE__MAX_EVENTS_PRESENT_MAX_EVENTS);
    cr_assert_eq(e->rule->max_events, 10);
    cr_assert_eq(e->rule->max_wait_ms_present_case,
                 KEYFLOW__V1__RULE__MAX_WAIT_MS_PRESENT_MAX_WAIT_MS);
    cr_assert_eq(e->rule->max_wait_ms, 1000);
    cr_assert_eq(e->rule->dedup_ms_present_case, KEYFLOW__V1__RULE__DEDUP_MS_PRESENT_DEDUP_MS);
    cr_assert_eq(e->rule->dedup_ms, 600000);
    cr_assert_eq(e->rule->window_ms_present_case, KEYFLOW__V1__RULE__WINDOW_MS_PRESENT__NOT_SET);
    cr_assert_str_eq(e->input_json, "{\"a\":1}");
    cr_assert_str_eq(encode(e), "{\"id\":\"e-1\",\"rule\":{\"kind\":\"RULE_KIND_BATCH\","
                                "\"maxWaitMs\":\"1000\",\"maxEvents\":\"10\","
                                "\"dedupMs\":\"600000\"},\"input\":{\"a\":1}}");
    expect_binary_round_trip(&e->base);
}

Test(api, debounce_event_from_the_design) {
    Keyflow__V1__Event *e = (Keyflow__V1__Event *)decode(
        EVENT, "{\"rule\": {\"kind\": \"debounce\", \"windowMs\": 50}, \"input\": 7}");
    cr_assert_str_eq(e->id, "");
    cr_assert_eq(e->rule->kind, KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE);
    cr_assert_eq(e->rule->window_ms_present_case, KEYFLOW__V1__RULE__WINDOW_MS_PRESENT_WINDOW_MS);
    cr_assert_eq(e->rule->window_ms, 50);
    cr_assert_eq(e->rule->max_wait_ms_present_case,
                 KEYFLOW__V1__RULE__MAX_WAIT_MS_PRESENT__NOT_SET);
    cr_assert_eq(e->rule->max_events_present_case, KEYFLOW__V1__RULE__MAX_EVENTS_PRESENT__NOT_SET);
    cr_assert_eq(e->rule->dedup_ms_present_case, KEYFLOW__V1__RULE__DEDUP_MS_PRESENT__NOT_SET);
    cr_assert_str_eq(e->input_json, "7");
}

Test(api, explicit_zero_rule_field_is_present) {
    Keyflow__V1__Event *e =
        (Keyflow__V1__Event *)decode(EVENT, "{\"rule\": {\"kind\": \"batch\", \"maxEvents\": 0}}");
    cr_assert_eq(e->rule->max_events_present_case,
                 KEYFLOW__V1__RULE__MAX_EVENTS_PRESENT_MAX_EVENTS);
    cr_assert_eq(e->rule->max_events, 0);
    cr_assert_str_eq(e->input_json, "");
    cr_assert_str_eq(encode(e), "{\"rule\":{\"kind\":\"RULE_KIND_BATCH\",\"maxEvents\":\"0\"}}");
}

Test(api, send_event_errors_name_the_path) {
    const ProtobufCMessageDescriptor *desc = &keyflow__v1__send_event_request__descriptor;
    expect_error(desc, "{\"event\": {\"rule\": {\"maxEvents\": \"ten\"}}}",
                 "event.rule.maxEvents: expected an integer, got \"ten\"");
    expect_error(desc, "{\"event\": {\"rule\": {\"kind\": \"sometimes\"}}}",
                 "event.rule.kind: expected one of RULE_KIND_UNSPECIFIED, RULE_KIND_DEBOUNCE, "
                 "RULE_KIND_BATCH (or unspecified, debounce, batch), got \"sometimes\"");
    expect_error(desc, "{\"event\": {\"rule\": {\"windowMs\": 1.5}}}",
                 "event.rule.windowMs: expected an integer, got 1.5");
    expect_error(desc, "{\"event\": {\"rule\": {\"window\": 1}}}",
                 "event.rule.window: unknown field (known: kind, windowMs, maxWaitMs, "
                 "maxEvents, dedupMs, edge, maxBytes, keyConcurrency, retry, startAfterMs)");
    expect_error(desc, "{\"workflow\": 1}", "workflow: expected a string, got 1");
}

Test(api, send_event_request_round_trip) {
    expect_round_trip(&keyflow__v1__send_event_request__descriptor,
                      "{\"workflow\": \"wf\", \"key\": \"k\","
                      " \"event\": {\"input\": [1, \"two\"]}}",
                      "{\"workflow\":\"wf\",\"key\":\"k\",\"event\":{\"input\":[1,\"two\"]}}");
}

Test(api, complete_run_outcome_oneof) {
    const ProtobufCMessageDescriptor *desc = &keyflow__v1__complete_run_request__descriptor;
    Keyflow__V1__CompleteRunRequest *r = (Keyflow__V1__CompleteRunRequest *)decode(
        desc, "{\"runId\": \"k@u\", \"lease\": \"l\", \"result\": {\"ok\": true}}");
    cr_assert_eq(r->outcome_case, KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_RESULT_JSON);
    cr_assert_str_eq(r->result_json, "{\"ok\":true}");
    cr_assert_str_eq(r->run_id, "k@u");
    r = (Keyflow__V1__CompleteRunRequest *)decode(desc, "{\"error\": \"boom\"}");
    cr_assert_eq(r->outcome_case, KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_ERROR);
    cr_assert_str_eq(r->error, "boom");
    r = (Keyflow__V1__CompleteRunRequest *)decode(desc, "{\"resultJson\": \"[1]\"}");
    cr_assert_eq(r->outcome_case, KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_RESULT_JSON);
    cr_assert_str_eq(r->result_json, "[1]");
    r = (Keyflow__V1__CompleteRunRequest *)decode(desc, "{\"result\": null}");
    cr_assert_eq(r->outcome_case, KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_RESULT_JSON);
    cr_assert_str_eq(r->result_json, "null");
    r = (Keyflow__V1__CompleteRunRequest *)decode(desc, "{\"runId\": \"r\"}");
    cr_assert_eq(r->outcome_case, KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME__NOT_SET);
    expect_error(desc, "{\"result\": 1, \"error\": \"e\"}",
                 "error: \"result\" and \"error\" are members of one oneof; set at most one");
}

Test(api, push_batch_rows_json_in_a_oneof_with_a_message) {
    const ProtobufCMessageDescriptor *desc = &keyflow__v1__push_batch_request__descriptor;
    Keyflow__V1__PushBatchRequest *r = (Keyflow__V1__PushBatchRequest *)decode(
        desc, "{\"functionId\": \"f\", \"sequence\": \"3\", \"rows\": [{\"k\": \"a\", \"v\": 1}],"
              " \"watermarkUs\": 0}");
    cr_assert_eq(r->rows_case, KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_ROWS_JSON);
    cr_assert_str_eq(r->rows_json, "[{\"k\":\"a\",\"v\":1}]");
    cr_assert_eq(r->watermark_present_case,
                 KEYFLOW__V1__PUSH_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US);
    cr_assert_eq(r->watermark_us, 0);
    cr_assert_str_eq(encode(r), "{\"functionId\":\"f\",\"sequence\":\"3\","
                                "\"rows\":[{\"k\":\"a\",\"v\":1}],\"watermarkUs\":\"0\"}");
    r = (Keyflow__V1__PushBatchRequest *)decode(desc, "{\"batch\": {}}");
    cr_assert_eq(r->rows_case, KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_BATCH);
    cr_assert_not_null(r->batch);
    expect_error(desc, "{\"batch\": {}, \"rows\": []}",
                 "rows: \"batch\" and \"rows\" are members of one oneof; set at most one");
}

Test(api, run_encodes_with_embedded_json) {
    Keyflow__V1__Run run = KEYFLOW__V1__RUN__INIT;
    run.run_id = "k@u";
    run.kind = KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH;
    run.input_json = "[{\"a\":1},{\"a\":2}]";
    run.event_count = 2;
    run.status = KEYFLOW__V1__RUN_STATUS__RUN_STATUS_COMPLETED;
    run.result_json = "{\"sum\":3}";
    run.finished_ms = 1700000000000LL;
    cr_assert_str_eq(encode(&run),
                     "{\"runId\":\"k@u\",\"kind\":\"RULE_KIND_BATCH\",\"input\":[{\"a\":1},"
                     "{\"a\":2}],\"eventCount\":\"2\",\"status\":\"RUN_STATUS_COMPLETED\","
                     "\"result\":{\"sum\":3},\"finishedMs\":\"1700000000000\",\"eventIds\":[]}");
    run.result_json = "";
    run.input_json = "oops";
    cr_assert_str_eq(encode(&run),
                     "{\"runId\":\"k@u\",\"kind\":\"RULE_KIND_BATCH\",\"inputJson\":\"oops\","
                     "\"eventCount\":\"2\",\"status\":\"RUN_STATUS_COMPLETED\","
                     "\"finishedMs\":\"1700000000000\",\"eventIds\":[]}");
}

Test(api, describe_response_with_repeated_fields) {
    expect_round_trip(&keyflow__v1__describe_coordinator_response__descriptor,
                      "{\"exists\": true, \"coordinator\": {\"kind\": \"debounce\","
                      " \"workflow\": \"w\", \"key\": \"k\"}, \"recentRunIds\": [\"a\", \"b\"],"
                      " \"rememberedIds\": [{\"id\": \"e\", \"receipt\": {\"runId\": \"r\","
                      " \"dueMs\": 5}}], \"journal\": [{\"seq\": 1, \"what\": \"run_started\"}]}",
                      "{\"exists\":true,\"coordinator\":{\"kind\":\"RULE_KIND_DEBOUNCE\","
                      "\"workflow\":\"w\",\"key\":\"k\"},\"recentRunIds\":[\"a\",\"b\"],"
                      "\"rememberedIds\":[{\"id\":\"e\",\"receipt\":{\"runId\":\"r\","
                      "\"dueMs\":\"5\"}}],\"journal\":[{\"seq\":\"1\",\"what\":\"run_started\"}]}");
}

/* ---- kf_message_set_text ---------------------------------------------- */

Test(set_text, dotted_paths_create_messages) {
    Keyflow__V1__DescribeCoordinatorRequest req = KEYFLOW__V1__DESCRIBE_COORDINATOR_REQUEST__INIT;
    expect_set_text(&req.base, "coordinator.workflow", "wf");
    expect_set_text(&req.base, "coordinator.key", "k/1");
    expect_set_text(&req.base, "coordinator.kind", "batch");
    cr_assert_not_null(req.coordinator);
    cr_assert_str_eq(req.coordinator->workflow, "wf");
    cr_assert_str_eq(req.coordinator->key, "k/1");
    cr_assert_eq(req.coordinator->kind, KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH);
    cr_assert_str_eq(encode(&req), "{\"coordinator\":{\"kind\":\"RULE_KIND_BATCH\","
                                   "\"workflow\":\"wf\",\"key\":\"k/1\"}}");
}

Test(set_text, field_and_json_names) {
    Keyflow__V1__ListRunsRequest req = KEYFLOW__V1__LIST_RUNS_REQUEST__INIT;
    expect_set_text(&req.base, "page_size", "50");
    expect_set_text(&req.base, "pageToken", "t");
    expect_set_text(&req.base, "status", "RUN_STATUS_FAILED");
    cr_assert_eq(req.page_size, 50);
    cr_assert_str_eq(req.page_token, "t");
    cr_assert_eq(req.status, KEYFLOW__V1__RUN_STATUS__RUN_STATUS_FAILED);
    expect_set_text(&req.base, "status", "completed");
    cr_assert_eq(req.status, KEYFLOW__V1__RUN_STATUS__RUN_STATUS_COMPLETED);
}

Test(set_text, repeated_fields_append) {
    Keyflow__V1__PollRunsRequest req = KEYFLOW__V1__POLL_RUNS_REQUEST__INIT;
    expect_set_text(&req.base, "workflows", "a");
    expect_set_text(&req.base, "workflows", "b");
    expect_set_text(&req.base, "workflows", "c");
    cr_assert_eq(req.n_workflows, 3u);
    cr_assert_str_eq(req.workflows[0], "a");
    cr_assert_str_eq(req.workflows[1], "b");
    cr_assert_str_eq(req.workflows[2], "c");
    Keyflow__Test__Lists lists = KEYFLOW__TEST__LISTS__INIT;
    expect_set_text(&lists.base, "rColor", "red");
    expect_set_text(&lists.base, "r_color", "deep_blue");
    expect_set_text(&lists.base, "rInt64", "-9223372036854775808");
    expect_set_text(&lists.base, "rBool", "true");
    cr_assert_str_eq(encode(&lists),
                     "{\"rInt32\":[],\"rSint32\":[],\"rInt64\":[\"-9223372036854775808\"],"
                     "\"rUint64\":[],\"rFixed32\":[],\"rDouble\":[],\"rFloat\":[],"
                     "\"rBool\":[true],\"rString\":[],\"rBytes\":[],"
                     "\"rColor\":[\"COLOR_RED\",\"COLOR_DEEP_BLUE\"],\"rInner\":[]}");
}

Test(set_text, every_scalar_type) {
    Keyflow__Test__Scalars m = KEYFLOW__TEST__SCALARS__INIT;
    expect_set_text(&m.base, "fDouble", "-2.5e1");
    expect_set_text(&m.base, "fFloat", "NaN");
    expect_set_text(&m.base, "fInt32", "-7");
    expect_set_text(&m.base, "fUint64", "18446744073709551615");
    expect_set_text(&m.base, "fBool", "true");
    expect_set_text(&m.base, "fString", " spaced, \"quoted\" ");
    expect_set_text(&m.base, "fBytes", "AAE");
    expect_set_text(&m.base, "level", "high");
    cr_assert(m.f_double == -25.0);
    cr_assert(isnan(m.f_float));
    cr_assert_eq(m.f_int32, -7);
    cr_assert_eq(m.f_uint64, UINT64_MAX);
    cr_assert_eq(m.f_bool, 1);
    cr_assert_str_eq(m.f_string, " spaced, \"quoted\" ");
    cr_assert_eq(m.f_bytes.len, 2u);
    cr_assert_eq(m.level, KEYFLOW__TEST__LEVEL__HIGH);
    expect_set_text(&m.base, "f_bool", "false");
    cr_assert_eq(m.f_bool, 0);
    expect_set_text(&m.base, "inner.child.name", "deep");
    cr_assert_str_eq(m.inner->child->name, "deep");
}

Test(set_text, errors_name_the_parameter) {
    Keyflow__V1__PollRunsRequest req = KEYFLOW__V1__POLL_RUNS_REQUEST__INIT;
    expect_set_text_error(&req.base, "leaseMs", "abc", "leaseMs: expected an integer, got \"abc\"");
    expect_set_text_error(&req.base, "lease_ms", "9223372036854775808",
                          "lease_ms: out of range for int64, got \"9223372036854775808\"");
    expect_set_text_error(&req.base, "nope", "1",
                          "nope: unknown field (known: workflows, workerId, leaseMs, maxRuns, "
                          "waitMs)");
    Keyflow__Test__Scalars m = KEYFLOW__TEST__SCALARS__INIT;
    expect_set_text_error(&m.base, "fBool", "yes", "fBool: expected true or false, got \"yes\"");
    /* As OpenAPI writes a boolean and an enum: no other spellings. */
    expect_set_text_error(&m.base, "fBool", "1", "fBool: expected true or false, got \"1\"");
    expect_set_text_error(&m.base, "fBool", "TRUE", "fBool: expected true or false, got \"TRUE\"");
    expect_set_text_error(&m.base, "color", "teal",
                          "color: expected one of COLOR_UNSPECIFIED, COLOR_RED, COLOR_GREEN, "
                          "COLOR_DEEP_BLUE (or unspecified, red, green, deep_blue), got \"teal\"");
    expect_set_text_error(&m.base, "color", "2",
                          "color: expected one of COLOR_UNSPECIFIED, COLOR_RED, COLOR_GREEN, "
                          "COLOR_DEEP_BLUE (or unspecified, red, green, deep_blue), got \"2\"");
    expect_set_text_error(&m.base, "fBytes", "A", "fBytes: expected base64, got \"A\"");
    expect_set_text_error(&m.base, "fDouble", "1,5", "fDouble: expected a number, got \"1,5\"");
    expect_set_text_error(&m.base, "fString", "\xff", "fString: not valid UTF-8");
    expect_set_text_error(&m.base, "inner.nope", "1",
                          "inner.nope: unknown field (known: name, count, child)");
    expect_set_text_error(&m.base, "inner.count", "x",
                          "inner.count: expected an integer, got \"x\"");
}

Test(set_text, bad_paths) {
    Keyflow__V1__DescribeCoordinatorRequest req = KEYFLOW__V1__DESCRIBE_COORDINATOR_REQUEST__INIT;
    expect_set_text_error(&req.base, "coordinator", "x",
                          "coordinator: is a message; set one of its fields "
                          "(coordinator.<field>)");
    expect_set_text_error(&req.base, "coordinator..kind", "batch",
                          "coordinator..kind: not a field name or dotted path of field names");
    expect_set_text_error(&req.base, "", "x",
                          "body: not a field name or dotted path of field names");
    expect_set_text_error(&req.base, "coordinator.", "x",
                          "coordinator.: not a field name or dotted path of field names");
    expect_set_text_error(&req.base, "coordinator.kind.x", "x",
                          "coordinator.kind: not a singular message field, so "
                          "\"coordinator.kind.x\" cannot be set");
    Keyflow__V1__PollRunsResponse resp = KEYFLOW__V1__POLL_RUNS_RESPONSE__INIT;
    expect_set_text_error(&resp.base, "runs.runId", "x",
                          "runs: not a singular message field, so \"runs.runId\" cannot be set");
}

Test(set_text, oneof_members_switch_the_case) {
    Keyflow__Test__Choice m = KEYFLOW__TEST__CHOICE__INIT;
    expect_set_text(&m.base, "number", "5");
    cr_assert_eq(m.pick_case, KEYFLOW__TEST__CHOICE__PICK_NUMBER);
    cr_assert_eq(m.number, 5);
    expect_set_text(&m.base, "text", "t");
    cr_assert_eq(m.pick_case, KEYFLOW__TEST__CHOICE__PICK_TEXT);
    cr_assert_str_eq(m.text, "t");
    expect_set_text(&m.base, "inner.name", "n");
    cr_assert_eq(m.pick_case, KEYFLOW__TEST__CHOICE__PICK_INNER);
    cr_assert_str_eq(m.inner->name, "n");
    cr_assert_null(m.inner->child);
    expect_set_text(&m.base, "inner.count", "2");
    cr_assert_str_eq(m.inner->name, "n");
    cr_assert_eq(m.inner->count, 2);
    expect_set_text(&m.base, "only", "0");
    cr_assert_eq(m.single_case, KEYFLOW__TEST__CHOICE__SINGLE_ONLY);
    cr_assert_str_eq(encode(&m), "{\"inner\":{\"name\":\"n\",\"count\":2},\"only\":0}");
}

Test(set_text, json_fields) {
    Keyflow__Test__Choice m = KEYFLOW__TEST__CHOICE__INIT;
    expect_set_text(&m.base, "payload", "{ \"a\" : [1, 2] }");
    cr_assert_eq(m.pick_case, KEYFLOW__TEST__CHOICE__PICK_PAYLOAD_JSON);
    cr_assert_str_eq(m.payload_json, "{\"a\":[1,2]}");
    expect_set_text(&m.base, "payloadJson", "raw text");
    cr_assert_str_eq(m.payload_json, "raw text");
    expect_set_text(&m.base, "meta", "\"s\"");
    cr_assert_str_eq(m.meta_json, "\"s\"");
    expect_set_text_error(&m.base, "meta", "not json",
                          "meta: not valid JSON: invalid token near 'not'");
    cr_assert_str_eq(m.meta_json, "\"s\"");
}

/* ---- kf_json_merge ---------------------------------------------------- */

Test(merge, path_prefixes_errors) {
    json_t *obj = json_pack("{s:{s:s}}", "rule", "maxEvents", "ten");
    Keyflow__V1__Event e = KEYFLOW__V1__EVENT__INIT;
    cr_assert_eq(kf_json_merge(obj, &e.base, "event", &arena, &err), KF_E_INVALID);
    cr_assert_str_eq(err.message, "event.rule.maxEvents: expected an integer, got \"ten\"");
    json_decref(obj);
    obj = json_integer(5);
    cr_assert_eq(kf_json_merge(obj, &e.base, "event", &arena, &err), KF_E_INVALID);
    cr_assert_str_eq(err.message, "event: expected an object, got 5");
    cr_assert_eq(kf_json_merge(obj, &e.base, "", &arena, &err), KF_E_INVALID);
    cr_assert_str_eq(err.message, "body: expected an object, got 5");
    json_decref(obj);
}

Test(merge, strings_with_nul_are_refused) {
    /* The body parser refuses \u0000, but a caller's jansson value may hold
     * one, and a C string would silently end there. */
    Keyflow__Test__Scalars m = KEYFLOW__TEST__SCALARS__INIT;
    json_t *obj = json_pack("{s:s#}", "fString", "a\0b", (int)3);
    cr_assert_not_null(obj);
    cr_assert_eq(kf_json_merge(obj, &m.base, "", &arena, &err), KF_E_INVALID);
    cr_assert_str_eq(err.message, "fString: must not contain a NUL character");
    cr_assert_str_eq(m.f_string, "");
    json_decref(obj);
}

Test(merge, present_fields_overwrite_and_messages_merge) {
    Keyflow__Test__Scalars *m = decode_scalars(
        "{\"fInt32\": 1, \"fString\": \"keep\", \"inner\": {\"name\": \"n\", \"count\": 1}}");
    json_t *obj = json_pack("{s:i, s:{s:i}}", "fInt32", 2, "inner", "count", 9);
    cr_assert_eq(kf_json_merge(obj, &m->base, "", &arena, &err), KF_OK, "%s", err.message);
    json_decref(obj);
    cr_assert_eq(m->f_int32, 2);
    cr_assert_str_eq(m->f_string, "keep");
    cr_assert_str_eq(m->inner->name, "n");
    cr_assert_eq(m->inner->count, 9);
}

Test(merge, repeated_fields_are_replaced) {
    Keyflow__Test__Lists *m = decode_lists("{\"rInt32\": [1, 2, 3], \"rString\": [\"a\"]}");
    json_t *obj = json_pack("{s:[i]}", "rInt32", 7);
    cr_assert_eq(kf_json_merge(obj, &m->base, "", &arena, &err), KF_OK);
    json_decref(obj);
    cr_assert_eq(m->n_r_int32, 1u);
    cr_assert_eq(m->r_int32[0], 7);
    cr_assert_eq(m->n_r_string, 1u);
    obj = json_pack("{s:n}", "rString");
    cr_assert_eq(kf_json_merge(obj, &m->base, "", &arena, &err), KF_OK);
    json_decref(obj);
    cr_assert_eq(m->n_r_string, 0u);
    cr_assert_null(m->r_string);
}

Test(merge, oneof_switches_and_clears) {
    Keyflow__Test__Choice *m = decode_choice("{\"text\": \"t\"}");
    /* The shared storage held a string pointer: the new member must not be
     * merged into it as a message. */
    json_t *obj = json_pack("{s:{s:s}}", "inner", "name", "i");
    cr_assert_eq(kf_json_merge(obj, &m->base, "", &arena, &err), KF_OK, "%s", err.message);
    json_decref(obj);
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK_INNER);
    cr_assert_str_eq(m->inner->name, "i");
    cr_assert_eq(m->inner->count, 0);
    /* Null for another member leaves the set member alone. */
    obj = json_pack("{s:n}", "text");
    cr_assert_eq(kf_json_merge(obj, &m->base, "", &arena, &err), KF_OK);
    json_decref(obj);
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK_INNER);
    /* Null for the set member clears the oneof. */
    obj = json_pack("{s:n}", "inner");
    cr_assert_eq(kf_json_merge(obj, &m->base, "", &arena, &err), KF_OK);
    json_decref(obj);
    cr_assert_eq(m->pick_case, KEYFLOW__TEST__CHOICE__PICK__NOT_SET);
    cr_assert_str_eq(encode(m), "{}");
}

Test(merge, into_a_stack_message) {
    Keyflow__V1__SendEventRequest req = KEYFLOW__V1__SEND_EVENT_REQUEST__INIT;
    expect_set_text(&req.base, "workflow", "wf");
    json_error_t jerr;
    json_t *obj = json_loads("{\"key\": \"k\", \"event\": {\"input\": [1]}}", 0, &jerr);
    cr_assert_not_null(obj);
    cr_assert_eq(kf_json_merge(obj, &req.base, "", &arena, &err), KF_OK, "%s", err.message);
    json_decref(obj);
    cr_assert_str_eq(req.workflow, "wf");
    cr_assert_str_eq(req.key, "k");
    cr_assert_str_eq(req.event->input_json, "[1]");
}

/* ---- encoding --------------------------------------------------------- */

Test(encode, jansson_value_is_owned_by_the_caller) {
    Keyflow__Test__Inner inner = KEYFLOW__TEST__INNER__INIT;
    inner.name = "x";
    inner.count = -1;
    json_t *v = kf_message_to_jansson(&inner.base);
    cr_assert_not_null(v);
    cr_assert(json_is_object(v));
    cr_assert_eq(json_object_size(v), 2u);
    cr_assert_str_eq(json_string_value(json_object_get(v, "name")), "x");
    cr_assert_eq(json_integer_value(json_object_get(v, "count")), -1);
    cr_assert_eq(v->refcount, 1u);
    json_decref(v);
}

Test(encode, invalid_utf8_is_replaced) {
    Keyflow__Test__Inner inner = KEYFLOW__TEST__INNER__INIT;
    inner.name = "a\xff"
                 "b\xe2\x82"
                 "c\xf0\x9f\x98\x80";
    cr_assert_str_eq(encode(&inner), "{\"name\":\"a\xef\xbf\xbd"
                                     "b\xef\xbf\xbd\xef\xbf\xbd"
                                     "c\xf0\x9f\x98\x80\"}");
    inner.name = "\xed\xa0\x80"; /* an encoded surrogate */
    cr_assert_str_eq(encode(&inner), "{\"name\":\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"}");
}

Test(encode, null_strings_are_empty) {
    Keyflow__Test__Inner inner = KEYFLOW__TEST__INNER__INIT;
    inner.name = NULL;
    cr_assert_str_eq(encode(&inner), "{}");
    Keyflow__Test__Lists lists = KEYFLOW__TEST__LISTS__INIT;
    char *strings[] = {NULL, "b"};
    lists.n_r_string = 2;
    lists.r_string = strings;
    cr_assert_str_eq(encode(&lists), "{\"rInt32\":[],\"rSint32\":[],\"rInt64\":[],\"rUint64\":[],"
                                     "\"rFixed32\":[],\"rDouble\":[],\"rFloat\":[],\"rBool\":[],"
                                     "\"rString\":[\"\",\"b\"],\"rBytes\":[],\"rColor\":[],"
                                     "\"rInner\":[]}");
}

Test(encode, arena_exhaustion_returns_null) {
    kf_arena_t small;
    kf_arena_init(&small, 64);
    Keyflow__Test__Inner inner = KEYFLOW__TEST__INNER__INIT;
    char name[200];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    inner.name = name;
    size_t len = 12345;
    cr_assert_null(kf_message_to_json(&inner.base, &small, &len));
    cr_assert_eq(len, 12345u);
    kf_arena_deinit(&small);
}

Test(encode, deep_everything_round_trips) {
    const char *json =
        "{\"scalars\":{\"fInt64\":\"1\",\"color\":\"COLOR_DEEP_BLUE\",\"inner\":{\"child\":"
        "{\"name\":\"c\"}}},\"lists\":{\"rInt32\":[],\"rSint32\":[],\"rInt64\":[],"
        "\"rUint64\":[],\"rFixed32\":[],\"rDouble\":[],\"rFloat\":[],\"rBool\":[],"
        "\"rString\":[],\"rBytes\":[],\"rColor\":[],\"rInner\":[{\"count\":1},{\"count\":2}]},"
        "\"choice\":{\"payload\":[1,[2,[3]]],\"meta\":{}},"
        "\"deep\":{\"next\":{\"many\":[],\"dataJson\":\"{x\"},\"many\":[{\"many\":[]}]}}";
    ProtobufCMessage *m = decode(&keyflow__test__everything__descriptor, json);
    cr_assert_str_eq(encode(m), json);
    expect_binary_round_trip(m);
}

/* ---- proto2 presence -------------------------------------------------- */

Test(proto2, has_flags_follow_the_json) {
    const ProtobufCMessageDescriptor *desc = &keyflow__test__legacy__descriptor;
    Keyflow__Test__Legacy *m = (Keyflow__Test__Legacy *)decode(
        desc, "{\"id\": 0, \"count\": 0, \"on\": false, \"data\": \"\", \"big\": \"0\"}");
    cr_assert(m->has_count && m->has_on && m->has_data && m->has_big);
    cr_assert_null(m->name);
    cr_assert_str_eq(m->label, "none");
    cr_assert_str_eq(encode(m),
                     "{\"id\":\"0\",\"count\":0,\"on\":false,\"data\":\"\",\"big\":\"0\"}");
    m = (Keyflow__Test__Legacy *)decode(desc, "{}");
    cr_assert_not(m->has_count);
    cr_assert_str_eq(encode(m), "{\"id\":\"0\"}");
}

Test(proto2, strings_and_null) {
    const ProtobufCMessageDescriptor *desc = &keyflow__test__legacy__descriptor;
    Keyflow__Test__Legacy *m = (Keyflow__Test__Legacy *)decode(
        desc, "{\"id\": \"5\", \"name\": \"\", \"label\": \"x\", \"count\": 3}");
    cr_assert_str_eq(m->name, "");
    cr_assert_str_eq(encode(m), "{\"id\":\"5\",\"count\":3,\"name\":\"\",\"label\":\"x\"}");
    json_t *obj = json_pack("{s:n, s:n, s:n}", "count", "name", "label");
    cr_assert_eq(kf_json_merge(obj, &m->base, "", &arena, &err), KF_OK);
    json_decref(obj);
    cr_assert_not(m->has_count);
    cr_assert_null(m->name);
    cr_assert_str_eq(m->label, "none");
    cr_assert_str_eq(encode(m), "{\"id\":\"5\"}");
}
