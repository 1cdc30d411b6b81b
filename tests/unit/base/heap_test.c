/*
 * heap_test.c - the timer heap (service/base/heap.h).
 *
 * Random arm / re-arm / disarm sequences from fixed seeds are checked against
 * a brute-force model after every operation: the same set of armed timers,
 * the same earliest timer under the (due_ms, arm order) order, a valid heap.
 * A failure prints the seed and the step so it can be replayed.
 */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "base/heap.h"

/* A small deterministic generator (splitmix64) so the sequences are the same
 * on every run and every platform. */
static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

Test(heap, empty_heap) {
    kf_heap_t heap;
    kf_heap_init(&heap);
    cr_assert_null(kf_heap_peek(&heap));
    cr_assert_eq(kf_heap_count(&heap), 0);
    cr_assert(kf_heap_valid(&heap));
    kf_heap_deinit(&heap);
}

Test(heap, timer_init_is_unarmed_and_keeps_type) {
    kf_timer_t t;
    memset(&t, 0x5c, sizeof t);
    kf_timer_init(&t, 3);
    cr_assert_not(kf_timer_armed(&t));
    cr_assert_not(kf_timer_armed(&t));
    cr_assert_eq(t.type, 3);
    kf_heap_t heap;
    kf_heap_init(&heap);
    kf_heap_arm(&heap, &t, 10);
    cr_assert(kf_timer_armed(&t));
    cr_assert_eq(t.type, 3, "arming keeps the owner type");
    cr_assert_eq(t.due_ms, 10);
    kf_heap_deinit(&heap);
}

/* Disarms the earliest timer and returns it. */
static kf_timer_t *pop(kf_heap_t *heap) {
    kf_timer_t *t = kf_heap_peek(heap);
    if (t != NULL) {
        kf_heap_disarm(heap, t);
        cr_assert_not(kf_timer_armed(t));
        cr_assert(kf_heap_valid(heap));
    }
    return t;
}

Test(heap, equal_due_fires_in_arm_order) {
    kf_heap_t heap;
    kf_heap_init(&heap);
    kf_timer_t t[5];
    for (int i = 0; i < 5; i++) {
        kf_timer_init(&t[i], (uint8_t)i);
    }
    /* Arm in the order 3, 1, 4, 0, 2, all at the same millisecond. */
    static const int order[] = {3, 1, 4, 0, 2};
    for (int i = 0; i < 5; i++) {
        kf_heap_arm(&heap, &t[order[i]], 500);
        cr_assert(kf_heap_valid(&heap));
    }
    for (int i = 0; i < 5; i++) {
        kf_timer_t *got = pop(&heap);
        cr_assert_eq(got, &t[order[i]], "position %d: got timer %d", i, (int)(got - t));
    }
    cr_assert_null(kf_heap_peek(&heap));
    kf_heap_deinit(&heap);
}

/* Re-arming at the same time counts as a new arm: the timer moves behind the
 * others due at that millisecond. */
Test(heap, rearm_at_same_due_moves_to_the_back) {
    kf_heap_t heap;
    kf_heap_init(&heap);
    kf_timer_t a;
    kf_timer_t b;
    kf_timer_t c;
    kf_timer_init(&a, 0);
    kf_timer_init(&b, 0);
    kf_timer_init(&c, 0);
    kf_heap_arm(&heap, &a, 100);
    kf_heap_arm(&heap, &b, 100);
    kf_heap_arm(&heap, &c, 100);
    kf_heap_arm(&heap, &a, 100);
    cr_assert_eq(kf_heap_count(&heap), 3, "re-arming does not add a second entry");
    cr_assert_eq(pop(&heap), &b);
    cr_assert_eq(pop(&heap), &c);
    cr_assert_eq(pop(&heap), &a);
    kf_heap_deinit(&heap);
}

