/*
 * runs.c - the run table, per-workflow pending queues, leases, parked long
 * polls, retention. See runs.h for the state machine and invariants.
 */
#include "runs/runs.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/json.h"
#include "base/bytes.h"
#include "base/log.h"
#include "base/map.h"
#include "base/pq.h"
#include "base/metrics.h"
#include "base/text.h"
#include "keyflow/v1/runs.pb-c.h"
#include "records/records.pb-c.h"

enum {
    ST_PENDING = KEYFLOW__V1__RUN_STATUS__RUN_STATUS_PENDING,
    ST_LEASED = KEYFLOW__V1__RUN_STATUS__RUN_STATUS_LEASED,
    ST_COMPLETED = KEYFLOW__V1__RUN_STATUS__RUN_STATUS_COMPLETED,
    ST_FAILED = KEYFLOW__V1__RUN_STATUS__RUN_STATUS_FAILED,
};

typedef struct wfq wfq_t;

typedef struct run {
    kf_map_node_t node;    /* by run_id */
    kf_timer_t timer;      /* LEASED: lease expiry; finished: retention */
    int64_t wakeup_due_ms; /* the stored wake-up, or KF_NO_WAKEUP */
    char *run_id;          /* owned strings */
    char *workflow;
    char *key;
    int kind;
    char *input;
    int64_t event_count;
    int status;
    int64_t attempts;
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
    wfq_t *queue;            /* its workflow's pending queue, while PENDING */
    kf_pq_node_t queue_node; /* position in that queue */
    uint64_t finished_group; /* group of the finishing write (or of the deletion) */
    bool deleted;            /* retention ended before the finish was durable:
                                a tombstone until the deletion is (see fire) */
    struct run *evict_prev;  /* finished, waiting for durability */
    struct run *evict_next;
} run_t;

/* Pending runs of one workflow, oldest (lowest run sequence) first. */
struct wfq {
    kf_map_node_t node; /* by workflow */
    char *workflow;
    kf_pq_t pq;
};

typedef struct poller {
    kf_cmd_t *cmd;
    kf_timer_t timer; /* the long poll's deadline */
    struct poller *prev;
    struct poller *next;
} poller_t;

struct kf_runs {
    kf_map_t by_id;
    kf_map_t queues;
    uint64_t next_seq;
    uint64_t pending;
    uint64_t leased;
    poller_t *polls_head; /* FIFO: the longest waiting poll is served first */
    poller_t *polls_tail;
    uint32_t polls;
    run_t *evict_head;
    run_t *evict_tail;
    kf_key_t sweep_cursor; /* wake-ups before it were swept */
    bool sweep_started;
};

static const char run_seq_key[] = "run_seq";

static void publish(const kf_runs_t *rs) {
    kf_gauge_set(KF_G_RUNS_PENDING, (int64_t)rs->pending);
    kf_gauge_set(KF_G_RUNS_LEASED, (int64_t)rs->leased);
    kf_gauge_set(KF_G_PARKED_POLLS, rs->polls);
}

static int64_t retention_ms(const kf_ctx_t *ctx) {
    int64_t r = ctx->config->run_retention_ms;
    return r > 0 ? r : KF_RETENTION_MS_DEFAULT;
}

static int64_t attempts_max(const kf_ctx_t *ctx) {
    int64_t a = ctx->config->run_attempts_max;
    return a > 0 ? a : KF_RUN_ATTEMPTS_DEFAULT;
}

/* ---- pending queues ---------------------------------------------------- */

static bool run_before(const kf_pq_node_t *a, const kf_pq_node_t *b, const void *ctx) {
    (void)ctx;
    return KF_CONTAINER_OF(a, run_t, queue_node)->seq < KF_CONTAINER_OF(b, run_t, queue_node)->seq;
}

static wfq_t *queue_get(kf_runs_t *rs, const char *workflow, bool create) {
    kf_map_node_t *n = kf_map_get(&rs->queues, workflow, strlen(workflow));
    if (n != NULL) {
        return KF_CONTAINER_OF(n, wfq_t, node);
    }
    if (!create) {
        return NULL;
    }
    wfq_t *q = kf_xcalloc(1, sizeof *q);
    q->workflow = kf_xstrdup(workflow);
    kf_pq_init(&q->pq, run_before, NULL);
    kf_map_insert(&rs->queues, &q->node, q->workflow, strlen(q->workflow));
    return q;
}

static void enqueue(kf_runs_t *rs, run_t *r) {
    wfq_t *q = queue_get(rs, r->workflow, true);
    r->queue = q;
    kf_pq_push(&q->pq, &r->queue_node);
    rs->pending++;
}

static void dequeue(kf_runs_t *rs, run_t *r) {
    KF_ASSERT(r->queue != NULL && kf_pq_queued(&r->queue_node));
    kf_pq_remove(&r->queue->pq, &r->queue_node);
    r->queue = NULL;
    rs->pending--;
}

static run_t *queue_head(const wfq_t *q) {
    kf_pq_node_t *n = kf_pq_top(&q->pq);
    return n ? KF_CONTAINER_OF(n, run_t, queue_node) : NULL;
}

/* The oldest pending run among `workflows` (all workflows when n == 0). */
static run_t *oldest_pending(kf_runs_t *rs, char **workflows, size_t n) {
    run_t *best = NULL;
    if (n == 0) {
        size_t b;
        for (kf_map_node_t *m = kf_map_first(&rs->queues, &b); m;
             m = kf_map_next(&rs->queues, &b, m)) {
            run_t *head = queue_head(KF_CONTAINER_OF(m, wfq_t, node));
            if (head != NULL && (best == NULL || head->seq < best->seq)) {
                best = head;
            }
        }
        return best;
    }
    for (size_t i = 0; i < n; i++) {
        wfq_t *q = queue_get(rs, workflows[i], false);
        run_t *head = q ? queue_head(q) : NULL;
        if (head != NULL && (best == NULL || head->seq < best->seq)) {
            best = head;
        }
    }
    return best;
}

/* ---- records ----------------------------------------------------------- */

static void run_to_rec(const run_t *r, Keyflow__Records__RunRec *rec) {
    keyflow__records__run_rec__init(rec);
    rec->run_id = r->run_id;
    rec->workflow = r->workflow;
    rec->key = r->key;
    rec->kind = r->kind;
    rec->input_json = r->input;
    rec->event_count = r->event_count;
    rec->status = r->status;
    rec->attempts = r->attempts;
    rec->created_ms = r->created_ms;
    rec->updated_ms = r->updated_ms;
    rec->worker_id = r->worker_id ? r->worker_id : "";
    rec->lease = (char *)r->lease;
    rec->lease_owner = (char *)r->lease_owner;
    rec->lease_ms = r->lease_ms;
    rec->lease_expires_ms = r->lease_expires_ms;
    rec->result_json = r->result_json ? r->result_json : "";
    rec->error = r->error ? r->error : "";
    rec->finished_ms = r->finished_ms;
    rec->seq = r->seq;
}

