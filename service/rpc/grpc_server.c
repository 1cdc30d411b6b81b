/*
 * grpc_server.c - gRPC C core server for every method of proto/methods.h.
 *
 * Call lifecycle (one call_t per call, its tag on the completion queue):
 *
 *   REQUESTED --arrival--> (ENGINE row) submitted to the engine
 *       |                        | cmd->done (replier thread)
 *       |                        v
 *       |                   REPLYING --batch complete--> freed
 *       +--(FRONT row: health check)--> REPLYING
 *       +--(FRONT row: health watch)--> WATCHING (sends the status, then
 *       |                               every change; open until the client
 *       |                               leaves or the server shuts down)
 *       +--(FRONT row: tail)----------> TAIL (a loop of engine reads)
 *       +--(FRONT row: worker)--------> WORKER (a relay between a remote
 *                                       handler's stream and the engine)
 *
 * What happens to a call follows from its row's flags (proto/rpcs.h): the
 * executor says engine or front end, the shape says unary, long poll (the
 * close is watched and cancels the command) or stream. FRONT rows go to
 * serve_front, a switch over kf_front_op_t without `default:`.
 *
 * Every request is re-posted as soon as one arrives, so each method always
 * has KF_GRPC_PENDING_PER_METHOD calls waiting. An unpack failure, a full
 * engine queue or a stopped engine is answered at once with the status and
 * a message naming the problem.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include "rpc/grpc_server.h"
#include "rpc/reflection.h"
#include "rpc/wire_check.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include "base/alloc.h"
#include "base/arena.h"
#include "base/assert.h"
#include "base/clock.h"
#include "base/health.h"
#include "base/log.h"
#include "base/metrics.h"
#include "runtime/router.h"
#include "grpc/health/v1/health.pb-c.h"
#include "keyflow/v1/functions.pb-c.h"
#include "keyflow/v1/partitions.pb-c.h"
#include "keyflow/v1/runs.pb-c.h"
#include "keyflow/v1/workers.pb-c.h"

#define KF_GRPC_THREADS_MAX 8

typedef enum call_state {
    CALL_REQUESTED,
    CALL_REPLYING,
    CALL_WATCH_SENT,   /* watch: a status message went out */
    CALL_WATCH_CLOSED, /* watch: the client closed or was cancelled */
    CALL_TAIL_SENT,    /* tail: a page went out */
    CALL_TAIL_CLOSED,  /* tail: the client closed or was cancelled */
    CALL_TAIL_DONE,    /* tail: the final status went out */
    CALL_POLL_CLOSED,  /* long poll: the client closed or was cancelled */
    CALL_WORKER_RECV,  /* worker: a message arrived (or the stream ended) */
    CALL_WORKER_SENT,  /* worker: a message went out */
    CALL_WORKER_DONE,  /* worker: the status went out, or the close batch ended */
    CALL_REFLECT_SENT, /* reflection: an answer went out */
    CALL_REFLECT_READ, /* reflection: the next request (or the half-close) arrived */
    CALL_REFLECT_DONE, /* reflection: the final status went out */
} call_state_t;

typedef struct call call_t;

/* A tag is a pointer to one of these, so one call can have two batches in
 * flight (a watch: its send and its close) and tell them apart. */
typedef struct call_tag {
    call_t *call;
    call_state_t state;
} call_tag_t;

struct call {
    kf_grpc_server_t *server;
    const kf_method_t *method;      /* NULL: a generic call for an unknown method */
    grpc_call_details call_details; /* generic calls only */
    void *registered;               /* grpc's handle for the method */
    int metrics_id;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array metadata;
    grpc_byte_buffer *payload;
    grpc_byte_buffer *reply;
    grpc_slice details;
    bool has_details;
    /* With KF_E_NOT_OWNER: keyflow-partition and the owner's node and
     * addresses (docs/scaling.md), sent as trailing metadata. */
    grpc_metadata trailers[5]; /* owner (4), applied partitions */
    size_t ntrailers;
    int cancelled;
    atomic_int refs;       /* outstanding batches: the reply, plus a close
                              watch (long polls: the engine's hold on the
                              command counts until it becomes the reply) */
    atomic_bool in_engine; /* the command is with the engine */
    bool close_watched;    /* RECV_CLOSE was started on its own */
    bool refs_watch;       /* counted in server->watches */
    int grpc_code;
    bool metrics_done;     /* this call's request was counted in the metrics */
    int64_t request_bytes; /* counted in server->request_bytes until freed */
    int64_t start_us;
    call_tag_t tag_main;
    call_tag_t tag_close;
    kf_arena_t arena;
    kf_cmd_t cmd;
    /* Health/Watch, under server->watch_lock: the open streams are a list
     * that a health change walks, sending each its new status. At most one
     * send is in flight per stream; a change seen meanwhile is sent when it
     * completes (watch_pump), so the last status always arrives. */
    call_t *watch_prev;
    call_t *watch_next;
    bool watch_linked;  /* on server->watching */
    bool watch_sending; /* a status message is in flight */
    bool watch_unknown; /* the service named is not served: SERVICE_UNKNOWN */
    bool watch_started; /* initial metadata went out */
    int watch_sent;     /* the status last sent; -1 none */
    /* ServerReflectionInfo: request, answer, request, ... with one batch in
     * flight at a time, so the call needs no reference count. */
    grpc_byte_buffer *reflect_next; /* RECV_MESSAGE's target */
    bool reflect_started;           /* initial metadata went out */
    /* TailOutput: repeated engine reads, one page in flight at a time. */
    atomic_int tail_refs; /* the close batch + the read or send in flight */
    atomic_bool tail_closed;
    bool tail_sent_metadata;
    kf_arena_t page_arena; /* one page's response; reset per read */
    Keyflow__V1__ReadOutputRequest tail_read;
    char *tail_cursor;         /* tail_read.cursor: where the stream is, in every partition */
    kf_principal_t *principal; /* the caller's key (a reference), or NULL */
    /* Workers/Serve: the stream the engine knows as a kf_worker_link_t. */
    kf_worker_link_t *link;
};

struct kf_grpc_server {
    grpc_server *server;
    grpc_completion_queue *cq;
    kf_router_t *router;
    kf_auth_t *auth; /* NULL: calls are not checked */
    void *registered[KF_METRICS_METHODS_MAX];
    int metrics_ids[KF_METRICS_METHODS_MAX];
    pthread_t threads[KF_GRPC_THREADS_MAX];
    int thread_count;
    bool started;
    atomic_bool shutting_down;
    atomic_int live_calls;      /* calls handed out by grpc and not yet freed */
    atomic_int watches;         /* of which Health/Watch streams (open until cancelled) */
    atomic_int worker_streams;  /* Workers/Serve streams (KF_WORKER_STREAMS_MAX) */
    atomic_llong request_bytes; /* request bytes of the calls not yet freed */
    int64_t request_bytes_max;  /* kf_grpc_options_t.request_bytes_held_max */
    call_tag_t shutdown_tag;
    atomic_bool shutdown_done;
    pthread_mutex_t watch_lock;
    call_t *watching;            /* open Health/Watch streams (watch_lock) */
    kf_reflection_t *reflection; /* server reflection's index; read-only */
    int health_listener;         /* kf_health_listen handle, or -1 */
    /* TLS: the material the next handshake should switch to, taken (and
     * cleared) by the certificate fetcher gRPC calls before handshakes. */
    pthread_mutex_t tls_lock;
    kf_tls_t *tls_next; /* NULL: keep serving what the last fetch gave */
    bool tls_enabled;
};

/* Counts the call once in keyflow_requests_total and its latency, and logs
 * it (debug). */
static void record_metrics(call_t *c) {
    if (c->method != NULL && c->call != NULL && !c->metrics_done) {
        int64_t duration_us = kf_mono_us() - c->start_us;
        kf_metrics_request(c->metrics_id, KF_TRANSPORT_GRPC, c->grpc_code, duration_us);
        kf_log_request("grpc", c->method->name, c->grpc_code, 0, duration_us, c->cmd.request);
        c->metrics_done = true;
    }
}

static void worker_link_free(kf_worker_link_t *link);

static void call_free(call_t *c) {
    if (c->method != NULL && kf_method_streams(c->method) && !c->metrics_done) {
        /* A stream the server did not end with a status: the client left
         * (or the server is going away), which its client sees as that. */
        c->grpc_code = GRPC_STATUS_CANCELLED;
        record_metrics(c);
    }
    if (c->call != NULL) {
        grpc_call_unref(c->call);
    }
    grpc_metadata_array_destroy(&c->metadata);
    if (c->payload != NULL) {
        grpc_byte_buffer_destroy(c->payload);
    }
    if (c->reply != NULL) {
        grpc_byte_buffer_destroy(c->reply);
    }
    if (c->reflect_next != NULL) {
        grpc_byte_buffer_destroy(c->reflect_next);
    }
    if (c->has_details) {
        grpc_slice_unref(c->details);
    }
    for (size_t i = 0; i < c->ntrailers; i++) {
        grpc_slice_unref(c->trailers[i].key);
        grpc_slice_unref(c->trailers[i].value);
    }
    kf_arena_deinit(&c->arena);
    kf_arena_deinit(&c->page_arena);
    free(c->tail_cursor);
    kf_principal_unref(c->principal);
    if (c->link != NULL) {
        worker_link_free(c->link);
        atomic_fetch_sub(&c->server->worker_streams, 1);
    }
    if (c->method == NULL) {
        grpc_call_details_destroy(&c->call_details);
    } else if (c->refs_watch) {
        atomic_fetch_sub(&c->server->watches, 1);
    }
    if (c->call != NULL) {
        atomic_fetch_sub(&c->server->live_calls, 1);
    }
    atomic_fetch_sub(&c->server->request_bytes, c->request_bytes);
    free(c);
}

