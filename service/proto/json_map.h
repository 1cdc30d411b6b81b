/*
 * json_map.h - the generic JSON <-> protobuf mapping of the API, shared by
 * the HTTP gateway, the CLI and the benchmarks, driven by protobuf-c
 * descriptors (no per-message code), following the proto3 JSON conventions:
 *
 *   - JSON names are lowerCamelCase (the descriptor's json_name, else the
 *     field name converted); the original snake_case name is accepted too.
 *   - int64/uint64/sint64/fixed64 are emitted as JSON strings; on input both
 *     strings and numbers are accepted (numbers must be integral and exact).
 *     int32 family: numbers (strings accepted). bool: true/false.
 *     float/double: numbers ("NaN", "Infinity", "-Infinity" strings accepted).
 *   - bytes are standard base64 (padded) when emitted; standard or URL-safe,
 *     padded or not, on input.
 *   - enums are emitted as their value name ("RULE_KIND_BATCH"); on input
 *     exactly the full name, or exactly the short name: the name without the
 *     enum's common prefix in lowercase ("batch", kf_json_enum_short_name),
 *     or, in a body, the value as a JSON integer (proto3 JSON). Nothing else
 *     ("Batch", "BATCH", "2" are refused), so that the OpenAPI document
 *     lists every accepted spelling; a query or path parameter, which is
 *     text, takes the two names only.
 *   - repeated fields are arrays; messages are objects; JSON null for a field
 *     means "absent/default".
 *   - oneof members: a member present in JSON sets the oneof case (so an
 *     explicit 0 is distinguishable from absent). At most one member of a
 *     oneof may appear, otherwise it is an error.
 *   - keyflow convention: a `string` field whose name ends in `_json` holds
 *     JSON text over gRPC; over HTTP it appears under the name without the
 *     suffix (lowerCamelCase: `input_json` -> "input") as an embedded JSON
 *     value of any type. On input the embedded value is re-serialized
 *     compactly into the string (kf_json_dumps: reals in their fewest exact
 *     digits); the string form under the full name
 *     ("inputJson": "<text>") is accepted as well. On output the text is
 *     parsed and embedded (empty text is omitted).
 *   - Output omits fields at their default (proto3 default), except oneof
 *     members whose case is set (they are emitted even when 0) and repeated
 *     fields, which are always emitted, [] when empty (proto3 JSON's
 *     "emit default values" for lists only), so that `jq '.runs[]'` works
 *     on every response. On input an empty array is the same as absent.
 *   - Unknown JSON fields are an error naming the field (so typos are caught).
 *
 * Errors name the JSON path of the offending value, e.g.
 * "event.rule.maxEvents: expected an integer, got \"ten\"" (KF_E_INVALID).
 * Nesting deeper than KF_JSON_DEPTH_MAX is KF_E_INVALID.
 *
 * Clarifications (decided with the implementation, json_map.c):
 *   - protobuf-c 1.4.1 descriptors carry no json_name, so the JSON name is
 *     always derived from the field name the way protoc derives json_name.
 *   - Integral JSON reals are accepted for integers only up to 2^53 in
 *     magnitude (beyond it the number may already be rounded): larger values
 *     must come as strings. jansson cannot hold integers past INT64_MAX, so
 *     uint64 values above it round-trip only as strings.
 *   - Unknown enum numbers are refused on input; on output an enum number
 *     without a name is emitted as a number.
 *   - JSON null under a field's own name is "absent" (it clears the field;
 *     a oneof member clears the oneof only if it is the member set). Under a
 *     `_json` field's embedded name null is a JSON value like any other: it
 *     is stored as the text "null" and sets the oneof case. A `_json` oneof
 *     member whose case is set but whose text is empty is emitted as null.
 *   - The `_json` convention applies to singular string fields only, and
 *     only when no other field of the message answers to the short name.
 *   - Present message fields merge into an existing sub-message; present
 *     repeated fields replace the existing elements; null elements in an
 *     array are an error. One field given under two spellings is an error.
 *   - Depth counts containers: the body object is level 1; an empty array
 *     adds no level (so every output, lists included, reads back). An embedded
 *     `_json` value has a limit of its own (KF_JSON_DEPTH_MAX levels of the
 *     value itself, as kf_json_check applies over gRPC).
 *   - "\u0000" is accepted in JSON strings (it is valid JSON); a string
 *     field refuses it by name, an embedded value keeps it.
 *   - Errors about the document itself use the path "body". A path too long
 *     for the message keeps its end ("...next.many"). Running out of arena is
 *     KF_E_TOO_LARGE, naming the path being decoded; jansson running out of
 *     memory is KF_E_NOMEM.
 *
 * Memory: every message, string, array and bytes buffer is allocated from the
 * arena (never freed individually); the result is valid until the arena is
 * reset. Thread-safe (no shared state).
 */
