/* window.c - rule validation and window arithmetic. */
#include "coord/window.h"

#include <string.h>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/crypto.h"
#include "base/limits.h"

#define CASE(r, f)   ((r)->f##_present_case)
#define HAS(r, f, F) (CASE(r, f) == KEYFLOW__V1__RULE__##F##_PRESENT_##F)

static kf_status_t range(kf_error_t *err, const char *field, const char *name, int64_t v,
                         int64_t lo, int64_t hi) {
    if (v < lo || v > hi) {
        return kf_error_set(err, KF_E_INVALID, "%s.%s: must be in %lld..%lld, got %lld", field,
                            name, (long long)lo, (long long)hi, (long long)v);
    }
    return KF_OK;
}

kf_status_t kf_rule_resolve(const Keyflow__V1__Rule *r, const char *field, kf_rule_t *out,
                            kf_error_t *err) {
    if (r == NULL) {
        return kf_error_set(err, KF_E_INVALID, "%s: required (a debounce or batch rule)", field);
    }
    kf_rule_t rule = {0};
    kf_status_t st;
    switch (r->kind) {
    case KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE:
        rule.kind = KF_RULE_DEBOUNCE;
        if (!HAS(r, window_ms, WINDOW_MS)) {
            return kf_error_set(err, KF_E_INVALID, "%s.window_ms: required for a debounce rule",
                                field);
        }
        if (HAS(r, max_events, MAX_EVENTS)) {
            return kf_error_set(err, KF_E_INVALID,
                                "%s.max_events: applies only to batch rules, not debounce", field);
        }
        if (HAS(r, max_bytes, MAX_BYTES)) {
            return kf_error_set(err, KF_E_INVALID,
                                "%s.max_bytes: applies only to batch rules, not debounce", field);
        }
        switch (r->edge) {
        case KEYFLOW__V1__EDGE__EDGE_UNSPECIFIED:
        case KEYFLOW__V1__EDGE__EDGE_TRAILING: rule.edge = KF_EDGE_TRAILING; break;
        case KEYFLOW__V1__EDGE__EDGE_LEADING: rule.edge = KF_EDGE_LEADING; break;
        case KEYFLOW__V1__EDGE__EDGE_BOTH: rule.edge = KF_EDGE_BOTH; break;
        default:
            return kf_error_set(err, KF_E_INVALID,
                                "%s.edge: must be trailing, leading or both, got %d", field,
                                (int)r->edge);
        }
        rule.window_ms = r->window_ms;
        rule.max_wait_ms = HAS(r, max_wait_ms, MAX_WAIT_MS) ? r->max_wait_ms : 0;
        if ((st = range(err, field, "window_ms", rule.window_ms, 1, KF_WINDOW_MS_MAX)) != KF_OK ||
            (st = range(err, field, "max_wait_ms", rule.max_wait_ms, 0, KF_WINDOW_MS_MAX)) !=
                KF_OK) {
            return st;
        }
        break;
    case KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH:
        rule.kind = KF_RULE_BATCH;
        rule.edge = KF_EDGE_TRAILING;
        if (HAS(r, window_ms, WINDOW_MS)) {
            return kf_error_set(err, KF_E_INVALID,
                                "%s.window_ms: applies only to debounce rules, not batch", field);
        }
        if (r->edge != KEYFLOW__V1__EDGE__EDGE_UNSPECIFIED) {
            return kf_error_set(err, KF_E_INVALID,
                                "%s.edge: applies only to debounce rules, not batch", field);
        }
        rule.max_bytes = HAS(r, max_bytes, MAX_BYTES) ? r->max_bytes : KF_WINDOW_INPUT_BYTES_MAX;
        rule.max_events = HAS(r, max_events, MAX_EVENTS) ? r->max_events : KF_BATCH_EVENTS_DEFAULT;
        rule.max_wait_ms =
            HAS(r, max_wait_ms, MAX_WAIT_MS) ? r->max_wait_ms : KF_BATCH_WAIT_MS_DEFAULT;
        if ((st = range(err, field, "max_events", rule.max_events, 1, KF_BATCH_EVENTS_MAX)) !=
                KF_OK ||
            (st = range(err, field, "max_wait_ms", rule.max_wait_ms, 1, KF_WINDOW_MS_MAX)) !=
                KF_OK ||
            (st = range(err, field, "max_bytes", rule.max_bytes, 1, KF_WINDOW_INPUT_BYTES_MAX)) !=
                KF_OK) {
            return st;
        }
        break;
    default:
        return kf_error_set(err, KF_E_INVALID, "%s.kind: must be debounce or batch, got %d", field,
                            (int)r->kind);
    }
    rule.dedup_ms = HAS(r, dedup_ms, DEDUP_MS) ? r->dedup_ms : KF_DEDUP_MS_DEFAULT;
    if ((st = range(err, field, "dedup_ms", rule.dedup_ms, 0, KF_DEDUP_MS_MAX)) != KF_OK ||
        (st = kf_run_options_resolve(r, field, &rule.run, err)) != KF_OK) {
        return st;
    }
    *out = rule;
    return KF_OK;
}

