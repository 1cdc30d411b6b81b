/*
 * store_rocks.c - the RocksDB implementation of the storage seam.
 *
 * The only file in keyflow that includes rocksdb/c.h. RocksDB errors are
 * translated into statuses here, once. Every write uses sync = true; a failed
 * write poisons the store (see store.h, invariant 1).
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include <rocksdb/c.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/log.h"
#include "storage/store_int.h"

typedef struct rocks_store {
    kf_store_t base;
    char *path; /* the data directory, for statvfs */
    rocksdb_t *db;
    rocksdb_options_t *options;
    rocksdb_options_t *cf_options[KF_CF_COUNT];
    rocksdb_column_family_handle_t *cf[KF_CF_COUNT];
    rocksdb_writeoptions_t *write_sync;
    rocksdb_readoptions_t *read;
    rocksdb_cache_t *block_cache;               /* one for every family */
    bool own_cache;                             /* not a kf_store_cache_t's */
    rocksdb_block_based_table_options_t *table; /* with block_cache */
    atomic_bool poisoned;                       /* a write failed: refuse all later writes */
} rocks_store_t;

typedef struct rocks_batch {
    kf_batch_t base;
    rocks_store_t *store;
    rocksdb_writebatch_t *wb;
} rocks_batch_t;

typedef struct rocks_iter {
    kf_iter_t base;
    rocksdb_iterator_t *it;
    rocksdb_readoptions_t *read;
    char *lower; /* bounds must outlive the iterator */
    size_t lower_len;
    char *upper;
    size_t upper_len;
} rocks_iter_t;

struct kf_store_cache {
    rocksdb_cache_t *cache;
};

kf_store_cache_t *kf_store_cache_create(size_t capacity_bytes) {
    kf_store_cache_t *c = calloc(1, sizeof *c);
    if (c == NULL) {
        return NULL;
    }
    c->cache = rocksdb_cache_create_lru(capacity_bytes);
    if (c->cache == NULL) {
        free(c);
        return NULL;
    }
    return c;
}

void kf_store_cache_destroy(kf_store_cache_t *c) {
    if (c != NULL) {
        rocksdb_cache_destroy(c->cache);
        free(c);
    }
}

uint64_t kf_store_cache_bytes(const kf_store_cache_t *c) {
    return rocksdb_cache_get_usage(c->cache);
}

static kf_status_t rocks_error(kf_error_t *err, char *rocks_err, const char *what) {
    kf_status_t st = kf_error_set(err, KF_E_IO, "rocksdb %s: %s", what, rocks_err);
    rocksdb_free(rocks_err);
    return st;
}

/* ---- batches ---------------------------------------------------------- */

static void rb_destroy(kf_batch_t *b) {
    rocks_batch_t *rb = (rocks_batch_t *)b;
    rocksdb_writebatch_destroy(rb->wb);
    free(rb);
}

static void rb_put(kf_batch_t *b, kf_cf_t cf, const void *key, size_t key_len, const void *value,
                   size_t value_len) {
    rocks_batch_t *rb = (rocks_batch_t *)b;
    rocksdb_writebatch_put_cf(rb->wb, rb->store->cf[cf], key, key_len, value, value_len);
}

static void rb_del(kf_batch_t *b, kf_cf_t cf, const void *key, size_t key_len) {
    rocks_batch_t *rb = (rocks_batch_t *)b;
    rocksdb_writebatch_delete_cf(rb->wb, rb->store->cf[cf], key, key_len);
}

static void rb_del_range(kf_batch_t *b, kf_cf_t cf, const void *begin, size_t begin_len,
                         const void *end, size_t end_len) {
    rocks_batch_t *rb = (rocks_batch_t *)b;
    rocksdb_writebatch_delete_range_cf(rb->wb, rb->store->cf[cf], begin, begin_len, end, end_len);
}

static void rb_clear(kf_batch_t *b) {
    rocksdb_writebatch_clear(((rocks_batch_t *)b)->wb);
}

static const kf_batch_ops_t rocks_batch_ops = {
    .destroy = rb_destroy,
    .put = rb_put,
    .del = rb_del,
    .del_range = rb_del_range,
    .clear = rb_clear,
};

static kf_batch_t *rs_batch_create(kf_store_t *s) {
    rocks_batch_t *rb = calloc(1, sizeof *rb);
    if (rb == NULL) {
        return NULL;
    }
    rb->base.ops = &rocks_batch_ops;
    rb->store = (rocks_store_t *)s;
    rb->wb = rocksdb_writebatch_create();
    return &rb->base;
}

/* ---- iterators -------------------------------------------------------- */

