/* heap.c - processing-time timers over the indexed heap of pq.c. */
#include "base/heap.h"

#include <stddef.h>

#include "base/assert.h"
#include "base/map.h"

static bool before(const kf_pq_node_t *an, const kf_pq_node_t *bn, const void *ctx) {
    (void)ctx;
    const kf_timer_t *a = KF_CONTAINER_OF(an, kf_timer_t, node);
    const kf_timer_t *b = KF_CONTAINER_OF(bn, kf_timer_t, node);
    return a->due_ms < b->due_ms || (a->due_ms == b->due_ms && a->seq < b->seq);
}

void kf_timer_init(kf_timer_t *timer, uint8_t type) {
    kf_pq_node_init(&timer->node);
    timer->due_ms = 0;
    timer->seq = 0;
    timer->type = type;
}

void kf_heap_init(kf_heap_t *heap) {
    kf_pq_init(&heap->pq, before, NULL);
    heap->next_seq = 0;
}

void kf_heap_deinit(kf_heap_t *heap) {
    kf_pq_deinit(&heap->pq);
}

void kf_heap_arm(kf_heap_t *heap, kf_timer_t *timer, int64_t due_ms) {
    kf_pq_remove(&heap->pq, &timer->node);
    timer->due_ms = due_ms;
    timer->seq = heap->next_seq++;
    kf_pq_push(&heap->pq, &timer->node);
}

void kf_heap_reserve(kf_heap_t *heap, uint32_t count) {
    KF_ASSERT(count <= UINT32_MAX - heap->pq.count);
    kf_pq_reserve(&heap->pq, heap->pq.count + count);
}

void kf_heap_arm_unordered(kf_heap_t *heap, kf_timer_t *timer, int64_t due_ms) {
    timer->due_ms = due_ms;
    timer->seq = heap->next_seq++;
    kf_pq_append(&heap->pq, &timer->node);
}

void kf_heap_reorder(kf_heap_t *heap) {
    kf_pq_heapify(&heap->pq);
}

void kf_heap_disarm(kf_heap_t *heap, kf_timer_t *timer) {
    kf_pq_remove(&heap->pq, &timer->node);
}

kf_timer_t *kf_heap_peek(const kf_heap_t *heap) {
    kf_pq_node_t *n = kf_pq_top(&heap->pq);
    return n ? KF_CONTAINER_OF(n, kf_timer_t, node) : NULL;
}

bool kf_heap_valid(const kf_heap_t *heap) {
    return kf_pq_valid(&heap->pq);
}
