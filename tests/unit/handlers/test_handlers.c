/*
 * test_handlers.c - the example native handlers (handlers/running_sum.c,
 * handlers/session_counter.c), loaded exactly as keyflowd loads them: the
 * built .so is dlopen()ed and its kf_handler_v1 table is driven through
 * invoke() with a fake host written here.
 *
 * The fake host is strict on purpose. It refuses, at the call that breaks
 * it, everything the real host refuses when it validates a response (an
 * unknown activation, a second mutation, a wrong column type, an unset
 * non-nullable column, an output row before its activation's event time, an
 * undeclared timer, a timer at or before the watermark) and also what the
 * real host would merely tolerate but a correct handler never does (reading
 * a column with the wrong accessor or outside the batch, setting a column
 * twice, leaving a row open). So a test that expects success also proves the
 * response would pass the engine's validation.
 *
 * Poison where the ABI says a value means nothing: input row 0 of every fake
 * call is a row no activation names (a handler that reads row i instead of
 * activation->row is refused), a null input cell holds a nonzero placeholder
 * (as a null entry of a pushed batch may), and state_value is garbage unless
 * the state kind is VALUE.
 *
 * The descriptor files written by the build are checked too: their digest
 * is the SHA-256 of the .so next to them, and their schemas drive the
 * handlers without a failure.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>
#include <mbedtls/md.h>

#include "keyflow/handler.h"

#ifndef KF_TEST_RUNNING_SUM_SO
#error "KF_TEST_RUNNING_SUM_SO must name the built running_sum.so"
#endif
#ifndef KF_TEST_SESSION_COUNTER_SO
#error "KF_TEST_SESSION_COUNTER_SO must name the built session_counter.so"
#endif
#ifndef KF_TEST_HANDLER_DIR
#error "KF_TEST_HANDLER_DIR must name the directory of the built handlers"
#endif

/* Field types, as in keyflow.v1.FieldType and handler.h. */
enum { FH_BOOL = 1, FH_INT64 = 2, FH_FLOAT64 = 3, FH_UTF8 = 4, FH_BYTES = 5, FH_TS = 6 };

#define FH_COLUMNS_MAX   8
#define FH_ROWS_MAX      600 /* input rows and activations per fake call */
#define FH_OUT_ROWS_MAX  600
#define FH_TIMER_OPS_MAX 600
#define FH_TEXT_BYTES    96 /* copied UTF8 output values */
#define FH_MESSAGE_BYTES 512
#define FH_KEY_BYTES     96

#define SIXTY_S_US INT64_C(60000000)
#define FH_POISON  INT64_C(777000000)

typedef struct fh_column {
    const char *name;
    int type;
    int nullable;
} fh_column_t;

typedef struct fh_cell {
    int set; /* output: set by the handler */
    int is_null;
    int64_t i;                /* INT64, TIMESTAMP_US, BOOL */
    char text[FH_TEXT_BYTES]; /* UTF8, copied */
    size_t text_len;
} fh_cell_t;

enum { FH_UNCHANGED = 0, FH_SET, FH_SET_NULL, FH_CLEAR };

typedef struct fh_mutation {
    int kind;
    int64_t value; /* FH_SET */
} fh_mutation_t;

typedef struct fh_out_row {
    uint32_t activation;
    fh_cell_t cells[FH_COLUMNS_MAX];
} fh_out_row_t;

typedef struct fh_timer_op {
    uint32_t activation;
    int cancel;
    char name[32];
    int64_t at_us;
} fh_timer_op_t;

/* The host's side of one call: what it offers and what the handler did. */
struct kf_call {
    const fh_column_t *in_cols;
    int in_col_count;
    const fh_column_t *out_cols;
    int out_col_count;
    int out_ts_column; /* output_event_time_column's index, or -1 */
    const char *const *timer_names;
    size_t timer_count;
    int64_t watermark_us;

    fh_cell_t input[FH_ROWS_MAX][FH_COLUMNS_MAX];
    uint32_t input_rows;
    kf_activation_t acts[FH_ROWS_MAX];
    char keys[FH_ROWS_MAX][FH_KEY_BYTES];
    uint32_t act_count;

    fh_out_row_t out[FH_OUT_ROWS_MAX];
    uint32_t out_count;
    int row_open;
    fh_mutation_t mutations[FH_ROWS_MAX];
    fh_timer_op_t timer_ops[FH_TIMER_OPS_MAX];
    uint32_t timer_op_count;

    int failed;
    int fail_calls; /* host->fail by the handler itself */
    char message[FH_MESSAGE_BYTES];
    int input_lookups;
    int output_lookups;
};

/* ---- the fake host ---------------------------------------------------- */

/* Marks the call failed; the first message wins, as the real host keeps. */
static void fh_refuse(kf_call_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fh_refuse(kf_call_t *c, const char *fmt, ...) {
    if (!c->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->message, sizeof c->message, fmt, ap);
        va_end(ap);
    }
    c->failed = 1;
}

static int fh_lookup(const fh_column_t *cols, int count, const char *name) {
    for (int i = 0; i < count; i++) {
        if (strcmp(cols[i].name, name) == 0) {
            return i;
        }
    }
    return -1;
}

static int64_t fh_watermark_us(const kf_call_t *c) {
    return c->watermark_us;
}

static int fh_input_column(const kf_call_t *c, const char *name) {
    ((kf_call_t *)c)->input_lookups++;
    return fh_lookup(c->in_cols, c->in_col_count, name);
}

static int fh_output_column(const kf_call_t *c, const char *name) {
    ((kf_call_t *)c)->output_lookups++;
    return fh_lookup(c->out_cols, c->out_col_count, name);
}

/* An input cell, or NULL (and the call refused) when the read is wrong. */
static const fh_cell_t *fh_input_cell(const kf_call_t *cc, uint32_t row, int column, int type) {
    kf_call_t *c = (kf_call_t *)cc;
    if (row == 0 || row >= c->input_rows) {
        fh_refuse(c, "read of input row %" PRIu32 " that no activation names", row);
        return NULL;
    }
    if (column < 0 || column >= c->in_col_count) {
        fh_refuse(c, "read of input column %d out of range", column);
        return NULL;
    }
    int actual = c->in_cols[column].type == FH_TS ? FH_INT64 : c->in_cols[column].type;
    if (type != 0 && type != actual) {
        fh_refuse(c, "input column '%s' read with the wrong accessor", c->in_cols[column].name);
        return NULL;
    }
    return &c->input[row][column];
}

static int fh_input_is_null(const kf_call_t *c, uint32_t row, int column) {
    const fh_cell_t *cell = fh_input_cell(c, row, column, 0);
    return cell != NULL && cell->is_null;
}

static int64_t fh_input_int64(const kf_call_t *c, uint32_t row, int column) {
    const fh_cell_t *cell = fh_input_cell(c, row, column, FH_INT64);
    return cell != NULL ? cell->i : 0;
}

static double fh_input_float64(const kf_call_t *c, uint32_t row, int column) {
    (void)fh_input_cell(c, row, column, FH_FLOAT64);
    return 0.0;
}

