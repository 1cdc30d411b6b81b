/*
 * store.h - the storage seam: ordered key/value column families, atomic
 * durable write batches, ordered iteration.
 *
 * Two implementations: RocksDB (store_rocks.c, the only file that includes
 * rocksdb/c.h) and an in-memory store with fault injection (store_mem.c)
 * that tests swap in. Everything above this header is storage-agnostic.
 *
 * Invariants
 *   1. kf_store_write is atomic and durable: when it returns KF_OK, every
 *      operation of the batch is on stable storage (RocksDB: one WriteBatch
 *      written with sync = true); when it fails, the store is poisoned and
 *      refuses every later write (sticky error), because a failed fsync
 *      leaves the disk state unknown. A failed write is never retried.
 *   2. Reads observe every write that returned KF_OK before the read began.
 *   3. Keys compare bytewise; the key encodings above this layer make that
 *      numeric order (big-endian) and prefix-free (length-prefixed strings).
 *   4. The stored format version is checked at open: a store of a version
 *      this build does not know is refused, never reinterpreted; an older
 *      one it knows is upgraded by the engine before it serves.
 *
 * Threads: a store may be read from any thread and written from one thread
 * at a time (the engine's committer). Batches and iterators belong to the
 * thread that created them.
 */
#ifndef KF_STORAGE_STORE_H
#define KF_STORAGE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* 2: coordinators as state records keyed by identity hash (coord/coord.c);
 * 1: as snapshots and journals keyed by identity. A store of version 1 is
 * opened and upgraded by the engine at start (kf_store_format_version,
 * kf_batch_put_format_version); anything else is refused. */
#define KF_STORE_FORMAT_VERSION 2
#define KF_STORE_FORMAT_OLDEST  1

/* One column family per record kind (DESIGN.md section 3). The order is the
 * on-disk identity of each family's name; append only. */
#define KF_CF_TABLE(X)                                                                             \
    X(KF_CF_META, "default")                    /* format version, global counters */              \
    X(KF_CF_COORD_SNAPSHOTS, "coord_snapshots") /* format 1 only: read to upgrade */               \
    X(KF_CF_COORD_JOURNAL, "coord_journal")     /* format 1 only: read to upgrade */               \
    X(KF_CF_RUNS, "runs")                       /* run_id -> run body (or whole record) */         \
    X(KF_CF_RUN_INDEX, "run_index")             /* workflow, seq -> run_id */                      \
    X(KF_CF_RUN_QUEUE, "run_queue")             /* live runs of older builds (read at start) */    \
    X(KF_CF_WAKEUPS, "wakeups")                 /* processing-time timers */                       \
    X(KF_CF_FUNCTIONS, "functions")             /* descriptors */                                  \
    X(KF_CF_STATE, "state")                     /* per-key value state */                          \
    X(KF_CF_TIMERS_BY_TIME, "timers_by_time")                                                      \
    X(KF_CF_TIMERS_BY_KEY, "timers_by_key")                                                        \
    X(KF_CF_OUTPUT, "output")               /* output row chunks */                                \
    X(KF_CF_PRODUCERS, "producers")         /* producer sequences and acks */                      \
    X(KF_CF_CHECKPOINTS, "checkpoints")     /* per-function checkpoints */                         \
    X(KF_CF_API_KEYS, "api_keys")           /* store secret, API key hashes */                     \
    X(KF_CF_OUTPUT_MARKS, "output_marks")   /* per output chunk: when written, bytes */            \
    X(KF_CF_RUN_LIVE, "run_live")           /* live runs' state, by run sequence */                \
    X(KF_CF_RUN_STATE, "run_state")         /* finished runs' final state, by run_id */            \
    X(KF_CF_COORD_STATE, "coord_state")     /* coordinator id -> state */                          \
    X(KF_CF_COORD_INDEX, "coord_index")     /* coordinator id -> wake-up, flags */                 \
    X(KF_CF_COORD_ITEMS, "coord_items")     /* remembered IDs, window events, recent runs */       \
    X(KF_CF_COORD_HISTORY, "coord_history") /* coordinator journals */                             \
    X(KF_CF_COORD_WINDOWS, "coord_windows") /* open window's run_id -> coordinator id */

