/*
 * runs.c - the run table: per-workflow ready queues, per-key groups
 * (key_concurrency), the state changes of runs.h's diagram, timers and
 * what memory keeps until it is durable. The RPC handlers are in ops.c,
 * the stored forms and views in records.c, recovery and retention's sweep
 * in recover.c; see runs_int.h for what memory holds and where a run is in
 * each status.
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

void kf__runs_publish(const kf_runs_t *rs) {
    kf_gauge_set(KF_G_RUNS_PENDING, (int64_t)rs->pending);
    kf_gauge_set(KF_G_RUNS_LEASED, (int64_t)rs->leased);
    kf_gauge_set(KF_G_RUNS_DELAYED, (int64_t)rs->delayed);
    kf_gauge_set(KF_G_PARKED_POLLS, rs->polls);
    kf_gauge_set(KF_G_RUN_WAITS, rs->waiting);
    kf_gauge_set(KF_G_RUNS_MEMORY_BYTES, (int64_t)rs->memory_bytes);
}

/* ---- memory accounting (runs_int.h) ------------------------------------------ */

uint64_t kf_runs_memory_bytes(const kf_runs_t *rs) {
    return rs->memory_bytes;
}

static void mem_add(kf_runs_t *rs, size_t bytes) {
    rs->memory_bytes += bytes;
}

static void mem_sub(kf_runs_t *rs, size_t bytes) {
    KF_ASSERT(rs->memory_bytes >= bytes);
    rs->memory_bytes -= bytes;
}

static size_t text_bytes(const char *s) {
    return s ? ALLOC(strlen(s) + 1) : 0;
}

static size_t detail_bytes(const run_detail_t *d) {
    return ALLOC(sizeof *d) + text_bytes(d->worker_id) + text_bytes(d->last_error) +
           text_bytes(d->result_json) + text_bytes(d->error);
}

static size_t body_bytes(const run_body_t *b) {
    size_t n = ALLOC(sizeof *b) + text_bytes(b->input) +
               (b->event_id_count ? ALLOC(b->event_id_count * sizeof *b->event_ids) : 0);
    for (uint32_t i = 0; i < b->event_id_count; i++) {
        n += text_bytes(b->event_ids[i]);
    }
    return n;
}

static size_t run_bytes(const run_t *r) {
    return ALLOC(sizeof *r + strlen(r->run_id) + 1) + SLOTS;
}

static int64_t retention_ms(const kf_ctx_t *ctx) {
    int64_t r = ctx->config->run_retention_ms;
    return r > 0 ? r : KF_RETENTION_MS_DEFAULT;
}

int64_t kf__runs_server_attempts_max(const kf_ctx_t *ctx) {
    int64_t a = ctx->config->run_attempts_max;
    return a > 0 ? a : KF_RUN_ATTEMPTS_DEFAULT;
}

int64_t kf__runs_attempts_max(const kf_ctx_t *ctx, const run_t *r) {
    KF_ASSERT(r->detail != NULL);
    return kf_retry_attempts_max(&r->detail->retry, kf__runs_server_attempts_max(ctx));
}

/* ---- workflows and key groups ---------------------------------------------- */

static bool run_before(const kf_pq_node_t *a, const kf_pq_node_t *b, const void *ctx) {
    (void)ctx;
    return KF_CONTAINER_OF(a, run_t, queue_node)->seq < KF_CONTAINER_OF(b, run_t, queue_node)->seq;
}

static run_t *pq_head(const kf_pq_t *pq) {
    kf_pq_node_t *n = kf_pq_top(pq);
    return n ? KF_CONTAINER_OF(n, run_t, queue_node) : NULL;
}

static wfq_t *queue_find(const kf_runs_t *rs, const char *workflow) {
    kf_map_node_t *n = kf_map_get(&rs->queues, workflow, strlen(workflow));
    return n ? KF_CONTAINER_OF(n, wfq_t, node) : NULL;
}

/* The workflow's entry, created on first use; one more run names it. */
static wfq_t *queue_ref(kf_runs_t *rs, const char *workflow) {
    wfq_t *q = queue_find(rs, workflow);
    if (q == NULL) {
        q = kf_xcalloc(1, sizeof *q);
        q->workflow = kf_xstrdup(workflow);
        mem_add(rs, ALLOC(sizeof *q) + text_bytes(workflow) + SLOTS);
        kf_pq_init(&q->pq, run_before, NULL);
        kf_map_insert(&rs->queues, &q->node, q->workflow, strlen(q->workflow));
    }
    q->runs++;
    return q;
}

