/*
 * misbehaving.c - a test-only native handler whose behaviour is chosen per
 * row by the input column `mode`, so tests can make it break each rule the
 * host validates (and also behave). Input: k UTF8, ts TIMESTAMP_US,
 * mode UTF8, amount INT64 nullable. Output: key UTF8, ts TIMESTAMP_US,
 * n INT64 (not nullable). Timer name: "t".
 *
 * Modes "drift", "drift_state" and "flaky" break determinism on purpose
 * (ReplayBatch must notice): they use a count of their calls in this
 * process, so a second run of the same row gives another number ("flaky"
 * fails every second call).
 */
#include <stdint.h>
#include <string.h>

#include "keyflow/handler.h"

static int emit(const kf_host_t *h, kf_call_t *call, uint32_t i, const kf_activation_t *a,
                int64_t ts, int64_t n) {
    int key = h->output_column(call, "key"), tsc = h->output_column(call, "ts");
    int nc = h->output_column(call, "n");
    h->row_begin(call, i);
    h->row_set_utf8(call, key, a->key_text, a->key_text_len);
    h->row_set_int64(call, tsc, ts);
    h->row_set_int64(call, nc, n);
    return h->row_end(call);
}

static int64_t drift_calls, flaky_calls;

static int invoke(const kf_host_t *h, kf_call_t *call, const kf_activation_t *acts,
                  uint32_t count) {
    int mode_col = h->input_column(call, "mode");
    int amount_col = h->input_column(call, "amount");
    for (uint32_t i = 0; i < count; i++) {
        const kf_activation_t *a = &acts[i];
        if (a->callback == KF_CALLBACK_TIMER) {
            emit(h, call, i, a, a->event_time_us,
                 a->state_kind == KF_STATE_VALUE ? a->state_value : -1);
            continue;
        }
        size_t len;
        const char *mode = h->input_utf8(call, a->row, mode_col, &len);
        int64_t amount = h->input_int64(call, a->row, amount_col);
        int64_t ts = a->event_time_us;
        if (strcmp(mode, "ok") == 0) {
            emit(h, call, i, a, ts, amount);
            h->state_set(call, i, amount);
        } else if (strcmp(mode, "timer") == 0) {
            h->timer_set(call, i, "t", ts + amount);
        } else if (strcmp(mode, "cancel") == 0) {
            h->timer_cancel(call, i, "t");
        } else if (strcmp(mode, "null") == 0) {
            h->state_set_null(call, i);
        } else if (strcmp(mode, "clear") == 0) {
            h->state_clear(call, i);
        } else if (strcmp(mode, "undeclared_timer") == 0) {
            h->timer_set(call, i, "nope", ts + 1);
        } else if (strcmp(mode, "past_timer") == 0) {
            h->timer_set(call, i, "t", h->watermark_us(call));
        } else if (strcmp(mode, "early_output") == 0) {
            emit(h, call, i, a, ts - 1, 0);
        } else if (strcmp(mode, "missing_column") == 0) {
            h->row_begin(call, i);
            h->row_set_int64(call, h->output_column(call, "ts"), ts);
            h->row_end(call);
        } else if (strcmp(mode, "two_mutations") == 0) {
            h->state_set(call, i, 1);
            h->state_set(call, i, 2);
        } else if (strcmp(mode, "wrong_type") == 0) {
            h->row_begin(call, i);
            h->row_set_utf8(call, h->output_column(call, "n"), "x", 1);
            h->row_end(call);
        } else if (strcmp(mode, "unended_row") == 0) {
            h->row_begin(call, i);
        } else if (strcmp(mode, "many_rows") == 0) {
            for (int r = 0; r < 5; r++) {
                emit(h, call, i, a, ts, r);
            }
        } else if (strcmp(mode, "bad_index") == 0) {
            h->state_set(call, count + 3, 1);
        } else if (strcmp(mode, "fail") == 0) {
            h->fail(call, "mode fail");
        } else if (strcmp(mode, "return") == 0) {
            return 7;
        } else if (strcmp(mode, "fill_bytes") == 0) {
            /* 300 MiB of overwrites of one cell (more than a step's arena
             * holds), then another row: the host must refuse, not abort. */
            static char big[1 << 20];
            memset(big, 'x', sizeof big);
            h->row_begin(call, i);
            for (int r = 0; r < 300; r++) {
                if (h->row_set_utf8(call, h->output_column(call, "key"), big, sizeof big) != 0) {
                    break;
                }
            }
            h->row_end(call);
            h->row_begin(call, i);
        } else if (strcmp(mode, "many_timer_ops") == 0) {
            for (int r = 0; r < 300000; r++) {
                if (h->timer_set(call, i, "t", ts + 1000000 + r) != 0) {
                    break;
                }
            }
        } else if (strcmp(mode, "drift") == 0) {
            emit(h, call, i, a, ts, ++drift_calls);
        } else if (strcmp(mode, "drift_state") == 0) {
            h->state_set(call, i, ++drift_calls);
        } else if (strcmp(mode, "flaky") == 0) {
            if (++flaky_calls % 2 == 0) {
                h->fail(call, "mode flaky: an even call");
            }
        } else if (strcmp(mode, "min_timer") == 0) {
            h->timer_set(call, i, "t", INT64_MIN);
        }
    }
    return 0;
}

const kf_handler_t kf_handler_v1 = {KF_HANDLER_ABI_VERSION, "misbehaving", invoke};
