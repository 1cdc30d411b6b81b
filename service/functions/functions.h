/*
 * functions.h - keyed process functions (DESIGN.md section 1): the registry,
 * per-key value state and event-time timers, input steps, the output stream.
 *
 * A PushBatch is one step:
 *
 *   rows (arrival order) --> handler calls (<= max_batch_rows activations,
 *   at most one per key) --> watermark advance --> due timers in
 *   (at_us, key, name) order, at most max_timer_callbacks_per_step of them
 *   --> one atomic write (state, timers, output, checkpoint, producer)
 *
 * and due timers beyond that bound fire in follow-on steps the engine runs
 * by itself (kf_functions_run_due), each its own atomic write, between
 * other commands; the function's later batches wait until they are done.
 *
 * Invariants
 *   1. Every handler response is validated before it is applied; a violation
 *      or a limit anywhere in the step rolls back everything the step did
 *      (undo log), so a refused batch changes nothing. The per-step limits
 *      (output rows and bytes, timer callbacks) count the whole step.
 *   2. A step is a resumable machine: a call goes out through the
 *      function's handler host (kf__call_send) and its response is taken
 *      later (take_response; the seam is drawn in functions_int.h); native
 *      handlers answer at once, a remote one (or the defer_calls test seam)
 *      later. While a step waits, later batches of the same function queue
 *      behind it.
 *   3. A retry of an accepted (producer, sequence) with the same rows and
 *      watermark returns the stored acknowledgement and changes nothing;
 *      with other content it is refused (ALREADY_EXISTS); a lower sequence
 *      whose acknowledgement is no longer kept is refused too.
 *   4. Output rows get contiguous per-function sequence numbers; reads see
 *      only rows whose write is durable.
 *
 * Engine-thread only.
 */
#ifndef KF_FUNCTIONS_FUNCTIONS_H
#define KF_FUNCTIONS_FUNCTIONS_H

#include "base/status.h"
#include "step/ctx.h"

typedef struct kf_functions kf_functions_t;

/* `config` is borrowed and outlives fns: its plugin_dir, output retention,
 * and defer_handler_calls, a test seam: native handler calls then answer
 * only on kf_functions_pump(), the way a remote handler's would arrive
 * later. */
kf_functions_t *kf_functions_create(const kf_engine_config_t *config);
void kf_functions_destroy(kf_functions_t *fns);
kf_status_t kf_functions_recover(kf_functions_t *fns, kf_ctx_t *ctx, kf_error_t *err) KF_MUST_USE;

void kf_functions_register(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_functions_get(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_functions_list(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_functions_push(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd);
/* DryRunBatch: a PushBatch's step, answered with what it would write, then
 * rolled back (it waits behind a busy function like a batch). */
void kf_functions_dry_run(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd);
/* ReplayBatch: a kept input batch of a REPLAY_SAFE function run again in a
 * scratch copy of the keys its step touched, compared with what it did. */
void kf_functions_replay(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_functions_read(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_functions_key_state(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_functions_trim(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd);
/* Estimated bytes of every function's tables (the memory budget); walks
 * the functions (at most KF_FUNCTIONS_MAX). */
uint64_t kf_functions_memory_bytes(const kf_functions_t *fns);
/* Forgets the oldest batches kept for ReplayBatch until they fit the room
 * the tables (m->used_bytes) leave in the memory budget m, and their share
 * of --replay-bytes: they yield to the tables (functions/replay.c). */
void kf_functions_replay_fit(kf_functions_t *fns, const kf_memory_t *m);
void kf_functions_delete(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_functions_delete_producer(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd);

/* Output retention and producer expiry: trims what the functions'
 * retention and TrimOutput say may go, examining at most `limit` output
 * chunks, and forgets producers idle past the server's expiry. Returns how
 * much it examined (== limit: more may be left; call again soon). */
uint32_t kf_functions_sweep(kf_functions_t *fns, kf_ctx_t *ctx, uint32_t limit);

/* Follow-on timer steps: due timers beyond what one step may fire
 * (max_timer_callbacks_per_step) fire in steps the engine starts by itself,
 * each its own atomic set of writes, between other commands. has_due says
 * whether any function has such a step to run; run_due starts up to
 * `steps_max` of them (round robin over functions) and returns how many. */
bool kf_functions_has_due(const kf_functions_t *fns);
uint32_t kf_functions_run_due(kf_functions_t *fns, kf_ctx_t *ctx, uint32_t steps_max);

/* Delivers the responses of calls that are out (defer_calls): each waiting
 * step takes its response and goes on. */
void kf_functions_pump(kf_functions_t *fns, kf_ctx_t *ctx);

/* A worker event from a front end (step/engine_types.h): a hello, a result, or
 * the end of the stream. `ev` stays the caller's. */
void kf_functions_worker_event(kf_functions_t *fns, kf_ctx_t *ctx, kf_worker_event_t *ev);
/* A KF_TIMER_REMOTE_CALL timer fired: a worker missed a call's deadline. */
void kf_functions_fire_call(kf_functions_t *fns, kf_ctx_t *ctx, kf_timer_t *timer);
/* Ends every worker stream (at shutdown): steps waiting for them fail, and
 * every link goes back to its front end. */
void kf_functions_release_workers(kf_functions_t *fns, kf_ctx_t *ctx);
/* A KF_TIMER_FUNCTION timer fired: a parked read's deadline. */
void kf_functions_fire(kf_functions_t *fns, kf_ctx_t *ctx, kf_timer_t *timer);
/* Groups <= ctx->durable_group_id are durable: wake parked reads. */
void kf_functions_durable(kf_functions_t *fns, kf_ctx_t *ctx);
/* Answers a parked read with KF_E_CANCELLED; false when not parked. */
bool kf_functions_cancel_read(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd, uint64_t id);
/* Ends what keys revoked since they were checked still hold open: parked
 * reads (KF_E_UNAUTHENTICATED) and worker streams (closed). */
void kf_functions_end_revoked(kf_functions_t *fns, kf_ctx_t *ctx);
/* Answers parked reads (empty) - at shutdown. */
void kf_functions_release_reads(kf_functions_t *fns, kf_ctx_t *ctx);

#endif
