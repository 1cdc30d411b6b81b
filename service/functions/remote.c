/*
 * remote.c - the remote handler host: a REMOTE function's handler calls go
 * to worker processes on the Workers stream (api/keyflow/v1/workers.proto),
 * which a front end relays (step/engine_types.h, "remote handler workers").
 *
 * A worker's life, with the function behind each transition:
 *
 *   HELLO --worker_hello--> SERVING: in fn->workers, welcome sent
 *     | refused                |  remote_send: a call out in a slot, deadline armed
 *     | (ops->close)           |  RESULT --worker_result--> recorded into the call,
 *     v                        |           the step resumed
 *   CLOSED <--worker_close-----+  deadline --kf_functions_fire_call--> worker_close
 *     |                        |  GONE --worker_gone--> worker_close (no ops->close)
 *     | GONE --worker_gone--> ops->release, freed
 *
 * Invariants
 *   1. A worker has at most `concurrency` calls out, one per slot. A slot is
 *      busy from remote_send until the call's result arrives or the worker
 *      closes. A call whose step ended (remote_abandon) keeps its slot with
 *      call = NULL: the worker is still working on it, and its result is
 *      dropped when it comes.
 *   2. Every busy slot has its deadline armed; a missed deadline closes the
 *      worker, since a stuck worker would hold its function's batches.
 *   3. A result is recorded through kf__host_abi, the builder functions a
 *      native handler writes through, so step.c validates it exactly like a
 *      native response; a result that does not fit its call (list lengths,
 *      activation indexes, column types) fails the call naming what.
 *   4. Closing a worker fails each live call it had with the reason and
 *      resumes the function's step, which then refuses its batch: nothing
 *      of it is applied (step.c rolls the whole step back).
 *   5. The engine touches a link only between its HELLO and ops->release.
 *
 * Engine-thread only.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/metrics.h"
#include "functions/functions_int.h"
#include "keyflow/v1/workers.pb-c.h"
#include "step/ctx.h"

typedef struct kf__worker worker_t;

typedef struct slot {
    kf_timer_t deadline; /* KF_TIMER_REMOTE_CALL; first, for KF_CONTAINER_OF */
    worker_t *worker;
    uint64_t call_id; /* 0: free */
    kf_call_t *call;  /* NULL: free, or abandoned by its step */
} slot_t;

struct kf__worker {
    kf_map_node_t node; /* fns->workers, keyed by the bytes of `link` */
    kf_worker_link_t *link;
    const kf_worker_ops_t *ops;
    const kf_principal_t *principal; /* the stream's key (borrowed), or NULL */
    function_t *fn;                  /* NULL: not serving (refused, or closed) */
    worker_t *next;                  /* fn->workers */
    worker_t *prev;
    char id[24]; /* "w<n>", this server's name for the stream */
    char name[KF_WORKER_NAME_BYTES_MAX + 1];
    char peer[64];
    uint32_t concurrency;
    uint32_t inflight;
    slot_t slots[KF_WORKER_CONCURRENCY_MAX];
};

void kf__remote_init(kf_functions_t *fns) {
    kf_map_init(&fns->workers);
}

bool kf__remote_available(const function_t *fn) {
    return fn->nworkers > 0;
}

static worker_t *worker_of(kf_functions_t *fns, kf_worker_link_t *const *link) {
    kf_map_node_t *n = kf_map_get(&fns->workers, link, sizeof *link);
    return n != NULL ? KF_CONTAINER_OF(n, worker_t, node) : NULL;
}

/* ---- sending ------------------------------------------------------------ */

/* Packs a ServerMessage into a malloc'd buffer for ops->send. */
static uint8_t *pack_message(const Keyflow__V1__ServerMessage *m, size_t *len) {
    *len = keyflow__v1__server_message__get_packed_size(m);
    uint8_t *buf = kf_xmalloc(*len);
    size_t packed = keyflow__v1__server_message__pack(m, buf);
    KF_ASSERT(packed == *len);
    return buf;
}

/* The call as a HandlerCall: what a native handler sees, columnar. Values
 * point into the step (keys, rows) until packed. NULL when too large. */
