/*
 * coord.c - the coordinator table: update-with-start, windows, dedup,
 * journal, snapshots and recovery. See coord.h for the state machine.
 *
 * Every change goes through append_entry(): encode a journal entry, put it
 * in the step's batch, then apply it with the same apply_* function that
 * replay uses. Decisions that need randomness or the clock (the window's
 * UUID, the event time) are made before the entry is built and recorded in
 * it, so replay is deterministic.
 */
#include "coord/coord.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/partition.h"
#include "base/json.h"
#include "base/log.h"
#include "base/map.h"
#include "base/metrics.h"
#include "base/text.h"
#include "coord/window.h"
#include "records/records.pb-c.h"

typedef struct remembered {
    char *id; /* owned */
    char run_uuid[KF_UUID_TEXT_BYTES + 1];
    bool digest_known; /* false: remembered by an older build (no digest) */
    uint8_t digest[KF_EVENT_DIGEST_BYTES];
    int64_t due_ms;
    int64_t expires_ms;
    int64_t commit_seq; /* 0: unknown (older build) */
} remembered_t;

/* What a remembered ID answers a retry with. */
typedef struct remembered_spec {
    const char *id;
    const char *run_uuid;
    const uint8_t *digest; /* KF_EVENT_DIGEST_BYTES, or NULL: unknown */
    int64_t due_ms;
    int64_t expires_ms;
    int64_t commit_seq;
} remembered_spec_t;

typedef struct coord {
    kf_map_node_t node; /* keyed by ckey */
    uint8_t *ckey;      /* storage key (keys.h), owned */
    size_t ckey_len;
    kf_rule_kind_t kind;
    char *workflow; /* owned, NUL-terminated */
    char *key;      /* owned, NUL-terminated */
    kf_timer_t timer;
    int64_t wakeup_due_ms; /* the stored wake-up, or KF_NO_WAKEUP */
    uint64_t journal_seq;  /* seq of the next entry */
    uint32_t journal_len;  /* entries since the last snapshot */
    int64_t runs_started;
    int64_t compactions;
    char recent[KF_RECENT_RUNS_MAX][KF_UUID_TEXT_BYTES + 1]; /* oldest first */
    uint32_t recent_count;
    /* The open window. */
    bool open;
    bool run_started;          /* run_uuid's run started at the leading edge */
    bool indexed;              /* run_uuid is in kf_coords.windows (its run collects) */
    kf_map_node_t window_node; /* there, by run_uuid */
    struct coord *window_next; /* another one indexed under the same uuid */
    char run_uuid[KF_UUID_TEXT_BYTES + 1];
    int64_t opened_ms;
    int64_t last_ms;
    int64_t due_ms;
    kf_rule_t rule; /* the latest event's rule */
    char *input;    /* debounce: latest input; batch: "[a,b" */
    size_t input_len;
    size_t input_cap;
    int64_t event_count;      /* events in run_uuid's run */
    int64_t events_absorbed;  /* events covered by a run started at the leading edge */
    kf_event_ids_t event_ids; /* of the events in run_uuid's run */
    /* Remembered event IDs, a ring buffer, oldest first. */
    remembered_t *ids;
    uint32_t ids_head;
    uint32_t ids_count;
    uint32_t ids_cap;
} coord_t;

struct kf_coords {
    kf_map_t map;
    kf_map_t windows; /* open windows by run uuid (GetRun of a receipt's run) */
    kf_runs_t *runs;
    uint64_t open_windows;
    int64_t window_bytes; /* input buffer bytes of open windows */
    uint64_t id_slots;    /* remembered ID ring slots, over every coordinator */
    uint64_t remembered;  /* remembered IDs, over every coordinator */
};

/* Estimated bytes (engine/ctx.h, kf_memory_t; docs/semantics.md, "Memory
 * budget"), each allocation with malloc's 16-byte header: a coordinator is
 * its struct, three strings (its storage key, workflow and key: taken as
 * 64 bytes each) and its map slot; an open window adds its index entry and
 * event ID list (its input buffer counts as allocated: window_bytes); a
 * remembered ID is a ring slot and its string (taken as 48 bytes). */
#define COORD_BYTES         (sizeof(coord_t) + 16 + 3 * 64 + 2 * sizeof(void *))
#define WINDOW_BYTES        128
#define REMEMBERED_ID_BYTES 48

uint64_t kf_coords_memory_bytes(const kf_coords_t *cs) {
    return cs->map.count * COORD_BYTES + cs->open_windows * WINDOW_BYTES +
           (uint64_t)cs->window_bytes + cs->id_slots * sizeof(remembered_t) +
           cs->remembered * REMEMBERED_ID_BYTES;
}

static void publish_gauges(const kf_coords_t *cs) {
    kf_gauge_set(KF_G_COORDINATORS, (int64_t)cs->map.count);
    kf_gauge_set(KF_G_OPEN_WINDOWS, (int64_t)cs->open_windows);
}

/* ---- coordinator objects ----------------------------------------------- */

static coord_t *coord_find(const kf_coords_t *cs, const kf_key_t *ckey) {
    kf_map_node_t *n = kf_map_get(&cs->map, ckey->bytes, ckey->len);
    return n ? KF_CONTAINER_OF(n, coord_t, node) : NULL;
}

static coord_t *coord_new(kf_coords_t *cs, const kf_key_t *ckey) {
    kf_key_reader_t r = kf_key_reader(ckey->bytes, ckey->len);
    uint8_t kind;
    const char *wf, *key;
    size_t wf_len, key_len;
    bool ok = kf_key_read_u8(&r, &kind) && kf_key_read_lp(&r, &wf, &wf_len) &&
              kf_key_read_lp(&r, &key, &key_len) && r.left == 0;
    KF_ASSERT(ok); /* callers validated or decoded the key */
    coord_t *c = kf_xcalloc(1, sizeof *c);
    c->ckey = kf_xmemdup(ckey->bytes, ckey->len);
    c->ckey_len = ckey->len;
    c->kind = (kf_rule_kind_t)kind;
    c->workflow = kf_xstrndup(wf, wf_len);
    c->key = kf_xstrndup(key, key_len);
    kf_timer_init(&c->timer, KF_TIMER_COORDINATOR);
    c->wakeup_due_ms = KF_NO_WAKEUP;
    kf_map_insert(&cs->map, &c->node, c->ckey, c->ckey_len);
    publish_gauges(cs);
    return c;
}

/* GetRun of a receipt's run ID finds the window while its run collects
 * events (it does not exist yet): the index holds c->run_uuid exactly while
 * the window is open and its run has not started. Run IDs are unique per
 * key, not uuids across keys (a seeded random source repeats them after a
 * simulated crash), so coordinators with one uuid share a map entry: the
 * first is in the map, the others chain behind it. */
static coord_t *index_head(const kf_coords_t *cs, const char *uuid) {
    kf_map_node_t *n = kf_map_get(&cs->windows, uuid, KF_UUID_TEXT_BYTES);
    return n ? KF_CONTAINER_OF(n, coord_t, window_node) : NULL;
}

