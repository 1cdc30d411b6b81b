/*
 * status_test.c - the status table (service/base/status.h).
 *
 * Every status must have a name, a text, a gRPC code and an HTTP status, and
 * the boundaries translate through this one table, so the specific rows the
 * front ends rely on are pinned here. kf_error_set must format into its fixed
 * buffer safely: truncated, always NUL-terminated, never past the buffer.
 */
#include <ctype.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <string.h>

#include <criterion/criterion.h>

#include "base/status.h"

Test(status, every_status_has_a_name_text_and_codes) {
    for (int i = 0; i < KF_STATUS_COUNT_; i++) {
        kf_status_t st = (kf_status_t)i;
        const char *name = kf_status_name(st);
        const char *text = kf_status_text(st);
        const char *grpc_name = kf_status_grpc_name(st);
        cr_assert_not_null(name, "status %d has no name", i);
        cr_assert_not_null(text, "status %d has no text", i);
        cr_assert_not_null(grpc_name, "status %d has no gRPC name", i);
        cr_assert_eq(strncmp(name, "KF_", 3), 0, "status %d name %s", i, name);
        cr_assert_gt(strlen(text), 0, "status %s has an empty text", name);
        int grpc = kf_status_grpc_code(st);
        int http = kf_status_http(st);
        cr_assert(grpc >= 0 && grpc <= 16, "%s: gRPC code %d out of range", name, grpc);
        cr_assert(http >= 100 && http <= 599, "%s: HTTP status %d out of range", name, http);
        for (const char *p = grpc_name; *p != '\0'; p++) {
            cr_assert(isupper((unsigned char)*p) || *p == '_', "%s: gRPC name %s", name, grpc_name);
        }
    }
}

Test(status, names_and_texts_are_unique) {
    for (int i = 0; i < KF_STATUS_COUNT_; i++) {
        for (int j = i + 1; j < KF_STATUS_COUNT_; j++) {
            cr_assert_str_neq(kf_status_name((kf_status_t)i), kf_status_name((kf_status_t)j));
            cr_assert_str_neq(kf_status_text((kf_status_t)i), kf_status_text((kf_status_t)j));
        }
    }
}

Test(status, names_match_the_enum) {
    cr_assert_str_eq(kf_status_name(KF_OK), "KF_OK");
    cr_assert_str_eq(kf_status_name(KF_AGAIN), "KF_AGAIN");
    cr_assert_str_eq(kf_status_name(KF_E_INVALID), "KF_E_INVALID");
    cr_assert_str_eq(kf_status_name(KF_E_TOO_LARGE), "KF_E_TOO_LARGE");
    cr_assert_str_eq(kf_status_name(KF_E_IO), "KF_E_IO");
    cr_assert_str_eq(kf_status_name(KF_E_CORRUPT), "KF_E_CORRUPT");
    cr_assert_str_eq(kf_status_name(KF_E_NOMEM), "KF_E_NOMEM");
    cr_assert_str_eq(kf_status_text(KF_E_INVALID), "invalid argument");
    cr_assert_str_eq(kf_status_text(KF_E_NOT_FOUND), "not found");
}

/* Only the two non-errors map to gRPC OK and HTTP 2xx. */
Test(status, only_ok_and_again_are_successes) {
    for (int i = 0; i < KF_STATUS_COUNT_; i++) {
        kf_status_t st = (kf_status_t)i;
        bool success = st == KF_OK || st == KF_AGAIN;
        if (success) {
            cr_assert_eq(kf_status_grpc_code(st), 0, "%s", kf_status_name(st));
            cr_assert_eq(kf_status_http(st), 200, "%s", kf_status_name(st));
            cr_assert_str_eq(kf_status_grpc_name(st), "OK");
        } else {
            cr_assert_neq(kf_status_grpc_code(st), 0, "%s maps to gRPC OK", kf_status_name(st));
            cr_assert_geq(kf_status_http(st), 400, "%s maps to HTTP %d", kf_status_name(st),
                          kf_status_http(st));
        }
    }
}

typedef struct row {
    kf_status_t status;
    int grpc;
    int http;
    const char *grpc_name;
} row_t;