static uint8_t *encode_call(const kf_call_t *call, uint64_t call_id, size_t *len, kf_error_t *err) {
    const step_t *s = call->step;
    uint32_t n = call->count;
    kf_arena_t a;
    kf_arena_init(&a, 0);
    Keyflow__V1__HandlerCall hc = KEYFLOW__V1__HANDLER_CALL__INIT;
    hc.call_id = call_id;
    if (s->has_watermark) {
        hc.watermark_present_case = KEYFLOW__V1__HANDLER_CALL__WATERMARK_PRESENT_WATERMARK_US;
        hc.watermark_us = s->watermark;
    }
    size_t cap = n ? n : 1;
    hc.activation_ids = kf_arena_alloc(&a, cap * sizeof *hc.activation_ids);
    hc.keys = kf_arena_alloc(&a, cap * sizeof *hc.keys);
    hc.key_texts = kf_arena_alloc(&a, cap * sizeof *hc.key_texts);
    hc.event_times_us = kf_arena_alloc(&a, cap * sizeof *hc.event_times_us);
    hc.callbacks = kf_arena_alloc(&a, cap * sizeof *hc.callbacks);
    hc.timer_names = kf_arena_alloc(&a, cap * sizeof *hc.timer_names);
    hc.states = kf_arena_alloc(&a, cap * sizeof *hc.states);
    hc.state_values = kf_arena_alloc(&a, cap * sizeof *hc.state_values);
    uint32_t *which = kf_arena_alloc(&a, cap * sizeof *which);
    /* A call holds at most KF_FN_MAX_BATCH_ROWS_MAX activations: these
     * arrays are far below the arena's limit. */
    KF_ASSERT(hc.activation_ids && hc.keys && hc.key_texts && hc.event_times_us && hc.callbacks &&
              hc.timer_names && hc.states && hc.state_values && which);
    uint32_t nrows = 0;
    for (uint32_t i = 0; i < n; i++) {
        const kf_activation_t *act = &call->acts[i];
        hc.activation_ids[i] = act->id;
        hc.keys[i].data = (uint8_t *)act->key;
        hc.keys[i].len = act->key_len;
        hc.key_texts[i] = (char *)act->key_text;
        hc.event_times_us[i] = act->event_time_us;
        bool row = act->callback == KF_CALLBACK_ROW;
        hc.callbacks[i] = row ? KEYFLOW__V1__CALLBACK_KIND__CALLBACK_KIND_ROW
                              : KEYFLOW__V1__CALLBACK_KIND__CALLBACK_KIND_TIMER;
        hc.timer_names[i] = row ? (char *)"" : (char *)act->timer_name;
        hc.states[i] = (Keyflow__V1__StateKind)act->state_kind; /* same numbers */
        hc.state_values[i] = act->state_kind == KF_STATE_VALUE ? act->state_value : 0;
        if (row) {
            which[nrows++] = act->row;
        }
    }
    hc.n_activation_ids = hc.n_keys = hc.n_key_texts = hc.n_event_times_us = n;
    hc.n_callbacks = hc.n_timer_names = hc.n_states = hc.n_state_values = n;
    if (nrows > 0) {
        hc.rows = kf_rows_gather(s->rows, which, nrows, &a);
        KF_ASSERT(hc.rows != NULL);
    }
    Keyflow__V1__ServerMessage m = KEYFLOW__V1__SERVER_MESSAGE__INIT;
    m.message_case = KEYFLOW__V1__SERVER_MESSAGE__MESSAGE_CALL;
    m.call = &hc;
    uint8_t *buf = NULL;
    size_t size = keyflow__v1__server_message__get_packed_size(&m);
    if (size > KF_RESPONSE_BYTES_MAX) {
        kf_error_set(err, KF_E_TOO_LARGE,
                     "the handler call would be %zu bytes, more than a worker stream carries (%d); "
                     "lower limits.max_batch_rows",
                     size, KF_RESPONSE_BYTES_MAX);
    } else {
        buf = pack_message(&m, len);
    }
    kf_arena_deinit(&a);
    return buf;
}

/* ---- recording a result ------------------------------------------------- */