static void queue_free(wfq_t *q) {
    kf_pq_deinit(&q->pq);
    free(q->workflow);
    free(q);
}

/* A run of the workflow left memory; the entry goes with the last one. */
static void queue_unref(kf_runs_t *rs, wfq_t *q) {
    KF_ASSERT(q->runs > 0);
    if (--q->runs == 0) {
        KF_ASSERT(q->pq.count == 0);
        mem_sub(rs, ALLOC(sizeof *q) + text_bytes(q->workflow) + SLOTS);
        kf_map_remove(&rs->queues, &q->node);
        queue_free(q);
    }
}

/* "workflow \0 key": a key group's name. Returns its length. */
static size_t group_name(const run_t *r, char out[KF_WORKFLOW_BYTES_MAX + 1 + KF_KEY_BYTES_MAX]) {
    size_t wlen = strlen(r->wf->workflow);
    KF_ASSERT(wlen <= KF_WORKFLOW_BYTES_MAX && r->key_len <= KF_KEY_BYTES_MAX);
    memcpy(out, r->wf->workflow, wlen);
    out[wlen] = '\0';
    memcpy(out + wlen + 1, r->run_id, r->key_len);
    return wlen + 1 + r->key_len;
}

static keygrp_t *group_find(const kf_runs_t *rs, const run_t *r) {
    char name[KF_WORKFLOW_BYTES_MAX + 1 + KF_KEY_BYTES_MAX];
    size_t len = group_name(r, name);
    kf_map_node_t *n = kf_map_get(&rs->groups, name, len);
    return n ? KF_CONTAINER_OF(n, keygrp_t, node) : NULL;
}

/* The run's key group, created when the key gets its first lease or
 * blocked run. */
static keygrp_t *group_get(kf_runs_t *rs, const run_t *r) {
    keygrp_t *g = group_find(rs, r);
    if (g == NULL) {
        char name[KF_WORKFLOW_BYTES_MAX + 1 + KF_KEY_BYTES_MAX];
        size_t len = group_name(r, name);
        g = kf_xcalloc(1, sizeof *g);
        g->name = kf_xmemdup(name, len);
        g->name_len = len;
        mem_add(rs, ALLOC(sizeof *g) + ALLOC(len) + SLOTS);
        kf_pq_init(&g->blocked, run_before, NULL);
        kf_map_insert(&rs->groups, &g->node, g->name, g->name_len);
    }
    return g;
}

static void group_free(keygrp_t *g) {
    kf_pq_deinit(&g->blocked);
    free(g->name);
    free(g);
}

/* The group goes when it holds neither a lease nor a blocked run. */
static void group_settle(kf_runs_t *rs, keygrp_t *g) {
    if (g->leased == 0 && g->blocked.count == 0) {
        mem_sub(rs, ALLOC(sizeof *g) + ALLOC(g->name_len) + SLOTS);
        kf_map_remove(&rs->groups, &g->node);
        group_free(g);
    }
}

/* ---- ready queues --------------------------------------------------------- */

static void make_ready(kf_runs_t *rs, run_t *r) {
    kf_pq_push(&r->wf->pq, &r->queue_node);
    rs->ready++;
}

/* A run that becomes PENDING waits behind its key's blocked runs, if any
 * (the key's runs are leased in order); otherwise it is ready. */
static void enqueue(kf_runs_t *rs, run_t *r) {
    KF_ASSERT(r->status == ST_PENDING && !kf_pq_queued(&r->queue_node));
    rs->pending++;
    keygrp_t *g = group_find(rs, r);
    if (g != NULL && g->blocked.count > 0) {
        r->flags |= RUN_BLOCKED;
        kf_pq_push(&g->blocked, &r->queue_node);
    } else {
        make_ready(rs, r);
    }
}

