/*
 * conns.c - connection admission and read deadlines (see conns.h).
 *
 * Each accepted socket gets a kf_http_conn_t through sock->on_close (the
 * one field of an h2o socket that h2o leaves to its user): h2o calls
 * on_conn_closed when it closes the socket, whatever the reason. A
 * connection closed while one of its requests is still held (answered
 * later by the engine) stays allocated, off the open list, until that last
 * hold is released.
 */
#define _GNU_SOURCE /* memmem */
#include "http/conns.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* After <h2o.h> (conns.h): h2o 2.2.5's HTTP/2 structs, for the request
 * bytes a connection's streams hold (compat/khash.h says why it exists). */
#include <h2o/http2.h>
#include <h2o/http2_internal.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/clock.h"
#include "base/limits.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/status.h"

#define ACCEPT_RETRY_MS 100
/* How often deadlines are checked: a connection lives at most this much
 * past its deadline. */
#define TICK_MS         100
#define ADDRESS_BUCKETS 1024

/* Connections from one client address. */
typedef struct address {
    struct address *next; /* in its bucket */
    uint8_t key[17];      /* family (4 or 6), then the address */
    int count;
} address_t;

struct kf_http_conn {
    kf_http_conns_t *conns;
    h2o_socket_t *sock; /* NULL once h2o closed it */
    SSL_CTX *ssl_ctx;   /* the TLS context it was accepted under (a reference), or NULL */
    address_t *address;
    int64_t idle_since_ms; /* see conns.h */
    int held;              /* requests answered later */
    bool http2;
    bool shut;                 /* its deadline passed: shut down, h2o closes it */
    h2o_socket_cb h2o_on_read; /* while an answer of ours is written: h2o's read callback */
    /* During a tick's shedding only: its h2o HTTP/2 connection (NULL for
     * HTTP/1), and the request bytes it is still sending. */
    h2o_http2_conn_t *h2;
    size_t sending;
    kf_http_conn_t *prev;
    kf_http_conn_t *next; /* on conns->open while open, then on conns->closed */
};

struct kf_http_conns {
    h2o_evloop_t *loop;
    h2o_socket_t *listener; /* NULL once closed */
    h2o_accept_ctx_t *accept_ctx;
    kf_http_conn_limits_t limits;
    char name[16];
    int count; /* open connections */
    bool accept_paused;
    h2o_timeout_t accept_timeout;
    h2o_timeout_entry_t accept_entry;
    h2o_timeout_t tick_timeout;
    h2o_timeout_entry_t tick_entry;
    kf_http_conn_t *open;
    kf_http_conn_t *closed; /* closed with requests still held */
    address_t *buckets[ADDRESS_BUCKETS];
    char head_refusal[512]; /* the HTTP/1 answer to a head past KF_HTTP_HEADER_BYTES_MAX */
    size_t head_refusal_len;
};

static int64_t now_ms(void) {
    return kf_mono_us() / 1000;
}

static void list_add(kf_http_conn_t **head, kf_http_conn_t *c) {
    c->prev = NULL;
    c->next = *head;
    if (*head != NULL) {
        (*head)->prev = c;
    }
    *head = c;
}

static void list_remove(kf_http_conn_t **head, kf_http_conn_t *c) {
    if (c->prev != NULL) {
        c->prev->next = c->next;
    } else {
        *head = c->next;
    }
    if (c->next != NULL) {
        c->next->prev = c->prev;
    }
    c->prev = c->next = NULL;
}

/* ---- client addresses -------------------------------------------------- */

/* The peer's address as a key; IPv4-mapped IPv6 counts as the IPv4
 * address. False when the socket has no peer address (then it is not
 * limited per address). */
static bool peer_key(h2o_socket_t *sock, uint8_t key[17]) {
    struct sockaddr_storage ss;
    if (h2o_socket_getpeername(sock, (struct sockaddr *)&ss) == 0) {
        return false;
    }
    memset(key, 0, 17);
    if (ss.ss_family == AF_INET) {
        key[0] = 4;
        memcpy(key + 1, &((struct sockaddr_in *)&ss)->sin_addr, 4);
        return true;
    }
    if (ss.ss_family == AF_INET6) {
        const uint8_t *a = ((struct sockaddr_in6 *)&ss)->sin6_addr.s6_addr;
        static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(a, mapped, 12) == 0) {
            key[0] = 4;
            memcpy(key + 1, a + 12, 4);
        } else {
            key[0] = 6;
            memcpy(key + 1, a, 16);
        }
        return true;
    }
    return false;
}

