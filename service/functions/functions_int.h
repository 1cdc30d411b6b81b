/*
 * functions_int.h - private to service/functions: the in-memory model of
 * process functions and the seams between the files that implement
 * functions.h. Nothing outside service/functions includes it.
 *
 * Files
 *   registry.c  the function table: create/destroy, RegisterFunction,
 *               GetFunction, ListFunctions, the checks every RPC shares.
 *   keys.c      per-key value state and event-time timers in memory, the
 *               canonical key of a row, GetKeyState.
 *   host.c      the handler host: the kf_host_t a handler builds its
 *               response through, and the hosts that send a call out and
 *               bring its response back (native, deferred).
 *   remote.c    the remote host: workers on the Workers stream (their
 *               hellos, calls out with deadlines, results recorded through
 *               the same kf_host_t, worker loss).
 *   step.c      PushBatch: producers, the step machine (activations,
 *               validation, apply, due timers), undo and the commit.
 *   output.c    ReadOutput: durable output, parked reads.
 *   retention.c output retention: TrimOutput, the sweep that trims.
 *   retire.c    DeleteFunction, DeleteProducer, producers' idle expiry.
 *   memory.c    what functions hold in memory, for the memory budget.
 *   recovery.c  loading functions, state, timers and producers from the store.
 *
 * Stored layout (prefix = the function's index, u32 big-endian):
 *   functions       function_id                         -> FunctionRec
 *   checkpoints     prefix                              -> CheckpointRec
 *   state           prefix | canonical key              -> kind u8 | value be64
 *   timers_by_key   prefix | lp(key) | lp(name)         -> ord(at_us) be64
 *   timers_by_time  prefix | ord(at_us) | lp(key) | lp(name) -> (empty)
 *   output          prefix | last_seq be64              -> RowBatch (a chunk)
 *   output_marks    prefix | last_seq be64              -> written_ms be64 |
 *                                                          bytes be64 | rows be32
 *   producers       prefix | producer_id                -> ProducerRec
 *   meta            "fn_index"                          -> next index be32
 *
 * Undo: the first time a step touches a key it snapshots the key (state and
 * timers). Commit diffs each touched key against its snapshot and writes
 * only what changed; rollback restores the snapshots and the function's
 * counters, so a refused step leaves memory exactly as it found it.
 *
 * A handler call and its host (the seam a remote host plugs into):
 *
 *   step.c step_advance --kf__call_send(call)--> fn->host->send(fns, fn, call)
 *     KF__CALL_ANSWERED  the response is already recorded in `call` (native):
 *                        step.c takes it at once
 *     KF__CALL_OUT       the step waits (step->awaiting) and holds the
 *                        function; batches queue behind it. Later the host
 *                        records the response into the same `call`, through
 *                        kf__host_abi's builder functions or kf__call_fail(),
 *                        sets call->answered and calls
 *                        kf__step_resume(fns, ctx, fn)
 *   step.c take_response: validate the whole response, apply, check the
 *   function's limits, append the call's output rows to the step's.
 *
 * A host that pipelines (remote) takes several calls of a step at once,
 * up to host->room(): step.c then builds calls whose keys are disjoint from
 * every call out (looking ahead past rows whose key is busy), takes the
 * responses in the order the calls went out, and puts the step's output
 * back into input-row order before it commits, so the output is what one
 * call at a time would have produced.
 *
 * Every function here runs on the engine thread.
 */
#ifndef KF_FUNCTIONS_FUNCTIONS_INT_H
#define KF_FUNCTIONS_FUNCTIONS_INT_H

#include <stdlib.h>

#include "base/assert.h"
#include "base/limits.h"
#include "base/map.h"
#include "base/ostree.h"
#include "base/pq.h"
#include "functions/descriptor.h"
#include "functions/functions.h"
#include "functions/plugin.h"
#include "functions/rows.h"
#include "keyflow/handler.h"
#include "records/records.pb-c.h"
#include "storage/keys.h"

/* The longest stored key of a function (the layout above): a timer by time,
 * prefix u32 | ord(at_us) be64 | lp(canonical key) | lp(timer name). Every
 * key the engine admits (KF_FUNCTION_KEY_BYTES_MAX) must fit the store's
 * key builders, which abort on a key that does not. */
