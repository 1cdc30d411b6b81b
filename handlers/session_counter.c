/*
 * session_counter.c - example native handler: count a key's events until it
 * has been idle for a while (in event time), then emit one summary row.
 *
 * Loaded by keyflowd through the ABI in keyflow/handler.h (read it first).
 * Input schema, by column name: optional `idle_us` (INT64, nullable; null or
 * missing means 60 s). The key and the event time come from the activation.
 * Declared timer: "idle". Output schema: `key` (UTF8), `ts` (TIMESTAMP_US),
 * `events` (INT64).
 *
 * A key's life (state and timer per key; the host fires "idle" once the
 * watermark reaches it):
 *
 *      absent --row--> 1 --row--> 2 --row--> ... n --"idle" fires--> absent
 *                      each row: SET count + 1,        emits {key, timer time, n}
 *                      re-arm "idle" (setting replaces) and CLEARs the state
 *
 *   - Row activation: SET count = (prior value, or 0) + 1; set "idle" at
 *     max(event_time_us + idle_us, watermark_us + 1); emit nothing. The clamp
 *     keeps a late row (its idle time already behind the watermark) from
 *     asking for a timer the host must refuse: it fires at the next watermark
 *     advance instead. event_time_us + idle_us saturates at INT64_MAX.
 *   - "idle" timer activation: emit one row {key, ts = the timer's time,
 *     events = the count (0 if the state is absent)} and CLEAR the state.
 *
 * Invariants kept:
 *   - Nothing is kept between calls and nothing is allocated; column indexes
 *     and the watermark are read once per call, not per row.
 *   - Results depend only on the activations, their state, the input rows and
 *     the call's watermark, which the host derives from the accepted input
 *     alone, so a replay computes the same results (REPLAY_SAFE).
 *   - On any failure the handler stops at once and returns nonzero; the host
 *     has then been told why and applies nothing of the call.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "keyflow/handler.h"

#define SC_NAME       "session_counter"
#define SC_TIMER_IDLE "idle"
/* 60 s of event time: long enough that a steady stream stays one session. */
#define SC_IDLE_DEFAULT_US INT64_C(60000000)
/* Failure messages are bounded; a long key is cut short in them. */
#define SC_MESSAGE_BYTES     256
#define SC_MESSAGE_KEY_BYTES 64

/* What one call reads once and then uses for every activation. */
typedef struct sc_call_info {
    int idle_us;          /* input INT64, nullable; -1 when the schema has none */
    int key;              /* output UTF8 */
    int ts;               /* output TIMESTAMP_US */
    int events;           /* output INT64 */
    int64_t watermark_us; /* the function's watermark before this call */
} sc_call_info_t;

/* A host built for another ABI version, or an older, shorter host table, may
 * lack functions this handler calls; refuse it before touching any of them. */
static int host_usable(const kf_host_t *host) {
    return host != NULL && host->abi_version == KF_HANDLER_ABI_VERSION &&
           host->size >= sizeof(kf_host_t);
}

static int fail_missing(const kf_host_t *host, kf_call_t *call, const char *name) {
    char message[SC_MESSAGE_BYTES];
    snprintf(message, sizeof message, SC_NAME ": the output schema has no column '%s'", name);
    host->fail(call, message);
    return -1;
}

/* How much of the key fits in a failure message: at most
 * SC_MESSAGE_KEY_BYTES bytes, cut before a UTF-8 continuation byte so the
 * message stays valid UTF-8 (it travels in gRPC statuses and JSON bodies). */
static int key_prefix_len(const kf_activation_t *act) {
    size_t n = act->key_text_len < SC_MESSAGE_KEY_BYTES ? act->key_text_len : SC_MESSAGE_KEY_BYTES;
    while (n > 0 && n < act->key_text_len && ((unsigned char)act->key_text[n] & 0xC0) == 0x80) {
        n--;
    }
    return (int)n;
}

static int fail_key(const kf_host_t *host, kf_call_t *call, const kf_activation_t *act,
                    const char *problem) {
    char message[SC_MESSAGE_BYTES];
    snprintf(message, sizeof message, SC_NAME ": key '%.*s' (activation %" PRIu64 "): %s",
             key_prefix_len(act), act->key_text, act->id, problem);
    host->fail(call, message);
    return -1;
}

