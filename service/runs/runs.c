/*
 * runs.c - the run table: records, per-workflow ready queues, per-key
 * groups (key_concurrency), the state changes of runs.h's diagram, timers,
 * retention and recovery. The RPC handlers are in ops.c; see runs_int.h for
 * where a run is in each status.
 */
#include "runs/runs_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/bytes.h"
#include "base/log.h"
#include "base/metrics.h"

static const char run_seq_key[] = "run_seq";

void kf__runs_publish(const kf_runs_t *rs) {
    kf_gauge_set(KF_G_RUNS_PENDING, (int64_t)rs->pending);
    kf_gauge_set(KF_G_RUNS_LEASED, (int64_t)rs->leased);
    kf_gauge_set(KF_G_RUNS_DELAYED, (int64_t)rs->delayed);
    kf_gauge_set(KF_G_PARKED_POLLS, rs->polls);
    kf_gauge_set(KF_G_RUN_WAITS, rs->waiting);
}

static int64_t retention_ms(const kf_ctx_t *ctx) {
    int64_t r = ctx->config->run_retention_ms;
    return r > 0 ? r : KF_RETENTION_MS_DEFAULT;
}

static int64_t server_attempts_max(const kf_ctx_t *ctx) {
    int64_t a = ctx->config->run_attempts_max;
    return a > 0 ? a : KF_RUN_ATTEMPTS_DEFAULT;
}

int64_t kf__runs_attempts_max(const kf_ctx_t *ctx, const run_t *r) {
    return kf_retry_attempts_max(&r->retry, server_attempts_max(ctx));
}

/* ---- key groups ----------------------------------------------------------- */

static bool run_before(const kf_pq_node_t *a, const kf_pq_node_t *b, const void *ctx) {
    (void)ctx;
    return KF_CONTAINER_OF(a, run_t, queue_node)->seq < KF_CONTAINER_OF(b, run_t, queue_node)->seq;
}

static run_t *pq_head(const kf_pq_t *pq) {
    kf_pq_node_t *n = kf_pq_top(pq);
    return n ? KF_CONTAINER_OF(n, run_t, queue_node) : NULL;
}

/* The run's key group, created on first use; the run joins it (live). */
static void group_join(kf_runs_t *rs, run_t *r) {
    KF_ASSERT(r->group == NULL);
    size_t wlen = strlen(r->workflow), klen = strlen(r->key);
    char name[KF_WORKFLOW_BYTES_MAX + 1 + KF_KEY_BYTES_MAX];
    KF_ASSERT(wlen <= KF_WORKFLOW_BYTES_MAX && klen <= KF_KEY_BYTES_MAX);
    memcpy(name, r->workflow, wlen);
    name[wlen] = '\0';
    memcpy(name + wlen + 1, r->key, klen);
    size_t len = wlen + 1 + klen;
    kf_map_node_t *n = kf_map_get(&rs->groups, name, len);
    keygrp_t *g;
    if (n != NULL) {
        g = KF_CONTAINER_OF(n, keygrp_t, node);
    } else {
        g = kf_xcalloc(1, sizeof *g);
        g->name = kf_xstrndup(name, len);
        g->name_len = len;
        kf_pq_init(&g->blocked, run_before, NULL);
        kf_map_insert(&rs->groups, &g->node, g->name, g->name_len);
    }
    g->live++;
    r->group = g;
}

static void group_free(keygrp_t *g) {
    kf_pq_deinit(&g->blocked);
    free(g->name);
    free(g);
}

/* The run stops being live; the group goes when its last live run does. */
static void group_leave(kf_runs_t *rs, run_t *r) {
    keygrp_t *g = r->group;
    KF_ASSERT(g != NULL && g->live > 0);
    r->group = NULL;
    if (--g->live == 0) {
        KF_ASSERT(g->leased == 0 && g->blocked.count == 0);
        kf_map_remove(&rs->groups, &g->node);
        group_free(g);
    }
}

/* ---- ready queues --------------------------------------------------------- */

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

static void make_ready(kf_runs_t *rs, run_t *r) {
    wfq_t *q = queue_get(rs, r->workflow, true);
    r->queue = q;
    kf_pq_push(&q->pq, &r->queue_node);
    rs->ready++;
}

