/*
 * model.c - the simulation's reference model (model.h). Written from
 * DESIGN.md, docs/semantics.md and the example handlers' header comments,
 * not from the engine's code: where the two disagree the driver reports it.
 */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const m_workflow_names[M_WORKFLOWS] = {"ship", "notify"};
const char *const m_key_names[M_KEYS] = {"k1", "k2", "k10", "x"};
const char *const m_fn_ids[M_FNS] = {"running_sum", "session_counter"};
/* Different lengths, so canonical order (length first) differs from text order. */
const char *const m_fn_key_names[M_FN_KEYS] = {"ann", "bo", "b", "carol", "an"};
const char *const m_producer_names[M_PRODUCERS] = {"p1", "p2", "p3"};

struct m_undo {
    void *ptr;
    size_t len;
    size_t off; /* into undo_bytes */
};

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (p == NULL) {
        fprintf(stderr, "keyflow_sim: out of memory\n");
        abort();
    }
    return p;
}

static void copy_text(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) {
        n = cap - 1;
    }
    memmove(dst, src, n);
    dst[n] = '\0';
}

static int64_t add_sat(int64_t a, int64_t b) {
    if (b > 0 && a > INT64_MAX - b) {
        return INT64_MAX;
    }
    return a + b;
}

void model_init(model_t *m, uint32_t runs_cap, uint32_t events_cap, uint64_t out_cap,
                int64_t retention_ms, int64_t attempts_max) {
    memset(m, 0, sizeof *m);
    m->retention_ms = retention_ms;
    m->attempts_max = attempts_max;
    for (int kind = M_DEBOUNCE; kind <= M_BATCH; kind++) {
        for (int w = 0; w < M_WORKFLOWS; w++) {
            for (int k = 0; k < M_KEYS; k++) {
                m_coord_t *c = &m->coords[m_coord_index(kind, w, k)];
                c->kind = kind;
                c->workflow = w;
                c->key = k;
            }
        }
    }
    m->ids = xcalloc(M_COORDS, sizeof *m->ids);
    m->runs_cap = runs_cap;
    m->runs = xcalloc(runs_cap, sizeof *m->runs);
    m->events_cap = events_cap;
    m->events = xcalloc(events_cap, sizeof *m->events);
    m->out_cap = out_cap;
    for (int f = 0; f < M_FNS; f++) {
        m->out[f] = xcalloc(out_cap, sizeof *m->out[f]);
        for (int k = 0; k < M_FN_KEYS; k++) {
            m->fns[f].state[k] = M_ABSENT;
            m->fns[f].timer_us[k] = M_NO_TIME;
        }
    }
}

void model_deinit(model_t *m) {
    free(m->ids);
    free(m->runs);
    free(m->events);
    for (int f = 0; f < M_FNS; f++) {
        free(m->out[f]);
    }
    free(m->undo);
    free(m->undo_bytes);
    memset(m, 0, sizeof *m);
}

/* ---- undo ------------------------------------------------------------------ */

void model_save(model_t *m, void *p, size_t len) {
    if (m->nundo == m->undo_cap) {
        m->undo_cap = m->undo_cap ? m->undo_cap * 2 : 256;
        m->undo = realloc(m->undo, m->undo_cap * sizeof *m->undo);
    }
    if (m->undo_len + len > m->undo_bytes_cap) {
        while (m->undo_len + len > m->undo_bytes_cap) {
            m->undo_bytes_cap = m->undo_bytes_cap ? m->undo_bytes_cap * 2 : 65536;
        }
        m->undo_bytes = realloc(m->undo_bytes, m->undo_bytes_cap);
    }
    if (m->undo == NULL || m->undo_bytes == NULL) {
        fprintf(stderr, "keyflow_sim: out of memory\n");
        abort();
    }
    memcpy(m->undo_bytes + m->undo_len, p, len);
    m->undo[m->nundo++] = (m_undo_t){p, len, m->undo_len};
    m->undo_len += len;
}

void model_commit(model_t *m) {
    m->nundo = 0;
    m->undo_len = 0;
}

void model_revert(model_t *m) {
    while (m->nundo > 0) {
        m_undo_t *u = &m->undo[--m->nundo];
        memcpy(u->ptr, m->undo_bytes + u->off, u->len);
    }
    m->undo_len = 0;
}

/* ---- coordinators ------------------------------------------------------------- */