/* Output rows of a result, through the builder functions (invariant 3). */
static void record_output(const worker_t *w, kf_call_t *call, const Keyflow__V1__CallResult *r) {
    const kf_host_t *h = &kf__host_abi;
    const Keyflow__V1__RowBatch *b = r->output;
    const Keyflow__V1__Schema *schema = call->step->fn->desc->output_schema;
    uint64_t rows = b != NULL && b->row_count > 0 ? (uint64_t)b->row_count : 0;
    if (b != NULL && b->row_count < 0) {
        kf__call_fail(call, KF_E_PRECONDITION, "worker %s: result.output.row_count is %" PRId64,
                      w->id, b->row_count);
        return;
    }
    if (r->n_output_activations != rows) {
        kf__call_fail(call, KF_E_PRECONDITION,
                      "worker %s: result.output_activations has %zu entries for %" PRIu64
                      " output rows",
                      w->id, r->n_output_activations, rows);
        return;
    }
    if (rows == 0) {
        return;
    }
    if (b->n_columns != schema->n_fields) {
        kf__call_fail(call, KF_E_PRECONDITION,
                      "worker %s: result.output has %zu columns, the output schema %zu", w->id,
                      b->n_columns, schema->n_fields);
        return;
    }
    for (size_t c = 0; c < b->n_columns; c++) {
        const Keyflow__V1__Column *col = b->columns[c];
        const Keyflow__V1__Field *f = schema->fields[c];
        size_t nvalues = 0;
        Keyflow__V1__Column__ValuesCase want = KEYFLOW__V1__COLUMN__VALUES__NOT_SET;
        switch (f->type) {
        case KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BOOL:
            want = KEYFLOW__V1__COLUMN__VALUES_BOOLS;
            nvalues = col->values_case == want ? col->bools->n_values : 0;
            break;
        case KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64:
        case KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US:
            want = KEYFLOW__V1__COLUMN__VALUES_INT64S;
            nvalues = col->values_case == want ? col->int64s->n_values : 0;
            break;
        case KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64:
            want = KEYFLOW__V1__COLUMN__VALUES_FLOAT64S;
            nvalues = col->values_case == want ? col->float64s->n_values : 0;
            break;
        case KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8:
            want = KEYFLOW__V1__COLUMN__VALUES_STRINGS;
            nvalues = col->values_case == want ? col->strings->n_values : 0;
            break;
        case KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BYTES:
            want = KEYFLOW__V1__COLUMN__VALUES_BYTES_VALUES;
            nvalues = col->values_case == want ? col->bytes_values->n_values : 0;
            break;
        default: KF_UNREACHABLE(); /* descriptors admit only these */
        }
        if (col->name[0] != '\0' && strcmp(col->name, f->name) != 0) {
            kf__call_fail(call, KF_E_PRECONDITION,
                          "worker %s: result.output.columns[%zu] is named %.64s, the output schema "
                          "has %s there",
                          w->id, c, col->name, f->name);
            return;
        }
        bool all_null = col->n_nulls == rows && col->values_case == 0;
        if (!all_null && (col->values_case != want || nvalues != rows)) {
            /* The names of the Column fields, so that the worker's author
             * reads "strings", not the oneof's case number. */
            const ProtobufCFieldDescriptor *want_f =
                protobuf_c_message_descriptor_get_field(&keyflow__v1__column__descriptor, want);
            const ProtobufCFieldDescriptor *got_f = protobuf_c_message_descriptor_get_field(
                &keyflow__v1__column__descriptor, (unsigned)col->values_case);
            kf__call_fail(call, KF_E_PRECONDITION,
                          "worker %s: result.output column %s needs %" PRIu64
                          " values in %s (%zu given, the column has %s)",
                          w->id, f->name, rows, want_f != NULL ? want_f->name : "?", nvalues,
                          got_f != NULL ? got_f->name : "no values");
            return;
        }
        if (col->n_nulls != 0 && col->n_nulls != rows) {
            kf__call_fail(call, KF_E_PRECONDITION,
                          "worker %s: result.output column %s has %zu null flags for %" PRIu64
                          " rows",
                          w->id, f->name, col->n_nulls, rows);
            return;
        }
    }
    for (uint64_t i = 0; i < rows; i++) {
        if (h->row_begin(call, r->output_activations[i]) != 0) {
            return;
        }
        for (size_t c = 0; c < b->n_columns; c++) {
            const Keyflow__V1__Column *col = b->columns[c];
            int rc;
            if (col->n_nulls != 0 && col->nulls[i]) {
                rc = h->row_set_null(call, (int)c);
            } else {
                switch (col->values_case) {
                case KEYFLOW__V1__COLUMN__VALUES_BOOLS:
                    rc = h->row_set_bool(call, (int)c, col->bools->values[i]);
                    break;
                case KEYFLOW__V1__COLUMN__VALUES_INT64S:
                    rc = h->row_set_int64(call, (int)c, col->int64s->values[i]);
                    break;
                case KEYFLOW__V1__COLUMN__VALUES_FLOAT64S:
                    rc = h->row_set_float64(call, (int)c, col->float64s->values[i]);
                    break;
                case KEYFLOW__V1__COLUMN__VALUES_STRINGS: {
                    const char *v = col->strings->values[i];
                    rc = h->row_set_utf8(call, (int)c, v, strlen(v));
                    break;
                }
                case KEYFLOW__V1__COLUMN__VALUES_BYTES_VALUES:
                    rc = h->row_set_bytes(call, (int)c, col->bytes_values->values[i].data,
                                          col->bytes_values->values[i].len);
                    break;
                case KEYFLOW__V1__COLUMN__VALUES__NOT_SET:
                default:
                    rc = kf__call_fail(call, KF_E_PRECONDITION,
                                       "worker %s: result.output row %" PRIu64
                                       ": column %zu has no value",
                                       w->id, i, c);
                    break;
                }
            }
            if (rc != 0) {
                return;
            }
        }
        if (h->row_end(call) != 0) {
            return;
        }
    }
}

