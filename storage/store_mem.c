/*
 * store_mem.c - an in-memory store with fault injection, for tests.
 *
 * The contents live in a kf_memdisk_t, which outlives store handles, so a
 * test can close a store (a crash: nothing buffered exists, every write is
 * "synced" when it returns) and reopen it to exercise recovery. Faults: the
 * Nth write through a handle can fail (a failed fsync: the store is then poisoned, like the
 * RocksDB store), and reads can fail.
 *
 * Each family is a sorted array searched by bisection: O(n) inserts, which
 * is fine at test sizes. Iterators take a snapshot of their range at creation.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "storage/store_int.h"

typedef struct mem_entry {
    uint8_t *key;
    size_t key_len;
    uint8_t *value;
    size_t value_len;
} mem_entry_t;

typedef struct mem_family {
    mem_entry_t *entries;
    size_t count;
    size_t cap;
    /* The last range delete, and how many overlapped the one before them
     * (kf_memdisk_range_overlaps). */
    uint8_t *range_begin, *range_end;
    size_t range_begin_len, range_end_len;
    uint64_t range_overlaps;
} mem_family_t;

struct kf_memdisk {
    pthread_mutex_t lock;
    mem_family_t families[KF_CF_COUNT];
    uint64_t writes;             /* successful writes */
    _Atomic uint64_t free_bytes; /* what kf_store_free_bytes reports */
};

typedef struct mem_store {
    kf_store_t base;
    kf_memdisk_t *disk;
    kf_mem_faults_t faults;
    uint64_t writes; /* successful writes through this handle */
    bool poisoned;
} mem_store_t;

typedef enum { OP_PUT, OP_DEL, OP_DEL_RANGE } mem_op_kind_t;

typedef struct mem_op {
    mem_op_kind_t kind;
    kf_cf_t cf;
    uint8_t *a; /* key, or range begin */
    size_t a_len;
    uint8_t *b; /* value, or range end */
    size_t b_len;
} mem_op_t;

typedef struct mem_batch {
    kf_batch_t base;
    mem_store_t *store;
    mem_op_t *ops;
    size_t count;
    size_t cap;
} mem_batch_t;

typedef struct mem_iter {
    kf_iter_t base;
    mem_entry_t *entries; /* snapshot copy */
    size_t count;
    size_t pos;
    bool failed;
} mem_iter_t;

static int cmp_bytes(const void *a, size_t a_len, const void *b, size_t b_len) {
    size_t n = a_len < b_len ? a_len : b_len;
    int c = n ? memcmp(a, b, n) : 0;
    if (c != 0) {
        return c;
    }
    return a_len < b_len ? -1 : (a_len > b_len ? 1 : 0);
}

