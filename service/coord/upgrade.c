/*
 * upgrade.c - coordinators of store format 1 rewritten as format 2.
 *
 * Format 1 kept each coordinator in memory and on disk as a snapshot
 * (coord_snapshots, keyed by identity) plus the journal entries since it
 * (coord_journal, identity | seq), with a wake-up of type 1 in wakeups; a
 * start replayed every journal. This file does that replay once, the way
 * format 1's engine did (the same checks: an entry it could not have
 * written is KF_E_CORRUPT), one coordinator at a time, and writes what
 * coord.c reads (see its layout): the state record, the index record, the
 * remembered IDs, the open window's events, the recent runs, the journal
 * under the new key and the window's GetRun entry; and deletes the old
 * records of that coordinator in the same write.
 *
 * A batch window's input was one string ("[a,b"); its events are not
 * separable without parsing JSON, so it becomes one event record holding
 * the joined inputs, which coord.c joins with the rest as text.
 *
 * Engine-thread only, at start, before anything reads coordinators.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/bytes.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/map.h"
#include "coord/coord_int.h"
#include "runs/runs.h"
#include "storage/keys.h"

/* Rewritten coordinators are written in batches of about this many bytes. */
#define UPGRADE_BATCH_BYTES (4 * 1024 * 1024)

typedef struct old_id {
    char *id; /* owned */
    char run_uuid[KF_UUID_TEXT_BYTES + 1];
    bool digest_known;
    uint8_t digest[KF_EVENT_DIGEST_BYTES];
    int64_t due_ms;
    int64_t expires_ms;
    int64_t commit_seq;
} old_id_t;

/* A format 1 coordinator as its engine held it. */
typedef struct old_coord {
    kf_key_t ident;
    kf_rule_kind_t kind;
    char *workflow; /* owned */
    char *key;
    uint64_t journal_seq;
    uint32_t journal_len;
    int64_t runs_started;
    int64_t compactions;
    char recent[KF_RECENT_RUNS_MAX][KF_UUID_TEXT_BYTES + 1]; /* oldest first */
    uint32_t recent_count;
    bool open;
    bool run_started;
    char run_uuid[KF_UUID_TEXT_BYTES + 1];
    int64_t opened_ms;
    int64_t last_ms;
    int64_t due_ms;
    kf_rule_t rule;
    char *input; /* debounce: latest input; batch: "[a,b" (owned) */
    size_t input_len;
    size_t input_cap;
    int64_t event_count;
    int64_t events_absorbed;
    kf_event_ids_t event_ids;
    old_id_t *ids; /* oldest first */
    uint32_t ids_count;
} old_coord_t;

static bool uuid_ok(const char *s) {
    return s != NULL && strlen(s) == KF_UUID_TEXT_BYTES;
}

static void old_free(old_coord_t *c) {
    for (uint32_t i = 0; i < c->ids_count; i++) {
        free(c->ids[i].id);
    }
    free(c->ids);
    free(c->input);
    free(c->workflow);
    free(c->key);
    kf_event_ids_clear(&c->event_ids);
    memset(c, 0, sizeof *c);
}

static bool ident_valid(const void *p, size_t len) {
    kf_key_reader_t r = kf_key_reader(p, len);
    uint8_t kind;
    const char *s;
    size_t n;
    return kf_key_read_u8(&r, &kind) && (kind == KF_RULE_DEBOUNCE || kind == KF_RULE_BATCH) &&
           kf_key_read_lp(&r, &s, &n) && kf_key_read_lp(&r, &s, &n) && r.left == 0;
}

