/*
 * store_rocks_test.c - what only the RocksDB store does (storage/store.h):
 * its directory lock, directory creation, errors at open, flushes to table
 * files with a small memtable, and the sticky error after a failed write.
 *
 * Each test gets its own mkdtemp directory, removed afterwards. The failed
 * write is real: the test lowers RLIMIT_FSIZE (with SIGXFSZ ignored) so that
 * the write-ahead log append fails with EFBIG, then restores the limit.
 * Criterion runs each test in its own process, so the limit cannot leak into
 * another test.
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "base/bytes.h"
#include "store_harness.h"

static store_harness_t h;

static void setup(void) {
    harness_setup_rocks(&h);
}
static void teardown(void) {
    harness_teardown(&h);
}

TestSuite(store_rocks_only, .init = setup, .fini = teardown);

Test(store_rocks_only, second_open_of_a_directory_fails_on_its_lock) {
    harness_put_str(h.store, KF_CF_RUNS, "k", "v");
    kf_rocks_options_t options = {.path = h.dir};
    kf_store_t *second = NULL;
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_store_open_rocks(&options, &second, &err);
    if (st == KF_OK) {
        kf_store_close(second);
    }
    cr_assert_eq(st, KF_E_IO, "got %s: %s", kf_status_name(st), err.message);
    cr_assert_null(second);
    cr_assert_eq(err.status, KF_E_IO);
    cr_assert_not_null(strstr(err.message, "LOCK"), "message '%s' does not mention the lock",
                       err.message);
    /* The first handle is unaffected. */
    harness_put_str(h.store, KF_CF_RUNS, "k2", "v2");
    char v[8];
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "k", v, sizeof v));
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "k2", v, sizeof v));
    /* After close, the directory can be opened again. */
    harness_reopen(&h);
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "k2", v, sizeof v));
}

/* Bytes of the write-ahead log files (*.log) in dir. */
static long long wal_bytes(const char *dir) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    long long total = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n > 4 && strcmp(e->d_name + n - 4, ".log") == 0) {
            char path[HARNESS_PATH_BYTES + 300];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            struct stat sb;
            cr_assert_eq(stat(path, &sb), 0);
            total += (long long)sb.st_size;
        }
    }
    closedir(d);
    return total;
}

/* A clean close writes the memtables out, so the next open has no WAL to
 * replay (bench/README.md, "Soak": replay was most of a restart). */
Test(store_rocks_only, clean_close_leaves_no_wal_to_replay) {
    for (int i = 0; i < 100; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%03d", i);
        harness_put_str(h.store, i % 2 ? KF_CF_RUNS : KF_CF_STATE, k, "value");
    }
    cr_assert_gt(wal_bytes(h.dir), 0, "written through the WAL");
    harness_reopen(&h);
    cr_assert_eq(wal_bytes(h.dir), 0);
    char v[8];
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "k099", v, sizeof v));
    cr_assert(harness_get_str(h.store, KF_CF_STATE, "k098", v, sizeof v), "read back from tables");
}

Test(store_rocks_only, missing_directory_is_created) {
    char path[HARNESS_PATH_BYTES + 16];
    snprintf(path, sizeof path, "%s/sub", h.dir);
    kf_rocks_options_t options = {.path = path};
    kf_store_t *store = NULL;
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_store_open_rocks(&options, &store, &err);
    cr_assert_eq(st, KF_OK, "%s: %s", kf_status_name(st), err.message);
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    cr_assert(S_ISDIR(sb.st_mode));
    harness_put_str(store, KF_CF_STATE, "x", "y");
    kf_store_close(store);
}

