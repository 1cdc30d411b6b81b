/*
 * keyflow_sim.c - the seeded simulation: random operation mixes against the
 * deterministic engine core, checked after every step against a reference
 * model (model.h).
 *
 *   keyflow_sim --seed S [--steps N] [--verbose]      one seed (replay a failure)
 *   keyflow_sim --seeds N [--from S] [--jobs J]       N seeds S, S+1, ... over J processes
 *
 * One seed is one world: a memory store (storage/store_mem.c), a manual
 * clock and a core created over them, plus the model and a "client" that
 * remembers what it sent and what was acknowledged. Each step draws one
 * operation from the seed:
 *
 *   SendEvent (debounce and batch rules, with and without IDs, retries of
 *   earlier IDs, some invalid), FlushWindow, CancelWindow, PollRuns (some
 *   long polls that wait, and cancels of them), HeartbeatRun, CompleteRun
 *   (results, errors, retries, stale leases), GetRun, RegisterFunction,
 *   PushBatch (running_sum and session_counter, JSON and columnar rows,
 *   watermarks, retries of a producer sequence, handler refusals; some
 *   accepted batches replayed with ReplayBatch, which must reproduce them), a pump
 *   of deferred handler calls (half the worlds answer them only then, as a
 *   remote worker would), a move of the manual clock (stopping at every
 *   time something is due), a group commit, or a crash.
 *
 * Groups work as in engine.c: commands of a group run, then the group's
 * batch is written and only then are their replies released. The driver
 * commits after a random number of steps. A crash drops the core and
 * recovers a new one from the store, either before the group's write (its
 * effects are lost, its replies never sent) or after it (effects durable,
 * replies lost). A store handle may be opened to fail its Nth write: the
 * failed group is fail-stop (nothing of it acknowledged) and the world
 * restarts; one may also be opened with failing reads, and recovery over it
 * must refuse cleanly.
 *
 * Checks: every reply is compared with the model's prediction when it is
 * produced; at every durable group boundary every coordinator, run,
 * function, key state and output row is read back and compared, and every
 * event, lease and push the client saw acknowledged must be in the model.
 * A failure prints the seed and the step and how to replay it; an assertion
 * inside the engine (SIGABRT) prints the same.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "base/alloc.h"
#include "base/arena.h"
#include "base/crypto.h"
#include "base/log.h"
#include "core/core.h"
#include "keyflow/v1/coordinators.pb-c.h"
#include "keyflow/v1/functions.pb-c.h"
#include "keyflow/v1/runs.pb-c.h"
#include "model.h"

#define DEFAULT_STEPS   400
#define START_MS        INT64_C(1700000000000)
#define START_US        (START_MS * 1000)
#define EVENTS_MAX      4096 /* client event log */
#define PUSHES_MAX      2048 /* client push log */
#define LEASES_MAX      4096 /* client lease log */
#define NOTES_MAX       4096
#define PUSH_ROWS_MAX   8
#define OUTSTANDING_MAX 64 /* pushes waiting for their handler at once */
#define PARKED_MAX      8  /* long polls waiting at once */

/* ---- the client's memory -------------------------------------------------- */

typedef struct c_event {
    int coord;
    char id[M_EVENT_ID_BYTES];
    m_payload_t payload; /* rule, flush, input (its own number) */
    bool acked;
    char receipt_run_id[M_RUN_ID_BYTES];
} c_event_t;

typedef struct c_lease {
    char run_id[M_RUN_ID_BYTES];
    char lease[M_LEASE_BYTES];
    int completed; /* 0: not yet; 1: sent a result; 2: sent an error */
    bool completion_acked;
} c_lease_t;

typedef struct c_push {
    int fn, producer;
    int64_t sequence;
    m_row_t rows[PUSH_ROWS_MAX];
    int nrows;
    bool has_watermark;
    int64_t watermark_us;
    bool acked;
    m_ack_t ack;
} c_push_t;

typedef enum { NOTE_EVENT, NOTE_LEASE, NOTE_COMPLETION, NOTE_PUSH } note_kind_t;

/* A reply of the open group: the client sees it only when the group is durable. */
typedef struct note {
    note_kind_t kind;
    int index;
    char run_id[M_RUN_ID_BYTES];
    char lease[M_LEASE_BYTES];
    m_ack_t ack;
} note_t;

typedef struct world {
    uint64_t seed;
    uint64_t rng; /* the driver's choices */
    long step;
    long steps;
    bool verbose;
    const char *plugin_dir;
    char digests[M_FNS][KF_SHA256_HEX_BYTES + 1];
    /* The engine side. */
    kf_memdisk_t *disk;
    kf_store_t *store;
    kf_core_t *core;
    kf_batch_t *batch;
    kf_engine_config_t config;
    uint64_t rng_seed[2]; /* the core's random source: seed, incarnation */
    uint64_t incarnation;
    bool write_fault_armed;
    int64_t now_ms;
    uint64_t group;
    kf_arena_t arena; /* requests and replies of the open group */
    kf_arena_t *cur;  /* where requests are built: `arena`, or an outstanding push's own */
    /* The reference model and the client. */
    model_t m;
    c_event_t events[EVENTS_MAX];
    int nevents;
    c_lease_t leases[LEASES_MAX];
    int nleases;
    c_push_t pushes[PUSHES_MAX];
    int npushes;
    int64_t next_sequence[M_FNS][M_PRODUCERS];
    int64_t client_watermark_us[M_FNS];
    note_t notes[NOTES_MAX];
    int nnotes;
    /* Pushes whose step waits for its handler (config.defer_handler_calls),
     * oldest first; each owns the arena its request and reply live in. */
    struct outstanding {
        kf_cmd_t *cmd;
        int push; /* index into pushes */
        kf_arena_t *arena;
    } outstanding[OUTSTANDING_MAX];
    int noutstanding;
    /* Arenas of answered pushes: their commands are on the core's ready
     * list until the group is released, so they are freed only then. */
    kf_arena_t *spent[OUTSTANDING_MAX * 4];
    int nspent;
    /* Long polls waiting for a run, oldest first. */
    struct parked_poll {
        kf_cmd_t *cmd;
        kf_arena_t *arena;
        int workflows[M_WORKFLOWS];
        int nworkflows;
        int64_t max_runs, granted_ms, deadline_ms;
        char worker[16];
        bool cancelled;
    } parked[PARKED_MAX];
    int nparked;
    uint64_t next_cmd_id;
    /* Counters for the summary. */
    uint64_t crashes, faults, commits, runs_done;
    /* Nothing is pending: reads of stored data see every effect so far. A
     * run past its retention is certainly gone only then, since the sweep
     * deletes through the group it runs in. */
    bool at_durable_point;
    /* kf_core_durable trails the writes by a group, as the committer's
     * notices trail the engine: records of the group before stay staged in
     * the engine's overlay while later groups read and rewrite them. */
    bool lag_durable;
    int64_t last_check_ms; /* when full_check last ran (after a recovery: 0) */
} world_t;

static world_t *g_world; /* for the SIGABRT report */
static const char *g_argv0 = "keyflow_sim";

/* ---- failure reports -------------------------------------------------------- */

static void report_line(char *buf, size_t cap, const world_t *w) {
    snprintf(buf, cap,
             "keyflow_sim: FAILED seed %" PRIu64 " at step %ld of %ld (now_ms %" PRId64
             ")\n  replay: %s --seed %" PRIu64 " --steps %ld --verbose\n",
             w->seed, w->step, w->steps, w->now_ms, g_argv0, w->seed, w->steps);
}

static void on_abort(int sig) {
    (void)sig;
    if (g_world != NULL) {
        char buf[512];
        report_line(buf, sizeof buf, g_world); /* not async-signal-safe; we are dying anyway */
        ssize_t rc = write(2, buf, strlen(buf));
        (void)rc;
    }
    signal(SIGABRT, SIG_DFL);
    raise(SIGABRT);
}

__attribute__((format(printf, 2, 3), noreturn)) static void fail(world_t *w, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "keyflow_sim: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    report_line(buf, sizeof buf, w);
    fputs(buf, stderr);
    g_world = NULL;
    exit(1);
}

#define CHECK(w, cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fail((w), __VA_ARGS__);                                                                \
        }                                                                                          \
    } while (0)

#define CHECK_EQ(w, what, got, want)                                                               \
    do {                                                                                           \
        long long got_ = (long long)(got), want_ = (long long)(want);                              \
        CHECK((w), got_ == want_, "%s: engine %lld, model %lld", (what), got_, want_);             \
    } while (0)

static const char *nonnull(const char *s) {
    return s != NULL ? s : "";
}

#define CHECK_STR(w, what, got, want)                                                              \
    do {                                                                                           \
        const char *got_ = nonnull(got), *want_ = nonnull(want);                                   \
        CHECK((w), strcmp(got_, want_) == 0, "%s: engine \"%s\", model \"%s\"", (what), got_,      \
              want_);                                                                              \
    } while (0)

