/*
 * log.h - one log sink on stderr, one line per record, in one of two formats:
 *
 *   text: 2026-11-29T10:00:00.123Z info engine: run started workflow=ship key=order-7
 *   json: {"ts":"2026-11-29T10:00:00.123Z","level":"info","module":"engine",
 *          "msg":"run started","workflow":"ship","key":"order-7"}      (one line)
 *
 * A record is a message plus typed fields (kf_log_kv); free-form records
 * (kf_log, printf-style) have a message only. In JSON every field is a
 * top-level member next to ts, level, module and msg; in text a value with
 * spaces, quotes or '=' is quoted. Lines are bounded (KF_LOG_LINE_BYTES_MAX):
 * a value that does not fit is cut, and the line stays well-formed.
 *
 * Thread-safe (one write(2) per line). An error is logged once, where it is
 * translated into a status; callers above it do not log it again.
 */
#ifndef KF_BASE_LOG_H
#define KF_BASE_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

typedef enum kf_log_level {
    KF_LOG_DEBUG,
    KF_LOG_INFO,
    KF_LOG_WARN,
    KF_LOG_ERROR,
} kf_log_level_t;

typedef enum kf_log_format {
    KF_LOG_FORMAT_TEXT,
    KF_LOG_FORMAT_JSON,
} kf_log_format_t;

/* Lines below `level` are dropped. Call before starting threads. */
void kf_log_set_level(kf_log_level_t level);
void kf_log_set_format(kf_log_format_t format);
/* Whether a record at `level` would be written: callers skip building
 * fields that nobody reads (the per-request debug line). */
bool kf_log_enabled(kf_log_level_t level);

/* "debug" -> KF_LOG_DEBUG, ...; false for any other word. */
bool kf_log_level_parse(const char *text, kf_log_level_t *out);
/* "text" / "json". */
bool kf_log_format_parse(const char *text, kf_log_format_t *out);

void kf_log(kf_log_level_t level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* One field of a structured record. `key` is a static name in snake_case;
 * `text` is borrowed for the call (NULL: the field is `number`). */
typedef struct kf_log_field {
    const char *key;
    const char *text;
    int64_t number;
} kf_log_field_t;

#define KF_LOG_STR(k, v) ((kf_log_field_t){.key = (k), .text = (v) != NULL ? (v) : ""})
#define KF_LOG_INT(k, v) ((kf_log_field_t){.key = (k), .text = NULL, .number = (int64_t)(v)})

void kf_log_fields(kf_log_level_t level, const char *module, const char *msg,
                   const kf_log_field_t *fields, size_t count);

/* kf_log_kv(KF_LOG_INFO, "runs", "lease expired", KF_LOG_STR("run_id", id), ...) */
#define kf_log_kv(level, module, msg, ...)                                                         \
    kf_log_fields((level), (module), (msg), (const kf_log_field_t[]){__VA_ARGS__},                 \
                  sizeof((const kf_log_field_t[]){__VA_ARGS__}) / sizeof(kf_log_field_t))

/*
 * The debug line of one finished request (either front end): the method,
 * the transport ("grpc", "http"), the outcome as a gRPC code name (and the
 * HTTP status when http_status > 0), the duration, and the identifiers of
 * the request when it has them (workflow, key, run_id, function_id, at the
 * top level or in a `coordinator` reference). `request` may be NULL (it was
 * not readable). Writes nothing unless debug is enabled. Any thread.
 */
void kf_log_request(const char *transport, const char *method, int grpc_code, int http_status,
                    int64_t duration_us, const ProtobufCMessage *request);

#endif
