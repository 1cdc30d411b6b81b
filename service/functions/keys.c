/*
 * keys.c - the keys of a process function in memory: per-key value state,
 * event-time timers and the canonical key; and GetKeyState, which reads them.
 *
 * Invariants
 *   1. A key is in the function's map while it is live (state or a timer),
 *      or while a step that touched it is in progress; the step's commit or
 *      rollback drops it when it is neither (step.c).
 *   2. The counters live_keys, timer_count and state_bytes, each key's
 *      ntimers and cost, and the timer tree always agree with the keys:
 *      only kf__key_set_state and kf__key_set_timer change a key's state
 *      or timers.
 *   3. The timer tree orders (at_us, key, name), the name by its text:
 *      timers that fall due together fire in the same order on every run
 *      and after recovery.
 *   4. A canonical key is, per key column, a u32 big-endian length and the
 *      UTF-8 bytes; its text is the value for one key column, else a JSON
 *      array of the values (kf__key_of_row, kf__key_text_of agree).
 */
#include <string.h>

#include <jansson.h>

#include "base/alloc.h"
#include "base/bytes.h"
#include "functions/functions_int.h"

void kf__key_prefix(kf_key_t *k, const function_t *fn) {
    kf_key_reset(k);
    uint8_t b[4];
    kf_put_be32(b, fn->index);
    kf_key_raw(k, b, 4);
}

/* ---- event-time timer heap --------------------------------------------- */

static int key_cmp(const fn_key_t *a, const fn_key_t *b) {
    uint32_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
    int c = memcmp(a->key, b->key, n);
    if (c != 0) {
        return c;
    }
    return a->key_len < b->key_len ? -1 : a->key_len > b->key_len;
}

int kf__timer_cmp(const kf_ostree_node_t *an, const kf_ostree_node_t *bn, const void *ctx) {
    const function_t *fn = ctx;
    const ev_timer_t *a = KF_CONTAINER_OF(an, ev_timer_t, node);
    const ev_timer_t *b = KF_CONTAINER_OF(bn, ev_timer_t, node);
    if (a->at_us != b->at_us) {
        return a->at_us < b->at_us ? -1 : 1;
    }
    int c = key_cmp(a->owner, b->owner);
    if (c != 0) {
        return c;
    }
    /* By the names' text, not their place in timer_names: the order must
     * not change when a descriptor lists the same names in another order. */
    return strcmp(fn->desc->timer_names[a->name], fn->desc->timer_names[b->name]);
}

/* The earliest event-time timer, or NULL. */
ev_timer_t *kf__timer_top(const function_t *fn) {
    kf_ostree_node_t *n = kf_ostree_first(&fn->timers);
    return n ? KF_CONTAINER_OF(n, ev_timer_t, node) : NULL;
}

/* ---- keys -------------------------------------------------------------- */

bool kf__key_live(const function_t *fn, const fn_key_t *k) {
    (void)fn;
    return k->state != KF_STATE_ABSENT || k->ntimers > 0;
}

/* What a key costs in max_state_bytes: nothing while it is not live; then
 * its canonical key, 9 bytes for a value (kind and int64) and 8 more for
 * its expiry (state_ttl_us), and, per timer, its name and 8 bytes of time;
 * the same estimate the stored records (state, timers_by_key,
 * timers_by_time) grow by. */
static uint32_t key_cost(const function_t *fn, const fn_key_t *k) {
    if (!kf__key_live(fn, k)) {
        return 0;
    }
    uint32_t cost = k->key_len + (k->state != KF_STATE_ABSENT ? 9u : 0u) +
                    (k->expires_us != KF__NO_TIME ? 8u : 0u);
    for (size_t i = 0; k->ntimers > 0 && i < fn->desc->n_timer_names; i++) {
        if (k->timers[i] != NULL) {
            cost += fn->timer_name_len[i] + 8u;
        }
    }
    return cost;
}