static size_t bucket_of(const uint8_t key[17]) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (int i = 0; i < 17; i++) {
        h = (h ^ key[i]) * 16777619u;
    }
    return h % ADDRESS_BUCKETS;
}

static address_t *address_get(kf_http_conns_t *c, const uint8_t key[17]) {
    address_t **b = &c->buckets[bucket_of(key)];
    for (address_t *a = *b; a != NULL; a = a->next) {
        if (memcmp(a->key, key, 17) == 0) {
            return a;
        }
    }
    address_t *a = kf_xcalloc(1, sizeof *a);
    memcpy(a->key, key, 17);
    a->next = *b;
    *b = a;
    return a;
}

static void address_put(kf_http_conns_t *c, address_t *a) {
    if (a == NULL || --a->count > 0) {
        return;
    }
    for (address_t **p = &c->buckets[bucket_of(a->key)]; *p != NULL; p = &(*p)->next) {
        if (*p == a) {
            *p = a->next;
            free(a);
            return;
        }
    }
    KF_UNREACHABLE();
}

/* ---- answers of our own ------------------------------------------------ */

/* A whole HTTP/1.1 answer with a JSON error body {"code", "status",
 * "message"} (the gateway's shape), for a connection that is closed after
 * it; `retry_after` (seconds) may be NULL. The message is ours: no
 * character in it needs escaping. Returns its length. */
static size_t render_answer(char *out, size_t cap, int http_status, const char *reason,
                            const char *retry_after, kf_status_t status, const char *format, ...)
    __attribute__((format(printf, 7, 8)));
static size_t render_answer(char *out, size_t cap, int http_status, const char *reason,
                            const char *retry_after, kf_status_t status, const char *format, ...) {
    char message[256];
    va_list ap;
    va_start(ap, format);
    vsnprintf(message, sizeof message, format, ap);
    va_end(ap);
    KF_ASSERT(strpbrk(message, "\"\\") == NULL);
    char body[384];
    int body_len = snprintf(body, sizeof body, "{\"code\":%d,\"status\":\"%s\",\"message\":\"%s\"}",
                            kf_status_grpc_code(status), kf_status_grpc_name(status), message);
    KF_ASSERT(body_len > 0 && (size_t)body_len < sizeof body);
    int n =
        snprintf(out, cap,
                 "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                 "%s%s%sConnection: close\r\n\r\n%s",
                 http_status, reason, body_len, retry_after != NULL ? "Retry-After: " : "",
                 retry_after != NULL ? retry_after : "", retry_after != NULL ? "\r\n" : "", body);
    KF_ASSERT(n > 0 && (size_t)n < cap);
    return (size_t)n;
}

/* ---- accepting --------------------------------------------------------- */

static void on_accept(h2o_socket_t *listener, const char *err);

static void accept_resume(kf_http_conns_t *c) {
    if (c->accept_paused && c->listener != NULL && c->count < c->limits.connections_max) {
        c->accept_paused = false;
        h2o_socket_read_start(c->listener, on_accept);
    }
}

static void accept_pause(kf_http_conns_t *c, bool retry_later) {
    if (!c->accept_paused) {
        c->accept_paused = true;
        h2o_socket_read_stop(c->listener);
    }
    if (retry_later && !h2o_timeout_is_linked(&c->accept_entry)) {
        h2o_timeout_link(c->loop, &c->accept_timeout, &c->accept_entry);
    }
}

static void on_accept_retry(h2o_timeout_entry_t *entry) {
    accept_resume(H2O_STRUCT_FROM_MEMBER(kf_http_conns_t, accept_entry, entry));
}

static void conn_free(kf_http_conn_t *conn) {
    SSL_CTX_free(conn->ssl_ctx);
    free(conn);
}

static void on_conn_closed(void *data) {
    kf_http_conn_t *conn = data;
    kf_http_conns_t *c = conn->conns;
    if (c == NULL) { /* closed after the tracker was destroyed */
        conn_free(conn);
        return;
    }
    list_remove(&c->open, conn);
    address_put(c, conn->address);
    conn->address = NULL;
    conn->sock = NULL;
    c->count--;
    if (conn->held > 0) {
        list_add(&c->closed, conn); /* freed by its last release */
    } else {
        conn_free(conn);
    }
    accept_resume(c);
}

