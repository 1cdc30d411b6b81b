/*
 * gateway.c - h2o event loops, request dispatch and asynchronous replies.
 *
 * Two servers, each an h2o context on its own loop thread: the gateway
 * (every route, plus the probes) and, with --probe-address, the probe
 * listener (GET /healthz, /readyz and /metrics only), whose own thread and
 * connection budget keep probes answered however the gateway's clients
 * behave. Who may connect, and for how long, is conns.h's.
 *
 * No request holds the gateway's loop for long: a body larger than
 * KF_HTTP_INLINE_BODY_BYTES_MAX is decoded by a worker thread (base/
 * workers.h), which submits the command to the engine itself, and a
 * response larger than that is rendered there; the loop only routes,
 * authenticates and sends. Bodies larger than KF_REQUEST_BYTES_MAX are
 * refused by h2o from their Content-Length, before they are read, with the
 * gateway's JSON error (json_errors below).
 *
 * Request lifetime: h2o may dispose a request before the engine answers
 * (an HTTP/2 client resets its stream). Each in-flight request therefore has
 * a heap http_call_t owned by the gateway, and a small hook in the request's
 * pool whose destructor clears call->req. When the engine's reply arrives on
 * the loop thread, it is sent only if call->req is still set; the call is
 * freed either way (or, when its rendered body is sent from its arena
 * without a copy, when h2o disposes the request). The hook is only touched
 * while call->req is set (then the pool, and so the hook, is alive). A body
 * a worker decodes is the request's own memory for HTTP/1 (h2o neither
 * reads nor disposes a connection's request while the handler holds it) and
 * a copy for HTTP/2 (a reset stream frees its body at once).
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include "http/gateway.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <h2o.h>

#include "base/alloc.h"
#include "base/arena.h"
#include "base/assert.h"
#include "base/clock.h"
#include "base/health.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/workers.h"
#include "http/conns.h"
#include "http/console.h"
#include "http/openapi.h"
#include "http/routes.h"
#include "keyflow/v1/partitions.pb-c.h"
#include "proto/json_map.h"

typedef struct http_call http_call_t;

typedef struct req_hook {
    http_call_t *call; /* cleared when the reply was sent */
    http_call_t *keep; /* freed with the request: its body was sent from it */
    kf_router_t *router;
} req_hook_t;

struct http_call {
    h2o_multithread_message_t msg; /* to the gateway's loop, once */
    kf_work_t work;                /* to a worker: decode, or render */
    kf_gateway_t *gw;
    h2o_req_t *req; /* NULL once h2o disposed the request */
    req_hook_t *hook;
    kf_http_conn_t *conn; /* the connection, held while the call lives (or NULL) */
    const kf_method_t *method;
    int metrics_id;
    int64_t start_us;
    kf_arena_t arena;
    kf_cmd_t cmd;
    kf_principal_t *principal; /* the caller's key (a reference), or NULL */
    kf_http_request_t hreq;    /* what a worker decodes */
    char *copy;                /* HTTP/2: hreq's bytes, copied (malloc) */
    bool offloaded;            /* counted in KF_G_HTTP_OFFLOADING */
    bool rendered;             /* a worker rendered the response: */
    char *json;                /*   the text (in the arena), or NULL (too large) */
    size_t json_len;
    int watch_fd;            /* HTTP/1 long poll: its socket, or -1 */
    http_call_t *watch_prev; /* on gw->watched while watch_fd >= 0 */
    http_call_t *watch_next;
};

/* One listener and its loop thread. */
typedef struct http_server {
    kf_gateway_t *gw;
    const char *name; /* "http", "probe" */
    h2o_globalconf_t config;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    h2o_evloop_t *loop;
    int listen_fd;
    kf_http_conns_t *conns;
    h2o_multithread_queue_t *queue;
    h2o_multithread_receiver_t control; /* any thread -> loop: stop, TLS */
    pthread_t thread;
    bool created;
    bool started;
    bool tls;       /* serves TLS (fixed at init: read by any thread) */
    bool loopback;  /* its address is a loopback one (fixed at init) */
    bool exit_loop; /* loop thread only */
} http_server_t;

struct kf_gateway {
    http_server_t main;
    http_server_t probe; /* probe.created: --probe-address */
    int probe_port;
    h2o_multithread_receiver_t replies; /* engine, workers -> main loop: finished calls */
    kf_workers_t *workers;              /* decode and render large JSON */
    kf_router_t *router;
    kf_auth_t *auth; /* NULL: requests are not checked */
    atomic_bool stopping;
    atomic_int in_flight;
    char *openapi; /* GET /openapi.json, written at create (http/openapi.h) */
    size_t openapi_len;
    int metrics_ids[KF_METRICS_METHODS_MAX];
    /* HTTP/1 long polls: h2o does not read a connection while its request is
     * being handled, so a client that leaves is noticed only by peeking at
     * the socket now and then (main loop thread only). */
    http_call_t *watched;
    h2o_timeout_t watch_timeout;
    h2o_timeout_entry_t watch_entry;
};

#define WATCH_INTERVAL_MS 200

/* A TLS swap that kf_gateway_set_tls waits for: each loop takes its new
 * context, then counts itself done, so that when the call returns every
 * connection accepted afterwards gets the new certificate (a client told
 * "reloaded" must never be handed the old one). */
typedef struct tls_swap {
    pthread_mutex_t lock;
    pthread_cond_t done;
    int pending; /* loops that have not taken their context yet */
} tls_swap_t;

typedef struct control_msg {
    h2o_multithread_message_t msg;
    int what;         /* 1: close the listener, 2: exit the loop, 3: new TLS */
    SSL_CTX *ssl_ctx; /* what == 3: the context new connections get */
    tls_swap_t *swap; /* what == 3: borrowed; signalled once ssl_ctx is in place */
} control_msg_t;

static const char *reason(int status) {
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 421: return "Misdirected Request";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 507: return "Insufficient Storage";
    case 504: return "Gateway Timeout";
    default: return "Error";
    }
}

static void send_body(h2o_req_t *req, int status, const char *content_type, const char *body,
                      size_t len) {
    req->res.status = status;
    req->res.reason = reason(status);
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, content_type,
                   strlen(content_type));
    req->res.content_length = len;
    h2o_send_inline(req, body, len);
}

/* Returns the HTTP status sent (read it here: h2o may dispose `req` once
 * the reply is out). */
static int send_error_with(h2o_req_t *req, kf_status_t status, const char *message, int http_status,
                           json_t *extra) {
    json_t *body = json_pack("{s:i, s:s, s:s}", "code", kf_status_grpc_code(status), "status",
                             kf_status_grpc_name(status), "message", message);
    if (body != NULL && extra != NULL) {
        json_object_update(body, extra);
    }
    json_decref(extra);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    const char *out = text ? text : "{\"code\":13,\"status\":\"INTERNAL\",\"message\":\"\"}";
    int sent = http_status ? http_status : kf_status_http(status);
    send_body(req, sent, "application/json", out, strlen(out));
    free(text);
    return sent;
}

static int send_error(h2o_req_t *req, kf_status_t status, const char *message, int http_status) {
    return send_error_with(req, status, message, http_status, NULL);
}

/* A command's error. One for a key whose partition is served elsewhere
 * also names the partition and, when the placement knows it, its owner:
 * {"partition": 5, "owner": {"node": ..., "grpc": ..., "http": ...}}
 * (docs/scaling.md). */