/* After a change to k: live_keys and state_bytes follow (invariant 2). */
static void key_recount(function_t *fn, fn_key_t *k, bool was_live) {
    bool live = kf__key_live(fn, k);
    fn->live_keys += (uint64_t)live - (uint64_t)was_live;
    uint32_t cost = key_cost(fn, k);
    fn->state_bytes = fn->state_bytes - k->cost + cost;
    k->cost = cost;
}

fn_key_t *kf__key_find(function_t *fn, const uint8_t *key, size_t len) {
    kf_map_node_t *n = kf_map_get(&fn->keys, key, len);
    return n ? KF_CONTAINER_OF(n, fn_key_t, node) : NULL;
}

fn_key_t *kf__key_new(function_t *fn, const uint8_t *key, size_t len, const char *text,
                      size_t text_len) {
    fn_key_t *k = kf_xcalloc(1, sizeof *k);
    k->key = kf_xmemdup(key, len);
    k->key_len = (uint32_t)len;
    k->key_text = kf_xstrndup(text, text_len);
    k->key_text_len = (uint32_t)text_len;
    k->state = KF_STATE_ABSENT;
    k->expires_us = KF__NO_TIME;
    kf_pq_node_init(&k->ttl_node);
    kf_map_insert(&fn->keys, &k->node, k->key, k->key_len);
    return k;
}

void kf__key_free(function_t *fn, fn_key_t *k) {
    for (size_t i = 0; k->timers != NULL && i < fn->desc->n_timer_names; i++) {
        free(k->timers[i]);
    }
    free(k->timers);
    free(k->key);
    free(k->key_text);
    free(k);
}

/* Sets or clears one timer of a key, keeping heap and counters in step. */
void kf__key_set_timer(function_t *fn, fn_key_t *k, uint8_t name, int64_t at_us) {
    if (k->timers == NULL) {
        if (at_us == KF__NO_TIME) {
            return;
        }
        k->timers = kf_xcalloc(fn->desc->n_timer_names, sizeof *k->timers);
    }
    ev_timer_t *t = k->timers[name];
    bool was_live = kf__key_live(fn, k);
    if (at_us == KF__NO_TIME) {
        if (t == NULL) {
            return;
        }
        kf_ostree_remove(&fn->timers, &t->node);
        free(t);
        k->timers[name] = NULL;
        k->ntimers--;
        fn->timer_count--;
    } else if (t != NULL) {
        if (t->at_us == at_us) {
            return;
        }
        kf_ostree_remove(&fn->timers, &t->node);
        t->at_us = at_us;
        kf_ostree_insert(&fn->timers, &t->node);
        return; /* same cost, same liveness */
    } else {
        t = kf_xcalloc(1, sizeof *t);
        t->owner = k;
        t->name = name;
        t->at_us = at_us;
        kf_ostree_node_init(&t->node);
        kf_ostree_insert(&fn->timers, &t->node);
        k->timers[name] = t;
        k->ntimers++;
        fn->timer_count++;
    }
    key_recount(fn, k, was_live);
}

void kf__key_set_state(function_t *fn, fn_key_t *k, uint8_t state, int64_t value,
                       int64_t expires_us) {
    KF_ASSERT(state != KF_STATE_ABSENT || expires_us == KF__NO_TIME);
    bool was_live = kf__key_live(fn, k);
    k->state = state;
    k->value = state == KF_STATE_VALUE ? value : 0;
    if (k->expires_us != expires_us) {
        kf_pq_remove(&fn->expiries, &k->ttl_node); /* no-op when not queued */
        k->expires_us = expires_us;
        if (expires_us != KF__NO_TIME) {
            kf_pq_push(&fn->expiries, &k->ttl_node);
        }
    }
    key_recount(fn, k, was_live);
}

bool kf__expiry_before(const kf_pq_node_t *an, const kf_pq_node_t *bn, const void *ctx) {
    (void)ctx;
    const fn_key_t *a = KF_CONTAINER_OF(an, fn_key_t, ttl_node);
    const fn_key_t *b = KF_CONTAINER_OF(bn, fn_key_t, ttl_node);
    if (a->expires_us != b->expires_us) {
        return a->expires_us < b->expires_us;
    }
    return key_cmp(a, b) < 0;
}

