/*
 * gateway.h - the HTTP/JSON gateway (h2o, HTTP/1.1 and h2c) on one event-loop
 * thread: the REST routes of routes.h over the engine, plus GET /healthz,
 * GET /readyz (200 exactly while base/health.h says serving, like gRPC
 * Health/Check) and GET /metrics (Prometheus text format); and, with a
 * probe address, a second listener on its own thread that serves only
 * those three, so that probes are answered whatever the gateway's clients
 * do (a slowloris at the connection bound, a large body being decoded).
 *
 * Only this module includes h2o.h. A request is routed on the loop thread
 * (a body over KF_HTTP_INLINE_BODY_BYTES_MAX is decoded by a worker thread),
 * executed by the engine, and answered on the loop thread once durable (the
 * engine's committer hands the reply over through an h2o multithread queue).
 * Connections are admitted and timed as conns.h says. Errors are HTTP
 * statuses from base/status.h's table with a JSON body
 * {"code": <grpc code>, "status": "<GRPC_NAME>", "message": "..."}, h2o's own
 * refusals (413 from Content-Length, 400) included.
 */
#ifndef KF_HTTP_GATEWAY_H
#define KF_HTTP_GATEWAY_H

#include <stdbool.h>

#include "base/status.h"
#include "auth/auth.h"
#include "runtime/router.h"
#include "tls/tls.h"

typedef struct kf_gateway kf_gateway_t;

typedef struct kf_gateway_options {
    const char *address;         /* "127.0.0.1:0" */
    kf_tls_t *tls;               /* borrowed; NULL = plaintext (HTTP/1.1 and h2c). With
                                    TLS, HTTP/1.1 and HTTP/2 (ALPN "h2"); with a client
                                    CA in it, client certificates are required. */
    kf_auth_t *auth;             /* API keys every request is checked against (borrowed;
                                    outlives the gateway); NULL: no checks. /healthz and
                                    /readyz never need a key; /metrics needs metrics:read */
    const char *probe_address;   /* the probe listener, or NULL for none; same certificate, never a
                                    client certificate */
    int connections_per_address; /* 0 = KF_HTTP_CONNECTIONS_PER_ADDRESS_DEFAULT */
    int64_t header_timeout_ms;   /* 0 = KF_HTTP_HEADER_TIMEOUT_MS_DEFAULT */
    int64_t body_timeout_ms;     /* 0 = KF_HTTP_BODY_TIMEOUT_MS_DEFAULT */
    const char *version;         /* the API version GET /openapi.json states
                                    (borrowed for the call); NULL: "unknown" */
} kf_gateway_options_t;

/* Binds; *port receives the bound port. The engine is borrowed. Errors:
 * KF_E_IO (bind), KF_E_INVALID (address), KF_E_INTERNAL (TLS context). */
kf_status_t kf_gateway_create(const kf_gateway_options_t *options, kf_router_t *router,
                              kf_gateway_t **out, int *port, kf_error_t *err) KF_MUST_USE;
/* New TLS material for connections accepted from now on (a SIGHUP reload);
 * open connections keep theirs. Returns once every listener uses it, so a
 * connection accepted after the call never gets the old certificate. Only
 * for a gateway created with TLS. The material is only read here. On error
 * nothing changes. Any thread but the gateway's own loops, before
 * kf_gateway_destroy. */
kf_status_t kf_gateway_set_tls(kf_gateway_t *gateway, const kf_tls_t *tls,
                               kf_error_t *err) KF_MUST_USE;
/* The probe listener's bound port, or 0 when there is none. */
int kf_gateway_probe_port(const kf_gateway_t *gateway);
kf_status_t kf_gateway_start(kf_gateway_t *gateway, kf_error_t *err) KF_MUST_USE;
/* Stops accepting new connections and requests (503 from then on); the
 * probe listener answers until kf_gateway_destroy. */
void kf_gateway_shutdown(kf_gateway_t *gateway);
/* After kf_engine_stop: delivers the last replies, stops the loop, frees. */
void kf_gateway_destroy(kf_gateway_t *gateway);

#endif
