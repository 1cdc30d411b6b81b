/*
 * store_test.c - the storage seam (storage/store.h), one set of test bodies
 * run against both implementations: suite store_mem (the memory store over
 * a memdisk) and suite store_rocks (RocksDB in a fresh directory per test).
 *
 * What both must agree on: point reads and writes per column family,
 * delete_range over [begin, end), batches that apply atomically across
 * families in the order their operations were added, bytewise-ordered
 * iteration within [lower, upper) with seek, iterators that see the store as
 * of their creation, data that survives close and reopen, and a format
 * version that is recorded at first open and checked at every open.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "base/bytes.h"
#include "store_harness.h"

static store_harness_t h;

static void setup_mem(void) {
    harness_setup_mem(&h);
}
static void setup_rocks(void) {
    harness_setup_rocks(&h);
}
static void teardown(void) {
    harness_teardown(&h);
}

/* Defines one body and registers it in both suites. */
#define STORE_TEST(name)                                                                           \
    static void body_##name(void);                                                                 \
    Test(store_mem, name, .init = setup_mem, .fini = teardown) {                                   \
        body_##name();                                                                             \
    }                                                                                              \
    Test(store_rocks, name, .init = setup_rocks, .fini = teardown) {                               \
        body_##name();                                                                             \
    }                                                                                              \
    static void body_##name(void)

#define LIST_BYTES 4096

static kf_iter_t *iter_create(kf_cf_t cf, const void *lower, size_t lower_len, const void *upper,
                              size_t upper_len) {
    kf_iter_t *iter = NULL;
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_iter_create(h.store, cf, lower, lower_len, upper, upper_len, &iter, &err);
    cr_assert_eq(st, KF_OK, "iter_create: %s: %s", kf_status_name(st), err.message);
    cr_assert_not_null(iter);
    return iter;
}

STORE_TEST(families_are_independent) {
    harness_put_str(h.store, KF_CF_RUNS, "k", "in-runs");
    harness_put_str(h.store, KF_CF_STATE, "k", "in-state");
    char v[64];
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "k", v, sizeof v));
    cr_assert_str_eq(v, "in-runs");
    cr_assert(harness_get_str(h.store, KF_CF_STATE, "k", v, sizeof v));
    cr_assert_str_eq(v, "in-state");
    cr_assert_not(harness_get_str(h.store, KF_CF_OUTPUT, "k", v, sizeof v));
    cr_assert_not(harness_get_str(h.store, KF_CF_RUNS, "K", v, sizeof v));
}

/* Every family can be written and read back, including META beside the
 * format record. */
STORE_TEST(every_family_round_trips) {
    for (int cf = 0; cf < KF_CF_COUNT; cf++) {
        char value[64];
        snprintf(value, sizeof value, "value-of-%s", kf_cf_name((kf_cf_t)cf));
        harness_put_str(h.store, (kf_cf_t)cf, "same-key", value);
    }
    for (int cf = 0; cf < KF_CF_COUNT; cf++) {
        char want[64];
        char got[64];
        snprintf(want, sizeof want, "value-of-%s", kf_cf_name((kf_cf_t)cf));
        cr_assert(harness_get_str(h.store, (kf_cf_t)cf, "same-key", got, sizeof got), "%s",
                  kf_cf_name((kf_cf_t)cf));
        cr_assert_str_eq(got, want);
    }
}

STORE_TEST(missing_key_is_not_found_with_an_empty_value) {
    kf_value_t value = {(void *)&value, 99}; /* garbage the call must clear */
    bool found = true;
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_store_get(h.store, KF_CF_RUNS, "nope", 4, &value, &found, &err);
    cr_assert_eq(st, KF_OK);
    cr_assert_not(found);
    cr_assert_null(value.data);
    cr_assert_eq(value.len, 0);
    kf_store_value_free(&value); /* safe on an empty value */
}

STORE_TEST(binary_keys_and_empty_values) {
    static const uint8_t key[] = {0x00, 0xff, 0x00, 0x01, 0xfe};
    harness_put(h.store, KF_CF_WAKEUPS, key, sizeof key, "", 0);
    kf_value_t value;
    bool found = false;
    kf_error_t err;
    kf_status_t st = kf_store_get(h.store, KF_CF_WAKEUPS, key, sizeof key, &value, &found, &err);
    cr_assert_eq(st, KF_OK);
    cr_assert(found, "an empty value is still a value");
    cr_assert_eq(value.len, 0);
    kf_store_value_free(&value);
    cr_assert_not(harness_has(h.store, KF_CF_WAKEUPS, key, sizeof key - 1), "prefix of a key");
    cr_assert_not(harness_has(h.store, KF_CF_WAKEUPS, key, 0), "empty key");
}

