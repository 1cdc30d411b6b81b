/* health.c - the process's serving state and its listeners (see health.h). */
#include "base/health.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>

#include "base/assert.h"
#include "base/limits.h"
#include "base/log.h"
#include "base/metrics.h"

static atomic_bool serving; /* wanted && !degraded && !failed */
static atomic_bool failed;
static bool wanted; /* what kf_health_set last asked (change_lock) */
/* Conditions degrading the process now (change_lock): one per engine at
 * its disk reserve, so one engine clearing does not make the process ready
 * while another is still below it. */
static unsigned degraded;
static char why[KF_ERROR_MESSAGE_BYTES_MAX] = "starting"; /* change_lock */
/* Orders changes, so the log and the listeners see them in one order. */
static pthread_mutex_t change_lock = PTHREAD_MUTEX_INITIALIZER;
/* Guards the listener table and is held while listeners run. */
static pthread_mutex_t listener_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    kf_health_listener_fn fn; /* NULL: free slot */
    void *ctx;
} listeners[KF_HEALTH_LISTENERS_MAX];

bool kf_health_serving(void) {
    return atomic_load(&serving);
}

bool kf_health_failed(void) {
    return atomic_load(&failed);
}

static void announce(void) {
    pthread_mutex_lock(&listener_lock);
    for (int i = 0; i < KF_HEALTH_LISTENERS_MAX; i++) {
        if (listeners[i].fn != NULL) {
            listeners[i].fn(listeners[i].ctx);
        }
    }
    pthread_mutex_unlock(&listener_lock);
}

void kf_health_reason(char *buf, size_t cap) {
    pthread_mutex_lock(&change_lock);
    snprintf(buf, cap, "%s", atomic_load(&serving) ? "serving" : why);
    pthread_mutex_unlock(&change_lock);
}

/* Applies wanted/degraded to the state; change_lock held. `stops` says
 * that this call's reason is why the process does not serve. */
static void update(const char *reason, bool stops) {
    bool to = wanted && degraded == 0;
    if (stops && !atomic_load(&failed)) {
        snprintf(why, sizeof why, "%s", reason);
    }
    if (atomic_load(&failed) || atomic_load(&serving) == to) {
        return;
    }
    atomic_store(&serving, to);
    kf_gauge_set_in(0, KF_G_READY, to ? 1 : 0); /* the process, not a partition */
    kf_log_kv(KF_LOG_INFO, "health", to ? "serving" : "not serving", KF_LOG_STR("reason", reason));
    announce();
}

void kf_health_set(bool to, const char *reason) {
    pthread_mutex_lock(&change_lock);
    wanted = to;
    update(reason, !to);
    pthread_mutex_unlock(&change_lock);
}

void kf_health_degrade(bool on, const char *reason) {
    pthread_mutex_lock(&change_lock);
    if (on) {
        degraded++;
    } else {
        KF_ASSERT(degraded > 0); /* each clear follows its own degrade */
        degraded--;
    }
    /* A clear that leaves another condition standing keeps that reason. */
    update(reason, on);
    pthread_mutex_unlock(&change_lock);
}

void kf_health_fail(const char *reason) {
    pthread_mutex_lock(&change_lock);
    bool first = !atomic_exchange(&failed, true);
    atomic_store(&serving, false);
    if (first) {
        snprintf(why, sizeof why, "failed: %s", reason);
        kf_gauge_set_in(0, KF_G_READY, 0);
        kf_log_kv(KF_LOG_ERROR, "health", "not serving: failed", KF_LOG_STR("reason", reason));
        announce();
    }
    pthread_mutex_unlock(&change_lock);
}

int kf_health_listen(kf_health_listener_fn fn, void *ctx) {
    KF_ASSERT(fn != NULL);
    int handle = -1;
    pthread_mutex_lock(&listener_lock);
    for (int i = 0; i < KF_HEALTH_LISTENERS_MAX && handle < 0; i++) {
        if (listeners[i].fn == NULL) {
            listeners[i].fn = fn;
            listeners[i].ctx = ctx;
            handle = i;
        }
    }
    pthread_mutex_unlock(&listener_lock);
    return handle;
}

void kf_health_unlisten(int handle) {
    KF_ASSERT(handle >= 0 && handle < KF_HEALTH_LISTENERS_MAX);
    pthread_mutex_lock(&listener_lock);
    listeners[handle].fn = NULL;
    listeners[handle].ctx = NULL;
    pthread_mutex_unlock(&listener_lock);
}
