/*
 * store_mem_test.c - the memory store's fault injection (storage/store.h,
 * kf_mem_faults_t) and its memdisk.
 *
 * fail_write_at = N fails the Nth write through a handle with KF_E_IO and
 * every later write too (a failed fsync poisons the store until reopen);
 * fail_reads fails gets and iteration with KF_E_IO; the memdisk keeps
 * exactly the writes that succeeded, so a reopen after a failure shows the
 * state before the failed batch and none of it.
 */
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "store_harness.h"

static store_harness_t h;

static void setup(void) {
    harness_setup_mem(&h);
}
static void teardown(void) {
    harness_teardown(&h);
}

TestSuite(store_mem_faults, .init = setup, .fini = teardown);

/* Reopens the handle with `faults` over the same memdisk. */
static void reopen_with(kf_mem_faults_t faults) {
    h.faults = faults;
    harness_reopen(&h);
}

static kf_status_t try_put(const char *key, kf_error_t *err) {
    kf_batch_t *batch = kf_batch_create(h.store);
    cr_assert_not_null(batch);
    kf_batch_put(batch, KF_CF_RUNS, key, strlen(key), "v", 1);
    kf_status_t st = kf_store_write(h.store, batch, err);
    kf_batch_destroy(batch);
    return st;
}

Test(store_mem_faults, memdisk_counts_successful_writes) {
    uint64_t base = kf_memdisk_writes(h.disk);
    harness_put_str(h.store, KF_CF_RUNS, "a", "1");
    harness_put_str(h.store, KF_CF_RUNS, "b", "2");
    cr_assert_eq(kf_memdisk_writes(h.disk), base + 2);
    harness_reopen(&h);
    cr_assert_eq(kf_memdisk_writes(h.disk), base + 2, "reopening an initialised disk wrote to it");
}

Test(store_mem_faults, nth_write_fails_and_poisons) {
    reopen_with((kf_mem_faults_t){.fail_write_at = 3});
    uint64_t base = kf_memdisk_writes(h.disk);
    kf_error_t err;
    kf_error_clear(&err);
    cr_assert_eq(try_put("w1", &err), KF_OK, "%s", err.message);
    cr_assert_eq(try_put("w2", &err), KF_OK, "%s", err.message);
    kf_status_t st = try_put("w3", &err);
    cr_assert_eq(st, KF_E_IO, "the 3rd write gave %s", kf_status_name(st));
    cr_assert_eq(err.status, KF_E_IO);
    cr_assert_gt(strlen(err.message), 0);
    for (int i = 4; i < 10; i++) {
        char key[8];
        snprintf(key, sizeof key, "w%d", i);
        st = try_put(key, &err);
        cr_assert_eq(st, KF_E_IO, "write %d after the failure gave %s", i, kf_status_name(st));
    }
    cr_assert_eq(kf_memdisk_writes(h.disk), base + 2);
    /* Reads still work on a poisoned store and see only what succeeded. */
    char v[8];
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "w1", v, sizeof v));
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "w2", v, sizeof v));
    cr_assert_not(harness_get_str(h.store, KF_CF_RUNS, "w3", v, sizeof v));
    cr_assert_not(harness_get_str(h.store, KF_CF_RUNS, "w5", v, sizeof v));
}

Test(store_mem_faults, first_write_can_fail) {
    reopen_with((kf_mem_faults_t){.fail_write_at = 1});
    kf_error_t err;
    cr_assert_eq(try_put("w1", &err), KF_E_IO);
    cr_assert_eq(try_put("w2", &err), KF_E_IO);
    char v[8];
    cr_assert_not(harness_get_str(h.store, KF_CF_RUNS, "w1", v, sizeof v));
}

Test(store_mem_faults, empty_batches_count_as_writes) {
    reopen_with((kf_mem_faults_t){.fail_write_at = 2});
    kf_batch_t *batch = kf_batch_create(h.store);
    kf_error_t err;
    cr_assert_eq(kf_store_write(h.store, batch, &err), KF_OK);
    cr_assert_eq(kf_store_write(h.store, batch, &err), KF_E_IO);
    kf_batch_destroy(batch);
}