static int fh_input_bool(const kf_call_t *c, uint32_t row, int column) {
    const fh_cell_t *cell = fh_input_cell(c, row, column, FH_BOOL);
    return cell != NULL ? (int)cell->i : 0;
}

static const char *fh_input_utf8(const kf_call_t *c, uint32_t row, int column, size_t *len) {
    const fh_cell_t *cell = fh_input_cell(c, row, column, FH_UTF8);
    *len = cell != NULL ? cell->text_len : 0;
    return cell != NULL ? cell->text : NULL;
}

static const uint8_t *fh_input_bytes(const kf_call_t *c, uint32_t row, int column, size_t *len) {
    (void)fh_input_cell(c, row, column, FH_BYTES);
    *len = 0;
    return NULL;
}

static int fh_check_activation(kf_call_t *c, uint32_t activation, const char *what) {
    if (activation >= c->act_count) {
        fh_refuse(c, "%s for unknown activation %" PRIu32, what, activation);
        return -1;
    }
    return 0;
}

static int fh_row_begin(kf_call_t *c, uint32_t activation) {
    if (fh_check_activation(c, activation, "row_begin") != 0) {
        return -1;
    }
    if (c->row_open) {
        fh_refuse(c, "row_begin while a row is open");
        return -1;
    }
    if (c->out_count == FH_OUT_ROWS_MAX) {
        fh_refuse(c, "too many output rows");
        return -1;
    }
    fh_out_row_t *r = &c->out[c->out_count];
    memset(r, 0, sizeof *r);
    r->activation = activation;
    c->row_open = 1;
    return 0;
}

/* The cell an output setter writes, or NULL (call refused). */
static fh_cell_t *fh_out_cell(kf_call_t *c, int column, int type) {
    if (!c->row_open) {
        fh_refuse(c, "output column set outside row_begin/row_end");
        return NULL;
    }
    if (column < 0 || column >= c->out_col_count) {
        fh_refuse(c, "output column %d out of range", column);
        return NULL;
    }
    int actual = c->out_cols[column].type == FH_TS ? FH_INT64 : c->out_cols[column].type;
    if (type != 0 && type != actual) {
        fh_refuse(c, "output column '%s' set with the wrong type", c->out_cols[column].name);
        return NULL;
    }
    if (type == 0 && !c->out_cols[column].nullable) {
        fh_refuse(c, "output column '%s' is not nullable", c->out_cols[column].name);
        return NULL;
    }
    fh_cell_t *cell = &c->out[c->out_count].cells[column];
    if (cell->set) {
        fh_refuse(c, "output column '%s' set twice", c->out_cols[column].name);
        return NULL;
    }
    cell->set = 1;
    return cell;
}

static int fh_row_set_null(kf_call_t *c, int column) {
    fh_cell_t *cell = fh_out_cell(c, column, 0);
    if (cell == NULL) {
        return -1;
    }
    cell->is_null = 1;
    return 0;
}

static int fh_row_set_int64(kf_call_t *c, int column, int64_t value) {
    fh_cell_t *cell = fh_out_cell(c, column, FH_INT64);
    if (cell == NULL) {
        return -1;
    }
    cell->i = value;
    return 0;
}

static int fh_row_set_float64(kf_call_t *c, int column, double value) {
    (void)value;
    return fh_out_cell(c, column, FH_FLOAT64) != NULL ? 0 : -1;
}

static int fh_row_set_bool(kf_call_t *c, int column, int value) {
    fh_cell_t *cell = fh_out_cell(c, column, FH_BOOL);
    if (cell == NULL) {
        return -1;
    }
    cell->i = value != 0;
    return 0;
}

static int fh_row_set_utf8(kf_call_t *c, int column, const char *value, size_t len) {
    fh_cell_t *cell = fh_out_cell(c, column, FH_UTF8);
    if (cell == NULL) {
        return -1;
    }
    if (len >= sizeof cell->text) {
        fh_refuse(c, "output text longer than the fake host keeps");
        return -1;
    }
    memcpy(cell->text, value, len);
    cell->text[len] = '\0';
    cell->text_len = len;
    return 0;
}

static int fh_row_set_bytes(kf_call_t *c, int column, const uint8_t *value, size_t len) {
    (void)value;
    (void)len;
    return fh_out_cell(c, column, FH_BYTES) != NULL ? 0 : -1;
}

static int fh_row_end(kf_call_t *c) {
    if (!c->row_open) {
        fh_refuse(c, "row_end without row_begin");
        return -1;
    }
    fh_out_row_t *r = &c->out[c->out_count];
    for (int i = 0; i < c->out_col_count; i++) {
        if (!r->cells[i].set) {
            if (!c->out_cols[i].nullable) {
                fh_refuse(c, "non-nullable output column '%s' not set", c->out_cols[i].name);
                return -1;
            }
            r->cells[i].is_null = 1;
        }
    }
    if (c->out_ts_column >= 0) {
        const fh_cell_t *ts = &r->cells[c->out_ts_column];
        if (ts->is_null || ts->i < c->acts[r->activation].event_time_us) {
            fh_refuse(c, "output row before its activation's event time");
            return -1;
        }
    }
    c->row_open = 0;
    c->out_count++;
    return 0;
}

static int fh_mutate(kf_call_t *c, uint32_t activation, int kind, int64_t value) {
    if (fh_check_activation(c, activation, "state mutation") != 0) {
        return -1;
    }
    if (c->mutations[activation].kind != FH_UNCHANGED) {
        fh_refuse(c, "second state mutation for activation %" PRIu32, activation);
        return -1;
    }
    c->mutations[activation].kind = kind;
    c->mutations[activation].value = value;
    return 0;
}

static int fh_state_set(kf_call_t *c, uint32_t activation, int64_t value) {
    return fh_mutate(c, activation, FH_SET, value);
}

static int fh_state_set_null(kf_call_t *c, uint32_t activation) {
    return fh_mutate(c, activation, FH_SET_NULL, 0);
}

static int fh_state_clear(kf_call_t *c, uint32_t activation) {
    return fh_mutate(c, activation, FH_CLEAR, 0);
}

static int fh_timer_op(kf_call_t *c, uint32_t activation, const char *name, int cancel,
                       int64_t at_us) {
    if (fh_check_activation(c, activation, "timer operation") != 0) {
        return -1;
    }
    int declared = 0;
    for (size_t i = 0; i < c->timer_count; i++) {
        declared |= strcmp(c->timer_names[i], name) == 0;
    }
    if (!declared) {
        fh_refuse(c, "undeclared timer '%s'", name);
        return -1;
    }
    if (!cancel && at_us <= c->watermark_us) {
        fh_refuse(c, "timer '%s' at %" PRId64 " not after the watermark %" PRId64, name, at_us,
                  c->watermark_us);
        return -1;
    }
    if (c->timer_op_count == FH_TIMER_OPS_MAX) {
        fh_refuse(c, "too many timer operations");
        return -1;
    }
    fh_timer_op_t *op = &c->timer_ops[c->timer_op_count++];
    op->activation = activation;
    op->cancel = cancel;
    snprintf(op->name, sizeof op->name, "%s", name);
    op->at_us = at_us;
    return 0;
}

