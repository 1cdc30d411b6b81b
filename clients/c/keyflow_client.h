/*
 * keyflow_client.h - the C client library of keyflow: one gRPC channel to a
 * keyflowd, a generic unary call, one typed wrapper per unary RPC of the
 * Coordinators, Runs, Functions and grpc.health.v1.Health services, and a
 * server-streaming call (kf_client_stream_t) for Functions/TailOutput.
 *
 * Threads
 *   A kf_client_t may be used by any number of threads at once: every call
 *   runs on its own completion queue over the client's one shared channel,
 *   and the client holds no other mutable state. kf_client_destroy must not
 *   run while any call on the client is still in progress or any stream of
 *   it is still open. A stream has rules of its own (see Streams below).
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
 * Several endpoints
 *   A target "host-a:50051,host-b:50051" names the processes that serve one
 *   data set's partitions together (docs/scaling.md). The client then asks
 *   every endpoint for its placement before its first call and routes each
 *   call by key with the server's hash: a coordinator's, a run's or a
 *   function key's call goes to the endpoint serving its partition;
 *   registration, deletion, descriptions and trims go to every endpoint
 *   (GetFunction's counters summed); ListRuns goes endpoint after endpoint
 *   behind one page token; PollRuns asks each in turn (a long poll waits on
 *   each for at most a second at a time); SendEvents and PushBatch
 *   (columnar or rows_json) are split by the rows' key partitions, one call
 *   per endpoint with the same producer and sequence, a watermark to every
 *   endpoint, the answers summed (lowest watermark, output_ranges per
 *   partition); a row of a partition no endpoint given serves refuses the
 *   whole call with KF_E_NOT_OWNER before anything is sent. DryRunBatch
 *   goes to the one endpoint its rows reach (refused with
 *   KF_E_UNIMPLEMENTED when they, or its watermark, reach several).
 *   ReadOutput reads the endpoints in turn behind one merged cursor (per
 *   partition the furthest position any endpoint answered; a page holds one
 *   partition's rows). TailOutput opens one stream per endpoint and hands
 *   out their pages as they come, each with its partition and the merged
 *   cursor as next_cursor, so a reader resumes from the last page it took;
 *   the first endpoint's stream to end ends it. Other streams are refused
 *   with KF_E_UNIMPLEMENTED.
 *
 * Limits
 *   Requests of at most KF_REQUEST_BYTES_MAX (20 MiB) are sent and responses
 *   of at most KF_RESPONSE_BYTES_MAX (64 MiB) are accepted, the same bounds
 *   the server keeps, set explicitly on the channel rather than trusting
 *   gRPC's 4 MiB default.
 */
#ifndef KF_CLIENT_KEYFLOW_CLIENT_H
#define KF_CLIENT_KEYFLOW_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "base/arena.h"
#include "base/status.h"
#include "grpc/health/v1/health.pb-c.h"
#include "keyflow/v1/coordinators.pb-c.h"
#include "keyflow/v1/functions.pb-c.h"
#include "keyflow/v1/keys.pb-c.h"
#include "keyflow/v1/partitions.pb-c.h"
#include "keyflow/v1/runs.pb-c.h"

/* The longest target ("host:port", "dns:///name:port", "unix:/path"); a
 * list of endpoints may hold KF_CLIENT_ENDPOINTS_MAX of them. */
#define KF_CLIENT_TARGET_BYTES_MAX 256
/* Endpoints of one client: one per process of a data set; more processes
 * than this would each serve very few of the (at most 256) partitions. */
#define KF_CLIENT_ENDPOINTS_MAX 32