typedef enum kf_cf {
#define KF_CF_ENUM_(id, name) id,
    KF_CF_TABLE(KF_CF_ENUM_)
#undef KF_CF_ENUM_
        KF_CF_COUNT
} kf_cf_t;

const char *kf_cf_name(kf_cf_t cf);

typedef struct kf_store kf_store_t;
typedef struct kf_batch kf_batch_t;
typedef struct kf_iter kf_iter_t;

/* A value read from the store. Owned by the caller; release with
 * kf_store_value_free (safe on an empty value). */
typedef struct kf_value {
    void *data;
    size_t len;
} kf_value_t;

/* ---- opening ---------------------------------------------------------- */

/* A RocksDB block cache that several stores of one process read through:
 * one bound for all of them, and the hot blocks of a busy store can take
 * room a quiet one does not use. Outlives every store opened with it. */
typedef struct kf_store_cache kf_store_cache_t;

/* NULL when it cannot be allocated. */
kf_store_cache_t *kf_store_cache_create(size_t capacity_bytes);
void kf_store_cache_destroy(kf_store_cache_t *cache); /* NULL is fine */
/* What the cache holds now; any thread. */
uint64_t kf_store_cache_bytes(const kf_store_cache_t *cache);

typedef struct kf_rocks_options {
    const char *path;          /* directory; created if missing */
    size_t write_buffer_bytes; /* per family memtable; 0 = default */
    size_t wal_bytes_max;      /* live WAL before flushing; 0 = KF_ROCKS_WAL_BYTES_MAX */
    /* Age at which a table file of a pending-work family is rewritten
     * (store_rocks.c); 0 = KF_ROCKS_PENDING_REWRITE_S. */
    unsigned pending_rewrite_s;
    /* Shared with other stores; NULL = a cache of KF_ROCKS_BLOCK_CACHE_BYTES
     * of the store's own. */
    kf_store_cache_t *block_cache;
} kf_rocks_options_t;

/* Opens (creating if needed) a RocksDB store and checks its format version.
 * Errors: KF_E_IO (cannot open, e.g. locked by another process),
 * KF_E_CORRUPT (another format version). */
kf_status_t kf_store_open_rocks(const kf_rocks_options_t *options, kf_store_t **out,
                                kf_error_t *err) KF_MUST_USE;

/* The in-memory store keeps its contents in a kf_memdisk_t that outlives
 * store handles, so a test can "restart" by closing and reopening. */
typedef struct kf_memdisk kf_memdisk_t;

typedef struct kf_mem_faults {
    /* Fail the write that would be the Nth successful one (1-based) and
     * every write after it; 0 = never. Simulates a failed fsync. */
    uint64_t fail_write_at;
    /* Fail gets and iterator seeks with KF_E_IO when set. */
    bool fail_reads;
} kf_mem_faults_t;

kf_memdisk_t *kf_memdisk_create(void);
void kf_memdisk_destroy(kf_memdisk_t *disk);
/* What kf_store_free_bytes reports for stores on this memdisk (default
 * UINT64_MAX): lets a test run the disk reserve without a full disk. Any
 * thread. */
void kf_memdisk_set_free_bytes(kf_memdisk_t *disk, uint64_t free_bytes);
/* Writes that reached the memdisk so far (all of them durable). */
uint64_t kf_memdisk_writes(const kf_memdisk_t *disk);
/* Range deletes on `cf` that overlapped the family's previous range delete.
 * RocksDB keeps range deletes as tombstones until compaction, and a flush
 * of overlapping ones costs memory quadratic in their number
 * (bench/README.md, "Soak"): a test can check a writer keeps them apart. */
uint64_t kf_memdisk_range_overlaps(const kf_memdisk_t *disk, kf_cf_t cf);

kf_status_t kf_store_open_mem(kf_memdisk_t *disk, const kf_mem_faults_t *faults, kf_store_t **out,
                              kf_error_t *err) KF_MUST_USE;