static int read_call_info(const kf_host_t *host, kf_call_t *call, sc_call_info_t *info) {
    /* Optional: without the column every session uses the default. */
    info->idle_us = host->input_column(call, "idle_us");

    static const char *const output_names[] = {"key", "ts", "events"};
    int *const output_slots[] = {&info->key, &info->ts, &info->events};
    for (size_t i = 0; i < sizeof output_names / sizeof output_names[0]; i++) {
        *output_slots[i] = host->output_column(call, output_names[i]);
        if (*output_slots[i] < 0) {
            return fail_missing(host, call, output_names[i]);
        }
    }
    info->watermark_us = host->watermark_us(call);
    return 0;
}

/* A row: count it and push the key's idle timer out. */
static int on_row(const kf_host_t *host, kf_call_t *call, const sc_call_info_t *info,
                  uint32_t index, const kf_activation_t *act) {
    /* Only VALUE carries a count; this handler never stores null, and a null
     * left by a migration counts as no events. */
    const int64_t previous = act->state_kind == KF_STATE_VALUE ? act->state_value : 0;
    if (previous == INT64_MAX) {
        return fail_key(host, call, act, "event count overflows int64");
    }

    int64_t idle_us = SC_IDLE_DEFAULT_US;
    if (info->idle_us >= 0 && !host->input_is_null(call, act->row, info->idle_us)) {
        idle_us = host->input_int64(call, act->row, info->idle_us);
        if (idle_us < 0) {
            /* A negative idle time has no meaning; refusing it is clearer
             * than silently ending the session at once. */
            return fail_key(host, call, act, "idle_us is negative");
        }
    }
    /* Saturate: a session that would end past the end of time ends there. */
    int64_t at_us =
        act->event_time_us > INT64_MAX - idle_us ? INT64_MAX : act->event_time_us + idle_us;
    if (info->watermark_us == INT64_MAX) {
        return fail_key(host, call, act, "the watermark is at INT64_MAX; no timer can be set");
    }
    if (at_us <= info->watermark_us) {
        at_us = info->watermark_us + 1;
    }

    if (host->state_set(call, index, previous + 1) != 0 ||
        host->timer_set(call, index, SC_TIMER_IDLE, at_us) != 0) {
        return -1;
    }
    return 0;
}

/* The idle timer fired: the session is over; report it and forget the key. */
static int on_idle(const kf_host_t *host, kf_call_t *call, const sc_call_info_t *info,
                   uint32_t index, const kf_activation_t *act) {
    const int64_t events = act->state_kind == KF_STATE_VALUE ? act->state_value : 0;
    if (host->row_begin(call, index) != 0 ||
        host->row_set_utf8(call, info->key, act->key_text, act->key_text_len) != 0 ||
        host->row_set_int64(call, info->ts, act->event_time_us) != 0 ||
        host->row_set_int64(call, info->events, events) != 0 || host->row_end(call) != 0 ||
        host->state_clear(call, index) != 0) {
        return -1;
    }
    return 0;
}

static int invoke(const kf_host_t *host, kf_call_t *call, const kf_activation_t *activations,
                  uint32_t count) {
    if (!host_usable(host)) {
        return -1;
    }
    sc_call_info_t info;
    if (read_call_info(host, call, &info) != 0) {
        return -1;
    }
    for (uint32_t i = 0; i < count; i++) {
        const kf_activation_t *act = &activations[i];
        int rc = 0;
        if (act->callback == KF_CALLBACK_ROW) {
            rc = on_row(host, call, &info, i, act);
        } else if (act->callback == KF_CALLBACK_TIMER) {
            /* The host fires only declared timers, and "idle" is the only
             * one; anything else is left alone rather than guessed at. */
            if (act->timer_name != NULL && strcmp(act->timer_name, SC_TIMER_IDLE) == 0) {
                rc = on_idle(host, call, &info, i, act);
            }
        } else {
            rc = fail_key(host, call, act, "unknown callback kind");
        }
        if (rc != 0) {
            return -1;
        }
    }
    return 0;
}

const kf_handler_t kf_handler_v1 = {KF_HANDLER_ABI_VERSION, SC_NAME, invoke};