static void run_save(kf_ctx_t *ctx, const run_t *r) {
    Keyflow__Records__RunRec rec;
    run_to_rec(r, &rec);
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_raw(&k, r->run_id, strlen(r->run_id));
    kf_ctx_put_msg(ctx, KF_CF_RUNS, &k, &rec.base);
}

/* The API view of a record; strings are copied into the arena. The lease
 * token goes only to the worker that holds it. */
static Keyflow__V1__Run *rec_to_pb(kf_arena_t *arena, const Keyflow__Records__RunRec *rec,
                                   bool with_lease) {
    Keyflow__V1__Run *p = kf_arena_new(arena, sizeof *p);
    keyflow__v1__run__init(p);
    p->run_id = kf_arena_strdup(arena, rec->run_id);
    p->workflow = kf_arena_strdup(arena, rec->workflow);
    p->key = kf_arena_strdup(arena, rec->key);
    p->kind = (Keyflow__V1__RuleKind)rec->kind;
    p->input_json = kf_arena_strdup(arena, rec->input_json);
    p->event_count = rec->event_count;
    p->status = (Keyflow__V1__RunStatus)rec->status;
    p->attempts = rec->attempts;
    p->created_ms = rec->created_ms;
    p->updated_ms = rec->updated_ms;
    p->worker_id = kf_arena_strdup(arena, rec->worker_id);
    p->lease = with_lease ? kf_arena_strdup(arena, rec->lease) : "";
    p->lease_expires_ms = rec->status == ST_LEASED ? rec->lease_expires_ms : 0;
    p->result_json = kf_arena_strdup(arena, rec->result_json);
    p->error = kf_arena_strdup(arena, rec->error);
    p->finished_ms = rec->finished_ms;
    KF_ASSERT(p->run_id && p->workflow && p->key && p->input_json && p->worker_id && p->lease &&
              p->result_json && p->error);
    return p;
}

static Keyflow__V1__Run *run_to_pb(kf_arena_t *arena, const run_t *r, bool with_lease) {
    Keyflow__Records__RunRec rec;
    run_to_rec(r, &rec);
    return rec_to_pb(arena, &rec, with_lease);
}

static run_t *run_find(const kf_runs_t *rs, const char *run_id) {
    kf_map_node_t *n = kf_map_get(&rs->by_id, run_id, strlen(run_id));
    return n ? KF_CONTAINER_OF(n, run_t, node) : NULL;
}

/* A tombstone (see kf_runs_fire) answers like a run that does not exist;
 * it must not fall through to the older stored record. */
static bool refuse_deleted(kf_ctx_t *ctx, kf_cmd_t *cmd, const run_t *r, const char *run_id) {
    if (r == NULL || !r->deleted) {
        return false;
    }
    kf_error_set(&cmd->error, KF_E_NOT_FOUND, "run_id: no run %s", run_id);
    kf_ctx_fail(ctx, cmd);
    return true;
}

bool kf_runs_live(const kf_runs_t *rs, const char *run_id) {
    const run_t *r = run_find(rs, run_id);
    return r != NULL && (r->status == ST_PENDING || r->status == ST_LEASED);
}

static run_t *run_from_rec(const Keyflow__Records__RunRec *rec) {
    run_t *r = kf_xcalloc(1, sizeof *r);
    kf_timer_init(&r->timer, KF_TIMER_RUN);
    kf_pq_node_init(&r->queue_node);
    r->wakeup_due_ms = KF_NO_WAKEUP;
    r->run_id = kf_xstrdup(rec->run_id);
    r->workflow = kf_xstrdup(rec->workflow);
    r->key = kf_xstrdup(rec->key);
    r->kind = rec->kind;
    r->input = kf_xstrdup(rec->input_json);
    r->event_count = rec->event_count;
    r->status = rec->status;
    r->attempts = rec->attempts;
    r->created_ms = rec->created_ms;
    r->updated_ms = rec->updated_ms;
    r->worker_id = rec->worker_id[0] ? kf_xstrdup(rec->worker_id) : NULL;
    if (strlen(rec->lease) == KF_LEASE_BYTES) {
        memcpy(r->lease, rec->lease, KF_LEASE_BYTES + 1);
    }
    if (strlen(rec->lease_owner) <= KF_API_KEY_ID_CHARS) {
        strcpy(r->lease_owner, rec->lease_owner);
    }
    r->lease_ms = rec->lease_ms;
    r->lease_expires_ms = rec->lease_expires_ms;
    r->result_json = rec->result_json[0] ? kf_xstrdup(rec->result_json) : NULL;
    r->error = rec->error[0] ? kf_xstrdup(rec->error) : NULL;
    r->finished_ms = rec->finished_ms;
    r->seq = rec->seq;
    return r;
}

static void run_free(run_t *r) {
    free(r->run_id);
    free(r->workflow);
    free(r->key);
    free(r->input);
    free(r->worker_id);
    free(r->result_json);
    free(r->error);
    free(r);
}

/* A run record as this engine writes it: every record read back goes
 * through here (load_rec), so nothing past it meets an identifier, status,
 * kind or lease that the engine could not have produced. */
static bool rec_valid(const Keyflow__Records__RunRec *rec) {
    size_t lease_len = strlen(rec->lease);
    bool lease_ok = rec->status == ST_LEASED ? lease_len == KF_LEASE_BYTES
                                             : lease_len == 0 || lease_len == KF_LEASE_BYTES;
    return rec->run_id[0] != '\0' && strlen(rec->run_id) <= KF_RUN_ID_BYTES_MAX &&
           strlen(rec->workflow) <= KF_WORKFLOW_BYTES_MAX && strlen(rec->key) <= KF_KEY_BYTES_MAX &&
           strlen(rec->worker_id) <= KF_WORKER_ID_BYTES_MAX &&
           (rec->kind == KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE ||
            rec->kind == KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH) &&
           (rec->status == ST_PENDING || rec->status == ST_LEASED || rec->status == ST_COMPLETED ||
            rec->status == ST_FAILED) &&
           lease_ok;
}

static kf_status_t load_rec(kf_ctx_t *ctx, const char *run_id, Keyflow__Records__RunRec **out,
                            kf_error_t *err) {
    kf_value_t v;
    bool found;
    *out = NULL;
    kf_status_t st = kf_store_get(ctx->store, KF_CF_RUNS, run_id, strlen(run_id), &v, &found, err);
    if (st != KF_OK || !found) {
        return st;
    }
    *out = keyflow__records__run_rec__unpack(NULL, v.len, v.data);
    kf_store_value_free(&v);
    if (*out == NULL || !rec_valid(*out)) {
        if (*out != NULL) {
            keyflow__records__run_rec__free_unpacked(*out, NULL);
            *out = NULL;
        }
        return kf_error_set(err, KF_E_CORRUPT, "runs: undecodable record for %s", run_id);
    }
    return KF_OK;
}