STORE_TEST(large_values_round_trip) {
    size_t len = 3u * 1024 * 1024 + 7;
    uint8_t *data = malloc(len);
    cr_assert_not_null(data);
    for (size_t i = 0; i < len; i++) {
        data[i] = (uint8_t)(i * 131 + (i >> 13));
    }
    harness_put(h.store, KF_CF_OUTPUT, "big", 3, data, len);
    kf_value_t value;
    bool found = false;
    kf_error_t err;
    kf_status_t st = kf_store_get(h.store, KF_CF_OUTPUT, "big", 3, &value, &found, &err);
    cr_assert_eq(st, KF_OK);
    cr_assert(found);
    cr_assert_eq(value.len, len);
    cr_assert_eq(memcmp(value.data, data, len), 0);
    kf_store_value_free(&value);
    free(data);
}

STORE_TEST(overwrite_keeps_the_latest_value) {
    harness_put_str(h.store, KF_CF_RUNS, "r1", "first, a longer value");
    harness_put_str(h.store, KF_CF_RUNS, "r1", "second");
    char v[64];
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "r1", v, sizeof v));
    cr_assert_str_eq(v, "second");
    char keys[LIST_BYTES];
    cr_assert_eq(harness_keys(h.store, KF_CF_RUNS, NULL, NULL, keys, sizeof keys), 1);
}

STORE_TEST(delete_removes_only_that_key) {
    harness_put_str(h.store, KF_CF_RUNS, "a", "1");
    harness_put_str(h.store, KF_CF_RUNS, "ab", "2");
    harness_put_str(h.store, KF_CF_STATE, "a", "3");
    harness_delete_str(h.store, KF_CF_RUNS, "a");
    char v[16];
    cr_assert_not(harness_get_str(h.store, KF_CF_RUNS, "a", v, sizeof v));
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "ab", v, sizeof v));
    cr_assert(harness_get_str(h.store, KF_CF_STATE, "a", v, sizeof v));
    /* Deleting an absent key is not an error. */
    harness_delete_str(h.store, KF_CF_RUNS, "never-there");
    harness_delete_str(h.store, KF_CF_RUNS, "a");
}

static void put_seq(kf_cf_t cf, uint64_t from, uint64_t to) {
    kf_batch_t *batch = kf_batch_create(h.store);
    cr_assert_not_null(batch);
    for (uint64_t i = from; i < to; i++) {
        uint8_t key[8];
        kf_put_be64(key, i);
        kf_batch_put(batch, cf, key, sizeof key, &i, sizeof i);
    }
    harness_write(h.store, batch);
    kf_batch_destroy(batch);
}

static bool has_seq(kf_cf_t cf, uint64_t i) {
    uint8_t key[8];
    kf_put_be64(key, i);
    return harness_has(h.store, cf, key, sizeof key);
}

STORE_TEST(delete_range_is_half_open) {
    put_seq(KF_CF_RUN_QUEUE, 0, 10);
    put_seq(KF_CF_RUN_INDEX, 0, 10);
    uint8_t begin[8];
    uint8_t end[8];
    kf_put_be64(begin, 3);
    kf_put_be64(end, 7);
    kf_batch_t *batch = kf_batch_create(h.store);
    kf_batch_delete_range(batch, KF_CF_RUN_QUEUE, begin, sizeof begin, end, sizeof end);
    harness_write(h.store, batch);
    kf_batch_destroy(batch);
    for (uint64_t i = 0; i < 10; i++) {
        bool want = i < 3 || i >= 7;
        cr_assert_eq(has_seq(KF_CF_RUN_QUEUE, i), want, "key %llu", (unsigned long long)i);
        cr_assert(has_seq(KF_CF_RUN_INDEX, i), "other family lost key %llu", (unsigned long long)i);
    }
}

