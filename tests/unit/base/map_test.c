/*
 * map_test.c - the intrusive hash map (service/base/map.h).
 *
 * Entries embed their node and own their key bytes, as the engine's do. The
 * checks: lookups by byte string (lengths and embedded NULs matter), growth
 * keeps every entry reachable, iteration visits each entry exactly once, and
 * removing the current entry during iteration (next fetched first) is safe.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "base/map.h"

typedef struct entry {
    kf_map_node_t node;
    char key[24];
    size_t key_len;
    int value;
    int visits;
} entry_t;

static entry_t *entry_of(kf_map_node_t *n) {
    return KF_CONTAINER_OF(n, entry_t, node);
}

static void entry_set(entry_t *e, int i) {
    int n = snprintf(e->key, sizeof e->key, "key-%d", i);
    e->key_len = (size_t)n;
    e->value = i;
    e->visits = 0;
}

static entry_t *lookup(const kf_map_t *map, const void *key, size_t len) {
    kf_map_node_t *n = kf_map_get(map, key, len);
    return n != NULL ? entry_of(n) : NULL;
}

Test(map, empty_map) {
    kf_map_t map;
    kf_map_init(&map);
    cr_assert_null(kf_map_get(&map, "x", 1));
    size_t bucket;
    cr_assert_null(kf_map_first(&map, &bucket));
    cr_assert_eq(map.count, 0);
    kf_map_deinit(&map);
}

Test(map, insert_get_remove) {
    kf_map_t map;
    kf_map_init(&map);
    entry_t a;
    entry_t b;
    entry_set(&a, 1);
    entry_set(&b, 2);
    kf_map_insert(&map, &a.node, a.key, a.key_len);
    kf_map_insert(&map, &b.node, b.key, b.key_len);
    cr_assert_eq(map.count, 2);
    cr_assert_eq(lookup(&map, "key-1", 5), &a);
    cr_assert_eq(lookup(&map, "key-2", 5), &b);
    cr_assert_null(lookup(&map, "key-3", 5));
    cr_assert_null(lookup(&map, "key-1", 4), "a prefix is another key");
    kf_map_remove(&map, &a.node);
    cr_assert_eq(map.count, 1);
    cr_assert_null(lookup(&map, "key-1", 5));
    cr_assert_eq(lookup(&map, "key-2", 5), &b);
    /* Re-insert after removal. */
    kf_map_insert(&map, &a.node, a.key, a.key_len);
    cr_assert_eq(lookup(&map, "key-1", 5), &a);
    cr_assert_eq(map.count, 2);
    kf_map_deinit(&map);
    cr_assert_eq(map.count, 0);
    cr_assert_null(map.buckets);
}

/* Keys are byte strings: length and embedded NULs distinguish them, and the
 * empty key is a key. */
Test(map, keys_are_byte_strings) {
    kf_map_t map;
    kf_map_init(&map);
    static const char k1[] = {'a', 'b'};
    static const char k2[] = {'a', 'b', '\0'};
    static const char k3[] = {'\0', 'a', 'b'};
    static const char k4[] = {'a', '\0', 'b'};
    entry_t e[5];
    const char *keys[] = {k1, k2, k3, k4, ""};
    size_t lens[] = {2, 3, 3, 3, 0};
    for (int i = 0; i < 5; i++) {
        memset(&e[i], 0, sizeof e[i]);
        e[i].value = i;
        kf_map_insert(&map, &e[i].node, keys[i], lens[i]);
    }
    for (int i = 0; i < 5; i++) {
        entry_t *got = lookup(&map, keys[i], lens[i]);
        cr_assert_eq(got, &e[i], "key %d", i);
    }
    cr_assert_null(lookup(&map, "a", 1));
    cr_assert_null(lookup(&map, "ab\0\0", 4));
    kf_map_deinit(&map);
}

Test(map, node_records_its_key) {
    kf_map_t map;
    kf_map_init(&map);
    entry_t a;
    entry_set(&a, 77);
    kf_map_insert(&map, &a.node, a.key, a.key_len);
    cr_assert_eq(a.node.key, a.key);
    cr_assert_eq(a.node.key_len, a.key_len);
    cr_assert_eq(a.node.hash, kf_hash_bytes(a.key, a.key_len));
    kf_map_deinit(&map);
}

