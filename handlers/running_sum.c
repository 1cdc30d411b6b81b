/*
 * running_sum.c - example native handler: a per-key running sum of `amount`.
 *
 * Loaded by keyflowd through the ABI in keyflow/handler.h (read it first).
 * Input schema, by column name: `amount` (INT64, nullable) and optionally
 * `reset` (BOOL, nullable). Output schema: `key` (UTF8), `ts` (TIMESTAMP_US),
 * `sum` (INT64, nullable), `previous` (UTF8).
 *
 * Per row activation, in this order of precedence:
 *   1. `reset` exists and is true  -> CLEAR the state,     emit sum = null
 *   2. `amount` is null            -> SET_NULL the state,  emit sum = null
 *   3. otherwise                   -> SET (prior value, or 0 when the state is
 *                                     absent or null) + amount, emit the sum;
 *                                     int64 overflow fails the whole call
 * Every row activation emits exactly one row whose `previous` names the state
 * kind the activation saw ("absent", "null" or "value"), so a reader of the
 * output can tell a cleared key from one whose last amount was null.
 * Timer activations are not expected (the descriptor declares no timers); one
 * that arrives anyway leaves the key unchanged and emits nothing.
 *
 * Invariants kept:
 *   - The handler keeps nothing between calls and allocates nothing: column
 *     indexes live on the stack for one call, strings come from the host or
 *     are literals. It is therefore reentrant and REPLAY_SAFE: results depend
 *     only on the activations, their state and the input rows.
 *   - Column names are resolved once per call, never per row: the benchmark
 *     pushes hundreds of thousands of rows a second through this handler.
 *   - On any failure the handler stops at once and returns nonzero; the host
 *     has then been told why (by host->fail here, or by the host function
 *     that refused an argument) and applies nothing of the call.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "keyflow/handler.h"

#define RS_NAME "running_sum"
/* Failure messages are bounded; a long key is cut short in them. */
#define RS_MESSAGE_BYTES     256
#define RS_MESSAGE_KEY_BYTES 64

/* Column indexes of one call's schemas. */
typedef struct rs_columns {
    int amount;   /* input INT64, nullable */
    int reset;    /* input BOOL, nullable; -1 when the schema has no `reset` */
    int key;      /* output UTF8 */
    int ts;       /* output TIMESTAMP_US */
    int sum;      /* output INT64, nullable */
    int previous; /* output UTF8 */
} rs_columns_t;

/*
 * A host built for another ABI version, or an older, shorter host table, may
 * lack functions this handler calls; refuse it before touching any of them.
 * (Without a usable table there is no host->fail to explain why.)
 */
static int host_usable(const kf_host_t *host) {
    return host != NULL && host->abi_version == KF_HANDLER_ABI_VERSION &&
           host->size >= sizeof(kf_host_t);
}

/* The readable name of a state kind and its length, or NULL for a kind this
 * ABI lacks. The length comes with it so no row pays for a strlen. */
static const char *state_kind_name(int32_t kind, size_t *len) {
    switch (kind) {
    case KF_STATE_ABSENT: *len = sizeof "absent" - 1; return "absent";
    case KF_STATE_NULL: *len = sizeof "null" - 1; return "null";
    case KF_STATE_VALUE: *len = sizeof "value" - 1; return "value";
    default: *len = 0; return NULL;
    }
}

/* Fails the call because a column the handler needs is not in the schema. */
static int fail_missing(const kf_host_t *host, kf_call_t *call, const char *side,
                        const char *name) {
    char message[RS_MESSAGE_BYTES];
    snprintf(message, sizeof message, RS_NAME ": the %s schema has no column '%s'", side, name);
    host->fail(call, message);
    return -1;
}

static int resolve_columns(const kf_host_t *host, kf_call_t *call, rs_columns_t *cols) {
    cols->amount = host->input_column(call, "amount");
    if (cols->amount < 0) {
        return fail_missing(host, call, "input", "amount");
    }
    /* Optional: a function registered without `reset` simply never resets. */
    cols->reset = host->input_column(call, "reset");

    /* A fixed lookup order, so the same schema always reports the same
     * missing column. */
    static const char *const output_names[] = {"key", "ts", "sum", "previous"};
    int *const output_slots[] = {&cols->key, &cols->ts, &cols->sum, &cols->previous};
    for (size_t i = 0; i < sizeof output_names / sizeof output_names[0]; i++) {
        *output_slots[i] = host->output_column(call, output_names[i]);
        if (*output_slots[i] < 0) {
            return fail_missing(host, call, "output", output_names[i]);
        }
    }
    return 0;
}