static void dequeue(kf_runs_t *rs, run_t *r) {
    KF_ASSERT(kf_pq_queued(&r->queue_node));
    if (r->flags & RUN_BLOCKED) {
        keygrp_t *g = group_find(rs, r);
        KF_ASSERT(g != NULL);
        kf_pq_remove(&g->blocked, &r->queue_node);
        r->flags &= (uint8_t)~RUN_BLOCKED;
        group_settle(rs, g);
    } else {
        kf_pq_remove(&r->wf->pq, &r->queue_node);
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
        wfq_t *q = queue_find(rs, workflows[i]);
        run_t *head = q ? pq_head(&q->pq) : NULL;
        if (head != NULL && (best == NULL || head->seq < best->seq)) {
            best = head;
        }
    }
    return best;
}

static bool slot_free(const keygrp_t *g, const run_t *r, uint32_t promised) {
    uint32_t leased = g ? g->leased : 0;
    return r->key_concurrency == 0 || (int64_t)(leased + promised) < r->key_concurrency;
}

bool kf__run_may_lease(const kf_runs_t *rs, const run_t *r) {
    const keygrp_t *g = group_find(rs, r);
    const run_t *oldest_blocked = g ? pq_head(&g->blocked) : NULL;
    return slot_free(g, r, 0) && (oldest_blocked == NULL || oldest_blocked->seq > r->seq);
}

void kf__run_block(kf_runs_t *rs, run_t *r) {
    KF_ASSERT(r->status == ST_PENDING && !(r->flags & RUN_BLOCKED) && kf_pq_queued(&r->queue_node));
    kf_pq_remove(&r->wf->pq, &r->queue_node);
    rs->ready--;
    r->flags |= RUN_BLOCKED;
    kf_pq_push(&group_get(rs, r)->blocked, &r->queue_node);
}

/* A slot of the key freed: its oldest blocked runs are ready again, as
 * many as the slots now free (a poll checks again before it leases one). */
static void unblock(kf_runs_t *rs, keygrp_t *g) {
    uint32_t moved = 0;
    run_t *r;
    while ((r = pq_head(&g->blocked)) != NULL && slot_free(g, r, moved)) {
        kf_pq_remove(&g->blocked, &r->queue_node);
        r->flags &= (uint8_t)~RUN_BLOCKED;
        make_ready(rs, r);
        moved++;
    }
}

/* ---- memory, and what it keeps until durable -------------------------------- */

run_t *kf__run_find(const kf_runs_t *rs, const char *run_id) {
    kf_map_node_t *n = kf_map_get(&rs->by_id, run_id, strlen(run_id));
    return n ? KF_CONTAINER_OF(n, run_t, node) : NULL;
}

bool kf_runs_live(const kf_runs_t *rs, const char *run_id) {
    const run_t *r = kf__run_find(rs, run_id);
    return r != NULL && !kf__run_finished(r->status);
}

run_t *kf__run_new(kf_runs_t *rs, const char *run_id, const char *workflow, size_t key_len,
                   uint64_t seq) {
    size_t id_len = strlen(run_id);
    KF_ASSERT(id_len <= KF_RUN_ID_BYTES_MAX && key_len < id_len && run_id[key_len] == '@');
    run_t *r = kf_xcalloc(1, sizeof *r + id_len + 1);
    memcpy(r->run_id, run_id, id_len + 1);
    if (!kf_map_try_insert(&rs->by_id, &r->node, r->run_id, id_len)) {
        free(r);
        return NULL;
    }
    mem_add(rs, run_bytes(r));
    r->key_len = (uint16_t)key_len;
    r->seq = seq;
    r->wf = queue_ref(rs, workflow);
    kf_pq_node_init(&r->queue_node);
    return r;
}

run_detail_t *kf__detail_new(kf_runs_t *rs, run_t *r) {
    KF_ASSERT(r->detail == NULL);
    run_detail_t *d = kf_xcalloc(1, sizeof *d);
    mem_add(rs, ALLOC(sizeof *d));
    kf_timer_init(&d->timer, KF_TIMER_RUN);
    d->run = r;
    d->wakeup_due_ms = KF_NO_WAKEUP;
    d->retry = KF_RETRY_POLICY_NONE;
    r->detail = d;
    return d;
}

void kf__detail_load(kf_runs_t *rs, run_t *r, const Keyflow__Records__RunLiveRec *live) {
    run_detail_t *d = kf__detail_new(rs, r);
    kf__detail_from_live(d, live);
    mem_add(rs, detail_bytes(d) - ALLOC(sizeof *d));
}

static void detail_free(run_detail_t *d) {
    free(d->worker_id);
    free(d->last_error);
    free(d->result_json);
    free(d->error);
    free(d);
}

