/*
 * clock_test.c - the clock seam and saturating time arithmetic
 * (service/base/clock.h).
 */
#include <stdint.h>
#include <time.h>

#include <criterion/criterion.h>

#include "base/clock.h"

Test(time_add_sat, adds_without_overflow) {
    cr_assert_eq(kf_time_add_sat(0, 0), 0);
    cr_assert_eq(kf_time_add_sat(1000, 250), 1250);
    cr_assert_eq(kf_time_add_sat(-1000, 250), -750);
    cr_assert_eq(kf_time_add_sat(INT64_MIN, INT64_MAX), -1);
    cr_assert_eq(kf_time_add_sat(INT64_MAX - 5, 5), INT64_MAX);
    cr_assert_eq(kf_time_add_sat(INT64_MAX, 0), INT64_MAX);
}

Test(time_add_sat, saturates_at_int64_max) {
    cr_assert_eq(kf_time_add_sat(INT64_MAX - 5, 6), INT64_MAX);
    cr_assert_eq(kf_time_add_sat(INT64_MAX, 1), INT64_MAX);
    cr_assert_eq(kf_time_add_sat(INT64_MAX, INT64_MAX), INT64_MAX);
    cr_assert_eq(kf_time_add_sat(1, INT64_MAX), INT64_MAX);
    cr_assert_eq(kf_time_add_sat(INT64_MAX / 2 + 1, INT64_MAX / 2 + 1), INT64_MAX);
    /* A realistic one: "never" plus a week stays "never". */
    cr_assert_eq(kf_time_add_sat(INT64_MAX - 1000, 7LL * 24 * 3600 * 1000), INT64_MAX);
}

Test(clock, manual_clock_reads_the_variable_every_time) {
    int64_t now = 5;
    kf_clock_t clock = kf_clock_manual(&now);
    cr_assert_eq(kf_clock_now_ms(&clock), 5);
    now = 1700000000000LL;
    cr_assert_eq(kf_clock_now_ms(&clock), 1700000000000LL);
    now = -7;
    cr_assert_eq(kf_clock_now_ms(&clock), -7);
    now = INT64_MAX;
    cr_assert_eq(kf_clock_now_ms(&clock), INT64_MAX);
    cr_assert_eq(clock.ctx, &now);
}

Test(clock, two_manual_clocks_are_independent) {
    int64_t a = 1;
    int64_t b = 2;
    kf_clock_t ca = kf_clock_manual(&a);
    kf_clock_t cb = kf_clock_manual(&b);
    a = 100;
    cr_assert_eq(kf_clock_now_ms(&ca), 100);
    cr_assert_eq(kf_clock_now_ms(&cb), 2);
}

/* The system clock is wall time in milliseconds: it agrees with
 * CLOCK_REALTIME bracketing it. (Not time(2): glibc may serve it from the
 * coarse clock, which lags by up to a tick.) */
static int64_t realtime_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

Test(clock, system_clock_is_unix_milliseconds) {
    kf_clock_t clock = kf_clock_system();
    int64_t before = realtime_ms();
    int64_t ms = kf_clock_now_ms(&clock);
    int64_t after = realtime_ms();
    cr_assert_geq(ms, before, "%lld ms vs %lld ms", (long long)ms, (long long)before);
    cr_assert_leq(ms, after, "%lld ms vs %lld ms", (long long)ms, (long long)after);
    cr_assert_gt(ms, 1500000000000LL, "Unix milliseconds, not seconds");
}

Test(clock, monotonic_clocks_agree_and_never_go_back) {
    int64_t prev_ns = kf_mono_ns();
    for (int i = 0; i < 10000; i++) {
        int64_t a = kf_mono_ns();
        int64_t us = kf_mono_us();
        int64_t b = kf_mono_ns();
        cr_assert_geq(a, prev_ns);
        cr_assert_geq(us, a / 1000, "iteration %d", i);
        cr_assert_leq(us, b / 1000, "iteration %d", i);
        prev_ns = b;
    }
    cr_assert_gt(prev_ns, 0);
}
