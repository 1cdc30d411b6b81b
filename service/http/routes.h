/*
 * routes.h - the gateway's REST routes: each maps an HTTP method and a path
 * pattern onto one RPC of the RPC table (proto/rpcs.h), named by its gRPC
 * path, like grpc-gateway's HTTP rules. The routes stay here, in the HTTP
 * layer; tests/unit/proto/test_rpc_table.py checks that each names an RPC
 * the gateway serves and fields its request has.
 * Path parameters and query parameters set request fields by name; the body
 * is merged into the whole request ("*", a JSON object) or into one field
 * ("event"; "events" takes a JSON array). Only a route without a body takes
 * a query, its parameters named as the OpenAPI document names them (the
 * route's alias, else the lowerCamelCase name; service/http/README.md).
 *
 *   POST /v1/workflows/{workflow}/keys/{key}/events     SendEvent (body: event)
 *   POST /v1/events:batch                               SendEvents (body: events, a JSON
 *                                                       array of SendEvent requests)
 *   GET  /v1/coordinators/{kind}/{workflow}/{key}       DescribeCoordinator
 *   POST /v1/coordinators/{kind}/{workflow}/{key}:flush FlushWindow
 *   POST /v1/coordinators/{kind}/{workflow}/{key}:cancel CancelWindow
 *   POST /v1/runs:poll                                  PollRuns (body: *)
 *   POST /v1/runs/{run_id}:heartbeat                    HeartbeatRun (body: *)
 *   POST /v1/runs/{run_id}:complete                     CompleteRun (body: *)
 *   GET  /v1/runs/{run_id}                              GetRun
 *   GET  /v1/runs                                       ListRuns (query)
 *   POST /v1/functions                                  RegisterFunction (body: descriptor)
 *   GET  /v1/functions                                  ListFunctions
 *   GET  /v1/functions/{function_id}                    GetFunction
 *   DELETE /v1/functions/{function_id}                  DeleteFunction (?allowMissing=true)
 *   POST /v1/functions/{function_id}/batches            PushBatch (body: *, "rows": [{...}])
 *   DELETE /v1/functions/{function_id}/producers/{producer_id}  DeleteProducer
 *   GET  /v1/functions/{function_id}/output             ReadOutput (?after=&limit=&wait=;
 *                                                       rows as JSON objects by default)
 *   POST /v1/functions/{function_id}/output:trim        TrimOutput (body: *)
 *   GET  /v1/functions/{function_id}/keys/{key}         GetKeyState
 *   POST /v1/keys                                       CreateKey (body: *)
 *   GET  /v1/keys                                       ListKeys
 *   POST /v1/keys/{key_id}:revoke                       RevokeKey (body: *)
 *   POST /v1/{package.Service}/{Method}                 any RPC, body: * (generic)
 *
 * Path segments are percent-decoded after matching, so a key containing '/'
 * travels as %2F. A ":verb" suffix is split at the segment's last ':'.
 */
#ifndef KF_HTTP_ROUTES_H
#define KF_HTTP_ROUTES_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

#include "base/arena.h"
#include "base/status.h"
#include "proto/methods.h"

typedef struct kf_http_request {
    const char *method; /* "GET", "POST", ... (not NUL-terminated) */
    size_t method_len;
    const char *path; /* without the query string */
    size_t path_len;
    const char *query; /* after '?', or NULL */
    size_t query_len;
    const char *body; /* NULL when none */
    size_t body_len;
} kf_http_request_t;

/* Finds the route and builds the request message in the arena.
 * Errors: KF_E_NOT_FOUND (no route: 404), KF_E_UNIMPLEMENTED (path known,
 * method not allowed: mapped to 405 by the caller), KF_E_INVALID (body or
 * parameter does not fit the message, naming the field). `*method` is set
 * (else NULL) as soon as the route names a method, failures included, so the
 * caller can count a refused request of a known method. */
/* Whether the gateway serves the RPC: an ENGINE row that does not stream
 * (the front end's own RPCs, health and tails, are gRPC only). */
bool kf_http_serves(const kf_method_t *m);

/* One REST route (the table is in routes.c). */
typedef struct kf_http_route_def {
    const char *http_method; /* "GET" (also answers HEAD), "POST" or "DELETE" */
    const char *pattern;     /* segments; "{field.path}" captures one */
    const char *verb;        /* ":verb" suffix of the last segment, or NULL */
    const char *rpc;         /* the RPC's gRPC path in proto/rpcs.h */
    const char *body;        /* "*", a field name, or NULL (no body) */
    const char *defaults;    /* "field=value&..." applied before the query, or NULL */
    const char *aliases;     /* "short=field&..." query names, or NULL */
} kf_http_route_def_t;

/* The routes in match order (static; any thread). For the tests that check
 * them against the RPC table. */
const kf_http_route_def_t *kf_http_routes(size_t *count);

/* The RPC a request's method and path name, without looking at its query
 * or body (cheap: the gateway authenticates with it before a worker decodes
 * a large body), or NULL when kf_http_route would refuse the path or
 * method. */
const kf_method_t *kf_http_route_method(const kf_http_request_t *request);

/* The methods the route table accepts on `path` (without the query), as an
 * HTTP Allow header value ("GET, HEAD", "POST"): HEAD wherever GET is.
 * Written into out (cap bytes, always NUL-terminated; empty when no route
 * has that path). What a 405 answer carries. */
#define KF_HTTP_ALLOW_BYTES_MAX 64
void kf_http_allowed(const char *path, size_t path_len, char *out, size_t cap);

kf_status_t kf_http_route(const kf_http_request_t *request, kf_arena_t *arena,
                          const kf_method_t **method, ProtobufCMessage **message,
                          kf_error_t *err) KF_MUST_USE;

#endif