/* ---- state changes ------------------------------------------------------ */

static void set_wakeup(kf_ctx_t *ctx, run_t *r, int64_t due_ms) {
    kf_ctx_wakeup_move(ctx, &r->timer, KF_WAKEUP_RUN, r->run_id, strlen(r->run_id),
                       &r->wakeup_due_ms, due_ms);
}

static void lease_run(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, const char *worker_id,
                      const kf_principal_t *owner, int64_t lease_ms) {
    KF_ASSERT(r->status == ST_PENDING);
    dequeue(rs, r);
    r->status = ST_LEASED;
    rs->leased++;
    r->attempts++;
    free(r->worker_id);
    r->worker_id = kf_xstrdup(worker_id);
    kf_uuid7(ctx->rng, ctx->now_ms, r->lease);
    strcpy(r->lease_owner, kf_principal_id(owner));
    r->lease_ms = lease_ms;
    r->lease_expires_ms = kf_time_add_sat(ctx->now_ms, lease_ms);
    r->updated_ms = ctx->now_ms;
    run_save(ctx, r);
    set_wakeup(ctx, r, r->lease_expires_ms);
}

static void evict_unlink(kf_runs_t *rs, run_t *r) {
    if (r->evict_prev) {
        r->evict_prev->evict_next = r->evict_next;
    } else if (rs->evict_head == r) {
        rs->evict_head = r->evict_next;
    } else {
        return; /* not on the list */
    }
    if (r->evict_next) {
        r->evict_next->evict_prev = r->evict_prev;
    } else {
        rs->evict_tail = r->evict_prev;
    }
    r->evict_prev = r->evict_next = NULL;
}

/* Queues a finished run to be forgotten once `group` is durable. The list
 * stays in group order: groups only grow. */
static void evict_push(kf_runs_t *rs, run_t *r, uint64_t group) {
    r->finished_group = group;
    r->evict_prev = rs->evict_tail;
    r->evict_next = NULL;
    if (rs->evict_tail) {
        rs->evict_tail->evict_next = r;
    } else {
        rs->evict_head = r;
    }
    rs->evict_tail = r;
}

static void finish_run(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, int status, const char *result,
                       const char *error) {
    KF_ASSERT(r->status == ST_LEASED);
    rs->leased--;
    r->status = status;
    r->finished_ms = r->updated_ms = ctx->now_ms;
    free(r->result_json);
    free(r->error);
    r->result_json = result ? kf_xstrdup(result) : NULL;
    r->error = error ? kf_xstrdup(error) : NULL;
    kf_key_t k;
    kf_key_run_queue(&k, r->seq);
    kf_ctx_delete(ctx, KF_CF_RUN_QUEUE, &k);
    run_save(ctx, r);
    set_wakeup(ctx, r, kf_time_add_sat(ctx->now_ms, retention_ms(ctx)));
    evict_push(rs, r, ctx->group_id);
    kf_counter_add(status == ST_COMPLETED ? KF_C_RUNS_COMPLETED : KF_C_RUNS_FAILED, 1);
    if (status == ST_FAILED) {
        kf_log_kv(KF_LOG_INFO, "runs", "run failed", KF_LOG_STR("run_id", r->run_id),
                  KF_LOG_STR("workflow", r->workflow), KF_LOG_INT("attempts", r->attempts),
                  KF_LOG_STR("error", r->error));
    }
}

static void delete_stored(kf_ctx_t *ctx, const char *run_id, const char *workflow, uint64_t seq,
                          int64_t wakeup_due_ms) {
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_raw(&k, run_id, strlen(run_id));
    kf_ctx_delete(ctx, KF_CF_RUNS, &k);
    kf_key_run_index(&k, workflow, strlen(workflow), seq);
    kf_ctx_delete(ctx, KF_CF_RUN_INDEX, &k);
    if (wakeup_due_ms != KF_NO_WAKEUP) {
        kf_key_wakeup(&k, wakeup_due_ms, KF_WAKEUP_RUN, run_id, strlen(run_id));
        kf_ctx_delete(ctx, KF_CF_WAKEUPS, &k);
    }
    kf_counter_add(KF_C_RUNS_DELETED, 1);
}

/* ---- long polls -------------------------------------------------------- */

static void poll_unlink(kf_runs_t *rs, poller_t *p) {
    if (p->prev) {
        p->prev->next = p->next;
    } else {
        rs->polls_head = p->next;
    }
    if (p->next) {
        p->next->prev = p->prev;
    } else {
        rs->polls_tail = p->prev;
    }
    rs->polls--;
}

/* Leases up to the poll's max_runs into its response; returns how many. */
static size_t fill_poll(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__PollRunsRequest *req = (const Keyflow__V1__PollRunsRequest *)cmd->request;
    Keyflow__V1__PollRunsResponse *resp = (Keyflow__V1__PollRunsResponse *)cmd->response;
    int64_t max_runs = req->max_runs > 0 ? req->max_runs : 1;
    int64_t lease_ms = req->lease_ms > 0 ? req->lease_ms : KF_LEASE_MS_DEFAULT;
    size_t got = 0;
    while ((int64_t)resp->n_runs < max_runs) {
        run_t *r = oldest_pending(rs, req->workflows, req->n_workflows);
        if (r == NULL) {
            break;
        }
        lease_run(rs, ctx, r, req->worker_id, cmd->principal, lease_ms);
        resp->runs[resp->n_runs++] = run_to_pb(cmd->arena, r, true);
        got++;
    }
    return got;
}

/* Hands newly pending runs to parked polls, longest waiting first. */
static void serve_parked(kf_runs_t *rs, kf_ctx_t *ctx) {
    poller_t *p = rs->polls_head;
    while (p != NULL && rs->pending > 0) {
        poller_t *next = p->next;
        if (fill_poll(rs, ctx, p->cmd) > 0) {
            poll_unlink(rs, p);
            kf_heap_disarm(&ctx->heap, &p->timer);
            p->cmd->parked = NULL;
            kf_ctx_ready(ctx, p->cmd);
        }
        p = next;
    }
    publish(rs);
}

bool kf_runs_cancel_poll(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd, uint64_t id) {
    for (poller_t *p = rs->polls_head; p != NULL; p = p->next) {
        if (p->cmd == cmd && cmd->id == id) {
            poll_unlink(rs, p);
            kf_heap_disarm(&ctx->heap, &p->timer);
            cmd->parked = NULL;
            cmd->response = NULL;
            kf_error_set(&cmd->error, KF_E_CANCELLED, "PollRuns: the client went away");
            kf_ctx_ready(ctx, cmd);
            publish(rs);
            return true;
        }
    }
    return false;
}

void kf_runs_release_polls(kf_runs_t *rs, kf_ctx_t *ctx) {
    while (rs->polls_head != NULL) {
        poller_t *p = rs->polls_head;
        poll_unlink(rs, p);
        kf_heap_disarm(&ctx->heap, &p->timer);
        p->cmd->parked = NULL;
        kf_ctx_ready(ctx, p->cmd);
    }
    publish(rs);
}

