/*
 * runs_int.h - what the files of the runs module share: the run table's
 * structs and its state changes (runs.c), used by the RPC handlers (ops.c)
 * and the run options (policy.c). Not for other modules: runs.h is.
 *
 * Where a run is, by status:
 *   PENDING  in its workflow's ready queue (wfq_t.pq), or in its key's
 *            blocked queue (keygrp_t.blocked) when the key had no free
 *            slot as a poll reached it; no timer.
 *   LEASED   counted in its key's `leased`; timer at lease expiry.
 *   DELAYED  timer at due_ms.
 *   finished timer at retention's end, until the finishing write is durable
 *            (then forgotten: it lives on disk only).
 * Every live run belongs to its key's group (keygrp_t) while it is live.
 *
 * Engine-thread only.
 */
#ifndef KF_RUNS_RUNS_INT_H
#define KF_RUNS_RUNS_INT_H

#include "base/map.h"
#include "base/pq.h"
#include "keyflow/v1/runs.pb-c.h"
#include "runs/runs.h"

enum {
    ST_PENDING = KEYFLOW__V1__RUN_STATUS__RUN_STATUS_PENDING,
    ST_LEASED = KEYFLOW__V1__RUN_STATUS__RUN_STATUS_LEASED,
    ST_COMPLETED = KEYFLOW__V1__RUN_STATUS__RUN_STATUS_COMPLETED,
    ST_FAILED = KEYFLOW__V1__RUN_STATUS__RUN_STATUS_FAILED,
    ST_CANCELLED = KEYFLOW__V1__RUN_STATUS__RUN_STATUS_CANCELLED,
    ST_DELAYED = KEYFLOW__V1__RUN_STATUS__RUN_STATUS_DELAYED,
    ST_WINDOW_OPEN = KEYFLOW__V1__RUN_STATUS__RUN_STATUS_WINDOW_OPEN, /* GetRun only */
};

static inline bool kf__run_finished(int status) {
    return status == ST_COMPLETED || status == ST_FAILED || status == ST_CANCELLED;
}

typedef struct wfq wfq_t;
typedef struct keygrp keygrp_t;

typedef struct run {
    kf_map_node_t node;    /* by run_id */
    kf_timer_t timer;      /* see the table above */
    int64_t wakeup_due_ms; /* the stored wake-up, or KF_NO_WAKEUP */
    char *run_id;          /* owned strings */
    char *workflow;
    char *key;
    int kind;
    char *input;
    int64_t event_count;
    int status;
    int64_t attempts; /* leases that counted (a released one does not) */
    int64_t created_ms;
    int64_t updated_ms;
    char *worker_id;
    char lease[KF_LEASE_BYTES + 1];
    char lease_owner[KF_API_KEY_ID_CHARS + 1]; /* API key that took the lease; "": none */
    int64_t lease_ms;
    int64_t lease_expires_ms;
    char *result_json;
    char *error;
    int64_t finished_ms;
    uint64_t seq;
    int64_t key_concurrency; /* this run's rule's; 0: unlimited */
    kf_retry_policy_t retry;
    int64_t due_ms; /* DELAYED: when it becomes PENDING */
    bool cancel_requested;
    char *last_error;          /* the latest failed attempt's error; NULL: none */
    char **event_ids;          /* owned, oldest first */
    uint32_t event_id_count;   /* <= KF_RUN_EVENT_IDS_MAX */
    int64_t event_ids_dropped; /* earlier ones left out */
    keygrp_t *group;           /* while live */
    wfq_t *queue;              /* PENDING and ready: its workflow's queue */
    bool blocked;              /* PENDING in group->blocked */
    kf_pq_node_t queue_node;   /* position in the queue it is in */
    uint64_t finished_group;   /* group of the finishing write (or of the deletion) */
    bool deleted;              /* retention ended before the finish was durable:
                                  a tombstone until the deletion is (kf_runs_fire) */
    struct run *evict_prev;    /* finished, waiting for durability */
    struct run *evict_next;
    size_t memory_bytes; /* counted in kf_runs.memory_bytes while in by_id */
} run_t;

/* Ready pending runs of one workflow, oldest (lowest run sequence) first. */
struct wfq {
    kf_map_node_t node; /* by workflow */
    char *workflow;
    kf_pq_t pq;
};