/* A worker's result into its call, through kf__host_abi (invariant 3): the
 * first problem marks the call failed, and step.c refuses the batch. */
static void record_result(const worker_t *w, kf_call_t *call, const Keyflow__V1__CallResult *r) {
    const kf_host_t *h = &kf__host_abi;
    uint32_t n = call->count;
    if (r->error[0] != '\0') {
        h->fail(call, r->error);
        return;
    }
    if ((r->n_mutations != 0 && r->n_mutations != n) ||
        (r->n_state_values != 0 && r->n_state_values != n)) {
        kf__call_fail(call, KF_E_PRECONDITION,
                      "worker %s: result has %zu mutations and %zu state_values for %u "
                      "activations (each: one per activation, or none)",
                      w->id, r->n_mutations, r->n_state_values, n);
        return;
    }
    size_t ntimers = r->n_timer_activations;
    if (r->n_timer_ops != ntimers || r->n_timer_names != ntimers ||
        (r->n_timer_at_us != ntimers && r->n_timer_at_us != 0)) {
        kf__call_fail(call, KF_E_PRECONDITION,
                      "worker %s: result timer lists differ in length (activations %zu, ops %zu, "
                      "names %zu, at_us %zu)",
                      w->id, ntimers, r->n_timer_ops, r->n_timer_names, r->n_timer_at_us);
        return;
    }
    record_output(w, call, r);
    for (uint32_t i = 0; i < r->n_mutations && !call->failed; i++) {
        switch (r->mutations[i]) {
        case KEYFLOW__V1__MUTATION__MUTATION_UNCHANGED: break;
        case KEYFLOW__V1__MUTATION__MUTATION_SET:
            if (r->n_state_values == 0) {
                kf__call_fail(call, KF_E_PRECONDITION,
                              "worker %s: result.mutations[%u] is SET but state_values is empty",
                              w->id, i);
            } else {
                h->state_set(call, i, r->state_values[i]);
            }
            break;
        case KEYFLOW__V1__MUTATION__MUTATION_SET_NULL: h->state_set_null(call, i); break;
        case KEYFLOW__V1__MUTATION__MUTATION_CLEAR: h->state_clear(call, i); break;
        default:
            kf__call_fail(call, KF_E_PRECONDITION, "worker %s: result.mutations[%u]: unknown %d",
                          w->id, i, (int)r->mutations[i]);
            break;
        }
    }
    for (size_t t = 0; t < ntimers && !call->failed; t++) {
        switch (r->timer_ops[t]) {
        case KEYFLOW__V1__TIMER_OP__TIMER_OP_SET:
            h->timer_set(call, r->timer_activations[t], r->timer_names[t],
                         r->n_timer_at_us ? r->timer_at_us[t] : 0);
            break;
        case KEYFLOW__V1__TIMER_OP__TIMER_OP_CANCEL:
            h->timer_cancel(call, r->timer_activations[t], r->timer_names[t]);
            break;
        default:
            kf__call_fail(call, KF_E_PRECONDITION, "worker %s: result.timer_ops[%zu]: unknown %d",
                          w->id, t, (int)r->timer_ops[t]);
            break;
        }
    }
}

