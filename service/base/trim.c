/*
 * trim.c - see trim.h.
 *
 * Invariants
 *   1. `freed` only grows (modulo 2^64); the trimmer remembers its value
 *      at the last trim, so a report is never lost between a look and a
 *      trim, nor counted twice.
 *   2. Only the trimmer thread calls malloc_trim.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include "base/trim.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "base/alloc.h"
#include "base/assert.h"

static _Atomic uint64_t freed;

void kf_trim_freed(size_t bytes) {
    atomic_fetch_add_explicit(&freed, bytes, memory_order_relaxed);
}

uint64_t kf_trim_freed_total(void) {
    return atomic_load_explicit(&freed, memory_order_relaxed);
}

struct kf_trimmer {
    pthread_t thread;
    pthread_mutex_t lock; /* only for stopping */
    pthread_cond_t cv;
    bool stop;
    int64_t interval_ms;
    uint64_t min_freed_bytes;
    uint64_t freed_at_trim; /* `freed` when last trimmed (invariant 1) */
    uint64_t freed_at_look; /* `freed` at the previous look */
    _Atomic uint64_t trims;
    _Atomic uint64_t released_bytes;
};

/* Resident bytes, or 0 when /proc cannot be read. */
static uint64_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL) {
        return 0;
    }
    unsigned long long size = 0, resident = 0;
    int n = fscanf(f, "%llu %llu", &size, &resident);
    fclose(f);
    return n == 2 ? (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE) : 0;
}

static void trim_now(kf_trimmer_t *t) {
    uint64_t before = rss_bytes();
#ifdef __GLIBC__
    malloc_trim(0);
#endif
    uint64_t after = rss_bytes();
    if (before > after) {
        atomic_fetch_add(&t->released_bytes, before - after);
    }
    atomic_fetch_add(&t->trims, 1);
}

static void *trimmer_main(void *arg) {
    kf_trimmer_t *t = arg;
    pthread_setname_np(pthread_self(), "kf-trim");
    pthread_mutex_lock(&t->lock);
    while (!t->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += t->interval_ms / 1000;
        ts.tv_nsec += (t->interval_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&t->cv, &t->lock, &ts);
        uint64_t now = atomic_load_explicit(&freed, memory_order_relaxed);
        /* Enough freed, or a burst that freed less and has ended (nothing
         * freed for an interval): its tail is given back too. */
        bool enough = now - t->freed_at_trim >= t->min_freed_bytes;
        bool ended = now != t->freed_at_trim && now == t->freed_at_look;
        t->freed_at_look = now;
        if (!t->stop && (enough || ended)) {
            t->freed_at_trim = now;
            pthread_mutex_unlock(&t->lock);
            trim_now(t);
            pthread_mutex_lock(&t->lock);
        }
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

kf_status_t kf_trimmer_create(int64_t interval_ms, size_t min_freed_bytes, kf_trimmer_t **out,
                              kf_error_t *err) {
    KF_ASSERT(interval_ms > 0);
    kf_trimmer_t *t = kf_xcalloc(1, sizeof *t);
    t->interval_ms = interval_ms;
    t->min_freed_bytes = min_freed_bytes;
    t->freed_at_trim = t->freed_at_look = atomic_load(&freed);
    pthread_mutex_init(&t->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&t->thread, NULL, trimmer_main, t) != 0) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->lock);
        free(t);
        return kf_error_set(err, KF_E_INTERNAL, "cannot start the memory trimmer thread");
    }
    *out = t;
    return KF_OK;
}

void kf_trimmer_destroy(kf_trimmer_t *t) {
    if (t == NULL) {
        return;
    }
    pthread_mutex_lock(&t->lock);
    t->stop = true;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->lock);
    pthread_join(t->thread, NULL);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

uint64_t kf_trimmer_trims(const kf_trimmer_t *t) {
    return atomic_load(&t->trims);
}

uint64_t kf_trimmer_released_bytes(const kf_trimmer_t *t) {
    return atomic_load(&t->released_bytes);
}