int m_coord_index(int kind, int workflow, int key) {
    return ((kind - 1) * M_WORKFLOWS + workflow) * M_KEYS + key;
}

m_rule_t m_rule_defaults(int kind, int edge, int64_t window_ms, int64_t max_wait_ms,
                         int64_t max_events, int64_t max_bytes, int64_t dedup_ms) {
    m_rule_t r = {.kind = kind, .edge = M_TRAILING};
    if (kind == M_DEBOUNCE) {
        r.edge = edge > 0 ? edge : M_TRAILING;
        r.window_ms = window_ms;
        r.max_wait_ms = max_wait_ms < 0 ? 0 : max_wait_ms;
    } else {
        r.max_events = max_events < 0 ? 100 : max_events;
        r.max_wait_ms = max_wait_ms < 0 ? 1000 : max_wait_ms;
        r.max_bytes = max_bytes < 0 ? 4 * 1024 * 1024 : max_bytes;
    }
    r.dedup_ms = dedup_ms < 0 ? 600000 : dedup_ms;
    return r;
}

/* DESIGN.md, "Exact window arithmetic". */
int64_t m_window_due_ms(const m_rule_t *rule, int64_t opened_ms, int64_t last_ms, int64_t count) {
    if (rule->kind == M_DEBOUNCE) {
        int64_t due = add_sat(last_ms, rule->window_ms);
        if (rule->max_wait_ms > 0) {
            int64_t bound = add_sat(opened_ms, rule->max_wait_ms);
            if (bound < due) {
                due = bound;
            }
        }
        return due;
    }
    if (count >= rule->max_events) {
        return last_ms;
    }
    return add_sat(opened_ms, rule->max_wait_ms);
}

static int64_t ids_last_expiry(const model_t *m, int c) {
    int64_t last = INT64_MIN;
    for (uint32_t i = 0; i < m->coords[c].nids; i++) {
        if (m->ids[c][i].expires_ms > last) {
            last = m->ids[c][i].expires_ms;
        }
    }
    return last;
}

bool m_coord_exists(const model_t *m, int c, int64_t now_ms) {
    return m->coords[c].open || ids_last_expiry(m, c) > now_ms;
}

const m_id_t *m_id_find(const model_t *m, int c, const char *id, int64_t now_ms) {
    for (uint32_t i = 0; i < m->coords[c].nids; i++) {
        const m_id_t *r = &m->ids[c][i];
        if (r->expires_ms > now_ms && strcmp(r->id, id) == 0) {
            return r;
        }
    }
    return NULL;
}

size_t m_event_text(int32_t n, char *out, size_t cap) {
    return (size_t)snprintf(out, cap, "{\"n\":%d}", (int)n);
}

void m_window_input(const model_t *m, int c, char *out, size_t cap) {
    const m_coord_t *co = &m->coords[c];
    if (co->run_started) {
        out[0] = '\0'; /* a leading edge's run took the input: nothing is kept */
        return;
    }
    if (co->kind == M_DEBOUNCE) {
        m_event_text(co->events[0], out, cap);
        return;
    }
    size_t len = 0;
    out[len++] = '[';
    for (int64_t i = 0; i < co->event_count; i++) {
        char one[32];
        m_event_text(co->events[i], one, sizeof one);
        len += (size_t)snprintf(out + len, cap - len, "%s%s", i ? "," : "", one);
    }
    snprintf(out + len, cap - len, "]");
}

/* A deleted coordinator starts again from nothing. */
static void coord_reset(model_t *m, int c) {
    m_coord_t *co = &m->coords[c];
    M_SAVE(m, *co);
    int kind = co->kind, workflow = co->workflow, key = co->key;
    memset(co, 0, sizeof *co);
    co->kind = kind;
    co->workflow = workflow;
    co->key = key;
}

static void journal_add(model_t *m, int c, int64_t entries) {
    m_coord_t *co = &m->coords[c];
    M_SAVE(m, co->journal_seq);
    M_SAVE(m, co->journal_len);
    co->journal_seq += entries;
    co->journal_len += entries;
}

/* After a change: delete an idle coordinator, else compact a long journal. */
static void coord_settle(model_t *m, int c, int64_t now_ms) {
    m_coord_t *co = &m->coords[c];
    if (!co->open && ids_last_expiry(m, c) <= now_ms) {
        coord_reset(m, c);
        return;
    }
    if (co->journal_len >= M_JOURNAL_MAX) {
        M_SAVE(m, co->journal_len);
        M_SAVE(m, co->compactions);
        co->journal_len = 0;
        co->compactions++;
    }
}

