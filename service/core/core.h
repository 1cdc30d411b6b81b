/*
 * core.h - the engine's deterministic heart: all state, no threads.
 *
 * The threaded engine (runtime/engine.c) drives a core; tests drive one
 * directly with a manual clock, a seeded random source and a fault-injecting
 * store:
 *
 *   kf_core_begin(core, batch, group_id, now_ms);
 *   kf_core_execute(core, cmd) ...;  kf_core_tick(core, limit);
 *   kf_core_run_work(core, steps) while kf_core_has_work(core) and time allows;
 *   write the batch; then kf_core_take_ready(core) -> release replies;
 *   kf_core_durable(core, group_id);
 *
 * Engine-thread only.
 */
#ifndef KF_CORE_CORE_H
#define KF_CORE_CORE_H

#include <stdint.h>

#include "step/engine_types.h"

typedef struct kf_core kf_core_t;

/* Recovers all state from the store (see kf_engine_create). `config` and
 * `store` are borrowed and outlive the core. */
kf_status_t kf_core_create(const kf_engine_config_t *config, kf_store_t *store, kf_core_t **out,
                           kf_error_t *err) KF_MUST_USE;
void kf_core_destroy(kf_core_t *core);

/* The commit sequence of the last group written before this start (0 for a
 * new store). Number groups from the next one: a group's id is its commit
 * sequence (receipts carry it), so it must keep increasing across restarts. */
uint64_t kf_core_last_commit_seq(const kf_core_t *core);
/* Records `group_id` as the store's last commit sequence in `batch`: call
 * for every group just before it is written (a group that writes nothing
 * needs none). Touches only the batch: any thread that owns it. */
void kf_core_seal_group(kf_batch_t *batch, uint64_t group_id);

/* Starts a step: effects go to `batch`, which belongs to group `group_id`. */
void kf_core_begin(kf_core_t *core, kf_batch_t *batch, uint64_t group_id, int64_t now_ms);
/* Executes one command. Its reply lands on the ready list now, or later
 * (a parked long poll) from another step. */
void kf_core_execute(kf_core_t *core, kf_cmd_t *cmd);
/* Fires up to `limit` due processing-time timers and sweeps retention.
 * Returns the number of timers fired. */
uint32_t kf_core_tick(kf_core_t *core, uint32_t limit);
/* The earliest armed timer's due time, or INT64_MAX. */
int64_t kf_core_next_due_ms(const kf_core_t *core);
/* Detaches the ready list (linked through cmd->next; NULL when empty). */
kf_cmd_t *kf_core_take_ready(kf_core_t *core);
/* Every group <= group_id is durable. */
void kf_core_durable(kf_core_t *core, uint64_t group_id);
/* Work the engine starts by itself: follow-on timer steps of process
 * functions (functions.h). has_work says whether there is any; run_work
 * starts up to `steps_max` steps in the current group and returns how many
 * it started. */
bool kf_core_has_work(const kf_core_t *core);
uint32_t kf_core_run_work(kf_core_t *core, uint32_t steps_max);
/* Test seam (config.defer_handler_calls): answers the handler calls that
 * are out, letting their steps go on. */
void kf_core_pump(kf_core_t *core);
/* Cancels a parked command (a long poll whose client left); no-op when
 * `cmd` is not parked under `id`. */
void kf_core_cancel(kf_core_t *core, kf_cmd_t *cmd, uint64_t id);
/* Handles worker events (step/engine_types.h) in order, freeing each. */
void kf_core_worker_events(kf_core_t *core, kf_worker_event_t *list);
/* Answers parked polls (empty) in the current step: call at shutdown. */
void kf_core_shutdown(kf_core_t *core);
/* The disk reserve: while `why` is non-NULL, commands that grow the store
 * (SendEvent, PushBatch, RegisterFunction) are refused with KF_E_NO_SPACE
 * and `why` as their message; everything else goes on (reads, completions,
 * deletions, timers). `why` is copied. */
void kf_core_set_disk_low(kf_core_t *core, const char *why);
/* The bytes the store may still grow by before the reserve is reached (free
 * space minus the reserve, this engine's share of it; UINT64_MAX, the
 * default, when not measured): once a group has written that much, windows
 * due wait, open, for space (kf_ctx_disk_room_left), and commands that grow
 * the store are refused with KF_E_NO_SPACE like below the reserve. A group
 * may pass the room by the last command admitted, never by more. */
void kf_core_set_disk_room(kf_core_t *core, uint64_t room_bytes);

#endif
