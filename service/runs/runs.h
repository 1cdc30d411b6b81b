/*
 * runs.h - runs started by closing windows, and the workers that take them.
 *
 *                kf_runs_start                     lease (poll: a slot of its key free)
 *   (window) --+-----------------------> PENDING ------------------------------> LEASED
 *              | start_after_ms            ^  ^  release (attempt not counted)    | | | |
 *              +------------> DELAYED -----+  +-----------------------------------+ | | |
 *                  due_ms      ^    | cancel                                        | | |
 *                              |    v                                               | | |
 *                              | CANCELLED <-- cancel (PENDING, DELAYED; or LEASED -+ | |
 *                              |               with cancel requested, at completion,  | |
 *                              |               release or lease expiry)               | |
 *                              +-- retryable error or lease expiry, attempts left ----+ |
 *                                  (DELAYED for the backoff; PENDING when it is 0)      |
 *   LEASED --(result)--> COMPLETED;  --(error, or no attempts left)--> FAILED ---------+
 *   COMPLETED/FAILED/CANCELLED --(retention ends)--> deleted
 *
 * Invariants
 *   1. A run is created in the same write that closes its window, exactly
 *      once (the coordinator journal records it; replay never re-creates).
 *   2. Live runs (PENDING, DELAYED, LEASED) are in memory and each has a
 *      live record (run_live); finished runs stay in memory only until their
 *      finishing write is durable, then live on disk until retention
 *      deletes them. A run's body (its input, event IDs, options) is written
 *      once, when it starts; state changes write its small live record, and
 *      its finish a final state record (runs_int.h, records.c). Memory keeps
 *      a run's compact state (identity, sequence, status, key limit, queue
 *      position; a lease's or delay's timer and texts); bodies, and a
 *      PENDING run's texts, are read from the store when touched, except
 *      while the write that changed them is not durable yet.
 *   3. A lease is a fresh UUID per attempt; completing, heartbeating or
 *      releasing with any other lease is FAILED_PRECONDITION and changes
 *      nothing.
 *   4. Pending runs are handed out oldest first (by run sequence), so a
 *      retried run goes ahead of newer ones; among the runs of one
 *      (workflow, key), a run whose key holds key_concurrency leases waits,
 *      and so do the key's later runs (they are leased in order).
 *   5. A DELAYED run and a LEASED one have a timer (and a stored wake-up)
 *      at their due time and lease expiry; a PENDING one has none.
 *
 * Engine-thread only.
 */
#ifndef KF_RUNS_RUNS_H
#define KF_RUNS_RUNS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/arena.h"
#include "base/status.h"
#include "keyflow/v1/coordinators.pb-c.h"
#include "records/records.pb-c.h"
#include "step/ctx.h"

typedef struct kf_runs kf_runs_t;

/* ---- run options (policy.c) ----------------------------------------------
 *
 * A rule carries options for its window's run: key_concurrency (leases of
 * the key at once, 0 = unlimited), a retry policy and start_after_ms. After
 * a failed attempt (a retryable error, an expired lease) with attempts
 * left, the run waits
 *     min(initial_backoff_ms * multiplier^(attempt - 1), max_backoff_ms)
 * (DELAYED; PENDING at once when that is 0). */
typedef struct kf_retry_policy {
    int64_t max_attempts;       /* 0: the server's --run-attempts */
    int64_t initial_backoff_ms; /* 0: retry at once */
    int64_t max_backoff_ms;     /* >= initial_backoff_ms */
    double multiplier;          /* 1..KF_BACKOFF_MULTIPLIER_MAX (0 in the NONE policy) */
} kf_retry_policy_t;

/* A rule without a policy: --run-attempts attempts, no backoff (what every
 * run did before retry policies). All zeros, so a zeroed kf_run_options_t
 * is a rule without options. */
#define KF_RETRY_POLICY_NONE ((kf_retry_policy_t){0, 0, 0, 0})

typedef struct kf_run_options {
    int64_t key_concurrency; /* 0: unlimited */
    kf_retry_policy_t retry;
    int64_t start_after_ms;
} kf_run_options_t;

/* Validates a request rule's run options and applies the defaults; `field`
 * names the rule in errors ("event.rule"). */
