/*
 * test_window.c - the pure rule and window arithmetic of window.h: rule
 * resolution (edges, max_bytes), the join decision of each edge, the due
 * time of every edge, batch bytes, and the event digest that tells a retry
 * from another payload. No engine, no store: every formula pinned alone.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "base/limits.h"
#include "coord/window.h"

static Keyflow__V1__Rule debounce(int64_t window_ms, Keyflow__V1__Edge edge) {
    Keyflow__V1__Rule r = KEYFLOW__V1__RULE__INIT;
    r.kind = KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE;
    r.window_ms_present_case = KEYFLOW__V1__RULE__WINDOW_MS_PRESENT_WINDOW_MS;
    r.window_ms = window_ms;
    r.edge = edge;
    return r;
}

static Keyflow__V1__Rule batch(void) {
    Keyflow__V1__Rule r = KEYFLOW__V1__RULE__INIT;
    r.kind = KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH;
    return r;
}

static void expect_refused(const Keyflow__V1__Rule *r, const char *field) {
    kf_rule_t rule;
    kf_error_t err;
    cr_assert_eq(kf_rule_resolve(r, "event.rule", &rule, &err), KF_E_INVALID);
    cr_assert(strstr(err.message, field) != NULL, "'%s' names %s", err.message, field);
}

Test(window, edge_defaults_to_trailing_and_each_edge_resolves) {
    kf_rule_t rule;
    kf_error_t err;
    Keyflow__V1__Rule r = debounce(100, KEYFLOW__V1__EDGE__EDGE_UNSPECIFIED);
    cr_assert_eq(kf_rule_resolve(&r, "event.rule", &rule, &err), KF_OK, "%s", err.message);
    cr_assert_eq(rule.edge, KF_EDGE_TRAILING);
    const Keyflow__V1__Edge edges[] = {KEYFLOW__V1__EDGE__EDGE_TRAILING,
                                       KEYFLOW__V1__EDGE__EDGE_LEADING,
                                       KEYFLOW__V1__EDGE__EDGE_BOTH};
    const kf_edge_t want[] = {KF_EDGE_TRAILING, KF_EDGE_LEADING, KF_EDGE_BOTH};
    for (int i = 0; i < 3; i++) {
        r.edge = edges[i];
        cr_assert_eq(kf_rule_resolve(&r, "event.rule", &rule, &err), KF_OK, "%s", err.message);
        cr_assert_eq(rule.edge, want[i]);
        cr_assert_eq(kf_edge_leading(&rule), want[i] != KF_EDGE_TRAILING);
    }
    r.edge = 9;
    expect_refused(&r, "event.rule.edge");
}

Test(window, edge_and_max_bytes_belong_to_one_kind_each) {
    Keyflow__V1__Rule b = batch();
    b.edge = KEYFLOW__V1__EDGE__EDGE_LEADING;
    expect_refused(&b, "event.rule.edge");
    Keyflow__V1__Rule d = debounce(100, KEYFLOW__V1__EDGE__EDGE_UNSPECIFIED);
    d.max_bytes_present_case = KEYFLOW__V1__RULE__MAX_BYTES_PRESENT_MAX_BYTES;
    d.max_bytes = 100;
    expect_refused(&d, "event.rule.max_bytes");
}

Test(window, max_bytes_defaults_to_the_fixed_bound_and_may_only_lower_it) {
    kf_rule_t rule;
    kf_error_t err;
    Keyflow__V1__Rule b = batch();
    cr_assert_eq(kf_rule_resolve(&b, "event.rule", &rule, &err), KF_OK, "%s", err.message);
    cr_assert_eq(rule.max_bytes, KF_WINDOW_INPUT_BYTES_MAX);
    b.max_bytes_present_case = KEYFLOW__V1__RULE__MAX_BYTES_PRESENT_MAX_BYTES;
    b.max_bytes = 1000;
    cr_assert_eq(kf_rule_resolve(&b, "event.rule", &rule, &err), KF_OK, "%s", err.message);
    cr_assert_eq(rule.max_bytes, 1000);
    b.max_bytes = 0;
    expect_refused(&b, "event.rule.max_bytes");
    b.max_bytes = KF_WINDOW_INPUT_BYTES_MAX + 1;
    expect_refused(&b, "event.rule.max_bytes");
}

Test(window, join_decision_of_each_edge) {
    kf_rule_t trailing = {.kind = KF_RULE_DEBOUNCE, .window_ms = 10, .edge = KF_EDGE_TRAILING};
    kf_rule_t leading = trailing, both = trailing;
    leading.edge = KF_EDGE_LEADING;
    both.edge = KF_EDGE_BOTH;
    /* No window: every edge opens one. */
    cr_assert_eq(kf_window_join(&trailing, false, false), KF_JOIN_OPEN);
    cr_assert_eq(kf_window_join(&leading, false, false), KF_JOIN_OPEN);
    cr_assert_eq(kf_window_join(&both, false, false), KF_JOIN_OPEN);
    /* A run still collecting: every edge joins it. */
    cr_assert_eq(kf_window_join(&trailing, true, false), KF_JOIN_RUN);
    cr_assert_eq(kf_window_join(&leading, true, false), KF_JOIN_RUN);
    cr_assert_eq(kf_window_join(&both, true, false), KF_JOIN_RUN);
    /* The run started at the leading edge: LEADING absorbs, the others
     * begin the window's next (trailing) run. */
    cr_assert_eq(kf_window_join(&leading, true, true), KF_JOIN_ABSORB);
    cr_assert_eq(kf_window_join(&both, true, true), KF_JOIN_NEXT_RUN);
    cr_assert_eq(kf_window_join(&trailing, true, true), KF_JOIN_NEXT_RUN);
}