/* ---- worker lifecycle --------------------------------------------------- */

static void slot_clear(kf_ctx_t *ctx, worker_t *w, slot_t *slot) {
    if (ctx != NULL) {
        kf_heap_disarm(&ctx->heap, &slot->deadline);
    }
    slot->call_id = 0;
    slot->call = NULL;
    w->inflight--;
}

/* Ends a serving worker (invariant 4): its live calls fail with
 * `call_status` and "worker <id> <what>"; the worker is told the same with
 * `worker_status` unless that is KF_OK (its stream already ended). `what`
 * reads after the worker's name ("was lost: ..."). ctx is NULL only at
 * destroy. */
static void worker_close(kf_functions_t *fns, kf_ctx_t *ctx, worker_t *w, kf_status_t call_status,
                         kf_status_t worker_status, const char *what) {
    char reason[KF_ERROR_MESSAGE_BYTES_MAX];
    snprintf(reason, sizeof reason, "worker %s (%.64s) %.400s", w->id, w->name, what);
    function_t *fn = w->fn;
    KF_ASSERT(fn != NULL);
    w->fn = NULL;
    if (w->prev != NULL) {
        w->prev->next = w->next;
    } else {
        fn->workers = w->next;
    }
    if (w->next != NULL) {
        w->next->prev = w->prev;
    }
    w->next = w->prev = NULL;
    fn->nworkers--;
    fns->serving_workers--;
    kf_gauge_set(KF_G_FUNCTION_WORKERS, (int64_t)fns->serving_workers);
    if (fn->nworkers == 0) {
        snprintf(fn->unavailable, sizeof fn->unavailable,
                 "no worker serves %s (the last one: %.400s)", fn->id, reason);
    }
    for (uint32_t i = 0; i < w->concurrency; i++) {
        slot_t *slot = &w->slots[i];
        if (slot->call_id == 0) {
            continue;
        }
        kf_call_t *call = slot->call;
        slot_clear(ctx, w, slot);
        if (call != NULL) {
            kf__call_fail(call, call_status, "%s", reason);
            call->answered = true;
            call->host_data = NULL;
        }
    }
    KF_ASSERT(w->inflight == 0);
    if (worker_status != KF_OK) {
        w->ops->close(w->link, worker_status, reason);
    }
    kf_log_kv(KF_LOG_WARN, "functions", "worker closed", KF_LOG_STR("function_id", fn->id),
              KF_LOG_STR("worker", w->id), KF_LOG_STR("name", w->name), KF_LOG_STR("peer", w->peer),
              KF_LOG_STR("reason", reason));
    if (ctx != NULL) {
        kf__step_resume(fns, ctx, fn);
    }
}

