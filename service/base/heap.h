/*
 * heap.h - an indexed binary min-heap of timers.
 *
 * Timers are embedded in their owners (a coordinator, a run, a parked poll)
 * and ordered by (due_ms, seq): seq is the arm order, so timers due at the
 * same millisecond fire in the order they were armed, deterministically.
 * Each timer knows its index, so re-arming (a debounce window moving) and
 * disarming are O(log n). Single-threaded (the engine's).
 */
#ifndef KF_BASE_HEAP_H
#define KF_BASE_HEAP_H

#include <stdbool.h>
#include <stdint.h>

#define KF_TIMER_UNARMED UINT32_MAX

typedef struct kf_timer {
    int64_t due_ms;
    uint64_t seq;
    uint32_t index;              /* position in the heap, or KF_TIMER_UNARMED */
    uint8_t type;                /* owner kind, for dispatch when it fires */
} kf_timer_t;

typedef struct kf_heap {
    kf_timer_t **items;
    uint32_t count;
    uint32_t cap;
    uint64_t next_seq;
} kf_heap_t;

void kf_timer_init(kf_timer_t *timer, uint8_t type);
static inline bool kf_timer_armed(const kf_timer_t *t) { return t->index != KF_TIMER_UNARMED; }

void kf_heap_init(kf_heap_t *heap);
void kf_heap_deinit(kf_heap_t *heap);
/* Arms or re-arms. */
void kf_heap_arm(kf_heap_t *heap, kf_timer_t *timer, int64_t due_ms);
/* No-op when unarmed. */
void kf_heap_disarm(kf_heap_t *heap, kf_timer_t *timer);
/* The earliest timer, or NULL. */
kf_timer_t *kf_heap_peek(const kf_heap_t *heap);
static inline uint32_t kf_heap_count(const kf_heap_t *heap) { return heap->count; }
/* Checks the heap property over every item: O(n), for tests. */
bool kf_heap_valid(const kf_heap_t *heap);

#endif
