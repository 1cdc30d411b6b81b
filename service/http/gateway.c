/*
 * gateway.c - h2o event loop, request dispatch and asynchronous replies.
 *
 * Request lifetime: h2o may dispose a request before the engine answers
 * (an HTTP/2 client resets its stream). Each in-flight request therefore has
 * a heap http_call_t owned by the gateway, and a small hook in the request's
 * pool whose destructor clears call->req. When the engine's reply arrives on
 * the loop thread, it is sent only if call->req is still set; the call is
 * freed either way. The hook is only touched while call->req is set (then
 * the pool, and so the hook, is alive).
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
#include "proto/json_map.h"
#include "http/routes.h"

typedef struct http_call http_call_t;

typedef struct req_hook {
    http_call_t *call; /* cleared when the reply was sent */
    kf_engine_t *engine;
} req_hook_t;

struct http_call {
    h2o_multithread_message_t msg;
    kf_gateway_t *gw;
    h2o_req_t *req; /* NULL once h2o disposed the request */
    req_hook_t *hook;
    const kf_method_t *method;
    int metrics_id;
    int64_t start_us;
    kf_arena_t arena;
    kf_cmd_t cmd;
    kf_principal_t *principal; /* the caller's key (a reference), or NULL */
    int watch_fd;              /* HTTP/1 long poll: its socket, or -1 */
    http_call_t *watch_prev;   /* on gw->watched while watch_fd >= 0 */
    http_call_t *watch_next;
};

struct kf_gateway {
    h2o_globalconf_t config;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    h2o_evloop_t *loop;
    h2o_socket_t *listener;
    int listen_fd;
    h2o_multithread_queue_t *queue;
    h2o_multithread_receiver_t replies; /* engine -> loop: finished calls */
    h2o_multithread_receiver_t control; /* any thread -> loop: stop */
    pthread_t thread;
    bool started;
    kf_engine_t *engine;
    kf_auth_t *auth; /* NULL: requests are not checked */
    atomic_bool stopping;
    atomic_int in_flight;
    bool exit_loop; /* loop thread only */
    int metrics_ids[KF_METRICS_METHODS_MAX];
    /* HTTP/1 long polls: h2o does not read a connection while its request is
     * being handled, so a client that leaves is noticed only by peeking at
     * the socket now and then (loop thread only). */
    http_call_t *watched;
    h2o_timeout_t watch_timeout;
    h2o_timeout_entry_t watch_entry;
    /* Accepted connections (loop thread only), at most
     * KF_HTTP_CONNECTIONS_MAX: at the bound, or when accept() runs out of
     * descriptors, the listener stops reading (else its level-triggered
     * readiness would spin the loop) until a connection closes or the retry
     * timer fires. */
    int connections;
    bool accept_paused;
    h2o_timeout_t accept_timeout;
    h2o_timeout_entry_t accept_entry;
};

#define ACCEPT_RETRY_MS 100

#define WATCH_INTERVAL_MS 200

typedef struct control_msg {
    h2o_multithread_message_t msg;
    int what;         /* 1: close the listener, 2: exit the loop, 3: new TLS */
    SSL_CTX *ssl_ctx; /* what == 3: the context new connections get */
} control_msg_t;

/* One accepted connection. With TLS it holds a reference to the context it
 * was accepted under: h2o keeps a bare pointer to it until the handshake
 * has created its SSL object, and a reload may replace the gateway's
 * context before that. */