static int send_cmd_error(kf_gateway_t *gw, h2o_req_t *req, const kf_cmd_t *cmd) {
    json_t *extra = NULL;
    if (cmd->error.status == KF_E_NOT_OWNER && cmd->foreign_partition >= 0) {
        extra = json_pack("{s:i}", "partition", (int)cmd->foreign_partition);
        const kf_placement_node_t *owner =
            kf_router_owner(gw->router, (uint32_t)cmd->foreign_partition);
        if (extra != NULL && owner != NULL) {
            json_object_set_new(extra, "owner",
                                json_pack("{s:s, s:s, s:s}", "node", owner->name, "grpc",
                                          owner->grpc_address, "http", owner->http_address));
        }
    }
    if (cmd->error.status != KF_OK && cmd->applied_partitions != NULL) {
        /* A SPLIT function's batch some partitions applied (router.h):
         * "appliedPartitions": [0, 3]. */
        json_t *applied = json_array();
        for (const char *p = cmd->applied_partitions; applied != NULL && *p != '\0';) {
            char *end;
            long v = strtol(p, &end, 10);
            json_array_append_new(applied, json_integer(v));
            p = *end == ',' ? end + 1 : end + strlen(end);
        }
        extra = extra != NULL ? extra : json_object();
        if (extra != NULL && applied != NULL) {
            json_object_set_new(extra, "appliedPartitions", applied);
        } else {
            json_decref(applied);
        }
    }
    return send_error_with(req, cmd->error.status, cmd->error.message, 0, extra);
}

/* 405 with the Allow header RFC 9110 requires: the methods the path does
 * accept, named in the JSON body's message too (a client that shows only
 * the body learns what to use). Returns 405. */
static int send_not_allowed(h2o_req_t *req, const char *message, const char *allow) {
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_ALLOW, NULL, allow, strlen(allow));
    char text[KF_ERROR_MESSAGE_BYTES_MAX + KF_HTTP_ALLOW_BYTES_MAX + 16];
    snprintf(text, sizeof text, "%s (allowed: %s)", message, allow);
    return send_error(req, KF_E_UNIMPLEMENTED, text, 405);
}

static void watch_unlink(kf_gateway_t *gw, http_call_t *call) {
    if (call->watch_fd < 0) {
        return;
    }
    if (call->watch_prev) {
        call->watch_prev->watch_next = call->watch_next;
    } else {
        gw->watched = call->watch_next;
    }
    if (call->watch_next) {
        call->watch_next->watch_prev = call->watch_prev;
    }
    call->watch_fd = -1;
}

/* Peeks at each watched socket: 0 bytes means the client closed it. The
 * peek never consumes data, so a pipelined request is left for h2o. */
static void on_watch_tick(h2o_timeout_entry_t *entry) {
    kf_gateway_t *gw = H2O_STRUCT_FROM_MEMBER(kf_gateway_t, watch_entry, entry);
    http_call_t *c = gw->watched;
    while (c != NULL) {
        http_call_t *next = c->watch_next;
        /* POLLRDHUP: the peer closed (or shut down its sending side), seen
         * even when bytes it sent before closing are still unread (a
         * pipelined request): a peek at the data would find those bytes
         * and miss the close. */
        struct pollfd p = {.fd = c->watch_fd, .events = POLLRDHUP};
        int n = poll(&p, 1, 0);
        if (n > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) {
            watch_unlink(gw, c);
            kf_router_cancel(gw->router, &c->cmd);
        }
        c = next;
    }
    if (gw->watched != NULL) {
        h2o_timeout_link(gw->main.loop, &gw->watch_timeout, &gw->watch_entry);
    }
}

static void watch_add(kf_gateway_t *gw, http_call_t *call, int fd) {
    call->watch_fd = fd;
    call->watch_prev = NULL;
    call->watch_next = gw->watched;
    if (gw->watched) {
        gw->watched->watch_prev = call;
    }
    gw->watched = call;
    if (!h2o_timeout_is_linked(&gw->watch_entry)) {
        h2o_timeout_link(gw->main.loop, &gw->watch_timeout, &gw->watch_entry);
    }
}

/* A LONG_POLL row's request with a wait may sit in the engine for a while. */
static bool is_long_poll(const kf_method_t *m, ProtobufCMessage *msg) {
    int64_t *wait_ms = kf_method_wait_ms(m, msg);
    return wait_ms != NULL && *wait_ms > 0;
}

/* Counts a request of a known method once (keyflow_requests_total and its
 * latency) and logs it (debug). `request` may be NULL (not readable). */
static void record_request(http_call_t *call, int metrics_id, int grpc_code, int http_status,
                           const ProtobufCMessage *request) {
    int64_t duration_us = kf_mono_us() - call->start_us;
    kf_metrics_request(metrics_id, KF_TRANSPORT_HTTP, grpc_code, duration_us);
    kf_log_request("http", call->method->name, grpc_code, http_status, duration_us, request);
}

/* The debug line of an HTTP request that names no RPC (a probe,
 * /openapi.json, a path no route has, a method no route of the path
 * takes): method "-", the HTTP method and the path as sent (without the
 * query), and the HTTP status
 * the answer carried. The path is percent-encoded past printable ASCII and
 * cut to KF_LOG_PATH_BYTES_MAX, so whatever a client sends, the line stays
 * one readable line. Loop thread, after the answer was sent. */
static void log_plain_request(const h2o_req_t *req, int64_t start_us) {
    if (!kf_log_enabled(KF_LOG_DEBUG)) {
        return;
    }
    static const char hex[] = "0123456789ABCDEF";
    char path[KF_LOG_PATH_BYTES_MAX + 4];
    char method[16];
    size_t o = 0;
    size_t path_len = req->query_at != SIZE_MAX ? req->query_at : req->path.len; /* no query */
    for (size_t i = 0; i < path_len; i++) {
        unsigned char c = (unsigned char)req->path.base[i];
        bool plain = c > ' ' && c < 0x7f;
        if (o + (plain ? 1 : 3) > KF_LOG_PATH_BYTES_MAX) {
            memcpy(path + o, "...", 3);
            o += 3;
            break;
        }
        if (plain) {
            path[o++] = (char)c;
        } else {
            path[o++] = '%';
            path[o++] = hex[c >> 4];
            path[o++] = hex[c & 15];
        }
    }
    path[o] = '\0';
    size_t m = 0;
    for (size_t i = 0; i < req->method.len && m + 1 < sizeof method; i++) {
        unsigned char c = (unsigned char)req->method.base[i];
        method[m++] = c > ' ' && c < 0x7f ? (char)c : '?';
    }
    method[m] = '\0';
    kf_log_kv(KF_LOG_DEBUG, "http", "request", KF_LOG_STR("method", "-"),
              KF_LOG_STR("transport", "http"), KF_LOG_STR("http_method", method),
              KF_LOG_STR("path", path), KF_LOG_INT("http_status", req->res.status),
              KF_LOG_INT("duration_us", kf_mono_us() - start_us));
}

/* Frees the call's memory (the loop's, or a worker's: nothing else refers
 * to it then). */
static void call_memory_free(http_call_t *call) {
    kf_arena_deinit(&call->arena);
    kf_principal_unref(call->principal);
    free(call->copy);
    free(call);
}

/* The call is over for the gateway (answered, or dropped): it leaves the
 * watch list and the in-flight count, and its connection is idle again.
 * Loop thread. */
static void call_end(http_call_t *call) {
    watch_unlink(call->gw, call);
    kf_http_conn_release(call->conn);
    call->conn = NULL;
    if (call->offloaded) {
        kf_gauge_add(KF_G_HTTP_OFFLOADING, -1);
        call->offloaded = false;
    }
    atomic_fetch_sub(&call->gw->in_flight, 1);
}

static void call_free(http_call_t *call) {
    call_end(call);
    call_memory_free(call);
}

/* h2o disposes the request (the client went away, or the reply was sent).
 * If the command still waits in the engine (a long poll), cancel it so that
 * it takes no run; the reply, when it comes, is dropped. A call whose body
 * was sent from its arena is freed now. Loop thread. */
static void on_req_dispose(void *p) {
    req_hook_t *hook = p;
    if (hook->call != NULL) {
        hook->call->req = NULL;
        kf_router_cancel(hook->router, &hook->call->cmd);
    }
    if (hook->keep != NULL) {
        call_memory_free(hook->keep);
    }
}

/* Sends the call's rendered body without copying it: the call, with its
 * arena, lives until h2o disposes the request. Loop thread; the call must
 * not be touched after this. */