static void on_tick(h2o_timeout_entry_t *entry);

static void on_accept(h2o_socket_t *listener, const char *err) {
    if (err != NULL) {
        return;
    }
    kf_http_conns_t *c = listener->data;
    if (c->count >= c->limits.connections_max) {
        accept_pause(c, false); /* resumed when a connection closes */
        return;
    }
    h2o_socket_t *sock = h2o_evloop_socket_accept(listener);
    if (sock == NULL) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            kf_log(KF_LOG_WARN, c->name, "accept: %s; pausing new connections for %d ms",
                   strerror(errno), ACCEPT_RETRY_MS);
            accept_pause(c, true);
        }
        return;
    }
    uint8_t key[17];
    address_t *address = NULL;
    if (peer_key(sock, key)) {
        address = address_get(c, key);
        if (address->count >= c->limits.per_address_max) {
            /* One client holds its share: close this one at once rather
             * than let it wait in the queue in front of other clients. */
            kf_counter_add(KF_C_HTTP_CONNECTIONS_REFUSED, 1);
            h2o_socket_close(sock);
            return;
        }
        address->count++;
    }
    kf_http_conn_t *conn = kf_xcalloc(1, sizeof *conn);
    conn->conns = c;
    conn->sock = sock;
    conn->address = address;
    conn->idle_since_ms = now_ms();
    conn->ssl_ctx = c->accept_ctx->ssl_ctx;
    if (conn->ssl_ctx != NULL) {
        /* h2o keeps a bare pointer to the context until the handshake made
         * its SSL object, and a reload may replace the listener's context
         * before that. */
        SSL_CTX_up_ref(conn->ssl_ctx);
    }
    list_add(&c->open, conn);
    c->count++;
    sock->on_close.cb = on_conn_closed;
    sock->on_close.data = conn;
    if (!h2o_timeout_is_linked(&c->tick_entry)) {
        h2o_timeout_link(c->loop, &c->tick_timeout, &c->tick_entry);
    }
    h2o_accept(c->accept_ctx, sock);
}

/* ---- deadlines --------------------------------------------------------- */

/* HTTP/1: h2o keeps the request's bytes in the socket's input until it is
 * answered, so an empty line there means the head arrived (lines end in
 * CRLF or LF, as picohttpparser takes them). */
static bool head_complete(h2o_socket_t *sock) {
    const h2o_buffer_t *in = sock->input;
    return in != NULL && in->size >= 2 &&
           (memmem(in->bytes, in->size, "\n\r\n", 3) != NULL ||
            memmem(in->bytes, in->size, "\n\n", 2) != NULL);
}

/* An HTTP/1 answer of ours on a connection h2o is reading a request head
 * of: h2o stops reading (so it parses nothing more), the answer is written
 * through the socket (TLS or not), then the socket is shut down and h2o's
 * read handed back, which fails, and h2o closes the connection through its
 * own error path. */
static void on_answer_written(h2o_socket_t *sock, const char *err) {
    (void)err;
    kf_http_conn_t *conn = sock->on_close.data;
    shutdown(h2o_socket_get_fd(sock), SHUT_RDWR);
    h2o_socket_read_start(sock, conn->h2o_on_read);
}

static void answer_and_close(kf_http_conn_t *conn, const char *answer, size_t len) {
    h2o_socket_t *sock = conn->sock;
    conn->shut = true;
    conn->h2o_on_read = sock->_cb.read;
    KF_ASSERT(conn->h2o_on_read != NULL); /* h2o is reading a head */
    h2o_socket_read_stop(sock);
    h2o_iovec_t buf = h2o_iovec_init(answer, len);
    h2o_socket_write(sock, &buf, 1, on_answer_written);
}

/* ---- request bytes held ------------------------------------------------ */

/* One HTTP/2 connection's streams. h2o 2.2.5 buffers each stream's request
 * body whole (stream->_req_body) and gives the flow-control window back as
 * the bytes arrive (16 MiB a stream, 100 streams a connection), so nothing
 * but the entity limit bounds a stream, and nothing bounds a connection. */
