/*
 * json.h - JSON text that clients store (event inputs, run results): one
 * check and one compact writer, so gRPC and the HTTP gateway accept the same
 * documents and show the same text (jansson underneath).
 */
#ifndef KF_BASE_JSON_H
#define KF_BASE_JSON_H

#include <stdbool.h>
#include <stddef.h>

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

#endif
