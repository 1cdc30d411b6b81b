/*
 * trim.h - gives the heap's free memory back to the system after bursts.
 *
 * glibc's malloc keeps what a thread freed in that thread's arena and
 * returns it to the system only from the top of the heap. Under a burst
 * of writes each run and coordinator holds its body, detail and staged
 * records until its group is durable; the long-lived entries allocated
 * between them keep the freed space from reaching the top, so RSS stayed
 * at the burst's peak: 1M pending runs made at once held 730 MiB where
 * the same runs after a restart hold 225 (bench/README.md, "Runs: memory
 * per pending run"). malloc_trim(0) also releases the free pages inside
 * each arena.
 *
 * Whoever frees much at once says so (kf_trim_freed, any thread: an
 * atomic add). A trimmer thread looks every interval and calls
 * malloc_trim once at least `min_freed_bytes` were reported since its last
 * trim, or when something was reported since then but nothing during the
 * last interval (a burst ended): an idle process never trims, a steady
 * load about once per interval, and a burst's tail an interval after it
 * settles. The
 * trim runs on its own thread, locking one arena at a time, so the engine
 * never waits for it.
 *
 * One trimmer per process (it trims every arena); kf_trim_freed with no
 * trimmer only counts. Without glibc the trimmer trims nothing.
 */
#ifndef KF_BASE_TRIM_H
#define KF_BASE_TRIM_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct kf_trimmer kf_trimmer_t;

/* Any thread: `bytes` were just freed (an estimate is fine). */
void kf_trim_freed(size_t bytes);
/* Every byte reported so far, by any thread (tests). */
uint64_t kf_trim_freed_total(void);

/* Starts the thread. KF_E_INTERNAL when it cannot be started. */
kf_status_t kf_trimmer_create(int64_t interval_ms, size_t min_freed_bytes, kf_trimmer_t **out,
                              kf_error_t *err) KF_MUST_USE;
/* Stops and joins the thread; NULL is a no-op. */
void kf_trimmer_destroy(kf_trimmer_t *t);
/* Trims done so far, and the bytes RSS shrank by across them (as
 * /proc/self/statm saw it; 0 where it cannot be read). */
uint64_t kf_trimmer_trims(const kf_trimmer_t *t);
uint64_t kf_trimmer_released_bytes(const kf_trimmer_t *t);

#endif