static void request_call(kf_grpc_server_t *s, size_t method_index) {
    if (atomic_load(&s->shutting_down)) {
        return;
    }
    call_t *c = kf_xcalloc(1, sizeof *c);
    c->server = s;
    c->method = &kf_methods[method_index];
    c->registered = s->registered[method_index];
    c->metrics_id = s->metrics_ids[method_index];
    c->tag_main = (call_tag_t){c, CALL_REQUESTED};
    c->tag_close = (call_tag_t){c, CALL_WATCH_CLOSED};
    grpc_metadata_array_init(&c->metadata);
    kf_arena_init(&c->arena, 0);
    kf_arena_init(&c->page_arena, 0);
    grpc_call_error rc =
        grpc_server_request_registered_call(s->server, c->registered, &c->call, &c->deadline,
                                            &c->metadata, &c->payload, s->cq, s->cq, &c->tag_main);
    if (rc != GRPC_CALL_OK) {
        kf_log(KF_LOG_ERROR, "grpc", "request_registered_call failed: %d", (int)rc);
        c->call = NULL;
        call_free(c);
    }
}

/* Keeps one generic call posted so that a call for a method that is not in
 * the table is answered UNIMPLEMENTED at once instead of waiting forever. */
static void request_generic(kf_grpc_server_t *s) {
    if (atomic_load(&s->shutting_down)) {
        return;
    }
    call_t *c = kf_xcalloc(1, sizeof *c);
    c->server = s;
    c->metrics_id = -1;
    c->tag_main = (call_tag_t){c, CALL_REQUESTED};
    grpc_metadata_array_init(&c->metadata);
    grpc_call_details_init(&c->call_details);
    kf_arena_init(&c->arena, 0);
    kf_arena_init(&c->page_arena, 0);
    if (grpc_server_request_call(s->server, &c->call, &c->call_details, &c->metadata, s->cq, s->cq,
                                 &c->tag_main) != GRPC_CALL_OK) {
        c->call = NULL;
        call_free(c);
    }
}

/* The op that ends a call with `status`, and `message` as its details when
 * it is an error; the call keeps what the op points at until it is freed. */
static void put_status(call_t *c, grpc_op *op, kf_status_t status, const char *message) {
    c->grpc_code = kf_status_grpc_code(status);
    op->op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    op->data.send_status_from_server.status = (grpc_status_code)c->grpc_code;
    if (status != KF_OK && message != NULL && message[0] != '\0') {
        KF_ASSERT(!c->has_details); /* one status per call */
        c->details = grpc_slice_from_copied_string(message);
        c->has_details = true;
        op->data.send_status_from_server.status_details = &c->details;
    }
    op->data.send_status_from_server.trailing_metadata_count = c->ntrailers;
    op->data.send_status_from_server.trailing_metadata = c->trailers;
}

/* One message of a server stream, as a batch of its own (with the initial
 * metadata before the first: *started). `slice` is taken. The previous
 * message's buffer is freed: its send completed, since a stream keeps one
 * send in flight. On GRPC_CALL_OK the batch completes with `state`. */
static grpc_call_error send_stream_message(call_t *c, grpc_slice slice, bool *started,
                                           call_state_t state) {
    if (c->reply != NULL) {
        grpc_byte_buffer_destroy(c->reply);
    }
    c->reply = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!*started) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = c->reply;
    c->tag_main.state = state;
    grpc_call_error rc = grpc_call_start_batch(c->call, ops, n, &c->tag_main, NULL);
    if (rc == GRPC_CALL_OK) {
        *started = true;
    }
    return rc;
}

/* Sends the reply (message when ok) and status; the batch's completion
 * frees the call. Any thread. */
static void send_reply(call_t *c, kf_status_t status, const char *message,
                       const ProtobufCMessage *response) {
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    n++;
    if (status == KF_OK && response != NULL) {
        size_t len = protobuf_c_message_get_packed_size(response);
        if (len > KF_RESPONSE_BYTES_MAX) {
            status = KF_E_TOO_LARGE;
            message = "response: larger than KF_RESPONSE_BYTES_MAX; ask for a smaller page";
        } else {
            grpc_slice slice = grpc_slice_malloc(len);
            protobuf_c_message_pack(response, GRPC_SLICE_START_PTR(slice));
            c->reply = grpc_raw_byte_buffer_create(&slice, 1);
            grpc_slice_unref(slice);
            ops[n].op = GRPC_OP_SEND_MESSAGE;
            ops[n].data.send_message.send_message = c->reply;
            n++;
        }
    }
    put_status(c, &ops[n++], status, message);
    if (!c->close_watched) {
        ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[n].data.recv_close_on_server.cancelled = &c->cancelled;
        n++;
    }
    c->tag_main.state = CALL_REPLYING;
    if (!c->close_watched) {
        atomic_fetch_add(&c->refs, 1); /* else the engine's reference becomes the reply's */
    }
    grpc_call_error rc = grpc_call_start_batch(c->call, ops, n, &c->tag_main, NULL);
    if (rc != GRPC_CALL_OK) {
        kf_log(KF_LOG_ERROR, "grpc", "start_batch for the reply failed: %d", (int)rc);
        if (atomic_fetch_sub(&c->refs, 1) == 1) {
            call_free(c);
        }
    }
}

static void add_trailer(call_t *c, const char *key, const char *value) {
    KF_ASSERT(c->ntrailers < sizeof c->trailers / sizeof c->trailers[0]);
    if (value != NULL && value[0] != '\0') {
        c->trailers[c->ntrailers].key = grpc_slice_from_static_string(key);
        c->trailers[c->ntrailers].value = grpc_slice_from_copied_string(value);
        c->ntrailers++;
    }
}

/* A command refused because its key's partition is served elsewhere: the
 * trailers name the partition and, when the placement knows it, the owner
 * (docs/scaling.md). */
static void add_owner_trailers(call_t *c, const kf_cmd_t *cmd) {
    if (cmd->error.status != KF_E_NOT_OWNER || cmd->foreign_partition < 0 || c->ntrailers > 0) {
        return;
    }
    char partition[16];
    snprintf(partition, sizeof partition, "%d", (int)cmd->foreign_partition);
    add_trailer(c, "keyflow-partition", partition);
    const kf_placement_node_t *owner =
        kf_router_owner(c->server->router, (uint32_t)cmd->foreign_partition);
    if (owner != NULL) {
        add_trailer(c, "keyflow-owner-node", owner->name);
        add_trailer(c, "keyflow-owner-grpc", owner->grpc_address);
        add_trailer(c, "keyflow-owner-http", owner->http_address);
    }
}

/* The engine finished the command (its group is durable). Replier thread. */
static void engine_done(kf_cmd_t *cmd) {
    call_t *c = cmd->owner;
    atomic_store(&c->in_engine, false);
    /* A long poll whose key was revoked while it waited gets nothing
     * (auth/auth.h). A unary call's answer says what it did, revoked or
     * not: the revocation is for the next call. */
    if (c->close_watched && cmd->error.status == KF_OK &&
        kf_principal_check_open(c->principal, &cmd->error) != KF_OK) {
        cmd->response = NULL;
    }
    add_owner_trailers(c, cmd);
    if (cmd->error.status != KF_OK && cmd->applied_partitions != NULL) {
        /* A SPLIT function's batch some partitions applied (router.h). */
        add_trailer(c, "keyflow-applied-partitions", cmd->applied_partitions);
    }
    send_reply(c, cmd->error.status, cmd->error.message, cmd->response);
}

static ProtobufCMessage *unpack_payload(call_t *c, const ProtobufCMessageDescriptor *desc,
                                        kf_error_t *err) {
    if (c->payload == NULL) {
        /* No message at all (an empty request still arrives as a message of
         * zero bytes): the client half-closed without one, or went away. */
        kf_error_set(err, KF_E_INVALID,
                     "request: no %s message was received (the client sent none or cancelled)",
                     desc->name);
        return NULL;
    }
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, c->payload)) {
        return NULL;
    }
    grpc_slice slice = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    ProtobufCMessage *m = NULL;
    if (kf_wire_check(desc, GRPC_SLICE_START_PTR(slice), GRPC_SLICE_LENGTH(slice), err) == KF_OK) {
        m = protobuf_c_message_unpack(desc, kf_arena_pb(&c->arena), GRPC_SLICE_LENGTH(slice),
                                      GRPC_SLICE_START_PTR(slice));
        if (m == NULL) {
            kf_error_set(err, KF_E_INVALID, "request: not a valid %s message", desc->name);
        }
    }
    grpc_slice_unref(slice);
    return m;
}

