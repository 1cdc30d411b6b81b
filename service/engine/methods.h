/*
 * methods.h - the one table of RPC methods, shared by the gRPC front end and
 * the HTTP gateway, so that both expose exactly the same operations with the
 * same request and response messages (one mapping, like grpc-gateway).
 */
#ifndef KF_ENGINE_METHODS_H
#define KF_ENGINE_METHODS_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

#include "engine/engine.h"

typedef enum kf_method_kind {
    KF_METHOD_ENGINE,       /* unary, executed by the engine */
    KF_METHOD_HEALTH_CHECK, /* grpc.health.v1.Health/Check, answered by the front end */
    KF_METHOD_HEALTH_WATCH, /* server streaming health */
    KF_METHOD_TAIL,         /* server streaming: repeated engine reads (op) */
} kf_method_kind_t;

typedef struct kf_method {
    const char *path; /* "/keyflow.v1.Coordinators/SendEvent" */
    const char *name; /* "SendEvent", for metrics */
    kf_method_kind_t kind;
    kf_op_t op; /* KF_METHOD_ENGINE only */
    const ProtobufCMessageDescriptor *request;
    const ProtobufCMessageDescriptor *response;
} kf_method_t;

extern const kf_method_t kf_methods[];
extern const size_t kf_method_count;

/* NULL when unknown. */
const kf_method_t *kf_method_by_path(const char *path);
const kf_method_t *kf_method_by_op(kf_op_t op);

#endif