static void say(world_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(world_t *w, const char *fmt, ...) {
    if (!w->verbose) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    printf("[%ld t=%" PRId64 "] ", w->step, w->now_ms - START_MS);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

/* ---- random choices ----------------------------------------------------------- */

static uint64_t next_u64(world_t *w) {
    uint64_t z = (w->rng += UINT64_C(0x9E3779B97F4A7C15)); /* splitmix64 */
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static int64_t rnd(world_t *w, int64_t n) { /* 0..n-1 */
    return n <= 1 ? 0 : (int64_t)(next_u64(w) % (uint64_t)n);
}

static bool chance(world_t *w, int percent) {
    return rnd(w, 100) < percent;
}

static int64_t pick(world_t *w, const int64_t *values, int n) {
    return values[rnd(w, n)];
}
#define PICK(w, ...)                                                                               \
    pick((w), (const int64_t[]){__VA_ARGS__},                                                      \
         (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))

/* ---- the engine side ------------------------------------------------------------- */

static void engine_begin(world_t *w) {
    kf_core_begin(w->core, w->batch, w->group, w->now_ms);
}

/* Fires every due timer, as the engine thread does before each turn; the
 * model does the same. */
static void settle_polls(world_t *w);

static void tick(world_t *w) {
    engine_begin(w);
    while (kf_core_tick(w->core, KF_TIMERS_PER_TURN_MAX) == KF_TIMERS_PER_TURN_MAX) {
    }
    m_tick(&w->m, w->now_ms);
    settle_polls(w);
}

static kf_cmd_t *exec(world_t *w, kf_op_t op, const ProtobufCMessage *request) {
    kf_cmd_t *cmd = kf_arena_zalloc(w->cur, sizeof *cmd);
    cmd->op = op;
    cmd->request = request;
    cmd->arena = w->cur;
    engine_begin(w);
    kf_core_execute(w->core, cmd);
    CHECK(w, cmd->parked == NULL, "%s: parked", kf_op_name(op));
    CHECK(w, (cmd->error.status == KF_OK) == (cmd->response != NULL),
          "%s: status %s with%s a response", kf_op_name(op), kf_status_name(cmd->error.status),
          cmd->response ? "" : "out");
    return cmd;
}

static void expect_status(world_t *w, const kf_cmd_t *cmd, kf_status_t want, const char *what) {
    CHECK(w, cmd->error.status == want, "%s: engine %s (%s), model %s", what,
          kf_status_name(cmd->error.status), cmd->error.message, kf_status_name(want));
}

static void drop_engine(world_t *w) {
    kf_batch_destroy(w->batch);
    kf_core_destroy(w->core);
    kf_store_close(w->store);
    w->batch = NULL;
    w->core = NULL;
    w->store = NULL;
}

static kf_status_t create_core(world_t *w, const kf_mem_faults_t *faults, kf_error_t *err) {
    kf_status_t st = kf_store_open_mem(w->disk, faults, &w->store, err);
    if (st != KF_OK) {
        return st;
    }
    w->incarnation++;
    w->rng_seed[0] = w->seed;
    w->rng_seed[1] = w->incarnation; /* a restarted process draws new UUIDs */
    st = kf_core_create(&w->config, w->store, &w->core, err);
    if (st != KF_OK) {
        kf_store_close(w->store);
        w->store = NULL;
        w->core = NULL;
    }
    return st;
}

/* Starts a new core over the store, as keyflowd does after a crash. */
static void recover(world_t *w) {
    kf_error_t err;
    if (chance(w, 5)) {
        /* Unreadable storage: recovery must refuse, not guess. */
        kf_mem_faults_t bad = {.fail_reads = true};
        kf_status_t st = create_core(w, &bad, &err);
        CHECK(w, st == KF_E_IO, "recovery over failing reads: %s (%s)", kf_status_name(st),
              st == KF_OK ? "recovered" : err.message);
    }
    kf_mem_faults_t faults = {0};
    w->write_fault_armed = chance(w, 25);
    if (w->write_fault_armed) {
        faults.fail_write_at = (uint64_t)(1 + rnd(w, 30));
    }
    kf_status_t st = create_core(w, &faults, &err);
    if (st == KF_E_IO && w->write_fault_armed) {
        /* Recovery's own repair write hit the injected fault: fail-stop. */
        w->write_fault_armed = false;
        st = create_core(w, NULL, &err);
    }
    CHECK(w, st == KF_OK, "recovery: %s: %s", kf_status_name(st), err.message);
    w->batch = kf_batch_create(w->store);
    w->group++;
    tick(w);
}

static void full_check(world_t *w);

/* The open group is lost: the model goes back to the last durable state. */
static void lose_group(world_t *w) {
    model_revert(&w->m);
    w->nnotes = 0;
}

static void drop_outstanding(world_t *w, int k);
static void free_spent(world_t *w);

static void restart(world_t *w) {
    w->last_check_ms = 0; /* recovery rebuilt every run: check them all */
    drop_engine(w);
    while (w->noutstanding > 0) {
        drop_outstanding(w, w->noutstanding - 1); /* never answered */
    }
    for (; w->nparked > 0; w->nparked--) {
        w->spent[w->nspent++] = w->parked[w->nparked - 1].arena; /* their clients saw the crash */
    }
    free_spent(w);
    kf_arena_reset(&w->arena);
    recover(w);
}

static void apply_notes(world_t *w);

/* The open group's write returned: the model's state is durable. */
static void group_durable(world_t *w) {
    model_commit(&w->m);
}

/* Writes the open group; on success its replies are released (the client
 * sees them) and everything is checked. Returns false after a fail-stop. */
static bool commit(world_t *w) {
    if (kf_batch_count(w->batch) > 0) {
        kf_error_t err;
        kf_status_t st = kf_store_write(w->store, w->batch, &err);
        if (st != KF_OK) {
            CHECK(w, w->write_fault_armed, "write failed without an injected fault: %s",
                  err.message);
            say(w, "write failed (injected): fail-stop, nothing of the group acknowledged");
            w->faults++;
            lose_group(w);
            restart(w);
            return false;
        }
        kf_batch_clear(w->batch);
    }
    (void)kf_core_take_ready(w->core);
    kf_core_durable(w->core, w->lag_durable ? w->group - 1 : w->group);
    w->group++;
    group_durable(w);
    apply_notes(w);
    w->commits++;
    w->at_durable_point = true;
    full_check(w);
    w->at_durable_point = false;
    (void)kf_core_take_ready(w->core); /* the checks' replies live in the arena */
    kf_arena_reset(&w->arena);
    free_spent(w);
    return true;
}

static void crash(world_t *w) {
    bool after_write = chance(w, 40) && kf_batch_count(w->batch) > 0;
    w->crashes++;
    if (after_write) {
        kf_error_t err;
        kf_status_t st = kf_store_write(w->store, w->batch, &err);
        if (st == KF_OK) {
            say(w, "crash after the group's write (durable, replies lost)");
            group_durable(w);
            w->nnotes = 0;
            restart(w);
            return;
        }
        CHECK(w, w->write_fault_armed, "write failed without an injected fault: %s", err.message);
    }
    say(w, "crash before the group's write (lost)");
    lose_group(w);
    restart(w);
}

/* ---- requests ------------------------------------------------------------------- */

#define NEW(T, init)                                                                               \
    ({                                                                                             \
        T *p_ = kf_arena_zalloc(w->cur, sizeof(T));                                                \
        init(p_);                                                                                  \
        p_;                                                                                        \
    })

static char *dup_text(world_t *w, const char *s) {
    return kf_arena_strdup(w->cur, s);
}

static Keyflow__V1__Rule *rule_message(world_t *w, const m_rule_t *r) {
    Keyflow__V1__Rule *m = NEW(Keyflow__V1__Rule, keyflow__v1__rule__init);
    m->kind = (Keyflow__V1__RuleKind)r->kind;
    if (r->kind == M_DEBOUNCE) {
        m->window_ms_present_case = KEYFLOW__V1__RULE__WINDOW_MS_PRESENT_WINDOW_MS;
        m->window_ms = r->window_ms;
        /* TRAILING is the default: leave it out half the time. */
        m->edge = r->edge == M_TRAILING && chance(w, 50) ? KEYFLOW__V1__EDGE__EDGE_UNSPECIFIED
                                                         : (Keyflow__V1__Edge)r->edge;
    } else {
        m->max_events_present_case = KEYFLOW__V1__RULE__MAX_EVENTS_PRESENT_MAX_EVENTS;
        m->max_events = r->max_events;
        if (r->max_bytes != 4 * 1024 * 1024 || chance(w, 50)) {
            m->max_bytes_present_case = KEYFLOW__V1__RULE__MAX_BYTES_PRESENT_MAX_BYTES;
            m->max_bytes = r->max_bytes;
        }
    }
    m->max_wait_ms_present_case = KEYFLOW__V1__RULE__MAX_WAIT_MS_PRESENT_MAX_WAIT_MS;
    m->max_wait_ms = r->max_wait_ms;
    m->dedup_ms_present_case = KEYFLOW__V1__RULE__DEDUP_MS_PRESENT_DEDUP_MS;
    m->dedup_ms = r->dedup_ms;
    return m;
}

static m_rule_t random_rule(world_t *w, int kind) {
    int64_t dedup = PICK(w, 0, 300, 5000, 60000, 600000);
    if (kind == M_DEBOUNCE) {
        int edge = (int)PICK(w, M_TRAILING, M_TRAILING, M_LEADING, M_BOTH);
        return m_rule_defaults(M_DEBOUNCE, edge, PICK(w, 1, 40, 300, 2000),
                               PICK(w, 0, 0, 100, 1000), -1, -1, dedup);
    }
    /* Small max_bytes close windows by size, or refuse an input outright. */
    int64_t max_bytes = PICK(w, 4 * 1024 * 1024, 4 * 1024 * 1024, 12, 25, 40, 80);
    return m_rule_defaults(M_BATCH, M_TRAILING, -1, PICK(w, 1, 50, 700, 3000),
                           1 + rnd(w, M_BATCH_EVENTS_MAX), max_bytes, dedup);
}

static Keyflow__V1__CoordinatorRef *coord_ref(world_t *w, int c) {
    const m_coord_t *co = &w->m.coords[c];
    Keyflow__V1__CoordinatorRef *r =
        NEW(Keyflow__V1__CoordinatorRef, keyflow__v1__coordinator_ref__init);
    r->kind = (Keyflow__V1__RuleKind)co->kind;
    r->workflow = (char *)m_workflow_names[co->workflow];
    r->key = (char *)m_key_names[co->key];
    return r;
}

static const char *coord_name(const world_t *w, int c) {
    static char buf[64];
    const m_coord_t *co = &w->m.coords[c];
    snprintf(buf, sizeof buf, "%s/%s/%s", co->kind == M_DEBOUNCE ? "debounce" : "batch",
             m_workflow_names[co->workflow], m_key_names[co->key]);
    return buf;
}

static void add_note(world_t *w, note_t note) {
    CHECK(w, w->nnotes < NOTES_MAX, "too many replies in one group");
    w->notes[w->nnotes++] = note;
}

/* A run ID is "<key>@<uuid>". */
static bool run_id_well_formed(const char *run_id, const char *key) {
    size_t k = strlen(key);
    return strncmp(run_id, key, k) == 0 && run_id[k] == '@' &&
           strlen(run_id + k + 1) == KF_UUID_TEXT_BYTES;
}

/* ---- coordinator operations ------------------------------------------------------ */

static Keyflow__V1__SendEventRequest *event_request(world_t *w, int coord, const char *id,
                                                    const m_payload_t *payload) {
    const m_coord_t *co = &w->m.coords[coord];
    Keyflow__V1__SendEventRequest *req =
        NEW(Keyflow__V1__SendEventRequest, keyflow__v1__send_event_request__init);
    req->workflow = (char *)m_workflow_names[co->workflow];
    req->key = (char *)m_key_names[co->key];
    req->event = NEW(Keyflow__V1__Event, keyflow__v1__event__init);
    req->event->id = dup_text(w, id);
    req->event->rule = rule_message(w, &payload->rule);
    req->event->flush = payload->flush;
    char text[32];
    m_event_text(payload->input, text, sizeof text);
    req->event->input_json = kf_arena_printf(w->cur, " %s\n", text); /* trimmed when stored */
    return req;
}

/* Picks the next event to send: a retry of an earlier one (or, with
 * *conflict, its ID with another payload), or a new one. Returns its index
 * in the client's log, or -1 for nothing to send. */
static int next_event(world_t *w, m_payload_t *payload, bool *retry, bool *conflict) {
    *retry = *conflict = false;
    if (w->nevents > 0 && chance(w, 25)) {
        /* Retry an earlier event with an ID: one whose ID is still
         * remembered (a duplicate, or with another payload a conflict) or
         * that never became durable (accepted now for the first time);
         * never one whose dedup time has passed, which would be a second
         * event with the same input. */
        int e = (int)rnd(w, w->nevents);
        c_event_t *ev = &w->events[e];
        bool remembered = m_id_find(&w->m, ev->coord, ev->id, w->now_ms) != NULL;
        if (ev->id[0] == '\0' || (w->m.events[e].accepted && !remembered)) {
            return -1;
        }
        *retry = true;
        *payload = ev->payload;
        if (remembered && chance(w, 15)) {
            *conflict = true; /* the same ID with another payload: refused */
            if (chance(w, 50)) {
                payload->flush = !payload->flush;
            } else {
                payload->input += EVENTS_MAX; /* never sent otherwise */
            }
        }
        return e;
    }
    CHECK(w, w->nevents < EVENTS_MAX, "client event log full");
    int e = w->nevents++;
    c_event_t *ev = &w->events[e];
    int kind = chance(w, 50) ? M_DEBOUNCE : M_BATCH;
    ev->coord = m_coord_index(kind, (int)rnd(w, M_WORKFLOWS), (int)rnd(w, M_KEYS));
    ev->payload.rule = random_rule(w, kind);
    ev->payload.flush = chance(w, 8);
    ev->payload.input = e;
    if (chance(w, 85)) {
        snprintf(ev->id, sizeof ev->id, "e%d", e);
    }
    *payload = ev->payload;
    return e;
}

/* The answer to one SendEvent (alone or in a SendEvents call), checked
 * against the model, which takes the event. */
static void event_answered(world_t *w, int e, const m_payload_t *payload, bool conflict,
                           kf_status_t status, const char *message,
                           const Keyflow__V1__SendEventResponse *resp) {
    c_event_t *ev = &w->events[e];
    const m_coord_t *co = &w->m.coords[ev->coord];
    say(w,
        "send %s id=%s n=%d%s%s [edge %d max_events %" PRId64 " max_bytes %" PRId64 " wait %" PRId64
        "] -> %s %s",
        coord_name(w, ev->coord), ev->id, payload->input, payload->flush ? " flush" : "",
        conflict ? " (conflict)" : "", payload->rule.edge, payload->rule.max_events,
        payload->rule.max_bytes, payload->rule.max_wait_ms, kf_status_name(status),
        status ? message : "");
    bool new_run = status == KF_OK && m_send_new_run(&w->m, ev->coord, ev->id, payload, w->now_ms);
    m_send_result_t want;
    m_send_event(&w->m, ev->coord, ev->id, payload,
                 status == KF_OK && resp->receipt ? resp->receipt->run_id : "", w->now_ms,
                 (int64_t)w->group, &want);
    if (want.status != 0) {
        CHECK(w, (int)kf_status_grpc_code(status) == want.status,
              "SendEvent: engine %s (%s), model gRPC code %d", kf_status_name(status), message,
              want.status);
        return;
    }
    CHECK(w, !conflict, "SendEvent: the same ID with another payload was not refused");
    CHECK(w, status == KF_OK, "SendEvent: engine %s (%s), model OK", kf_status_name(status),
          message);
    CHECK(w, resp->receipt != NULL, "SendEvent: no receipt");
    CHECK_EQ(w, "SendEvent disposition", resp->disposition, want.disposition);
    CHECK_EQ(w, "SendEvent duplicate", resp->duplicate, want.disposition == M_DUPLICATE);
    CHECK_EQ(w, "SendEvent run_started", resp->run_started, want.disposition == M_CLOSED);
    CHECK_STR(w, "SendEvent receipt.run_id", resp->receipt->run_id, want.run_id);
    CHECK_EQ(w, "SendEvent receipt.due_ms", resp->receipt->due_ms, want.due_ms);
    CHECK_EQ(w, "SendEvent receipt.commit_seq", resp->receipt->commit_seq, want.commit_seq);
    if (new_run) {
        CHECK(w, run_id_well_formed(resp->receipt->run_id, m_key_names[co->key]),
              "SendEvent: malformed run_id %s", resp->receipt->run_id);
    }
    note_t n = {.kind = NOTE_EVENT, .index = e};
    snprintf(n.run_id, sizeof n.run_id, "%s", resp->receipt->run_id);
    add_note(w, n);
}

static void op_send_event(world_t *w) {
    m_payload_t payload;
    bool retry, conflict;
    int e = next_event(w, &payload, &retry, &conflict);
    if (e < 0) {
        return;
    }
    c_event_t *ev = &w->events[e];
    Keyflow__V1__SendEventRequest *req = event_request(w, ev->coord, ev->id, &payload);
    if (!retry && chance(w, 3)) {
        /* A rule out of range: refused, nothing changes, never retried. */
        if (payload.rule.kind == M_DEBOUNCE) {
            req->event->rule->window_ms = 0;
        } else {
            req->event->rule->max_events = 0;
        }
        kf_cmd_t *cmd = exec(w, KF_OP_SEND_EVENT, &req->base);
        say(w, "send %s n=%d (invalid rule) -> %s", coord_name(w, ev->coord), e,
            kf_status_name(cmd->error.status));
        expect_status(w, cmd, KF_E_INVALID, "SendEvent with an invalid rule");
        ev->id[0] = '\0';
        return;
    }
    kf_cmd_t *cmd = exec(w, KF_OP_SEND_EVENT, &req->base);
    event_answered(w, e, &payload, conflict, cmd->error.status, cmd->error.message,
                   (const Keyflow__V1__SendEventResponse *)cmd->response);
}

/* SendEvents: a few events in one call, each answered as SendEvent would
 * be, in order, all in one write. */
static void op_send_events(world_t *w) {
    int n = 1 + (int)rnd(w, 5);
    int index[8];
    m_payload_t payloads[8];
    bool conflicts[8];
    Keyflow__V1__SendEventsRequest *req =
        NEW(Keyflow__V1__SendEventsRequest, keyflow__v1__send_events_request__init);
    req->events = kf_arena_zalloc(w->cur, 8 * sizeof *req->events);
    for (int i = 0; i < n; i++) {
        bool retry;
        int e = next_event(w, &payloads[req->n_events], &retry, &conflicts[req->n_events]);
        bool again = false; /* the model learns of the call's events only after it */
        for (size_t k = 0; k < req->n_events; k++) {
            again |= index[k] == e;
        }
        if (e < 0 || again) {
            continue;
        }
        index[req->n_events] = e;
        req->events[req->n_events] =
            event_request(w, w->events[e].coord, w->events[e].id, &payloads[req->n_events]);
        req->n_events++;
    }
    kf_cmd_t *cmd = exec(w, KF_OP_SEND_EVENTS, &req->base);
    say(w, "send %zu events in one call", req->n_events);
    expect_status(w, cmd, KF_OK, "SendEvents");
    const Keyflow__V1__SendEventsResponse *resp =
        (const Keyflow__V1__SendEventsResponse *)cmd->response;
    CHECK_EQ(w, "SendEvents results", resp->n_results, req->n_events);
    for (size_t i = 0; i < req->n_events; i++) {
        const Keyflow__V1__SendEventsResult *r = resp->results[i];
        bool ok = r->outcome_case == KEYFLOW__V1__SEND_EVENTS_RESULT__OUTCOME_RESPONSE;
        kf_status_t st = KF_OK;
        if (!ok) {
            CHECK(w, r->outcome_case == KEYFLOW__V1__SEND_EVENTS_RESULT__OUTCOME_ERROR,
                  "SendEvents: a result with no outcome");
            st = r->error->code == 6   ? KF_E_EXISTS
                 : r->error->code == 3 ? KF_E_INVALID
                                       : KF_E_INTERNAL;
        }
        event_answered(w, index[i], &payloads[i], conflicts[i], st, ok ? "" : r->error->message,
                       ok ? r->response : NULL);
    }
}

static void op_flush_or_cancel(world_t *w, bool flush) {
    int c = (int)rnd(w, M_COORDS);
    char run_id[M_RUN_ID_BYTES] = "";
    kf_cmd_t *cmd;
    if (flush) {
        Keyflow__V1__FlushWindowRequest *req =
            NEW(Keyflow__V1__FlushWindowRequest, keyflow__v1__flush_window_request__init);
        req->coordinator = coord_ref(w, c);
        cmd = exec(w, KF_OP_FLUSH_WINDOW, &req->base);
        expect_status(w, cmd, KF_OK, "FlushWindow");
        Keyflow__V1__FlushWindowResponse *resp = (Keyflow__V1__FlushWindowResponse *)cmd->response;
        int want = m_flush(&w->m, c, w->now_ms, run_id);
        say(w, "flush %s -> %d", coord_name(w, c), resp->flushed);
        CHECK_EQ(w, "FlushWindow disposition", resp->disposition, want);
        CHECK_EQ(w, "FlushWindow flushed", resp->flushed, want == M_CLOSED);
        CHECK_STR(w, "FlushWindow run_id", resp->run_id, run_id);
    } else {
        Keyflow__V1__CancelWindowRequest *req =
            NEW(Keyflow__V1__CancelWindowRequest, keyflow__v1__cancel_window_request__init);
        req->coordinator = coord_ref(w, c);
        cmd = exec(w, KF_OP_CANCEL_WINDOW, &req->base);
        expect_status(w, cmd, KF_OK, "CancelWindow");
        Keyflow__V1__CancelWindowResponse *resp =
            (Keyflow__V1__CancelWindowResponse *)cmd->response;
        int64_t dropped = 0;
        int want = m_cancel(&w->m, c, w->now_ms, run_id, &dropped);
        say(w, "cancel %s -> %d", coord_name(w, c), resp->cancelled);
        CHECK_EQ(w, "CancelWindow disposition", resp->disposition, want);
        CHECK_EQ(w, "CancelWindow cancelled", resp->cancelled, want == M_CANCELLED);
        CHECK_STR(w, "CancelWindow run_id", resp->run_id, run_id);
        CHECK_EQ(w, "CancelWindow events_dropped", resp->events_dropped, dropped);
    }
}

/* ---- run operations ---------------------------------------------------------------- */

static void check_run(world_t *w, const Keyflow__V1__Run *got, int r, const char *what);

/* The runs a poll was answered with: each was pending in the model and of
 * a requested workflow, oldest first; the model leases them now.
 * `candidates` >= 0: an immediate answer, which must take
 * min(max_runs, candidates). */
static void poll_answered(world_t *w, const Keyflow__V1__PollRunsResponse *resp,
                          const int *workflows, int nworkflows, const char *worker,
                          int64_t max_runs, int64_t granted_ms, int candidates) {
    if (candidates >= 0) {
        CHECK_EQ(w, "PollRuns runs", resp->n_runs, candidates < max_runs ? candidates : max_runs);
    } else {
        CHECK(w, resp->n_runs >= 1 && (int64_t)resp->n_runs <= max_runs,
              "PollRuns (long poll): %zu runs for max_runs %" PRId64, resp->n_runs, max_runs);
    }
    int64_t newest = INT64_MIN;
    for (size_t i = 0; i < resp->n_runs; i++) {
        const Keyflow__V1__Run *got = resp->runs[i];
        int r = m_run_find(&w->m, got->run_id);
        CHECK(w, r >= 0, "PollRuns: unknown run %s", got->run_id);
        CHECK(w, w->m.runs[r].status == M_PENDING, "PollRuns: run %s was not pending", got->run_id);
        CHECK(w, m_run_matches(&w->m, r, workflows, nworkflows),
              "PollRuns: run %s of another workflow", got->run_id);
        CHECK(w, w->m.runs[r].created_ms >= newest, "PollRuns: runs out of creation order");
        newest = w->m.runs[r].created_ms;
        CHECK(w, strlen(got->lease) == KF_UUID_TEXT_BYTES, "PollRuns: lease %s", got->lease);
        m_run_lease(&w->m, r, got->lease, worker, granted_ms, w->now_ms);
        say(w, "  leased %s attempt %" PRId64 " until %" PRId64, got->run_id, got->attempts,
            got->lease_expires_ms - START_MS);
        check_run(w, got, r, "PollRuns");
        CHECK_STR(w, "PollRuns lease", got->lease, w->m.runs[r].lease);
        note_t n = {.kind = NOTE_LEASE};
        snprintf(n.run_id, sizeof n.run_id, "%s", got->run_id);
        snprintf(n.lease, sizeof n.lease, "%s", got->lease);
        add_note(w, n);
        w->runs_done++;
    }
    /* Oldest first: nothing left pending may be older than what was handed
     * out - but a waiting poll is served as each run becomes pending, one
     * at a time, so runs that became pending in this same instant (leases
     * expiring together) do not count against it. */
    for (uint32_t r = 0; r < w->m.nruns && resp->n_runs > 0; r++) {
        if (w->m.runs[r].status == M_PENDING &&
            m_run_matches(&w->m, (int)r, workflows, nworkflows) &&
            (candidates >= 0 || w->m.runs[r].updated_ms < w->now_ms)) {
            CHECK(w, w->m.runs[r].created_ms >= newest,
                  "PollRuns: run %s (created %" PRId64 ") passed over for a newer one",
                  w->m.runs[r].run_id, w->m.runs[r].created_ms);
        }
    }
}

static int pending_matching(const world_t *w, const int *workflows, int nworkflows) {
    int n = 0;
    for (uint32_t r = 0; r < w->m.nruns; r++) {
        n +=
            w->m.runs[r].status == M_PENDING && m_run_matches(&w->m, (int)r, workflows, nworkflows);
    }
    return n;
}

static void spend(world_t *w, kf_arena_t *arena) {
    CHECK(w, w->nspent < (int)(sizeof w->spent / sizeof w->spent[0]), "too many spent arenas");
    w->spent[w->nspent++] = arena;
}

static void op_poll(world_t *w) {
    int workflows[M_WORKFLOWS];
    int nworkflows = (int)rnd(w, M_WORKFLOWS + 1);
    int first = (int)rnd(w, M_WORKFLOWS);
    for (int i = 0; i < nworkflows; i++) {
        workflows[i] = (first + i) % M_WORKFLOWS;
    }
    int64_t max_runs = PICK(w, 0, 1, 1, 2, 3);
    int64_t lease_ms = PICK(w, 0, 100, 500, 2000, 5000);
    /* Mostly wait when nothing is pending: that is when a poll parks. */
    int wait_percent = pending_matching(w, workflows, nworkflows) == 0 ? 70 : 20;
    int64_t wait_ms =
        w->nparked < PARKED_MAX && chance(w, wait_percent) ? PICK(w, 100, 1000, 5000) : 0;
    char worker[16];
    snprintf(worker, sizeof worker, "w%d", (int)rnd(w, 3));
    if (wait_ms > 0) {
        w->cur = kf_xcalloc(1, sizeof *w->cur); /* it may wait past this group */
        kf_arena_init(w->cur, 0);
    }
    Keyflow__V1__PollRunsRequest *req =
        NEW(Keyflow__V1__PollRunsRequest, keyflow__v1__poll_runs_request__init);
    req->n_workflows = (size_t)nworkflows;
    req->workflows = kf_arena_zalloc(w->cur, (M_WORKFLOWS + 1) * sizeof(char *));
    for (int i = 0; i < nworkflows; i++) {
        req->workflows[i] = (char *)m_workflow_names[workflows[i]];
    }
    req->worker_id = dup_text(w, worker);
    req->max_runs = max_runs;
    req->lease_ms = lease_ms;
    req->wait_ms = wait_ms;
    int64_t want_max = max_runs ? max_runs : 1;
    int64_t granted_ms = lease_ms ? lease_ms : 30000;
    int candidates = pending_matching(w, workflows, nworkflows);
    kf_cmd_t *cmd = kf_arena_zalloc(w->cur, sizeof *cmd);
    cmd->op = KF_OP_POLL_RUNS;
    cmd->request = &req->base;
    cmd->arena = w->cur;
    cmd->id = ++w->next_cmd_id;
    engine_begin(w);
    kf_core_execute(w->core, cmd);
    kf_arena_t *own = w->cur != &w->arena ? w->cur : NULL;
    w->cur = &w->arena;
    if (cmd->parked != NULL) {
        say(w, "poll %d workflow(s) max %" PRId64 " waits %" PRId64 " ms", nworkflows, want_max,
            wait_ms);
        CHECK_EQ(w, "PollRuns parked with pending runs", candidates, 0);
        struct parked_poll *p = &w->parked[w->nparked++];
        *p = (struct parked_poll){.cmd = cmd,
                                  .arena = own,
                                  .nworkflows = nworkflows,
                                  .max_runs = want_max,
                                  .granted_ms = granted_ms,
                                  .deadline_ms = w->now_ms + wait_ms};
        memcpy(p->workflows, workflows, sizeof workflows);
        snprintf(p->worker, sizeof p->worker, "%s", worker);
        return;
    }
    expect_status(w, cmd, KF_OK, "PollRuns");
    Keyflow__V1__PollRunsResponse *resp = (Keyflow__V1__PollRunsResponse *)cmd->response;
    say(w, "poll %d workflow(s) max %" PRId64 " -> %zu of %d pending", nworkflows, want_max,
        resp->n_runs, candidates);
    poll_answered(w, resp, workflows, nworkflows, worker, want_max, granted_ms, candidates);
    if (own != NULL) {
        spend(w, own);
    }
}

/* Long polls that were answered since the last look: by a run that became
 * pending (the longest waiting matching poll first), by their deadline
 * (empty), or by a cancel. Those still waiting must have nothing to take. */
static void settle_polls(world_t *w) {
    for (int k = 0; k < w->nparked;) {
        struct parked_poll *p = &w->parked[k];
        if (p->cmd->parked != NULL) {
            k++;
            continue;
        }
        if (p->cancelled) {
            expect_status(w, p->cmd, KF_E_CANCELLED, "PollRuns cancelled while waiting");
        } else {
            expect_status(w, p->cmd, KF_OK, "PollRuns (long poll)");
            const Keyflow__V1__PollRunsResponse *resp =
                (const Keyflow__V1__PollRunsResponse *)p->cmd->response;
            say(w, "long poll answered with %zu run(s)", resp->n_runs);
            if (resp->n_runs == 0) {
                CHECK(w, w->now_ms >= p->deadline_ms,
                      "PollRuns (long poll) answered empty before its deadline %" PRId64,
                      p->deadline_ms);
            } else {
                for (int e = 0; e < k; e++) { /* still waiting, and longer */
                    for (size_t i = 0; i < resp->n_runs; i++) {
                        int r = m_run_find(&w->m, resp->runs[i]->run_id);
                        CHECK(w,
                              r < 0 || !m_run_matches(&w->m, r, w->parked[e].workflows,
                                                      w->parked[e].nworkflows),
                              "PollRuns: run %s went to a later long poll", resp->runs[i]->run_id);
                    }
                }
                poll_answered(w, resp, p->workflows, p->nworkflows, p->worker, p->max_runs,
                              p->granted_ms, -1);
            }
        }
        spend(w, p->arena);
        memmove(&w->parked[k], &w->parked[k + 1], (size_t)(w->nparked - k - 1) * sizeof *p);
        w->nparked--;
    }
    for (int k = 0; k < w->nparked; k++) {
        const struct parked_poll *p = &w->parked[k];
        CHECK(w, w->now_ms < p->deadline_ms, "PollRuns (long poll) still waits past its deadline");
        CHECK_EQ(w, "pending runs while a long poll for them waits",
                 pending_matching(w, p->workflows, p->nworkflows), 0);
    }
}

/* The client of a waiting poll goes away. */
static void op_cancel_poll(world_t *w) {
    if (w->nparked == 0) {
        return;
    }
    struct parked_poll *p = &w->parked[rnd(w, w->nparked)];
    say(w, "cancel a waiting poll");
    p->cancelled = true;
    engine_begin(w);
    kf_core_cancel(w->core, p->cmd, p->cmd->id);
    CHECK(w, p->cmd->parked == NULL, "a cancelled poll still waits");
}

/* The earliest time the driver must stop the clock at: the model's, or a
 * long poll's deadline. */
static int64_t next_due_ms(const world_t *w) {
    int64_t due = m_next_due_ms(&w->m, w->now_ms);
    for (int k = 0; k < w->nparked; k++) {
        if (w->parked[k].deadline_ms > w->now_ms && w->parked[k].deadline_ms < due) {
            due = w->parked[k].deadline_ms;
        }
    }
    return due;
}

/* Whether a command about run r should find it. Past its retention the
 * run is certainly gone only at a durable point (the sweep deletes through
 * the group it runs in); until then the engine may answer NOT_FOUND, or from
 * the run's latest state - never from an older one. Returns 1 (answer from
 * the model's state), 0 (NOT_FOUND) or -1 (answered NOT_FOUND: accepted). */
static int run_kept_now(const world_t *w, int r, const kf_cmd_t *cmd) {
    int kept = m_run_kept(&w->m, r, w->now_ms);
    if (kept == 1 || (kept == 0 && w->at_durable_point)) {
        return kept;
    }
    return cmd->error.status == KF_E_NOT_FOUND ? -1 : 1;
}

static c_lease_t *random_lease(world_t *w) {
    if (w->nleases == 0) {
        return NULL;
    }
    /* Mostly recent leases: those are the ones a worker still holds. */
    int i = chance(w, 70) ? w->nleases - 1 - (int)rnd(w, w->nleases < 4 ? w->nleases : 4)
                          : (int)rnd(w, w->nleases);
    return &w->leases[i];
}

static void op_heartbeat(world_t *w) {
    c_lease_t *l = random_lease(w);
    if (l == NULL) {
        return;
    }
    int64_t lease_ms = PICK(w, 0, 0, 200, 3000);
    Keyflow__V1__HeartbeatRunRequest *req =
        NEW(Keyflow__V1__HeartbeatRunRequest, keyflow__v1__heartbeat_run_request__init);
    req->run_id = l->run_id;
    req->lease = l->lease;
    req->lease_ms = lease_ms;
    kf_cmd_t *cmd = exec(w, KF_OP_HEARTBEAT_RUN, &req->base);
    say(w, "heartbeat %s -> %s", l->run_id, kf_status_name(cmd->error.status));
    int r = m_run_find(&w->m, l->run_id);
    CHECK(w, r >= 0, "client holds a lease on run %s the model never created", l->run_id);
    int kept = run_kept_now(w, r, cmd);
    if (kept < 0) {
        return; /* past retention and answered as deleted: right too */
    }
    const m_run_t *run = &w->m.runs[r];
    if (kept == 0) {
        expect_status(w, cmd, KF_E_NOT_FOUND, "HeartbeatRun of a run past retention");
    } else if (run->status == M_LEASED && strcmp(run->lease, l->lease) == 0 &&
               w->now_ms < run->lease_expires_ms) {
        expect_status(w, cmd, KF_OK, "HeartbeatRun");
        m_run_heartbeat(&w->m, r, lease_ms, w->now_ms);
        CHECK_EQ(w, "HeartbeatRun lease_expires_ms",
                 ((Keyflow__V1__HeartbeatRunResponse *)cmd->response)->lease_expires_ms,
                 w->m.runs[r].lease_expires_ms);
    } else {
        expect_status(w, cmd, KF_E_PRECONDITION, "HeartbeatRun with a lease that does not hold");
    }
}

static void op_complete(world_t *w) {
    c_lease_t *l = random_lease(w);
    if (l == NULL) {
        return;
    }
    /* A retry repeats the completion the worker sent; otherwise choose. */
    int kind = l->completed ? l->completed : (chance(w, 80) ? 1 : 2);
    if (l->completed && chance(w, 10)) {
        kind = 3 - kind; /* a different outcome on the same lease */
    }
    Keyflow__V1__CompleteRunRequest *req =
        NEW(Keyflow__V1__CompleteRunRequest, keyflow__v1__complete_run_request__init);
    req->run_id = l->run_id;
    req->lease = l->lease;
    char text[32];
    if (kind == 1) {
        snprintf(text, sizeof text, "{\"done\":%d}", (int)(l - w->leases));
        req->outcome_case = KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_RESULT_JSON;
        req->result_json = dup_text(w, text);
    } else {
        snprintf(text, sizeof text, "worker error %d", (int)(l - w->leases));
        req->outcome_case = KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_ERROR;
        req->error = dup_text(w, text);
    }
    kf_cmd_t *cmd = exec(w, KF_OP_COMPLETE_RUN, &req->base);
    say(w, "complete %s %s -> %s", l->run_id, kind == 1 ? "result" : "error",
        kf_status_name(cmd->error.status));
    if (!l->completed) {
        l->completed = kind;
    }
    int r = m_run_find(&w->m, l->run_id);
    CHECK(w, r >= 0, "client holds a lease on run %s the model never created", l->run_id);
    int kept = run_kept_now(w, r, cmd);
    if (kept < 0) {
        return; /* past retention and answered as deleted: right too */
    }
    const m_run_t *run = &w->m.runs[r];
    bool finished = run->status == M_COMPLETED || run->status == M_FAILED;
    if (kept == 0) {
        expect_status(w, cmd, KF_E_NOT_FOUND, "CompleteRun of a run past retention");
    } else if (run->status == M_LEASED && strcmp(run->lease, l->lease) == 0) {
        expect_status(w, cmd, KF_OK, "CompleteRun");
        m_run_finish(&w->m, r, kind == 1, text, w->now_ms);
        Keyflow__V1__CompleteRunResponse *resp = (Keyflow__V1__CompleteRunResponse *)cmd->response;
        CHECK(w, !resp->already_finished, "CompleteRun: already_finished on the first completion");
        check_run(w, resp->run, r, "CompleteRun");
        note_t n = {.kind = NOTE_COMPLETION, .index = (int)(l - w->leases)};
        add_note(w, n);
    } else if (finished && strcmp(run->lease, l->lease) == 0 &&
               (run->status == M_COMPLETED) == (kind == 1)) {
        expect_status(w, cmd, KF_OK, "CompleteRun retry");
        Keyflow__V1__CompleteRunResponse *resp = (Keyflow__V1__CompleteRunResponse *)cmd->response;
        CHECK(w, resp->already_finished, "CompleteRun retry: already_finished not set");
        check_run(w, resp->run, r, "CompleteRun retry");
    } else {
        expect_status(w, cmd, KF_E_PRECONDITION, "CompleteRun without the current lease");
    }
}

static void op_get_run(world_t *w) {
    Keyflow__V1__GetRunRequest *req =
        NEW(Keyflow__V1__GetRunRequest, keyflow__v1__get_run_request__init);
    int r = w->m.nruns > 0 && chance(w, 90) ? (int)rnd(w, w->m.nruns) : -1;
    req->run_id = r >= 0 ? w->m.runs[r].run_id : "k1@00000000-0000-7000-8000-000000000000";
    kf_cmd_t *cmd = exec(w, KF_OP_GET_RUN, &req->base);
    int kept = r >= 0 ? run_kept_now(w, r, cmd) : 0;
    if (kept == 1) {
        expect_status(w, cmd, KF_OK, "GetRun");
        check_run(w, (Keyflow__V1__Run *)cmd->response, r, "GetRun");
    } else if (kept == 0) {
        expect_status(w, cmd, KF_E_NOT_FOUND, "GetRun of an unknown or deleted run");
    }
}

/* ---- process functions --------------------------------------------------------------- */

static Keyflow__V1__Field *field(world_t *w, const char *name, Keyflow__V1__FieldType type,
                                 bool nullable) {
    Keyflow__V1__Field *f = NEW(Keyflow__V1__Field, keyflow__v1__field__init);
    f->name = (char *)name;
    f->type = type;
    f->nullable = nullable;
    return f;
}

static Keyflow__V1__Schema *schema(world_t *w, size_t n, Keyflow__V1__Field **fields) {
    Keyflow__V1__Schema *s = NEW(Keyflow__V1__Schema, keyflow__v1__schema__init);
    s->n_fields = n;
    s->fields = kf_arena_memdup(w->cur, fields, n * sizeof *fields);
    return s;
}

/* The descriptors of handlers/running_sum.descriptor.json.in and
 * handlers/session_counter.descriptor.json.in. */
static Keyflow__V1__FunctionDescriptor *descriptor(world_t *w, int f) {
    Keyflow__V1__FunctionDescriptor *d =
        NEW(Keyflow__V1__FunctionDescriptor, keyflow__v1__function_descriptor__init);
    const Keyflow__V1__FieldType UTF8 = KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8;
    const Keyflow__V1__FieldType TS = KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US;
    const Keyflow__V1__FieldType I64 = KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64;
    d->version = 1;
    d->function_id = (char *)m_fn_ids[f];
    d->pipeline_state_id = kf_arena_printf(w->cur, "%s.v1", m_fn_ids[f]);
    d->runtime = KEYFLOW__V1__RUNTIME__RUNTIME_NATIVE;
    d->implementation_digest = w->digests[f];
    d->determinism = KEYFLOW__V1__DETERMINISM__DETERMINISM_REPLAY_SAFE;
    static char *keys[] = {"user"};
    d->n_key_columns = 1;
    d->key_columns = keys;
    d->event_time_column = "ts";
    d->output_event_time_column = "ts";
    if (f == M_FN_RUNNING_SUM) {
        d->input_schema = schema(w, 3,
                                 (Keyflow__V1__Field *[]){field(w, "user", UTF8, false),
                                                          field(w, "ts", TS, false),
                                                          field(w, "amount", I64, true)});
        d->output_schema =
            schema(w, 4,
                   (Keyflow__V1__Field *[]){field(w, "key", UTF8, false), field(w, "ts", TS, false),
                                            field(w, "sum", I64, true),
                                            field(w, "previous", UTF8, false)});
        d->value_state_name = "sum";
    } else {
        d->input_schema = schema(w, 3,
                                 (Keyflow__V1__Field *[]){field(w, "user", UTF8, false),
                                                          field(w, "ts", TS, false),
                                                          field(w, "idle_us", I64, true)});
        d->output_schema =
            schema(w, 3,
                   (Keyflow__V1__Field *[]){field(w, "key", UTF8, false), field(w, "ts", TS, false),
                                            field(w, "events", I64, false)});
        d->value_state_name = "events";
        static char *timers[] = {"idle"};
        d->n_timer_names = 1;
        d->timer_names = timers;
    }
    return d;
}

static void op_register(world_t *w) {
    int f = (int)rnd(w, M_FNS);
    Keyflow__V1__RegisterFunctionRequest *req =
        NEW(Keyflow__V1__RegisterFunctionRequest, keyflow__v1__register_function_request__init);
    req->descriptor = descriptor(w, f);
    bool changed = w->m.fns[f].registered && chance(w, 15);
    if (changed) {
        req->descriptor->value_state_name = "other";
    }
    kf_cmd_t *cmd = exec(w, KF_OP_REGISTER_FUNCTION, &req->base);
    say(w, "register %s%s -> %s", m_fn_ids[f], changed ? " (changed)" : "",
        kf_status_name(cmd->error.status));
    if (changed) {
        expect_status(w, cmd, KF_E_EXISTS, "RegisterFunction with another descriptor");
        return;
    }
    expect_status(w, cmd, KF_OK, "RegisterFunction");
    Keyflow__V1__RegisterFunctionResponse *resp =
        (Keyflow__V1__RegisterFunctionResponse *)cmd->response;
    CHECK_EQ(w, "RegisterFunction already_registered", resp->already_registered,
             w->m.fns[f].registered);
    CHECK(w, resp->function->available, "RegisterFunction: unavailable: %s",
          resp->function->unavailable_reason);
    M_SAVE(&w->m, w->m.fns[f].registered);
    w->m.fns[f].registered = true;
}

static const char *arg_column(int f) {
    return f == M_FN_RUNNING_SUM ? "amount" : "idle_us";
}

static char *rows_json(world_t *w, const c_push_t *p) {
    json_t *arr = json_array();
    for (int i = 0; i < p->nrows; i++) {
        const m_row_t *row = &p->rows[i];
        json_t *o = json_object();
        json_object_set_new(o, "user", json_string(m_fn_key_names[row->key]));
        json_object_set_new(o, "ts", json_integer(row->ts_us));
        json_object_set_new(o, arg_column(p->fn),
                            row->arg_null ? json_null() : json_integer(row->arg));
        json_array_append_new(arr, o);
    }
    char *text = json_dumps(arr, JSON_COMPACT);
    json_decref(arr);
    char *copy = dup_text(w, text);
    free(text);
    return copy;
}

static Keyflow__V1__RowBatch *rows_batch(world_t *w, const c_push_t *p) {
    Keyflow__V1__RowBatch *b = NEW(Keyflow__V1__RowBatch, keyflow__v1__row_batch__init);
    size_t n = (size_t)p->nrows;
    b->row_count = p->nrows;
    b->n_columns = 3;
    b->columns = kf_arena_zalloc(w->cur, 3 * sizeof *b->columns);
    for (int c = 0; c < 3; c++) {
        b->columns[c] = NEW(Keyflow__V1__Column, keyflow__v1__column__init);
    }
    Keyflow__V1__StringValues *users =
        NEW(Keyflow__V1__StringValues, keyflow__v1__string_values__init);
    Keyflow__V1__Int64Values *ts = NEW(Keyflow__V1__Int64Values, keyflow__v1__int64_values__init);
    Keyflow__V1__Int64Values *arg = NEW(Keyflow__V1__Int64Values, keyflow__v1__int64_values__init);
    users->n_values = ts->n_values = arg->n_values = n;
    users->values = kf_arena_zalloc(w->cur, (n + 1) * sizeof(char *));
    ts->values = kf_arena_zalloc(w->cur, (n + 1) * sizeof(int64_t));
    arg->values = kf_arena_zalloc(w->cur, (n + 1) * sizeof(int64_t));
    protobuf_c_boolean *nulls = kf_arena_zalloc(w->cur, (n + 1) * sizeof *nulls);
    bool any_null = false;
    for (size_t i = 0; i < n; i++) {
        users->values[i] = (char *)m_fn_key_names[p->rows[i].key];
        ts->values[i] = p->rows[i].ts_us;
        arg->values[i] = p->rows[i].arg_null ? 0 : p->rows[i].arg;
        nulls[i] = p->rows[i].arg_null;
        any_null |= p->rows[i].arg_null;
    }
    b->columns[0]->values_case = KEYFLOW__V1__COLUMN__VALUES_STRINGS;
    b->columns[0]->strings = users;
    b->columns[1]->values_case = KEYFLOW__V1__COLUMN__VALUES_INT64S;
    b->columns[1]->int64s = ts;
    b->columns[2]->values_case = KEYFLOW__V1__COLUMN__VALUES_INT64S;
    b->columns[2]->int64s = arg;
    if (any_null) {
        b->columns[2]->n_nulls = n;
        b->columns[2]->nulls = nulls;
    }
    if (chance(w, 50)) {
        b->columns[0]->name = "user"; /* names are optional but must match */
    }
    return b;
}

static void new_push(world_t *w, c_push_t *p) {
    memset(p, 0, sizeof *p);
    p->fn = (int)rnd(w, M_FNS);
    p->producer = (int)rnd(w, M_PRODUCERS);
    int64_t *next = &w->next_sequence[p->fn][p->producer];
    *next += chance(w, 10) ? 1 + rnd(w, 3) : 1; /* gaps are allowed */
    p->sequence = *next;
    p->nrows = (int)rnd(w, PUSH_ROWS_MAX + 1);
    int64_t *wm = &w->client_watermark_us[p->fn];
    for (int i = 0; i < p->nrows; i++) {
        m_row_t *row = &p->rows[i];
        row->key = (int)rnd(w, M_FN_KEYS);
        /* Around the watermark: some rows are late. */
        row->ts_us = *wm + rnd(w, 4000000) - 1000000;
        row->arg_null = chance(w, 12);
        if (p->fn == M_FN_RUNNING_SUM) {
            row->arg = chance(w, 2) ? INT64_MAX - rnd(w, 10) : rnd(w, 201) - 100;
        } else {
            row->arg = chance(w, 2) ? -1 : PICK(w, 0, 1000, 500000, 2000000, 5000000);
        }
    }
    p->has_watermark = chance(w, 60);
    if (p->has_watermark) {
        p->watermark_us = chance(w, 10) ? *wm - rnd(w, 2000000) : *wm + rnd(w, 3000000);
        if (p->watermark_us > *wm) {
            *wm = p->watermark_us;
        }
    }
}

static void push_replied(world_t *w, int i, const kf_cmd_t *cmd);

static bool push_done(const kf_cmd_t *cmd) {
    return cmd->response != NULL || cmd->error.status != KF_OK;
}

static void free_spent(world_t *w) {
    for (int i = 0; i < w->nspent; i++) {
        kf_arena_deinit(w->spent[i]);
        free(w->spent[i]);
    }
    w->nspent = 0;
}

static void drop_outstanding(world_t *w, int k) {
    CHECK(w, w->nspent < (int)(sizeof w->spent / sizeof w->spent[0]), "too many spent arenas");
    w->spent[w->nspent++] = w->outstanding[k].arena;
    memmove(&w->outstanding[k], &w->outstanding[k + 1],
            (size_t)(w->noutstanding - k - 1) * sizeof w->outstanding[0]);
    w->noutstanding--;
}

/* Takes the replies of outstanding pushes that came back, oldest first:
 * one of a function is taken only after every earlier one of it. */
static void settle_pushes(world_t *w) {
    bool blocked[M_FNS] = {false};
    for (int k = 0; k < w->noutstanding;) {
        int fn = w->pushes[w->outstanding[k].push].fn;
        if (blocked[fn] || !push_done(w->outstanding[k].cmd)) {
            blocked[fn] = true;
            k++;
            continue;
        }
        push_replied(w, w->outstanding[k].push, w->outstanding[k].cmd);
        drop_outstanding(w, k);
    }
}

/* Answers the handler calls that are out; their steps go on. */
static void op_pump(world_t *w) {
    say(w, "pump (%d pushes outstanding)", w->noutstanding);
    engine_begin(w);
    kf_core_pump(w->core);
    settle_pushes(w);
}

static void op_push(world_t *w) {
    int i;
    if (w->npushes > 0 && chance(w, 20)) {
        i = (int)rnd(w, w->npushes); /* a retry of the same (producer, sequence, rows) */
    } else {
        CHECK(w, w->npushes < PUSHES_MAX, "client push log full");
        i = w->npushes++;
        new_push(w, &w->pushes[i]);
    }
    c_push_t *p = &w->pushes[i];
    if (w->config.defer_handler_calls && w->m.fns[p->fn].registered) {
        w->cur = kf_xcalloc(1, sizeof *w->cur); /* lives until the reply */
        kf_arena_init(w->cur, 0);
    }
    Keyflow__V1__PushBatchRequest *req =
        NEW(Keyflow__V1__PushBatchRequest, keyflow__v1__push_batch_request__init);
    req->function_id = (char *)m_fn_ids[p->fn];
    req->producer_id = (char *)m_producer_names[p->producer];
    req->sequence = p->sequence;
    if (p->nrows > 0 || chance(w, 50)) {
        if (chance(w, 50)) {
            req->rows_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_ROWS_JSON;
            req->rows_json = rows_json(w, p);
        } else {
            req->rows_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_BATCH;
            req->batch = rows_batch(w, p);
        }
    }
    if (p->has_watermark) {
        req->watermark_present_case =
            KEYFLOW__V1__PUSH_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US;
        req->watermark_us = p->watermark_us;
    }
    kf_cmd_t *cmd = kf_arena_zalloc(w->cur, sizeof *cmd);
    cmd->op = KF_OP_PUSH_BATCH;
    cmd->request = &req->base;
    cmd->arena = w->cur;
    engine_begin(w);
    kf_core_execute(w->core, cmd);
    if (w->cur != &w->arena) {
        /* Its handler calls answer on op_pump: the reply comes later. */
        CHECK(w, w->noutstanding < OUTSTANDING_MAX, "too many pushes outstanding");
        w->outstanding[w->noutstanding++] = (struct outstanding){cmd, i, w->cur};
        w->cur = &w->arena;
        say(w, "push %s %s seq %" PRId64 " rows %d%s (handler calls deferred)", m_fn_ids[p->fn],
            m_producer_names[p->producer], p->sequence, p->nrows, p->has_watermark ? " +wm" : "");
        settle_pushes(w);
        return;
    }
    push_replied(w, i, cmd);
}

/* ReplayBatch of a batch just accepted: both functions are REPLAY_SAFE and
 * their handlers deterministic, so the replay must reproduce the step
 * exactly (replay.c invariant 2: the same timers, in the same order, up to
 * the step's bound); it applies nothing, which the model's later checks
 * see. A push answered at once is the newest kept batch, so it is found;
 * deferred ones may settle together, past what a function keeps. */
static void check_replay(world_t *w, const c_push_t *p, bool must_find) {
    Keyflow__V1__ReplayBatchRequest *req =
        NEW(Keyflow__V1__ReplayBatchRequest, keyflow__v1__replay_batch_request__init);
    req->function_id = (char *)m_fn_ids[p->fn];
    req->producer_id = (char *)m_producer_names[p->producer];
    req->sequence = p->sequence;
    kf_cmd_t *cmd = exec(w, KF_OP_REPLAY_BATCH, &req->base);
    say(w, "replay %s %s seq %" PRId64 " -> %s", m_fn_ids[p->fn], m_producer_names[p->producer],
        p->sequence, kf_status_name(cmd->error.status));
    if (cmd->error.status == KF_E_NOT_FOUND && !must_find) {
        return;
    }
    expect_status(w, cmd, KF_OK, "ReplayBatch");
    Keyflow__V1__ReplayBatchResponse *r = (Keyflow__V1__ReplayBatchResponse *)cmd->response;
    CHECK(w, r->reproduced, "ReplayBatch: not reproduced: %s", r->first_difference);
    CHECK_EQ(w, "ReplayBatch output rows", r->replayed_output_rows, r->recorded_output_rows);
}

/* A push's reply is here: compare it with the model, which applies the
 * push now (pushes of one function run one at a time, in arrival order, so
 * replies come in that order). */
static void push_replied(world_t *w, int i, const kf_cmd_t *cmd) {
    c_push_t *p = &w->pushes[i];
    say(w, "push %s %s seq %" PRId64 " rows %d%s -> %s %s", m_fn_ids[p->fn],
        m_producer_names[p->producer], p->sequence, p->nrows, p->has_watermark ? " +wm" : "",
        kf_status_name(cmd->error.status), cmd->error.status ? cmd->error.message : "");
    CHECK(w, (cmd->error.status == KF_OK) == (cmd->response != NULL),
          "PushBatch: status %s with%s a response", kf_status_name(cmd->error.status),
          cmd->response ? "" : "out");
    if (!w->m.fns[p->fn].registered) {
        expect_status(w, cmd, KF_E_NOT_FOUND, "PushBatch to an unregistered function");
        return;
    }
    m_push_result_t want;
    m_push(&w->m, p->fn, p->producer, p->sequence, p->rows, p->nrows, p->has_watermark,
           p->watermark_us, &want);
    if (want.status != 0) {
        expect_status(w, cmd, KF_E_PRECONDITION, "PushBatch");
        return;
    }
    expect_status(w, cmd, KF_OK, "PushBatch");
    Keyflow__V1__PushBatchResponse *a = (Keyflow__V1__PushBatchResponse *)cmd->response;
    CHECK_EQ(w, "PushBatch duplicate", a->duplicate, want.duplicate);
    CHECK_EQ(w, "PushBatch sequence", a->sequence, want.ack.sequence);
    CHECK_EQ(w, "PushBatch rows_accepted", a->rows_accepted, want.ack.rows_accepted);
    CHECK_EQ(w, "PushBatch activations", a->activations, want.ack.activations);
    CHECK_EQ(w, "PushBatch timer_callbacks", a->timer_callbacks, want.ack.timer_callbacks);
    CHECK_EQ(w, "PushBatch handler_calls", a->handler_calls, want.ack.handler_calls);
    CHECK_EQ(w, "PushBatch first_output_seq", a->first_output_seq, want.ack.first_output_seq);
    CHECK_EQ(w, "PushBatch last_output_seq", a->last_output_seq, want.ack.last_output_seq);
    CHECK_EQ(w, "PushBatch watermark_us", a->watermark_us, want.ack.watermark_us);
    note_t n = {.kind = NOTE_PUSH, .index = i, .ack = want.ack};
    add_note(w, n);
    if (!want.duplicate && chance(w, 30)) {
        check_replay(w, p, !w->config.defer_handler_calls);
    }
}

/* ---- time ------------------------------------------------------------------------------ */

/* Moves the clock to `to_ms`, stopping at every time the model has
 * something due, so windows close at exactly their due times. */
static void op_advance(world_t *w) {
    int64_t delta = chance(w, 30)   ? rnd(w, 5)
                    : chance(w, 60) ? rnd(w, 400)
                    : chance(w, 80) ? rnd(w, 5000)
                                    : rnd(w, 120000);
    int64_t to = w->now_ms + delta;
    say(w, "advance %" PRId64 " ms", delta);
    for (;;) {
        int64_t due = next_due_ms(w);
        int64_t next = due < to ? due : to;
        w->now_ms = next;
        tick(w);
        if (next == to) {
            break;
        }
    }
}

/* ---- checks ------------------------------------------------------------------------------- */

static void check_run(world_t *w, const Keyflow__V1__Run *got, int r, const char *what) {
    const m_run_t *run = &w->m.runs[r];
    const m_coord_t *co = &w->m.coords[run->coord];
    char field[160];
#define F(name) (snprintf(field, sizeof field, "%s %s %s", what, run->run_id, name), field)
    CHECK(w, got != NULL, "%s: no run", what);
    CHECK_STR(w, F("run_id"), got->run_id, run->run_id);
    CHECK_STR(w, F("workflow"), got->workflow, m_workflow_names[co->workflow]);
    CHECK_STR(w, F("key"), got->key, m_key_names[co->key]);
    CHECK_EQ(w, F("kind"), got->kind, co->kind);
    CHECK_STR(w, F("input"), got->input_json, run->input);
    CHECK_EQ(w, F("event_count"), got->event_count, run->event_count);
    CHECK_EQ(w, F("status"), got->status, run->status);
    CHECK_EQ(w, F("attempts"), got->attempts, run->attempts);
    CHECK_EQ(w, F("created_ms"), got->created_ms, run->created_ms);
    CHECK_EQ(w, F("updated_ms"), got->updated_ms, run->updated_ms);
    if (run->attempts > 0) {
        CHECK_STR(w, F("worker_id"), got->worker_id, run->worker);
    }
    if (run->status == M_LEASED) {
        CHECK_EQ(w, F("lease_expires_ms"), got->lease_expires_ms, run->lease_expires_ms);
    }
    if (run->status == M_COMPLETED) {
        CHECK_STR(w, F("result"), got->result_json, run->result);
    }
    if (run->status == M_FAILED) {
        CHECK_STR(w, F("error"), got->error, run->error);
    }
    if (run->status == M_COMPLETED || run->status == M_FAILED) {
        CHECK_EQ(w, F("finished_ms"), got->finished_ms, run->finished_ms);
    }
#undef F
}

static void check_coordinator(world_t *w, int c) {
    const m_coord_t *co = &w->m.coords[c];
    Keyflow__V1__DescribeCoordinatorRequest *req = NEW(
        Keyflow__V1__DescribeCoordinatorRequest, keyflow__v1__describe_coordinator_request__init);
    req->coordinator = coord_ref(w, c);
    size_t before = kf_batch_count(w->batch);
    kf_cmd_t *cmd = exec(w, KF_OP_DESCRIBE_COORDINATOR, &req->base);
    expect_status(w, cmd, KF_OK, "DescribeCoordinator");
    CHECK(w, kf_batch_count(w->batch) == before, "DescribeCoordinator changed something");
    Keyflow__V1__DescribeCoordinatorResponse *d =
        (Keyflow__V1__DescribeCoordinatorResponse *)cmd->response;
    char field[160];
#define F(name) (snprintf(field, sizeof field, "%s %s", coord_name(w, c), name), field)
    bool exists = m_coord_exists(&w->m, c, w->now_ms);
    CHECK_EQ(w, F("exists"), d->exists, exists);
    if (!exists) {
        return;
    }
    CHECK_EQ(w, F("window open"), d->window != NULL, co->open);
    if (co->open) {
        const Keyflow__V1__Window *win = d->window;
        char input[M_INPUT_BYTES];
        m_window_input(&w->m, c, input, sizeof input);
        CHECK_STR(w, F("window.run_id"), win->run_id, co->run_id);
        CHECK_EQ(w, F("window.event_count"), win->event_count, co->event_count);
        CHECK_EQ(w, F("window.opened_ms"), win->opened_ms, co->opened_ms);
        CHECK_EQ(w, F("window.last_ms"), win->last_ms, co->last_ms);
        CHECK_EQ(w, F("window.due_ms"), win->due_ms, co->due_ms);
        CHECK_EQ(w, F("window.input_bytes"), win->input_bytes, strlen(input));
        CHECK_EQ(w, F("window.rule.max_wait_ms"), win->rule->max_wait_ms, co->rule.max_wait_ms);
        CHECK_EQ(w, F("window.rule.dedup_ms"), win->rule->dedup_ms, co->rule.dedup_ms);
        CHECK_EQ(w, F("window.rule.window_ms"), win->rule->window_ms, co->rule.window_ms);
        CHECK_EQ(w, F("window.rule.max_events"), win->rule->max_events, co->rule.max_events);
        CHECK_EQ(w, F("window.rule.max_bytes"), win->rule->max_bytes, co->rule.max_bytes);
        CHECK_EQ(w, F("window.rule.edge"),
                 co->kind == M_DEBOUNCE ? (int)win->rule->edge : M_TRAILING, co->rule.edge);
        CHECK_EQ(w, F("window.run_started"), win->run_started, co->run_started);
        CHECK_EQ(w, F("window.events_absorbed"), win->events_absorbed, co->events_absorbed);
        CHECK(w, win->due_ms > w->now_ms, "%s: open window overdue (due %" PRId64 ")",
              coord_name(w, c), win->due_ms);
    }
    CHECK_EQ(w, F("runs_started"), d->runs_started, co->runs_started);
    CHECK_EQ(w, F("recent_run_ids"), d->n_recent_run_ids, co->nrecent);
    for (size_t i = 0; i < d->n_recent_run_ids; i++) {
        CHECK_STR(w, F("recent_run_ids[]"), d->recent_run_ids[i], co->recent[i]);
    }
    size_t live = 0;
    for (uint32_t i = 0; i < co->nids; i++) {
        const m_id_t *id = &w->m.ids[c][i];
        if (id->expires_ms <= w->now_ms) {
            continue;
        }
        CHECK(w, live < d->n_remembered_ids, "%s: remembered id %s missing", coord_name(w, c),
              id->id);
        const Keyflow__V1__RememberedId *got = d->remembered_ids[live++];
        CHECK_STR(w, F("remembered_ids[].id"), got->id, id->id);
        CHECK_STR(w, F("remembered_ids[].receipt.run_id"), got->receipt->run_id, id->run_id);
        CHECK_EQ(w, F("remembered_ids[].receipt.due_ms"), got->receipt->due_ms, id->due_ms);
        CHECK_EQ(w, F("remembered_ids[].expires_ms"), got->expires_ms, id->expires_ms);
        CHECK_EQ(w, F("remembered_ids[].receipt.commit_seq"), got->receipt->commit_seq,
                 id->commit_seq);
    }
    CHECK_EQ(w, F("remembered_ids"), d->n_remembered_ids, live);
    CHECK_EQ(w, F("journal_seq"), d->journal_seq, co->journal_seq);
    CHECK_EQ(w, F("journal_length"), d->journal_length, co->journal_len);
    CHECK_EQ(w, F("compactions"), d->compactions, co->compactions);
    CHECK_EQ(w, F("journal entries (durable)"), d->n_journal, co->journal_len);
#undef F
}

/* GetRun for the runs that changed since the last check (and those whose
 * retention may have ended), plus a rotating few of the others, so a long
 * world's checks stay linear; ListRuns below still sees every run. */
static void check_runs(world_t *w) {
    uint32_t rotating = 16;
    for (uint32_t r = 0; r < w->m.nruns; r++) {
        int kept = m_run_kept(&w->m, (int)r, w->now_ms);
        const m_run_t *run = &w->m.runs[r];
        bool changed = run->updated_ms >= w->last_check_ms ||
                       (kept != 1 && run->finished_ms + w->m.retention_ms + M_SWEEP_SLACK_MS >=
                                         w->last_check_ms);
        bool turn = (r + w->commits) % 64 == 0 && rotating > 0;
        if (kept < 0 || !(changed || turn)) {
            continue;
        }
        rotating -= turn;
        Keyflow__V1__GetRunRequest *req =
            NEW(Keyflow__V1__GetRunRequest, keyflow__v1__get_run_request__init);
        req->run_id = w->m.runs[r].run_id;
        kf_cmd_t *cmd = exec(w, KF_OP_GET_RUN, &req->base);
        if (kept) {
            expect_status(w, cmd, KF_OK, "GetRun");
            check_run(w, (Keyflow__V1__Run *)cmd->response, (int)r, "GetRun");
        } else {
            expect_status(w, cmd, KF_E_NOT_FOUND, "GetRun past retention");
        }
    }
    /* Every stored run, page by page: each one a model run, none twice. */
    bool *seen = calloc(w->m.nruns + 1, sizeof *seen);
    const char *token = "";
    size_t listed = 0;
    for (int page = 0; page < 1000; page++) {
        Keyflow__V1__ListRunsRequest *req =
            NEW(Keyflow__V1__ListRunsRequest, keyflow__v1__list_runs_request__init);
        req->page_size = 1 + rnd(w, 300);
        req->page_token = (char *)token;
        kf_cmd_t *cmd = exec(w, KF_OP_LIST_RUNS, &req->base);
        expect_status(w, cmd, KF_OK, "ListRuns");
        Keyflow__V1__ListRunsResponse *resp = (Keyflow__V1__ListRunsResponse *)cmd->response;
        for (size_t i = 0; i < resp->n_runs; i++) {
            int r = m_run_find(&w->m, resp->runs[i]->run_id);
            CHECK(w, r >= 0, "ListRuns: run %s is not in the model (created twice, or never)",
                  resp->runs[i]->run_id);
            CHECK(w, !seen[r], "ListRuns: run %s listed twice", resp->runs[i]->run_id);
            CHECK(w, m_run_kept(&w->m, r, w->now_ms) != 0, "ListRuns: run %s is past retention",
                  resp->runs[i]->run_id);
            seen[r] = true;
            listed++;
        }
        if (resp->next_page_token[0] == '\0') {
            break;
        }
        token = resp->next_page_token;
    }
    for (uint32_t r = 0; r < w->m.nruns; r++) {
        if (m_run_kept(&w->m, (int)r, w->now_ms) == 1) {
            CHECK(w, seen[r], "ListRuns: run %s is missing", w->m.runs[r].run_id);
        }
    }
    free(seen);
    (void)listed;
}

static const char *state_word(int kind) {
    return kind == M_ABSENT ? "absent" : kind == M_NULL ? "null" : "value";
}

static int64_t json_int(world_t *w, json_t *o, const char *name) {
    json_t *v = json_object_get(o, name);
    CHECK(w, json_is_string(v), "output row: %s is not an int64 string", name);
    return strtoll(json_string_value(v), NULL, 10);
}

static void check_function(world_t *w, int f) {
    const m_fn_t *fn = &w->m.fns[f];
    Keyflow__V1__GetFunctionRequest *greq =
        NEW(Keyflow__V1__GetFunctionRequest, keyflow__v1__get_function_request__init);
    greq->function_id = (char *)m_fn_ids[f];
    kf_cmd_t *cmd = exec(w, KF_OP_GET_FUNCTION, &greq->base);
    if (!fn->registered) {
        expect_status(w, cmd, KF_E_NOT_FOUND, "GetFunction of an unregistered function");
        return;
    }
    expect_status(w, cmd, KF_OK, "GetFunction");
    Keyflow__V1__FunctionInfo *info = (Keyflow__V1__FunctionInfo *)cmd->response;
    int64_t keys = 0, timers = 0, state_bytes = 0;
    for (int k = 0; k < M_FN_KEYS; k++) {
        keys += fn->state[k] != M_ABSENT || fn->timer_us[k] != M_NO_TIME;
        timers += fn->timer_us[k] != M_NO_TIME;
        /* docs/semantics.md: a live key costs its canonical key, 9 bytes for
         * a value and its timers' names and 8 bytes each ("idle"). */
        if (fn->state[k] != M_ABSENT || fn->timer_us[k] != M_NO_TIME) {
            state_bytes += 4 + (int64_t)strlen(m_fn_key_names[k]) +
                           (fn->state[k] != M_ABSENT ? 9 : 0) +
                           (fn->timer_us[k] != M_NO_TIME ? 4 + 8 : 0);
        }
    }
    char field[160];
#define F(name) (snprintf(field, sizeof field, "%s %s", m_fn_ids[f], name), field)
    CHECK_EQ(w, F("watermark_us"), info->watermark_us, fn->has_watermark ? fn->watermark_us : 0);
    CHECK_EQ(w, F("output_seq"), info->output_seq, fn->nout);
    CHECK_EQ(w, F("keys"), info->keys, keys);
    CHECK_EQ(w, F("timers"), info->timers, timers);
    CHECK_EQ(w, F("state_bytes"), info->state_bytes, state_bytes);
    /* At most M_FN_KEYS timers, far below max_timer_callbacks_per_step: a
     * batch's step fires every due timer and no follow-on step is left. */
    CHECK_EQ(w, F("due_timers"), info->due_timers, 0);
    for (int k = 0; k < M_FN_KEYS; k++) {
        Keyflow__V1__GetKeyStateRequest *req =
            NEW(Keyflow__V1__GetKeyStateRequest, keyflow__v1__get_key_state_request__init);
        req->function_id = (char *)m_fn_ids[f];
        req->key = (char *)m_fn_key_names[k];
        cmd = exec(w, KF_OP_GET_KEY_STATE, &req->base);
        expect_status(w, cmd, KF_OK, "GetKeyState");
        Keyflow__V1__GetKeyStateResponse *s = (Keyflow__V1__GetKeyStateResponse *)cmd->response;
        snprintf(field, sizeof field, "%s key %s state", m_fn_ids[f], m_fn_key_names[k]);
        CHECK_EQ(w, field, s->state, fn->state[k]);
        if (fn->state[k] == M_VALUE) {
            snprintf(field, sizeof field, "%s key %s value", m_fn_ids[f], m_fn_key_names[k]);
            CHECK_EQ(w, field, s->value, fn->value[k]);
        }
        snprintf(field, sizeof field, "%s key %s timers", m_fn_ids[f], m_fn_key_names[k]);
        CHECK_EQ(w, field, s->n_timers, fn->timer_us[k] != M_NO_TIME);
        if (s->n_timers == 1) {
            snprintf(field, sizeof field, "%s key %s timer idle", m_fn_ids[f], m_fn_key_names[k]);
            CHECK_EQ(w, field, s->timers[0]->at_us, fn->timer_us[k]);
        }
    }
    /* The whole output stream, in pages: dense sequences, the model's rows.
     * ReadOutput shows what the engine was told is durable, so a world
     * whose durable notices lag sees the stream a group behind: it checks
     * the rest. */
    int64_t after = 0;
    while (!w->lag_durable && (after < (int64_t)fn->nout || after == 0)) {
        Keyflow__V1__ReadOutputRequest *req =
            NEW(Keyflow__V1__ReadOutputRequest, keyflow__v1__read_output_request__init);
        req->function_id = (char *)m_fn_ids[f];
        req->after_seq = after;
        req->limit = 1 + rnd(w, 64);
        req->format = KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON;
        cmd = exec(w, KF_OP_READ_OUTPUT, &req->base);
        expect_status(w, cmd, KF_OK, "ReadOutput");
        Keyflow__V1__ReadOutputResponse *resp = (Keyflow__V1__ReadOutputResponse *)cmd->response;
        CHECK_EQ(w, F("high_water_seq"), resp->high_water_seq, fn->nout);
        json_t *rows = json_loads(resp->rows_json[0] ? resp->rows_json : "[]", 0, NULL);
        CHECK(w, json_is_array(rows), "ReadOutput: rows_json is not an array");
        size_t n = json_array_size(rows);
        if (n == 0) {
            json_decref(rows);
            CHECK_EQ(w, F("output rows after the last"), after, fn->nout);
            break;
        }
        CHECK_EQ(w, F("first_seq"), resp->first_seq, after + 1);
        CHECK_EQ(w, F("last_seq"), resp->last_seq, after + (int64_t)n);
        for (size_t i = 0; i < n; i++) {
            json_t *o = json_array_get(rows, i);
            int64_t seq = json_int(w, o, "_seq");
            CHECK_EQ(w, F("output _seq (dense)"), seq, after + 1 + (int64_t)i);
            CHECK(w, seq <= (int64_t)fn->nout, "%s: output row %" PRId64 " beyond the model's",
                  m_fn_ids[f], seq);
            const m_out_row_t *want = &w->m.out[f][seq - 1];
            snprintf(field, sizeof field, "%s output %" PRId64 " key", m_fn_ids[f], seq);
            CHECK_STR(w, field, json_string_value(json_object_get(o, "key")),
                      m_fn_key_names[want->key]);
            snprintf(field, sizeof field, "%s output %" PRId64 " ts", m_fn_ids[f], seq);
            CHECK_EQ(w, field, json_int(w, o, "ts"), want->ts_us);
            snprintf(field, sizeof field, "%s output %" PRId64 " value", m_fn_ids[f], seq);
            if (f == M_FN_RUNNING_SUM) {
                json_t *sum = json_object_get(o, "sum");
                CHECK_EQ(w, field, json_is_null(sum), want->value_null);
                if (!want->value_null) {
                    CHECK_EQ(w, field, json_int(w, o, "sum"), want->value);
                }
                snprintf(field, sizeof field, "%s output %" PRId64 " previous", m_fn_ids[f], seq);
                CHECK_STR(w, field, json_string_value(json_object_get(o, "previous")),
                          state_word(want->previous));
            } else {
                CHECK_EQ(w, field, json_int(w, o, "events"), want->value);
            }
        }
        json_decref(rows);
        after += (int64_t)n;
        CHECK_EQ(w, F("next_after_seq"), resp->next_after_seq, after);
    }
#undef F
}

/* Everything the client saw acknowledged is in the model (which the
 * engine was just compared with). */
static void check_acknowledged(world_t *w) {
    for (int e = 0; e < w->nevents; e++) {
        const c_event_t *ev = &w->events[e];
        if (!ev->acked) {
            continue;
        }
        const m_event_t *me = &w->m.events[e];
        CHECK(w, me->accepted, "acknowledged event %d (id %s) is lost", e, ev->id);
        CHECK(w, strcmp(me->run_id, ev->receipt_run_id) == 0,
              "acknowledged event %d joined %s, its receipt named %s", e, me->run_id,
              ev->receipt_run_id);
    }
    for (int i = 0; i < w->npushes; i++) {
        const c_push_t *p = &w->pushes[i];
        if (p->acked) {
            CHECK(w, w->m.fns[p->fn].producers[p->producer].last_sequence >= p->sequence,
                  "acknowledged push %s seq %" PRId64 " is lost", m_producer_names[p->producer],
                  p->sequence);
        }
    }
}

static void full_check(world_t *w) {
    for (int c = 0; c < M_COORDS; c++) {
        check_coordinator(w, c);
    }
    check_runs(w);
    for (int f = 0; f < M_FNS; f++) {
        check_function(w, f);
    }
    check_acknowledged(w);
    w->last_check_ms = w->now_ms;
}

/* The group is durable: its replies reach the client. */
static void apply_notes(world_t *w) {
    for (int i = 0; i < w->nnotes; i++) {
        const note_t *n = &w->notes[i];
        switch (n->kind) {
        case NOTE_EVENT: {
            c_event_t *ev = &w->events[n->index];
            if (!ev->acked) {
                ev->acked = true;
                snprintf(ev->receipt_run_id, sizeof ev->receipt_run_id, "%s", n->run_id);
            } else {
                CHECK(w, strcmp(ev->receipt_run_id, n->run_id) == 0,
                      "event %d: a retry's receipt names %s, the first named %s", n->index,
                      n->run_id, ev->receipt_run_id);
            }
            break;
        }
        case NOTE_LEASE: {
            CHECK(w, w->nleases < LEASES_MAX, "client lease log full");
            c_lease_t *l = &w->leases[w->nleases++];
            memset(l, 0, sizeof *l);
            snprintf(l->run_id, sizeof l->run_id, "%s", n->run_id);
            snprintf(l->lease, sizeof l->lease, "%s", n->lease);
            break;
        }
        case NOTE_COMPLETION: w->leases[n->index].completion_acked = true; break;
        case NOTE_PUSH: {
            c_push_t *p = &w->pushes[n->index];
            if (p->acked) {
                CHECK(w, memcmp(&p->ack, &n->ack, sizeof p->ack) == 0,
                      "push %s seq %" PRId64 ": a retry's acknowledgement differs from the first",
                      m_producer_names[p->producer], p->sequence);
            }
            p->acked = true;
            p->ack = n->ack;
            break;
        }
        }
    }
    w->nnotes = 0;
}

/* ---- one seed ------------------------------------------------------------------------------ */

static void world_open(world_t *w, uint64_t seed, long steps, bool verbose,
                       const char *plugin_dir) {
    memset(w, 0, sizeof *w);
    w->seed = seed;
    w->rng = seed * UINT64_C(0x2545F4914F6CDD1D) + 1;
    w->steps = steps;
    w->verbose = verbose;
    w->plugin_dir = plugin_dir;
    w->now_ms = START_MS + (int64_t)(seed % 1000);
    for (int f = 0; f < M_FNS; f++) {
        w->client_watermark_us[f] = START_US;
    }
    const char *files[M_FNS] = {KF_SIM_RUNNING_SUM_SO, KF_SIM_SESSION_COUNTER_SO};
    for (int f = 0; f < M_FNS; f++) {
        uint8_t d[KF_SHA256_BYTES];
        kf_error_t err;
        CHECK(w, kf_sha256_file(files[f], d, &err) == KF_OK, "%s", err.message);
        kf_hex_encode(d, sizeof d, w->digests[f]);
    }
    int64_t retention = PICK(w, 1000, 5000, 60000);
    int64_t attempts = PICK(w, 1, 2, 3);
    model_init(&w->m, (uint32_t)(steps * 2 + 64), EVENTS_MAX, (uint64_t)steps * 16 + 64, retention,
               attempts);
    w->config.clock = kf_clock_manual(&w->now_ms);
    w->config.rng_seed = w->rng_seed;
    w->config.rng_seed_len = sizeof w->rng_seed;
    w->config.run_retention_ms = retention;
    w->config.run_attempts_max = attempts;
    w->config.plugin_dir = plugin_dir;
    /* Half the worlds answer handler calls only on op_pump, as a remote
     * worker would: steps wait, later pushes queue behind them, and crashes
     * and reads meet steps half done. */
    w->config.defer_handler_calls = chance(w, 50);
    w->config.replay_batches = PICK(w, 1, 2, 8);
    w->lag_durable = chance(w, 50);
    kf_arena_init(&w->arena, 0);
    w->cur = &w->arena;
    w->disk = kf_memdisk_create();
    recover(w);
}

static void world_close(world_t *w) {
    drop_engine(w);
    free_spent(w);
    kf_memdisk_destroy(w->disk);
    kf_arena_deinit(&w->arena);
    model_deinit(&w->m);
}

static void run_seed(world_t *w, uint64_t seed, long steps, bool verbose, const char *plugin_dir) {
    world_open(w, seed, steps, verbose, plugin_dir);
    g_world = w;
    for (w->step = 1; w->step <= steps; w->step++) {
        int64_t op = rnd(w, 100);
        if (op < 20) {
            op_send_event(w);
        } else if (op < 24) {
            op_send_events(w);
        } else if (op < 28) {
            op_flush_or_cancel(w, true);
        } else if (op < 31) {
            op_flush_or_cancel(w, false);
        } else if (op < 39) {
            op_poll(w);
        } else if (op < 43) {
            op_heartbeat(w);
        } else if (op < 51) {
            op_complete(w);
        } else if (op < 52) {
            op_get_run(w);
        } else if (op < 53) {
            op_cancel_poll(w);
        } else if (op < 56) {
            op_register(w);
        } else if (op < 68) {
            op_push(w);
        } else if (op < 72) {
            op_pump(w);
        } else if (op < 92) {
            op_advance(w);
        } else if (op < 97) {
            if (!commit(w)) {
                continue;
            }
        } else {
            crash(w);
            continue;
        }
        tick(w);
        if (chance(w, 50)) {
            commit(w);
        }
    }
    for (int i = 0; i < 64 && w->noutstanding > 0; i++) {
        op_pump(w); /* let every step finish */
    }
    CHECK(w, w->noutstanding == 0, "%d pushes never answered", w->noutstanding);
    while (w->nparked > 0) {
        w->now_ms = next_due_ms(w); /* the polls' deadlines: they end empty */
        tick(w);
    }
    commit(w);
    g_world = NULL;
    world_close(w);
}

/* ---- many seeds ------------------------------------------------------------------------------ */

static void usage(FILE *to) {
    fprintf(to,
            "usage: keyflow_sim --seed S [--steps N] [--verbose]\n"
            "       keyflow_sim --seeds N [--from S] [--steps N] [--jobs J]\n"
            "Runs the seeded simulation of the engine core (tests/sim/README.md).\n"
            "  --seed S      run one seed (replay a failure; --verbose prints every step)\n"
            "  --seeds N     run seeds S .. S+N-1 (--from S, default 1)\n"
            "  --steps N     operations per seed (default %d, at most 10000)\n"
            "  --jobs J      worker processes (default 1; e.g. $(nproc))\n"
            "  --plugin-dir  the example handlers' directory (default: the build's)\n",
            DEFAULT_STEPS);
}

/* Runs seeds from, from + stride, ... below from + count; 0 when all pass. */
static int run_range(uint64_t from, uint64_t count, uint64_t offset, uint64_t stride, long steps,
                     const char *plugin_dir, bool progress) {
    static world_t world; /* large: not on the stack */
    uint64_t done = 0;
    for (uint64_t i = offset; i < count; i += stride) {
        run_seed(&world, from + i, steps, false, plugin_dir);
        done++;
        if (progress && done % 10000 == 0) {
            fprintf(stderr, "keyflow_sim: %" PRIu64 " seeds passed\n", done * stride);
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    g_argv0 = argv[0];
    uint64_t seed = 0, from = 1, seeds = 0;
    long steps = DEFAULT_STEPS, jobs = 1;
    bool one = false, verbose = false;
    const char *plugin_dir = KF_SIM_PLUGIN_DIR;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--verbose") == 0) {
            verbose = true;
            continue;
        }
        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (v == NULL) {
            usage(stderr);
            return 2;
        }
        char *end;
        errno = 0;
        unsigned long long n = strtoull(v, &end, 10);
        bool numeric = errno == 0 && *end == '\0' && end != v;
        if (strcmp(a, "--plugin-dir") == 0) {
            plugin_dir = v;
        } else if (!numeric) {
            fprintf(stderr, "keyflow_sim: %s needs a number, got %s\n", a, v);
            return 2;
        } else if (strcmp(a, "--seed") == 0) {
            seed = n;
            one = true;
        } else if (strcmp(a, "--seeds") == 0) {
            seeds = n;
        } else if (strcmp(a, "--from") == 0) {
            from = n;
        } else if (strcmp(a, "--steps") == 0 && n >= 1 && n <= 10000) {
            steps = (long)n;
        } else if (strcmp(a, "--jobs") == 0 && n >= 1 && n <= 256) {
            jobs = (long)n;
        } else {
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (!one && seeds == 0) {
        usage(stderr);
        return 2;
    }
    kf_log_set_level(KF_LOG_ERROR); /* recovery logs a line per restart */
    signal(SIGABRT, on_abort);
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (one) {
        static world_t world;
        run_seed(&world, seed, steps, verbose, plugin_dir);
        printf("keyflow_sim: seed %" PRIu64 " passed (%ld steps, %" PRIu64 " commits, %" PRIu64
               " crashes, %" PRIu64 " write faults)\n",
               seed, steps, world.commits, world.crashes, world.faults);
        return 0;
    }
    int failed = 0;
    if (jobs == 1) {
        failed = run_range(from, seeds, 0, 1, steps, plugin_dir, true);
    } else {
        pid_t pids[256];
        for (long j = 0; j < jobs; j++) {
            pids[j] = fork();
            if (pids[j] < 0) {
                perror("keyflow_sim: fork");
                return 1;
            }
            if (pids[j] == 0) {
                _exit(
                    run_range(from, seeds, (uint64_t)j, (uint64_t)jobs, steps, plugin_dir, j == 0));
            }
        }
        for (long left = jobs; left > 0; left--) {
            int status;
            pid_t pid = wait(&status);
            if (pid < 0) {
                break;
            }
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                failed = 1;
                for (long j = 0; j < jobs; j++) {
                    if (pids[j] != pid) {
                        kill(pids[j], SIGTERM); /* our own children, by pid */
                    }
                }
            }
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    if (failed) {
        fprintf(stderr, "keyflow_sim: FAILED (see the seed above)\n");
        return 1;
    }
    printf("keyflow_sim: %" PRIu64 " seeds (%" PRIu64 "..%" PRIu64
           ") x %ld steps passed in %.1f s\n",
           seeds, from, from + seeds - 1, steps, secs);
    return 0;
}