/* First index whose key is >= key. */
static size_t lower_bound(const mem_family_t *f, const void *key, size_t key_len) {
    size_t lo = 0, hi = f->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cmp_bytes(f->entries[mid].key, f->entries[mid].key_len, key, key_len) < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

static void family_put(mem_family_t *f, const uint8_t *key, size_t key_len, const uint8_t *value,
                       size_t value_len) {
    size_t i = lower_bound(f, key, key_len);
    if (i < f->count && cmp_bytes(f->entries[i].key, f->entries[i].key_len, key, key_len) == 0) {
        free(f->entries[i].value);
        f->entries[i].value = kf_xmemdup(value, value_len);
        f->entries[i].value_len = value_len;
        return;
    }
    if (f->count == f->cap) {
        f->cap = f->cap ? f->cap * 2 : 64;
        f->entries = kf_xrealloc(f->entries, f->cap * sizeof *f->entries);
    }
    memmove(&f->entries[i + 1], &f->entries[i], (f->count - i) * sizeof *f->entries);
    f->entries[i] =
        (mem_entry_t){kf_xmemdup(key, key_len), key_len, kf_xmemdup(value, value_len), value_len};
    f->count++;
}

static void family_del_range(mem_family_t *f, const uint8_t *begin, size_t begin_len,
                             const uint8_t *end, size_t end_len) {
    if (f->range_end != NULL && cmp_bytes(begin, begin_len, f->range_end, f->range_end_len) < 0 &&
        cmp_bytes(f->range_begin, f->range_begin_len, end, end_len) < 0) {
        f->range_overlaps++;
    }
    free(f->range_begin);
    free(f->range_end);
    f->range_begin = kf_xmemdup(begin, begin_len);
    f->range_begin_len = begin_len;
    f->range_end = kf_xmemdup(end, end_len);
    f->range_end_len = end_len;
    size_t i = lower_bound(f, begin, begin_len);
    size_t j = lower_bound(f, end, end_len);
    if (j <= i) {
        return;
    }
    for (size_t k = i; k < j; k++) {
        free(f->entries[k].key);
        free(f->entries[k].value);
    }
    memmove(&f->entries[i], &f->entries[j], (f->count - j) * sizeof *f->entries);
    f->count -= j - i;
}

static void family_del(mem_family_t *f, const uint8_t *key, size_t key_len) {
    size_t i = lower_bound(f, key, key_len);
    if (i < f->count && cmp_bytes(f->entries[i].key, f->entries[i].key_len, key, key_len) == 0) {
        free(f->entries[i].key);
        free(f->entries[i].value);
        memmove(&f->entries[i], &f->entries[i + 1], (f->count - i - 1) * sizeof *f->entries);
        f->count--;
    }
}

kf_memdisk_t *kf_memdisk_create(void) {
    kf_memdisk_t *d = kf_xcalloc(1, sizeof *d);
    pthread_mutex_init(&d->lock, NULL);
    atomic_store(&d->free_bytes, UINT64_MAX);
    return d;
}

void kf_memdisk_set_free_bytes(kf_memdisk_t *d, uint64_t free_bytes) {
    atomic_store(&d->free_bytes, free_bytes);
}

void kf_memdisk_destroy(kf_memdisk_t *d) {
    if (d == NULL) {
        return;
    }
    for (int c = 0; c < KF_CF_COUNT; c++) {
        mem_family_t *f = &d->families[c];
        for (size_t i = 0; i < f->count; i++) {
            free(f->entries[i].key);
            free(f->entries[i].value);
        }
        free(f->entries);
        free(f->range_begin);
        free(f->range_end);
    }
    pthread_mutex_destroy(&d->lock);
    free(d);
}

uint64_t kf_memdisk_range_overlaps(const kf_memdisk_t *d, kf_cf_t cf) {
    pthread_mutex_lock((pthread_mutex_t *)&d->lock);
    uint64_t n = d->families[cf].range_overlaps;
    pthread_mutex_unlock((pthread_mutex_t *)&d->lock);
    return n;
}

uint64_t kf_memdisk_writes(const kf_memdisk_t *d) {
    pthread_mutex_lock((pthread_mutex_t *)&d->lock);
    uint64_t n = d->writes;
    pthread_mutex_unlock((pthread_mutex_t *)&d->lock);
    return n;
}

/* ---- batches ---------------------------------------------------------- */

static void mb_clear(kf_batch_t *b) {
    mem_batch_t *mb = (mem_batch_t *)b;
    for (size_t i = 0; i < mb->count; i++) {
        free(mb->ops[i].a);
        free(mb->ops[i].b);
    }
    mb->count = 0;
}

static void mb_destroy(kf_batch_t *b) {
    mem_batch_t *mb = (mem_batch_t *)b;
    mb_clear(b);
    free(mb->ops);
    free(mb);
}

static void mb_add(mem_batch_t *mb, mem_op_t op) {
    if (mb->count == mb->cap) {
        mb->cap = mb->cap ? mb->cap * 2 : 16;
        mb->ops = kf_xrealloc(mb->ops, mb->cap * sizeof *mb->ops);
    }
    mb->ops[mb->count++] = op;
}

static void mb_put(kf_batch_t *b, kf_cf_t cf, const void *key, size_t key_len, const void *value,
                   size_t value_len) {
    mb_add((mem_batch_t *)b, (mem_op_t){OP_PUT, cf, kf_xmemdup(key, key_len), key_len,
                                        kf_xmemdup(value, value_len), value_len});
}

static void mb_del(kf_batch_t *b, kf_cf_t cf, const void *key, size_t key_len) {
    mb_add((mem_batch_t *)b, (mem_op_t){OP_DEL, cf, kf_xmemdup(key, key_len), key_len, NULL, 0});
}

static void mb_del_range(kf_batch_t *b, kf_cf_t cf, const void *begin, size_t begin_len,
                         const void *end, size_t end_len) {
    mb_add((mem_batch_t *)b, (mem_op_t){OP_DEL_RANGE, cf, kf_xmemdup(begin, begin_len), begin_len,
                                        kf_xmemdup(end, end_len), end_len});
}

static const kf_batch_ops_t mem_batch_ops = {
    .destroy = mb_destroy,
    .put = mb_put,
    .del = mb_del,
    .del_range = mb_del_range,
    .clear = mb_clear,
};

static kf_batch_t *ms_batch_create(kf_store_t *s) {
    mem_batch_t *mb = kf_xcalloc(1, sizeof *mb);
    mb->base.ops = &mem_batch_ops;
    mb->store = (mem_store_t *)s;
    return &mb->base;
}

/* ---- iterators -------------------------------------------------------- */

static void mi_destroy(kf_iter_t *i) {
    mem_iter_t *mi = (mem_iter_t *)i;
    for (size_t k = 0; k < mi->count; k++) {
        free(mi->entries[k].key);
        free(mi->entries[k].value);
    }
    free(mi->entries);
    free(mi);
}

static void mi_seek(kf_iter_t *i, const void *key, size_t key_len) {
    mem_iter_t *mi = (mem_iter_t *)i;
    mem_family_t f = {mi->entries, mi->count, mi->count};
    mi->pos = lower_bound(&f, key, key_len);
}

static void mi_seek_first(kf_iter_t *i) {
    ((mem_iter_t *)i)->pos = 0;
}
static bool mi_valid(kf_iter_t *i) {
    mem_iter_t *mi = (mem_iter_t *)i;
    return !mi->failed && mi->pos < mi->count;
}
static void mi_next(kf_iter_t *i) {
    mem_iter_t *mi = (mem_iter_t *)i;
    KF_ASSERT(mi->pos < mi->count);
    mi->pos++;
}
static const void *mi_key(kf_iter_t *i, size_t *len) {
    mem_iter_t *mi = (mem_iter_t *)i;
    *len = mi->entries[mi->pos].key_len;
    return mi->entries[mi->pos].key;
}
static const void *mi_value(kf_iter_t *i, size_t *len) {
    mem_iter_t *mi = (mem_iter_t *)i;
    *len = mi->entries[mi->pos].value_len;
    return mi->entries[mi->pos].value;
}
static kf_status_t mi_status(kf_iter_t *i, kf_error_t *err) {
    return ((mem_iter_t *)i)->failed ? kf_error_set(err, KF_E_IO, "injected read fault") : KF_OK;
}

static const kf_iter_ops_t mem_iter_ops = {
    .destroy = mi_destroy,
    .seek = mi_seek,
    .seek_first = mi_seek_first,
    .valid = mi_valid,
    .next = mi_next,
    .key = mi_key,
    .value = mi_value,
    .status = mi_status,
};

static kf_status_t ms_iter_create(kf_store_t *s, kf_cf_t cf, const void *lower, size_t lower_len,
                                  const void *upper, size_t upper_len, kf_iter_t **out,
                                  kf_error_t *err) {
    (void)err;
    mem_store_t *ms = (mem_store_t *)s;
    mem_iter_t *mi = kf_xcalloc(1, sizeof *mi);
    mi->base.ops = &mem_iter_ops;
    mi->failed = ms->faults.fail_reads;
    pthread_mutex_lock(&ms->disk->lock);
    mem_family_t *f = &ms->disk->families[cf];
    size_t from = lower ? lower_bound(f, lower, lower_len) : 0;
    size_t to = upper ? lower_bound(f, upper, upper_len) : f->count;
    if (to > from) {
        mi->count = to - from;
        mi->entries = kf_xmalloc(mi->count * sizeof *mi->entries);
        for (size_t k = 0; k < mi->count; k++) {
            mem_entry_t *e = &f->entries[from + k];
            mi->entries[k] = (mem_entry_t){kf_xmemdup(e->key, e->key_len), e->key_len,
                                           kf_xmemdup(e->value, e->value_len), e->value_len};
        }
    }
    pthread_mutex_unlock(&ms->disk->lock);
    *out = &mi->base;
    return KF_OK;
}

/* ---- store ------------------------------------------------------------ */

static kf_status_t ms_get(kf_store_t *s, kf_cf_t cf, const void *key, size_t key_len,
                          kf_value_t *value, bool *found, kf_error_t *err) {
    mem_store_t *ms = (mem_store_t *)s;
    if (ms->faults.fail_reads) {
        return kf_error_set(err, KF_E_IO, "injected read fault");
    }
    pthread_mutex_lock(&ms->disk->lock);
    mem_family_t *f = &ms->disk->families[cf];
    size_t i = lower_bound(f, key, key_len);
    if (i < f->count && cmp_bytes(f->entries[i].key, f->entries[i].key_len, key, key_len) == 0) {
        value->data = kf_xmemdup(f->entries[i].value, f->entries[i].value_len);
        value->len = f->entries[i].value_len;
        *found = true;
    }
    pthread_mutex_unlock(&ms->disk->lock);
    return KF_OK;
}

static kf_status_t ms_write(kf_store_t *s, kf_batch_t *b, kf_error_t *err) {
    mem_store_t *ms = (mem_store_t *)s;
    mem_batch_t *mb = (mem_batch_t *)b;
    KF_ASSERT(mb->store == ms);
    pthread_mutex_lock(&ms->disk->lock);
    if (ms->poisoned ||
        (ms->faults.fail_write_at != 0 && ms->writes + 1 >= ms->faults.fail_write_at)) {
        ms->poisoned = true;
        pthread_mutex_unlock(&ms->disk->lock);
        return kf_error_set(err, KF_E_IO, "injected fsync failure");
    }
    for (size_t i = 0; i < mb->count; i++) {
        mem_op_t *op = &mb->ops[i];
        mem_family_t *f = &ms->disk->families[op->cf];
        switch (op->kind) {
        case OP_PUT: family_put(f, op->a, op->a_len, op->b, op->b_len); break;
        case OP_DEL: family_del(f, op->a, op->a_len); break;
        case OP_DEL_RANGE: family_del_range(f, op->a, op->a_len, op->b, op->b_len); break;
        }
    }
    ms->disk->writes++;
    ms->writes++;
    pthread_mutex_unlock(&ms->disk->lock);
    return KF_OK;
}

static kf_status_t ms_free_bytes(kf_store_t *s, uint64_t *free_bytes, kf_error_t *err) {
    (void)err;
    *free_bytes = atomic_load(&((mem_store_t *)s)->disk->free_bytes);
    return KF_OK;
}

static void ms_memory(kf_store_t *s, kf_store_memory_t *out) {
    kf_memdisk_t *d = ((mem_store_t *)s)->disk;
    pthread_mutex_lock(&d->lock);
    for (int c = 0; c < KF_CF_COUNT; c++) {
        for (size_t i = 0; i < d->families[c].count; i++) {
            out->memtable_bytes +=
                d->families[c].entries[i].key_len + d->families[c].entries[i].value_len;
        }
    }
    pthread_mutex_unlock(&d->lock);
}

static void ms_close(kf_store_t *s) {
    free(s);
}

static const kf_store_ops_t mem_store_ops = {
    .close = ms_close,
    .get = ms_get,
    .write = ms_write,
    .batch_create = ms_batch_create,
    .iter_create = ms_iter_create,
    .free_bytes = ms_free_bytes,
    .memory = ms_memory,
};

kf_status_t kf_store_open_mem(kf_memdisk_t *disk, const kf_mem_faults_t *faults, kf_store_t **out,
                              kf_error_t *err) {
    mem_store_t *ms = calloc(1, sizeof *ms);
    if (ms == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate the store");
    }
    ms->base.ops = &mem_store_ops;
    ms->disk = disk;
    if (faults != NULL) {
        ms->faults = *faults;
    }
    kf_mem_faults_t saved = ms->faults;
    ms->faults.fail_write_at = 0; /* the format record is not one of the counted writes */
    ms->faults.fail_reads = false;
    kf_status_t st = kf__store_check_format(&ms->base, err);
    ms->faults = saved;
    ms->writes = 0;
    if (st != KF_OK) {
        free(ms);
        return st;
    }
    *out = &ms->base;
    return KF_OK;
}