static void old_init(old_coord_t *c, const void *ident, size_t len) {
    memset(c, 0, sizeof *c);
    kf_key_reset(&c->ident);
    kf_key_raw(&c->ident, ident, len);
    kf_key_reader_t r = kf_key_reader(ident, len);
    uint8_t kind;
    const char *wf, *key;
    size_t wf_len, key_len;
    bool ok = kf_key_read_u8(&r, &kind) && kf_key_read_lp(&r, &wf, &wf_len) &&
              kf_key_read_lp(&r, &key, &key_len);
    KF_ASSERT(ok); /* checked by ident_valid */
    c->kind = (kf_rule_kind_t)kind;
    c->workflow = kf_xstrndup(wf, wf_len);
    c->key = kf_xstrndup(key, key_len);
    c->ids = kf_xcalloc(KF_REMEMBERED_IDS_MAX, sizeof *c->ids);
}

static void input_reserve(old_coord_t *c, size_t need) {
    if (need <= c->input_cap) {
        return;
    }
    size_t cap = c->input_cap ? c->input_cap : 64;
    while (cap < need) {
        cap *= 2;
    }
    c->input = kf_xrealloc(c->input, cap);
    c->input_cap = cap;
}

static void ids_prune(old_coord_t *c, int64_t at_ms) {
    uint32_t kept = 0;
    for (uint32_t i = 0; i < c->ids_count; i++) {
        if (c->ids[i].expires_ms > at_ms) {
            c->ids[kept++] = c->ids[i];
        } else {
            free(c->ids[i].id);
        }
    }
    c->ids_count = kept;
}

static void id_push(old_coord_t *c, const char *id, const char *run_uuid, const uint8_t *digest,
                    int64_t due_ms, int64_t expires_ms, int64_t commit_seq) {
    if (c->ids_count == KF_REMEMBERED_IDS_MAX) {
        free(c->ids[0].id); /* the oldest is forgotten first */
        memmove(&c->ids[0], &c->ids[1], (KF_REMEMBERED_IDS_MAX - 1) * sizeof c->ids[0]);
        c->ids_count--;
    }
    old_id_t *r = &c->ids[c->ids_count++];
    memset(r, 0, sizeof *r);
    r->id = kf_xstrdup(id);
    memcpy(r->run_uuid, run_uuid, KF_UUID_TEXT_BYTES + 1);
    r->digest_known = digest != NULL;
    if (digest != NULL) {
        memcpy(r->digest, digest, KF_EVENT_DIGEST_BYTES);
    }
    r->due_ms = due_ms;
    r->expires_ms = expires_ms;
    r->commit_seq = commit_seq;
}

static void recent_push(old_coord_t *c, const char *uuid) {
    if (c->recent_count == KF_RECENT_RUNS_MAX) {
        memmove(c->recent[0], c->recent[1], (KF_RECENT_RUNS_MAX - 1) * sizeof c->recent[0]);
        c->recent_count--;
    }
    memcpy(c->recent[c->recent_count++], uuid, KF_UUID_TEXT_BYTES + 1);
}

static bool window_runs(const old_coord_t *c, const char *run_uuid) {
    return c->open && uuid_ok(run_uuid) && strcmp(c->run_uuid, run_uuid) == 0;
}

static void window_begin_run(old_coord_t *c, const char *run_uuid, const kf_rule_t *rule) {
    memcpy(c->run_uuid, run_uuid, KF_UUID_TEXT_BYTES + 1);
    kf_event_ids_clear(&c->event_ids);
    c->run_started = false;
    c->event_count = 0;
    c->input_len = 0;
    if (rule->kind == KF_RULE_BATCH) {
        input_reserve(c, 1);
        c->input[c->input_len++] = '[';
    }
}

static void window_drop(old_coord_t *c) {
    kf_event_ids_clear(&c->event_ids);
    c->input_len = 0;
    c->open = false;
    c->run_started = false;
    c->event_count = 0;
    c->events_absorbed = 0;
}

/* Live IDs have distinct names (a second one would have been a
 * duplicate); should a store say otherwise, the later one stays, since
 * format 2 finds an ID by its name. */