static void ri_destroy(kf_iter_t *i) {
    rocks_iter_t *ri = (rocks_iter_t *)i;
    rocksdb_iter_destroy(ri->it);
    rocksdb_readoptions_destroy(ri->read);
    free(ri->lower);
    free(ri->upper);
    free(ri);
}

static void ri_seek(kf_iter_t *i, const void *key, size_t key_len) {
    rocksdb_iter_seek(((rocks_iter_t *)i)->it, key, key_len);
}

static void ri_seek_first(kf_iter_t *i) {
    rocksdb_iter_seek_to_first(((rocks_iter_t *)i)->it);
}
static bool ri_valid(kf_iter_t *i) {
    return rocksdb_iter_valid(((rocks_iter_t *)i)->it) != 0;
}
static void ri_next(kf_iter_t *i) {
    rocksdb_iter_next(((rocks_iter_t *)i)->it);
}

static const void *ri_key(kf_iter_t *i, size_t *len) {
    return rocksdb_iter_key(((rocks_iter_t *)i)->it, len);
}

static const void *ri_value(kf_iter_t *i, size_t *len) {
    return rocksdb_iter_value(((rocks_iter_t *)i)->it, len);
}

static kf_status_t ri_status(kf_iter_t *i, kf_error_t *err) {
    char *e = NULL;
    rocksdb_iter_get_error(((rocks_iter_t *)i)->it, &e);
    return e != NULL ? rocks_error(err, e, "iterate") : KF_OK;
}

static const kf_iter_ops_t rocks_iter_ops = {
    .destroy = ri_destroy,
    .seek = ri_seek,
    .seek_first = ri_seek_first,
    .valid = ri_valid,
    .next = ri_next,
    .key = ri_key,
    .value = ri_value,
    .status = ri_status,
};

static kf_status_t rs_iter_create(kf_store_t *s, kf_cf_t cf, const void *lower, size_t lower_len,
                                  const void *upper, size_t upper_len, kf_iter_t **out,
                                  kf_error_t *err) {
    rocks_store_t *rs = (rocks_store_t *)s;
    rocks_iter_t *ri = calloc(1, sizeof *ri);
    if (ri == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate an iterator");
    }
    ri->base.ops = &rocks_iter_ops;
    ri->read = rocksdb_readoptions_create();
    if (lower != NULL) {
        ri->lower = kf_xmemdup(lower, lower_len);
        ri->lower_len = lower_len;
        rocksdb_readoptions_set_iterate_lower_bound(ri->read, ri->lower, ri->lower_len);
    }
    if (upper != NULL) {
        ri->upper = kf_xmemdup(upper, upper_len);
        ri->upper_len = upper_len;
        rocksdb_readoptions_set_iterate_upper_bound(ri->read, ri->upper, ri->upper_len);
    }
    ri->it = rocksdb_create_iterator_cf(rs->db, ri->read, rs->cf[cf]);
    *out = &ri->base;
    return KF_OK;
}

/* ---- store ------------------------------------------------------------ */

static kf_status_t rs_get(kf_store_t *s, kf_cf_t cf, const void *key, size_t key_len,
                          kf_value_t *value, bool *found, kf_error_t *err) {
    rocks_store_t *rs = (rocks_store_t *)s;
    char *e = NULL;
    size_t len = 0;
    char *data = rocksdb_get_cf(rs->db, rs->read, rs->cf[cf], key, key_len, &len, &e);
    if (e != NULL) {
        return rocks_error(err, e, "get");
    }
    if (data != NULL) {
        value->data = data; /* rocksdb_free is free() */
        value->len = len;
        *found = true;
    }
    return KF_OK;
}

static kf_status_t rs_write(kf_store_t *s, kf_batch_t *b, kf_error_t *err) {
    rocks_store_t *rs = (rocks_store_t *)s;
    rocks_batch_t *rb = (rocks_batch_t *)b;
    KF_ASSERT(rb->store == rs);
    if (atomic_load(&rs->poisoned)) {
        return kf_error_set(err, KF_E_IO, "store refuses writes after an earlier write failed");
    }
    char *e = NULL;
    rocksdb_write(rs->db, rs->write_sync, rb->wb, &e);
    if (e != NULL) {
        atomic_store(&rs->poisoned, true);
        return rocks_error(err, e, "sync write");
    }
    return KF_OK;
}

static kf_status_t rs_free_bytes(kf_store_t *s, uint64_t *free_bytes, kf_error_t *err) {
    rocks_store_t *rs = (rocks_store_t *)s;
    struct statvfs sv;
    if (statvfs(rs->path, &sv) != 0) {
        return kf_error_set(err, KF_E_IO, "statvfs %s: %s", rs->path, strerror(errno));
    }
    *free_bytes = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    return KF_OK;
}