/* gRPC method paths, as in the RPC table (service/proto/rpcs.h). */
#define KF_CLIENT_PATH_SEND_EVENT           "/keyflow.v1.Coordinators/SendEvent"
#define KF_CLIENT_PATH_SEND_EVENTS          "/keyflow.v1.Coordinators/SendEvents"
#define KF_CLIENT_PATH_DESCRIBE_COORDINATOR "/keyflow.v1.Coordinators/DescribeCoordinator"
#define KF_CLIENT_PATH_FLUSH_WINDOW         "/keyflow.v1.Coordinators/FlushWindow"
#define KF_CLIENT_PATH_CANCEL_WINDOW        "/keyflow.v1.Coordinators/CancelWindow"
#define KF_CLIENT_PATH_POLL_RUNS            "/keyflow.v1.Runs/PollRuns"
#define KF_CLIENT_PATH_HEARTBEAT_RUN        "/keyflow.v1.Runs/HeartbeatRun"
#define KF_CLIENT_PATH_COMPLETE_RUN         "/keyflow.v1.Runs/CompleteRun"
#define KF_CLIENT_PATH_RELEASE_RUN          "/keyflow.v1.Runs/ReleaseRun"
#define KF_CLIENT_PATH_GET_RUN              "/keyflow.v1.Runs/GetRun"
#define KF_CLIENT_PATH_LIST_RUNS            "/keyflow.v1.Runs/ListRuns"
#define KF_CLIENT_PATH_CANCEL_RUN           "/keyflow.v1.Runs/CancelRun"
#define KF_CLIENT_PATH_REGISTER_FUNCTION    "/keyflow.v1.Functions/RegisterFunction"
#define KF_CLIENT_PATH_GET_FUNCTION         "/keyflow.v1.Functions/GetFunction"
#define KF_CLIENT_PATH_LIST_FUNCTIONS       "/keyflow.v1.Functions/ListFunctions"
#define KF_CLIENT_PATH_PUSH_BATCH           "/keyflow.v1.Functions/PushBatch"
#define KF_CLIENT_PATH_DRY_RUN_BATCH        "/keyflow.v1.Functions/DryRunBatch"
#define KF_CLIENT_PATH_REPLAY_BATCH         "/keyflow.v1.Functions/ReplayBatch"
#define KF_CLIENT_PATH_READ_OUTPUT          "/keyflow.v1.Functions/ReadOutput"
#define KF_CLIENT_PATH_TAIL_OUTPUT          "/keyflow.v1.Functions/TailOutput"
#define KF_CLIENT_PATH_GET_KEY_STATE        "/keyflow.v1.Functions/GetKeyState"
#define KF_CLIENT_PATH_TRIM_OUTPUT          "/keyflow.v1.Functions/TrimOutput"
#define KF_CLIENT_PATH_DELETE_FUNCTION      "/keyflow.v1.Functions/DeleteFunction"
#define KF_CLIENT_PATH_DELETE_PRODUCER      "/keyflow.v1.Functions/DeleteProducer"
#define KF_CLIENT_PATH_HEALTH_CHECK         "/grpc.health.v1.Health/Check"
#define KF_CLIENT_PATH_CREATE_KEY           "/keyflow.v1.Keys/CreateKey"
#define KF_CLIENT_PATH_LIST_KEYS            "/keyflow.v1.Keys/ListKeys"
#define KF_CLIENT_PATH_REVOKE_KEY           "/keyflow.v1.Keys/RevokeKey"
#define KF_CLIENT_PATH_GET_PLACEMENT        "/keyflow.v1.Partitions/GetPlacement"

typedef struct kf_client kf_client_t;

/* The longest API key (keys keyflowd issues are 84 characters). */
#define KF_CLIENT_API_KEY_BYTES_MAX 256

/*
 * How to reach the server. Zeroed means plaintext without a key. Every
 * string is borrowed for the duration of kf_client_create only (files are
 * read there, each at most KF_TLS_PEM_BYTES_MAX bytes).
 */
typedef struct kf_client_options {
    /* TLS is used when `tls` is set or any of the paths below is given. */
    bool tls;
    const char *tls_ca_path;     /* PEM CAs that verify the server; NULL: gRPC's
                                    default roots (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH) */
    const char *tls_cert_path;   /* PEM client certificate for mTLS (with tls_key_path) */
    const char *tls_key_path;    /* its private key */
    const char *tls_server_name; /* the name the server's certificate must carry
                                    when it is not the target's host; NULL: the host */
    /* Sent with every call as "authorization: Bearer <api_key>"; NULL: none.
     * Printable ASCII without spaces, at most KF_CLIENT_API_KEY_BYTES_MAX. */
    const char *api_key;
} kf_client_options_t;