static int fh_timer_set(kf_call_t *c, uint32_t activation, const char *name, int64_t at_us) {
    return fh_timer_op(c, activation, name, 0, at_us);
}

static int fh_timer_cancel(kf_call_t *c, uint32_t activation, const char *name) {
    return fh_timer_op(c, activation, name, 1, 0);
}

static void fh_fail(kf_call_t *c, const char *message) {
    c->fail_calls++;
    fh_refuse(c, "%s", message);
}

static const kf_host_t FH_HOST = {
    .abi_version = KF_HANDLER_ABI_VERSION,
    .size = sizeof(kf_host_t),
    .watermark_us = fh_watermark_us,
    .input_column = fh_input_column,
    .output_column = fh_output_column,
    .input_is_null = fh_input_is_null,
    .input_int64 = fh_input_int64,
    .input_float64 = fh_input_float64,
    .input_bool = fh_input_bool,
    .input_utf8 = fh_input_utf8,
    .input_bytes = fh_input_bytes,
    .row_begin = fh_row_begin,
    .row_set_null = fh_row_set_null,
    .row_set_int64 = fh_row_set_int64,
    .row_set_float64 = fh_row_set_float64,
    .row_set_bool = fh_row_set_bool,
    .row_set_utf8 = fh_row_set_utf8,
    .row_set_bytes = fh_row_set_bytes,
    .row_end = fh_row_end,
    .state_set = fh_state_set,
    .state_set_null = fh_state_set_null,
    .state_clear = fh_state_clear,
    .timer_set = fh_timer_set,
    .timer_cancel = fh_timer_cancel,
    .fail = fh_fail,
};

/* ---- building calls ----------------------------------------------------- */

static kf_call_t *fh_call_create(const fh_column_t *in, int in_count, const fh_column_t *out,
                                 int out_count, const char *const *timers, size_t timer_count) {
    cr_assert(in_count <= FH_COLUMNS_MAX && out_count <= FH_COLUMNS_MAX);
    kf_call_t *c = calloc(1, sizeof *c);
    cr_assert_not_null(c);
    c->in_cols = in;
    c->in_col_count = in_count;
    c->out_cols = out;
    c->out_col_count = out_count;
    c->out_ts_column = fh_lookup(out, out_count, "ts");
    c->timer_names = timers;
    c->timer_count = timer_count;
    c->watermark_us = INT64_MIN;
    /* Row 0: the poison row (see the file comment). */
    for (int col = 0; col < in_count; col++) {
        c->input[0][col].i = FH_POISON;
        c->input[0][col].is_null = 0;
    }
    c->input_rows = 1;
    return c;
}

static uint32_t fh_add_activation(kf_call_t *c, const char *key, int64_t time_us, int32_t kind,
                                  int64_t value) {
    cr_assert_lt(c->act_count, FH_ROWS_MAX);
    uint32_t index = c->act_count++;
    kf_activation_t *a = &c->acts[index];
    snprintf(c->keys[index], sizeof c->keys[index], "%s", key);
    a->id = 1000 + index;
    /* The canonical key is not used by these handlers; give it anyway. */
    a->key = (const uint8_t *)c->keys[index];
    a->key_len = strlen(key);
    a->key_text = c->keys[index];
    a->key_text_len = strlen(key);
    a->event_time_us = time_us;
    a->state_kind = kind;
    a->state_value = kind == KF_STATE_VALUE ? value : FH_POISON;
    return index;
}

/* A row activation whose input row carries key and event time in the `user`
 * and `ts` columns (when the schema has them); every other cell is null. */
static uint32_t fh_row(kf_call_t *c, const char *key, int64_t ts_us, int32_t kind, int64_t value) {
    cr_assert_lt(c->input_rows, FH_ROWS_MAX);
    uint32_t row = c->input_rows++;
    for (int col = 0; col < c->in_col_count; col++) {
        fh_cell_t *cell = &c->input[row][col];
        memset(cell, 0, sizeof *cell);
        cell->is_null = 1;
        cell->i = 1; /* the placeholder: reads as true, or as 1 */
        if (strcmp(c->in_cols[col].name, "user") == 0) {
            cell->is_null = 0;
            snprintf(cell->text, sizeof cell->text, "%s", key);
            cell->text_len = strlen(cell->text);
        } else if (strcmp(c->in_cols[col].name, "ts") == 0) {
            cell->is_null = 0;
            cell->i = ts_us;
        }
    }
    uint32_t index = fh_add_activation(c, key, ts_us, kind, value);
    c->acts[index].callback = KF_CALLBACK_ROW;
    c->acts[index].row = row;
    return index;
}

static uint32_t fh_timer(kf_call_t *c, const char *key, const char *name, int64_t at_us,
                         int32_t kind, int64_t value) {
    uint32_t index = fh_add_activation(c, key, at_us, kind, value);
    c->acts[index].callback = KF_CALLBACK_TIMER;
    c->acts[index].timer_name = name;
    return index;
}

static fh_cell_t *fh_in(kf_call_t *c, uint32_t activation, const char *column) {
    int col = fh_lookup(c->in_cols, c->in_col_count, column);
    cr_assert_geq(col, 0, "no input column %s", column);
    return &c->input[c->acts[activation].row][col];
}

static void fh_in_int64(kf_call_t *c, uint32_t activation, const char *column, int64_t v) {
    fh_cell_t *cell = fh_in(c, activation, column);
    cell->is_null = 0;
    cell->i = v;
}

static void fh_in_bool(kf_call_t *c, uint32_t activation, const char *column, int v) {
    fh_cell_t *cell = fh_in(c, activation, column);
    cell->is_null = 0;
    cell->i = v;
}

/* ---- running and inspecting --------------------------------------------- */

/* dlopen() is reference counted: opening again returns the same object. */
static void *open_so(const char *path) {
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(so, "dlopen %s: %s", path, dlerror());
    return so;
}

static const kf_handler_t *load_handler(const char *path, const char *name) {
    void *so = open_so(path);
    const kf_handler_t *h = dlsym(so, KF_HANDLER_SYMBOL);
    cr_assert_not_null(h, "%s does not export %s", path, KF_HANDLER_SYMBOL);
    cr_assert_eq(h->abi_version, KF_HANDLER_ABI_VERSION);
    cr_assert_str_eq(h->name, name);
    cr_assert_not_null(h->invoke);
    return h; /* never dlclose()d: each test is its own process */
}

static const kf_handler_t *running_sum(void) {
    return load_handler(KF_TEST_RUNNING_SUM_SO, "running_sum");
}

static const kf_handler_t *session_counter(void) {
    return load_handler(KF_TEST_SESSION_COUNTER_SO, "session_counter");
}

/* Invokes and checks the outcome is consistent: success leaves no failure
 * and no open row; failure always comes with a message. */
static int fh_invoke(const kf_handler_t *h, kf_call_t *c) {
    int rc = h->invoke(&FH_HOST, c, c->acts, c->act_count);
    if (rc == 0) {
        cr_assert(!c->failed, "invoke returned 0 but the call failed: %s", c->message);
        cr_assert(!c->row_open, "invoke returned with an output row open");
    } else {
        cr_assert(c->failed, "invoke returned %d without saying why", rc);
        cr_assert_gt(strlen(c->message), 0);
    }
    return rc;
}

