/*
 * trim_test.c - the memory trimmer (service/base/trim.h): it trims after
 * enough was freed, after a small burst ended, never when nothing was
 * freed, and a trim gives freed heap pages between live allocations back
 * to the system.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <criterion/criterion.h>

#include "base/clock.h"
#include "base/trim.h"

#define INTERVAL_MS 20

/* Waits (at most 10 s) until the trimmer has made `trims` trims. */
static bool wait_trims(kf_trimmer_t *t, uint64_t trims) {
    int64_t deadline = kf_mono_us() + 10 * 1000 * 1000;
    while (kf_trimmer_trims(t) < trims) {
        if (kf_mono_us() > deadline) {
            return false;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return true;
}

Test(trim, nothing_freed_nothing_trimmed) {
    kf_trimmer_t *t;
    kf_error_t err;
    cr_assert_eq(kf_trimmer_create(INTERVAL_MS, 1024, &t, &err), KF_OK, "%s", err.message);
    struct timespec ts = {0, 10 * INTERVAL_MS * 1000000L};
    nanosleep(&ts, NULL);
    cr_assert_eq(kf_trimmer_trims(t), 0);
    kf_trimmer_destroy(t);
}

Test(trim, enough_freed_is_trimmed) {
    kf_trimmer_t *t;
    kf_error_t err;
    cr_assert_eq(kf_trimmer_create(INTERVAL_MS, 1024, &t, &err), KF_OK, "%s", err.message);
    kf_trim_freed(4096);
    cr_assert(wait_trims(t, 1), "no trim after 4096 bytes freed (threshold 1024)");
    kf_trimmer_destroy(t);
}

/* Less than the threshold, but nothing more follows: the burst ended. */
Test(trim, a_small_burst_is_trimmed_once_it_ends) {
    kf_trimmer_t *t;
    kf_error_t err;
    cr_assert_eq(kf_trimmer_create(INTERVAL_MS, 1u << 30, &t, &err), KF_OK, "%s", err.message);
    kf_trim_freed(100);
    cr_assert(wait_trims(t, 1), "a burst below the threshold was never trimmed");
    /* And only once: nothing was freed since. */
    struct timespec ts = {0, 10 * INTERVAL_MS * 1000000L};
    nanosleep(&ts, NULL);
    cr_assert_eq(kf_trimmer_trims(t), 1);
    kf_trimmer_destroy(t);
}

/* What the trimmer is for: small blocks freed between blocks that stay
 * (bodies between runs) are resident until trimmed. ASan's allocator is not
 * glibc's, whose malloc_trim then has nothing to release. */
#if defined(__SANITIZE_ADDRESS__)
#define GLIBC_HEAP 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GLIBC_HEAP 0
#else
#define GLIBC_HEAP 1
#endif
#else
#define GLIBC_HEAP 1
#endif

Test(trim, freed_pages_between_live_blocks_go_back) {
#if GLIBC_HEAP && defined(__GLIBC__)
    enum { N = 8 * 1024, BIG = 8000, SMALL = 100 }; /* each freed block spans a page */
    char **big = calloc(N, sizeof *big);
    char **small = calloc(N, sizeof *small);
    cr_assert(big && small);
    for (size_t i = 0; i < N; i++) {
        big[i] = malloc(BIG);
        small[i] = malloc(SMALL);
        cr_assert(big[i] && small[i]);
        memset(big[i], 1, BIG); /* resident */
        memset(small[i], 1, SMALL);
    }
    for (size_t i = 0; i < N; i++) {
        free(big[i]); /* 64 MiB freed, none of it at the top of the heap */
    }
    kf_trimmer_t *t;
    kf_error_t err;
    cr_assert_eq(kf_trimmer_create(INTERVAL_MS, 1024, &t, &err), KF_OK, "%s", err.message);
    kf_trim_freed((size_t)N * BIG);
    cr_assert(wait_trims(t, 1));
    /* Most of the freed 64 MiB: page-sized runs of freed blocks. */
    cr_assert_gt(kf_trimmer_released_bytes(t), 16u * 1024 * 1024, "released %llu bytes",
                 (unsigned long long)kf_trimmer_released_bytes(t));
    kf_trimmer_destroy(t);
    for (size_t i = 0; i < N; i++) {
        free(small[i]);
    }
    free(big);
    free(small);
#else
    cr_skip_test("not glibc's heap: malloc_trim has nothing to release");
#endif
}
