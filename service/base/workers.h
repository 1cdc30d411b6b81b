/*
 * workers.h - a small fixed pool of threads running queued work, with a
 * bounded queue: for work that must not run on an event loop (the HTTP
 * gateway decodes and renders large JSON bodies here).
 *
 * Work is intrusive: the caller embeds a kf_work_t in its own object and
 * owns that object; the pool only links it while it waits and calls its
 * run function once, on one of the pool's threads. What run touches is the
 * caller's business (hand the result back to its owner's thread).
 */
#ifndef KF_BASE_WORKERS_H
#define KF_BASE_WORKERS_H

#include <stddef.h>

#include "base/status.h"

typedef struct kf_work kf_work_t;

struct kf_work {
    void (*run)(kf_work_t *work); /* set by the submitter */
    kf_work_t *next;              /* the pool's, while queued */
};

typedef struct kf_workers kf_workers_t;

/* Starts `threads` threads named "<name>-N" (name: at most 10 characters).
 * Errors: KF_E_INTERNAL (a thread could not be started; none is left). */
kf_status_t kf_workers_create(const char *name, int threads, size_t queue_max, kf_workers_t **out,
                              kf_error_t *err) KF_MUST_USE;
/* Queues `work`; its run will be called once on a pool thread. KF_E_LIMIT
 * (and run is never called) when queue_max works are already waiting, or
 * once kf_workers_destroy began. Any thread. */
kf_status_t kf_workers_submit(kf_workers_t *workers, kf_work_t *work) KF_MUST_USE;
/* Works queued and not started yet. Any thread. */
size_t kf_workers_waiting(kf_workers_t *workers);
/* Runs every work already queued, joins the threads and frees the pool. */
void kf_workers_destroy(kf_workers_t *workers);

#endif
