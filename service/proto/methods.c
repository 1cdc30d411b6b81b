/* methods.c - the method rows, expanded from proto/rpcs.h (see methods.h). */
#include "proto/methods.h"

#include <string.h>

#include "base/assert.h"
#include "grpc/health/v1/health.pb-c.h"
#include "grpc/reflection/v1/reflection.pb-c.h"
#include "grpc/reflection/v1alpha/reflection.pb-c.h"
#include "keyflow/v1/coordinators.pb-c.h"
#include "keyflow/v1/functions.pb-c.h"
#include "keyflow/v1/keys.pb-c.h"
#include "keyflow/v1/partitions.pb-c.h"
#include "keyflow/v1/runs.pb-c.h"
#include "keyflow/v1/workers.pb-c.h"

/* The engine answers each command once: it can only execute what is unary on
 * the wire (a long poll included). */
#define ENGINE_SHAPE_CHECK_(op, svc, meth, label, req, resp, shape, ...)                           \
    _Static_assert(KF_RPC_##shape == KF_RPC_UNARY || KF_RPC_##shape == KF_RPC_LONG_POLL,           \
                   "ENGINE row " #op " must be UNARY or LONG_POLL");
KF_RPC_TABLE(ENGINE_SHAPE_CHECK_, KF_RPC_IGNORE)
#undef ENGINE_SHAPE_CHECK_

/* The route column's words, as data. */
#define BY_COORDINATOR(workflow, key)                                                              \
    { KF_ROUTE_BY_COORDINATOR, {workflow, key}, NULL }
#define BY_RUN_ID(field)                                                                           \
    { KF_ROUTE_BY_RUN_ID, {field, NULL}, NULL }
#define BY_FUNCTION_KEY(function, key)                                                             \
    { KF_ROUTE_BY_FUNCTION_KEY, {function, key}, NULL }
#define SPLIT(plan)                                                                                \
    { KF_ROUTE_SPLIT, {NULL, NULL}, #plan }
#define ALL(plan)                                                                                  \
    { KF_ROUTE_ALL, {NULL, NULL}, #plan }
#define MERGE(plan)                                                                                \
    { KF_ROUTE_MERGE, {NULL, NULL}, #plan }
#define FIRST(plan)                                                                                \
    { KF_ROUTE_FIRST, {NULL, NULL}, #plan }
#define HOME()                                                                                     \
    { KF_ROUTE_HOME, {NULL, NULL}, NULL }
#define LOCAL()                                                                                    \
    { KF_ROUTE_LOCAL, {NULL, NULL}, NULL }

/* The route goes last and variadic: expanded, it holds commas. */
#define ROW_(svc_, meth_, label_, req_, resp_, exec_, shape_, op_, front_, scope_, resource_,      \
             grows_, ...)                                                                          \
    {                                                                                              \
        .path = "/" svc_ "/" meth_, .service = svc_, .name = label_,                               \
        .request = &req_##__descriptor, .response = &resp_##__descriptor, .executor = exec_,       \
        .shape = KF_RPC_##shape_, .op = op_, .front = front_, .scope = KF_SCOPE_##scope_,          \
        .resource = resource_, .grows_store = grows_, .route = __VA_ARGS__,                        \
    }
/* The disk column's words. */
#define DISK_GROWS_   true
#define DISK_BOUNDED_ false
#define ENGINE_ROW_(op, svc, meth, label, req, resp, shape, scope, resource, module, handler,      \
                    disk, route)                                                                   \
    ROW_(svc, meth, label, req, resp, KF_RPC_ENGINE, shape, KF_OP_##op, 0, scope, resource,        \
         DISK_##disk##_, route),
#define FRONT_ROW_(front, svc, meth, label, req, resp, shape, scope, resource, route)              \
    ROW_(svc, meth, label, req, resp, KF_RPC_FRONT_END, shape, 0, KF_FRONT_##front, scope,         \
         resource, false, route),

const kf_method_t kf_methods[KF_METHOD_COUNT] = {KF_RPC_TABLE(ENGINE_ROW_, FRONT_ROW_)};

#undef ROW_
#undef DISK_GROWS_
#undef DISK_BOUNDED_
#undef ENGINE_ROW_
#undef FRONT_ROW_
#undef BY_COORDINATOR
#undef BY_RUN_ID
#undef BY_FUNCTION_KEY
#undef SPLIT
#undef ALL
#undef MERGE
#undef FIRST
#undef HOME
#undef LOCAL

const char *kf_route_kind_name(kf_route_kind_t kind) {
    switch (kind) {
    case KF_ROUTE_LOCAL: return "local";
    case KF_ROUTE_HOME: return "home";
    case KF_ROUTE_BY_COORDINATOR: return "by_coordinator";
    case KF_ROUTE_BY_RUN_ID: return "by_run_id";
    case KF_ROUTE_BY_FUNCTION_KEY: return "by_function_key";
    case KF_ROUTE_SPLIT: return "split";
    case KF_ROUTE_ALL: return "all";
    case KF_ROUTE_MERGE: return "merge";
    case KF_ROUTE_FIRST: return "first";
    }
    KF_UNREACHABLE();
}

const char *kf_method_string_at(const ProtobufCMessage *msg, const char *path) {
    for (;;) {
        const char *dot = strchr(path, '.');
        size_t len = dot != NULL ? (size_t)(dot - path) : strlen(path);
        char name[64];
        KF_ASSERT(len < sizeof name);
        memcpy(name, path, len);
        name[len] = '\0';
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field_by_name(msg->descriptor, name);
        KF_ASSERT(f != NULL && f->label != PROTOBUF_C_LABEL_REPEATED);
        const void *at = (const char *)msg + f->offset;
        if (dot == NULL) {
            KF_ASSERT(f->type == PROTOBUF_C_TYPE_STRING);
            return *(const char *const *)at;
        }
        KF_ASSERT(f->type == PROTOBUF_C_TYPE_MESSAGE);
        msg = *(const ProtobufCMessage *const *)at;
        if (msg == NULL) {
            return NULL;
        }
        path = dot + 1;
    }
}

const kf_method_t *kf_method_by_path(const char *path) {
    for (size_t i = 0; i < KF_METHOD_COUNT; i++) {
        if (strcmp(kf_methods[i].path, path) == 0) {
            return &kf_methods[i];
        }
    }
    return NULL;
}

const kf_method_t *kf_method_by_op(kf_op_t op) {
    for (size_t i = 0; i < KF_METHOD_COUNT; i++) {
        if (kf_methods[i].executor == KF_RPC_ENGINE && kf_methods[i].op == op) {
            return &kf_methods[i];
        }
    }
    KF_UNREACHABLE();
}

bool kf_method_service_known(const char *service) {
    for (size_t i = 0; i < KF_METHOD_COUNT; i++) {
        if (strcmp(kf_methods[i].service, service) == 0) {
            return true;
        }
    }
    return false;
}

bool kf_method_streams(const kf_method_t *m) {
    return m->shape == KF_RPC_SERVER_STREAM || m->shape == KF_RPC_BIDI_STREAM;
}

int64_t *kf_method_wait_ms(const kf_method_t *m, ProtobufCMessage *request) {
    if (m->shape != KF_RPC_LONG_POLL) {
        return NULL;
    }
    KF_ASSERT(request->descriptor == m->request);
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(m->request, "wait_ms");
    /* The table's contract for LONG_POLL rows (test_rpc_table.py checks it
     * against the protos). */
    KF_ASSERT(f != NULL && f->type == PROTOBUF_C_TYPE_INT64 &&
              f->label != PROTOBUF_C_LABEL_REPEATED);
    return (int64_t *)(void *)((char *)request + f->offset);
}

static const char *const op_names[KF_OP_COUNT] = {
#define OP_NAME_(op, ...) "KF_OP_" #op,
    KF_RPC_TABLE(OP_NAME_, KF_RPC_IGNORE)
#undef OP_NAME_
};

const char *kf_op_name(kf_op_t op) {
    KF_ASSERT((unsigned)op < KF_OP_COUNT);
    return op_names[op];
}

static const char *const scope_names[KF_SCOPE_COUNT] = {
#define SCOPE_NAME_(scope, name) name,
    KF_SCOPE_TABLE(SCOPE_NAME_)
#undef SCOPE_NAME_
};

const char *kf_scope_name(kf_scope_t scope) {
    KF_ASSERT((unsigned)scope < KF_SCOPE_COUNT);
    return scope_names[scope];
}

const char *kf_rpc_shape_name(kf_rpc_shape_t shape) {
    switch (shape) {
    case KF_RPC_UNARY: return "unary";
    case KF_RPC_LONG_POLL: return "long_poll";
    case KF_RPC_SERVER_STREAM: return "server_stream";
    case KF_RPC_BIDI_STREAM: return "bidi_stream";
    }
    KF_UNREACHABLE();
}