STORE_TEST(delete_range_by_prefix_bounds) {
    harness_put_str(h.store, KF_CF_COORD_JOURNAL, "a", "");
    harness_put_str(h.store, KF_CF_COORD_JOURNAL, "b", "");
    harness_put_str(h.store, KF_CF_COORD_JOURNAL, "b\x01", "");
    harness_put_str(h.store, KF_CF_COORD_JOURNAL, "bzzz", "");
    harness_put_str(h.store, KF_CF_COORD_JOURNAL, "c", "");
    kf_batch_t *batch = kf_batch_create(h.store);
    kf_batch_delete_range(batch, KF_CF_COORD_JOURNAL, "b", 1, "c", 1);
    harness_write(h.store, batch);
    kf_batch_destroy(batch);
    char keys[LIST_BYTES];
    cr_assert_eq(harness_keys(h.store, KF_CF_COORD_JOURNAL, NULL, NULL, keys, sizeof keys), 2);
    cr_assert_str_eq(keys, "a,c");
}

STORE_TEST(delete_range_empty_range_deletes_nothing) {
    put_seq(KF_CF_RUN_QUEUE, 0, 5);
    uint8_t at[8];
    kf_put_be64(at, 2);
    kf_batch_t *batch = kf_batch_create(h.store);
    kf_batch_delete_range(batch, KF_CF_RUN_QUEUE, at, sizeof at, at, sizeof at);
    harness_write(h.store, batch);
    kf_batch_destroy(batch);
    for (uint64_t i = 0; i < 5; i++) {
        cr_assert(has_seq(KF_CF_RUN_QUEUE, i), "key %llu", (unsigned long long)i);
    }
}

/* Nothing of a batch is visible before kf_store_write; all of it after. */
STORE_TEST(batch_applies_across_families_at_write) {
    harness_put_str(h.store, KF_CF_RUN_QUEUE, "old", "x");
    kf_batch_t *batch = kf_batch_create(h.store);
    cr_assert_not_null(batch);
    kf_batch_put(batch, KF_CF_COORD_SNAPSHOTS, "c1", 2, "snap", 4);
    kf_batch_put(batch, KF_CF_COORD_JOURNAL, "c1j", 3, "entry", 5);
    kf_batch_put(batch, KF_CF_RUNS, "r1", 2, "run", 3);
    kf_batch_put(batch, KF_CF_WAKEUPS, "w1", 2, "", 0);
    kf_batch_delete(batch, KF_CF_RUN_QUEUE, "old", 3);
    cr_assert_eq(kf_batch_count(batch), 5);
    char v[16];
    cr_assert_not(harness_get_str(h.store, KF_CF_COORD_SNAPSHOTS, "c1", v, sizeof v));
    cr_assert_not(harness_get_str(h.store, KF_CF_RUNS, "r1", v, sizeof v));
    cr_assert(harness_get_str(h.store, KF_CF_RUN_QUEUE, "old", v, sizeof v));
    harness_write(h.store, batch);
    kf_batch_destroy(batch);
    cr_assert(harness_get_str(h.store, KF_CF_COORD_SNAPSHOTS, "c1", v, sizeof v));
    cr_assert_str_eq(v, "snap");
    cr_assert(harness_get_str(h.store, KF_CF_COORD_JOURNAL, "c1j", v, sizeof v));
    cr_assert_str_eq(v, "entry");
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "r1", v, sizeof v));
    cr_assert_str_eq(v, "run");
    cr_assert(harness_get_str(h.store, KF_CF_WAKEUPS, "w1", v, sizeof v));
    cr_assert_not(harness_get_str(h.store, KF_CF_RUN_QUEUE, "old", v, sizeof v));
}

