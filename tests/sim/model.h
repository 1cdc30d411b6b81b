/*
 * model.h - the seeded simulation's reference model: what DESIGN.md and
 * docs/semantics.md say the engine's state must be, computed the simple
 * way (arrays and loops, no journals, no heaps, no storage).
 *
 * The driver (keyflow_sim.c) applies every command to the engine and to
 * the model, and compares. Values the engine draws at random (window UUIDs,
 * lease tokens) are learned from the engine's replies and recorded here.
 *
 * Groups and crashes: every change to the model goes through model_save()
 * first, which copies the bytes about to change into an undo log. At a
 * durable group boundary the driver calls model_commit() (the log is
 * dropped); when a group is lost (a crash before its write, or a failed
 * write) model_revert() restores the model to the last durable state,
 * exactly as recovery must restore the engine. Nothing in the model moves
 * in memory after model_create(), so saved pointers stay valid.
 */
#ifndef KF_SIM_MODEL_H
#define KF_SIM_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The simulated world's names: 2 workflows x 4 keys x 2 kinds. */
#define M_WORKFLOWS 2
#define M_KEYS      4
#define M_COORDS    (2 * M_WORKFLOWS * M_KEYS)
/* Batch rules use at most this many events, so a window's inputs fit. */
#define M_BATCH_EVENTS_MAX 8
#define M_IDS_MAX          1024 /* KF_REMEMBERED_IDS_MAX */
#define M_RECENT_MAX       16   /* KF_RECENT_RUNS_MAX */
#define M_JOURNAL_MAX      256  /* KF_JOURNAL_ENTRIES_MAX */
#define M_RUN_ID_BYTES     64
#define M_LEASE_BYTES      40
#define M_EVENT_ID_BYTES   16
#define M_INPUT_BYTES      (M_BATCH_EVENTS_MAX * 24 + 8)
/* Process functions: running_sum (0) and session_counter (1). */
#define M_FNS            2
#define M_FN_KEYS        5 /* < max_timer_callbacks_per_step: no follow-on steps */
#define M_PRODUCERS      3
#define M_ACKS_KEPT      16   /* KF_PRODUCER_ACKS_KEPT */
#define M_SWEEP_SLACK_MS 1000 /* core.c SWEEP_INTERVAL_MS: retention is swept this late */

extern const char *const m_workflow_names[M_WORKFLOWS];
extern const char *const m_key_names[M_KEYS];
extern const char *const m_fn_ids[M_FNS];
extern const char *const m_fn_key_names[M_FN_KEYS];
extern const char *const m_producer_names[M_PRODUCERS];

enum { M_DEBOUNCE = 1, M_BATCH = 2 };               /* keyflow.v1.RuleKind */
enum { M_TRAILING = 1, M_LEADING = 2, M_BOTH = 3 }; /* keyflow.v1.Edge */
enum {
    M_OPENED = 1,
    M_JOINED = 2,
    M_DUPLICATE = 3,
    M_CLOSED = 4,
    M_CANCELLED = 5,
    M_NO_WINDOW = 6
};                                                                   /* keyflow.v1.Disposition */
enum { M_PENDING = 1, M_LEASED = 2, M_COMPLETED = 3, M_FAILED = 4 }; /* keyflow.v1.RunStatus */
enum { M_ABSENT = 1, M_NULL = 2, M_VALUE = 3 };                      /* keyflow.v1.StateKind */
enum { M_FN_RUNNING_SUM = 0, M_FN_SESSION_COUNTER = 1 };

#define M_NO_TIME INT64_MIN

typedef struct m_rule {
    int kind;
    int edge; /* debounce: M_TRAILING, M_LEADING, M_BOTH; batch: M_TRAILING */
    int64_t window_ms;
    int64_t max_wait_ms;
    int64_t max_events;
    int64_t max_bytes; /* batch only */
    int64_t dedup_ms;
} m_rule_t;

/* What makes a retry the same event (docs/semantics.md, "Event identity"). */
typedef struct m_payload {
    m_rule_t rule;
    bool flush;
    int32_t input; /* the event number: its input is {"n":<input>} */
} m_payload_t;