static void send_rendered(http_call_t *call) {
    h2o_req_t *req = call->req;
    static h2o_generator_t generator = {NULL, NULL};
    req->res.status = 200;
    req->res.reason = reason(200);
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                   H2O_STRLIT("application/json"));
    req->res.content_length = call->json_len;
    call->hook->keep = call;
    h2o_start_response(req, &generator);
    if (h2o_memis(req->input.method.base, req->input.method.len, H2O_STRLIT("HEAD"))) {
        h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
    } else {
        h2o_iovec_t body = h2o_iovec_init(call->json, call->json_len);
        h2o_send(req, &body, 1, H2O_SEND_STATE_FINAL);
    }
}

/* Loop thread: the engine answered (or a worker could not decode the
 * request, or rendered the answer). */
static void finish_call(http_call_t *call) {
    kf_cmd_t *cmd = &call->cmd;
    int code = kf_status_grpc_code(cmd->error.status);
    int http_status = 0; /* 0: the client left, nothing was sent */
    bool kept = false;
    if (call->req != NULL) {
        h2o_req_t *req = call->req;
        call->hook->call = NULL;
        if (cmd->error.status != KF_OK) {
            http_status = send_cmd_error(call->gw, req, cmd);
        } else if (call->rendered && call->json != NULL) {
            http_status = 200;
            kept = true;
        } else {
            size_t len;
            char *json =
                call->rendered ? NULL : kf_message_to_json(cmd->response, &call->arena, &len);
            if (json != NULL) {
                http_status = 200;
                send_body(req, 200, "application/json", json, len);
            } else {
                code = kf_status_grpc_code(KF_E_TOO_LARGE);
                http_status = send_error(req, KF_E_TOO_LARGE, "response: too large to render", 0);
            }
        }
    }
    record_request(call, call->metrics_id, code, http_status, cmd->request);
    if (kept) {
        call_end(call);
        send_rendered(call); /* frees the call when h2o is done with it */
    } else {
        call_free(call);
    }
}

static void on_replies(h2o_multithread_receiver_t *receiver, h2o_linklist_t *messages) {
    (void)receiver;
    while (!h2o_linklist_is_empty(messages)) {
        h2o_multithread_message_t *m =
            H2O_STRUCT_FROM_MEMBER(h2o_multithread_message_t, link, messages->next);
        h2o_linklist_unlink(&m->link);
        finish_call(H2O_STRUCT_FROM_MEMBER(http_call_t, msg, m));
    }
}

static void on_control(h2o_multithread_receiver_t *receiver, h2o_linklist_t *messages) {
    http_server_t *srv = H2O_STRUCT_FROM_MEMBER(http_server_t, control, receiver);
    while (!h2o_linklist_is_empty(messages)) {
        h2o_multithread_message_t *m =
            H2O_STRUCT_FROM_MEMBER(h2o_multithread_message_t, link, messages->next);
        h2o_linklist_unlink(&m->link);
        control_msg_t *c = H2O_STRUCT_FROM_MEMBER(control_msg_t, msg, m);
        if (c->what == 1) {
            kf_http_conns_close_listener(srv->conns);
        } else if (c->what == 2) {
            srv->exit_loop = true;
        } else if (c->what == 3) {
            SSL_CTX_free(srv->accept_ctx.ssl_ctx); /* connections hold their own */
            srv->accept_ctx.ssl_ctx = c->ssl_ctx;
            pthread_mutex_lock(&c->swap->lock);
            c->swap->pending--;
            pthread_cond_signal(&c->swap->done);
            pthread_mutex_unlock(&c->swap->lock);
        }
        free(c);
    }
}

/* Hands a finished call to the gateway's loop. Any thread. */
static void to_loop(http_call_t *call) {
    h2o_multithread_send_message(&call->gw->replies, &call->msg);
}

/* Worker thread: renders a large response, then hands the call over. */
static void render_work(kf_work_t *work) {
    http_call_t *call = H2O_STRUCT_FROM_MEMBER(http_call_t, work, work);
    call->json = kf_message_to_json(call->cmd.response, &call->arena, &call->json_len);
    call->rendered = true;
    to_loop(call);
}

/* Replier thread: the engine answered. A large response is rendered by a
 * worker (when one is free; else by the loop, as any other). */
static void engine_done(kf_cmd_t *cmd) {
    http_call_t *call = cmd->owner;
    /* A long poll whose key was revoked while it waited gets nothing
     * (auth/auth.h); a unary call's answer says what it did. */
    if (cmd->error.status == KF_OK &&
        is_long_poll(call->method, (ProtobufCMessage *)cmd->request) &&
        kf_principal_check_open(call->principal, &cmd->error) != KF_OK) {
        cmd->response = NULL;
    }
    if (cmd->error.status == KF_OK &&
        protobuf_c_message_get_packed_size(cmd->response) > KF_HTTP_INLINE_BODY_BYTES_MAX) {
        call->work.run = render_work;
        if (kf_workers_submit(call->gw->workers, &call->work) == KF_OK) {
            kf_counter_add(KF_C_HTTP_OFFLOADED, 1);
            return;
        }
    }
    to_loop(call);
}

/* Authentication of a request for an RPC needing `scope`: the
 * Authorization header against the API keys. On failure the error is sent
 * (401 with a WWW-Authenticate challenge) and false returned. */
static bool authenticate(kf_gateway_t *gw, h2o_req_t *req, kf_scope_t scope,
                         kf_principal_t **principal) {
    *principal = NULL;
    if (gw->auth == NULL) {
        return true;
    }
    ssize_t i = h2o_find_header(&req->headers, H2O_TOKEN_AUTHORIZATION, -1);
    const char *value = i >= 0 ? req->headers.entries[i].value.base : NULL;
    size_t len = i >= 0 ? req->headers.entries[i].value.len : 0;
    size_t count = 0;
    for (ssize_t at = i; at >= 0;
         at = h2o_find_header(&req->headers, H2O_TOKEN_AUTHORIZATION, at)) {
        count++;
    }
    kf_error_t err;
    if (kf_auth_authenticate(gw->auth, scope, value, len, count, principal, &err) != KF_OK) {
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_WWW_AUTHENTICATE, NULL,
                       H2O_STRLIT("Bearer realm=\"keyflow\""));
        send_error(req, err.status, err.message, 0);
        return false;
    }
    return true;
}

/* GET /metrics: with auth on, a key holding metrics:read (Prometheus sends
 * bearer tokens). */
