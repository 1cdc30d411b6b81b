/*
 * cli_runs.c - `keyflow run cancel|wait|release`, and the wait for a run's
 * end that `keyflow send --wait` shares (docs/semantics.md, "Finding runs,
 * and waiting for one").
 *
 * A wait is a loop of GetRun long polls (each up to KF_POLL_WAIT_MS_MAX,
 * capped by what is left of --wait-timeout-ms), so it outlives any one
 * call's deadline and rides out a keyflowd restart (UNAVAILABLE is retried
 * with a pause until the wait's own deadline).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/limits.h"
#include "cli.h"

#define FLAGS(a) a, sizeof a / sizeof a[0]

/* Pause before asking again after a transient error. */
#define WAIT_RETRY_MS 200

static void sleep_ms(int64_t ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static bool finished(Keyflow__V1__RunStatus st) {
    return st == KEYFLOW__V1__RUN_STATUS__RUN_STATUS_COMPLETED ||
           st == KEYFLOW__V1__RUN_STATUS__RUN_STATUS_FAILED ||
           st == KEYFLOW__V1__RUN_STATUS__RUN_STATUS_CANCELLED;
}

static const char *status_name(Keyflow__V1__RunStatus st) {
    const ProtobufCEnumValue *v =
        protobuf_c_enum_descriptor_get_value(&keyflow__v1__run_status__descriptor, (int)st);
    return v != NULL ? v->name + strlen("RUN_STATUS_") : "UNKNOWN";
}

int kf__cli_wait_run(kf__cli_t *cli, const char *run_id, int64_t timeout_ms) {
    int64_t deadline_ms = timeout_ms > 0 ? kf_mono_us() / 1000 + timeout_ms : INT64_MAX;
    Keyflow__V1__Run *run = NULL;
    for (;;) {
        int64_t left_ms =
            deadline_ms == INT64_MAX ? KF_POLL_WAIT_MS_MAX : deadline_ms - kf_mono_us() / 1000;
        if (left_ms <= 0) {
            break;
        }
        Keyflow__V1__GetRunRequest req = KEYFLOW__V1__GET_RUN_REQUEST__INIT;
        req.run_id = (char *)run_id;
        req.wait_ms = left_ms < KF_POLL_WAIT_MS_MAX ? left_ms : KF_POLL_WAIT_MS_MAX;
        kf_error_t err;
        kf_status_t st = kf_client_get_run(cli->client, &req, &cli->arena,
                                           kf__cli_timeout_ms(cli, req.wait_ms), &run, &err);
        if (st == KF_E_UNAVAILABLE || st == KF_E_TIMEOUT) {
            run = NULL;
            sleep_ms(WAIT_RETRY_MS);
            continue;
        }
        if (st != KF_OK) {
            return kf__cli_fail(&err);
        }
        if (finished(run->status)) {
            int rc = kf__cli_print(cli, &run->base);
            if (rc == KF__CLI_EXIT_OK &&
                run->status != KEYFLOW__V1__RUN_STATUS__RUN_STATUS_COMPLETED) {
                fprintf(stderr, "keyflow: run %s ended %s%s%s\n", run_id, status_name(run->status),
                        run->error[0] ? ": " : "", run->error);
                return KF__CLI_EXIT_ERROR;
            }
            return rc;
        }
    }
    if (run != NULL) {
        (void)kf__cli_print(cli, &run->base);
    }
    fprintf(stderr, "keyflow: run %s did not finish within %lld ms%s%s\n", run_id,
            (long long)timeout_ms, run != NULL ? "; it is " : "",
            run != NULL ? status_name(run->status) : "");
    return KF__CLI_EXIT_ERROR;
}

/* ---- run wait ------------------------------------------------------------ */

static const kf__cli_flag_t wait_flags[] = {
    {"--wait-timeout-ms", KF__CLI_VALUE, "N", "give up after N ms (default: wait until it ends)"},
};

int kf__cli_wait_timeout(const kf__cli_args_t *args, int64_t *out) {
    bool present = false;
    *out = 0;
    return kf__cli_int64(args, "--wait-timeout-ms", 1, KF__CLI_TIMEOUT_MS_MAX, &present, out);
}

static int cmd_wait(kf__cli_t *cli, const kf__cli_args_t *args) {
    int64_t timeout_ms;
    int rc = kf__cli_wait_timeout(args, &timeout_ms);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    return kf__cli_wait_run(cli, args->positional[0], timeout_ms);
}

/* ---- run cancel / release ---------------------------------------------- */

static int cmd_cancel(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__CancelRunRequest req = KEYFLOW__V1__CANCEL_RUN_REQUEST__INIT;
    req.run_id = (char *)args->positional[0];
    Keyflow__V1__CancelRunResponse *resp = NULL;
    kf_error_t err;
    if (kf_client_cancel_run(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &resp,
                             &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, &resp->base);
}

static const kf__cli_flag_t release_flags[] = {
    {"--lease", KF__CLI_VALUE, "L", "the lease token poll returned (required)"},
};

static int cmd_release(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__ReleaseRunRequest req = KEYFLOW__V1__RELEASE_RUN_REQUEST__INIT;
    const char *lease = NULL;
    int rc = kf__cli_require(args, "--lease", &lease);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    req.run_id = (char *)args->positional[0];
    req.lease = (char *)lease;
    Keyflow__V1__ReleaseRunResponse *resp = NULL;
    kf_error_t err;
    if (kf_client_release_run(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &resp,
                              &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, &resp->base);
}

static const kf__cli_command_t run_commands[] = {
    {"cancel", "RUN_ID", "cancel a run (a leased one when its worker reports)",
     "A PENDING or DELAYED run is CANCELLED at once. A LEASED one is marked\n"
     "\"cancelRequested\": its worker's next heartbeat says so, and whatever the worker then\n"
     "reports ends the run CANCELLED. Prints {\"run\": {...}}. Needs coordinators:write.",
     NULL, 0, 1, 1, false, cmd_cancel, NULL},
    {"wait", "RUN_ID [--wait-timeout-ms N]", "wait until a run finishes and print it",
     "Waits (GetRun long polls) until the run is COMPLETED, FAILED or CANCELLED and prints\n"
     "it; a receipt's run ID works before its window closes. Exit status 0 when it\n"
     "COMPLETED, 1 when it FAILED, was CANCELLED or did not finish in time.",
     FLAGS(wait_flags), 1, 1, false, cmd_wait, NULL},
    {"release", "RUN_ID --lease L", "give a leased run back (the attempt does not count)",
     "The run is PENDING again at once for any worker. Prints {\"run\": {...}}.",
     FLAGS(release_flags), 1, 1, false, cmd_release, NULL},
};

const kf__cli_command_group_t kf__cli_run_group = {run_commands,
                                                   sizeof run_commands / sizeof run_commands[0]};