Test(map, duplicate_insert_asserts, .signal = SIGABRT) {
    kf_map_t map;
    kf_map_init(&map);
    entry_t a;
    entry_t b;
    entry_set(&a, 5);
    entry_set(&b, 5);
    kf_map_insert(&map, &a.node, a.key, a.key_len);
    kf_map_insert(&map, &b.node, b.key, b.key_len);
}

Test(map, removing_an_entry_that_is_not_in_the_map_asserts, .signal = SIGABRT) {
    kf_map_t map;
    kf_map_init(&map);
    entry_t a;
    entry_t stranger;
    entry_set(&a, 1);
    entry_set(&stranger, 2);
    kf_map_insert(&map, &a.node, a.key, a.key_len);
    memset(&stranger.node, 0, sizeof stranger.node);
    stranger.node.hash = kf_hash_bytes(stranger.key, stranger.key_len);
    kf_map_remove(&map, &stranger.node);
}

Test(map, hash_is_deterministic_and_spreads) {
    cr_assert_eq(kf_hash_bytes("abc", 3), kf_hash_bytes("abc", 3));
    cr_assert_neq(kf_hash_bytes("abc", 3), kf_hash_bytes("abd", 3));
    cr_assert_neq(kf_hash_bytes("", 0), kf_hash_bytes("\0", 1));
    /* Keys differing only in the last byte land in different low bits. */
    bool used[64] = {false};
    int distinct = 0;
    for (int i = 0; i < 64; i++) {
        char key[8] = "prefix";
        key[6] = (char)i;
        unsigned low = (unsigned)(kf_hash_bytes(key, 7) & 63);
        if (!used[low]) {
            used[low] = true;
            distinct++;
        }
    }
    cr_assert_gt(distinct, 30, "64 keys used only %d of 64 buckets", distinct);
}

Test(map, growth_keeps_every_entry) {
    enum { N = 20000 };
    entry_t *e = calloc(N, sizeof *e);
    cr_assert_not_null(e);
    kf_map_t map;
    kf_map_init(&map);
    for (int i = 0; i < N; i++) {
        entry_set(&e[i], i);
        kf_map_insert(&map, &e[i].node, e[i].key, e[i].key_len);
        cr_assert_eq(map.count, (size_t)i + 1);
        cr_assert_geq(map.bucket_count, map.count, "load factor above 1");
        cr_assert_eq(map.bucket_count & (map.bucket_count - 1), 0, "%zu buckets", map.bucket_count);
    }
    for (int i = 0; i < N; i++) {
        char key[24];
        int n = snprintf(key, sizeof key, "key-%d", i);
        entry_t *got = lookup(&map, key, (size_t)n);
        cr_assert_eq(got, &e[i], "key-%d", i);
        cr_assert_eq(got->value, i);
    }
    cr_assert_null(lookup(&map, "key-20000", 9));
    kf_map_deinit(&map);
    free(e);
}

static void visit_all(const kf_map_t *map, int *visited) {
    size_t bucket;
    *visited = 0;
    for (kf_map_node_t *n = kf_map_first(map, &bucket); n != NULL;
         n = kf_map_next(map, &bucket, n)) {
        entry_of(n)->visits++;
        (*visited)++;
    }
}

Test(map, iteration_visits_each_entry_once) {
    enum { N = 1000 };
    entry_t *e = calloc(N, sizeof *e);
    cr_assert_not_null(e);
    kf_map_t map;
    kf_map_init(&map);
    for (int i = 0; i < N; i++) {
        entry_set(&e[i], i);
        kf_map_insert(&map, &e[i].node, e[i].key, e[i].key_len);
    }
    int visited;
    visit_all(&map, &visited);
    cr_assert_eq(visited, N);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(e[i].visits, 1, "entry %d visited %d times", i, e[i].visits);
    }
    kf_map_deinit(&map);
    free(e);
}

/* Remove every entry whose value is odd while iterating, fetching the next
 * node first as the header requires; each entry is still seen exactly once. */