static void body_free(run_body_t *b) {
    free(b->input);
    for (uint32_t i = 0; i < b->event_id_count; i++) {
        free(b->event_ids[i]);
    }
    free(b->event_ids);
    free(b);
}

static void run_free(kf_runs_t *rs, run_t *r) {
    if (r->detail != NULL) {
        mem_sub(rs, detail_bytes(r->detail));
        detail_free(r->detail);
    }
    if (r->body != NULL) {
        mem_sub(rs, body_bytes(r->body));
        body_free(r->body);
    }
    mem_sub(rs, run_bytes(r));
    free(r);
}

static void settle_unlink(kf_runs_t *rs, run_detail_t *d) {
    if (d->prev) {
        d->prev->next = d->next;
    } else if (rs->settling_head == d) {
        rs->settling_head = d->next;
    } else {
        return; /* not on the list */
    }
    if (d->next) {
        d->next->prev = d->prev;
    } else {
        rs->settling_tail = d->prev;
    }
    d->prev = d->next = NULL;
}

/* The run wrote its state in this group: once the group is durable, a
 * PENDING run's detail goes (its live record holds it) and a finished run
 * is forgotten (its records hold it). LEASED and DELAYED runs keep their
 * detail and are not on the list. The list stays in group order: groups
 * only grow. */
static void settle_push(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r) {
    run_detail_t *d = r->detail;
    settle_unlink(rs, d);
    if (r->status == ST_LEASED || r->status == ST_DELAYED) {
        return;
    }
    d->group = ctx->group_id;
    d->prev = rs->settling_tail;
    if (rs->settling_tail) {
        rs->settling_tail->next = d;
    } else {
        rs->settling_head = d;
    }
    rs->settling_tail = d;
}

/* Writes the run's changed state and keeps in memory what must stay. */
static void save(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r) {
    kf__run_save(ctx, r);
    settle_push(rs, ctx, r);
}

kf_status_t kf__run_detail(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, kf_error_t *err) {
    if (r->detail != NULL) {
        return KF_OK;
    }
    KF_ASSERT(r->status == ST_PENDING);
    Keyflow__Records__RunLiveRec *live;
    kf_status_t st = kf__run_load_live(ctx, r->seq, r->run_id, &live, err);
    if (st != KF_OK) {
        return st;
    }
    kf__detail_load(rs, r, live);
    keyflow__records__run_live_rec__free_unpacked(live, NULL);
    settle_push(rs, ctx, r); /* dropped again if nothing changes it */
    return KF_OK;
}

static void run_forget(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r) {
    KF_ASSERT(r->body == NULL); /* bodies settle first: their group is older */
    if (r->detail != NULL) {
        kf_heap_disarm(&ctx->heap, &r->detail->timer);
        settle_unlink(rs, r->detail);
    }
    kf_map_remove(&rs->by_id, &r->node);
    queue_unref(rs, r->wf);
    run_free(rs, r);
}

void kf_runs_evict(kf_runs_t *rs, kf_ctx_t *ctx) {
    uint64_t held = rs->memory_bytes;
    while (rs->bodies_head != NULL && rs->bodies_head->group <= ctx->durable_group_id) {
        run_body_t *b = rs->bodies_head;
        rs->bodies_head = b->next;
        if (rs->bodies_head == NULL) {
            rs->bodies_tail = NULL;
        }
        b->run->body = NULL;
        mem_sub(rs, body_bytes(b));
        body_free(b);
    }
    while (rs->settling_head != NULL && rs->settling_head->group <= ctx->durable_group_id) {
        run_detail_t *d = rs->settling_head;
        run_t *r = d->run;
        if (kf__run_finished(r->status)) {
            run_forget(rs, ctx, r); /* its stored wake-up stays; the sweep deletes it when due */
            continue;
        }
        KF_ASSERT(r->status == ST_PENDING && !kf_timer_armed(&d->timer) &&
                  d->wakeup_due_ms == KF_NO_WAKEUP);
        settle_unlink(rs, d);
        mem_sub(rs, detail_bytes(d));
        detail_free(d);
        r->detail = NULL;
    }
    if (rs->memory_bytes != held) {
        kf__runs_publish(rs);
    }
}

/* ---- state changes -------------------------------------------------------- */