/*
 * Creates a client for `target` ("127.0.0.1:50051", or several endpoints
 * separated by commas: see Several endpoints above; borrowed, copied).
 * Connecting is lazy: an unreachable server (or a failed TLS handshake)
 * shows up as KF_E_UNAVAILABLE on the first call, not here. Errors:
 * KF_E_INVALID for an empty or too long target, an API key that cannot be
 * a header value, or a client certificate without its key (or the other
 * way round); KF_E_IO / KF_E_TOO_LARGE for a TLS file that cannot be read;
 * KF_E_NOMEM. Any thread; initializes gRPC (reference counted, so several
 * clients may coexist). `options` may be NULL (plaintext, no key).
 */
kf_status_t kf_client_create_with(const char *target, const kf_client_options_t *options,
                                  kf_client_t **out, kf_error_t *err) KF_MUST_USE;
/* kf_client_create_with(target, NULL, ...): plaintext, no key. */
kf_status_t kf_client_create(const char *target, kf_client_t **out, kf_error_t *err) KF_MUST_USE;

/* Closes the channel and frees the client. NULL is a no-op. No call on the
 * client may be in progress. */
void kf_client_destroy(kf_client_t *client);

/* The target the client was created with; valid until destroy. */
const char *kf_client_target(const kf_client_t *client);
/* The target's endpoints (1 for a single target) and each one's text. */
size_t kf_client_endpoint_count(const kf_client_t *client);
const char *kf_client_endpoint(const kf_client_t *client, size_t endpoint);
/* keyflow.v1.Partitions/GetPlacement of one endpoint (0-based): the
 * partition count, the partitions it serves with their readiness, the
 * placement's nodes and every RPC's route. Needs no API key. */
kf_status_t kf_client_get_placement(kf_client_t *client, size_t endpoint, kf_arena_t *arena,
                                    int64_t timeout_ms, Keyflow__V1__Placement **response,
                                    kf_error_t *err) KF_MUST_USE;

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
 * UNKNOWN, which keyflowd never sends, maps to KF_E_INTERNAL, as does any
 * code outside 0..16. So kf_status_grpc_name() of the result
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
/* Up to 1000 events; a refused event is an error entry of the response,
 * only a refused call is an error status. */
