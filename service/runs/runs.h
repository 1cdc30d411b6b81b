/*
 * runs.h - runs started by closing windows, and the workers that take them.
 *
 *                 kf_runs_start           lease (poll)
 *   (window) ----------------> PENDING ---------------> LEASED
 *                                 ^                       |  |  \ complete(error)
 *                                 |  lease expired,       |  |   \----------> FAILED
 *                                 +-- attempts < max -----+  | complete(result)
 *                                                            +--------------> COMPLETED
 *   LEASED --(lease expired, attempts == max)--> FAILED
 *   COMPLETED/FAILED --(retention ends)--> deleted
 *
 * Invariants
 *   1. A run is created in the same write that closes its window, exactly
 *      once (the coordinator journal records it; replay never re-creates).
 *   2. Live runs (PENDING, LEASED) are in memory and in the run_queue family;
 *      finished runs stay in memory only until their finishing write is
 *      durable, then live on disk until retention deletes them.
 *   3. A lease is a fresh UUID per attempt; completing or heartbeating with
 *      any other lease is FAILED_PRECONDITION and changes nothing.
 *   4. Pending runs are handed out oldest first (by run sequence), so a
 *      retried run goes ahead of newer ones.
 *
 * Engine-thread only.
 */
#ifndef KF_RUNS_RUNS_H
#define KF_RUNS_RUNS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/ctx.h"

typedef struct kf_runs kf_runs_t;

kf_runs_t *kf_runs_create(void);
void kf_runs_destroy(kf_runs_t *runs);

/* Loads live runs, the run sequence and run wake-ups' owners. */
kf_status_t kf_runs_recover(kf_runs_t *runs, kf_ctx_t *ctx, kf_error_t *err) KF_MUST_USE;
/* A stored wake-up for `run_id` was found at start: arm it, or return false
 * when no live or in-memory run owns it (the caller leaves it to the sweep). */
bool kf_runs_attach_wakeup(kf_runs_t *runs, kf_ctx_t *ctx, const char *run_id, size_t len,
                           int64_t due_ms);

/* What a closing window hands over. Borrowed for the call. */
typedef struct kf_run_spec {
    const char *run_id;
    const char *workflow;
    const char *key;
    int kind; /* keyflow.v1.RuleKind */
    const char *input;
    size_t input_len;
    int64_t event_count;
} kf_run_spec_t;

/* True when one more live run would pass KF_LIVE_RUNS_MAX. */
bool kf_runs_full(const kf_runs_t *runs);
/* True when `count` more live runs fit under KF_LIVE_RUNS_MAX. */
bool kf_runs_room(const kf_runs_t *runs, uint32_t count);
/* Whether a pending or leased run has this ID (recovery's consistency check). */
bool kf_runs_live(const kf_runs_t *runs, const char *run_id);
/* Creates a PENDING run and returns its sequence number (journalled by the
 * caller). Hands it to a parked poll at once when one matches. */
uint64_t kf_runs_start(kf_runs_t *runs, kf_ctx_t *ctx, const kf_run_spec_t *spec);

void kf_runs_poll(kf_runs_t *runs, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_runs_heartbeat(kf_runs_t *runs, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_runs_complete(kf_runs_t *runs, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_runs_get(kf_runs_t *runs, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_runs_list(kf_runs_t *runs, kf_ctx_t *ctx, kf_cmd_t *cmd);

/* After wake-ups are attached: arms leased runs that had none. */
void kf_runs_finish_recovery(kf_runs_t *runs, kf_ctx_t *ctx);

/* A KF_TIMER_RUN or KF_TIMER_POLL timer fired (already disarmed). */
void kf_runs_fire(kf_runs_t *runs, kf_ctx_t *ctx, kf_timer_t *timer);
/* Deletes finished runs whose retention ended and that are no longer in
 * memory, found through the wake-up family; at most `limit` per call.
 * Returns how many it examined. */
uint32_t kf_runs_sweep(kf_runs_t *runs, kf_ctx_t *ctx, uint32_t limit);
/* Forgets finished runs whose finishing write is durable. */
void kf_runs_evict(kf_runs_t *runs, kf_ctx_t *ctx);
/* Answers a parked poll with KF_E_CANCELLED; false when `cmd` (with `id`)
 * is not one of the parked polls. Only pointers are compared until found. */
bool kf_runs_cancel_poll(kf_runs_t *runs, kf_ctx_t *ctx, kf_cmd_t *cmd, uint64_t id);
/* Answers every parked poll (empty) - at shutdown. */
void kf_runs_release_polls(kf_runs_t *runs, kf_ctx_t *ctx);

/* Counts for metrics and tests. */
uint64_t kf_runs_pending(const kf_runs_t *runs);
uint64_t kf_runs_leased(const kf_runs_t *runs);

#endif
