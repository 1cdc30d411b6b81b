/*
 * ctx.h - what one engine step shares with the modules it calls
 * (coordinators, runs, functions): the batch collecting the step's effects,
 * the step's time, the timer heap, the random source and the ready list.
 *
 * Engine-thread only. A module validates a command completely before it
 * touches state or the batch, so a refused command changes nothing.
 */
#ifndef KF_STEP_CTX_H
#define KF_STEP_CTX_H

#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "base/crypto.h"
#include "base/heap.h"
#include "step/engine_types.h"
#include "storage/keys.h"
#include "storage/overlay.h"
#include "storage/store.h"

/* Timer owner kinds (kf_timer_t.type). */
enum {
    KF_TIMER_COORDINATOR = 1,
    KF_TIMER_RUN = 2,
    KF_TIMER_POLL = 3,
    KF_TIMER_FUNCTION = 4,
    KF_TIMER_REMOTE_CALL = 5, /* a remote handler call's deadline */
    KF_TIMER_RUN_WAIT = 6,    /* a GetRun wait_ms deadline */
};

/* The memory budget (--memory-budget; DESIGN.md section 8): the engine's
 * tables, in estimated bytes (docs/semantics.md, "Memory budget", lists the
 * estimate of each kind of entry). The core sets used_bytes from the
 * modules' estimates at the start of every group and turn; admissions in
 * between add their own estimate, so the count only errs high. */
typedef struct kf_memory {
    uint64_t budget_bytes; /* 0: no budget */
    uint64_t used_bytes;
} kf_memory_t;

typedef struct kf_ctx {
    const kf_engine_config_t *config;
    kf_store_t *store;
    kf_overlay_t *overlay;     /* records of groups not yet durable (reads see them) */
    kf_batch_t *batch;         /* this step's effects; replaced per group */
    int64_t now_ms;            /* this step's time */
    uint64_t group_id;         /* the group this step belongs to */
    uint64_t durable_group_id; /* every group <= this one is durable */
    kf_heap_t heap;            /* processing-time timers */
    kf_rng_t *rng;
    kf_cmd_t *ready_head; /* commands whose replies are complete */
    kf_cmd_t *ready_tail;
    uint8_t *scratch; /* record encoding buffer */
    size_t scratch_cap;
    kf_memory_t memory;
    /* Bytes the store may still grow by before the disk reserve is reached
     * (runtime/engine.c measures it every turn; UINT64_MAX: not measured).
     * See kf_ctx_disk_room_left. */
    uint64_t disk_room_bytes;
} kf_ctx_t;

/* Appends a command to the ready list (its reply goes with this group). */
void kf_ctx_ready(kf_ctx_t *ctx, kf_cmd_t *cmd);
/* The same for a refused command: cmd->error is set; no response. */
void kf_ctx_fail(kf_ctx_t *ctx, kf_cmd_t *cmd);
/* Writes: into this step's batch, and staged in the overlay when it tracks
 * the family, so that later reads through kf_ctx_get / kf_ctx_iter_create
 * see them before the group is durable (storage/overlay.h). Reads of an
 * untracked family see the store only: durable writes (or a little more),
 * never this group's. */

/* Packs msg and puts it under key in cf, in this step's batch; returns the
 * packed size. */
size_t kf_ctx_put_msg(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *key, const ProtobufCMessage *msg);
void kf_ctx_put(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *key, const void *value, size_t len);
void kf_ctx_delete(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *key);
/* Deletes every key in [begin, end) of cf: one range tombstone, whatever
 * the number of keys. Not for a tracked family (kf_ctx_delete_prefix). */
void kf_ctx_delete_range(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *begin, const kf_key_t *end);
/* Deletes every key of cf that starts with `prefix` (a range tombstone). */
void kf_ctx_delete_prefix(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *prefix);
/* kf_store_get and kf_iter_create through the overlay. */
kf_status_t kf_ctx_get(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *key, kf_value_t *value,
                       bool *found, kf_error_t *err) KF_MUST_USE;
kf_status_t kf_ctx_iter_create(kf_ctx_t *ctx, kf_cf_t cf, const kf_key_t *lower,
                               const kf_key_t *upper, kf_iter_t **out, kf_error_t *err) KF_MUST_USE;

/* Moves a run's stored processing-time wake-up (KF_WAKEUP_RUN; coordinators
 * keep theirs in coord_index): deletes the record at old_due_ms (if not
 * INT64_MIN) and writes one at new_due_ms (if not INT64_MIN), and arms or
 * disarms the in-memory timer to match. */
void kf_ctx_wakeup_move(kf_ctx_t *ctx, kf_timer_t *timer, kf_wakeup_type_t type,
                        const void *identity, size_t identity_len, int64_t *stored_due_ms,
                        int64_t new_due_ms);

#define KF_NO_WAKEUP INT64_MIN

/* Admits a new entry of about `bytes` (`what` names it: "a new window"):
 * KF_OK, counting the bytes as used until the next refresh, or KF_E_LIMIT
 * naming the budget when they would pass it. Existing entries never come
 * here: they keep working whatever the budget. */
kf_status_t kf_ctx_admit(kf_ctx_t *ctx, uint64_t bytes, const char *what,
                         kf_error_t *err) KF_MUST_USE;
/* The same check without counting the bytes (a step checks its growth after
 * every handler call, and counts it once it commits). */
kf_status_t kf_ctx_memory_check(const kf_ctx_t *ctx, uint64_t bytes, const char *what,
                                kf_error_t *err) KF_MUST_USE;

/* False once this group's writes have used up the room left above the disk
 * reserve. Work the engine starts by itself that copies stored data (a
 * window closing into a run copies its input) waits while it is false:
 * below the reserve only bounded writes may go on, or a disk filled with
 * open windows would fail-stop when they close, and again at every restart
 * (docs/semantics.md, "Disk space"). */
bool kf_ctx_disk_room_left(const kf_ctx_t *ctx);

#endif
