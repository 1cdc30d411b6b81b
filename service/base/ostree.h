/*
 * ostree.h - an intrusive ordered set that also counts: a treap whose
 * nodes know the size of their subtree, so "how many items come before
 * this point of the order" is O(depth), like the order-statistic trees of
 * textbooks.
 *
 * It holds process-function timers in (at_us, key, name) order: the first
 * node is the next timer to fire, and kf_ostree_count_prefix() answers
 * "how many timers are due" (at_us <= watermark) without visiting them.
 *
 * Items embed a kf_ostree_node_t; the tree never allocates. The comparator
 * must be a strict total order over the items in the tree (no two compare
 * equal). Priorities come from a generator seeded per tree, so the shape
 * is a pure function of the sequence of operations (deterministic runs);
 * the expected depth is O(log n). Single-threaded.
 */
#ifndef KF_BASE_OSTREE_H
#define KF_BASE_OSTREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kf_ostree_node {
    struct kf_ostree_node *parent;
    struct kf_ostree_node *left;
    struct kf_ostree_node *right;
    uint32_t size;     /* nodes in this subtree, itself included; 0: not in a tree */
    uint32_t priority; /* treap order: a parent's is >= its children's */
} kf_ostree_node_t;

/* <0, 0 or >0 as a sorts before, with or after b. */
typedef int (*kf_ostree_cmp_fn)(const kf_ostree_node_t *a, const kf_ostree_node_t *b,
                                const void *ctx);

typedef struct kf_ostree {
    kf_ostree_node_t *root;
    kf_ostree_node_t *first; /* the minimum, cached */
    kf_ostree_cmp_fn cmp;
    const void *ctx;    /* passed to cmp */
    uint64_t rng_state; /* priorities */
} kf_ostree_t;

void kf_ostree_init(kf_ostree_t *t, kf_ostree_cmp_fn cmp, const void *ctx);
/* Forgets every node (marks none of them: the owner frees them). */
void kf_ostree_deinit(kf_ostree_t *t);
static inline void kf_ostree_node_init(kf_ostree_node_t *n) {
    n->parent = n->left = n->right = NULL;
    n->size = 0;
    n->priority = 0;
}
static inline bool kf_ostree_linked(const kf_ostree_node_t *n) {
    return n->size != 0;
}
static inline uint32_t kf_ostree_count(const kf_ostree_t *t) {
    return t->root ? t->root->size : 0;
}
static inline kf_ostree_node_t *kf_ostree_first(const kf_ostree_t *t) {
    return t->first;
}
/* Inserts a node that is not in a tree; O(log n) expected. */
void kf_ostree_insert(kf_ostree_t *t, kf_ostree_node_t *n);
/* Removes a node of this tree; O(log n) expected. */
void kf_ostree_remove(kf_ostree_t *t, kf_ostree_node_t *n);
/* The node after n in the order, or NULL. */
kf_ostree_node_t *kf_ostree_next(const kf_ostree_node_t *n);
/* How many nodes satisfy `in_prefix`, which must hold for a prefix of the
 * order and for nothing after it (e.g. "at_us <= watermark"); O(depth). */
uint32_t kf_ostree_count_prefix(const kf_ostree_t *t,
                                bool (*in_prefix)(const kf_ostree_node_t *n, const void *arg),
                                const void *arg);
/* Checks order, priorities, sizes, parents and the cached minimum: O(n),
 * for tests. */
bool kf_ostree_valid(const kf_ostree_t *t);

#endif