Test(window, every_edge_shares_the_debounce_due_time) {
    const kf_edge_t edges[] = {KF_EDGE_TRAILING, KF_EDGE_LEADING, KF_EDGE_BOTH};
    for (int i = 0; i < 3; i++) {
        kf_rule_t r = {.kind = KF_RULE_DEBOUNCE, .window_ms = 100, .edge = edges[i]};
        cr_assert_eq(kf_window_due_ms(&r, 1000, 1000, 1), 1100, "first event: opened + window");
        cr_assert_eq(kf_window_due_ms(&r, 1000, 1090, 5), 1190, "quiet time after the latest");
        r.max_wait_ms = 150;
        cr_assert_eq(kf_window_due_ms(&r, 1000, 1090, 5), 1150, "capped at opened + max_wait");
        cr_assert_eq(kf_window_due_ms(&r, 1000, 1020, 2), 1120);
    }
}

Test(window, batch_bytes_count_the_run_input_array) {
    /* "[" + "12345" + "]" */
    cr_assert_eq(kf_batch_bytes_with(0, 0, 5), 7);
    /* "[12345" + "," + "678" + "]" = 7 + 1 + 3 */
    cr_assert_eq(kf_batch_bytes_with(7, 1, 3), 11);
    cr_assert_eq(kf_batch_bytes_with(11, 2, 0), 12);
}

Test(window, digest_tells_a_retry_from_another_payload) {
    kf_rule_t base = {.kind = KF_RULE_BATCH,
                      .max_events = 10,
                      .max_wait_ms = 1000,
                      .max_bytes = KF_WINDOW_INPUT_BYTES_MAX,
                      .dedup_ms = 600000,
                      .edge = KF_EDGE_TRAILING};
    uint8_t a[KF_EVENT_DIGEST_BYTES], b[KF_EVENT_DIGEST_BYTES];
    kf_event_digest(&base, false, "{\"n\":1}", 7, a);
    kf_event_digest(&base, false, "{\"n\":1}", 7, b);
    cr_assert_arr_eq(a, b, sizeof a, "the same event, the same digest");
    kf_event_digest(&base, false, "{\"n\":2}", 7, b);
    cr_assert_arr_neq(a, b, sizeof a, "input");
    kf_event_digest(&base, true, "{\"n\":1}", 7, b);
    cr_assert_arr_neq(a, b, sizeof a, "flush");
    kf_rule_t other = base;
    other.max_events = 11;
    kf_event_digest(&other, false, "{\"n\":1}", 7, b);
    cr_assert_arr_neq(a, b, sizeof a, "max_events");
    other = base;
    other.max_wait_ms = 1001;
    kf_event_digest(&other, false, "{\"n\":1}", 7, b);
    cr_assert_arr_neq(a, b, sizeof a, "max_wait_ms");
    other = base;
    other.max_bytes = 100;
    kf_event_digest(&other, false, "{\"n\":1}", 7, b);
    cr_assert_arr_neq(a, b, sizeof a, "max_bytes");
    other = base;
    other.dedup_ms = 1;
    kf_event_digest(&other, false, "{\"n\":1}", 7, b);
    cr_assert_arr_neq(a, b, sizeof a, "dedup_ms");
    kf_rule_t d = {
        .kind = KF_RULE_DEBOUNCE, .window_ms = 10, .dedup_ms = 600000, .edge = KF_EDGE_TRAILING};
    kf_event_digest(&d, false, "1", 1, a);
    d.edge = KF_EDGE_LEADING;
    kf_event_digest(&d, false, "1", 1, b);
    cr_assert_arr_neq(a, b, sizeof a, "edge");
    d.edge = KF_EDGE_TRAILING;
    d.window_ms = 11;
    kf_event_digest(&d, false, "1", 1, b);
    cr_assert_arr_neq(a, b, sizeof a, "window_ms");
}