/* How much of the key fits in a failure message: at most
 * RS_MESSAGE_KEY_BYTES bytes, cut before a UTF-8 continuation byte so the
 * message stays valid UTF-8 (it travels in gRPC statuses and JSON bodies). */
static int key_prefix_len(const kf_activation_t *act) {
    size_t n = act->key_text_len < RS_MESSAGE_KEY_BYTES ? act->key_text_len : RS_MESSAGE_KEY_BYTES;
    while (n > 0 && n < act->key_text_len && ((unsigned char)act->key_text[n] & 0xC0) == 0x80) {
        n--;
    }
    return (int)n;
}

/* Whether a + b leaves the int64 range (checked before adding: signed
 * overflow is undefined behaviour, so it must never happen). */
static int add_overflows(int64_t a, int64_t b) {
    return (b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b);
}

static int fail_overflow(const kf_host_t *host, kf_call_t *call, const kf_activation_t *act,
                         int64_t base, int64_t amount) {
    char message[RS_MESSAGE_BYTES];
    snprintf(message, sizeof message,
             RS_NAME ": int64 overflow adding amount %" PRId64 " to sum %" PRId64
                     " of key '%.*s' (activation %" PRIu64 ")",
             amount, base, key_prefix_len(act), act->key_text, act->id);
    host->fail(call, message);
    return -1;
}

/*
 * One row activation: one state mutation and one output row. `index` is the
 * activation's position in this call, which is how the host's builder calls
 * address it.
 */
static int apply_row(const kf_host_t *host, kf_call_t *call, const rs_columns_t *cols,
                     uint32_t index, const kf_activation_t *act) {
    size_t previous_len;
    const char *previous = state_kind_name(act->state_kind, &previous_len);
    if (previous == NULL) {
        char message[RS_MESSAGE_BYTES];
        snprintf(message, sizeof message,
                 RS_NAME ": activation %" PRIu64 " has unknown state kind %" PRId32, act->id,
                 act->state_kind);
        host->fail(call, message);
        return -1;
    }

    const uint32_t row = act->row;
    int sum_is_null = 1;
    int64_t sum = 0;
    int rc;
    /* A null `reset` means "no reset", the same as false. */
    if (cols->reset >= 0 && !host->input_is_null(call, row, cols->reset) &&
        host->input_bool(call, row, cols->reset)) {
        rc = host->state_clear(call, index);
    } else if (host->input_is_null(call, row, cols->amount)) {
        rc = host->state_set_null(call, index);
    } else {
        const int64_t amount = host->input_int64(call, row, cols->amount);
        /* A null state contributes nothing, like an absent one; `previous`
         * still tells the two apart. */
        const int64_t base = act->state_kind == KF_STATE_VALUE ? act->state_value : 0;
        if (add_overflows(base, amount)) {
            return fail_overflow(host, call, act, base, amount);
        }
        sum = base + amount;
        sum_is_null = 0;
        rc = host->state_set(call, index, sum);
    }
    if (rc != 0) {
        return -1;
    }

    if (host->row_begin(call, index) != 0 ||
        host->row_set_utf8(call, cols->key, act->key_text, act->key_text_len) != 0 ||
        host->row_set_int64(call, cols->ts, act->event_time_us) != 0 ||
        (sum_is_null ? host->row_set_null(call, cols->sum)
                     : host->row_set_int64(call, cols->sum, sum)) != 0 ||
        host->row_set_utf8(call, cols->previous, previous, previous_len) != 0 ||
        host->row_end(call) != 0) {
        return -1;
    }
    return 0;
}

static int invoke(const kf_host_t *host, kf_call_t *call, const kf_activation_t *activations,
                  uint32_t count) {
    if (!host_usable(host)) {
        return -1;
    }
    rs_columns_t cols;
    if (resolve_columns(host, call, &cols) != 0) {
        return -1;
    }
    for (uint32_t i = 0; i < count; i++) {
        const kf_activation_t *act = &activations[i];
        if (act->callback == KF_CALLBACK_ROW) {
            if (apply_row(host, call, &cols, i, act) != 0) {
                return -1;
            }
        } else if (act->callback != KF_CALLBACK_TIMER) {
            char message[RS_MESSAGE_BYTES];
            snprintf(message, sizeof message,
                     RS_NAME ": activation %" PRIu64 " has unknown callback kind %" PRId32, act->id,
                     act->callback);
            host->fail(call, message);
            return -1;
        }
        /* A timer activation: this function declares no timers, so there is
         * nothing to do; the key's state stays unchanged. */
    }
    return 0;
}

const kf_handler_t kf_handler_v1 = {KF_HANDLER_ABI_VERSION, RS_NAME, invoke};
