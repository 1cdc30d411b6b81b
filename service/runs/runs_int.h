/*
 * runs_int.h - what the files of the runs module share: the run table's
 * structs and its state changes (runs.c), used by the RPC handlers (ops.c),
 * the stored forms (records.c) and the run options (policy.c). Not for
 * other modules: runs.h is.
 *
 * Memory holds what the engine must see without a read; the rest is read
 * from the store when a run is touched (kf__run_view_open, kf__run_detail):
 *
 *   run_t          every run in memory: identity, sequence, workflow,
 *                  status, attempts, key limit, queue position (compact)
 *   run_detail_t   timer, lease, retry policy and texts (worker, last
 *                  error, result): LEASED, DELAYED and finished runs, and a
 *                  PENDING run until the write that made it PENDING is
 *                  durable; after that its live record holds them
 *   run_body_t     input, event IDs, kind, creation time: only until the
 *                  write that started the run is durable; after that the
 *                  stored body is read when needed
 *
 * A read of the store sees only durable writes (the committer may still be
 * writing the group before), so whatever a run wrote in a group that is not
 * durable yet stays in memory until it is: the settle lists (rs->bodies,
 * rs->settling) drop it, in group order, at kf_runs_evict.
 *
 * Where a run is, by status:
 *   PENDING  in its workflow's ready queue (wfq_t.pq), or in its key's
 *            blocked queue (keygrp_t.blocked) when the key had no free
 *            slot as a poll reached it; no timer.
 *   LEASED   counted in its key's `leased`; timer at lease expiry.
 *   DELAYED  timer at due_ms.
 *   finished timer at retention's end, until the finishing write is durable
 *            (then forgotten: it lives on disk only).
 * A key's group (keygrp_t) exists while the key has leases or blocked runs.
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
typedef struct run run_t;

/* run_t.flags */
enum {
    RUN_BLOCKED = 1,          /* PENDING in its key's blocked queue */
    RUN_CANCEL_REQUESTED = 2, /* CancelRun of a LEASED run */
    RUN_DELETED = 4,          /* retention ended before the finish was durable:
                                 a tombstone until the deletion is (kf_runs_fire) */
};

typedef struct run_detail {
    kf_timer_t timer;      /* see the table above */
    run_t *run;            /* its run */
    int64_t wakeup_due_ms; /* the stored wake-up, or KF_NO_WAKEUP */
    kf_retry_policy_t retry;
    int64_t due_ms; /* DELAYED: when it becomes PENDING */
    int64_t lease_ms;
    int64_t lease_expires_ms;
    int64_t finished_ms;
    char lease[KF_LEASE_BYTES + 1];            /* the latest lease ("": none or forgotten) */
    char lease_owner[KF_API_KEY_ID_CHARS + 1]; /* API key that took it; "": none */
    char *worker_id;                           /* owned texts; NULL: none */
    char *last_error;                          /* the latest failed attempt's error */
    char *result_json;
    char *error;
    uint64_t group;          /* on rs->settling: durable with this group */
    struct run_detail *prev; /* rs->settling, in group order */
    struct run_detail *next;
} run_detail_t;

typedef struct run_body {
    char *input; /* owned */
    int kind;
    int64_t event_count;
    int64_t created_ms;
    kf_retry_policy_t retry;
    char **event_ids; /* owned, oldest first */
    uint32_t event_id_count;
    int64_t event_ids_dropped;
    run_t *run;
    uint64_t group;        /* the start's: durable with this group */
    struct run_body *next; /* rs->bodies, in group order */
} run_body_t;

struct run {
    kf_map_node_t node; /* by run_id */
    uint64_t seq;
    wfq_t *wf;            /* its workflow */
    run_detail_t *detail; /* see above; NULL: a PENDING run's texts are stored */
    run_body_t *body;     /* NULL: stored */
    int64_t updated_ms;
    kf_pq_node_t queue_node;  /* PENDING: its position in the ready or blocked queue */
    uint16_t key_concurrency; /* this run's rule's; 0: unlimited */
    uint16_t key_len;         /* the key is run_id's first key_len bytes */
    uint8_t status;
    uint8_t attempts; /* leases that counted (a released one does not) */
    uint8_t flags;
    char run_id[]; /* "<key>@<uuid>", NUL-terminated */
};

