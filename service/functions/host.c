/*
 * host.c - the handler host: how a step's handler call reaches a handler
 * and how the handler's response is recorded, for validation in step.c.
 *
 * Two halves, one seam (the diagram is in functions_int.h):
 *   - kf__host_abi, the kf_host_t of keyflow/handler.h: input accessors over
 *     the step's rows, and builder functions that record a response (output
 *     rows, one state mutation per activation, ordered timer operations)
 *     into the kf_call_t. Any host records through them, so a response is
 *     checked the same way whoever sent it.
 *   - kf__handler_host_t implementations that carry a call to a handler:
 *     native_host invokes the plugin at once (KF__CALL_ANSWERED);
 *     deferred_host (the defer_calls test seam) leaves the call out
 *     (KF__CALL_OUT) and invokes the plugin on kf_functions_pump(), the way
 *     a remote worker's response arrives later; kf__remote_host (remote.c)
 *     sends calls to workers.
 *
 * Invariants
 *   1. Builder functions check their arguments as they are called; the
 *      first failure marks the call failed (kf__call_fail) and later calls
 *      change nothing that validation would accept. Nothing recorded here
 *      touches function state: step.c applies a response only after it
 *      validated the whole of it.
 *   2. Memory a handler can make the host take (output values, timer
 *      operations) is bounded by the descriptor's limits as it arrives,
 *      not only when the call returns. Output limits count the whole step
 *      (earlier calls' rows and bytes included).
 *   3. A call is out at most once per step at a time; while it is out the
 *      step and its arena stay alive (the function is held, see step.c).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/metrics.h"
#include "base/text.h"
#include "base/watchdog.h"
#include "functions/functions_int.h"

/* ---- kf__host_abi: recording a response -------------------------------- */