/* The live runs of one (workflow, key): its leases and the pending runs
 * that wait for a slot. Exists while the key has live runs. */
struct keygrp {
    kf_map_node_t node; /* by name */
    char *name;         /* workflow '\0' key, owned */
    size_t name_len;
    uint32_t live;   /* PENDING, DELAYED and LEASED runs of the key */
    uint32_t leased; /* of which LEASED */
    kf_pq_t blocked; /* PENDING runs that found no free slot, oldest first */
};

typedef struct poller {
    kf_cmd_t *cmd;
    kf_timer_t timer; /* the long poll's deadline */
    struct poller *prev;
    struct poller *next;
} poller_t;

typedef struct waitlist waitlist_t;

/* A GetRun waiting (wait_ms) for its run to finish. In the command's arena. */
typedef struct waiter {
    kf_cmd_t *cmd;
    kf_timer_t timer; /* KF_TIMER_RUN_WAIT: the wait's deadline */
    waitlist_t *list;
    struct waiter *prev; /* among the waiters of its run ID */
    struct waiter *next;
    struct waiter *all_prev; /* among every waiter (cancellation, shutdown) */
    struct waiter *all_next;
} waiter_t;

/* The waiters of one run ID (which need not exist yet: a window's). */
struct waitlist {
    kf_map_node_t node; /* by run_id */
    char *run_id;       /* owned */
    waiter_t *head;
};

struct kf_runs {
    kf_map_t by_id;
    kf_map_t queues;
    kf_map_t groups;
    uint64_t next_seq;
    uint64_t pending; /* PENDING: ready + blocked */
    uint64_t ready;   /* PENDING in a workflow queue */
    uint64_t leased;
    uint64_t delayed;
    poller_t *polls_head; /* FIFO: the longest waiting poll is served first */
    poller_t *polls_tail;
    uint32_t polls;
    kf_map_t waitlists;
    waiter_t *waiters; /* every waiter */
    uint32_t waiting;
    kf_window_lookup_fn window_lookup;
    void *window_owner;
    run_t *evict_head;
    run_t *evict_tail;
    kf_key_t sweep_cursor; /* wake-ups before it were swept */
    bool sweep_started;
    uint64_t memory_bytes; /* of the runs in by_id (the memory budget) */
};

/* ---- runs.c: the table and its state changes ---------------------------- */

void kf__runs_publish(const kf_runs_t *rs);
int64_t kf__runs_attempts_max(const kf_ctx_t *ctx, const run_t *r);
/* The run in memory, tombstones included (see run_t.deleted). */
run_t *kf__run_find(const kf_runs_t *rs, const char *run_id);
/* The API view; strings are copied into the arena. The lease token goes
 * only to the worker that holds it. */
Keyflow__V1__Run *kf__run_to_pb(kf_arena_t *arena, const kf_ctx_t *ctx, const run_t *r,
                                bool with_lease);
Keyflow__V1__Run *kf__rec_to_pb(kf_arena_t *arena, const kf_ctx_t *ctx,
                                const Keyflow__Records__RunRec *rec, bool with_lease);
/* The run as one whole record (the view kf__rec_to_pb and the stale
 * completion checks read); it borrows r's strings and `retry`. */
void kf__run_to_rec(const run_t *r, Keyflow__Records__RunRec *rec,
                    Keyflow__Records__RetryRec *retry);

/* ---- records.c: stored forms ---------------------------------------------- */

enum {
    KF_RUN_LAYOUT_WHOLE = 0, /* RunRec of older builds: body and state */
    KF_RUN_LAYOUT_SPLIT = 1, /* RunRec is the body; RunLiveRec / RunStateRec the state */
};

/* A run read back from the store: its body and, once finished, its final
 * state, merged into `view` (a whole record borrowing from both). */
typedef struct kf_stored_run {
    Keyflow__Records__RunRec *body;       /* owned */
    Keyflow__Records__RunStateRec *state; /* owned; NULL: the body is a whole record */
    Keyflow__Records__RunRec view;
} kf_stored_run_t;

/* Reads a run that is not in memory (a finished one: live runs are all in
 * memory). *out NULL when there is none; KF_E_CORRUPT for records this
 * engine could not have written. Free with kf__stored_run_free. */
