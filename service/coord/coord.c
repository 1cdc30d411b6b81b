/*
 * coord.c - the coordinator table: update-with-start, windows, dedup,
 * journal and recovery, with each coordinator's state on disk and only a
 * small entry per coordinator in memory. See coord.h for the state machine.
 *
 * Layout (store format 2; storage/keys.h has the key bytes)
 *   1. Identity: a coordinator's id is two SipHash-2-4 values of its
 *      identity bytes (kind, workflow, key) under the store's secret key
 *      (meta "coord_id_key", 32 random bytes made at the first start): 16
 *      fixed bytes, and no client can make two identities share one without
 *      the key. Each state record carries its identity, checked against the
 *      request at every load.
 *   2. Memory: one coord_t per coordinator (its id, its wake-up timer in the
 *      heap, the stored wake-up time and an open flag, about 100 bytes) in
 *      a map by id. Nothing in it grows with a client's payload.
 *   3. coord_state[id]: the coordinator as one CoordStateRec (identity,
 *      journal counters, the open window's rule, times, run uuid, event count
 *      and debounce's latest input, and the bookkeeping of its items),
 *      rewritten by every change (state_save, once per command).
 *   4. coord_items[id | kind | ...]: what grows with events, read only when
 *      touched: remembered IDs by arrival seq and by ID (a point read per
 *      event with an ID), the open window's events (a batch's inputs and
 *      the event IDs its run records; read when the window closes) and the
 *      recent runs (DescribeCoordinator).
 *   5. coord_index[id]: the stored wake-up and the open flag, exactly one
 *      record per coordinator, written with its state whenever either
 *      changes: recovery rebuilds memory and the heap from this family
 *      alone (8 + 1 bytes a record), decoding no state.
 *   6. coord_history[id | seq]: the journal, append-only (a vector memtable:
 *      the committer appends), read only by DescribeCoordinator. The state
 *      record is always current, so continue-as-new just deletes the
 *      history up to the current seq.
 *   7. coord_windows[run_id]: the id, while the window of run_id is open and
 *      its run has not started (GetRun of a receipt's run).
 *   8. Reads go through the engine's overlay (ctx.h), which stages the
 *      state, items and windows records of groups that are not durable yet:
 *      a command sees what the commands before it wrote, written or not.
 *
 * Invariants
 *   9. A coordinator exists iff its memory entry, its state and its index
 *      record do; all three appear and go in the same group.
 *  10. A window's run is created in the write that closes it (runs.h, 1),
 *      with the input and event IDs read from its event records, which the
 *      same write deletes.
 *  11. The in-memory timer is at or before the coordinator's due time (the
 *      open window's, else the expiry of its last remembered ID); the stored
 *      wake-up is at or before it too (a due time that only moves later
 *      writes nothing while the stored one is still ahead: it fires early,
 *      kf_coords_fire finds nothing due and re-arms), so no window is ever
 *      closed late, crash or not.
 *  12. Remembered IDs: records [ids_first, ids_next) by seq, each with its
 *      ID record, ids_count of them. Expired ones stay until the cap needs
 *      room or a sweep is due (every KF_REMEMBERED_IDS_SWEEP_EVERY-th ID;
 *      they answer nothing meanwhile), so "at most 1024, the oldest
 *      forgotten first" counts live ones, as if every event pruned the
 *      expired.
 *  13. A command reads everything it needs before it changes anything
 *      (state, remembered ID, room for one more ID, the events of a window
 *      it may close), so a read error changes nothing; only an overdue
 *      window closes first, as its timer would have.
 *
 * Engine-thread only.
 */
#include "coord/coord.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/bytes.h"
#include "base/json.h"
#include "base/log.h"
#include "base/map.h"
#include "base/metrics.h"
#include "base/partition.h"
#include "base/text.h"
#include "coord/coord_int.h"
#include "coord/window.h"
#include "records/records.pb-c.h"

typedef struct coord {
    kf_map_node_t node; /* keyed by id */
    kf_timer_t timer;
    int64_t wakeup_ms; /* the stored wake-up (coord_index), or KF_NO_WAKEUP */
    uint8_t id[KF_COORD_ID_BYTES];
    bool open; /* as coord_index says */
} coord_t;

struct kf_coords {
    kf_map_t map;
    kf_runs_t *runs;
    kf_ctx_t *ctx; /* the engine's, from kf_coords_recover on (window lookups) */
    uint64_t open_windows;
    kf_coord_id_key_t id_key;
    kf_arena_t scratch; /* the state a command works on; reset per coordinator */
    kf_arena_t lookup;  /* window_lookup's answer, valid until the next */
    /* Recovery allocates every coordinator it finds in this one array
     * rather than one malloc each; a deleted one goes on the free list
     * (linked through node.next) and is reused by the next coord_add. */
    coord_t *slab;
    size_t slab_count;
    coord_t *slab_free;
    size_t slab_free_count;
};

/* The open window, as loaded from and saved to its state record. */
typedef struct window {
    char run_uuid[KF_UUID_TEXT_BYTES + 1];
    int64_t opened_ms;
    int64_t last_ms;
    int64_t due_ms;
    kf_rule_t rule;    /* the latest event's */
    const char *input; /* debounce: the latest input (not NUL-terminated; borrowed) */
    size_t input_len;  /* debounce: its length; batch: bytes of "[" and inputs joined by "," */
    int64_t event_count;
    bool run_started;
    int64_t events_absorbed;
    uint64_t events_first; /* event records [events_first, events_next) */
    uint64_t events_next;
    int64_t event_ids_dropped;
} window_t;

/* The open window's events as its run will take them: read before a
 * command that may close the window changes anything, then kept up to date
 * by the events the command adds. */
typedef struct events {
    bool loaded;
    kf_event_ids_t ids; /* the latest KF_RUN_EVENT_IDS_MAX, and how many were dropped */
    char *input;        /* batch: "[" and the inputs joined by "," (owned) */
    size_t input_len;
    size_t input_cap;
} events_t;

/* One coordinator while a command works on it. Strings are borrowed from
 * the arena it was loaded into or from the request. */
typedef struct state {
    coord_t *c;
    kf_rule_kind_t kind;
    const char *workflow;
    const char *key;
    uint64_t journal_seq; /* seq of the next history entry */
    uint32_t journal_len; /* entries since the last compaction */
    int64_t runs_started;
    int64_t compactions;
    bool open;
    window_t w;
    uint64_t ids_first;
    uint64_t ids_next;
    uint32_t ids_count;
    int64_t ids_last_expiry_ms;
    bool ids_unsorted;
    events_t ev;
} state_t;

/* A remembered ID as stored. */
typedef struct remembered {
    uint64_t seq;
    const char *id;
    const char *run_uuid;
    const uint8_t *digest; /* KF_EVENT_DIGEST_BYTES, or NULL: unknown (older build) */
    int64_t due_ms;
    int64_t expires_ms;
    int64_t commit_seq; /* 0: unknown (older build) */
} remembered_t;

/* What making room for one more remembered ID deletes (invariant 12). */
typedef struct id_room {
    uint32_t drops;
    uint64_t *drop_seq; /* in the scratch arena */
    const char **drop_id;
    uint64_t first;         /* ids_first afterwards */
    int64_t last_expiry_ms; /* ids_last_expiry_ms afterwards */
    bool unsorted;          /* ids_unsorted afterwards */
} id_room_t;

/* Estimated bytes (step/ctx.h, kf_memory_t; docs/semantics.md, "Memory
 * budget"): a coordinator is its entry with malloc's 16-byte header, its
 * map slot (at most two bucket pointers, the table doubling at load 1) and
 * its heap slot (up to two pointers likewise). Windows, inputs and
 * remembered IDs are on disk and count nothing here. */
#define COORD_BYTES (sizeof(coord_t) + 16 + 4 * sizeof(void *))

uint64_t kf_coords_memory_bytes(const kf_coords_t *cs) {
    return cs->map.count * COORD_BYTES + cs->slab_free_count * sizeof(coord_t);
}

static void publish_gauges(const kf_coords_t *cs) {
    kf_gauge_set(KF_G_COORDINATORS, (int64_t)cs->map.count);
    kf_gauge_set(KF_G_OPEN_WINDOWS, (int64_t)cs->open_windows);
}

/* ---- identity and memory -------------------------------------------------- */

void kf__coord_id(const kf_coord_id_key_t *key, const void *ident, size_t ident_len,
                  uint8_t id[KF_COORD_ID_BYTES]) {
    kf_put_be64(id, kf_siphash(key->k[0], ident, ident_len));
    kf_put_be64(id + 8, kf_siphash(key->k[1], ident, ident_len));
}

static coord_t *coord_find(const kf_coords_t *cs, const uint8_t id[KF_COORD_ID_BYTES]) {
    kf_map_node_t *n = kf_map_get(&cs->map, id, KF_COORD_ID_BYTES);
    return n ? KF_CONTAINER_OF(n, coord_t, node) : NULL;
}

static bool in_slab(const kf_coords_t *cs, const coord_t *c) {
    return cs->slab_count > 0 && c >= cs->slab && c < cs->slab + cs->slab_count;
}

static coord_t *coord_add(kf_coords_t *cs, const uint8_t id[KF_COORD_ID_BYTES]) {
    coord_t *c = cs->slab_free;
    if (c != NULL) {
        cs->slab_free = c->node.next ? KF_CONTAINER_OF(c->node.next, coord_t, node) : NULL;
        cs->slab_free_count--;
        memset(c, 0, sizeof *c);
    } else {
        c = kf_xcalloc(1, sizeof *c);
    }
    memcpy(c->id, id, KF_COORD_ID_BYTES);
    kf_timer_init(&c->timer, KF_TIMER_COORDINATOR);
    c->wakeup_ms = KF_NO_WAKEUP;
    kf_map_insert(&cs->map, &c->node, c->id, KF_COORD_ID_BYTES);
    return c;
}

/* Once out of the map and the heap. */
static void coord_free(kf_coords_t *cs, coord_t *c) {
    if (in_slab(cs, c)) {
        c->node.next = cs->slab_free ? &cs->slab_free->node : NULL;
        cs->slab_free = c;
        cs->slab_free_count++;
    } else {
        free(c);
    }
}

static void coord_set_open(kf_coords_t *cs, coord_t *c, bool open) {
    if (c->open != open) {
        cs->open_windows += open ? 1 : (uint64_t)-1;
        c->open = open;
    }
}

/* ---- rules <-> records ------------------------------------------------------ */

void kf__rule_to_rec(const kf_rule_t *rule, Keyflow__Records__RuleRec *rec,
                     Keyflow__Records__RetryRec *retry) {
    keyflow__records__rule_rec__init(rec);
    rec->kind = (int32_t)rule->kind;
    rec->window_ms = rule->window_ms;
    rec->max_wait_ms = rule->max_wait_ms;
    rec->max_events = rule->max_events;
    rec->dedup_ms = rule->dedup_ms;
    rec->edge = (int32_t)rule->edge;
    rec->max_bytes = rule->max_bytes;
    kf_run_options_to_rule_rec(&rule->run, rec, retry);
}

static bool in_range(int64_t v, int64_t lo, int64_t hi) {
    return v >= lo && v <= hi;
}

