/*
 * watchdog_test.c - the watchdog (service/base/watchdog.h): calls that
 * return in time never end the process, however many; one that does not
 * return ends it with SIGABRT.
 */
#include <signal.h>
#include <stdint.h>

#include <criterion/criterion.h>

#include "base/clock.h"
#include "base/watchdog.h"

Test(watchdog, calls_that_return_in_time_are_left_alone) {
    kf_watchdog_t *wd;
    kf_error_t err;
    cr_assert_eq(kf_watchdog_create(&wd, &err), KF_OK, "%s", err.message);
    /* Many short calls over several poll periods, each well within 50 ms. */
    int64_t until = kf_mono_us() + 200000;
    uint64_t calls = 0;
    while (kf_mono_us() < until) {
        kf_watchdog_arm(wd, "a short call", "test bound", 50);
        calls++;
        kf_watchdog_disarm(wd);
    }
    /* Disarmed for longer than any bound: nothing to blame. */
    int64_t idle_until = kf_mono_us() + 120000;
    while (kf_mono_us() < idle_until) {
    }
    kf_watchdog_destroy(wd);
    cr_assert_gt(calls, 0);
}

/* The process ends (abort: SIGABRT) within the bound and a poll period;
 * the loop would give up after 10 s and fail the test. */
Test(watchdog, a_call_past_its_bound_aborts_the_process, .signal = SIGABRT) {
    kf_watchdog_t *wd;
    kf_error_t err;
    cr_assert_eq(kf_watchdog_create(&wd, &err), KF_OK, "%s", err.message);
    kf_watchdog_arm(wd, "the native handler of function looper", "limits.call_timeout_ms", 30);
    int64_t give_up = kf_mono_us() + 10000000;
    while (kf_mono_us() < give_up) {
    }
    kf_watchdog_disarm(wd);
    kf_watchdog_destroy(wd);
}