typedef struct connection {
    kf_gateway_t *gw;
    SSL_CTX *ssl_ctx; /* NULL for plaintext */
} connection_t;

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
    case 429: return "Too Many Requests";
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
static int send_error(h2o_req_t *req, kf_status_t status, const char *message, int http_status) {
    json_t *body = json_pack("{s:i, s:s, s:s}", "code", kf_status_grpc_code(status), "status",
                             kf_status_grpc_name(status), "message", message);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    const char *out = text ? text : "{\"code\":13,\"status\":\"INTERNAL\",\"message\":\"\"}";
    int sent = http_status ? http_status : kf_status_http(status);
    send_body(req, sent, "application/json", out, strlen(out));
    free(text);
    return sent;
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
            kf_engine_cancel(gw->engine, &c->cmd);
        }
        c = next;
    }
    if (gw->watched != NULL) {
        h2o_timeout_link(gw->loop, &gw->watch_timeout, &gw->watch_entry);
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
        h2o_timeout_link(gw->loop, &gw->watch_timeout, &gw->watch_entry);
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

static void call_free(http_call_t *call) {
    watch_unlink(call->gw, call);
    kf_arena_deinit(&call->arena);
    kf_principal_unref(call->principal);
    atomic_fetch_sub(&call->gw->in_flight, 1);
    free(call);
}

/* h2o disposes the request (the client went away, or the reply was sent).
 * If the command still waits in the engine (a long poll), cancel it so that
 * it takes no run; the reply, when it comes, is dropped. Loop thread. */
static void on_req_dispose(void *p) {
    req_hook_t *hook = p;
    if (hook->call != NULL) {
        hook->call->req = NULL;
        kf_engine_cancel(hook->engine, &hook->call->cmd);
    }
}

/* Loop thread: the engine answered. */
static void finish_call(http_call_t *call) {
    kf_cmd_t *cmd = &call->cmd;
    int code = kf_status_grpc_code(cmd->error.status);
    int http_status = 0; /* 0: the client left, nothing was sent */
    if (call->req != NULL) {
        h2o_req_t *req = call->req;
        call->hook->call = NULL;
        if (cmd->error.status == KF_OK) {
            size_t len;
            char *json = kf_message_to_json(cmd->response, &call->arena, &len);
            if (json != NULL) {
                http_status = 200;
                send_body(req, 200, "application/json", json, len);
            } else {
                code = kf_status_grpc_code(KF_E_TOO_LARGE);
                http_status = send_error(req, KF_E_TOO_LARGE, "response: too large to render", 0);
            }
        } else {
            http_status = send_error(req, cmd->error.status, cmd->error.message, 0);
        }
    }
    record_request(call, call->metrics_id, code, http_status, cmd->request);
    call_free(call);
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
    kf_gateway_t *gw = H2O_STRUCT_FROM_MEMBER(kf_gateway_t, control, receiver);
    while (!h2o_linklist_is_empty(messages)) {
        h2o_multithread_message_t *m =
            H2O_STRUCT_FROM_MEMBER(h2o_multithread_message_t, link, messages->next);
        h2o_linklist_unlink(&m->link);
        control_msg_t *c = H2O_STRUCT_FROM_MEMBER(control_msg_t, msg, m);
        if (c->what == 1 && gw->listener != NULL) {
            h2o_socket_read_stop(gw->listener);
            h2o_socket_close(gw->listener);
            gw->listener = NULL;
        } else if (c->what == 2) {
            gw->exit_loop = true;
        } else if (c->what == 3) {
            SSL_CTX_free(gw->accept_ctx.ssl_ctx); /* connections hold their own */
            gw->accept_ctx.ssl_ctx = c->ssl_ctx;
        }
        free(c);
    }
}

/* Replier thread: hand the finished call to the loop. */
static void engine_done(kf_cmd_t *cmd) {
    http_call_t *call = cmd->owner;
    h2o_multithread_send_message(&call->gw->replies, &call->msg);
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
    kf_error_t err;
    if (kf_auth_authenticate(gw->auth, scope, value, len, principal, &err) != KF_OK) {
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

static int on_req(h2o_handler_t *self, h2o_req_t *req) {
    kf_gateway_t *gw = *(kf_gateway_t **)(self + 1);
    size_t path_len = req->query_at != SIZE_MAX ? req->query_at : req->path.len;
    bool is_get = h2o_memis(req->method.base, req->method.len, H2O_STRLIT("GET")) ||
                  h2o_memis(req->method.base, req->method.len, H2O_STRLIT("HEAD"));
    static const char *const probes[] = {"/healthz", "/readyz", "/metrics"};
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        if (!is_get && path_is(req, path_len, probes[i])) {
            char message[64];
            snprintf(message, sizeof message, "method: use GET for %s", probes[i]);
            send_error(req, KF_E_UNIMPLEMENTED, message, 405);
            return 0;
        }
    }
    if (path_is(req, path_len, "/healthz")) {
        static const char ok[] = "{\"status\":\"ok\"}";
        send_body(req, 200, "application/json", ok, sizeof ok - 1);
        return 0;
    }
    if (path_is(req, path_len, "/readyz")) {
        /* The same answer as gRPC Health/Check (base/health.h), with the
         * reason when not ready. Asking the engine first also measures free
         * space again (at most every KF_DISK_CHECK_INTERVAL_MS), so a disk
         * that was freed shows here at once. */
        char why[KF_ERROR_MESSAGE_BYTES_MAX];
        bool unready = kf_engine_unready(gw->engine, why, sizeof why);
        if (!unready && kf_health_serving()) {
            static const char ok[] = "{\"status\":\"ready\"}";
            send_body(req, 200, "application/json", ok, sizeof ok - 1);
        } else {
            if (!unready) {
                kf_health_reason(why, sizeof why);
            }
            send_error(req, KF_E_UNAVAILABLE, why, 0);
        }
        return 0;
    }
    if (path_is(req, path_len, "/metrics")) {
        serve_metrics(gw, req);
        return 0;
    }
    if (atomic_load(&gw->stopping)) {
        send_error(req, KF_E_UNAVAILABLE, "the server is shutting down", 0);
        return 0;
    }
    http_call_t *call = calloc(1, sizeof *call);
    if (call == NULL) {
        send_error(req, KF_E_NOMEM, "out of memory", 0);
        return 0;
    }
    call->gw = gw;
    call->watch_fd = -1;
    call->start_us = kf_mono_us();
    kf_arena_init(&call->arena, 0);
    atomic_fetch_add(&gw->in_flight, 1);
    kf_http_request_t hreq = {
        .method = req->method.base,
        .method_len = req->method.len,
        .path = req->path.base,
        .path_len = path_len,
        .query = req->query_at != SIZE_MAX ? req->path.base + req->query_at + 1 : NULL,
        .query_len = req->query_at != SIZE_MAX ? req->path.len - req->query_at - 1 : 0,
        .body = req->entity.base,
        .body_len = req->entity.base ? req->entity.len : 0,
    };
    ProtobufCMessage *msg;
    kf_error_t err;
    kf_status_t st = kf_http_route(&hreq, &call->arena, &call->method, &msg, &err);
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
        } else if (st == KF_OK) {
            st = kf_auth_authorize(call->principal, call->method, msg, &err);
        }
    }
    if (st != KF_OK) {
        int sent = send_error(req, st, err.message, st == KF_E_UNIMPLEMENTED ? 405 : 0);
        if (call->method != NULL) { /* a refused request of a known method counts */
            record_request(call, gw->metrics_ids[call->method - kf_methods],
                           kf_status_grpc_code(st), sent, NULL);
        }
        call_free(call);
        return 0;
    }
    call->metrics_id = gw->metrics_ids[call->method - kf_methods];
    kf_cmd_t *cmd = &call->cmd;
    KF_ASSERT(call->method->executor == KF_RPC_ENGINE); /* routes name no others */
    cmd->op = call->method->op;
    cmd->request = msg;
    cmd->principal = call->principal;
    cmd->arena = &call->arena;
    cmd->done = engine_done;
    cmd->owner = call;
    call->req = req;
    call->hook = h2o_mem_alloc_shared(&req->pool, sizeof *call->hook, on_req_dispose);
    call->hook->call = call;
    call->hook->engine = gw->engine;
    if (req->version < 0x200 && is_long_poll(call->method, msg)) {
        h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
        if (sock != NULL) {
            watch_add(gw, call, h2o_socket_get_fd(sock));
        }
    }
    if (kf_engine_submit(gw->engine, cmd) != KF_OK) {
        call->hook->call = NULL;
        int sent = send_error(req, cmd->error.status, cmd->error.message, 0);
        record_request(call, call->metrics_id, kf_status_grpc_code(cmd->error.status), sent, msg);
        call_free(call);
    }
    return 0;
}

