/* workers.c - the pool of workers.h: one mutex, one condition, a FIFO. */
#define _GNU_SOURCE /* pthread_setname_np */
#include "base/workers.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/alloc.h"

struct kf_workers {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    kf_work_t *head; /* guarded by lock */
    kf_work_t *tail;
    size_t waiting;
    size_t queue_max;
    bool exit; /* no more submits; threads leave once the queue is empty */
    int threads;
    pthread_t *thread;
    char name[12];
};

static void *worker_main(void *arg) {
    kf_workers_t *w = arg;
    char name[16];
    snprintf(name, sizeof name, "%s", w->name);
    pthread_setname_np(pthread_self(), name);
    for (;;) {
        pthread_mutex_lock(&w->lock);
        while (w->head == NULL && !w->exit) {
            pthread_cond_wait(&w->cv, &w->lock);
        }
        kf_work_t *work = w->head;
        if (work != NULL) {
            w->head = work->next;
            if (w->head == NULL) {
                w->tail = NULL;
            }
            w->waiting--;
        }
        pthread_mutex_unlock(&w->lock);
        if (work == NULL) {
            return NULL; /* exit, and nothing is left */
        }
        work->next = NULL;
        work->run(work);
    }
}

kf_status_t kf_workers_create(const char *name, int threads, size_t queue_max, kf_workers_t **out,
                              kf_error_t *err) {
    kf_workers_t *w = kf_xcalloc(1, sizeof *w);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->queue_max = queue_max;
    snprintf(w->name, sizeof w->name, "%s", name);
    w->thread = kf_xcalloc((size_t)threads, sizeof *w->thread);
    for (int i = 0; i < threads; i++) {
        if (pthread_create(&w->thread[i], NULL, worker_main, w) != 0) {
            kf_workers_destroy(w);
            return kf_error_set(err, KF_E_INTERNAL, "cannot start the %s worker threads", name);
        }
        w->threads++;
    }
    *out = w;
    return KF_OK;
}

kf_status_t kf_workers_submit(kf_workers_t *w, kf_work_t *work) {
    work->next = NULL;
    pthread_mutex_lock(&w->lock);
    if (w->exit || w->waiting >= w->queue_max) {
        pthread_mutex_unlock(&w->lock);
        return KF_E_LIMIT;
    }
    if (w->tail != NULL) {
        w->tail->next = work;
    } else {
        w->head = work;
    }
    w->tail = work;
    w->waiting++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->lock);
    return KF_OK;
}

size_t kf_workers_waiting(kf_workers_t *w) {
    pthread_mutex_lock(&w->lock);
    size_t n = w->waiting;
    pthread_mutex_unlock(&w->lock);
    return n;
}

void kf_workers_destroy(kf_workers_t *w) {
    if (w == NULL) {
        return;
    }
    pthread_mutex_lock(&w->lock);
    w->exit = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->lock);
    for (int i = 0; i < w->threads; i++) {
        pthread_join(w->thread[i], NULL);
    }
    free(w->thread);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->lock);
    free(w);
}
