/*
 * engine_types.h - the engine's vocabulary: the command a front end hands
 * over, the worker events and the configuration, shared by the modules
 * (coord/, runs/, functions/, keys/), the deterministic core that composes
 * them (core/core.h) and the threads that drive it (runtime/engine.h,
 * which is what front ends call).
 *
 * Layers (layers.txt): base, storage, proto < step (this folder: the
 * vocabulary and the step context, step/ctx.h) < modules < core (no threads)
 * < runtime < front ends (rpc/, http/) < main.
 */
#ifndef KF_STEP_ENGINE_TYPES_H
#define KF_STEP_ENGINE_TYPES_H

#include <stdbool.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "base/arena.h"
#include "base/clock.h"
#include "auth/auth.h"
#include "base/limits.h"
#include "base/status.h"
#include "proto/methods.h"
#include "storage/store.h"

/* A command: one call of an ENGINE row of the RPC table (proto/rpcs.h),
 * which also names the module function that executes it (core/core.c).
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
    kf_principal_t *principal;       /* who called (borrowed until done); NULL:
                                        auth is off, or the RPC needs no key */
    /* Set by the engine before done. */
    ProtobufCMessage *response; /* in arena; NULL when error.status != KF_OK */
    kf_error_t error;
    /* With error.status KF_E_NOT_OWNER (set by the router, runtime/router.h):
     * the partition the call's key belongs to, which this process does not
     * serve; kf_router_owner names who does. */
    int32_t foreign_partition;
    /* With error.status KF_E_RANGE from ReadOutput below the retained rows
     * (functions/retention.c): the after_seq a read may resume from (the
     * first retained sequence - 1), so that the router can answer a
     * resumable cursor. */
    int64_t resume_after_seq;
    /* With an error from a SPLIT function's PushBatch that some partitions
     * applied (set by the router): those partitions, "0,3,5" (in arena);
     * NULL otherwise. Front ends pass it on (metadata, JSON). */
    const char *applied_partitions;
    /* Router-private: where the command went (runtime/router.c). */
    void *routed;
    /* Engine-private. */
    kf_cmd_t *next;
    int64_t submitted_ns;
    uint64_t id;  /* unique per submission, for cancellation */
    void *parked; /* engine state while the command waits */
};

/* ---- remote handler workers ---------------------------------------------
 * A worker stream (keyflow.v1.Workers/Serve) lives in a front end; the
 * engine owns what it means (functions/remote.c). They meet here:
 *
 *   front end (any thread)                     engine thread
 *   kf_engine_worker_post(HELLO)  ------------> accept: ops->send(welcome)
 *                                               or refuse: ops->close(status)
 *                                <------------ ops->send(call), ...
 *   kf_engine_worker_post(RESULT) ------------> recorded, validated, applied
 *   kf_engine_worker_post(GONE)   ------------> its calls fail; ops->release
 *
 * Contract:
 *   - Per link the front end posts one HELLO first, then RESULTs, then one
 *     GONE (the stream ended, for whatever reason); nothing after GONE.
 *   - Once a HELLO was accepted by kf_engine_worker_post, the engine calls
 *     ops->release(link) exactly once: when it handles the GONE, or when
 *     it stops (kf_engine_stop), whichever is first; it never touches the
 *     link after that. Posts after the engine stopped are refused.
 *   - ops->send and ops->close run on the engine thread and must not block;
 *     send takes ownership of the packed keyflow.v1.ServerMessage (free()).
 *     After close the engine sends nothing more on the link.
 *   - The engine has at most the worker's granted concurrency of calls out
 *     on a link, so a front end that forwards only RESULTs answering calls
 *     it sent keeps the number of events per link bounded by that. */
typedef struct kf_worker_link kf_worker_link_t; /* the front end's, opaque here */

typedef struct kf_worker_ops {
    void (*send)(kf_worker_link_t *link, uint8_t *message, size_t len, bool is_call);
    void (*close)(kf_worker_link_t *link, kf_status_t status, const char *message);
    void (*release)(kf_worker_link_t *link);
} kf_worker_ops_t;

typedef enum kf_worker_event_kind {
    KF_WORKER_HELLO,
    KF_WORKER_RESULT,
    KF_WORKER_GONE,
} kf_worker_event_kind_t;

typedef struct kf_worker_event {
    kf_worker_event_kind_t kind;
    kf_worker_link_t *link;
    const kf_worker_ops_t *ops; /* HELLO: lives as long as the link */
    /* HELLO: the stream's API key (NULL: auth off), borrowed until
     * ops->release; once it is revoked the engine sends no more calls and
     * closes the stream (auth/auth.h). */
    const kf_principal_t *principal;
    /* HELLO and RESULT: the unpacked keyflow.v1.WorkerMessage (protobuf-c,
     * default allocator), owned by the event. */
    ProtobufCMessage *message;
    char peer[64];                           /* HELLO: for logs */
    char reason[KF_ERROR_MESSAGE_BYTES_MAX]; /* GONE: why the stream ended */
    struct kf_worker_event *next;            /* engine-private */
} kf_worker_event_t;

