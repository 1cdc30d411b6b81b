/*
 * overlay.c - staged records of groups not yet durable, over the store.
 *
 * Staged records (entry_t) live in a treap ordered by (family, key), so
 * that a read finds one in O(log n) and an iterator walks them in key order
 * beside the store's iterator. Staged prefix deletes (prefix_t) live in a
 * hash map keyed by (family, prefix); a key is under one when one of the
 * family's few prefix lengths finds it there. Both kinds are also on one
 * list in staging order, which is group order (groups only increase and a
 * restaged item moves to the end), so kf_overlay_durable pops from the
 * front.
 *
 * Invariants (besides overlay.h's)
 *   1. The staging list is ordered by group, oldest first.
 *   2. An entry is in the treap and on the list, or freed; likewise a
 *      prefix in the map.
 *   3. bytes = the key and value bytes of every staged item.
 */
#include "storage/overlay.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/map.h"
#include "base/ostree.h"
#include "storage/keys.h"
#include "storage/store_int.h"

typedef struct staged {
    struct staged *prev; /* the staging list */
    struct staged *next;
    uint64_t group; /* the latest group that wrote it */
    bool is_prefix;
} staged_t;

typedef struct entry {
    staged_t staged;
    kf_ostree_node_t node;
    uint8_t *value; /* owned; NULL for a staged delete */
    size_t value_len;
    bool deleted;
    uint8_t cf;
    size_t key_len;
    uint8_t key[];
} entry_t;

/* Map key: the family's byte, then the prefix. */
typedef struct prefix {
    staged_t staged;
    kf_map_node_t node;
    size_t len;
    uint8_t key[];
} prefix_t;

typedef struct family {
    bool tracked;
    uint32_t prefix_lengths; /* distinct lengths in use */
    size_t prefix_length[KF_OVERLAY_PREFIX_LENGTHS_MAX];
} family_t;

struct kf_overlay {
    kf_store_t *store;
    kf_ostree_t entries;
    kf_map_t prefixes;
    staged_t *head; /* oldest group first */
    staged_t *tail;
    size_t count;
    size_t bytes;
    family_t family[KF_CF_COUNT];
};

/* Bytewise, a shorter key before its extensions: RocksDB's order. */
static int key_cmp(const void *a, size_t a_len, const void *b, size_t b_len) {
    size_t n = a_len < b_len ? a_len : b_len;
    int c = n ? memcmp(a, b, n) : 0;
    if (c != 0) {
        return c;
    }
    return a_len < b_len ? -1 : a_len > b_len ? 1 : 0;
}

static entry_t *entry_of(const kf_ostree_node_t *n) {
    return n ? KF_CONTAINER_OF(n, entry_t, node) : NULL;
}

static int entry_cmp_to(const entry_t *e, uint8_t cf, const void *key, size_t key_len) {
    if (e->cf != cf) {
        return e->cf < cf ? -1 : 1;
    }
    return key_cmp(e->key, e->key_len, key, key_len);
}

static int entry_cmp(const kf_ostree_node_t *a, const kf_ostree_node_t *b, const void *ctx) {
    (void)ctx;
    const entry_t *eb = entry_of(b);
    return entry_cmp_to(entry_of(a), eb->cf, eb->key, eb->key_len);
}

/* The first entry at or after (cf, key), or NULL. */
static entry_t *lower_bound(const kf_overlay_t *ov, uint8_t cf, const void *key, size_t key_len) {
    kf_ostree_node_t *best = NULL;
    for (kf_ostree_node_t *n = ov->entries.root; n != NULL;) {
        if (entry_cmp_to(entry_of(n), cf, key, key_len) >= 0) {
            best = n;
            n = n->left;
        } else {
            n = n->right;
        }
    }
    return entry_of(best);
}