static void fh_expect_ok(const kf_handler_t *h, kf_call_t *c) {
    int rc = fh_invoke(h, c);
    cr_assert_eq(rc, 0, "invoke failed: %s", c->message);
}

static void fh_expect_failure(const kf_handler_t *h, kf_call_t *c, const char *needle) {
    int rc = fh_invoke(h, c);
    cr_assert_neq(rc, 0, "invoke succeeded; expected a failure naming '%s'", needle);
    cr_assert_not_null(strstr(c->message, needle), "message '%s' does not mention '%s'", c->message,
                       needle);
    /* The handler explained it itself, not a host function it misused. */
    cr_assert_eq(c->fail_calls, 1, "host->fail called %d times; message '%s'", c->fail_calls,
                 c->message);
}

static const fh_cell_t *fh_out(const kf_call_t *c, uint32_t row, const char *column) {
    cr_assert_lt(row, c->out_count);
    int col = fh_lookup(c->out_cols, c->out_col_count, column);
    cr_assert_geq(col, 0, "no output column %s", column);
    return &c->out[row].cells[col];
}

/* The output rows of one activation. */
static uint32_t fh_rows_of(const kf_call_t *c, uint32_t activation) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->out_count; i++) {
        n += c->out[i].activation == activation;
    }
    return n;
}

/* ---- running_sum ------------------------------------------------------- */

static const fh_column_t RS_IN[] = {
    {"user", FH_UTF8, 0},
    {"ts", FH_TS, 0},
    {"amount", FH_INT64, 1},
};
static const fh_column_t RS_IN_RESET[] = {
    {"user", FH_UTF8, 0},
    {"ts", FH_TS, 0},
    {"amount", FH_INT64, 1},
    {"reset", FH_BOOL, 1},
};
static const fh_column_t RS_OUT[] = {
    {"key", FH_UTF8, 0},
    {"ts", FH_TS, 0},
    {"sum", FH_INT64, 1},
    {"previous", FH_UTF8, 0},
};
#define NCOLS(a) ((int)(sizeof(a) / sizeof((a)[0])))

static kf_call_t *rs_call(int with_reset) {
    return with_reset
               ? fh_call_create(RS_IN_RESET, NCOLS(RS_IN_RESET), RS_OUT, NCOLS(RS_OUT), NULL, 0)
               : fh_call_create(RS_IN, NCOLS(RS_IN), RS_OUT, NCOLS(RS_OUT), NULL, 0);
}

/* Checks output row `row` in full; sum_null selects a null sum. */
static void rs_expect_row(const kf_call_t *c, uint32_t row, uint32_t activation, const char *key,
                          int64_t ts_us, int sum_null, int64_t sum, const char *previous) {
    cr_assert_eq(c->out[row].activation, activation);
    cr_assert_str_eq(fh_out(c, row, "key")->text, key);
    cr_assert_eq(fh_out(c, row, "ts")->i, ts_us);
    cr_assert_eq(fh_out(c, row, "sum")->is_null, sum_null, "row %u sum null", row);
    if (!sum_null) {
        cr_assert_eq(fh_out(c, row, "sum")->i, sum, "row %u sum %" PRId64 " != %" PRId64, row,
                     fh_out(c, row, "sum")->i, sum);
    }
    cr_assert_str_eq(fh_out(c, row, "previous")->text, previous);
}

Test(running_sum, exports_only_the_handler_table) {
    void *so = open_so(KF_TEST_RUNNING_SUM_SO);
    cr_assert_null(dlsym(so, "invoke"), "invoke must be static");
    cr_assert_null(dlsym(so, "apply_row"), "helpers must be static");
}

Test(running_sum, absent_state_starts_from_the_amount) {
    kf_call_t *c = rs_call(0);
    uint32_t a = fh_row(c, "alice", 100, KF_STATE_ABSENT, 0);
    fh_in_int64(c, a, "amount", 5);
    fh_expect_ok(running_sum(), c);
    cr_assert_eq(c->mutations[a].kind, FH_SET);
    cr_assert_eq(c->mutations[a].value, 5);
    cr_assert_eq(c->out_count, 1);
    rs_expect_row(c, 0, a, "alice", 100, 0, 5, "absent");
    cr_assert_eq(c->timer_op_count, 0);
    free(c);
}

Test(running_sum, value_state_adds_including_negative_amounts) {
    kf_call_t *c = rs_call(0);
    uint32_t a = fh_row(c, "alice", 200, KF_STATE_VALUE, 10);
    uint32_t b = fh_row(c, "bob", 201, KF_STATE_VALUE, 10);
    fh_in_int64(c, a, "amount", 7);
    fh_in_int64(c, b, "amount", -25);
    fh_expect_ok(running_sum(), c);
    cr_assert_eq(c->mutations[a].kind, FH_SET);
    cr_assert_eq(c->mutations[a].value, 17);
    cr_assert_eq(c->mutations[b].value, -15);
    rs_expect_row(c, 0, a, "alice", 200, 0, 17, "value");
    rs_expect_row(c, 1, b, "bob", 201, 0, -15, "value");
    free(c);
}

Test(running_sum, null_amount_sets_null_and_null_state_counts_as_zero) {
    kf_call_t *c = rs_call(0);
    uint32_t a = fh_row(c, "alice", 1, KF_STATE_VALUE, 10); /* amount stays null */
    uint32_t b = fh_row(c, "bob", 2, KF_STATE_NULL, 0);
    fh_in_int64(c, b, "amount", 3);
    uint32_t d = fh_row(c, "dora", 3, KF_STATE_ABSENT, 0); /* amount stays null */
    fh_expect_ok(running_sum(), c);
    cr_assert_eq(c->mutations[a].kind, FH_SET_NULL);
    cr_assert_eq(c->mutations[b].kind, FH_SET);
    cr_assert_eq(c->mutations[b].value, 3);
    cr_assert_eq(c->mutations[d].kind, FH_SET_NULL);
    rs_expect_row(c, 0, a, "alice", 1, 1, 0, "value");
    rs_expect_row(c, 1, b, "bob", 2, 0, 3, "null");
    rs_expect_row(c, 2, d, "dora", 3, 1, 0, "absent");
    free(c);
}

