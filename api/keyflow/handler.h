/*
 * keyflow/handler.h - the native handler ABI, version 1.
 *
 * A native handler is a shared object exporting one symbol,
 *
 *     const kf_handler_t kf_handler_v1 = { KF_HANDLER_ABI_VERSION, "name", invoke };
 *
 * keyflowd loads it only from its configured plugin directory, and only when
 * the SHA-256 of the file equals the function descriptor's
 * implementation_digest (checked at registration and at every start; the
 * bytes hashed are the bytes loaded).
 *
 * Contract
 *   - invoke() runs on the engine thread: it must be bounded and must never
 *     block (no I/O, no locks held across calls, no sleeping). A call that
 *     has not returned after the descriptor's limits.call_timeout_ms (10 s
 *     by default) ends keyflowd (the watchdog; the batch is not
 *     acknowledged, docs/semantics.md).
 *   - One call carries up to max_batch_rows activations, at most one per
 *     key, each with the key's value state as it was before the activation.
 *   - The host owns every byte the handler sees. Pointers passed in (keys,
 *     strings, activations) are valid only until invoke() returns; the
 *     handler keeps nothing.
 *   - Results are written only through the host functions: output rows,
 *     one state mutation per activation (default: unchanged), ordered timer
 *     operations. The host validates the whole response after invoke()
 *     returns; any violation (wrong type, missing non-nullable column, an
 *     output event time before its activation's, an undeclared timer, a
 *     timer at or before the watermark, a limit) fails the whole input batch
 *     and nothing is applied.
 *   - Builder functions (row_*, state_*, timer_*) return 0, or -1 when an
 *     argument is wrong; the call is then already marked failed with a
 *     message naming the problem. Their `activation` argument is the index
 *     of the activation in this call's array (0..count-1), not its id.
 *     Input accessors never fail the call: a wrong row or column reads as
 *     null / 0 / NULL.
 *   - Output UTF8 values must be valid UTF-8 (checked). fail() copies its
 *     message (the first 300 bytes).
 *   - key_text is the key column's value for one key column, else a JSON
 *     array of the values.
 *   - If the descriptor declares determinism REPLAY_SAFE, results must
 *     depend only on the activations, their input rows, their state and
 *     the watermark.
 *   - kf_host_t only grows at its end; `size` says how much of it the host
 *     provides, so a handler built against a newer header can check that
 *     every member it uses lies within `size`.
 *
 * Types: BOOL=1, INT64=2, FLOAT64=3, UTF8=4, BYTES=5, TIMESTAMP_US=6 (as in
 * keyflow.v1.FieldType). Columns are addressed by their index in the input
 * or output schema; input_column()/output_column() look indexes up by name
 * (do it once per call, not per row).
 */
#ifndef KEYFLOW_HANDLER_H
#define KEYFLOW_HANDLER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KF_HANDLER_ABI_VERSION 1u
#define KF_HANDLER_SYMBOL      "kf_handler_v1"

enum kf_callback_kind {
    KF_CALLBACK_ROW = 1,   /* an input row arrived for the key */
    KF_CALLBACK_TIMER = 2, /* a timer of the key fired (no row) */
};

enum kf_state_kind {
    KF_STATE_ABSENT = 1, /* never set, or cleared */
    KF_STATE_NULL = 2,
    KF_STATE_VALUE = 3,
};

/* Opaque: one handler call (its inputs and the response being built). */
typedef struct kf_call kf_call_t;

typedef struct kf_activation {
    uint64_t id;        /* per-function sequence */
    const uint8_t *key; /* canonical key: (u32 BE length, UTF-8 bytes) per key column */
    size_t key_len;
    const char *key_text; /* readable key (NUL-terminated) */
    size_t key_text_len;
    int64_t event_time_us;  /* the row's event time, or the timer's time */
    int32_t callback;       /* enum kf_callback_kind */
    uint32_t row;           /* KF_CALLBACK_ROW: row index for the input_* functions */
    const char *timer_name; /* KF_CALLBACK_TIMER: the timer that fired */
    int32_t state_kind;     /* enum kf_state_kind, before this activation */
    int64_t state_value;    /* when KF_STATE_VALUE */
} kf_activation_t;

typedef struct kf_host {
    uint32_t abi_version; /* KF_HANDLER_ABI_VERSION */
    uint32_t size;        /* sizeof(kf_host_t) as the host built it */

    /* The function's watermark before this call: a timer must be set after
     * it (at_us > watermark_us). INT64_MIN before the first watermark. */
    int64_t (*watermark_us)(const kf_call_t *call);

    /* Schema lookups: a column index, or -1. */
    int (*input_column)(const kf_call_t *call, const char *name);
    int (*output_column)(const kf_call_t *call, const char *name);

    /* Input values of row activations (row = activation->row). Reading a
     * column with the wrong accessor returns 0 / NULL. */
    int (*input_is_null)(const kf_call_t *call, uint32_t row, int column);
    int64_t (*input_int64)(const kf_call_t *call, uint32_t row,
                           int column); /* INT64, TIMESTAMP_US */
    double (*input_float64)(const kf_call_t *call, uint32_t row, int column);
    int (*input_bool)(const kf_call_t *call, uint32_t row, int column);
    const char *(*input_utf8)(const kf_call_t *call, uint32_t row, int column, size_t *len);
    const uint8_t *(*input_bytes)(const kf_call_t *call, uint32_t row, int column, size_t *len);

    /* Output rows: begin (for an activation), set columns, end. Columns not
     * set are null (an error for non-nullable columns). Values are copied. */
    int (*row_begin)(kf_call_t *call, uint32_t activation);
    int (*row_set_null)(kf_call_t *call, int column);
    int (*row_set_int64)(kf_call_t *call, int column, int64_t value); /* INT64, TIMESTAMP_US */
    int (*row_set_float64)(kf_call_t *call, int column, double value);
    int (*row_set_bool)(kf_call_t *call, int column, int value);
    int (*row_set_utf8)(kf_call_t *call, int column, const char *value, size_t len);
    int (*row_set_bytes)(kf_call_t *call, int column, const uint8_t *value, size_t len);
    int (*row_end)(kf_call_t *call);

    /* The activation's one state mutation (a second one is an error). */
    int (*state_set)(kf_call_t *call, uint32_t activation, int64_t value);
    int (*state_set_null)(kf_call_t *call, uint32_t activation);
    int (*state_clear)(kf_call_t *call, uint32_t activation);

    /* Ordered timer operations of the activation's key: setting replaces,
     * cancelling an absent timer is a no-op. */
    int (*timer_set)(kf_call_t *call, uint32_t activation, const char *name, int64_t at_us);
    int (*timer_cancel)(kf_call_t *call, uint32_t activation, const char *name);

    /* Refuse the whole call (e.g. an input the handler cannot take). */
    void (*fail)(kf_call_t *call, const char *message);
} kf_host_t;

typedef struct kf_handler {
    uint32_t abi_version; /* KF_HANDLER_ABI_VERSION */
    const char *name;
    /* Returns 0; nonzero fails the call (like host->fail). */
    int (*invoke)(const kf_host_t *host, kf_call_t *call, const kf_activation_t *activations,
                  uint32_t count);
} kf_handler_t;

#ifdef __cplusplus
}
#endif

#endif