Test(store_rocks_only, path_that_is_a_file_is_an_io_error) {
    char path[HARNESS_PATH_BYTES + 16];
    snprintf(path, sizeof path, "%s/file", h.dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("not a database\n", f);
    fclose(f);
    kf_rocks_options_t options = {.path = path};
    kf_store_t *store = NULL;
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_store_open_rocks(&options, &store, &err);
    if (st == KF_OK) {
        kf_store_close(store);
    }
    cr_assert_eq(st, KF_E_IO, "got %s: %s", kf_status_name(st), err.message);
    cr_assert_null(store);
    cr_assert_gt(strlen(err.message), 0);
}

/* With a small memtable the data goes through flushes into table files; it
 * must read back complete and in order, before and after a reopen. */
Test(store_rocks_only, small_memtables_flush_and_read_back) {
    char path[HARNESS_PATH_BYTES + 16];
    snprintf(path, sizeof path, "%s/small", h.dir);
    kf_rocks_options_t options = {.path = path, .write_buffer_bytes = 64 * 1024};
    enum { BATCHES = 100, PER_BATCH = 40, VALUE_BYTES = 500 };
    uint8_t value[VALUE_BYTES];
    for (int pass = 0; pass < 2; pass++) {
        kf_store_t *store = NULL;
        kf_error_t err;
        kf_error_clear(&err);
        kf_status_t st = kf_store_open_rocks(&options, &store, &err);
        cr_assert_eq(st, KF_OK, "pass %d: %s: %s", pass, kf_status_name(st), err.message);
        if (pass == 0) {
            for (int b = 0; b < BATCHES; b++) {
                kf_batch_t *batch = kf_batch_create(store);
                for (int i = 0; i < PER_BATCH; i++) {
                    uint64_t n = (uint64_t)(b * PER_BATCH + i);
                    uint8_t key[8];
                    kf_put_be64(key, n * 7919 % (BATCHES * PER_BATCH)); /* scrambled order */
                    memset(value, (int)(n & 0xff), sizeof value);
                    kf_batch_put(batch, KF_CF_OUTPUT, key, sizeof key, value, sizeof value);
                }
                harness_write(store, batch);
                kf_batch_destroy(batch);
            }
        }
        kf_iter_t *iter = NULL;
        st = kf_iter_create(store, KF_CF_OUTPUT, NULL, 0, NULL, 0, &iter, &err);
        cr_assert_eq(st, KF_OK);
        uint64_t expect = 0;
        for (kf_iter_seek_first(iter); kf_iter_valid(iter); kf_iter_next(iter)) {
            size_t len;
            const uint8_t *key = kf_iter_key(iter, &len);
            cr_assert_eq(len, 8);
            cr_assert_eq(kf_get_be64(key), expect, "pass %d", pass);
            kf_iter_value(iter, &len);
            cr_assert_eq(len, VALUE_BYTES);
            expect++;
        }
        cr_assert_eq(kf_iter_status(iter, &err), KF_OK, "%s", err.message);
        kf_iter_destroy(iter);
        cr_assert_eq(expect, BATCHES * PER_BATCH, "pass %d", pass);
        kf_store_close(store);
    }
}

static int count_table_files(const char *dir) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t len = strlen(e->d_name);
        n += len > 4 && strcmp(e->d_name + len - 4, ".sst") == 0;
    }
    closedir(d);
    return n;
}

enum { GROW_PER_ROUND = 40, GROW_VALUE_BYTES = 400 };

/* One round of short-lived work: GROW_PER_ROUND new keys written and
 * deleted in one batch, so in the same memtable (as a short-lived run's
 * live state is). */
static void grow_round(kf_store_t *store, uint64_t *next) {
    uint8_t value[GROW_VALUE_BYTES];
    memset(value, 'v', sizeof value);
    uint64_t first = *next;
    kf_batch_t *batch = kf_batch_create(store);
    for (int i = 0; i < GROW_PER_ROUND; i++) {
        uint8_t key[8];
        kf_put_be64(key, (*next)++);
        kf_batch_put(batch, KF_CF_RUN_LIVE, key, sizeof key, value, sizeof value);
    }
    for (uint64_t k = first; k < *next; k++) {
        uint8_t key[8];
        kf_put_be64(key, k);
        kf_batch_delete(batch, KF_CF_RUN_LIVE, key, sizeof key);
    }
    harness_write(store, batch);
    kf_batch_destroy(batch);
}

