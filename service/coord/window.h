/*
 * window.h - rules and window arithmetic of debounce and batch coordinators
 * (DESIGN.md section 2, "Exact window arithmetic"). Pure functions: no
 * state, no clock, no I/O, so the unit tests pin every formula.
 */
#ifndef KF_COORD_WINDOW_H
#define KF_COORD_WINDOW_H

#include <stdint.h>

#include "base/status.h"
#include "keyflow/v1/coordinators.pb-c.h"

typedef enum kf_rule_kind {
    KF_RULE_DEBOUNCE = KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE,
    KF_RULE_BATCH = KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH,
} kf_rule_kind_t;

/* A rule with every default resolved. */
typedef struct kf_rule {
    kf_rule_kind_t kind;
    int64_t window_ms;   /* debounce only, >= 1 */
    int64_t max_wait_ms; /* debounce: 0 = unbounded; batch: >= 1 */
    int64_t max_events;  /* batch only, 1..KF_BATCH_EVENTS_MAX */
    int64_t dedup_ms;    /* 0..KF_DEDUP_MS_MAX */
} kf_rule_t;

/* Validates a request's rule and applies the defaults. `field` names the
 * rule in messages ("event.rule"). Errors: KF_E_INVALID naming the field
 * and the accepted range. Writes *out only on success. */
kf_status_t kf_rule_resolve(const Keyflow__V1__Rule *rule, const char *field, kf_rule_t *out,
                            kf_error_t *err) KF_MUST_USE;

/* The due time of a window holding event_count >= 1 events, the first at
 * opened_ms and the latest at last_ms, under `rule` (the latest event's):
 *   debounce: min(last + window, opened + max_wait) if max_wait > 0,
 *             else last + window;
 *   batch:    last once event_count >= max_events, else opened + max_wait.
 * Additions saturate at INT64_MAX. */
int64_t kf_window_due_ms(const kf_rule_t *rule, int64_t opened_ms, int64_t last_ms,
                         int64_t event_count);

/* When a remembered event ID stops deduplicating: at + dedup (saturating). */
int64_t kf_dedup_expires_ms(const kf_rule_t *rule, int64_t at_ms);

#endif