Test(running_sum, reset_clears_and_wins_over_the_amount) {
    kf_call_t *c = rs_call(1);
    uint32_t a = fh_row(c, "alice", 10, KF_STATE_VALUE, 40);
    fh_in_int64(c, a, "amount", 2);
    fh_in_bool(c, a, "reset", 1);
    uint32_t b = fh_row(c, "bob", 11, KF_STATE_VALUE, 40);
    fh_in_int64(c, b, "amount", 2);
    fh_in_bool(c, b, "reset", 0);
    uint32_t d = fh_row(c, "dora", 12, KF_STATE_VALUE, 40); /* reset stays null */
    fh_in_int64(c, d, "amount", 2);
    uint32_t e = fh_row(c, "erin", 13, KF_STATE_NULL, 0);
    fh_in_bool(c, e, "reset", 1);
    fh_expect_ok(running_sum(), c);
    cr_assert_eq(c->mutations[a].kind, FH_CLEAR);
    cr_assert_eq(c->mutations[b].kind, FH_SET);
    cr_assert_eq(c->mutations[b].value, 42);
    cr_assert_eq(c->mutations[d].kind, FH_SET);
    cr_assert_eq(c->mutations[d].value, 42);
    cr_assert_eq(c->mutations[e].kind, FH_CLEAR);
    rs_expect_row(c, 0, a, "alice", 10, 1, 0, "value");
    rs_expect_row(c, 1, b, "bob", 11, 0, 42, "value");
    rs_expect_row(c, 2, d, "dora", 12, 0, 42, "value");
    rs_expect_row(c, 3, e, "erin", 13, 1, 0, "null");
    free(c);
}

/* One key through every transition, one call per row as the engine does it,
 * each activation seeing the state the previous call left. */
Test(running_sum, absent_null_and_value_stay_distinct_across_calls) {
    const kf_handler_t *h = running_sum();
    struct {
        int amount_null;
        int64_t amount;
        int reset;
        int sum_null;
        int64_t sum;
        const char *previous;
    } steps[] = {
        {0, 5, 0, 0, 5, "absent"}, {1, 0, 0, 1, 0, "value"},    {0, 3, 0, 0, 3, "null"},
        {0, 4, 0, 0, 7, "value"},  {0, 9, 1, 1, 0, "value"},    {1, 0, 0, 1, 0, "absent"},
        {1, 0, 1, 1, 0, "null"},   {0, -2, 0, 0, -2, "absent"},
    };
    int32_t kind = KF_STATE_ABSENT;
    int64_t value = 0;
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        kf_call_t *c = rs_call(1);
        uint32_t a = fh_row(c, "k", (int64_t)i * 10, kind, value);
        if (!steps[i].amount_null) {
            fh_in_int64(c, a, "amount", steps[i].amount);
        }
        if (steps[i].reset) {
            fh_in_bool(c, a, "reset", 1);
        }
        fh_expect_ok(h, c);
        cr_assert_eq(c->out_count, 1, "step %zu", i);
        rs_expect_row(c, 0, a, "k", (int64_t)i * 10, steps[i].sum_null, steps[i].sum,
                      steps[i].previous);
        switch (c->mutations[a].kind) {
        case FH_SET:
            kind = KF_STATE_VALUE;
            value = c->mutations[a].value;
            break;
        case FH_SET_NULL: kind = KF_STATE_NULL; break;
        case FH_CLEAR: kind = KF_STATE_ABSENT; break;
        default: cr_assert_fail("step %zu left the state unchanged", i);
        }
        free(c);
    }
}

Test(running_sum, overflow_fails_the_whole_call) {
    const kf_handler_t *h = running_sum();
    kf_call_t *c = rs_call(0);
    uint32_t ok = fh_row(c, "fine", 1, KF_STATE_VALUE, 1);
    fh_in_int64(c, ok, "amount", 1);
    uint32_t a = fh_row(c, "big", 2, KF_STATE_VALUE, INT64_MAX);
    fh_in_int64(c, a, "amount", 1);
    fh_expect_failure(h, c, "overflow");
    cr_assert_not_null(strstr(c->message, "big"), "message names the key: %s", c->message);
    free(c);

    c = rs_call(0);
    a = fh_row(c, "small", 2, KF_STATE_VALUE, INT64_MIN);
    fh_in_int64(c, a, "amount", -1);
    fh_expect_failure(h, c, "overflow");
    free(c);

    /* The extremes themselves are fine. */
    c = rs_call(0);
    a = fh_row(c, "edge", 2, KF_STATE_VALUE, INT64_MAX - 1);
    fh_in_int64(c, a, "amount", 1);
    uint32_t b = fh_row(c, "low", 3, KF_STATE_ABSENT, 0);
    fh_in_int64(c, b, "amount", INT64_MIN);
    fh_expect_ok(h, c);
    cr_assert_eq(c->mutations[a].value, INT64_MAX);
    cr_assert_eq(c->mutations[b].value, INT64_MIN);
    free(c);
}

/* Well-formed UTF-8 (structure only: lead and continuation bytes). */
static int utf8_valid(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p != 0) {
        int more = *p < 0x80             ? 0
                   : (*p & 0xE0) == 0xC0 ? 1
                   : (*p & 0xF0) == 0xE0 ? 2
                   : (*p & 0xF8) == 0xF0 ? 3
                                         : -1;
        if (more < 0) {
            return 0;
        }
        p++;
        for (int i = 0; i < more; i++, p++) {
            if ((*p & 0xC0) != 0x80) {
                return 0;
            }
        }
    }
    return 1;
}

/* Failure messages quote the key, cut short; the cut must not split a
 * UTF-8 character, because the message travels in gRPC and JSON. */
Test(running_sum, long_keys_are_cut_on_a_character_boundary) {
    char key[FH_KEY_BYTES];
    size_t n = 0;
    key[n++] = 'a';
    while (n + 2 < 82) {
        key[n++] = (char)0xC3; /* U+00E9, two bytes */
        key[n++] = (char)0xA9;
    }
    key[n] = '\0';
    kf_call_t *c = rs_call(0);
    uint32_t a = fh_row(c, key, 1, KF_STATE_VALUE, INT64_MAX);
    fh_in_int64(c, a, "amount", 1);
    fh_expect_failure(running_sum(), c, "overflow");
    cr_assert(utf8_valid(c->message), "message is not UTF-8: %s", c->message);
    cr_assert_not_null(strstr(c->message, "'a\xc3\xa9"), "message quotes the key: %s", c->message);
    free(c);
}

Test(running_sum, missing_columns_are_named) {
    const kf_handler_t *h = running_sum();
    static const fh_column_t no_amount[] = {{"user", FH_UTF8, 0}, {"ts", FH_TS, 0}};
    kf_call_t *c = fh_call_create(no_amount, NCOLS(no_amount), RS_OUT, NCOLS(RS_OUT), NULL, 0);
    fh_row(c, "k", 1, KF_STATE_ABSENT, 0);
    fh_expect_failure(h, c, "'amount'");
    free(c);

    /* Each output column in turn. */
    for (int missing = 0; missing < NCOLS(RS_OUT); missing++) {
        fh_column_t out[FH_COLUMNS_MAX];
        int n = 0;
        for (int i = 0; i < NCOLS(RS_OUT); i++) {
            if (i != missing) {
                out[n++] = RS_OUT[i];
            }
        }
        c = fh_call_create(RS_IN, NCOLS(RS_IN), out, n, NULL, 0);
        uint32_t a = fh_row(c, "k", 1, KF_STATE_ABSENT, 0);
        fh_in_int64(c, a, "amount", 1);
        char needle[32];
        snprintf(needle, sizeof needle, "'%s'", RS_OUT[missing].name);
        fh_expect_failure(h, c, needle);
        cr_assert_eq(c->out_count, 0);
        free(c);
    }
}

