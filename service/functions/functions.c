/*
 * functions.c - registry, state, timers and steps of process functions.
 * See functions.h for the step and its invariants.
 *
 * Stored layout (prefix = the function's index, u32 big-endian):
 *   functions       function_id                         -> FunctionRec
 *   checkpoints     prefix                              -> CheckpointRec
 *   state           prefix | canonical key              -> kind u8 | value be64
 *   timers_by_key   prefix | lp(key) | lp(name)         -> ord(at_us) be64
 *   timers_by_time  prefix | ord(at_us) | lp(key) | lp(name) -> (empty)
 *   output          prefix | last_seq be64              -> RowBatch (a chunk)
 *   producers       prefix | producer_id                -> ProducerRec
 *
 * Undo: the first time a step touches a key it snapshots the key (state and
 * timers). Commit diffs each touched key against its snapshot and writes
 * only what changed; rollback restores the snapshots and the function's
 * counters, so a refused step leaves memory exactly as it found it.
 */
#include "functions/functions.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/assert.h"
#include "base/bytes.h"
#include "base/log.h"
#include "base/map.h"
#include "base/metrics.h"
#include "base/pq.h"
#include "base/text.h"
#include "functions/descriptor.h"
#include "functions/plugin.h"
#include "functions/rows.h"
#include "keyflow/handler.h"
#include "records/records.pb-c.h"

#define NO_TIME             INT64_MIN
#define STATE_CODEC_VERSION 2

/* ---- in-memory structures ---------------------------------------------- */

typedef struct function function_t;
static bool key_text_of(const function_t *fn, const uint8_t *key, size_t len, char **text,
                        size_t *text_len);

typedef struct fn_key fn_key_t;
typedef struct step step_t;

typedef struct ev_timer {
    fn_key_t *owner;
    uint8_t name; /* index into the descriptor's timer_names */
    int64_t at_us;
    kf_pq_node_t node; /* position in the function's timer queue */
} ev_timer_t;

struct fn_key {
    kf_map_node_t node; /* by canonical key */
    uint8_t *key;       /* canonical key, owned */
    uint32_t key_len;
    char *key_text; /* owned */
    uint32_t key_text_len;
    uint8_t state; /* KF_STATE_* */
    int64_t value;
    ev_timer_t **timers; /* one slot per timer name, NULL until needed */
    uint32_t step_mark;  /* the step that snapshotted this key */
    uint32_t call_mark;  /* the handler call that holds this key */
};

typedef struct producer {
    kf_map_node_t node;
    char *id;
    int64_t last_sequence;
    uint32_t nacks; /* ring of the last acks, oldest first */
    int64_t ack_seq[KF_PRODUCER_ACKS_KEPT];
    uint8_t *ack[KF_PRODUCER_ACKS_KEPT];
    size_t ack_len[KF_PRODUCER_ACKS_KEPT];
} producer_t;

typedef struct reader {
    kf_cmd_t *cmd;
    function_t *fn;
    kf_timer_t timer;
    struct reader *next;
    struct reader *prev;
} reader_t;

struct function {
    kf_map_node_t node; /* by function_id */
    char *id;
    uint32_t index;
    kf_arena_t arena; /* the canonical descriptor lives here */
    Keyflow__V1__FunctionDescriptor *desc;
    char sha256[KF_SHA256_HEX_BYTES + 1];
    int64_t created_ms;
    kf_fn_limits_t limits;
    int key_cols[KF_KEY_COLUMNS_MAX];
    int nkey_cols;
    int event_col;
    int out_event_col;
    const kf_handler_t *handler; /* NULL: unavailable */
    char unavailable[KF_ERROR_MESSAGE_BYTES_MAX];
    kf_map_t keys;
    uint64_t live_keys; /* keys with state or timers */
    uint64_t timer_count;
    uint64_t state_bytes;
    kf_pq_t timers; /* event-time timers, (at_us, key, name) order */
    bool has_watermark;
    int64_t watermark_us;
    uint64_t next_activation;
    uint64_t output_seq;         /* last written */
    uint64_t durable_output_seq; /* last durable */
    kf_map_t producers;
    reader_t *readers;    /* parked reads */
    struct step *active;  /* the step in progress (its call may be out) */
    kf_cmd_t *queue_head; /* PushBatch commands waiting for `active` */
    kf_cmd_t *queue_tail;
    uint32_t queued;
};

typedef struct pending_durable {
    function_t *fn;
    uint64_t group;
    uint64_t output_seq;
} pending_durable_t;

struct kf_functions {
    kf_map_t by_id;
    kf_plugins_t *plugins;
    uint32_t next_index;
    uint32_t step_counter;
    uint32_t call_counter;
    pending_durable_t *pending; /* output written in groups not yet durable */
    size_t npending;
    size_t pending_cap;
    uint32_t nreaders;
    uint8_t *scratch; /* canonical key building */
    size_t scratch_cap;
    bool defer_calls; /* test seam: native calls answer on pump() */
};

static const char fn_index_key[] = "fn_index";

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    KF_ASSERT(p != NULL);
    return p;
}

static void key_prefix(kf_key_t *k, const function_t *fn) {
    kf_key_reset(k);
    uint8_t b[4];
    kf_put_be32(b, fn->index);
    kf_key_raw(k, b, 4);
}

/* ---- event-time timer heap -------------------------------------------- */

static int key_cmp(const fn_key_t *a, const fn_key_t *b) {
    uint32_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
    int c = memcmp(a->key, b->key, n);
    if (c != 0) {
        return c;
    }
    return a->key_len < b->key_len ? -1 : a->key_len > b->key_len;
}

static bool ev_before(const kf_pq_node_t *an, const kf_pq_node_t *bn, const void *ctx) {
    const function_t *fn = ctx;
    const ev_timer_t *a = KF_CONTAINER_OF(an, ev_timer_t, node);
    const ev_timer_t *b = KF_CONTAINER_OF(bn, ev_timer_t, node);
    if (a->at_us != b->at_us) {
        return a->at_us < b->at_us;
    }
    int c = key_cmp(a->owner, b->owner);
    if (c != 0) {
        return c < 0;
    }
    return strcmp(fn->desc->timer_names[a->name], fn->desc->timer_names[b->name]) < 0;
}

/* The earliest event-time timer, or NULL. */
static ev_timer_t *ev_top(const function_t *fn) {
    kf_pq_node_t *n = kf_pq_top(&fn->timers);
    return n ? KF_CONTAINER_OF(n, ev_timer_t, node) : NULL;
}

/* ---- keys -------------------------------------------------------------- */

static bool key_live(const function_t *fn, const fn_key_t *k) {
    if (k->state != KF_STATE_ABSENT) {
        return true;
    }
    for (size_t i = 0; k->timers != NULL && i < fn->desc->n_timer_names; i++) {
        if (k->timers[i] != NULL) {
            return true;
        }
    }
    return false;
}

static uint64_t state_cost(const fn_key_t *k) {
    return k->state == KF_STATE_ABSENT ? 0 : (uint64_t)k->key_len + 9;
}

static fn_key_t *key_find(function_t *fn, const uint8_t *key, size_t len) {
    kf_map_node_t *n = kf_map_get(&fn->keys, key, len);
    return n ? KF_CONTAINER_OF(n, fn_key_t, node) : NULL;
}

static fn_key_t *key_new(function_t *fn, const uint8_t *key, size_t len, const char *text,
                         size_t text_len) {
    fn_key_t *k = calloc(1, sizeof *k);
    KF_ASSERT(k != NULL);
    k->key = xmalloc(len);
    memcpy(k->key, key, len);
    k->key_len = (uint32_t)len;
    k->key_text = xmalloc(text_len + 1);
    memcpy(k->key_text, text, text_len);
    k->key_text[text_len] = '\0';
    k->key_text_len = (uint32_t)text_len;
    k->state = KF_STATE_ABSENT;
    kf_map_insert(&fn->keys, &k->node, k->key, k->key_len);
    return k;
}

static void key_free(function_t *fn, fn_key_t *k) {
    for (size_t i = 0; k->timers != NULL && i < fn->desc->n_timer_names; i++) {
        free(k->timers[i]);
    }
    free(k->timers);
    free(k->key);
    free(k->key_text);
    free(k);
}

/* Sets or clears one timer of a key, keeping heap and counters in step. */
static void key_set_timer(function_t *fn, fn_key_t *k, uint8_t name, int64_t at_us) {
    if (k->timers == NULL) {
        if (at_us == NO_TIME) {
            return;
        }
        k->timers = calloc(fn->desc->n_timer_names, sizeof *k->timers);
        KF_ASSERT(k->timers != NULL);
    }
    ev_timer_t *t = k->timers[name];
    bool was_live = key_live(fn, k);
    if (at_us == NO_TIME) {
        if (t != NULL) {
            kf_pq_remove(&fn->timers, &t->node);
            free(t);
            k->timers[name] = NULL;
            fn->timer_count--;
        }
    } else if (t != NULL) {
        kf_pq_remove(&fn->timers, &t->node);
        t->at_us = at_us;
        kf_pq_push(&fn->timers, &t->node);
    } else {
        t = calloc(1, sizeof *t);
        KF_ASSERT(t != NULL);
        t->owner = k;
        t->name = name;
        t->at_us = at_us;
        kf_pq_node_init(&t->node);
        kf_pq_push(&fn->timers, &t->node);
        k->timers[name] = t;
        fn->timer_count++;
    }
    bool live = key_live(fn, k);
    fn->live_keys += (uint64_t)live - (uint64_t)was_live;
}

static void key_set_state(function_t *fn, fn_key_t *k, uint8_t state, int64_t value) {
    bool was_live = key_live(fn, k);
    fn->state_bytes -= state_cost(k);
    k->state = state;
    k->value = state == KF_STATE_VALUE ? value : 0;
    fn->state_bytes += state_cost(k);
    bool live = key_live(fn, k);
    fn->live_keys += (uint64_t)live - (uint64_t)was_live;
}

/* The canonical key of input row `row`: per key column, u32 BE length and
 * the UTF-8 bytes. Key text: the value for one key column, else a JSON
 * array of the values. Both point into fns->scratch / a malloc'd text. */
static size_t row_key(kf_functions_t *fns, const function_t *fn, const kf_rows_t *rows,
                      uint32_t row, char **text, size_t *text_len, bool *text_owned) {
    size_t need = 0;
    for (int c = 0; c < fn->nkey_cols; c++) {
        need += 4 + rows->cols[fn->key_cols[c]].str_len[row];
    }
    if (need > fns->scratch_cap) {
        fns->scratch_cap = need * 2;
        fns->scratch = realloc(fns->scratch, fns->scratch_cap);
        KF_ASSERT(fns->scratch != NULL);
    }
    size_t o = 0;
    for (int c = 0; c < fn->nkey_cols; c++) {
        const kf_column_t *col = &rows->cols[fn->key_cols[c]];
        uint32_t len = col->str_len[row];
        kf_put_be32(fns->scratch + o, len);
        memcpy(fns->scratch + o + 4, col->str[row], len);
        o += 4 + len;
    }
    if (fn->nkey_cols == 1) {
        *text = rows->cols[fn->key_cols[0]].str[row];
        *text_len = rows->cols[fn->key_cols[0]].str_len[row];
        *text_owned = false;
    } else {
        json_t *arr = json_array();
        for (int c = 0; c < fn->nkey_cols; c++) {
            const kf_column_t *col = &rows->cols[fn->key_cols[c]];
            json_array_append_new(arr, json_stringn(col->str[row], col->str_len[row]));
        }
        *text = json_dumps(arr, JSON_COMPACT);
        json_decref(arr);
        KF_ASSERT(*text != NULL);
        *text_len = strlen(*text);
        *text_owned = true;
    }
    return o;
}