static void window_index(kf_coords_t *cs, coord_t *c, bool collecting) {
    if (c->indexed) {
        coord_t *head = index_head(cs, c->run_uuid);
        if (head == c) {
            kf_map_remove(&cs->windows, &c->window_node);
            if (c->window_next != NULL) {
                kf_map_insert(&cs->windows, &c->window_next->window_node, c->window_next->run_uuid,
                              KF_UUID_TEXT_BYTES);
            }
        } else {
            coord_t *p = head;
            while (p->window_next != c) {
                p = p->window_next;
            }
            p->window_next = c->window_next;
        }
        c->window_next = NULL;
        c->indexed = false;
    }
    if (collecting) {
        coord_t *head = index_head(cs, c->run_uuid);
        if (head == NULL) {
            kf_map_insert(&cs->windows, &c->window_node, c->run_uuid, KF_UUID_TEXT_BYTES);
        } else {
            c->window_next = head->window_next;
            head->window_next = c;
        }
        c->indexed = true;
    }
}

/* Frees the window's input buffer (its run took the input). */
static void input_release(kf_coords_t *cs, coord_t *c) {
    cs->window_bytes -= (int64_t)c->input_cap;
    free(c->input);
    c->input = NULL;
    c->input_len = c->input_cap = 0;
}

static void window_drop(kf_coords_t *cs, coord_t *c) {
    if (c->open) {
        cs->open_windows--;
    }
    window_index(cs, c, false);
    kf_event_ids_clear(&c->event_ids);
    input_release(cs, c);
    c->open = false;
    c->run_started = false;
    c->event_count = 0;
    c->events_absorbed = 0;
}

static void coord_free(kf_coords_t *cs, coord_t *c) {
    window_drop(cs, c);
    for (uint32_t i = 0; i < c->ids_count; i++) {
        free(c->ids[(c->ids_head + i) % c->ids_cap].id);
    }
    cs->remembered -= c->ids_count;
    cs->id_slots -= c->ids_cap;
    free(c->ids);
    free(c->ckey);
    free(c->workflow);
    free(c->key);
    free(c);
}

static void input_reserve(kf_coords_t *cs, coord_t *c, size_t need) {
    if (need <= c->input_cap) {
        return;
    }
    size_t cap = c->input_cap ? c->input_cap : 64;
    while (cap < need) {
        cap *= 2;
    }
    char *p = kf_xrealloc(c->input, cap);
    cs->window_bytes += (int64_t)(cap - c->input_cap);
    c->input = p;
    c->input_cap = cap;
}

static remembered_t *id_at(coord_t *c, uint32_t i) {
    return &c->ids[(c->ids_head + i) % c->ids_cap];
}

/* The live remembered entry for `id` at now_ms, or NULL. */
static remembered_t *id_find(coord_t *c, const char *id, int64_t now_ms) {
    for (uint32_t i = 0; i < c->ids_count; i++) {
        remembered_t *r = id_at(c, i);
        if (r->expires_ms > now_ms && strcmp(r->id, id) == 0) {
            return r;
        }
    }
    return NULL;
}

static void id_pop_oldest(kf_coords_t *cs, coord_t *c) {
    KF_ASSERT(c->ids_count > 0);
    free(c->ids[c->ids_head].id);
    c->ids_head = (c->ids_head + 1) % c->ids_cap;
    c->ids_count--;
    cs->remembered--;
}

/* Drops IDs expired at at_ms, keeping order. Runs inside apply functions
 * only (with the entry's time), so live and replay agree. */
static void ids_prune(kf_coords_t *cs, coord_t *c, int64_t at_ms) {
    uint32_t kept = 0;
    for (uint32_t i = 0; i < c->ids_count; i++) {
        remembered_t *r = id_at(c, i);
        if (r->expires_ms > at_ms) {
            *id_at(c, kept++) = *r;
        } else {
            free(r->id);
        }
    }
    cs->remembered -= c->ids_count - kept;
    c->ids_count = kept;
}

static void id_push(kf_coords_t *cs, coord_t *c, const remembered_spec_t *spec) {
    if (c->ids_count == KF_REMEMBERED_IDS_MAX) {
        id_pop_oldest(cs, c); /* DESIGN.md: at most 1024 per key, oldest forgotten first */
    }
    if (c->ids_count == c->ids_cap) {
        uint32_t cap = c->ids_cap ? c->ids_cap * 2 : 4;
        if (cap > KF_REMEMBERED_IDS_MAX) {
            cap = KF_REMEMBERED_IDS_MAX;
        }
        remembered_t *ids = kf_xcalloc(cap, sizeof *ids);
        for (uint32_t i = 0; i < c->ids_count; i++) {
            ids[i] = *id_at(c, i);
        }
        free(c->ids);
        cs->id_slots += cap - c->ids_cap;
        c->ids = ids;
        c->ids_head = 0;
        c->ids_cap = cap;
    }
    remembered_t *r = &c->ids[(c->ids_head + c->ids_count) % c->ids_cap];
    r->id = kf_xstrdup(spec->id);
    memcpy(r->run_uuid, spec->run_uuid, KF_UUID_TEXT_BYTES + 1);
    r->digest_known = spec->digest != NULL;
    if (spec->digest != NULL) {
        memcpy(r->digest, spec->digest, KF_EVENT_DIGEST_BYTES);
    }
    r->due_ms = spec->due_ms;
    r->expires_ms = spec->expires_ms;
    r->commit_seq = spec->commit_seq;
    c->ids_count++;
    cs->remembered++;
}

static int64_t ids_last_expiry(coord_t *c) {
    int64_t last = INT64_MIN;
    for (uint32_t i = 0; i < c->ids_count; i++) {
        if (id_at(c, i)->expires_ms > last) {
            last = id_at(c, i)->expires_ms;
        }
    }
    return last;
}

static void recent_push(coord_t *c, const char *uuid) {
    if (c->recent_count == KF_RECENT_RUNS_MAX) {
        memmove(c->recent[0], c->recent[1], (KF_RECENT_RUNS_MAX - 1) * sizeof c->recent[0]);
        c->recent_count--;
    }
    memcpy(c->recent[c->recent_count++], uuid, KF_UUID_TEXT_BYTES + 1);
}

/* ---- rules <-> records ------------------------------------------------- */