Test(status, boundary_translations) {
    static const row_t rows[] = {
        {KF_E_CANCELLED, 1, 499, "CANCELLED"},
        {KF_E_INVALID, 3, 400, "INVALID_ARGUMENT"},
        {KF_E_TIMEOUT, 4, 504, "DEADLINE_EXCEEDED"},
        {KF_E_NOT_FOUND, 5, 404, "NOT_FOUND"},
        {KF_E_EXISTS, 6, 409, "ALREADY_EXISTS"},
        {KF_E_PERMISSION, 7, 403, "PERMISSION_DENIED"},
        {KF_E_LIMIT, 8, 429, "RESOURCE_EXHAUSTED"},
        {KF_E_TOO_LARGE, 8, 413, "RESOURCE_EXHAUSTED"},
        {KF_E_NO_SPACE, 8, 507, "RESOURCE_EXHAUSTED"},
        {KF_E_PRECONDITION, 9, 409, "FAILED_PRECONDITION"},
        {KF_E_ABORTED, 10, 409, "ABORTED"},
        {KF_E_RANGE, 11, 400, "OUT_OF_RANGE"},
        {KF_E_UNIMPLEMENTED, 12, 501, "UNIMPLEMENTED"},
        {KF_E_INTERNAL, 13, 500, "INTERNAL"},
        {KF_E_UNAVAILABLE, 14, 503, "UNAVAILABLE"},
        {KF_E_IO, 13, 500, "INTERNAL"},
        {KF_E_CORRUPT, 15, 500, "DATA_LOSS"},
        {KF_E_NOMEM, 8, 503, "RESOURCE_EXHAUSTED"},
        {KF_E_UNAUTHENTICATED, 16, 401, "UNAUTHENTICATED"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const row_t *r = &rows[i];
        const char *name = kf_status_name(r->status);
        cr_assert_eq(kf_status_grpc_code(r->status), r->grpc, "%s", name);
        cr_assert_eq(kf_status_http(r->status), r->http, "%s", name);
        cr_assert_str_eq(kf_status_grpc_name(r->status), r->grpc_name, "%s", name);
    }
}

Test(status, out_of_range_status_asserts, .signal = SIGABRT) {
    (void)kf_status_name((kf_status_t)KF_STATUS_COUNT_);
}

Test(error, set_formats_and_returns_the_status) {
    kf_error_t err;
    kf_error_clear(&err);
    cr_assert_eq(err.status, KF_OK);
    cr_assert_str_eq(err.message, "");
    kf_status_t st =
        kf_error_set(&err, KF_E_INVALID, "%s: must be in 1..%d, got %d", "rule.max", 10000, 0);
    cr_assert_eq(st, KF_E_INVALID);
    cr_assert_eq(err.status, KF_E_INVALID);
    cr_assert_str_eq(err.message, "rule.max: must be in 1..10000, got 0");
    kf_error_clear(&err);
    cr_assert_eq(err.status, KF_OK);
    cr_assert_str_eq(err.message, "");
}

Test(error, set_overwrites_an_earlier_error) {
    kf_error_t err;
    kf_error_clear(&err);
    (void)kf_error_set(&err, KF_E_IO, "a long first message about a disk");
    (void)kf_error_set(&err, KF_E_NOT_FOUND, "short");
    cr_assert_eq(err.status, KF_E_NOT_FOUND);
    cr_assert_str_eq(err.message, "short");
}

Test(error, set_with_null_error_only_returns) {
    cr_assert_eq(kf_error_set(NULL, KF_E_LIMIT, "queue full at %d", 8192), KF_E_LIMIT);
}

Test(error, arguments_are_not_reinterpreted_as_formats) {
    kf_error_t err;
    (void)kf_error_set(&err, KF_E_INVALID, "%s", "100%s %n %d");
    cr_assert_str_eq(err.message, "100%s %n %d");
}

/* A message longer than the buffer is cut, NUL-terminated, and nothing past
 * the buffer is written (the canary around it stays intact). */
Test(error, long_messages_truncate_safely) {
    struct {
        kf_error_t err;
        unsigned char canary[64];
    } box;
    memset(&box, 0xa5, sizeof box);
    char big[3 * KF_ERROR_MESSAGE_BYTES_MAX];
    for (size_t i = 0; i < sizeof big - 1; i++) {
        big[i] = (char)('a' + (char)(i % 26));
    }
    big[sizeof big - 1] = '\0';
    kf_status_t st = kf_error_set(&box.err, KF_E_TOO_LARGE, "field: %s", big);
    cr_assert_eq(st, KF_E_TOO_LARGE);
    cr_assert_eq(box.err.status, KF_E_TOO_LARGE);
    size_t len = strnlen(box.err.message, sizeof box.err.message);
    cr_assert_eq(len, KF_ERROR_MESSAGE_BYTES_MAX - 1, "length %zu", len);
    cr_assert_eq(strncmp(box.err.message, "field: ", 7), 0);
    cr_assert_eq(memcmp(box.err.message + 7, big, len - 7), 0);
    for (size_t i = 0; i < sizeof box.canary; i++) {
        cr_assert_eq(box.canary[i], 0xa5, "canary byte %zu overwritten", i);
    }
}

Test(error, message_of_exactly_the_buffer_size_minus_one_fits) {
    kf_error_t err;
    char text[KF_ERROR_MESSAGE_BYTES_MAX];
    memset(text, 'x', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    (void)kf_error_set(&err, KF_E_INVALID, "%s", text);
    cr_assert_str_eq(err.message, text);
}

static kf_status_t set_via_list(kf_error_t *err, kf_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static kf_status_t set_via_list(kf_error_t *err, kf_status_t st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kf_status_t out = kf_error_setv(err, st, fmt, ap);
    va_end(ap);
    return out;
}

Test(error, setv_matches_set) {
    kf_error_t a;
    kf_error_t b;
    (void)kf_error_set(&a, KF_E_RANGE, "%s=%lld (%u)", "due_ms", -5LL, 7u);
    cr_assert_eq(set_via_list(&b, KF_E_RANGE, "%s=%lld (%u)", "due_ms", -5LL, 7u), KF_E_RANGE);
    cr_assert_eq(a.status, b.status);
    cr_assert_str_eq(a.message, b.message);
    cr_assert_str_eq(b.message, "due_ms=-5 (7)");
}
