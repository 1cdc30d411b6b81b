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
#include "storage/store.h"

/* X(op, request type, response type) — the engine's command set. The
 * request and response types are the API's protobuf-c messages: the engine
 * asks for them at its boundary and never sees wire bytes or JSON. */
#define KF_OP_TABLE(X)                                                                             \
    X(KF_OP_SEND_EVENT, Keyflow__V1__SendEventRequest, Keyflow__V1__SendEventResponse)             \
    X(KF_OP_DESCRIBE_COORDINATOR, Keyflow__V1__DescribeCoordinatorRequest,                         \
      Keyflow__V1__DescribeCoordinatorResponse)                                                    \
    X(KF_OP_FLUSH_WINDOW, Keyflow__V1__FlushWindowRequest, Keyflow__V1__FlushWindowResponse)       \
    X(KF_OP_CANCEL_WINDOW, Keyflow__V1__CancelWindowRequest, Keyflow__V1__CancelWindowResponse)    \
    X(KF_OP_POLL_RUNS, Keyflow__V1__PollRunsRequest, Keyflow__V1__PollRunsResponse)                \
    X(KF_OP_HEARTBEAT_RUN, Keyflow__V1__HeartbeatRunRequest, Keyflow__V1__HeartbeatRunResponse)    \
    X(KF_OP_COMPLETE_RUN, Keyflow__V1__CompleteRunRequest, Keyflow__V1__CompleteRunResponse)       \
    X(KF_OP_GET_RUN, Keyflow__V1__GetRunRequest, Keyflow__V1__Run)                                 \
    X(KF_OP_LIST_RUNS, Keyflow__V1__ListRunsRequest, Keyflow__V1__ListRunsResponse)                \
    X(KF_OP_REGISTER_FUNCTION, Keyflow__V1__RegisterFunctionRequest,                               \
      Keyflow__V1__RegisterFunctionResponse)                                                       \
    X(KF_OP_GET_FUNCTION, Keyflow__V1__GetFunctionRequest, Keyflow__V1__FunctionInfo)              \
    X(KF_OP_LIST_FUNCTIONS, Keyflow__V1__ListFunctionsRequest, Keyflow__V1__ListFunctionsResponse) \
    X(KF_OP_PUSH_BATCH, Keyflow__V1__PushBatchRequest, Keyflow__V1__PushBatchResponse)             \
    X(KF_OP_READ_OUTPUT, Keyflow__V1__ReadOutputRequest, Keyflow__V1__ReadOutputResponse)          \
    X(KF_OP_GET_KEY_STATE, Keyflow__V1__GetKeyStateRequest, Keyflow__V1__GetKeyStateResponse)

typedef enum kf_op {
#define KF_OP_ENUM_(op, req, resp) op,
    KF_OP_TABLE(KF_OP_ENUM_)
#undef KF_OP_ENUM_
        KF_OP_COUNT
} kf_op_t;

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

const char *kf_op_name(kf_op_t op);

#endif
