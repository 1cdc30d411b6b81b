/*
 * descriptor.h - function descriptors: validation, defaults, the canonical
 * encoding and its SHA-256 (the function's checkpoint identity).
 *
 * The canonical descriptor is the request's descriptor with every default
 * resolved (determinism UNSPECIFIED -> UNDECLARED, every limit present)
 * but placement: UNSPECIFIED there means "registered before placement
 * existed" in a stored descriptor (read as SPLIT: its keys are where they
 * were put), and a registration turns it into SINGLE for a new function
 * (functions/registry.c);
 * its encoding is protobuf-c's pack of that message, which writes fields in
 * field-number order with no unknown fields, so equal descriptors encode to
 * equal bytes. Pure functions: no state, no I/O.
 */
#ifndef KF_FUNCTIONS_DESCRIPTOR_H
#define KF_FUNCTIONS_DESCRIPTOR_H

#include <stdbool.h>
#include <stdint.h>

#include "base/arena.h"
#include "base/crypto.h"
#include "base/status.h"
#include "keyflow/v1/functions.pb-c.h"
#include "step/engine_types.h"

typedef struct kf_fn_limits {
    int64_t max_keys;
    int64_t max_timers;
    int64_t max_state_bytes;
    int64_t max_batch_rows;
    int64_t max_input_rows;
    int64_t max_input_bytes;
    int64_t max_output_rows;
    int64_t max_output_bytes;
    int64_t max_timer_callbacks;
    int64_t call_timeout_ms; /* a REMOTE worker's answer, a NATIVE call's return */
} kf_fn_limits_t;

/* Validates `in` (every rule of DESIGN.md section 1, each error naming the
 * field, e.g. "descriptor.key_columns[0]: column \"amount\" must be UTF8")
 * and builds the canonical descriptor in the arena. Errors: KF_E_INVALID.
 * Does not check registry rules (reused pipeline_state_id). */
kf_status_t kf_descriptor_canonicalize(const Keyflow__V1__FunctionDescriptor *in, kf_arena_t *arena,
                                       Keyflow__V1__FunctionDescriptor **out,
                                       kf_error_t *err) KF_MUST_USE;

/* The canonical encoding (packed into the arena) and its SHA-256 in hex. */
kf_status_t kf_descriptor_encode(const Keyflow__V1__FunctionDescriptor *canonical,
                                 kf_arena_t *arena, uint8_t **bytes, size_t *len,
                                 char sha256_hex[KF_SHA256_HEX_BYTES + 1],
                                 kf_error_t *err) KF_MUST_USE;

/* Whether a canonical descriptor's keys are split over the partitions:
 * SPLIT, or UNSPECIFIED (stored before placement existed). */
bool kf_descriptor_split(const Keyflow__V1__FunctionDescriptor *canonical);

/* Limits of a canonical descriptor. */
void kf_descriptor_limits(const Keyflow__V1__FunctionDescriptor *canonical, kf_fn_limits_t *out);

/* The output retention in force for a canonical descriptor: its own
 * bounds, the server's for those it leaves out. */
void kf_descriptor_retention(const Keyflow__V1__FunctionDescriptor *canonical,
                             const kf_retention_t *server, kf_retention_t *out);

/* Index of a field by name in a schema, or -1. */
int kf_schema_find(const Keyflow__V1__Schema *schema, const char *name);

#endif