static void serve_metrics(kf_gateway_t *gw, h2o_req_t *req) {
    kf_principal_t *p;
    if (!authenticate(gw, req, KF_SCOPE_METRICS_READ, &p)) {
        return;
    }
    bool allowed = kf_principal_allows(p, KF_SCOPE_METRICS_READ, "");
    kf_principal_unref(p);
    if (!allowed) {
        send_error(req, KF_E_PERMISSION,
                   "/metrics needs the metrics:read scope, which this API key lacks", 0);
        return;
    }
    size_t len;
    char *text = kf_metrics_render(&len);
    if (text == NULL) {
        send_error(req, KF_E_NOMEM, "metrics: out of memory", 0);
        return;
    }
    send_body(req, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
    free(text);
}

static bool path_is(h2o_req_t *req, size_t path_len, const char *want) {
    return path_len == strlen(want) && memcmp(req->path.base, want, path_len) == 0;
}

/* GET /healthz, /readyz and /metrics, on either listener, and (main: on
 * the gateway's listener only) /openapi.json. The probe listener serves
 * exactly the probes and /metrics: it is the port operators open to their
 * monitoring, and the API's description belongs with the API. False
 * (nothing sent) for any other path. */
static bool serve_probe(kf_gateway_t *gw, h2o_req_t *req, size_t path_len, bool main) {
    bool is_get = h2o_memis(req->method.base, req->method.len, H2O_STRLIT("GET")) ||
                  h2o_memis(req->method.base, req->method.len, H2O_STRLIT("HEAD"));
    static const char *const probes[] = {"/healthz", "/readyz", "/metrics", "/openapi.json"};
    size_t served = sizeof probes / sizeof probes[0] - (main ? 0 : 1);
    for (size_t i = 0; i < served; i++) {
        if (!is_get && path_is(req, path_len, probes[i])) {
            char message[64];
            snprintf(message, sizeof message, "method: use GET for %s", probes[i]);
            send_not_allowed(req, message, "GET, HEAD");
            return true;
        }
    }
    if (path_is(req, path_len, "/healthz")) {
        static const char ok[] = "{\"status\":\"ok\"}";
        send_body(req, 200, "application/json", ok, sizeof ok - 1);
        return true;
    }
    if (path_is(req, path_len, "/readyz")) {
        /* The same answer as gRPC Health/Check (base/health.h), with the
         * reason when not ready. Asking the engines first also measures free
         * space again, so a disk that was filled or freed shows here at once
         * (and every engine acts on it from then on). */
        char why[KF_ERROR_MESSAGE_BYTES_MAX];
        bool unready = kf_router_unready(gw->router, why, sizeof why);
        if (!unready && kf_health_serving()) {
            static const char ok[] = "{\"status\":\"ready\"}";
            send_body(req, 200, "application/json", ok, sizeof ok - 1);
        } else {
            if (!unready) {
                kf_health_reason(why, sizeof why);
            }
            send_error(req, KF_E_UNAVAILABLE, why, 0);
        }
        return true;
    }
    if (path_is(req, path_len, "/metrics")) {
        serve_metrics(gw, req);
        return true;
    }
    if (main && path_is(req, path_len, "/openapi.json")) {
        send_body(req, 200, "application/json", gw->openapi, gw->openapi_len);
        return true;
    }
    return false;
}

/* GET /v1/partitions: keyflow.v1.Partitions/GetPlacement as JSON (no key
 * needed, as over gRPC). False (nothing sent) for any other path. */
static bool serve_placement(kf_gateway_t *gw, h2o_req_t *req, size_t path_len) {
    if (!path_is(req, path_len, "/v1/partitions")) {
        return false;
    }
    bool head = h2o_memis(req->method.base, req->method.len, H2O_STRLIT("HEAD"));
    if (!head && !h2o_memis(req->method.base, req->method.len, H2O_STRLIT("GET"))) {
        send_not_allowed(req, "method: use GET for /v1/partitions", "GET, HEAD");
        return true;
    }
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    Keyflow__V1__Placement *placement = kf_router_placement(gw->router, &arena);
    size_t len = 0;
    char *json = placement != NULL ? kf_message_to_json(&placement->base, &arena, &len) : NULL;
    if (json != NULL) {
        send_body(req, 200, "application/json", json, len);
    } else {
        send_error(req, KF_E_LIMIT, "placement: out of memory", 0);
    }
    kf_arena_deinit(&arena);
    return true;
}

/* GET / and /ui/...: the web console's files (http/console.h), to anyone
 * (the page asks for an API key itself, and holds no data), with headers
 * that keep the page to its own origin. An unknown name under /ui/ is 404;
 * another method is 405. False (nothing sent) for a path that is not the
 * console's. */
static bool serve_console(h2o_req_t *req, size_t path_len) {
    if (!kf_console_claims(req->path.base, path_len)) {
        return false;
    }
    bool head = h2o_memis(req->method.base, req->method.len, H2O_STRLIT("HEAD"));
    if (!head && !h2o_memis(req->method.base, req->method.len, H2O_STRLIT("GET"))) {
        send_not_allowed(req, "method: the console's files are read with GET", "GET, HEAD");
        return true;
    }
    const kf_console_file_t *file = kf_console_find(req->path.base, path_len);
    if (file == NULL) {
        char message[KF_ERROR_MESSAGE_BYTES_MAX];
        snprintf(message, sizeof message, "path: the console has no file %.*s",
                 (int)(path_len < 200 ? path_len : 200), req->path.base);
        send_error(req, KF_E_NOT_FOUND, message, 0);
        return true;
    }
    h2o_headers_t *headers = &req->res.headers;
    h2o_add_header_by_str(&req->pool, headers, H2O_STRLIT("content-security-policy"), 0, NULL,
                          H2O_STRLIT(KF_CONSOLE_CSP));
    h2o_add_header_by_str(&req->pool, headers, H2O_STRLIT("x-content-type-options"), 0, NULL,
                          H2O_STRLIT("nosniff"));
    h2o_add_header_by_str(&req->pool, headers, H2O_STRLIT("referrer-policy"), 0, NULL,
                          H2O_STRLIT("no-referrer"));
    /* Revalidated every time (a new keyflowd may serve a new console), at
     * the cost of a 304 while the file is the same. */
    h2o_add_header(&req->pool, headers, H2O_TOKEN_CACHE_CONTROL, NULL, H2O_STRLIT("no-cache"));
    h2o_add_header(&req->pool, headers, H2O_TOKEN_ETAG, NULL, file->etag, strlen(file->etag));
    ssize_t i = h2o_find_header(&req->headers, H2O_TOKEN_IF_NONE_MATCH, -1);
    if (i >= 0 && h2o_memis(req->headers.entries[i].value.base, req->headers.entries[i].value.len,
                            file->etag, strlen(file->etag))) {
        req->res.status = 304;
        req->res.reason = "Not Modified";
        h2o_send_inline(req, "", 0);
        return true;
    }
    send_body(req, 200, file->content_type, (const char *)file->body, file->body_len);
    return true;
}

static size_t path_length(const h2o_req_t *req) {
    return req->query_at != SIZE_MAX ? req->query_at : req->path.len;
}

/*
 * Without API keys, nothing tells keyflowd's clients from a web page that
 * the person running keyflowd happens to visit: a browser sends a page's
 * requests to 127.0.0.1 too. Two things set a browser's requests apart, and
 * are refused (403, nothing done) while keys are off:
 *   - Host: a page that rebinds its own name to 127.0.0.1 (DNS rebinding)
 *     sends its own name. On a loopback listener only loopback literals
 *     (localhost, 127.x, [::1]) are accepted; a request without a Host
 *     (HTTP/1.0) comes from no browser.
 *   - Origin: a browser sends it with every cross-origin request that can
 *     change something (any POST, whatever its Content-Type: a CORS
 *     "simple" text/plain POST included). It must be a loopback origin, or
 *     on a listener others can reach (--insecure-no-auth) the request's own
 *     Host. Clients that are not browsers send no Origin, so curl -d with
 *     its form Content-Type keeps working.
 * With keys on, a page has no key to send, and none of this is needed.
 * docs/security.md, "Without keys".
 */
static bool refuse_browser_without_keys(kf_gateway_t *gw, h2o_req_t *req) {
    if (kf_auth_enabled(gw->auth)) {
        return false;
    }
    http_server_t *srv = H2O_STRUCT_FROM_MEMBER(http_server_t, ctx, req->conn->ctx);
    h2o_iovec_t host = req->input.authority;
    if (host.base == srv->config.hosts[0]->authority.hostport.base) {
        host = h2o_iovec_init(NULL, 0); /* no Host: h2o filled in its host's name */
    }
    char message[KF_ERROR_MESSAGE_BYTES_MAX];
    if (srv->loopback && host.base != NULL && !kf_host_is_loopback(host.base, host.len)) {
        snprintf(message, sizeof message,
                 "host: \"%.*s\" is not a loopback name; without API keys keyflowd answers only "
                 "requests addressed to localhost, 127.0.0.1 or [::1] (a web page that points "
                 "its own name at this machine must not drive it); start keyflowd with --auth to "
                 "serve other names",
                 (int)(host.len < 200 ? host.len : 200), host.base);
        send_error(req, KF_E_PERMISSION, message, 0);
        return true;
    }
    ssize_t i = h2o_find_header_by_str(&req->headers, H2O_STRLIT("origin"), -1);
    if (i < 0) {
        return false;
    }
    h2o_iovec_t origin = req->headers.entries[i].value;
    bool allowed = kf_origin_is_loopback(origin.base, origin.len);
    if (!allowed && !srv->loopback && host.base != NULL) {
        /* Its own origin: http(s)://<the request's Host>. */
        const char *sep = memchr(origin.base, ':', origin.len);
        size_t skip = sep != NULL ? (size_t)(sep - origin.base) + 3 : origin.len;
        allowed = sep != NULL && skip <= origin.len && origin.len - skip == host.len &&
                  memcmp(sep, "://", 3) == 0 &&
                  strncasecmp(origin.base + skip, host.base, host.len) == 0;
    }
    if (allowed) {
        return false;
    }
    snprintf(message, sizeof message,
             "origin: \"%.*s\" is another site; without API keys keyflowd refuses requests a "
             "web page sends (they could create keys, send events or complete runs in the name "
             "of whoever runs the browser); start keyflowd with --auth, or call it from a "
             "client that is not a browser",
             (int)(origin.len < 200 ? origin.len : 200), origin.base);
    send_error(req, KF_E_PERMISSION, message, 0);
    return true;
}

/* ---- request framing and head size --------------------------------------- */

/*
 * h2o 2.2.5 frames an HTTP/1 body by the first Content-Length when several
 * are sent, and by Transfer-Encoding when both are (lib/http1.c,
 * init_headers); neither header reaches the handler (they are not in
 * req->headers). A proxy in front that frames the other way sees a request
 * where h2o sees a body, or the reverse: request smuggling. RFC 9112
 * section 6.3 says to refuse such a request (400) and close the connection,
 * which is done here before anything of the request is used. h2o reads
 * nothing more of a connection while its request is in the handler, so with
 * keep-alive off the bytes after it are never parsed as a request. h2o
 * leaves the request's head at the start of the socket's input until it is
 * answered (conns.c relies on the same), header names lowercased in place;
 * that is what is read here, with picohttpparser's rules (LF or CRLF line
 * ends, one empty line before the request line skipped).
 *
 * The head's size is bounded by KF_HTTP_HEADER_BYTES_MAX (431): here for a
 * head that arrived whole (h2o alone would take 408 KiB), in conns.c for
 * one still arriving.
 */

static bool name_is(const char *name, size_t len, const char *want) {
    return len == strlen(want) && strncasecmp(name, want, len) == 0;
}

/* The head of an HTTP/1 request: 0 (fine), or the status to refuse it with
 * (400, 431) and `message` saying why. */
static int check_http1_head(h2o_req_t *req, char *message, size_t cap) {
    h2o_socket_t *sock = req->conn->callbacks->get_socket != NULL
                             ? req->conn->callbacks->get_socket(req->conn)
                             : NULL;
    if (sock == NULL || sock->input == NULL) {
        return 0;
    }
    const char *start = sock->input->bytes;
    const char *end = start + sock->input->size;
    const char *line = start;
    size_t head_bytes = 0;
    int lines = 0;
    int lengths = 0, codings = 0;
    const char *length = NULL; /* the first Content-Length value */
    size_t length_len = 0;
    bool lengths_differ = false;
    while (line < end && head_bytes == 0) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        if (nl == NULL) {
            return 0; /* h2o parsed a whole head: not reached */
        }
        size_t len = (size_t)(nl - line);
        if (len > 0 && line[len - 1] == '\r') {
            len--;
        }
        const char *next = nl + 1;
        if (len == 0) {
            if (lines > 0) {
                head_bytes = (size_t)(next - start);
            }
            line = next;
            continue;
        }
        const char *name = line;
        const char *colon = lines > 0 ? memchr(line, ':', len) : NULL;
        lines++;
        line = next;
        if (colon == NULL) {
            continue; /* the request line */
        }
        size_t name_len = (size_t)(colon - name);
        const char *value = colon + 1;
        const char *value_end = name + len;
        while (value < value_end && (*value == ' ' || *value == '\t')) {
            value++;
        }
        while (value_end > value && (value_end[-1] == ' ' || value_end[-1] == '\t')) {
            value_end--;
        }
        size_t value_len = (size_t)(value_end - value);
        if (name_is(name, name_len, "content-length")) {
            if (lengths++ == 0) {
                length = value;
                length_len = value_len;
            } else if (value_len != length_len || memcmp(value, length, value_len) != 0) {
                lengths_differ = true;
            }
        } else if (name_is(name, name_len, "transfer-encoding")) {
            codings++;
        }
    }
    if (head_bytes > KF_HTTP_HEADER_BYTES_MAX) {
        snprintf(message, cap,
                 "request head: %zu bytes, more than the limit of %u (KF_HTTP_HEADER_BYTES_MAX); "
                 "the connection is closed",
                 head_bytes, (unsigned)KF_HTTP_HEADER_BYTES_MAX);
        return 431;
    }
    if (lengths_differ) {
        snprintf(message, cap,
                 "content-length: sent %d times with different values, so where the body ends "
                 "is ambiguous (RFC 9112 section 6.3); the connection is closed",
                 lengths);
        return 400;
    }
    if (codings > 0 && lengths > 0) {
        snprintf(message, cap,
                 "transfer-encoding: sent with content-length, so where the body ends is "
                 "ambiguous (RFC 9112 section 6.3); the connection is closed");
        return 400;
    }
    if (codings > 1) {
        snprintf(message, cap,
                 "transfer-encoding: sent %d times; send it once (RFC 9112 section 6.3); the "
                 "connection is closed",
                 codings);
        return 400;
    }
    return 0;
}