/* A failed batch leaves nothing behind, in any family. */
Test(store_mem_faults, failed_batch_is_all_or_nothing) {
    harness_put_str(h.store, KF_CF_RUN_QUEUE, "keep", "x");
    reopen_with((kf_mem_faults_t){.fail_write_at = 1});
    kf_batch_t *batch = kf_batch_create(h.store);
    kf_batch_put(batch, KF_CF_COORD_SNAPSHOTS, "c", 1, "s", 1);
    kf_batch_put(batch, KF_CF_RUNS, "r", 1, "r", 1);
    kf_batch_delete(batch, KF_CF_RUN_QUEUE, "keep", 4);
    kf_batch_delete_range(batch, KF_CF_RUN_QUEUE, "a", 1, "z", 1);
    kf_error_t err;
    cr_assert_eq(kf_store_write(h.store, batch, &err), KF_E_IO);
    kf_batch_destroy(batch);
    reopen_with((kf_mem_faults_t){0});
    char v[8];
    cr_assert_not(harness_get_str(h.store, KF_CF_COORD_SNAPSHOTS, "c", v, sizeof v));
    cr_assert_not(harness_get_str(h.store, KF_CF_RUNS, "r", v, sizeof v));
    cr_assert(harness_get_str(h.store, KF_CF_RUN_QUEUE, "keep", v, sizeof v));
}

/* The poison belongs to the handle: reopening (recovery) clears it, and the
 * fault counter starts again from the reopen. */
Test(store_mem_faults, reopen_clears_the_poison) {
    reopen_with((kf_mem_faults_t){.fail_write_at = 2});
    kf_error_t err;
    cr_assert_eq(try_put("a", &err), KF_OK);
    cr_assert_eq(try_put("b", &err), KF_E_IO);
    reopen_with((kf_mem_faults_t){.fail_write_at = 2});
    cr_assert_eq(try_put("c", &err), KF_OK, "%s", err.message);
    cr_assert_eq(try_put("d", &err), KF_E_IO);
    reopen_with((kf_mem_faults_t){0});
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(try_put("e", &err), KF_OK);
    }
    char v[8];
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "a", v, sizeof v));
    cr_assert_not(harness_get_str(h.store, KF_CF_RUNS, "b", v, sizeof v));
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "c", v, sizeof v));
    cr_assert_not(harness_get_str(h.store, KF_CF_RUNS, "d", v, sizeof v));
}

/* The format record written at the first open is not one of the counted
 * writes, so fail_write_at = 1 still allows opening a fresh disk. */
Test(store_mem_faults, format_record_is_not_a_counted_write) {
    harness_close(&h);
    kf_memdisk_destroy(h.disk);
    h.disk = kf_memdisk_create();
    h.faults = (kf_mem_faults_t){.fail_write_at = 1, .fail_reads = true};
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = harness_open(&h, &err);
    cr_assert_eq(st, KF_OK, "%s: %s", kf_status_name(st), err.message);
    cr_assert_eq(try_put("x", &err), KF_E_IO);
    reopen_with((kf_mem_faults_t){0});
    kf_value_t value;
    bool found = false;
    st = kf_store_get(h.store, KF_CF_META, "format_version", 14, &value, &found, &err);
    cr_assert_eq(st, KF_OK);
    cr_assert(found, "the format record was not written");
    kf_store_value_free(&value);
}

Test(store_mem_faults, fail_reads_fails_gets) {
    harness_put_str(h.store, KF_CF_RUNS, "present", "v");
    reopen_with((kf_mem_faults_t){.fail_reads = true});
    kf_value_t value;
    bool found = true;
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_store_get(h.store, KF_CF_RUNS, "present", 7, &value, &found, &err);
    cr_assert_eq(st, KF_E_IO, "got %s", kf_status_name(st));
    cr_assert_eq(err.status, KF_E_IO);
    cr_assert_not(found);
    cr_assert_null(value.data);
    st = kf_store_get(h.store, KF_CF_RUNS, "absent", 6, &value, &found, &err);
    cr_assert_eq(st, KF_E_IO);
}