int64_t kf_window_due_ms(const kf_rule_t *rule, int64_t opened_ms, int64_t last_ms,
                         int64_t event_count) {
    if (rule->kind == KF_RULE_DEBOUNCE) {
        int64_t trailing = kf_time_add_sat(last_ms, rule->window_ms);
        if (rule->max_wait_ms > 0) {
            int64_t cap = kf_time_add_sat(opened_ms, rule->max_wait_ms);
            return cap < trailing ? cap : trailing;
        }
        return trailing;
    }
    if (event_count >= rule->max_events) {
        return last_ms;
    }
    return kf_time_add_sat(opened_ms, rule->max_wait_ms);
}

int64_t kf_dedup_expires_ms(const kf_rule_t *rule, int64_t at_ms) {
    return kf_time_add_sat(at_ms, rule->dedup_ms);
}

kf_join_t kf_window_join(const kf_rule_t *rule, bool window_open, bool run_started) {
    if (!window_open) {
        return KF_JOIN_OPEN;
    }
    if (!run_started) {
        return KF_JOIN_RUN;
    }
    return rule->edge == KF_EDGE_LEADING ? KF_JOIN_ABSORB : KF_JOIN_NEXT_RUN;
}

bool kf_edge_leading(const kf_rule_t *rule) {
    return rule->edge == KF_EDGE_LEADING || rule->edge == KF_EDGE_BOTH;
}

int64_t kf_batch_bytes_with(int64_t input_bytes, int64_t event_count, size_t len) {
    /* "[" + input + "]", or the array so far plus "," + input. */
    return event_count == 0 ? 2 + (int64_t)len : input_bytes + 1 + (int64_t)len;
}

void kf_event_digest(const kf_rule_t *rule, bool flush, const char *input, size_t len,
                     uint8_t out[KF_EVENT_DIGEST_BYTES]) {
    /* A fixed-width encoding of every rule field, then the input: two events
     * differ in digest whenever they differ in any of them. The run options
     * are encoded only when a rule has some, so that a digest remembered
     * before they existed still matches its retry. */
    uint8_t head[1 + 1 + 1 + 5 * 8 + 7 * 8];
    uint8_t *p = head;
    *p++ = (uint8_t)rule->kind;
    *p++ = (uint8_t)rule->edge;
    *p++ = flush ? 1 : 0;
    const kf_run_options_t *o = &rule->run;
    uint64_t multiplier_bits;
    _Static_assert(sizeof multiplier_bits == sizeof o->retry.multiplier, "a double is 64 bits");
    memcpy(&multiplier_bits, &o->retry.multiplier, sizeof multiplier_bits);
    const int64_t fields[] = {
        rule->window_ms, rule->max_wait_ms, rule->max_events, rule->max_bytes, rule->dedup_ms,
        /* run options */
        o->key_concurrency, o->start_after_ms, o->retry.max_attempts, o->retry.initial_backoff_ms,
        o->retry.max_backoff_ms, (int64_t)multiplier_bits, 1};
    size_t count = sizeof fields / sizeof fields[0];
    bool options = o->key_concurrency != 0 || o->start_after_ms != 0 ||
                   o->retry.max_attempts != 0 || o->retry.initial_backoff_ms != 0 ||
                   o->retry.max_backoff_ms != 0 || multiplier_bits != 0;
    if (!options) {
        count = 5;
    }
    for (size_t i = 0; i < count; i++) {
        kf_put_be64(p, (uint64_t)fields[i]);
        p += 8;
    }
    uint8_t sha[KF_SHA256_BYTES];
    kf_sha256_pair(head, (size_t)(p - head), input, len, sha);
    memcpy(out, sha, KF_EVENT_DIGEST_BYTES);
}