_Static_assert(4 + 8 + 2 + KF_FUNCTION_KEY_BYTES_MAX + 2 + KF_FIELD_NAME_BYTES_MAX <=
                   KF_STORE_KEY_BYTES_MAX,
               "a function's longest stored key fits");

/* "No timer" inside; also the watermark before the first one. */
#define KF__NO_TIME             INT64_MIN
#define KF__STATE_CODEC_VERSION 2
#define KF__FN_INDEX_KEY        "fn_index" /* meta: the next function index */

/* ---- in-memory structures ---------------------------------------------- */

typedef struct function function_t;
typedef struct fn_key fn_key_t;
typedef struct step step_t;
typedef struct kf__handler_host kf__handler_host_t;

typedef struct ev_timer {
    fn_key_t *owner;
    uint8_t name; /* index into the descriptor's timer_names */
    int64_t at_us;
    kf_ostree_node_t node; /* position in the function's timer tree */
} ev_timer_t;

struct fn_key {
    kf_map_node_t node; /* by canonical key */
    uint8_t *key;       /* canonical key, owned */
    uint32_t key_len;
    char *key_text; /* owned */
    uint32_t key_text_len;
    uint8_t state;   /* KF_STATE_* */
    uint8_t in_call; /* in a handler call that is out (pipelining) */
    int64_t value;
    int64_t expires_us;    /* state_ttl_us: when the value expires, or KF__NO_TIME */
    kf_pq_node_t ttl_node; /* in the function's expiry queue while expires_us is set */
    ev_timer_t **timers;   /* one slot per timer name, NULL until needed */
    uint8_t ntimers;       /* timers set */
    uint32_t cost;         /* what the key adds to state_bytes (keys.c key_cost) */
    uint32_t step_mark;    /* the step that snapshotted this key */
    uint32_t call_mark;    /* the handler call that holds this key */
};

typedef struct producer {
    kf_map_node_t node;
    char *id;
    char owner[KF_API_KEY_ID_CHARS + 1]; /* API key that first pushed; "": none */
    int64_t last_sequence;
    uint32_t nacks; /* ring of the last acks, oldest first */
    int64_t ack_seq[KF_PRODUCER_ACKS_KEPT];
    uint8_t *ack[KF_PRODUCER_ACKS_KEPT];
    size_t ack_len[KF_PRODUCER_ACKS_KEPT];
    /* What each acknowledged batch held (kf__batch_digest); an ack stored
     * before digests were kept has none and answers any retry. */
    uint8_t ack_digest[KF_PRODUCER_ACKS_KEPT][KF_SHA256_BYTES];
    bool ack_has_digest[KF_PRODUCER_ACKS_KEPT];
    int64_t last_used_ms;   /* its last batch (retire.c: idle expiry) */
    struct producer *older; /* the function's producers by last use, oldest first */
    struct producer *newer;
} producer_t;

/* A kept input batch (replay.c), in its function's list and the engine's. */
typedef struct replay_rec {
    struct replay_rec *prev; /* kf_functions_t's list, oldest first */
    struct replay_rec *next;
    struct replay_rec *fn_prev; /* the function's list, oldest first */
    struct replay_rec *fn_next;
    struct function *fn;
    char *producer_id;
    int64_t sequence;
    uint8_t *bytes; /* a packed keyflow.records.ReplayRec */
    size_t len;
} replay_rec_t;

typedef struct reader {
    kf_cmd_t *cmd;
    function_t *fn;
    kf_timer_t timer;
    struct reader *next;
    struct reader *prev;
} reader_t;