Test(running_sum, timer_activations_change_nothing) {
    kf_call_t *c = rs_call(0);
    uint32_t t = fh_timer(c, "k", "stray", 50, KF_STATE_VALUE, 9);
    uint32_t a = fh_row(c, "j", 60, KF_STATE_VALUE, 1);
    fh_in_int64(c, a, "amount", 1);
    fh_expect_ok(running_sum(), c);
    cr_assert_eq(c->mutations[t].kind, FH_UNCHANGED);
    cr_assert_eq(fh_rows_of(c, t), 0);
    cr_assert_eq(c->out_count, 1);
    rs_expect_row(c, 0, a, "j", 60, 0, 2, "value");
    free(c);
}

/* A full batch: one row per row activation, in order, with the column
 * names looked up once for the call, not once per row. */
Test(running_sum, a_full_batch_looks_columns_up_once) {
    kf_call_t *c = rs_call(1);
    enum { N = 256 };
    for (uint32_t i = 0; i < N; i++) {
        char key[16];
        snprintf(key, sizeof key, "u%u", i);
        uint32_t a = fh_row(c, key, 1000 + i, i % 3 == 0 ? KF_STATE_ABSENT : KF_STATE_VALUE, i);
        fh_in_int64(c, a, "amount", 2);
    }
    fh_expect_ok(running_sum(), c);
    cr_assert_eq(c->out_count, N);
    for (uint32_t i = 0; i < N; i++) {
        char key[16];
        snprintf(key, sizeof key, "u%u", i);
        int64_t expected = (i % 3 == 0 ? 0 : i) + 2;
        rs_expect_row(c, i, i, key, 1000 + i, 0, expected, i % 3 == 0 ? "absent" : "value");
        cr_assert_eq(c->mutations[i].value, expected);
    }
    cr_assert_leq(c->input_lookups, 2, "input_column called %d times", c->input_lookups);
    cr_assert_leq(c->output_lookups, 4, "output_column called %d times", c->output_lookups);
    free(c);
}

Test(running_sum, empty_call_succeeds) {
    kf_call_t *c = rs_call(0);
    fh_expect_ok(running_sum(), c);
    cr_assert_eq(c->out_count, 0);
    free(c);
}

Test(running_sum, refuses_a_host_table_it_cannot_use) {
    const kf_handler_t *h = running_sum();
    kf_call_t *c = rs_call(0);
    uint32_t a = fh_row(c, "k", 1, KF_STATE_ABSENT, 0);
    fh_in_int64(c, a, "amount", 1);
    kf_host_t old = FH_HOST;
    old.size = (uint32_t)offsetof(kf_host_t, fail);
    cr_assert_neq(h->invoke(&old, c, c->acts, c->act_count), 0);
    kf_host_t other = FH_HOST;
    other.abi_version = KF_HANDLER_ABI_VERSION + 1;
    cr_assert_neq(h->invoke(&other, c, c->acts, c->act_count), 0);
    /* Nothing was touched through either table. */
    cr_assert_eq(c->input_lookups + c->output_lookups, 0);
    cr_assert_eq(c->mutations[a].kind, FH_UNCHANGED);
    free(c);
}

/* ---- session_counter ---------------------------------------------------- */

static const fh_column_t SC_IN[] = {
    {"user", FH_UTF8, 0},
    {"ts", FH_TS, 0},
    {"idle_us", FH_INT64, 1},
};
static const fh_column_t SC_IN_NO_IDLE[] = {
    {"user", FH_UTF8, 0},
    {"ts", FH_TS, 0},
};
static const fh_column_t SC_OUT[] = {
    {"key", FH_UTF8, 0},
    {"ts", FH_TS, 0},
    {"events", FH_INT64, 0},
};
static const char *const SC_TIMERS[] = {"idle"};

static kf_call_t *sc_call(int64_t watermark_us) {
    kf_call_t *c = fh_call_create(SC_IN, NCOLS(SC_IN), SC_OUT, NCOLS(SC_OUT), SC_TIMERS, 1);
    c->watermark_us = watermark_us;
    return c;
}

/* The one timer operation of `activation`: a set of "idle". */
static int64_t sc_idle_at(const kf_call_t *c, uint32_t activation) {
    const fh_timer_op_t *found = NULL;
    for (uint32_t i = 0; i < c->timer_op_count; i++) {
        if (c->timer_ops[i].activation == activation) {
            cr_assert_null(found, "activation %u has two timer operations", activation);
            found = &c->timer_ops[i];
        }
    }
    cr_assert_not_null(found, "activation %u set no timer", activation);
    cr_assert(!found->cancel);
    cr_assert_str_eq(found->name, "idle");
    return found->at_us;
}

Test(session_counter, exports_only_the_handler_table) {
    void *so = open_so(KF_TEST_SESSION_COUNTER_SO);
    cr_assert_null(dlsym(so, "invoke"), "invoke must be static");
}

Test(session_counter, first_row_counts_one_and_arms_idle) {
    kf_call_t *c = sc_call(INT64_MIN);
    uint32_t a = fh_row(c, "alice", 1000, KF_STATE_ABSENT, 0);
    fh_expect_ok(session_counter(), c);
    cr_assert_eq(c->mutations[a].kind, FH_SET);
    cr_assert_eq(c->mutations[a].value, 1);
    cr_assert_eq(sc_idle_at(c, a), 1000 + SIXTY_S_US);
    cr_assert_eq(c->out_count, 0, "rows emit nothing");
    free(c);
}

Test(session_counter, later_rows_count_up_and_re_arm) {
    kf_call_t *c = sc_call(500);
    uint32_t a = fh_row(c, "alice", 20000, KF_STATE_VALUE, 4);
    uint32_t b = fh_row(c, "bob", 30000, KF_STATE_VALUE, 1);
    fh_in_int64(c, b, "idle_us", 250);
    uint32_t d = fh_row(c, "dora", 40000, KF_STATE_ABSENT, 0);
    fh_in_int64(c, d, "idle_us", 0);
    fh_expect_ok(session_counter(), c);
    cr_assert_eq(c->mutations[a].value, 5);
    cr_assert_eq(c->mutations[b].value, 2);
    cr_assert_eq(c->mutations[d].value, 1);
    cr_assert_eq(sc_idle_at(c, a), 20000 + SIXTY_S_US, "null idle_us takes the default");
    cr_assert_eq(sc_idle_at(c, b), 30250);
    cr_assert_eq(sc_idle_at(c, d), 40000);
    cr_assert_eq(c->timer_op_count, 3);
    cr_assert_eq(c->out_count, 0);
    free(c);
}

Test(session_counter, idle_us_column_is_optional) {
    kf_call_t *c =
        fh_call_create(SC_IN_NO_IDLE, NCOLS(SC_IN_NO_IDLE), SC_OUT, NCOLS(SC_OUT), SC_TIMERS, 1);
    uint32_t a = fh_row(c, "k", 7, KF_STATE_ABSENT, 0);
    fh_expect_ok(session_counter(), c);
    cr_assert_eq(sc_idle_at(c, a), 7 + SIXTY_S_US);
    free(c);
}

