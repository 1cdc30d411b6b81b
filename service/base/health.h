/*
 * health.h - whether the process serves: the one answer behind gRPC
 * Health/Check and Health/Watch, HTTP GET /readyz and the keyflow_ready
 * gauge, so that they always agree.
 *
 * The state is process-wide (one process, one readiness), like the metrics:
 *
 *   NOT_SERVING (starting) --kf_health_set(true)--> SERVING
 *   SERVING --kf_health_set(false, "draining")----> NOT_SERVING (SIGTERM: the drain)
 *   any --kf_health_fail(reason)------------------> NOT_SERVING, for good (fail-stop)
 *   SERVING <--kf_health_degrade(true/false, reason)--> NOT_SERVING while
 *       degraded (the disk reserve reached), whatever kf_health_set asked
 *
 * Every change is logged (info, or error for a failure) with its reason and
 * announced to the listeners, which is how a Watch stream learns of it. A
 * listener runs on the thread that made the change, after the state changed,
 * under this module's listener lock (so kf_health_unlisten can wait it out);
 * it reads the state itself, must be quick, and must not call kf_health_set,
 * kf_health_fail or kf_health_(un)listen. Any thread.
 */
#ifndef KF_BASE_HEALTH_H
#define KF_BASE_HEALTH_H

#include <stdbool.h>
#include <stddef.h>

/* Listeners a process registers (both front ends, the tests). */
#define KF_HEALTH_LISTENERS_MAX 8

bool kf_health_serving(void);
/* Whether kf_health_fail was called. */
bool kf_health_failed(void);
/* Why it is not serving (the reason given with the change that made it
 * so), or "serving". NUL-terminated, cut to cap. */
void kf_health_reason(char *buf, size_t cap);

/* Serving or not, with a reason for the log ("started", "draining"). No
 * effect after a failure, or when nothing changes. `reason` is borrowed for
 * the call. */
void kf_health_set(bool serving, const char *reason);
/* The process can no longer serve (a failed sync): NOT_SERVING from now on,
 * logged as an error with the reason. */
void kf_health_fail(const char *reason);
/* A condition that keeps a started process from serving until it clears,
 * independent of kf_health_set: the disk reserve reached. Conditions are
 * counted, each raiser calling (true) once and (false) once when its own
 * condition clears (every partition's engine raises its own): while any
 * holds, the state is NOT_SERVING with the latest raiser's reason; when the
 * last clears, the state is what kf_health_set last asked for (SERVING
 * again, or still draining). */
void kf_health_degrade(bool degraded, const char *reason);

typedef void (*kf_health_listener_fn)(void *ctx);
/* Calls fn(ctx) after every change until kf_health_unlisten. Returns a
 * handle (>= 0), or -1 when KF_HEALTH_LISTENERS_MAX are registered. */
int kf_health_listen(kf_health_listener_fn fn, void *ctx);
/* After it returns, the listener is not running and will not run again. */
void kf_health_unlisten(int handle);

#endif
