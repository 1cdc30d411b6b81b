/*
 * log.c - the stderr log sink (see log.h for the two line formats).
 *
 * A line is built in a fixed buffer on the caller's stack and written with
 * one write(2), so lines of concurrent threads never interleave. The buffer
 * keeps room for the line's end ("}\n" in JSON) at all times: a value that
 * does not fit is cut at a character boundary and the line still closes.
 */
#include "base/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/limits.h"
#include "base/status.h"

static atomic_int log_level = KF_LOG_INFO;
static atomic_int log_format = KF_LOG_FORMAT_TEXT;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void kf_log_set_level(kf_log_level_t level) {
    atomic_store(&log_level, (int)level);
}

void kf_log_set_format(kf_log_format_t format) {
    atomic_store(&log_format, (int)format);
}

bool kf_log_enabled(kf_log_level_t level) {
    return (int)level >= atomic_load_explicit(&log_level, memory_order_relaxed);
}

bool kf_log_level_parse(const char *text, kf_log_level_t *out) {
    for (int i = 0; i < (int)(sizeof level_names / sizeof level_names[0]); i++) {
        if (strcmp(text, level_names[i]) == 0) {
            *out = (kf_log_level_t)i;
            return true;
        }
    }
    return false;
}

bool kf_log_format_parse(const char *text, kf_log_format_t *out) {
    if (strcmp(text, "text") == 0) {
        *out = KF_LOG_FORMAT_TEXT;
    } else if (strcmp(text, "json") == 0) {
        *out = KF_LOG_FORMAT_JSON;
    } else {
        return false;
    }
    return true;
}

/* ---- the line buffer --------------------------------------------------- */

/* Bytes kept free for the end of the line: "}\n" in JSON, "\n" in text,
 * plus the closing quote of a value that was cut. */
#define LINE_RESERVE_BYTES 4

typedef struct line {
    char bytes[KF_LOG_LINE_BYTES_MAX];
    size_t len;
    bool json;
    bool full; /* a value was cut: nothing more goes in but the line's end */
} line_t;

/* Appends n bytes if they fit whole; false (nothing appended) otherwise. */
static bool line_put(line_t *l, const char *s, size_t n) {
    if (l->full || n > sizeof l->bytes - LINE_RESERVE_BYTES - l->len) {
        return false;
    }
    memcpy(l->bytes + l->len, s, n);
    l->len += n;
    return true;
}

static bool line_puts(line_t *l, const char *s) {
    return line_put(l, s, strlen(s));
}

/* The length of the valid UTF-8 sequence at s (1..4), or 0 when the bytes
 * there are not one (the caller writes U+FFFD and skips one byte). */
static size_t utf8_sequence(const unsigned char *s, size_t left) {
    if (s[0] < 0x80) {
        return 1;
    }
    size_t n = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
    if (n == 0 || (s[0] & 0xf8) == 0xf8 || n > left) {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            return 0;
        }
    }
    /* Overlong 3- and 4-byte forms, surrogates and code points past U+10FFFF. */
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0) ||
        (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90)) {
        return 0;
    }
    return n;
}

/* Appends `s` as the body of a JSON string (JSON) or as text that needs no
 * quoting (text: control bytes escaped; quoted = whether quotes and
 * backslashes need escaping too). Invalid UTF-8 becomes U+FFFD so that a
 * JSON line is always valid. Stops, whole characters only, when full;
 * returns false then. */