static entry_t *find(const kf_overlay_t *ov, uint8_t cf, const void *key, size_t key_len) {
    entry_t *e = lower_bound(ov, cf, key, key_len);
    return e != NULL && entry_cmp_to(e, cf, key, key_len) == 0 ? e : NULL;
}

/* ---- the staging list ---------------------------------------------------- */

static void list_unlink(kf_overlay_t *ov, staged_t *s) {
    if (s->prev) {
        s->prev->next = s->next;
    } else {
        ov->head = s->next;
    }
    if (s->next) {
        s->next->prev = s->prev;
    } else {
        ov->tail = s->prev;
    }
    s->prev = s->next = NULL;
}

static void list_append(kf_overlay_t *ov, staged_t *s, uint64_t group) {
    KF_ASSERT(ov->tail == NULL || ov->tail->group <= group); /* groups only increase */
    s->group = group;
    s->prev = ov->tail;
    s->next = NULL;
    if (ov->tail) {
        ov->tail->next = s;
    } else {
        ov->head = s;
    }
    ov->tail = s;
}

static void restage(kf_overlay_t *ov, staged_t *s, uint64_t group) {
    list_unlink(ov, s);
    list_append(ov, s, group);
}

/* ---- staging ------------------------------------------------------------- */

kf_overlay_t *kf_overlay_create(kf_store_t *store) {
    kf_overlay_t *ov = kf_xcalloc(1, sizeof *ov);
    ov->store = store;
    kf_ostree_init(&ov->entries, entry_cmp, ov);
    kf_map_init(&ov->prefixes);
    return ov;
}

static void item_free(kf_overlay_t *ov, staged_t *s) {
    if (s->is_prefix) {
        prefix_t *p = KF_CONTAINER_OF(s, prefix_t, staged);
        kf_map_remove(&ov->prefixes, &p->node);
        ov->bytes -= p->len;
        free(p);
    } else {
        entry_t *e = KF_CONTAINER_OF(s, entry_t, staged);
        kf_ostree_remove(&ov->entries, &e->node);
        ov->bytes -= e->key_len + e->value_len;
        free(e->value);
        free(e);
    }
    ov->count--;
}

void kf_overlay_destroy(kf_overlay_t *ov) {
    if (ov == NULL) {
        return;
    }
    while (ov->head != NULL) {
        staged_t *s = ov->head;
        list_unlink(ov, s);
        item_free(ov, s);
    }
    kf_ostree_deinit(&ov->entries);
    kf_map_deinit(&ov->prefixes);
    free(ov);
}

void kf_overlay_track(kf_overlay_t *ov, kf_cf_t cf) {
    KF_ASSERT((unsigned)cf < KF_CF_COUNT);
    ov->family[cf].tracked = true;
}

bool kf_overlay_tracks(const kf_overlay_t *ov, kf_cf_t cf) {
    KF_ASSERT((unsigned)cf < KF_CF_COUNT);
    return ov->family[cf].tracked;
}

/* The entry for (cf, key), created (as a delete) when there is none, and
 * restaged under `group`. */
static entry_t *entry_stage(kf_overlay_t *ov, uint64_t group, kf_cf_t cf, const void *key,
                            size_t key_len) {
    KF_ASSERT(kf_overlay_tracks(ov, cf));
    entry_t *e = find(ov, (uint8_t)cf, key, key_len);
    if (e != NULL) {
        restage(ov, &e->staged, group);
        return e;
    }
    e = kf_xmalloc(sizeof *e + key_len);
    memset(e, 0, sizeof *e);
    e->cf = (uint8_t)cf;
    e->key_len = key_len;
    memcpy(e->key, key, key_len);
    e->deleted = true;
    kf_ostree_node_init(&e->node);
    kf_ostree_insert(&ov->entries, &e->node);
    list_append(ov, &e->staged, group);
    ov->count++;
    ov->bytes += key_len;
    return e;
}