/* Keys that only grow, each written and then deleted (run_live: a run's
 * live state by run sequence, deleted when it finishes). A flush keeps the
 * tombstones alone, in a file that overlaps nothing and so moves to the
 * last level without a rewrite; such files piled up forever, 100 per
 * partition an hour in the soak, until these families were rewritten
 * periodically (store_rocks.c, rewrite_pending_families). Before: 70
 * files after the first 300 rounds, more with every flush. */
Test(store_rocks_only, tombstones_of_growing_keys_do_not_pile_up_in_files) {
    char path[HARNESS_PATH_BYTES + 16];
    snprintf(path, sizeof path, "%s/grow", h.dir);
    kf_rocks_options_t options = {
        .path = path, .write_buffer_bytes = 64 * 1024, .pending_rewrite_s = 2};
    kf_store_t *store = NULL;
    kf_error_t err;
    kf_error_clear(&err);
    cr_assert_eq(kf_store_open_rocks(&options, &store, &err), KF_OK, "%s", err.message);
    enum { ROUNDS = 300, FILES_MAX = 16 };
    uint64_t next = 1;
    for (int r = 0; r < ROUNDS; r++) {
        grow_round(store, &next);
    }
    int piled = count_table_files(path);
    /* The work goes on (a flush every few rounds, each a chance for RocksDB
     * to pick files past their age) until the files are few, or 60 s. */
    int files = piled;
    for (int i = 0; i < 600 && files > FILES_MAX; i++) {
        grow_round(store, &next);
        usleep(100 * 1000);
        files = count_table_files(path);
    }
    cr_assert_leq(files, FILES_MAX, "%d table files left (%d after the first rounds)", files,
                  piled);
    kf_store_close(store);
}

/* A write whose log append fails is refused with KF_E_IO, and the store then
 * refuses every later write, even once the disk would accept it again, until
 * it is reopened. What was acknowledged before stays. */
Test(store_rocks_only, failed_write_poisons_the_store) {
    harness_put_str(h.store, KF_CF_RUNS, "before", "acknowledged");

    size_t big_len = 2u * 1024 * 1024;
    uint8_t *big = malloc(big_len);
    cr_assert_not_null(big);
    memset(big, 0x42, big_len);
    kf_batch_t *batch = kf_batch_create(h.store);
    kf_batch_put(batch, KF_CF_OUTPUT, "big", 3, big, big_len);
    free(big);

    struct rlimit saved;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &saved), 0);
    cr_assert_eq(signal(SIGXFSZ, SIG_IGN) == SIG_ERR, 0);
    struct rlimit low = saved;
    low.rlim_cur = 512 * 1024;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &low), 0);
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_store_write(h.store, batch, &err);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &saved), 0);
    kf_batch_destroy(batch);
    cr_assert_eq(st, KF_E_IO, "a write past RLIMIT_FSIZE gave %s: %s", kf_status_name(st),
                 err.message);
    cr_assert_eq(err.status, KF_E_IO);

    /* The limit is back; the store must still refuse. */
    for (int i = 0; i < 3; i++) {
        batch = kf_batch_create(h.store);
        kf_batch_put(batch, KF_CF_RUNS, "after", 5, "x", 1);
        kf_error_clear(&err);
        st = kf_store_write(h.store, batch, &err);
        kf_batch_destroy(batch);
        cr_assert_eq(st, KF_E_IO, "write %d after the failure gave %s", i, kf_status_name(st));
    }
    char v[32];
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "before", v, sizeof v));
    cr_assert_not(harness_get_str(h.store, KF_CF_RUNS, "after", v, sizeof v));

    /* Reopening recovers: acknowledged data is there and writes work. */
    harness_reopen(&h);
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "before", v, sizeof v));
    cr_assert_str_eq(v, "acknowledged");
    cr_assert_not(harness_get_str(h.store, KF_CF_RUNS, "after", v, sizeof v));
    harness_put_str(h.store, KF_CF_RUNS, "after", "x");
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "after", v, sizeof v));
}