Test(heap, rearm_moves_earlier_and_later) {
    kf_heap_t heap;
    kf_heap_init(&heap);
    kf_timer_t t[3];
    for (int i = 0; i < 3; i++) {
        kf_timer_init(&t[i], 0);
        kf_heap_arm(&heap, &t[i], 1000 * (i + 1));
    }
    cr_assert_eq(kf_heap_peek(&heap), &t[0]);
    kf_heap_arm(&heap, &t[2], 10);
    cr_assert_eq(kf_heap_peek(&heap), &t[2]);
    cr_assert_eq(t[2].due_ms, 10);
    kf_heap_arm(&heap, &t[2], 5000);
    cr_assert_eq(kf_heap_peek(&heap), &t[0]);
    cr_assert(kf_heap_valid(&heap));
    cr_assert_eq(pop(&heap), &t[0]);
    cr_assert_eq(pop(&heap), &t[1]);
    cr_assert_eq(pop(&heap), &t[2]);
    kf_heap_deinit(&heap);
}

Test(heap, disarm_unarmed_and_twice_is_a_noop) {
    kf_heap_t heap;
    kf_heap_init(&heap);
    kf_timer_t a;
    kf_timer_t b;
    kf_timer_init(&a, 0);
    kf_timer_init(&b, 0);
    kf_heap_disarm(&heap, &a);
    cr_assert_eq(kf_heap_count(&heap), 0);
    kf_heap_arm(&heap, &a, 1);
    kf_heap_arm(&heap, &b, 2);
    kf_heap_disarm(&heap, &a);
    kf_heap_disarm(&heap, &a);
    cr_assert_eq(kf_heap_count(&heap), 1);
    cr_assert_eq(kf_heap_peek(&heap), &b);
    cr_assert(kf_heap_valid(&heap));
    kf_heap_deinit(&heap);
}

Test(heap, extreme_and_negative_due_times) {
    kf_heap_t heap;
    kf_heap_init(&heap);
    static const int64_t dues[] = {INT64_MAX, 0, -1, INT64_MIN, 42, INT64_MIN + 1, -42};
    static const int expected[] = {3, 5, 6, 2, 1, 4, 0};
    kf_timer_t t[7];
    for (int i = 0; i < 7; i++) {
        kf_timer_init(&t[i], 0);
        kf_heap_arm(&heap, &t[i], dues[i]);
    }
    for (int i = 0; i < 7; i++) {
        kf_timer_t *got = pop(&heap);
        cr_assert_eq(got, &t[expected[i]], "position %d: got due %lld", i, (long long)got->due_ms);
    }
    kf_heap_deinit(&heap);
}

Test(heap, deinit_unarms_every_timer) {
    kf_heap_t heap;
    kf_heap_init(&heap);
    kf_timer_t t[10];
    for (int i = 0; i < 10; i++) {
        kf_timer_init(&t[i], 0);
        kf_heap_arm(&heap, &t[i], 10 - i);
    }
    kf_heap_deinit(&heap);
    for (int i = 0; i < 10; i++) {
        cr_assert_not(kf_timer_armed(&t[i]), "timer %d still armed", i);
    }
    cr_assert_eq(kf_heap_count(&heap), 0);
    cr_assert_null(kf_heap_peek(&heap));
    /* The heap is usable again after deinit. */
    kf_heap_arm(&heap, &t[0], 1);
    cr_assert_eq(kf_heap_peek(&heap), &t[0]);
    kf_heap_deinit(&heap);
}

Test(heap, disarming_a_timer_of_another_heap_asserts, .signal = SIGABRT) {
    kf_heap_t h1;
    kf_heap_t h2;
    kf_heap_init(&h1);
    kf_heap_init(&h2);
    kf_timer_t a;
    kf_timer_t b;
    kf_timer_init(&a, 0);
    kf_timer_init(&b, 0);
    kf_heap_arm(&h1, &a, 1);
    kf_heap_arm(&h2, &b, 1);
    kf_heap_arm(&h2, &a, 2); /* a is armed in h1: re-arming it through h2 is a bug */
}