/* Operations of one batch apply in the order they were added. */
STORE_TEST(batch_operations_apply_in_order) {
    harness_put_str(h.store, KF_CF_STATE, "gone", "x");
    kf_batch_t *batch = kf_batch_create(h.store);
    kf_batch_put(batch, KF_CF_STATE, "k", 1, "v1", 2);
    kf_batch_delete(batch, KF_CF_STATE, "k", 1);
    kf_batch_put(batch, KF_CF_STATE, "k", 1, "v2", 2);
    kf_batch_put(batch, KF_CF_STATE, "d", 1, "v", 1);
    kf_batch_delete(batch, KF_CF_STATE, "d", 1);
    kf_batch_delete_range(batch, KF_CF_STATE, "a", 1, "z", 1);
    kf_batch_put(batch, KF_CF_STATE, "m", 1, "after-range", 11);
    harness_write(h.store, batch);
    kf_batch_destroy(batch);
    char v[32];
    cr_assert_not(harness_get_str(h.store, KF_CF_STATE, "k", v, sizeof v),
                  "the range deletion came after the put of k");
    cr_assert_not(harness_get_str(h.store, KF_CF_STATE, "d", v, sizeof v));
    cr_assert_not(harness_get_str(h.store, KF_CF_STATE, "gone", v, sizeof v));
    cr_assert(harness_get_str(h.store, KF_CF_STATE, "m", v, sizeof v),
              "a put after the range deletion survives it");
    cr_assert_str_eq(v, "after-range");

    batch = kf_batch_create(h.store);
    kf_batch_put(batch, KF_CF_STATE, "k", 1, "v1", 2);
    kf_batch_delete(batch, KF_CF_STATE, "k", 1);
    kf_batch_put(batch, KF_CF_STATE, "k", 1, "v2", 2);
    harness_write(h.store, batch);
    kf_batch_destroy(batch);
    cr_assert(harness_get_str(h.store, KF_CF_STATE, "k", v, sizeof v));
    cr_assert_str_eq(v, "v2");
}

STORE_TEST(batch_counts_and_bytes) {
    kf_batch_t *batch = kf_batch_create(h.store);
    cr_assert_eq(kf_batch_count(batch), 0);
    cr_assert_eq(kf_batch_bytes(batch), 0);
    kf_batch_put(batch, KF_CF_RUNS, "key", 3, "value", 5);
    cr_assert_eq(kf_batch_count(batch), 1);
    cr_assert_eq(kf_batch_bytes(batch), 8);
    kf_batch_delete(batch, KF_CF_RUNS, "gone", 4);
    cr_assert_eq(kf_batch_count(batch), 2);
    cr_assert_eq(kf_batch_bytes(batch), 12);
    kf_batch_delete_range(batch, KF_CF_RUNS, "b1", 2, "e12", 3);
    cr_assert_eq(kf_batch_count(batch), 3);
    cr_assert_eq(kf_batch_bytes(batch), 17);
    kf_batch_clear(batch);
    cr_assert_eq(kf_batch_count(batch), 0);
    cr_assert_eq(kf_batch_bytes(batch), 0);
    kf_batch_destroy(batch);
}

/* A written batch is left as it was; clearing it makes it reusable and
 * empty (a cleared batch writes nothing). */
STORE_TEST(batch_survives_write_and_clear_empties_it) {
    kf_batch_t *batch = kf_batch_create(h.store);
    kf_batch_put(batch, KF_CF_RUNS, "a", 1, "1", 1);
    harness_write(h.store, batch);
    cr_assert_eq(kf_batch_count(batch), 1);
    cr_assert_eq(kf_batch_bytes(batch), 2);
    harness_delete_str(h.store, KF_CF_RUNS, "a");
    harness_write(h.store, batch); /* the same operations again */
    char v[8];
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "a", v, sizeof v));
    kf_batch_clear(batch);
    kf_batch_put(batch, KF_CF_RUNS, "b", 1, "2", 1);
    harness_delete_str(h.store, KF_CF_RUNS, "a");
    harness_write(h.store, batch);
    cr_assert_not(harness_get_str(h.store, KF_CF_RUNS, "a", v, sizeof v),
                  "clear left an old operation in the batch");
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "b", v, sizeof v));
    kf_batch_clear(batch);
    harness_write(h.store, batch); /* an empty batch is a valid write */
    kf_batch_destroy(batch);
}

STORE_TEST(iteration_is_bytewise_ordered) {
    static const char *const keys[] = {"b", "a", "ab", "a\x01", "\x7f", "aa", "\x01", "ba"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        harness_put_str(h.store, KF_CF_FUNCTIONS, keys[i], keys[i]);
    }
    static const uint8_t high[] = {0xff, 0x00};
    harness_put(h.store, KF_CF_FUNCTIONS, high, sizeof high, "hi", 2);
    char list[LIST_BYTES];
    int n = harness_keys(h.store, KF_CF_FUNCTIONS, NULL, NULL, list, sizeof list);
    cr_assert_eq(n, 9);
    cr_assert_str_eq(list, "\\x01,a,a\\x01,aa,ab,b,ba,\\x7f,\\xff\\x00");
}

