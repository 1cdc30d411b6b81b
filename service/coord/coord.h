/*
 * coord.h - debounce and batch coordinators (DESIGN.md section 2).
 *
 * A coordinator is identified by (kind, workflow, key). It exists while it
 * has an open window or remembers a live event ID, and keeps a journal of
 * what it did plus a snapshot:
 *
 *                send_event (opens)          close_window (due/full/flush/size)
 *   (absent) -------------------> OPEN -------------------------------> IDLE
 *       ^                          | ^  send_event (joins)              |  |
 *       |                          | +----------+                       |  | send_event
 *       |                          | cancel_window                      |  +--> OPEN
 *       +-- delete_coordinator <---+-------------> IDLE ----------------+
 *              (no window, no live remembered IDs)
 *
 * Invariants
 *   1. Every state change is a journal entry (event accepted, run started,
 *      window cancelled) written in the same batch as its effects, and the
 *      same apply function runs live and on replay, so recovery rebuilds
 *      exactly the acknowledged state.
 *   2. A window's run is created in the write that closes it (runs.h, 1).
 *   3. After KF_JOURNAL_ENTRIES_MAX entries the coordinator writes a snapshot
 *      and deletes the folded entries in the same batch (continue-as-new).
 *   4. The in-memory timer is at or before the coordinator's due time: the
 *      open window's, else the expiry of its last remembered ID (a debounce
 *      event that moves the due time later leaves it; it fires early and
 *      kf_coords_fire, finding nothing due, re-arms it). The stored
 *      wake-up is at or before it too (a later move writes nothing while the
 *      stored one is still ahead; after a restart it fires early and is
 *      re-armed), so no window is ever closed late, crash or not.
 *
 * Engine-thread only.
 */
#ifndef KF_COORD_COORD_H
#define KF_COORD_COORD_H

#include <stdint.h>

#include "base/status.h"
#include "engine/ctx.h"
#include "runs/runs.h"

typedef struct kf_coords kf_coords_t;

/* `runs` is borrowed and outlives the table. */
kf_coords_t *kf_coords_create(kf_runs_t *runs);
void kf_coords_destroy(kf_coords_t *coords);

/* Loads snapshots and replays journals. */
kf_status_t kf_coords_recover(kf_coords_t *coords, kf_ctx_t *ctx, kf_error_t *err) KF_MUST_USE;
/* A stored wake-up for the coordinator with storage key `ckey` was found at
 * start; returns false when no such coordinator exists. */
bool kf_coords_attach_wakeup(kf_coords_t *coords, kf_ctx_t *ctx, const void *ckey, size_t len,
                             int64_t due_ms);
/* After wake-ups are attached: gives any coordinator without one its timer
 * (repairing a store written by a crashed older build). */
void kf_coords_finish_recovery(kf_coords_t *coords, kf_ctx_t *ctx);

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