/* ---- Health ------------------------------------------------------------
 * Check and Watch answer from base/health.h (the state /readyz answers
 * from too) and the engine's own failure flag, so the two transports agree.
 * A service name that is not served is NOT_FOUND for Check and
 * SERVICE_UNKNOWN for Watch, as the health protocol says (a Watch stays
 * open: the service could appear). */

static bool health_serving(const kf_grpc_server_t *s) {
    return kf_health_serving() && !kf_router_failed(s->router);
}

/* Known: "" (the whole server), or any service with an RPC in the table:
 * the keyflow services, health itself and reflection, the very list
 * reflection gives, so a client that checks each listed service before
 * using it finds every one SERVING. */
static bool health_service_known(const char *service) {
    return service[0] == '\0' || kf_method_service_known(service);
}

static int watch_status(const call_t *c) {
    if (c->watch_unknown) {
        return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
    }
    return health_serving(c->server)
               ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
               : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

static void watch_unref(call_t *c) {
    if (atomic_fetch_sub(&c->refs, 1) == 1) {
        call_free(c);
    }
}

/* Sends the current status if it differs from the last one sent and no
 * send is in flight. server->watch_lock held. */
static void watch_pump(call_t *c) {
    int status = watch_status(c);
    if (!c->watch_linked || c->watch_sending || status == c->watch_sent) {
        return;
    }
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
    size_t len = grpc__health__v1__health_check_response__get_packed_size(&resp);
    grpc_slice slice = grpc_slice_malloc(len);
    grpc__health__v1__health_check_response__pack(&resp, GRPC_SLICE_START_PTR(slice));
    atomic_fetch_add(&c->refs, 1);
    if (send_stream_message(c, slice, &c->watch_started, CALL_WATCH_SENT) != GRPC_CALL_OK) {
        atomic_fetch_sub(&c->refs, 1); /* the close batch still holds the call */
        return;
    }
    c->watch_sending = true;
    c->watch_sent = status;
}

/* A health change: every open Watch gets the new status. Called by
 * base/health.c on the thread that made the change. */
static void on_health_change(void *ctx) {
    kf_grpc_server_t *s = ctx;
    pthread_mutex_lock(&s->watch_lock);
    for (call_t *c = s->watching; c != NULL; c = c->watch_next) {
        watch_pump(c);
    }
    pthread_mutex_unlock(&s->watch_lock);
}

static void start_watch(call_t *c, const Grpc__Health__V1__HealthCheckRequest *req) {
    kf_grpc_server_t *s = c->server;
    /* First the close (it completes when the client goes away or at server
     * shutdown, and holds the call until then), then the current status. */
    grpc_op close_op;
    memset(&close_op, 0, sizeof close_op);
    close_op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    close_op.data.recv_close_on_server.cancelled = &c->cancelled;
    atomic_store(&c->refs, 1);
    c->refs_watch = true;
    c->watch_sent = -1;
    c->watch_unknown = !health_service_known(req->service);
    atomic_fetch_add(&s->watches, 1);
    c->tag_close.state = CALL_WATCH_CLOSED;
    if (grpc_call_start_batch(c->call, &close_op, 1, &c->tag_close, NULL) != GRPC_CALL_OK) {
        call_free(c);
        return;
    }
    pthread_mutex_lock(&s->watch_lock);
    c->watch_prev = NULL;
    c->watch_next = s->watching;
    if (s->watching != NULL) {
        s->watching->watch_prev = c;
    }
    s->watching = c;
    c->watch_linked = true;
    watch_pump(c);
    pthread_mutex_unlock(&s->watch_lock);
}

/* The stream's send (ok) or its end. */
static void watch_sent(call_t *c, bool ok) {
    pthread_mutex_lock(&c->server->watch_lock);
    c->watch_sending = false;
    if (ok) {
        watch_pump(c); /* a change that came while this send was in flight */
    }
    pthread_mutex_unlock(&c->server->watch_lock);
    watch_unref(c);
}

static void watch_closed(call_t *c) {
    kf_grpc_server_t *s = c->server;
    pthread_mutex_lock(&s->watch_lock);
    if (c->watch_linked) {
        if (c->watch_prev != NULL) {
            c->watch_prev->watch_next = c->watch_next;
        } else {
            s->watching = c->watch_next;
        }
        if (c->watch_next != NULL) {
            c->watch_next->watch_prev = c->watch_prev;
        }
        c->watch_linked = false;
    }
    pthread_mutex_unlock(&s->watch_lock);
    watch_unref(c);
}

/* ---- TailOutput ---------------------------------------------------------
 * The stream is a loop of engine reads (ReadOutput with a long wait): each
 * page with rows is sent, and the next read starts when the send completed,
 * so a tail costs the engine one bounded read per page and never more than
 * one page is buffered per stream. The call is freed when both the close
 * batch and the last read or send are done (tail_refs). */

static void tail_unref(call_t *c) {
    if (atomic_fetch_sub(&c->tail_refs, 1) == 1) {
        call_free(c);
    }
}

static void tail_finish(call_t *c, kf_status_t status, const char *message) {
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!c->tail_sent_metadata) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->tail_sent_metadata = true;
    }
    put_status(c, &ops[n++], status, message);
    c->tag_main.state = CALL_TAIL_DONE;
    if (grpc_call_start_batch(c->call, ops, n, &c->tag_main, NULL) != GRPC_CALL_OK) {
        tail_unref(c);
    }
}

static void tail_done(kf_cmd_t *cmd);

/* Starts the next read; the in-flight reference moves to it. */
static void tail_next(call_t *c) {
    if (atomic_load(&c->tail_closed)) {
        tail_unref(c);
        return;
    }
    kf_arena_reset(&c->page_arena);
    kf_cmd_t *cmd = &c->cmd;
    memset(cmd, 0, sizeof *cmd);
    cmd->op = KF_OP_READ_OUTPUT;
    cmd->request = &c->tail_read.base;
    cmd->principal = c->principal;
    cmd->arena = &c->page_arena;
    cmd->done = tail_done;
    cmd->owner = c;
    /* A reference of this function's own: the read may finish, and the
     * client leave, before the check below. */
    atomic_fetch_add(&c->tail_refs, 1);
    atomic_store(&c->in_engine, true);
    if (kf_router_submit(c->server->router, cmd) != KF_OK) {
        atomic_store(&c->in_engine, false);
        tail_finish(c, cmd->error.status, cmd->error.message);
    } else if (atomic_load(&c->tail_closed)) {
        /* The client left while this read was being submitted, and the
         * close may have missed it (in_engine was not yet set): cancel it
         * here, or it would hold a parked read until its wait ends. */
        kf_router_cancel(c->server->router, cmd);
    }
    tail_unref(c);
}

/* A read finished (replier thread). */
static void tail_done(kf_cmd_t *cmd) {
    call_t *c = cmd->owner;
    atomic_store(&c->in_engine, false);
    if (atomic_load(&c->tail_closed)) {
        tail_unref(c);
        return;
    }
    /* The stream ends once its key is revoked (auth/auth.h). */
    if (cmd->error.status != KF_OK || kf_principal_check_open(c->principal, &cmd->error) != KF_OK) {
        tail_finish(c, cmd->error.status, cmd->error.message);
        return;
    }
    const Keyflow__V1__ReadOutputResponse *resp = (const void *)cmd->response;
    if (resp->first_seq == 0) {
        tail_next(c); /* the wait ended empty: wait again */
        return;
    }
    c->tail_read.after_seq = resp->last_seq;
    if (resp->next_cursor[0] != '\0') {
        /* Several partitions: the next read goes on from every one's
         * position (docs/scaling.md). */
        snprintf(c->tail_cursor, KF_OUTPUT_CURSOR_BYTES_MAX, "%s", resp->next_cursor);
    }
    size_t len = protobuf_c_message_get_packed_size(cmd->response);
    grpc_slice slice = grpc_slice_malloc(len);
    protobuf_c_message_pack(cmd->response, GRPC_SLICE_START_PTR(slice));
    if (c->reply != NULL) {
        grpc_byte_buffer_destroy(c->reply);
    }
    c->reply = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!c->tail_sent_metadata) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->tail_sent_metadata = true;
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = c->reply;
    n++;
    c->tag_main.state = CALL_TAIL_SENT;
    if (grpc_call_start_batch(c->call, ops, n, &c->tag_main, NULL) != GRPC_CALL_OK) {
        tail_unref(c);
    }
}

