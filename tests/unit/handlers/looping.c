/*
 * looping.c - a test-only native handler that never returns when a row
 * asks it to, for the watchdog's end-to-end test (tests/e2e/test_watchdog.py).
 *
 * Input: k UTF8, ts TIMESTAMP_US, mode UTF8, amount INT64 (nullable).
 * Output: key UTF8, ts TIMESTAMP_US, n INT64. A row with mode "loop" spins
 * forever (a busy loop, as a buggy handler would); any other row emits
 * {key, ts, n: amount} and sets the state to amount.
 */
#include <stdint.h>
#include <string.h>

#include "keyflow/handler.h"

static int invoke(const kf_host_t *h, kf_call_t *call, const kf_activation_t *acts,
                  uint32_t count) {
    int mode_col = h->input_column(call, "mode"), amount_col = h->input_column(call, "amount");
    for (uint32_t i = 0; i < count; i++) {
        const kf_activation_t *a = &acts[i];
        if (a->callback != KF_CALLBACK_ROW) {
            continue;
        }
        size_t len;
        const char *mode = h->input_utf8(call, a->row, mode_col, &len);
        if (mode != NULL && strcmp(mode, "loop") == 0) {
            for (volatile uint64_t spins = 0;; spins++) {
            }
        }
        int64_t amount = h->input_int64(call, a->row, amount_col);
        if (h->row_begin(call, i) != 0 ||
            h->row_set_utf8(call, h->output_column(call, "key"), a->key_text, a->key_text_len) ||
            h->row_set_int64(call, h->output_column(call, "ts"), a->event_time_us) != 0 ||
            h->row_set_int64(call, h->output_column(call, "n"), amount) != 0 ||
            h->row_end(call) != 0 || h->state_set(call, i, amount) != 0) {
            return -1;
        }
    }
    return 0;
}

const kf_handler_t kf_handler_v1 = {KF_HANDLER_ABI_VERSION, "looping", invoke};