/* Frees an event and its message (the engine does it for events it took).
 * Any thread. */
void kf_worker_event_free(kf_worker_event_t *ev);

/* Output retention bounds of a function (functions/retention.c); 0 = no
 * bound of that kind. */
typedef struct kf_retention {
    int64_t max_age_ms;
    int64_t max_rows;
    int64_t max_bytes;
} kf_retention_t;

typedef struct kf_engine_config {
    kf_clock_t clock;     /* default: system clock */
    const void *rng_seed; /* NULL: system entropy */
    size_t rng_seed_len;
    int64_t run_retention_ms;       /* finished runs kept this long; 0 = default */
    int64_t run_attempts_max;       /* leases per run before FAILED; 0 = default */
    int64_t queue_depth_max;        /* inbox bound; 0 = KF_QUEUE_DEPTH_MAX */
    const char *plugin_dir;         /* native handler .so files; NULL = none */
    kf_auth_t *auth;                /* the API-key registry the engine keeps up to date
                                       (borrowed); NULL: a disabled one of its own */
    const char *bootstrap_key_path; /* where a new admin key is written (auth on) */
    bool new_admin_key;             /* make an admin key even if one was made before */
    const char *admin_key_path;     /* the admin key to adopt instead of making one, or NULL */
    /* The registry whose revocations end this engine's open calls of
     * revoked keys (auth/auth.h); NULL: `auth`. A partition's engine, which
     * keeps no keys, watches the home engine's. Borrowed. */
    const kf_auth_t *revocations_auth;
    bool defer_handler_calls; /* tests only: handler calls answer on
                                 kf_core_pump(), like remote ones */
    /* Watches native handler calls (base/watchdog.h); borrowed. NULL: none
     * (deterministic tests); kf_engine_create makes one when it is NULL. */
    struct kf_watchdog *watchdog;
    /* ReplayBatch: input batches kept per REPLAY_SAFE function (0: none;
     * keyflowd's --replay-batches) and bytes they may hold in all (0: the
     * KF_REPLAY_BYTES_DEFAULT; --replay-bytes, of which each of several
     * partitions in a process gets an equal share), within the room the
     * tables leave in memory_budget_bytes. */
    int64_t replay_batches;
    int64_t replay_bytes;
    /* Free bytes kept on the store's filesystem (--disk-reserve); 0 =
     * KF_DISK_RESERVE_BYTES_DEFAULT. */
    uint64_t disk_reserve_bytes;
    /* The partitions whose stores this process writes on that filesystem
     * (the served ones): each engine closes windows into its share of the
     * room above the reserve (runtime/engine.c, disk_room). 0 or 1: all. */
    uint32_t disk_sharing_partitions;
    /* The server's output retention (--output-retention-*), for the bounds
     * a descriptor leaves out. Unset: KF_OUTPUT_RETENTION_MS_DEFAULT of
     * age, no bound on rows or bytes. */
    bool output_retention_set;
    kf_retention_t output_retention;
    /* The memory budget of the engine's tables (--memory-budget, whose
     * default main derives from the cgroup limit); 0 = none. */
    uint64_t memory_budget_bytes;
    /* With several partitions in a process, memory_budget_bytes is this
     * partition's share of the process's --memory-budget: the whole of it
     * and the partitions sharing it, so that a refusal names the flag's
     * value, not a number the operator never gave. 0: not shared. */
    uint64_t memory_budget_process_bytes;
    uint32_t memory_budget_partitions;
    /* Producers idle this long are forgotten (--producer-idle-expiry-ms);
     * 0 = KF_PRODUCER_IDLE_EXPIRY_MS_DEFAULT. */
    int64_t producer_idle_expiry_ms;
    /* Called on the committer thread (or the engine thread, for a write it
     * made itself) when a sync fails. Default: log and abort(). If it
     * returns, the engine acknowledges nothing more and answers every call
     * it holds with the failure (runtime/engine.h, invariant 3); the caller
     * then stops it. */
    void (*on_fatal)(const kf_error_t *err, void *ctx);
    void *on_fatal_ctx;
    /* The partition this engine is (docs/scaling.md): run IDs it makes carry
     * partition_index (base/partition.h). 0 of 1 when the data set has one. */
    uint32_t partition_index;
    uint32_t partition_count;
    /* Where this engine's gauges go (base/metrics.h): partition + 1, or 0 for
     * the home engine and a single store. */
    uint32_t metrics_slot;
} kf_engine_config_t;

#endif