static void entry_set(kf_overlay_t *ov, entry_t *e, const void *value, size_t value_len,
                      bool deleted) {
    ov->bytes -= e->value_len;
    free(e->value);
    e->value = NULL;
    e->value_len = 0;
    e->deleted = deleted;
    if (!deleted) {
        e->value = kf_xmalloc(value_len);
        if (value_len > 0) {
            memcpy(e->value, value, value_len);
        }
        e->value_len = value_len;
        ov->bytes += value_len;
    }
}

void kf_overlay_put(kf_overlay_t *ov, uint64_t group, kf_cf_t cf, const void *key, size_t key_len,
                    const void *value, size_t value_len) {
    entry_set(ov, entry_stage(ov, group, cf, key, key_len), value, value_len, false);
}

void kf_overlay_delete(kf_overlay_t *ov, uint64_t group, kf_cf_t cf, const void *key,
                       size_t key_len) {
    entry_set(ov, entry_stage(ov, group, cf, key, key_len), NULL, 0, true);
}

static bool has_prefix(const entry_t *e, uint8_t cf, const void *prefix, size_t len) {
    return e->cf == cf && e->key_len >= len && memcmp(e->key, prefix, len) == 0;
}

void kf_overlay_delete_prefix(kf_overlay_t *ov, uint64_t group, kf_cf_t cf, const void *prefix,
                              size_t prefix_len) {
    KF_ASSERT(kf_overlay_tracks(ov, cf) && prefix_len > 0 && prefix_len <= KF_STORE_KEY_BYTES_MAX);
    family_t *f = &ov->family[cf];
    uint32_t i = 0;
    while (i < f->prefix_lengths && f->prefix_length[i] != prefix_len) {
        i++;
    }
    if (i == f->prefix_lengths) {
        KF_ASSERT(f->prefix_lengths < KF_OVERLAY_PREFIX_LENGTHS_MAX);
        f->prefix_length[f->prefix_lengths++] = prefix_len;
    }
    uint8_t mkey[KF_STORE_KEY_BYTES_MAX + 1];
    mkey[0] = (uint8_t)cf;
    memcpy(mkey + 1, prefix, prefix_len);
    kf_map_node_t *n = kf_map_get(&ov->prefixes, mkey, prefix_len + 1);
    if (n != NULL) {
        restage(ov, &KF_CONTAINER_OF(n, prefix_t, node)->staged, group);
    } else {
        prefix_t *p = kf_xmalloc(sizeof *p + prefix_len + 1);
        memset(p, 0, sizeof *p);
        p->staged.is_prefix = true;
        p->len = prefix_len + 1;
        memcpy(p->key, mkey, p->len);
        kf_map_insert(&ov->prefixes, &p->node, p->key, p->len);
        list_append(ov, &p->staged, group);
        ov->count++;
        ov->bytes += p->len;
    }
    /* Staged records under the prefix become deletes of this group
     * (invariant 3 of overlay.h). */
    for (entry_t *e = lower_bound(ov, (uint8_t)cf, prefix, prefix_len);
         e != NULL && has_prefix(e, (uint8_t)cf, prefix, prefix_len);
         e = entry_of(kf_ostree_next(&e->node))) {
        restage(ov, &e->staged, group);
        entry_set(ov, e, NULL, 0, true);
    }
}

void kf_overlay_durable(kf_overlay_t *ov, uint64_t group) {
    while (ov->head != NULL && ov->head->group <= group) {
        staged_t *s = ov->head;
        list_unlink(ov, s);
        item_free(ov, s);
    }
}

size_t kf_overlay_count(const kf_overlay_t *ov) {
    return ov->count;
}

size_t kf_overlay_bytes(const kf_overlay_t *ov) {
    return ov->bytes;
}

/* ---- reading ------------------------------------------------------------- */