Test(session_counter, late_rows_arm_just_after_the_watermark) {
    const int64_t watermark = 10 * SIXTY_S_US;
    kf_call_t *c = sc_call(watermark);
    uint32_t late = fh_row(c, "late", 1000, KF_STATE_VALUE, 2); /* idle at 1000 + 60 s */
    uint32_t edge = fh_row(c, "edge", watermark - SIXTY_S_US, KF_STATE_ABSENT, 0);
    uint32_t fresh = fh_row(c, "fresh", watermark + 1, KF_STATE_ABSENT, 0);
    uint32_t zero = fh_row(c, "zero", watermark, KF_STATE_ABSENT, 0);
    fh_in_int64(c, zero, "idle_us", 0);
    fh_expect_ok(session_counter(), c);
    cr_assert_eq(sc_idle_at(c, late), watermark + 1);
    cr_assert_eq(sc_idle_at(c, edge), watermark + 1, "exactly at the watermark is too early");
    cr_assert_eq(sc_idle_at(c, fresh), watermark + 1 + SIXTY_S_US);
    cr_assert_eq(sc_idle_at(c, zero), watermark + 1);
    cr_assert_eq(c->mutations[late].value, 3, "a late row still counts");
    free(c);
}

Test(session_counter, idle_time_saturates_instead_of_overflowing) {
    kf_call_t *c = sc_call(INT64_MIN);
    uint32_t a = fh_row(c, "k", INT64_MAX - 5, KF_STATE_ABSENT, 0);
    fh_expect_ok(session_counter(), c);
    cr_assert_eq(sc_idle_at(c, a), INT64_MAX);
    free(c);
}

Test(session_counter, bad_inputs_fail_the_call) {
    const kf_handler_t *h = session_counter();
    kf_call_t *c = sc_call(0);
    uint32_t a = fh_row(c, "neg", 100, KF_STATE_ABSENT, 0);
    fh_in_int64(c, a, "idle_us", -1);
    fh_expect_failure(h, c, "idle_us");
    free(c);

    c = sc_call(INT64_MAX);
    fh_row(c, "end", 100, KF_STATE_ABSENT, 0);
    fh_expect_failure(h, c, "watermark");
    free(c);

    c = sc_call(0);
    fh_row(c, "full", 100, KF_STATE_VALUE, INT64_MAX);
    fh_expect_failure(h, c, "overflow");
    free(c);

    static const fh_column_t no_events[] = {{"key", FH_UTF8, 0}, {"ts", FH_TS, 0}};
    c = fh_call_create(SC_IN, NCOLS(SC_IN), no_events, NCOLS(no_events), SC_TIMERS, 1);
    fh_row(c, "k", 100, KF_STATE_ABSENT, 0);
    fh_expect_failure(h, c, "'events'");
    free(c);
}

Test(session_counter, idle_timer_emits_the_summary_and_clears) {
    kf_call_t *c = sc_call(5 * SIXTY_S_US);
    uint32_t t = fh_timer(c, "alice", "idle", 2 * SIXTY_S_US, KF_STATE_VALUE, 3);
    uint32_t u = fh_timer(c, "ghost", "idle", 3 * SIXTY_S_US, KF_STATE_ABSENT, 0);
    fh_expect_ok(session_counter(), c);
    cr_assert_eq(c->out_count, 2);
    cr_assert_eq(c->out[0].activation, t);
    cr_assert_str_eq(fh_out(c, 0, "key")->text, "alice");
    cr_assert_eq(fh_out(c, 0, "ts")->i, 2 * SIXTY_S_US, "ts is the timer's time");
    cr_assert_eq(fh_out(c, 0, "events")->i, 3);
    cr_assert_eq(c->mutations[t].kind, FH_CLEAR);
    cr_assert_eq(c->out[1].activation, u);
    cr_assert_eq(fh_out(c, 1, "events")->i, 0, "an absent state counts zero events");
    cr_assert_eq(c->mutations[u].kind, FH_CLEAR);
    cr_assert_eq(c->timer_op_count, 0, "a fired timer is not re-armed");
    free(c);
}

Test(session_counter, unknown_timer_names_are_left_alone) {
    static const char *const timers[] = {"idle", "other"};
    kf_call_t *c = fh_call_create(SC_IN, NCOLS(SC_IN), SC_OUT, NCOLS(SC_OUT), timers, 2);
    uint32_t t = fh_timer(c, "k", "other", 10, KF_STATE_VALUE, 3);
    fh_expect_ok(session_counter(), c);
    cr_assert_eq(c->out_count, 0);
    cr_assert_eq(c->mutations[t].kind, FH_UNCHANGED);
    free(c);
}

/* A whole session through the handler, one call per step as the engine
 * runs it: three rows, the watermark passes the last idle time, the timer
 * fires with the count, then a new session starts from nothing. */
Test(session_counter, a_session_from_first_row_to_summary) {
    const kf_handler_t *h = session_counter();
    int32_t kind = KF_STATE_ABSENT;
    int64_t value = 0;
    int64_t due_us = 0;
    const int64_t times[] = {0, 10 * 1000000, 25 * 1000000};
    for (size_t i = 0; i < 3; i++) {
        kf_call_t *c = sc_call(i == 0 ? INT64_MIN : times[i] - 1);
        uint32_t a = fh_row(c, "s", times[i], kind, value);
        fh_expect_ok(h, c);
        cr_assert_eq(c->mutations[a].kind, FH_SET);
        kind = KF_STATE_VALUE;
        value = c->mutations[a].value;
        due_us = sc_idle_at(c, a); /* setting replaces: only the last counts */
        free(c);
    }
    cr_assert_eq(value, 3);
    cr_assert_eq(due_us, 25 * 1000000 + SIXTY_S_US);

    kf_call_t *c = sc_call(25 * 1000000);
    uint32_t t = fh_timer(c, "s", "idle", due_us, kind, value);
    fh_expect_ok(h, c);
    cr_assert_eq(c->out_count, 1);
    cr_assert_eq(fh_out(c, 0, "ts")->i, due_us);
    cr_assert_eq(fh_out(c, 0, "events")->i, 3);
    cr_assert_eq(c->mutations[t].kind, FH_CLEAR);
    free(c);

    c = sc_call(due_us);
    uint32_t a = fh_row(c, "s", due_us + 5, KF_STATE_ABSENT, 0);
    fh_expect_ok(h, c);
    cr_assert_eq(c->mutations[a].value, 1, "a new session starts from one");
    free(c);
}

Test(session_counter, a_full_batch_reads_the_call_once) {
    kf_call_t *c = sc_call(0);
    enum { N = 256 };
    for (uint32_t i = 0; i < N; i++) {
        char key[16];
        snprintf(key, sizeof key, "u%u", i);
        if (i % 2 == 0) {
            fh_row(c, key, 1000 + i, KF_STATE_VALUE, i);
        } else {
            fh_timer(c, key, "idle", 1, KF_STATE_VALUE, i);
        }
    }
    fh_expect_ok(session_counter(), c);
    cr_assert_eq(c->out_count, N / 2);
    cr_assert_eq(c->timer_op_count, N / 2);
    cr_assert_leq(c->input_lookups, 1);
    cr_assert_leq(c->output_lookups, 3);
    free(c);
}

