/* status.c - names and translations of kf_status_t, all from one table. */
#include "base/status.h"

#include <stdio.h>

#include "base/assert.h"

static const struct {
    const char *name;
    const char *text;
    int grpc;
    int http;
} status_rows[] = {
#define KF_STATUS_ROW_(name, grpc, http, text) {#name, text, grpc, http},
    KF_STATUS_TABLE(KF_STATUS_ROW_)
#undef KF_STATUS_ROW_
};

_Static_assert(sizeof status_rows / sizeof status_rows[0] == KF_STATUS_COUNT_,
               "one row per status");

static const char *const grpc_names[] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

static unsigned status_index(kf_status_t status) {
    unsigned i = (unsigned)status;
    KF_ASSERT(i < KF_STATUS_COUNT_);
    return i;
}

const char *kf_status_name(kf_status_t status) {
    return status_rows[status_index(status)].name;
}
const char *kf_status_text(kf_status_t status) {
    return status_rows[status_index(status)].text;
}
int kf_status_grpc_code(kf_status_t status) {
    return status_rows[status_index(status)].grpc;
}
int kf_status_http(kf_status_t status) {
    return status_rows[status_index(status)].http;
}

const char *kf_grpc_code_name(int code) {
    return code >= 0 && (size_t)code < sizeof grpc_names / sizeof grpc_names[0] ? grpc_names[code]
                                                                                : NULL;
}

const char *kf_status_grpc_name(kf_status_t status) {
    const char *name = kf_grpc_code_name(kf_status_grpc_code(status));
    KF_ASSERT(name != NULL);
    return name;
}

void kf_error_clear(kf_error_t *err) {
    err->status = KF_OK;
    err->message[0] = '\0';
}

kf_status_t kf_error_setv(kf_error_t *err, kf_status_t status, const char *fmt, va_list ap) {
    if (err != NULL) {
        err->status = status;
        vsnprintf(err->message, sizeof err->message, fmt, ap);
    }
    return status;
}

kf_status_t kf_error_set(kf_error_t *err, kf_status_t status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kf_error_setv(err, status, fmt, ap);
    va_end(ap);
    return status;
}