#ifndef KF_HTTP_JSON_MAP_H
#define KF_HTTP_JSON_MAP_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

#include "base/arena.h"
#include "base/status.h"

/* Parses `json` (a JSON object; an empty body means {}) into a new message
 * of type `desc`. Errors: KF_E_INVALID with the path and the problem; `*out`
 * is written only on success. Duplicate keys in one object are an error. */
kf_status_t kf_json_to_message(const char *json, size_t len, const ProtobufCMessageDescriptor *desc,
                               kf_arena_t *arena, ProtobufCMessage **out,
                               kf_error_t *err) KF_MUST_USE;

/* Merges a parsed JSON object into an existing message (fields present in
 * `obj` overwrite). `path` prefixes error messages ("" at the top). `obj` is
 * borrowed. On failure `msg` may be partly merged and should be discarded. */
kf_status_t kf_json_merge(json_t *obj, ProtobufCMessage *msg, const char *path, kf_arena_t *arena,
                          kf_error_t *err) KF_MUST_USE;

/* Sets one field from text, as a path parameter or query parameter would:
 * `name` is the JSON name or the field name, or a dotted path into nested
 * messages ("coordinator.workflow"); `text` is converted to the field's type
 * (integers, bools, enums by name, strings as-is). Repeated fields get the
 * value appended. Errors: KF_E_INVALID naming the parameter.
 * Bools take true or false; enums their two names (no number); bytes are
 * base64. Intermediate
 * messages are created as needed. A oneof member switches the oneof to
 * itself. The embedded name of a `_json` field ("input") takes JSON text;
 * its full name ("inputJson") takes any text. A message-typed field cannot
 * be set from text. */
kf_status_t kf_message_set_text(ProtobufCMessage *msg, const char *name, const char *text,
                                kf_arena_t *arena, kf_error_t *err) KF_MUST_USE;

/* What kf_message_set_text_as does when the singular field `name` already
 * holds a value (is present as the encoder sees it). Repeated fields always
 * take one more element. */
typedef enum kf_set_mode {
    KF_SET_REPLACE, /* the new value wins (kf_message_set_text) */
    KF_SET_ONCE,    /* KF_E_INVALID "given more than once", unless a string
                       field already holds this very text */
    KF_SET_DEFAULT, /* the value already there stays */
} kf_set_mode_t;

kf_status_t kf_message_set_text_as(ProtobufCMessage *msg, const char *name, const char *text,
                                   kf_set_mode_t mode, kf_arena_t *arena,
                                   kf_error_t *err) KF_MUST_USE;

/* The key field `f` of `desc` is emitted under: its lowerCamelCase name, or
 * for a `_json` field the embedded name ("input" for input_json), which
 * *embedded tells. out holds KF_JSON_NAME_BYTES_MAX bytes. What the OpenAPI
 * document and the CLI's tables name fields by. */
#define KF_JSON_NAME_BYTES_MAX 128
void kf_json_field_name(const ProtobufCMessageDescriptor *desc, const ProtobufCFieldDescriptor *f,
                        char out[KF_JSON_NAME_BYTES_MAX], bool *embedded);

/* Every key a JSON object may give field `f` of `desc` under, the emitted
 * one (kf_json_field_name) first: its lowerCamelCase name and its proto
 * name; for a `_json` field the embedded name (taking any JSON value) and
 * the full names (taking JSON text as a string). Returns how many (1..4).
 * What the OpenAPI document lists as a message's properties. */
#define KF_JSON_FIELD_KEYS_MAX 4
typedef struct kf_json_key {
    char name[KF_JSON_NAME_BYTES_MAX];
    bool embedded; /* takes the value itself, not JSON text (a `_json` field's short name) */
} kf_json_key_t;
size_t kf_json_field_keys(const ProtobufCMessageDescriptor *desc, const ProtobufCFieldDescriptor *f,
                          kf_json_key_t keys[KF_JSON_FIELD_KEYS_MAX]);

/* The short name of the enum value named `full` (a name of `ed`): without
 * the prefix every name of the enum shares, cut back to its last '_', in
 * lowercase ("RULE_KIND_BATCH" -> "batch"; without such a prefix, the
 * whole name in lowercase). What the decoder accepts besides the full name,
 * and what the OpenAPI document lists. */
void kf_json_enum_short_name(const ProtobufCEnumDescriptor *ed, const char *full,
                             char out[KF_JSON_NAME_BYTES_MAX]);

/* Renders a message as compact JSON (NUL-terminated, in the arena). NULL
 * only when the arena is exhausted. */
char *kf_message_to_json(const ProtobufCMessage *msg, kf_arena_t *arena, size_t *len);

/* The same, as a jansson value the caller owns (json_decref). */
json_t *kf_message_to_jansson(const ProtobufCMessage *msg);

#endif