STORE_TEST(iteration_values_match_keys) {
    put_seq(KF_CF_RUN_QUEUE, 0, 300);
    kf_iter_t *iter = iter_create(KF_CF_RUN_QUEUE, NULL, 0, NULL, 0);
    uint64_t expect = 0;
    for (kf_iter_seek_first(iter); kf_iter_valid(iter); kf_iter_next(iter)) {
        size_t klen = 0;
        size_t vlen = 0;
        const uint8_t *key = kf_iter_key(iter, &klen);
        const void *value = kf_iter_value(iter, &vlen);
        cr_assert_eq(klen, 8);
        cr_assert_eq(kf_get_be64(key), expect, "big-endian keys iterate numerically");
        uint64_t v;
        cr_assert_eq(vlen, sizeof v);
        memcpy(&v, value, sizeof v);
        cr_assert_eq(v, expect);
        expect++;
    }
    cr_assert_eq(expect, 300);
    kf_error_t err;
    cr_assert_eq(kf_iter_status(iter, &err), KF_OK);
    kf_iter_destroy(iter);
}

STORE_TEST(iteration_stays_in_its_family) {
    harness_put_str(h.store, KF_CF_RUNS, "r", "");
    harness_put_str(h.store, KF_CF_RUN_INDEX, "i", "");
    harness_put_str(h.store, KF_CF_TIMERS_BY_KEY, "t", "");
    char list[LIST_BYTES];
    cr_assert_eq(harness_keys(h.store, KF_CF_RUN_INDEX, NULL, NULL, list, sizeof list), 1);
    cr_assert_str_eq(list, "i");
    cr_assert_eq(harness_keys(h.store, KF_CF_TIMERS_BY_TIME, NULL, NULL, list, sizeof list), 0);
    cr_assert_str_eq(list, "");
}

STORE_TEST(iteration_bounds_are_lower_inclusive_upper_exclusive) {
    static const char *const keys[] = {"a", "b", "b\x01", "bb", "c", "d"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        harness_put_str(h.store, KF_CF_STATE, keys[i], "");
    }
    char list[LIST_BYTES];
    cr_assert_eq(harness_keys(h.store, KF_CF_STATE, "b", "c", list, sizeof list), 3);
    cr_assert_str_eq(list, "b,b\\x01,bb");
    cr_assert_eq(harness_keys(h.store, KF_CF_STATE, "b", NULL, list, sizeof list), 5);
    cr_assert_str_eq(list, "b,b\\x01,bb,c,d");
    cr_assert_eq(harness_keys(h.store, KF_CF_STATE, NULL, "b\x01", list, sizeof list), 2);
    cr_assert_str_eq(list, "a,b");
    cr_assert_eq(harness_keys(h.store, KF_CF_STATE, "a0", "a1", list, sizeof list), 0);
    cr_assert_eq(harness_keys(h.store, KF_CF_STATE, "e", NULL, list, sizeof list), 0);
    cr_assert_eq(harness_keys(h.store, KF_CF_STATE, "bc", "d", list, sizeof list), 1);
    cr_assert_str_eq(list, "c");
}

STORE_TEST(seek_positions_at_the_first_key_not_below) {
    static const char *const keys[] = {"k10", "k20", "k30", "k40"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        harness_put_str(h.store, KF_CF_CHECKPOINTS, keys[i], keys[i]);
    }
    kf_iter_t *iter = iter_create(KF_CF_CHECKPOINTS, NULL, 0, NULL, 0);
    char list[LIST_BYTES];
    kf_iter_seek(iter, "k20", 3);
    cr_assert_eq(harness_collect(iter, list, sizeof list), 3);
    cr_assert_str_eq(list, "k20,k30,k40");
    kf_iter_seek(iter, "k21", 3);
    cr_assert_eq(harness_collect(iter, list, sizeof list), 2);
    cr_assert_str_eq(list, "k30,k40");
    kf_iter_seek(iter, "a", 1);
    cr_assert_eq(harness_collect(iter, list, sizeof list), 4);
    kf_iter_seek(iter, "k41", 3);
    cr_assert_not(kf_iter_valid(iter), "seek past the end");
    kf_iter_seek_first(iter);
    cr_assert(kf_iter_valid(iter));
    size_t len;
    const char *key = kf_iter_key(iter, &len);
    cr_assert_eq(len, 3);
    cr_assert_eq(memcmp(key, "k10", 3), 0);
    const char *value = kf_iter_value(iter, &len);
    cr_assert_eq(len, 3);
    cr_assert_eq(memcmp(value, "k10", 3), 0);
    kf_iter_destroy(iter);
}