_Static_assert(KF_RUN_ATTEMPTS_MAX <= UINT8_MAX, "attempts fit run_t.attempts");
_Static_assert(KF_KEY_CONCURRENCY_MAX <= UINT16_MAX, "limits fit run_t.key_concurrency");
_Static_assert(KF_KEY_BYTES_MAX <= UINT16_MAX, "keys fit run_t.key_len");

/* Ready pending runs of one workflow, oldest (lowest run sequence) first.
 * Exists while runs of the workflow are in memory. */
struct wfq {
    kf_map_node_t node; /* by workflow */
    char *workflow;
    kf_pq_t pq;
    uint64_t runs; /* in memory, naming it */
};

/* The leases of one (workflow, key) and the pending runs that wait for a
 * slot. Exists while the key has either. */
struct keygrp {
    kf_map_node_t node; /* by name */
    char *name;         /* workflow '\0' key, owned */
    size_t name_len;
    uint32_t leased;
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
    run_body_t *bodies_head; /* pinned bodies, in group order */
    run_body_t *bodies_tail;
    run_detail_t *settling_head; /* details to drop (PENDING) or runs to forget
                                    (finished) once durable, in group order */
    run_detail_t *settling_tail;
    uint64_t memory_bytes; /* held by runs, details, bodies, queues, groups and hints */
    kf_map_t list_hints;   /* ListRuns's shortcuts past deleted index entries (ops.c) */
    run_t **timed;         /* recovery only: LEASED and DELAYED runs, for their timers */
    size_t timed_count;
    size_t timed_cap;
    kf_key_t sweep_cursor; /* wake-ups before it were swept */
    bool sweep_started;
};

/* ---- memory accounting ----------------------------------------------------------
 *
 * What the table holds, as the memory budget counts it (docs/semantics.md,
 * "Memory budget"): each allocation with malloc's 16-byte header, and the
 * slots a run or entry takes in its map and queue. Erring high is fine;
 * low is not. */

#define ALLOC(bytes) ((bytes) + 16)
#define SLOTS        (3 * sizeof(void *)) /* a map bucket (load <= 1), a queue slot */

/* ---- runs.c: the table and its state changes ---------------------------- */

void kf__runs_publish(const kf_runs_t *rs);
/* --run-attempts, or its default. */
int64_t kf__runs_server_attempts_max(const kf_ctx_t *ctx);
/* Attempts a run with a detail may take. */
int64_t kf__runs_attempts_max(const kf_ctx_t *ctx, const run_t *r);
/* The run in memory, tombstones included (RUN_DELETED). */
run_t *kf__run_find(const kf_runs_t *rs, const char *run_id);
static inline const char *kf__run_workflow(const run_t *r) {
    return r->wf->workflow;
}
/* Gives a PENDING run its detail from its (durable) live record, for a
 * change or a check of its lease; no-op when it has one. Errors: reading
 * the store. */
kf_status_t kf__run_detail(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, kf_error_t *err) KF_MUST_USE;

/* A run in memory as one whole record (`rec`), for the API view and the
 * stale completion checks: what memory holds, plus what is read from the
 * store for it (its body; a PENDING run's texts). Close it to free those. */
typedef struct run_view {
    Keyflow__Records__RunRec rec;
    Keyflow__Records__RetryRec retry;
    Keyflow__Records__RunRec *stored_body;     /* read; owned */
    Keyflow__Records__RunLiveRec *stored_live; /* read; owned */
    char key[KF_KEY_BYTES_MAX + 1];
} run_view_t;

/* Opens the view; with `with_body` false the body's fields (input, kind,
 * event IDs, created_ms) are left empty and nothing of the body is read.
 * Errors: reading the store (KF_E_IO, KF_E_CORRUPT); *v is closed then. */
kf_status_t kf__run_view_open(kf_ctx_t *ctx, const run_t *r, bool with_body, run_view_t *v,
                              kf_error_t *err) KF_MUST_USE;
/* The state fields again from memory, after a change (the run must have its
 * detail, as every change gives it). */
void kf__run_view_refresh(run_view_t *v, const run_t *r);
void kf__run_view_close(run_view_t *v);
/* The API view of a run in memory (open, kf__rec_to_pb, close); NULL with
 * *err set when the store could not be read. */
Keyflow__V1__Run *kf__run_to_pb(kf_arena_t *arena, kf_ctx_t *ctx, const run_t *r, bool with_lease,
                                kf_error_t *err);
/* The API view of a whole record; strings are copied into the arena. The
 * lease token goes only to the worker that holds it. */