typedef struct h2_streams {
    size_t held;                 /* body bytes of every stream */
    size_t sending;              /* of which streams still receiving their body */
    h2o_http2_stream_t *largest; /* the receiving stream holding the most */
} h2_streams_t;

static size_t stream_body_bytes(const h2o_http2_stream_t *stream) {
    return stream->_req_body != NULL ? stream->_req_body->size : 0;
}

/* Every open stream is in its connection's priority tree exactly once (a
 * public h2o structure; the stream table is not reachable, compat/khash.h).
 * The tree is at most as deep as the connection has streams. */
static void h2_walk(h2o_http2_scheduler_node_t *node, h2_streams_t *out) {
    for (h2o_linklist_t *l = node->_all_refs.next; l != &node->_all_refs; l = l->next) {
        h2o_http2_scheduler_openref_t *ref =
            H2O_STRUCT_FROM_MEMBER(h2o_http2_scheduler_openref_t, _all_link, l);
        h2o_http2_stream_t *stream =
            H2O_STRUCT_FROM_MEMBER(h2o_http2_stream_t, _refs.scheduler, ref);
        size_t n = stream_body_bytes(stream);
        out->held += n;
        if (stream->state == H2O_HTTP2_STREAM_STATE_RECV_BODY && n > 0) {
            out->sending += n;
            if (out->largest == NULL || n > stream_body_bytes(out->largest)) {
                out->largest = stream;
            }
        }
        h2_walk(&ref->node, out);
    }
}

/* Finds which open connections are HTTP/2 (h2c, prior knowledge or
 * upgrade, or ALPN h2): h2o lists them in the context, on the socket the
 * tracker accepted. */
static void find_http2(kf_http_conns_t *c) {
    for (kf_http_conn_t *conn = c->open; conn != NULL; conn = conn->next) {
        conn->h2 = NULL;
    }
    h2o_linklist_t *anchor = &c->accept_ctx->ctx->http2._conns;
    for (h2o_linklist_t *l = anchor->next; l != anchor; l = l->next) {
        h2o_http2_conn_t *h2 = H2O_STRUCT_FROM_MEMBER(h2o_http2_conn_t, _conns, l);
        if (h2->sock != NULL && h2->sock->on_close.cb == on_conn_closed) {
            kf_http_conn_t *conn = h2->sock->on_close.data;
            if (conn->conns == c) {
                conn->h2 = h2;
            }
        }
    }
}

/* Request bytes h2o holds for a connection, and (*sending) how many of
 * them it is still sending. HTTP/1: a request's head and body stay in the
 * socket's input until it is answered; while it is held (being answered)
 * they go with the answer. HTTP/2: every stream's body, of which those
 * still arriving can be refused. */
static size_t held_bytes(const kf_http_conn_t *conn, size_t *sending) {
    *sending = 0;
    if (conn->sock == NULL || conn->shut) {
        return 0;
    }
    size_t in = conn->sock->input != NULL ? conn->sock->input->size : 0;
    if (conn->h2 == NULL) {
        *sending = conn->held == 0 ? in : 0;
        return in;
    }
    h2_streams_t streams = {0};
    h2_walk(&conn->h2->scheduler, &streams);
    if (conn->h2->state < H2O_HTTP2_CONN_STATE_IS_CLOSING) {
        *sending = streams.sending;
    }
    const h2o_buffer_t *upgrade = conn->h2->_http1_req_input; /* h2c: the upgrading request */
    return in + streams.held + (upgrade != NULL ? upgrade->size : 0);
}

/* Resets an HTTP/2 connection's receiving streams, largest first, until
 * `excess` bytes are gone or none is left; REFUSED_STREAM tells the client
 * nothing was done and it may retry. The connection and its other streams
 * (requests being answered) go on. Returns the bytes let go. */
static size_t shed_streams(kf_http_conns_t *c, kf_http_conn_t *conn, size_t excess) {
    size_t freed = 0;
    int reset = 0;
    while (freed < excess) {
        h2_streams_t streams = {0};
        h2_walk(&conn->h2->scheduler, &streams);
        if (streams.largest == NULL) {
            break;
        }
        freed += stream_body_bytes(streams.largest);
        h2o_http2_encode_rst_stream_frame(&conn->h2->_write.buf, streams.largest->stream_id,
                                          -H2O_HTTP2_ERROR_REFUSED_STREAM);
        h2o_http2_stream_reset(conn->h2, streams.largest);
        reset++;
    }
    if (reset > 0) {
        h2o_http2_conn_request_write(conn->h2);
        kf_counter_add(KF_C_HTTP_STREAMS_SHED, (uint64_t)reset);
        kf_log(KF_LOG_WARN, c->name,
               "refusing %d HTTP/2 streams holding %zu request bytes: connections held more "
               "than %llu in all",
               reset, freed, (unsigned long long)KF_HTTP_BUFFERED_BYTES_MAX);
    }
    return freed;
}