/* HTTP/2: the decoded head (h2o framed the body by frames). */
static int check_http2_head(h2o_req_t *req, char *message, size_t cap) {
    size_t bytes = req->input.method.len + req->input.path.len + req->input.authority.len;
    for (size_t i = 0; i < req->headers.size; i++) {
        bytes += req->headers.entries[i].name->len + req->headers.entries[i].value.len + 4;
    }
    if (bytes <= KF_HTTP_HEADER_BYTES_MAX) {
        return 0;
    }
    snprintf(message, cap,
             "request head: %zu bytes of names and values, more than the limit of %u "
             "(KF_HTTP_HEADER_BYTES_MAX)",
             bytes, (unsigned)KF_HTTP_HEADER_BYTES_MAX);
    return 431;
}

/* Refuses a request whose framing is ambiguous (400) or whose head is too
 * large (431), before anything of it is used; an HTTP/1 connection is
 * closed after the answer. True when it answered. */
static bool refuse_head(h2o_req_t *req) {
    char message[KF_ERROR_MESSAGE_BYTES_MAX];
    int status = req->version < 0x200 ? check_http1_head(req, message, sizeof message)
                                      : check_http2_head(req, message, sizeof message);
    if (status == 0) {
        return false;
    }
    req->http1_is_persistent = 0; /* h2o closes the connection once this is sent */
    send_error(req, status == 431 ? KF_E_TOO_LARGE : KF_E_INVALID, message, status);
    return true;
}

static int on_probe_req(h2o_handler_t *self, h2o_req_t *req) {
    kf_gateway_t *gw = *(kf_gateway_t **)(self + 1);
    int64_t start_us = kf_mono_us();
    kf_http_conn_request(req);
    if (!refuse_head(req) && !refuse_browser_without_keys(gw, req) &&
        !serve_probe(gw, req, path_length(req), false)) {
        send_error(req, KF_E_NOT_FOUND,
                   "path: the probe listener serves /healthz, /readyz and /metrics only", 0);
    }
    log_plain_request(req, start_us);
    return 0;
}

/* Hands the call's command to the engine; false (cmd->error set) when the
 * engine refused it. Any thread. */
static bool submit(http_call_t *call, ProtobufCMessage *msg) {
    kf_cmd_t *cmd = &call->cmd;
    KF_ASSERT(call->method->executor == KF_RPC_ENGINE); /* routes name no others */
    cmd->op = call->method->op;
    cmd->request = msg;
    cmd->principal = call->principal;
    cmd->arena = &call->arena;
    cmd->done = engine_done;
    cmd->owner = call;
    return kf_router_submit(call->gw->router, cmd) == KF_OK;
}

/* Worker thread: decodes a large body into the request message (what the
 * loop would have done), checks the key's name prefixes against it and
 * submits it; a refusal goes back to the loop as the call's error. */
static void decode_work(kf_work_t *work) {
    http_call_t *call = H2O_STRUCT_FROM_MEMBER(http_call_t, work, work);
    const kf_method_t *method;
    ProtobufCMessage *msg = NULL;
    kf_error_t err;
    kf_status_t st = kf_http_route(&call->hreq, &call->arena, &method, &msg, &err);
    if (st == KF_OK) {
        KF_ASSERT(method == call->method);
        st = kf_auth_authorize(call->principal, method, msg, &err);
    }
    if (st == KF_OK) {
        if (submit(call, msg)) {
            return; /* engine_done takes it from here */
        }
        err = call->cmd.error;
    }
    call->cmd.error = err;
    call->cmd.response = NULL;
    call->cmd.request = NULL;
    to_loop(call);
}