kf_status_t kf_client_send_events(kf_client_t *client,
                                  const Keyflow__V1__SendEventsRequest *request, kf_arena_t *arena,
                                  int64_t timeout_ms, Keyflow__V1__SendEventsResponse **response,
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
kf_status_t kf_client_release_run(kf_client_t *client,
                                  const Keyflow__V1__ReleaseRunRequest *request, kf_arena_t *arena,
                                  int64_t timeout_ms, Keyflow__V1__ReleaseRunResponse **response,
                                  kf_error_t *err) KF_MUST_USE;
/* With request->wait_ms a long poll, as kf_client_poll_runs. */
kf_status_t kf_client_get_run(kf_client_t *client, const Keyflow__V1__GetRunRequest *request,
                              kf_arena_t *arena, int64_t timeout_ms, Keyflow__V1__Run **response,
                              kf_error_t *err) KF_MUST_USE;
kf_status_t kf_client_cancel_run(kf_client_t *client, const Keyflow__V1__CancelRunRequest *request,
                                 kf_arena_t *arena, int64_t timeout_ms,
                                 Keyflow__V1__CancelRunResponse **response,
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
kf_status_t kf_client_register_function(kf_client_t *client,
                                        const Keyflow__V1__RegisterFunctionRequest *request,
                                        kf_arena_t *arena, int64_t timeout_ms,
                                        Keyflow__V1__RegisterFunctionResponse **response,
                                        kf_error_t *err) KF_MUST_USE;
kf_status_t kf_client_get_function(kf_client_t *client,
                                   const Keyflow__V1__GetFunctionRequest *request,
                                   kf_arena_t *arena, int64_t timeout_ms,
                                   Keyflow__V1__FunctionInfo **response,
                                   kf_error_t *err) KF_MUST_USE;
kf_status_t kf_client_list_functions(kf_client_t *client,
                                     const Keyflow__V1__ListFunctionsRequest *request,
                                     kf_arena_t *arena, int64_t timeout_ms,
                                     Keyflow__V1__ListFunctionsResponse **response,
                                     kf_error_t *err) KF_MUST_USE;
/* Not idempotent in general, but a retry of the same (producer_id,
 * sequence) is answered with the original acknowledgement (duplicate set),
 * so retrying after KF_E_TIMEOUT or KF_E_UNAVAILABLE is safe. */
kf_status_t kf_client_push_batch(kf_client_t *client, const Keyflow__V1__PushBatchRequest *request,
                                 kf_arena_t *arena, int64_t timeout_ms,
                                 Keyflow__V1__PushBatchResponse **response,
                                 kf_error_t *err) KF_MUST_USE;
/* What the batch would do, changing nothing. With several endpoints the
 * batch must stay with one of them (see Several endpoints). */
kf_status_t kf_client_dry_run_batch(kf_client_t *client,
                                    const Keyflow__V1__DryRunBatchRequest *request,
                                    kf_arena_t *arena, int64_t timeout_ms,
                                    Keyflow__V1__DryRunBatchResponse **response,
                                    kf_error_t *err) KF_MUST_USE;
/* A long poll when request->wait_ms > 0: give timeout_ms > wait_ms. */
kf_status_t kf_client_read_output(kf_client_t *client,
                                  const Keyflow__V1__ReadOutputRequest *request, kf_arena_t *arena,
                                  int64_t timeout_ms, Keyflow__V1__ReadOutputResponse **response,
                                  kf_error_t *err) KF_MUST_USE;
kf_status_t kf_client_get_key_state(kf_client_t *client,
                                    const Keyflow__V1__GetKeyStateRequest *request,
                                    kf_arena_t *arena, int64_t timeout_ms,
                                    Keyflow__V1__GetKeyStateResponse **response,
                                    kf_error_t *err) KF_MUST_USE;
/* Idempotent: trimming again to the same or an earlier position changes
 * nothing. */
kf_status_t kf_client_trim_output(kf_client_t *client,
                                  const Keyflow__V1__TrimOutputRequest *request, kf_arena_t *arena,
                                  int64_t timeout_ms, Keyflow__V1__TrimOutputResponse **response,
                                  kf_error_t *err) KF_MUST_USE;
/* With allow_missing set, a retry after a lost reply answers OK (deleted
 * false) instead of NOT_FOUND. */
kf_status_t kf_client_delete_function(kf_client_t *client,
                                      const Keyflow__V1__DeleteFunctionRequest *request,
                                      kf_arena_t *arena, int64_t timeout_ms,
                                      Keyflow__V1__DeleteFunctionResponse **response,
                                      kf_error_t *err) KF_MUST_USE;
kf_status_t kf_client_delete_producer(kf_client_t *client,
                                      const Keyflow__V1__DeleteProducerRequest *request,
                                      kf_arena_t *arena, int64_t timeout_ms,
                                      Keyflow__V1__DeleteProducerResponse **response,
                                      kf_error_t *err) KF_MUST_USE;

/* The Keys service (every call needs a key with keys:admin). The api_key
 * of a CreateKeyResponse is the only copy of the new key's secret. */
kf_status_t kf_client_create_key(kf_client_t *client, const Keyflow__V1__CreateKeyRequest *request,
                                 kf_arena_t *arena, int64_t timeout_ms,
                                 Keyflow__V1__CreateKeyResponse **response,
                                 kf_error_t *err) KF_MUST_USE;
kf_status_t kf_client_list_keys(kf_client_t *client, const Keyflow__V1__ListKeysRequest *request,
                                kf_arena_t *arena, int64_t timeout_ms,
                                Keyflow__V1__ListKeysResponse **response,
                                kf_error_t *err) KF_MUST_USE;
kf_status_t kf_client_revoke_key(kf_client_t *client, const Keyflow__V1__RevokeKeyRequest *request,
                                 kf_arena_t *arena, int64_t timeout_ms,
                                 Keyflow__V1__RevokeKeyResponse **response,
                                 kf_error_t *err) KF_MUST_USE;

/*
 * Streams: one server-streaming call (one request, any number of responses,
 * then a status).
 *
 *   kf_client_stream_open --> kf_client_stream_next ... --> kf_client_stream_close
 *                               | a message  (KF_OK, *response set)
 *                               | nothing within timeout_ms (KF_AGAIN; call again)
 *                               | the end    (KF_OK, *response NULL: the server
 *                               |             finished with OK), or the call's
 *                               |             error status; every later next
 *                               |             returns the same
 *   kf_client_stream_cancel (any thread) ends it early: a next that is
 *   waiting returns KF_E_CANCELLED at once.
 *
 * Threads: a stream is used by one thread at a time (open, next, close);
 * kf_client_stream_cancel alone may be called from another thread while a
 * next is waiting, but never concurrently with or after close. Streams of
 * one client are independent, each on its own completion queue.
 *
 * Memory: the stream is heap-allocated by open and freed by close, which
 * the caller must always call (also after an error or the end). Each
 * response is decoded into the arena passed to that next and lives until
 * the arena is reset, so a long tail can reset its arena between messages.
 * The request is borrowed until open returns.
 *
 * Bounds: one message is received at a time (a next starts the receive of
 * the next message only once the previous one was handed out), and HTTP/2
 * flow control holds the server back while the reader does not call next,
 * so a slow reader costs a flow-control window, not the stream's length.
 * Each message is bounded by KF_RESPONSE_BYTES_MAX like a unary response.
 */
typedef struct kf_client_stream kf_client_stream_t;

/*
 * Starts a server-streaming call of `method_path` with `request` (packed
 * here; see kf_client_call for the size bound). Responses decode as
 * `response_desc`. `timeout_ms` > 0 is a deadline for the whole stream
 * (the stream then ends with KF_E_TIMEOUT); 0 means none. Errors: only
 * local ones (KF_E_TOO_LARGE, KF_E_INTERNAL); the server's answer,
 * including an unknown method or a refused request, comes from the first
 * next. On error *out is NULL and nothing needs closing.
 */
kf_status_t kf_client_stream_open(kf_client_t *client, const char *method_path,
                                  const ProtobufCMessage *request,
                                  const ProtobufCMessageDescriptor *response_desc,
                                  int64_t timeout_ms, kf_client_stream_t **out,
                                  kf_error_t *err) KF_MUST_USE;

/*
 * Waits for the next response, at most `timeout_ms` (> 0), or without a
 * limit but the stream's own deadline (0). Returns KF_OK with *response
 * set (in `arena`); KF_OK with *response NULL when the server ended the
 * stream with OK; KF_AGAIN when timeout_ms passed first (the stream is
 * untouched: the same wait goes on at the next call); otherwise the
 * stream's final error (the server's status and message, KF_E_CANCELLED
 * after kf_client_stream_cancel, or a local decode failure, after which
 * the stream is cancelled). After the end or an error, every call returns
 * the same outcome again.
 */
kf_status_t kf_client_stream_next(kf_client_stream_t *stream, kf_arena_t *arena, int64_t timeout_ms,
                                  ProtobufCMessage **response, kf_error_t *err) KF_MUST_USE;

/* Cancels the call (the server sees the client go away). Idempotent; any
 * thread, between open and close (see Threads above). */
void kf_client_stream_cancel(kf_client_stream_t *stream);

/* Cancels the call if it has not ended, waits for gRPC to release it (which
 * a cancelled call does at once), and frees the stream. NULL is a no-op. */
void kf_client_stream_close(kf_client_stream_t *stream);

/*
 * Functions/TailOutput: pages of output rows after request->after_seq (or
 * request->cursor), one ReadOutputResponse per message as rows are written
 * (the server sends only non-empty pages and never ends the stream on its
 * own, except with an error). With several endpoints the stream follows
 * all of them and each page's next_cursor is the merged cursor (see
 * Several endpoints). Typed kf_client_stream_open / kf_client_stream_next.
 */
kf_status_t kf_client_tail_output(kf_client_t *client,
                                  const Keyflow__V1__TailOutputRequest *request, int64_t timeout_ms,
                                  kf_client_stream_t **out, kf_error_t *err) KF_MUST_USE;
kf_status_t kf_client_tail_output_next(kf_client_stream_t *stream, kf_arena_t *arena,
                                       int64_t timeout_ms,
                                       Keyflow__V1__ReadOutputResponse **response,
                                       kf_error_t *err) KF_MUST_USE;

#endif
