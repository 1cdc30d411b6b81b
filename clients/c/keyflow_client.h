/*
 * keyflow_client.h - the C client library of keyflow: one gRPC channel to a
 * keyflowd, a generic unary call, and one typed wrapper per RPC of the
 * Coordinators, Runs and grpc.health.v1.Health services.
 *
 * Threads
 *   A kf_client_t may be used by any number of threads at once: every call
 *   runs on its own completion queue over the client's one shared channel,
 *   and the client holds no other mutable state. kf_client_destroy must not
 *   run while any call on the client is still in progress.
 *
 * Memory
 *   The client is heap-allocated by kf_client_create and owned by the
 *   caller until kf_client_destroy. Requests are borrowed for the duration of
 *   a call only. Responses, and every string, sub-message and array inside
 *   them, are allocated in the arena the caller passes, and stay valid until
 *   that arena is reset or deinitialized. An arena belongs to one thread at a
 *   time: two threads calling at once use two arenas.
 *
 * Errors
 *   Every call returns a kf_status_t and fills a caller-owned kf_error_t.
 *   A non-OK gRPC status becomes the kf_status_t of the same gRPC code (see
 *   kf_client_status_from_grpc) with the server's message copied verbatim
 *   (truncated only past KF_ERROR_MESSAGE_BYTES_MAX). Failures on this side
 *   (a request larger than KF_REQUEST_BYTES_MAX, an undecodable response, an
 *   exhausted arena) get a status and a message of their own that names the
 *   problem. On failure *response is NULL; the arena may hold some bytes of a
 *   partly decoded response, which it frees with everything else.
 *
 * Limits
 *   Requests of at most KF_REQUEST_BYTES_MAX (20 MiB) are sent and responses
 *   of at most KF_RESPONSE_BYTES_MAX (64 MiB) are accepted, the same bounds
 *   the server keeps, set explicitly on the channel rather than trusting
 *   gRPC's 4 MiB default.
 */
#ifndef KF_CLIENT_KEYFLOW_CLIENT_H
#define KF_CLIENT_KEYFLOW_CLIENT_H

#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "base/arena.h"
#include "base/status.h"
#include "grpc/health/v1/health.pb-c.h"
#include "keyflow/v1/coordinators.pb-c.h"
#include "keyflow/v1/runs.pb-c.h"

/* The longest target ("host:port", "dns:///name:port", "unix:/path"). */
#define KF_CLIENT_TARGET_BYTES_MAX 256

/* gRPC method paths, as in service/engine/methods.c. */
#define KF_CLIENT_PATH_SEND_EVENT "/keyflow.v1.Coordinators/SendEvent"
#define KF_CLIENT_PATH_DESCRIBE_COORDINATOR "/keyflow.v1.Coordinators/DescribeCoordinator"
#define KF_CLIENT_PATH_FLUSH_WINDOW "/keyflow.v1.Coordinators/FlushWindow"
#define KF_CLIENT_PATH_CANCEL_WINDOW "/keyflow.v1.Coordinators/CancelWindow"
#define KF_CLIENT_PATH_POLL_RUNS "/keyflow.v1.Runs/PollRuns"
#define KF_CLIENT_PATH_HEARTBEAT_RUN "/keyflow.v1.Runs/HeartbeatRun"
#define KF_CLIENT_PATH_COMPLETE_RUN "/keyflow.v1.Runs/CompleteRun"
#define KF_CLIENT_PATH_GET_RUN "/keyflow.v1.Runs/GetRun"
#define KF_CLIENT_PATH_LIST_RUNS "/keyflow.v1.Runs/ListRuns"
#define KF_CLIENT_PATH_HEALTH_CHECK "/grpc.health.v1.Health/Check"

typedef struct kf_client kf_client_t;

/*
 * Creates a client for `target` ("127.0.0.1:50051"; borrowed, copied).
 * Connecting is lazy: an unreachable server shows up as KF_E_UNAVAILABLE
 * on the first call, not here. Errors: KF_E_INVALID for an empty or
 * too long target, KF_E_NOMEM. Any thread; initializes gRPC (reference
 * counted, so several clients may coexist).
 */
kf_status_t kf_client_create(const char *target, kf_client_t **out, kf_error_t *err) KF_MUST_USE;

/* Closes the channel and frees the client. NULL is a no-op. No call on the
 * client may be in progress. */
void kf_client_destroy(kf_client_t *client);

/* The target the client was created with; valid until destroy. */
const char *kf_client_target(const kf_client_t *client);

