/*
 * store_harness.h - what the store tests share: a store under test that is
 * either the memory store (over a kf_memdisk_t that outlives handles) or
 * RocksDB (in a fresh mkdtemp directory per test, removed afterwards), so
 * the same test bodies run against both, plus small read/write helpers that
 * assert success and print the status and message when they fail.
 *
 * Ownership: the harness owns its store handle, memdisk and directory;
 * harness_teardown releases all three. Single-threaded, one per test process.
 */
#ifndef KF_TESTS_STORE_HARNESS_H
#define KF_TESTS_STORE_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/store.h"

#define HARNESS_PATH_BYTES 128

typedef struct store_harness {
    bool rocks;                   /* RocksDB, or else the memory store */
    kf_memdisk_t *disk;           /* memory store: survives close/reopen */
    kf_mem_faults_t faults;       /* memory store: faults for the next open */
    char dir[HARNESS_PATH_BYTES]; /* RocksDB: this test's own directory */
    kf_store_t *store;            /* the open handle, or NULL */
} store_harness_t;

/* Creates a fresh directory under $TMPDIR (or /tmp); out is
 * HARNESS_PATH_BYTES long. */
void harness_make_temp_dir(char *out);
/* Removes a directory tree (no symlinks followed). */
void harness_remove_tree(const char *path);

/* Set up the backing storage and open the store (asserting success). */
void harness_setup_mem(store_harness_t *h);
void harness_setup_rocks(store_harness_t *h);
/* Closes the store and removes the backing storage. Safe after a failed
 * open (store NULL). */
void harness_teardown(store_harness_t *h);

/* Opens h->store over the same backing storage; on failure h->store stays
 * NULL and the status is returned. */
kf_status_t harness_open(store_harness_t *h, kf_error_t *err);
void harness_close(store_harness_t *h);
/* Close and open again, asserting success: a restart. */
void harness_reopen(store_harness_t *h);

/* One-operation batches, asserting KF_OK. */
void harness_put(kf_store_t *store, kf_cf_t cf, const void *key, size_t key_len, const void *value,
                 size_t value_len);
void harness_put_str(kf_store_t *store, kf_cf_t cf, const char *key, const char *value);
void harness_delete_str(kf_store_t *store, kf_cf_t cf, const char *key);
/* Writes the batch and asserts KF_OK. */
void harness_write(kf_store_t *store, kf_batch_t *batch);

/* Reads key as a NUL-terminated string into out (cap bytes); false when
 * absent. Asserts the read itself succeeded. */
bool harness_get_str(kf_store_t *store, kf_cf_t cf, const char *key, char *out, size_t cap);
bool harness_has(kf_store_t *store, kf_cf_t cf, const void *key, size_t key_len);

/* Iterates from the iterator's current position to its end, copying keys as
 * strings ("k1,k2,...") into out; asserts the iteration status is KF_OK.
 * Returns the number of keys. */
int harness_collect(kf_iter_t *iter, char *out, size_t cap);
/* All keys of a family, optionally bounded (NULL = unbounded), as above. */
int harness_keys(kf_store_t *store, kf_cf_t cf, const char *lower, const char *upper, char *out,
                 size_t cap);

#endif