struct function {
    kf_map_node_t node; /* by function_id */
    char *id;
    uint32_t index;
    kf_arena_t arena; /* the canonical descriptor lives here */
    Keyflow__V1__FunctionDescriptor *desc;
    char sha256[KF_SHA256_HEX_BYTES + 1];
    int64_t created_ms;
    kf_fn_limits_t limits;
    /* Placement (docs/scaling.md): a SINGLE function's keys are all in its
     * home partition; a SPLIT one's are spread by key, and this partition
     * holds its share of max_keys, max_timers and max_state_bytes, so the
     * shares of all partitions add up to the function's limits. */
    bool split;
    uint32_t home;             /* SINGLE: the partition that holds every key */
    int64_t share_keys;        /* this partition's part of limits.max_keys */
    int64_t share_timers;      /* ... of limits.max_timers */
    int64_t share_state_bytes; /* ... of limits.max_state_bytes */
    int key_cols[KF_KEY_COLUMNS_MAX];
    int nkey_cols;
    int event_col;
    int out_event_col;
    const kf__handler_host_t *host; /* NULL: unavailable (see `unavailable`) */
    struct kf__worker *workers;     /* REMOTE: workers serving it (remote.c) */
    uint32_t nworkers;
    const kf_handler_t *handler; /* the native handler the host invokes */
    const char *watch_what;      /* names its calls to the watchdog (in `arena`) */
    char unavailable[KF_ERROR_MESSAGE_BYTES_MAX];
    kf_map_t keys;
    uint64_t live_keys; /* keys with state or timers */
    uint64_t timer_count;
    uint64_t state_bytes;
    kf_ostree_t timers; /* event-time timers, (at_us, key, name) order */
    kf_pq_t expiries;   /* keys whose value expires (state_ttl_us), (expires_us, key) order */
    uint32_t timer_name_len[KF_TIMER_NAMES_MAX];
    bool has_watermark;
    int64_t watermark_us;
    uint64_t next_activation;
    uint64_t output_seq;         /* last written */
    uint64_t durable_output_seq; /* last durable */
    uint64_t trimmed_seq;        /* rows <= it are gone for readers (retention.c) */
    uint64_t purged_seq;         /* chunks ending <= it are deleted from disk */
    uint64_t retained_bytes;     /* stored bytes of the chunks after purged_seq */
    kf_map_t producers;
    producer_t *oldest_producer; /* by last use (retire.c) */
    producer_t *newest_producer;
    reader_t *readers;    /* parked reads */
    struct step *active;  /* the step in progress (its call may be out) */
    kf_cmd_t *queue_head; /* PushBatch commands waiting (step.c invariant 3) */
    kf_cmd_t *queue_tail;
    uint32_t queued;
    /* In fns' due list: may have due timers for follow-on steps. */
    struct function *due_next;
    struct function *due_prev;
    bool in_due;
    /* Why the last follow-on step was refused ("" when it was not): follow-on
     * steps then stop until a PushBatch step succeeds. */
    char due_error[KF_ERROR_MESSAGE_BYTES_MAX];
    /* due_error says why the last attempt failed, but the follow-on steps
     * go on once a worker can take them (its worker was lost). */
    bool due_retry;
    replay_rec_t *replay_head; /* kept input batches (replay.c), oldest first */
    replay_rec_t *replay_tail;
    uint32_t replay_count;
};

typedef struct pending_durable {
    function_t *fn;
    uint64_t group;
    uint64_t output_seq;
} pending_durable_t;

struct kf_functions {
    const kf_engine_config_t *config; /* borrowed from the core */
    kf_map_t by_id;
    kf_plugins_t *plugins;
    uint32_t next_index;      /* the index the next registration takes */
    bool index_counter_found; /* recovery: next_index came from the store */
    uint32_t step_counter;
    uint32_t call_counter;
    pending_durable_t *pending; /* output written in groups not yet durable */
    size_t npending;
    size_t pending_cap;
    uint32_t nreaders;
    uint8_t *scratch; /* canonical key building */
    size_t scratch_cap;
    bool defer_calls; /* test seam: native calls answer on pump() */
    kf_map_t workers; /* remote.c: every worker stream, by its link */
    uint64_t next_call_id;
    uint64_t next_worker_id;
    uint32_t serving_workers; /* over every function (a gauge) */
    function_t *due_head;     /* functions that may have due timers, round robin */
    function_t *due_tail;
    replay_rec_t *replay_head; /* every kept input batch, oldest first (replay.c) */
    replay_rec_t *replay_tail;
    uint64_t replay_bytes;
    uint32_t sweep_start; /* retention.c: the function the next sweep starts at */
};

/* ---- a step: one PushBatch or a follow-on timer step, with its undo log */