/* ---- operations -------------------------------------------------------- */

bool kf_runs_full(const kf_runs_t *rs) {
    return !kf_runs_room(rs, 1);
}

bool kf_runs_room(const kf_runs_t *rs, uint32_t count) {
    return rs->pending + rs->leased + count <= KF_LIVE_RUNS_MAX;
}

uint64_t kf_runs_start(kf_runs_t *rs, kf_ctx_t *ctx, const kf_run_spec_t *spec) {
    KF_ASSERT(!kf_runs_full(rs));
    KF_ASSERT(run_find(rs, spec->run_id) == NULL);
    run_t *r = kf_xcalloc(1, sizeof *r);
    kf_timer_init(&r->timer, KF_TIMER_RUN);
    kf_pq_node_init(&r->queue_node);
    r->wakeup_due_ms = KF_NO_WAKEUP;
    r->run_id = kf_xstrdup(spec->run_id);
    r->workflow = kf_xstrdup(spec->workflow);
    r->key = kf_xstrdup(spec->key);
    r->kind = spec->kind;
    r->input = kf_xstrndup(spec->input, spec->input_len);
    r->event_count = spec->event_count;
    r->status = ST_PENDING;
    r->created_ms = r->updated_ms = ctx->now_ms;
    r->seq = rs->next_seq++;
    kf_map_insert(&rs->by_id, &r->node, r->run_id, strlen(r->run_id));

    uint8_t seq_be[8];
    kf_put_be64(seq_be, rs->next_seq);
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_raw(&k, run_seq_key, sizeof run_seq_key - 1);
    kf_ctx_put(ctx, KF_CF_META, &k, seq_be, sizeof seq_be);
    run_save(ctx, r);
    kf_key_run_index(&k, r->workflow, strlen(r->workflow), r->seq);
    kf_ctx_put(ctx, KF_CF_RUN_INDEX, &k, r->run_id, strlen(r->run_id));
    kf_key_run_queue(&k, r->seq);
    kf_ctx_put(ctx, KF_CF_RUN_QUEUE, &k, r->run_id, strlen(r->run_id));
    enqueue(rs, r);
    kf_counter_add(KF_C_RUNS_CREATED, 1);
    serve_parked(rs, ctx);
    publish(rs);
    return r->seq;
}

static kf_status_t check_workflows(const Keyflow__V1__PollRunsRequest *req, kf_error_t *err) {
    if (req->n_workflows > KF_POLL_WORKFLOWS_MAX) {
        return kf_error_set(err, KF_E_INVALID, "workflows: at most %d, got %zu",
                            KF_POLL_WORKFLOWS_MAX, req->n_workflows);
    }
    for (size_t i = 0; i < req->n_workflows; i++) {
        char field[32];
        snprintf(field, sizeof field, "workflows[%zu]", i);
        kf_status_t st =
            kf_check_identifier(field, req->workflows[i], KF_WORKFLOW_BYTES_MAX, true, err);
        if (st != KF_OK) {
            return st;
        }
    }
    return KF_OK;
}

static kf_status_t check_range(kf_error_t *err, const char *field, int64_t v, int64_t lo,
                               int64_t hi) {
    if (v < lo || v > hi) {
        return kf_error_set(err, KF_E_INVALID, "%s: must be in %lld..%lld, got %lld", field,
                            (long long)lo, (long long)hi, (long long)v);
    }
    return KF_OK;
}