static void ids_unique(old_coord_t *c) {
    kf_map_t names;
    kf_map_init(&names);
    kf_map_node_t *nodes = kf_xcalloc(c->ids_count + 1, sizeof *nodes);
    uint32_t kept = 0;
    for (uint32_t i = c->ids_count; i-- > 0;) { /* newest first */
        old_id_t *r = &c->ids[i];
        if (kf_map_get(&names, r->id, strlen(r->id)) != NULL) {
            free(r->id);
            r->id = NULL;
            continue;
        }
        kf_map_insert(&names, &nodes[i], r->id, strlen(r->id));
        kept++;
    }
    kf_map_deinit(&names);
    free(nodes);
    uint32_t j = 0;
    for (uint32_t i = 0; i < c->ids_count; i++) {
        if (c->ids[i].id != NULL) {
            c->ids[j++] = c->ids[i];
        }
    }
    KF_ASSERT(j == kept);
    c->ids_count = kept;
}

/* ---- format 1's replay ------------------------------------------------------------- */

static kf_status_t apply_accepted(old_coord_t *c, int64_t at_ms,
                                  const Keyflow__Records__EventAcceptedRec *e, kf_error_t *err) {
    kf_rule_t rule;
    if (!kf__rule_from_rec(e->rule, &rule) || !uuid_ok(e->run_uuid) || rule.kind != c->kind ||
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
        c->opened_ms = at_ms;
        c->events_absorbed = 0;
        window_begin_run(c, e->run_uuid, &rule);
    } else if (e->next_run) {
        if (!c->open || !c->run_started || rule.kind != KF_RULE_DEBOUNCE) {
            return kf_error_set(err, KF_E_CORRUPT,
                                "journal: a next run in a window whose run has not started");
        }
        window_begin_run(c, e->run_uuid, &rule);
    } else if (!window_runs(c, e->run_uuid) || e->absorbed != c->run_started) {
        return kf_error_set(err, KF_E_CORRUPT, "journal: event joined a window that is not open");
    }
    if (rule.kind == KF_RULE_BATCH &&
        c->input_len + 1 + strlen(e->input_json) + 1 > KF_WINDOW_INPUT_BYTES_MAX) {
        return kf_error_set(err, KF_E_CORRUPT, "journal: a batch window larger than %d bytes",
                            KF_WINDOW_INPUT_BYTES_MAX);
    }
    if (e->absorbed) {
        c->events_absorbed++;
    } else {
        const char *in = e->input_json[0] ? e->input_json : "null";
        size_t in_len = strlen(in);
        if (rule.kind == KF_RULE_DEBOUNCE) {
            input_reserve(c, in_len);
            memcpy(c->input, in, in_len);
            c->input_len = in_len;
        } else {
            input_reserve(c, c->input_len + 1 + in_len + 1);
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
    ids_prune(c, at_ms);
    if (e->event_id[0] != '\0') {
        id_push(c, e->event_id, e->run_uuid,
                e->digest.len == KF_EVENT_DIGEST_BYTES ? e->digest.data : NULL, e->due_ms,
                kf_dedup_expires_ms(&rule, at_ms), e->commit_seq);
    }
    return KF_OK;
}

static kf_status_t apply_entry(old_coord_t *c, const Keyflow__Records__JournalEntryRec *e,
                               kf_error_t *err) {
    switch (e->entry_case) {
    case KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_ACCEPTED:
        return apply_accepted(c, e->at_ms, e->accepted, err);
    case KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_STARTED:
        if (!window_runs(c, e->started->run_uuid) || c->run_started) {
            return kf_error_set(err, KF_E_CORRUPT,
                                "journal: run started for a window that is not open");
        }
        if (e->started->leading) {
            c->run_started = true;
            kf_event_ids_clear(&c->event_ids);
            c->input_len = 0;
        } else {
            window_drop(c);
        }
        c->runs_started++;
        recent_push(c, e->started->run_uuid);
        return KF_OK;
    case KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_CANCELLED:
        if (!window_runs(c, e->cancelled->run_uuid) || c->run_started) {
            return kf_error_set(err, KF_E_CORRUPT, "journal: cancelled a window that is not open");
        }
        window_drop(c);
        return KF_OK;
    case KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY_CLOSED:
        if (!window_runs(c, e->closed->run_uuid) || !c->run_started) {
            return kf_error_set(err, KF_E_CORRUPT,
                                "journal: closed a window without a started run");
        }
        window_drop(c);
        return KF_OK;
    case KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY__NOT_SET:
    case _KEYFLOW__RECORDS__JOURNAL_ENTRY_REC__ENTRY__CASE_IS_INT_SIZE: break;
    }
    return kf_error_set(err, KF_E_CORRUPT, "journal: unknown entry kind %d", (int)e->entry_case);
}

static kf_status_t load_snapshot(old_coord_t *c, const Keyflow__Records__CoordSnapshot *s,
                                 kf_error_t *err) {
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
        id_push(c, r->id, r->run_uuid,
                r->digest.len == KF_EVENT_DIGEST_BYTES ? r->digest.data : NULL, r->due_ms,
                r->expires_ms, r->commit_seq);
    }
    if (s->window != NULL) {
        const Keyflow__Records__WindowRec *w = s->window;
        if (!uuid_ok(w->run_uuid) || !kf__rule_from_rec(w->rule, &c->rule) ||
            c->rule.kind != c->kind || strlen(w->input) > KF_WINDOW_INPUT_BYTES_MAX) {
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
        memcpy(c->run_uuid, w->run_uuid, KF_UUID_TEXT_BYTES + 1);
        c->opened_ms = w->opened_ms;
        c->last_ms = w->last_ms;
        c->due_ms = w->due_ms;
        c->event_count = w->event_count;
        c->run_started = w->run_started;
        c->events_absorbed = w->events_absorbed;
        size_t len = strlen(w->input);
        if (len > 0) {
            input_reserve(c, len + 1);
            memcpy(c->input, w->input, len);
            c->input_len = len;
        }
    }
    return KF_OK;
}

/* ---- writing format 2 ------------------------------------------------------------- */

static void put_msg(kf_batch_t *b, kf_cf_t cf, const kf_key_t *k, const ProtobufCMessage *m) {
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = kf_xmalloc(len);
    size_t packed = protobuf_c_message_pack(m, buf);
    KF_ASSERT(packed == len);
    kf_batch_put(b, cf, k->bytes, k->len, buf, len);
    free(buf);
}

static void put_event(kf_batch_t *b, const uint8_t *id, uint64_t seq, const char *event_id,
                      const char *input) {
    Keyflow__Records__WindowEventRec rec = KEYFLOW__RECORDS__WINDOW_EVENT_REC__INIT;
    rec.event_id = (char *)event_id;
    rec.input = (char *)input;
    kf_key_t k;
    kf_key_coord_item_seq(&k, id, KF_COORD_ITEM_EVENT, seq);
    put_msg(b, KF_CF_COORD_ITEMS, &k, &rec.base);
}

/* The open window's state and event records; returns events_next. */
static uint64_t write_window(kf_batch_t *b, const uint8_t *id, old_coord_t *c,
                             Keyflow__Records__WindowStateRec *w, char **input_copy) {
    w->run_uuid = c->run_uuid;
    w->opened_ms = c->opened_ms;
    w->last_ms = c->last_ms;
    w->due_ms = c->due_ms;
    w->event_count = c->event_count;
    w->run_started = c->run_started;
    w->events_absorbed = c->events_absorbed;
    w->event_ids_dropped = c->event_ids.dropped;
    w->input = "";
    uint64_t seq = 0;
    if (c->kind == KF_RULE_BATCH) {
        w->input_bytes = c->input_len > 0 ? (int64_t)c->input_len : 1;
        if (c->input_len > 1) {
            *input_copy = kf_xstrndup(c->input + 1, c->input_len - 1); /* after "[" */
            put_event(b, id, seq++, "", *input_copy);
        }
    } else if (c->input_len > 0) {
        *input_copy = kf_xstrndup(c->input, c->input_len);
        w->input = *input_copy;
    }
    const char *ids[KF_RUN_EVENT_IDS_MAX];
    uint32_t n = kf_event_ids_list(&c->event_ids, ids);
    for (uint32_t i = 0; i < n; i++) {
        put_event(b, id, seq++, ids[i], "");
    }
    w->events_first = 0;
    w->events_next = seq;
    return seq;
}

/* Writes coordinator `c` in format 2 (unless it had nothing left to do at
 * now_ms) and deletes its format 1 records, into `b`. */
static void rewrite(const kf_coord_id_key_t *key, kf_batch_t *b, old_coord_t *c, int64_t now_ms) {
    uint8_t id[KF_COORD_ID_BYTES];
    kf__coord_id(key, c->ident.bytes, c->ident.len, id);
    ids_prune(c, now_ms); /* expired IDs answer nothing: leave them behind */
    ids_unique(c);
    int64_t last_expiry = INT64_MIN;
    bool unsorted = false;
    for (uint32_t i = 0; i < c->ids_count; i++) {
        unsorted = unsorted || c->ids[i].expires_ms < last_expiry;
        last_expiry = c->ids[i].expires_ms > last_expiry ? c->ids[i].expires_ms : last_expiry;
    }
    /* the old records go in any case */
    kf_key_t k, end;
    kf_batch_delete(b, KF_CF_COORD_SNAPSHOTS, c->ident.bytes, c->ident.len);
    bool has_end = kf_key_prefix_end(&c->ident, &end);
    KF_ASSERT(has_end);
    kf_batch_delete_range(b, KF_CF_COORD_JOURNAL, c->ident.bytes, c->ident.len, end.bytes, end.len);
    kf_key_wakeup(&k, 0, KF_WAKEUP_COORDINATOR, c->ident.bytes, c->ident.len);
    kf_batch_delete(b, KF_CF_WAKEUPS, k.bytes, k.len);
    if (!c->open && (c->ids_count == 0 || last_expiry <= now_ms)) {
        return; /* format 1 would have deleted it at start */
    }

    Keyflow__Records__CoordStateRec st = KEYFLOW__RECORDS__COORD_STATE_REC__INIT;
    Keyflow__Records__WindowStateRec w = KEYFLOW__RECORDS__WINDOW_STATE_REC__INIT;
    Keyflow__Records__RuleRec rule;
    Keyflow__Records__RetryRec retry;
    char *input_copy = NULL;
    st.kind = (int32_t)c->kind;
    st.workflow = c->workflow;
    st.key = c->key;
    st.journal_seq = c->journal_seq;
    st.journal_len = c->journal_len;
    st.runs_started = c->runs_started;
    st.compactions = c->compactions;
    if (c->open) {
        kf__rule_to_rec(&c->rule, &rule, &retry);
        w.rule = &rule;
        write_window(b, id, c, &w, &input_copy);
        st.window = &w;
        if (!c->run_started) {
            char run_id[KF_RUN_ID_BYTES_MAX + 1];
            snprintf(run_id, sizeof run_id, "%s@%s", c->key, c->run_uuid);
            kf_batch_put(b, KF_CF_COORD_WINDOWS, run_id, strlen(run_id), id, KF_COORD_ID_BYTES);
        }
    }
    for (uint32_t i = 0; i < c->ids_count; i++) {
        const old_id_t *r = &c->ids[i];
        Keyflow__Records__RememberedIdRec rec = KEYFLOW__RECORDS__REMEMBERED_ID_REC__INIT;
        rec.id = r->id;
        rec.run_uuid = (char *)r->run_uuid;
        rec.due_ms = r->due_ms;
        rec.expires_ms = r->expires_ms;
        rec.commit_seq = r->commit_seq;
        if (r->digest_known) {
            rec.digest.data = (uint8_t *)r->digest;
            rec.digest.len = KF_EVENT_DIGEST_BYTES;
        }
        kf_key_coord_item_seq(&k, id, KF_COORD_ITEM_ID, i);
        put_msg(b, KF_CF_COORD_ITEMS, &k, &rec.base);
        uint8_t seq[8];
        kf_put_be64(seq, i);
        kf_key_coord_item_name(&k, id, r->id, strlen(r->id));
        kf_batch_put(b, KF_CF_COORD_ITEMS, k.bytes, k.len, seq, sizeof seq);
    }
    st.ids_first = 0;
    st.ids_next = c->ids_count;
    st.ids_count = c->ids_count;
    st.ids_last_expiry_ms = c->ids_count > 0 ? last_expiry : 0;
    st.ids_unsorted = unsorted;
    /* Recent runs are numbered by runs_started (coord.c, recent_push). */
    if (c->runs_started < (int64_t)c->recent_count) {
        st.runs_started = c->recent_count;
    }
    int64_t base = st.runs_started - (int64_t)c->recent_count;
    for (uint32_t i = 0; i < c->recent_count; i++) {
        kf_key_coord_item_seq(&k, id, KF_COORD_ITEM_RECENT, (uint64_t)base + i);
        kf_batch_put(b, KF_CF_COORD_ITEMS, k.bytes, k.len, c->recent[i], KF_UUID_TEXT_BYTES);
    }
    kf_key_coord_id(&k, id);
    put_msg(b, KF_CF_COORD_STATE, &k, &st.base);
    uint8_t index[9];
    kf_put_be64(index, kf_i64_ordered(c->open ? c->due_ms : last_expiry));
    index[8] = c->open ? 1 : 0;
    kf_batch_put(b, KF_CF_COORD_INDEX, k.bytes, k.len, index, sizeof index);
    free(input_copy);
}

/* ---- the scan ------------------------------------------------------------------------ */

static int ident_cmp(const void *a, size_t a_len, const void *b, size_t b_len) {
    size_t n = a_len < b_len ? a_len : b_len;
    int c = memcmp(a, b, n);
    return c != 0 ? c : a_len < b_len ? -1 : a_len > b_len ? 1 : 0;
}

/* Replays one coordinator: its snapshot (if `snap` is there and its key is
 * the coordinator's) and its journal entries, copying the entries to the
 * new journal keys into `b` as it goes. */
static kf_status_t replay(const kf_coord_id_key_t *key, old_coord_t *c, kf_iter_t *snaps,
                          kf_iter_t *journal, kf_batch_t *b, kf_error_t *err) {
    uint8_t id[KF_COORD_ID_BYTES];
    kf__coord_id(key, c->ident.bytes, c->ident.len, id);
    if (kf_iter_valid(snaps)) {
        size_t kl, vl;
        const void *k = kf_iter_key(snaps, &kl);
        if (ident_cmp(k, kl, c->ident.bytes, c->ident.len) == 0) {
            const void *v = kf_iter_value(snaps, &vl);
            Keyflow__Records__CoordSnapshot *s =
                keyflow__records__coord_snapshot__unpack(NULL, vl, v);
            if (s == NULL) {
                return kf_error_set(err, KF_E_CORRUPT, "coord_snapshots: undecodable record");
            }
            kf_status_t st = load_snapshot(c, s, err);
            keyflow__records__coord_snapshot__free_unpacked(s, NULL);
            if (st != KF_OK) {
                return st;
            }
            kf_iter_next(snaps);
        }
    }
    for (; kf_iter_valid(journal); kf_iter_next(journal)) {
        size_t kl, vl;
        const uint8_t *k = kf_iter_key(journal, &kl);
        if (kl < 9 || ident_cmp(k, kl - 8, c->ident.bytes, c->ident.len) != 0) {
            break;
        }
        const void *v = kf_iter_value(journal, &vl);
        Keyflow__Records__JournalEntryRec *e =
            keyflow__records__journal_entry_rec__unpack(NULL, vl, v);
        if (e == NULL) {
            return kf_error_set(err, KF_E_CORRUPT, "coord_journal: undecodable entry");
        }
        kf_status_t st = KF_OK;
        if (e->seq != c->journal_seq) {
            st = kf_error_set(err, KF_E_CORRUPT,
                              "coord_journal: %s/%s entry %llu where %llu was expected",
                              c->workflow, c->key, (unsigned long long)e->seq,
                              (unsigned long long)c->journal_seq);
        } else {
            st = apply_entry(c, e, err);
            c->journal_seq++;
            c->journal_len++;
        }
        if (st == KF_OK) {
            kf_key_t hk;
            kf_key_coord_history(&hk, id, e->seq);
            kf_batch_put(b, KF_CF_COORD_HISTORY, hk.bytes, hk.len, v, vl);
        }
        keyflow__records__journal_entry_rec__free_unpacked(e, NULL);
        if (st != KF_OK) {
            return st;
        }
    }
    return KF_OK;
}

kf_status_t kf__coords_upgrade(const kf_coord_id_key_t *key, kf_ctx_t *ctx, kf_error_t *err) {
    kf_iter_t *snaps = NULL, *journal = NULL;
    kf_status_t st =
        kf_iter_create(ctx->store, KF_CF_COORD_SNAPSHOTS, NULL, 0, NULL, 0, &snaps, err);
    if (st == KF_OK) {
        st = kf_iter_create(ctx->store, KF_CF_COORD_JOURNAL, NULL, 0, NULL, 0, &journal, err);
    }
    if (st != KF_OK) {
        kf_iter_destroy(snaps);
        return st;
    }
    kf_iter_seek_first(snaps);
    kf_iter_seek_first(journal);
    kf_batch_t *b = kf_batch_create(ctx->store);
    uint64_t coordinators = 0;
    bool any = false;
    int64_t t0 = kf_mono_us();
    while (st == KF_OK && (kf_iter_valid(snaps) || kf_iter_valid(journal))) {
        /* The next coordinator: the smaller identity of the two cursors. */
        size_t sl = 0, jl = 0;
        const void *sk = kf_iter_valid(snaps) ? kf_iter_key(snaps, &sl) : NULL;
        const uint8_t *jk = kf_iter_valid(journal) ? kf_iter_key(journal, &jl) : NULL;
        if (jk != NULL && jl < 9) {
            st = kf_error_set(err, KF_E_CORRUPT, "coord_journal: malformed key");
            break;
        }
        const void *ident = sk;
        size_t ident_len = sl;
        if (sk == NULL || (jk != NULL && ident_cmp(jk, jl - 8, sk, sl) < 0)) {
            ident = jk;
            ident_len = jl - 8;
        }
        if (!ident_valid(ident, ident_len)) {
            st = kf_error_set(err, KF_E_CORRUPT, "%s: malformed key",
                              ident == sk ? "coord_snapshots" : "coord_journal");
            break;
        }
        old_coord_t c;
        old_init(&c, ident, ident_len);
        any = true;
        st = replay(key, &c, snaps, journal, b, err);
        if (st == KF_OK) {
            rewrite(key, b, &c, ctx->now_ms);
            coordinators++;
        }
        old_free(&c);
        if (st == KF_OK && kf_batch_bytes(b) >= UPGRADE_BATCH_BYTES) {
            st = kf_store_write(ctx->store, b, err);
            kf_batch_clear(b);
        }
    }
    if (st == KF_OK) {
        st = kf_iter_status(snaps, err);
    }
    if (st == KF_OK) {
        st = kf_iter_status(journal, err);
    }
    kf_iter_destroy(snaps);
    kf_iter_destroy(journal);
    if (st == KF_OK && (any || kf_store_format_version(ctx->store) < KF_STORE_FORMAT_VERSION)) {
        kf_batch_put_format_version(b);
        st = kf_store_write(ctx->store, b, err);
    }
    kf_batch_destroy(b);
    if (st == KF_OK && any) {
        kf_log_kv(KF_LOG_INFO, "coord", "upgraded coordinators from store format 1",
                  KF_LOG_INT("coordinators", coordinators),
                  KF_LOG_INT("duration_ms", (kf_mono_us() - t0) / 1000));
    }
    return st;
}