/* Copies what a worker reads of an HTTP/2 request (h2o frees a reset
 * stream's memory at once). */
static void copy_request(http_call_t *call) {
    kf_http_request_t *h = &call->hreq;
    char *p = kf_xmalloc(h->method_len + h->path_len + h->query_len + h->body_len + 1);
    call->copy = p;
    memcpy(p, h->method, h->method_len);
    h->method = p;
    p += h->method_len;
    memcpy(p, h->path, h->path_len);
    h->path = p;
    p += h->path_len;
    if (h->query != NULL) {
        memcpy(p, h->query, h->query_len);
        h->query = p;
        p += h->query_len;
    }
    if (h->body != NULL) {
        memcpy(p, h->body, h->body_len);
        h->body = p;
    }
}

static int on_req(h2o_handler_t *self, h2o_req_t *req) {
    kf_gateway_t *gw = *(kf_gateway_t **)(self + 1);
    int64_t start_us = kf_mono_us();
    kf_http_conn_t *conn = kf_http_conn_request(req);
    size_t path_len = path_length(req);
    if (refuse_head(req) || refuse_browser_without_keys(gw, req) ||
        serve_probe(gw, req, path_len, true) || serve_placement(gw, req, path_len) ||
        serve_console(req, path_len)) {
        log_plain_request(req, start_us);
        return 0;
    }
    if (atomic_load(&gw->stopping)) {
        send_error(req, KF_E_UNAVAILABLE, "the server is shutting down", 0);
        log_plain_request(req, start_us);
        return 0;
    }
    http_call_t *call = calloc(1, sizeof *call);
    if (call == NULL) {
        send_error(req, KF_E_NOMEM, "out of memory", 0);
        log_plain_request(req, start_us);
        return 0;
    }
    call->gw = gw;
    call->watch_fd = -1;
    call->start_us = start_us;
    call->conn = conn;
    kf_http_conn_hold(conn);
    kf_arena_init(&call->arena, 0);
    atomic_fetch_add(&gw->in_flight, 1);
    call->hreq = (kf_http_request_t){
        .method = req->method.base,
        .method_len = req->method.len,
        .path = req->path.base,
        .path_len = path_len,
        .query = req->query_at != SIZE_MAX ? req->path.base + req->query_at + 1 : NULL,
        .query_len = req->query_at != SIZE_MAX ? req->path.len - req->query_at - 1 : 0,
        .body = req->entity.base,
        .body_len = req->entity.base ? req->entity.len : 0,
    };
    /* A large body is decoded by a worker: the loop only finds the route
     * (which needs no body), so that the caller is authenticated before
     * anything is spent on it. Unknown paths take the quick way below. */
    bool offload = call->hreq.body_len > KF_HTTP_INLINE_BODY_BYTES_MAX &&
                   (call->method = kf_http_route_method(&call->hreq)) != NULL;
    ProtobufCMessage *msg = NULL;
    kf_error_t err;
    kf_status_t st =
        offload ? KF_OK : kf_http_route(&call->hreq, &call->arena, &call->method, &msg, &err);
    /* Once the route names an RPC, who is calling comes first, then whether
     * the key holds the RPC's scope: a caller without either learns nothing
     * about its request. Then the key's name prefixes, against the request
     * it built. */
    if (call->method != NULL && !authenticate(gw, req, call->method->scope, &call->principal)) {
        record_request(call, gw->metrics_ids[call->method - kf_methods],
                       kf_status_grpc_code(KF_E_UNAUTHENTICATED), 401, NULL);
        call_free(call);
        return 0;
    }
    if (call->method != NULL) {
        kf_error_t scope_err;
        if (kf_auth_authorize(call->principal, call->method, NULL, &scope_err) != KF_OK) {
            st = scope_err.status;
            err = scope_err;
        } else if (st == KF_OK && !offload) {
            st = kf_auth_authorize(call->principal, call->method, msg, &err);
        }
    }
    if (st != KF_OK) {
        int sent;
        if (st == KF_E_UNIMPLEMENTED) { /* the path is known, the method is not */
            char allow[KF_HTTP_ALLOW_BYTES_MAX];
            kf_http_allowed(call->hreq.path, call->hreq.path_len, allow, sizeof allow);
            sent = send_not_allowed(req, err.message, allow);
        } else {
            sent = send_error(req, st, err.message, 0);
        }
        if (call->method != NULL) { /* a refused request of a known method counts */
            record_request(call, gw->metrics_ids[call->method - kf_methods],
                           kf_status_grpc_code(st), sent, NULL);
        } else {
            log_plain_request(req, start_us);
        }
        call_free(call);
        return 0;
    }
    call->metrics_id = gw->metrics_ids[call->method - kf_methods];
    call->req = req;
    call->hook = h2o_mem_alloc_shared(&req->pool, sizeof *call->hook, on_req_dispose);
    call->hook->call = call;
    call->hook->keep = NULL;
    call->hook->router = gw->router;
    if (offload) {
        /* A worker owns the call until it hands it back (to_loop) or to the
         * engine. */
        call->work.run = decode_work;
        if (req->version >= 0x200) {
            copy_request(call);
        }
        call->offloaded = true;
        kf_gauge_add(KF_G_HTTP_OFFLOADING, 1);
        if (kf_workers_submit(gw->workers, &call->work) != KF_OK) {
            call->hook->call = NULL;
            kf_error_set(&err, KF_E_LIMIT,
                         "request: %d large bodies are waiting to be decoded; retry later",
                         KF_HTTP_WORK_QUEUE_MAX);
            int sent = send_error(req, KF_E_LIMIT, err.message, 0);
            record_request(call, call->metrics_id, kf_status_grpc_code(KF_E_LIMIT), sent, NULL);
            call_free(call);
            return 0;
        }
        kf_counter_add(KF_C_HTTP_OFFLOADED, 1);
        return 0;
    }
    if (req->version < 0x200 && is_long_poll(call->method, msg)) {
        h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
        if (sock != NULL) {
            watch_add(gw, call, h2o_socket_get_fd(sock));
        }
    }
    if (!submit(call, msg)) {
        call->hook->call = NULL;
        int sent = send_cmd_error(gw, req, &call->cmd);
        record_request(call, call->metrics_id, kf_status_grpc_code(call->cmd.error.status), sent,
                       msg);
        call_free(call);
    }
    return 0;
}

static kf_status_t bind_listener(const char *what, const char *address, int *fd_out, int *port,
                                 kf_error_t *err) {
    /* "host:port", "[v6]:port"; the host may be a name (resolved once). */
    char host[256], service[16];
    const char *colon = strrchr(address, ':');
    if (colon == NULL || strlen(colon + 1) == 0 || strlen(colon + 1) >= sizeof service) {
        return kf_error_set(err, KF_E_INVALID, "%s address: expected host:port, got %s", what,
                            address);
    }
    const char *h = address;
    size_t hl = (size_t)(colon - address);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl == 0 || hl >= sizeof host) {
        return kf_error_set(err, KF_E_INVALID, "%s address: expected host:port, got %s", what,
                            address);
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    snprintf(service, sizeof service, "%s", colon + 1);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0 || res == NULL) {
        return kf_error_set(err, KF_E_INVALID, "%s address: cannot resolve %s: %s", what, address,
                            gai_strerror(rc));
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
        int e = errno;
        if (fd >= 0) {
            close(fd);
        }
        freeaddrinfo(res);
        return kf_error_set(err, KF_E_IO, "%s: cannot listen on %s: %s", what, address,
                            strerror(e));
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &len);
    *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return KF_OK;
}

/* A server context for the material, negotiating HTTP/2 by ALPN. The probe
 * listener's never asks for a client certificate, even under mTLS: what it
 * serves needs none (health answers anyone, /metrics takes an API key),
 * and its clients (the kubelet's HTTPS probes, a container healthcheck)
 * have none to give. */
