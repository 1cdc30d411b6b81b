/* heap.c - the timer heap. */
#include "base/heap.h"

#include <stdlib.h>

#include "base/assert.h"

void kf_timer_init(kf_timer_t *timer, uint8_t type) {
    timer->due_ms = 0;
    timer->seq = 0;
    timer->index = KF_TIMER_UNARMED;
    timer->type = type;
}

void kf_heap_init(kf_heap_t *heap) {
    heap->items = NULL;
    heap->count = 0;
    heap->cap = 0;
    heap->next_seq = 0;
}

void kf_heap_deinit(kf_heap_t *heap) {
    for (uint32_t i = 0; i < heap->count; i++) {
        heap->items[i]->index = KF_TIMER_UNARMED;
    }
    free(heap->items);
    kf_heap_init(heap);
}

static bool before(const kf_timer_t *a, const kf_timer_t *b) {
    return a->due_ms < b->due_ms || (a->due_ms == b->due_ms && a->seq < b->seq);
}

static void place(kf_heap_t *heap, uint32_t i, kf_timer_t *t) {
    heap->items[i] = t;
    t->index = i;
}

static void sift_up(kf_heap_t *heap, uint32_t i) {
    kf_timer_t *t = heap->items[i];
    while (i > 0) {
        uint32_t parent = (i - 1) / 2;
        if (!before(t, heap->items[parent])) {
            break;
        }
        place(heap, i, heap->items[parent]);
        i = parent;
    }
    place(heap, i, t);
}

static void sift_down(kf_heap_t *heap, uint32_t i) {
    kf_timer_t *t = heap->items[i];
    for (;;) {
        uint32_t child = 2 * i + 1;
        if (child >= heap->count) {
            break;
        }
        if (child + 1 < heap->count && before(heap->items[child + 1], heap->items[child])) {
            child++;
        }
        if (!before(heap->items[child], t)) {
            break;
        }
        place(heap, i, heap->items[child]);
        i = child;
    }
    place(heap, i, t);
}

void kf_heap_arm(kf_heap_t *heap, kf_timer_t *timer, int64_t due_ms) {
    if (kf_timer_armed(timer)) {
        kf_heap_disarm(heap, timer);
    }
    if (heap->count == heap->cap) {
        uint32_t cap = heap->cap ? heap->cap * 2 : 256;
        kf_timer_t **items = realloc(heap->items, cap * sizeof *items);
        KF_ASSERT(items != NULL); /* bounded by KF_TIMERS_MAX; OOM here is fatal */
        heap->items = items;
        heap->cap = cap;
    }
    timer->due_ms = due_ms;
    timer->seq = heap->next_seq++;
    place(heap, heap->count++, timer);
    sift_up(heap, timer->index);
}

void kf_heap_disarm(kf_heap_t *heap, kf_timer_t *timer) {
    if (!kf_timer_armed(timer)) {
        return;
    }
    uint32_t i = timer->index;
    KF_ASSERT(i < heap->count && heap->items[i] == timer);
    timer->index = KF_TIMER_UNARMED;
    heap->count--;
    if (i == heap->count) {
        return;
    }
    kf_timer_t *moved = heap->items[heap->count];
    place(heap, i, moved);
    sift_down(heap, i);
    sift_up(heap, moved->index); /* the moved timer may belong above i instead */
}

kf_timer_t *kf_heap_peek(const kf_heap_t *heap) { return heap->count ? heap->items[0] : NULL; }

bool kf_heap_valid(const kf_heap_t *heap) {
    for (uint32_t i = 0; i < heap->count; i++) {
        if (heap->items[i]->index != i) {
            return false;
        }
        if (i > 0 && before(heap->items[i], heap->items[(i - 1) / 2])) {
            return false;
        }
    }
    return true;
}