static void start_tail(call_t *c, const Keyflow__V1__TailOutputRequest *req) {
    if (req->max_rows_per_message < 0 || req->max_rows_per_message > KF_READ_OUTPUT_LIMIT_MAX ||
        req->after_seq < 0) {
        send_reply(c, KF_E_INVALID,
                   req->after_seq < 0 ? "after_seq: must not be negative"
                                      : "max_rows_per_message: must be in 0..65536 (0 = 1000)",
                   NULL);
        return;
    }
    keyflow__v1__read_output_request__init(&c->tail_read);
    c->tail_read.function_id = req->function_id;
    c->tail_read.after_seq = req->after_seq;
    c->tail_cursor = kf_xmalloc(KF_OUTPUT_CURSOR_BYTES_MAX);
    snprintf(c->tail_cursor, KF_OUTPUT_CURSOR_BYTES_MAX, "%s", req->cursor);
    c->tail_read.cursor = c->tail_cursor;
    c->tail_read.limit = req->max_rows_per_message;
    c->tail_read.format = req->format;
    c->tail_read.wait_ms = KF_POLL_WAIT_MS_MAX / 2;
    grpc_op close_op;
    memset(&close_op, 0, sizeof close_op);
    close_op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    close_op.data.recv_close_on_server.cancelled = &c->cancelled;
    c->tag_close.state = CALL_TAIL_CLOSED;
    atomic_store(&c->tail_refs, 2);
    if (grpc_call_start_batch(c->call, &close_op, 1, &c->tag_close, NULL) != GRPC_CALL_OK) {
        call_free(c);
        return;
    }
    tail_next(c);
}

/* ---- Workers/Serve --------------------------------------------------------
 * A remote handler's stream, relayed between the worker and the engine
 * (step/engine_types.h, "remote handler workers"): messages the worker
 * sends are unpacked here and posted (the first as HELLO, then RESULTs),
 * calls the engine sends (ops->send, on the engine thread) go out one
 * SEND_MESSAGE at a time from a queue, and the stream ends with the status the engine
 * or this relay decided (ops->close), or OK when the worker half-closes.
 *
 *   arrival --peer check--> RECV loop (one message at a time) ------+
 *      |                     first: HELLO; then RESULT, each        |
 *      |                     answering a call sent (else: protocol  |
 *      |                     error, stream closed)                  |
 *      |                    ops->send --> queue --> SEND_MESSAGE ---+
 *      |                    ops->close / protocol error / half-close:
 *      |                      status after the send in flight, GONE posted
 *      +-- freed when the recv, send, status and close batches are done
 *          and the engine released the link (refs)
 *
 * The queue holds at most the worker's calls out plus the welcome: the
 * engine sends a call only into a free slot (functions/remote.c), so a
 * stream is paced by its worker's results, never by how fast the
 * transport accepts bytes (the starvation pitfall of unpaced streams). */

typedef struct out_message {
    grpc_byte_buffer *buffer;
    struct out_message *next;
} out_message_t;

struct kf_worker_link {
    call_t *call;
    pthread_mutex_t lock;
    /* Guarded by lock. */
    out_message_t *queue_head;
    out_message_t *queue_tail;
    grpc_byte_buffer *sending; /* the message in flight, or NULL */
    bool sent_metadata;
    bool closing;        /* the status is decided: nothing more is sent */
    bool status_started; /* the status batch was started */
    kf_status_t status;
    char message[KF_ERROR_MESSAGE_BYTES_MAX];
    bool gone_posted;
    uint64_t calls_sent;
    /* CQ threads only (one recv at a time). */
    uint64_t results;
    bool hello_posted;
    grpc_byte_buffer *recv_buffer;
    atomic_int refs; /* recv, send, status and close batches; the engine */
    call_tag_t tag_recv;
    call_tag_t tag_send;
    call_tag_t tag_status;
    call_tag_t tag_close;
};

static void worker_link_free(kf_worker_link_t *link) {
    while (link->queue_head != NULL) {
        out_message_t *m = link->queue_head;
        link->queue_head = m->next;
        grpc_byte_buffer_destroy(m->buffer);
        free(m);
    }
    if (link->sending != NULL) {
        grpc_byte_buffer_destroy(link->sending);
    }
    if (link->recv_buffer != NULL) {
        grpc_byte_buffer_destroy(link->recv_buffer);
    }
    pthread_mutex_destroy(&link->lock);
    free(link);
}

static void link_unref(kf_worker_link_t *link) {
    if (atomic_fetch_sub(&link->refs, 1) == 1) {
        call_free(link->call);
    }
}

/* Starts the next send, or the status once closing; lock held. */
static void link_pump(kf_worker_link_t *link) {
    call_t *c = link->call;
    if (link->sending != NULL) {
        return;
    }
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!link->sent_metadata) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    }
    if (!link->closing && link->queue_head != NULL) {
        out_message_t *m = link->queue_head;
        link->queue_head = m->next;
        if (link->queue_head == NULL) {
            link->queue_tail = NULL;
        }
        link->sending = m->buffer;
        free(m);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = link->sending;
        n++;
        atomic_fetch_add(&link->refs, 1);
        if (grpc_call_start_batch(c->call, ops, n, &link->tag_send, NULL) != GRPC_CALL_OK) {
            grpc_byte_buffer_destroy(link->sending);
            link->sending = NULL;
            atomic_fetch_sub(&link->refs, 1); /* never the last: the close batch holds one */
            return;
        }
        link->sent_metadata = true;
        return;
    }
    if (link->closing && !link->status_started) {
        link->status_started = true;
        c->grpc_code = kf_status_grpc_code(link->status);
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.status = (grpc_status_code)c->grpc_code;
        if (link->status != KF_OK && link->message[0] != '\0') {
            c->details = grpc_slice_from_copied_string(link->message);
            c->has_details = true;
            ops[n].data.send_status_from_server.status_details = &c->details;
        }
        n++;
        atomic_fetch_add(&link->refs, 1);
        if (grpc_call_start_batch(c->call, ops, n, &link->tag_status, NULL) != GRPC_CALL_OK) {
            atomic_fetch_sub(&link->refs, 1);
            return;
        }
        link->sent_metadata = true;
    }
}

/* Decides the stream's status (the first decision wins) and drops what is
 * queued; the status goes out after the message in flight. Any thread. */
static void link_close(kf_worker_link_t *link, kf_status_t status, const char *message) {
    pthread_mutex_lock(&link->lock);
    if (!link->closing) {
        link->closing = true;
        link->status = status;
        snprintf(link->message, sizeof link->message, "%s", message ? message : "");
        while (link->queue_head != NULL) {
            out_message_t *m = link->queue_head;
            link->queue_head = m->next;
            grpc_byte_buffer_destroy(m->buffer);
            free(m);
        }
        link->queue_tail = NULL;
        link_pump(link);
    }
    pthread_mutex_unlock(&link->lock);
}

/* Tells the engine the stream is over (once, and only after its HELLO). */
static void link_post_gone(kf_worker_link_t *link, const char *reason) {
    pthread_mutex_lock(&link->lock);
    bool post = link->hello_posted && !link->gone_posted;
    link->gone_posted = true;
    pthread_mutex_unlock(&link->lock);
    if (!post) {
        return;
    }
    kf_worker_event_t *ev = kf_xcalloc(1, sizeof *ev);
    ev->kind = KF_WORKER_GONE;
    ev->link = link;
    snprintf(ev->reason, sizeof ev->reason, "%s", reason);
    kf_error_t err;
    if (kf_router_worker_post(link->call->server->router, ev, &err) != KF_OK) {
        /* Stopping: the engine releases the link itself (step/engine_types.h). */
        kf_worker_event_free(ev);
    }
}

/* The relay's own verdict (a protocol error): the worker gets `status`,
 * the engine hears the stream is gone. */
static void link_fail(kf_worker_link_t *link, kf_status_t status, const char *message) {
    link_close(link, status, message);
    link_post_gone(link, message);
}

/* ---- the engine's side (engine thread) ---- */

static void link_send(kf_worker_link_t *link, uint8_t *message, size_t len, bool is_call) {
    kf_error_t err;
    if (kf_principal_check_open(link->call->principal, &err) != KF_OK) {
        /* The engine closes the stream at its next turn; meanwhile nothing
         * more goes to a worker whose key was revoked (auth/auth.h). */
        free(message);
        link_fail(link, err.status, err.message);
        return;
    }
    grpc_slice slice = grpc_slice_new(message, len, free); /* takes the buffer */
    grpc_byte_buffer *buffer = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    pthread_mutex_lock(&link->lock);
    if (link->closing) {
        pthread_mutex_unlock(&link->lock);
        grpc_byte_buffer_destroy(buffer);
        return;
    }
    if (is_call) {
        link->calls_sent++;
    }
    out_message_t *m = kf_xmalloc(sizeof *m);
    m->buffer = buffer;
    m->next = NULL;
    if (link->queue_tail != NULL) {
        link->queue_tail->next = m;
    } else {
        link->queue_head = m;
    }
    link->queue_tail = m;
    link_pump(link);
    pthread_mutex_unlock(&link->lock);
}

static void link_engine_close(kf_worker_link_t *link, kf_status_t status, const char *message) {
    link_close(link, status, message);
}

