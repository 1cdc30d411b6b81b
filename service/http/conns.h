/*
 * conns.h - who gets a connection, and for how long: admission and read
 * deadlines for one h2o listener of the HTTP module (the gateway's, and the
 * probe listener's). Internal to service/http.
 *
 * Admission (on accept):
 *   - at most connections_max at once: at the bound, or when accept() runs
 *     out of descriptors, the listener stops reading (else its
 *     level-triggered readiness would spin the loop) until a connection
 *     closes or a retry timer fires;
 *   - at most per_address_max from one client address: one more is closed
 *     as soon as it is accepted, so one host cannot take every connection.
 *
 * Deadlines (a tick every KF__CONN_TICK_MS): a connection with no request in
 * the handler is "idle since" it was accepted, since a request of it
 * reached the handler, or since the handler let go of one. It must have
 * its request head (request line and headers) within header_timeout_ms of
 * that, and the whole request, body included, within body_timeout_ms (which
 * also bounds how long an answer may take to be read). Past its deadline
 * the socket is shut down, and h2o closes the connection through its own
 * error path (a read or write that fails): nothing is freed under h2o's feet.
 * HTTP/2 connections (known once one request came) get the body deadline:
 * their input is framed, not a request head.
 *
 * Request bytes (each tick): the connections may hold at most
 * KF_HTTP_BUFFERED_BYTES_MAX of requests in all, HTTP/1 requests and
 * HTTP/2 stream bodies alike. Past it the connections still sending that
 * hold the most lose what they send, largest first: an HTTP/1 connection
 * is shut down, an HTTP/2 connection's receiving streams are reset
 * (REFUSED_STREAM). Requests being answered count, and are never cut.
 *
 * Threads: the loop thread of the listener only.
 */
#ifndef KF_HTTP_CONNS_H
#define KF_HTTP_CONNS_H

#include <stdbool.h>
#include <stdint.h>

#include <h2o.h>

typedef struct kf_http_conn_limits {
    int connections_max;
    int per_address_max;
    int64_t header_timeout_ms;
    int64_t body_timeout_ms;
} kf_http_conn_limits_t;

typedef struct kf_http_conns kf_http_conns_t;
typedef struct kf_http_conn kf_http_conn_t;

/* For the listening socket `listener` (not read until kf_http_conns_start)
 * of a loop; accepted connections go to h2o_accept(accept_ctx, ...). All
 * three are borrowed and outlive the tracker. `name` ("http", "probe") is
 * for the log. */
kf_http_conns_t *kf_http_conns_create(h2o_evloop_t *loop, h2o_socket_t *listener,
                                      h2o_accept_ctx_t *accept_ctx,
                                      const kf_http_conn_limits_t *limits, const char *name);
void kf_http_conns_start(kf_http_conns_t *conns);
/* Closes the listening socket: no more connections. Idempotent. */
void kf_http_conns_close_listener(kf_http_conns_t *conns);
/* Connections open now. */
int kf_http_conns_count(const kf_http_conns_t *conns);
/* Once every connection closed (h2o closed them) and the loop is no longer
 * run: frees the tracker. Connections whose request is still held are
 * freed with it. */
void kf_http_conns_destroy(kf_http_conns_t *conns);

/* A request arrived (h2o read it whole): the connection it came on is
 * idle from now (an answer at once ends its part), and HTTP/2 when the
 * request is. Returns it, or NULL (not one of ours). */
kf_http_conn_t *kf_http_conn_request(h2o_req_t *req);
/* That request is answered later (the engine, a worker): no deadline while
 * any is held. `conn` may be NULL. */
void kf_http_conn_hold(kf_http_conn_t *conn);
/* It was answered (or dropped): the connection is idle from now. After the
 * connection closed, frees it with its last hold. NULL: no-op. */
void kf_http_conn_release(kf_http_conn_t *conn);

#endif