/* ---- the descriptor files ----------------------------------------------- */

static void sha256_hex(const char *path, char out[65]) {
    unsigned char digest[32];
    int rc = mbedtls_md_file(mbedtls_md_info_from_type(MBEDTLS_MD_SHA256), path, digest);
    cr_assert_eq(rc, 0, "cannot hash %s", path);
    for (int i = 0; i < 32; i++) {
        snprintf(out + 2 * i, 3, "%02x", digest[i]);
    }
}

static json_t *load_descriptor(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.descriptor.json", KF_TEST_HANDLER_DIR, name);
    json_error_t error;
    json_t *d = json_load_file(path, JSON_REJECT_DUPLICATES, &error);
    cr_assert_not_null(d, "%s:%d: %s", path, error.line, error.text);
    return d;
}

static const char *json_str(json_t *obj, const char *field) {
    const char *s = json_string_value(json_object_get(obj, field));
    cr_assert_not_null(s, "descriptor field %s is not a string", field);
    return s;
}

static int field_type(const char *name) {
    static const char *const names[] = {NULL,
                                        "FIELD_TYPE_BOOL",
                                        "FIELD_TYPE_INT64",
                                        "FIELD_TYPE_FLOAT64",
                                        "FIELD_TYPE_UTF8",
                                        "FIELD_TYPE_BYTES",
                                        "FIELD_TYPE_TIMESTAMP_US"};
    for (int i = 1; i < 7; i++) {
        if (strcmp(names[i], name) == 0) {
            return i;
        }
    }
    cr_assert_fail("unknown field type %s", name);
    return 0;
}

/* The descriptor's schema as fake-host columns (names borrowed from json). */
static int schema_columns(json_t *d, const char *schema, fh_column_t *cols) {
    json_t *fields = json_object_get(json_object_get(d, schema), "fields");
    cr_assert(json_is_array(fields), "%s.fields", schema);
    cr_assert_leq(json_array_size(fields), FH_COLUMNS_MAX);
    size_t i;
    json_t *f;
    json_array_foreach(fields, i, f) {
        cr_assert(json_is_object(f));
        cols[i].name = json_str(f, "name");
        cols[i].type = field_type(json_str(f, "type"));
        json_t *nullable = json_object_get(f, "nullable");
        cols[i].nullable = nullable != NULL && json_is_true(nullable);
    }
    return (int)json_array_size(fields);
}

static void expect_column(const fh_column_t *cols, int n, const char *name, int type,
                          int nullable) {
    int i = fh_lookup(cols, n, name);
    cr_assert_geq(i, 0, "descriptor lacks column %s", name);
    cr_assert_eq(cols[i].type, type, "column %s type", name);
    cr_assert_eq(cols[i].nullable, nullable, "column %s nullable", name);
}

/* The fields every native descriptor needs, checked the same way for both. */
static void check_descriptor_common(json_t *d, const char *name, const char *so) {
    char hex[65];
    sha256_hex(so, hex);
    cr_assert_str_eq(json_str(d, "implementationDigest"), hex,
                     "the descriptor's digest is not the SHA-256 of %s", so);
    cr_assert_eq(json_integer_value(json_object_get(d, "version")), 1);
    cr_assert_str_eq(json_str(d, "functionId"), name);
    cr_assert_str_eq(json_str(d, "runtime"), "RUNTIME_NATIVE");
    cr_assert_str_eq(json_str(d, "determinism"), "DETERMINISM_REPLAY_SAFE");
    fh_column_t in[FH_COLUMNS_MAX];
    fh_column_t out[FH_COLUMNS_MAX];
    int n_in = schema_columns(d, "inputSchema", in);
    int n_out = schema_columns(d, "outputSchema", out);
    json_t *keys = json_object_get(d, "keyColumns");
    cr_assert(json_is_array(keys) && json_array_size(keys) == 1);
    expect_column(in, n_in, json_string_value(json_array_get(keys, 0)), FH_UTF8, 0);
    expect_column(in, n_in, json_str(d, "eventTimeColumn"), FH_TS, 0);
    expect_column(out, n_out, json_str(d, "outputEventTimeColumn"), FH_TS, 0);
    expect_column(out, n_out, "key", FH_UTF8, 0);
}

Test(descriptors, running_sum_matches_its_so_and_its_handler) {
    json_t *d = load_descriptor("running_sum");
    check_descriptor_common(d, "running_sum", KF_TEST_RUNNING_SUM_SO);
    cr_assert_str_eq(json_str(d, "valueStateName"), "sum");
    cr_assert_eq(json_array_size(json_object_get(d, "timerNames")), 0);

    /* The descriptor's own schemas drive the handler without a failure. */
    fh_column_t in[FH_COLUMNS_MAX];
    fh_column_t out[FH_COLUMNS_MAX];
    int n_in = schema_columns(d, "inputSchema", in);
    int n_out = schema_columns(d, "outputSchema", out);
    expect_column(in, n_in, "amount", FH_INT64, 1);
    expect_column(out, n_out, "sum", FH_INT64, 1);
    expect_column(out, n_out, "previous", FH_UTF8, 0);
    kf_call_t *c = fh_call_create(in, n_in, out, n_out, NULL, 0);
    uint32_t a = fh_row(c, "u", 5, KF_STATE_VALUE, 1);
    fh_in_int64(c, a, "amount", 2);
    fh_row(c, "v", 6, KF_STATE_ABSENT, 0); /* null amount */
    fh_expect_ok(running_sum(), c);
    cr_assert_eq(c->out_count, 2);
    free(c);
    json_decref(d);
}

Test(descriptors, session_counter_matches_its_so_and_its_handler) {
    json_t *d = load_descriptor("session_counter");
    check_descriptor_common(d, "session_counter", KF_TEST_SESSION_COUNTER_SO);
    cr_assert_str_eq(json_str(d, "valueStateName"), "events");
    json_t *timers = json_object_get(d, "timerNames");
    cr_assert_eq(json_array_size(timers), 1);
    cr_assert_str_eq(json_string_value(json_array_get(timers, 0)), "idle");

    fh_column_t in[FH_COLUMNS_MAX];
    fh_column_t out[FH_COLUMNS_MAX];
    int n_in = schema_columns(d, "inputSchema", in);
    int n_out = schema_columns(d, "outputSchema", out);
    expect_column(in, n_in, "idle_us", FH_INT64, 1);
    expect_column(out, n_out, "events", FH_INT64, 0);
    kf_call_t *c = fh_call_create(in, n_in, out, n_out, SC_TIMERS, 1);
    c->watermark_us = 0;
    fh_row(c, "u", 5, KF_STATE_VALUE, 1);
    fh_timer(c, "v", "idle", 6, KF_STATE_VALUE, 4);
    fh_expect_ok(session_counter(), c);
    cr_assert_eq(c->out_count, 1);
    cr_assert_eq(c->timer_op_count, 1);
    free(c);
    json_decref(d);
}