static void link_release(kf_worker_link_t *link) {
    link_unref(link);
}

static const kf_worker_ops_t link_ops = {
    .send = link_send,
    .close = link_engine_close,
    .release = link_release,
};

/* ---- the worker's side (CQ threads) ---- */

static void link_recv(kf_worker_link_t *link) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &link->recv_buffer;
    atomic_fetch_add(&link->refs, 1);
    if (grpc_call_start_batch(link->call->call, &op, 1, &link->tag_recv, NULL) != GRPC_CALL_OK) {
        atomic_fetch_sub(&link->refs, 1); /* never the last: the close batch holds one */
        link_fail(link, KF_E_INTERNAL, "cannot read the stream");
    }
}

/* One message from the worker: HELLO first, then RESULTs; false when the
 * stream is to end. */
static bool link_received(kf_worker_link_t *link, grpc_byte_buffer *buffer) {
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, buffer)) {
        link_fail(link, KF_E_INVALID, "protocol: an unreadable message");
        return false;
    }
    grpc_slice slice = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    kf_error_t err;
    kf_error_clear(&err);
    Keyflow__V1__WorkerMessage *m = NULL;
    if (kf_wire_check(&keyflow__v1__worker_message__descriptor, GRPC_SLICE_START_PTR(slice),
                      GRPC_SLICE_LENGTH(slice), &err) == KF_OK) {
        m = keyflow__v1__worker_message__unpack(NULL, GRPC_SLICE_LENGTH(slice),
                                                GRPC_SLICE_START_PTR(slice));
    }
    grpc_slice_unref(slice);
    if (m == NULL) {
        char reason[KF_ERROR_MESSAGE_BYTES_MAX];
        snprintf(reason, sizeof reason, "protocol: not a keyflow.v1.WorkerMessage%s%.400s",
                 err.message[0] ? ": " : "", err.message);
        link_fail(link, KF_E_INVALID, reason);
        return false;
    }
    if (!link->hello_posted && link->call->principal != NULL &&
        kf_auth_authorize(link->call->principal, link->call->method, &m->base, &err) != KF_OK) {
        /* The key holds functions:serve, but not for this function. */
        keyflow__v1__worker_message__free_unpacked(m, NULL);
        link_close(link, err.status, err.message);
        return false;
    }
    kf_worker_event_t *ev = kf_xcalloc(1, sizeof *ev);
    ev->link = link;
    ev->message = &m->base;
    if (!link->hello_posted) {
        ev->kind = KF_WORKER_HELLO;
        ev->ops = &link_ops;
        ev->principal = link->call->principal; /* the call outlives the engine's link */
        char *peer = grpc_call_get_peer(link->call->call);
        snprintf(ev->peer, sizeof ev->peer, "%s", peer ? peer : "");
        gpr_free(peer);
        /* The engine's reference, taken before it can be released. */
        atomic_fetch_add(&link->refs, 1);
        pthread_mutex_lock(&link->lock);
        link->hello_posted = true;
        pthread_mutex_unlock(&link->lock);
        if (kf_router_worker_post(link->call->server->router, ev, &err) != KF_OK) {
            pthread_mutex_lock(&link->lock);
            link->hello_posted = false;
            pthread_mutex_unlock(&link->lock);
            kf_worker_event_free(ev);
            atomic_fetch_sub(&link->refs, 1); /* never the last: recv holds one */
            link_close(link, err.status, err.message);
            return false;
        }
        return true;
    }
    /* Only results, each answering a call this stream carried: the number
     * of events a stream has in the engine stays bounded (step/engine_types.h). */
    pthread_mutex_lock(&link->lock);
    bool closing = link->closing;
    uint64_t sent = link->calls_sent;
    pthread_mutex_unlock(&link->lock);
    const char *problem = NULL;
    if (m->message_case != KEYFLOW__V1__WORKER_MESSAGE__MESSAGE_RESULT) {
        problem = "protocol: after the hello a worker sends only results";
    } else if (++link->results > sent) {
        problem = "protocol: more results than calls were sent";
    }
    if (problem != NULL || closing) {
        kf_worker_event_free(ev);
        if (problem != NULL) {
            link_fail(link, KF_E_INVALID, problem);
            return false;
        }
        return true; /* the engine closed the stream: the rest is dropped */
    }
    ev->kind = KF_WORKER_RESULT;
    if (kf_router_worker_post(link->call->server->router, ev, &err) != KF_OK) {
        kf_worker_event_free(ev);
        link_close(link, err.status, err.message);
        return false;
    }
    return true;
}

static void on_worker_recv(kf_worker_link_t *link, bool ok) {
    grpc_byte_buffer *buffer = link->recv_buffer;
    link->recv_buffer = NULL;
    if (!ok || buffer == NULL) {
        /* Half-closed (ok, no message), cancelled or gone (not ok). */
        const char *reason = ok ? "the worker closed its stream" : "the stream was cancelled";
        link_close(link, KF_OK, NULL);
        link_post_gone(link, reason);
    } else {
        bool more = link_received(link, buffer);
        grpc_byte_buffer_destroy(buffer);
        if (more) {
            link_recv(link);
        }
    }
    link_unref(link);
}

static void on_worker_sent(kf_worker_link_t *link, bool ok) {
    pthread_mutex_lock(&link->lock);
    grpc_byte_buffer_destroy(link->sending);
    link->sending = NULL;
    if (!ok && !link->closing) {
        link->closing = true; /* the transport is gone: recv ends too */
        link->status_started = true;
    }
    link_pump(link);
    pthread_mutex_unlock(&link->lock);
    link_unref(link);
}

/* Whether the peer is this machine: loopback or a unix socket. */
static bool peer_is_local(const char *peer) {
    return strncmp(peer, "ipv4:127.", 9) == 0 || strncmp(peer, "ipv6:[::1]:", 11) == 0 ||
           strncmp(peer, "ipv6:[::ffff:127.", 17) == 0 || strncmp(peer, "unix:", 5) == 0;
}

static void start_worker(call_t *c) {
    kf_grpc_server_t *s = c->server;
    /* Who may serve a function: a worker receives every key, row and state
     * of it. One on this machine (loopback or a unix socket), or one that
     * came over TLS with an API key: the key's functions:serve was checked
     * at arrival (authenticate), its prefix is checked against the hello's
     * function_id (link_received). A plaintext worker from elsewhere could
     * be anyone on the path, key or not. */
    char *peer = grpc_call_get_peer(c->call);
    bool local = peer != NULL && peer_is_local(peer);
    bool admitted = local || (s->tls_enabled && c->principal != NULL);
    char message[256];
    snprintf(message, sizeof message,
             "Workers/Serve: a worker must connect from this machine (loopback), or over TLS "
             "with an API key holding functions:serve; this call came from %.100s%s",
             peer ? peer : "an unknown peer", s->tls_enabled ? " without a key" : " without TLS");
    gpr_free(peer);
    if (!admitted) {
        send_reply(c, KF_E_PERMISSION, message, NULL);
        return;
    }
    if (atomic_fetch_add(&s->worker_streams, 1) >= KF_WORKER_STREAMS_MAX) {
        atomic_fetch_sub(&s->worker_streams, 1);
        snprintf(message, sizeof message,
                 "Workers/Serve: %d worker streams are open (KF_WORKER_STREAMS_MAX)",
                 KF_WORKER_STREAMS_MAX);
        send_reply(c, KF_E_LIMIT, message, NULL);
        return;
    }
    kf_worker_link_t *link = kf_xcalloc(1, sizeof *link);
    link->call = c;
    pthread_mutex_init(&link->lock, NULL);
    link->tag_recv = (call_tag_t){c, CALL_WORKER_RECV};
    link->tag_send = (call_tag_t){c, CALL_WORKER_SENT};
    link->tag_status = (call_tag_t){c, CALL_WORKER_DONE};
    link->tag_close = (call_tag_t){c, CALL_WORKER_DONE};
    c->link = link;
    atomic_store(&link->refs, 1); /* the close batch */
    grpc_op close_op;
    memset(&close_op, 0, sizeof close_op);
    close_op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    close_op.data.recv_close_on_server.cancelled = &c->cancelled;
    if (grpc_call_start_batch(c->call, &close_op, 1, &link->tag_close, NULL) != GRPC_CALL_OK) {
        call_free(c);
        return;
    }
    /* Every method is registered to read its first message with the call
     * (GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER): the hello is here. */
    grpc_byte_buffer *hello = c->payload;
    c->payload = NULL;
    atomic_fetch_add(&link->refs, 1); /* as a recv in flight would hold */
    link->recv_buffer = hello;
    on_worker_recv(link, true);
}

static void on_worker_event(call_t *c, call_tag_t *tag, bool ok) {
    kf_worker_link_t *link = c->link;
    if (tag == &link->tag_recv) {
        on_worker_recv(link, ok);
    } else if (tag == &link->tag_send) {
        on_worker_sent(link, ok);
    } else {
        if (tag == &link->tag_status) {
            record_metrics(c);
        }
        link_unref(link);
    }
}