/*
 * One unary call of `method_path` ("/keyflow.v1.Coordinators/SendEvent").
 * `request` is packed with protobuf-c and borrowed until return. The reply
 * is unpacked as `response_desc` into `arena` (see Memory above) and stored
 * in *response. `timeout_ms` > 0 sets a deadline that far from now (expiry
 * is KF_E_TIMEOUT); 0 means no deadline. For a long poll, pass more than
 * the poll's wait_ms. Any thread (see Threads above).
 */
kf_status_t kf_client_call(kf_client_t *client, const char *method_path,
                           const ProtobufCMessage *request,
                           const ProtobufCMessageDescriptor *response_desc, kf_arena_t *arena,
                           int64_t timeout_ms, ProtobufCMessage **response,
                           kf_error_t *err) KF_MUST_USE;

/*
 * The kf_status_t for a gRPC status code, the inverse of the server's
 * status -> code table. Codes that several statuses share map to the
 * general one (RESOURCE_EXHAUSTED -> KF_E_LIMIT, INTERNAL -> KF_E_INTERNAL);
 * the two codes keyflowd never sends map to their nearest kin (UNKNOWN ->
 * KF_E_INTERNAL, UNAUTHENTICATED -> KF_E_PERMISSION), as does any code
 * outside 0..16 (KF_E_INTERNAL). So kf_status_grpc_name() of the result
 * gives back the code's name for every code keyflowd sends.
 */
kf_status_t kf_client_status_from_grpc(int grpc_code);

/*
 * Typed wrappers: kf_client_call with the method's path and response type.
 * Same ownership, thread and error rules; *response lives in `arena`.
 */
kf_status_t kf_client_send_event(kf_client_t *client, const Keyflow__V1__SendEventRequest *request,
                                 kf_arena_t *arena, int64_t timeout_ms,
                                 Keyflow__V1__SendEventResponse **response,
                                 kf_error_t *err) KF_MUST_USE;
kf_status_t kf_client_describe_coordinator(kf_client_t *client,
                                           const Keyflow__V1__DescribeCoordinatorRequest *request,
                                           kf_arena_t *arena, int64_t timeout_ms,
                                           Keyflow__V1__DescribeCoordinatorResponse **response,
                                           kf_error_t *err) KF_MUST_USE;
kf_status_t kf_client_flush_window(kf_client_t *client,
                                   const Keyflow__V1__FlushWindowRequest *request,
                                   kf_arena_t *arena, int64_t timeout_ms,
                                   Keyflow__V1__FlushWindowResponse **response,
                                   kf_error_t *err) KF_MUST_USE;
kf_status_t kf_client_cancel_window(kf_client_t *client,
                                    const Keyflow__V1__CancelWindowRequest *request,
                                    kf_arena_t *arena, int64_t timeout_ms,
                                    Keyflow__V1__CancelWindowResponse **response,
                                    kf_error_t *err) KF_MUST_USE;
/* A long poll: give timeout_ms > request->wait_ms, or the deadline cuts the
 * wait short with KF_E_TIMEOUT. */
kf_status_t kf_client_poll_runs(kf_client_t *client, const Keyflow__V1__PollRunsRequest *request,
                                kf_arena_t *arena, int64_t timeout_ms,
                                Keyflow__V1__PollRunsResponse **response,
                                kf_error_t *err) KF_MUST_USE;
kf_status_t kf_client_heartbeat_run(kf_client_t *client,
                                    const Keyflow__V1__HeartbeatRunRequest *request,
                                    kf_arena_t *arena, int64_t timeout_ms,
                                    Keyflow__V1__HeartbeatRunResponse **response,
                                    kf_error_t *err) KF_MUST_USE;
kf_status_t kf_client_complete_run(kf_client_t *client,
                                   const Keyflow__V1__CompleteRunRequest *request,
                                   kf_arena_t *arena, int64_t timeout_ms,
                                   Keyflow__V1__CompleteRunResponse **response,
                                   kf_error_t *err) KF_MUST_USE;
kf_status_t kf_client_get_run(kf_client_t *client, const Keyflow__V1__GetRunRequest *request,
                              kf_arena_t *arena, int64_t timeout_ms, Keyflow__V1__Run **response,
                              kf_error_t *err) KF_MUST_USE;
kf_status_t kf_client_list_runs(kf_client_t *client, const Keyflow__V1__ListRunsRequest *request,
                                kf_arena_t *arena, int64_t timeout_ms,
                                Keyflow__V1__ListRunsResponse **response,
                                kf_error_t *err) KF_MUST_USE;
kf_status_t kf_client_health_check(kf_client_t *client,
                                   const Grpc__Health__V1__HealthCheckRequest *request,
                                   kf_arena_t *arena, int64_t timeout_ms,
                                   Grpc__Health__V1__HealthCheckResponse **response,
                                   kf_error_t *err) KF_MUST_USE;

#endif
