/*
 * methods.h - keyflow's RPCs as data, expanded from the one table in
 * proto/rpcs.h: the engine's op enum, and one kf_method_t per RPC that the
 * gRPC front end, the HTTP gateway and the CLI look methods up in, so all of
 * them expose exactly the same operations with the same request and response
 * messages (one mapping, like grpc-gateway).
 *
 * Front ends derive what they do from a row's flags (executor, shape), never
 * by comparing ops: an ENGINE row becomes a command for the engine, a
 * LONG_POLL row's wait is capped and cancelled when the client leaves, a
 * FRONT row goes to the front end's own switch over kf_front_op_t.
 *
 * The rows are constant and live for the whole process; any thread.
 */
#ifndef KF_PROTO_METHODS_H
#define KF_PROTO_METHODS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "proto/rpcs.h"

/* The commands the engine executes: one per ENGINE row. */
typedef enum kf_op {
#define KF_OP_ENUM_(op, ...) KF_OP_##op,
    KF_RPC_TABLE(KF_OP_ENUM_, KF_RPC_IGNORE)
#undef KF_OP_ENUM_
} kf_op_t;

/* The RPCs a front end answers itself: one per FRONT row. */
typedef enum kf_front_op {
#define KF_FRONT_ENUM_(front, ...) KF_FRONT_##front,
    KF_RPC_TABLE(KF_RPC_IGNORE, KF_FRONT_ENUM_)
#undef KF_FRONT_ENUM_
} kf_front_op_t;

/* Counts outside the enums, so a switch over one needs no `default:` and no
 * case for a sentinel: -Wswitch then names any op a switch forgot. */
#define KF_RPC_ONE_(...) +1
enum {
    KF_OP_COUNT = 0 KF_RPC_TABLE(KF_RPC_ONE_, KF_RPC_IGNORE),
    KF_FRONT_COUNT = 0 KF_RPC_TABLE(KF_RPC_IGNORE, KF_RPC_ONE_),
    KF_METHOD_COUNT = KF_OP_COUNT + KF_FRONT_COUNT,
};
#undef KF_RPC_ONE_

typedef enum kf_rpc_executor {
    KF_RPC_ENGINE,    /* a command for the engine (kf_method_t.op) */
    KF_RPC_FRONT_END, /* answered by the front end (kf_method_t.front) */
} kf_rpc_executor_t;

/* See "shape" in proto/rpcs.h. */
typedef enum kf_rpc_shape {
    KF_RPC_UNARY,
    KF_RPC_LONG_POLL,
    KF_RPC_SERVER_STREAM,
    KF_RPC_BIDI_STREAM,
} kf_rpc_shape_t;

typedef enum kf_scope {
#define KF_SCOPE_ENUM_(scope, name) KF_SCOPE_##scope,
    KF_SCOPE_TABLE(KF_SCOPE_ENUM_)
#undef KF_SCOPE_ENUM_
} kf_scope_t;
#define KF_SCOPE_ONE_(scope, name) +1
enum { KF_SCOPE_COUNT = 0 KF_SCOPE_TABLE(KF_SCOPE_ONE_) };
#undef KF_SCOPE_ONE_

/* See "route" in proto/rpcs.h. */
typedef enum kf_route_kind {
    KF_ROUTE_LOCAL,
    KF_ROUTE_HOME,
    KF_ROUTE_BY_COORDINATOR,
    KF_ROUTE_BY_RUN_ID,
    KF_ROUTE_BY_FUNCTION_KEY,
    KF_ROUTE_SPLIT,
    KF_ROUTE_ALL,
    KF_ROUTE_MERGE,
    KF_ROUTE_FIRST,
} kf_route_kind_t;

typedef struct kf_route {
    kf_route_kind_t kind;
    const char *fields[2]; /* BY_*: the request fields (dotted paths) */
    const char *plan;      /* SPLIT, ALL, MERGE, FIRST: the router's plan */
} kf_route_t;

typedef struct kf_method {
    const char *path;    /* "/keyflow.v1.Coordinators/SendEvent" */
    const char *service; /* "keyflow.v1.Coordinators" */
    const char *name;    /* "SendEvent": metrics label, unique across services */
    const ProtobufCMessageDescriptor *request;
    const ProtobufCMessageDescriptor *response;
    kf_rpc_executor_t executor;
    kf_rpc_shape_t shape;
    kf_op_t op;          /* executor == KF_RPC_ENGINE only */
    kf_front_op_t front; /* executor == KF_RPC_FRONT_END only */
    /* Authorization (auth/auth.h; how it is checked: above the table in
     * proto/rpcs.h). */
    kf_scope_t scope;     /* the scope a caller's key needs */
    const char *resource; /* request field (dotted path) a key's name prefix
                             applies to; NULL: the request names none */
    kf_route_t route;     /* which partitions a call goes to */
    /* An ENGINE row's disk column is GROWS: refused while the disk reserve
     * is reached (core/core.c). */
    bool grows_store;
} kf_method_t;

/* Every row, in table order. */
extern const kf_method_t kf_methods[KF_METHOD_COUNT];

/* NULL when unknown. */
const kf_method_t *kf_method_by_path(const char *path);
/* The ENGINE row of an op; never NULL for a valid op. */
const kf_method_t *kf_method_by_op(kf_op_t op);
/* Whether any RPC belongs to the service ("keyflow.v1.Runs"). */
bool kf_method_service_known(const char *service);
/* A LONG_POLL row's wait: the request's `int64 wait_ms` field, which
 * `request` (a message of m->request) owns. NULL for every other shape. */
int64_t *kf_method_wait_ms(const kf_method_t *m, ProtobufCMessage *request);

/* Whether the RPC streams (SERVER_STREAM, BIDI_STREAM): more than one
 * request or response per call. */
bool kf_method_streams(const kf_method_t *m);

/* The string at a dotted `path` of `msg` (through singular messages), or
 * NULL when a message on the way is absent. The path must name a string
 * field (the table's routes do; tests/unit/proto checks them). */
const char *kf_method_string_at(const ProtobufCMessage *msg, const char *path);
/* "by_coordinator", "split", ... */
const char *kf_route_kind_name(kf_route_kind_t kind);

/* "KF_OP_SEND_EVENT" */
const char *kf_op_name(kf_op_t op);
/* "events:send" */
const char *kf_scope_name(kf_scope_t scope);
/* "unary", "long_poll", "server_stream", "bidi_stream" */
const char *kf_rpc_shape_name(kf_rpc_shape_t shape);

#endif