/* A run that becomes PENDING waits behind its key's blocked runs, if any
 * (the key's runs are leased in order); otherwise it is ready. */
static void enqueue(kf_runs_t *rs, run_t *r) {
    KF_ASSERT(r->status == ST_PENDING && r->group != NULL && !kf_pq_queued(&r->queue_node));
    rs->pending++;
    if (r->group->blocked.count > 0) {
        r->blocked = true;
        kf_pq_push(&r->group->blocked, &r->queue_node);
    } else {
        make_ready(rs, r);
    }
}

static void dequeue(kf_runs_t *rs, run_t *r) {
    KF_ASSERT(kf_pq_queued(&r->queue_node));
    if (r->blocked) {
        kf_pq_remove(&r->group->blocked, &r->queue_node);
        r->blocked = false;
    } else {
        KF_ASSERT(r->queue != NULL);
        kf_pq_remove(&r->queue->pq, &r->queue_node);
        r->queue = NULL;
        rs->ready--;
    }
    rs->pending--;
}

run_t *kf__runs_oldest_ready(kf_runs_t *rs, char **workflows, size_t n) {
    run_t *best = NULL;
    if (n == 0) {
        size_t b;
        for (kf_map_node_t *m = kf_map_first(&rs->queues, &b); m;
             m = kf_map_next(&rs->queues, &b, m)) {
            run_t *head = pq_head(&KF_CONTAINER_OF(m, wfq_t, node)->pq);
            if (head != NULL && (best == NULL || head->seq < best->seq)) {
                best = head;
            }
        }
        return best;
    }
    for (size_t i = 0; i < n; i++) {
        wfq_t *q = queue_get(rs, workflows[i], false);
        run_t *head = q ? pq_head(&q->pq) : NULL;
        if (head != NULL && (best == NULL || head->seq < best->seq)) {
            best = head;
        }
    }
    return best;
}

static bool slot_free(const keygrp_t *g, const run_t *r, uint32_t promised) {
    return r->key_concurrency == 0 || (int64_t)(g->leased + promised) < r->key_concurrency;
}

bool kf__run_may_lease(const run_t *r) {
    const run_t *oldest_blocked = pq_head(&r->group->blocked);
    return slot_free(r->group, r, 0) && (oldest_blocked == NULL || oldest_blocked->seq > r->seq);
}

void kf__run_block(kf_runs_t *rs, run_t *r) {
    KF_ASSERT(r->status == ST_PENDING && !r->blocked && r->queue != NULL);
    kf_pq_remove(&r->queue->pq, &r->queue_node);
    r->queue = NULL;
    rs->ready--;
    r->blocked = true;
    kf_pq_push(&r->group->blocked, &r->queue_node);
}

/* A slot of the key freed: its oldest blocked runs are ready again, as
 * many as the slots now free (a poll checks again before it leases one). */
static void unblock(kf_runs_t *rs, keygrp_t *g) {
    uint32_t moved = 0;
    run_t *r;
    while ((r = pq_head(&g->blocked)) != NULL && slot_free(g, r, moved)) {
        kf_pq_remove(&g->blocked, &r->queue_node);
        r->blocked = false;
        make_ready(rs, r);
        moved++;
    }
}

/* ---- records -------------------------------------------------------------- */

void kf__run_to_rec(const run_t *r, Keyflow__Records__RunRec *rec,
                    Keyflow__Records__RetryRec *retry) {
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
    rec->key_concurrency = r->key_concurrency;
    kf__retry_to_rec(&r->retry, retry, &rec->retry);
    rec->due_ms = r->status == ST_DELAYED ? r->due_ms : 0;
    rec->cancel_requested = r->cancel_requested;
    rec->last_error = r->last_error ? r->last_error : "";
    rec->n_event_ids = r->event_id_count;
    rec->event_ids = r->event_ids;
    rec->event_ids_dropped = r->event_ids_dropped;
}

