/*
 * log_test.c - the log sink (service/base/log.h): both line formats, level
 * filtering, values that need quoting or escaping, lines cut at the bound,
 * and the per-request debug line's identifiers.
 *
 * Each test redirects stderr (fd 2) into a temporary file, logs, and reads
 * the lines back; every JSON line is parsed with jansson, so "valid JSON"
 * means what a log shipper would see. Criterion runs each test in its own
 * process, so the level and format set by one test do not leak.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "base/limits.h"
#include "base/log.h"
#include "keyflow/v1/coordinators.pb-c.h"
#include "keyflow/v1/runs.pb-c.h"

#define CAPTURE_BYTES_MAX (4 * KF_LOG_LINE_BYTES_MAX)

static FILE *capture_file;
static int saved_stderr = -1;

static void capture_begin(void) {
    fflush(stderr);
    capture_file = tmpfile();
    cr_assert_not_null(capture_file);
    saved_stderr = dup(STDERR_FILENO);
    cr_assert_geq(saved_stderr, 0);
    cr_assert_geq(dup2(fileno(capture_file), STDERR_FILENO), 0);
}

/* Everything logged since capture_begin (caller frees). */
static char *capture_end(void) {
    cr_assert_geq(dup2(saved_stderr, STDERR_FILENO), 0);
    close(saved_stderr);
    char *text = calloc(1, CAPTURE_BYTES_MAX + 1);
    cr_assert_not_null(text);
    rewind(capture_file);
    size_t n = fread(text, 1, CAPTURE_BYTES_MAX, capture_file);
    text[n] = '\0';
    fclose(capture_file);
    return text;
}

static size_t count_lines(const char *text) {
    size_t n = 0;
    for (const char *p = text; *p != '\0'; p++) {
        n += *p == '\n';
    }
    return n;
}

/* The one line of `text` as a JSON object (caller decrefs). */
static json_t *only_json_line(const char *text) {
    cr_assert_eq(count_lines(text), 1, "expected one line: %s", text);
    json_error_t error;
    json_t *line = json_loads(text, JSON_REJECT_DUPLICATES, &error);
    cr_assert_not_null(line, "not JSON (%s): %s", error.text, text);
    cr_assert(json_is_object(line));
    return line;
}

static const char *str(json_t *object, const char *key) {
    json_t *v = json_object_get(object, key);
    cr_assert(json_is_string(v), "%s is not a string", key);
    return json_string_value(v);
}

Test(log, text_line_has_time_level_module_message_and_fields) {
    capture_begin();
    kf_log_kv(KF_LOG_INFO, "runs", "lease expired", KF_LOG_STR("run_id", "k@1"),
              KF_LOG_INT("attempt", 2), KF_LOG_STR("error", "two words"), KF_LOG_STR("empty", ""),
              KF_LOG_STR("eq", "a=b"), KF_LOG_STR("quote", "say \"hi\""));
    char *text = capture_end();
    /* 2026-11-29T10:00:00.123Z */
    cr_assert_eq(strlen(text) > 25 && text[4] == '-' && text[10] == 'T' && text[23] == 'Z', 1, "%s",
                 text);
    cr_assert_str_eq(text + 25, "info runs: lease expired run_id=k@1 attempt=2 error=\"two words\" "
                                "empty=\"\" eq=\"a=b\" quote=\"say \\\"hi\\\"\"\n");
    free(text);
}

Test(log, json_line_is_one_object_with_fields_at_the_top) {
    kf_log_set_format(KF_LOG_FORMAT_JSON);
    capture_begin();
    kf_log_kv(KF_LOG_WARN, "coord", "window closed, run started", KF_LOG_STR("key", "a\"b\\c\n\t"),
              KF_LOG_INT("events", -7), KF_LOG_STR("null_text", NULL));
    char *text = capture_end();
    json_t *line = only_json_line(text);
    cr_assert_eq(json_object_size(line), 7, "%s", text);
    cr_assert_eq(strlen(str(line, "ts")), 24);
    cr_assert_str_eq(str(line, "level"), "warn");
    cr_assert_str_eq(str(line, "module"), "coord");
    cr_assert_str_eq(str(line, "msg"), "window closed, run started");
    cr_assert_str_eq(str(line, "key"), "a\"b\\c\n\t");
    cr_assert_eq(json_integer_value(json_object_get(line, "events")), -7);
    cr_assert_str_eq(str(line, "null_text"), "");
    json_decref(line);
    free(text);
}

