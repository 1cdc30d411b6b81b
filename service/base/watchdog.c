/*
 * watchdog.c - see watchdog.h.
 *
 * Invariants
 *   1. Arming and disarming are atomic stores on the watched thread; the
 *      watchdog thread only reads. A deadline of 0 means disarmed.
 *   2. The watchdog aborts only when it sees the same arming (generation)
 *      past its deadline twice in a row around reading its name, so a call
 *      that returned and a new one armed meanwhile is never blamed.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include "base/watchdog.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/limits.h"
#include "base/log.h"

struct kf_watchdog {
    pthread_t thread;
    pthread_mutex_t lock; /* only for stopping */
    pthread_cond_t cv;
    bool stop;
    _Atomic uint64_t generation; /* incremented by every arm */
    _Atomic int64_t deadline_us; /* kf_mono_us() deadline; 0: disarmed */
    _Atomic int64_t bound_ms;    /* of the armed call */
    _Atomic(const char *) what;  /* of the armed call */
    _Atomic(const char *) limit; /* the limit that sets bound_ms */
};

void kf_watchdog_arm(kf_watchdog_t *wd, const char *what, const char *limit_name,
                     int64_t bound_ms) {
    atomic_store_explicit(&wd->what, what, memory_order_relaxed);
    atomic_store_explicit(&wd->limit, limit_name, memory_order_relaxed);
    atomic_store_explicit(&wd->bound_ms, bound_ms, memory_order_relaxed);
    atomic_fetch_add_explicit(&wd->generation, 1, memory_order_release);
    atomic_store_explicit(&wd->deadline_us, kf_mono_us() + bound_ms * 1000, memory_order_release);
}

void kf_watchdog_disarm(kf_watchdog_t *wd) {
    atomic_store_explicit(&wd->deadline_us, 0, memory_order_release);
}

/* A watched call overran (invariant 2 held): say what, then end. */
static void overran(kf_watchdog_t *wd) {
    const char *what = atomic_load_explicit(&wd->what, memory_order_acquire);
    const char *limit = atomic_load_explicit(&wd->limit, memory_order_acquire);
    kf_log_kv(KF_LOG_ERROR, "watchdog",
              "a call did not return within its bound; aborting so the supervisor restarts "
              "keyflowd (the batch it served is not acknowledged)",
              KF_LOG_STR("call", what ? what : "?"), KF_LOG_STR("limit", limit ? limit : "?"),
              KF_LOG_INT("bound_ms", atomic_load(&wd->bound_ms)));
    abort();
}

static void check(kf_watchdog_t *wd) {
    int64_t deadline = atomic_load_explicit(&wd->deadline_us, memory_order_acquire);
    if (deadline == 0 || kf_mono_us() < deadline) {
        return;
    }
    uint64_t gen = atomic_load_explicit(&wd->generation, memory_order_acquire);
    /* The same arming, still armed, still past its deadline (invariant 2). */
    if (atomic_load_explicit(&wd->deadline_us, memory_order_acquire) == deadline &&
        atomic_load_explicit(&wd->generation, memory_order_acquire) == gen) {
        overran(wd);
    }
}

static void *watchdog_main(void *arg) {
    kf_watchdog_t *wd = arg;
    pthread_setname_np(pthread_self(), "kf-watchdog");
    pthread_mutex_lock(&wd->lock);
    while (!wd->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += KF_WATCHDOG_POLL_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&wd->cv, &wd->lock, &ts);
        if (!wd->stop) {
            check(wd);
        }
    }
    pthread_mutex_unlock(&wd->lock);
    return NULL;
}

kf_status_t kf_watchdog_create(kf_watchdog_t **out, kf_error_t *err) {
    kf_watchdog_t *wd = kf_xcalloc(1, sizeof *wd);
    pthread_mutex_init(&wd->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&wd->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&wd->thread, NULL, watchdog_main, wd) != 0) {
        pthread_cond_destroy(&wd->cv);
        pthread_mutex_destroy(&wd->lock);
        free(wd);
        return kf_error_set(err, KF_E_INTERNAL, "cannot start the watchdog thread");
    }
    *out = wd;
    return KF_OK;
}

void kf_watchdog_destroy(kf_watchdog_t *wd) {
    if (wd == NULL) {
        return;
    }
    pthread_mutex_lock(&wd->lock);
    wd->stop = true;
    pthread_cond_signal(&wd->cv);
    pthread_mutex_unlock(&wd->lock);
    pthread_join(wd->thread, NULL);
    pthread_cond_destroy(&wd->cv);
    pthread_mutex_destroy(&wd->lock);
    free(wd);
}