typedef struct undo {
    fn_key_t *key;
    bool existed;
    uint8_t state;
    int64_t value;
    int64_t expires_us;
    int64_t at[KF_TIMER_NAMES_MAX];
} undo_t;

struct step {
    kf_functions_t *fns;
    function_t *fn;
    kf_ctx_t *ctx;
    kf_arena_t *arena;
    const kf_rows_t *rows;
    int64_t watermark; /* for timer validation and the handler */
    bool has_watermark;
    uint32_t mark;
    undo_t *undo;
    size_t nundo;
    size_t undo_cap;
    kf_outbuf_t out; /* every output row of the step */
    /* function counters at the start, restored on rollback */
    uint64_t live_keys0, timer_count0, state_bytes0, next_activation0;
    uint64_t due_timers0; /* due timers before the step (GetFunction meanwhile) */
    int64_t activations;
    int64_t timer_callbacks;
    int64_t expired; /* values cleared by state_ttl_us */
    int64_t calls;
    kf_error_t *err;
    /* The step as a resumable machine: one handler call out at a time. */
    kf_cmd_t *cmd; /* the PushBatch being answered; NULL in a follow-on step */
    const Keyflow__V1__PushBatchRequest *req; /* NULL in a follow-on step */
    kf_rows_t rows_storage;
    uint8_t digest[KF_SHA256_BYTES]; /* of the PushBatch's rows and watermark */
    bool timers_phase;               /* rows done, watermark advanced */
    bool dry;                        /* DryRunBatch: answered with its effects, rolled back */
    /* ReplayBatch: the record the step runs again, on a scratch function;
     * answered with the comparison, rolled back, never committed. */
    const Keyflow__Records__ReplayRec *replay;
    uint32_t row_pos; /* next input row (one call at a time) */
    bool awaiting;    /* a call is out, or the host has no room: waiting */
    /* Calls out, oldest first (a ring); responses are taken in this order. */
    kf_call_t *calls_out[KF_FN_CALLS_IN_FLIGHT_MAX];
    uint32_t out_head;
    uint32_t nout;
    kf_call_t *spare; /* calls to reuse (linked by next_spare) */
    /* Pipelining (host->pipelines): the rows not yet in a call as a list
     * in row order, each row's key once looked up, and the input row of
     * each output row, to restore input order at the end. */
    bool lookahead;
    bool reordered;     /* a call took a row before an earlier one */
    uint32_t *next_row; /* next unassigned row after each row */
    uint32_t first_row; /* first unassigned row (rows->count: none) */
    fn_key_t **row_key;
    uint32_t *out_row; /* per step output row: its activation's input row */
    uint32_t out_row_cap;
    /* The last timer fired (owner NULL: none yet); its key lives until the
     * step ends. */
    struct {
        fn_key_t *owner;
        uint8_t name;
        int64_t at_us;
    } last_fired;
    /* Set by the commit: the stored timers_by_time records before this due
     * time (the last fired timer's; KF__NO_TIME: none) go with one range
     * delete (step.c, delete_fired_span). */
    int64_t fired_before_us;
    /* The earliest timer's due time when the step started (KF__NO_TIME:
     * none): no stored timers_by_time record comes before it, so the
     * step's range delete starts there (step.c, delete_fired_span). */
    int64_t first_timer_at0;
    int64_t busy_us;    /* engine time so far (not while a call is out) */
    int64_t resumed_us; /* when the engine last took the step up */
    /* A follow-on step owns its memory: its arena and error. */
    kf_arena_t own_arena;
    kf_error_t own_error;
};

/* ---- a handler call: its activations and the response being built ------ */

enum { KF__MUT_UNCHANGED, KF__MUT_SET, KF__MUT_SET_NULL, KF__MUT_CLEAR };
enum { KF__TOP_SET = 1, KF__TOP_CANCEL = 2 };

typedef struct result {
    uint8_t mutation;
    uint8_t mutations; /* how many mutations were asked for */
    int64_t value;
} result_t;

typedef struct timer_op {
    uint32_t act;
    uint8_t op;
    int name; /* index, or -1: undeclared */
    int64_t at_us;
} timer_op_t;