static void on_accept(h2o_socket_t *listener, const char *err);

static void accept_resume(kf_gateway_t *gw) {
    if (gw->accept_paused && gw->listener != NULL && !atomic_load(&gw->stopping) &&
        gw->connections < KF_HTTP_CONNECTIONS_MAX) {
        gw->accept_paused = false;
        h2o_socket_read_start(gw->listener, on_accept);
    }
}

static void accept_pause(kf_gateway_t *gw, bool retry_later) {
    if (!gw->accept_paused) {
        gw->accept_paused = true;
        h2o_socket_read_stop(gw->listener);
    }
    if (retry_later && !h2o_timeout_is_linked(&gw->accept_entry)) {
        h2o_timeout_link(gw->loop, &gw->accept_timeout, &gw->accept_entry);
    }
}

static void on_accept_retry(h2o_timeout_entry_t *entry) {
    accept_resume(H2O_STRUCT_FROM_MEMBER(kf_gateway_t, accept_entry, entry));
}

static void on_connection_closed(void *data) {
    connection_t *conn = data;
    kf_gateway_t *gw = conn->gw;
    SSL_CTX_free(conn->ssl_ctx);
    free(conn);
    gw->connections--;
    accept_resume(gw);
}

static void on_accept(h2o_socket_t *listener, const char *err) {
    if (err != NULL) {
        return;
    }
    kf_gateway_t *gw = listener->data;
    if (gw->connections >= KF_HTTP_CONNECTIONS_MAX) {
        accept_pause(gw, false); /* resumed when a connection closes */
        return;
    }
    h2o_socket_t *sock = h2o_evloop_socket_accept(listener);
    if (sock == NULL) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            kf_log(KF_LOG_WARN, "http", "accept: %s; pausing new connections for %d ms",
                   strerror(errno), ACCEPT_RETRY_MS);
            accept_pause(gw, true);
        }
        return;
    }
    connection_t *conn = malloc(sizeof *conn);
    if (conn == NULL) {
        h2o_socket_close(sock);
        return;
    }
    conn->gw = gw;
    conn->ssl_ctx = gw->accept_ctx.ssl_ctx;
    if (conn->ssl_ctx != NULL) {
        SSL_CTX_up_ref(conn->ssl_ctx);
    }
    gw->connections++;
    sock->on_close.cb = on_connection_closed;
    sock->on_close.data = conn;
    h2o_accept(&gw->accept_ctx, sock);
}