/* ---- model check ------------------------------------------------------ */

#define MODEL_TIMERS 96

typedef struct model {
    bool armed[MODEL_TIMERS];
    int64_t due_ms[MODEL_TIMERS];
    uint64_t order[MODEL_TIMERS]; /* arm order, counted by the model */
    uint64_t next_order;
    uint32_t count;
} model_t;

/* The model's earliest timer, or -1: a linear scan under (due, arm order). */
static int model_min(const model_t *m) {
    int best = -1;
    for (int i = 0; i < MODEL_TIMERS; i++) {
        if (!m->armed[i]) {
            continue;
        }
        if (best < 0 || m->due_ms[i] < m->due_ms[best] ||
            (m->due_ms[i] == m->due_ms[best] && m->order[i] < m->order[best])) {
            best = i;
        }
    }
    return best;
}

static void check_against_model(const kf_heap_t *heap, const kf_timer_t *timers, const model_t *m,
                                uint64_t seed, int step) {
    cr_assert(kf_heap_valid(heap), "seed %llu step %d: heap invalid", (unsigned long long)seed,
              step);
    cr_assert_eq(kf_heap_count(heap), m->count, "seed %llu step %d: count %u, model %u",
                 (unsigned long long)seed, step, kf_heap_count(heap), m->count);
    for (int i = 0; i < MODEL_TIMERS; i++) {
        cr_assert_eq(kf_timer_armed(&timers[i]), m->armed[i], "seed %llu step %d: timer %d",
                     (unsigned long long)seed, step, i);
        if (m->armed[i]) {
            cr_assert_eq(timers[i].due_ms, m->due_ms[i], "seed %llu step %d: timer %d due",
                         (unsigned long long)seed, step, i);
        }
    }
    int want = model_min(m);
    const kf_timer_t *got = kf_heap_peek(heap);
    if (want < 0) {
        cr_assert_null(got, "seed %llu step %d", (unsigned long long)seed, step);
    } else {
        cr_assert_eq(got, &timers[want], "seed %llu step %d: peek timer %d, model %d",
                     (unsigned long long)seed, step, got ? (int)(got - timers) : -1, want);
    }
}

static void run_model(uint64_t seed, int steps, int64_t due_span) {
    kf_heap_t heap;
    kf_heap_init(&heap);
    static kf_timer_t timers[MODEL_TIMERS];
    model_t m;
    memset(&m, 0, sizeof m);
    for (int i = 0; i < MODEL_TIMERS; i++) {
        kf_timer_init(&timers[i], (uint8_t)(i % 3));
    }
    uint64_t rs = seed;
    for (int step = 0; step < steps; step++) {
        int i = (int)(next_random(&rs) % MODEL_TIMERS);
        uint64_t action = next_random(&rs) % 10;
        if (action < 6) {
            /* arm or re-arm; a small span forces many equal due times */
            int64_t due = (int64_t)(next_random(&rs) % (uint64_t)due_span) - due_span / 4;
            kf_heap_arm(&heap, &timers[i], due);
            if (!m.armed[i]) {
                m.count++;
            }
            m.armed[i] = true;
            m.due_ms[i] = due;
            m.order[i] = m.next_order++;
        } else if (action < 8) {
            kf_heap_disarm(&heap, &timers[i]);
            if (m.armed[i]) {
                m.count--;
            }
            m.armed[i] = false;
        } else {
            /* fire the earliest, as the engine does */
            kf_timer_t *t = kf_heap_peek(&heap);
            int want = model_min(&m);
            cr_assert_eq(t, want < 0 ? NULL : &timers[want], "seed %llu step %d: fire",
                         (unsigned long long)seed, step);
            if (t != NULL) {
                kf_heap_disarm(&heap, t);
                m.armed[want] = false;
                m.count--;
            }
        }
        check_against_model(&heap, timers, &m, seed, step);
    }
    /* Drain: the whole firing order matches the model. */
    int step = steps;
    while (m.count > 0) {
        int want = model_min(&m);
        cr_assert_eq(kf_heap_peek(&heap), &timers[want], "seed %llu drain %d",
                     (unsigned long long)seed, step);
        kf_heap_disarm(&heap, &timers[want]);
        m.armed[want] = false;
        m.count--;
        check_against_model(&heap, timers, &m, seed, step++);
    }
    kf_heap_deinit(&heap);
}

