/*
 * json.h - JSON text that clients store (event inputs, run results): one
 * check and one compact writer, so gRPC and the HTTP gateway accept the same
 * documents and show the same text (jansson underneath).
 */
#ifndef KF_BASE_JSON_H
#define KF_BASE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/status.h"

/* Flags for json_loadb on client JSON: any value at the top, "\u0000" in
 * strings allowed (it is valid JSON), duplicate object keys refused (what
 * the second one would mean differs between readers; RFC 8259 4). */
#define KF_JSON_LOAD_FLAGS (JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES)

/* Checks JSON text a client stores: at most max_bytes (KF_E_TOO_LARGE),
 * parsable with KF_JSON_LOAD_FLAGS and nested at most KF_JSON_DEPTH_MAX
 * containers deep (KF_E_INVALID). Empty text is fine (the caller's default).
 * Messages name `field`. */
kf_status_t kf_json_check(const char *field, const char *text, size_t len, size_t max_bytes,
                          kf_error_t *err) KF_MUST_USE;

/* True when v nests containers more than `levels` deep (a scalar: 0, [] or
 * {}: 1). */
bool kf_json_deeper_than(const json_t *v, int levels);

/* json_dumps(v, flags) with every real written in the fewest significant
 * digits that read back as the same double: 0.1 stays "0.1" (jansson's
 * default of 17 digits would write 0.10000000000000001). NULL when out of
 * memory; the caller frees the text with free(). */
char *kf_json_dumps(const json_t *v, size_t flags);

/* ---- proto3 JSON scalars -------------------------------------------------
 * The JSON forms of 64-bit integers (a decimal string), doubles (a number,
 * or "NaN", "Infinity", "-Infinity") and bytes (base64), shared by the
 * gateway's mapping (proto/json_map.c) and the column types
 * (proto/columns.c) so that both read and write a value the same way. */

typedef enum kf_json_number {
    KF_JSON_NUMBER_OK,
    KF_JSON_NUMBER_MALFORMED,
    KF_JSON_NUMBER_OUT_OF_RANGE, /* well formed, past what 64 bits hold */
} kf_json_number_t;

/* "-?[0-9]+" as sign and magnitude (len bytes at s). Stricter than strtoll,
 * which would also take leading blanks, '+', and wrap "-5" for unsigned
 * types. */
kf_json_number_t kf_json_integer_text(const char *s, size_t len, bool *negative,
                                      uint64_t *magnitude);
/* A decimal number or one of proto3 JSON's names for the non-finite values;
 * s is NUL-terminated at len. Hex, "inf" and blanks are malformed. */
kf_json_number_t kf_json_double_text(const char *s, size_t len, double *out);
/* A JSON integer, or a decimal string (kf_json_integer_text), within int64. */
bool kf_json_int64_value(const json_t *v, int64_t *out);
/* A JSON number, or a string kf_json_double_text reads. */
bool kf_json_double_value(const json_t *v, double *out);

/* Writers; each returns NULL when jansson is out of memory. */
json_t *kf_json_int64(int64_t value); /* a decimal string */
json_t *kf_json_double(double value); /* a number, or the names of NaN and the infinities */
json_t *kf_json_bytes(const uint8_t *data, size_t len); /* base64, padded */

#endif
