/*
 * fn_harness.h - what the process-function unit tests share: a sim (the
 * engine core over a memory store, tests/unit/engine/sim.h) with the test
 * plugins loaded, descriptors for them, and one-line calls of the RPCs.
 *
 * Plugins (tests/plugins): misbehaving.so (tests/unit/functions) breaks a
 * rule chosen per row by its `mode` column; timer_names.so
 * (tests/unit/handlers) sets and cancels timers by name. Every message is
 * built in the sim's arena; every call steps the sim (its group is
 * durable when it returns).
 */
#ifndef KF_TEST_FN_HARNESS_H
#define KF_TEST_FN_HARNESS_H

#include <jansson.h>

#include "../engine/sim.h"
#include "base/crypto.h"
#include "keyflow/v1/functions.pb-c.h"

extern sim_t sim;

/* Criterion .init / .fini: a fresh sim (seed 11) with the plugins. */
void fnh_setup(void);
void fnh_teardown(void);

/* misbehaving: input k UTF8, ts TIMESTAMP_US, mode UTF8, amount INT64
 * (nullable); output key UTF8, ts TIMESTAMP_US, n INT64; timer "t". */
Keyflow__V1__FunctionDescriptor *fnh_descriptor(const char *id, const char *state_id);
/* timer_names: input k, ts, op, names, at; output key, ts, name; the
 * given timer names. */
Keyflow__V1__FunctionDescriptor *fnh_timer_names_descriptor(const char *id, const char *state_id,
                                                            const char *const *names, size_t count);
/* Sets one of the descriptor's limits by its proto name ("max_output_rows"). */
void fnh_limit(Keyflow__V1__FunctionDescriptor *d, const char *name, int64_t value);

kf_cmd_t *fnh_register(Keyflow__V1__FunctionDescriptor *d);
/* rows: a JSON array text or NULL; watermark: INT64_MIN for none. */
kf_cmd_t *fnh_push(const char *fid, const char *producer, int64_t seq, const char *rows,
                   int64_t watermark);
/* The same from producer "p", asserting it was accepted. */
Keyflow__V1__PushBatchResponse *fnh_push_ok(const char *fid, int64_t seq, const char *rows,
                                            int64_t watermark);
Keyflow__V1__GetKeyStateResponse *fnh_state(const char *fid, const char *key);
Keyflow__V1__FunctionInfo *fnh_info(const char *fid);
/* The output rows after `after`, as parsed JSON (caller decrefs). */
json_t *fnh_output(const char *fid, int64_t after, int64_t limit,
                   Keyflow__V1__ReadOutputResponse **resp_out);
int64_t fnh_out_int(json_t *rows, size_t i, const char *col);
const char *fnh_out_str(json_t *rows, size_t i, const char *col);

#endif
