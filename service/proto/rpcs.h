/*
 * rpcs.h - the one table of keyflow's RPCs. Each RPC is one row here; the
 * op enum, the method rows both front ends serve (proto/methods.h), the
 * engine's dispatch (core/core.c) and the front ends' behaviour (unary,
 * long poll, stream) are all expanded from it, so nothing about an RPC is
 * written twice. How to add one: docs/rpcs.md.
 *
 * Two kinds of row:
 *
 *   ENGINE(op, service, method, name, request, response, shape, scope,
 *          resource, module, handler, disk, route)
 *       executed by the engine: a command KF_OP_<op> that core/core.c
 *       hands to `handler(core-><module>, ctx, cmd)`. Shape UNARY or
 *       LONG_POLL (the engine answers each command once).
 *   FRONT(front, service, method, name, request, response, shape, scope,
 *         resource, route)
 *       answered by the front end itself (health, or a stream it drives):
 *       KF_FRONT_<front>, which each front end that serves it handles in a
 *       switch without `default:`. The HTTP gateway serves ENGINE rows only.
 *
 * Columns:
 *   service   full protobuf service name; path = "/" service "/" method
 *   method    the RPC's name in the .proto
 *   name      its name in metrics (keyflow_requests_total{method=...}) and
 *             listings: unique across services
 *   request,  protobuf-c name prefixes of the messages (the generated
 *   response  `<prefix>__descriptor` is what the rows point at)
 *   shape     UNARY          one request, one response
 *             LONG_POLL      unary on the wire, but the request's
 *                            `int64 wait_ms` lets it park in the engine; the
 *                            front end caps the wait at the call's deadline
 *                            and cancels it (kf_engine_cancel) when the
 *                            client leaves
 *             SERVER_STREAM  one request, a stream of responses
 *             BIDI_STREAM    streams both ways
 *   scope     the API-key scope a caller needs (KF_SCOPE_TABLE below)
 *   resource  the request field naming the resource a key's prefix limit
 *             applies to ("workflow", "function_id", or a path through
 *             messages such as "coordinator.workflow"; through a repeated
 *             message, "events.workflow", it names that field of every
 *             element), or NULL
 *
 *   disk      ENGINE rows: whether the command grows the store, which the
 *             engine refuses while the disk reserve is reached
 *             (docs/semantics.md, "Disk space"):
 *             GROWS          it adds records that nothing deletes soon
 *                            (events, batches, functions)
 *             BOUNDED        it reads, moves or deletes what exists (a
 *                            completion rewrites its run, a flush turns a
 *                            window into a run), or adds a bounded handful
 *                            (API keys): it goes on below the reserve, so
 *                            that workers drain, retention frees space and
 *                            an operator can manage the server
 *
 *   route     which partition(s) of the data set a call goes to
 *             (docs/scaling.md; runtime/router.c does it):
 *             BY_COORDINATOR(workflow, key)  the partition of the
 *                            coordinator the two string fields name
 *             BY_RUN_ID(field)   the partition written in the run ID
 *             BY_FUNCTION_KEY(function, key)  the partition of the
 *                            function's key (its text, as GetKeyState takes it)
 *             SPLIT(plan)    the request's items (events, rows) go to their
 *                            own partitions; the answers are put back in order
 *             ALL(plan)      every served partition, the answers combined
 *                            (registration reaches every partition)
 *             MERGE(plan)    partitions in turn behind one cursor
 *             FIRST(plan)    every served partition; the first with
 *                            something to hand out answers (long polls)
 *             HOME()         the process's own store (API keys)
 *             LOCAL()        the process itself, no partition (health)
 *             The fields are dotted paths, like resource; a plan names the
 *             router's code for that RPC (plan_<name> in runtime/router.c).
 *
 * scope and resource are enforced by auth/auth.h (kf_auth_authorize):
 *   - scope: the caller's key holds the row's scope; KF_SCOPE_NONE needs no
 *     key (health).
 *   - resource names a string field or a repeated string field (PollRuns'
 *     "workflows"), possibly in every element of a repeated message
 *     (SendEvents' "events.workflow"): every value must start with the
 *     key's prefix. An empty
 *     value means "all" in the optional filters (ListRuns' workflow,
 *     PollRuns' workflows), so it matches only a key without a prefix: a
 *     prefix-limited key must narrow the filter to its prefix.
 *   - a path through a member of a oneof (Serve's "hello.function_id")
 *     names nothing when the message holds another member (a result sent
 *     before the hello): the request is refused INVALID_ARGUMENT whatever
 *     the key. test_rpc_table.py reports such a path unless its
 *     ONEOF_RESOURCES lists it (after checking its front end ends only that
 *     call on the refusal).
 *   - NULL: the request names no resource (a run id, whose workflow only the
 *     engine knows; a list of everything). The engine checks what the
 *     request resolves to (kf_principal_allows on the run's workflow) or
 *     lists only what the key may see (ListFunctions).
 * tests/unit/proto/test_rpc_table.py checks every row against api/'s .proto
 * files (types, streaming, wait_ms, the resource field's existence).
 */