static void set_wakeup(kf_ctx_t *ctx, run_t *r, int64_t due_ms) {
    run_detail_t *d = r->detail;
    kf_ctx_wakeup_move(ctx, &d->timer, KF_WAKEUP_RUN, r->run_id, strlen(r->run_id),
                       &d->wakeup_due_ms, due_ms);
}

static void set_text(kf_runs_t *rs, char **field, const char *text) {
    mem_sub(rs, text_bytes(*field));
    free(*field);
    *field = text ? kf_xstrdup(text) : NULL;
    mem_add(rs, text_bytes(*field));
}

void kf__run_lease(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, const char *worker_id,
                   const kf_principal_t *owner, int64_t lease_ms) {
    KF_ASSERT(r->status == ST_PENDING && r->detail != NULL && kf__run_may_lease(rs, r));
    run_detail_t *d = r->detail;
    dequeue(rs, r);
    r->status = ST_LEASED;
    rs->leased++;
    group_get(rs, r)->leased++;
    r->attempts++;
    set_text(rs, &d->worker_id, worker_id);
    kf_uuid7(ctx->rng, ctx->now_ms, d->lease);
    strcpy(d->lease_owner, kf_principal_id(owner));
    d->lease_ms = lease_ms;
    d->lease_expires_ms = kf_time_add_sat(ctx->now_ms, lease_ms);
    r->updated_ms = ctx->now_ms;
    save(rs, ctx, r);
    set_wakeup(ctx, r, d->lease_expires_ms);
}

/* Takes the run out of whatever live state it is in (its queue, its lease
 * count, the delayed count); its timer is the caller's to move. Returns the
 * key group whose lease it gave up, or NULL. */
static keygrp_t *leave_state(kf_runs_t *rs, run_t *r) {
    keygrp_t *freed = NULL;
    switch (r->status) {
    case ST_PENDING: dequeue(rs, r); break;
    case ST_LEASED:
        freed = group_find(rs, r);
        KF_ASSERT(rs->leased > 0 && freed != NULL && freed->leased > 0);
        rs->leased--;
        freed->leased--;
        break;
    case ST_DELAYED:
        KF_ASSERT(rs->delayed > 0);
        rs->delayed--;
        break;
    default: KF_UNREACHABLE(); /* finished runs are not live */
    }
    return freed;
}

/* The slot a lease gave up goes to the key's blocked runs; the group goes
 * when nothing holds it. */
static void slot_freed(kf_runs_t *rs, keygrp_t *g) {
    if (g != NULL) {
        unblock(rs, g);
        group_settle(rs, g);
    }
}

/* A live run (already out of its state) becomes PENDING: the key's slot it
 * may have freed and the run itself can go to parked polls. */
static void to_pending(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, keygrp_t *freed) {
    run_detail_t *d = r->detail;
    r->status = ST_PENDING;
    d->due_ms = 0;
    d->lease_expires_ms = 0;
    r->updated_ms = ctx->now_ms;
    set_wakeup(ctx, r, KF_NO_WAKEUP);
    save(rs, ctx, r);
    enqueue(rs, r);
    slot_freed(rs, freed);
    kf__runs_serve_parked(rs, ctx);
}

static void to_delayed(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, int64_t due_ms, keygrp_t *freed) {
    run_detail_t *d = r->detail;
    r->status = ST_DELAYED;
    d->due_ms = due_ms;
    d->lease_expires_ms = 0;
    r->updated_ms = ctx->now_ms;
    rs->delayed++;
    save(rs, ctx, r);
    set_wakeup(ctx, r, due_ms);
    slot_freed(rs, freed);
    kf__runs_serve_parked(rs, ctx);
}