typedef struct m_id {
    char id[M_EVENT_ID_BYTES];
    char run_id[M_RUN_ID_BYTES];
    int64_t due_ms;
    int64_t expires_ms;
    int64_t commit_seq;
    m_payload_t payload;
} m_id_t;

typedef struct m_coord {
    int kind, workflow, key;
    bool open;
    char run_id[M_RUN_ID_BYTES]; /* the open window's run, learned from the first receipt */
    bool run_started;            /* that run started at the leading edge: absorbing */
    int64_t events_absorbed;
    int64_t opened_ms, last_ms, due_ms, event_count;
    m_rule_t rule;
    int32_t events[M_BATCH_EVENTS_MAX]; /* batch: every event; debounce: [0] the latest */
    uint32_t nids;                      /* remembered IDs in ids[coord][0..nids), oldest first */
    int64_t runs_started, journal_seq, journal_len, compactions;
    char recent[M_RECENT_MAX][M_RUN_ID_BYTES];
    uint32_t nrecent;
} m_coord_t;

typedef struct m_run {
    char run_id[M_RUN_ID_BYTES];
    int coord;
    char input[M_INPUT_BYTES];
    int64_t event_count;
    int status;
    int64_t attempts;
    char lease[M_LEASE_BYTES];
    char worker[16];
    int64_t lease_ms, lease_expires_ms;
    int64_t created_ms, updated_ms, finished_ms;
    char result[32]; /* COMPLETED */
    char error[64];  /* FAILED */
} m_run_t;

/* Where an accepted event went: the run its window starts (or would). */
typedef struct m_event {
    int coord;
    char run_id[M_RUN_ID_BYTES];
    bool accepted;
} m_event_t;

typedef struct m_out_row {
    int key;
    int64_t ts_us;
    bool value_null;
    int64_t value;
    int previous; /* running_sum: the state kind the activation saw */
} m_out_row_t;

typedef struct m_ack {
    int64_t sequence;
    int64_t rows_accepted, activations, timer_callbacks, handler_calls;
    int64_t first_output_seq, last_output_seq, watermark_us;
} m_ack_t;

typedef struct m_producer {
    int64_t last_sequence; /* 0: never accepted */
    uint32_t nacks;
    m_ack_t acks[M_ACKS_KEPT]; /* oldest first */
} m_producer_t;

typedef struct m_fn {
    bool registered;
    bool has_watermark;
    int64_t watermark_us;
    int state[M_FN_KEYS];
    int64_t value[M_FN_KEYS];
    int64_t timer_us[M_FN_KEYS]; /* session_counter's "idle", or M_NO_TIME */
    m_producer_t producers[M_PRODUCERS];
    uint64_t nout; /* rows in out[0..nout): seq = index + 1 */
} m_fn_t;

/* One input row of a push (the driver keeps what it sent, for retries). */
typedef struct m_row {
    int key;
    int64_t ts_us;
    bool arg_null;
    int64_t arg; /* running_sum: amount; session_counter: idle_us */
} m_row_t;

typedef struct m_undo m_undo_t;

typedef struct model {
    int64_t retention_ms;
    int64_t attempts_max;
    m_coord_t coords[M_COORDS];
    m_id_t (*ids)[M_IDS_MAX]; /* [M_COORDS][M_IDS_MAX] */
    m_run_t *runs;            /* creation order */
    uint32_t nruns, runs_cap;
    m_event_t *events; /* by event number */
    uint32_t nevents, events_cap;
    m_fn_t fns[M_FNS];
    m_out_row_t *out[M_FNS];
    uint64_t out_cap;
    /* The undo log of the open group. */
    m_undo_t *undo;
    size_t nundo, undo_cap;
    uint8_t *undo_bytes;
    size_t undo_len, undo_bytes_cap;
} model_t;

/* Capacities bound what one seed can create; exceeding one is a driver bug. */
void model_init(model_t *m, uint32_t runs_cap, uint32_t events_cap, uint64_t out_cap,
                int64_t retention_ms, int64_t attempts_max);
void model_deinit(model_t *m);