/* The window's run starts with its input: the window closes, or (leading)
 * stays open, absorbing, until its due time. */
static void start_run(model_t *m, int c, int64_t now_ms, bool leading) {
    m_coord_t *co = &m->coords[c];
    if (m->nruns == m->runs_cap) {
        fprintf(stderr, "keyflow_sim: model run capacity %u exceeded\n", m->runs_cap);
        abort();
    }
    m_run_t *r = &m->runs[m->nruns];
    M_SAVE(m, m->nruns);
    M_SAVE(m, *r);
    memset(r, 0, sizeof *r);
    copy_text(r->run_id, sizeof r->run_id, co->run_id);
    r->coord = c;
    m_window_input(m, c, r->input, sizeof r->input);
    r->event_count = co->event_count;
    r->status = M_PENDING;
    r->created_ms = r->updated_ms = now_ms;
    m->nruns++;
    M_SAVE(m, *co);
    if (leading) {
        co->run_started = true;
    } else {
        co->open = false;
    }
    co->runs_started++;
    if (co->nrecent == M_RECENT_MAX) {
        memmove(co->recent[0], co->recent[1], (M_RECENT_MAX - 1) * sizeof co->recent[0]);
        co->nrecent--;
    }
    copy_text(co->recent[co->nrecent++], sizeof co->recent[0], co->run_id);
    journal_add(m, c, 1);
}

/* Closes the open window: its run starts, or, when it already started at
 * the leading edge, the window just ends. */
static void end_window(model_t *m, int c, int64_t now_ms) {
    m_coord_t *co = &m->coords[c];
    if (!co->run_started) {
        start_run(m, c, now_ms, false);
        return;
    }
    M_SAVE(m, *co);
    co->open = false;
    co->run_started = false;
    journal_add(m, c, 1);
}

static bool same_payload(const m_payload_t *a, const m_payload_t *b) {
    const m_rule_t *x = &a->rule, *y = &b->rule;
    return x->kind == y->kind && x->edge == y->edge && x->window_ms == y->window_ms &&
           x->max_wait_ms == y->max_wait_ms && x->max_events == y->max_events &&
           x->max_bytes == y->max_bytes && x->dedup_ms == y->dedup_ms && a->flush == b->flush &&
           a->input == b->input;
}

typedef enum { JOIN_OPEN, JOIN_RUN, JOIN_ABSORB, JOIN_NEXT_RUN } join_t;

/* How an accepted event meets the coordinator's window (after a window
 * full by bytes was closed). */
static join_t join_of(const m_coord_t *co, const m_rule_t *rule) {
    if (!co->open) {
        return JOIN_OPEN;
    }
    if (!co->run_started) {
        return JOIN_RUN;
    }
    return rule->edge == M_LEADING ? JOIN_ABSORB : JOIN_NEXT_RUN;
}

/* The batch window's array with one more input of `len` bytes. */
static int64_t batch_bytes_with(const model_t *m, int c, size_t len) {
    char text[M_INPUT_BYTES];
    m_window_input(m, c, text, sizeof text);
    return m->coords[c].event_count == 0 ? 2 + (int64_t)len
                                         : (int64_t)strlen(text) + 1 + (int64_t)len;
}

static bool closes_by_size(const model_t *m, int c, const m_payload_t *p) {
    char text[32];
    size_t len = m_event_text(p->input, text, sizeof text);
    const m_coord_t *co = &m->coords[c];
    return co->open && p->rule.kind == M_BATCH && batch_bytes_with(m, c, len) > p->rule.max_bytes;
}

/* A window is over at its due time, whether or not its timer fired: a
 * request that meets it overdue closes it first (as within one SendEvents
 * call, where events after a due time meet their window in one request). */
static void close_if_overdue(model_t *m, int c, int64_t now_ms) {
    m_coord_t *co = &m->coords[c];
    if (co->open && co->due_ms <= now_ms) {
        end_window(m, c, now_ms);
        coord_settle(m, c, now_ms);
    }
}