static kf_status_t make_ssl_ctx(const kf_tls_t *tls, bool probe, SSL_CTX **out, kf_error_t *err) {
    kf_status_t st = kf_tls_server_ctx_create(tls, !probe, out, err);
    if (st == KF_OK) {
        h2o_ssl_register_alpn_protocols(*out, h2o_http2_alpn_protocols);
    }
    return st;
}

/* ---- h2o's own error answers, in the gateway's JSON ---------------------- */

/* h2o answers some requests itself, before any handler sees them: a body
 * over max_request_entity_size (413, refused from its Content-Length before
 * a byte of it is read), a request that is not valid HTTP (400), an
 * unknown Expect (417). Those answers are bound to the host's fallback
 * path; this filter there replaces h2o's text body with the gateway's JSON
 * error, so that every error a client sees has the same shape. */
typedef struct json_error_ostream {
    h2o_ostream_t super;
    h2o_iovec_t body;
} json_error_ostream_t;

static void json_error_send(h2o_ostream_t *self, h2o_req_t *req, h2o_iovec_t *bufs, size_t bufcnt,
                            h2o_send_state_t state) {
    (void)bufs;
    (void)bufcnt;
    json_error_ostream_t *o = (json_error_ostream_t *)self;
    bool head = h2o_memis(req->input.method.base, req->input.method.len, H2O_STRLIT("HEAD"));
    bool last = !h2o_send_state_is_in_progress(state);
    h2o_ostream_send_next(self, req, &o->body, last && !head ? 1 : 0, state);
}

static void json_errors_setup(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot) {
    (void)self;
    if (req->res.status >= 400) {
        kf_status_t status = KF_E_INVALID;
        char message[160];
        if (req->res.status == 413) {
            status = KF_E_TOO_LARGE;
            snprintf(message, sizeof message,
                     "request body: larger than the limit of %zu bytes (refused unread)",
                     req->conn->ctx->globalconf->max_request_entity_size);
        } else if (req->res.status == 417) {
            snprintf(message, sizeof message, "expect: only 100-continue is understood");
        } else {
            snprintf(message, sizeof message, "request: not valid HTTP (%s)",
                     req->res.reason != NULL ? req->res.reason : "refused");
        }
        json_t *doc = json_pack("{s:i, s:s, s:s}", "code", kf_status_grpc_code(status), "status",
                                kf_status_grpc_name(status), "message", message);
        char *text = doc != NULL ? json_dumps(doc, JSON_COMPACT) : NULL;
        json_decref(doc);
        if (text != NULL) {
            json_error_ostream_t *o = (json_error_ostream_t *)h2o_add_ostream(req, sizeof *o, slot);
            o->super.do_send = json_error_send;
            o->body = h2o_strdup(&req->pool, text, SIZE_MAX);
            free(text);
            h2o_set_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE,
                           H2O_STRLIT("application/json"), 1);
            req->res.content_length = o->body.len;
            slot = &o->super.next;
        }
    }
    h2o_setup_next_ostream(req, slot);
}

/* ---- servers ------------------------------------------------------------- */

