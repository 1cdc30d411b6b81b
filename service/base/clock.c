/* clock.c - system and manual clocks. */
#include "base/clock.h"

#include <time.h>

static int64_t system_now_ms(void *ctx) {
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t manual_now_ms(void *ctx) {
    return *(const int64_t *)ctx;
}

kf_clock_t kf_clock_system(void) {
    return (kf_clock_t){.now_ms = system_now_ms, .ctx = NULL};
}

kf_clock_t kf_clock_manual(int64_t *now_ms) {
    return (kf_clock_t){.now_ms = manual_now_ms, .ctx = now_ms};
}

int64_t kf_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t kf_mono_us(void) {
    return kf_mono_ns() / 1000;
}