bool m_send_new_run(const model_t *m, int c, const char *id, const m_payload_t *payload,
                    int64_t now_ms) {
    if (id[0] != '\0' && m_id_find(m, c, id, now_ms) != NULL) {
        return false;
    }
    if (m->coords[c].open && m->coords[c].due_ms <= now_ms) {
        return true; /* the overdue window closes: the event opens the next */
    }
    if (closes_by_size(m, c, payload)) {
        return true; /* the event opens the next window */
    }
    join_t j = join_of(&m->coords[c], &payload->rule);
    return j == JOIN_OPEN || j == JOIN_NEXT_RUN;
}

void m_send_event(model_t *m, int c, const char *id, const m_payload_t *payload,
                  const char *new_run_id, int64_t now_ms, int64_t commit_seq,
                  m_send_result_t *out) {
    memset(out, 0, sizeof *out);
    m_coord_t *co = &m->coords[c];
    const m_rule_t *rule = &payload->rule;
    char text[32];
    size_t len = m_event_text(payload->input, text, sizeof text);
    if (rule->kind == M_BATCH && 2 + (int64_t)len > rule->max_bytes) {
        out->status = 3; /* INVALID_ARGUMENT: it fits no window */
        return;
    }
    close_if_overdue(m, c, now_ms);
    if (id[0] != '\0') {
        const m_id_t *r = m_id_find(m, c, id, now_ms);
        if (r != NULL) {
            if (!same_payload(&r->payload, payload)) {
                out->status = 6; /* ALREADY_EXISTS: the ID was used with another payload */
                return;
            }
            out->disposition = M_DUPLICATE;
            copy_text(out->run_id, sizeof out->run_id, r->run_id);
            out->due_ms = r->due_ms;
            out->commit_seq = r->commit_seq;
            return;
        }
    }
    if (closes_by_size(m, c, payload)) {
        start_run(m, c, now_ms, false); /* the window is full by bytes */
    }
    join_t join = join_of(co, rule);
    M_SAVE(m, *co);
    int64_t count = co->event_count + 1;
    switch (join) {
    case JOIN_OPEN:
        co->open = true;
        co->opened_ms = now_ms;
        co->events_absorbed = 0;
        __attribute__((fallthrough)); /* a new run */
    case JOIN_NEXT_RUN:
        copy_text(co->run_id, sizeof co->run_id, new_run_id);
        co->run_started = false;
        co->event_count = 0;
        count = 1;
        out->new_run = true;
        break;
    case JOIN_RUN: break;
    case JOIN_ABSORB:
        co->events_absorbed++;
        count = co->event_count;
        break;
    }
    if (join != JOIN_ABSORB) {
        if (rule->kind == M_DEBOUNCE) {
            co->events[0] = payload->input;
        } else {
            if (co->event_count >= M_BATCH_EVENTS_MAX) {
                fprintf(stderr, "keyflow_sim: a batch window outgrew the model\n");
                abort();
            }
            co->events[co->event_count] = payload->input;
        }
        co->event_count++;
    }
    co->last_ms = now_ms;
    co->rule = *rule;
    co->due_ms = payload->flush ? now_ms : m_window_due_ms(rule, co->opened_ms, now_ms, count);
    journal_add(m, c, 1);
    /* Remembered IDs: expired ones are pruned at each accepted event; at
     * most M_IDS_MAX, the oldest forgotten first. */
    m_id_t *ids = m->ids[c];
    model_save(m, ids, co->nids * sizeof *ids);
    uint32_t kept = 0;
    for (uint32_t i = 0; i < co->nids; i++) {
        if (ids[i].expires_ms > now_ms) {
            ids[kept++] = ids[i];
        }
    }
    co->nids = kept;
    if (id[0] != '\0') {
        if (co->nids == M_IDS_MAX) {
            memmove(&ids[0], &ids[1], (M_IDS_MAX - 1) * sizeof *ids);
            co->nids--;
        }
        m_id_t *r = &ids[co->nids];
        M_SAVE(m, *r);
        copy_text(r->id, sizeof r->id, id);
        copy_text(r->run_id, sizeof r->run_id, co->run_id);
        r->due_ms = co->due_ms;
        r->expires_ms = add_sat(now_ms, rule->dedup_ms);
        r->commit_seq = commit_seq;
        r->payload = *payload;
        co->nids++;
    }
    int32_t n = payload->input;
    if ((uint32_t)n >= m->events_cap) {
        fprintf(stderr, "keyflow_sim: model event capacity exceeded\n");
        abort();
    }
    M_SAVE(m, m->events[n]);
    m->events[n] = (m_event_t){.coord = c, .accepted = true};
    copy_text(m->events[n].run_id, sizeof m->events[n].run_id, co->run_id);
    copy_text(out->run_id, sizeof out->run_id, co->run_id);
    out->due_ms = co->due_ms;
    out->commit_seq = commit_seq;
    bool closed = false;
    if (join == JOIN_OPEN && (rule->edge == M_LEADING || rule->edge == M_BOTH)) {
        start_run(m, c, now_ms, true);
        closed = true;
    }
    if (rule->kind == M_BATCH && co->event_count >= rule->max_events) {
        start_run(m, c, now_ms, false);
        closed = true;
    }
    if (payload->flush && co->open) {
        end_window(m, c, now_ms);
        closed = true;
    }
    out->disposition = closed                                       ? M_CLOSED
                       : join == JOIN_OPEN || join == JOIN_NEXT_RUN ? M_OPENED
                                                                    : M_JOINED;
    coord_settle(m, c, now_ms);
}