/* Lives in the step's arena, reused (kf__call_reset) for each call. */
struct kf_call {
    step_t *step;
    kf_activation_t *acts;
    fn_key_t **keys;
    uint32_t count;
    uint32_t cap;
    result_t *res;
    timer_op_t *tops;
    uint32_t ntops;
    uint32_t tops_cap;
    kf_outbuf_t out;   /* this call's output rows */
    uint32_t *row_act; /* activation of each output row */
    uint32_t row_act_cap;
    int cur_row;     /* the row being built, or -1 */
    bool answered;   /* the response is recorded: take_response may run */
    void *host_data; /* the host's record of the call while it is out */
    struct kf_call *next_spare;
    bool failed;
    kf_status_t fail_status;
    char message[KF_ERROR_MESSAGE_BYTES_MAX];
};

/* ---- registry.c -------------------------------------------------------- */

/* Partition `partition`'s share of a limit split over `partitions`: the
 * limit divided evenly, the remainder to the lowest partitions, so the
 * shares add up to the limit exactly. */
int64_t kf__limit_share(int64_t limit, uint32_t partition, uint32_t partitions);
/* Builds the in-memory function from a canonical descriptor (copied into
 * the function's own arena) and enters it in the table; its handler host
 * is attached (kf__host_attach). */
function_t *kf__fn_new(kf_functions_t *fns, const Keyflow__V1__FunctionDescriptor *canonical,
                       const char *sha256, uint32_t index, int64_t created_ms);
/* The function named by a request's function_id, or NULL with err set. */
function_t *kf__fn_require(kf_functions_t *fns, const char *id, kf_error_t *err);
/* Frees a function already out of the table (or with the table). */
void kf__fn_free(function_t *fn);

/* ---- keys.c ------------------------------------------------------------ */

void kf__key_prefix(kf_key_t *k, const function_t *fn);
/* The (at_us, key, name) order of the function's timer tree. */
int kf__timer_cmp(const kf_ostree_node_t *an, const kf_ostree_node_t *bn, const void *ctx);
/* The earliest event-time timer, or NULL. */
ev_timer_t *kf__timer_top(const function_t *fn);
/* A key is live while it has state or a timer. */
bool kf__key_live(const function_t *fn, const fn_key_t *k);
fn_key_t *kf__key_find(function_t *fn, const uint8_t *key, size_t len);
/* A new key with no state and no timers; copies key and text. */
fn_key_t *kf__key_new(function_t *fn, const uint8_t *key, size_t len, const char *text,
                      size_t text_len);
/* Frees a key already out of the function's map (or with the map). */
void kf__key_free(function_t *fn, fn_key_t *k);
/* Sets (at_us) or clears (KF__NO_TIME) one timer of a key, keeping heap
 * and counters in step. */
void kf__key_set_timer(function_t *fn, fn_key_t *k, uint8_t name, int64_t at_us);
/* Sets a key's value state; expires_us is when the value expires
 * (state_ttl_us), KF__NO_TIME for never (and for ABSENT). */
void kf__key_set_state(function_t *fn, fn_key_t *k, uint8_t state, int64_t value,
                       int64_t expires_us);
/* The (expires_us, key) order of the expiry queue. */
bool kf__expiry_before(const kf_pq_node_t *an, const kf_pq_node_t *bn, const void *ctx);
/* The key whose value expires first, or NULL. */
fn_key_t *kf__expiry_top(const function_t *fn);
size_t kf__key_of_row(kf_functions_t *fns, const function_t *fn, const kf_rows_t *rows,
                      uint32_t row, char **text, size_t *text_len, bool *text_owned);
/* The readable form of a stored canonical key (malloc'd into *text); false
 * when the key is malformed. */
bool kf__key_text_of(const function_t *fn, const uint8_t *key, size_t len, char **text,
                     size_t *text_len);

/* ---- host.c ------------------------------------------------------------ */

typedef enum kf__call_sent {
    KF__CALL_ANSWERED, /* the response is in the call now */
    KF__CALL_OUT,      /* it comes later, then kf__step_resume() */
} kf__call_sent_t;

/* How a function's handler calls reach the handler. One per kind of
 * handler; a function's host is chosen when it is built (kf__host_attach).
 * To add one (a remote worker stream): implement send(), and when the
 * response arrives on the engine thread, record it into the call through
 * kf__host_abi (or kf__call_fail) and call kf__step_resume(). */