void kf_runs_poll(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__PollRunsRequest *req = (const Keyflow__V1__PollRunsRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    if (check_workflows(req, err) != KF_OK ||
        kf_check_identifier("worker_id", req->worker_id, KF_WORKER_ID_BYTES_MAX, true, err) !=
            KF_OK ||
        (req->lease_ms != 0 &&
         check_range(err, "lease_ms", req->lease_ms, KF_LEASE_MS_MIN, KF_LEASE_MS_MAX) != KF_OK) ||
        (req->max_runs != 0 &&
         check_range(err, "max_runs", req->max_runs, 1, KF_POLL_RUNS_MAX) != KF_OK) ||
        check_range(err, "wait_ms", req->wait_ms, 0, KF_POLL_WAIT_MS_MAX) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    int64_t max_runs = req->max_runs > 0 ? req->max_runs : 1;
    Keyflow__V1__PollRunsResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__poll_runs_response__init(resp);
    resp->runs = kf_arena_new(cmd->arena, (size_t)max_runs * sizeof *resp->runs);
    cmd->response = &resp->base;
    if (fill_poll(rs, ctx, cmd) > 0 || req->wait_ms == 0) {
        publish(rs);
        kf_ctx_ready(ctx, cmd);
        return;
    }
    if (rs->polls >= KF_PARKED_POLLS_MAX) {
        cmd->response = NULL;
        kf_error_set(err, KF_E_LIMIT,
                     "PollRuns: %d long polls already waiting (KF_PARKED_POLLS_MAX)",
                     KF_PARKED_POLLS_MAX);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    poller_t *p = kf_arena_new(cmd->arena, sizeof *p);
    p->cmd = cmd;
    kf_timer_init(&p->timer, KF_TIMER_POLL);
    kf_heap_arm(&ctx->heap, &p->timer, kf_time_add_sat(ctx->now_ms, req->wait_ms));
    p->prev = rs->polls_tail;
    if (rs->polls_tail) {
        rs->polls_tail->next = p;
    } else {
        rs->polls_head = p;
    }
    rs->polls_tail = p;
    rs->polls++;
    cmd->parked = p;
    publish(rs);
}

static kf_status_t check_run_ref(const char *run_id, const char *lease, bool need_lease,
                                 kf_error_t *err) {
    kf_status_t st = kf_check_identifier("run_id", run_id, KF_RUN_ID_BYTES_MAX, true, err);
    if (st != KF_OK) {
        return st;
    }
    if (need_lease && strlen(lease) != KF_LEASE_BYTES) {
        return kf_error_set(err, KF_E_INVALID,
                            "lease: required, the %d-character token PollRuns returned",
                            KF_LEASE_BYTES);
    }
    return KF_OK;
}

/* The caller's grants cover the run's workflow (the request names only the
 * run). On refusal cmd->error is set. */
static bool workflow_allowed(kf_cmd_t *cmd, kf_scope_t scope, const char *run_id,
                             const char *workflow) {
    if (kf_principal_allows(cmd->principal, scope, workflow)) {
        return true;
    }
    kf_error_set(&cmd->error, KF_E_PERMISSION,
                 "run_id: run %s belongs to workflow \"%s\", outside this API key's %s grants",
                 run_id, workflow, kf_scope_name(scope));
    return false;
}

/* Work on a lease (heartbeat, complete) that the caller presents: only the
 * key that took the lease may do it, so that another tenant holding the
 * token cannot forge the run's result. A lease taken without a key (auth
 * was off) is anyone's. */
static bool lease_owner_is_caller(kf_cmd_t *cmd, const char *run_id, const char *owner) {
    if (cmd->principal == NULL || owner[0] == '\0' ||
        strcmp(owner, kf_principal_id(cmd->principal)) == 0) {
        return true;
    }
    kf_error_set(&cmd->error, KF_E_PERMISSION,
                 "lease: run %s was leased with another API key; only that key may heartbeat or "
                 "complete it",
                 run_id);
    return false;
}

static const char *status_word(int status) {
    switch (status) {
    case ST_PENDING: return "PENDING";
    case ST_LEASED: return "LEASED";
    case ST_COMPLETED: return "COMPLETED";
    case ST_FAILED: return "FAILED";
    default: return "UNKNOWN";
    }
}

void kf_runs_heartbeat(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__HeartbeatRunRequest *req =
        (const Keyflow__V1__HeartbeatRunRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    if (check_run_ref(req->run_id, req->lease, true, err) != KF_OK ||
        (req->lease_ms != 0 &&
         check_range(err, "lease_ms", req->lease_ms, KF_LEASE_MS_MIN, KF_LEASE_MS_MAX) != KF_OK)) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    run_t *r = run_find(rs, req->run_id);
    if (refuse_deleted(ctx, cmd, r, req->run_id)) {
        return;
    }
    if (r == NULL) {
        Keyflow__Records__RunRec *rec;
        if (load_rec(ctx, req->run_id, &rec, err) == KF_OK) {
            if (rec == NULL) {
                kf_error_set(err, KF_E_NOT_FOUND, "run_id: no run %s", req->run_id);
            } else {
                if (workflow_allowed(cmd, KF_SCOPE_RUNS_WORK, req->run_id, rec->workflow)) {
                    kf_error_set(err, KF_E_PRECONDITION, "run %s is %s", req->run_id,
                                 status_word(rec->status));
                }
                keyflow__records__run_rec__free_unpacked(rec, NULL);
            }
        }
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (!workflow_allowed(cmd, KF_SCOPE_RUNS_WORK, req->run_id, r->workflow) ||
        (strcmp(r->lease, req->lease) == 0 &&
         !lease_owner_is_caller(cmd, req->run_id, r->lease_owner))) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (r->status != ST_LEASED || strcmp(r->lease, req->lease) != 0 ||
        ctx->now_ms >= r->lease_expires_ms) {
        kf_error_set(err, KF_E_PRECONDITION,
                     "lease: does not hold run %s (it is %s; the lease expired or belongs to "
                     "another attempt)",
                     req->run_id, status_word(r->status));
        kf_ctx_fail(ctx, cmd);
        return;
    }
    /* r->lease_ms stays the length the lease was granted with: a heartbeat
     * without lease_ms extends by that, whatever earlier heartbeats asked. */
    int64_t lease_ms = req->lease_ms ? req->lease_ms : r->lease_ms;
    r->lease_expires_ms = kf_time_add_sat(ctx->now_ms, lease_ms);
    r->updated_ms = ctx->now_ms;
    run_save(ctx, r);
    set_wakeup(ctx, r, r->lease_expires_ms);
    Keyflow__V1__HeartbeatRunResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__heartbeat_run_response__init(resp);
    resp->lease_expires_ms = r->lease_expires_ms;
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

static kf_status_t check_outcome(const Keyflow__V1__CompleteRunRequest *req, kf_error_t *err) {
    if (req->outcome_case == KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_RESULT_JSON) {
        return kf_json_check("result", req->result_json, strlen(req->result_json),
                             KF_RUN_RESULT_BYTES_MAX, err);
    }
    if (req->outcome_case == KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_ERROR) {
        size_t len = strlen(req->error);
        if (len == 0) {
            return kf_error_set(err, KF_E_INVALID, "error: must not be empty when the run failed");
        }
        if (len > KF_RUN_ERROR_BYTES_MAX) {
            return kf_error_set(err, KF_E_TOO_LARGE, "error: at most %d bytes, got %zu",
                                KF_RUN_ERROR_BYTES_MAX, len);
        }
        return KF_OK;
    }
    return kf_error_set(err, KF_E_INVALID, "outcome: one of result or error is required");
}

/* A completion for a run that already finished: the same lease and the
 * same kind of outcome is a retry (OK, already_finished); anything else is
 * FAILED_PRECONDITION. */
static void complete_finished(kf_ctx_t *ctx, kf_cmd_t *cmd, const Keyflow__Records__RunRec *rec) {
    const Keyflow__V1__CompleteRunRequest *req =
        (const Keyflow__V1__CompleteRunRequest *)cmd->request;
    bool wants_success =
        req->outcome_case == KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_RESULT_JSON;
    bool finished = rec->status == ST_COMPLETED || rec->status == ST_FAILED;
    if (!workflow_allowed(cmd, KF_SCOPE_RUNS_WORK, rec->run_id, rec->workflow) ||
        (strcmp(rec->lease, req->lease) == 0 &&
         !lease_owner_is_caller(cmd, rec->run_id, rec->lease_owner))) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (finished && strcmp(rec->lease, req->lease) == 0 &&
        (rec->status == ST_COMPLETED) == wants_success) {
        Keyflow__V1__CompleteRunResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
        keyflow__v1__complete_run_response__init(resp);
        resp->run = rec_to_pb(cmd->arena, rec, false);
        resp->already_finished = true;
        cmd->response = &resp->base;
        kf_ctx_ready(ctx, cmd);
        return;
    }
    if (finished && strcmp(rec->lease, req->lease) == 0) {
        kf_error_set(&cmd->error, KF_E_PRECONDITION,
                     "outcome: run %s already finished %s with this lease; a %s cannot replace it",
                     rec->run_id, status_word(rec->status), wants_success ? "result" : "error");
    } else {
        kf_error_set(&cmd->error, KF_E_PRECONDITION,
                     "lease: does not hold run %s (it is %s; the lease expired or belongs to "
                     "another attempt)",
                     rec->run_id, status_word(rec->status));
    }
    kf_ctx_fail(ctx, cmd);
}

void kf_runs_complete(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__CompleteRunRequest *req =
        (const Keyflow__V1__CompleteRunRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    if (check_run_ref(req->run_id, req->lease, true, err) != KF_OK ||
        check_outcome(req, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    run_t *r = run_find(rs, req->run_id);
    if (refuse_deleted(ctx, cmd, r, req->run_id)) {
        return;
    }
    if (r == NULL) {
        Keyflow__Records__RunRec *rec;
        if (load_rec(ctx, req->run_id, &rec, err) != KF_OK) {
            kf_ctx_fail(ctx, cmd);
            return;
        }
        if (rec == NULL) {
            kf_error_set(err, KF_E_NOT_FOUND, "run_id: no run %s", req->run_id);
            kf_ctx_fail(ctx, cmd);
            return;
        }
        complete_finished(ctx, cmd, rec);
        keyflow__records__run_rec__free_unpacked(rec, NULL);
        return;
    }
    if (!workflow_allowed(cmd, KF_SCOPE_RUNS_WORK, req->run_id, r->workflow) ||
        (strcmp(r->lease, req->lease) == 0 &&
         !lease_owner_is_caller(cmd, req->run_id, r->lease_owner))) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (r->status == ST_LEASED && strcmp(r->lease, req->lease) == 0 &&
        ctx->now_ms >= r->lease_expires_ms) {
        /* Expired by the clock though its timer has not fired yet this turn. */
        kf_error_set(err, KF_E_PRECONDITION, "lease: expired at %lld for run %s",
                     (long long)r->lease_expires_ms, req->run_id);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (r->status != ST_LEASED || strcmp(r->lease, req->lease) != 0) {
        Keyflow__Records__RunRec rec;
        run_to_rec(r, &rec);
        complete_finished(ctx, cmd, &rec);
        return;
    }
    if (req->outcome_case == KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_RESULT_JSON) {
        finish_run(rs, ctx, r, ST_COMPLETED, req->result_json[0] ? req->result_json : "null", NULL);
    } else {
        finish_run(rs, ctx, r, ST_FAILED, NULL, req->error);
    }
    Keyflow__V1__CompleteRunResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__complete_run_response__init(resp);
    resp->run = run_to_pb(cmd->arena, r, false);
    cmd->response = &resp->base;
    publish(rs);
    kf_ctx_ready(ctx, cmd);
}

void kf_runs_get(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__GetRunRequest *req = (const Keyflow__V1__GetRunRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    if (check_run_ref(req->run_id, "", false, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    run_t *r = run_find(rs, req->run_id);
    if (refuse_deleted(ctx, cmd, r, req->run_id)) {
        return;
    }
    if (r != NULL) {
        if (!workflow_allowed(cmd, KF_SCOPE_RUNS_READ, req->run_id, r->workflow)) {
            kf_ctx_fail(ctx, cmd);
            return;
        }
        cmd->response = &run_to_pb(cmd->arena, r, false)->base;
        kf_ctx_ready(ctx, cmd);
        return;
    }
    Keyflow__Records__RunRec *rec;
    if (load_rec(ctx, req->run_id, &rec, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (rec == NULL) {
        kf_error_set(err, KF_E_NOT_FOUND, "run_id: no run %s", req->run_id);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (!workflow_allowed(cmd, KF_SCOPE_RUNS_READ, req->run_id, rec->workflow)) {
        keyflow__records__run_rec__free_unpacked(rec, NULL);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    cmd->response = &rec_to_pb(cmd->arena, rec, false)->base;
    keyflow__records__run_rec__free_unpacked(rec, NULL);
    kf_ctx_ready(ctx, cmd);
}

static bool hex_decode(const char *hex, kf_key_t *out) {
    size_t n = strlen(hex);
    if (n % 2 != 0 || n / 2 > KF_STORE_KEY_BYTES_MAX) {
        return false;
    }
    kf_key_reset(out);
    for (size_t i = 0; i < n; i += 2) {
        int v = 0;
        for (int j = 0; j < 2; j++) {
            char c = hex[i + (size_t)j];
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (d < 0) {
                return false;
            }
            v = v * 16 + d;
        }
        kf_key_u8(out, (uint8_t)v);
    }
    return true;
}

/* A page token is the hex of: TOKEN_MAGIC, the status filter, and the last
 * run index key returned. The filter and the index key's shape (and its
 * workflow, when the listing names one) are checked on the way back, so a
 * token of another query, or made up, is refused instead of silently
 * ending or restarting the listing. */
#define TOKEN_MAGIC 0x4c /* 'L' */

static char *token_encode(kf_arena_t *arena, uint8_t status, const void *key, size_t len) {
    uint8_t head[2] = {TOKEN_MAGIC, status};
    char *hex = kf_arena_new(arena, (sizeof head + len) * 2 + 1);
    kf_hex_encode(head, sizeof head, hex);
    kf_hex_encode(key, len, hex + sizeof head * 2);
    return hex;
}

static bool token_decode(const char *hex, uint8_t status, const kf_key_t *prefix, kf_key_t *key) {
    kf_key_t raw;
    if (!hex_decode(hex, &raw) || raw.len < 2 || raw.bytes[0] != TOKEN_MAGIC ||
        raw.bytes[1] != status) {
        return false;
    }
    kf_key_reset(key);
    kf_key_raw(key, raw.bytes + 2, raw.len - 2);
    /* lp(workflow) | run_seq be64, nothing more */
    kf_key_reader_t r = kf_key_reader(key->bytes, key->len);
    const char *workflow;
    size_t workflow_len;
    uint64_t seq;
    if (!kf_key_read_lp(&r, &workflow, &workflow_len) || workflow_len == 0 ||
        !kf_key_read_be64(&r, &seq) || r.left != 0) {
        return false;
    }
    return prefix == NULL ||
           (key->len > prefix->len && memcmp(key->bytes, prefix->bytes, prefix->len) == 0);
}

/* Lists runs in (workflow, creation) order through the run index. Runs in
 * memory are shown as they are now; others as stored. Examines at most
 * KF_LIST_SCAN_MAX index entries per call and returns a token to go on. */
void kf_runs_list(kf_runs_t *rs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__ListRunsRequest *req = (const Keyflow__V1__ListRunsRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    if (kf_check_identifier("workflow", req->workflow, KF_WORKFLOW_BYTES_MAX, false, err) !=
            KF_OK ||
        (req->page_size != 0 &&
         check_range(err, "page_size", req->page_size, 1, KF_LIST_PAGE_MAX) != KF_OK) ||
        check_range(err, "status", (int)req->status, 0, ST_FAILED) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    kf_key_t lower, upper, after;
    bool bounded = req->workflow[0] != '\0';
    kf_key_reset(&lower);
    if (bounded) {
        kf_key_lp(&lower, req->workflow, strlen(req->workflow));
        bool ok = kf_key_prefix_end(&lower, &upper);
        KF_ASSERT(ok);
    }
    if (req->page_token[0] &&
        !token_decode(req->page_token, (uint8_t)req->status, bounded ? &lower : NULL, &after)) {
        kf_error_set(err, KF_E_INVALID,
                     "page_token: not a token this server returned for this workflow and status");
        kf_ctx_fail(ctx, cmd);
        return;
    }
    kf_iter_t *it;
    if (kf_iter_create(ctx->store, KF_CF_RUN_INDEX, bounded ? lower.bytes : NULL, lower.len,
                       bounded ? upper.bytes : NULL, bounded ? upper.len : 0, &it, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    int64_t page = req->page_size ? req->page_size : KF_LIST_PAGE_DEFAULT;
    Keyflow__V1__ListRunsResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__list_runs_response__init(resp);
    resp->runs = kf_arena_new(cmd->arena, (size_t)page * sizeof *resp->runs);
    if (req->page_token[0]) {
        kf_iter_seek(it, after.bytes, after.len);
        if (kf_iter_valid(it)) {
            size_t klen;
            const void *k = kf_iter_key(it, &klen);
            if (klen == after.len && memcmp(k, after.bytes, klen) == 0) {
                kf_iter_next(it); /* the token names the last entry already returned */
            }
        }
    } else {
        kf_iter_seek_first(it);
    }
    size_t examined = 0, bytes = 0;
    const char *last_key = NULL;
    size_t last_len = 0;
    char *token = NULL;
    while (kf_iter_valid(it)) {
        size_t klen, vlen;
        const void *k = kf_iter_key(it, &klen);
        const char *v = kf_iter_value(it, &vlen);
        if ((int64_t)resp->n_runs >= page || examined >= KF_LIST_SCAN_MAX ||
            bytes >= KF_RESPONSE_BYTES_MAX / 4) {
            token = "";
            break;
        }
        examined++;
        char *run_id = kf_arena_strndup(cmd->arena, v, vlen);
        KF_ASSERT(run_id != NULL);
        Keyflow__V1__Run *p = NULL;
        run_t *r = run_find(rs, run_id);
        if (r != NULL) {
            p = r->deleted ? NULL : run_to_pb(cmd->arena, r, false);
        } else {
            Keyflow__Records__RunRec *rec;
            if (load_rec(ctx, run_id, &rec, err) != KF_OK) {
                kf_iter_destroy(it);
                kf_ctx_fail(ctx, cmd);
                return;
            }
            if (rec != NULL) {
                p = rec_to_pb(cmd->arena, rec, false);
                keyflow__records__run_rec__free_unpacked(rec, NULL);
            }
        }
        if (p != NULL && (req->status == 0 || (int)p->status == (int)req->status)) {
            resp->runs[resp->n_runs++] = p;
            bytes += strlen(p->input_json) + strlen(p->result_json) + 256;
        }
        last_key = k;
        last_len = klen;
        resp->next_page_token = token_encode(cmd->arena, (uint8_t)req->status, last_key, last_len);
        kf_iter_next(it);
    }
    if (token == NULL) {
        resp->next_page_token = ""; /* reached the end */
    }
    kf_status_t st = kf_iter_status(it, err);
    kf_iter_destroy(it);
    if (st != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

/* ---- timers ------------------------------------------------------------ */

static void run_forget(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r) {
    kf_heap_disarm(&ctx->heap, &r->timer);
    evict_unlink(rs, r);
    kf_map_remove(&rs->by_id, &r->node);
    run_free(r);
}

void kf_runs_fire(kf_runs_t *rs, kf_ctx_t *ctx, kf_timer_t *timer) {
    if (timer->type == KF_TIMER_POLL) {
        poller_t *p = KF_CONTAINER_OF(timer, poller_t, timer);
        poll_unlink(rs, p);
        p->cmd->parked = NULL;
        kf_ctx_ready(ctx, p->cmd); /* the long poll ends empty */
        publish(rs);
        return;
    }
    run_t *r = KF_CONTAINER_OF(timer, run_t, timer);
    if (r->status == ST_LEASED) {
        if (r->lease_expires_ms > ctx->now_ms) {
            set_wakeup(ctx, r, r->lease_expires_ms);
            return;
        }
        kf_counter_add(KF_C_LEASES_EXPIRED, 1);
        kf_log_kv(KF_LOG_INFO, "runs", "lease expired", KF_LOG_STR("run_id", r->run_id),
                  KF_LOG_STR("workflow", r->workflow), KF_LOG_STR("worker_id", r->worker_id),
                  KF_LOG_INT("attempt", r->attempts), KF_LOG_INT("attempts_max", attempts_max(ctx)),
                  KF_LOG_STR("next", r->attempts >= attempts_max(ctx) ? "failed" : "pending"));
        if (r->attempts >= attempts_max(ctx)) {
            char msg[160];
            snprintf(msg, sizeof msg, "lease expired on attempt %lld of %lld",
                     (long long)r->attempts, (long long)attempts_max(ctx));
            /* The worker's lease ended unused: forget it, so a late
             * CompleteRun with it is refused rather than taken for a retry
             * of a completion that never happened. */
            r->lease[0] = '\0';
            r->lease_owner[0] = '\0';
            finish_run(rs, ctx, r, ST_FAILED, NULL, msg);
        } else {
            rs->leased--;
            r->status = ST_PENDING;
            r->lease[0] = '\0';
            r->lease_owner[0] = '\0';
            r->lease_expires_ms = 0;
            r->updated_ms = ctx->now_ms;
            run_save(ctx, r);
            set_wakeup(ctx, r, KF_NO_WAKEUP);
            enqueue(rs, r);
            serve_parked(rs, ctx);
        }
        publish(rs);
        return;
    }
    if (r->status == ST_COMPLETED || r->status == ST_FAILED) {
        delete_stored(ctx, r->run_id, r->workflow, r->seq, r->wakeup_due_ms);
        r->wakeup_due_ms = KF_NO_WAKEUP;
        if (r->finished_group > ctx->durable_group_id) {
            /* Its finishing write is not durable yet, so the stored record
             * is still the one from before it finished: forgetting the run
             * now would let GetRun, ListRuns and CompleteRun read that older
             * state back. It stays, answering as deleted, until the
             * deletion is durable. */
            r->deleted = true;
            evict_unlink(rs, r);
            evict_push(rs, r, ctx->group_id);
            return;
        }
        run_forget(rs, ctx, r);
        return;
    }
    KF_UNREACHABLE(); /* pending runs have no timer */
}

uint32_t kf_runs_sweep(kf_runs_t *rs, kf_ctx_t *ctx, uint32_t limit) {
    kf_key_t lower, upper;
    kf_key_reset(&lower);
    kf_key_u8(&lower, KF_WAKEUP_RUN);
    kf_key_wakeup(&upper, kf_time_add_sat(ctx->now_ms, 1), KF_WAKEUP_RUN, NULL, 0);
    kf_iter_t *it;
    kf_error_t err;
    if (kf_iter_create(ctx->store, KF_CF_WAKEUPS, lower.bytes, lower.len, upper.bytes, upper.len,
                       &it, &err) != KF_OK) {
        return 0;
    }
    if (rs->sweep_started) {
        kf_iter_seek(it, rs->sweep_cursor.bytes, rs->sweep_cursor.len);
    } else {
        kf_iter_seek_first(it);
    }
    uint32_t examined = 0;
    for (; kf_iter_valid(it) && examined < limit; kf_iter_next(it)) {
        size_t klen;
        const uint8_t *k = kf_iter_key(it, &klen);
        if (rs->sweep_started && klen == rs->sweep_cursor.len &&
            memcmp(k, rs->sweep_cursor.bytes, klen) == 0) {
            continue;
        }
        examined++;
        kf_key_reset(&rs->sweep_cursor);
        kf_key_raw(&rs->sweep_cursor, k, klen);
        rs->sweep_started = true;
        kf_key_reader_t rd = kf_key_reader(k, klen);
        int64_t due;
        uint8_t type;
        if (!kf_key_read_u8(&rd, &type) || type != KF_WAKEUP_RUN || !kf_key_read_time(&rd, &due)) {
            continue;
        }
        char run_id[KF_RUN_ID_BYTES_MAX + 1];
        if (rd.left == 0 || rd.left > KF_RUN_ID_BYTES_MAX) {
            continue;
        }
        memcpy(run_id, rd.p, rd.left);
        run_id[rd.left] = '\0';
        if (run_find(rs, run_id) != NULL) {
            continue; /* in memory: its own timer handles it */
        }
        Keyflow__Records__RunRec *rec;
        if (load_rec(ctx, run_id, &rec, &err) != KF_OK) {
            continue;
        }
        kf_key_t wk;
        kf_key_reset(&wk);
        kf_key_raw(&wk, k, klen);
        if (rec == NULL) {
            kf_ctx_delete(ctx, KF_CF_WAKEUPS, &wk); /* stale: the run is gone */
            continue;
        }
        if (rec->status == ST_COMPLETED || rec->status == ST_FAILED) {
            delete_stored(ctx, run_id, rec->workflow, rec->seq, due);
        }
        keyflow__records__run_rec__free_unpacked(rec, NULL);
    }
    kf_iter_destroy(it);
    return examined;
}

void kf_runs_evict(kf_runs_t *rs, kf_ctx_t *ctx) {
    while (rs->evict_head != NULL && rs->evict_head->finished_group <= ctx->durable_group_id) {
        run_t *r = rs->evict_head;
        run_forget(rs, ctx, r); /* its stored wake-up stays; the sweep deletes it when due */
    }
}

/* ---- recovery ---------------------------------------------------------- */

kf_status_t kf_runs_recover(kf_runs_t *rs, kf_ctx_t *ctx, kf_error_t *err) {
    kf_value_t v;
    bool found;
    kf_status_t st =
        kf_store_get(ctx->store, KF_CF_META, run_seq_key, sizeof run_seq_key - 1, &v, &found, err);
    if (st != KF_OK) {
        return st;
    }
    if (found) {
        if (v.len != 8) {
            kf_store_value_free(&v);
            return kf_error_set(err, KF_E_CORRUPT, "meta: malformed run_seq");
        }
        rs->next_seq = kf_get_be64(v.data);
        kf_store_value_free(&v);
    }
    kf_iter_t *it;
    if ((st = kf_iter_create(ctx->store, KF_CF_RUN_QUEUE, NULL, 0, NULL, 0, &it, err)) != KF_OK) {
        return st;
    }
    for (kf_iter_seek_first(it); kf_iter_valid(it) && st == KF_OK; kf_iter_next(it)) {
        size_t vlen;
        const char *val = kf_iter_value(it, &vlen);
        char run_id[KF_RUN_ID_BYTES_MAX + 1];
        if (vlen == 0 || vlen > KF_RUN_ID_BYTES_MAX) {
            st = kf_error_set(err, KF_E_CORRUPT, "run_queue: malformed entry");
            break;
        }
        memcpy(run_id, val, vlen);
        run_id[vlen] = '\0';
        Keyflow__Records__RunRec *rec;
        if ((st = load_rec(ctx, run_id, &rec, err)) != KF_OK) {
            break;
        }
        if (rec == NULL || (rec->status != ST_PENDING && rec->status != ST_LEASED) ||
            rec->seq >= rs->next_seq || strcmp(rec->run_id, run_id) != 0 ||
            run_find(rs, run_id) != NULL) {
            st = kf_error_set(err, KF_E_CORRUPT,
                              "run_queue: %s is not a live run, or is listed twice", run_id);
            if (rec) {
                keyflow__records__run_rec__free_unpacked(rec, NULL);
            }
            break;
        }
        run_t *r = run_from_rec(rec);
        keyflow__records__run_rec__free_unpacked(rec, NULL);
        kf_map_insert(&rs->by_id, &r->node, r->run_id, strlen(r->run_id));
        if (r->status == ST_PENDING) {
            enqueue(rs, r);
        } else {
            rs->leased++;
        }
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    publish(rs);
    return st;
}

bool kf_runs_attach_wakeup(kf_runs_t *rs, kf_ctx_t *ctx, const char *run_id, size_t len,
                           int64_t due_ms) {
    char id[KF_RUN_ID_BYTES_MAX + 1];
    if (len == 0 || len > KF_RUN_ID_BYTES_MAX) {
        return false;
    }
    memcpy(id, run_id, len);
    id[len] = '\0';
    run_t *r = run_find(rs, id);
    if (r == NULL || r->status != ST_LEASED || r->wakeup_due_ms != KF_NO_WAKEUP) {
        return false;
    }
    r->wakeup_due_ms = due_ms;
    kf_heap_arm(&ctx->heap, &r->timer, due_ms);
    return true;
}

void kf_runs_finish_recovery(kf_runs_t *rs, kf_ctx_t *ctx) {
    size_t b;
    for (kf_map_node_t *n = kf_map_first(&rs->by_id, &b); n; n = kf_map_next(&rs->by_id, &b, n)) {
        run_t *r = KF_CONTAINER_OF(n, run_t, node);
        if (r->status == ST_LEASED && !kf_timer_armed(&r->timer)) {
            kf_log(KF_LOG_WARN, "runs", "repairing lease wake-up of %s", r->run_id);
            set_wakeup(ctx, r, r->lease_expires_ms);
        }
    }
}

/* ---- lifecycle --------------------------------------------------------- */

kf_runs_t *kf_runs_create(void) {
    kf_runs_t *rs = kf_xcalloc(1, sizeof *rs);
    kf_map_init(&rs->by_id);
    kf_map_init(&rs->queues);
    return rs;
}

void kf_runs_destroy(kf_runs_t *rs) {
    if (rs == NULL) {
        return;
    }
    /* Queues first: their nodes live inside the runs. */
    size_t b;
    kf_map_node_t *n = kf_map_first(&rs->queues, &b);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&rs->queues, &b, n);
        wfq_t *q = KF_CONTAINER_OF(n, wfq_t, node);
        kf_pq_deinit(&q->pq);
        free(q->workflow);
        free(q);
        n = next;
    }
    n = kf_map_first(&rs->by_id, &b);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&rs->by_id, &b, n);
        run_free(KF_CONTAINER_OF(n, run_t, node));
        n = next;
    }
    kf_map_deinit(&rs->by_id);
    kf_map_deinit(&rs->queues);
    free(rs);
}

uint64_t kf_runs_pending(const kf_runs_t *rs) {
    return rs->pending;
}
uint64_t kf_runs_leased(const kf_runs_t *rs) {
    return rs->leased;
}