int m_flush(model_t *m, int c, int64_t now_ms, char *run_id) {
    close_if_overdue(m, c, now_ms);
    m_coord_t *co = &m->coords[c];
    if (!co->open) {
        return M_NO_WINDOW;
    }
    copy_text(run_id, M_RUN_ID_BYTES, co->run_id);
    end_window(m, c, now_ms);
    coord_settle(m, c, now_ms);
    return M_CLOSED;
}

int m_cancel(model_t *m, int c, int64_t now_ms, char *run_id, int64_t *dropped) {
    close_if_overdue(m, c, now_ms);
    m_coord_t *co = &m->coords[c];
    if (!co->open) {
        return M_NO_WINDOW;
    }
    if (co->run_started) {
        /* The run started at the leading edge: nothing to drop. */
        run_id[0] = '\0';
        *dropped = 0;
        end_window(m, c, now_ms);
    } else {
        copy_text(run_id, M_RUN_ID_BYTES, co->run_id);
        *dropped = co->event_count;
        M_SAVE(m, co->open);
        co->open = false;
        journal_add(m, c, 1);
    }
    coord_settle(m, c, now_ms);
    return M_CANCELLED;
}

/* ---- runs ---------------------------------------------------------------------- */

int m_run_find(const model_t *m, const char *run_id) {
    for (uint32_t i = 0; i < m->nruns; i++) {
        if (strcmp(m->runs[i].run_id, run_id) == 0) {
            return (int)i;
        }
    }
    return -1;
}

int m_run_kept(const model_t *m, int r, int64_t now_ms) {
    const m_run_t *run = &m->runs[r];
    if (run->status != M_COMPLETED && run->status != M_FAILED) {
        return 1;
    }
    int64_t gone = add_sat(run->finished_ms, m->retention_ms);
    if (now_ms < gone) {
        return 1;
    }
    return now_ms < add_sat(gone, M_SWEEP_SLACK_MS) ? -1 : 0;
}

bool m_run_matches(const model_t *m, int r, const int *workflows, int nworkflows) {
    if (nworkflows == 0) {
        return true;
    }
    int w = m->coords[m->runs[r].coord].workflow;
    for (int i = 0; i < nworkflows; i++) {
        if (workflows[i] == w) {
            return true;
        }
    }
    return false;
}

void m_run_lease(model_t *m, int r, const char *lease, const char *worker, int64_t lease_ms,
                 int64_t now_ms) {
    m_run_t *run = &m->runs[r];
    M_SAVE(m, *run);
    run->status = M_LEASED;
    run->attempts++;
    copy_text(run->lease, sizeof run->lease, lease);
    copy_text(run->worker, sizeof run->worker, worker);
    run->lease_ms = lease_ms;
    run->lease_expires_ms = add_sat(now_ms, lease_ms);
    run->updated_ms = now_ms;
}

void m_run_heartbeat(model_t *m, int r, int64_t lease_ms, int64_t now_ms) {
    m_run_t *run = &m->runs[r];
    M_SAVE(m, *run);
    run->lease_expires_ms = add_sat(now_ms, lease_ms ? lease_ms : run->lease_ms);
    run->updated_ms = now_ms;
}

