/*
 * json_test.c - client JSON checks, the shortest-digits writer and the
 * proto3 JSON scalar forms.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/limits.h"

static kf_error_t err;

static kf_status_t check(const char *text) {
    kf_error_clear(&err);
    return kf_json_check("event.input", text, strlen(text), 64, &err);
}

Test(json_check, accepts_any_value_and_nul_escapes) {
    const char *good[] = {"1", "null", "\"a\\u0000b\"", "[1,{\"a\":[]}]", " {\"a\": 0.1} ", ""};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        cr_assert_eq(check(good[i]), KF_OK, "%s: %s", good[i], err.message);
    }
}

Test(json_check, refuses_naming_the_field) {
    cr_assert_eq(check("{\"a\":1,\"a\":2}"), KF_E_INVALID);
    cr_assert(strstr(err.message, "event.input: not valid JSON: duplicate object key") != NULL,
              "%s", err.message);
    cr_assert_eq(check("{nope"), KF_E_INVALID);
    cr_assert(strstr(err.message, "event.input: not valid JSON") != NULL, "%s", err.message);
    char big[80];
    memset(big, ' ', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    big[0] = '1';
    cr_assert_eq(check(big), KF_E_TOO_LARGE);
    cr_assert_str_eq(err.message, "event.input: at most 64 bytes of JSON, got 79");
}

Test(json_check, nesting_is_bounded) {
    size_t cap = (size_t)KF_JSON_DEPTH_MAX * 2 + 4;
    char *text = calloc(1, cap);
    cr_assert_not_null(text);
    for (int depth = KF_JSON_DEPTH_MAX; depth <= KF_JSON_DEPTH_MAX + 1; depth++) {
        memset(text, '[', (size_t)depth);
        memset(text + depth, ']', (size_t)depth);
        text[2 * depth] = '\0';
        kf_error_clear(&err);
        kf_status_t st = kf_json_check("result", text, strlen(text), 1024, &err);
        if (depth == KF_JSON_DEPTH_MAX) {
            cr_assert_eq(st, KF_OK, "%s", err.message);
        } else {
            cr_assert_eq(st, KF_E_INVALID);
            cr_assert_str_eq(err.message, "result: nested deeper than 64 levels");
        }
    }
    free(text);
}

static char *dump_real(double x) {
    json_t *v = json_real(x);
    char *text = kf_json_dumps(v, JSON_ENCODE_ANY);
    json_decref(v);
    cr_assert_not_null(text);
    return text;
}

Test(json_dumps, reals_use_the_fewest_digits_that_read_back) {
    struct {
        double x;
        const char *text;
    } cases[] = {
        {0.1, "0.1"},     {1.0 / 3, "0.3333333333333333"}, {100.0, "100.0"},   {-0.5, "-0.5"},
        {1e300, "1e300"}, {123456.789, "123456.789"},      {5e-324, "5e-324"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = dump_real(cases[i].x);
        cr_assert_str_eq(text, cases[i].text);
        free(text);
    }
}

Test(json_dumps, every_real_reads_back_exactly) {
    /* Doubles from random bit patterns (seeded), finite ones only. */
    uint64_t state = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < 20000; i++) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        double x;
        memcpy(&x, &state, sizeof x);
        if (!isfinite(x)) {
            continue;
        }
        char *text = dump_real(x);
        double back = strtod(text, NULL);
        cr_assert(memcmp(&back, &x, sizeof x) == 0 || (x == 0 && back == 0), "%.17g -> %s", x,
                  text);
        free(text);
    }
}

Test(json_dumps, a_document_takes_the_most_digits_any_real_needs) {
    json_t *v = json_pack("{s:f, s:[f, i]}", "a", 0.25, "b", 0.1, 7);
    char *text = kf_json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
    cr_assert_str_eq(text, "{\"a\":0.25,\"b\":[0.1,7]}");
    free(text);
    json_decref(v);
}

/* ---- proto3 JSON scalars ------------------------------------------------- */

static json_t *parse(const char *text) {
    json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
    cr_assert_not_null(v, "%s", text);
    return v;
}

Test(json_scalars, int64_takes_integers_and_strict_decimal_strings) {
    struct {
        const char *json;
        bool ok;
        int64_t value;
    } cases[] = {
        {"12", true, 12},
        {"\"-12\"", true, -12},
        {"\"9223372036854775807\"", true, INT64_MAX},
        {"\"-9223372036854775808\"", true, INT64_MIN},
        {"\"9223372036854775808\"", false, 0},
        {"\"99999999999999999999\"", false, 0},
        {"\" 12\"", false, 0},
        {"\"+12\"", false, 0},
        {"\"12x\"", false, 0},
        {"\"\"", false, 0},
        {"\"-\"", false, 0},
        {"1.0", false, 0},
        {"true", false, 0},
        {"null", false, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *v = parse(cases[i].json);
        int64_t got = 0;
        cr_assert_eq(kf_json_int64_value(v, &got), cases[i].ok, "%s", cases[i].json);
        if (cases[i].ok) {
            cr_assert_eq(got, cases[i].value, "%s", cases[i].json);
        }
        json_decref(v);
    }
}

Test(json_scalars, double_takes_numbers_decimal_text_and_the_non_finite_names) {
    const char *good[] = {"1.5",     "-2",           "\"1.5\"",      "\"-1e3\"",
                          "\"NaN\"", "\"Infinity\"", "\"-Infinity\""};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        json_t *v = parse(good[i]);
        double d = 0;
        cr_assert(kf_json_double_value(v, &d), "%s", good[i]);
        json_decref(v);
    }
    const char *bad[] = {"\"inf\"", "\"nan\"", "\"0x10\"", "\" 1\"", "\"1e999\"", "\"\"", "true"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *v = parse(bad[i]);
        double d = 0;
        cr_assert(!kf_json_double_value(v, &d), "%s", bad[i]);
        json_decref(v);
    }
}

/* What the writers produce reads back as the same value. */
Test(json_scalars, writers_read_back) {
    int64_t ints[] = {0, -1, INT64_MAX, INT64_MIN};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        json_t *v = kf_json_int64(ints[i]);
        cr_assert(json_is_string(v));
        int64_t back = 0;
        cr_assert(kf_json_int64_value(v, &back));
        cr_assert_eq(back, ints[i]);
        json_decref(v);
    }
    double reals[] = {0.1, -3.5, INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
        json_t *v = kf_json_double(reals[i]);
        double back = 0;
        cr_assert(kf_json_double_value(v, &back));
        cr_assert(isnan(reals[i]) ? isnan(back) : back == reals[i], "%g", reals[i]);
        json_decref(v);
    }
    json_t *nan = kf_json_double(NAN);
    cr_assert_str_eq(json_string_value(nan), "NaN");
    json_decref(nan);
    const uint8_t bytes[] = {0, 1, 2, 0xff};
    json_t *b = kf_json_bytes(bytes, sizeof bytes);
    cr_assert_str_eq(json_string_value(b), "AAEC/w==");
    json_decref(b);
    json_t *empty = kf_json_bytes(NULL, 0);
    cr_assert_str_eq(json_string_value(empty), "");
    json_decref(empty);
}