Test(log, printf_records_become_the_message) {
    kf_log_set_format(KF_LOG_FORMAT_JSON);
    capture_begin();
    kf_log(KF_LOG_ERROR, "main", "cannot open %s: %d%%", "the store", 5);
    char *text = capture_end();
    json_t *line = only_json_line(text);
    cr_assert_str_eq(str(line, "msg"), "cannot open the store: 5%");
    cr_assert_str_eq(str(line, "level"), "error");
    json_decref(line);
    free(text);
}

Test(log, levels_below_the_threshold_are_dropped) {
    capture_begin();
    cr_assert(!kf_log_enabled(KF_LOG_DEBUG), "info is the default");
    kf_log(KF_LOG_DEBUG, "t", "dropped");
    kf_log(KF_LOG_INFO, "t", "kept 1");
    kf_log_set_level(KF_LOG_ERROR);
    kf_log(KF_LOG_WARN, "t", "dropped");
    kf_log_kv(KF_LOG_INFO, "t", "dropped", KF_LOG_INT("n", 1));
    kf_log(KF_LOG_ERROR, "t", "kept 2");
    kf_log_set_level(KF_LOG_DEBUG);
    kf_log(KF_LOG_DEBUG, "t", "kept 3");
    char *text = capture_end();
    cr_assert_eq(count_lines(text), 3, "%s", text);
    cr_assert_null(strstr(text, "dropped"));
    cr_assert_not_null(strstr(text, "kept 3"));
    free(text);
}

Test(log, parse_names) {
    kf_log_level_t level;
    kf_log_format_t format;
    cr_assert(kf_log_level_parse("debug", &level) && level == KF_LOG_DEBUG);
    cr_assert(kf_log_level_parse("error", &level) && level == KF_LOG_ERROR);
    cr_assert(!kf_log_level_parse("DEBUG", &level));
    cr_assert(!kf_log_level_parse("", &level));
    cr_assert(kf_log_format_parse("json", &format) && format == KF_LOG_FORMAT_JSON);
    cr_assert(kf_log_format_parse("text", &format) && format == KF_LOG_FORMAT_TEXT);
    cr_assert(!kf_log_format_parse("logfmt", &format));
}

/* Bytes that are not UTF-8 would make the JSON line invalid: they become
 * U+FFFD, and valid multi-byte characters pass through. */
Test(log, invalid_utf8_is_replaced) {
    kf_log_set_format(KF_LOG_FORMAT_JSON);
    capture_begin();
    kf_log_kv(KF_LOG_INFO, "t", "m",
              KF_LOG_STR("key", "\xc3\xa9-\xff-\xc3-\xed\xa0\x80-\xf0\x9f\x98\x80"));
    char *text = capture_end();
    json_t *line = only_json_line(text);
    cr_assert_str_eq(str(line, "key"),
                     "\xc3\xa9-\xef\xbf\xbd-\xef\xbf\xbd-\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd-"
                     "\xf0\x9f\x98\x80");
    json_decref(line);
    free(text);
}

/* A value longer than a line is cut (whole characters, even escaped
 * ones), and the line is still one valid JSON object within the bound;
 * fields after it are left out. */