/* ---- recovery after a crash ----------------------------------------------
 * A child process writes (sync) and exits without closing the store, as a
 * SIGKILL would leave it: everything is in the WAL, none of it flushed
 * (clean closes flush, so only a crash leaves a WAL to replay). The parent
 * reopens with small memtables, so the replay fills and flushes many of
 * them while it opens: every row must read back, in order, and memtables
 * must stay bounded afterwards. Its own suite: nothing of RocksDB may run
 * in this process before the fork (the child would inherit a thread pool
 * without its threads). */

enum { CRASH_ROWS = 4000, CRASH_VALUE_BYTES = 500 };

static void put_rows(kf_store_t *store, uint64_t first, uint64_t count) {
    uint8_t value[CRASH_VALUE_BYTES];
    for (uint64_t n = first; n < first + count;) {
        kf_batch_t *batch = kf_batch_create(store);
        for (int i = 0; i < 40 && n < first + count; i++, n++) {
            uint8_t key[8];
            kf_put_be64(key, n);
            memset(value, (int)(n & 0xff), sizeof value);
            kf_batch_put(batch, KF_CF_OUTPUT, key, sizeof key, value, sizeof value);
        }
        harness_write(store, batch);
        kf_batch_destroy(batch);
    }
}

TestSuite(store_rocks_crash);

Test(store_rocks_crash, replay_of_many_memtables_reads_back_and_memtables_stay_small) {
    char dir[HARNESS_PATH_BYTES];
    harness_make_temp_dir(dir);
    pid_t child = fork();
    cr_assert_neq(child, -1);
    if (child == 0) {
        /* Default (large) memtables: the rows stay in the WAL only. */
        kf_rocks_options_t big = {.path = dir};
        kf_store_t *store = NULL;
        kf_error_t err;
        kf_error_clear(&err);
        if (kf_store_open_rocks(&big, &store, &err) != KF_OK) {
            _exit(2);
        }
        put_rows(store, 0, CRASH_ROWS);
        _exit(0); /* no close: no flush, the WAL stays as after a SIGKILL */
    }
    int status = 0;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);

    /* About 2 MB of rows against 64 KiB memtables: some 30 memtables. */
    kf_rocks_options_t small = {.path = dir, .write_buffer_bytes = 64 * 1024};
    kf_store_t *store = NULL;
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_store_open_rocks(&small, &store, &err);
    cr_assert_eq(st, KF_OK, "%s: %s", kf_status_name(st), err.message);
    kf_iter_t *iter = NULL;
    cr_assert_eq(kf_iter_create(store, KF_CF_OUTPUT, NULL, 0, NULL, 0, &iter, &err), KF_OK);
    uint64_t expect = 0;
    for (kf_iter_seek_first(iter); kf_iter_valid(iter); kf_iter_next(iter)) {
        size_t len;
        const uint8_t *key = kf_iter_key(iter, &len);
        cr_assert_eq(len, 8);
        cr_assert_eq(kf_get_be64(key), expect);
        const uint8_t *value = kf_iter_value(iter, &len);
        cr_assert_eq(len, CRASH_VALUE_BYTES);
        cr_assert_eq(value[CRASH_VALUE_BYTES - 1], (uint8_t)(expect & 0xff));
        expect++;
    }
    cr_assert_eq(kf_iter_status(iter, &err), KF_OK, "%s", err.message);
    kf_iter_destroy(iter);
    cr_assert_eq(expect, CRASH_ROWS, "every acknowledged row is back after the replay");

    /* Twice as much again: 64 KiB memtables flush it away; memtables that
     * kept a replay-sized limit would hold all of it, more than 6 MB. */
    put_rows(store, CRASH_ROWS, 2 * CRASH_ROWS);
    uint64_t deadline_ms = 30000;
    kf_store_memory_t m = {0};
    for (uint64_t waited_ms = 0; waited_ms < deadline_ms; waited_ms += 10) {
        m = (kf_store_memory_t){0};
        kf_store_memory(store, &m);
        if (m.memtable_bytes < 3u * 1024 * 1024) {
            break;
        }
        usleep(10 * 1000);
    }
    cr_assert_lt(m.memtable_bytes, 3u * 1024 * 1024, "memtables still hold %llu bytes",
                 (unsigned long long)m.memtable_bytes);
    kf_store_close(store);
    harness_remove_tree(dir);
}