/* Whether a staged prefix delete covers (cf, key). */
static bool under_deleted_prefix(const kf_overlay_t *ov, uint8_t cf, const void *key,
                                 size_t key_len) {
    const family_t *f = &ov->family[cf];
    if (f->prefix_lengths == 0 || ov->prefixes.count == 0) {
        return false;
    }
    uint8_t mkey[KF_STORE_KEY_BYTES_MAX + 1];
    mkey[0] = cf;
    for (uint32_t i = 0; i < f->prefix_lengths; i++) {
        size_t len = f->prefix_length[i];
        if (len > key_len || len > KF_STORE_KEY_BYTES_MAX) {
            continue;
        }
        memcpy(mkey + 1, key, len);
        if (kf_map_get(&ov->prefixes, mkey, len + 1) != NULL) {
            return true;
        }
    }
    return false;
}

kf_status_t kf_overlay_get(kf_overlay_t *ov, kf_cf_t cf, const void *key, size_t key_len,
                           kf_value_t *value, bool *found, kf_error_t *err) {
    KF_ASSERT((unsigned)cf < KF_CF_COUNT);
    value->data = NULL;
    value->len = 0;
    *found = false;
    if (!ov->family[cf].tracked) {
        return kf_store_get(ov->store, cf, key, key_len, value, found, err);
    }
    const entry_t *e = find(ov, (uint8_t)cf, key, key_len);
    if (e != NULL) {
        if (!e->deleted) {
            value->data = kf_xmalloc(e->value_len);
            if (e->value_len > 0) {
                memcpy(value->data, e->value, e->value_len);
            }
            value->len = e->value_len;
            *found = true;
        }
        return KF_OK;
    }
    if (under_deleted_prefix(ov, (uint8_t)cf, key, key_len)) {
        return KF_OK;
    }
    return kf_store_get(ov->store, cf, key, key_len, value, found, err);
}

/* The merged iterator: the store's iterator and a cursor over the staged
 * entries of the family, both at or after the position; the smaller key
 * wins, a staged entry hides the store's record of its key, and staged
 * deletes and keys under deleted prefixes are skipped. */
typedef struct merged_iter {
    kf_iter_t base;
    kf_overlay_t *ov;
    kf_iter_t *store_it;
    uint8_t cf;
    uint8_t *lower; /* owned copies; NULL: unbounded */
    size_t lower_len;
    uint8_t *upper;
    size_t upper_len;
    entry_t *staged; /* the next staged entry in range, or NULL */
    bool at_staged;  /* the current record is `staged` (else the store's) */
    bool valid;
} merged_iter_t;

static bool below_upper(const merged_iter_t *m, const void *key, size_t key_len) {
    return m->upper == NULL || key_cmp(key, key_len, m->upper, m->upper_len) < 0;
}

static void staged_check(merged_iter_t *m) {
    if (m->staged != NULL &&
        (m->staged->cf != m->cf || !below_upper(m, m->staged->key, m->staged->key_len))) {
        m->staged = NULL;
    }
}

/* Moves to the first visible record at or after both cursors. */
static void settle(merged_iter_t *m) {
    for (;;) {
        staged_check(m);
        bool store_ok = kf_iter_valid(m->store_it);
        size_t sk_len = 0;
        const void *sk = store_ok ? kf_iter_key(m->store_it, &sk_len) : NULL;
        if (m->staged == NULL && !store_ok) {
            m->valid = false;
            return;
        }
        int c = m->staged == NULL ? 1
                : !store_ok       ? -1
                                  : key_cmp(m->staged->key, m->staged->key_len, sk, sk_len);
        if (c <= 0) {
            if (c == 0) {
                kf_iter_next(m->store_it); /* hidden by the staged entry */
            }
            if (m->staged->deleted) {
                m->staged = entry_of(kf_ostree_next(&m->staged->node));
                continue;
            }
            m->at_staged = true;
            m->valid = true;
            return;
        }
        if (under_deleted_prefix(m->ov, m->cf, sk, sk_len)) {
            kf_iter_next(m->store_it);
            continue;
        }
        m->at_staged = false;
        m->valid = true;
        return;
    }
}