/* The format version found at open (KF_STORE_FORMAT_OLDEST ..
 * KF_STORE_FORMAT_VERSION; a new store is created at the current one). */
uint32_t kf_store_format_version(const kf_store_t *store);

/* Closes and frees the handle. Outstanding batches/iterators must be gone. */
void kf_store_close(kf_store_t *store);

/* Bytes an unprivileged writer could still write on the store's filesystem
 * (statvfs: f_bavail * f_frsize). Cheap (no I/O); any thread.
 * Errors: KF_E_IO (the filesystem cannot be queried). */
kf_status_t kf_store_free_bytes(kf_store_t *store, uint64_t *free_bytes,
                                kf_error_t *err) KF_MUST_USE;

/* What the store holds in memory now: RocksDB's memtables (every family,
 * flushing ones included) and its block cache (a shared cache's whole
 * content: every store reading through it reports the same figure). The
 * memory store reports its records' bytes as memtable bytes. Cheap; any
 * thread. */
typedef struct kf_store_memory {
    uint64_t memtable_bytes;
    uint64_t block_cache_bytes;
} kf_store_memory_t;

void kf_store_memory(kf_store_t *store, kf_store_memory_t *out);

/* ---- reading ---------------------------------------------------------- */

/* *found is false (and value empty) when the key is absent. */
kf_status_t kf_store_get(kf_store_t *store, kf_cf_t cf, const void *key, size_t key_len,
                         kf_value_t *value, bool *found, kf_error_t *err) KF_MUST_USE;
void kf_store_value_free(kf_value_t *value);

/* An iterator over [lower, upper) of one family; either bound may be NULL.
 * The bounds are copied. */
kf_status_t kf_iter_create(kf_store_t *store, kf_cf_t cf, const void *lower, size_t lower_len,
                           const void *upper, size_t upper_len, kf_iter_t **out,
                           kf_error_t *err) KF_MUST_USE;
void kf_iter_destroy(kf_iter_t *iter);
void kf_iter_seek(kf_iter_t *iter, const void *key, size_t key_len);
void kf_iter_seek_first(kf_iter_t *iter);
bool kf_iter_valid(kf_iter_t *iter);
void kf_iter_next(kf_iter_t *iter);
/* Valid until the next move or destroy. */
const void *kf_iter_key(kf_iter_t *iter, size_t *len);
const void *kf_iter_value(kf_iter_t *iter, size_t *len);
/* KF_OK unless the iteration hit an I/O error (then valid() is false). */
kf_status_t kf_iter_status(kf_iter_t *iter, kf_error_t *err) KF_MUST_USE;

/* ---- writing ---------------------------------------------------------- */

kf_batch_t *kf_batch_create(kf_store_t *store);
void kf_batch_destroy(kf_batch_t *batch);
void kf_batch_put(kf_batch_t *batch, kf_cf_t cf, const void *key, size_t key_len, const void *value,
                  size_t value_len);
void kf_batch_delete(kf_batch_t *batch, kf_cf_t cf, const void *key, size_t key_len);
/* Deletes every key in [begin, end). */
void kf_batch_delete_range(kf_batch_t *batch, kf_cf_t cf, const void *begin, size_t begin_len,
                           const void *end, size_t end_len);
void kf_batch_clear(kf_batch_t *batch);
size_t kf_batch_count(const kf_batch_t *batch);
/* Approximate bytes the batch will write. */
size_t kf_batch_bytes(const kf_batch_t *batch);

/* Records the current format version (KF_STORE_FORMAT_VERSION) with the
 * batch: the last write of an upgrade. */
void kf_batch_put_format_version(kf_batch_t *batch);

/* Writes the batch atomically and durably (see invariant 1). The batch is
 * left as it was; clear it to reuse. Errors: KF_E_IO, and from then on the
 * store is poisoned. */
kf_status_t kf_store_write(kf_store_t *store, kf_batch_t *batch, kf_error_t *err) KF_MUST_USE;

/* ---- implementation seam (store_int.h) -------------------------------- */

#endif