int kf__call_fail(kf_call_t *call, kf_status_t st, const char *fmt, ...) {
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

/* The value at (row, column) when the column is of type `want1` or `want2`
 * and the value is not null; false otherwise (the accessor then reads as
 * null / 0 / NULL, as keyflow/handler.h promises). */
static bool in_value(const kf_call_t *call, uint32_t row, int column, Keyflow__V1__FieldType want1,
                     Keyflow__V1__FieldType want2, kf_cell_t *out) {
    const kf_column_t *c = in_col(call, row, column);
    if (c == NULL || (c->type->type != want1 && c->type->type != want2) ||
        (c->nulls != NULL && c->nulls[row])) {
        return false;
    }
    kf_rows_value(call->step->rows, row, (uint32_t)column, out);
    return true;
}

static int64_t host_input_int64(const kf_call_t *call, uint32_t row, int column) {
    kf_cell_t v = {0};
    return in_value(call, row, column, KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64,
                    KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US, &v)
               ? v.v.i
               : 0;
}

static double host_input_float64(const kf_call_t *call, uint32_t row, int column) {
    kf_cell_t v = {0};
    return in_value(call, row, column, KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64,
                    KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64, &v)
               ? v.v.f
               : 0.0;
}

static int host_input_bool(const kf_call_t *call, uint32_t row, int column) {
    kf_cell_t v = {0};
    return in_value(call, row, column, KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BOOL,
                    KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BOOL, &v)
               ? v.v.i != 0
               : 0;
}

static const char *host_input_utf8(const kf_call_t *call, uint32_t row, int column, size_t *len) {
    kf_cell_t v = {0};
    bool found = in_value(call, row, column, KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8,
                          KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, &v);
    *len = v.len;
    return found ? v.p : NULL;
}

static const uint8_t *host_input_bytes(const kf_call_t *call, uint32_t row, int column,
                                       size_t *len) {
    kf_cell_t v = {0};
    bool found = in_value(call, row, column, KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BYTES,
                          KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BYTES, &v);
    *len = v.len;
    return found ? (const uint8_t *)v.p : NULL;
}

static int check_act(kf_call_t *call, uint32_t act, const char *what) {
    if (act >= call->count) {
        return kf__call_fail(call, KF_E_PRECONDITION, "%s: activation index %u, the call has %u",
                             what, act, call->count);
    }
    return 0;
}

static int host_row_begin(kf_call_t *call, uint32_t act) {
    if (check_act(call, act, "row_begin") != 0) {
        return -1;
    }
    if (call->cur_row >= 0) {
        return kf__call_fail(call, KF_E_PRECONDITION, "row_begin: the previous row was not ended");
    }
    /* Per step: the rows earlier calls of the step wrote count too. */
    if ((int64_t)call->step->out.rows + call->out.rows >= call->step->fn->limits.max_output_rows) {
        return kf__call_fail(call, KF_E_LIMIT,
                             "max_output_rows: more than %lld output rows in one step",
                             (long long)call->step->fn->limits.max_output_rows);
    }
    if (kf_outbuf_add_row(&call->out) == NULL) {
        return kf__call_fail(call, KF_E_LIMIT, "output: out of memory for this step");
    }
    if (call->out.rows > call->row_act_cap) {
        uint32_t cap = call->row_act_cap ? call->row_act_cap * 2 : 256;
        uint32_t *p = kf_arena_alloc(call->step->arena, cap * sizeof *p);
        if (p == NULL) {
            return kf__call_fail(call, KF_E_LIMIT, "output: out of memory for this step");
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
        kf__call_fail(call, KF_E_PRECONDITION, "%s: no row begun", what);
        return NULL;
    }
    const Keyflow__V1__Schema *s = call->step->fn->desc->output_schema;
    if (column < 0 || (size_t)column >= s->n_fields) {
        kf__call_fail(call, KF_E_PRECONDITION, "%s: output column %d does not exist", what, column);
        return NULL;
    }
    Keyflow__V1__FieldType t = s->fields[column]->type;
    if (want1 != 0 && t != want1 && t != want2) {
        kf__call_fail(call, KF_E_PRECONDITION, "%s: output column %s is not of that type", what,
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
        return kf__call_fail(call, KF_E_PRECONDITION, "%s: NULL value with length %zu", what, len);
    }
    kf_cell_t given = {.p = value, .len = (uint32_t)len};
    if (!kf_column_type(type)->valid(&given)) { /* only UTF8 values can be invalid */
        return kf__call_fail(call, KF_E_PRECONDITION, "%s: not valid UTF-8 without NUL bytes",
                             what);
    }
    /* Checked as values arrive, not only when the call returns: every
     * copy (overwrites included) lives in the step's arena until the step
     * ends, so a handler must not be able to fill it. */
    int64_t limit = call->step->fn->limits.max_output_bytes;
    if ((int64_t)(call->step->out.bytes + call->out.bytes + len) > limit) {
        return kf__call_fail(call, KF_E_LIMIT,
                             "max_output_bytes: the step would write more than %lld bytes of "
                             "output",
                             (long long)limit);
    }
    char *copy = kf_arena_alloc(call->step->arena, len + 1);
    if (copy == NULL) {
        return kf__call_fail(call, KF_E_LIMIT, "output: out of memory for this step");
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
        return kf__call_fail(call, KF_E_PRECONDITION, "row_end: no row begun");
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
        return kf__call_fail(call, KF_E_PRECONDITION,
                             "%s: activation %" PRIu64
                             " already has a state mutation (one per activation)",
                             what, call->acts[act].id);
    }
    r->mutation = mutation;
    r->value = value;
    return 0;
}

static int host_state_set(kf_call_t *call, uint32_t act, int64_t value) {
    return mutate(call, act, KF__MUT_SET, value, "state_set");
}
static int host_state_set_null(kf_call_t *call, uint32_t act) {
    return mutate(call, act, KF__MUT_SET_NULL, 0, "state_set_null");
}
static int host_state_clear(kf_call_t *call, uint32_t act) {
    return mutate(call, act, KF__MUT_CLEAR, 0, "state_clear");
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
        return kf__call_fail(call, KF_E_PRECONDITION,
                             "%s: timer \"%.64s\" is not declared in timer_names", what,
                             name ? name : "(null)");
    }
    /* Before the first watermark, watermark_us() is INT64_MIN: nothing is
     * after it but a real time (INT64_MIN also means "no timer" inside). */
    int64_t watermark = call->step->has_watermark ? call->step->watermark : INT64_MIN;
    if (op == KF__TOP_SET && at_us <= watermark) {
        return kf__call_fail(call, KF_E_PRECONDITION,
                             "%s: timer \"%s\" at %" PRId64
                             " us is not after the watermark %" PRId64,
                             what, name, at_us, watermark);
    }
    if (call->ntops >= KF_FN_TIMER_OPS_PER_CALL_MAX) {
        return kf__call_fail(call, KF_E_LIMIT, "%s: more than %d timer operations in one call",
                             what, KF_FN_TIMER_OPS_PER_CALL_MAX);
    }
    if (call->ntops == call->tops_cap) {
        uint32_t cap = call->tops_cap ? call->tops_cap * 2 : 64;
        timer_op_t *p = kf_arena_alloc(call->step->arena, cap * sizeof *p);
        if (p == NULL) {
            return kf__call_fail(call, KF_E_LIMIT, "timers: out of memory for this step");
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
    return timer_op(call, act, name, KF__TOP_SET, at_us, "timer_set");
}
static int host_timer_cancel(kf_call_t *call, uint32_t act, const char *name) {
    return timer_op(call, act, name, KF__TOP_CANCEL, 0, "timer_cancel");
}
static void host_fail(kf_call_t *call, const char *message) {
    kf__call_fail(call, KF_E_PRECONDITION, "handler refused the call: %.300s",
                  message ? message : "");
}

const kf_host_t kf__host_abi = {
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

/* ---- the call object --------------------------------------------------- */

void kf__call_init(kf_call_t *call, step_t *s, uint32_t cap) {
    memset(call, 0, sizeof *call);
    call->step = s;
    call->cap = cap;
    call->acts = kf_arena_new(s->arena, cap * sizeof *call->acts);
    call->keys = kf_arena_new(s->arena, cap * sizeof *call->keys);
    call->res = kf_arena_new(s->arena, cap * sizeof *call->res);
    kf_outbuf_init(&call->out, s->fn->desc->output_schema, s->arena);
    call->cur_row = -1;
}

void kf__call_reset(kf_call_t *call) {
    call->count = 0;
    call->ntops = 0;
    call->out.rows = 0;
    call->out.bytes = 0;
    call->cur_row = -1;
    call->failed = false;
    call->answered = false;
    call->host_data = NULL;
    memset(call->res, 0, call->cap * sizeof *call->res);
}

void kf__call_add(kf_call_t *call, fn_key_t *k, uint64_t id, int32_t callback, uint32_t row,
                  int64_t event_time_us, const char *timer_name) {
    KF_ASSERT(call->count < call->cap && !k->in_call);
    kf_activation_t *a = &call->acts[call->count];
    a->id = id;
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
    k->in_call = 1;
}

/* ---- handler hosts ----------------------------------------------------- */

/* The call runs on the engine thread, under the watchdog (base/watchdog.h):
 * a handler that does not return within call_timeout_ms ends the process
 * before its step commits. */
static void native_invoke(kf_functions_t *fns, function_t *fn, kf_call_t *call) {
    kf_watchdog_t *wd = fns->config->watchdog;
    if (wd != NULL) {
        kf_watchdog_arm(wd, fn->watch_what, "limits.call_timeout_ms", fn->limits.call_timeout_ms);
    }
    int rc = fn->handler->invoke(&kf__host_abi, call, call->acts, call->count);
    if (wd != NULL) {
        kf_watchdog_disarm(wd);
    }
    if (rc != 0) {
        kf__call_fail(call, KF_E_PRECONDITION, "handler returned %d", rc);
    }
}

/* Native handlers answer inside invoke(), so one call at a time. */
static int native_room(kf_functions_t *fns, function_t *fn) {
    (void)fns;
    (void)fn;
    return 1;
}

static kf__call_sent_t native_send(kf_functions_t *fns, function_t *fn, kf_call_t *call) {
    (void)fns;
    native_invoke(fns, fn, call);
    return KF__CALL_ANSWERED;
}

/* Never called: a native call is never out. */
static void native_abandon(kf_functions_t *fns, function_t *fn, kf_call_t *call) {
    (void)fns;
    (void)fn;
    (void)call;
    KF_UNREACHABLE();
}

static const kf__handler_host_t native_host = {
    .name = "native",
    .pipelines = false,
    .room = native_room,
    .send = native_send,
    .abandon = native_abandon,
};

const kf__handler_host_t *kf__host_native(void) {
    return &native_host;
}

/* The defer_calls test seam: one call at a time stays out until
 * kf_functions_pump(). */
static int deferred_room(kf_functions_t *fns, function_t *fn) {
    (void)fns;
    return fn->active != NULL && fn->active->nout > 0 ? 0 : 1;
}

static kf__call_sent_t deferred_send(kf_functions_t *fns, function_t *fn, kf_call_t *call) {
    (void)fns;
    (void)fn;
    (void)call;
    return KF__CALL_OUT;
}

/* The step ended while its call was out: pump() finds nothing to answer. */
static void deferred_abandon(kf_functions_t *fns, function_t *fn, kf_call_t *call) {
    (void)fns;
    (void)fn;
    (void)call;
}

static const kf__handler_host_t deferred_host = {
    .name = "native (deferred)",
    .pipelines = false,
    .room = deferred_room,
    .send = deferred_send,
    .abandon = deferred_abandon,
};

void kf__host_attach(kf_functions_t *fns, function_t *fn) {
    fn->host = NULL;
    fn->handler = NULL;
    if (fn->desc->runtime == KEYFLOW__V1__RUNTIME__RUNTIME_REMOTE) {
        fn->host = &kf__remote_host;
        snprintf(fn->unavailable, sizeof fn->unavailable,
                 "no worker serves %s: start one (Workers/Serve) with its implementation_digest",
                 fn->id);
        return;
    }
    kf_error_t err;
    if (kf_plugins_find(fns->plugins, fn->desc->implementation_digest, &fn->handler, &err) !=
        KF_OK) {
        fn->handler = NULL;
        snprintf(fn->unavailable, sizeof fn->unavailable, "%s", err.message);
        return;
    }
    fn->host = fns->defer_calls ? &deferred_host : &native_host;
}

/* Sends a call to the handler through the function's host. A native
 * handler answers inside send(); a remote one (or the test seam
 * `defer_calls`) answers later, from a worker's result (remote.c) or
 * kf_functions_pump(); either way the response then goes through step.c's
 * take_response() exactly as an immediate one does. */
kf__call_sent_t kf__call_send(kf_call_t *call) {
    step_t *s = call->step;
    KF_ASSERT(s->fn->host != NULL);
    s->calls++;
    s->activations += call->count;
    kf_counter_add(KF_C_HANDLER_CALLS, 1);
    return s->fn->host->send(s->fns, s->fn, call);
}

void kf_functions_pump(kf_functions_t *fns, kf_ctx_t *ctx) {
    size_t b;
    for (kf_map_node_t *n = kf_map_first(&fns->by_id, &b); n; n = kf_map_next(&fns->by_id, &b, n)) {
        function_t *fn = KF_CONTAINER_OF(n, function_t, node);
        step_t *s = fn->active;
        if (fn->host != &deferred_host || s == NULL || !s->awaiting) {
            continue;
        }
        for (uint32_t i = 0; i < s->nout; i++) {
            kf_call_t *call = s->calls_out[(s->out_head + i) % KF_FN_CALLS_IN_FLIGHT_MAX];
            if (!call->answered) {
                native_invoke(fns, fn, call);
                call->answered = true;
            }
        }
        kf__step_resume(fns, ctx, fn);
    }
}