Keyflow__V1__Run *kf__rec_to_pb(kf_arena_t *arena, const kf_ctx_t *ctx,
                                const Keyflow__Records__RunRec *rec, bool with_lease);

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
/* Reads the live record of the run `run_id`, sequence `seq`: one this
 * engine wrote for it, or KF_E_CORRUPT. Free with
 * keyflow__records__run_live_rec__free_unpacked. */
kf_status_t kf__run_load_live(kf_ctx_t *ctx, uint64_t seq, const char *run_id,
                              Keyflow__Records__RunLiveRec **out, kf_error_t *err);
/* What retention needs of a stored run not in memory: whether it is there,
 * finished, and where its index entry is. Reads the final state (or, for a
 * whole record of an older build, that record). */
typedef struct kf_stored_final {
    bool found;
    bool finished;
    const char *workflow; /* borrowed from the records below */
    uint64_t seq;
    Keyflow__Records__RunStateRec *state; /* owned */
    Keyflow__Records__RunRec *whole;      /* owned */
} kf_stored_final_t;

kf_status_t kf__run_load_final(kf_ctx_t *ctx, const char *run_id, kf_stored_final_t *out,
                               kf_error_t *err);
void kf__stored_final_free(kf_stored_final_t *f);
/* Whether `run_id` has the shape of a run ID, "<key>@<36-character UUID>";
 * *key_len is then the key's length. */
bool kf__run_id_split(const char *run_id, size_t *key_len);
/* A PENDING run's detail from its live record. */
void kf__detail_from_live(run_detail_t *d, const Keyflow__Records__RunLiveRec *live);
/* Whether a live record is one this engine could have written. */
bool kf__run_live_valid(const Keyflow__Records__RunLiveRec *rec);
/* Writes the body: once, when the run starts (r->body). */
void kf__run_save_body(kf_ctx_t *ctx, const run_t *r);
/* Writes the run's state after a change (r->detail): its live record while
 * it is live; its final state (and the live record's deletion) once it
 * finished. */
void kf__run_save(kf_ctx_t *ctx, const run_t *r);

/* The oldest ready run among `workflows` (all when n == 0), or NULL. */
run_t *kf__runs_oldest_ready(kf_runs_t *rs, char **workflows, size_t n);
/* Whether `r` (ready) may be leased now: its key has a free slot under r's
 * key_concurrency, and no older run of the key waits blocked. */
bool kf__run_may_lease(const kf_runs_t *rs, const run_t *r);
/* Moves a ready run that may not be leased to its key's blocked queue. */
void kf__run_block(kf_runs_t *rs, run_t *r);
/* PENDING -> LEASED; the run has its detail (kf__run_detail). */
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
/* CancelRun of a LEASED run: its worker is asked (HeartbeatRun). */
void kf__run_request_cancel(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r);
/* Extends a LEASED run's lease to now + lease_ms. */
void kf__run_heartbeat(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, int64_t lease_ms);
/* Deletes a finished run's records (retention), and its wake-up at
 * wakeup_due_ms unless that is KF_NO_WAKEUP. */
void kf__run_delete_stored(kf_ctx_t *ctx, const char *run_id, const char *workflow, uint64_t seq,
                           int64_t wakeup_due_ms);

/* ---- recovery (recover.c, with runs.c's part) ------------------------------ */

/* A run enters memory: the table, its workflow; nothing else yet. The
 * run_id has the shape of one (kf__run_id_split gives key_len). NULL when
 * a run with that ID is in memory already (nothing changed). */
run_t *kf__run_new(kf_runs_t *rs, const char *run_id, const char *workflow, size_t key_len,
                   uint64_t seq);
/* Gives `r` an empty detail (no timer armed, no texts) and returns it. */
run_detail_t *kf__detail_new(kf_runs_t *rs, run_t *r);
/* Gives `r` its detail from its live record (copied). */
void kf__detail_load(kf_runs_t *rs, run_t *r, const Keyflow__Records__RunLiveRec *live);
/* A recovered run (status and detail set) joins its queue or counts. A
 * PENDING run's detail, if it has one, goes once the recovery's own write
 * is durable. */
void kf__runs_adopt(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r);
/* Reads the run sequence into rs->next_seq. */
kf_status_t kf__runs_load_seq(kf_runs_t *rs, kf_ctx_t *ctx, kf_error_t *err);

/* ---- ops.c: the RPC handlers' shared parts -------------------------------- */

/* Forgets ListRuns's shortcuts (when too many, and at the end). */
void kf__list_hints_clear(kf_runs_t *rs);

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
