/* pq.c - the indexed binary heap behind timers and queues. */
#include "base/pq.h"

#include <stdlib.h>

#include "base/alloc.h"
#include "base/assert.h"

void kf_pq_init(kf_pq_t *pq, kf_pq_before_fn before, const void *ctx) {
    pq->items = NULL;
    pq->count = 0;
    pq->cap = 0;
    pq->before = before;
    pq->ctx = ctx;
}

void kf_pq_deinit(kf_pq_t *pq) {
    for (uint32_t i = 0; i < pq->count; i++) {
        pq->items[i]->index = KF_PQ_NONE;
    }
    free(pq->items);
    pq->items = NULL;
    pq->count = pq->cap = 0;
}

static void place(kf_pq_t *pq, uint32_t i, kf_pq_node_t *n) {
    pq->items[i] = n;
    n->index = i;
}

static void sift_up(kf_pq_t *pq, uint32_t i) {
    kf_pq_node_t *n = pq->items[i];
    while (i > 0) {
        uint32_t parent = (i - 1) / 2;
        if (!pq->before(n, pq->items[parent], pq->ctx)) {
            break;
        }
        place(pq, i, pq->items[parent]);
        i = parent;
    }
    place(pq, i, n);
}

static void sift_down(kf_pq_t *pq, uint32_t i) {
    kf_pq_node_t *n = pq->items[i];
    for (;;) {
        uint32_t child = 2 * i + 1;
        if (child >= pq->count) {
            break;
        }
        if (child + 1 < pq->count && pq->before(pq->items[child + 1], pq->items[child], pq->ctx)) {
            child++;
        }
        if (!pq->before(pq->items[child], n, pq->ctx)) {
            break;
        }
        place(pq, i, pq->items[child]);
        i = child;
    }
    place(pq, i, n);
}

void kf_pq_reserve(kf_pq_t *pq, uint32_t count) {
    if (count > pq->cap) {
        pq->items = kf_xrealloc(pq->items, (size_t)count * sizeof *pq->items);
        pq->cap = count;
    }
}

void kf_pq_append(kf_pq_t *pq, kf_pq_node_t *node) {
    KF_ASSERT(!kf_pq_queued(node));
    if (pq->count == pq->cap) {
        KF_ASSERT(pq->cap < UINT32_MAX / 2);
        kf_pq_reserve(pq, pq->cap ? pq->cap * 2 : 256);
    }
    place(pq, pq->count++, node);
}

void kf_pq_heapify(kf_pq_t *pq) {
    /* Floyd: sift every inner node down, the last first. */
    for (uint32_t i = pq->count / 2; i-- > 0;) {
        sift_down(pq, i);
    }
}

void kf_pq_push(kf_pq_t *pq, kf_pq_node_t *node) {
    kf_pq_append(pq, node);
    sift_up(pq, node->index);
}

void kf_pq_remove(kf_pq_t *pq, kf_pq_node_t *node) {
    if (!kf_pq_queued(node)) {
        return;
    }
    uint32_t i = node->index;
    KF_ASSERT(i < pq->count && pq->items[i] == node);
    node->index = KF_PQ_NONE;
    pq->count--;
    if (i == pq->count) {
        return;
    }
    kf_pq_node_t *moved = pq->items[pq->count];
    place(pq, i, moved);
    sift_down(pq, i);
    sift_up(pq, moved->index); /* the moved node may belong above i instead */
}

bool kf_pq_valid(const kf_pq_t *pq) {
    for (uint32_t i = 0; i < pq->count; i++) {
        if (pq->items[i]->index != i) {
            return false;
        }
        if (i > 0 && pq->before(pq->items[i], pq->items[(i - 1) / 2], pq->ctx)) {
            return false;
        }
    }
    return true;
}