/* ---- steps: undo ------------------------------------------------------- */

typedef struct undo {
    fn_key_t *key;
    bool existed;
    uint8_t state;
    int64_t value;
    int64_t at[KF_TIMER_NAMES_MAX];
} undo_t;

struct step {
    kf_functions_t *fns;
    function_t *fn;
    kf_ctx_t *ctx;
    kf_arena_t *arena;
    const kf_rows_t *rows;
    int64_t watermark; /* for timer validation and the handler */
    bool has_watermark;
    uint32_t mark;
    undo_t *undo;
    size_t nundo;
    size_t undo_cap;
    kf_outbuf_t out; /* every output row of the step */
    /* function counters at the start, restored on rollback */
    uint64_t live_keys0, timer_count0, state_bytes0, next_activation0;
    int64_t activations;
    int64_t timer_callbacks;
    int64_t calls;
    kf_error_t *err;
    /* The step as a resumable machine: one handler call out at a time. */
    kf_cmd_t *cmd; /* the PushBatch being answered */
    const Keyflow__V1__PushBatchRequest *req;
    kf_rows_t rows_storage;
    kf_call_t *call;
    bool timers_phase; /* rows done, watermark advanced */
    uint32_t row_pos;  /* next input row */
    bool awaiting;     /* a call is out, its response not yet taken */
};

static void touch(step_t *s, fn_key_t *k, bool existed) {
    if (k->step_mark == s->mark) {
        return;
    }
    k->step_mark = s->mark;
    if (s->nundo == s->undo_cap) {
        s->undo_cap = s->undo_cap ? s->undo_cap * 2 : 256;
        s->undo = realloc(s->undo, s->undo_cap * sizeof *s->undo);
        KF_ASSERT(s->undo != NULL);
    }
    undo_t *u = &s->undo[s->nundo++];
    u->key = k;
    u->existed = existed;
    u->state = k->state;
    u->value = k->value;
    for (size_t i = 0; i < s->fn->desc->n_timer_names; i++) {
        u->at[i] = k->timers && k->timers[i] ? k->timers[i]->at_us : NO_TIME;
    }
}

static void rollback(step_t *s) {
    function_t *fn = s->fn;
    for (size_t i = s->nundo; i-- > 0;) {
        undo_t *u = &s->undo[i];
        fn_key_t *k = u->key;
        for (size_t t = 0; t < fn->desc->n_timer_names; t++) {
            key_set_timer(fn, k, (uint8_t)t, u->at[t]);
        }
        key_set_state(fn, k, u->state, u->value);
        k->step_mark = 0;
        if (!u->existed) {
            kf_map_remove(&fn->keys, &k->node);
            key_free(fn, k);
        }
    }
    fn->live_keys = s->live_keys0;
    fn->timer_count = s->timer_count0;
    fn->state_bytes = s->state_bytes0;
    fn->next_activation = s->next_activation0;
}

/* ---- handler calls: the host side of keyflow/handler.h ---------------- */

enum { MUT_UNCHANGED, MUT_SET, MUT_SET_NULL, MUT_CLEAR };
enum { TOP_SET = 1, TOP_CANCEL = 2 };

typedef struct result {
    uint8_t mutation;
    uint8_t mutations; /* how many mutations were asked for */
    int64_t value;
} result_t;

typedef struct timer_op {
    uint32_t act;
    uint8_t op;
    int name; /* index, or -1: undeclared */
    int64_t at_us;
} timer_op_t;

struct kf_call {
    step_t *step;
    kf_activation_t *acts;
    fn_key_t **keys;
    uint32_t count;
    uint32_t cap;
    result_t *res;
    timer_op_t *tops;
    uint32_t ntops;
    uint32_t tops_cap;
    kf_outbuf_t out;   /* this call's output rows */
    uint32_t *row_act; /* activation of each output row */
    uint32_t row_act_cap;
    int cur_row; /* the row being built, or -1 */
    bool failed;
    kf_status_t fail_status;
    char message[KF_ERROR_MESSAGE_BYTES_MAX];
};

