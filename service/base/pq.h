/*
 * pq.h - an intrusive, indexed binary min-heap ordered by a comparator.
 *
 * Items embed a kf_pq_node_t (its position, so removal and re-ordering are
 * O(log n)); the queue stores node pointers and never allocates per item.
 * The comparator must be a strict weak order with no ties (add a sequence
 * to break them) so that the pop order is deterministic. Single-threaded.
 */
#ifndef KF_BASE_PQ_H
#define KF_BASE_PQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KF_PQ_NONE UINT32_MAX

typedef struct kf_pq_node {
    uint32_t index; /* position in the queue, or KF_PQ_NONE */
} kf_pq_node_t;

typedef bool (*kf_pq_before_fn)(const kf_pq_node_t *a, const kf_pq_node_t *b, const void *ctx);

typedef struct kf_pq {
    kf_pq_node_t **items;
    uint32_t count;
    uint32_t cap;
    kf_pq_before_fn before;
    const void *ctx; /* passed to `before` */
} kf_pq_t;

void kf_pq_init(kf_pq_t *pq, kf_pq_before_fn before, const void *ctx);
/* Marks every queued node unqueued and frees the array. */
void kf_pq_deinit(kf_pq_t *pq);
static inline void kf_pq_node_init(kf_pq_node_t *n) {
    n->index = KF_PQ_NONE;
}
static inline bool kf_pq_queued(const kf_pq_node_t *n) {
    return n->index != KF_PQ_NONE;
}
void kf_pq_push(kf_pq_t *pq, kf_pq_node_t *node);
/* Bulk loading (recovery of many items at once): kf_pq_append queues a node
 * without restoring the heap order, and kf_pq_heapify restores it over the
 * whole queue in O(n), instead of O(log n) per push. Between them the queue
 * takes no other call. kf_pq_reserve makes room for `count` items in one
 * allocation. */
void kf_pq_reserve(kf_pq_t *pq, uint32_t count);
void kf_pq_append(kf_pq_t *pq, kf_pq_node_t *node);
void kf_pq_heapify(kf_pq_t *pq);
/* No-op when the node is not queued. */
void kf_pq_remove(kf_pq_t *pq, kf_pq_node_t *node);
static inline kf_pq_node_t *kf_pq_top(const kf_pq_t *pq) {
    return pq->count ? pq->items[0] : NULL;
}
/* Checks the heap property and indexes: O(n), for tests. */
bool kf_pq_valid(const kf_pq_t *pq);

#endif