void m_run_finish(model_t *m, int r, bool success, const char *text, int64_t now_ms) {
    m_run_t *run = &m->runs[r];
    M_SAVE(m, *run);
    run->status = success ? M_COMPLETED : M_FAILED;
    run->finished_ms = run->updated_ms = now_ms;
    if (success) {
        copy_text(run->result, sizeof run->result, text);
    } else {
        copy_text(run->error, sizeof run->error, text);
    }
}

/* ---- time ------------------------------------------------------------------------ */

void m_tick(model_t *m, int64_t now_ms) {
    for (int c = 0; c < M_COORDS; c++) {
        m_coord_t *co = &m->coords[c];
        if (co->open && co->due_ms <= now_ms) {
            end_window(m, c, now_ms);
            coord_settle(m, c, now_ms);
        } else if (!co->open && co->nids > 0 && ids_last_expiry(m, c) <= now_ms) {
            coord_settle(m, c, now_ms);
        }
    }
    for (uint32_t r = 0; r < m->nruns; r++) {
        m_run_t *run = &m->runs[r];
        if (run->status != M_LEASED || run->lease_expires_ms > now_ms) {
            continue;
        }
        M_SAVE(m, *run);
        if (run->attempts >= m->attempts_max) {
            run->status = M_FAILED;
            run->lease[0] = '\0';
            snprintf(run->error, sizeof run->error, "lease expired on attempt %lld of %lld",
                     (long long)run->attempts, (long long)m->attempts_max);
            run->finished_ms = run->updated_ms = now_ms;
        } else {
            run->status = M_PENDING;
            run->lease[0] = '\0';
            run->lease_expires_ms = 0;
            run->updated_ms = now_ms;
        }
    }
}

int64_t m_next_due_ms(const model_t *m, int64_t now_ms) {
    int64_t next = INT64_MAX;
#define CONSIDER(t)                                                                                \
    do {                                                                                           \
        int64_t t_ = (t);                                                                          \
        if (t_ > now_ms && t_ < next) {                                                            \
            next = t_;                                                                             \
        }                                                                                          \
    } while (0)
    for (int c = 0; c < M_COORDS; c++) {
        const m_coord_t *co = &m->coords[c];
        if (co->open) {
            CONSIDER(co->due_ms);
        } else if (co->nids > 0) {
            CONSIDER(ids_last_expiry(m, c));
        }
    }
    for (uint32_t r = 0; r < m->nruns; r++) {
        const m_run_t *run = &m->runs[r];
        if (run->status == M_LEASED) {
            CONSIDER(run->lease_expires_ms);
        }
    }
#undef CONSIDER
    return next;
}

/* ---- process functions ----------------------------------------------------------------- */

int m_fn_key_cmp(int a, int b) {
    size_t la = strlen(m_fn_key_names[a]), lb = strlen(m_fn_key_names[b]);
    if (la != lb) {
        return la < lb ? -1 : 1;
    }
    return strcmp(m_fn_key_names[a], m_fn_key_names[b]);
}

static void emit(model_t *m, int f, int key, int64_t ts_us, bool null, int64_t value,
                 int previous) {
    m_fn_t *fn = &m->fns[f];
    if (fn->nout == m->out_cap) {
        fprintf(stderr, "keyflow_sim: model output capacity exceeded\n");
        abort();
    }
    m_out_row_t *row = &m->out[f][fn->nout];
    M_SAVE(m, *row);
    *row = (m_out_row_t){key, ts_us, null, value, previous};
    fn->nout++;
}

static bool add_overflows(int64_t a, int64_t b) {
    return (b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b);
}

/* The engine's handler calls: a row call ends at max_batch_rows (256,
 * never reached here) or when a key repeats. */
static int64_t row_calls(const m_row_t *rows, int nrows) {
    int64_t calls = 0;
    bool in_call[M_FN_KEYS] = {0};
    for (int i = 0; i < nrows; i++) {
        if (i == 0 || in_call[rows[i].key]) {
            calls++;
            memset(in_call, 0, sizeof in_call);
        }
        in_call[rows[i].key] = true;
    }
    return calls;
}

