/*
 * ostree.c - the counting treap behind process-function timers.
 *
 * Invariants (kf_ostree_valid checks them all)
 *   1. In-order traversal is strictly increasing under cmp.
 *   2. A parent's priority is >= each child's (the treap's heap order).
 *   3. size = 1 + size(left) + size(right) for every node in the tree.
 *   4. parent pointers agree with left/right; the root's parent is NULL.
 *   5. first is the leftmost node (NULL when empty).
 * Rotations keep 1 and change only the two nodes' sizes; insert and remove
 * fix the sizes on the path to the root.
 */
#include "base/ostree.h"

#include <stddef.h>

#include "base/assert.h"

static uint32_t size_of(const kf_ostree_node_t *n) {
    return n ? n->size : 0;
}

/* xorshift64*: cheap, and the same priorities on every run. */
static uint32_t next_priority(kf_ostree_t *t) {
    uint64_t x = t->rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    t->rng_state = x;
    return (uint32_t)((x * 0x2545F4914F6CDD1DULL) >> 32);
}

void kf_ostree_init(kf_ostree_t *t, kf_ostree_cmp_fn cmp, const void *ctx) {
    t->root = NULL;
    t->first = NULL;
    t->cmp = cmp;
    t->ctx = ctx;
    t->rng_state = 0x9E3779B97F4A7C15ULL;
}

void kf_ostree_deinit(kf_ostree_t *t) {
    t->root = NULL;
    t->first = NULL;
}

/* Replaces `old` by `n` in old's parent (or as the root). */
static void replace_child(kf_ostree_t *t, kf_ostree_node_t *parent, kf_ostree_node_t *old,
                          kf_ostree_node_t *n) {
    if (parent == NULL) {
        t->root = n;
    } else if (parent->left == old) {
        parent->left = n;
    } else {
        parent->right = n;
    }
    if (n != NULL) {
        n->parent = parent;
    }
}

/* Lifts n above its parent; the subtree keeps its set of nodes, so only
 * the two nodes' sizes change. */
static void rotate_up(kf_ostree_t *t, kf_ostree_node_t *n) {
    kf_ostree_node_t *p = n->parent;
    KF_ASSERT(p != NULL);
    kf_ostree_node_t *g = p->parent;
    if (p->left == n) {
        p->left = n->right;
        if (n->right) {
            n->right->parent = p;
        }
        n->right = p;
    } else {
        p->right = n->left;
        if (n->left) {
            n->left->parent = p;
        }
        n->left = p;
    }
    p->parent = n;
    replace_child(t, g, p, n);
    n->size = p->size;
    p->size = 1 + size_of(p->left) + size_of(p->right);
}

void kf_ostree_insert(kf_ostree_t *t, kf_ostree_node_t *n) {
    KF_ASSERT(!kf_ostree_linked(n));
    n->left = n->right = NULL;
    n->size = 1;
    n->priority = next_priority(t);
    kf_ostree_node_t *p = NULL, *cur = t->root;
    bool left = false, leftmost = true;
    while (cur != NULL) {
        int c = t->cmp(n, cur, t->ctx);
        KF_ASSERT(c != 0); /* a strict order: no duplicates */
        cur->size++;
        p = cur;
        left = c < 0;
        leftmost = leftmost && left;
        cur = left ? cur->left : cur->right;
    }
    n->parent = p;
    if (p == NULL) {
        t->root = n;
    } else if (left) {
        p->left = n;
    } else {
        p->right = n;
    }
    if (leftmost) {
        t->first = n;
    }
    while (n->parent != NULL && n->parent->priority < n->priority) {
        rotate_up(t, n);
    }
}

kf_ostree_node_t *kf_ostree_next(const kf_ostree_node_t *n) {
    if (n->right != NULL) {
        const kf_ostree_node_t *c = n->right;
        while (c->left != NULL) {
            c = c->left;
        }
        return (kf_ostree_node_t *)c;
    }
    const kf_ostree_node_t *c = n;
    while (c->parent != NULL && c->parent->right == c) {
        c = c->parent;
    }
    return c->parent;
}

void kf_ostree_remove(kf_ostree_t *t, kf_ostree_node_t *n) {
    KF_ASSERT(kf_ostree_linked(n));
    if (t->first == n) {
        t->first = kf_ostree_next(n);
    }
    /* Rotate n down (its higher-priority child up) until it has at most
     * one child; rotations keep every ancestor's set of nodes. */
    while (n->left != NULL && n->right != NULL) {
        rotate_up(t, n->left->priority > n->right->priority ? n->left : n->right);
    }
    kf_ostree_node_t *child = n->left ? n->left : n->right;
    kf_ostree_node_t *p = n->parent;
    replace_child(t, p, n, child);
    for (kf_ostree_node_t *a = p; a != NULL; a = a->parent) {
        a->size--;
    }
    kf_ostree_node_init(n);
}

uint32_t kf_ostree_count_prefix(const kf_ostree_t *t,
                                bool (*in_prefix)(const kf_ostree_node_t *n, const void *arg),
                                const void *arg) {
    uint32_t count = 0;
    for (const kf_ostree_node_t *n = t->root; n != NULL;) {
        if (in_prefix(n, arg)) {
            count += size_of(n->left) + 1;
            n = n->right;
        } else {
            n = n->left;
        }
    }
    return count;
}

bool kf_ostree_valid(const kf_ostree_t *t) {
    if (t->root == NULL) {
        return t->first == NULL;
    }
    if (t->root->parent != NULL) {
        return false;
    }
    const kf_ostree_node_t *leftmost = t->root;
    while (leftmost->left != NULL) {
        leftmost = leftmost->left;
    }
    if (t->first != leftmost) {
        return false;
    }
    /* In order, through parent pointers: no recursion, no stack. */
    const kf_ostree_node_t *prev = NULL;
    uint32_t seen = 0;
    for (const kf_ostree_node_t *n = leftmost; n != NULL; n = kf_ostree_next(n)) {
        seen++;
        if (prev != NULL && t->cmp(prev, n, t->ctx) >= 0) {
            return false;
        }
        if (n->size != 1 + size_of(n->left) + size_of(n->right)) {
            return false;
        }
        const kf_ostree_node_t *kids[2] = {n->left, n->right};
        for (int i = 0; i < 2; i++) {
            if (kids[i] != NULL && (kids[i]->parent != n || kids[i]->priority > n->priority)) {
                return false;
            }
        }
        prev = n;
    }
    return seen == t->root->size;
}