/* A LONG_POLL request that may wait in the engine (its wait_ms > 0): its
 * wait is capped at the call's deadline (the client would not see a later
 * answer), and the caller watches for the client leaving. */
static bool prepare_long_poll(call_t *c, ProtobufCMessage *req) {
    int64_t *wait_ms = kf_method_wait_ms(c->method, req);
    if (wait_ms == NULL || *wait_ms <= 0 || *wait_ms > KF_POLL_WAIT_MS_MAX) {
        return false; /* nothing to wait for, or out of range: the engine says so */
    }
    gpr_timespec deadline = gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC);
    gpr_timespec now = gpr_now(GPR_CLOCK_MONOTONIC);
    if (gpr_time_cmp(deadline, gpr_inf_future(GPR_CLOCK_MONOTONIC)) != 0) {
        int64_t left_ms = gpr_time_to_millis(gpr_time_sub(deadline, now)) - 5;
        if (left_ms < *wait_ms) {
            *wait_ms = left_ms > 0 ? left_ms : 0;
        }
    }
    return *wait_ms > 0;
}

/* The call's request message, or NULL after refusing the call. */
static ProtobufCMessage *unpack_or_refuse(call_t *c) {
    kf_error_t err;
    kf_error_clear(&err);
    ProtobufCMessage *req = unpack_payload(c, c->method->request, &err);
    if (req == NULL) {
        send_reply(c, err.status != KF_OK ? err.status : KF_E_INVALID,
                   err.message[0] ? err.message : "request: unreadable", NULL);
    }
    return req;
}

/* Health/Check: the whole server (service "") or one of its services. */
static void health_check(call_t *c, const Grpc__Health__V1__HealthCheckRequest *req) {
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    if (!health_service_known(req->service)) {
        send_reply(c, KF_E_NOT_FOUND, "service: unknown service name", NULL);
        return;
    }
    resp.status = health_serving(c->server)
                      ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                      : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    send_reply(c, KF_OK, NULL, &resp.base);
}

/* Who is calling: the "authorization" metadata against the API keys, and
 * whether that key holds the RPC's scope, before anything else is read (a
 * caller without a working key or the scope learns nothing about its
 * request). Refuses the call (and returns false) otherwise. */
static bool authenticate(call_t *c) {
    kf_auth_t *auth = c->server->auth;
    if (auth == NULL) {
        return true;
    }
    const char *value = NULL;
    size_t len = 0, count = 0;
    for (size_t i = 0; i < c->metadata.count; i++) {
        if (grpc_slice_str_cmp(c->metadata.metadata[i].key, "authorization") == 0 && count++ == 0) {
            value = (const char *)GRPC_SLICE_START_PTR(c->metadata.metadata[i].value);
            len = GRPC_SLICE_LENGTH(c->metadata.metadata[i].value);
        }
    }
    kf_error_t err;
    if (kf_auth_authenticate(auth, c->method->scope, value, len, count, &c->principal, &err) !=
            KF_OK ||
        kf_auth_authorize(c->principal, c->method, NULL, &err) != KF_OK) {
        send_reply(c, err.status, err.message, NULL);
        return false;
    }
    return true;
}

/* Unpacks the request and checks it against the caller's grants (scope,
 * name prefixes); NULL after refusing the call. */
static ProtobufCMessage *unpack_authorized(call_t *c) {
    ProtobufCMessage *req = unpack_or_refuse(c);
    kf_error_t err;
    if (req != NULL && kf_auth_authorize(c->principal, c->method, req, &err) != KF_OK) {
        send_reply(c, err.status, err.message, NULL);
        return NULL;
    }
    return req;
}

/* ---- ServerReflectionInfo ---------------------------------------------------
 * A bidirectional stream, served as a loop on the completion queue: answer
 * the request at hand (rpc/reflection.h), send it, read the next one; the
 * client's half-close ends the stream with OK. Each answer is built in the
 * call's arena, reset per request, so a long session stays bounded. */

static void reflect_finish(call_t *c, kf_status_t status, const char *message) {
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!c->reflect_started) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->reflect_started = true;
    }
    put_status(c, &ops[n++], status, message);
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n].data.recv_close_on_server.cancelled = &c->cancelled;
    n++;
    c->tag_main.state = CALL_REFLECT_DONE;
    if (grpc_call_start_batch(c->call, ops, n, &c->tag_main, NULL) != GRPC_CALL_OK) {
        call_free(c);
    }
}

/* Answers `request` (NULL: the client half-closed: the end). */
static void reflect_answer(call_t *c, grpc_byte_buffer *request) {
    if (request == NULL) {
        reflect_finish(c, KF_OK, NULL);
        return;
    }
    size_t request_len = grpc_byte_buffer_length(request);
    if (request_len > KF_FRONT_REQUEST_BYTES_MAX) {
        char message[KF_ERROR_MESSAGE_BYTES_MAX];
        snprintf(message, sizeof message, "request: %zu bytes; reflection takes at most %d",
                 request_len, KF_FRONT_REQUEST_BYTES_MAX);
        reflect_finish(c, KF_E_TOO_LARGE, message);
        return;
    }
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, request)) {
        reflect_finish(c, KF_E_INVALID, "request: unreadable");
        return;
    }
    grpc_slice bytes = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    kf_arena_reset(&c->arena);
    uint8_t *answer = NULL;
    size_t len = 0;
    kf_error_t err;
    kf_status_t st = kf_reflection_answer(c->server->reflection, GRPC_SLICE_START_PTR(bytes),
                                          GRPC_SLICE_LENGTH(bytes), &c->arena, &answer, &len, &err);
    grpc_slice_unref(bytes);
    if (st != KF_OK) {
        reflect_finish(c, st, err.message);
        return;
    }
    grpc_slice slice = grpc_slice_from_copied_buffer((const char *)answer, len);
    if (send_stream_message(c, slice, &c->reflect_started, CALL_REFLECT_SENT) != GRPC_CALL_OK) {
        reflect_finish(c, KF_E_INTERNAL, "cannot send the answer");
    }
}

static void reflect_read(call_t *c) {
    if (c->reflect_next != NULL) {
        grpc_byte_buffer_destroy(c->reflect_next);
        c->reflect_next = NULL;
    }
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->reflect_next;
    c->tag_main.state = CALL_REFLECT_READ;
    if (grpc_call_start_batch(c->call, &op, 1, &c->tag_main, NULL) != GRPC_CALL_OK) {
        reflect_finish(c, KF_E_INTERNAL, "cannot read the next request");
    }
}

/* The RPCs this front end answers itself (FRONT rows of proto/rpcs.h). No
 * default: a new FRONT row does not compile until it is served here. */
static void serve_front(call_t *c) {
    ProtobufCMessage *req;
    switch (c->method->front) {
    case KF_FRONT_HEALTH_WATCH:
        if ((req = unpack_or_refuse(c)) != NULL) {
            start_watch(c, (const Grpc__Health__V1__HealthCheckRequest *)req);
        }
        return;
    case KF_FRONT_HEALTH_CHECK:
        if ((req = unpack_authorized(c)) != NULL) {
            health_check(c, (const Grpc__Health__V1__HealthCheckRequest *)req);
        }
        return;
    case KF_FRONT_TAIL_OUTPUT:
        if ((req = unpack_authorized(c)) != NULL) {
            start_tail(c, (const Keyflow__V1__TailOutputRequest *)req);
        }
        return;
    case KF_FRONT_WORKER_SERVE: start_worker(c); return; /* it reads its own messages */
    case KF_FRONT_PLACEMENT:
        if ((req = unpack_authorized(c)) != NULL) {
            Keyflow__V1__Placement *placement = kf_router_placement(c->server->router, &c->arena);
            send_reply(c, placement != NULL ? KF_OK : KF_E_LIMIT,
                       placement != NULL ? NULL : "placement: out of memory",
                       placement != NULL ? &placement->base : NULL);
        }
        return;
    case KF_FRONT_REFLECTION_V1:
    case KF_FRONT_REFLECTION_V1ALPHA:
        reflect_answer(c, c->payload); /* the first request came with the call */
        return;
    }
    KF_UNREACHABLE();
}

/* Counts the call's request message among the bytes calls hold until they
 * are answered, or refuses the call (RESOURCE_EXHAUSTED, nothing done) when
 * that would pass the bound while other calls hold some: a call that is
 * alone is always taken, so any request within KF_REQUEST_BYTES_MAX can be
 * served. gRPC has already read the message; refusing at once frees it. */
static bool hold_request_bytes(call_t *c) {
    kf_grpc_server_t *s = c->server;
    int64_t n = c->payload != NULL ? (int64_t)grpc_byte_buffer_length(c->payload) : 0;
    int64_t before = atomic_fetch_add(&s->request_bytes, n);
    if (n > 0 && before > 0 && before + n > s->request_bytes_max) {
        atomic_fetch_sub(&s->request_bytes, n);
        kf_counter_add(KF_C_GRPC_REFUSED_REQUEST_BYTES, 1);
        char message[KF_ERROR_MESSAGE_BYTES_MAX];
        snprintf(message, sizeof message,
                 "queued request bytes: calls not yet answered hold %lld, and this request's "
                 "%lld would pass the limit of %lld (--grpc-request-bytes-held); retry later",
                 (long long)before, (long long)n, (long long)s->request_bytes_max);
        send_reply(c, KF_E_LIMIT, message, NULL);
        return false;
    }
    c->request_bytes = n;
    return true;
}