Keyflow__V1__Run *kf__rec_to_pb(kf_arena_t *arena, const kf_ctx_t *ctx,
                                const Keyflow__Records__RunRec *rec, bool with_lease) {
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
    p->due_ms = rec->status == ST_DELAYED ? rec->due_ms : 0;
    p->cancel_requested = rec->cancel_requested;
    p->last_error = kf_arena_strdup(arena, rec->last_error);
    kf_retry_policy_t retry;
    bool ok = kf__retry_from_rec(rec->retry, &retry);
    KF_ASSERT(ok); /* records are checked where they are read (kf__run_load) */
    p->max_attempts = kf_retry_attempts_max(&retry, server_attempts_max(ctx));
    p->n_event_ids = rec->n_event_ids;
    p->event_ids = kf_arena_new(arena, (rec->n_event_ids + 1) * sizeof *p->event_ids);
    for (size_t i = 0; i < rec->n_event_ids; i++) {
        p->event_ids[i] = kf_arena_strdup(arena, rec->event_ids[i]);
        KF_ASSERT(p->event_ids[i] != NULL);
    }
    p->event_ids_dropped = rec->event_ids_dropped;
    KF_ASSERT(p->run_id && p->workflow && p->key && p->input_json && p->worker_id && p->lease &&
              p->result_json && p->error && p->last_error);
    return p;
}

Keyflow__V1__Run *kf__run_to_pb(kf_arena_t *arena, const kf_ctx_t *ctx, const run_t *r,
                                bool with_lease) {
    Keyflow__Records__RunRec rec;
    Keyflow__Records__RetryRec retry;
    kf__run_to_rec(r, &rec, &retry);
    return kf__rec_to_pb(arena, ctx, &rec, with_lease);
}

run_t *kf__run_find(const kf_runs_t *rs, const char *run_id) {
    kf_map_node_t *n = kf_map_get(&rs->by_id, run_id, strlen(run_id));
    return n ? KF_CONTAINER_OF(n, run_t, node) : NULL;
}

bool kf_runs_live(const kf_runs_t *rs, const char *run_id) {
    const run_t *r = kf__run_find(rs, run_id);
    return r != NULL && !kf__run_finished(r->status);
}

static run_t *run_new(void) {
    run_t *r = kf_xcalloc(1, sizeof *r);
    kf_timer_init(&r->timer, KF_TIMER_RUN);
    kf_pq_node_init(&r->queue_node);
    r->wakeup_due_ms = KF_NO_WAKEUP;
    r->retry = KF_RETRY_POLICY_NONE;
    return r;
}

static void set_event_ids(run_t *r, const char *const *ids, size_t count, int64_t dropped) {
    KF_ASSERT(count <= KF_RUN_EVENT_IDS_MAX);
    r->event_ids = count ? kf_xcalloc(count, sizeof *r->event_ids) : NULL;
    for (size_t i = 0; i < count; i++) {
        r->event_ids[i] = kf_xstrdup(ids[i]);
    }
    r->event_id_count = (uint32_t)count;
    r->event_ids_dropped = dropped;
}

static run_t *run_from_rec(const Keyflow__Records__RunRec *rec) {
    run_t *r = run_new();
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
    r->key_concurrency = rec->key_concurrency;
    bool ok = kf__retry_from_rec(rec->retry, &r->retry);
    KF_ASSERT(ok); /* checked by rec_valid */
    r->due_ms = rec->due_ms;
    r->cancel_requested = rec->cancel_requested;
    r->last_error = rec->last_error[0] ? kf_xstrdup(rec->last_error) : NULL;
    set_event_ids(r, (const char *const *)rec->event_ids, rec->n_event_ids, rec->event_ids_dropped);
    return r;
}

/* Estimated bytes a run holds (the memory budget; docs/semantics.md,
 * "Memory budget"): its struct and map slot, and each string with
 * malloc's 16-byte header. A result or error comes with the run's end,
 * after which the run leaves memory once its write is durable. */
static size_t run_bytes(const run_t *r) {
    size_t n = sizeof *r + 2 * sizeof(void *) + 4 * 16 + strlen(r->run_id) + strlen(r->workflow) +
               strlen(r->key) + strlen(r->input);
    for (uint32_t i = 0; i < r->event_id_count; i++) {
        n += 16 + sizeof(char *) + strlen(r->event_ids[i]);
    }
    return n;
}

/* Enters a run in the table, counting its memory. */
static void run_insert(kf_runs_t *rs, run_t *r) {
    kf_map_insert(&rs->by_id, &r->node, r->run_id, strlen(r->run_id));
    r->memory_bytes = run_bytes(r);
    rs->memory_bytes += r->memory_bytes;
}

