/*
 * status.h - the one status vocabulary of keyflow.
 *
 * Every fallible function returns a kf_status_t and writes its results
 * through out-parameters. Names, gRPC codes and HTTP statuses all come from
 * the single table KF_STATUS_TABLE, so a status is translated exactly once
 * at each boundary (see service/rpc and service/http).
 *
 * KF_OK and KF_AGAIN are not errors: KF_AGAIN means "not now, the caller was
 * parked and will be answered later" (a long poll with nothing to hand out).
 */
#ifndef KF_BASE_STATUS_H
#define KF_BASE_STATUS_H

#include <stdarg.h>
#include <stddef.h>

#include "base/limits.h"

/* X(name, grpc_code, http_status, text) */
#define KF_STATUS_TABLE(X)                                                                         \
    X(KF_OK, 0, 200, "ok")                                                                         \
    X(KF_AGAIN, 0, 200, "again")                                                                   \
    X(KF_E_CANCELLED, 1, 499, "cancelled")                                                         \
    X(KF_E_INVALID, 3, 400, "invalid argument")                                                    \
    X(KF_E_TIMEOUT, 4, 504, "deadline exceeded")                                                   \
    X(KF_E_NOT_FOUND, 5, 404, "not found")                                                         \
    X(KF_E_EXISTS, 6, 409, "already exists")                                                       \
    X(KF_E_PERMISSION, 7, 403, "permission denied")                                                \
    X(KF_E_LIMIT, 8, 429, "resource exhausted")                                                    \
    X(KF_E_TOO_LARGE, 8, 413, "too large")                                                         \
    X(KF_E_NO_SPACE, 8, 507, "insufficient storage")                                               \
    X(KF_E_PRECONDITION, 9, 409, "failed precondition")                                            \
    /* The key's partition is served by another process (docs/scaling.md):                         \
     * HTTP 421 Misdirected Request, as for a server that cannot answer for                        \
     * that authority. */                                                                          \
    X(KF_E_NOT_OWNER, 9, 421, "partition served elsewhere")                                        \
    X(KF_E_ABORTED, 10, 409, "aborted")                                                            \
    X(KF_E_RANGE, 11, 400, "out of range")                                                         \
    X(KF_E_UNIMPLEMENTED, 12, 501, "unimplemented")                                                \
    X(KF_E_INTERNAL, 13, 500, "internal error")                                                    \
    X(KF_E_UNAVAILABLE, 14, 503, "unavailable")                                                    \
    X(KF_E_IO, 13, 500, "i/o error")                                                               \
    X(KF_E_CORRUPT, 15, 500, "data corrupt")                                                       \
    X(KF_E_NOMEM, 8, 503, "out of memory")                                                         \
    X(KF_E_UNAUTHENTICATED, 16, 401, "unauthenticated")

typedef enum kf_status {
#define KF_STATUS_ENUM_(name, grpc, http, text) name,
    KF_STATUS_TABLE(KF_STATUS_ENUM_)
#undef KF_STATUS_ENUM_
        KF_STATUS_COUNT_
} kf_status_t;

/* The enum name, e.g. "KF_E_INVALID". Never NULL. */
const char *kf_status_name(kf_status_t status);
/* A short human text, e.g. "invalid argument". Never NULL. */
const char *kf_status_text(kf_status_t status);
/* The gRPC status code (grpc_status_code numbering). */
int kf_status_grpc_code(kf_status_t status);
/* The HTTP status the gateway answers with. */
int kf_status_http(kf_status_t status);
/* The canonical gRPC code name ("INVALID_ARGUMENT"), used in JSON errors. */
const char *kf_status_grpc_name(kf_status_t status);
/* The name of a gRPC status code 0..16 (grpc_status_code numbering); NULL
 * for any other number. The one table of these names (metrics, bench). */
const char *kf_grpc_code_name(int code);

/*
 * An error with a message that names the offending field and the limit,
 * e.g. "event.rule.max_events: must be in 1..10000, got 0". Caller-owned;
 * kf_error_set overwrites it and returns the status it was given so that
 * a function can `return kf_error_set(err, KF_E_INVALID, "...")`.
 */
typedef struct kf_error {
    kf_status_t status;
    char message[KF_ERROR_MESSAGE_BYTES_MAX];
} kf_error_t;

void kf_error_clear(kf_error_t *err);
kf_status_t kf_error_set(kf_error_t *err, kf_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
kf_status_t kf_error_setv(kf_error_t *err, kf_status_t status, const char *fmt, va_list ap);

#define KF_MUST_USE __attribute__((warn_unused_result))

#endif