void kf__run_finish(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, int status, const char *result,
                    const char *error) {
    KF_ASSERT(!kf__run_finished(r->status) && kf__run_finished(status) && r->detail != NULL);
    run_detail_t *d = r->detail;
    keygrp_t *freed = leave_state(rs, r);
    r->status = (uint8_t)status;
    d->due_ms = 0;
    d->finished_ms = r->updated_ms = ctx->now_ms;
    set_text(rs, &d->result_json, result);
    set_text(rs, &d->error, error);
    save(rs, ctx, r); /* its final state; the live record goes */
    set_wakeup(ctx, r, kf_time_add_sat(ctx->now_ms, retention_ms(ctx)));
    kf_counter_add(status == ST_COMPLETED ? KF_C_RUNS_COMPLETED
                   : status == ST_FAILED  ? KF_C_RUNS_FAILED
                                          : KF_C_RUNS_CANCELLED,
                   1);
    if (status != ST_COMPLETED) {
        kf_log_kv(KF_LOG_INFO, "runs", status == ST_FAILED ? "run failed" : "run cancelled",
                  KF_LOG_STR("run_id", r->run_id), KF_LOG_STR("workflow", r->wf->workflow),
                  KF_LOG_INT("attempts", r->attempts), KF_LOG_STR("error", d->error));
    }
    kf__runs_wake(rs, ctx, r->run_id, r);
    slot_freed(rs, freed);
    kf__runs_serve_parked(rs, ctx);
    kf__runs_publish(rs);
}

void kf__run_release(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r) {
    KF_ASSERT(r->status == ST_LEASED && r->attempts > 0);
    r->attempts--; /* a release is not an attempt */
    r->detail->lease[0] = '\0';
    r->detail->lease_owner[0] = '\0';
    if (r->flags & RUN_CANCEL_REQUESTED) {
        kf__run_finish(rs, ctx, r, ST_CANCELLED, NULL, NULL);
        return;
    }
    keygrp_t *freed = leave_state(rs, r);
    to_pending(rs, ctx, r, freed);
    kf__runs_publish(rs);
}

void kf__run_attempt_failed(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, const char *error,
                            bool keep_lease) {
    KF_ASSERT(r->status == ST_LEASED);
    run_detail_t *d = r->detail;
    if (!keep_lease) {
        /* The lease ended unused: forget it, so a late completion with it
         * is refused rather than taken for a retry of one that happened. */
        d->lease[0] = '\0';
        d->lease_owner[0] = '\0';
    }
    if (r->flags & RUN_CANCEL_REQUESTED) {
        kf__run_finish(rs, ctx, r, ST_CANCELLED, NULL, error);
        return;
    }
    int64_t max = kf__runs_attempts_max(ctx, r);
    if (r->attempts >= max) {
        kf__run_finish(rs, ctx, r, ST_FAILED, NULL, error);
        return;
    }
    set_text(rs, &d->last_error, error);
    kf_counter_add(KF_C_RUN_RETRIES, 1);
    keygrp_t *freed = leave_state(rs, r);
    int64_t backoff_ms = kf_retry_backoff_ms(&d->retry, r->attempts);
    if (backoff_ms == 0) {
        to_pending(rs, ctx, r, freed);
    } else {
        to_delayed(rs, ctx, r, kf_time_add_sat(ctx->now_ms, backoff_ms), freed);
    }
    kf__runs_publish(rs);
}

void kf__run_request_cancel(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r) {
    KF_ASSERT(r->status == ST_LEASED);
    if (!(r->flags & RUN_CANCEL_REQUESTED)) {
        r->flags |= RUN_CANCEL_REQUESTED;
        r->updated_ms = ctx->now_ms;
        save(rs, ctx, r);
    }
}

void kf__run_heartbeat(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, int64_t lease_ms) {
    KF_ASSERT(r->status == ST_LEASED);
    run_detail_t *d = r->detail;
    d->lease_expires_ms = kf_time_add_sat(ctx->now_ms, lease_ms);
    r->updated_ms = ctx->now_ms;
    save(rs, ctx, r);
    set_wakeup(ctx, r, d->lease_expires_ms);
}

/* Retention's end: the run's records go (a whole record of an older build
 * has no state record; deleting the absent one costs nothing). */