kf_status_t kf_run_options_resolve(const Keyflow__V1__Rule *rule, const char *field,
                                   kf_run_options_t *out, kf_error_t *err) KF_MUST_USE;
/* Into a stored rule; `retry` is storage the record may point at (it must
 * outlive the record's encoding). */
void kf_run_options_to_rule_rec(const kf_run_options_t *o, Keyflow__Records__RuleRec *rec,
                                Keyflow__Records__RetryRec *retry);
/* From a stored rule; false when the record is outside what resolve could
 * produce (not written by this engine). Older records read as no options. */
bool kf_run_options_from_rule_rec(const Keyflow__Records__RuleRec *rec, kf_run_options_t *out);
/* Into an API rule (DescribeCoordinator); allocations in `arena`. */
void kf_run_options_to_rule(kf_arena_t *arena, const kf_run_options_t *o, Keyflow__V1__Rule *r);
/* The wait after failed attempt number `attempt` (>= 1). */
int64_t kf_retry_backoff_ms(const kf_retry_policy_t *p, int64_t attempt);
/* Attempts a run may take under `p`. */
int64_t kf_retry_attempts_max(const kf_retry_policy_t *p, int64_t server_default);

kf_runs_t *kf_runs_create(void);
void kf_runs_destroy(kf_runs_t *runs);

/* Loads live runs, the run sequence and run wake-ups' owners. */
kf_status_t kf_runs_recover(kf_runs_t *runs, kf_ctx_t *ctx, kf_error_t *err) KF_MUST_USE;
/* A stored wake-up for `run_id` was found at start: arm it, or return false
 * when no live or in-memory run owns it (the caller leaves it to the sweep). */
bool kf_runs_attach_wakeup(kf_runs_t *runs, kf_ctx_t *ctx, const char *run_id, size_t len,
                           int64_t due_ms);

/* ---- event IDs a run holds (event_ids.c) ----------------------------------
 *
 * A window collects the IDs of its events for its run: the latest
 * KF_RUN_EVENT_IDS_MAX, oldest first, and a count of the earlier ones left
 * out (bounded as the coordinator's journal is). */
typedef struct kf_event_ids {
    char **ring; /* owned strings; NULL until the first push */
    uint32_t cap;
    uint32_t head; /* the oldest */
    uint32_t count;
    int64_t dropped;
} kf_event_ids_t;

/* Copies `id` in; forgets the oldest past KF_RUN_EVENT_IDS_MAX. */
void kf_event_ids_push(kf_event_ids_t *e, const char *id);
/* Frees everything; *e is empty again. */
void kf_event_ids_clear(kf_event_ids_t *e);
/* The IDs oldest first into out[] (room for KF_RUN_EVENT_IDS_MAX); the
 * pointers are borrowed until the next push or clear. Returns the count. */
uint32_t kf_event_ids_list(const kf_event_ids_t *e, const char **out);

/* What a closing window hands over. Borrowed for the call. */
typedef struct kf_run_spec {
    const char *run_id;
    const char *workflow;
    const char *key;
    int kind; /* keyflow.v1.RuleKind */
    const char *input;
    size_t input_len;
    int64_t event_count;
    kf_run_options_t options;
    const char *const *event_ids; /* the latest ones, oldest first */
    uint32_t event_id_count;      /* <= KF_RUN_EVENT_IDS_MAX */
    int64_t event_ids_dropped;    /* earlier IDs left out */
} kf_run_spec_t;

/* Estimated bytes of the runs in memory (the memory budget): runs, their
 * details and bodies not yet durable, workflows and key groups (runs.c,
 * "memory accounting"). Whoever changes what a run holds keeps it true. */
uint64_t kf_runs_memory_bytes(const kf_runs_t *runs);

/* True when one more live run would pass KF_LIVE_RUNS_MAX. */
bool kf_runs_full(const kf_runs_t *runs);
/* True when `count` more live runs fit under KF_LIVE_RUNS_MAX. */
bool kf_runs_room(const kf_runs_t *runs, uint32_t count);
/* Whether a pending or leased run has this ID (recovery's consistency check). */
bool kf_runs_live(const kf_runs_t *runs, const char *run_id);
/* Creates a PENDING run (DELAYED with options.start_after_ms) and returns
 * its sequence number (journalled by the caller). Hands it to a parked poll
 * at once when one matches. */