Test(log, long_values_are_cut_and_the_line_stays_valid) {
    kf_log_set_format(KF_LOG_FORMAT_JSON);
    size_t n = 3 * KF_LOG_LINE_BYTES_MAX;
    char *big = malloc(n + 1);
    cr_assert_not_null(big);
    for (size_t i = 0; i < n; i++) {
        big[i] = i % 3 == 0 ? '"' : 'x'; /* escapes take two bytes each */
    }
    big[n] = '\0';
    capture_begin();
    kf_log_kv(KF_LOG_INFO, "t", "big", KF_LOG_STR("first", "1"), KF_LOG_STR("key", big),
              KF_LOG_STR("after", "gone"));
    kf_log(KF_LOG_INFO, "t", "%s", big); /* a message that is too long */
    char *text = capture_end();
    cr_assert_eq(count_lines(text), 2, "%.200s", text);
    char *second = strchr(text, '\n') + 1;
    cr_assert_leq((size_t)(second - text), KF_LOG_LINE_BYTES_MAX);
    cr_assert_leq(strlen(second), KF_LOG_LINE_BYTES_MAX);
    second[-1] = '\0';
    json_error_t error;
    json_t *line = json_loads(text, JSON_REJECT_DUPLICATES, &error);
    cr_assert_not_null(line, "%s", error.text);
    cr_assert_str_eq(str(line, "first"), "1");
    cr_assert_gt(strlen(str(line, "key")), KF_LOG_LINE_BYTES_MAX / 4);
    cr_assert_eq(strncmp(str(line, "key"), big, strlen(str(line, "key"))), 0, "a prefix");
    cr_assert_null(json_object_get(line, "after"));
    json_decref(line);
    json_t *message = json_loads(second, JSON_REJECT_DUPLICATES, &error);
    cr_assert_not_null(message, "%s", error.text);
    cr_assert_eq(strncmp(str(message, "msg"), big, 100), 0);
    json_decref(message);
    /* The text format cuts the same way. */
    kf_log_set_format(KF_LOG_FORMAT_TEXT);
    capture_begin();
    kf_log_kv(KF_LOG_INFO, "t", "big", KF_LOG_STR("key", big), KF_LOG_STR("after", "gone"));
    char *plain = capture_end();
    cr_assert_eq(count_lines(plain), 1);
    cr_assert_leq(strlen(plain), KF_LOG_LINE_BYTES_MAX);
    cr_assert_null(strstr(plain, "after"));
    cr_assert_eq(plain[strlen(plain) - 2], '"', "the cut value is closed");
    free(plain);
    free(text);
    free(big);
}

Test(log, request_line_names_method_outcome_duration_and_identifiers) {
    kf_log_set_format(KF_LOG_FORMAT_JSON);
    Keyflow__V1__SendEventRequest send = KEYFLOW__V1__SEND_EVENT_REQUEST__INIT;
    send.workflow = "ship";
    send.key = "order-7";
    Keyflow__V1__CoordinatorRef ref = KEYFLOW__V1__COORDINATOR_REF__INIT;
    ref.workflow = "notify";
    ref.key = "user-1";
    Keyflow__V1__FlushWindowRequest flush = KEYFLOW__V1__FLUSH_WINDOW_REQUEST__INIT;
    flush.coordinator = &ref;
    Keyflow__V1__GetRunRequest get = KEYFLOW__V1__GET_RUN_REQUEST__INIT;
    get.run_id = "order-7@u";

    capture_begin();
    kf_log_request("grpc", "SendEvent", 0, 0, 1234, &send.base);
    char *text = capture_end();
    cr_assert_str_eq(text, "", "nothing below debug");
    free(text);

    kf_log_set_level(KF_LOG_DEBUG);
    capture_begin();
    kf_log_request("grpc", "SendEvent", 0, 0, 1234, &send.base);
    char *a = capture_end();
    capture_begin();
    kf_log_request("http", "FlushWindow", 5, 404, 9, &flush.base);
    char *b = capture_end();
    capture_begin();
    kf_log_request("http", "GetRun", 3, 400, 1, &get.base);
    char *c = capture_end();
    capture_begin();
    kf_log_request("grpc", "PollRuns", 1, 0, 2, NULL);
    char *d = capture_end();

    json_t *line = only_json_line(a);
    cr_assert_str_eq(str(line, "level"), "debug");
    cr_assert_str_eq(str(line, "msg"), "request");
    cr_assert_str_eq(str(line, "method"), "SendEvent");
    cr_assert_str_eq(str(line, "transport"), "grpc");
    cr_assert_str_eq(str(line, "status"), "OK");
    cr_assert_eq(json_integer_value(json_object_get(line, "duration_us")), 1234);
    cr_assert_str_eq(str(line, "workflow"), "ship");
    cr_assert_str_eq(str(line, "key"), "order-7");
    cr_assert_null(json_object_get(line, "http_status"));
    json_decref(line);

    line = only_json_line(b);
    cr_assert_str_eq(str(line, "status"), "NOT_FOUND");
    cr_assert_eq(json_integer_value(json_object_get(line, "http_status")), 404);
    cr_assert_str_eq(str(line, "workflow"), "notify", "inside the coordinator reference");
    cr_assert_str_eq(str(line, "key"), "user-1");
    json_decref(line);

    line = only_json_line(c);
    cr_assert_str_eq(str(line, "run_id"), "order-7@u");
    cr_assert_null(json_object_get(line, "workflow"), "empty identifiers are left out");
    json_decref(line);

    line = only_json_line(d);
    cr_assert_str_eq(str(line, "status"), "CANCELLED");
    json_decref(line);
    free(a);
    free(b);
    free(c);
    free(d);
}