/* Every HTTP/1 connection may hold a body of up to the entity limit
 * (20 MiB), and one address may open KF_HTTP_CONNECTIONS_PER_ADDRESS_DEFAULT
 * of them: 64 connections holding 19 MiB each took 508 MiB of RSS from one
 * client (a hostile audit); an HTTP/2 connection may hold 100 such bodies.
 * Past KF_HTTP_BUFFERED_BYTES_MAX in all, the connections still sending
 * that hold the most lose what they are sending, largest first: an HTTP/1
 * connection is shut down, an HTTP/2 connection's receiving streams are
 * reset. */
static void shed_buffered(kf_http_conns_t *c) {
    find_http2(c);
    size_t total = 0;
    for (kf_http_conn_t *conn = c->open; conn != NULL; conn = conn->next) {
        total += held_bytes(conn, &conn->sending);
    }
    while (total > KF_HTTP_BUFFERED_BYTES_MAX) {
        kf_http_conn_t *largest = NULL;
        for (kf_http_conn_t *conn = c->open; conn != NULL; conn = conn->next) {
            if (conn->sending > 0 && (largest == NULL || conn->sending > largest->sending)) {
                largest = conn;
            }
        }
        if (largest == NULL) {
            return;
        }
        if (largest->h2 != NULL) {
            total -= shed_streams(c, largest, total - KF_HTTP_BUFFERED_BYTES_MAX);
        } else {
            total -= largest->sending;
            shutdown(h2o_socket_get_fd(largest->sock), SHUT_RDWR);
            largest->shut = true;
            kf_counter_add(KF_C_HTTP_CONNECTIONS_SHED, 1);
            kf_log(KF_LOG_WARN, c->name,
                   "closing a connection holding %zu request bytes: connections held more than "
                   "%llu in all",
                   largest->sending, (unsigned long long)KF_HTTP_BUFFERED_BYTES_MAX);
        }
        largest->sending = 0; /* drained as far as needed, or entirely */
    }
}

static void on_tick(h2o_timeout_entry_t *entry) {
    kf_http_conns_t *c = H2O_STRUCT_FROM_MEMBER(kf_http_conns_t, tick_entry, entry);
    shed_buffered(c);
    int64_t now = now_ms();
    for (kf_http_conn_t *conn = c->open; conn != NULL; conn = conn->next) {
        if (conn->held > 0 || conn->shut) {
            continue;
        }
        bool body_phase = conn->http2 || conn->h2 != NULL || head_complete(conn->sock);
        if (!body_phase && conn->sock->input != NULL &&
            conn->sock->input->size > KF_HTTP_HEADER_BYTES_MAX && conn->sock->_cb.read != NULL) {
            /* A head still arriving past the bound (one that arrived whole
             * is the handler's to refuse). h2o alone would read 408 KiB. */
            answer_and_close(conn, c->head_refusal, c->head_refusal_len);
            kf_counter_add(KF_C_HTTP_CONNECTIONS_REFUSED, 1);
            kf_log(KF_LOG_DEBUG, c->name, "closing a connection: request head past %u bytes",
                   (unsigned)KF_HTTP_HEADER_BYTES_MAX);
            continue;
        }
        int64_t limit = body_phase ? c->limits.body_timeout_ms : c->limits.header_timeout_ms;
        if (now - conn->idle_since_ms > limit) {
            /* h2o is reading or writing this socket (nothing of it is held):
             * that read or write now fails and h2o closes the connection. */
            shutdown(h2o_socket_get_fd(conn->sock), SHUT_RDWR);
            conn->shut = true;
            kf_counter_add(KF_C_HTTP_CONNECTIONS_TIMED_OUT, 1);
            kf_log(KF_LOG_DEBUG, c->name, "closing a connection: no complete %s within %lld ms",
                   body_phase ? "request" : "request head", (long long)limit);
        }
    }
    if (c->open != NULL) {
        h2o_timeout_link(c->loop, &c->tick_timeout, &c->tick_entry);
    }
}