static void rs_memory(kf_store_t *s, kf_store_memory_t *out) {
    rocks_store_t *rs = (rocks_store_t *)s;
    for (int i = 0; i < KF_CF_COUNT; i++) {
        uint64_t v = 0;
        if (rocksdb_property_int_cf(rs->db, rs->cf[i], "rocksdb.cur-size-all-mem-tables", &v) ==
            0) {
            out->memtable_bytes += v;
        }
    }
    out->block_cache_bytes = rocksdb_cache_get_usage(rs->block_cache);
}

/* Writes every family's memtables out before a clean close, so the next
 * open replays no WAL. With the WAL left in place a restart after load
 * spent most of its time in recovery (5.6 s of store open after the soak,
 * bench/README.md, "Soak"): replaying up to KF_ROCKS_WAL_BYTES_MAX into
 * memtables, sorting the vector memtables and flushing the small journal
 * ones as they filled. A failed flush loses nothing (the WAL stays and is
 * replayed); a poisoned store writes nothing more. */
static void flush_before_close(rocks_store_t *rs) {
    if (atomic_load(&rs->poisoned)) {
        return;
    }
    rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
    rocksdb_flushoptions_set_wait(fo, 1);
    for (int i = 0; i < KF_CF_COUNT; i++) {
        char *e = NULL;
        if (rs->cf[i] != NULL) {
            rocksdb_flush_cf(rs->db, fo, rs->cf[i], &e);
        }
        if (e != NULL) {
            kf_log(KF_LOG_WARN, "storage", "flush of %s before close: %s (the WAL keeps it)",
                   kf_cf_name((kf_cf_t)i), e);
            rocksdb_free(e);
            break;
        }
    }
    rocksdb_flushoptions_destroy(fo);
}

static void rs_close(kf_store_t *s) {
    rocks_store_t *rs = (rocks_store_t *)s;
    if (rs->db != NULL) {
        flush_before_close(rs); /* before the family handles go */
    }
    for (int i = 0; i < KF_CF_COUNT; i++) {
        if (rs->cf[i] != NULL) {
            rocksdb_column_family_handle_destroy(rs->cf[i]);
        }
        if (rs->cf_options[i] != NULL) {
            rocksdb_options_destroy(rs->cf_options[i]);
        }
    }
    if (rs->db != NULL) {
        rocksdb_close(rs->db);
    }
    if (rs->write_sync != NULL) {
        rocksdb_writeoptions_destroy(rs->write_sync);
    }
    if (rs->read != NULL) {
        rocksdb_readoptions_destroy(rs->read);
    }
    if (rs->options != NULL) {
        rocksdb_options_destroy(rs->options);
    }
    if (rs->table != NULL) {
        rocksdb_block_based_options_destroy(rs->table);
    }
    if (rs->block_cache != NULL && rs->own_cache) {
        rocksdb_cache_destroy(rs->block_cache);
    }
    free(rs->path);
    free(rs);
}

static const kf_store_ops_t rocks_store_ops = {
    .close = rs_close,
    .get = rs_get,
    .write = rs_write,
    .batch_create = rs_batch_create,
    .iter_create = rs_iter_create,
    .free_bytes = rs_free_bytes,
    .memory = rs_memory,
};