__attribute__((format(printf, 3, 4))) static int call_fail(kf_call_t *call, kf_status_t st,
                                                           const char *fmt, ...) {
    if (!call->failed) {
        call->failed = true;
        call->fail_status = st;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(call->message, sizeof call->message, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int64_t host_watermark(const kf_call_t *call) {
    return call->step->has_watermark ? call->step->watermark : INT64_MIN;
}

static int host_input_column(const kf_call_t *call, const char *name) {
    return kf_schema_find(call->step->fn->desc->input_schema, name);
}

static int host_output_column(const kf_call_t *call, const char *name) {
    return kf_schema_find(call->step->fn->desc->output_schema, name);
}

static const kf_column_t *in_col(const kf_call_t *call, uint32_t row, int column) {
    const kf_rows_t *rows = call->step->rows;
    if (rows == NULL || row >= rows->count || column < 0 || (uint32_t)column >= rows->ncols) {
        return NULL;
    }
    return &rows->cols[column];
}

static int host_input_is_null(const kf_call_t *call, uint32_t row, int column) {
    const kf_column_t *c = in_col(call, row, column);
    return c == NULL || (c->nulls != NULL && c->nulls[row]);
}

static int64_t host_input_int64(const kf_call_t *call, uint32_t row, int column) {
    const kf_column_t *c = in_col(call, row, column);
    return c && c->i64 && !(c->nulls && c->nulls[row]) ? c->i64[row] : 0;
}

static double host_input_float64(const kf_call_t *call, uint32_t row, int column) {
    const kf_column_t *c = in_col(call, row, column);
    return c && c->f64 && !(c->nulls && c->nulls[row]) ? c->f64[row] : 0.0;
}

static int host_input_bool(const kf_call_t *call, uint32_t row, int column) {
    const kf_column_t *c = in_col(call, row, column);
    return c && c->b && !(c->nulls && c->nulls[row]) ? c->b[row] != 0 : 0;
}

static const char *host_input_utf8(const kf_call_t *call, uint32_t row, int column, size_t *len) {
    const kf_column_t *c = in_col(call, row, column);
    if (c == NULL || c->str == NULL || (c->nulls && c->nulls[row])) {
        *len = 0;
        return NULL;
    }
    *len = c->str_len[row];
    return c->str[row];
}

static const uint8_t *host_input_bytes(const kf_call_t *call, uint32_t row, int column,
                                       size_t *len) {
    const kf_column_t *c = in_col(call, row, column);
    if (c == NULL || c->bin == NULL || (c->nulls && c->nulls[row])) {
        *len = 0;
        return NULL;
    }
    *len = c->bin[row].len;
    return c->bin[row].data;
}

static int check_act(kf_call_t *call, uint32_t act, const char *what) {
    if (act >= call->count) {
        return call_fail(call, KF_E_PRECONDITION, "%s: activation index %u, the call has %u", what,
                         act, call->count);
    }
    return 0;
}

static int host_row_begin(kf_call_t *call, uint32_t act) {
    if (check_act(call, act, "row_begin") != 0) {
        return -1;
    }
    if (call->cur_row >= 0) {
        return call_fail(call, KF_E_PRECONDITION, "row_begin: the previous row was not ended");
    }
    if (call->out.rows >= (uint32_t)call->step->fn->limits.max_output_rows) {
        return call_fail(call, KF_E_LIMIT,
                         "max_output_rows: more than %lld output rows in one call",
                         (long long)call->step->fn->limits.max_output_rows);
    }
    if (kf_outbuf_add_row(&call->out) == NULL) {
        return call_fail(call, KF_E_LIMIT, "output: out of memory for this step");
    }
    if (call->out.rows > call->row_act_cap) {
        uint32_t cap = call->row_act_cap ? call->row_act_cap * 2 : 256;
        uint32_t *p = kf_arena_alloc(call->step->arena, cap * sizeof *p);
        if (p == NULL) {
            return call_fail(call, KF_E_LIMIT, "output: out of memory for this step");
        }
        if (call->row_act_cap) {
            memcpy(p, call->row_act, call->row_act_cap * sizeof *p);
        }
        call->row_act = p;
        call->row_act_cap = cap;
    }
    call->row_act[call->out.rows - 1] = act;
    call->cur_row = (int)call->out.rows - 1;
    return 0;
}

/* The cell being set, after checking the column and its type. */
static kf_cell_t *out_cell(kf_call_t *call, int column, Keyflow__V1__FieldType want1,
                           Keyflow__V1__FieldType want2, const char *what) {
    if (call->cur_row < 0) {
        call_fail(call, KF_E_PRECONDITION, "%s: no row begun", what);
        return NULL;
    }
    const Keyflow__V1__Schema *s = call->step->fn->desc->output_schema;
    if (column < 0 || (size_t)column >= s->n_fields) {
        call_fail(call, KF_E_PRECONDITION, "%s: output column %d does not exist", what, column);
        return NULL;
    }
    Keyflow__V1__FieldType t = s->fields[column]->type;
    if (want1 != 0 && t != want1 && t != want2) {
        call_fail(call, KF_E_PRECONDITION, "%s: output column %s is not of that type", what,
                  s->fields[column]->name);
        return NULL;
    }
    return &kf_outbuf_row(&call->out, (uint32_t)call->cur_row)[column];
}

static int host_row_set_null(kf_call_t *call, int column) {
    kf_cell_t *c = out_cell(call, column, 0, 0, "row_set_null");
    if (c == NULL) {
        return -1;
    }
    c->set = 1;
    c->null = 1;
    return 0;
}

static int host_row_set_int64(kf_call_t *call, int column, int64_t value) {
    kf_cell_t *c = out_cell(call, column, KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64,
                            KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US, "row_set_int64");
    if (c == NULL) {
        return -1;
    }
    c->set = 1;
    c->null = 0;
    c->v.i = value;
    return 0;
}

static int host_row_set_float64(kf_call_t *call, int column, double value) {
    kf_cell_t *c = out_cell(call, column, KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64,
                            KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64, "row_set_float64");
    if (c == NULL) {
        return -1;
    }
    c->set = 1;
    c->null = 0;
    c->v.f = value;
    return 0;
}

static int host_row_set_bool(kf_call_t *call, int column, int value) {
    kf_cell_t *c = out_cell(call, column, KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BOOL,
                            KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BOOL, "row_set_bool");
    if (c == NULL) {
        return -1;
    }
    c->set = 1;
    c->null = 0;
    c->v.i = value != 0;
    return 0;
}

static int set_bytes(kf_call_t *call, int column, const void *value, size_t len,
                     Keyflow__V1__FieldType type, const char *what) {
    kf_cell_t *c = out_cell(call, column, type, type, what);
    if (c == NULL) {
        return -1;
    }
    if (value == NULL && len > 0) {
        return call_fail(call, KF_E_PRECONDITION, "%s: NULL value with length %zu", what, len);
    }
    if (type == KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8 &&
        (!kf_utf8_valid(value, len) || (len > 0 && memchr(value, 0, len) != NULL))) {
        return call_fail(call, KF_E_PRECONDITION, "%s: not valid UTF-8 without NUL bytes", what);
    }
    /* Checked as values arrive, not only when the call returns: every
     * copy (overwrites included) lives in the step's arena until the step
     * ends, so a handler must not be able to fill it. */
    int64_t limit = call->step->fn->limits.max_output_bytes;
    if ((int64_t)(call->out.bytes + len) > limit) {
        return call_fail(call, KF_E_LIMIT,
                         "max_output_bytes: one handler call produced more than %lld bytes; "
                         "nothing applied",
                         (long long)limit);
    }
    char *copy = kf_arena_alloc(call->step->arena, len + 1);
    if (copy == NULL) {
        return call_fail(call, KF_E_LIMIT, "output: out of memory for this step");
    }
    if (len > 0) {
        memcpy(copy, value, len);
    }
    copy[len] = '\0';
    c->set = 1;
    c->null = 0;
    c->p = copy;
    c->len = (uint32_t)len;
    call->out.bytes += len;
    return 0;
}

static int host_row_set_utf8(kf_call_t *call, int column, const char *value, size_t len) {
    return set_bytes(call, column, value, len, KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8,
                     "row_set_utf8");
}

static int host_row_set_bytes(kf_call_t *call, int column, const uint8_t *value, size_t len) {
    return set_bytes(call, column, value, len, KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BYTES,
                     "row_set_bytes");
}

static int host_row_end(kf_call_t *call) {
    if (call->cur_row < 0) {
        return call_fail(call, KF_E_PRECONDITION, "row_end: no row begun");
    }
    call->out.bytes += 8u * call->out.ncols;
    call->cur_row = -1;
    return 0;
}

static int mutate(kf_call_t *call, uint32_t act, uint8_t mutation, int64_t value,
                  const char *what) {
    if (check_act(call, act, what) != 0) {
        return -1;
    }
    result_t *r = &call->res[act];
    if (++r->mutations > 1) {
        return call_fail(call, KF_E_PRECONDITION,
                         "%s: activation %" PRIu64
                         " already has a state mutation (one per activation)",
                         what, call->acts[act].id);
    }
    r->mutation = mutation;
    r->value = value;
    return 0;
}

static int host_state_set(kf_call_t *call, uint32_t act, int64_t value) {
    return mutate(call, act, MUT_SET, value, "state_set");
}
static int host_state_set_null(kf_call_t *call, uint32_t act) {
    return mutate(call, act, MUT_SET_NULL, 0, "state_set_null");
}
static int host_state_clear(kf_call_t *call, uint32_t act) {
    return mutate(call, act, MUT_CLEAR, 0, "state_clear");
}

static int timer_op(kf_call_t *call, uint32_t act, const char *name, uint8_t op, int64_t at_us,
                    const char *what) {
    if (check_act(call, act, what) != 0) {
        return -1;
    }
    const Keyflow__V1__FunctionDescriptor *d = call->step->fn->desc;
    int idx = -1;
    for (size_t i = 0; name != NULL && i < d->n_timer_names; i++) {
        if (strcmp(d->timer_names[i], name) == 0) {
            idx = (int)i;
        }
    }
    if (idx < 0) {
        return call_fail(call, KF_E_PRECONDITION,
                         "%s: timer \"%.64s\" is not declared in timer_names", what,
                         name ? name : "(null)");
    }
    /* Before the first watermark, watermark_us() is INT64_MIN: nothing is
     * after it but a real time (INT64_MIN also means "no timer" inside). */
    int64_t watermark = call->step->has_watermark ? call->step->watermark : INT64_MIN;
    if (op == TOP_SET && at_us <= watermark) {
        return call_fail(call, KF_E_PRECONDITION,
                         "%s: timer \"%s\" at %" PRId64 " us is not after the watermark %" PRId64,
                         what, name, at_us, watermark);
    }
    if (call->ntops >= KF_FN_TIMER_OPS_PER_CALL_MAX) {
        return call_fail(call, KF_E_LIMIT, "%s: more than %d timer operations in one call", what,
                         KF_FN_TIMER_OPS_PER_CALL_MAX);
    }
    if (call->ntops == call->tops_cap) {
        uint32_t cap = call->tops_cap ? call->tops_cap * 2 : 64;
        timer_op_t *p = kf_arena_alloc(call->step->arena, cap * sizeof *p);
        if (p == NULL) {
            return call_fail(call, KF_E_LIMIT, "timers: out of memory for this step");
        }
        if (call->tops_cap) {
            memcpy(p, call->tops, call->tops_cap * sizeof *p);
        }
        call->tops = p;
        call->tops_cap = cap;
    }
    call->tops[call->ntops++] = (timer_op_t){act, op, idx, at_us};
    return 0;
}

static int host_timer_set(kf_call_t *call, uint32_t act, const char *name, int64_t at_us) {
    return timer_op(call, act, name, TOP_SET, at_us, "timer_set");
}
static int host_timer_cancel(kf_call_t *call, uint32_t act, const char *name) {
    return timer_op(call, act, name, TOP_CANCEL, 0, "timer_cancel");
}
static void host_fail(kf_call_t *call, const char *message) {
    call_fail(call, KF_E_PRECONDITION, "handler refused the call: %.300s", message ? message : "");
}

static const kf_host_t host = {
    .abi_version = KF_HANDLER_ABI_VERSION,
    .size = sizeof(kf_host_t),
    .watermark_us = host_watermark,
    .input_column = host_input_column,
    .output_column = host_output_column,
    .input_is_null = host_input_is_null,
    .input_int64 = host_input_int64,
    .input_float64 = host_input_float64,
    .input_bool = host_input_bool,
    .input_utf8 = host_input_utf8,
    .input_bytes = host_input_bytes,
    .row_begin = host_row_begin,
    .row_set_null = host_row_set_null,
    .row_set_int64 = host_row_set_int64,
    .row_set_float64 = host_row_set_float64,
    .row_set_bool = host_row_set_bool,
    .row_set_utf8 = host_row_set_utf8,
    .row_set_bytes = host_row_set_bytes,
    .row_end = host_row_end,
    .state_set = host_state_set,
    .state_set_null = host_state_set_null,
    .state_clear = host_state_clear,
    .timer_set = host_timer_set,
    .timer_cancel = host_timer_cancel,
    .fail = host_fail,
};

/* ---- calls: build, dispatch, validate, apply --------------------------- */

static void call_init(kf_call_t *call, step_t *s, uint32_t cap) {
    memset(call, 0, sizeof *call);
    call->step = s;
    call->cap = cap;
    call->acts = kf_arena_new(s->arena, cap * sizeof *call->acts);
    call->keys = kf_arena_new(s->arena, cap * sizeof *call->keys);
    call->res = kf_arena_new(s->arena, cap * sizeof *call->res);
    kf_outbuf_init(&call->out, s->fn->desc->output_schema, s->arena);
    call->cur_row = -1;
}

static void call_reset(kf_call_t *call) {
    call->count = 0;
    call->ntops = 0;
    call->out.rows = 0;
    call->out.bytes = 0;
    call->cur_row = -1;
    call->failed = false;
    memset(call->res, 0, call->cap * sizeof *call->res);
}

static void call_add(kf_call_t *call, fn_key_t *k, int32_t callback, uint32_t row,
                     int64_t event_time_us, const char *timer_name) {
    step_t *s = call->step;
    KF_ASSERT(call->count < call->cap);
    kf_activation_t *a = &call->acts[call->count];
    a->id = s->fn->next_activation++;
    a->key = k->key;
    a->key_len = k->key_len;
    a->key_text = k->key_text;
    a->key_text_len = k->key_text_len;
    a->event_time_us = event_time_us;
    a->callback = callback;
    a->row = row;
    a->timer_name = timer_name;
    a->state_kind = k->state;
    a->state_value = k->value;
    call->keys[call->count] = k;
    call->count++;
}

/* Checks the whole response (invariant 1) before anything is applied. */
static kf_status_t validate(kf_call_t *call) {
    step_t *s = call->step;
    function_t *fn = s->fn;
    if (call->failed) {
        return kf_error_set(s->err, call->fail_status,
                            "handler response rejected, nothing applied: %s", call->message);
    }
    if (call->cur_row >= 0) {
        return kf_error_set(
            s->err, KF_E_PRECONDITION,
            "handler response rejected, nothing applied: an output row was begun but "
            "not ended");
    }
    if ((int64_t)call->out.bytes > fn->limits.max_output_bytes) {
        return kf_error_set(s->err, KF_E_LIMIT,
                            "max_output_bytes: one handler call produced %llu bytes (limit %lld); "
                            "nothing applied",
                            (unsigned long long)call->out.bytes,
                            (long long)fn->limits.max_output_bytes);
    }
    const Keyflow__V1__Schema *os = fn->desc->output_schema;
    for (uint32_t r = 0; r < call->out.rows; r++) {
        const kf_cell_t *cells = kf_outbuf_row(&call->out, r);
        const kf_activation_t *a = &call->acts[call->row_act[r]];
        for (size_t c = 0; c < os->n_fields; c++) {
            if (!os->fields[c]->nullable && (!cells[c].set || cells[c].null)) {
                return kf_error_set(s->err, KF_E_PRECONDITION,
                                    "handler response rejected, nothing applied: output row of "
                                    "activation %" PRIu64 " (key %s) has no value for non-nullable "
                                    "column %s",
                                    a->id, a->key_text, os->fields[c]->name);
            }
        }
        int64_t ts = cells[fn->out_event_col].v.i;
        if (ts < a->event_time_us) {
            return kf_error_set(s->err, KF_E_PRECONDITION,
                                "handler response rejected, nothing applied: output row of "
                                "activation %" PRIu64 " has %s %" PRId64
                                ", before the activation's "
                                "event time %" PRId64,
                                a->id, os->fields[fn->out_event_col]->name, ts, a->event_time_us);
        }
    }
    return KF_OK;
}

static void apply(kf_call_t *call) {
    step_t *s = call->step;
    function_t *fn = s->fn;
    for (uint32_t i = 0; i < call->ntops; i++) {
        timer_op_t *t = &call->tops[i];
        fn_key_t *k = call->keys[t->act];
        touch(s, k, true);
        key_set_timer(fn, k, (uint8_t)t->name, t->op == TOP_SET ? t->at_us : NO_TIME);
    }
    for (uint32_t i = 0; i < call->count; i++) {
        result_t *r = &call->res[i];
        fn_key_t *k = call->keys[i];
        switch (r->mutation) {
        case MUT_UNCHANGED: break;
        case MUT_SET:
            touch(s, k, true);
            key_set_state(fn, k, KF_STATE_VALUE, r->value);
            break;
        case MUT_SET_NULL:
            touch(s, k, true);
            key_set_state(fn, k, KF_STATE_NULL, 0);
            break;
        case MUT_CLEAR:
            touch(s, k, true);
            key_set_state(fn, k, KF_STATE_ABSENT, 0);
            break;
        default: KF_UNREACHABLE();
        }
    }
}

/* Aggregate limits after a call was applied (rolled back by the caller). */
static kf_status_t check_limits(step_t *s) {
    function_t *fn = s->fn;
    if ((int64_t)fn->live_keys > fn->limits.max_keys) {
        return kf_error_set(s->err, KF_E_LIMIT,
                            "max_keys: the batch would leave %llu keys with state or timers (limit "
                            "%lld); nothing applied",
                            (unsigned long long)fn->live_keys, (long long)fn->limits.max_keys);
    }
    if ((int64_t)fn->timer_count > fn->limits.max_timers) {
        return kf_error_set(s->err, KF_E_LIMIT,
                            "max_timers: the batch would leave %llu timers (limit %lld); nothing "
                            "applied",
                            (unsigned long long)fn->timer_count, (long long)fn->limits.max_timers);
    }
    if ((int64_t)fn->state_bytes > fn->limits.max_state_bytes) {
        return kf_error_set(s->err, KF_E_LIMIT,
                            "max_state_bytes: the batch would leave %llu bytes of state (limit "
                            "%lld); nothing applied",
                            (unsigned long long)fn->state_bytes,
                            (long long)fn->limits.max_state_bytes);
    }
    return KF_OK;
}

/* Sends a call to the handler. True when its response is already here:
 * native handlers answer inside invoke(). A remote handler (or the test
 * seam `defer_calls`) answers later, through kf_functions_pump() today and a
 * worker stream tomorrow; either way the response then goes through
 * take_response() exactly as an immediate one does. */
static bool send_call(kf_call_t *call) {
    step_t *s = call->step;
    s->calls++;
    s->activations += call->count;
    kf_counter_add(KF_C_HANDLER_CALLS, 1);
    if (s->fns->defer_calls) {
        s->awaiting = true;
        return false;
    }
    const kf_handler_t *h = s->fn->handler;
    int rc = h->invoke(&host, call, call->acts, call->count);
    if (rc != 0) {
        call_fail(call, KF_E_PRECONDITION, "handler returned %d", rc);
    }
    return true;
}

/* Validates a call's response, then applies it (invariant 1). */
static kf_status_t take_response(kf_call_t *call) {
    step_t *s = call->step;
    kf_status_t st = validate(call);
    if (st != KF_OK) {
        return st;
    }
    apply(call);
    if ((st = check_limits(s)) != KF_OK) {
        return st;
    }
    if (call->out.rows > 0) {
        st = kf_outbuf_append_from(&s->out, &call->out, 0, call->out.rows, s->err);
    }
    return st;
}

/* The next call of the rows phase: rows in arrival order; a call ends at
 * max_batch_rows activations or when the next row's key already has an
 * activation in it. */
static void build_row_call(step_t *s, kf_call_t *call) {
    function_t *fn = s->fn;
    const kf_rows_t *rows = s->rows;
    const kf_column_t *ev = &rows->cols[fn->event_col];
    uint32_t stamp = ++s->fns->call_counter;
    while (s->row_pos < rows->count && call->count < (uint32_t)fn->limits.max_batch_rows) {
        uint32_t i = s->row_pos;
        char *text;
        size_t text_len;
        bool owned;
        size_t klen = row_key(s->fns, fn, rows, i, &text, &text_len, &owned);
        fn_key_t *k = key_find(fn, s->fns->scratch, klen);
        if (k == NULL) {
            k = key_new(fn, s->fns->scratch, klen, text, text_len);
            touch(s, k, false);
        }
        if (owned) {
            free(text);
        }
        if (k->call_mark == stamp) {
            break; /* a second row of this key: next call */
        }
        k->call_mark = stamp;
        call_add(call, k, KF_CALLBACK_ROW, i, ev->i64[i], NULL);
        s->row_pos++;
    }
}

/* The next call of the timers phase: due timers in (at_us, key, name)
 * order, at most max_timer_callbacks_per_step, one per key. */
static void build_timer_call(step_t *s, kf_call_t *call) {
    function_t *fn = s->fn;
    uint32_t per_call = (uint32_t)fn->limits.max_timer_callbacks;
    if (per_call > (uint32_t)fn->limits.max_batch_rows) {
        per_call = (uint32_t)fn->limits.max_batch_rows;
    }
    uint32_t stamp = ++s->fns->call_counter;
    ev_timer_t *t;
    while ((t = ev_top(fn)) != NULL && t->at_us <= s->watermark && call->count < per_call) {
        fn_key_t *k = t->owner;
        if (k->call_mark == stamp) {
            break; /* another timer of a key already in this call */
        }
        k->call_mark = stamp;
        int64_t at = t->at_us;
        uint8_t name = t->name;
        touch(s, k, true);
        key_set_timer(fn, k, name, NO_TIME); /* fired: gone unless set again */
        call_add(call, k, KF_CALLBACK_TIMER, 0, at, fn->desc->timer_names[name]);
        s->timer_callbacks++;
    }
}

/* Builds the step's next call; false when the step has no call left. The
 * watermark advances between the rows and the timers. */
static bool next_call(step_t *s) {
    kf_call_t *call = s->call;
    call_reset(call);
    if (!s->timers_phase) {
        if (s->row_pos < s->rows->count) {
            build_row_call(s, call);
            return true;
        }
        const Keyflow__V1__PushBatchRequest *req = s->req;
        if (req->watermark_present_case ==
                KEYFLOW__V1__PUSH_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US &&
            (!s->has_watermark || req->watermark_us > s->watermark)) {
            s->has_watermark = true; /* watermarks never go back: a lower one is ignored */
            s->watermark = req->watermark_us;
        }
        s->timers_phase = true;
    }
    ev_timer_t *top = ev_top(s->fn);
    if (s->has_watermark && top != NULL && top->at_us <= s->watermark) {
        build_timer_call(s, call);
        return true;
    }
    return false;
}

static void step_finish(step_t *s, kf_status_t st);

/* Runs the step until a call is out with no response yet, or to its end. */
static void step_advance(step_t *s) {
    for (;;) {
        if (!next_call(s)) {
            step_finish(s, KF_OK);
            return;
        }
        if (!send_call(s->call)) {
            return; /* the response arrives later */
        }
        kf_status_t st = take_response(s->call);
        if (st != KF_OK) {
            step_finish(s, st);
            return;
        }
    }
}

/* ---- commit: the step's one atomic write ------------------------------- */

static void put_state(kf_ctx_t *ctx, const function_t *fn, const fn_key_t *k) {
    kf_key_t key;
    key_prefix(&key, fn);
    kf_key_raw(&key, k->key, k->key_len);
    if (k->state == KF_STATE_ABSENT) {
        kf_ctx_delete(ctx, KF_CF_STATE, &key);
        return;
    }
    uint8_t v[9];
    v[0] = k->state;
    kf_put_be64(v + 1, (uint64_t)k->value);
    kf_ctx_put(ctx, KF_CF_STATE, &key, v, sizeof v);
}

static void timer_keys(const function_t *fn, const fn_key_t *k, size_t name, int64_t at_us,
                       kf_key_t *by_key, kf_key_t *by_time) {
    const char *n = fn->desc->timer_names[name];
    key_prefix(by_key, fn);
    kf_key_lp(by_key, (const char *)k->key, k->key_len);
    kf_key_lp(by_key, n, strlen(n));
    key_prefix(by_time, fn);
    kf_key_time(by_time, at_us);
    kf_key_lp(by_time, (const char *)k->key, k->key_len);
    kf_key_lp(by_time, n, strlen(n));
}

static void write_timer_diff(kf_ctx_t *ctx, const function_t *fn, const fn_key_t *k, size_t name,
                             int64_t old_at, int64_t new_at) {
    kf_key_t by_key, by_time;
    if (old_at != NO_TIME) {
        timer_keys(fn, k, name, old_at, &by_key, &by_time);
        kf_ctx_delete(ctx, KF_CF_TIMERS_BY_TIME, &by_time);
        if (new_at == NO_TIME) {
            kf_ctx_delete(ctx, KF_CF_TIMERS_BY_KEY, &by_key);
        }
    }
    if (new_at != NO_TIME) {
        timer_keys(fn, k, name, new_at, &by_key, &by_time);
        uint8_t v[8];
        kf_put_be64(v, kf_i64_ordered(new_at));
        kf_ctx_put(ctx, KF_CF_TIMERS_BY_KEY, &by_key, v, sizeof v);
        kf_ctx_put(ctx, KF_CF_TIMERS_BY_TIME, &by_time, "", 0);
    }
}

static void put_checkpoint(kf_ctx_t *ctx, const function_t *fn) {
    Keyflow__Records__CheckpointRec cp = KEYFLOW__RECORDS__CHECKPOINT_REC__INIT;
    cp.codec_version = STATE_CODEC_VERSION;
    cp.descriptor_sha256 = (char *)fn->sha256;
    cp.has_watermark = fn->has_watermark;
    cp.watermark_us = fn->watermark_us;
    cp.next_activation_id = fn->next_activation;
    cp.output_seq = fn->output_seq;
    kf_key_t k;
    key_prefix(&k, fn);
    kf_ctx_put_msg(ctx, KF_CF_CHECKPOINTS, &k, &cp.base);
}

static void put_producer(kf_ctx_t *ctx, const function_t *fn, const producer_t *p) {
    Keyflow__Records__ProducerRec rec = KEYFLOW__RECORDS__PRODUCER_REC__INIT;
    Keyflow__Records__ProducerAckRec acks[KF_PRODUCER_ACKS_KEPT];
    Keyflow__Records__ProducerAckRec *ptrs[KF_PRODUCER_ACKS_KEPT];
    rec.producer_id = p->id;
    rec.last_sequence = p->last_sequence;
    for (uint32_t i = 0; i < p->nacks; i++) {
        keyflow__records__producer_ack_rec__init(&acks[i]);
        acks[i].sequence = p->ack_seq[i];
        acks[i].ack.data = p->ack[i];
        acks[i].ack.len = p->ack_len[i];
        ptrs[i] = &acks[i];
    }
    rec.n_acks = p->nacks;
    rec.acks = ptrs;
    kf_key_t k;
    key_prefix(&k, fn);
    kf_key_raw(&k, p->id, strlen(p->id));
    kf_ctx_put_msg(ctx, KF_CF_PRODUCERS, &k, &rec.base);
}

static void producer_remember(producer_t *p, int64_t seq, const ProtobufCMessage *ack) {
    if (p->nacks == KF_PRODUCER_ACKS_KEPT) {
        free(p->ack[0]);
        memmove(&p->ack[0], &p->ack[1], (KF_PRODUCER_ACKS_KEPT - 1) * sizeof p->ack[0]);
        memmove(&p->ack_seq[0], &p->ack_seq[1], (KF_PRODUCER_ACKS_KEPT - 1) * sizeof p->ack_seq[0]);
        memmove(&p->ack_len[0], &p->ack_len[1], (KF_PRODUCER_ACKS_KEPT - 1) * sizeof p->ack_len[0]);
        p->nacks--;
    }
    size_t len = protobuf_c_message_get_packed_size(ack);
    uint8_t *buf = xmalloc(len);
    protobuf_c_message_pack(ack, buf);
    p->ack_seq[p->nacks] = seq;
    p->ack[p->nacks] = buf;
    p->ack_len[p->nacks] = len;
    p->nacks++;
    p->last_sequence = seq;
}

static void pending_add(kf_functions_t *fns, function_t *fn, uint64_t group) {
    if (fns->npending > 0 && fns->pending[fns->npending - 1].fn == fn &&
        fns->pending[fns->npending - 1].group == group) {
        fns->pending[fns->npending - 1].output_seq = fn->output_seq;
        return;
    }
    if (fns->npending == fns->pending_cap) {
        fns->pending_cap = fns->pending_cap ? fns->pending_cap * 2 : 64;
        fns->pending = realloc(fns->pending, fns->pending_cap * sizeof *fns->pending);
        KF_ASSERT(fns->pending != NULL);
    }
    fns->pending[fns->npending++] = (pending_durable_t){fn, group, fn->output_seq};
}

/* Writes everything the step changed, in the context's batch. */
static void commit(step_t *s, Keyflow__V1__PushBatchResponse *ack) {
    function_t *fn = s->fn;
    kf_ctx_t *ctx = s->ctx;
    for (size_t i = 0; i < s->nundo; i++) {
        undo_t *u = &s->undo[i];
        fn_key_t *k = u->key;
        k->step_mark = 0;
        if (u->state != k->state || (k->state == KF_STATE_VALUE && u->value != k->value)) {
            put_state(ctx, fn, k);
        }
        for (size_t t = 0; t < fn->desc->n_timer_names; t++) {
            int64_t now_at = k->timers && k->timers[t] ? k->timers[t]->at_us : NO_TIME;
            if (now_at != u->at[t]) {
                write_timer_diff(ctx, fn, k, t, u->at[t], now_at);
            }
        }
        if (!key_live(fn, k)) {
            kf_map_remove(&fn->keys, &k->node);
            key_free(fn, k);
        }
    }
    if (s->out.rows > 0) {
        ack->first_output_seq = (int64_t)fn->output_seq + 1;
        for (uint32_t from = 0; from < s->out.rows; from += KF_OUTPUT_CHUNK_ROWS_MAX) {
            uint32_t n = s->out.rows - from;
            if (n > KF_OUTPUT_CHUNK_ROWS_MAX) {
                n = KF_OUTPUT_CHUNK_ROWS_MAX;
            }
            /* Each chunk is encoded in its own short-lived arena, so a step
             * with very many output rows (a timer storm) needs memory for
             * one chunk's encoding at a time. */
            kf_arena_t chunk_arena;
            kf_arena_init(&chunk_arena, 0);
            Keyflow__V1__RowBatch *chunk = kf_outbuf_to_batch(&s->out, from, n, &chunk_arena);
            KF_ASSERT(chunk != NULL); /* one chunk is bounded by KF_OUTPUT_CHUNK_ROWS_MAX rows */
            fn->output_seq += n;
            kf_key_t k;
            key_prefix(&k, fn);
            kf_key_be64(&k, fn->output_seq);
            kf_ctx_put_msg(ctx, KF_CF_OUTPUT, &k, &chunk->base);
            kf_arena_deinit(&chunk_arena);
        }
        ack->last_output_seq = (int64_t)fn->output_seq;
        kf_counter_add(KF_C_OUTPUT_ROWS, s->out.rows);
        pending_add(s->fns, fn, ctx->group_id);
    }
    put_checkpoint(ctx, fn);
}

/* ---- registry ----------------------------------------------------------- */

static function_t *fn_find(const kf_functions_t *fns, const char *id) {
    kf_map_node_t *n = kf_map_get(&fns->by_id, id, strlen(id));
    return n ? KF_CONTAINER_OF(n, function_t, node) : NULL;
}

static function_t *fn_by_pipeline(const kf_functions_t *fns, const char *pipeline_state_id) {
    size_t b;
    for (kf_map_node_t *n = kf_map_first(&fns->by_id, &b); n; n = kf_map_next(&fns->by_id, &b, n)) {
        function_t *fn = KF_CONTAINER_OF(n, function_t, node);
        if (strcmp(fn->desc->pipeline_state_id, pipeline_state_id) == 0) {
            return fn;
        }
    }
    return NULL;
}

/* Builds the in-memory function from a canonical descriptor (copied into
 * the function's own arena). */
static function_t *fn_new(kf_functions_t *fns, const Keyflow__V1__FunctionDescriptor *canonical,
                          const char *sha256, uint32_t index, int64_t created_ms) {
    function_t *fn = calloc(1, sizeof *fn);
    KF_ASSERT(fn != NULL);
    kf_arena_init(&fn->arena, 0);
    kf_error_t err;
    kf_status_t st = kf_descriptor_canonicalize(canonical, &fn->arena, &fn->desc, &err);
    KF_ASSERT(st == KF_OK); /* it was canonical already */
    fn->id = fn->desc->function_id;
    memcpy(fn->sha256, sha256, KF_SHA256_HEX_BYTES + 1);
    fn->index = index;
    fn->created_ms = created_ms;
    kf_descriptor_limits(fn->desc, &fn->limits);
    fn->nkey_cols = (int)fn->desc->n_key_columns;
    for (int i = 0; i < fn->nkey_cols; i++) {
        fn->key_cols[i] = kf_schema_find(fn->desc->input_schema, fn->desc->key_columns[i]);
    }
    fn->event_col = kf_schema_find(fn->desc->input_schema, fn->desc->event_time_column);
    fn->out_event_col = kf_schema_find(fn->desc->output_schema, fn->desc->output_event_time_column);
    KF_ASSERT(fn->event_col >= 0 && fn->out_event_col >= 0);
    fn->next_activation = 1;
    kf_map_init(&fn->keys);
    kf_map_init(&fn->producers);
    kf_pq_init(&fn->timers, ev_before, fn);
    if (fn->desc->runtime == KEYFLOW__V1__RUNTIME__RUNTIME_NATIVE) {
        if (kf_plugins_find(fns->plugins, fn->desc->implementation_digest, &fn->handler, &err) !=
            KF_OK) {
            fn->handler = NULL;
            snprintf(fn->unavailable, sizeof fn->unavailable, "%s", err.message);
        }
    } else {
        snprintf(fn->unavailable, sizeof fn->unavailable,
                 "runtime REMOTE: no worker serves %s (remote workers are not supported by this "
                 "build yet)",
                 fn->id);
    }
    kf_map_insert(&fns->by_id, &fn->node, fn->id, strlen(fn->id));
    kf_gauge_set(KF_G_FUNCTIONS, (int64_t)fns->by_id.count);
    return fn;
}

static void fn_free(function_t *fn) {
    kf_pq_deinit(&fn->timers); /* first: its nodes live in the keys' timers */
    size_t b;
    kf_map_node_t *n = kf_map_first(&fn->keys, &b);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&fn->keys, &b, n);
        key_free(fn, KF_CONTAINER_OF(n, fn_key_t, node));
        n = next;
    }
    n = kf_map_first(&fn->producers, &b);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&fn->producers, &b, n);
        producer_t *p = KF_CONTAINER_OF(n, producer_t, node);
        for (uint32_t i = 0; i < p->nacks; i++) {
            free(p->ack[i]);
        }
        free(p->id);
        free(p);
        n = next;
    }
    kf_map_deinit(&fn->keys);
    kf_map_deinit(&fn->producers);
    kf_arena_deinit(&fn->arena);
    free(fn);
}