void m_push(model_t *m, int f, int p, int64_t sequence, const m_row_t *rows, int nrows,
            bool has_watermark, int64_t watermark_us, m_push_result_t *out) {
    memset(out, 0, sizeof *out);
    m_fn_t *fn = &m->fns[f];
    m_producer_t *prod = &fn->producers[p];
    if (sequence <= prod->last_sequence) {
        for (uint32_t i = 0; i < prod->nacks; i++) {
            if (prod->acks[i].sequence == sequence) {
                out->duplicate = true;
                out->ack = prod->acks[i];
                return;
            }
        }
        out->status = 9; /* KF_E_PRECONDITION's gRPC code; the driver maps it */
        return;
    }
    /* Compute the step on a copy; apply only if every call succeeds. */
    m_fn_t next = *fn;
    m_out_row_t produced[64 + M_FN_KEYS];
    int nproduced = 0;
    int64_t wm_before = fn->has_watermark ? fn->watermark_us : INT64_MIN;
    for (int i = 0; i < nrows; i++) {
        const m_row_t *row = &rows[i];
        int k = row->key;
        int seen = next.state[k];
        if (f == M_FN_RUNNING_SUM) {
            if (row->arg_null) {
                next.state[k] = M_NULL;
                next.value[k] = 0;
                produced[nproduced++] = (m_out_row_t){k, row->ts_us, true, 0, seen};
            } else {
                int64_t base = seen == M_VALUE ? next.value[k] : 0;
                if (add_overflows(base, row->arg)) {
                    out->status = 9; /* the handler refuses; nothing applied */
                    return;
                }
                next.state[k] = M_VALUE;
                next.value[k] = base + row->arg;
                produced[nproduced++] = (m_out_row_t){k, row->ts_us, false, next.value[k], seen};
            }
        } else {
            int64_t idle = row->arg_null ? INT64_C(60000000) : row->arg;
            if (idle < 0) {
                out->status = 9;
                return;
            }
            next.value[k] = (seen == M_VALUE ? next.value[k] : 0) + 1;
            next.state[k] = M_VALUE;
            int64_t at = row->ts_us > INT64_MAX - idle ? INT64_MAX : row->ts_us + idle;
            if (at <= wm_before) {
                at = wm_before + 1;
            }
            next.timer_us[k] = at;
        }
    }
    if (has_watermark && (!next.has_watermark || watermark_us > next.watermark_us)) {
        next.has_watermark = true;
        next.watermark_us = watermark_us;
    }
    /* Due timers in (at_us, canonical key) order. */
    int64_t timers = 0;
    for (;;) {
        int best = -1;
        for (int k = 0; k < M_FN_KEYS; k++) {
            int64_t at = next.timer_us[k];
            if (at == M_NO_TIME || !next.has_watermark || at > next.watermark_us) {
                continue;
            }
            if (best < 0 || at < next.timer_us[best] ||
                (at == next.timer_us[best] && m_fn_key_cmp(k, best) < 0)) {
                best = k;
            }
        }
        if (best < 0) {
            break;
        }
        int64_t at = next.timer_us[best];
        produced[nproduced++] =
            (m_out_row_t){best, at, false, next.state[best] == M_VALUE ? next.value[best] : 0, 0};
        next.state[best] = M_ABSENT;
        next.value[best] = 0;
        next.timer_us[best] = M_NO_TIME;
        timers++;
    }
    m_ack_t ack = {
        .sequence = sequence,
        .rows_accepted = nrows,
        .activations = nrows + timers,
        .timer_callbacks = timers,
        /* Timer calls hold distinct keys, at most 256 each: one call here. */
        .handler_calls = row_calls(rows, nrows) + (timers > 0 ? 1 : 0),
        .watermark_us = next.has_watermark ? next.watermark_us : 0,
    };
    if (nproduced > 0) {
        ack.first_output_seq = (int64_t)fn->nout + 1;
        ack.last_output_seq = (int64_t)fn->nout + nproduced;
    }
    next.nout = fn->nout;
    m_producer_t *np = &next.producers[p];
    if (np->nacks == M_ACKS_KEPT) {
        memmove(&np->acks[0], &np->acks[1], (M_ACKS_KEPT - 1) * sizeof np->acks[0]);
        np->nacks--;
    }
    np->acks[np->nacks++] = ack;
    np->last_sequence = sequence;
    M_SAVE(m, *fn);
    *fn = next;
    for (int i = 0; i < nproduced; i++) {
        emit(m, f, produced[i].key, produced[i].ts_us, produced[i].value_null, produced[i].value,
             produced[i].previous);
    }
    out->ack = ack;
}