static rocksdb_options_t *family_options(const rocks_store_t *rs, const kf_rocks_options_t *o,
                                         kf_cf_t cf) {
    rocksdb_options_t *opt = rocksdb_options_create();
    rocksdb_options_set_block_based_table_factory(opt, rs->table);
    size_t buffer = o->write_buffer_bytes ? o->write_buffer_bytes : 64u * 1024 * 1024;
    /* The engine keeps live state in memory and reads point records rarely;
     * bigger memtables mean fewer flushes under a write-heavy load. */
    /* Output marks are written as often as output chunks, but each is
     * about 30 bytes: a small memtable holds minutes of them. */
    if (cf == KF_CF_META || cf == KF_CF_FUNCTIONS || cf == KF_CF_CHECKPOINTS ||
        cf == KF_CF_API_KEYS || cf == KF_CF_OUTPUT_MARKS) {
        buffer = 4u * 1024 * 1024;
    }
    rocksdb_options_set_write_buffer_size(opt, buffer);
    rocksdb_options_set_max_write_buffer_number(opt, 4);
    if (cf == KF_CF_STATE || cf == KF_CF_TIMERS_BY_KEY || cf == KF_CF_TIMERS_BY_TIME) {
        /* Process-function state and timers are written for every touched
         * key of every batch, in random key order, and read only by the
         * recovery scans at start (the engine keeps them in memory). A
         * skiplist memtable makes each of those inserts a search; an
         * append-only vector, sorted once at flush, does not (measured:
         * about 4x more input rows/s). A point Get on these families would
         * be a linear scan of the memtable, so nothing does one. */
        rocksdb_options_set_memtable_vector_rep(opt);
    }
    if (cf == KF_CF_COORD_STATE) {
        /* One record per coordinator, rewritten by every event and read
         * before it: updated in place when the new value is no longer than
         * the one in the memtable (most events), so the memtable holds one
         * entry per recently touched coordinator rather than one per
         * event. Nothing takes snapshots of this family. */
        rocksdb_options_set_inplace_update_support(opt, 1);
    }
    if (cf == KF_CF_COORD_HISTORY || cf == KF_CF_COORD_JOURNAL) {
        /* One journal entry per event, keyed by coordinator, so in random
         * order; read only by DescribeCoordinator's listing (a range of one
         * coordinator) and format 1's upgrade, never by a point Get. Vectors
         * make every insert an append; limits.h says how the sizes bound
         * the sort a read of the mutable memtable costs. */
        rocksdb_options_set_memtable_vector_rep(opt);
        rocksdb_options_set_write_buffer_size(opt, KF_ROCKS_JOURNAL_MEMTABLE_BYTES);
        rocksdb_options_set_max_write_buffer_number(opt, KF_ROCKS_JOURNAL_MEMTABLES);
        rocksdb_options_set_min_write_buffer_number_to_merge(opt, KF_ROCKS_JOURNAL_FLUSH_MERGE);
    }
    if (cf == KF_CF_RUNS || cf == KF_CF_RUN_INDEX || cf == KF_CF_RUN_LIVE ||
        cf == KF_CF_RUN_STATE || cf == KF_CF_WAKEUPS) {
        /* Retention deletes every run (all of its records) some time after
         * it finished; a tombstone stays in each file it reaches until a
         * compaction brings it to the last level, and every read that
         * passes it steps over it. A file dense with tombstones is
         * compacted soon rather than when its level happens to fill. */
        rocksdb_options_add_compact_on_deletion_collector_factory(
            opt, KF_ROCKS_DELETION_WINDOW_ENTRIES, KF_ROCKS_DELETION_TRIGGER_ENTRIES);
    }
    return opt;
}

/* Families of pending work keyed by a number that only grows (run_live
 * by run sequence, wake-ups and event-time timers by time), each entry
 * deleted when its work is done, mostly within one memtable: the flush
 * then keeps only tombstones, in a key range nothing on disk overlaps, so
 * the file moves down to the last level without a rewrite, and RocksDB
 * never compacts a last-level file for its tombstones alone while no
 * snapshot is released (this store takes none). In the soak such files
 * piled up at 100 per partition an hour (bench/README.md, "Soak").
 * Periodic compaction rewrites every file of these families older than
 * KF_ROCKS_PENDING_REWRITE_S, dropping the tombstones. It is a mutable
 * option the C API sets only on an open database. A failure costs files,
 * not data: it is logged. */
static void rewrite_pending_families(rocks_store_t *rs, const kf_rocks_options_t *o) {
    static const kf_cf_t families[] = {KF_CF_RUN_LIVE, KF_CF_WAKEUPS, KF_CF_TIMERS_BY_TIME};
    char seconds[24];
    snprintf(seconds, sizeof seconds, "%u",
             o->pending_rewrite_s != 0 ? o->pending_rewrite_s : KF_ROCKS_PENDING_REWRITE_S);
    const char *keys[] = {"periodic_compaction_seconds"};
    const char *values[] = {seconds};
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        char *e = NULL;
        rocksdb_set_options_cf(rs->db, rs->cf[families[i]], 1, keys, values, &e);
        if (e != NULL) {
            kf_log(KF_LOG_WARN, "storage", "periodic compaction of %s: %s", kf_cf_name(families[i]),
                   e);
            rocksdb_free(e);
        }
    }
}