/* The request bytes a call this front end serves itself may bring (0: no
 * bound of its own, KF_REQUEST_BYTES_MAX as for every call). Health,
 * reflection and TailOutput streams stay open as long as the client likes,
 * holding their first request's bytes, and health and reflection need no
 * key: seven idle Watch streams of 19 MiB each held the whole
 * --grpc-request-bytes-held, so every other call was refused until they
 * closed. Their requests are small by nature; larger ones are refused. */
static size_t front_request_bytes_max(const kf_method_t *m) {
    if (m->executor != KF_RPC_FRONT_END) {
        return 0;
    }
    switch (m->front) {
    case KF_FRONT_HEALTH_WATCH:
    case KF_FRONT_HEALTH_CHECK: return KF_PROBE_REQUEST_BYTES_MAX;
    case KF_FRONT_TAIL_OUTPUT:
    case KF_FRONT_PLACEMENT:
    case KF_FRONT_REFLECTION_V1:
    case KF_FRONT_REFLECTION_V1ALPHA: return KF_FRONT_REQUEST_BYTES_MAX;
    case KF_FRONT_WORKER_SERVE: return 0; /* it reads its own messages, one at a time */
    }
    KF_UNREACHABLE();
}

/* Refuses (KF_E_TOO_LARGE, naming the bound) a front-end request past
 * front_request_bytes_max; true when the call may go on. */
static bool front_request_fits(call_t *c) {
    size_t cap = front_request_bytes_max(c->method);
    size_t n = c->payload != NULL ? grpc_byte_buffer_length(c->payload) : 0;
    if (cap == 0 || n <= cap) {
        return true;
    }
    char message[KF_ERROR_MESSAGE_BYTES_MAX];
    snprintf(message, sizeof message, "request: %zu bytes; %s takes at most %zu", n,
             c->method->name, cap);
    send_reply(c, KF_E_TOO_LARGE, message, NULL);
    return false;
}

static void on_arrival(kf_grpc_server_t *s, call_t *c) {
    atomic_fetch_add(&s->live_calls, 1);
    c->start_us = kf_mono_us();
    if (c->method == NULL) {
        request_generic(s);
        char msg[256];
        snprintf(msg, sizeof msg, "method %.*s is not implemented",
                 (int)GRPC_SLICE_LENGTH(c->call_details.method),
                 (const char *)GRPC_SLICE_START_PTR(c->call_details.method));
        send_reply(c, KF_E_UNIMPLEMENTED, msg, NULL);
        return;
    }
    request_call(s, (size_t)(c->method - kf_methods)); /* keep the method's backlog full */
    const kf_method_t *m = c->method;
    if (!front_request_fits(c) || !authenticate(c) || !hold_request_bytes(c)) {
        return;
    }
    if (m->executor == KF_RPC_FRONT_END) {
        serve_front(c);
        return;
    }
    ProtobufCMessage *req = unpack_authorized(c);
    if (req == NULL) {
        return;
    }
    /* The arena has the request now: the message need not wait in the
     * queue twice (its bytes stay counted until the answer). */
    grpc_byte_buffer_destroy(c->payload);
    c->payload = NULL;
    kf_cmd_t *cmd = &c->cmd;
    cmd->op = m->op;
    cmd->request = req;
    cmd->principal = c->principal;
    cmd->arena = &c->arena;
    cmd->done = engine_done;
    cmd->owner = c;
    bool long_poll = prepare_long_poll(c, req);
    if (long_poll) {
        /* Set before the submit, whose lock orders it before the reply
         * (send_reply then leaves RECV_CLOSE to the watch started below). */
        c->close_watched = true;
        atomic_store(&c->refs, 2); /* the close watch, and the command in the engine */
    }
    atomic_store(&c->in_engine, true);
    if (kf_router_submit(s->router, cmd) != KF_OK) {
        atomic_store(&c->in_engine, false);
        if (long_poll) {
            c->close_watched = false; /* not submitted: no other thread has the call */
            atomic_store(&c->refs, 0);
        }
        add_owner_trailers(c, cmd);
        send_reply(c, cmd->error.status, cmd->error.message, NULL);
        return;
    }
    if (long_poll) {
        /* The close watch starts only now, once the command has its id: a
         * close seen by another gRPC thread must find the command in the
         * engine under the id it was submitted with (cancelling it), or
         * already out of it. The watch's reference keeps the call alive
         * until here even if the reply went out meanwhile. */
        grpc_op close_op;
        memset(&close_op, 0, sizeof close_op);
        close_op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        close_op.data.recv_close_on_server.cancelled = &c->cancelled;
        c->tag_close.state = CALL_POLL_CLOSED;
        if (grpc_call_start_batch(c->call, &close_op, 1, &c->tag_close, NULL) != GRPC_CALL_OK) {
            if (atomic_fetch_sub(&c->refs, 1) == 1) {
                call_free(c);
            }
        }
    }
}

static void on_event(kf_grpc_server_t *s, call_tag_t *tag, bool ok) {
    if (tag == &s->shutdown_tag) {
        atomic_store(&s->shutdown_done, true);
        return;
    }
    call_t *c = tag->call;
    switch (tag->state) {
    case CALL_REQUESTED:
        if (!ok) {
            c->call = NULL; /* the server is shutting down: no call was created */
            call_free(c);
            return;
        }
        on_arrival(s, c);
        return;
    case CALL_REPLYING:
        record_metrics(c);
        if (atomic_fetch_sub(&c->refs, 1) == 1) {
            call_free(c);
        }
        return;
    case CALL_WATCH_SENT: watch_sent(c, ok); return;
    case CALL_WATCH_CLOSED: watch_closed(c); return;
    case CALL_POLL_CLOSED:
        /* The client left while its long poll may still wait in the engine:
         * tell the engine, so that no run is leased to nobody. */
        if (c->cancelled && atomic_load(&c->in_engine)) {
            kf_router_cancel(s->router, &c->cmd);
        }
        if (atomic_fetch_sub(&c->refs, 1) == 1) {
            call_free(c);
        }
        return;
    case CALL_TAIL_SENT:
        if (ok) {
            tail_next(c);
        } else {
            tail_unref(c);
        }
        return;
    case CALL_TAIL_CLOSED:
        /* The client left: a read parked in the engine would otherwise wait
         * out its full wait (holding a parked-read slot); cancel it. */
        atomic_store(&c->tail_closed, true);
        if (atomic_load(&c->in_engine)) {
            kf_router_cancel(s->router, &c->cmd);
        }
        tail_unref(c);
        return;
    case CALL_TAIL_DONE:
        record_metrics(c);
        tail_unref(c);
        return;
    case CALL_WORKER_RECV:
    case CALL_WORKER_SENT:
    case CALL_WORKER_DONE: on_worker_event(c, tag, ok); return;
    case CALL_REFLECT_SENT:
        if (ok) {
            reflect_read(c);
        } else {
            reflect_finish(c, KF_E_CANCELLED, "the client went away");
        }
        return;
    case CALL_REFLECT_READ:
        if (ok) {
            reflect_answer(c, c->reflect_next);
        } else {
            reflect_finish(c, KF_E_CANCELLED, "the client went away");
        }
        return;
    case CALL_REFLECT_DONE:
        record_metrics(c);
        call_free(c);
        return;
    }
}

static void *cq_main(void *arg) {
    kf_grpc_server_t *s = arg;
    pthread_setname_np(pthread_self(), "kf-grpc");
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) {
            break;
        }
        if (ev.type == GRPC_OP_COMPLETE) {
            on_event(s, ev.tag, ev.success != 0);
        }
    }
    return NULL;
}

/* Debian builds abseil without NDEBUG, so every absl::Mutex inside gRPC
 * keeps a lock-order graph for deadlock detection (a debug aid; release
 * builds of abseil leave it off). It cost 3-4% of the server's CPU in the
 * SendEvent profile; turning it off gave Health/Check at c=64 +5-13%
 * (bench/README.md). Turned off the way abseil offers it,
 * absl::SetMutexDeadlockDetectionMode(kIgnore), looked up by its mangled
 * name because this is C; when the symbol is absent nothing changes. */
static void absl_deadlock_detection_off(void) {
    static const char *const names[] = {
        "_ZN4absl7debian329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE",
        "_ZN4absl12lts_2022062329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *sym = dlsym(RTLD_DEFAULT, names[i]);
        if (sym != NULL) {
            void (*set_mode)(int) = (void (*)(int))(uintptr_t)sym;
            set_mode(0); /* absl::OnDeadlockCycle::kIgnore */
            return;
        }
    }
}