Test(map, removal_during_iteration) {
    enum { N = 3000 };
    entry_t *e = calloc(N, sizeof *e);
    cr_assert_not_null(e);
    kf_map_t map;
    kf_map_init(&map);
    for (int i = 0; i < N; i++) {
        entry_set(&e[i], i);
        kf_map_insert(&map, &e[i].node, e[i].key, e[i].key_len);
    }
    size_t bucket;
    int seen = 0;
    kf_map_node_t *n = kf_map_first(&map, &bucket);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&map, &bucket, n);
        entry_t *x = entry_of(n);
        x->visits++;
        seen++;
        if (x->value % 2 == 1) {
            kf_map_remove(&map, n);
        }
        n = next;
    }
    cr_assert_eq(seen, N);
    cr_assert_eq(map.count, N / 2);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(e[i].visits, 1, "entry %d visited %d times", i, e[i].visits);
        entry_t *got = lookup(&map, e[i].key, e[i].key_len);
        if (i % 2 == 1) {
            cr_assert_null(got, "removed entry %d still found", i);
        } else {
            cr_assert_eq(got, &e[i], "kept entry %d lost", i);
        }
    }
    int visited;
    visit_all(&map, &visited);
    cr_assert_eq(visited, N / 2);
    kf_map_deinit(&map);
    free(e);
}

Test(map, remove_everything_during_iteration) {
    enum { N = 500 };
    entry_t *e = calloc(N, sizeof *e);
    cr_assert_not_null(e);
    kf_map_t map;
    kf_map_init(&map);
    for (int i = 0; i < N; i++) {
        entry_set(&e[i], i);
        kf_map_insert(&map, &e[i].node, e[i].key, e[i].key_len);
    }
    size_t bucket;
    int seen = 0;
    for (kf_map_node_t *n = kf_map_first(&map, &bucket), *next; n != NULL; n = next) {
        next = kf_map_next(&map, &bucket, n);
        kf_map_remove(&map, n);
        seen++;
    }
    cr_assert_eq(seen, N);
    cr_assert_eq(map.count, 0);
    cr_assert_null(kf_map_first(&map, &bucket));
    for (int i = 0; i < N; i++) {
        cr_assert_null(lookup(&map, e[i].key, e[i].key_len));
    }
    kf_map_deinit(&map);
    free(e);
}

/* A seeded mix of inserts and removes against a presence array. */
Test(map, random_operations_match_a_model) {
    enum { N = 2000 };
    entry_t *e = calloc(N, sizeof *e);
    cr_assert_not_null(e);
    bool *present = calloc(N, sizeof *present);
    cr_assert_not_null(present);
    kf_map_t map;
    kf_map_init(&map);
    for (int i = 0; i < N; i++) {
        entry_set(&e[i], i);
    }
    uint64_t rs = 12345;
    size_t count = 0;
    for (int step = 0; step < 50000; step++) {
        rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
        int i = (int)((rs >> 33) % N);
        if (present[i]) {
            kf_map_remove(&map, &e[i].node);
            present[i] = false;
            count--;
        } else {
            kf_map_insert(&map, &e[i].node, e[i].key, e[i].key_len);
            present[i] = true;
            count++;
        }
        cr_assert_eq(map.count, count, "step %d", step);
        cr_assert_eq(lookup(&map, e[i].key, e[i].key_len), present[i] ? &e[i] : NULL,
                     "step %d key %d", step, i);
    }
    for (int i = 0; i < N; i++) {
        cr_assert_eq(lookup(&map, e[i].key, e[i].key_len), present[i] ? &e[i] : NULL, "key %d", i);
    }
    kf_map_deinit(&map);
    free(present);
    free(e);
}

/* Reserving sizes the buckets once: inserting that many entries afterwards
 * does not grow them, every entry stays reachable, and reserving again for
 * fewer, with entries present, keeps them all. */
Test(map, reserve_then_insert_does_not_grow) {
    enum { N = 3000 };
    entry_t *e = calloc(N, sizeof *e);
    cr_assert_not_null(e);
    kf_map_t map;
    kf_map_init(&map);
    entry_set(&e[0], 0);
    kf_map_insert(&map, &e[0].node, e[0].key, e[0].key_len);
    kf_map_reserve(&map, N);
    size_t buckets = map.bucket_count;
    cr_assert_geq(buckets, N);
    for (int i = 1; i < N; i++) {
        entry_set(&e[i], i);
        cr_assert(kf_map_try_insert(&map, &e[i].node, e[i].key, e[i].key_len));
    }
    cr_assert_eq(map.bucket_count, buckets, "no growth after reserve");
    kf_map_reserve(&map, 10);
    cr_assert_eq(map.bucket_count, buckets, "reserve never shrinks");
    for (int i = 0; i < N; i++) {
        cr_assert_eq(lookup(&map, e[i].key, e[i].key_len), &e[i], "entry %d", i);
    }
    kf_map_deinit(&map);
    free(e);
}