/* A stream that will never serve: told why, kept until its GONE. */
__attribute__((format(printf, 4, 5))) static void
refuse(worker_t *w, kf_status_t st, const char *function_id, const char *fmt, ...) {
    char message[KF_ERROR_MESSAGE_BYTES_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    kf_log_kv(KF_LOG_WARN, "functions", "worker refused", KF_LOG_STR("function_id", function_id),
              KF_LOG_STR("worker", w->id), KF_LOG_STR("peer", w->peer),
              KF_LOG_STR("reason", message));
    w->ops->close(w->link, st, message);
}

static void worker_hello(kf_functions_t *fns, kf_ctx_t *ctx, kf_worker_event_t *ev) {
    KF_ASSERT(worker_of(fns, &ev->link) == NULL);
    worker_t *w = kf_xcalloc(1, sizeof *w);
    w->link = ev->link;
    w->ops = ev->ops;
    w->principal = ev->principal;
    snprintf(w->id, sizeof w->id, "w%" PRIu64, ++fns->next_worker_id);
    snprintf(w->peer, sizeof w->peer, "%s", ev->peer);
    kf_map_insert(&fns->workers, &w->node, &w->link, sizeof w->link);
    const Keyflow__V1__WorkerMessage *m = (const Keyflow__V1__WorkerMessage *)ev->message;
    if (m == NULL || m->message_case != KEYFLOW__V1__WORKER_MESSAGE__MESSAGE_HELLO) {
        refuse(w, KF_E_INVALID, "", "hello: a worker's first message must be a hello");
        return;
    }
    const Keyflow__V1__WorkerHello *hello = m->hello;
    if (strlen(hello->worker_name) > KF_WORKER_NAME_BYTES_MAX) {
        refuse(w, KF_E_INVALID, hello->function_id, "hello.worker_name: at most %d bytes, got %zu",
               KF_WORKER_NAME_BYTES_MAX, strlen(hello->worker_name));
        return;
    }
    snprintf(w->name, sizeof w->name, "%s", hello->worker_name);
    if (hello->max_concurrent_calls < 0 ||
        hello->max_concurrent_calls > KF_WORKER_CONCURRENCY_MAX) {
        refuse(w, KF_E_INVALID, hello->function_id,
               "hello.max_concurrent_calls: must be in 0..%d (0 means 1), got %d",
               KF_WORKER_CONCURRENCY_MAX, hello->max_concurrent_calls);
        return;
    }
    kf_map_node_t *n = kf_map_get(&fns->by_id, hello->function_id, strlen(hello->function_id));
    function_t *fn = n != NULL ? KF_CONTAINER_OF(n, function_t, node) : NULL;
    if (fn == NULL) {
        refuse(w, KF_E_NOT_FOUND, hello->function_id,
               "hello.function_id: no function \"%.128s\" is registered", hello->function_id);
        return;
    }
    if (fn->desc->runtime != KEYFLOW__V1__RUNTIME__RUNTIME_REMOTE) {
        refuse(w, KF_E_PRECONDITION, fn->id,
               "hello.function_id: %s is a NATIVE function; its handler runs inside keyflowd",
               fn->id);
        return;
    }
    if (strcmp(hello->implementation_digest, fn->desc->implementation_digest) != 0) {
        refuse(w, KF_E_PRECONDITION, fn->id,
               "hello.implementation_digest: \"%.64s\" is not %s's implementation_digest %s (a new "
               "implementation is a new function)",
               hello->implementation_digest, fn->id, fn->desc->implementation_digest);
        return;
    }
    if (fn->nworkers >= KF_WORKERS_PER_FUNCTION_MAX) {
        refuse(w, KF_E_LIMIT, fn->id, "function %s already has %d workers (the most it may have)",
               fn->id, KF_WORKERS_PER_FUNCTION_MAX);
        return;
    }
    w->concurrency = hello->max_concurrent_calls > 0 ? (uint32_t)hello->max_concurrent_calls : 1;
    for (uint32_t i = 0; i < w->concurrency; i++) {
        kf_timer_init(&w->slots[i].deadline, KF_TIMER_REMOTE_CALL);
        w->slots[i].worker = w;
    }
    w->fn = fn;
    w->next = fn->workers;
    if (fn->workers != NULL) {
        fn->workers->prev = w;
    }
    fn->workers = w;
    fn->nworkers++;
    fns->serving_workers++;
    kf_gauge_set(KF_G_FUNCTION_WORKERS, (int64_t)fns->serving_workers);
    Keyflow__V1__Welcome welcome = KEYFLOW__V1__WELCOME__INIT;
    welcome.descriptor = fn->desc;
    welcome.max_concurrent_calls = (int32_t)w->concurrency;
    welcome.worker_id = w->id;
    Keyflow__V1__ServerMessage msg = KEYFLOW__V1__SERVER_MESSAGE__INIT;
    msg.message_case = KEYFLOW__V1__SERVER_MESSAGE__MESSAGE_WELCOME;
    msg.welcome = &welcome;
    size_t len;
    uint8_t *buf = pack_message(&msg, &len);
    w->ops->send(w->link, buf, len, false);
    kf_log_kv(KF_LOG_INFO, "functions", "worker connected", KF_LOG_STR("function_id", fn->id),
              KF_LOG_STR("worker", w->id), KF_LOG_STR("name", w->name), KF_LOG_STR("peer", w->peer),
              KF_LOG_INT("concurrency", w->concurrency));
    kf__step_resume(fns, ctx, fn); /* a step may wait for room */
}

static void worker_result(kf_functions_t *fns, kf_ctx_t *ctx, worker_t *w,
                          const Keyflow__V1__WorkerMessage *m) {
    if (w->fn == NULL) {
        return; /* closed: what it still sends is dropped */
    }
    if (m->message_case != KEYFLOW__V1__WORKER_MESSAGE__MESSAGE_RESULT) {
        worker_close(fns, ctx, w, KF_E_UNAVAILABLE, KF_E_INVALID,
                     "broke the protocol: only the first message of a stream is a hello");
        return;
    }
    const Keyflow__V1__CallResult *r = m->result;
    slot_t *slot = NULL;
    for (uint32_t i = 0; i < w->concurrency && slot == NULL; i++) {
        if (w->slots[i].call_id != 0 && w->slots[i].call_id == r->call_id) {
            slot = &w->slots[i];
        }
    }
    if (slot == NULL) {
        char reason[160];
        snprintf(reason, sizeof reason,
                 "broke the protocol: it sent a result for call %" PRIu64
                 ", which is not out on its stream",
                 r->call_id);
        worker_close(fns, ctx, w, KF_E_UNAVAILABLE, KF_E_PRECONDITION, reason);
        return;
    }
    kf_call_t *call = slot->call;
    function_t *fn = w->fn;
    slot_clear(ctx, w, slot);
    if (call != NULL) {
        call->host_data = NULL;
        record_result(w, call, r);
        call->answered = true;
    }
    kf__step_resume(fns, ctx, fn); /* a response, or room, for the step */
}

static void worker_gone(kf_functions_t *fns, kf_ctx_t *ctx, worker_t *w, const char *reason) {
    if (w->fn != NULL) {
        char message[KF_ERROR_MESSAGE_BYTES_MAX];
        snprintf(message, sizeof message, "was lost: its stream ended (%.400s)",
                 reason[0] ? reason : "closed");
        worker_close(fns, ctx, w, KF_E_UNAVAILABLE, KF_OK, message);
    }
    kf_map_remove(&fns->workers, &w->node);
    w->ops->release(w->link);
    free(w);
}

void kf_functions_worker_event(kf_functions_t *fns, kf_ctx_t *ctx, kf_worker_event_t *ev) {
    if (ev->kind == KF_WORKER_HELLO) {
        worker_hello(fns, ctx, ev);
        return;
    }
    worker_t *w = worker_of(fns, &ev->link);
    KF_ASSERT(w != NULL); /* a link's events follow its HELLO (engine.h) */
    if (ev->kind == KF_WORKER_RESULT) {
        KF_ASSERT(ev->message != NULL);
        worker_result(fns, ctx, w, (const Keyflow__V1__WorkerMessage *)ev->message);
    } else {
        worker_gone(fns, ctx, w, ev->reason);
    }
}

void kf_functions_fire_call(kf_functions_t *fns, kf_ctx_t *ctx, kf_timer_t *timer) {
    slot_t *slot = KF_CONTAINER_OF(timer, slot_t, deadline);
    worker_t *w = slot->worker;
    KF_ASSERT(w->fn != NULL && slot->call_id != 0); /* closing disarms every deadline */
    char reason[200];
    snprintf(reason, sizeof reason,
             "did not answer call %" PRIu64 " within %" PRId64 " ms (limits.call_timeout_ms)",
             slot->call_id, w->fn->limits.call_timeout_ms);
    worker_close(fns, ctx, w, KF_E_TIMEOUT, KF_E_TIMEOUT, reason);
}

void kf__remote_release_all(kf_functions_t *fns, kf_ctx_t *ctx) {
    size_t b;
    kf_map_node_t *n = kf_map_first(&fns->workers, &b);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&fns->workers, &b, n);
        worker_t *w = KF_CONTAINER_OF(n, worker_t, node);
        if (w->fn != NULL) {
            worker_close(fns, ctx, w, KF_E_UNAVAILABLE, KF_E_UNAVAILABLE,
                         "was closed: keyflowd is shutting down");
        }
        kf_map_remove(&fns->workers, &w->node);
        w->ops->release(w->link);
        free(w);
        n = next;
    }
    if (ctx == NULL) {
        kf_map_deinit(&fns->workers);
    }
}