fn_key_t *kf__expiry_top(const function_t *fn) {
    kf_pq_node_t *n = kf_pq_top(&fn->expiries);
    return n ? KF_CONTAINER_OF(n, fn_key_t, ttl_node) : NULL;
}

/* The canonical key of input row `row`: per key column, u32 BE length and
 * the UTF-8 bytes. Key text: the value for one key column, else a JSON
 * array of the values. Both point into fns->scratch / a malloc'd text. */
size_t kf__key_of_row(kf_functions_t *fns, const function_t *fn, const kf_rows_t *rows,
                      uint32_t row, char **text, size_t *text_len, bool *text_owned) {
    kf_cell_t values[KF_KEY_COLUMNS_MAX];
    size_t need = 0;
    for (int c = 0; c < fn->nkey_cols; c++) {
        kf_rows_value(rows, row, (uint32_t)fn->key_cols[c], &values[c]); /* UTF8 */
        need += 4 + values[c].len;
    }
    if (need > fns->scratch_cap) {
        fns->scratch_cap = need * 2;
        fns->scratch = kf_xrealloc(fns->scratch, fns->scratch_cap);
    }
    size_t o = 0;
    for (int c = 0; c < fn->nkey_cols; c++) {
        kf_put_be32(fns->scratch + o, values[c].len);
        memcpy(fns->scratch + o + 4, values[c].p, values[c].len);
        o += 4 + values[c].len;
    }
    if (fn->nkey_cols == 1) {
        *text = (char *)values[0].p;
        *text_len = values[0].len;
        *text_owned = false;
    } else {
        json_t *arr = kf_xcheck(json_array());
        for (int c = 0; c < fn->nkey_cols; c++) {
            json_array_append_new(arr, json_stringn(values[c].p, values[c].len));
        }
        *text = kf_xcheck(json_dumps(arr, JSON_COMPACT));
        json_decref(arr);
        *text_len = strlen(*text);
        *text_owned = true;
    }
    return o;
}

/* The readable form of a stored canonical key (see kf__key_of_row). */
bool kf__key_text_of(const function_t *fn, const uint8_t *key, size_t len, char **text,
                     size_t *text_len) {
    json_t *arr = kf_xcheck(json_array());
    size_t o = 0;
    for (int c = 0; c < fn->nkey_cols; c++) {
        if (len - o < 4 || len - o - 4 < kf_get_be32(key + o)) {
            json_decref(arr);
            return false;
        }
        uint32_t n = kf_get_be32(key + o);
        json_t *column = json_stringn((const char *)key + o + 4, n);
        if (column == NULL) { /* not UTF-8: no key this engine wrote */
            json_decref(arr);
            return false;
        }
        json_array_append_new(arr, column);
        o += 4 + n;
    }
    if (o != len) {
        json_decref(arr);
        return false;
    }
    if (fn->nkey_cols == 1) {
        json_t *v = json_array_get(arr, 0);
        *text_len = json_string_length(v);
        *text = kf_xstrndup(json_string_value(v), *text_len);
    } else {
        *text = kf_xcheck(json_dumps(arr, JSON_COMPACT));
        *text_len = strlen(*text);
    }
    json_decref(arr);
    return true;
}

/* ---- key state --------------------------------------------------------- */

/* The key as it was before the active step, when that step touched it;
 * NULL when the key's memory is its committed state. */
static const undo_t *step_snapshot(const function_t *fn, const fn_key_t *k) {
    const step_t *s = fn->active;
    if (s == NULL || k->step_mark != s->mark) {
        return NULL;
    }
    for (size_t i = 0; i < s->nundo; i++) {
        if (s->undo[i].key == k) {
            return &s->undo[i];
        }
    }
    return NULL;
}