static void mi_seek(kf_iter_t *it, const void *key, size_t key_len) {
    merged_iter_t *m = (merged_iter_t *)it;
    if (m->lower != NULL && key_cmp(key, key_len, m->lower, m->lower_len) < 0) {
        key = m->lower;
        key_len = m->lower_len;
    }
    kf_iter_seek(m->store_it, key, key_len);
    m->staged = lower_bound(m->ov, m->cf, key, key_len);
    settle(m);
}

static void mi_seek_first(kf_iter_t *it) {
    merged_iter_t *m = (merged_iter_t *)it;
    mi_seek(it, m->lower != NULL ? m->lower : (const uint8_t *)"", m->lower_len);
}

static bool mi_valid(kf_iter_t *it) {
    return ((merged_iter_t *)it)->valid;
}

static void mi_next(kf_iter_t *it) {
    merged_iter_t *m = (merged_iter_t *)it;
    KF_ASSERT(m->valid);
    if (m->at_staged) {
        m->staged = entry_of(kf_ostree_next(&m->staged->node));
    } else {
        kf_iter_next(m->store_it);
    }
    settle(m);
}

static const void *mi_key(kf_iter_t *it, size_t *len) {
    merged_iter_t *m = (merged_iter_t *)it;
    KF_ASSERT(m->valid);
    if (m->at_staged) {
        *len = m->staged->key_len;
        return m->staged->key;
    }
    return kf_iter_key(m->store_it, len);
}

static const void *mi_value(kf_iter_t *it, size_t *len) {
    merged_iter_t *m = (merged_iter_t *)it;
    KF_ASSERT(m->valid);
    if (m->at_staged) {
        *len = m->staged->value_len;
        return m->staged->value;
    }
    return kf_iter_value(m->store_it, len);
}

static kf_status_t mi_status(kf_iter_t *it, kf_error_t *err) {
    return kf_iter_status(((merged_iter_t *)it)->store_it, err);
}

static void mi_destroy(kf_iter_t *it) {
    merged_iter_t *m = (merged_iter_t *)it;
    kf_iter_destroy(m->store_it);
    free(m->lower);
    free(m->upper);
    free(m);
}

static const kf_iter_ops_t merged_iter_ops = {
    .destroy = mi_destroy,
    .seek = mi_seek,
    .seek_first = mi_seek_first,
    .valid = mi_valid,
    .next = mi_next,
    .key = mi_key,
    .value = mi_value,
    .status = mi_status,
};

static uint8_t *copy_bound(const void *p, size_t len) {
    if (p == NULL) {
        return NULL;
    }
    uint8_t *c = kf_xmalloc(len);
    if (len > 0) {
        memcpy(c, p, len);
    }
    return c;
}

kf_status_t kf_overlay_iter_create(kf_overlay_t *ov, kf_cf_t cf, const void *lower,
                                   size_t lower_len, const void *upper, size_t upper_len,
                                   kf_iter_t **out, kf_error_t *err) {
    kf_iter_t *store_it;
    kf_status_t st =
        kf_iter_create(ov->store, cf, lower, lower_len, upper, upper_len, &store_it, err);
    if (st != KF_OK || !ov->family[cf].tracked) {
        *out = st == KF_OK ? store_it : NULL;
        return st;
    }
    merged_iter_t *m = kf_xcalloc(1, sizeof *m);
    m->base.ops = &merged_iter_ops;
    m->ov = ov;
    m->store_it = store_it;
    m->cf = (uint8_t)cf;
    m->lower = copy_bound(lower, lower_len);
    m->lower_len = lower != NULL ? lower_len : 0;
    m->upper = copy_bound(upper, upper_len);
    m->upper_len = upper != NULL ? upper_len : 0;
    *out = &m->base;
    return KF_OK;
}
