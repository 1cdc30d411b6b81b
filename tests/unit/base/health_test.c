/*
 * health_test.c - the process's one readiness (service/base/health.h).
 *
 * Each Criterion test runs in its own process, so each starts from the
 * module's initial state (NOT_SERVING, "starting"). The cases are the state
 * diagram of the header, and the one that was wrong: with 8 partitions,
 * every engine raises its own disk-reserve condition, and one engine
 * clearing made the process ready while another was still below its
 * reserve (last writer won).
 */
#include <stdatomic.h>
#include <string.h>

#include <criterion/criterion.h>

#include "base/health.h"

static char reason_buf[512];

static const char *reason(void) {
    kf_health_reason(reason_buf, sizeof reason_buf);
    return reason_buf;
}

Test(health, starts_not_serving_until_set) {
    cr_assert(!kf_health_serving());
    kf_health_set(true, "started");
    cr_assert(kf_health_serving());
    kf_health_set(false, "draining");
    cr_assert(!kf_health_serving());
    cr_assert_str_eq(reason(), "draining");
}

Test(health, every_degrading_condition_must_clear) {
    kf_health_set(true, "started");
    kf_health_degrade(true, "partition 1: disk reserve reached");
    kf_health_degrade(true, "partition 2: disk reserve reached");
    cr_assert(!kf_health_serving());
    kf_health_degrade(false, "partition 1: disk reserve clear again");
    cr_assert(!kf_health_serving(), "one partition still below its reserve");
    cr_assert(strstr(reason(), "disk reserve reached") != NULL, "reason: %s", reason());
    kf_health_degrade(false, "partition 2: disk reserve clear again");
    cr_assert(kf_health_serving());
}

Test(health, clearing_while_draining_stays_not_serving) {
    kf_health_set(true, "started");
    kf_health_degrade(true, "disk reserve reached");
    kf_health_set(false, "draining");
    kf_health_degrade(false, "disk reserve clear again");
    cr_assert(!kf_health_serving());
}

Test(health, a_failure_is_for_good) {
    kf_health_set(true, "started");
    kf_health_fail("a durable write failed");
    cr_assert(!kf_health_serving());
    cr_assert(kf_health_failed());
    kf_health_set(true, "started");
    kf_health_degrade(true, "disk reserve reached");
    kf_health_degrade(false, "disk reserve clear again");
    cr_assert(!kf_health_serving());
    cr_assert(strstr(reason(), "a durable write failed") != NULL, "reason: %s", reason());
}

static atomic_int changes;

static void count_change(void *ctx) {
    (void)ctx;
    atomic_fetch_add(&changes, 1);
}

/* Listeners hear changes of the state, not every call. */
Test(health, listeners_hear_each_change_once) {
    int h = kf_health_listen(count_change, NULL);
    cr_assert_geq(h, 0);
    kf_health_set(true, "started");
    kf_health_degrade(true, "a");
    kf_health_degrade(true, "b");
    kf_health_degrade(false, "a clear");
    kf_health_degrade(false, "b clear");
    cr_assert_eq(atomic_load(&changes), 3); /* serving, not serving, serving */
    kf_health_unlisten(h);
    kf_health_set(false, "draining");
    cr_assert_eq(atomic_load(&changes), 3);
}