void model_save(model_t *m, void *p, size_t len);
#define M_SAVE(m, x) model_save((m), &(x), sizeof(x))
void model_commit(model_t *m);
void model_revert(model_t *m);

int m_coord_index(int kind, int workflow, int key);
/* Resolves a rule's defaults, as kf_rule_resolve does for valid rules. */
m_rule_t m_rule_defaults(int kind, int edge, int64_t window_ms, int64_t max_wait_ms,
                         int64_t max_events, int64_t max_bytes, int64_t dedup_ms);
int64_t m_window_due_ms(const m_rule_t *rule, int64_t opened_ms, int64_t last_ms, int64_t count);
/* The coordinator exists at now_ms (open window or a live remembered ID). */
bool m_coord_exists(const model_t *m, int c, int64_t now_ms);
/* The live remembered entry for id, or NULL. */
const m_id_t *m_id_find(const model_t *m, int c, const char *id, int64_t now_ms);
/* The input text a window holds (debounce: the latest; batch: the array). */
void m_window_input(const model_t *m, int c, char *out, size_t cap);

/* ---- coordinator commands (valid requests only) ------------------------ */

/* The JSON text of event n's input, and its length. */
size_t m_event_text(int32_t n, char *out, size_t cap);

typedef struct m_send_result {
    int status;      /* 0, or the kf_status_t refusing it (nothing changed) */
    int disposition; /* M_OPENED .. M_CLOSED */
    bool new_run;    /* the receipt names a new run: its run_id came from the engine */
    char run_id[M_RUN_ID_BYTES];
    int64_t due_ms;
    int64_t commit_seq;
} m_send_result_t;

/* Whether this event, accepted now, begins a new run (opens a window, or
 * begins a BOTH window's trailing run): its run ID is then the engine's. */
bool m_send_new_run(const model_t *m, int c, const char *id, const m_payload_t *payload,
                    int64_t now_ms);
/* SendEvent of a well-formed event; `new_run_id` names the run when
 * m_send_new_run() said so. `commit_seq` is the write the event joins. */
void m_send_event(model_t *m, int c, const char *id, const m_payload_t *payload,
                  const char *new_run_id, int64_t now_ms, int64_t commit_seq, m_send_result_t *out);
/* FlushWindow / CancelWindow: their disposition; run_id and dropped as answered. */
int m_flush(model_t *m, int c, int64_t now_ms, char *run_id);
int m_cancel(model_t *m, int c, int64_t now_ms, char *run_id, int64_t *dropped);

/* Fires everything due at or before now_ms, as the engine's timers do:
 * windows close, leases expire, idle coordinators are deleted. */
void m_tick(model_t *m, int64_t now_ms);
/* The earliest time something in the model is due after now_ms, or INT64_MAX. */
int64_t m_next_due_ms(const model_t *m, int64_t now_ms);

/* ---- runs ---------------------------------------------------------------- */

int m_run_find(const model_t *m, const char *run_id);
/* 1: certainly kept; 0: certainly deleted by retention; -1: being swept. */
int m_run_kept(const model_t *m, int r, int64_t now_ms);
bool m_run_matches(const model_t *m, int r, const int *workflows, int nworkflows);
void m_run_lease(model_t *m, int r, const char *lease, const char *worker, int64_t lease_ms,
                 int64_t now_ms);
void m_run_heartbeat(model_t *m, int r, int64_t lease_ms, int64_t now_ms);
void m_run_finish(model_t *m, int r, bool success, const char *text, int64_t now_ms);

/* ---- process functions ----------------------------------------------------- */

typedef struct m_push_result {
    int status; /* 0 ok, else the kf_status_t expected */
    bool duplicate;
    m_ack_t ack;
} m_push_result_t;

/* A PushBatch with the given content (applied when it is accepted). */
void m_push(model_t *m, int fn, int producer, int64_t sequence, const m_row_t *rows, int nrows,
            bool has_watermark, int64_t watermark_us, m_push_result_t *out);
/* Canonical key order (u32 length, then bytes), as the timer queue orders keys. */
int m_fn_key_cmp(int a, int b);

#endif