kf_status_t kf__run_load(kf_ctx_t *ctx, const char *run_id, kf_stored_run_t **out, kf_error_t *err);
void kf__stored_run_free(kf_stored_run_t *s);
/* Reads a run's body alone (its body fields are checked, whatever the
 * layout). *out NULL when there is none. Free with
 * keyflow__records__run_rec__free_unpacked. */
kf_status_t kf__run_load_body(kf_ctx_t *ctx, const char *run_id, Keyflow__Records__RunRec **out,
                              kf_error_t *err);
/* A live run's state into a body's view (both borrowed by it). */
void kf__overlay_live(Keyflow__Records__RunRec *view, const Keyflow__Records__RunLiveRec *live);
/* Whether a live record is one this engine could have written. */
bool kf__run_live_valid(const Keyflow__Records__RunLiveRec *rec);
/* The records of runs.c's table; each borrows r's strings and `retry`. */
void kf__run_to_body(const run_t *r, Keyflow__Records__RunRec *rec,
                     Keyflow__Records__RetryRec *retry);
void kf__run_to_live(const run_t *r, Keyflow__Records__RunLiveRec *rec,
                     Keyflow__Records__RetryRec *retry);
void kf__run_to_state(const run_t *r, Keyflow__Records__RunStateRec *rec);
/* Writes the body: once, when the run starts. */
void kf__run_save_body(kf_ctx_t *ctx, const run_t *r);
/* Writes the run's state after a change: its live record while it is live;
 * its final state (and the live record's deletion) once it finished. */
void kf__run_save(kf_ctx_t *ctx, const run_t *r);

/* The oldest ready run among `workflows` (all when n == 0), or NULL. */
run_t *kf__runs_oldest_ready(kf_runs_t *rs, char **workflows, size_t n);
/* Whether `r` (ready) may be leased now: its key has a free slot under r's
 * key_concurrency, and no older run of the key waits blocked. */
bool kf__run_may_lease(const run_t *r);
/* Moves a ready run that may not be leased to its key's blocked queue. */
void kf__run_block(kf_runs_t *rs, run_t *r);
/* PENDING -> LEASED. */
void kf__run_lease(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, const char *worker_id,
                   const kf_principal_t *owner, int64_t lease_ms);
/* LEASED -> PENDING at once, the attempt not counted (ReleaseRun); a run
 * whose cancellation was asked is CANCELLED instead. */
void kf__run_release(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r);
/* A failed attempt of a LEASED run (`error`: what failed): retried under
 * its policy (DELAYED for the backoff, or PENDING), or FAILED when no
 * attempt is left, or CANCELLED when that was asked. `keep_lease`: a retry
 * of the same completion is recognised by its lease. */
void kf__run_attempt_failed(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, const char *error,
                            bool keep_lease);
/* Any live status -> COMPLETED, FAILED or CANCELLED; answers the run's
 * GetRun waiters. `result` and `error` are copied (NULL: none). */
void kf__run_finish(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, int status, const char *result,
                    const char *error);
/* Hands ready runs to parked polls, longest waiting first. */
void kf__runs_serve_parked(kf_runs_t *rs, kf_ctx_t *ctx);

/* ---- ops.c: the RPC handlers' shared parts -------------------------------- */

/* Answers every GetRun waiting for `run_id`: with `r` (as it is now), or
 * NOT_FOUND when r is NULL. */
void kf__runs_wake(kf_runs_t *rs, kf_ctx_t *ctx, const char *run_id, const run_t *r);
/* Answers one waiter (its deadline passed, or shutdown) with its run as it
 * is now. */
void kf__waiter_answer(kf_runs_t *rs, kf_ctx_t *ctx, waiter_t *w);
void kf__poll_unlink(kf_runs_t *rs, poller_t *p);
bool kf__waiter_cancel(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd, uint64_t id);

/* ---- policy.c: retry policies in run records ------------------------------ */

/* *out points at `storage`, or NULL for KF_RETRY_POLICY_NONE (an older
 * record's shape). */
void kf__retry_to_rec(const kf_retry_policy_t *p, Keyflow__Records__RetryRec *storage,
                      Keyflow__Records__RetryRec **out);
/* False for a policy resolve could not have produced. */
bool kf__retry_from_rec(const Keyflow__Records__RetryRec *rec, kf_retry_policy_t *out);

#endif