Test(heap, random_sequences_match_the_model_with_many_ties) {
    for (uint64_t seed = 1; seed <= 40; seed++) {
        run_model(seed, 3000, 8);
    }
}

Test(heap, random_sequences_match_the_model_with_spread_dues) {
    for (uint64_t seed = 1000; seed < 1020; seed++) {
        run_model(seed, 3000, 1000000);
    }
}

/* Past the initial capacity: the heap grows and keeps its order. */
Test(heap, grows_past_its_first_allocation) {
    enum { N = 5000 };
    kf_timer_t *t = calloc(N, sizeof *t);
    cr_assert_not_null(t);
    kf_heap_t heap;
    kf_heap_init(&heap);
    uint64_t rs = 77;
    for (int i = 0; i < N; i++) {
        kf_timer_init(&t[i], 0);
        kf_heap_arm(&heap, &t[i], (int64_t)(next_random(&rs) % 100000));
    }
    cr_assert_eq(kf_heap_count(&heap), N);
    cr_assert(kf_heap_valid(&heap));
    int64_t last_due = INT64_MIN;
    uint64_t last_seq = 0;
    for (int i = 0; i < N; i++) {
        kf_timer_t *got = kf_heap_peek(&heap);
        cr_assert_not_null(got);
        cr_assert(got->due_ms > last_due || (got->due_ms == last_due && got->seq > last_seq),
                  "pop %d out of order", i);
        last_due = got->due_ms;
        last_seq = got->seq;
        kf_heap_disarm(&heap, got);
    }
    cr_assert_eq(kf_heap_count(&heap), 0);
    kf_heap_deinit(&heap);
    free(t);
}

/* Recovery's bulk build: timers armed unordered (some already armed one by
 * one before them) and then reordered fire in exactly the order that arming
 * each of them one by one gives. */
Test(heap, bulk_arm_then_reorder_fires_as_arming_one_by_one) {
    enum { N = 3000, EARLY = 40 };
    kf_timer_t *bulk = calloc(N, sizeof *bulk);
    kf_timer_t *single = calloc(N, sizeof *single);
    cr_assert(bulk != NULL && single != NULL);
    kf_heap_t hb, hs;
    kf_heap_init(&hb);
    kf_heap_init(&hs);
    uint64_t rs = 4242;
    for (int i = 0; i < N; i++) {
        int64_t due = (int64_t)(next_random(&rs) % 500); /* many ties */
        kf_timer_init(&bulk[i], 0);
        kf_timer_init(&single[i], 0);
        kf_heap_arm(&hs, &single[i], due);
        if (i < EARLY) {
            kf_heap_arm(&hb, &bulk[i], due);
        } else {
            if (i == EARLY) {
                kf_heap_reserve(&hb, N - EARLY);
            }
            kf_heap_arm_unordered(&hb, &bulk[i], due);
            cr_assert(kf_timer_armed(&bulk[i]));
        }
    }
    kf_heap_reorder(&hb);
    cr_assert(kf_heap_valid(&hb));
    cr_assert_eq(kf_heap_count(&hb), N);
    for (int i = 0; i < N; i++) {
        kf_timer_t *b = pop(&hb);
        kf_timer_t *s = pop(&hs);
        cr_assert_eq(b - bulk, s - single, "pop %d: timer %d, one by one gives %d", i,
                     (int)(b - bulk), (int)(s - single));
    }
    cr_assert_null(kf_heap_peek(&hb));
    kf_heap_deinit(&hb);
    kf_heap_deinit(&hs);
    free(bulk);
    free(single);
}