#ifndef KF_PROTO_RPCS_H
#define KF_PROTO_RPCS_H

#define KF_RPC_TABLE(ENGINE, FRONT)                                                                \
    ENGINE(SEND_EVENT, "keyflow.v1.Coordinators", "SendEvent", "SendEvent",                        \
           keyflow__v1__send_event_request, keyflow__v1__send_event_response, UNARY, EVENTS_SEND,  \
           "workflow", coords, kf_coords_send_event, GROWS, BY_COORDINATOR("workflow", "key"))     \
    ENGINE(SEND_EVENTS, "keyflow.v1.Coordinators", "SendEvents", "SendEvents",                     \
           keyflow__v1__send_events_request, keyflow__v1__send_events_response, UNARY,             \
           EVENTS_SEND, "events.workflow", coords, kf_coords_send_events, GROWS,                   \
           SPLIT(send_events))                                                                     \
    ENGINE(DESCRIBE_COORDINATOR, "keyflow.v1.Coordinators", "DescribeCoordinator",                 \
           "DescribeCoordinator", keyflow__v1__describe_coordinator_request,                       \
           keyflow__v1__describe_coordinator_response, UNARY, COORDINATORS_READ,                   \
           "coordinator.workflow", coords, kf_coords_describe, BOUNDED,                            \
           BY_COORDINATOR("coordinator.workflow", "coordinator.key"))                              \
    ENGINE(FLUSH_WINDOW, "keyflow.v1.Coordinators", "FlushWindow", "FlushWindow",                  \
           keyflow__v1__flush_window_request, keyflow__v1__flush_window_response, UNARY,           \
           COORDINATORS_WRITE, "coordinator.workflow", coords, kf_coords_flush, BOUNDED,           \
           BY_COORDINATOR("coordinator.workflow", "coordinator.key"))                              \
    ENGINE(CANCEL_WINDOW, "keyflow.v1.Coordinators", "CancelWindow", "CancelWindow",               \
           keyflow__v1__cancel_window_request, keyflow__v1__cancel_window_response, UNARY,         \
           COORDINATORS_WRITE, "coordinator.workflow", coords, kf_coords_cancel, BOUNDED,          \
           BY_COORDINATOR("coordinator.workflow", "coordinator.key"))                              \
    ENGINE(POLL_RUNS, "keyflow.v1.Runs", "PollRuns", "PollRuns", keyflow__v1__poll_runs_request,   \
           keyflow__v1__poll_runs_response, LONG_POLL, RUNS_WORK, "workflows", runs, kf_runs_poll, \
           BOUNDED, FIRST(poll_runs))                                                              \
    ENGINE(HEARTBEAT_RUN, "keyflow.v1.Runs", "HeartbeatRun", "HeartbeatRun",                       \
           keyflow__v1__heartbeat_run_request, keyflow__v1__heartbeat_run_response, UNARY,         \
           RUNS_WORK, NULL, runs, kf_runs_heartbeat, BOUNDED, BY_RUN_ID("run_id"))                 \
    ENGINE(COMPLETE_RUN, "keyflow.v1.Runs", "CompleteRun", "CompleteRun",                          \
           keyflow__v1__complete_run_request, keyflow__v1__complete_run_response, UNARY,           \
           RUNS_WORK, NULL, runs, kf_runs_complete, BOUNDED, BY_RUN_ID("run_id"))                  \
    ENGINE(RELEASE_RUN, "keyflow.v1.Runs", "ReleaseRun", "ReleaseRun",                             \
           keyflow__v1__release_run_request, keyflow__v1__release_run_response, UNARY, RUNS_WORK,  \
           NULL, runs, kf_runs_release, BOUNDED, BY_RUN_ID("run_id"))                              \
    ENGINE(GET_RUN, "keyflow.v1.Runs", "GetRun", "GetRun", keyflow__v1__get_run_request,           \
           keyflow__v1__run, LONG_POLL, RUNS_READ, NULL, runs, kf_runs_get, BOUNDED,               \
           BY_RUN_ID("run_id"))                                                                    \
    ENGINE(LIST_RUNS, "keyflow.v1.Runs", "ListRuns", "ListRuns", keyflow__v1__list_runs_request,   \
           keyflow__v1__list_runs_response, UNARY, RUNS_READ, "workflow", runs, kf_runs_list,      \
           BOUNDED, MERGE(list_runs))                                                              \
    /* Cancelling is a control-plane act, like CancelWindow: coordinators:write. */                \
    ENGINE(CANCEL_RUN, "keyflow.v1.Runs", "CancelRun", "CancelRun",                                \
           keyflow__v1__cancel_run_request, keyflow__v1__cancel_run_response, UNARY,               \
           COORDINATORS_WRITE, NULL, runs, kf_runs_cancel, BOUNDED, BY_RUN_ID("run_id"))           \
    ENGINE(REGISTER_FUNCTION, "keyflow.v1.Functions", "RegisterFunction", "RegisterFunction",      \
           keyflow__v1__register_function_request, keyflow__v1__register_function_response, UNARY, \
           FUNCTIONS_ADMIN, "descriptor.function_id", functions, kf_functions_register, GROWS,     \
           ALL(register_function))                                                                 \
    ENGINE(GET_FUNCTION, "keyflow.v1.Functions", "GetFunction", "GetFunction",                     \
           keyflow__v1__get_function_request, keyflow__v1__function_info, UNARY, FUNCTIONS_READ,   \
           "function_id", functions, kf_functions_get, BOUNDED, ALL(get_function))                 \
    ENGINE(LIST_FUNCTIONS, "keyflow.v1.Functions", "ListFunctions", "ListFunctions",               \
           keyflow__v1__list_functions_request, keyflow__v1__list_functions_response, UNARY,       \
           FUNCTIONS_READ, NULL, functions, kf_functions_list, BOUNDED, ALL(list_functions))       \
    ENGINE(PUSH_BATCH, "keyflow.v1.Functions", "PushBatch", "PushBatch",                           \
           keyflow__v1__push_batch_request, keyflow__v1__push_batch_response, UNARY,               \
           FUNCTIONS_PUSH, "function_id", functions, kf_functions_push, GROWS, SPLIT(push_batch))  \
    ENGINE(DRY_RUN_BATCH, "keyflow.v1.Functions", "DryRunBatch", "DryRunBatch",                    \
           keyflow__v1__dry_run_batch_request, keyflow__v1__dry_run_batch_response, UNARY,         \
           FUNCTIONS_PUSH, "function_id", functions, kf_functions_dry_run, BOUNDED,                \
           SPLIT(dry_run_batch))                                                                   \
    ENGINE(REPLAY_BATCH, "keyflow.v1.Functions", "ReplayBatch", "ReplayBatch",                     \
           keyflow__v1__replay_batch_request, keyflow__v1__replay_batch_response, UNARY,           \
           FUNCTIONS_ADMIN, "function_id", functions, kf_functions_replay, BOUNDED,                \
           ALL(replay_batch))                                                                      \
    ENGINE(READ_OUTPUT, "keyflow.v1.Functions", "ReadOutput", "ReadOutput",                        \
           keyflow__v1__read_output_request, keyflow__v1__read_output_response, LONG_POLL,         \
           FUNCTIONS_READ, "function_id", functions, kf_functions_read, BOUNDED,                   \
           MERGE(read_output))                                                                     \
    ENGINE(GET_KEY_STATE, "keyflow.v1.Functions", "GetKeyState", "GetKeyState",                    \
           keyflow__v1__get_key_state_request, keyflow__v1__get_key_state_response, UNARY,         \
           FUNCTIONS_READ, "function_id", functions, kf_functions_key_state, BOUNDED,              \
           BY_FUNCTION_KEY("function_id", "key"))                                                  \
    ENGINE(TRIM_OUTPUT, "keyflow.v1.Functions", "TrimOutput", "TrimOutput",                        \
           keyflow__v1__trim_output_request, keyflow__v1__trim_output_response, UNARY,             \
           FUNCTIONS_READ, "function_id", functions, kf_functions_trim, BOUNDED, ALL(trim_output)) \
    ENGINE(DELETE_FUNCTION, "keyflow.v1.Functions", "DeleteFunction", "DeleteFunction",            \
           keyflow__v1__delete_function_request, keyflow__v1__delete_function_response, UNARY,     \
           FUNCTIONS_ADMIN, "function_id", functions, kf_functions_delete, BOUNDED,                \
           ALL(delete_function))                                                                   \
    ENGINE(DELETE_PRODUCER, "keyflow.v1.Functions", "DeleteProducer", "DeleteProducer",            \
           keyflow__v1__delete_producer_request, keyflow__v1__delete_producer_response, UNARY,     \
           FUNCTIONS_ADMIN, "function_id", functions, kf_functions_delete_producer, BOUNDED,       \
           ALL(delete_producer))                                                                   \
    ENGINE(CREATE_KEY, "keyflow.v1.Keys", "CreateKey", "CreateKey",                                \
           keyflow__v1__create_key_request, keyflow__v1__create_key_response, UNARY, KEYS_ADMIN,   \
           NULL, keys, kf_keys_create_key, BOUNDED, HOME())                                        \
    ENGINE(LIST_KEYS, "keyflow.v1.Keys", "ListKeys", "ListKeys", keyflow__v1__list_keys_request,   \
           keyflow__v1__list_keys_response, UNARY, KEYS_ADMIN, NULL, keys, kf_keys_list, BOUNDED,  \
           HOME())                                                                                 \
    ENGINE(REVOKE_KEY, "keyflow.v1.Keys", "RevokeKey", "RevokeKey",                                \
           keyflow__v1__revoke_key_request, keyflow__v1__revoke_key_response, UNARY, KEYS_ADMIN,   \
           NULL, keys, kf_keys_revoke, BOUNDED, HOME())                                            \
    /* A loop of ReadOutput commands the gRPC front end drives (rpc/grpc_server.c). */             \
    FRONT(TAIL_OUTPUT, "keyflow.v1.Functions", "TailOutput", "TailOutput",                         \
          keyflow__v1__tail_output_request, keyflow__v1__read_output_response, SERVER_STREAM,      \
          FUNCTIONS_READ, "function_id", MERGE(read_output))                                       \
    FRONT(HEALTH_CHECK, "grpc.health.v1.Health", "Check", "HealthCheck",                           \
          grpc__health__v1__health_check_request, grpc__health__v1__health_check_response, UNARY,  \
          NONE, NULL, LOCAL())                                                                     \
    FRONT(HEALTH_WATCH, "grpc.health.v1.Health", "Watch", "HealthWatch",                           \
          grpc__health__v1__health_check_request, grpc__health__v1__health_check_response,         \
          SERVER_STREAM, NONE, NULL, LOCAL())                                                      \
    /* A remote handler's stream (api/keyflow/v1/workers.proto): the gRPC front end relays         \
     * calls and results between the worker and the engine (kf_engine_worker_post). */             \
    FRONT(WORKER_SERVE, "keyflow.v1.Workers", "Serve", "WorkerServe", keyflow__v1__worker_message, \
          keyflow__v1__server_message, BIDI_STREAM, FUNCTIONS_SERVE, "hello.function_id",          \
          ALL(workers))                                                                            \
    /* The process's partitions and the data set's placement (docs/scaling.md),                    \
     * from the router: clients ask it before their first call, so it needs no                     \
     * key (it names what the caller reaches already). */                                          \
    FRONT(PLACEMENT, "keyflow.v1.Partitions", "GetPlacement", "GetPlacement",                      \
          keyflow__v1__get_placement_request, keyflow__v1__placement, UNARY, NONE, NULL, LOCAL())  \
    /* gRPC server reflection, answered from the embedded descriptor set                           \
     * (rpc/reflection.h); v1alpha is the same protocol under its older name. */                   \
    FRONT(REFLECTION_V1, "grpc.reflection.v1.ServerReflection", "ServerReflectionInfo",            \
          "ServerReflectionInfo", grpc__reflection__v1__server_reflection_request,                 \
          grpc__reflection__v1__server_reflection_response, BIDI_STREAM, NONE, NULL, LOCAL())      \
    FRONT(REFLECTION_V1ALPHA, "grpc.reflection.v1alpha.ServerReflection", "ServerReflectionInfo",  \
          "ServerReflectionInfoV1alpha", grpc__reflection__v1alpha__server_reflection_request,     \
          grpc__reflection__v1alpha__server_reflection_response, BIDI_STREAM, NONE, NULL, LOCAL())

/* X(scope, name): the API-key scopes (docs/security.md). metrics:read
 * guards GET /metrics, which is not an RPC. */
#define KF_SCOPE_TABLE(X)                                                                          \
    X(NONE, "none")                                                                                \
    X(EVENTS_SEND, "events:send")                                                                  \
    X(COORDINATORS_READ, "coordinators:read")                                                      \
    X(COORDINATORS_WRITE, "coordinators:write")                                                    \
    X(RUNS_WORK, "runs:work")                                                                      \
    X(RUNS_READ, "runs:read")                                                                      \
    X(FUNCTIONS_ADMIN, "functions:admin")                                                          \
    X(FUNCTIONS_PUSH, "functions:push")                                                            \
    X(FUNCTIONS_READ, "functions:read")                                                            \
    X(FUNCTIONS_SERVE, "functions:serve")                                                          \
    X(METRICS_READ, "metrics:read")                                                                \
    X(KEYS_ADMIN, "keys:admin")

/* For expansions that take one kind of row only. */
#define KF_RPC_IGNORE(...)

#endif