Test(store_mem_faults, fail_reads_fails_iteration) {
    harness_put_str(h.store, KF_CF_RUNS, "a", "1");
    harness_put_str(h.store, KF_CF_RUNS, "b", "2");
    reopen_with((kf_mem_faults_t){.fail_reads = true});
    kf_iter_t *iter = NULL;
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_iter_create(h.store, KF_CF_RUNS, NULL, 0, NULL, 0, &iter, &err);
    if (st == KF_OK) {
        kf_iter_seek_first(iter);
        cr_assert_not(kf_iter_valid(iter), "an iterator over failing reads is valid");
        kf_iter_seek(iter, "a", 1);
        cr_assert_not(kf_iter_valid(iter));
        st = kf_iter_status(iter, &err);
        kf_iter_destroy(iter);
    }
    cr_assert_eq(st, KF_E_IO, "got %s", kf_status_name(st));
    cr_assert_eq(err.status, KF_E_IO);
}

Test(store_mem_faults, fail_reads_leaves_writes_working) {
    reopen_with((kf_mem_faults_t){.fail_reads = true});
    kf_error_t err;
    cr_assert_eq(try_put("w", &err), KF_OK, "%s", err.message);
    reopen_with((kf_mem_faults_t){0});
    char v[8];
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "w", v, sizeof v));
}

/* Two handles over one memdisk see each other's writes: the memdisk is the
 * durable state, a handle is only a process's view of it. */
Test(store_mem_faults, handles_share_the_memdisk) {
    kf_store_t *other = NULL;
    kf_error_t err;
    kf_status_t st = kf_store_open_mem(h.disk, NULL, &other, &err);
    cr_assert_eq(st, KF_OK, "%s", err.message);
    harness_put_str(h.store, KF_CF_STATE, "from-first", "1");
    harness_put_str(other, KF_CF_STATE, "from-second", "2");
    char v[8];
    cr_assert(harness_get_str(other, KF_CF_STATE, "from-first", v, sizeof v));
    cr_assert(harness_get_str(h.store, KF_CF_STATE, "from-second", v, sizeof v));
    kf_store_close(other);
}

/* A seeded workload with a failure at a random write: whatever was
 * acknowledged is on the memdisk after reopen, and nothing else is. */
Test(store_mem_faults, acknowledged_writes_are_exactly_what_survives) {
    for (uint64_t seed = 1; seed <= 20; seed++) {
        harness_close(&h);
        kf_memdisk_destroy(h.disk);
        h.disk = kf_memdisk_create();
        h.faults = (kf_mem_faults_t){.fail_write_at = 1 + seed * 7 % 40};
        kf_error_t err;
        cr_assert_eq(harness_open(&h, &err), KF_OK);
        bool acked[60] = {false};
        bool failed_once = false;
        for (int i = 0; i < 60; i++) {
            char key[16];
            snprintf(key, sizeof key, "k%02d", i);
            kf_status_t st = try_put(key, &err);
            if (st == KF_OK) {
                cr_assert_not(failed_once, "seed %llu: write %d succeeded after a failure",
                              (unsigned long long)seed, i);
                acked[i] = true;
            } else {
                cr_assert_eq(st, KF_E_IO);
                failed_once = true;
            }
        }
        cr_assert(failed_once, "seed %llu: no write failed", (unsigned long long)seed);
        reopen_with((kf_mem_faults_t){0});
        for (int i = 0; i < 60; i++) {
            char key[16];
            char v[8];
            snprintf(key, sizeof key, "k%02d", i);
            cr_assert_eq(harness_get_str(h.store, KF_CF_RUNS, key, v, sizeof v), acked[i],
                         "seed %llu key %s", (unsigned long long)seed, key);
        }
    }
}