bool kf__rule_from_rec(const Keyflow__Records__RuleRec *rec, kf_rule_t *rule) {
    if (rec == NULL || !in_range(rec->dedup_ms, 0, KF_DEDUP_MS_MAX)) {
        return false;
    }
    if (rec->kind == KF_RULE_DEBOUNCE) {
        if (!in_range(rec->window_ms, 1, KF_WINDOW_MS_MAX) ||
            !in_range(rec->max_wait_ms, 0, KF_WINDOW_MS_MAX)) {
            return false;
        }
    } else if (rec->kind == KF_RULE_BATCH) {
        if (!in_range(rec->max_events, 1, KF_BATCH_EVENTS_MAX) ||
            !in_range(rec->max_wait_ms, 1, KF_WINDOW_MS_MAX)) {
            return false;
        }
    } else {
        return false;
    }
    if (!kf_run_options_from_rule_rec(rec, &rule->run)) {
        return false;
    }
    rule->kind = (kf_rule_kind_t)rec->kind;
    rule->window_ms = rec->window_ms;
    rule->max_wait_ms = rec->max_wait_ms;
    rule->max_events = rec->max_events;
    rule->dedup_ms = rec->dedup_ms;
    /* Records of older builds carry neither field: TRAILING, 4 MiB. */
    switch (rec->edge) {
    case 0:
    case KF_EDGE_TRAILING: rule->edge = KF_EDGE_TRAILING; break;
    case KF_EDGE_LEADING: rule->edge = KF_EDGE_LEADING; break;
    case KF_EDGE_BOTH: rule->edge = KF_EDGE_BOTH; break;
    default: return false;
    }
    rule->max_bytes = 0;
    if (rule->kind == KF_RULE_BATCH) {
        rule->max_bytes = rec->max_bytes == 0 ? KF_WINDOW_INPUT_BYTES_MAX : rec->max_bytes;
        if (!in_range(rule->max_bytes, 1, KF_WINDOW_INPUT_BYTES_MAX) ||
            rule->edge != KF_EDGE_TRAILING) {
            return false;
        }
    }
    return true;
}

static bool uuid_ok(const char *s) {
    return s != NULL && strlen(s) == KF_UUID_TEXT_BYTES;
}

/* ---- state records ---------------------------------------------------------- */

static void state_new(state_t *s, coord_t *c, kf_rule_kind_t kind, const char *workflow,
                      const char *key) {
    memset(s, 0, sizeof *s);
    s->c = c;
    s->kind = kind;
    s->workflow = workflow;
    s->key = key;
}

/* Frees what the state owns (its events); call once per load or new. */
static void state_done(state_t *s) {
    kf_event_ids_clear(&s->ev.ids);
    free(s->ev.input);
    memset(&s->ev, 0, sizeof s->ev);
}

static kf_status_t corrupt_state(const coord_t *c, const char *what, kf_error_t *err) {
    char hex[2 * KF_COORD_ID_BYTES + 1];
    kf_hex_encode(c->id, KF_COORD_ID_BYTES, hex);
    return kf_error_set(err, KF_E_CORRUPT, "coord_state %s: %s", hex, what);
}

static kf_status_t window_from_rec(const Keyflow__Records__WindowStateRec *r, kf_rule_kind_t kind,
                                   window_t *w) {
    if (!uuid_ok(r->run_uuid) || !kf__rule_from_rec(r->rule, &w->rule) || w->rule.kind != kind ||
        strlen(r->input) > KF_EVENT_INPUT_BYTES_MAX || r->event_count < 0 ||
        r->events_absorbed < 0 || r->events_first > r->events_next || r->event_ids_dropped < 0 ||
        !in_range(r->input_bytes, kind == KF_RULE_BATCH ? 1 : 0, KF_WINDOW_INPUT_BYTES_MAX)) {
        return KF_E_CORRUPT;
    }
    memcpy(w->run_uuid, r->run_uuid, KF_UUID_TEXT_BYTES + 1);
    w->opened_ms = r->opened_ms;
    w->last_ms = r->last_ms;
    w->due_ms = r->due_ms;
    w->input = r->input;
    w->input_len = kind == KF_RULE_BATCH ? (size_t)r->input_bytes : strlen(r->input);
    w->event_count = r->event_count;
    w->run_started = r->run_started;
    w->events_absorbed = r->events_absorbed;
    w->events_first = r->events_first;
    w->events_next = r->events_next;
    w->event_ids_dropped = r->event_ids_dropped;
    return KF_OK;
}

/* Reads the state of `c` into `s` (strings in `arena`). When `ident` is
 * given, the stored identity must be it (invariant 1). */
static kf_status_t state_load(kf_coords_t *cs, kf_ctx_t *ctx, coord_t *c, kf_arena_t *arena,
                              const kf_key_t *ident, state_t *s, kf_error_t *err) {
    (void)cs;
    kf_key_t k;
    kf_key_coord_id(&k, c->id);
    kf_value_t v;
    bool found;
    kf_status_t st = kf_ctx_get(ctx, KF_CF_COORD_STATE, &k, &v, &found, err);
    if (st != KF_OK) {
        return st;
    }
    if (!found) {
        return corrupt_state(c, "missing (the coordinator is indexed)", err);
    }
    Keyflow__Records__CoordStateRec *r =
        keyflow__records__coord_state_rec__unpack(kf_arena_pb(arena), v.len, v.data);
    kf_store_value_free(&v);
    if (r == NULL) {
        return corrupt_state(c, "undecodable", err);
    }
    if ((r->kind != KF_RULE_DEBOUNCE && r->kind != KF_RULE_BATCH) || r->workflow[0] == '\0' ||
        strlen(r->workflow) > KF_WORKFLOW_BYTES_MAX || r->key[0] == '\0' ||
        strlen(r->key) > KF_KEY_BYTES_MAX || r->ids_first > r->ids_next ||
        r->ids_count > KF_REMEMBERED_IDS_MAX || r->ids_next - r->ids_first < r->ids_count ||
        r->journal_len > r->journal_seq) {
        return corrupt_state(c, "malformed", err);
    }
    state_new(s, c, (kf_rule_kind_t)r->kind, r->workflow, r->key);
    if (ident != NULL) {
        kf_key_t mine;
        kf_key_coord(&mine, (uint8_t)r->kind, r->workflow, strlen(r->workflow), r->key,
                     strlen(r->key));
        if (mine.len != ident->len || memcmp(mine.bytes, ident->bytes, mine.len) != 0) {
            /* Two identities with one 128-bit keyed hash: never expected. */
            return kf_error_set(err, KF_E_INTERNAL,
                                "coordinator %s/%s has the id of another coordinator", r->workflow,
                                r->key);
        }
    }
    s->journal_seq = r->journal_seq;
    s->journal_len = r->journal_len;
    s->runs_started = r->runs_started;
    s->compactions = r->compactions;
    s->ids_first = r->ids_first;
    s->ids_next = r->ids_next;
    s->ids_count = r->ids_count;
    s->ids_last_expiry_ms = r->ids_last_expiry_ms;
    s->ids_unsorted = r->ids_unsorted;
    if (r->window != NULL) {
        if (window_from_rec(r->window, s->kind, &s->w) != KF_OK) {
            return corrupt_state(c, "malformed window", err);
        }
        s->open = true;
    }
    return KF_OK;
}

static void state_save(kf_coords_t *cs, kf_ctx_t *ctx, const state_t *s) {
    Keyflow__Records__CoordStateRec r = KEYFLOW__RECORDS__COORD_STATE_REC__INIT;
    Keyflow__Records__WindowStateRec w = KEYFLOW__RECORDS__WINDOW_STATE_REC__INIT;
    Keyflow__Records__RuleRec rule;
    Keyflow__Records__RetryRec retry;
    r.kind = (int32_t)s->kind;
    r.workflow = (char *)s->workflow;
    r.key = (char *)s->key;
    r.journal_seq = s->journal_seq;
    r.journal_len = s->journal_len;
    r.runs_started = s->runs_started;
    r.compactions = s->compactions;
    r.ids_first = s->ids_first;
    r.ids_next = s->ids_next;
    r.ids_count = s->ids_count;
    r.ids_last_expiry_ms = s->ids_last_expiry_ms;
    r.ids_unsorted = s->ids_unsorted;
    if (s->open) {
        const window_t *sw = &s->w;
        kf__rule_to_rec(&sw->rule, &rule, &retry);
        w.run_uuid = (char *)sw->run_uuid;
        w.opened_ms = sw->opened_ms;
        w.last_ms = sw->last_ms;
        w.due_ms = sw->due_ms;
        w.rule = &rule;
        w.input = "";
        if (s->kind == KF_RULE_BATCH) {
            w.input_bytes = (int64_t)sw->input_len;
        } else if (sw->input_len > 0) {
            w.input = kf_arena_strndup(&cs->scratch, sw->input, sw->input_len);
            KF_ASSERT(w.input != NULL);
        }
        w.event_count = sw->event_count;
        w.run_started = sw->run_started;
        w.events_absorbed = sw->events_absorbed;
        w.events_first = sw->events_first;
        w.events_next = sw->events_next;
        w.event_ids_dropped = sw->event_ids_dropped;
        r.window = &w;
    }
    kf_key_t k;
    kf_key_coord_id(&k, s->c->id);
    kf_ctx_put_msg(ctx, KF_CF_COORD_STATE, &k, &r.base);
}

/* ---- the open window's events ------------------------------------------------- */

static void events_append(events_t *ev, const char *text, size_t len) {
    if (ev->input_len + len + 1 > ev->input_cap) {
        size_t cap = ev->input_cap ? ev->input_cap : 256;
        while (cap < ev->input_len + len + 1) {
            cap *= 2;
        }
        ev->input = kf_xrealloc(ev->input, cap);
        ev->input_cap = cap;
    }
    memcpy(ev->input + ev->input_len, text, len);
    ev->input_len += len;
}

/* The events of a window that begins: none yet. */
static void events_reset(state_t *s) {
    state_done(s);
    s->ev.loaded = true;
    if (s->kind == KF_RULE_BATCH) {
        events_append(&s->ev, "[", 1);
    }
}