void kf__run_delete_stored(kf_ctx_t *ctx, const char *run_id, const char *workflow, uint64_t seq,
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

static const char run_seq_key[] = "run_seq";

kf_status_t kf__runs_load_seq(kf_runs_t *rs, kf_ctx_t *ctx, kf_error_t *err) {
    kf_value_t v;
    bool found;
    kf_status_t st =
        kf_store_get(ctx->store, KF_CF_META, run_seq_key, sizeof run_seq_key - 1, &v, &found, err);
    if (st != KF_OK || !found) {
        return st;
    }
    if (v.len != 8) {
        st = kf_error_set(err, KF_E_CORRUPT, "meta: malformed run_seq");
    } else {
        rs->next_seq = kf_get_be64(v.data);
    }
    kf_store_value_free(&v);
    return st;
}

/* The body stays in memory until the start is durable. */
static void pin_body(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r, const kf_run_spec_t *spec) {
    run_body_t *b = kf_xcalloc(1, sizeof *b);
    b->input = kf_xstrndup(spec->input, spec->input_len);
    b->kind = spec->kind;
    b->event_count = spec->event_count;
    b->created_ms = ctx->now_ms;
    b->retry = spec->options.retry;
    KF_ASSERT(spec->event_id_count <= KF_RUN_EVENT_IDS_MAX);
    b->event_ids =
        spec->event_id_count ? kf_xcalloc(spec->event_id_count, sizeof *b->event_ids) : NULL;
    for (uint32_t i = 0; i < spec->event_id_count; i++) {
        b->event_ids[i] = kf_xstrdup(spec->event_ids[i]);
    }
    b->event_id_count = spec->event_id_count;
    b->event_ids_dropped = spec->event_ids_dropped;
    b->run = r;
    b->group = ctx->group_id;
    mem_add(rs, body_bytes(b));
    if (rs->bodies_tail) {
        rs->bodies_tail->next = b;
    } else {
        rs->bodies_head = b;
    }
    rs->bodies_tail = b;
    r->body = b;
}

uint64_t kf_runs_start(kf_runs_t *rs, kf_ctx_t *ctx, const kf_run_spec_t *spec) {
    KF_ASSERT(!kf_runs_full(rs));
    size_t key_len = strlen(spec->key);
    run_t *r = kf__run_new(rs, spec->run_id, spec->workflow, key_len, rs->next_seq++);
    KF_ASSERT(r != NULL && memcmp(r->run_id, spec->key, key_len) == 0);
    r->key_concurrency = (uint16_t)spec->options.key_concurrency;
    r->updated_ms = ctx->now_ms;
    pin_body(rs, ctx, r, spec);
    kf__detail_new(rs, r)->retry = spec->options.retry;

    uint8_t seq_be[8];
    kf_put_be64(seq_be, rs->next_seq);
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_raw(&k, run_seq_key, sizeof run_seq_key - 1);
    kf_ctx_put(ctx, KF_CF_META, &k, seq_be, sizeof seq_be);
    kf_key_run_index(&k, spec->workflow, strlen(spec->workflow), r->seq);
    kf_ctx_put(ctx, KF_CF_RUN_INDEX, &k, r->run_id, strlen(r->run_id));
    kf__run_save_body(ctx, r);
    kf_counter_add(KF_C_RUNS_CREATED, 1);
    if (spec->options.start_after_ms > 0) {
        to_delayed(rs, ctx, r, kf_time_add_sat(ctx->now_ms, spec->options.start_after_ms), NULL);
    } else {
        r->status = ST_PENDING;
        save(rs, ctx, r);
        enqueue(rs, r);
        kf__runs_serve_parked(rs, ctx);
    }
    kf__runs_publish(rs);
    return r->seq;
}

/* ---- timers ------------------------------------------------------------- */

static void lease_expired(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r) {
    run_detail_t *d = r->detail;
    int64_t max = kf__runs_attempts_max(ctx, r);
    kf_counter_add(KF_C_LEASES_EXPIRED, 1);
    const char *next = (r->flags & RUN_CANCEL_REQUESTED)                 ? "cancelled"
                       : r->attempts >= max                              ? "failed"
                       : kf_retry_backoff_ms(&d->retry, r->attempts) > 0 ? "delayed"
                                                                         : "pending";
    kf_log_kv(KF_LOG_INFO, "runs", "lease expired", KF_LOG_STR("run_id", r->run_id),
              KF_LOG_STR("workflow", r->wf->workflow), KF_LOG_STR("worker_id", d->worker_id),
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
    run_detail_t *d = KF_CONTAINER_OF(timer, run_detail_t, timer);
    run_t *r = d->run;
    switch (r->status) {
    case ST_LEASED:
        if (d->lease_expires_ms > ctx->now_ms) {
            set_wakeup(ctx, r, d->lease_expires_ms);
            return;
        }
        lease_expired(rs, ctx, r);
        return;
    case ST_DELAYED:
        if (d->due_ms > ctx->now_ms) {
            set_wakeup(ctx, r, d->due_ms);
            return;
        }
        leave_state(rs, r);
        to_pending(rs, ctx, r, NULL);
        kf__runs_publish(rs);
        return;
    case ST_COMPLETED:
    case ST_FAILED:
    case ST_CANCELLED:
        kf__run_delete_stored(ctx, r->run_id, r->wf->workflow, r->seq, d->wakeup_due_ms);
        d->wakeup_due_ms = KF_NO_WAKEUP;
        if (d->group > ctx->durable_group_id) {
            /* Its finishing write is not durable yet, so the stored record
             * is still the one from before it finished: forgetting the run
             * now would let GetRun, ListRuns and CompleteRun read that older
             * state back. It stays, answering as deleted, until the
             * deletion is durable. */
            r->flags |= RUN_DELETED;
            settle_push(rs, ctx, r);
            return;
        }
        run_forget(rs, ctx, r);
        return;
    default: KF_UNREACHABLE(); /* pending runs have no timer */
    }
}

/* ---- recovery's part --------------------------------------------------------- */

/* Recovered runs that need a timer: kf_runs_finish_recovery checks these,
 * not every run. */
static void timed_push(kf_runs_t *rs, run_t *r) {
    if (rs->timed_count == rs->timed_cap) {
        rs->timed_cap = rs->timed_cap ? rs->timed_cap * 2 : 64;
        rs->timed = kf_xrealloc(rs->timed, rs->timed_cap * sizeof *rs->timed);
    }
    rs->timed[rs->timed_count++] = r;
}

void kf__runs_adopt(kf_runs_t *rs, kf_ctx_t *ctx, run_t *r) {
    switch (r->status) {
    case ST_PENDING:
        enqueue(rs, r);
        if (r->detail != NULL) {
            settle_push(rs, ctx, r);
        }
        break;
    case ST_LEASED:
        KF_ASSERT(r->detail != NULL);
        rs->leased++;
        group_get(rs, r)->leased++;
        timed_push(rs, r);
        break;
    case ST_DELAYED:
        KF_ASSERT(r->detail != NULL);
        rs->delayed++;
        timed_push(rs, r);
        break;
    default: KF_UNREACHABLE();
    }
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
        r->detail->wakeup_due_ms != KF_NO_WAKEUP) {
        return false;
    }
    r->detail->wakeup_due_ms = due_ms;
    kf_heap_arm(&ctx->heap, &r->detail->timer, due_ms);
    return true;
}

void kf_runs_finish_recovery(kf_runs_t *rs, kf_ctx_t *ctx) {
    for (size_t i = 0; i < rs->timed_count; i++) {
        run_t *r = rs->timed[i];
        if ((r->status == ST_LEASED || r->status == ST_DELAYED) &&
            !kf_timer_armed(&r->detail->timer)) {
            kf_log(KF_LOG_WARN, "runs", "repairing the wake-up of %s", r->run_id);
            set_wakeup(ctx, r,
                       r->status == ST_LEASED ? r->detail->lease_expires_ms : r->detail->due_ms);
        }
    }
    free(rs->timed);
    rs->timed = NULL;
    rs->timed_count = rs->timed_cap = 0;
}

/* ---- lifecycle ----------------------------------------------------------- */

kf_runs_t *kf_runs_create(void) {
    kf_runs_t *rs = kf_xcalloc(1, sizeof *rs);
    kf_map_init(&rs->by_id);
    kf_map_init(&rs->queues);
    kf_map_init(&rs->groups);
    kf_map_init(&rs->waitlists);
    kf_map_init(&rs->list_hints);
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
    /* Queues and groups first: their queues hold nodes inside the runs.
     * Waiters live in their commands' arenas; only their lists are ours. */
    size_t b;
    kf_map_node_t *n = kf_map_first(&rs->queues, &b);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&rs->queues, &b, n);
        queue_free(KF_CONTAINER_OF(n, wfq_t, node));
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
        run_free(rs, KF_CONTAINER_OF(n, run_t, node)); /* its pinned body and detail too */
        n = next;
    }
    kf_map_deinit(&rs->by_id);
    kf_map_deinit(&rs->queues);
    kf_map_deinit(&rs->groups);
    kf_map_deinit(&rs->waitlists);
    kf__list_hints_clear(rs);
    kf_map_deinit(&rs->list_hints);
    free(rs->timed);
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