static kf_status_t server_init(http_server_t *srv, kf_gateway_t *gw, const char *name,
                               const char *address, SSL_CTX *ssl_ctx,
                               int (*on_request)(h2o_handler_t *, h2o_req_t *),
                               const kf_http_conn_limits_t *limits, size_t body_bytes_max,
                               int *port, kf_error_t *err) {
    kf_status_t st = bind_listener(name, address, &srv->listen_fd, port, err);
    if (st != KF_OK) {
        return st;
    }
    srv->gw = gw;
    srv->name = name;
    h2o_config_init(&srv->config);
    /* Bodies past the request bound are refused by h2o itself (413). */
    srv->config.max_request_entity_size = body_bytes_max;
    /* h2o's own deadline for reading a whole HTTP/1 request, and for an idle
     * HTTP/2 connection: the body deadline; conns.h enforces the shorter
     * one for the request head. */
    srv->config.http1.req_timeout = (uint64_t)limits->body_timeout_ms;
    srv->config.http2.idle_timeout = (uint64_t)limits->body_timeout_ms;
    h2o_hostconf_t *host =
        h2o_config_register_host(&srv->config, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_filter_t *filter = h2o_create_filter(&host->fallback_path, sizeof *filter);
    filter->on_setup_ostream = json_errors_setup;
    h2o_pathconf_t *path = h2o_config_register_path(host, "/", 0);
    h2o_handler_t *handler = h2o_create_handler(path, sizeof *handler + sizeof(kf_gateway_t *));
    handler->on_req = on_request;
    *(kf_gateway_t **)(handler + 1) = gw;
    srv->loop = h2o_evloop_create();
    h2o_context_init(&srv->ctx, srv->loop, &srv->config);
    srv->accept_ctx.ctx = &srv->ctx;
    srv->accept_ctx.hosts = srv->config.hosts;
    srv->accept_ctx.ssl_ctx = ssl_ctx; /* the server's reference */
    srv->tls = ssl_ctx != NULL;
    srv->loopback = kf_address_is_loopback(address);
    srv->queue = h2o_multithread_create_queue(srv->loop);
    h2o_multithread_register_receiver(srv->queue, &srv->control, on_control);
    h2o_socket_t *listener =
        h2o_evloop_socket_create(srv->loop, srv->listen_fd, H2O_SOCKET_FLAG_DONT_READ);
    srv->conns = kf_http_conns_create(srv->loop, listener, &srv->accept_ctx, limits, name);
    srv->created = true;
    return KF_OK;
}

static void *loop_main(void *arg) {
    http_server_t *srv = arg;
    char name[16];
    snprintf(name, sizeof name, "kf-%s", srv->name);
    pthread_setname_np(pthread_self(), name);
    while (!srv->exit_loop) {
        h2o_evloop_run(srv->loop, INT32_MAX);
    }
    return NULL;
}

static kf_status_t server_start(http_server_t *srv, kf_error_t *err) {
    kf_http_conns_start(srv->conns);
    if (pthread_create(&srv->thread, NULL, loop_main, srv) != 0) {
        return kf_error_set(err, KF_E_INTERNAL, "cannot start the %s thread", srv->name);
    }
    srv->started = true;
    return KF_OK;
}

static void send_control(http_server_t *srv, int what) {
    control_msg_t *c = kf_xcalloc(1, sizeof *c);
    c->what = what;
    h2o_multithread_send_message(&srv->control, &c->msg);
}

static void server_stop(http_server_t *srv) {
    if (srv->started) {
        send_control(srv, 2);
        pthread_join(srv->thread, NULL);
        srv->started = false;
    }
}

/* Connections still open when the loop stopped (an idle keep-alive, a
 * client that never finished its request) hold entries in h2o's request and
 * idle timeouts, and h2o_context_dispose refuses to run over them. Make those
 * timeouts due now and turn the loop until they fired: each connection is
 * then closed by h2o's own timeout path, as if it had idled out. Every reply
 * was already sent (or given up on) by then. */
static void close_connections(http_server_t *srv) {
    srv->ctx.http1.req_timeout.timeout = 0;
    srv->ctx.http2.idle_timeout.timeout = 0;
    srv->ctx.http2.graceful_shutdown_timeout.timeout = 0;
    int64_t deadline = kf_mono_us() + 2 * 1000 * 1000;
    while ((!h2o_linklist_is_empty(&srv->ctx.http1._conns) ||
            !h2o_linklist_is_empty(&srv->ctx.http2._conns)) &&
           kf_mono_us() < deadline) {
        h2o_evloop_run(srv->loop, 10);
    }
}

/* After server_stop: frees what server_init made. */
static void server_dispose(http_server_t *srv) {
    if (!srv->created) {
        return;
    }
    kf_http_conns_close_listener(srv->conns);
    close_connections(srv);
    h2o_multithread_unregister_receiver(srv->queue, &srv->control);
    h2o_multithread_destroy_queue(srv->queue);
    /* Closing an evloop socket is finished by the loop's next turn: run it
     * once so the queue's and listener's sockets are really freed. */
    h2o_evloop_run(srv->loop, 0);
    kf_http_conns_destroy(srv->conns);
    h2o_context_dispose(&srv->ctx);
    h2o_evloop_destroy(srv->loop);
    h2o_config_dispose(&srv->config);
    SSL_CTX_free(srv->accept_ctx.ssl_ctx);
    srv->created = false;
}

/* ---- the gateway ----------------------------------------------------------- */

kf_status_t kf_gateway_set_tls(kf_gateway_t *gw, const kf_tls_t *tls, kf_error_t *err) {
    KF_ASSERT(gw->main.tls);
    SSL_CTX *ctxs[2] = {NULL, NULL}; /* the main listener's, the probe's */
    kf_status_t st = make_ssl_ctx(tls, false, &ctxs[0], err);
    if (st == KF_OK && gw->probe.created && gw->probe.tls) {
        st = make_ssl_ctx(tls, true, &ctxs[1], err);
    }
    if (st != KF_OK) {
        SSL_CTX_free(ctxs[0]);
        return st;
    }
    tls_swap_t swap = {.lock = PTHREAD_MUTEX_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};
    http_server_t *servers[] = {&gw->main, &gw->probe};
    for (size_t i = 0; i < 2; i++) {
        http_server_t *srv = servers[i];
        SSL_CTX *ctx = ctxs[i];
        if (!srv->created || !srv->tls) {
            continue;
        }
        SSL_CTX_up_ref(ctx); /* the server's own reference */
        if (!srv->started) { /* no loop thread reads it yet */
            SSL_CTX_free(srv->accept_ctx.ssl_ctx);
            srv->accept_ctx.ssl_ctx = ctx;
            continue;
        }
        control_msg_t *c = kf_xcalloc(1, sizeof *c);
        c->what = 3;
        c->ssl_ctx = ctx;
        c->swap = &swap;
        pthread_mutex_lock(&swap.lock);
        swap.pending++;
        pthread_mutex_unlock(&swap.lock);
        h2o_multithread_send_message(&srv->control, &c->msg);
    }
    /* The loops never block for long: this returns within a loop turn. */
    pthread_mutex_lock(&swap.lock);
    while (swap.pending > 0) {
        pthread_cond_wait(&swap.done, &swap.lock);
    }
    pthread_mutex_unlock(&swap.lock);
    pthread_mutex_destroy(&swap.lock);
    pthread_cond_destroy(&swap.done);
    SSL_CTX_free(ctxs[0]);
    SSL_CTX_free(ctxs[1]);
    return KF_OK;
}

static int64_t or_default(int64_t value, int64_t fallback) {
    return value > 0 ? value : fallback;
}

kf_status_t kf_gateway_create(const kf_gateway_options_t *options, kf_router_t *router,
                              kf_gateway_t **out, int *port, kf_error_t *err) {
    kf_gateway_t *gw = kf_xcalloc(1, sizeof *gw);
    gw->router = router;
    gw->auth = options->auth;
    SSL_CTX *ssl_ctx = NULL;
    kf_status_t st = KF_OK;
    if (options->tls != NULL) {
        st = make_ssl_ctx(options->tls, false, &ssl_ctx, err);
        if (st != KF_OK) {
            free(gw);
            return st;
        }
    }
    kf_http_conn_limits_t limits = {
        .connections_max = KF_HTTP_CONNECTIONS_MAX,
        .per_address_max = (int)or_default(options->connections_per_address,
                                           KF_HTTP_CONNECTIONS_PER_ADDRESS_DEFAULT),
        .header_timeout_ms =
            or_default(options->header_timeout_ms, KF_HTTP_HEADER_TIMEOUT_MS_DEFAULT),
        .body_timeout_ms = or_default(options->body_timeout_ms, KF_HTTP_BODY_TIMEOUT_MS_DEFAULT),
    };
    if (limits.body_timeout_ms < limits.header_timeout_ms) {
        limits.body_timeout_ms = limits.header_timeout_ms;
    }
    st = server_init(&gw->main, gw, "http", options->address, ssl_ctx, on_req, &limits,
                     KF_REQUEST_BYTES_MAX, port, err);
    if (st != KF_OK) {
        SSL_CTX_free(ssl_ctx);
        free(gw);
        return st;
    }
    for (size_t i = 0; i < KF_METHOD_COUNT; i++) {
        /* Series only for what the gateway serves (the RPC table says). */
        gw->metrics_ids[i] = kf_http_serves(&kf_methods[i])
                                 ? kf_metrics_method_register(kf_methods[i].name, KF_TRANSPORT_HTTP)
                                 : -1;
    }
    h2o_multithread_register_receiver(gw->main.queue, &gw->replies, on_replies);
    h2o_timeout_init(gw->main.loop, &gw->watch_timeout, WATCH_INTERVAL_MS);
    gw->watch_entry.cb = on_watch_tick;
    st = kf_workers_create("kf-http-w", KF_HTTP_WORKERS, KF_HTTP_WORK_QUEUE_MAX, &gw->workers, err);
    if (st == KF_OK) {
        st = kf_openapi_render(options->version, &gw->openapi, &gw->openapi_len, err);
    }
    if (st == KF_OK && options->probe_address != NULL) {
        kf_http_conn_limits_t probe = {
            .connections_max = KF_PROBE_CONNECTIONS_MAX,
            .per_address_max = KF_PROBE_CONNECTIONS_PER_ADDRESS_MAX,
            .header_timeout_ms = KF_PROBE_TIMEOUT_MS,
            .body_timeout_ms = KF_PROBE_TIMEOUT_MS,
        };
        SSL_CTX *probe_ctx = NULL;
        if (options->tls != NULL) {
            st = make_ssl_ctx(options->tls, true, &probe_ctx, err);
        }
        if (st == KF_OK) {
            st =
                server_init(&gw->probe, gw, "probe", options->probe_address, probe_ctx,
                            on_probe_req, &probe, KF_PROBE_REQUEST_BYTES_MAX, &gw->probe_port, err);
        }
        if (st != KF_OK) {
            SSL_CTX_free(probe_ctx);
        }
    }
    if (st != KF_OK) {
        kf_gateway_destroy(gw);
        return st;
    }
    *out = gw;
    return KF_OK;
}

int kf_gateway_probe_port(const kf_gateway_t *gw) {
    return gw->probe.created ? gw->probe_port : 0;
}

kf_status_t kf_gateway_start(kf_gateway_t *gw, kf_error_t *err) {
    kf_status_t st = server_start(&gw->main, err);
    if (st == KF_OK && gw->probe.created) {
        st = server_start(&gw->probe, err);
    }
    return st;
}

void kf_gateway_shutdown(kf_gateway_t *gw) {
    if (atomic_exchange(&gw->stopping, true)) {
        return;
    }
    /* The probe listener goes on answering (a drain's 503 is worth seeing)
     * until the gateway is destroyed. */
    if (gw->main.started) {
        send_control(&gw->main, 1);
    }
}

void kf_gateway_destroy(kf_gateway_t *gw) {
    if (gw == NULL) {
        return;
    }
    kf_gateway_shutdown(gw);
    if (gw->main.started) {
        /* The engine has stopped, so every reply is queued or delivered
         * (unless a failed sync stopped it: then give up after a while). */
        int64_t deadline = kf_mono_us() + 5 * 1000 * 1000;
        while (atomic_load(&gw->in_flight) > 0 && kf_mono_us() < deadline) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    /* Workers first, while the loop still runs: what they still hold goes
     * back to it. */
    kf_workers_destroy(gw->workers);
    server_stop(&gw->main);
    server_stop(&gw->probe);
    if (gw->main.created) {
        if (h2o_timeout_is_linked(&gw->watch_entry)) {
            h2o_timeout_unlink(&gw->watch_entry);
        }
        h2o_timeout_dispose(gw->main.loop, &gw->watch_timeout);
        h2o_multithread_unregister_receiver(gw->main.queue, &gw->replies);
    }
    server_dispose(&gw->main);
    server_dispose(&gw->probe);
    free(gw->openapi);
    free(gw);
}