/* Reads the open window's event records (invariant 13). */
static kf_status_t events_load(kf_ctx_t *ctx, state_t *s, kf_error_t *err) {
    KF_ASSERT(s->open);
    if (s->ev.loaded) {
        return KF_OK;
    }
    events_reset(s);
    kf_key_t lower, upper;
    kf_key_coord_item_seq(&lower, s->c->id, KF_COORD_ITEM_EVENT, s->w.events_first);
    kf_key_coord_item_seq(&upper, s->c->id, KF_COORD_ITEM_EVENT, s->w.events_next);
    kf_iter_t *it;
    kf_status_t st = kf_ctx_iter_create(ctx, KF_CF_COORD_ITEMS, &lower, &upper, &it, err);
    if (st != KF_OK) {
        return st;
    }
    for (kf_iter_seek_first(it); kf_iter_valid(it) && st == KF_OK; kf_iter_next(it)) {
        size_t len;
        const void *v = kf_iter_value(it, &len);
        Keyflow__Records__WindowEventRec *e =
            keyflow__records__window_event_rec__unpack(NULL, len, v);
        if (e == NULL || strlen(e->event_id) > KF_EVENT_ID_BYTES_MAX ||
            s->ev.input_len + 1 + strlen(e->input) > KF_WINDOW_INPUT_BYTES_MAX) {
            st = corrupt_state(s->c, "malformed window event", err);
        } else {
            if (e->event_id[0] != '\0') {
                kf_event_ids_push(&s->ev.ids, e->event_id);
            }
            if (s->kind == KF_RULE_BATCH && e->input[0] != '\0') {
                if (s->ev.input_len > 1) {
                    events_append(&s->ev, ",", 1);
                }
                events_append(&s->ev, e->input, strlen(e->input));
            }
        }
        if (e != NULL) {
            keyflow__records__window_event_rec__free_unpacked(e, NULL);
        }
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    if (st == KF_OK && s->kind == KF_RULE_BATCH && s->ev.input_len != s->w.input_len) {
        st = corrupt_state(s->c, "window events do not add up to its input", err);
    }
    if (st != KF_OK) {
        state_done(s);
        return st;
    }
    s->ev.ids.dropped += s->w.event_ids_dropped;
    return KF_OK;
}

/* A window's run begins: no events yet (the previous run's were deleted
 * when it started). */
static void window_begin_run(kf_ctx_t *ctx, state_t *s, const char *run_uuid,
                             const kf_rule_t *rule) {
    window_t *w = &s->w;
    memcpy(w->run_uuid, run_uuid, KF_UUID_TEXT_BYTES + 1);
    w->run_started = false;
    w->event_count = 0;
    w->input = NULL;
    w->input_len = rule->kind == KF_RULE_BATCH ? 1 : 0; /* "[" */
    w->events_first = w->events_next;
    w->event_ids_dropped = 0;
    events_reset(s);
    /* GetRun of the receipt's run finds the window (invariant 7). */
    char run_id[KF_RUN_ID_BYTES_MAX + 1];
    snprintf(run_id, sizeof run_id, "%s@%s", s->key, run_uuid);
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_raw(&k, run_id, strlen(run_id));
    kf_ctx_put(ctx, KF_CF_COORD_WINDOWS, &k, s->c->id, KF_COORD_ID_BYTES);
}

/* The window's run no longer collects (it started, or the window was
 * cancelled): its events and its GetRun entry go. */
static void window_end_run(kf_ctx_t *ctx, state_t *s) {
    kf_key_t k;
    kf_key_coord_item(&k, s->c->id, KF_COORD_ITEM_EVENT);
    kf_ctx_delete_prefix(ctx, KF_CF_COORD_ITEMS, &k);
    s->w.events_first = s->w.events_next;
    char run_id[KF_RUN_ID_BYTES_MAX + 1];
    snprintf(run_id, sizeof run_id, "%s@%s", s->key, s->w.run_uuid);
    kf_key_reset(&k);
    kf_key_raw(&k, run_id, strlen(run_id));
    kf_ctx_delete(ctx, KF_CF_COORD_WINDOWS, &k);
}

/* An event joins the window's run (not absorbed). `input` is
 * NUL-terminated and lives until the command ends. */
static void window_add_event(kf_ctx_t *ctx, state_t *s, const char *event_id, const char *input,
                             size_t input_len) {
    window_t *w = &s->w;
    bool batch = s->kind == KF_RULE_BATCH;
    if (batch || event_id[0] != '\0') {
        Keyflow__Records__WindowEventRec rec = KEYFLOW__RECORDS__WINDOW_EVENT_REC__INIT;
        rec.event_id = (char *)event_id;
        rec.input = batch ? (char *)input : "";
        kf_key_t k;
        kf_key_coord_item_seq(&k, s->c->id, KF_COORD_ITEM_EVENT, w->events_next++);
        kf_ctx_put_msg(ctx, KF_CF_COORD_ITEMS, &k, &rec.base);
        if (!batch && w->events_next - w->events_first > KF_RUN_EVENT_IDS_MAX) {
            /* A debounce window keeps only the IDs its run records. */
            kf_key_coord_item_seq(&k, s->c->id, KF_COORD_ITEM_EVENT, w->events_first++);
            kf_ctx_delete(ctx, KF_CF_COORD_ITEMS, &k);
            w->event_ids_dropped++;
        }
    }
    if (batch) {
        w->input_len += (w->event_count > 0 ? 1 : 0) + input_len;
    } else {
        w->input = input;
        w->input_len = input_len;
    }
    if (s->ev.loaded) {
        if (event_id[0] != '\0') {
            kf_event_ids_push(&s->ev.ids, event_id);
        }
        if (batch) {
            if (w->event_count > 0) {
                events_append(&s->ev, ",", 1);
            }
            events_append(&s->ev, input, input_len);
        }
    }
    w->event_count++;
}

/* ---- remembered IDs ---------------------------------------------------------------- */

static kf_status_t id_decode(const coord_t *c, const void *v, size_t len, kf_arena_t *arena,
                             uint64_t seq, remembered_t *out, kf_error_t *err) {
    Keyflow__Records__RememberedIdRec *r =
        keyflow__records__remembered_id_rec__unpack(kf_arena_pb(arena), len, v);
    if (r == NULL || !uuid_ok(r->run_uuid) || r->id[0] == '\0' ||
        strlen(r->id) > KF_EVENT_ID_BYTES_MAX ||
        (r->digest.len != 0 && r->digest.len != KF_EVENT_DIGEST_BYTES)) {
        return corrupt_state(c, "malformed remembered ID", err);
    }
    *out = (remembered_t){
        .seq = seq,
        .id = r->id,
        .run_uuid = r->run_uuid,
        .digest = r->digest.len == KF_EVENT_DIGEST_BYTES ? r->digest.data : NULL,
        .due_ms = r->due_ms,
        .expires_ms = r->expires_ms,
        .commit_seq = r->commit_seq,
    };
    return KF_OK;
}

/* The stored record of `event_id`, live or expired; *found false when the
 * coordinator remembers none. */
static kf_status_t id_lookup(kf_coords_t *cs, kf_ctx_t *ctx, const state_t *s, const char *event_id,
                             remembered_t *out, bool *found, kf_error_t *err) {
    *found = false;
    if (s->ids_count == 0) {
        return KF_OK;
    }
    kf_key_t k;
    kf_key_coord_item_name(&k, s->c->id, event_id, strlen(event_id));
    kf_value_t v;
    kf_status_t st = kf_ctx_get(ctx, KF_CF_COORD_ITEMS, &k, &v, found, err);
    if (st != KF_OK || !*found) {
        return st;
    }
    uint64_t seq = v.len == 8 ? kf_get_be64(v.data) : UINT64_MAX;
    kf_store_value_free(&v);
    if (seq < s->ids_first || seq >= s->ids_next) {
        return corrupt_state(s->c, "a remembered ID out of range", err);
    }
    kf_key_coord_item_seq(&k, s->c->id, KF_COORD_ITEM_ID, seq);
    bool there;
    st = kf_ctx_get(ctx, KF_CF_COORD_ITEMS, &k, &v, &there, err);
    if (st != KF_OK) {
        return st;
    }
    if (!there) {
        return corrupt_state(s->c, "a remembered ID without its record", err);
    }
    st = id_decode(s->c, v.data, v.len, &cs->scratch, seq, out, err);
    kf_store_value_free(&v);
    if (st == KF_OK && strcmp(out->id, event_id) != 0) {
        st = corrupt_state(s->c, "a remembered ID under another name", err);
    }
    return st;
}

/* Plans room for one more remembered ID at now_ms, when the coordinator
 * holds the most it may (invariant 12) or a sweep is due: the expired ones
 * go, and the oldest live one too if that is not enough. `skip_seq` is an expired record that
 * the push replaces anyway (or UINT64_MAX). */
static kf_status_t ids_plan_room(kf_coords_t *cs, kf_ctx_t *ctx, const state_t *s, int64_t now_ms,
                                 uint64_t skip_seq, id_room_t *room, kf_error_t *err) {
    uint32_t n = s->ids_count + 1;
    memset(room, 0, sizeof *room);
    room->drop_seq = kf_arena_new(&cs->scratch, n * sizeof *room->drop_seq);
    room->drop_id = kf_arena_new(&cs->scratch, n * sizeof *room->drop_id);
    room->first = s->ids_first;
    room->last_expiry_ms = s->ids_last_expiry_ms;
    /* Sorted by expiry (the usual case: one dedup_ms per key), the expired
     * ones are a prefix, every record after the first live one is live, and
     * the latest expiry is the last record's; otherwise every record is
     * looked at and the live ones kept in order. */
    bool whole = s->ids_unsorted;
    remembered_t *live = kf_arena_new(&cs->scratch, n * sizeof *live);
    uint32_t nlive = 0;
    kf_key_t lower, upper;
    kf_key_coord_item_seq(&lower, s->c->id, KF_COORD_ITEM_ID, s->ids_first);
    kf_key_coord_item_seq(&upper, s->c->id, KF_COORD_ITEM_ID, s->ids_next);
    kf_iter_t *it;
    kf_status_t st = kf_ctx_iter_create(ctx, KF_CF_COORD_ITEMS, &lower, &upper, &it, err);
    if (st != KF_OK) {
        return st;
    }
    for (kf_iter_seek_first(it); kf_iter_valid(it); kf_iter_next(it)) {
        size_t kl, vl;
        const uint8_t *key = kf_iter_key(it, &kl);
        const void *v = kf_iter_value(it, &vl);
        uint64_t seq = kf_get_be64(key + kl - 8);
        if (seq == skip_seq) {
            continue;
        }
        remembered_t r;
        if ((st = id_decode(s->c, v, vl, &cs->scratch, seq, &r, err)) != KF_OK) {
            break;
        }
        if (r.expires_ms <= now_ms) {
            if (room->drops == n) {
                st = corrupt_state(s->c, "more remembered IDs than counted", err);
                break;
            }
            room->drop_seq[room->drops] = seq;
            room->drop_id[room->drops++] = r.id;
            continue;
        }
        live[nlive++] = r;
        if (!whole || nlive == n) {
            break;
        }
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    if (st != KF_OK) {
        return st;
    }
    uint32_t others = s->ids_count - (skip_seq != UINT64_MAX ? 1 : 0);
    uint32_t live_count = others - room->drops;
    uint32_t keep_from = 0; /* live[keep_from..] stay */
    if (live_count >= KF_REMEMBERED_IDS_MAX) {
        KF_ASSERT(nlive > 0);
        room->drop_seq[room->drops] = live[0].seq;
        room->drop_id[room->drops++] = live[0].id;
        keep_from = 1;
    }
    if (whole) {
        room->first = keep_from < nlive ? live[keep_from].seq : s->ids_next;
        room->last_expiry_ms = INT64_MIN;
        for (uint32_t i = keep_from; i < nlive; i++) {
            room->unsorted = room->unsorted || live[i].expires_ms < room->last_expiry_ms;
            if (live[i].expires_ms > room->last_expiry_ms) {
                room->last_expiry_ms = live[i].expires_ms;
            }
        }
    } else if (room->drops > 0) {
        /* A prefix went: what stays starts after it. */
        room->first = room->drop_seq[room->drops - 1] + 1;
    }
    return KF_OK;
}

static void ids_apply_room(kf_ctx_t *ctx, state_t *s, const id_room_t *room) {
    for (uint32_t i = 0; i < room->drops; i++) {
        kf_key_t k;
        kf_key_coord_item_seq(&k, s->c->id, KF_COORD_ITEM_ID, room->drop_seq[i]);
        kf_ctx_delete(ctx, KF_CF_COORD_ITEMS, &k);
        kf_key_coord_item_name(&k, s->c->id, room->drop_id[i], strlen(room->drop_id[i]));
        kf_ctx_delete(ctx, KF_CF_COORD_ITEMS, &k);
    }
    KF_ASSERT(s->ids_count >= room->drops);
    s->ids_first = room->first;
    s->ids_count -= room->drops;
    s->ids_unsorted = room->unsorted;
    s->ids_last_expiry_ms = room->last_expiry_ms;
}

/* Remembers an event ID (room made; `replaced` is the expired record of the
 * same ID, or NULL). */
static void ids_push(kf_ctx_t *ctx, state_t *s, const remembered_t *r,
                     const remembered_t *replaced) {
    kf_key_t k;
    if (replaced != NULL) {
        kf_key_coord_item_seq(&k, s->c->id, KF_COORD_ITEM_ID, replaced->seq);
        kf_ctx_delete(ctx, KF_CF_COORD_ITEMS, &k);
        s->ids_count--;
    }
    Keyflow__Records__RememberedIdRec rec = KEYFLOW__RECORDS__REMEMBERED_ID_REC__INIT;
    rec.id = (char *)r->id;
    rec.run_uuid = (char *)r->run_uuid;
    rec.due_ms = r->due_ms;
    rec.expires_ms = r->expires_ms;
    rec.commit_seq = r->commit_seq;
    rec.digest.data = (uint8_t *)r->digest;
    rec.digest.len = KF_EVENT_DIGEST_BYTES;
    uint64_t seq = s->ids_next++;
    kf_key_coord_item_seq(&k, s->c->id, KF_COORD_ITEM_ID, seq);
    kf_ctx_put_msg(ctx, KF_CF_COORD_ITEMS, &k, &rec.base);
    uint8_t v[8];
    kf_put_be64(v, seq);
    kf_key_coord_item_name(&k, s->c->id, r->id, strlen(r->id));
    kf_ctx_put(ctx, KF_CF_COORD_ITEMS, &k, v, sizeof v);
    if (s->ids_count == 0) {
        s->ids_last_expiry_ms = r->expires_ms;
        s->ids_unsorted = false;
    } else {
        s->ids_unsorted = s->ids_unsorted || r->expires_ms < s->ids_last_expiry_ms;
        if (r->expires_ms > s->ids_last_expiry_ms) {
            s->ids_last_expiry_ms = r->expires_ms;
        }
    }
    s->ids_count++;
}

/* ---- history (the journal) --------------------------------------------------------- */

/* Journals `e` (seq and time filled in here). */
static void history_append(kf_ctx_t *ctx, state_t *s, Keyflow__Records__JournalEntryRec *e) {
    e->seq = s->journal_seq++;
    e->at_ms = ctx->now_ms;
    kf_key_t k;
    kf_key_coord_history(&k, s->c->id, e->seq);
    kf_ctx_put_msg(ctx, KF_CF_COORD_HISTORY, &k, &e->base);
    s->journal_len++;
}

/* Continue-as-new: the state record is the snapshot, so the history up to
 * here just goes. */
static void maybe_compact(kf_ctx_t *ctx, state_t *s) {
    if (s->journal_len < KF_JOURNAL_ENTRIES_MAX) {
        return;
    }
    s->compactions++;
    kf_key_t begin, end;
    kf_key_coord_history(&begin, s->c->id, 0);
    kf_key_coord_history(&end, s->c->id, s->journal_seq);
    kf_ctx_delete_range(ctx, KF_CF_COORD_HISTORY, &begin, &end);
    s->journal_len = 0;
    kf_counter_add(KF_C_COMPACTIONS, 1);
}

/* ---- wake-ups, settling, deletion ------------------------------------------------------- */

static void index_put(kf_ctx_t *ctx, const coord_t *c) {
    uint8_t v[9];
    kf_put_be64(v, kf_i64_ordered(c->wakeup_ms));
    v[8] = c->open ? 1 : 0;
    kf_key_t k;
    kf_key_coord_id(&k, c->id);
    kf_ctx_put(ctx, KF_CF_COORD_INDEX, &k, v, sizeof v);
}

/* Moves the coordinator's wake-up to due_ms and records whether a window
 * is open (invariant 11): a later due time writes nothing while the stored
 * wake-up is still ahead, and the in-memory timer stays where it is unless
 * it is later than the new due time. */
static void wakeup_move(kf_coords_t *cs, kf_ctx_t *ctx, coord_t *c, int64_t due_ms, bool open) {
    bool flag_same = c->open == open;
    if (flag_same && c->wakeup_ms == due_ms) {
        if (!kf_timer_armed(&c->timer) || c->timer.due_ms != due_ms) {
            kf_heap_arm(&ctx->heap, &c->timer, due_ms);
        }
        return;
    }
    if (flag_same && c->wakeup_ms != KF_NO_WAKEUP && c->wakeup_ms <= due_ms &&
        c->wakeup_ms > ctx->now_ms) {
        if (!kf_timer_armed(&c->timer) || c->timer.due_ms > due_ms) {
            kf_heap_arm(&ctx->heap, &c->timer, due_ms);
        }
        return;
    }
    c->wakeup_ms = due_ms;
    coord_set_open(cs, c, open);
    index_put(ctx, c);
    kf_heap_arm(&ctx->heap, &c->timer, due_ms);
}

static void coord_delete(kf_coords_t *cs, kf_ctx_t *ctx, state_t *s) {
    coord_t *c = s->c;
    KF_ASSERT(!s->open);
    kf_key_t k;
    kf_key_coord_id(&k, c->id);
    kf_ctx_delete(ctx, KF_CF_COORD_STATE, &k);
    kf_ctx_delete(ctx, KF_CF_COORD_INDEX, &k);
    kf_ctx_delete_prefix(ctx, KF_CF_COORD_ITEMS, &k);
    kf_ctx_delete_prefix(ctx, KF_CF_COORD_HISTORY, &k);
    kf_heap_disarm(&ctx->heap, &c->timer);
    coord_set_open(cs, c, false);
    kf_map_remove(&cs->map, &c->node);
    coord_free(cs, c);
    s->c = NULL;
}

/* Re-arms the coordinator's wake-up, or deletes it when it has nothing left
 * to do. Returns false when the coordinator was deleted. */
static bool coord_schedule(kf_coords_t *cs, kf_ctx_t *ctx, state_t *s) {
    int64_t due;
    if (s->open) {
        due = s->w.due_ms;
    } else {
        due = s->ids_count > 0 ? s->ids_last_expiry_ms : INT64_MIN;
        if (due <= ctx->now_ms) {
            coord_delete(cs, ctx, s);
            return false;
        }
    }
    wakeup_move(cs, ctx, s->c, due, s->open);
    return true;
}

/* Ends a command's changes: wake-up, compaction, the state record.
 * Returns false when the coordinator was deleted (s->c is then NULL). */
static bool coord_settle(kf_coords_t *cs, kf_ctx_t *ctx, state_t *s) {
    bool exists = coord_schedule(cs, ctx, s);
    if (exists) {
        maybe_compact(ctx, s);
        state_save(cs, ctx, s);
    }
    publish_gauges(cs);
    return exists;
}

/* ---- closing windows --------------------------------------------------------------- */

/* "<key>@<uuid>" in the arena (once per receipt: no printf). */
static char *run_id_in(kf_arena_t *arena, const char *key, const char *uuid) {
    size_t key_len = strlen(key);
    size_t uuid_len = strlen(uuid);
    char *s = kf_arena_alloc(arena, key_len + 1 + uuid_len + 1);
    KF_ASSERT(s != NULL);
    memcpy(s, key, key_len);
    s[key_len] = '@';
    memcpy(s + key_len + 1, uuid, uuid_len + 1);
    return s;
}

static void recent_push(kf_ctx_t *ctx, state_t *s, const char *uuid) {
    kf_key_t k;
    kf_key_coord_item_seq(&k, s->c->id, KF_COORD_ITEM_RECENT, (uint64_t)s->runs_started);
    kf_ctx_put(ctx, KF_CF_COORD_ITEMS, &k, uuid, KF_UUID_TEXT_BYTES);
    if (s->runs_started >= KF_RECENT_RUNS_MAX) {
        kf_key_coord_item_seq(&k, s->c->id, KF_COORD_ITEM_RECENT,
                              (uint64_t)(s->runs_started - KF_RECENT_RUNS_MAX));
        kf_ctx_delete(ctx, KF_CF_COORD_ITEMS, &k);
    }
    s->runs_started++;
}

static void window_close(state_t *s) {
    s->open = false;
    memset(&s->w, 0, sizeof s->w);
    state_done(s);
}

/* Starts the window's run with its input and event IDs (read before the
 * command changed anything): the window closes, or with `leading` stays
 * open to absorb events until its due time. */
static void start_run(kf_coords_t *cs, kf_ctx_t *ctx, state_t *s, const char *reason,
                      bool leading) {
    window_t *w = &s->w;
    KF_ASSERT(s->open && !w->run_started && s->ev.loaded);
    char run_id[KF_RUN_ID_BYTES_MAX + 1];
    const char *event_ids[KF_RUN_EVENT_IDS_MAX];
    snprintf(run_id, sizeof run_id, "%s@%s", s->key, w->run_uuid);
    bool batch = s->kind == KF_RULE_BATCH;
    if (batch) {
        events_append(&s->ev, "]", 1);
    }
    kf_run_spec_t spec = {
        .run_id = run_id,
        .workflow = s->workflow,
        .key = s->key,
        .kind = (int)s->kind,
        .input = batch ? s->ev.input : w->input,
        .input_len = batch ? s->ev.input_len : w->input_len,
        .event_count = w->event_count,
        .options = w->rule.run,
        .event_ids = event_ids,
        .event_id_count = kf_event_ids_list(&s->ev.ids, event_ids),
        .event_ids_dropped = s->ev.ids.dropped,
    };
    uint64_t run_seq = kf_runs_start(cs->runs, ctx, &spec);
    Keyflow__Records__JournalEntryRec e = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__INIT;
    Keyflow__Records__RunStartedRec started = KEYFLOW__RECORDS__RUN_STARTED_REC__INIT;
    started.run_uuid = w->run_uuid;
    started.reason = (char *)reason;
    started.run_seq = run_seq;
    started.leading = leading;
    e.entry_case = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_STARTED;
    e.started = &started;
    history_append(ctx, s, &e);
    kf_log_kv(KF_LOG_INFO, "coord", "window closed, run started",
              KF_LOG_STR("kind", batch ? "batch" : "debounce"), KF_LOG_STR("workflow", s->workflow),
              KF_LOG_STR("key", s->key), KF_LOG_STR("run_id", run_id), KF_LOG_STR("reason", reason),
              KF_LOG_INT("events", spec.event_count));
    window_end_run(ctx, s);
    recent_push(ctx, s, w->run_uuid);
    if (leading) {
        /* The window stays open to absorb events until its due time. */
        w->run_started = true;
        w->input = NULL;
        w->input_len = 0;
        events_reset(s);
    } else {
        window_close(s);
    }
}

/* Closes the open window: its run starts, or, when it already started at
 * the leading edge, the window just ends ("due", "flush", "cancel"). */
static void end_window(kf_coords_t *cs, kf_ctx_t *ctx, state_t *s, const char *reason) {
    KF_ASSERT(s->open);
    if (!s->w.run_started) {
        start_run(cs, ctx, s, reason, false);
        return;
    }
    Keyflow__Records__JournalEntryRec e = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__INIT;
    Keyflow__Records__WindowClosedRec closed = KEYFLOW__RECORDS__WINDOW_CLOSED_REC__INIT;
    closed.run_uuid = s->w.run_uuid;
    closed.reason = (char *)reason;
    closed.events_absorbed = s->w.events_absorbed;
    e.entry_case = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_CLOSED;
    e.closed = &closed;
    history_append(ctx, s, &e);
    window_close(s);
}

/* Whether closing the open window now would start a run, and there is no
 * room for one more live run. */
static bool end_blocked(const kf_coords_t *cs, const state_t *s) {
    return !s->w.run_started && kf_runs_full(cs->runs);
}

/* An overdue window whose run would copy its input while the disk has no
 * room above its reserve stays open until there is (step/ctx.h,
 * kf_ctx_disk_room_left); FlushWindow still closes one on request. */
static bool end_waits_for_disk(const kf_ctx_t *ctx, const state_t *s) {
    return !s->w.run_started && !kf_ctx_disk_room_left(ctx);
}

/* ---- requests --------------------------------------------------------------------- */

/* Loads the coordinator of `ident` (*s->c NULL when there is none) and
 * closes its window if its due time has passed, as its timer would have.
 * The engine fires due timers before each turn's commands, but at most
 * KF_TIMERS_PER_TURN_MAX of them, so a request may still meet a window
 * that is over: it must not join, cancel, flush or describe it as open.
 * On success the caller owes state_done(s). */
static kf_status_t coord_open(kf_coords_t *cs, kf_ctx_t *ctx, const kf_key_t *ident,
                              uint8_t id[KF_COORD_ID_BYTES], state_t *s, kf_error_t *err) {
    memset(s, 0, sizeof *s);
    kf__coord_id(&cs->id_key, ident->bytes, ident->len, id);
    coord_t *c = coord_find(cs, id);
    if (c == NULL) {
        return KF_OK;
    }
    kf_status_t st = state_load(cs, ctx, c, &cs->scratch, ident, s, err);
    if (st != KF_OK) {
        return st;
    }
    if (!s->open || s->w.due_ms > ctx->now_ms || end_blocked(cs, s) || end_waits_for_disk(ctx, s)) {
        return KF_OK;
    }
    if (!s->w.run_started && (st = events_load(ctx, s, err)) != KF_OK) {
        state_done(s);
        return st;
    }
    end_window(cs, ctx, s, "due");
    if (!coord_settle(cs, ctx, s)) {
        state_done(s);
        memset(s, 0, sizeof *s);
    }
    return KF_OK;
}

static kf_status_t ref_key(const Keyflow__V1__CoordinatorRef *ref, const char *field,
                           kf_key_t *ident, kf_error_t *err) {
    char name[64];
    if (ref == NULL) {
        return kf_error_set(err, KF_E_INVALID, "%s: required", field);
    }
    if (ref->kind != KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE &&
        ref->kind != KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH) {
        return kf_error_set(err, KF_E_INVALID, "%s.kind: must be debounce or batch", field);
    }
    kf_status_t st;
    snprintf(name, sizeof name, "%s.workflow", field);
    if ((st = kf_check_identifier(name, ref->workflow, KF_WORKFLOW_BYTES_MAX, true, err)) !=
        KF_OK) {
        return st;
    }
    snprintf(name, sizeof name, "%s.key", field);
    if ((st = kf_check_identifier(name, ref->key, KF_KEY_BYTES_MAX, true, err)) != KF_OK) {
        return st;
    }
    kf_key_coord(ident, (uint8_t)ref->kind, ref->workflow, strlen(ref->workflow), ref->key,
                 strlen(ref->key));
    return KF_OK;
}

/* Trims JSON whitespace around text (the input is stored as sent otherwise). */
static void trim_json_space(const char **text, size_t *len) {
    const char *p = *text;
    size_t n = *len;
    while (n > 0 && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')) {
        p++;
        n--;
    }
    while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\n' || p[n - 1] == '\t' || p[n - 1] == '\r')) {
        n--;
    }
    *text = p;
    *len = n;
}

/* A live remembered ID answers a retry: with its first receipt when the
 * payload is the same (or unknown: remembered by an older build), else the
 * retry is refused. */
static kf_status_t answer_duplicate(const state_t *s, const remembered_t *r, const uint8_t *digest,
                                    kf_arena_t *arena, Keyflow__V1__SendEventResponse *resp,
                                    kf_error_t *err) {
    if (r->digest != NULL && memcmp(r->digest, digest, KF_EVENT_DIGEST_BYTES) != 0) {
        kf_counter_add(KF_C_EVENTS_CONFLICT, 1);
        return kf_error_set(err, KF_E_EXISTS,
                            "event.id: \"%s\" was already used with another payload (rule, flush "
                            "or input) on this coordinator; a retry must repeat the event exactly, "
                            "another event needs another ID",
                            r->id);
    }
    resp->receipt->run_id = run_id_in(arena, s->key, r->run_uuid);
    resp->receipt->due_ms = r->due_ms;
    resp->receipt->commit_seq = r->commit_seq;
    resp->duplicate = true;
    resp->disposition = KEYFLOW__V1__DISPOSITION__DISPOSITION_DUPLICATE;
    kf_counter_add(KF_C_EVENTS_DUPLICATE, 1);
    return KF_OK;
}

/* Refuses an event that cannot be taken now, before anything changes. */
static kf_status_t admit(const kf_coords_t *cs, kf_ctx_t *ctx, const state_t *s, kf_error_t *err) {
    bool exists = s->c != NULL;
    if (!exists && cs->map.count >= KF_COORDINATORS_MAX) {
        return kf_error_set(err, KF_E_LIMIT,
                            "coordinators: at most %d held at once (KF_COORDINATORS_MAX)",
                            KF_COORDINATORS_MAX);
    }
    /* One event starts at most two runs: the window it does not fit (batch
     * bytes) and its own (full, flush or leading edge). */
    if (!kf_runs_room(cs->runs, 2)) {
        return kf_error_set(
            err, KF_E_LIMIT,
            "runs: %d pending or leased runs (KF_LIVE_RUNS_MAX); complete some first",
            KF_LIVE_RUNS_MAX);
    }
    /* The memory budget admits new coordinators and windows; an event for
     * an open window is always taken. A window costs no memory of its own
     * now, so one on an existing coordinator is refused only while the
     * tables are past the budget already. */
    if (!exists) {
        return kf_ctx_admit(ctx, COORD_BYTES, "a new coordinator", err);
    }
    if (!s->open) {
        return kf_ctx_admit(ctx, 0, "a new window", err);
    }
    return KF_OK;
}

/* A new window's run UUID: a UUIDv7 whose spare bits name this engine's
 * partition, so that a call naming only the run ID (GetRun, CompleteRun)
 * finds its partition (base/partition.h). */
static void new_run_uuid(kf_ctx_t *ctx, int64_t now, char uuid[KF_UUID_TEXT_BYTES + 1]) {
    kf_uuid7(ctx->rng, now, uuid);
    kf_partition_tag_uuid(uuid, ctx->config->partition_index);
}

/* What send_one reads before it changes anything (invariant 13). */
typedef struct send_reads {
    bool seen; /* the event's ID is remembered (live or expired) */
    remembered_t remembered;
    bool room; /* room must be made for its ID */
    id_room_t id_room;
} send_reads_t;

/* One SendEvent: the response (in `arena`) or an error, in which case
 * nothing changed but an overdue window closing, as its timer would have. */
static kf_status_t send_one(kf_coords_t *cs, kf_ctx_t *ctx,
                            const Keyflow__V1__SendEventRequest *req, kf_arena_t *arena,
                            Keyflow__V1__SendEventResponse **out, kf_error_t *err) {
    kf_rule_t rule;
    const Keyflow__V1__Event *ev = req->event;
    if (kf_check_identifier("workflow", req->workflow, KF_WORKFLOW_BYTES_MAX, true, err) != KF_OK ||
        kf_check_identifier("key", req->key, KF_KEY_BYTES_MAX, true, err) != KF_OK) {
        return err->status;
    }
    if (ev == NULL) {
        return kf_error_set(err, KF_E_INVALID, "event: required");
    }
    const char *input = ev->input_json;
    size_t input_len = strlen(input);
    trim_json_space(&input, &input_len);
    if (kf_check_identifier("event.id", ev->id, KF_EVENT_ID_BYTES_MAX, false, err) != KF_OK ||
        kf_rule_resolve(ev->rule, "event.rule", &rule, err) != KF_OK ||
        kf_json_check("event.input", input, input_len, KF_EVENT_INPUT_BYTES_MAX, err) != KF_OK) {
        return err->status;
    }
    if (rule.kind == KF_RULE_BATCH && kf_batch_bytes_with(0, 0, input_len) > rule.max_bytes) {
        return kf_error_set(err, KF_E_INVALID,
                            "event.input: %zu bytes do not fit event.rule.max_bytes %lld (a batch "
                            "run's input is the array [input, ...])",
                            input_len, (long long)rule.max_bytes);
    }
    uint8_t digest[KF_EVENT_DIGEST_BYTES];
    bool has_id = ev->id[0] != '\0';
    if (has_id) {
        kf_event_digest(&rule, ev->flush, input, input_len, digest);
    }
    kf_key_t ident;
    kf_key_coord(&ident, (uint8_t)rule.kind, req->workflow, strlen(req->workflow), req->key,
                 strlen(req->key));
    kf_arena_reset(&cs->scratch);
    state_t s;
    uint8_t id[KF_COORD_ID_BYTES];
    kf_status_t st = coord_open(cs, ctx, &ident, id, &s, err);
    if (st != KF_OK) {
        return st;
    }
    int64_t now = ctx->now_ms;
    bool exists = s.c != NULL;

    Keyflow__V1__SendEventResponse *resp = kf_arena_new(arena, sizeof *resp);
    keyflow__v1__send_event_response__init(resp);
    resp->receipt = kf_arena_new(arena, sizeof *resp->receipt);
    keyflow__v1__receipt__init(resp->receipt);

    /* Reads. */
    send_reads_t reads = {0};
    if (exists && has_id) {
        st = id_lookup(cs, ctx, &s, ev->id, &reads.remembered, &reads.seen, err);
        if (st == KF_OK && reads.seen && reads.remembered.expires_ms > now) {
            st = answer_duplicate(&s, &reads.remembered, digest, arena, resp, err);
            state_done(&s);
            *out = resp;
            return st;
        }
        uint64_t replaced = reads.seen ? reads.remembered.seq : UINT64_MAX;
        /* At the cap room must be made. Before it, expired IDs go every
         * KF_REMEMBERED_IDS_SWEEP_EVERY IDs: a coordinator whose events
         * keep coming never lacks a live ID, so it is never deleted, and
         * without the sweep it kept every expired ID up to the cap (a soak
         * at 500 events/s over 5,000 keys grew its data by ~100 MiB an
         * hour, bench/README.md, "Soak"). */
        bool full = s.ids_count - (reads.seen ? 1u : 0u) >= KF_REMEMBERED_IDS_MAX;
        bool sweep = s.ids_count > 0 && s.ids_next % KF_REMEMBERED_IDS_SWEEP_EVERY == 0;
        if (st == KF_OK && (full || sweep)) {
            reads.room = true;
            st = ids_plan_room(cs, ctx, &s, now, replaced, &reads.id_room, err);
        }
    }
    if (st == KF_OK) {
        st = admit(cs, ctx, &s, err);
    }
    bool batch_over = exists && s.open && rule.kind == KF_RULE_BATCH &&
                      kf_batch_bytes_with((int64_t)s.w.input_len + 1, s.w.event_count, input_len) >
                          rule.max_bytes;
    kf_join_t join = exists && s.open && !batch_over ? kf_window_join(&rule, true, s.w.run_started)
                                                     : KF_JOIN_OPEN;
    bool may_close = batch_over || ev->flush ||
                     (rule.kind == KF_RULE_BATCH && join == KF_JOIN_RUN &&
                      s.w.event_count + 1 >= rule.max_events);
    if (st == KF_OK && may_close && exists && s.open && !s.w.run_started) {
        st = events_load(ctx, &s, err);
    }
    if (st != KF_OK) {
        state_done(&s);
        return st;
    }

    /* Changes. */
    if (!exists) {
        state_new(&s, coord_add(cs, id), rule.kind, req->workflow, req->key);
        publish_gauges(cs);
    }
    if (batch_over) {
        start_run(cs, ctx, &s, "size", false); /* the window is full by bytes: start it */
    }
    KF_ASSERT(join == kf_window_join(&rule, s.open, s.open && s.w.run_started));
    char uuid[KF_UUID_TEXT_BYTES + 1];
    int64_t opened_ms = s.w.opened_ms;
    int64_t count = 1;
    switch (join) {
    case KF_JOIN_OPEN:
        opened_ms = now;
        new_run_uuid(ctx, now, uuid);
        break;
    case KF_JOIN_NEXT_RUN: new_run_uuid(ctx, now, uuid); break;
    case KF_JOIN_RUN:
        memcpy(uuid, s.w.run_uuid, sizeof uuid);
        count = s.w.event_count + 1;
        break;
    case KF_JOIN_ABSORB:
        memcpy(uuid, s.w.run_uuid, sizeof uuid);
        count = s.w.event_count;
        break;
    }
    /* A flushing event closes its window at once. */
    int64_t due_ms = ev->flush ? now : kf_window_due_ms(&rule, opened_ms, now, count);
    const char *input_z = input;
    if (input[input_len] != '\0') {
        input_z = kf_arena_strndup(arena, input, input_len); /* a trailing blank was trimmed */
        KF_ASSERT(input_z != NULL);
    }
    if (input_len == 0) {
        input_z = "null";
        input_len = 4;
    }

    if (join == KF_JOIN_OPEN) {
        s.open = true;
        memset(&s.w, 0, sizeof s.w);
        s.w.opened_ms = now;
        s.w.events_first = s.w.events_next = 0;
        window_begin_run(ctx, &s, uuid, &rule);
    } else if (join == KF_JOIN_NEXT_RUN) {
        window_begin_run(ctx, &s, uuid, &rule);
    }
    if (join == KF_JOIN_ABSORB) {
        s.w.events_absorbed++;
    } else {
        window_add_event(ctx, &s, ev->id, input_z, input_len);
    }
    s.w.last_ms = now;
    s.w.rule = rule;
    s.w.due_ms = due_ms;
    int64_t commit_seq = (int64_t)ctx->group_id;
    if (has_id) {
        if (reads.room) {
            ids_apply_room(ctx, &s, &reads.id_room);
        }
        remembered_t r = {
            .id = ev->id,
            .run_uuid = uuid,
            .digest = digest,
            .due_ms = due_ms,
            .expires_ms = kf_dedup_expires_ms(&rule, now),
            .commit_seq = commit_seq,
        };
        ids_push(ctx, &s, &r, reads.seen ? &reads.remembered : NULL);
    }
    Keyflow__Records__EventAcceptedRec acc = KEYFLOW__RECORDS__EVENT_ACCEPTED_REC__INIT;
    acc.event_id = ev->id;
    acc.run_uuid = uuid;
    acc.opened = join == KF_JOIN_OPEN;
    acc.absorbed = join == KF_JOIN_ABSORB;
    acc.next_run = join == KF_JOIN_NEXT_RUN;
    acc.due_ms = due_ms;
    acc.commit_seq = commit_seq;
    Keyflow__Records__JournalEntryRec e = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__INIT;
    e.entry_case = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_ACCEPTED;
    e.accepted = &acc;
    history_append(ctx, &s, &e);
    KF_ASSERT(s.w.due_ms == due_ms && s.w.event_count == count);
    kf_counter_add(KF_C_EVENTS_ACCEPTED, 1);

    bool closed = false;
    if (join == KF_JOIN_OPEN && kf_edge_leading(&rule)) {
        start_run(cs, ctx, &s, "leading", true);
        closed = true;
    }
    if (rule.kind == KF_RULE_BATCH && s.w.event_count >= rule.max_events) {
        start_run(cs, ctx, &s, "full", false); /* fires at once, inside this request */
        closed = true;
    }
    if (ev->flush && s.open) {
        end_window(cs, ctx, &s, "flush");
        closed = true;
    }
    resp->receipt->run_id = run_id_in(arena, s.key, uuid);
    resp->receipt->due_ms = due_ms;
    resp->receipt->commit_seq = commit_seq;
    resp->run_started = closed;
    if (closed) {
        resp->disposition = KEYFLOW__V1__DISPOSITION__DISPOSITION_CLOSED;
    } else if (join == KF_JOIN_OPEN || join == KF_JOIN_NEXT_RUN) {
        resp->disposition = KEYFLOW__V1__DISPOSITION__DISPOSITION_OPENED;
    } else {
        resp->disposition = KEYFLOW__V1__DISPOSITION__DISPOSITION_JOINED;
    }
    coord_settle(cs, ctx, &s);
    state_done(&s);
    *out = resp;
    return KF_OK;
}

void kf_coords_send_event(kf_coords_t *cs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__SendEventRequest *req = (const Keyflow__V1__SendEventRequest *)cmd->request;
    Keyflow__V1__SendEventResponse *resp = NULL;
    if (send_one(cs, ctx, req, cmd->arena, &resp, &cmd->error) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

void kf_coords_send_events(kf_coords_t *cs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__SendEventsRequest *req =
        (const Keyflow__V1__SendEventsRequest *)cmd->request;
    if (req->n_events > KF_SEND_EVENTS_MAX) {
        kf_error_set(&cmd->error, KF_E_INVALID,
                     "events: at most %d per call (KF_SEND_EVENTS_MAX), got %zu",
                     KF_SEND_EVENTS_MAX, req->n_events);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    kf_arena_t *arena = cmd->arena;
    Keyflow__V1__SendEventsResponse *resp = kf_arena_new(arena, sizeof *resp);
    keyflow__v1__send_events_response__init(resp);
    resp->results = kf_arena_new(arena, (req->n_events + 1) * sizeof *resp->results);
    for (size_t i = 0; i < req->n_events; i++) {
        Keyflow__V1__SendEventsResult *r = kf_arena_new(arena, sizeof *r);
        keyflow__v1__send_events_result__init(r);
        kf_error_t err;
        kf_error_clear(&err);
        Keyflow__V1__SendEventResponse *one = NULL;
        if (send_one(cs, ctx, req->events[i], arena, &one, &err) == KF_OK) {
            r->outcome_case = KEYFLOW__V1__SEND_EVENTS_RESULT__OUTCOME_RESPONSE;
            r->response = one;
        } else {
            Keyflow__V1__EventError *e = kf_arena_new(arena, sizeof *e);
            keyflow__v1__event_error__init(e);
            e->code = kf_status_grpc_code(err.status);
            e->status = (char *)kf_status_grpc_name(err.status);
            e->message = kf_arena_strdup(arena, err.message);
            KF_ASSERT(e->message != NULL);
            r->outcome_case = KEYFLOW__V1__SEND_EVENTS_RESULT__OUTCOME_ERROR;
            r->error = e;
        }
        resp->results[resp->n_results++] = r;
    }
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

static Keyflow__V1__Rule *rule_out(kf_arena_t *arena, const kf_rule_t *rule) {
    Keyflow__V1__Rule *r = kf_arena_new(arena, sizeof *r);
    keyflow__v1__rule__init(r);
    r->kind = (Keyflow__V1__RuleKind)rule->kind;
    r->max_wait_ms_present_case = KEYFLOW__V1__RULE__MAX_WAIT_MS_PRESENT_MAX_WAIT_MS;
    r->max_wait_ms = rule->max_wait_ms;
    r->dedup_ms_present_case = KEYFLOW__V1__RULE__DEDUP_MS_PRESENT_DEDUP_MS;
    r->dedup_ms = rule->dedup_ms;
    if (rule->kind == KF_RULE_DEBOUNCE) {
        r->window_ms_present_case = KEYFLOW__V1__RULE__WINDOW_MS_PRESENT_WINDOW_MS;
        r->window_ms = rule->window_ms;
        r->edge = (Keyflow__V1__Edge)rule->edge;
    } else {
        r->max_events_present_case = KEYFLOW__V1__RULE__MAX_EVENTS_PRESENT_MAX_EVENTS;
        r->max_events = rule->max_events;
        r->max_bytes_present_case = KEYFLOW__V1__RULE__MAX_BYTES_PRESENT_MAX_BYTES;
        r->max_bytes = rule->max_bytes;
    }
    kf_run_options_to_rule(arena, &rule->run, r);
    return r;
}

static const char *entry_name(int entry_case) {
    switch (entry_case) {
    case KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_ACCEPTED: return "event_accepted";
    case KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_STARTED: return "run_started";
    case KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_CANCELLED: return "window_cancelled";
    case KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_CLOSED: return "window_closed";
    default: return "unknown";
    }
}

/* The durable journal entries since the last compaction (a read of the
 * store: entries of groups not yet synced are not listed; their count is
 * in journal_length). */
/* The coordinator's journal, oldest first. A stored entry that does not
 * decode is corruption: the call fails KF_E_CORRUPT naming the coordinator
 * and the entry, and the log says so, as every other decoder does. */
static kf_status_t describe_journal(kf_ctx_t *ctx, const state_t *s,
                                    Keyflow__V1__DescribeCoordinatorResponse *resp,
                                    kf_arena_t *arena, kf_error_t *err) {
    kf_key_t lower, upper;
    kf_key_coord_history(&lower, s->c->id, 0);
    kf_key_coord_history(&upper, s->c->id, s->journal_seq);
    kf_iter_t *it;
    kf_status_t st = kf_ctx_iter_create(ctx, KF_CF_COORD_HISTORY, &lower, &upper, &it, err);
    if (st != KF_OK) {
        return st;
    }
    resp->journal = kf_arena_new(arena, KF_JOURNAL_ENTRIES_MAX * sizeof *resp->journal);
    for (kf_iter_seek_first(it); kf_iter_valid(it) && resp->n_journal < KF_JOURNAL_ENTRIES_MAX;
         kf_iter_next(it)) {
        size_t len;
        const void *v = kf_iter_value(it, &len);
        Keyflow__Records__JournalEntryRec *e =
            keyflow__records__journal_entry_rec__unpack(kf_arena_pb(arena), len, v);
        if (e == NULL) {
            char hex[2 * KF_COORD_ID_BYTES + 1];
            kf_hex_encode(s->c->id, KF_COORD_ID_BYTES, hex);
            kf_log(KF_LOG_ERROR, "coord",
                   "coord_history %s: journal entry %zu of %zu bytes does not decode", hex,
                   resp->n_journal, len);
            kf_iter_destroy(it);
            return kf_error_set(err, KF_E_CORRUPT,
                                "coord_history %s: journal entry %zu of %zu bytes does not decode",
                                hex, resp->n_journal, len);
        }
        Keyflow__V1__JournalRecord *jr = kf_arena_new(arena, sizeof *jr);
        keyflow__v1__journal_record__init(jr);
        jr->seq = (int64_t)e->seq;
        jr->at_ms = e->at_ms;
        jr->what = (char *)entry_name(e->entry_case);
        if (e->entry_case == KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_ACCEPTED) {
            jr->run_id = run_id_in(arena, s->key, e->accepted->run_uuid);
            jr->event_id = e->accepted->event_id;
            const Keyflow__Records__EventAcceptedRec *a = e->accepted;
            jr->detail = kf_arena_printf(arena, "%sdue_ms=%lld commit_seq=%lld",
                                         a->opened     ? "opened "
                                         : a->absorbed ? "absorbed "
                                         : a->next_run ? "next_run "
                                                       : "",
                                         (long long)a->due_ms, (long long)a->commit_seq);
        } else if (e->entry_case == KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_STARTED) {
            jr->run_id = run_id_in(arena, s->key, e->started->run_uuid);
            jr->detail = kf_arena_printf(arena, "reason=%s", e->started->reason);
        } else if (e->entry_case == KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_CANCELLED) {
            jr->run_id = run_id_in(arena, s->key, e->cancelled->run_uuid);
            jr->detail = kf_arena_printf(arena, "events=%lld", (long long)e->cancelled->events);
        } else if (e->entry_case == KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_CLOSED) {
            jr->run_id = run_id_in(arena, s->key, e->closed->run_uuid);
            jr->detail = kf_arena_printf(arena, "reason=%s events_absorbed=%lld", e->closed->reason,
                                         (long long)e->closed->events_absorbed);
        }
        resp->journal[resp->n_journal++] = jr;
    }
    st = kf_iter_status(it, err);
    kf_iter_destroy(it);
    return st;
}

/* Recent runs and live remembered IDs, oldest first. */
static kf_status_t describe_items(kf_coords_t *cs, kf_ctx_t *ctx, const state_t *s,
                                  Keyflow__V1__DescribeCoordinatorResponse *resp, kf_arena_t *arena,
                                  kf_error_t *err) {
    kf_key_t lower, upper;
    kf_iter_t *it;
    kf_key_coord_item(&lower, s->c->id, KF_COORD_ITEM_RECENT);
    kf_key_coord_item(&upper, s->c->id, KF_COORD_ITEM_RECENT + 1);
    kf_status_t st = kf_ctx_iter_create(ctx, KF_CF_COORD_ITEMS, &lower, &upper, &it, err);
    if (st != KF_OK) {
        return st;
    }
    resp->recent_run_ids = kf_arena_new(arena, (KF_RECENT_RUNS_MAX + 1) * sizeof(char *));
    for (kf_iter_seek_first(it); kf_iter_valid(it) && resp->n_recent_run_ids < KF_RECENT_RUNS_MAX;
         kf_iter_next(it)) {
        size_t len;
        const char *v = kf_iter_value(it, &len);
        char uuid[KF_UUID_TEXT_BYTES + 1];
        if (len != KF_UUID_TEXT_BYTES) {
            st = corrupt_state(s->c, "malformed recent run", err);
            break;
        }
        memcpy(uuid, v, len);
        uuid[len] = '\0';
        resp->recent_run_ids[resp->n_recent_run_ids++] = run_id_in(arena, s->key, uuid);
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    if (st != KF_OK) {
        return st;
    }
    kf_key_coord_item_seq(&lower, s->c->id, KF_COORD_ITEM_ID, s->ids_first);
    kf_key_coord_item_seq(&upper, s->c->id, KF_COORD_ITEM_ID, s->ids_next);
    if ((st = kf_ctx_iter_create(ctx, KF_CF_COORD_ITEMS, &lower, &upper, &it, err)) != KF_OK) {
        return st;
    }
    resp->remembered_ids = kf_arena_new(arena, (s->ids_count + 1) * sizeof *resp->remembered_ids);
    for (kf_iter_seek_first(it); kf_iter_valid(it) && st == KF_OK; kf_iter_next(it)) {
        size_t kl, vl;
        const uint8_t *k = kf_iter_key(it, &kl);
        const void *v = kf_iter_value(it, &vl);
        remembered_t r;
        st = id_decode(s->c, v, vl, &cs->scratch, kf_get_be64(k + kl - 8), &r, err);
        if (st != KF_OK || r.expires_ms <= ctx->now_ms) {
            continue; /* expired: no longer deduplicates */
        }
        if (resp->n_remembered_ids == s->ids_count) {
            st = corrupt_state(s->c, "more remembered IDs than counted", err);
            break;
        }
        Keyflow__V1__RememberedId *ri = kf_arena_new(arena, sizeof *ri);
        keyflow__v1__remembered_id__init(ri);
        ri->id = kf_arena_strdup(arena, r.id);
        ri->receipt = kf_arena_new(arena, sizeof *ri->receipt);
        keyflow__v1__receipt__init(ri->receipt);
        ri->receipt->run_id = run_id_in(arena, s->key, r.run_uuid);
        ri->receipt->due_ms = r.due_ms;
        ri->receipt->commit_seq = r.commit_seq;
        ri->expires_ms = r.expires_ms;
        resp->remembered_ids[resp->n_remembered_ids++] = ri;
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    return st;
}

void kf_coords_describe(kf_coords_t *cs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__DescribeCoordinatorRequest *req =
        (const Keyflow__V1__DescribeCoordinatorRequest *)cmd->request;
    kf_key_t ident;
    if (ref_key(req->coordinator, "coordinator", &ident, &cmd->error) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    kf_arena_t *arena = cmd->arena;
    Keyflow__V1__DescribeCoordinatorResponse *resp = kf_arena_new(arena, sizeof *resp);
    keyflow__v1__describe_coordinator_response__init(resp);
    Keyflow__V1__CoordinatorRef *ref = kf_arena_new(arena, sizeof *ref);
    keyflow__v1__coordinator_ref__init(ref);
    ref->kind = req->coordinator->kind;
    ref->workflow = req->coordinator->workflow;
    ref->key = req->coordinator->key;
    resp->coordinator = ref;
    kf_arena_reset(&cs->scratch);
    state_t s;
    uint8_t id[KF_COORD_ID_BYTES];
    if (coord_open(cs, ctx, &ident, id, &s, &cmd->error) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (s.c != NULL) {
        resp->exists = true;
        if (s.open) {
            const window_t *w = &s.w;
            Keyflow__V1__Window *pw = kf_arena_new(arena, sizeof *pw);
            keyflow__v1__window__init(pw);
            pw->run_id = run_id_in(arena, s.key, w->run_uuid);
            pw->event_count = w->event_count;
            pw->opened_ms = w->opened_ms;
            pw->last_ms = w->last_ms;
            pw->due_ms = w->due_ms;
            pw->input_bytes = (int64_t)w->input_len + (s.kind == KF_RULE_BATCH ? 1 : 0);
            pw->rule = rule_out(arena, &w->rule);
            pw->run_started = w->run_started;
            pw->events_absorbed = w->events_absorbed;
            resp->window = pw;
        }
        resp->runs_started = s.runs_started;
        if (describe_items(cs, ctx, &s, resp, arena, &cmd->error) != KF_OK) {
            state_done(&s);
            kf_ctx_fail(ctx, cmd);
            return;
        }
        resp->journal_length = s.journal_len;
        resp->journal_seq = (int64_t)s.journal_seq;
        resp->compactions = s.compactions;
        if (describe_journal(ctx, &s, resp, arena, &cmd->error) != KF_OK) {
            state_done(&s);
            kf_ctx_fail(ctx, cmd);
            return;
        }
    }
    state_done(&s);
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

void kf_coords_flush(kf_coords_t *cs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__FlushWindowRequest *req =
        (const Keyflow__V1__FlushWindowRequest *)cmd->request;
    kf_key_t ident;
    if (ref_key(req->coordinator, "coordinator", &ident, &cmd->error) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    Keyflow__V1__FlushWindowResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__flush_window_response__init(resp);
    resp->disposition = KEYFLOW__V1__DISPOSITION__DISPOSITION_NO_WINDOW;
    kf_arena_reset(&cs->scratch);
    state_t s;
    uint8_t id[KF_COORD_ID_BYTES];
    if (coord_open(cs, ctx, &ident, id, &s, &cmd->error) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (s.c != NULL && s.open) {
        if (end_blocked(cs, &s)) {
            state_done(&s);
            kf_error_set(&cmd->error, KF_E_LIMIT,
                         "runs: %d pending or leased runs (KF_LIVE_RUNS_MAX)", KF_LIVE_RUNS_MAX);
            kf_ctx_fail(ctx, cmd);
            return;
        }
        if (end_waits_for_disk(ctx, &s)) {
            /* Its run would copy its input where the disk has no room above
             * its reserve: refused like a new event. A client that filled
             * the disk to the reserve with windows could otherwise flush
             * them until the disk is full, and again after every restart.
             * CancelWindow still drops it. */
            kf_error_set(&cmd->error, KF_E_NO_SPACE,
                         "disk reserve reached: closing this window copies its %lld bytes of "
                         "input into a run, and the disk has no room for them above "
                         "--disk-reserve; flush it once space is freed, or cancel it",
                         (long long)s.w.input_len);
            state_done(&s);
            kf_counter_add(KF_C_REJECTED_DISK_RESERVE, 1);
            kf_ctx_fail(ctx, cmd);
            return;
        }
        if (!s.w.run_started && events_load(ctx, &s, &cmd->error) != KF_OK) {
            kf_ctx_fail(ctx, cmd);
            return;
        }
        /* A window whose run started at its leading edge just ends. */
        resp->run_id = run_id_in(cmd->arena, s.key, s.w.run_uuid);
        end_window(cs, ctx, &s, "flush");
        resp->flushed = true;
        resp->disposition = KEYFLOW__V1__DISPOSITION__DISPOSITION_CLOSED;
        coord_settle(cs, ctx, &s);
    }
    state_done(&s);
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

void kf_coords_cancel(kf_coords_t *cs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__CancelWindowRequest *req =
        (const Keyflow__V1__CancelWindowRequest *)cmd->request;
    kf_key_t ident;
    if (ref_key(req->coordinator, "coordinator", &ident, &cmd->error) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    Keyflow__V1__CancelWindowResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__cancel_window_response__init(resp);
    resp->disposition = KEYFLOW__V1__DISPOSITION__DISPOSITION_NO_WINDOW;
    kf_arena_reset(&cs->scratch);
    state_t s;
    uint8_t id[KF_COORD_ID_BYTES];
    if (coord_open(cs, ctx, &ident, id, &s, &cmd->error) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (s.c != NULL && s.open) {
        if (s.w.run_started) {
            /* Its run started at the leading edge: no run to drop, the
             * window (and its absorbing) just ends. */
            end_window(cs, ctx, &s, "cancel");
        } else {
            resp->run_id = run_id_in(cmd->arena, s.key, s.w.run_uuid);
            resp->events_dropped = s.w.event_count;
            Keyflow__Records__WindowCancelledRec can = KEYFLOW__RECORDS__WINDOW_CANCELLED_REC__INIT;
            can.run_uuid = s.w.run_uuid;
            can.events = s.w.event_count;
            Keyflow__Records__JournalEntryRec e = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__INIT;
            e.entry_case = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_CANCELLED;
            e.cancelled = &can;
            history_append(ctx, &s, &e);
            window_end_run(ctx, &s);
            window_close(&s);
            kf_runs_window_dropped(cs->runs, ctx, resp->run_id);
        }
        resp->cancelled = true;
        resp->disposition = KEYFLOW__V1__DISPOSITION__DISPOSITION_CANCELLED;
        coord_settle(cs, ctx, &s);
    }
    state_done(&s);
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

void kf_coords_fire(kf_coords_t *cs, kf_ctx_t *ctx, kf_timer_t *timer) {
    coord_t *c = KF_CONTAINER_OF(timer, coord_t, timer);
    if (c->open && !kf_ctx_disk_room_left(ctx)) {
        /* Its window may copy its input into a run: look again shortly,
         * without reading it (many may wait) nor moving its stored wake-up
         * (that is a write; a restart finds it due and waits the same). */
        kf_heap_arm(&ctx->heap, &c->timer, ctx->now_ms + KF_DISK_WAIT_RETRY_MS);
        return;
    }
    kf_arena_reset(&cs->scratch);
    state_t s;
    kf_error_t err;
    kf_status_t st = state_load(cs, ctx, c, &cs->scratch, NULL, &s, &err);
    if (st == KF_OK && s.open && s.w.due_ms <= ctx->now_ms) {
        if (end_blocked(cs, &s)) {
            /* No room for another live run: keep the window open and look
             * again shortly; SendEvent meanwhile refuses new events. */
            wakeup_move(cs, ctx, c, ctx->now_ms + 1000, true);
            state_done(&s);
            return;
        }
        if (!s.w.run_started) {
            st = events_load(ctx, &s, &err);
        }
        if (st == KF_OK) {
            end_window(cs, ctx, &s, "due");
        }
    }
    if (st != KF_OK) {
        /* Nothing changed; the store will answer or fail-stop the engine
         * on its next write. */
        kf_log_kv(KF_LOG_ERROR, "coord", "cannot read a coordinator whose timer fired",
                  KF_LOG_STR("error", err.message));
        kf_heap_arm(&ctx->heap, &c->timer, ctx->now_ms + 1000);
        return;
    }
    coord_settle(cs, ctx, &s);
    state_done(&s);
}

/* ---- recovery ---------------------------------------------------------------------- */

/* The meta record holding the id key (invariant 1). */
static const char id_key_name[] = "coord_id_key";

/* Reads the store's id key, or makes one (written at once: everything
 * stored under an id depends on it). */
static kf_status_t load_id_key(kf_coords_t *cs, kf_ctx_t *ctx, kf_error_t *err) {
    kf_value_t v;
    bool found;
    kf_status_t st =
        kf_store_get(ctx->store, KF_CF_META, id_key_name, sizeof id_key_name - 1, &v, &found, err);
    if (st != KF_OK) {
        return st;
    }
    if (found) {
        if (v.len != sizeof cs->id_key.k) {
            kf_store_value_free(&v);
            return kf_error_set(err, KF_E_CORRUPT, "meta: %s of %zu bytes", id_key_name, v.len);
        }
        memcpy(cs->id_key.k, v.data, v.len);
        kf_store_value_free(&v);
        return KF_OK;
    }
    kf_rng_bytes(ctx->rng, cs->id_key.k, sizeof cs->id_key.k);
    kf_batch_t *b = kf_batch_create(ctx->store);
    if (b == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate a write batch");
    }
    kf_batch_put(b, KF_CF_META, id_key_name, sizeof id_key_name - 1, cs->id_key.k,
                 sizeof cs->id_key.k);
    st = kf_store_write(ctx->store, b, err);
    kf_batch_destroy(b);
    return st;
}

/* Rebuilds memory and the heap from coord_index alone (invariant 5).
 * This is most of a restart's work with many open windows, so it costs one
 * pass over the index into one array, then one map sized for all of them
 * and one O(n) heap build, rather than a malloc, a map lookup, a map insert
 * and a heap insertion per coordinator. */
static kf_status_t recover_index(kf_coords_t *cs, kf_ctx_t *ctx, kf_error_t *err) {
    KF_ASSERT(cs->slab == NULL && cs->map.count == 0);
    kf_iter_t *it;
    kf_status_t st = kf_iter_create(ctx->store, KF_CF_COORD_INDEX, NULL, 0, NULL, 0, &it, err);
    if (st != KF_OK) {
        return st;
    }
    coord_t *slab = NULL;
    size_t n = 0, cap = 0;
    for (kf_iter_seek_first(it); kf_iter_valid(it); kf_iter_next(it)) {
        size_t kl, vl;
        const uint8_t *k = kf_iter_key(it, &kl);
        const uint8_t *v = kf_iter_value(it, &vl);
        if (kl != KF_COORD_ID_BYTES || vl != 9 || v[8] > 1) {
            st = kf_error_set(err, KF_E_CORRUPT, "coord_index: malformed record");
            break;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            slab = kf_xreallocarray(slab, cap, sizeof *slab);
        }
        coord_t *c = &slab[n++];
        memset(c, 0, sizeof *c);
        memcpy(c->id, k, KF_COORD_ID_BYTES);
        kf_timer_init(&c->timer, KF_TIMER_COORDINATOR);
        c->wakeup_ms = kf_i64_from_ordered(kf_get_be64(v));
        c->open = v[8] == 1;
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    if (st != KF_OK || n == 0) {
        free(slab);
        return st;
    }
    KF_ASSERT(n <= UINT32_MAX);
    cs->slab = kf_xreallocarray(slab, n, sizeof *slab); /* give back the doubling's slack */
    cs->slab_count = n;
    kf_map_reserve(&cs->map, n);
    kf_heap_reserve(&ctx->heap, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        coord_t *c = &cs->slab[i];
        /* The index's keys are distinct, so no lookup first; a duplicate
         * would be corruption all the same. */
        if (!kf_map_try_insert(&cs->map, &c->node, c->id, KF_COORD_ID_BYTES)) {
            st = kf_error_set(err, KF_E_CORRUPT, "coord_index: duplicate coordinator");
            break;
        }
        cs->open_windows += c->open;
        kf_heap_arm_unordered(&ctx->heap, &c->timer, c->wakeup_ms);
    }
    kf_heap_reorder(&ctx->heap);
    return st;
}

kf_status_t kf_coords_recover(kf_coords_t *cs, kf_ctx_t *ctx, kf_error_t *err) {
    cs->ctx = ctx;
    kf_status_t st = load_id_key(cs, ctx, err);
    if (st == KF_OK) {
        st = kf__coords_upgrade(&cs->id_key, ctx, err);
    }
    if (st == KF_OK) {
        st = recover_index(cs, ctx, err);
    }
    publish_gauges(cs);
    return st;
}

/* ---- lifecycle --------------------------------------------------------------------- */

/* The runs' seam for GetRun of a receipt's run ID (runs.h): the open
 * window of run_id, whose strings live in cs->lookup until the next call. */
static bool window_lookup(void *owner, const char *run_id, kf_open_window_t *out) {
    kf_coords_t *cs = owner;
    kf_ctx_t *ctx = cs->ctx;
    if (ctx == NULL) {
        return false;
    }
    kf_key_t k;
    size_t len = strlen(run_id);
    if (len == 0 || len > KF_RUN_ID_BYTES_MAX) {
        return false;
    }
    kf_key_reset(&k);
    kf_key_raw(&k, run_id, len);
    kf_value_t v;
    bool found;
    kf_error_t err;
    if (kf_ctx_get(ctx, KF_CF_COORD_WINDOWS, &k, &v, &found, &err) != KF_OK || !found) {
        return false;
    }
    coord_t *c = v.len == KF_COORD_ID_BYTES ? coord_find(cs, v.data) : NULL;
    kf_store_value_free(&v);
    if (c == NULL) {
        return false;
    }
    kf_arena_reset(&cs->lookup);
    state_t s;
    if (state_load(cs, ctx, c, &cs->lookup, NULL, &s, &err) != KF_OK) {
        kf_log_kv(KF_LOG_ERROR, "coord", "cannot read the window of a run",
                  KF_LOG_STR("run_id", run_id), KF_LOG_STR("error", err.message));
        return false;
    }
    bool open = s.open && !s.w.run_started &&
                strcmp(run_id_in(&cs->lookup, s.key, s.w.run_uuid), run_id) == 0;
    if (open) {
        *out = (kf_open_window_t){
            .workflow = s.workflow,
            .key = s.key,
            .kind = (int)s.kind,
            .opened_ms = s.w.opened_ms,
            .last_ms = s.w.last_ms,
            .due_ms = s.w.due_ms,
            .event_count = s.w.event_count,
        };
    }
    state_done(&s);
    return open;
}

kf_coords_t *kf_coords_create(kf_runs_t *runs) {
    kf_coords_t *cs = kf_xcalloc(1, sizeof *cs);
    kf_map_init(&cs->map);
    kf_arena_init(&cs->scratch, 0);
    kf_arena_init(&cs->lookup, 0);
    cs->runs = runs;
    kf_runs_set_window_lookup(runs, window_lookup, cs);
    return cs;
}

void kf_coords_destroy(kf_coords_t *cs) {
    if (cs == NULL) {
        return;
    }
    size_t b;
    kf_map_node_t *n = kf_map_first(&cs->map, &b);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&cs->map, &b, n);
        coord_t *c = KF_CONTAINER_OF(n, coord_t, node);
        if (!in_slab(cs, c)) {
            free(c);
        }
        n = next;
    }
    free(cs->slab);
    kf_map_deinit(&cs->map);
    kf_arena_deinit(&cs->scratch);
    kf_arena_deinit(&cs->lookup);
    free(cs);
}

uint64_t kf_coords_count(const kf_coords_t *cs) {
    return cs->map.count;
}
uint64_t kf_coords_open_windows(const kf_coords_t *cs) {
    return cs->open_windows;
}