void kf__remote_end_revoked(kf_functions_t *fns, kf_ctx_t *ctx) {
    size_t b;
    for (kf_map_node_t *n = kf_map_first(&fns->workers, &b); n != NULL;
         n = kf_map_next(&fns->workers, &b, n)) {
        worker_t *w = KF_CONTAINER_OF(n, worker_t, node);
        kf_error_t err;
        if (w->fn != NULL && kf_principal_check_open(w->principal, &err) != KF_OK) {
            /* The stream stays in fns->workers, serving nothing, until its GONE. */
            worker_close(fns, ctx, w, KF_E_UNAVAILABLE, KF_E_UNAUTHENTICATED,
                         "lost its API key: revoked");
        }
    }
}

void kf__remote_close_function(kf_functions_t *fns, kf_ctx_t *ctx, function_t *fn,
                               kf_status_t status, const char *message) {
    while (fn->workers != NULL) {
        /* The stream stays in fns->workers, serving nothing, until its GONE. */
        worker_close(fns, ctx, fn->workers, status, status, message);
    }
}

void kf_functions_end_revoked(kf_functions_t *fns, kf_ctx_t *ctx) {
    kf__output_end_revoked(fns, ctx);
    kf__remote_end_revoked(fns, ctx);
}

void kf_functions_release_workers(kf_functions_t *fns, kf_ctx_t *ctx) {
    kf__remote_release_all(fns, ctx);
}