uint64_t kf_runs_start(kf_runs_t *runs, kf_ctx_t *ctx, const kf_run_spec_t *spec);

void kf_runs_poll(kf_runs_t *runs, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_runs_heartbeat(kf_runs_t *runs, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_runs_complete(kf_runs_t *runs, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_runs_release(kf_runs_t *runs, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_runs_get(kf_runs_t *runs, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_runs_list(kf_runs_t *runs, kf_ctx_t *ctx, kf_cmd_t *cmd);
/* A move of ListRuns's iterator at least this slow leaves a shortcut
 * (ops.c); KF_LIST_HINT_LEARN_US unless a test sets it (0: every move).
 * Process-wide. */
void kf_runs_list_hints_learn_us(int64_t us);
void kf_runs_cancel(kf_runs_t *runs, kf_ctx_t *ctx, kf_cmd_t *cmd);

/* ---- windows: runs that do not exist yet ---------------------------------
 *
 * A receipt names its run before the window closes. GetRun asks the
 * coordinators through this seam (the coordinators sit above runs), and
 * they tell runs when a window is dropped, so a GetRun waiting for a run
 * that will never exist is answered. */
typedef struct kf_open_window {
    const char *workflow; /* borrowed until the engine's next change */
    const char *key;
    int kind; /* keyflow.v1.RuleKind */
    int64_t opened_ms;
    int64_t last_ms;
    int64_t due_ms;
    int64_t event_count;
} kf_open_window_t;

/* Fills *out and returns true when `run_id` names an open window. */
typedef bool (*kf_window_lookup_fn)(void *owner, const char *run_id, kf_open_window_t *out);
/* `owner` is borrowed and outlives `runs`. */
void kf_runs_set_window_lookup(kf_runs_t *runs, kf_window_lookup_fn fn, void *owner);
/* The open window of `run_id` was dropped (CancelWindow): its run will
 * never exist; GetRun calls waiting for it are answered NOT_FOUND. */
void kf_runs_window_dropped(kf_runs_t *runs, kf_ctx_t *ctx, const char *run_id);

/* After wake-ups are attached: arms leased runs that had none. */
void kf_runs_finish_recovery(kf_runs_t *runs, kf_ctx_t *ctx);

/* A KF_TIMER_RUN, KF_TIMER_POLL or KF_TIMER_RUN_WAIT timer fired (already
 * disarmed). */
void kf_runs_fire(kf_runs_t *runs, kf_ctx_t *ctx, kf_timer_t *timer);
/* Deletes finished runs whose retention ended and that are no longer in
 * memory, found through the wake-up family; at most `limit` per call.
 * Returns how many it examined. */
uint32_t kf_runs_sweep(kf_runs_t *runs, kf_ctx_t *ctx, uint32_t limit);
/* Forgets finished runs whose finishing write is durable. */
void kf_runs_evict(kf_runs_t *runs, kf_ctx_t *ctx);
/* Answers a parked poll or GetRun wait with KF_E_CANCELLED; false when
 * `cmd` (with `id`) is not one of them. Only pointers are compared until
 * found. */
bool kf_runs_cancel_poll(kf_runs_t *runs, kf_ctx_t *ctx, kf_cmd_t *cmd, uint64_t id);
/* Answers every parked poll and GetRun wait whose key was revoked with
 * KF_E_UNAUTHENTICATED (auth/auth.h). */
void kf_runs_end_revoked(kf_runs_t *runs, kf_ctx_t *ctx);
/* Answers every parked poll (empty) and GetRun wait (the run as it is) -
 * at shutdown. */
void kf_runs_release_polls(kf_runs_t *runs, kf_ctx_t *ctx);

/* Counts for metrics and tests. */
uint64_t kf_runs_pending(const kf_runs_t *runs);
uint64_t kf_runs_leased(const kf_runs_t *runs);
uint64_t kf_runs_delayed(const kf_runs_t *runs);

#endif