/* gRPC's certificate fetcher: asked before handshakes (the first time when
 * the port starts) whether the certificate changed. Any gRPC thread. The
 * config copies the PEM text, so the material is released here. */
static grpc_ssl_certificate_config_reload_status
fetch_certificate(void *user_data, grpc_ssl_server_certificate_config **config) {
    kf_grpc_server_t *s = user_data;
    pthread_mutex_lock(&s->tls_lock);
    kf_tls_t *tls = s->tls_next;
    s->tls_next = NULL;
    pthread_mutex_unlock(&s->tls_lock);
    if (tls == NULL) {
        return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
    }
    grpc_ssl_pem_key_cert_pair pair = {kf_tls_key_pem(tls), kf_tls_cert_pem(tls)};
    /* gRPC 1.51 asserts that a fetched config has root certificates even
     * when no client certificate is requested (they then go unused): the
     * server's own chain stands in for them. */
    const char *roots = kf_tls_client_ca_pem(tls);
    *config = grpc_ssl_server_certificate_config_create(
        roots != NULL ? roots : kf_tls_cert_pem(tls), &pair, 1);
    kf_tls_unref(tls);
    return *config != NULL ? GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW
                           : GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
}

void kf_grpc_server_set_tls(kf_grpc_server_t *s, kf_tls_t *tls) {
    KF_ASSERT(s->tls_enabled);
    kf_tls_ref(tls);
    pthread_mutex_lock(&s->tls_lock);
    kf_tls_t *replaced = s->tls_next;
    s->tls_next = tls;
    pthread_mutex_unlock(&s->tls_lock);
    kf_tls_unref(replaced); /* never fetched: superseded */
}

/* Insecure credentials, or TLS ones whose certificate comes from the
 * fetcher, so that a reload needs no new port. */
static grpc_server_credentials *server_credentials(kf_grpc_server_t *s, kf_tls_t *tls) {
    if (tls == NULL) {
        return grpc_insecure_server_credentials_create();
    }
    s->tls_enabled = true;
    kf_grpc_server_set_tls(s, tls);
    grpc_ssl_server_credentials_options *options =
        grpc_ssl_server_credentials_create_options_using_config_fetcher(
            kf_tls_requires_client_cert(tls)
                ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            fetch_certificate, s);
    return grpc_ssl_server_credentials_create_with_options(options); /* takes the options */
}

kf_status_t kf_grpc_server_create(const kf_grpc_options_t *options, kf_router_t *router,
                                  kf_grpc_server_t **out, int *port, kf_error_t *err) {
    absl_deadlock_detection_off();
    grpc_init();
    gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);
    kf_grpc_server_t *s = calloc(1, sizeof *s);
    if (s == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate the gRPC server");
    }
    s->router = router;
    s->auth = options->auth;
    s->thread_count = options->threads > 0 ? options->threads : 1;
    if (s->thread_count > KF_GRPC_THREADS_MAX) {
        s->thread_count = KF_GRPC_THREADS_MAX;
    }
    s->request_bytes_max = options->request_bytes_held_max > 0 ? options->request_bytes_held_max
                                                               : KF_GRPC_REQUEST_BYTES_HELD_DEFAULT;
    s->shutdown_tag.call = NULL;
    s->health_listener = -1;
    kf_status_t reflection_st = kf_reflection_create(&s->reflection, err);
    if (reflection_st != KF_OK) {
        free(s);
        grpc_shutdown();
        return reflection_st;
    }
    pthread_mutex_init(&s->tls_lock, NULL);
    pthread_mutex_init(&s->watch_lock, NULL);
    /* gRPC's own buffers: it grants a stream the window for its whole
     * message (up to KF_REQUEST_BYTES_MAX) before the call reaches us, on
     * any number of streams. Past the quota it resets streams. */
    grpc_resource_quota *quota = grpc_resource_quota_create("keyflow");
    grpc_resource_quota_resize(quota, KF_GRPC_MEMORY_QUOTA_BYTES);
    grpc_arg args[4];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = KF_REQUEST_BYTES_MAX;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = KF_RESPONSE_BYTES_MAX;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_ALLOW_REUSEPORT;
    args[2].value.integer = 0;
    args[3].type = GRPC_ARG_POINTER;
    args[3].key = GRPC_ARG_RESOURCE_QUOTA;
    args[3].value.pointer.p = quota;
    args[3].value.pointer.vtable = grpc_resource_quota_arg_vtable();
    grpc_channel_args channel_args = {4, args};
    s->server = grpc_server_create(&channel_args, NULL);
    grpc_resource_quota_unref(quota); /* the server holds its own reference */
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    _Static_assert(KF_METHOD_COUNT <= KF_METRICS_METHODS_MAX, "a metrics id per method");
    for (size_t i = 0; i < KF_METHOD_COUNT; i++) {
        s->registered[i] = grpc_server_register_method(
            s->server, kf_methods[i].path, NULL, GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
        s->metrics_ids[i] = kf_metrics_method_register(kf_methods[i].name, KF_TRANSPORT_GRPC);
    }
    grpc_server_credentials *creds = server_credentials(s, options->tls);
    int bound = grpc_server_add_http2_port(s->server, options->address, creds);
    grpc_server_credentials_release(creds);
    if (bound == 0) {
        grpc_server_destroy(s->server);
        grpc_completion_queue_shutdown(s->cq);
        grpc_completion_queue_destroy(s->cq);
        kf_tls_unref(s->tls_next);
        pthread_mutex_destroy(&s->tls_lock);
        pthread_mutex_destroy(&s->watch_lock);
        kf_reflection_destroy(s->reflection);
        free(s);
        grpc_shutdown();
        return kf_error_set(err, KF_E_IO, "grpc: cannot bind %s", options->address);
    }
    *port = bound;
    *out = s;
    return KF_OK;
}

kf_status_t kf_grpc_server_start(kf_grpc_server_t *s, kf_error_t *err) {
    grpc_server_start(s->server);
    for (size_t i = 0; i < KF_METHOD_COUNT; i++) {
        for (int k = 0; k < KF_GRPC_PENDING_PER_METHOD; k++) {
            request_call(s, i);
        }
    }
    request_generic(s);
    s->health_listener = kf_health_listen(on_health_change, s);
    if (s->health_listener < 0) {
        return kf_error_set(err, KF_E_LIMIT,
                            "health: no listener slot left (KF_HEALTH_LISTENERS_MAX)");
    }
    for (int i = 0; i < s->thread_count; i++) {
        if (pthread_create(&s->threads[i], NULL, cq_main, s) != 0) {
            return kf_error_set(err, KF_E_INTERNAL, "cannot start a gRPC thread");
        }
    }
    s->started = true;
    return KF_OK;
}

void kf_grpc_server_wait_watches(kf_grpc_server_t *s, int timeout_ms) {
    int64_t deadline_us = kf_mono_us() + (int64_t)timeout_ms * 1000;
    for (;;) {
        bool sending = false;
        pthread_mutex_lock(&s->watch_lock);
        for (call_t *c = s->watching; c != NULL && !sending; c = c->watch_next) {
            sending = c->watch_sending || watch_status(c) != c->watch_sent;
        }
        pthread_mutex_unlock(&s->watch_lock);
        if (!sending || kf_mono_us() >= deadline_us) {
            return;
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

void kf_grpc_server_shutdown(kf_grpc_server_t *s) {
    if (atomic_exchange(&s->shutting_down, true)) {
        return;
    }
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
}

void kf_grpc_server_destroy(kf_grpc_server_t *s, int grace_ms) {
    if (s == NULL) {
        return;
    }
    kf_grpc_server_shutdown(s);
    if (s->health_listener >= 0) {
        kf_health_unlisten(s->health_listener); /* no more sends to the watches */
    }
    /* Calls the engine answered are finishing; health watches stay open
     * until cancelled. Give the rest a grace period, then cancel. */
    int64_t deadline = kf_mono_us() + (int64_t)grace_ms * 1000;
    bool cancelled = false;
    while (s->started && !atomic_load(&s->shutdown_done)) {
        int busy = atomic_load(&s->live_calls) - atomic_load(&s->watches);
        if (!cancelled && (kf_mono_us() > deadline || busy <= 0)) {
            grpc_server_cancel_all_calls(s->server);
            cancelled = true;
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (!cancelled) {
        grpc_server_cancel_all_calls(s->server);
    }
    while (s->started && atomic_load(&s->live_calls) > 0) {
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    grpc_server_destroy(s->server);
    grpc_completion_queue_shutdown(s->cq);
    if (s->started) {
        for (int i = 0; i < s->thread_count; i++) {
            pthread_join(s->threads[i], NULL);
        }
    } else {
        while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
               GRPC_QUEUE_SHUTDOWN) {
        }
    }
    grpc_completion_queue_destroy(s->cq);
    kf_tls_unref(s->tls_next);
    pthread_mutex_destroy(&s->tls_lock);
    pthread_mutex_destroy(&s->watch_lock);
    kf_reflection_destroy(s->reflection);
    free(s);
    grpc_shutdown();
}