uint64_t kf_runs_memory_bytes(const kf_runs_t *rs) {
    return rs->memory_bytes;
}

static void run_free(run_t *r) {
    free(r->run_id);
    free(r->workflow);
    free(r->key);
    free(r->input);
    free(r->worker_id);
    free(r->result_json);
    free(r->error);
    free(r->last_error);
    for (uint32_t i = 0; i < r->event_id_count; i++) {
        free(r->event_ids[i]);
    }
    free(r->event_ids);
    free(r);
}

/* ---- state changes -------------------------------------------------------- */

static void set_wakeup(kf_ctx_t *ctx, run_t *r, int64_t due_ms) {
    kf_ctx_wakeup_move(ctx, &r->timer, KF_WAKEUP_RUN, r->run_id, strlen(r->run_id),
                       &r->wakeup_due_ms, due_ms);
}

static void set_text(char **field, const char *text) {
    free(*field);
    *field = text ? kf_xstrdup(text) : NULL;
}

void kf__run_lease(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, const char *worker_id,
                   const kf_principal_t *owner, int64_t lease_ms) {
    KF_ASSERT(r->status == ST_PENDING && kf__run_may_lease(r));
    dequeue(rs, r);
    r->status = ST_LEASED;
    rs->leased++;
    r->group->leased++;
    r->attempts++;
    set_text(&r->worker_id, worker_id);
    kf_uuid7(ctx->rng, ctx->now_ms, r->lease);
    strcpy(r->lease_owner, kf_principal_id(owner));
    r->lease_ms = lease_ms;
    r->lease_expires_ms = kf_time_add_sat(ctx->now_ms, lease_ms);
    r->updated_ms = ctx->now_ms;
    kf__run_save(ctx, r);
    set_wakeup(ctx, r, r->lease_expires_ms);
}

/* Takes the run out of whatever live state it is in (its queue, its lease
 * count, the delayed count); its timer is the caller's to move. */
static void leave_state(kf_runs_t *rs, run_t *r) {
    switch (r->status) {
    case ST_PENDING: dequeue(rs, r); break;
    case ST_LEASED:
        KF_ASSERT(rs->leased > 0 && r->group->leased > 0);
        rs->leased--;
        r->group->leased--;
        break;
    case ST_DELAYED:
        KF_ASSERT(rs->delayed > 0);
        rs->delayed--;
        break;
    default: KF_UNREACHABLE(); /* finished runs are not live */
    }
}

/* A live run (already out of its state) becomes PENDING: the key's slot it
 * may have freed and the run itself can go to parked polls. */
static void to_pending(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r) {
    r->status = ST_PENDING;
    r->due_ms = 0;
    r->lease_expires_ms = 0;
    r->updated_ms = ctx->now_ms;
    kf__run_save(ctx, r);
    set_wakeup(ctx, r, KF_NO_WAKEUP);
    enqueue(rs, r);
    unblock(rs, r->group);
    kf__runs_serve_parked(rs, ctx);
}

