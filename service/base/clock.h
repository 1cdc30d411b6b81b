/*
 * clock.h - the engine's clock seam.
 *
 * All engine time is Unix milliseconds from a kf_clock_t, so that tests can
 * run the engine over a manual clock and get the same answer every time.
 * Durable timers need absolute wall time (they survive restarts), so the
 * system clock is CLOCK_REALTIME; kf_mono_us is for measuring durations only.
 */
#ifndef KF_BASE_CLOCK_H
#define KF_BASE_CLOCK_H

#include <stdint.h>

typedef struct kf_clock {
    int64_t (*now_ms)(void *ctx);
    void *ctx;
} kf_clock_t;

/* The wall clock. Thread-safe. */
kf_clock_t kf_clock_system(void);

/* A manual clock for tests; `*now_ms` is read on every call (the test thread
 * moves it; the engine thread reads it, so use it single-threaded or with the
 * engine stepped by the test). */
kf_clock_t kf_clock_manual(int64_t *now_ms);

static inline int64_t kf_clock_now_ms(const kf_clock_t *clock) {
    return clock->now_ms(clock->ctx);
}

/* Monotonic microseconds, for latency measurement. */
int64_t kf_mono_us(void);
/* Monotonic nanoseconds. */
int64_t kf_mono_ns(void);

/* a + b for times and spans, saturating at INT64_MAX instead of overflowing
 * (DESIGN.md: "additions saturate instead of overflowing"). b >= 0. */
static inline int64_t kf_time_add_sat(int64_t a, int64_t b) {
    return (b > 0 && a > INT64_MAX - b) ? INT64_MAX : a + b;
}

#endif
