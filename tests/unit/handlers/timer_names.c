/*
 * timer_names.c - a test-only native handler that sets and cancels timers
 * by name, so tests can pin how timers of several names behave: cancel by
 * name, and the (at_us, key, name) order of timers due together.
 *
 * Input: k UTF8 (the key), ts TIMESTAMP_US, op UTF8, names UTF8 (a
 * comma-separated list of timer names), at INT64. Output: key UTF8, ts
 * TIMESTAMP_US, name UTF8.
 *   op "set":    timer_set(name, at) for each name, in the list's order
 *   op "cancel": timer_cancel(name) for each name
 *   op "emit":   one output row {key, ts, name: names} (no timer change)
 * A timer activation emits {key, ts: the timer's time, name: the timer's}.
 * The value state counts the key's activations.
 */
#include <stdint.h>
#include <string.h>

#include "keyflow/handler.h"

#define NAME_BYTES_MAX 64

static int emit(const kf_host_t *h, kf_call_t *call, uint32_t i, const kf_activation_t *a,
                int64_t ts, const char *name, size_t name_len) {
    if (h->row_begin(call, i) != 0 ||
        h->row_set_utf8(call, h->output_column(call, "key"), a->key_text, a->key_text_len) != 0 ||
        h->row_set_int64(call, h->output_column(call, "ts"), ts) != 0 ||
        h->row_set_utf8(call, h->output_column(call, "name"), name, name_len) != 0) {
        return -1;
    }
    return h->row_end(call);
}

/* Calls set or cancel for each name of the comma-separated list. */
static int each_name(const kf_host_t *h, kf_call_t *call, uint32_t i, const char *names, size_t len,
                     int set, int64_t at) {
    size_t from = 0;
    while (from <= len) {
        size_t to = from;
        while (to < len && names[to] != ',') {
            to++;
        }
        char name[NAME_BYTES_MAX + 1];
        size_t n = to - from < NAME_BYTES_MAX ? to - from : NAME_BYTES_MAX;
        memcpy(name, names + from, n);
        name[n] = '\0';
        int rc = set ? h->timer_set(call, i, name, at) : h->timer_cancel(call, i, name);
        if (rc != 0) {
            return -1;
        }
        from = to + 1;
    }
    return 0;
}

static int invoke(const kf_host_t *h, kf_call_t *call, const kf_activation_t *acts,
                  uint32_t count) {
    int op_col = h->input_column(call, "op"), names_col = h->input_column(call, "names");
    int at_col = h->input_column(call, "at");
    for (uint32_t i = 0; i < count; i++) {
        const kf_activation_t *a = &acts[i];
        int64_t n = a->state_kind == KF_STATE_VALUE ? a->state_value : 0;
        if (h->state_set(call, i, n + 1) != 0) {
            return -1;
        }
        if (a->callback == KF_CALLBACK_TIMER) {
            if (emit(h, call, i, a, a->event_time_us, a->timer_name, strlen(a->timer_name)) != 0) {
                return -1;
            }
            continue;
        }
        size_t op_len, names_len;
        const char *op = h->input_utf8(call, a->row, op_col, &op_len);
        const char *names = h->input_utf8(call, a->row, names_col, &names_len);
        int64_t at = h->input_int64(call, a->row, at_col);
        int rc;
        if (op != NULL && strcmp(op, "set") == 0) {
            rc = each_name(h, call, i, names, names_len, 1, at);
        } else if (op != NULL && strcmp(op, "cancel") == 0) {
            rc = each_name(h, call, i, names, names_len, 0, 0);
        } else if (op != NULL && strcmp(op, "emit") == 0) {
            rc = emit(h, call, i, a, a->event_time_us, names, names_len);
        } else {
            h->fail(call, "timer_names: op must be set, cancel or emit");
            rc = -1;
        }
        if (rc != 0) {
            return -1;
        }
    }
    return 0;
}

const kf_handler_t kf_handler_v1 = {KF_HANDLER_ABI_VERSION, "timer_names", invoke};
