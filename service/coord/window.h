/*
 * window.h - rules and window arithmetic of debounce and batch coordinators
 * (DESIGN.md section 2, "Exact window arithmetic"; docs/semantics.md,
 * "Edges", "Batch bytes", "Event identity"). Pure functions: no state, no
 * clock, no I/O, so the unit tests pin every formula.
 */
#ifndef KF_COORD_WINDOW_H
#define KF_COORD_WINDOW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "keyflow/v1/coordinators.pb-c.h"
#include "runs/runs.h"

typedef enum kf_rule_kind {
    KF_RULE_DEBOUNCE = KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE,
    KF_RULE_BATCH = KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH,
} kf_rule_kind_t;

/* Which edge of a debounce window starts a run. */
typedef enum kf_edge {
    KF_EDGE_TRAILING = KEYFLOW__V1__EDGE__EDGE_TRAILING,
    KF_EDGE_LEADING = KEYFLOW__V1__EDGE__EDGE_LEADING,
    KF_EDGE_BOTH = KEYFLOW__V1__EDGE__EDGE_BOTH,
} kf_edge_t;

/* A rule with every default resolved. */
typedef struct kf_rule {
    kf_rule_kind_t kind;
    int64_t window_ms;    /* debounce only, >= 1 */
    int64_t max_wait_ms;  /* debounce: 0 = unbounded; batch: >= 1 */
    int64_t max_events;   /* batch only, 1..KF_BATCH_EVENTS_MAX */
    int64_t max_bytes;    /* batch only, 1..KF_WINDOW_INPUT_BYTES_MAX */
    int64_t dedup_ms;     /* 0..KF_DEDUP_MS_MAX */
    kf_edge_t edge;       /* debounce: any; batch: always TRAILING */
    kf_run_options_t run; /* for the window's run (runs.h) */
} kf_rule_t;

/* Validates a request's rule and applies the defaults. `field` names the
 * rule in messages ("event.rule"). Errors: KF_E_INVALID naming the field
 * and the accepted range. Writes *out only on success. */
kf_status_t kf_rule_resolve(const Keyflow__V1__Rule *rule, const char *field, kf_rule_t *out,
                            kf_error_t *err) KF_MUST_USE;

/* The due time of a window holding event_count >= 1 events, the first at
 * opened_ms and the latest at last_ms, under `rule` (the latest event's):
 *   debounce: min(last + window, opened + max_wait) if max_wait > 0,
 *             else last + window (every edge: for LEADING this is the end of
 *             the quiet window, after which the next event starts a run);
 *   batch:    last once event_count >= max_events, else opened + max_wait.
 * Additions saturate at INT64_MAX. */
int64_t kf_window_due_ms(const kf_rule_t *rule, int64_t opened_ms, int64_t last_ms,
                         int64_t event_count);

/* When a remembered event ID stops deduplicating: at + dedup (saturating). */
int64_t kf_dedup_expires_ms(const kf_rule_t *rule, int64_t at_ms);

/* ---- edges --------------------------------------------------------------
 *
 * A window's run is either still collecting (it starts when the window
 * closes: the trailing edge) or already started (at the leading edge, when
 * the window opened). An event meets one of:
 *
 *   no window          -> OPEN: a window opens; under LEADING or BOTH its run
 *                         starts at once with this event's input.
 *   run collecting     -> JOIN the window's run (whatever the event's edge).
 *   run started, edge
 *     LEADING          -> ABSORB: the event is covered by the started run and
 *                         is in no run's input.
 *     TRAILING or BOTH -> NEXT_RUN: the event begins the window's next run,
 *                         which starts when the window closes.
 *
 * At the window's due time a collecting run starts; a window whose run
 * already started closes without one. The due time is the same formula for
 * every edge, over the window's first and latest events (absorbed ones
 * included), so a steady stream under LEADING starts one run per max_wait_ms
 * at most, and none at all while it keeps the window open without max_wait.
 */
typedef enum kf_join {
    KF_JOIN_OPEN,
    KF_JOIN_RUN,
    KF_JOIN_ABSORB,
    KF_JOIN_NEXT_RUN,
} kf_join_t;

kf_join_t kf_window_join(const kf_rule_t *rule, bool window_open, bool run_started);
/* Whether a window opened under `rule` starts its run at once. */
bool kf_edge_leading(const kf_rule_t *rule);

/* ---- batch bytes --------------------------------------------------------
 *
 * A batch run's input is "[" + the inputs joined by "," + "]". With
 * `event_count` inputs holding `input_bytes` of that array so far (0 when
 * empty), one more input of `len` bytes makes it this long. An event whose
 * input does not fit an empty window (2 + len > max_bytes) is refused; one
 * that does not fit the open window closes it first (its run starts, reason
 * "size") and opens the next. */
int64_t kf_batch_bytes_with(int64_t input_bytes, int64_t event_count, size_t len);

/* ---- event identity -----------------------------------------------------
 *
 * A retry is the same event when its digest matches: the first 16 bytes of
 * SHA-256 over the resolved rule (every field, defaults applied), the flush
 * flag and the input text as stored (trimmed). Another payload under a
 * remembered ID is refused (ALREADY_EXISTS). */
#define KF_EVENT_DIGEST_BYTES 16

void kf_event_digest(const kf_rule_t *rule, bool flush, const char *input, size_t len,
                     uint8_t out[KF_EVENT_DIGEST_BYTES]);

#endif