STORE_TEST(seek_respects_the_bounds) {
    static const char *const keys[] = {"a", "b", "c", "d", "e"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        harness_put_str(h.store, KF_CF_PRODUCERS, keys[i], "");
    }
    kf_iter_t *iter = iter_create(KF_CF_PRODUCERS, "b", 1, "d", 1);
    char list[LIST_BYTES];
    kf_iter_seek(iter, "a", 1); /* below the lower bound: lands on it */
    cr_assert_eq(harness_collect(iter, list, sizeof list), 2);
    cr_assert_str_eq(list, "b,c");
    kf_iter_seek(iter, "c", 1);
    cr_assert_eq(harness_collect(iter, list, sizeof list), 1);
    cr_assert_str_eq(list, "c");
    kf_iter_seek(iter, "d", 1); /* at the upper bound: nothing */
    cr_assert_not(kf_iter_valid(iter));
    kf_iter_destroy(iter);
}

/* "The bounds are copied": the caller's buffers may change afterwards. */
STORE_TEST(iterator_copies_its_bounds) {
    static const char *const keys[] = {"a", "b", "c", "d", "e"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        harness_put_str(h.store, KF_CF_PRODUCERS, keys[i], "");
    }
    char *lower = malloc(1);
    char *upper = malloc(1);
    cr_assert(lower != NULL && upper != NULL);
    lower[0] = 'b';
    upper[0] = 'd';
    kf_iter_t *iter = iter_create(KF_CF_PRODUCERS, lower, 1, upper, 1);
    lower[0] = 'z';
    upper[0] = 'z';
    free(lower);
    free(upper);
    char list[LIST_BYTES];
    kf_iter_seek_first(iter);
    cr_assert_eq(harness_collect(iter, list, sizeof list), 2);
    cr_assert_str_eq(list, "b,c");
    kf_iter_destroy(iter);
}

/* Both implementations iterate over the store as it was when the iterator
 * was created (RocksDB pins a snapshot; the memory store copies). */
STORE_TEST(iterator_sees_the_store_as_of_its_creation) {
    harness_put_str(h.store, KF_CF_RUNS, "a", "1");
    harness_put_str(h.store, KF_CF_RUNS, "c", "3");
    kf_iter_t *iter = iter_create(KF_CF_RUNS, NULL, 0, NULL, 0);
    harness_put_str(h.store, KF_CF_RUNS, "b", "2");
    harness_delete_str(h.store, KF_CF_RUNS, "c");
    char list[LIST_BYTES];
    kf_iter_seek_first(iter);
    cr_assert_eq(harness_collect(iter, list, sizeof list), 2);
    cr_assert_str_eq(list, "a,c");
    kf_iter_destroy(iter);
    cr_assert_eq(harness_keys(h.store, KF_CF_RUNS, NULL, NULL, list, sizeof list), 2);
    cr_assert_str_eq(list, "a,b");
}

STORE_TEST(data_survives_close_and_reopen) {
    put_seq(KF_CF_RUN_QUEUE, 0, 100);
    harness_put_str(h.store, KF_CF_RUNS, "run-1", "pending");
    harness_put_str(h.store, KF_CF_RUNS, "run-2", "done");
    harness_delete_str(h.store, KF_CF_RUNS, "run-2");
    uint8_t begin[8];
    uint8_t end[8];
    kf_put_be64(begin, 10);
    kf_put_be64(end, 20);
    kf_batch_t *batch = kf_batch_create(h.store);
    kf_batch_delete_range(batch, KF_CF_RUN_QUEUE, begin, 8, end, 8);
    harness_write(h.store, batch);
    kf_batch_destroy(batch);

    harness_reopen(&h);
    char v[32];
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "run-1", v, sizeof v));
    cr_assert_str_eq(v, "pending");
    cr_assert_not(harness_get_str(h.store, KF_CF_RUNS, "run-2", v, sizeof v),
                  "a delete was lost across reopen");
    for (uint64_t i = 0; i < 100; i++) {
        cr_assert_eq(has_seq(KF_CF_RUN_QUEUE, i), i < 10 || i >= 20, "key %llu",
                     (unsigned long long)i);
    }
    /* And it can be written again after the restart. */
    harness_put_str(h.store, KF_CF_RUNS, "run-3", "new");
    harness_reopen(&h);
    cr_assert(harness_get_str(h.store, KF_CF_RUNS, "run-3", v, sizeof v));
}