kf_status_t kf_store_open_rocks(const kf_rocks_options_t *o, kf_store_t **out, kf_error_t *err) {
    rocks_store_t *rs = calloc(1, sizeof *rs);
    if (rs == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate the store");
    }
    rs->base.ops = &rocks_store_ops;
    rs->path = strdup(o->path);
    if (rs->path == NULL) {
        free(rs);
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate the store");
    }
    rs->options = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(rs->options, 1);
    rocksdb_options_set_create_missing_column_families(rs->options, 1);
    rocksdb_options_set_keep_log_file_num(rs->options, 4);
    /* RocksDB's info log (LOG in the data directory) at FATAL: it keeps the
     * options header written at open and nothing else. Debian's librocksdb
     * is built with assertions on, and a second write to the LOG after one
     * failed (a full disk) aborts the process inside RocksDB
     * (writable_file_writer.h, "sync_without_flush_called_"): on a full disk
     * the error handler's own log lines killed keyflowd before the failed
     * write could reach it. keyflowd reports storage errors itself. */
    rocksdb_options_set_info_log_level(rs->options, 4 /* FATAL_LEVEL */);
    rocksdb_options_set_max_background_jobs(rs->options, 2);
    rocksdb_options_set_max_open_files(rs->options, 1024);
    /* A small WAL: once the live WAL files pass this, RocksDB flushes the
     * families whose memtables pin the oldest of them. Rarely written
     * families (meta, functions, checkpoints) would otherwise pin every WAL
     * written since their last write, and a restart replays all of it: at
     * 512 MiB a restart after a soak spent most of its 11.9 s replaying
     * (measured in bench/README.md, "Restart after load"). Replay cost is
     * about 15 ms per MiB here. Atomic flush of all families bounded the
     * WAL no better and flushes every family each time (measured), so it is
     * off. */
    rocksdb_options_set_max_total_wal_size(
        rs->options, o->wal_bytes_max != 0 ? o->wal_bytes_max : KF_ROCKS_WAL_BYTES_MAX);
    /* One writer (the committer) and vector memtables: concurrent memtable
     * writes buy nothing and vector memtables do not support them. */
    rocksdb_options_set_allow_concurrent_memtable_write(rs->options, 0);

    /* Two options the C API has no setter for, through RocksDB's option
     * string:
     * - No fallocate: RocksDB would preallocate each WAL to 1.1 x the
     *   largest write buffer (about 70 MB) and the MANIFEST to 4 MB, so an
     *   empty store took 76 MB of disk. Appends cost the same here
     *   (bench/README.md, "allow_fallocate=false": no change in c=1
     *   latency), and on a nearly full disk nothing is reserved that the
     *   data does not use.
     * - No flush at open: recovery keeps the replayed WAL in memtables
     *   instead of writing it out as level-0 files before it serves. A
     *   restart then writes almost nothing (it can start on a disk below
     *   the reserve, where the flush could not be written) and is faster;
     *   the WAL files stay until the memtables are flushed as usual. */
    char *oe = NULL;
    rocksdb_options_t *db_options = rocksdb_options_create();
    rocksdb_get_options_from_string(
        rs->options, "allow_fallocate=false;avoid_flush_during_recovery=true", db_options, &oe);
    if (oe != NULL) {
        rocksdb_options_destroy(db_options);
        kf_status_t st = rocks_error(err, oe, "options");
        rs_close(&rs->base);
        return st;
    }
    rocksdb_options_destroy(rs->options);
    rs->options = db_options;

    /* One block cache for every family, of a stated size (limits.h), or
     * the one the process shares among its stores. */
    if (o->block_cache != NULL) {
        rs->block_cache = o->block_cache->cache;
    } else {
        rs->block_cache = rocksdb_cache_create_lru(KF_ROCKS_BLOCK_CACHE_BYTES);
        rs->own_cache = true;
    }
    rs->table = rocksdb_block_based_options_create();
    rocksdb_block_based_options_set_block_cache(rs->table, rs->block_cache);

    const char *names[KF_CF_COUNT];
    for (int i = 0; i < KF_CF_COUNT; i++) {
        names[i] = kf_cf_name((kf_cf_t)i);
        rs->cf_options[i] = family_options(rs, o, (kf_cf_t)i);
    }
    char *e = NULL;
    rs->db =
        rocksdb_open_column_families(rs->options, o->path, KF_CF_COUNT, names,
                                     (const rocksdb_options_t *const *)rs->cf_options, rs->cf, &e);
    if (e != NULL) {
        kf_status_t st = rocks_error(err, e, "open");
        rs->db = NULL;
        rs_close(&rs->base);
        return st;
    }
    rs->write_sync = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(rs->write_sync, 1);
    rs->read = rocksdb_readoptions_create();
    rewrite_pending_families(rs, o);
    kf_status_t st = kf__store_check_format(&rs->base, err);
    if (st != KF_OK) {
        rs_close(&rs->base);
        return st;
    }
    *out = &rs->base;
    return KF_OK;
}