static void to_delayed(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, int64_t due_ms) {
    r->status = ST_DELAYED;
    r->due_ms = due_ms;
    r->lease_expires_ms = 0;
    r->updated_ms = ctx->now_ms;
    rs->delayed++;
    kf__run_save(ctx, r);
    set_wakeup(ctx, r, due_ms);
    unblock(rs, r->group);
    kf__runs_serve_parked(rs, ctx);
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

void kf__run_finish(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, int status, const char *result,
                    const char *error) {
    KF_ASSERT(!kf__run_finished(r->status) && kf__run_finished(status));
    leave_state(rs, r);
    keygrp_t *g = r->group;
    bool slot_freed = r->status == ST_LEASED;
    r->status = status;
    r->due_ms = 0;
    r->finished_ms = r->updated_ms = ctx->now_ms;
    set_text(&r->result_json, result);
    set_text(&r->error, error);
    kf__run_save(ctx, r); /* its final state; the live record goes */
    set_wakeup(ctx, r, kf_time_add_sat(ctx->now_ms, retention_ms(ctx)));
    evict_push(rs, r, ctx->group_id);
    kf_counter_add(status == ST_COMPLETED ? KF_C_RUNS_COMPLETED
                   : status == ST_FAILED  ? KF_C_RUNS_FAILED
                                          : KF_C_RUNS_CANCELLED,
                   1);
    if (status != ST_COMPLETED) {
        kf_log_kv(KF_LOG_INFO, "runs", status == ST_FAILED ? "run failed" : "run cancelled",
                  KF_LOG_STR("run_id", r->run_id), KF_LOG_STR("workflow", r->workflow),
                  KF_LOG_INT("attempts", r->attempts), KF_LOG_STR("error", r->error));
    }
    kf__runs_wake(rs, ctx, r->run_id, r);
    if (g->live > 1 && slot_freed) {
        unblock(rs, g);
    }
    group_leave(rs, r);
    kf__runs_serve_parked(rs, ctx);
    kf__runs_publish(rs);
}

void kf__run_release(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r) {
    KF_ASSERT(r->status == ST_LEASED && r->attempts > 0);
    r->attempts--; /* a release is not an attempt */
    r->lease[0] = '\0';
    r->lease_owner[0] = '\0';
    if (r->cancel_requested) {
        kf__run_finish(rs, ctx, r, ST_CANCELLED, NULL, NULL);
        return;
    }
    leave_state(rs, r);
    to_pending(rs, ctx, r);
    kf__runs_publish(rs);
}

void kf__run_attempt_failed(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, const char *error,
                            bool keep_lease) {
    KF_ASSERT(r->status == ST_LEASED);
    if (!keep_lease) {
        /* The lease ended unused: forget it, so a late completion with it
         * is refused rather than taken for a retry of one that happened. */
        r->lease[0] = '\0';
        r->lease_owner[0] = '\0';
    }
    if (r->cancel_requested) {
        kf__run_finish(rs, ctx, r, ST_CANCELLED, NULL, error);
        return;
    }
    int64_t max = kf__runs_attempts_max(ctx, r);
    if (r->attempts >= max) {
        kf__run_finish(rs, ctx, r, ST_FAILED, NULL, error);
        return;
    }
    set_text(&r->last_error, error);
    kf_counter_add(KF_C_RUN_RETRIES, 1);
    leave_state(rs, r);
    int64_t backoff_ms = kf_retry_backoff_ms(&r->retry, r->attempts);
    if (backoff_ms == 0) {
        to_pending(rs, ctx, r);
    } else {
        to_delayed(rs, ctx, r, kf_time_add_sat(ctx->now_ms, backoff_ms));
    }
    kf__runs_publish(rs);
}

/* Retention's end: the run's records go (a whole record of an older build
 * has no state record; deleting the absent one costs nothing). */
static void delete_stored(kf_ctx_t *ctx, const char *run_id, const char *workflow, uint64_t seq,
                          int64_t wakeup_due_ms) {
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_raw(&k, run_id, strlen(run_id));
    kf_ctx_delete(ctx, KF_CF_RUNS, &k);
    kf_ctx_delete(ctx, KF_CF_RUN_STATE, &k);
    kf_key_run_index(&k, workflow, strlen(workflow), seq);
    kf_ctx_delete(ctx, KF_CF_RUN_INDEX, &k);
    if (wakeup_due_ms != KF_NO_WAKEUP) {
        kf_key_wakeup(&k, wakeup_due_ms, KF_WAKEUP_RUN, run_id, strlen(run_id));
        kf_ctx_delete(ctx, KF_CF_WAKEUPS, &k);
    }
    kf_counter_add(KF_C_RUNS_DELETED, 1);
}

/* ---- starting runs -------------------------------------------------------- */

bool kf_runs_full(const kf_runs_t *rs) {
    return !kf_runs_room(rs, 1);
}

bool kf_runs_room(const kf_runs_t *rs, uint32_t count) {
    return rs->pending + rs->leased + rs->delayed + count <= KF_LIVE_RUNS_MAX;
}

uint64_t kf_runs_start(kf_runs_t *rs, kf_ctx_t *ctx, const kf_run_spec_t *spec) {
    KF_ASSERT(!kf_runs_full(rs));
    KF_ASSERT(kf__run_find(rs, spec->run_id) == NULL);
    run_t *r = run_new();
    r->run_id = kf_xstrdup(spec->run_id);
    r->workflow = kf_xstrdup(spec->workflow);
    r->key = kf_xstrdup(spec->key);
    r->kind = spec->kind;
    r->input = kf_xstrndup(spec->input, spec->input_len);
    r->event_count = spec->event_count;
    r->key_concurrency = spec->options.key_concurrency;
    r->retry = spec->options.retry;
    set_event_ids(r, spec->event_ids, spec->event_id_count, spec->event_ids_dropped);
    r->created_ms = r->updated_ms = ctx->now_ms;
    r->seq = rs->next_seq++;
    run_insert(rs, r);
    group_join(rs, r);

    uint8_t seq_be[8];
    kf_put_be64(seq_be, rs->next_seq);
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_raw(&k, run_seq_key, sizeof run_seq_key - 1);
    kf_ctx_put(ctx, KF_CF_META, &k, seq_be, sizeof seq_be);
    kf_key_run_index(&k, r->workflow, strlen(r->workflow), r->seq);
    kf_ctx_put(ctx, KF_CF_RUN_INDEX, &k, r->run_id, strlen(r->run_id));
    kf__run_save_body(ctx, r);
    kf_counter_add(KF_C_RUNS_CREATED, 1);
    if (spec->options.start_after_ms > 0) {
        to_delayed(rs, ctx, r, kf_time_add_sat(ctx->now_ms, spec->options.start_after_ms));
    } else {
        r->status = ST_PENDING;
        kf__run_save(ctx, r);
        enqueue(rs, r);
        kf__runs_serve_parked(rs, ctx);
    }
    kf__runs_publish(rs);
    return r->seq;
}

/* ---- timers ------------------------------------------------------------- */

static void run_forget(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r) {
    kf_heap_disarm(&ctx->heap, &r->timer);
    evict_unlink(rs, r);
    kf_map_remove(&rs->by_id, &r->node);
    rs->memory_bytes -= r->memory_bytes;
    run_free(r);
}

static void lease_expired(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r) {
    int64_t max = kf__runs_attempts_max(ctx, r);
    kf_counter_add(KF_C_LEASES_EXPIRED, 1);
    const char *next = r->cancel_requested                               ? "cancelled"
                       : r->attempts >= max                              ? "failed"
                       : kf_retry_backoff_ms(&r->retry, r->attempts) > 0 ? "delayed"
                                                                         : "pending";
    kf_log_kv(KF_LOG_INFO, "runs", "lease expired", KF_LOG_STR("run_id", r->run_id),
              KF_LOG_STR("workflow", r->workflow), KF_LOG_STR("worker_id", r->worker_id),
              KF_LOG_INT("attempt", r->attempts), KF_LOG_INT("attempts_max", max),
              KF_LOG_STR("next", next));
    char msg[160];
    snprintf(msg, sizeof msg, "lease expired on attempt %lld of %lld", (long long)r->attempts,
             (long long)max);
    kf__run_attempt_failed(rs, ctx, r, msg, false);
}

void kf_runs_fire(kf_runs_t *rs, kf_ctx_t *ctx, kf_timer_t *timer) {
    if (timer->type == KF_TIMER_POLL) {
        poller_t *p = KF_CONTAINER_OF(timer, poller_t, timer);
        kf__poll_unlink(rs, p);
        p->cmd->parked = NULL;
        kf_ctx_ready(ctx, p->cmd); /* the long poll ends empty */
        kf__runs_publish(rs);
        return;
    }
    if (timer->type == KF_TIMER_RUN_WAIT) {
        kf__waiter_answer(rs, ctx, KF_CONTAINER_OF(timer, waiter_t, timer));
        return;
    }
    run_t *r = KF_CONTAINER_OF(timer, run_t, timer);
    switch (r->status) {
    case ST_LEASED:
        if (r->lease_expires_ms > ctx->now_ms) {
            set_wakeup(ctx, r, r->lease_expires_ms);
            return;
        }
        lease_expired(rs, ctx, r);
        return;
    case ST_DELAYED:
        if (r->due_ms > ctx->now_ms) {
            set_wakeup(ctx, r, r->due_ms);
            return;
        }
        leave_state(rs, r);
        to_pending(rs, ctx, r);
        kf__runs_publish(rs);
        return;
    case ST_COMPLETED:
    case ST_FAILED:
    case ST_CANCELLED:
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
    default: KF_UNREACHABLE(); /* pending runs have no timer */
    }
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
        if (kf__run_find(rs, run_id) != NULL) {
            continue; /* in memory: its own timer handles it */
        }
        kf_stored_run_t *sr;
        if (kf__run_load(ctx, run_id, &sr, &err) != KF_OK) {
            continue;
        }
        kf_key_t wk;
        kf_key_reset(&wk);
        kf_key_raw(&wk, k, klen);
        if (sr == NULL) {
            kf_ctx_delete(ctx, KF_CF_WAKEUPS, &wk); /* stale: the run is gone */
            continue;
        }
        if (kf__run_finished(sr->view.status)) {
            delete_stored(ctx, run_id, sr->view.workflow, sr->view.seq, due);
        }
        kf__stored_run_free(sr);
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

/* ---- recovery ------------------------------------------------------------ */

/* A recovered live run joins the table. */
static void recover_run(kf_runs_t *rs, run_t *r) {
    run_insert(rs, r);
    group_join(rs, r);
    switch (r->status) {
    case ST_PENDING: enqueue(rs, r); break;
    case ST_LEASED:
        rs->leased++;
        r->group->leased++;
        break;
    case ST_DELAYED: rs->delayed++; break;
    default: KF_UNREACHABLE();
    }
}

/* One live run of an older build, listed in run_queue by its ID: its whole
 * record is read, and it moves to run_live (the record stays as its body).
 * `k` is its run_queue key. */
static kf_status_t recover_queued(kf_runs_t *rs, kf_ctx_t *ctx, const kf_key_t *k,
                                  const char *run_id, run_t **out, kf_error_t *err) {
    kf_stored_run_t *sr;
    kf_status_t st = kf__run_load(ctx, run_id, &sr, err);
    if (st != KF_OK) {
        return st;
    }
    if (sr == NULL || sr->state != NULL || kf__run_finished(sr->view.status) ||
        sr->view.seq >= rs->next_seq) {
        kf__stored_run_free(sr);
        return kf_error_set(err, KF_E_CORRUPT, "run_queue: %s is not a live run", run_id);
    }
    *out = run_from_rec(&sr->view);
    kf__stored_run_free(sr);
    kf_ctx_delete(ctx, KF_CF_RUN_QUEUE, k);
    kf__run_save(ctx, *out);
    return KF_OK;
}

/* One live run from its live record and its body. */
static kf_status_t recover_live(kf_runs_t *rs, kf_ctx_t *ctx, uint64_t seq, const void *value,
                                size_t len, run_t **out, kf_error_t *err) {
    Keyflow__Records__RunLiveRec *live = keyflow__records__run_live_rec__unpack(NULL, len, value);
    if (live == NULL || !kf__run_live_valid(live)) {
        if (live != NULL) {
            keyflow__records__run_live_rec__free_unpacked(live, NULL);
        }
        return kf_error_set(err, KF_E_CORRUPT, "run_live: undecodable record at %llu",
                            (unsigned long long)seq);
    }
    Keyflow__Records__RunRec *body;
    kf_status_t st = kf__run_load_body(ctx, live->run_id, &body, err);
    if (st == KF_OK && (body == NULL || body->seq != seq || seq >= rs->next_seq ||
                        strcmp(body->workflow, live->workflow) != 0)) {
        st = kf_error_set(err, KF_E_CORRUPT, "run_live: %s has no body of its own", live->run_id);
    }
    if (st == KF_OK) {
        Keyflow__Records__RunRec view = *body;
        kf__overlay_live(&view, live);
        *out = run_from_rec(&view);
    }
    if (body != NULL) {
        keyflow__records__run_rec__free_unpacked(body, NULL);
    }
    keyflow__records__run_live_rec__free_unpacked(live, NULL);
    return st;
}

/* Every live run listed in `cf` (run_queue of older builds, run_live), in
 * run sequence order. */
static kf_status_t recover_family(kf_runs_t *rs, kf_ctx_t *ctx, kf_cf_t cf, kf_error_t *err) {
    kf_iter_t *it;
    kf_status_t st = kf_iter_create(ctx->store, cf, NULL, 0, NULL, 0, &it, err);
    if (st != KF_OK) {
        return st;
    }
    for (kf_iter_seek_first(it); kf_iter_valid(it) && st == KF_OK; kf_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *kb = kf_iter_key(it, &klen);
        const char *val = kf_iter_value(it, &vlen);
        kf_key_reader_t rd = kf_key_reader(kb, klen);
        uint64_t seq;
        if (!kf_key_read_be64(&rd, &seq) || rd.left != 0) {
            st = kf_error_set(err, KF_E_CORRUPT, "%s: malformed key", kf_cf_name(cf));
            break;
        }
        run_t *r = NULL;
        if (cf == KF_CF_RUN_QUEUE) {
            char run_id[KF_RUN_ID_BYTES_MAX + 1];
            if (vlen == 0 || vlen > KF_RUN_ID_BYTES_MAX) {
                st = kf_error_set(err, KF_E_CORRUPT, "run_queue: malformed entry");
                break;
            }
            memcpy(run_id, val, vlen);
            run_id[vlen] = '\0';
            if (kf__run_find(rs, run_id) != NULL) {
                st = kf_error_set(err, KF_E_CORRUPT,
                                  "run_queue: %s is not a live run, or is listed twice", run_id);
                break;
            }
            kf_key_t k;
            kf_key_reset(&k);
            kf_key_raw(&k, kb, klen);
            st = recover_queued(rs, ctx, &k, run_id, &r, err);
        } else {
            st = recover_live(rs, ctx, seq, val, vlen, &r, err);
        }
        if (st != KF_OK) {
            break;
        }
        if (r->seq != seq || kf__run_find(rs, r->run_id) != NULL) {
            st = kf_error_set(err, KF_E_CORRUPT, "%s: %s is not a live run, or is listed twice",
                              kf_cf_name(cf), r->run_id);
            run_free(r);
            break;
        }
        recover_run(rs, r);
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    return st;
}

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
    /* run_live first: a run of an older build found there too is listed
     * twice. */
    if ((st = recover_family(rs, ctx, KF_CF_RUN_LIVE, err)) == KF_OK) {
        st = recover_family(rs, ctx, KF_CF_RUN_QUEUE, err);
    }
    kf__runs_publish(rs);
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
    run_t *r = kf__run_find(rs, id);
    if (r == NULL || (r->status != ST_LEASED && r->status != ST_DELAYED) ||
        r->wakeup_due_ms != KF_NO_WAKEUP) {
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
        if ((r->status == ST_LEASED || r->status == ST_DELAYED) && !kf_timer_armed(&r->timer)) {
            kf_log(KF_LOG_WARN, "runs", "repairing the wake-up of %s", r->run_id);
            set_wakeup(ctx, r, r->status == ST_LEASED ? r->lease_expires_ms : r->due_ms);
        }
    }
}

/* ---- lifecycle ----------------------------------------------------------- */

kf_runs_t *kf_runs_create(void) {
    kf_runs_t *rs = kf_xcalloc(1, sizeof *rs);
    kf_map_init(&rs->by_id);
    kf_map_init(&rs->queues);
    kf_map_init(&rs->groups);
    kf_map_init(&rs->waitlists);
    return rs;
}

void kf_runs_set_window_lookup(kf_runs_t *rs, kf_window_lookup_fn fn, void *owner) {
    rs->window_lookup = fn;
    rs->window_owner = owner;
}

void kf_runs_destroy(kf_runs_t *rs) {
    if (rs == NULL) {
        return;
    }
    /* Queues and groups first: their nodes live inside the runs. Waiters
     * live in their commands' arenas; only their lists are ours. */
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
    n = kf_map_first(&rs->groups, &b);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&rs->groups, &b, n);
        group_free(KF_CONTAINER_OF(n, keygrp_t, node));
        n = next;
    }
    n = kf_map_first(&rs->waitlists, &b);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&rs->waitlists, &b, n);
        waitlist_t *l = KF_CONTAINER_OF(n, waitlist_t, node);
        free(l->run_id);
        free(l);
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
    kf_map_deinit(&rs->groups);
    kf_map_deinit(&rs->waitlists);
    free(rs);
}

uint64_t kf_runs_pending(const kf_runs_t *rs) {
    return rs->pending;
}
uint64_t kf_runs_leased(const kf_runs_t *rs) {
    return rs->leased;
}
uint64_t kf_runs_delayed(const kf_runs_t *rs) {
    return rs->delayed;
}