void kf_functions_key_state(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__GetKeyStateRequest *req =
        (const Keyflow__V1__GetKeyStateRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    function_t *fn = kf__fn_require(fns, req->function_id, err);
    if (fn == NULL) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    size_t text_len = strlen(req->key);
    if (text_len > KF_FUNCTION_KEY_TEXT_BYTES_MAX) {
        kf_error_set(err, KF_E_TOO_LARGE, "key: at most %d bytes of text",
                     KF_FUNCTION_KEY_TEXT_BYTES_MAX);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    uint8_t *key = kf_arena_new(cmd->arena, text_len + 4 * KF_KEY_COLUMNS_MAX + 8);
    size_t klen = 0;
    if (fn->nkey_cols == 1) {
        kf_put_be32(key, (uint32_t)text_len);
        memcpy(key + 4, req->key, text_len);
        klen = 4 + text_len;
    } else {
        json_t *arr = json_loads(req->key, 0, NULL);
        bool ok =
            arr != NULL && json_is_array(arr) && json_array_size(arr) == (size_t)fn->nkey_cols;
        for (size_t i = 0; ok && i < json_array_size(arr); i++) {
            json_t *v = json_array_get(arr, i);
            ok = json_is_string(v);
            if (ok) {
                size_t n = json_string_length(v);
                kf_put_be32(key + klen, (uint32_t)n);
                memcpy(key + klen + 4, json_string_value(v), n);
                klen += 4 + n;
            }
        }
        json_decref(arr);
        if (!ok) {
            kf_error_set(err, KF_E_INVALID,
                         "key: this function has %d key columns: give a JSON array of %d strings",
                         fn->nkey_cols, fn->nkey_cols);
            kf_ctx_fail(ctx, cmd);
            return;
        }
    }
    /* The text may be longer than the key it names (JSON escapes), but the
     * canonical key is bounded as every row's is. */
    if (klen > KF_FUNCTION_KEY_BYTES_MAX) {
        kf_error_set(err, KF_E_TOO_LARGE, "key: the key is %zu bytes (at most %d)", klen,
                     KF_FUNCTION_KEY_BYTES_MAX);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    Keyflow__V1__GetKeyStateResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__get_key_state_response__init(resp);
    char *readable;
    size_t readable_len;
    bool well_formed = kf__key_text_of(fn, key, klen, &readable, &readable_len);
    KF_ASSERT(well_formed); /* built from well-formed columns just above */
    resp->key_text = kf_arena_strndup(cmd->arena, readable, readable_len);
    free(readable);
    resp->value_state_name = fn->desc->value_state_name;
    resp->state = KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT;
    fn_key_t *k = kf__key_find(fn, key, klen);
    if (k != NULL) {
        /* A key the step under way touched answers from its snapshot: the
         * step may still be rolled back (see fn_info). */
        const undo_t *before = step_snapshot(fn, k);
        resp->state = (Keyflow__V1__StateKind)(before ? before->state : k->state);
        resp->value = before ? before->value : k->value;
        int64_t expires_us = before ? before->expires_us : k->expires_us;
        resp->state_expires_us = expires_us != KF__NO_TIME ? expires_us : 0;
        resp->timers =
            kf_arena_new(cmd->arena, (fn->desc->n_timer_names + 1) * sizeof *resp->timers);
        for (size_t i = 0; i < fn->desc->n_timer_names; i++) {
            int64_t at = before                              ? before->at[i]
                         : k->timers != NULL && k->timers[i] ? k->timers[i]->at_us
                                                             : KF__NO_TIME;
            if (at == KF__NO_TIME) {
                continue;
            }
            Keyflow__V1__TimerState *t = kf_arena_new(cmd->arena, sizeof *t);
            keyflow__v1__timer_state__init(t);
            t->name = fn->desc->timer_names[i];
            t->at_us = at;
            resp->timers[resp->n_timers++] = t;
        }
    }
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

_Static_assert((int)KF_STATE_ABSENT == (int)KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT &&
                   (int)KF_STATE_NULL == (int)KEYFLOW__V1__STATE_KIND__STATE_KIND_NULL &&
                   (int)KF_STATE_VALUE == (int)KEYFLOW__V1__STATE_KIND__STATE_KIND_VALUE,
               "handler state kinds are the API's");
