/*
 * coord.h - debounce and batch coordinators (DESIGN.md section 2).
 *
 * A coordinator is identified by (kind, workflow, key). It exists while it
 * has an open window or remembers a live event ID, and keeps a journal of
 * what it did plus its current state:
 *
 *                send_event (opens)          close_window (due/full/flush/size)
 *   (absent) -------------------> OPEN -------------------------------> IDLE
 *       ^                          | ^  send_event (joins)              |  |
 *       |                          | +----------+                       |  | send_event
 *       |                          | cancel_window                      |  +--> OPEN
 *       +-- delete_coordinator <---+-------------> IDLE ----------------+
 *              (no window, no live remembered IDs)
 *
 * Invariants (coord.c has the storage layout and the rest)
 *   1. Every state change is journalled (event accepted, run started,
 *      window cancelled, window closed) in the same batch as its effects;
 *      the coordinator's state record is rewritten in that batch too, so
 *      recovery needs no replay.
 *   2. A window's run is created in the write that closes it (runs.h, 1).
 *   3. After KF_JOURNAL_ENTRIES_MAX entries the journal is deleted up to
 *      the current entry in the same batch (continue-as-new).
 *   4. No window is ever closed late, crash or not: the stored and the
 *      in-memory wake-ups are at or before the coordinator's due time.
 *
 * Engine-thread only.
 */
#ifndef KF_COORD_COORD_H
#define KF_COORD_COORD_H

#include <stdint.h>

#include "base/status.h"
#include "runs/runs.h"
#include "step/ctx.h"

typedef struct kf_coords kf_coords_t;

/* `runs` is borrowed and outlives the table. */
kf_coords_t *kf_coords_create(kf_runs_t *runs);
void kf_coords_destroy(kf_coords_t *coords);

/* Upgrades a store of format 1, then rebuilds the coordinators' memory
 * entries and timers from their index (decoding no state). `ctx` is the
 * engine's and outlives the table (GetRun's window lookups read through
 * it). Errors: KF_E_CORRUPT, KF_E_IO. */
kf_status_t kf_coords_recover(kf_coords_t *coords, kf_ctx_t *ctx, kf_error_t *err) KF_MUST_USE;

void kf_coords_send_event(kf_coords_t *coords, kf_ctx_t *ctx, kf_cmd_t *cmd);
/* Up to KF_SEND_EVENTS_MAX events, each executed as kf_coords_send_event
 * would, in order, into this step's batch (so all in one write); a refused
 * event is an error entry of the response and changes nothing. */
void kf_coords_send_events(kf_coords_t *coords, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_coords_describe(kf_coords_t *coords, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_coords_flush(kf_coords_t *coords, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_coords_cancel(kf_coords_t *coords, kf_ctx_t *ctx, kf_cmd_t *cmd);

/* A KF_TIMER_COORDINATOR timer fired (already disarmed). */
void kf_coords_fire(kf_coords_t *coords, kf_ctx_t *ctx, kf_timer_t *timer);

uint64_t kf_coords_count(const kf_coords_t *coords);
/* Estimated bytes of the coordinators in memory (the memory budget):
 * whoever changes what a coordinator holds keeps this true. */
uint64_t kf_coords_memory_bytes(const kf_coords_t *coords);
uint64_t kf_coords_open_windows(const kf_coords_t *coords);

#endif
