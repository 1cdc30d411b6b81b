/*
 * heap.h - the engine's processing-time timers: a kf_pq (pq.h) ordered by
 * (due_ms, seq).
 *
 * Timers are embedded in their owners (a coordinator, a run, a parked poll);
 * seq is the arm order, so timers due at the same millisecond fire in the
 * order they were armed, deterministically. Re-arming (a debounce window
 * moving) and disarming are O(log n). Single-threaded (the engine's).
 */
#ifndef KF_BASE_HEAP_H
#define KF_BASE_HEAP_H

#include <stdbool.h>
#include <stdint.h>

#include "base/pq.h"

typedef struct kf_timer {
    kf_pq_node_t node; /* position in the heap */
    int64_t due_ms;
    uint64_t seq;
    uint8_t type; /* owner kind, for dispatch when it fires */
} kf_timer_t;

typedef struct kf_heap {
    kf_pq_t pq;
    uint64_t next_seq;
} kf_heap_t;

void kf_timer_init(kf_timer_t *timer, uint8_t type);
static inline bool kf_timer_armed(const kf_timer_t *t) {
    return kf_pq_queued(&t->node);
}

void kf_heap_init(kf_heap_t *heap);
void kf_heap_deinit(kf_heap_t *heap);
/* Arms or re-arms. */
void kf_heap_arm(kf_heap_t *heap, kf_timer_t *timer, int64_t due_ms);
/* Bulk arming (recovery): kf_heap_arm_unordered arms an unarmed timer
 * without restoring the heap order, and kf_heap_reorder restores it in O(n)
 * over every timer; nothing else touches the heap in between. The firing
 * order is the same as arming them one by one. kf_heap_reserve makes room
 * for `count` more timers in one allocation. */
void kf_heap_reserve(kf_heap_t *heap, uint32_t count);
void kf_heap_arm_unordered(kf_heap_t *heap, kf_timer_t *timer, int64_t due_ms);
void kf_heap_reorder(kf_heap_t *heap);
/* No-op when unarmed. */
void kf_heap_disarm(kf_heap_t *heap, kf_timer_t *timer);
/* The earliest timer, or NULL. */
kf_timer_t *kf_heap_peek(const kf_heap_t *heap);
static inline uint32_t kf_heap_count(const kf_heap_t *heap) {
    return heap->pq.count;
}
/* Checks the heap property over every item: O(n), for tests. */
bool kf_heap_valid(const kf_heap_t *heap);

#endif