/* ---- a block cache shared by several stores ------------------------------
 * keyflowd opens a store per partition and home's; each used to make its
 * own KF_ROCKS_BLOCK_CACHE_BYTES cache, so the default 8 partitions held
 * 9 times the stated bound. Two stores read through one small cache: what
 * they cache together stays within its capacity, and both report it. */

enum { SHARED_CACHE_BYTES = 256 * 1024 };

static kf_store_t *open_with_cache(const char *dir, kf_store_cache_t *cache) {
    kf_rocks_options_t options = {
        .path = dir, .write_buffer_bytes = 64 * 1024, .block_cache = cache};
    kf_store_t *store = NULL;
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_store_open_rocks(&options, &store, &err);
    cr_assert_eq(st, KF_OK, "%s: %s", kf_status_name(st), err.message);
    return store;
}

static uint64_t read_all_rows(kf_store_t *store) {
    kf_error_t err;
    kf_error_clear(&err);
    kf_iter_t *iter = NULL;
    cr_assert_eq(kf_iter_create(store, KF_CF_OUTPUT, NULL, 0, NULL, 0, &iter, &err), KF_OK);
    uint64_t rows = 0;
    for (kf_iter_seek_first(iter); kf_iter_valid(iter); kf_iter_next(iter)) {
        rows++;
    }
    cr_assert_eq(kf_iter_status(iter, &err), KF_OK, "%s", err.message);
    kf_iter_destroy(iter);
    return rows;
}

TestSuite(store_rocks_cache);

Test(store_rocks_cache, stores_sharing_a_cache_stay_within_its_capacity) {
    char dirs[2][HARNESS_PATH_BYTES];
    kf_store_cache_t *cache = kf_store_cache_create(SHARED_CACHE_BYTES);
    cr_assert_not_null(cache);
    kf_store_t *stores[2];
    for (int i = 0; i < 2; i++) {
        harness_make_temp_dir(dirs[i]);
        stores[i] = open_with_cache(dirs[i], cache);
        put_rows(stores[i], 0, CRASH_ROWS); /* 2 MB each, flushed by 64 KiB memtables */
        kf_store_close(stores[i]);          /* flushes the rest: all in table files */
        stores[i] = open_with_cache(dirs[i], cache);
    }
    /* Every row of both stores is read from table files through the
     * cache: 4 MB of blocks against a 256 KiB cache. */
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(read_all_rows(stores[i]), CRASH_ROWS);
    }
    uint64_t cached = kf_store_cache_bytes(cache);
    cr_assert_gt(cached, 0, "reads went through the shared cache");
    /* LRU without a strict limit may pass its capacity by the blocks in
     * use; nothing is in use once the iterators are gone. */
    cr_assert_leq(cached, SHARED_CACHE_BYTES, "the cache holds %llu bytes",
                  (unsigned long long)cached);
    for (int i = 0; i < 2; i++) {
        kf_store_memory_t m = {0};
        kf_store_memory(stores[i], &m);
        cr_assert_eq(m.block_cache_bytes, cached, "store %d reports the shared cache", i);
    }
    /* Closing one store leaves the cache to the other. */
    kf_store_close(stores[0]);
    cr_assert_eq(read_all_rows(stores[1]), CRASH_ROWS);
    kf_store_close(stores[1]);
    kf_store_cache_destroy(cache);
    for (int i = 0; i < 2; i++) {
        harness_remove_tree(dirs[i]);
    }
}