/* ---- the host ----------------------------------------------------------- */

static int remote_room(kf_functions_t *fns, function_t *fn) {
    (void)fns;
    if (fn->nworkers == 0) {
        return -1;
    }
    int room = 0;
    for (worker_t *w = fn->workers; w != NULL; w = w->next) {
        /* A worker whose key was revoked gets no call (the sweep closes it). */
        if (!kf_principal_revoked(w->principal)) {
            room += (int)(w->concurrency - w->inflight);
        }
    }
    return room;
}

/* To the worker with the most free slots, so a step's calls spread over
 * every worker of the function. */
static kf__call_sent_t remote_send(kf_functions_t *fns, function_t *fn, kf_call_t *call) {
    worker_t *best = NULL;
    for (worker_t *w = fn->workers; w != NULL; w = w->next) {
        if (kf_principal_revoked(w->principal)) {
            continue;
        }
        if (best == NULL || w->concurrency - w->inflight > best->concurrency - best->inflight) {
            best = w;
        }
    }
    KF_ASSERT(best != NULL && best->inflight < best->concurrency); /* room() > 0 */
    slot_t *slot = NULL;
    for (uint32_t i = 0; i < best->concurrency && slot == NULL; i++) {
        if (best->slots[i].call_id == 0) {
            slot = &best->slots[i];
        }
    }
    KF_ASSERT(slot != NULL);
    /* A call ID names its partition (id mod partition_count): the worker
     * stream serves every partition of the process, and the router sends a
     * result back to the partition that made the call (runtime/router.c). */
    uint64_t partitions = fns->config->partition_count > 1 ? fns->config->partition_count : 1;
    uint64_t id = ++fns->next_call_id * partitions + fns->config->partition_index;
    kf_error_t err;
    size_t len = 0;
    uint8_t *buf = encode_call(call, id, &len, &err);
    if (buf == NULL) {
        kf__call_fail(call, err.status, "%s", err.message);
        return KF__CALL_ANSWERED;
    }
    kf_ctx_t *ctx = call->step->ctx;
    slot->call_id = id;
    slot->call = call;
    best->inflight++;
    call->host_data = slot;
    kf_heap_arm(&ctx->heap, &slot->deadline, ctx->now_ms + fn->limits.call_timeout_ms);
    best->ops->send(best->link, buf, len, true);
    return KF__CALL_OUT;
}

static void remote_abandon(kf_functions_t *fns, function_t *fn, kf_call_t *call) {
    (void)fns;
    (void)fn;
    slot_t *slot = call->host_data;
    if (slot != NULL) {
        slot->call = NULL; /* invariant 1: the slot stays busy until the result */
    }
    call->host_data = NULL;
}

const kf__handler_host_t kf__remote_host = {
    .name = "remote",
    .pipelines = true,
    .room = remote_room,
    .send = remote_send,
    .abandon = remote_abandon,
};