static kf_status_t bind_listener(const char *address, int *fd_out, int *port, kf_error_t *err) {
    /* "host:port", "[v6]:port"; the host may be a name (resolved once). */
    char host[256], service[16];
    const char *colon = strrchr(address, ':');
    if (colon == NULL || strlen(colon + 1) == 0 || strlen(colon + 1) >= sizeof service) {
        return kf_error_set(err, KF_E_INVALID, "http address: expected host:port, got %s", address);
    }
    const char *h = address;
    size_t hl = (size_t)(colon - address);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl == 0 || hl >= sizeof host) {
        return kf_error_set(err, KF_E_INVALID, "http address: expected host:port, got %s", address);
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
        return kf_error_set(err, KF_E_INVALID, "http address: cannot resolve %s: %s", address,
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
        return kf_error_set(err, KF_E_IO, "http: cannot listen on %s: %s", address, strerror(e));
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

/* A server context for the material, negotiating HTTP/2 by ALPN. */
static kf_status_t make_ssl_ctx(const kf_tls_t *tls, SSL_CTX **out, kf_error_t *err) {
    kf_status_t st = kf_tls_server_ctx_create(tls, out, err);
    if (st == KF_OK) {
        h2o_ssl_register_alpn_protocols(*out, h2o_http2_alpn_protocols);
    }
    return st;
}

kf_status_t kf_gateway_set_tls(kf_gateway_t *gw, const kf_tls_t *tls, kf_error_t *err) {
    KF_ASSERT(gw->accept_ctx.ssl_ctx != NULL);
    SSL_CTX *ctx;
    kf_status_t st = make_ssl_ctx(tls, &ctx, err);
    if (st != KF_OK) {
        return st;
    }
    control_msg_t *c = calloc(1, sizeof *c);
    if (c == NULL) {
        SSL_CTX_free(ctx);
        return kf_error_set(err, KF_E_NOMEM, "out of memory");
    }
    c->what = 3;
    c->ssl_ctx = ctx;
    h2o_multithread_send_message(&gw->control, &c->msg);
    return KF_OK;
}

kf_status_t kf_gateway_create(const kf_gateway_options_t *options, kf_engine_t *engine,
                              kf_gateway_t **out, int *port, kf_error_t *err) {
    kf_gateway_t *gw = calloc(1, sizeof *gw);
    if (gw == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate the gateway");
    }
    SSL_CTX *ssl_ctx = NULL;
    if (options->tls != NULL) {
        kf_status_t st = make_ssl_ctx(options->tls, &ssl_ctx, err);
        if (st != KF_OK) {
            free(gw);
            return st;
        }
    }
    kf_status_t st = bind_listener(options->address, &gw->listen_fd, port, err);
    if (st != KF_OK) {
        SSL_CTX_free(ssl_ctx);
        free(gw);
        return st;
    }
    gw->engine = engine;
    gw->auth = options->auth;
    for (size_t i = 0; i < KF_METHOD_COUNT; i++) {
        gw->metrics_ids[i] = kf_metrics_method_register(kf_methods[i].name);
    }
    h2o_config_init(&gw->config);
    /* Bodies past the request bound are refused by h2o itself (413). */
    gw->config.max_request_entity_size = KF_REQUEST_BYTES_MAX;
    h2o_hostconf_t *host =
        h2o_config_register_host(&gw->config, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *path = h2o_config_register_path(host, "/", 0);
    h2o_handler_t *handler = h2o_create_handler(path, sizeof *handler + sizeof(kf_gateway_t *));
    handler->on_req = on_req;
    *(kf_gateway_t **)(handler + 1) = gw;
    gw->loop = h2o_evloop_create();
    h2o_context_init(&gw->ctx, gw->loop, &gw->config);
    gw->accept_ctx.ctx = &gw->ctx;
    gw->accept_ctx.hosts = gw->config.hosts;
    gw->accept_ctx.ssl_ctx = ssl_ctx; /* the gateway's reference */
    gw->queue = h2o_multithread_create_queue(gw->loop);
    h2o_multithread_register_receiver(gw->queue, &gw->replies, on_replies);
    h2o_multithread_register_receiver(gw->queue, &gw->control, on_control);
    h2o_timeout_init(gw->loop, &gw->watch_timeout, WATCH_INTERVAL_MS);
    gw->watch_entry.cb = on_watch_tick;
    h2o_timeout_init(gw->loop, &gw->accept_timeout, ACCEPT_RETRY_MS);
    gw->accept_entry.cb = on_accept_retry;
    gw->listener = h2o_evloop_socket_create(gw->loop, gw->listen_fd, H2O_SOCKET_FLAG_DONT_READ);
    gw->listener->data = gw;
    *out = gw;
    return KF_OK;
}

static void *loop_main(void *arg) {
    kf_gateway_t *gw = arg;
    pthread_setname_np(pthread_self(), "kf-http");
    while (!gw->exit_loop) {
        h2o_evloop_run(gw->loop, INT32_MAX);
    }
    return NULL;
}

kf_status_t kf_gateway_start(kf_gateway_t *gw, kf_error_t *err) {
    h2o_socket_read_start(gw->listener, on_accept);
    if (pthread_create(&gw->thread, NULL, loop_main, gw) != 0) {
        return kf_error_set(err, KF_E_INTERNAL, "cannot start the HTTP thread");
    }
    gw->started = true;
    return KF_OK;
}

static void send_control(kf_gateway_t *gw, int what) {
    control_msg_t *c = kf_xcalloc(1, sizeof *c);
    c->what = what;
    h2o_multithread_send_message(&gw->control, &c->msg);
}

void kf_gateway_shutdown(kf_gateway_t *gw) {
    if (atomic_exchange(&gw->stopping, true)) {
        return;
    }
    if (gw->started) {
        send_control(gw, 1);
    }
}

/* Connections still open when the loop stopped (an idle keep-alive, a
 * client that never finished its request) hold entries in h2o's request and
 * idle timeouts, and h2o_context_dispose refuses to run over them. Make those
 * timeouts due now and turn the loop until they fired: each connection is
 * then closed by h2o's own timeout path, as if it had idled out. Every reply
 * was already sent (or given up on) by then. */
static void close_connections(kf_gateway_t *gw) {
    gw->ctx.http1.req_timeout.timeout = 0;
    gw->ctx.http2.idle_timeout.timeout = 0;
    gw->ctx.http2.graceful_shutdown_timeout.timeout = 0;
    int64_t deadline = kf_mono_us() + 2 * 1000 * 1000;
    while ((!h2o_linklist_is_empty(&gw->ctx.http1._conns) ||
            !h2o_linklist_is_empty(&gw->ctx.http2._conns)) &&
           kf_mono_us() < deadline) {
        h2o_evloop_run(gw->loop, 10);
    }
}

void kf_gateway_destroy(kf_gateway_t *gw) {
    if (gw == NULL) {
        return;
    }
    kf_gateway_shutdown(gw);
    if (gw->started) {
        /* The engine has stopped, so every reply is queued or delivered
         * (unless a failed sync stopped it: then give up after a while). */
        int64_t deadline = kf_mono_us() + 5 * 1000 * 1000;
        while (atomic_load(&gw->in_flight) > 0 && kf_mono_us() < deadline) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        send_control(gw, 2);
        pthread_join(gw->thread, NULL);
    } else if (gw->listener != NULL) {
        h2o_socket_close(gw->listener);
        gw->listener = NULL;
    }
    close_connections(gw);
    if (h2o_timeout_is_linked(&gw->watch_entry)) {
        h2o_timeout_unlink(&gw->watch_entry);
    }
    h2o_timeout_dispose(gw->loop, &gw->watch_timeout);
    if (h2o_timeout_is_linked(&gw->accept_entry)) {
        h2o_timeout_unlink(&gw->accept_entry);
    }
    h2o_timeout_dispose(gw->loop, &gw->accept_timeout);
    h2o_multithread_unregister_receiver(gw->queue, &gw->replies);
    h2o_multithread_unregister_receiver(gw->queue, &gw->control);
    h2o_multithread_destroy_queue(gw->queue);
    /* Closing an evloop socket is finished by the loop's next turn: run it
     * once so the queue's and listener's sockets are really freed. */
    h2o_evloop_run(gw->loop, 0);
    h2o_context_dispose(&gw->ctx);
    h2o_evloop_destroy(gw->loop);
    h2o_config_dispose(&gw->config);
    SSL_CTX_free(gw->accept_ctx.ssl_ctx);
    free(gw);
}