struct kf__handler_host {
    const char *name; /* for logs */
    bool pipelines;   /* takes several calls of a step at once (see above) */
    /* How many more calls of fn's active step it takes now: > 0 room, 0
     * none until a call out is answered (the step waits), -1 none at all
     * (the step fails UNAVAILABLE with fn->unavailable). */
    int (*room)(kf_functions_t *fns, function_t *fn);
    /* Sends `call` (borrowed: it and the step's arena live until the step
     * ends or abandons it). */
    kf__call_sent_t (*send)(kf_functions_t *fns, function_t *fn, kf_call_t *call);
    /* The step ended while `call` was out: the host forgets it (its
     * response, if one comes, is dropped) and never touches it again. */
    void (*abandon)(kf_functions_t *fns, function_t *fn, kf_call_t *call);
};

/* The native host (a replay runs on it whatever its function's runtime). */
const kf__handler_host_t *kf__host_native(void);

/* The builder and accessor functions a handler's response goes through,
 * whichever host carried the call: every response is recorded, then
 * validated, the same way. */
extern const kf_host_t kf__host_abi;

/* Sets fn->host and fn->handler for the function's runtime, or leaves the
 * host NULL with the reason in fn->unavailable. */
void kf__host_attach(kf_functions_t *fns, function_t *fn);
/* Marks the call failed (the first failure's message is kept); -1. */
__attribute__((format(printf, 3, 4))) int kf__call_fail(kf_call_t *call, kf_status_t st,
                                                        const char *fmt, ...);
/* The call object of a step (in its arena), for up to `cap` activations. */
void kf__call_init(kf_call_t *call, step_t *s, uint32_t cap);
/* Empties the call for the step's next one. */
void kf__call_reset(kf_call_t *call);
/* Adds an activation of key `k` (the key's state as it is now) with id
 * `id`, and marks the key in a call. */
void kf__call_add(kf_call_t *call, fn_key_t *k, uint64_t id, int32_t callback, uint32_t row,
                  int64_t event_time_us, const char *timer_name);
/* Sends the call through its function's host. */
kf__call_sent_t kf__call_send(kf_call_t *call);

/* ---- remote.c ---------------------------------------------------------- */

/* The host of REMOTE functions. */
extern const kf__handler_host_t kf__remote_host;
/* Whether fn (REMOTE) has a worker now; the reason in fn->unavailable. */
bool kf__remote_available(const function_t *fn);
void kf__remote_init(kf_functions_t *fns);
/* Ends every worker stream (at shutdown and destroy): their calls fail,
 * and the front end gets every link back. */
void kf__remote_release_all(kf_functions_t *fns, kf_ctx_t *ctx);
/* Closes every serving worker whose stream's key was revoked, telling it
 * KF_E_UNAUTHENTICATED; their calls fail as for a lost worker. */
void kf__remote_end_revoked(kf_functions_t *fns, kf_ctx_t *ctx);
/* Ends the streams of every worker of fn (the function is deleted): each
 * is told `status` and `message`; their calls are dropped. */
void kf__remote_close_function(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn,
                               kf_status_t status, const char *message);

/* ---- replay.c ---------------------------------------------------------- */

/* Keeps a committing PushBatch step of a REPLAY_SAFE function (before its
 * commit: the undo log still holds every key it touched). */
void kf__replay_keep(step_t *s);
/* Forgets the kept batches of a function (deleted or freed). */
void kf__replay_forget(kf_functions_t *fns, function_t *fn);
/* A replay step ended (st: how): compares it with its record and sets its
 * command's response. */
void kf__replay_answer(step_t *s, kf_status_t st);
void kf__replay_scratch_free(function_t *scratch);

/* ---- step.c ------------------------------------------------------------ */

/* Starts the step of s->cmd (rows, req set) on fn, which is idle. */
void kf__step_begin(step_t *s, kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn);

/* Timers due (at_us <= watermark) that wait for a step to fire them. */
uint64_t kf__due_timers(const function_t *fn);
/* Puts the function on the due list when it has due timers and follow-on
 * steps may run them (after a step, at recovery, when its host has room
 * again); takes it off otherwise. */
