/*
 * grpc_server.h - the gRPC front end (gRPC C core, protobuf-c).
 *
 * Serves every row of the RPC table (proto/rpcs.h, proto/methods.h): ENGINE
 * rows are unpacked on a completion-queue thread into a per-call arena,
 * handed to the engine, and answered from the engine's replier thread once
 * durable. FRONT rows are answered here: the standard grpc.health.v1.Health
 * service without the engine (it is also the no-op baseline of the
 * benchmarks) from base/health.h, Check with the current status and Watch
 * with every change; TailOutput as a loop of engine reads.
 *
 * Request bytes held: gRPC reads a call's request message whole before the
 * call arrives here, and a call keeps it (and its unpacked copy in the
 * call's arena) until it is answered; the engine queues calls by count.
 * The request bytes of calls not yet answered are counted process-wide, and
 * a call that would take them past request_bytes_held_max is refused
 * RESOURCE_EXHAUSTED at once, unless no other call holds any
 * (keyflow_grpc_requests_refused_bytes_total).
 *
 * Only this module includes grpc/. Statuses become gRPC codes through
 * kf_status_grpc_code (one table, base/status.h).
 */
#ifndef KF_RPC_GRPC_SERVER_H
#define KF_RPC_GRPC_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "auth/auth.h"
#include "runtime/router.h"
#include "tls/tls.h"

typedef struct kf_grpc_server kf_grpc_server_t;

typedef struct kf_grpc_options {
    const char *address;            /* "127.0.0.1:0" binds an ephemeral port */
    int threads;                    /* completion-queue threads; 0 = 1 */
    kf_tls_t *tls;                  /* borrowed (a reference is taken); NULL = plaintext.
                                       With a client CA in it, every client must show a
                                       certificate that CA signed (mTLS). */
    kf_auth_t *auth;                /* API keys every call is checked against (borrowed;
                                       must outlive the server); NULL: no checks */
    int64_t request_bytes_held_max; /* request bytes of calls not yet answered,
                                       past which calls are refused
                                       RESOURCE_EXHAUSTED; 0 = the default
                                       (KF_GRPC_REQUEST_BYTES_HELD_DEFAULT) */
} kf_grpc_options_t;

/* Binds the address; *port receives the bound port. The engine is borrowed
 * and must outlive the server. Errors: KF_E_IO (bind failed). */
kf_status_t kf_grpc_server_create(const kf_grpc_options_t *options, kf_router_t *router,
                                  kf_grpc_server_t **out, int *port, kf_error_t *err) KF_MUST_USE;
kf_status_t kf_grpc_server_start(kf_grpc_server_t *server, kf_error_t *err) KF_MUST_USE;
/* New TLS material for connections accepted from now on (a SIGHUP reload);
 * open connections keep the certificate they began with. Only for a server
 * created with TLS, and mTLS stays as it was created (on or off). Takes a
 * reference. Any thread. */
void kf_grpc_server_set_tls(kf_grpc_server_t *server, kf_tls_t *tls);
/* Waits, at most timeout_ms, until every Health/Watch stream has handed its
 * latest status to the transport: before a fail-stop exit, so that watchers
 * hear NOT_SERVING rather than only a dropped connection. Any thread. */
void kf_grpc_server_wait_watches(kf_grpc_server_t *server, int timeout_ms);
/* Stops accepting calls; calls already handed to the engine are answered
 * when the engine finishes them. Call before kf_engine_stop. */
void kf_grpc_server_shutdown(kf_grpc_server_t *server);
/* After kf_engine_stop: waits for every call to finish (cancelling any left
 * after grace_ms), joins the threads and frees everything. */
void kf_grpc_server_destroy(kf_grpc_server_t *server, int grace_ms);

#endif
