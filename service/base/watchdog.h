/*
 * watchdog.h - a thread that ends the process when a call it was told to
 * watch does not return in time.
 *
 * A native handler runs on the engine thread, in process: if it loops,
 * nothing else runs and nothing can interrupt it. The engine arms the
 * watchdog around each native call (kf_watchdog_arm: a few atomic stores,
 * no system call) with the function's bound; the watchdog thread looks
 * every KF_WATCHDOG_POLL_MS, and when a call is still armed past its
 * deadline it logs an error naming what it watched and calls abort(). The
 * step of that call was never committed, so its batch is not acknowledged;
 * the supervisor (systemd, Kubernetes) restarts keyflowd, which recovers
 * the last durable state (docs/semantics.md).
 *
 * One watchdog watches one thread's calls (arm and disarm from that thread
 * only); any number may exist. create starts the thread, destroy stops and
 * joins it.
 */
#ifndef KF_BASE_WATCHDOG_H
#define KF_BASE_WATCHDOG_H

#include <stdint.h>

#include "base/status.h"

typedef struct kf_watchdog kf_watchdog_t;

/* KF_E_INTERNAL when the thread cannot be started. */
kf_status_t kf_watchdog_create(kf_watchdog_t **out, kf_error_t *err) KF_MUST_USE;
/* Stops the thread; NULL is a no-op. */
void kf_watchdog_destroy(kf_watchdog_t *wd);
/* Watches a call from now for bound_ms. `what` names it in the abort
 * message (for example "function f's native handler") and must stay valid
 * until kf_watchdog_disarm. */
void kf_watchdog_arm(kf_watchdog_t *wd, const char *what, const char *limit_name, int64_t bound_ms);
void kf_watchdog_disarm(kf_watchdog_t *wd);

#endif
