/* methods.c - the method table. */
#include "engine/methods.h"

#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "keyflow/v1/coordinators.pb-c.h"
#include "keyflow/v1/functions.pb-c.h"
#include "keyflow/v1/runs.pb-c.h"

#define ENGINE_METHOD(svc, meth, op_, req, resp)                                                   \
    {                                                                                              \
        "/keyflow.v1." svc "/" meth, meth, KF_METHOD_ENGINE, op_, &req##__descriptor,              \
            &resp##__descriptor                                                                    \
    }

const kf_method_t kf_methods[] = {
    ENGINE_METHOD("Coordinators", "SendEvent", KF_OP_SEND_EVENT, keyflow__v1__send_event_request,
                  keyflow__v1__send_event_response),
    ENGINE_METHOD("Coordinators", "DescribeCoordinator", KF_OP_DESCRIBE_COORDINATOR,
                  keyflow__v1__describe_coordinator_request,
                  keyflow__v1__describe_coordinator_response),
    ENGINE_METHOD("Coordinators", "FlushWindow", KF_OP_FLUSH_WINDOW,
                  keyflow__v1__flush_window_request, keyflow__v1__flush_window_response),
    ENGINE_METHOD("Coordinators", "CancelWindow", KF_OP_CANCEL_WINDOW,
                  keyflow__v1__cancel_window_request, keyflow__v1__cancel_window_response),
    ENGINE_METHOD("Runs", "PollRuns", KF_OP_POLL_RUNS, keyflow__v1__poll_runs_request,
                  keyflow__v1__poll_runs_response),
    ENGINE_METHOD("Runs", "HeartbeatRun", KF_OP_HEARTBEAT_RUN, keyflow__v1__heartbeat_run_request,
                  keyflow__v1__heartbeat_run_response),
    ENGINE_METHOD("Runs", "CompleteRun", KF_OP_COMPLETE_RUN, keyflow__v1__complete_run_request,
                  keyflow__v1__complete_run_response),
    ENGINE_METHOD("Runs", "GetRun", KF_OP_GET_RUN, keyflow__v1__get_run_request, keyflow__v1__run),
    ENGINE_METHOD("Runs", "ListRuns", KF_OP_LIST_RUNS, keyflow__v1__list_runs_request,
                  keyflow__v1__list_runs_response),
    ENGINE_METHOD("Functions", "RegisterFunction", KF_OP_REGISTER_FUNCTION,
                  keyflow__v1__register_function_request, keyflow__v1__register_function_response),
    ENGINE_METHOD("Functions", "GetFunction", KF_OP_GET_FUNCTION, keyflow__v1__get_function_request,
                  keyflow__v1__function_info),
    ENGINE_METHOD("Functions", "ListFunctions", KF_OP_LIST_FUNCTIONS,
                  keyflow__v1__list_functions_request, keyflow__v1__list_functions_response),
    ENGINE_METHOD("Functions", "PushBatch", KF_OP_PUSH_BATCH, keyflow__v1__push_batch_request,
                  keyflow__v1__push_batch_response),
    ENGINE_METHOD("Functions", "ReadOutput", KF_OP_READ_OUTPUT, keyflow__v1__read_output_request,
                  keyflow__v1__read_output_response),
    ENGINE_METHOD("Functions", "GetKeyState", KF_OP_GET_KEY_STATE,
                  keyflow__v1__get_key_state_request, keyflow__v1__get_key_state_response),
    {"/keyflow.v1.Functions/TailOutput", "TailOutput", KF_METHOD_TAIL, KF_OP_READ_OUTPUT,
     &keyflow__v1__tail_output_request__descriptor, &keyflow__v1__read_output_response__descriptor},
    {"/grpc.health.v1.Health/Check", "HealthCheck", KF_METHOD_HEALTH_CHECK, 0,
     &grpc__health__v1__health_check_request__descriptor,
     &grpc__health__v1__health_check_response__descriptor},
    {"/grpc.health.v1.Health/Watch", "HealthWatch", KF_METHOD_HEALTH_WATCH, 0,
     &grpc__health__v1__health_check_request__descriptor,
     &grpc__health__v1__health_check_response__descriptor},
};

const size_t kf_method_count = sizeof kf_methods / sizeof kf_methods[0];

const kf_method_t *kf_method_by_path(const char *path) {
    for (size_t i = 0; i < kf_method_count; i++) {
        if (strcmp(kf_methods[i].path, path) == 0) {
            return &kf_methods[i];
        }
    }
    return NULL;
}

const kf_method_t *kf_method_by_op(kf_op_t op) {
    for (size_t i = 0; i < kf_method_count; i++) {
        if (kf_methods[i].kind == KF_METHOD_ENGINE && kf_methods[i].op == op) {
            return &kf_methods[i];
        }
    }
    return NULL;
}