void kf__due_update(kf_functions_t *fns, function_t *fn);
/* Takes the function off the due list (when it is freed). */
void kf__due_unlink(kf_functions_t *fns, function_t *fn);

/* A response of the active step came in, or the host's room changed: take
 * what is answered and go on (the step may finish, and queued batches
 * start; due timers may run again). */
void kf__step_resume(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn);
/* Refuses the batches queued behind an active step with `status` and
 * `message` (at shutdown, or when the function is deleted). */
void kf__push_release_queued(kf_ctx_t *ctx, function_t *fn, kf_status_t status,
                             const char *message);
/* Ends the function's active step, if any, refused with `status` and
 * `message`: its calls out are abandoned and nothing of it is applied
 * (DeleteFunction). */
void kf__step_abort(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn, kf_status_t status,
                    const char *message);
producer_t *kf__producer_get(function_t *fn, const char *id, bool create);
void kf__put_checkpoint(kf_ctx_t *ctx, const function_t *fn);

/* ---- output.c ---------------------------------------------------------- */

/* Output up to fn->output_seq was written in `group`: readers are woken
 * when the group is durable (kf_functions_durable). */
void kf__output_written(kf_functions_t *fns, function_t *fn, uint64_t group);
/* Parked reads whose key was revoked fail with KF_E_UNAUTHENTICATED. */
void kf__output_end_revoked(kf_functions_t *fns, kf_ctx_t *ctx);
/* Before a function is freed: its parked reads fail with `status` and
 * `message`, and nothing pending refers to it any more. */
void kf__output_forget(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn, kf_status_t status,
                       const char *message);

/* ---- memory.c ---------------------------------------------------------- */

/* The memory budget admits a new function (its canonical descriptor's
 * encoding is descriptor_bytes long) or a new producer: KF_E_LIMIT naming
 * the budget when it would pass it. */
kf_status_t kf__fn_admit(kf_ctx_t *ctx, size_t descriptor_bytes, kf_error_t *err) KF_MUST_USE;
kf_status_t kf__producer_admit(kf_ctx_t *ctx, kf_error_t *err) KF_MUST_USE;
/* After a handler call was applied: KF_E_LIMIT (in s->err) when the keys
 * the step added would pass the budget. */
kf_status_t kf__step_memory_check(const step_t *s) KF_MUST_USE;
/* What the step's new keys add to the tables (0 when it added none). */
uint64_t kf__step_memory_growth(const step_t *s);
/* The step committed: count what it added until the next refresh. */
void kf__step_memory_commit(step_t *s);

/* ---- retire.c ---------------------------------------------------------- */

/* A producer was used at now_ms (an accepted batch, or a retry of one):
 * it becomes the function's newest. */
void kf__producer_touch(function_t *fn, producer_t *p, int64_t now_ms);
/* Removes a producer from its function (memory only) and frees it. */
void kf__producer_free(function_t *fn, producer_t *p);
/* After recovery loaded fn's producers (in key order): orders them by
 * last use, giving those stored before expiry existed `now_ms`. */
void kf__producers_recovered(function_t *fn, int64_t now_ms);
/* Expires producers idle past the server's expiry, at most `limit`;
 * returns how many. */
uint32_t kf__producers_expire(kf_functions_t *fns, kf_ctx_t *ctx, uint32_t limit);

/* ---- retention.c ------------------------------------------------------- */

/* Puts a chunk of `rows` output rows ending at fn->output_seq, and its
 * mark, in the step's batch. */
void kf__output_put_chunk(kf_ctx_t *ctx, function_t *fn, const Keyflow__V1__RowBatch *chunk,
                          uint32_t rows);
/* KF_E_RANGE in cmd->error, naming the first retained sequence, when a
 * read after `after_seq` would start before the retained rows; then
 * cmd->resume_after_seq is where a read may resume. */
kf_status_t kf__output_check_range(const function_t *fn, int64_t after_seq, kf_cmd_t *cmd);
/* The retention in force for fn (its descriptor's, then the server's). */
void kf__output_retention(const kf_functions_t *fns, const function_t *fn, kf_retention_t *out);

#endif
