/*
 * ostree_test.c - the counting treap (service/base/ostree.h).
 *
 * Random insert / remove sequences from fixed seeds are checked against a
 * brute-force model after every operation: the same members in the same
 * order, the same first node, the same prefix counts, a valid tree. A
 * failure prints the seed and the step so it can be replayed.
 */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>

#include <criterion/criterion.h>

#include "base/ostree.h"

typedef struct item {
    kf_ostree_node_t node;
    int64_t at;  /* the primary order */
    uint32_t id; /* breaks ties, as key and name do for timers */
} item_t;

#define ITEM(n) ((const item_t *)((const char *)(n)-offsetof(item_t, node)))

static int cmp_items(const kf_ostree_node_t *a, const kf_ostree_node_t *b, const void *ctx) {
    (void)ctx;
    const item_t *x = ITEM(a), *y = ITEM(b);
    if (x->at != y->at) {
        return x->at < y->at ? -1 : 1;
    }
    return x->id < y->id ? -1 : x->id > y->id;
}

static bool at_most(const kf_ostree_node_t *n, const void *arg) {
    return ITEM(n)->at <= *(const int64_t *)arg;
}

static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

Test(ostree, empty) {
    kf_ostree_t t;
    kf_ostree_init(&t, cmp_items, NULL);
    cr_assert_eq(kf_ostree_count(&t), 0);
    cr_assert_null(kf_ostree_first(&t));
    int64_t w = 100;
    cr_assert_eq(kf_ostree_count_prefix(&t, at_most, &w), 0);
    cr_assert(kf_ostree_valid(&t));
}

Test(ostree, orders_and_counts) {
    kf_ostree_t t;
    kf_ostree_init(&t, cmp_items, NULL);
    item_t items[5] = {{.at = 30, .id = 1},
                       {.at = 10, .id = 2},
                       {.at = 30, .id = 0},
                       {.at = 20, .id = 3},
                       {.at = 50, .id = 4}};
    for (int i = 0; i < 5; i++) {
        kf_ostree_node_init(&items[i].node);
        kf_ostree_insert(&t, &items[i].node);
        cr_assert(kf_ostree_valid(&t));
    }
    const int order[] = {1, 3, 2, 0, 4}; /* 10, 20, 30/0, 30/1, 50 */
    const kf_ostree_node_t *n = kf_ostree_first(&t);
    for (int i = 0; i < 5; i++, n = kf_ostree_next(n)) {
        cr_assert_eq(n, &items[order[i]].node, "position %d", i);
    }
    cr_assert_null(n);
    int64_t w = 30;
    cr_assert_eq(kf_ostree_count_prefix(&t, at_most, &w), 4);
    w = 9;
    cr_assert_eq(kf_ostree_count_prefix(&t, at_most, &w), 0);
    kf_ostree_remove(&t, &items[1].node);
    cr_assert_not(kf_ostree_linked(&items[1].node));
    cr_assert_eq(kf_ostree_first(&t), &items[3].node);
    cr_assert_eq(kf_ostree_count(&t), 4);
    cr_assert(kf_ostree_valid(&t));
}

Test(ostree, a_duplicate_is_a_bug, .signal = SIGABRT) {
    kf_ostree_t t;
    kf_ostree_init(&t, cmp_items, NULL);
    item_t a = {.at = 1, .id = 1}, b = {.at = 1, .id = 1};
    kf_ostree_node_init(&a.node);
    kf_ostree_node_init(&b.node);
    kf_ostree_insert(&t, &a.node);
    kf_ostree_insert(&t, &b.node);
}

#define POOL 300

Test(ostree, random_sequences_match_a_model) {
    for (uint64_t seed = 1; seed <= 20; seed++) {
        uint64_t rng = seed;
        static item_t pool[POOL];
        kf_ostree_t t;
        kf_ostree_init(&t, cmp_items, NULL);
        for (uint32_t i = 0; i < POOL; i++) {
            pool[i] = (item_t){.at = 0, .id = i};
            kf_ostree_node_init(&pool[i].node);
        }
        for (int step = 0; step < 3000; step++) {
            item_t *it = &pool[next_random(&rng) % POOL];
            if (kf_ostree_linked(&it->node)) {
                kf_ostree_remove(&t, &it->node);
            } else {
                it->at = (int64_t)(next_random(&rng) % 50); /* many ties on `at` */
                kf_ostree_insert(&t, &it->node);
            }
            cr_assert(kf_ostree_valid(&t), "seed %llu step %d", (unsigned long long)seed, step);
            /* The model: members by brute force. */
            uint32_t members = 0;
            const item_t *min = NULL;
            int64_t w = (int64_t)(next_random(&rng) % 55);
            uint32_t due = 0;
            for (uint32_t i = 0; i < POOL; i++) {
                if (!kf_ostree_linked(&pool[i].node)) {
                    continue;
                }
                members++;
                due += pool[i].at <= w;
                if (min == NULL || cmp_items(&pool[i].node, &min->node, NULL) < 0) {
                    min = &pool[i];
                }
            }
            cr_assert_eq(kf_ostree_count(&t), members, "seed %llu step %d",
                         (unsigned long long)seed, step);
            cr_assert_eq(kf_ostree_first(&t), min ? &min->node : NULL, "seed %llu step %d",
                         (unsigned long long)seed, step);
            cr_assert_eq(kf_ostree_count_prefix(&t, at_most, &w), due, "seed %llu step %d",
                         (unsigned long long)seed, step);
        }
    }
}