static bool line_escape(line_t *l, const char *text, bool quoted) {
    const unsigned char *s = (const unsigned char *)text;
    size_t left = strlen(text);
    while (left > 0) {
        char esc[8];
        size_t n = utf8_sequence(s, left);
        const char *out = (const char *)s;
        size_t out_len = n;
        if (n == 0) {
            out = "\xef\xbf\xbd"; /* U+FFFD */
            out_len = 3;
            n = 1;
        } else if (n == 1 && (s[0] < 0x20 || s[0] == 0x7f)) {
            out = esc;
            out_len = s[0] == '\n'   ? (size_t)snprintf(esc, sizeof esc, "\\n")
                      : s[0] == '\t' ? (size_t)snprintf(esc, sizeof esc, "\\t")
                      : s[0] == '\r' ? (size_t)snprintf(esc, sizeof esc, "\\r")
                                     : (size_t)snprintf(esc, sizeof esc, "\\u%04x", s[0]);
        } else if (n == 1 && quoted && (s[0] == '"' || s[0] == '\\')) {
            esc[0] = '\\';
            esc[1] = (char)s[0];
            out = esc;
            out_len = 2;
        }
        if (!line_put(l, out, out_len)) {
            return false;
        }
        s += n;
        left -= n;
    }
    return true;
}

/* Text values are quoted when they would otherwise not read back as one
 * value: empty, or holding a space, a quote, '=' or a control byte. */
static bool text_needs_quotes(const char *s) {
    if (s[0] == '\0') {
        return true;
    }
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c <= ' ' || c == '"' || c == '=' || c == 0x7f) {
            return true;
        }
    }
    return false;
}

static void line_begin(line_t *l, kf_log_level_t level, const char *module) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char stamp[64];
    snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    l->len = 0;
    l->full = false;
    l->json = atomic_load_explicit(&log_format, memory_order_relaxed) == KF_LOG_FORMAT_JSON;
    KF_ASSERT((unsigned)level < sizeof level_names / sizeof level_names[0]);
    if (l->json) {
        line_puts(l, "{\"ts\":\"");
        line_puts(l, stamp);
        line_puts(l, "\",\"level\":\"");
        line_puts(l, level_names[level]);
        line_puts(l, "\",\"module\":\"");
        line_escape(l, module, true);
        line_puts(l, "\",\"msg\":\"");
    } else {
        line_puts(l, stamp);
        line_puts(l, " ");
        line_puts(l, level_names[level]);
        line_puts(l, " ");
        line_escape(l, module, false);
        line_puts(l, ": ");
    }
}

/* Ends the message begun by line_begin (`msg` may be cut). */
static void line_message(line_t *l, const char *msg) {
    if (!line_escape(l, msg, l->json)) {
        l->full = true;
    }
    if (l->json) {
        l->bytes[l->len++] = '"'; /* the string was opened by line_begin */
    }
}

/* Appends a quoted string value; when it does not fit, the part that does
 * is closed with a quote from the reserve and the line is full. */
static void line_quoted(line_t *l, const char *value) {
    if (!line_puts(l, "\"")) {
        return;
    }
    if (!line_escape(l, value, true)) {
        l->full = true;
    }
    l->bytes[l->len++] = '"'; /* fits: checked above, or taken from the reserve */
}

static void line_field(line_t *l, const kf_log_field_t *f) {
    /* The names that every line has cannot be fields (they would repeat a
     * JSON member). */
    KF_ASSERT(strcmp(f->key, "ts") != 0 && strcmp(f->key, "level") != 0 &&
              strcmp(f->key, "msg") != 0 && strcmp(f->key, "module") != 0);
    char number[24];
    if (f->text == NULL) {
        snprintf(number, sizeof number, "%lld", (long long)f->number);
    }
    size_t mark = l->len;
    bool ok = l->json ? line_puts(l, ",\"") && line_escape(l, f->key, true) && line_puts(l, "\":")
                      : line_puts(l, " ") && line_escape(l, f->key, false) && line_puts(l, "=");
    if (ok && f->text == NULL) {
        ok = line_puts(l, number);
    } else if (ok && (l->json || text_needs_quotes(f->text))) {
        size_t before = l->len;
        line_quoted(l, f->text);
        ok = l->len > before;
    } else if (ok) {
        ok = line_escape(l, f->text, false);
        l->full = !ok;
        ok = ok || l->len > mark;
    }
    if (!ok) {
        l->len = mark; /* not even the start of its value fit: leave it out */
        l->full = true;
    }
}