static Keyflow__V1__FunctionInfo *fn_info(kf_arena_t *a, const function_t *fn) {
    Keyflow__V1__FunctionInfo *info = kf_arena_new(a, sizeof *info);
    keyflow__v1__function_info__init(info);
    info->descriptor = fn->desc; /* lives in the function's arena, outlives the reply */
    info->descriptor_sha256 = (char *)fn->sha256;
    info->created_ms = fn->created_ms;
    info->available = fn->handler != NULL;
    info->unavailable_reason = fn->handler ? "" : kf_arena_strdup(a, fn->unavailable);
    info->watermark_us = fn->has_watermark ? fn->watermark_us : 0;
    info->output_seq = (int64_t)fn->output_seq;
    info->keys = (int64_t)fn->live_keys;
    info->timers = (int64_t)fn->timer_count;
    info->state_bytes = (int64_t)fn->state_bytes;
    return info;
}

void kf_functions_register(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__RegisterFunctionRequest *req =
        (const Keyflow__V1__RegisterFunctionRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    Keyflow__V1__FunctionDescriptor *canonical;
    uint8_t *bytes;
    size_t len;
    char sha[KF_SHA256_HEX_BYTES + 1];
    if (kf_descriptor_canonicalize(req->descriptor, cmd->arena, &canonical, err) != KF_OK ||
        kf_descriptor_encode(canonical, cmd->arena, &bytes, &len, sha, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    Keyflow__V1__RegisterFunctionResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__register_function_response__init(resp);
    function_t *existing = fn_find(fns, canonical->function_id);
    if (existing != NULL) {
        if (strcmp(existing->sha256, sha) != 0) {
            kf_error_set(err, KF_E_EXISTS,
                         "descriptor.function_id: %s is registered with a different descriptor "
                         "(sha256 %s, this one %s); a new implementation is a new function",
                         existing->id, existing->sha256, sha);
            kf_ctx_fail(ctx, cmd);
            return;
        }
        resp->function = fn_info(cmd->arena, existing);
        resp->already_registered = true;
        cmd->response = &resp->base;
        kf_ctx_ready(ctx, cmd);
        return;
    }
    function_t *other = fn_by_pipeline(fns, canonical->pipeline_state_id);
    if (other != NULL) {
        kf_error_set(err, KF_E_EXISTS,
                     "descriptor.pipeline_state_id: %s is already the state of function %s; two "
                     "functions never share one",
                     canonical->pipeline_state_id, other->id);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (fns->by_id.count >= KF_FUNCTIONS_MAX) {
        kf_error_set(err, KF_E_LIMIT, "functions: at most %d (KF_FUNCTIONS_MAX)", KF_FUNCTIONS_MAX);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (canonical->runtime == KEYFLOW__V1__RUNTIME__RUNTIME_NATIVE) {
        const kf_handler_t *h;
        if (kf_plugins_find(fns->plugins, canonical->implementation_digest, &h, err) != KF_OK) {
            kf_ctx_fail(ctx, cmd);
            return;
        }
    }
    function_t *fn = fn_new(fns, canonical, sha, fns->next_index++, ctx->now_ms);
    Keyflow__Records__FunctionRec rec = KEYFLOW__RECORDS__FUNCTION_REC__INIT;
    rec.descriptor.data = bytes;
    rec.descriptor.len = len;
    rec.sha256 = sha;
    rec.created_ms = fn->created_ms;
    rec.index = fn->index;
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_raw(&k, fn->id, strlen(fn->id));
    kf_ctx_put_msg(ctx, KF_CF_FUNCTIONS, &k, &rec.base);
    uint8_t next[4];
    kf_put_be32(next, fns->next_index);
    kf_key_reset(&k);
    kf_key_raw(&k, fn_index_key, sizeof fn_index_key - 1);
    kf_ctx_put(ctx, KF_CF_META, &k, next, sizeof next);
    put_checkpoint(ctx, fn);
    resp->function = fn_info(cmd->arena, fn);
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

static function_t *require_fn(kf_functions_t *fns, const char *id, kf_error_t *err) {
    if (id[0] == '\0') {
        kf_error_set(err, KF_E_INVALID, "function_id: required");
        return NULL;
    }
    function_t *fn = fn_find(fns, id);
    if (fn == NULL) {
        kf_error_set(err, KF_E_NOT_FOUND, "function_id: no function %.128s", id);
    }
    return fn;
}

void kf_functions_get(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__GetFunctionRequest *req =
        (const Keyflow__V1__GetFunctionRequest *)cmd->request;
    function_t *fn = require_fn(fns, req->function_id, &cmd->error);
    if (fn == NULL) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    cmd->response = &fn_info(cmd->arena, fn)->base;
    kf_ctx_ready(ctx, cmd);
}

static int cmp_ids(const void *a, const void *b) {
    return strcmp((*(function_t *const *)a)->id, (*(function_t *const *)b)->id);
}

void kf_functions_list(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__ListFunctionsRequest *req =
        (const Keyflow__V1__ListFunctionsRequest *)cmd->request;
    if (req->page_size < 0 || req->page_size > KF_LIST_PAGE_MAX) {
        kf_error_set(&cmd->error, KF_E_INVALID, "page_size: must be in 0..%d, got %lld",
                     KF_LIST_PAGE_MAX, (long long)req->page_size);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    size_t n = fns->by_id.count, i = 0, b;
    function_t **all = kf_arena_new(cmd->arena, (n + 1) * sizeof *all);
    for (kf_map_node_t *m = kf_map_first(&fns->by_id, &b); m; m = kf_map_next(&fns->by_id, &b, m)) {
        all[i++] = KF_CONTAINER_OF(m, function_t, node);
    }
    qsort(all, n, sizeof *all, cmp_ids);
    int64_t page = req->page_size ? req->page_size : KF_LIST_PAGE_DEFAULT;
    Keyflow__V1__ListFunctionsResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__list_functions_response__init(resp);
    resp->functions = kf_arena_new(cmd->arena, (size_t)page * sizeof *resp->functions);
    for (i = 0; i < n; i++) {
        if (req->page_token[0] != '\0' && strcmp(all[i]->id, req->page_token) <= 0) {
            continue;
        }
        if ((int64_t)resp->n_functions == page) {
            resp->next_page_token = resp->functions[resp->n_functions - 1]->descriptor->function_id;
            break;
        }
        resp->functions[resp->n_functions++] = fn_info(cmd->arena, all[i]);
    }
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

/* ---- PushBatch ---------------------------------------------------------- */

static producer_t *producer_get(function_t *fn, const char *id, bool create) {
    kf_map_node_t *n = kf_map_get(&fn->producers, id, strlen(id));
    if (n != NULL || !create) {
        return n ? KF_CONTAINER_OF(n, producer_t, node) : NULL;
    }
    producer_t *p = calloc(1, sizeof *p);
    KF_ASSERT(p != NULL);
    p->id = strdup(id);
    KF_ASSERT(p->id != NULL);
    kf_map_insert(&fn->producers, &p->node, p->id, strlen(p->id));
    return p;
}

/* A retry of an accepted sequence: the stored acknowledgement. */
static bool replay_ack(producer_t *p, int64_t seq, kf_cmd_t *cmd) {
    for (uint32_t i = 0; i < p->nacks; i++) {
        if (p->ack_seq[i] == seq) {
            Keyflow__V1__PushBatchResponse *ack = keyflow__v1__push_batch_response__unpack(
                kf_arena_pb(cmd->arena), p->ack_len[i], p->ack[i]);
            KF_ASSERT(ack != NULL);
            ack->duplicate = true;
            cmd->response = &ack->base;
            return true;
        }
    }
    return false;
}

/* Ends a step: commit and acknowledge, or roll back and refuse. */
static void step_finish(step_t *s, kf_status_t st) {
    function_t *fn = s->fn;
    kf_ctx_t *ctx = s->ctx;
    kf_cmd_t *cmd = s->cmd;
    fn->active = NULL;
    if (st != KF_OK) {
        rollback(s);
        free(s->undo);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    fn->has_watermark = s->has_watermark;
    fn->watermark_us = s->watermark;
    Keyflow__V1__PushBatchResponse *ack = kf_arena_new(cmd->arena, sizeof *ack);
    keyflow__v1__push_batch_response__init(ack);
    ack->rows_accepted = s->rows->count;
    ack->activations = s->activations;
    ack->timer_callbacks = s->timer_callbacks;
    ack->handler_calls = s->calls;
    ack->watermark_us = fn->has_watermark ? fn->watermark_us : 0;
    ack->sequence = s->req->sequence;
    commit(s, ack);
    free(s->undo);
    producer_t *p = producer_get(fn, s->req->producer_id, true);
    producer_remember(p, s->req->sequence, &ack->base);
    put_producer(ctx, fn, p);
    kf_counter_add(KF_C_INPUT_ROWS, s->rows->count);
    kf_counter_add(KF_C_EVENT_TIMERS_FIRED, (uint64_t)s->timer_callbacks);
    cmd->response = &ack->base;
    kf_ctx_ready(ctx, cmd);
}

/* Checks a PushBatch and starts its step (the function is idle). */
static void push_begin(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn, kf_cmd_t *cmd) {
    const Keyflow__V1__PushBatchRequest *req = (const Keyflow__V1__PushBatchRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    KF_ASSERT(fn->active == NULL);
    if (kf_check_identifier("producer_id", req->producer_id, KF_PRODUCER_ID_BYTES_MAX, true, err) !=
        KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (req->sequence < 1) {
        kf_error_set(err, KF_E_INVALID, "sequence: must be at least 1, got %lld",
                     (long long)req->sequence);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    producer_t *p = producer_get(fn, req->producer_id, false);
    if (p != NULL && req->sequence <= p->last_sequence) {
        if (replay_ack(p, req->sequence, cmd)) {
            kf_ctx_ready(ctx, cmd);
            return;
        }
        kf_error_set(
            err, KF_E_PRECONDITION,
            "sequence: %lld is not after %lld, the last accepted from producer %s (if %lld was "
            "accepted, its acknowledgement is no longer kept: only the last %d are)",
            (long long)req->sequence, (long long)p->last_sequence, p->id, (long long)req->sequence,
            KF_PRODUCER_ACKS_KEPT);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (p == NULL && fn->producers.count >= KF_PRODUCERS_MAX) {
        kf_error_set(err, KF_E_LIMIT,
                     "producer_id: at most %d producers per function (KF_PRODUCERS_MAX)",
                     KF_PRODUCERS_MAX);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (fn->handler == NULL) {
        kf_error_set(err, KF_E_UNAVAILABLE, "function %s is unavailable: %s", fn->id,
                     fn->unavailable);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    step_t *s = kf_arena_new(cmd->arena, sizeof *s);
    kf_rows_t *rows = &s->rows_storage;
    kf_status_t st = KF_OK;
    const Keyflow__V1__Schema *schema = fn->desc->input_schema;
    if (req->rows_case == KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_BATCH) {
        st = kf_rows_from_batch(req->batch, schema, fn->limits.max_input_rows,
                                fn->limits.max_input_bytes, cmd->arena, rows, err);
    } else if (req->rows_case == KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_ROWS_JSON) {
        st = kf_rows_from_json(req->rows_json, strlen(req->rows_json), schema,
                               fn->limits.max_input_rows, fn->limits.max_input_bytes, cmd->arena,
                               rows, err);
    } else {
        rows->ncols = (uint32_t)schema->n_fields; /* a watermark-only batch */
    }
    for (uint32_t i = 0; st == KF_OK && i < rows->count; i++) {
        size_t klen = 0;
        for (int c = 0; c < fn->nkey_cols; c++) {
            klen += 4 + rows->cols[fn->key_cols[c]].str_len[i];
        }
        if (klen > KF_FUNCTION_KEY_BYTES_MAX) {
            st = kf_error_set(err, KF_E_TOO_LARGE, "rows[%u]: the key is %zu bytes (at most %d)", i,
                              klen, KF_FUNCTION_KEY_BYTES_MAX);
        }
    }
    if (st != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    s->fns = fns;
    s->fn = fn;
    s->ctx = ctx;
    s->arena = cmd->arena;
    s->rows = rows;
    s->cmd = cmd;
    s->req = req;
    s->has_watermark = fn->has_watermark;
    s->watermark = fn->watermark_us;
    s->mark = ++fns->step_counter;
    if (s->mark == 0) {
        s->mark = ++fns->step_counter; /* 0 means "not touched" */
    }
    s->live_keys0 = fn->live_keys;
    s->timer_count0 = fn->timer_count;
    s->state_bytes0 = fn->state_bytes;
    s->next_activation0 = fn->next_activation;
    s->err = err;
    kf_outbuf_init(&s->out, fn->desc->output_schema, cmd->arena);
    s->call = kf_arena_new(cmd->arena, sizeof *s->call);
    call_init(s->call, s, (uint32_t)fn->limits.max_batch_rows);
    fn->active = s;
    step_advance(s);
}

/* Starts queued batches while the function is idle (a step that finishes
 * at once leaves it idle again). */
static void fn_drain(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn) {
    while (fn->active == NULL && fn->queue_head != NULL) {
        kf_cmd_t *cmd = fn->queue_head;
        fn->queue_head = cmd->next;
        if (fn->queue_head == NULL) {
            fn->queue_tail = NULL;
        }
        fn->queued--;
        cmd->next = NULL;
        cmd->parked = NULL;
        push_begin(fns, ctx, fn, cmd);
    }
}

/* A step whose call is out holds the function: later batches wait in order
 * behind it (bounded), since each step starts from the state the previous
 * one left. */
#define KF_FN_QUEUED_MAX 1024

void kf_functions_push(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__PushBatchRequest *req = (const Keyflow__V1__PushBatchRequest *)cmd->request;
    function_t *fn = require_fn(fns, req->function_id, &cmd->error);
    if (fn == NULL) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (fn->active != NULL) {
        if (fn->queued >= KF_FN_QUEUED_MAX) {
            kf_error_set(&cmd->error, KF_E_LIMIT,
                         "function %s: %d batches already wait for its handler", fn->id,
                         KF_FN_QUEUED_MAX);
            kf_ctx_fail(ctx, cmd);
            return;
        }
        cmd->next = NULL;
        cmd->parked = fn;
        if (fn->queue_tail) {
            fn->queue_tail->next = cmd;
        } else {
            fn->queue_head = cmd;
        }
        fn->queue_tail = cmd;
        fn->queued++;
        return;
    }
    push_begin(fns, ctx, fn, cmd);
    fn_drain(fns, ctx, fn);
}

void kf_functions_pump(kf_functions_t *fns, kf_ctx_t *ctx) {
    size_t b;
    for (kf_map_node_t *n = kf_map_first(&fns->by_id, &b); n; n = kf_map_next(&fns->by_id, &b, n)) {
        function_t *fn = KF_CONTAINER_OF(n, function_t, node);
        step_t *s = fn->active;
        if (s == NULL || !s->awaiting) {
            continue;
        }
        s->awaiting = false;
        s->ctx = ctx;
        kf_call_t *call = s->call;
        int rc = fn->handler->invoke(&host, call, call->acts, call->count);
        if (rc != 0) {
            call_fail(call, KF_E_PRECONDITION, "handler returned %d", rc);
        }
        kf_status_t st = take_response(call);
        if (st != KF_OK) {
            step_finish(s, st);
        } else {
            step_advance(s);
        }
        fn_drain(fns, ctx, fn);
    }
}

/* ---- output ------------------------------------------------------------- */

/* Reads rows (after, high] into the response, at most `limit`. */
static kf_status_t read_rows(kf_ctx_t *ctx, function_t *fn, int64_t after, int64_t limit,
                             Keyflow__V1__RowFormat format, kf_arena_t *arena,
                             Keyflow__V1__ReadOutputResponse *resp, kf_error_t *err) {
    uint64_t high = fn->durable_output_seq;
    resp->high_water_seq = (int64_t)high;
    resp->next_after_seq = after;
    if ((uint64_t)after >= high) {
        return KF_OK;
    }
    kf_key_t lower, upper;
    key_prefix(&lower, fn);
    key_prefix(&upper, fn);
    kf_key_be64(&lower, (uint64_t)after + 1);
    kf_key_be64(&upper, high + 1); /* chunks written after `high` are not durable yet */
    kf_iter_t *it;
    kf_status_t st = kf_iter_create(ctx->store, KF_CF_OUTPUT, lower.bytes, lower.len, upper.bytes,
                                    upper.len, &it, err);
    if (st != KF_OK) {
        return st;
    }
    kf_outbuf_t out;
    kf_outbuf_init(&out, fn->desc->output_schema, arena);
    int64_t first = 0;
    uint64_t next = (uint64_t)after + 1;
    for (kf_iter_seek_first(it); kf_iter_valid(it) && (int64_t)out.rows < limit; kf_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = kf_iter_key(it, &klen);
        const void *v = kf_iter_value(it, &vlen);
        if (klen != 12) {
            st = kf_error_set(err, KF_E_CORRUPT, "output: malformed key");
            break;
        }
        uint64_t last = kf_get_be64(k + 4);
        Keyflow__V1__RowBatch *chunk = keyflow__v1__row_batch__unpack(kf_arena_pb(arena), vlen, v);
        kf_rows_t rows;
        if (chunk == NULL ||
            kf_rows_from_batch(chunk, fn->desc->output_schema, INT64_MAX, INT64_MAX, arena, &rows,
                               err) != KF_OK ||
            rows.count == 0 || last + 1 < rows.count) {
            st = kf_error_set(err, KF_E_CORRUPT, "output: undecodable chunk ending at %" PRIu64,
                              last);
            break;
        }
        uint64_t chunk_first = last + 1 - rows.count;
        if (next < chunk_first || next > last) {
            st = kf_error_set(err, KF_E_CORRUPT, "output: gap before row %" PRIu64, next);
            break;
        }
        uint32_t from = (uint32_t)(next - chunk_first);
        uint32_t n = rows.count - from;
        if ((int64_t)n > limit - (int64_t)out.rows) {
            n = (uint32_t)(limit - (int64_t)out.rows);
        }
        if (first == 0) {
            first = (int64_t)next;
        }
        if ((st = kf_outbuf_append_rows(&out, &rows, from, n, err)) != KF_OK) {
            break;
        }
        next += n;
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    if (st != KF_OK || out.rows == 0) {
        return st;
    }
    resp->first_seq = first;
    resp->last_seq = first + out.rows - 1;
    resp->next_after_seq = resp->last_seq;
    if (format == KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON) {
        size_t len;
        resp->rows_json = kf_outbuf_to_json(&out, 0, out.rows, first, arena, &len);
    } else {
        resp->batch = kf_outbuf_to_batch(&out, 0, out.rows, arena);
    }
    if ((format == KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON && resp->rows_json == NULL) ||
        (format != KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON && resp->batch == NULL)) {
        return kf_error_set(err, KF_E_TOO_LARGE,
                            "limit: the page is too large; ask for fewer rows");
    }
    return KF_OK;
}

static void reader_unlink(kf_functions_t *fns, reader_t *r) {
    if (r->prev) {
        r->prev->next = r->next;
    } else {
        r->fn->readers = r->next;
    }
    if (r->next) {
        r->next->prev = r->prev;
    }
    fns->nreaders--;
    kf_gauge_set(KF_G_PARKED_READS, fns->nreaders);
}

static void answer_read(kf_ctx_t *ctx, function_t *fn, kf_cmd_t *cmd) {
    const Keyflow__V1__ReadOutputRequest *req =
        (const Keyflow__V1__ReadOutputRequest *)cmd->request;
    Keyflow__V1__ReadOutputResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__read_output_response__init(resp);
    int64_t limit = req->limit ? req->limit : KF_READ_OUTPUT_LIMIT_DEFAULT;
    if (read_rows(ctx, fn, req->after_seq, limit, req->format, cmd->arena, resp, &cmd->error) !=
        KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

void kf_functions_read(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__ReadOutputRequest *req =
        (const Keyflow__V1__ReadOutputRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    function_t *fn = require_fn(fns, req->function_id, err);
    if (fn == NULL) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (req->after_seq < 0 || req->limit < 0 || req->limit > KF_READ_OUTPUT_LIMIT_MAX ||
        req->wait_ms < 0 || req->wait_ms > KF_POLL_WAIT_MS_MAX || (int)req->format < 0 ||
        req->format > KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON) {
        kf_error_set(err, KF_E_INVALID, "%s",
                     req->after_seq < 0 ? "after_seq: must not be negative"
                     : (req->limit < 0 || req->limit > KF_READ_OUTPUT_LIMIT_MAX)
                         ? "limit: must be in 0..65536 (0 = 1000)"
                     : (req->wait_ms < 0 || req->wait_ms > KF_POLL_WAIT_MS_MAX)
                         ? "wait_ms: must be in 0..60000"
                         : "format: must be COLUMNAR or JSON");
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if ((uint64_t)req->after_seq >= fn->durable_output_seq && req->wait_ms > 0) {
        if (fns->nreaders >= KF_PARKED_READS_MAX) {
            kf_error_set(err, KF_E_LIMIT,
                         "ReadOutput: %d reads already waiting (KF_PARKED_READS_MAX)",
                         KF_PARKED_READS_MAX);
            kf_ctx_fail(ctx, cmd);
            return;
        }
        reader_t *r = kf_arena_new(cmd->arena, sizeof *r);
        r->cmd = cmd;
        r->fn = fn;
        kf_timer_init(&r->timer, KF_TIMER_FUNCTION);
        kf_heap_arm(&ctx->heap, &r->timer, kf_time_add_sat(ctx->now_ms, req->wait_ms));
        r->next = fn->readers;
        if (fn->readers) {
            fn->readers->prev = r;
        }
        fn->readers = r;
        fns->nreaders++;
        kf_gauge_set(KF_G_PARKED_READS, fns->nreaders);
        cmd->parked = r;
        return;
    }
    answer_read(ctx, fn, cmd);
}

void kf_functions_fire(kf_functions_t *fns, kf_ctx_t *ctx, kf_timer_t *timer) {
    reader_t *r = KF_CONTAINER_OF(timer, reader_t, timer);
    reader_unlink(fns, r);
    r->cmd->parked = NULL;
    answer_read(ctx, r->fn, r->cmd);
}

void kf_functions_durable(kf_functions_t *fns, kf_ctx_t *ctx) {
    size_t done = 0;
    while (done < fns->npending && fns->pending[done].group <= ctx->durable_group_id) {
        pending_durable_t *p = &fns->pending[done++];
        function_t *fn = p->fn;
        if (p->output_seq <= fn->durable_output_seq) {
            continue;
        }
        fn->durable_output_seq = p->output_seq;
        reader_t *r = fn->readers;
        while (r != NULL) {
            reader_t *next = r->next;
            const Keyflow__V1__ReadOutputRequest *req =
                (const Keyflow__V1__ReadOutputRequest *)r->cmd->request;
            if ((uint64_t)req->after_seq < fn->durable_output_seq) {
                reader_unlink(fns, r);
                kf_heap_disarm(&ctx->heap, &r->timer);
                r->cmd->parked = NULL;
                answer_read(ctx, fn, r->cmd);
            }
            r = next;
        }
    }
    if (done > 0) {
        memmove(fns->pending, fns->pending + done, (fns->npending - done) * sizeof *fns->pending);
        fns->npending -= done;
    }
}

bool kf_functions_cancel_read(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd, uint64_t id) {
    size_t b;
    for (kf_map_node_t *n = kf_map_first(&fns->by_id, &b); n; n = kf_map_next(&fns->by_id, &b, n)) {
        function_t *fn = KF_CONTAINER_OF(n, function_t, node);
        for (reader_t *r = fn->readers; r != NULL; r = r->next) {
            if (r->cmd == cmd && cmd->id == id) {
                reader_unlink(fns, r);
                kf_heap_disarm(&ctx->heap, &r->timer);
                cmd->parked = NULL;
                cmd->response = NULL;
                kf_error_set(&cmd->error, KF_E_CANCELLED, "ReadOutput: the client went away");
                kf_ctx_ready(ctx, cmd);
                return true;
            }
        }
    }
    return false;
}

void kf_functions_release_reads(kf_functions_t *fns, kf_ctx_t *ctx) {
    size_t b;
    for (kf_map_node_t *n = kf_map_first(&fns->by_id, &b); n; n = kf_map_next(&fns->by_id, &b, n)) {
        function_t *fn = KF_CONTAINER_OF(n, function_t, node);
        while (fn->queue_head != NULL) { /* batches waiting behind a call that is out */
            kf_cmd_t *cmd = fn->queue_head;
            fn->queue_head = cmd->next;
            fn->queued--;
            cmd->next = NULL;
            cmd->parked = NULL;
            kf_error_set(&cmd->error, KF_E_UNAVAILABLE, "the server is shutting down");
            kf_ctx_fail(ctx, cmd);
        }
        fn->queue_tail = NULL;
        while (fn->readers != NULL) {
            reader_t *r = fn->readers;
            reader_unlink(fns, r);
            kf_heap_disarm(&ctx->heap, &r->timer);
            r->cmd->parked = NULL;
            answer_read(ctx, fn, r->cmd);
        }
    }
}

/* ---- key state ---------------------------------------------------------- */

void kf_functions_key_state(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__GetKeyStateRequest *req =
        (const Keyflow__V1__GetKeyStateRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    function_t *fn = require_fn(fns, req->function_id, err);
    if (fn == NULL) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    size_t text_len = strlen(req->key);
    if (text_len > KF_FUNCTION_KEY_BYTES_MAX) {
        kf_error_set(err, KF_E_TOO_LARGE, "key: at most %d bytes", KF_FUNCTION_KEY_BYTES_MAX);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    uint8_t *key = kf_arena_new(cmd->arena, text_len + 4 * KF_KEY_COLUMNS_MAX + 8);
    size_t klen = 0;
    if (fn->nkey_cols == 1) {
        kf_put_be32(key, (uint32_t)text_len);
        memcpy(key + 4, req->key, text_len);
        klen = 4 + text_len;
    } else {
        json_t *arr = json_loads(req->key, 0, NULL);
        bool ok =
            arr != NULL && json_is_array(arr) && json_array_size(arr) == (size_t)fn->nkey_cols;
        for (size_t i = 0; ok && i < json_array_size(arr); i++) {
            json_t *v = json_array_get(arr, i);
            ok = json_is_string(v);
            if (ok) {
                size_t n = json_string_length(v);
                kf_put_be32(key + klen, (uint32_t)n);
                memcpy(key + klen + 4, json_string_value(v), n);
                klen += 4 + n;
            }
        }
        json_decref(arr);
        if (!ok) {
            kf_error_set(err, KF_E_INVALID,
                         "key: this function has %d key columns: give a JSON array of %d strings",
                         fn->nkey_cols, fn->nkey_cols);
            kf_ctx_fail(ctx, cmd);
            return;
        }
    }
    Keyflow__V1__GetKeyStateResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__get_key_state_response__init(resp);
    char *readable;
    size_t readable_len;
    bool well_formed = key_text_of(fn, key, klen, &readable, &readable_len);
    KF_ASSERT(well_formed); /* built from well-formed columns just above */
    resp->key_text = kf_arena_strndup(cmd->arena, readable, readable_len);
    free(readable);
    resp->value_state_name = fn->desc->value_state_name;
    resp->state = KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT;
    fn_key_t *k = key_find(fn, key, klen);
    if (k != NULL) {
        resp->state = (Keyflow__V1__StateKind)k->state; /* KF_STATE_* match StateKind */
        resp->value = k->value;
        resp->timers =
            kf_arena_new(cmd->arena, (fn->desc->n_timer_names + 1) * sizeof *resp->timers);
        for (size_t i = 0; k->timers != NULL && i < fn->desc->n_timer_names; i++) {
            if (k->timers[i] == NULL) {
                continue;
            }
            Keyflow__V1__TimerState *t = kf_arena_new(cmd->arena, sizeof *t);
            keyflow__v1__timer_state__init(t);
            t->name = fn->desc->timer_names[i];
            t->at_us = k->timers[i]->at_us;
            resp->timers[resp->n_timers++] = t;
        }
    }
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

_Static_assert((int)KF_STATE_ABSENT == (int)KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT &&
                   (int)KF_STATE_NULL == (int)KEYFLOW__V1__STATE_KIND__STATE_KIND_NULL &&
                   (int)KF_STATE_VALUE == (int)KEYFLOW__V1__STATE_KIND__STATE_KIND_VALUE,
               "handler state kinds are the API's");

/* ---- recovery ----------------------------------------------------------- */

/* The readable form of a stored canonical key (see row_key). */
static bool key_text_of(const function_t *fn, const uint8_t *key, size_t len, char **text,
                        size_t *text_len) {
    json_t *arr = json_array();
    size_t o = 0;
    for (int c = 0; c < fn->nkey_cols; c++) {
        if (len - o < 4 || len - o - 4 < kf_get_be32(key + o)) {
            json_decref(arr);
            return false;
        }
        uint32_t n = kf_get_be32(key + o);
        json_t *column = json_stringn((const char *)key + o + 4, n);
        if (column == NULL) { /* not UTF-8: no key this engine wrote */
            json_decref(arr);
            return false;
        }
        json_array_append_new(arr, column);
        o += 4 + n;
    }
    if (o != len) {
        json_decref(arr);
        return false;
    }
    if (fn->nkey_cols == 1) {
        json_t *v = json_array_get(arr, 0);
        *text_len = json_string_length(v);
        *text = xmalloc(*text_len + 1);
        memcpy(*text, json_string_value(v), *text_len + 1);
    } else {
        *text = json_dumps(arr, JSON_COMPACT);
        KF_ASSERT(*text != NULL);
        *text_len = strlen(*text);
    }
    json_decref(arr);
    return true;
}

static fn_key_t *recover_key(function_t *fn, const uint8_t *key, size_t len) {
    fn_key_t *k = key_find(fn, key, len);
    if (k != NULL) {
        return k;
    }
    char *text;
    size_t text_len;
    if (!key_text_of(fn, key, len, &text, &text_len)) {
        return NULL;
    }
    k = key_new(fn, key, len, text, text_len);
    free(text);
    return k;
}

typedef kf_status_t (*scan_fn)(function_t *fn, const uint8_t *rest, size_t rest_len,
                               const uint8_t *value, size_t value_len, kf_error_t *err);

static kf_status_t scan_prefix(kf_ctx_t *ctx, function_t *fn, kf_cf_t cf, scan_fn each,
                               kf_error_t *err) {
    kf_key_t lower, upper;
    key_prefix(&lower, fn);
    bool ok = kf_key_prefix_end(&lower, &upper);
    kf_iter_t *it;
    kf_status_t st = kf_iter_create(ctx->store, cf, lower.bytes, lower.len, ok ? upper.bytes : NULL,
                                    ok ? upper.len : 0, &it, err);
    if (st != KF_OK) {
        return st;
    }
    for (kf_iter_seek_first(it); kf_iter_valid(it) && st == KF_OK; kf_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = kf_iter_key(it, &klen);
        const uint8_t *v = kf_iter_value(it, &vlen);
        st = each(fn, k + 4, klen - 4, v, vlen, err);
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    return st;
}

static kf_status_t load_state(function_t *fn, const uint8_t *key, size_t len, const uint8_t *v,
                              size_t vlen, kf_error_t *err) {
    fn_key_t *k = vlen == 9 && (v[0] == KF_STATE_NULL || v[0] == KF_STATE_VALUE)
                      ? recover_key(fn, key, len)
                      : NULL;
    if (k == NULL) {
        return kf_error_set(err, KF_E_CORRUPT, "state of %s: malformed record", fn->id);
    }
    key_set_state(fn, k, v[0], (int64_t)kf_get_be64(v + 1));
    return KF_OK;
}

static kf_status_t load_timer(function_t *fn, const uint8_t *rest, size_t len, const uint8_t *v,
                              size_t vlen, kf_error_t *err) {
    kf_key_reader_t r = kf_key_reader(rest, len);
    const char *key, *name;
    size_t key_len, name_len;
    if (!kf_key_read_lp(&r, &key, &key_len) || !kf_key_read_lp(&r, &name, &name_len) ||
        r.left != 0 || vlen != 8) {
        return kf_error_set(err, KF_E_CORRUPT, "timers of %s: malformed record", fn->id);
    }
    int idx = -1;
    for (size_t i = 0; i < fn->desc->n_timer_names; i++) {
        if (strlen(fn->desc->timer_names[i]) == name_len &&
            memcmp(fn->desc->timer_names[i], name, name_len) == 0) {
            idx = (int)i;
        }
    }
    fn_key_t *k = idx >= 0 ? recover_key(fn, (const uint8_t *)key, key_len) : NULL;
    if (k == NULL) {
        return kf_error_set(err, KF_E_CORRUPT, "timers of %s: unknown timer or malformed key",
                            fn->id);
    }
    key_set_timer(fn, k, (uint8_t)idx, kf_i64_from_ordered(kf_get_be64(v)));
    return KF_OK;
}

static kf_status_t load_producer(function_t *fn, const uint8_t *rest, size_t len, const uint8_t *v,
                                 size_t vlen, kf_error_t *err) {
    (void)rest;
    (void)len;
    Keyflow__Records__ProducerRec *rec = keyflow__records__producer_rec__unpack(NULL, vlen, v);
    if (rec == NULL || rec->n_acks > KF_PRODUCER_ACKS_KEPT) {
        if (rec) {
            keyflow__records__producer_rec__free_unpacked(rec, NULL);
        }
        return kf_error_set(err, KF_E_CORRUPT, "producers of %s: malformed record", fn->id);
    }
    /* Each stored acknowledgement must decode, and a producer appear once:
     * a retry is answered from these later, with no way left to refuse. */
    bool ok = producer_get(fn, rec->producer_id, false) == NULL;
    for (size_t i = 0; ok && i < rec->n_acks; i++) {
        Keyflow__V1__PushBatchResponse *ack = keyflow__v1__push_batch_response__unpack(
            NULL, rec->acks[i]->ack.len, rec->acks[i]->ack.data);
        ok = ack != NULL;
        if (ack != NULL) {
            keyflow__v1__push_batch_response__free_unpacked(ack, NULL);
        }
    }
    if (!ok) {
        kf_status_t st = kf_error_set(err, KF_E_CORRUPT,
                                      "producers of %s: producer %s stored twice or with an "
                                      "undecodable acknowledgement",
                                      fn->id, rec->producer_id);
        keyflow__records__producer_rec__free_unpacked(rec, NULL);
        return st;
    }
    producer_t *p = producer_get(fn, rec->producer_id, true);
    p->last_sequence = rec->last_sequence;
    for (size_t i = 0; i < rec->n_acks; i++) {
        p->ack_seq[i] = rec->acks[i]->sequence;
        p->ack_len[i] = rec->acks[i]->ack.len;
        p->ack[i] = xmalloc(p->ack_len[i]);
        memcpy(p->ack[i], rec->acks[i]->ack.data, p->ack_len[i]);
    }
    p->nacks = (uint32_t)rec->n_acks;
    keyflow__records__producer_rec__free_unpacked(rec, NULL);
    return KF_OK;
}

static kf_status_t load_checkpoint(kf_ctx_t *ctx, function_t *fn, kf_error_t *err) {
    kf_key_t k;
    key_prefix(&k, fn);
    kf_value_t v;
    bool found;
    kf_status_t st = kf_store_get(ctx->store, KF_CF_CHECKPOINTS, k.bytes, k.len, &v, &found, err);
    if (st != KF_OK) {
        return st;
    }
    if (!found) {
        return kf_error_set(err, KF_E_CORRUPT, "checkpoint of %s: missing", fn->id);
    }
    Keyflow__Records__CheckpointRec *cp =
        keyflow__records__checkpoint_rec__unpack(NULL, v.len, v.data);
    kf_store_value_free(&v);
    if (cp == NULL || cp->codec_version != STATE_CODEC_VERSION ||
        strcmp(cp->descriptor_sha256, fn->sha256) != 0) {
        st = kf_error_set(err, KF_E_CORRUPT,
                          "checkpoint of %s: state codec %d for descriptor %s, expected codec %d "
                          "for %s",
                          fn->id, cp ? cp->codec_version : -1, cp ? cp->descriptor_sha256 : "?",
                          STATE_CODEC_VERSION, fn->sha256);
    } else {
        fn->has_watermark = cp->has_watermark;
        fn->watermark_us = cp->watermark_us;
        fn->next_activation = cp->next_activation_id;
        fn->output_seq = fn->durable_output_seq = cp->output_seq;
    }
    if (cp) {
        keyflow__records__checkpoint_rec__free_unpacked(cp, NULL);
    }
    return st;
}

static kf_status_t recover_function(kf_functions_t *fns, kf_ctx_t *ctx, const void *v, size_t vlen,
                                    kf_error_t *err) {
    Keyflow__Records__FunctionRec *rec = keyflow__records__function_rec__unpack(NULL, vlen, v);
    if (rec == NULL) {
        return kf_error_set(err, KF_E_CORRUPT, "functions: undecodable record");
    }
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    kf_status_t st = KF_OK;
    Keyflow__V1__FunctionDescriptor *d = keyflow__v1__function_descriptor__unpack(
        kf_arena_pb(&arena), rec->descriptor.len, rec->descriptor.data);
    Keyflow__V1__FunctionDescriptor *canonical = NULL;
    uint8_t *bytes;
    size_t len;
    char sha[KF_SHA256_HEX_BYTES + 1];
    if (d == NULL || kf_descriptor_canonicalize(d, &arena, &canonical, err) != KF_OK ||
        kf_descriptor_encode(canonical, &arena, &bytes, &len, sha, err) != KF_OK ||
        strcmp(sha, rec->sha256) != 0) {
        st =
            kf_error_set(err, KF_E_CORRUPT, "functions: descriptor of %s does not match its sha256",
                         d ? d->function_id : "?");
    }
    if (st == KF_OK &&
        kf_map_get(&fns->by_id, canonical->function_id, strlen(canonical->function_id)) != NULL) {
        st = kf_error_set(err, KF_E_CORRUPT, "functions: %s is stored twice",
                          canonical->function_id);
    }
    if (st == KF_OK) {
        function_t *fn = fn_new(fns, canonical, sha, rec->index, rec->created_ms);
        if (fn->index >= fns->next_index) {
            fns->next_index = fn->index + 1;
        }
        if (fn->handler == NULL) {
            kf_log(KF_LOG_WARN, "functions", "%s is unavailable: %s", fn->id, fn->unavailable);
        }
        if ((st = load_checkpoint(ctx, fn, err)) == KF_OK &&
            (st = scan_prefix(ctx, fn, KF_CF_STATE, load_state, err)) == KF_OK &&
            (st = scan_prefix(ctx, fn, KF_CF_TIMERS_BY_KEY, load_timer, err)) == KF_OK) {
            st = scan_prefix(ctx, fn, KF_CF_PRODUCERS, load_producer, err);
        }
    }
    kf_arena_deinit(&arena);
    keyflow__records__function_rec__free_unpacked(rec, NULL);
    return st;
}

kf_status_t kf_functions_recover(kf_functions_t *fns, kf_ctx_t *ctx, kf_error_t *err) {
    kf_value_t v;
    bool found;
    kf_status_t st = kf_store_get(ctx->store, KF_CF_META, fn_index_key, sizeof fn_index_key - 1, &v,
                                  &found, err);
    if (st != KF_OK) {
        return st;
    }
    if (found) {
        fns->next_index = v.len == 4 ? kf_get_be32(v.data) : 0;
        kf_store_value_free(&v);
    }
    kf_iter_t *it;
    if ((st = kf_iter_create(ctx->store, KF_CF_FUNCTIONS, NULL, 0, NULL, 0, &it, err)) != KF_OK) {
        return st;
    }
    for (kf_iter_seek_first(it); kf_iter_valid(it) && st == KF_OK; kf_iter_next(it)) {
        size_t vlen;
        const void *val = kf_iter_value(it, &vlen);
        st = recover_function(fns, ctx, val, vlen, err);
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    return st;
}

/* ---- lifecycle ---------------------------------------------------------- */

kf_functions_t *kf_functions_create(const char *plugin_dir, bool defer_calls) {
    kf_functions_t *fns = calloc(1, sizeof *fns);
    KF_ASSERT(fns != NULL);
    fns->defer_calls = defer_calls;
    kf_map_init(&fns->by_id);
    fns->plugins = kf_plugins_create(plugin_dir);
    return fns;
}

void kf_functions_destroy(kf_functions_t *fns) {
    if (fns == NULL) {
        return;
    }
    size_t b;
    kf_map_node_t *n = kf_map_first(&fns->by_id, &b);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&fns->by_id, &b, n);
        fn_free(KF_CONTAINER_OF(n, function_t, node));
        n = next;
    }
    kf_map_deinit(&fns->by_id);
    kf_plugins_destroy(fns->plugins);
    free(fns->pending);
    free(fns->scratch);
    free(fns);
}