static const char format_key[] = "format_version";

STORE_TEST(format_version_is_recorded_at_first_open) {
    kf_value_t value;
    bool found = false;
    kf_error_t err;
    kf_status_t st =
        kf_store_get(h.store, KF_CF_META, format_key, sizeof format_key - 1, &value, &found, &err);
    cr_assert_eq(st, KF_OK);
    cr_assert(found, "no format record after the first open");
    cr_assert_eq(kf_store_format_version(h.store), KF_STORE_FORMAT_VERSION);
    cr_assert_eq(value.len, 4);
    cr_assert_eq(kf_get_be32(value.data), KF_STORE_FORMAT_VERSION);
    kf_store_value_free(&value);
    harness_reopen(&h); /* the same version opens fine */
}

/* Does `text` contain `n` as a whole number (not inside a longer one)? */
static bool mentions_number(const char *text, unsigned n) {
    char want[16];
    snprintf(want, sizeof want, "%u", n);
    size_t len = strlen(want);
    for (const char *p = strstr(text, want); p != NULL; p = strstr(p + 1, want)) {
        bool before = p == text || p[-1] < '0' || p[-1] > '9';
        bool after = p[len] < '0' || p[len] > '9';
        if (before && after) {
            return true;
        }
    }
    return false;
}

static void write_format_record(const void *bytes, size_t len) {
    kf_batch_t *batch = kf_batch_create(h.store);
    kf_batch_put(batch, KF_CF_META, format_key, sizeof format_key - 1, bytes, len);
    harness_write(h.store, batch);
    kf_batch_destroy(batch);
    harness_close(&h);
}

STORE_TEST(another_format_version_is_refused) {
    uint8_t version[4];
    kf_put_be32(version, 7);
    write_format_record(version, sizeof version);
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = harness_open(&h, &err);
    cr_assert_eq(st, KF_E_CORRUPT, "got %s: %s", kf_status_name(st), err.message);
    cr_assert_null(h.store);
    cr_assert_eq(err.status, KF_E_CORRUPT);
    cr_assert(mentions_number(err.message, 7), "message '%s' lacks the stored version",
              err.message);
    cr_assert(mentions_number(err.message, KF_STORE_FORMAT_VERSION),
              "message '%s' lacks this build's version", err.message);
    /* Refused, never reinterpreted: the record is still the stored one. */
    st = harness_open(&h, &err);
    cr_assert_eq(st, KF_E_CORRUPT);
}

STORE_TEST(an_older_known_version_opens_and_says_so_until_upgraded) {
    uint8_t version[4];
    kf_put_be32(version, KF_STORE_FORMAT_OLDEST);
    write_format_record(version, sizeof version);
    kf_error_t err;
    kf_status_t st = harness_open(&h, &err);
    cr_assert_eq(st, KF_OK, "%s", err.message);
    cr_assert_eq(kf_store_format_version(h.store), KF_STORE_FORMAT_OLDEST);
    kf_batch_t *batch = kf_batch_create(h.store);
    kf_batch_put_format_version(batch);
    harness_write(h.store, batch);
    kf_batch_destroy(batch);
    harness_reopen(&h);
    cr_assert_eq(kf_store_format_version(h.store), KF_STORE_FORMAT_VERSION);
}

STORE_TEST(malformed_format_record_is_refused) {
    write_format_record("\x00\x01", 2);
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = harness_open(&h, &err);
    cr_assert_eq(st, KF_E_CORRUPT, "got %s: %s", kf_status_name(st), err.message);
    cr_assert_null(h.store);
}

/* What the store holds in memory is reported (for /metrics and the memory
 * figures in bench/README.md): records just written are in memtables. */
STORE_TEST(memory_counts_what_was_written) {
    kf_store_memory_t before, after;
    kf_store_memory(h.store, &before);
    char key[16], value[128];
    memset(value, 'v', sizeof value - 1);
    value[sizeof value - 1] = '\0';
    for (int i = 0; i < 1000; i++) {
        snprintf(key, sizeof key, "m%04d", i);
        harness_put_str(h.store, KF_CF_RUN_LIVE, key, value);
    }
    kf_store_memory(h.store, &after);
    cr_assert_geq(after.memtable_bytes, before.memtable_bytes + 1000 * sizeof value, "%llu -> %llu",
                  (unsigned long long)before.memtable_bytes,
                  (unsigned long long)after.memtable_bytes);
}