static void line_write(line_t *l) {
    if (l->json) {
        l->bytes[l->len++] = '}';
    }
    l->bytes[l->len++] = '\n';
    KF_ASSERT(l->len <= sizeof l->bytes);
    ssize_t ignored = write(STDERR_FILENO, l->bytes, l->len);
    (void)ignored;
}

/* ---- records ----------------------------------------------------------- */

void kf_log(kf_log_level_t level, const char *module, const char *fmt, ...) {
    if (!kf_log_enabled(level)) {
        return;
    }
    char msg[KF_LOG_LINE_BYTES_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0) {
        return;
    }
    line_t l;
    line_begin(&l, level, module);
    line_message(&l, msg);
    line_write(&l);
}

void kf_log_fields(kf_log_level_t level, const char *module, const char *msg,
                   const kf_log_field_t *fields, size_t count) {
    if (!kf_log_enabled(level)) {
        return;
    }
    line_t l;
    line_begin(&l, level, module);
    line_message(&l, msg);
    for (size_t i = 0; i < count; i++) {
        line_field(&l, &fields[i]);
    }
    line_write(&l);
}

/* ---- the per-request line ---------------------------------------------- */

/* The request's identifiers, in this order, at the top level or inside a
 * `coordinator` reference (DescribeCoordinator, FlushWindow, ...). */
static const char *const request_id_fields[] = {"workflow", "key", "run_id", "function_id"};
#define REQUEST_FIELDS_MAX 12

static const char *string_field(const ProtobufCMessage *m, const char *name) {
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(m->descriptor, name);
    if (f == NULL || f->type != PROTOBUF_C_TYPE_STRING || f->label == PROTOBUF_C_LABEL_REPEATED) {
        return NULL;
    }
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
        uint32_t which = *(const uint32_t *)((const char *)m + f->quantifier_offset);
        if (which != f->id) {
            return NULL;
        }
    }
    const char *v = *(char *const *)((const char *)m + f->offset);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

static size_t request_fields(const ProtobufCMessage *m, kf_log_field_t *out, size_t n) {
    const ProtobufCMessage *scopes[2] = {NULL, m};
    const ProtobufCFieldDescriptor *ref =
        protobuf_c_message_descriptor_get_field_by_name(m->descriptor, "coordinator");
    if (ref != NULL && ref->type == PROTOBUF_C_TYPE_MESSAGE &&
        ref->label != PROTOBUF_C_LABEL_REPEATED) {
        scopes[0] = *(ProtobufCMessage *const *)((const char *)m + ref->offset);
    }
    for (size_t s = 0; s < 2; s++) {
        for (size_t i = 0;
             scopes[s] != NULL && i < sizeof request_id_fields / sizeof request_id_fields[0] &&
             n < REQUEST_FIELDS_MAX;
             i++) {
            const char *v = string_field(scopes[s], request_id_fields[i]);
            if (v != NULL) {
                out[n++] = KF_LOG_STR(request_id_fields[i], v);
            }
        }
    }
    return n;
}

void kf_log_request(const char *transport, const char *method, int grpc_code, int http_status,
                    int64_t duration_us, const ProtobufCMessage *request) {
    if (!kf_log_enabled(KF_LOG_DEBUG)) {
        return;
    }
    kf_log_field_t fields[REQUEST_FIELDS_MAX];
    size_t n = 0;
    const char *code_name = kf_grpc_code_name(grpc_code);
    fields[n++] = KF_LOG_STR("method", method);
    fields[n++] = KF_LOG_STR("transport", transport);
    fields[n++] = KF_LOG_STR("status", code_name != NULL ? code_name : "UNKNOWN");
    if (http_status > 0) {
        fields[n++] = KF_LOG_INT("http_status", http_status);
    }
    fields[n++] = KF_LOG_INT("duration_us", duration_us);
    if (request != NULL) {
        n = request_fields(request, fields, n);
    }
    kf_log_fields(KF_LOG_DEBUG, transport, "request", fields, n);
}
