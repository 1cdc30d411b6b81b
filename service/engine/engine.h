/*
 * engine.h - the engine: one thread owns all mutable state, a committer
 * thread makes each group of effects durable, replies leave only after that.
 *
 *   front end threads            engine thread                committer thread
 *   ---------------------        --------------------------   -----------------------
 *   kf_engine_submit(cmd) -----> inbox (bounded) -> execute -> group N (one batch)
 *                                fire due timers      |        write group N-1 (sync)
 *                                                     +------> hand N-1's replies to
 *                                                              the replier thread:
 *   cmd->done(cmd) <-------------------------------------------- cmd->done(cmd)
 *
 * Invariants
 *   1. Only the engine thread touches engine state (coordinators, runs,
 *      functions, timers). Front ends hand it commands and get them back.
 *   2. A command's reply (cmd->done) is called only after the group holding
 *      its effects, and every group before it, was written with sync = true.
 *      Reads are released in the same order, so no reply reveals an effect
 *      that is not yet durable.
 *   3. A failed sync is fatal: nothing of that group or any later group is
 *      acknowledged; the process stops (config.on_fatal, default abort()).
 *   4. While the committer syncs group N-1, the engine fills group N: one
 *      fsync serves every command that arrived meanwhile (group commit).
 *   5. Every queue is bounded: a full inbox refuses with KF_E_LIMIT.
 */
#ifndef KF_ENGINE_ENGINE_H
#define KF_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "base/arena.h"
#include "base/clock.h"
#include "base/status.h"
#include "proto/methods.h"
#include "storage/store.h"

/* A command: one call of an ENGINE row of the RPC table (proto/rpcs.h),
 * which also names the module function that executes it (engine/core.c).
 * The request and response are the row's protobuf-c messages: the engine
 * asks for them at its boundary and never sees wire bytes or JSON. */
typedef struct kf_cmd kf_cmd_t;

struct kf_cmd {
    /* Set by the submitter. */
    kf_op_t op;
    const ProtobufCMessage *request; /* borrowed until done; usually in arena */
    kf_arena_t *arena;               /* the response is built here; owned by submitter */
    void (*done)(kf_cmd_t *cmd);     /* called exactly once after kf_engine_submit
                                        returned KF_OK, on the replier thread; the
                                        cmd is the submitter's again */
    void *owner;                     /* submitter's context */
    /* Set by the engine before done. */
    ProtobufCMessage *response; /* in arena; NULL when error.status != KF_OK */
    kf_error_t error;
    /* Engine-private. */
    kf_cmd_t *next;
    int64_t submitted_ns;
    uint64_t id;  /* unique per submission, for cancellation */
    void *parked; /* engine state while the command waits */
};

typedef struct kf_engine_config {
    kf_clock_t clock;     /* default: system clock */
    const void *rng_seed; /* NULL: system entropy */
    size_t rng_seed_len;
    int64_t run_retention_ms; /* finished runs kept this long; 0 = default */
    int64_t run_attempts_max; /* leases per run before FAILED; 0 = default */
    int64_t queue_depth_max;  /* inbox bound; 0 = KF_QUEUE_DEPTH_MAX */
    const char *plugin_dir;   /* native handler .so files; NULL = none */
    bool defer_handler_calls; /* tests only: handler calls answer on
                                 kf_core_pump(), like remote ones */
    /* Called on the committer thread when a sync fails. Default: log and
     * abort(). If it returns, the engine stops acknowledging anything. */
    void (*on_fatal)(const kf_error_t *err, void *ctx);
    void *on_fatal_ctx;
} kf_engine_config_t;

typedef struct kf_engine kf_engine_t;

/* Loads every coordinator, run and function from the store (replaying
 * journals) and rebuilds the timer heap. The store is borrowed and must
 * outlive the engine. Errors: KF_E_IO, KF_E_CORRUPT (with the key). */
kf_status_t kf_engine_create(const kf_engine_config_t *config, kf_store_t *store, kf_engine_t **out,
                             kf_error_t *err) KF_MUST_USE;
/* Starts the engine and committer threads. */
kf_status_t kf_engine_start(kf_engine_t *engine, kf_error_t *err) KF_MUST_USE;
/* Hands a command to the engine. On KF_OK the engine owns it until done();
 * otherwise (KF_E_LIMIT: queue full, KF_E_UNAVAILABLE: stopping) done() will
 * not be called and cmd->error says why. Any thread. */
kf_status_t kf_engine_submit(kf_engine_t *engine, kf_cmd_t *cmd) KF_MUST_USE;
/* The submitter's client went away: if `cmd` is still waiting in the engine
 * (a long poll), answer it now with KF_E_CANCELLED instead of letting it
 * take work. Harmless when the command already finished. Any thread; the
 * engine never touches `cmd` unless it is still one of its parked commands. */
void kf_engine_cancel(kf_engine_t *engine, kf_cmd_t *cmd);
/* Stops accepting, finishes every accepted command (parked polls answer
 * empty), syncs the last group and joins the threads. Idempotent. */
void kf_engine_stop(kf_engine_t *engine);
void kf_engine_destroy(kf_engine_t *engine);
/* True once a sync failed (the engine acknowledges nothing more). */
bool kf_engine_failed(const kf_engine_t *engine);

#endif