/* `retry` is storage the record may point at while it is encoded. */
static void rule_to_rec(const kf_rule_t *rule, Keyflow__Records__RuleRec *rec,
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

/* A stored rule must be one kf_rule_resolve could have produced (the same
 * ranges): anything else was not written by this engine. */
static bool rule_from_rec(const Keyflow__Records__RuleRec *rec, kf_rule_t *rule) {
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

/* ---- apply: the one place state changes (live and replay) --------------- */

static bool window_runs(const coord_t *c, const char *run_uuid) {
    return c->open && uuid_ok(run_uuid) && strcmp(c->run_uuid, run_uuid) == 0;
}

/* Opens the window, or moves an open window whose run started to its next
 * run (the bookkeeping both share). */
static void window_begin_run(kf_coords_t *cs, coord_t *c, const char *run_uuid,
                             const kf_rule_t *rule) {
    memcpy(c->run_uuid, run_uuid, KF_UUID_TEXT_BYTES + 1);
    window_index(cs, c, true);
    kf_event_ids_clear(&c->event_ids);
    c->run_started = false;
    c->event_count = 0;
    c->input_len = 0;
    if (rule->kind == KF_RULE_BATCH) {
        input_reserve(cs, c, 1);
        c->input[c->input_len++] = '[';
    }
}

static kf_status_t apply_accepted(kf_coords_t *cs, coord_t *c, int64_t at_ms,
                                  const Keyflow__Records__EventAcceptedRec *e, kf_error_t *err) {
    kf_rule_t rule;
    if (!rule_from_rec(e->rule, &rule) || !uuid_ok(e->run_uuid) || rule.kind != c->kind ||
        strlen(e->event_id) > KF_EVENT_ID_BYTES_MAX ||
        strlen(e->input_json) > KF_EVENT_INPUT_BYTES_MAX ||
        (e->digest.len != 0 && e->digest.len != KF_EVENT_DIGEST_BYTES) ||
        (int)e->opened + (int)e->absorbed + (int)e->next_run > 1) {
        return kf_error_set(err, KF_E_CORRUPT, "journal: malformed event_accepted entry");
    }
    if (e->opened) {
        if (c->open) {
            return kf_error_set(err, KF_E_CORRUPT, "journal: window opened twice");
        }
        c->open = true;
        cs->open_windows++;
        c->opened_ms = at_ms;
        c->events_absorbed = 0;
        window_begin_run(cs, c, e->run_uuid, &rule);
    } else if (e->next_run) {
        if (!c->open || !c->run_started || rule.kind != KF_RULE_DEBOUNCE) {
            return kf_error_set(err, KF_E_CORRUPT,
                                "journal: a next run in a window whose run has not started");
        }
        window_begin_run(cs, c, e->run_uuid, &rule);
    } else if (!window_runs(c, e->run_uuid) || e->absorbed != c->run_started) {
        return kf_error_set(err, KF_E_CORRUPT, "journal: event joined a window that is not open");
    }
    if (rule.kind == KF_RULE_BATCH &&
        c->input_len + 1 + strlen(e->input_json) + 1 > KF_WINDOW_INPUT_BYTES_MAX) {
        /* The live path closes a batch window before an event would take it
         * past this (send_one, the same sum against the rule's max_bytes). */
        return kf_error_set(err, KF_E_CORRUPT, "journal: a batch window larger than %d bytes",
                            KF_WINDOW_INPUT_BYTES_MAX);
    }
    if (e->absorbed) {
        c->events_absorbed++;
    } else {
        const char *in = e->input_json[0] ? e->input_json : "null";
        size_t in_len = strlen(in);
        if (rule.kind == KF_RULE_DEBOUNCE) {
            input_reserve(cs, c, in_len);
            memcpy(c->input, in, in_len);
            c->input_len = in_len;
        } else {
            input_reserve(cs, c, c->input_len + 1 + in_len + 1);
            if (c->event_count > 0) {
                c->input[c->input_len++] = ',';
            }
            memcpy(c->input + c->input_len, in, in_len);
            c->input_len += in_len;
        }
        c->event_count++;
    }
    c->last_ms = at_ms;
    c->rule = rule;
    c->due_ms = e->due_ms;
    if (e->event_id[0] != '\0' && !e->absorbed) {
        kf_event_ids_push(&c->event_ids, e->event_id); /* absorbed ones are in no run */
    }
    ids_prune(cs, c, at_ms);
    if (e->event_id[0] != '\0') {
        remembered_spec_t spec = {
            .id = e->event_id,
            .run_uuid = e->run_uuid,
            .digest = e->digest.len == KF_EVENT_DIGEST_BYTES ? e->digest.data : NULL,
            .due_ms = e->due_ms,
            .expires_ms = kf_dedup_expires_ms(&rule, at_ms),
            .commit_seq = e->commit_seq,
        };
        id_push(cs, c, &spec);
    }
    return KF_OK;
}

static kf_status_t apply_started(kf_coords_t *cs, coord_t *c,
                                 const Keyflow__Records__RunStartedRec *e, kf_error_t *err) {
    if (!window_runs(c, e->run_uuid) || c->run_started) {
        return kf_error_set(err, KF_E_CORRUPT,
                            "journal: run started for a window that is not open");
    }
    if (e->leading) {
        /* The window stays open to absorb events until its due time. */
        c->run_started = true;
        window_index(cs, c, false);
        kf_event_ids_clear(&c->event_ids);
        input_release(cs, c);
    } else {
        window_drop(cs, c);
    }
    c->runs_started++;
    recent_push(c, e->run_uuid);
    return KF_OK;
}

static kf_status_t apply_cancelled(kf_coords_t *cs, coord_t *c,
                                   const Keyflow__Records__WindowCancelledRec *e, kf_error_t *err) {
    if (!window_runs(c, e->run_uuid) || c->run_started) {
        return kf_error_set(err, KF_E_CORRUPT, "journal: cancelled a window that is not open");
    }
    window_drop(cs, c);
    return KF_OK;
}

static kf_status_t apply_closed(kf_coords_t *cs, coord_t *c,
                                const Keyflow__Records__WindowClosedRec *e, kf_error_t *err) {
    if (!window_runs(c, e->run_uuid) || !c->run_started) {
        return kf_error_set(err, KF_E_CORRUPT, "journal: closed a window without a started run");
    }
    window_drop(cs, c);
    return KF_OK;
}

static kf_status_t apply_entry(kf_coords_t *cs, coord_t *c,
                               const Keyflow__Records__JournalEntryRec *e, kf_error_t *err) {
    switch (e->entry_case) {
    case KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_ACCEPTED:
        return apply_accepted(cs, c, e->at_ms, e->accepted, err);
    case KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_STARTED:
        return apply_started(cs, c, e->started, err);
    case KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_CANCELLED:
        return apply_cancelled(cs, c, e->cancelled, err);
    case KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_CLOSED:
        return apply_closed(cs, c, e->closed, err);
    case KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY__NOT_SET:
    case _KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY__CASE_IS_INT_SIZE: break;
    }
    return kf_error_set(err, KF_E_CORRUPT, "journal: unknown entry kind %d", (int)e->entry_case);
}

/* Journals `e` (seq and time filled in here) and applies it. */
static void append_entry(kf_coords_t *cs, kf_ctx_t *ctx, coord_t *c,
                         Keyflow__Records__JournalEntryRec *e) {
    e->seq = c->journal_seq;
    e->at_ms = ctx->now_ms;
    kf_key_t ckey, jkey;
    kf_key_reset(&ckey);
    kf_key_raw(&ckey, c->ckey, c->ckey_len);
    kf_key_journal(&jkey, &ckey, e->seq);
    kf_ctx_put_msg(ctx, KF_CF_COORD_JOURNAL, &jkey, &e->base);
    kf_error_t err;
    kf_status_t st = apply_entry(cs, c, e, &err);
    KF_ASSERT(st == KF_OK); /* live entries are built valid; a failure is a bug */
    c->journal_seq++;
    c->journal_len++;
}

/* ---- snapshots --------------------------------------------------------- */

static void write_snapshot(kf_ctx_t *ctx, coord_t *c) {
    Keyflow__Records__CoordSnapshot snap = KEYFLOW__RECORDS__COORD_SNAPSHOT__INIT;
    Keyflow__Records__WindowRec win = KEYFLOW__RECORDS__WINDOW_REC__INIT;
    Keyflow__Records__RuleRec rule;
    Keyflow__Records__RetryRec retry;
    const char *event_ids[KF_RUN_EVENT_IDS_MAX];
    snap.journal_seq = c->journal_seq;
    snap.runs_started = c->runs_started;
    snap.compactions = c->compactions;
    char *input = NULL;
    if (c->open) {
        rule_to_rec(&c->rule, &rule, &retry);
        win.run_uuid = c->run_uuid;
        win.opened_ms = c->opened_ms;
        win.last_ms = c->last_ms;
        win.due_ms = c->due_ms;
        win.rule = &rule;
        input = c->input_len > 0 ? kf_xstrndup(c->input, c->input_len) : NULL;
        win.input = input != NULL ? input : "";
        win.event_count = c->event_count;
        win.run_started = c->run_started;
        win.events_absorbed = c->events_absorbed;
        win.n_event_ids = kf_event_ids_list(&c->event_ids, event_ids);
        win.event_ids = (char **)event_ids;
        win.event_ids_dropped = c->event_ids.dropped;
        snap.window = &win;
    }
    Keyflow__Records__RememberedIdRec *ids = kf_xcalloc(c->ids_count + 1, sizeof *ids);
    Keyflow__Records__RememberedIdRec **id_ptrs = kf_xcalloc(c->ids_count + 1, sizeof *id_ptrs);
    for (uint32_t i = 0; i < c->ids_count; i++) {
        remembered_t *r = id_at(c, i);
        keyflow__records__remembered_id_rec__init(&ids[i]);
        ids[i].id = r->id;
        ids[i].run_uuid = r->run_uuid;
        ids[i].due_ms = r->due_ms;
        ids[i].expires_ms = r->expires_ms;
        ids[i].commit_seq = r->commit_seq;
        if (r->digest_known) {
            ids[i].digest.data = r->digest;
            ids[i].digest.len = KF_EVENT_DIGEST_BYTES;
        }
        id_ptrs[i] = &ids[i];
    }
    snap.n_ids = c->ids_count;
    snap.ids = id_ptrs;
    char *recent[KF_RECENT_RUNS_MAX];
    for (uint32_t i = 0; i < c->recent_count; i++) {
        recent[i] = c->recent[i];
    }
    snap.n_recent_runs = c->recent_count;
    snap.recent_runs = recent;
    kf_key_t ckey;
    kf_key_reset(&ckey);
    kf_key_raw(&ckey, c->ckey, c->ckey_len);
    kf_ctx_put_msg(ctx, KF_CF_COORD_SNAPSHOTS, &ckey, &snap.base);
    free(ids);
    free(id_ptrs);
    free(input);
}

/* Continue-as-new: fold the journal into a snapshot once it is long. */
static void maybe_compact(kf_ctx_t *ctx, coord_t *c) {
    if (c->journal_len < KF_JOURNAL_ENTRIES_MAX) {
        return;
    }
    c->compactions++;
    write_snapshot(ctx, c);
    kf_key_t ckey, begin, end;
    kf_key_reset(&ckey);
    kf_key_raw(&ckey, c->ckey, c->ckey_len);
    kf_key_journal(&begin, &ckey, 0);
    kf_key_journal(&end, &ckey, c->journal_seq);
    kf_batch_delete_range(ctx->batch, KF_CF_COORD_JOURNAL, begin.bytes, begin.len, end.bytes,
                          end.len);
    c->journal_len = 0;
    kf_counter_add(KF_C_COMPACTIONS, 1);
}

static void coord_delete(kf_coords_t *cs, kf_ctx_t *ctx, coord_t *c) {
    kf_ctx_wakeup_move(ctx, &c->timer, KF_WAKEUP_COORDINATOR, c->ckey, c->ckey_len,
                       &c->wakeup_due_ms, KF_NO_WAKEUP);
    kf_key_t ckey, end;
    kf_key_reset(&ckey);
    kf_key_raw(&ckey, c->ckey, c->ckey_len);
    kf_ctx_delete(ctx, KF_CF_COORD_SNAPSHOTS, &ckey);
    bool has_end = kf_key_prefix_end(&ckey, &end);
    KF_ASSERT(has_end); /* the kind byte is 1 or 2, never 0xff */
    kf_batch_delete_range(ctx->batch, KF_CF_COORD_JOURNAL, ckey.bytes, ckey.len, end.bytes,
                          end.len);
    kf_map_remove(&cs->map, &c->node);
    coord_free(cs, c);
    publish_gauges(cs);
}

/* Re-arms the coordinator's wake-up, or deletes it when it has nothing left
 * to do. Returns false when the coordinator was deleted. */
static bool coord_schedule(kf_coords_t *cs, kf_ctx_t *ctx, coord_t *c) {
    int64_t due;
    if (c->open) {
        due = c->due_ms;
    } else {
        due = ids_last_expiry(c);
        if (due <= ctx->now_ms) {
            coord_delete(cs, ctx, c);
            return false;
        }
    }
    kf_ctx_wakeup_move(ctx, &c->timer, KF_WAKEUP_COORDINATOR, c->ckey, c->ckey_len,
                       &c->wakeup_due_ms, due);
    return true;
}

static void coord_settle(kf_coords_t *cs, kf_ctx_t *ctx, coord_t *c) {
    if (coord_schedule(cs, ctx, c)) {
        maybe_compact(ctx, c);
    }
    publish_gauges(cs);
}

/* ---- closing windows --------------------------------------------------- */

/* Starts the window's run (run_uuid) with its input: the window closes, or
 * with `leading` stays open to absorb events until its due time. */
static void start_run(kf_coords_t *cs, kf_ctx_t *ctx, coord_t *c, const char *reason,
                      bool leading) {
    KF_ASSERT(c->open && !c->run_started);
    char run_id[KF_RUN_ID_BYTES_MAX + 1];
    const char *event_ids[KF_RUN_EVENT_IDS_MAX];
    snprintf(run_id, sizeof run_id, "%s@%s", c->key, c->run_uuid);
    if (c->kind == KF_RULE_BATCH) {
        input_reserve(cs, c, c->input_len + 1);
        c->input[c->input_len] = ']';
    }
    kf_run_spec_t spec = {
        .run_id = run_id,
        .workflow = c->workflow,
        .key = c->key,
        .kind = (int)c->kind,
        .input = c->input,
        .input_len = c->input_len + (c->kind == KF_RULE_BATCH ? 1 : 0),
        .event_count = c->event_count,
        .options = c->rule.run,
        .event_ids = event_ids,
        .event_id_count = kf_event_ids_list(&c->event_ids, event_ids),
        .event_ids_dropped = c->event_ids.dropped,
    };
    uint64_t run_seq = kf_runs_start(cs->runs, ctx, &spec);
    Keyflow__Records__JournalEntryRec e = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__INIT;
    Keyflow__Records__RunStartedRec started = KEYFLOW__RECORDS__RUN_STARTED_REC__INIT;
    started.run_uuid = c->run_uuid;
    started.reason = (char *)reason;
    started.run_seq = run_seq;
    started.leading = leading;
    e.entry_case = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_STARTED;
    e.started = &started;
    append_entry(cs, ctx, c, &e);
    kf_log_kv(KF_LOG_INFO, "coord", "window closed, run started",
              KF_LOG_STR("kind", c->kind == KF_RULE_BATCH ? "batch" : "debounce"),
              KF_LOG_STR("workflow", c->workflow), KF_LOG_STR("key", c->key),
              KF_LOG_STR("run_id", run_id), KF_LOG_STR("reason", reason),
              KF_LOG_INT("events", spec.event_count));
}

/* Closes the open window: its run starts, or, when it already started at
 * the leading edge, the window just ends ("due", "flush", "cancel"). */
static void end_window(kf_coords_t *cs, kf_ctx_t *ctx, coord_t *c, const char *reason) {
    KF_ASSERT(c->open);
    if (!c->run_started) {
        start_run(cs, ctx, c, reason, false);
        return;
    }
    Keyflow__Records__JournalEntryRec e = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__INIT;
    Keyflow__Records__WindowClosedRec closed = KEYFLOW__RECORDS__WINDOW_CLOSED_REC__INIT;
    closed.run_uuid = c->run_uuid;
    closed.reason = (char *)reason;
    closed.events_absorbed = c->events_absorbed;
    e.entry_case = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_CLOSED;
    e.closed = &closed;
    append_entry(cs, ctx, c, &e);
}

/* Whether closing the open window now would start a run, and there is no
 * room for one more live run. */
static bool end_blocked(const kf_coords_t *cs, const coord_t *c) {
    return !c->run_started && kf_runs_full(cs->runs);
}

/* ---- requests ---------------------------------------------------------- */

/* Closes the window of `c` if its due time has passed, as its timer would
 * have. The engine fires due timers before each turn's commands, but at most
 * KF_TIMERS_PER_TURN_MAX of them, so a request may still meet a window that
 * is over: it must not join, cancel, flush or describe it as open. Returns
 * the coordinator as it is afterwards (NULL when settling deleted it). */
static coord_t *close_if_overdue(kf_coords_t *cs, kf_ctx_t *ctx, coord_t *c, const kf_key_t *ckey) {
    if (c == NULL || !c->open || c->due_ms > ctx->now_ms || end_blocked(cs, c)) {
        return c;
    }
    end_window(cs, ctx, c, "due");
    coord_settle(cs, ctx, c);
    return coord_find(cs, ckey);
}

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

static kf_status_t ref_key(const Keyflow__V1__CoordinatorRef *ref, const char *field,
                           kf_key_t *ckey, kf_error_t *err) {
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
    kf_key_coord(ckey, (uint8_t)ref->kind, ref->workflow, strlen(ref->workflow), ref->key,
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
static kf_status_t answer_duplicate(const coord_t *c, const remembered_t *r, const uint8_t *digest,
                                    kf_arena_t *arena, Keyflow__V1__SendEventResponse *resp,
                                    kf_error_t *err) {
    if (r->digest_known && memcmp(r->digest, digest, KF_EVENT_DIGEST_BYTES) != 0) {
        kf_counter_add(KF_C_EVENTS_CONFLICT, 1);
        return kf_error_set(err, KF_E_EXISTS,
                            "event.id: \"%s\" was already used with another payload (rule, flush "
                            "or input) on this coordinator; a retry must repeat the event exactly, "
                            "another event needs another ID",
                            r->id);
    }
    resp->receipt->run_id = run_id_in(arena, c->key, r->run_uuid);
    resp->receipt->due_ms = r->due_ms;
    resp->receipt->commit_seq = r->commit_seq;
    resp->duplicate = true;
    resp->disposition = KEYFLOW__V1__DISPOSITION__DISPOSITION_DUPLICATE;
    kf_counter_add(KF_C_EVENTS_DUPLICATE, 1);
    return KF_OK;
}

/* Refuses an event that cannot be taken now, before anything changes. */
static kf_status_t admit(const kf_coords_t *cs, kf_ctx_t *ctx, const coord_t *c, size_t input_len,
                         kf_error_t *err) {
    if (c == NULL && cs->map.count >= KF_COORDINATORS_MAX) {
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
    if (cs->window_bytes + (int64_t)input_len + 64 > KF_OPEN_WINDOW_BYTES_MAX) {
        return kf_error_set(err, KF_E_LIMIT,
                            "windows: open windows hold %lld bytes (KF_OPEN_WINDOW_BYTES_MAX)",
                            (long long)cs->window_bytes);
    }
    /* The memory budget admits new coordinators and windows; an event for
     * an open window is always taken. */
    if (c == NULL) {
        return kf_ctx_admit(ctx, COORD_BYTES + WINDOW_BYTES + input_len, "a new coordinator", err);
    }
    if (!c->open) {
        return kf_ctx_admit(ctx, WINDOW_BYTES + input_len, "a new window", err);
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
    kf_key_t ckey;
    kf_key_coord(&ckey, (uint8_t)rule.kind, req->workflow, strlen(req->workflow), req->key,
                 strlen(req->key));
    coord_t *c = close_if_overdue(cs, ctx, coord_find(cs, &ckey), &ckey);
    int64_t now = ctx->now_ms;

    Keyflow__V1__SendEventResponse *resp = kf_arena_new(arena, sizeof *resp);
    keyflow__v1__send_event_response__init(resp);
    resp->receipt = kf_arena_new(arena, sizeof *resp->receipt);
    keyflow__v1__receipt__init(resp->receipt);
    const remembered_t *seen = c != NULL && has_id ? id_find(c, ev->id, now) : NULL;
    if (seen != NULL) {
        kf_status_t st = answer_duplicate(c, seen, digest, arena, resp, err);
        *out = resp;
        return st;
    }
    kf_status_t st = admit(cs, ctx, c, input_len, err);
    if (st != KF_OK) {
        return st;
    }
    if (c == NULL) {
        c = coord_new(cs, &ckey);
    }
    if (c->open && rule.kind == KF_RULE_BATCH &&
        kf_batch_bytes_with((int64_t)c->input_len + 1, c->event_count, input_len) >
            rule.max_bytes) {
        start_run(cs, ctx, c, "size", false); /* the window is full by bytes: start it */
    }
    kf_join_t join = kf_window_join(&rule, c->open, c->run_started);
    char uuid[KF_UUID_TEXT_BYTES + 1];
    int64_t opened_ms = c->opened_ms;
    int64_t count = 1;
    switch (join) {
    case KF_JOIN_OPEN:
        opened_ms = now;
        new_run_uuid(ctx, now, uuid);
        break;
    case KF_JOIN_NEXT_RUN: new_run_uuid(ctx, now, uuid); break;
    case KF_JOIN_RUN:
        memcpy(uuid, c->run_uuid, sizeof uuid);
        count = c->event_count + 1;
        break;
    case KF_JOIN_ABSORB:
        memcpy(uuid, c->run_uuid, sizeof uuid);
        count = c->event_count;
        break;
    }
    /* A flushing event closes its window at once. */
    int64_t due_ms = ev->flush ? now : kf_window_due_ms(&rule, opened_ms, now, count);

    Keyflow__Records__RuleRec rule_rec;
    Keyflow__Records__RetryRec retry_rec;
    rule_to_rec(&rule, &rule_rec, &retry_rec);
    Keyflow__Records__EventAcceptedRec acc = KEYFLOW__RECORDS__EVENT_ACCEPTED_REC__INIT;
    acc.event_id = ev->id;
    acc.rule = &rule_rec;
    /* An absorbed input is in no run: it is not kept. */
    if (join == KF_JOIN_ABSORB) {
        acc.input_json = "";
    } else if (input[input_len] == '\0') {
        acc.input_json = (char *)input; /* no trailing blank was trimmed: use it in place */
    } else {
        acc.input_json = kf_arena_strndup(arena, input, input_len);
        KF_ASSERT(acc.input_json != NULL);
    }
    acc.run_uuid = uuid;
    acc.opened = join == KF_JOIN_OPEN;
    acc.absorbed = join == KF_JOIN_ABSORB;
    acc.next_run = join == KF_JOIN_NEXT_RUN;
    acc.due_ms = due_ms;
    acc.commit_seq = (int64_t)ctx->group_id;
    if (has_id) {
        acc.digest.data = digest;
        acc.digest.len = sizeof digest;
    }
    Keyflow__Records__JournalEntryRec e = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__INIT;
    e.entry_case = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_ACCEPTED;
    e.accepted = &acc;
    append_entry(cs, ctx, c, &e);
    KF_ASSERT(c->due_ms == due_ms && c->event_count == count);
    kf_counter_add(KF_C_EVENTS_ACCEPTED, 1);

    bool closed = false;
    if (join == KF_JOIN_OPEN && kf_edge_leading(&rule)) {
        start_run(cs, ctx, c, "leading", true);
        closed = true;
    }
    if (rule.kind == KF_RULE_BATCH && c->event_count >= rule.max_events) {
        start_run(cs, ctx, c, "full", false); /* fires at once, inside this request */
        closed = true;
    }
    if (ev->flush && c->open) {
        end_window(cs, ctx, c, "flush");
        closed = true;
    }
    resp->receipt->run_id = run_id_in(arena, c->key, uuid);
    resp->receipt->due_ms = due_ms;
    resp->receipt->commit_seq = acc.commit_seq;
    resp->run_started = closed;
    if (closed) {
        resp->disposition = KEYFLOW__V1__DISPOSITION__DISPOSITION_CLOSED;
    } else if (join == KF_JOIN_OPEN || join == KF_JOIN_NEXT_RUN) {
        resp->disposition = KEYFLOW__V1__DISPOSITION__DISPOSITION_OPENED;
    } else {
        resp->disposition = KEYFLOW__V1__DISPOSITION__DISPOSITION_JOINED;
    }
    coord_settle(cs, ctx, c);
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

/* The durable journal entries since the last snapshot (a read: entries of
 * groups not yet synced are not listed; their count is in journal_length). */
static void describe_journal(kf_ctx_t *ctx, coord_t *c,
                             Keyflow__V1__DescribeCoordinatorResponse *resp, kf_arena_t *arena) {
    kf_key_t ckey, end;
    kf_key_reset(&ckey);
    kf_key_raw(&ckey, c->ckey, c->ckey_len);
    if (!kf_key_prefix_end(&ckey, &end)) {
        return;
    }
    kf_iter_t *it;
    kf_error_t err;
    if (kf_iter_create(ctx->store, KF_CF_COORD_JOURNAL, ckey.bytes, ckey.len, end.bytes, end.len,
                       &it, &err) != KF_OK) {
        return;
    }
    resp->journal = kf_arena_new(arena, KF_JOURNAL_ENTRIES_MAX * sizeof *resp->journal);
    for (kf_iter_seek_first(it); kf_iter_valid(it) && resp->n_journal < KF_JOURNAL_ENTRIES_MAX;
         kf_iter_next(it)) {
        size_t len;
        const void *v = kf_iter_value(it, &len);
        Keyflow__Records__JournalEntryRec *e =
            keyflow__records__journal_entry_rec__unpack(kf_arena_pb(arena), len, v);
        if (e == NULL) {
            continue;
        }
        Keyflow__V1__JournalRecord *jr = kf_arena_new(arena, sizeof *jr);
        keyflow__v1__journal_record__init(jr);
        jr->seq = (int64_t)e->seq;
        jr->at_ms = e->at_ms;
        jr->what = (char *)entry_name(e->entry_case);
        if (e->entry_case == KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_ACCEPTED) {
            jr->run_id = run_id_in(arena, c->key, e->accepted->run_uuid);
            jr->event_id = e->accepted->event_id;
            const Keyflow__Records__EventAcceptedRec *a = e->accepted;
            jr->detail = kf_arena_printf(arena, "%sdue_ms=%lld commit_seq=%lld",
                                         a->opened     ? "opened "
                                         : a->absorbed ? "absorbed "
                                         : a->next_run ? "next_run "
                                                       : "",
                                         (long long)a->due_ms, (long long)a->commit_seq);
        } else if (e->entry_case == KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_STARTED) {
            jr->run_id = run_id_in(arena, c->key, e->started->run_uuid);
            jr->detail = kf_arena_printf(arena, "reason=%s", e->started->reason);
        } else if (e->entry_case == KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_CANCELLED) {
            jr->run_id = run_id_in(arena, c->key, e->cancelled->run_uuid);
            jr->detail = kf_arena_printf(arena, "events=%lld", (long long)e->cancelled->events);
        } else if (e->entry_case == KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_CLOSED) {
            jr->run_id = run_id_in(arena, c->key, e->closed->run_uuid);
            jr->detail = kf_arena_printf(arena, "reason=%s events_absorbed=%lld", e->closed->reason,
                                         (long long)e->closed->events_absorbed);
        }
        resp->journal[resp->n_journal++] = jr;
    }
    kf_iter_destroy(it);
}

void kf_coords_describe(kf_coords_t *cs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__DescribeCoordinatorRequest *req =
        (const Keyflow__V1__DescribeCoordinatorRequest *)cmd->request;
    kf_key_t ckey;
    if (ref_key(req->coordinator, "coordinator", &ckey, &cmd->error) != KF_OK) {
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
    coord_t *c = close_if_overdue(cs, ctx, coord_find(cs, &ckey), &ckey);
    if (c != NULL) {
        resp->exists = true;
        if (c->open) {
            Keyflow__V1__Window *w = kf_arena_new(arena, sizeof *w);
            keyflow__v1__window__init(w);
            w->run_id = run_id_in(arena, c->key, c->run_uuid);
            w->event_count = c->event_count;
            w->opened_ms = c->opened_ms;
            w->last_ms = c->last_ms;
            w->due_ms = c->due_ms;
            w->input_bytes = (int64_t)c->input_len + (c->kind == KF_RULE_BATCH ? 1 : 0);
            w->rule = rule_out(arena, &c->rule);
            w->run_started = c->run_started;
            w->events_absorbed = c->events_absorbed;
            resp->window = w;
        }
        resp->runs_started = c->runs_started;
        resp->recent_run_ids = kf_arena_new(arena, (c->recent_count + 1) * sizeof(char *));
        for (uint32_t i = 0; i < c->recent_count; i++) {
            resp->recent_run_ids[resp->n_recent_run_ids++] = run_id_in(arena, c->key, c->recent[i]);
        }
        resp->remembered_ids =
            kf_arena_new(arena, (c->ids_count + 1) * sizeof *resp->remembered_ids);
        for (uint32_t i = 0; i < c->ids_count; i++) {
            remembered_t *r = id_at(c, i);
            if (r->expires_ms <= ctx->now_ms) {
                continue; /* expired: no longer deduplicates */
            }
            Keyflow__V1__RememberedId *ri = kf_arena_new(arena, sizeof *ri);
            keyflow__v1__remembered_id__init(ri);
            ri->id = kf_arena_strdup(arena, r->id);
            ri->receipt = kf_arena_new(arena, sizeof *ri->receipt);
            keyflow__v1__receipt__init(ri->receipt);
            ri->receipt->run_id = run_id_in(arena, c->key, r->run_uuid);
            ri->receipt->due_ms = r->due_ms;
            ri->receipt->commit_seq = r->commit_seq;
            ri->expires_ms = r->expires_ms;
            resp->remembered_ids[resp->n_remembered_ids++] = ri;
        }
        resp->journal_length = c->journal_len;
        resp->journal_seq = (int64_t)c->journal_seq;
        resp->compactions = c->compactions;
        describe_journal(ctx, c, resp, arena);
    }
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

void kf_coords_flush(kf_coords_t *cs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__FlushWindowRequest *req =
        (const Keyflow__V1__FlushWindowRequest *)cmd->request;
    kf_key_t ckey;
    if (ref_key(req->coordinator, "coordinator", &ckey, &cmd->error) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    Keyflow__V1__FlushWindowResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__flush_window_response__init(resp);
    resp->disposition = KEYFLOW__V1__DISPOSITION__DISPOSITION_NO_WINDOW;
    coord_t *c = close_if_overdue(cs, ctx, coord_find(cs, &ckey), &ckey);
    if (c != NULL && c->open) {
        if (end_blocked(cs, c)) {
            kf_error_set(&cmd->error, KF_E_LIMIT,
                         "runs: %d pending or leased runs (KF_LIVE_RUNS_MAX)", KF_LIVE_RUNS_MAX);
            kf_ctx_fail(ctx, cmd);
            return;
        }
        /* A window whose run started at its leading edge just ends. */
        resp->run_id = run_id_in(cmd->arena, c->key, c->run_uuid);
        end_window(cs, ctx, c, "flush");
        resp->flushed = true;
        resp->disposition = KEYFLOW__V1__DISPOSITION__DISPOSITION_CLOSED;
        coord_settle(cs, ctx, c);
    }
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

void kf_coords_cancel(kf_coords_t *cs, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__CancelWindowRequest *req =
        (const Keyflow__V1__CancelWindowRequest *)cmd->request;
    kf_key_t ckey;
    if (ref_key(req->coordinator, "coordinator", &ckey, &cmd->error) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    Keyflow__V1__CancelWindowResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__cancel_window_response__init(resp);
    resp->disposition = KEYFLOW__V1__DISPOSITION__DISPOSITION_NO_WINDOW;
    coord_t *c = close_if_overdue(cs, ctx, coord_find(cs, &ckey), &ckey);
    if (c != NULL && c->open) {
        if (c->run_started) {
            /* Its run started at the leading edge: no run to drop, the
             * window (and its absorbing) just ends. */
            end_window(cs, ctx, c, "cancel");
        } else {
            resp->run_id = run_id_in(cmd->arena, c->key, c->run_uuid);
            resp->events_dropped = c->event_count;
            Keyflow__Records__WindowCancelledRec can = KEYFLOW__RECORDS__WINDOW_CANCELLED_REC__INIT;
            can.run_uuid = c->run_uuid;
            can.events = c->event_count;
            Keyflow__Records__JournalEntryRec e = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__INIT;
            e.entry_case = KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_CANCELLED;
            e.cancelled = &can;
            append_entry(cs, ctx, c, &e);
            kf_runs_window_dropped(cs->runs, ctx, resp->run_id);
        }
        resp->cancelled = true;
        resp->disposition = KEYFLOW__V1__DISPOSITION__DISPOSITION_CANCELLED;
        coord_settle(cs, ctx, c);
    }
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

void kf_coords_fire(kf_coords_t *cs, kf_ctx_t *ctx, kf_timer_t *timer) {
    coord_t *c = KF_CONTAINER_OF(timer, coord_t, timer);
    if (c->open && c->due_ms <= ctx->now_ms) {
        if (end_blocked(cs, c)) {
            /* No room for another live run: keep the window open and look
             * again shortly; SendEvent meanwhile refuses new events. */
            kf_ctx_wakeup_move(ctx, &c->timer, KF_WAKEUP_COORDINATOR, c->ckey, c->ckey_len,
                               &c->wakeup_due_ms, ctx->now_ms + 1000);
            return;
        }
        end_window(cs, ctx, c, "due");
    }
    coord_settle(cs, ctx, c);
}

/* ---- recovery ---------------------------------------------------------- */

static kf_status_t load_snapshot(kf_coords_t *cs, coord_t *c,
                                 const Keyflow__Records__CoordSnapshot *s, kf_error_t *err) {
    c->journal_seq = s->journal_seq;
    c->runs_started = s->runs_started;
    c->compactions = s->compactions;
    for (size_t i = 0; i < s->n_recent_runs && i < KF_RECENT_RUNS_MAX; i++) {
        if (!uuid_ok(s->recent_runs[i])) {
            return kf_error_set(err, KF_E_CORRUPT, "snapshot: malformed recent run");
        }
        recent_push(c, s->recent_runs[i]);
    }
    for (size_t i = 0; i < s->n_ids; i++) {
        const Keyflow__Records__RememberedIdRec *r = s->ids[i];
        if (!uuid_ok(r->run_uuid) || r->id[0] == '\0' || strlen(r->id) > KF_EVENT_ID_BYTES_MAX ||
            (r->digest.len != 0 && r->digest.len != KF_EVENT_DIGEST_BYTES)) {
            return kf_error_set(err, KF_E_CORRUPT, "snapshot: malformed remembered id");
        }
        remembered_spec_t spec = {
            .id = r->id,
            .run_uuid = r->run_uuid,
            .digest = r->digest.len == KF_EVENT_DIGEST_BYTES ? r->digest.data : NULL,
            .due_ms = r->due_ms,
            .expires_ms = r->expires_ms,
            .commit_seq = r->commit_seq,
        };
        id_push(cs, c, &spec);
    }
    if (s->window != NULL) {
        const Keyflow__Records__WindowRec *w = s->window;
        if (!uuid_ok(w->run_uuid) || !rule_from_rec(w->rule, &c->rule) || c->rule.kind != c->kind ||
            strlen(w->input) > KF_WINDOW_INPUT_BYTES_MAX) {
            return kf_error_set(err, KF_E_CORRUPT, "snapshot: malformed window");
        }
        if (w->n_event_ids > KF_RUN_EVENT_IDS_MAX || w->event_ids_dropped < 0) {
            return kf_error_set(err, KF_E_CORRUPT, "snapshot: malformed window event IDs");
        }
        for (size_t i = 0; i < w->n_event_ids; i++) {
            if (w->event_ids[i][0] == '\0' || strlen(w->event_ids[i]) > KF_EVENT_ID_BYTES_MAX) {
                return kf_error_set(err, KF_E_CORRUPT, "snapshot: malformed window event IDs");
            }
            kf_event_ids_push(&c->event_ids, w->event_ids[i]);
        }
        c->event_ids.dropped = w->event_ids_dropped;
        c->open = true;
        cs->open_windows++;
        memcpy(c->run_uuid, w->run_uuid, KF_UUID_TEXT_BYTES + 1);
        c->opened_ms = w->opened_ms;
        c->last_ms = w->last_ms;
        c->due_ms = w->due_ms;
        c->event_count = w->event_count;
        c->run_started = w->run_started;
        c->events_absorbed = w->events_absorbed;
        window_index(cs, c, !c->run_started);
        size_t len = strlen(w->input);
        if (len > 0) {
            input_reserve(cs, c, len + 1);
            memcpy(c->input, w->input, len);
            c->input_len = len;
        }
    }
    return KF_OK;
}

static bool ckey_valid(const void *p, size_t len) {
    kf_key_reader_t r = kf_key_reader(p, len);
    uint8_t kind;
    const char *s;
    size_t n;
    return kf_key_read_u8(&r, &kind) && (kind == KF_RULE_DEBOUNCE || kind == KF_RULE_BATCH) &&
           kf_key_read_lp(&r, &s, &n) && kf_key_read_lp(&r, &s, &n) && r.left == 0;
}

static kf_status_t recover_snapshots(kf_coords_t *cs, kf_ctx_t *ctx, kf_error_t *err) {
    kf_iter_t *it;
    kf_status_t st = kf_iter_create(ctx->store, KF_CF_COORD_SNAPSHOTS, NULL, 0, NULL, 0, &it, err);
    if (st != KF_OK) {
        return st;
    }
    for (kf_iter_seek_first(it); kf_iter_valid(it) && st == KF_OK; kf_iter_next(it)) {
        size_t klen, vlen;
        const void *k = kf_iter_key(it, &klen);
        const void *v = kf_iter_value(it, &vlen);
        if (!ckey_valid(k, klen)) {
            st = kf_error_set(err, KF_E_CORRUPT, "coord_snapshots: malformed key");
            break;
        }
        Keyflow__Records__CoordSnapshot *s =
            keyflow__records__coord_snapshot__unpack(NULL, vlen, v);
        if (s == NULL) {
            st = kf_error_set(err, KF_E_CORRUPT, "coord_snapshots: undecodable record");
            break;
        }
        kf_key_t ckey;
        kf_key_reset(&ckey);
        kf_key_raw(&ckey, k, klen);
        coord_t *c = coord_new(cs, &ckey);
        st = load_snapshot(cs, c, s, err);
        keyflow__records__coord_snapshot__free_unpacked(s, NULL);
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    return st;
}

static kf_status_t recover_journal(kf_coords_t *cs, kf_ctx_t *ctx, kf_error_t *err) {
    kf_iter_t *it;
    kf_status_t st = kf_iter_create(ctx->store, KF_CF_COORD_JOURNAL, NULL, 0, NULL, 0, &it, err);
    if (st != KF_OK) {
        return st;
    }
    for (kf_iter_seek_first(it); kf_iter_valid(it) && st == KF_OK; kf_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = kf_iter_key(it, &klen);
        const void *v = kf_iter_value(it, &vlen);
        if (klen < 9 || !ckey_valid(k, klen - 8)) {
            st = kf_error_set(err, KF_E_CORRUPT, "coord_journal: malformed key");
            break;
        }
        kf_key_t ckey;
        kf_key_reset(&ckey);
        kf_key_raw(&ckey, k, klen - 8);
        coord_t *c = coord_find(cs, &ckey);
        if (c == NULL) {
            c = coord_new(cs, &ckey);
        }
        Keyflow__Records__JournalEntryRec *e =
            keyflow__records__journal_entry_rec__unpack(NULL, vlen, v);
        if (e == NULL) {
            st = kf_error_set(err, KF_E_CORRUPT, "coord_journal: undecodable entry");
            break;
        }
        if (e->seq != c->journal_seq) {
            st = kf_error_set(err, KF_E_CORRUPT,
                              "coord_journal: %s/%s entry %llu where %llu was expected",
                              c->workflow, c->key, (unsigned long long)e->seq,
                              (unsigned long long)c->journal_seq);
        } else {
            st = apply_entry(cs, c, e, err);
            c->journal_seq++;
            c->journal_len++;
        }
        keyflow__records__journal_entry_rec__free_unpacked(e, NULL);
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    return st;
}

/* An open window's run does not exist yet (it starts when the window
 * closes, unless it started at the leading edge); a live run under that ID
 * means the store is not what this engine
 * wrote, and closing the window would have nowhere to go. */
static kf_status_t check_open_runs(kf_coords_t *cs, kf_error_t *err) {
    size_t b;
    for (kf_map_node_t *n = kf_map_first(&cs->map, &b); n != NULL;
         n = kf_map_next(&cs->map, &b, n)) {
        const coord_t *c = KF_CONTAINER_OF(n, coord_t, node);
        char run_id[KF_RUN_ID_BYTES_MAX + 1];
        snprintf(run_id, sizeof run_id, "%s@%s", c->key, c->run_uuid);
        if (c->open && !c->run_started && kf_runs_live(cs->runs, run_id)) {
            return kf_error_set(err, KF_E_CORRUPT,
                                "coord: the open window of %s/%s names run %s, which exists",
                                c->workflow, c->key, run_id);
        }
    }
    return KF_OK;
}

kf_status_t kf_coords_recover(kf_coords_t *cs, kf_ctx_t *ctx, kf_error_t *err) {
    kf_status_t st = recover_snapshots(cs, ctx, err);
    if (st == KF_OK) {
        st = recover_journal(cs, ctx, err);
    }
    if (st == KF_OK) {
        st = check_open_runs(cs, err);
    }
    publish_gauges(cs);
    return st;
}

bool kf_coords_attach_wakeup(kf_coords_t *cs, kf_ctx_t *ctx, const void *ckey, size_t len,
                             int64_t due_ms) {
    kf_map_node_t *n = kf_map_get(&cs->map, ckey, len);
    if (n == NULL) {
        return false;
    }
    coord_t *c = KF_CONTAINER_OF(n, coord_t, node);
    if (c->wakeup_due_ms != KF_NO_WAKEUP) {
        return false; /* a second record for one coordinator: the caller deletes it */
    }
    c->wakeup_due_ms = due_ms;
    kf_heap_arm(&ctx->heap, &c->timer, due_ms);
    return true;
}

void kf_coords_finish_recovery(kf_coords_t *cs, kf_ctx_t *ctx) {
    size_t b;
    kf_map_node_t *n = kf_map_first(&cs->map, &b);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&cs->map, &b, n);
        coord_t *c = KF_CONTAINER_OF(n, coord_t, node);
        int64_t want = c->open ? c->due_ms : ids_last_expiry(c);
        if (!kf_timer_armed(&c->timer) || c->wakeup_due_ms > want) {
            kf_log(KF_LOG_WARN, "coord", "repairing wake-up of %s/%s", c->workflow, c->key);
            coord_settle(cs, ctx, c);
        }
        n = next;
    }
}

/* ---- lifecycle --------------------------------------------------------- */

/* The runs' seam for GetRun of a receipt's run ID (runs.h): the open
 * window whose uuid ends the ID, if its key is the ID's key. */
static bool window_lookup(void *owner, const char *run_id, kf_open_window_t *out) {
    const kf_coords_t *cs = owner;
    size_t len = strlen(run_id);
    if (len < KF_UUID_TEXT_BYTES + 2 || run_id[len - KF_UUID_TEXT_BYTES - 1] != '@') {
        return false;
    }
    size_t key_len = len - KF_UUID_TEXT_BYTES - 1;
    for (const coord_t *c = index_head(cs, run_id + key_len + 1); c != NULL; c = c->window_next) {
        if (strlen(c->key) != key_len || memcmp(c->key, run_id, key_len) != 0) {
            continue;
        }
        KF_ASSERT(c->open && !c->run_started);
        *out = (kf_open_window_t){
            .workflow = c->workflow,
            .key = c->key,
            .kind = (int)c->kind,
            .opened_ms = c->opened_ms,
            .last_ms = c->last_ms,
            .due_ms = c->due_ms,
            .event_count = c->event_count,
        };
        return true;
    }
    return false;
}

kf_coords_t *kf_coords_create(kf_runs_t *runs) {
    kf_coords_t *cs = kf_xcalloc(1, sizeof *cs);
    kf_map_init(&cs->map);
    kf_map_init(&cs->windows);
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
        coord_free(cs, KF_CONTAINER_OF(n, coord_t, node));
        n = next;
    }
    kf_map_deinit(&cs->map);
    kf_map_deinit(&cs->windows);
    free(cs);
}

uint64_t kf_coords_count(const kf_coords_t *cs) {
    return cs->map.count;
}
uint64_t kf_coords_open_windows(const kf_coords_t *cs) {
    return cs->open_windows;
}