kf_http_conn_t *kf_http_conn_request(h2o_req_t *req) {
    h2o_socket_t *sock = req->conn->callbacks->get_socket != NULL
                             ? req->conn->callbacks->get_socket(req->conn)
                             : NULL;
    if (sock == NULL || sock->on_close.cb != on_conn_closed) {
        return NULL;
    }
    kf_http_conn_t *conn = sock->on_close.data;
    conn->idle_since_ms = now_ms();
    if (req->version >= 0x200) {
        conn->http2 = true;
    }
    return conn;
}

void kf_http_conn_hold(kf_http_conn_t *conn) {
    if (conn != NULL) {
        conn->held++;
    }
}

void kf_http_conn_release(kf_http_conn_t *conn) {
    if (conn == NULL) {
        return;
    }
    KF_ASSERT(conn->held > 0);
    conn->held--;
    conn->idle_since_ms = now_ms();
    if (conn->sock == NULL && conn->held == 0) {
        list_remove(&conn->conns->closed, conn);
        conn_free(conn);
    }
}

/* ---- the tracker ------------------------------------------------------- */

kf_http_conns_t *kf_http_conns_create(h2o_evloop_t *loop, h2o_socket_t *listener,
                                      h2o_accept_ctx_t *accept_ctx,
                                      const kf_http_conn_limits_t *limits, const char *name) {
    kf_http_conns_t *c = kf_xcalloc(1, sizeof *c);
    c->loop = loop;
    c->listener = listener;
    c->accept_ctx = accept_ctx;
    c->limits = *limits;
    snprintf(c->name, sizeof c->name, "%s", name);
    listener->data = c;
    h2o_timeout_init(loop, &c->accept_timeout, ACCEPT_RETRY_MS);
    c->accept_entry.cb = on_accept_retry;
    h2o_timeout_init(loop, &c->tick_timeout, TICK_MS);
    c->tick_entry.cb = on_tick;
    c->head_refusal_len = render_answer(
        c->head_refusal, sizeof c->head_refusal, 431, "Request Header Fields Too Large", NULL,
        KF_E_TOO_LARGE,
        "request head: more than the limit of %u bytes (KF_HTTP_HEADER_BYTES_MAX) before its "
        "end; the connection is closed",
        (unsigned)KF_HTTP_HEADER_BYTES_MAX);
    return c;
}

void kf_http_conns_start(kf_http_conns_t *c) {
    h2o_socket_read_start(c->listener, on_accept);
}

void kf_http_conns_close_listener(kf_http_conns_t *c) {
    if (c->listener != NULL) {
        h2o_socket_read_stop(c->listener);
        h2o_socket_close(c->listener);
        c->listener = NULL;
    }
}

int kf_http_conns_count(const kf_http_conns_t *c) {
    return c->count;
}

void kf_http_conns_destroy(kf_http_conns_t *c) {
    if (c == NULL) {
        return;
    }
    kf_http_conns_close_listener(c);
    if (h2o_timeout_is_linked(&c->accept_entry)) {
        h2o_timeout_unlink(&c->accept_entry);
    }
    h2o_timeout_dispose(c->loop, &c->accept_timeout);
    if (h2o_timeout_is_linked(&c->tick_entry)) {
        h2o_timeout_unlink(&c->tick_entry);
    }
    h2o_timeout_dispose(c->loop, &c->tick_timeout);
    /* Held requests that were never answered (the engine stopped without
     * answering them): their connections go with the tracker. Open ones
     * are h2o's to close before this. */
    while (c->closed != NULL) {
        kf_http_conn_t *conn = c->closed;
        list_remove(&c->closed, conn);
        conn_free(conn);
    }
    for (kf_http_conn_t *conn = c->open; conn != NULL; conn = conn->next) {
        conn->conns = NULL; /* not freed: h2o still owns its socket */
    }
    for (size_t i = 0; i < ADDRESS_BUCKETS; i++) {
        while (c->buckets[i] != NULL) {
            address_t *a = c->buckets[i];
            c->buckets[i] = a->next;
            free(a);
        }
    }
    free(c);
}
