/*
 * keyflow.c - the `keyflow` command-line client: one command per RPC of
 * the Coordinators, Runs and Health services, `functions ...` subcommands
 * for the Functions service (cli_functions.c), a generic `call`, and a
 * worker loop (`work`, in cli_work.c), all over the C client library.
 *
 * Invariants
 *   1. Output: every response is printed by kf__cli_print (cli_output.c):
 *      one JSON document on one line of stdout, rendered by the gateway's
 *      mapping (so the CLI and `curl` against the HTTP gateway print the
 *      same shapes) plus empty lists as [], or, on a terminal or with
 *      --output table, the same data as aligned tables.
 *   2. Errors: an RPC error prints "keyflow: <GRPC_CODE_NAME>: <message>"
 *      with the server's message unchanged and exits 1; a usage error names
 *      the flag or argument at fault and exits 2; nothing is sent then.
 *   3. Requests carry only what the user gave: a rule field is set (its
 *      oneof case chosen) only when its flag is present, so the server's
 *      defaults and the server's validation apply, in one place. The CLI
 *      checks syntax (integers, enum words, which flags go together) only.
 *   4. All memory of one invocation lives in one arena, plus input buffers
 *      read from files, which are freed before the command returns.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/limits.h"
#include "base/version.h"
#include "cli.h"
#include "proto/methods.h"
#include "proto/json_map.h"

#define DEFAULT_ADDR "127.0.0.1:50051"

typedef kf__cli_command_t command_t;

/* "functions push": a subcommand's full name, for messages and help. */
#define COMMAND_NAME_BYTES_MAX 64

/* ---- output ------------------------------------------------------------ */

int kf__cli_fail(const kf_error_t *err) {
    fprintf(stderr, "keyflow: %s: %s\n", kf_status_grpc_name(err->status), err->message);
    return KF__CLI_EXIT_ERROR;
}

int64_t kf__cli_timeout_ms(const kf__cli_t *cli, int64_t wait_ms) {
    if (cli->timeout_set) {
        return cli->timeout_ms;
    }
    /* The server caps a long poll at KF_POLL_WAIT_MS_MAX (and refuses more),
     * so a larger wait never needs a longer deadline. */
    if (wait_ms < 0) {
        wait_ms = 0;
    }
    if (wait_ms > KF_POLL_WAIT_MS_MAX) {
        wait_ms = KF_POLL_WAIT_MS_MAX;
    }
    return KF__CLI_TIMEOUT_MS_DEFAULT + wait_ms;
}

/* ---- shared request pieces --------------------------------------------- */

static int parse_kind(const kf__cli_args_t *args, Keyflow__V1__RuleKind *out) {
    const char *text = NULL;
    int rc = kf__cli_require(args, "--kind", &text);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    if (strcasecmp(text, "debounce") == 0) {
        *out = KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE;
    } else if (strcasecmp(text, "batch") == 0) {
        *out = KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH;
    } else {
        return kf__cli_usage_error(args->command, "--kind: expected debounce or batch, got \"%s\"",
                                   text);
    }
    return KF__CLI_EXIT_OK;
}

/* ---- send -------------------------------------------------------------- */

static const kf__cli_flag_t send_flags[] = {
    {"--workflow", KF__CLI_VALUE, "W", "workflow the window's run belongs to (required)"},
    {"--key", KF__CLI_VALUE, "K", "coordinator key (required)"},
    {"--id", KF__CLI_VALUE, "ID", "event ID: a retry with the same ID gets the first receipt"},
    {"--debounce", KF__CLI_SWITCH, NULL, "debounce rule (one of --debounce, --batch)"},
    {"--batch", KF__CLI_SWITCH, NULL, "batch rule (one of --debounce, --batch)"},
    {"--window-ms", KF__CLI_VALUE, "N", "debounce: quiet time after the latest event"},
    {"--max-wait-ms", KF__CLI_VALUE, "N",
     "longest a window stays open (debounce default 0 = unbounded, batch 1000)"},
    {"--max-events", KF__CLI_VALUE, "N", "batch: events that fill a window (default 100)"},
    {"--max-bytes", KF__CLI_VALUE, "N",
     "batch: bytes of the run's input array that fill a window (default and at most 4194304)"},
    {"--edge", KF__CLI_VALUE, "trailing|leading|both",
     "debounce: which edge of the window starts a run (default trailing)"},
    {"--dedup-ms", KF__CLI_VALUE, "N", "how long the event ID is remembered (default 600000)"},
    {"--flush", KF__CLI_SWITCH, NULL, "close the window with this event in it"},
    {"--input", KF__CLI_VALUE, "JSON", "the event's input, any JSON value"},
    {"--input-file", KF__CLI_VALUE, "F", "read the input from file F ('-' for stdin)"},
    {"--key-concurrency", KF__CLI_VALUE, "N", "the run: leased runs of the key at once (0 = any)"},
    {"--start-after-ms", KF__CLI_VALUE, "N", "the run: DELAYED this long after the window closes"},
    {"--retry-max-attempts", KF__CLI_VALUE, "N", "the run: attempts in all (retry policy)"},
    {"--retry-initial-backoff-ms", KF__CLI_VALUE, "N",
     "the run: first retry's wait (default 1000)"},
    {"--retry-max-backoff-ms", KF__CLI_VALUE, "N", "the run: longest wait (default 60000)"},
    {"--retry-multiplier", KF__CLI_VALUE, "X", "the run: wait growth per attempt (default 2)"},
    {"--wait", KF__CLI_SWITCH, NULL, "then wait until the run finishes and print it"},
    {"--wait-timeout-ms", KF__CLI_VALUE, "N", "with --wait: give up after N ms (default: never)"},
};

static int parse_edge(const kf__cli_args_t *args, Keyflow__V1__Edge *out) {
    const char *text = kf__cli_value(args, "--edge");
    if (text == NULL) {
        return KF__CLI_EXIT_OK;
    }
    if (strcasecmp(text, "trailing") == 0) {
        *out = KEYFLOW__V1__EDGE__EDGE_TRAILING;
    } else if (strcasecmp(text, "leading") == 0) {
        *out = KEYFLOW__V1__EDGE__EDGE_LEADING;
    } else if (strcasecmp(text, "both") == 0) {
        *out = KEYFLOW__V1__EDGE__EDGE_BOTH;
    } else {
        return kf__cli_usage_error(args->command,
                                   "--edge: expected trailing, leading or both, got \"%s\"", text);
    }
    return KF__CLI_EXIT_OK;
}

/* The rule's run options (--key-concurrency, --start-after-ms, --retry-*):
 * only those given are sent; any --retry-* flag sends a retry policy, whose
 * other fields take the server's defaults. */
static int parse_run_options(const kf__cli_args_t *args, Keyflow__V1__Rule *rule,
                             Keyflow__V1__RetryPolicy *retry) {
    bool present = false;
    int64_t v = 0;
    int rc;
    if ((rc = kf__cli_int64(args, "--key-concurrency", INT64_MIN, INT64_MAX, &present, &v)) != 0) {
        return rc;
    }
    rule->key_concurrency = present ? v : 0;
    if ((rc = kf__cli_int64(args, "--start-after-ms", INT64_MIN, INT64_MAX, &present, &v)) != 0) {
        return rc;
    }
    rule->start_after_ms = present ? v : 0;
    bool any = false;
    if ((rc = kf__cli_int64(args, "--retry-max-attempts", INT64_MIN, INT64_MAX, &present,
                            &retry->max_attempts)) != 0) {
        return rc;
    }
    any |= present;
    if ((rc = kf__cli_int64(args, "--retry-initial-backoff-ms", INT64_MIN, INT64_MAX, &present,
                            &retry->initial_backoff_ms)) != 0) {
        return rc;
    }
    if (present) {
        retry->initial_backoff_ms_present_case =
            KEYFLOW__V1__RETRY_POLICY__INITIAL_BACKOFF_MS_PRESENT_INITIAL_BACKOFF_MS;
    }
    any |= present;
    if ((rc = kf__cli_int64(args, "--retry-max-backoff-ms", INT64_MIN, INT64_MAX, &present,
                            &retry->max_backoff_ms)) != 0) {
        return rc;
    }
    any |= present;
    const char *mult = kf__cli_value(args, "--retry-multiplier");
    if (mult != NULL) {
        char *end = NULL;
        errno = 0;
        retry->multiplier = strtod(mult, &end);
        if (errno != 0 || end == mult || *end != '\0') {
            return kf__cli_usage_error(args->command, "--retry-multiplier: not a number: \"%s\"",
                                       mult);
        }
        any = true;
    }
    rule->retry = any ? retry : NULL;
    return KF__CLI_EXIT_OK;
}

static int cmd_send(kf__cli_t *cli, const kf__cli_args_t *args) {
    const char *workflow = NULL;
    const char *key = NULL;
    int rc;
    if ((rc = kf__cli_require(args, "--workflow", &workflow)) != KF__CLI_EXIT_OK ||
        (rc = kf__cli_require(args, "--key", &key)) != KF__CLI_EXIT_OK) {
        return rc;
    }
    bool debounce = kf__cli_has(args, "--debounce");
    bool batch = kf__cli_has(args, "--batch");
    if (debounce == batch) {
        return kf__cli_usage_error(args->command, debounce
                                                      ? "--debounce and --batch exclude each other"
                                                      : "one of --debounce or --batch is required");
    }
    Keyflow__V1__Rule rule = KEYFLOW__V1__RULE__INIT;
    rule.kind = debounce ? KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE
                         : KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH;
    bool present = false;
    int64_t v = 0;
    /* Full int64 range: the server owns the bounds and names them. */
    if ((rc = kf__cli_int64(args, "--window-ms", INT64_MIN, INT64_MAX, &present, &v)) != 0) {
        return rc;
    }
    if (present) {
        rule.window_ms_present_case = KEYFLOW__V1__RULE__WINDOW_MS_PRESENT_WINDOW_MS;
        rule.window_ms = v;
    }
    if ((rc = kf__cli_int64(args, "--max-wait-ms", INT64_MIN, INT64_MAX, &present, &v)) != 0) {
        return rc;
    }
    if (present) {
        rule.max_wait_ms_present_case = KEYFLOW__V1__RULE__MAX_WAIT_MS_PRESENT_MAX_WAIT_MS;
        rule.max_wait_ms = v;
    }
    if ((rc = kf__cli_int64(args, "--max-events", INT64_MIN, INT64_MAX, &present, &v)) != 0) {
        return rc;
    }
    if (present) {
        rule.max_events_present_case = KEYFLOW__V1__RULE__MAX_EVENTS_PRESENT_MAX_EVENTS;
        rule.max_events = v;
    }
    if ((rc = kf__cli_int64(args, "--dedup-ms", INT64_MIN, INT64_MAX, &present, &v)) != 0) {
        return rc;
    }
    if (present) {
        rule.dedup_ms_present_case = KEYFLOW__V1__RULE__DEDUP_MS_PRESENT_DEDUP_MS;
        rule.dedup_ms = v;
    }
    if ((rc = kf__cli_int64(args, "--max-bytes", INT64_MIN, INT64_MAX, &present, &v)) != 0) {
        return rc;
    }
    if (present) {
        rule.max_bytes_present_case = KEYFLOW__V1__RULE__MAX_BYTES_PRESENT_MAX_BYTES;
        rule.max_bytes = v;
    }
    if ((rc = parse_edge(args, &rule.edge)) != KF__CLI_EXIT_OK) {
        return rc;
    }
    Keyflow__V1__RetryPolicy retry = KEYFLOW__V1__RETRY_POLICY__INIT;
    int64_t wait_timeout_ms = 0;
    bool wait = kf__cli_has(args, "--wait");
    if ((rc = parse_run_options(args, &rule, &retry)) != KF__CLI_EXIT_OK ||
        (rc = kf__cli_wait_timeout(args, &wait_timeout_ms)) != KF__CLI_EXIT_OK) {
        return rc;
    }
    if (wait_timeout_ms > 0 && !wait) {
        return kf__cli_usage_error(args->command, "--wait-timeout-ms applies only with --wait");
    }

    const char *input = kf__cli_value(args, "--input");
    const char *input_file = kf__cli_value(args, "--input-file");
    char *input_buf = NULL;
    if (input != NULL && input_file != NULL) {
        return kf__cli_usage_error(args->command, "--input and --input-file exclude each other");
    }
    if (input_file != NULL) {
        size_t len = 0;
        kf_error_t err;
        if (kf__cli_read_path(input_file, KF__CLI_INPUT_BYTES_MAX, &input_buf, &len, &err) !=
            KF_OK) {
            return kf__cli_usage_error(args->command, "--input-file: %s", err.message);
        }
        input = input_buf;
    }

    Keyflow__V1__Event event = KEYFLOW__V1__EVENT__INIT;
    const char *id = kf__cli_value(args, "--id");
    if (id != NULL) {
        event.id = (char *)id;
    }
    event.rule = &rule;
    event.flush = kf__cli_has(args, "--flush");
    if (input != NULL) {
        event.input_json = (char *)input;
    }
    Keyflow__V1__SendEventRequest req = KEYFLOW__V1__SEND_EVENT_REQUEST__INIT;
    req.workflow = (char *)workflow;
    req.key = (char *)key;
    req.event = &event;
    Keyflow__V1__SendEventResponse *resp = NULL;
    kf_error_t err;
    kf_status_t st = kf_client_send_event(cli->client, &req, &cli->arena,
                                          kf__cli_timeout_ms(cli, 0), &resp, &err);
    free(input_buf);
    if (st != KF_OK) {
        return kf__cli_fail(&err);
    }
    rc = kf__cli_print(cli, &resp->base);
    if (rc != KF__CLI_EXIT_OK || !wait) {
        return rc;
    }
    return kf__cli_wait_run(cli, resp->receipt->run_id, wait_timeout_ms);
}

static const kf__cli_flag_t send_many_flags[] = {
    {"--file", KF__CLI_VALUE, "F", "JSON lines to read ('-' or absent: stdin)"},
    {"--workflow", KF__CLI_VALUE, "W", "workflow of the lines that name none"},
    {"--batch-events", KF__CLI_VALUE, "N", "events per SendEvents call (1..1000, default 1000)"},
};

/* ---- describe / flush / cancel ----------------------------------------- */

static const kf__cli_flag_t coordinator_flags[] = {
    {"--kind", KF__CLI_VALUE, "debounce|batch", "which coordinator of the key (required)"},
    {"--workflow", KF__CLI_VALUE, "W", "workflow (required)"},
    {"--key", KF__CLI_VALUE, "K", "key (required)"},
};

static int cmd_coordinator(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__CoordinatorRef ref = KEYFLOW__V1__COORDINATOR_REF__INIT;
    const char *workflow = NULL;
    const char *key = NULL;
    int rc;
    if ((rc = parse_kind(args, &ref.kind)) != KF__CLI_EXIT_OK ||
        (rc = kf__cli_require(args, "--workflow", &workflow)) != KF__CLI_EXIT_OK ||
        (rc = kf__cli_require(args, "--key", &key)) != KF__CLI_EXIT_OK) {
        return rc;
    }
    ref.workflow = (char *)workflow;
    ref.key = (char *)key;
    int64_t timeout_ms = kf__cli_timeout_ms(cli, 0);
    kf_error_t err;
    kf_status_t st;
    const ProtobufCMessage *out = NULL;
    if (strcmp(args->command, "describe") == 0) {
        Keyflow__V1__DescribeCoordinatorRequest req =
            KEYFLOW__V1__DESCRIBE_COORDINATOR_REQUEST__INIT;
        Keyflow__V1__DescribeCoordinatorResponse *resp = NULL;
        req.coordinator = &ref;
        st =
            kf_client_describe_coordinator(cli->client, &req, &cli->arena, timeout_ms, &resp, &err);
        out = resp != NULL ? &resp->base : NULL;
    } else if (strcmp(args->command, "flush") == 0) {
        Keyflow__V1__FlushWindowRequest req = KEYFLOW__V1__FLUSH_WINDOW_REQUEST__INIT;
        Keyflow__V1__FlushWindowResponse *resp = NULL;
        req.coordinator = &ref;
        st = kf_client_flush_window(cli->client, &req, &cli->arena, timeout_ms, &resp, &err);
        out = resp != NULL ? &resp->base : NULL;
    } else {
        KF_ASSERT(strcmp(args->command, "cancel") == 0);
        Keyflow__V1__CancelWindowRequest req = KEYFLOW__V1__CANCEL_WINDOW_REQUEST__INIT;
        Keyflow__V1__CancelWindowResponse *resp = NULL;
        req.coordinator = &ref;
        st = kf_client_cancel_window(cli->client, &req, &cli->arena, timeout_ms, &resp, &err);
        out = resp != NULL ? &resp->base : NULL;
    }
    if (st != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, out);
}

/* ---- poll -------------------------------------------------------------- */

static const kf__cli_flag_t poll_flags[] = {
    {"--worker", KF__CLI_VALUE, "ID", "worker ID the lease is held by (required)"},
    {"--workflow", KF__CLI_LIST, "W", "only runs of workflow W (repeatable; default: any)"},
    {"--lease-ms", KF__CLI_VALUE, "N", "lease length (default 30000)"},
    {"--max-runs", KF__CLI_VALUE, "N", "most runs to lease at once (default 1)"},
    {"--wait-ms", KF__CLI_VALUE, "N", "long poll: wait up to N ms for a run (default 0)"},
};

static int cmd_poll(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__PollRunsRequest req = KEYFLOW__V1__POLL_RUNS_REQUEST__INIT;
    const char *worker = NULL;
    int rc = kf__cli_require(args, "--worker", &worker);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    req.worker_id = (char *)worker;
    const char *workflows[KF__CLI_OCCURRENCES_MAX];
    size_t n = kf__cli_list(args, "--workflow", workflows, KF__CLI_OCCURRENCES_MAX);
    req.n_workflows = n;
    req.workflows = n > 0 ? (char **)workflows : NULL;
    bool present = false;
    if ((rc = kf__cli_int64(args, "--lease-ms", INT64_MIN, INT64_MAX, &present, &req.lease_ms)) !=
            0 ||
        (rc = kf__cli_int64(args, "--max-runs", INT64_MIN, INT64_MAX, &present, &req.max_runs)) !=
            0 ||
        (rc = kf__cli_int64(args, "--wait-ms", INT64_MIN, INT64_MAX, &present, &req.wait_ms)) !=
            0) {
        return rc;
    }
    Keyflow__V1__PollRunsResponse *resp = NULL;
    kf_error_t err;
    if (kf_client_poll_runs(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, req.wait_ms),
                            &resp, &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, &resp->base);
}

/* ---- heartbeat / complete ---------------------------------------------- */

static const kf__cli_flag_t heartbeat_flags[] = {
    {"--lease", KF__CLI_VALUE, "L", "the lease token poll returned (required)"},
    {"--lease-ms", KF__CLI_VALUE, "N", "new lease length (default: the original length)"},
};

static int cmd_heartbeat(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__HeartbeatRunRequest req = KEYFLOW__V1__HEARTBEAT_RUN_REQUEST__INIT;
    const char *lease = NULL;
    int rc = kf__cli_require(args, "--lease", &lease);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    bool present = false;
    rc = kf__cli_int64(args, "--lease-ms", INT64_MIN, INT64_MAX, &present, &req.lease_ms);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    req.run_id = (char *)args->positional[0];
    req.lease = (char *)lease;
    Keyflow__V1__HeartbeatRunResponse *resp = NULL;
    kf_error_t err;
    if (kf_client_heartbeat_run(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &resp,
                                &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, &resp->base);
}

static const kf__cli_flag_t complete_flags[] = {
    {"--lease", KF__CLI_VALUE, "L", "the lease token poll returned (required)"},
    {"--result", KF__CLI_VALUE, "JSON", "success: the run's result, any JSON value"},
    {"--error", KF__CLI_VALUE, "TEXT", "failure: the run becomes FAILED with this error"},
    {"--retryable", KF__CLI_SWITCH, NULL, "with --error: retry under the rule's retry policy"},
};

static int cmd_complete(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__CompleteRunRequest req = KEYFLOW__V1__COMPLETE_RUN_REQUEST__INIT;
    const char *lease = NULL;
    int rc = kf__cli_require(args, "--lease", &lease);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    const char *result = kf__cli_value(args, "--result");
    const char *error = kf__cli_value(args, "--error");
    if ((result == NULL) == (error == NULL)) {
        return kf__cli_usage_error(args->command, result != NULL
                                                      ? "--result and --error exclude each other"
                                                      : "one of --result or --error is required");
    }
    req.run_id = (char *)args->positional[0];
    req.lease = (char *)lease;
    if (result != NULL) {
        req.outcome_case = KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_RESULT_JSON;
        req.result_json = (char *)result;
    } else {
        req.outcome_case = KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_ERROR;
        req.error = (char *)error;
    }
    req.retryable = kf__cli_has(args, "--retryable");
    Keyflow__V1__CompleteRunResponse *resp = NULL;
    kf_error_t err;
    if (kf_client_complete_run(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &resp,
                               &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, &resp->base);
}

/* ---- get / list -------------------------------------------------------- */

static int cmd_get(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__GetRunRequest req = KEYFLOW__V1__GET_RUN_REQUEST__INIT;
    req.run_id = (char *)args->positional[0];
    Keyflow__V1__Run *run = NULL;
    kf_error_t err;
    if (kf_client_get_run(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &run, &err) !=
        KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, &run->base);
}

static const kf__cli_flag_t list_flags[] = {
    {"--workflow", KF__CLI_VALUE, "W", "only runs of workflow W"},
    {"--key", KF__CLI_VALUE, "K", "only runs of key K"},
    {"--status", KF__CLI_VALUE, "pending|leased|delayed|completed|failed|cancelled",
     "only runs in this status"},
    {"--page-size", KF__CLI_VALUE, "N", "runs per page (default 100, at most 1000)"},
    {"--page-token", KF__CLI_VALUE, "T", "continue from a previous page's nextPageToken"},
};

static const struct {
    const char *word;
    Keyflow__V1__RunStatus status;
} run_statuses[] = {
    {"pending", KEYFLOW__V1__RUN_STATUS__RUN_STATUS_PENDING},
    {"leased", KEYFLOW__V1__RUN_STATUS__RUN_STATUS_LEASED},
    {"completed", KEYFLOW__V1__RUN_STATUS__RUN_STATUS_COMPLETED},
    {"failed", KEYFLOW__V1__RUN_STATUS__RUN_STATUS_FAILED},
    {"cancelled", KEYFLOW__V1__RUN_STATUS__RUN_STATUS_CANCELLED},
    {"delayed", KEYFLOW__V1__RUN_STATUS__RUN_STATUS_DELAYED},
};

static int cmd_list(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__ListRunsRequest req = KEYFLOW__V1__LIST_RUNS_REQUEST__INIT;
    const char *workflow = kf__cli_value(args, "--workflow");
    const char *key = kf__cli_value(args, "--key");
    const char *status = kf__cli_value(args, "--status");
    const char *token = kf__cli_value(args, "--page-token");
    if (workflow != NULL) {
        req.workflow = (char *)workflow;
    }
    if (key != NULL) {
        req.key = (char *)key;
    }
    if (token != NULL) {
        req.page_token = (char *)token;
    }
    if (status != NULL) {
        size_t i = 0;
        size_t count = sizeof run_statuses / sizeof run_statuses[0];
        while (i < count && strcasecmp(run_statuses[i].word, status) != 0) {
            i++;
        }
        if (i == count) {
            return kf__cli_usage_error(args->command,
                                       "--status: expected pending, leased, delayed, completed, "
                                       "failed or cancelled, got \"%s\"",
                                       status);
        }
        req.status = run_statuses[i].status;
    }
    bool present = false;
    int rc = kf__cli_int64(args, "--page-size", INT64_MIN, INT64_MAX, &present, &req.page_size);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    Keyflow__V1__ListRunsResponse *resp = NULL;
    kf_error_t err;
    if (kf_client_list_runs(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &resp,
                            &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, &resp->base);
}

/* ---- health ------------------------------------------------------------ */

static const kf__cli_flag_t health_flags[] = {
    {"--service", KF__CLI_VALUE, "NAME", "one service, e.g. keyflow.v1.Runs (default: the server)"},
};

static int cmd_health(kf__cli_t *cli, const kf__cli_args_t *args) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    const char *service = kf__cli_value(args, "--service");
    if (service != NULL) {
        req.service = (char *)service;
    }
    Grpc__Health__V1__HealthCheckResponse *resp = NULL;
    kf_error_t err;
    if (kf_client_health_check(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &resp,
                               &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    int rc = kf__cli_print(cli, &resp->base);
    if (rc == KF__CLI_EXIT_OK &&
        resp->status != GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING) {
        /* A script's `keyflow health && ...` must not go on against a
         * server that answers but is not serving (e.g. shutting down). */
        fprintf(stderr, "keyflow: health: the server is not serving\n");
        return KF__CLI_EXIT_ERROR;
    }
    return rc;
}

/* ---- partitions ----------------------------------------------------------- */

/* Prints each endpoint's placement, then checks the data set as a whole:
 * every partition served by exactly one endpoint given, and ready. */
static int cmd_partitions(kf__cli_t *cli, const kf__cli_args_t *args) {
    (void)args;
    size_t n = kf_client_endpoint_count(cli->client);
    uint32_t count = 0;
    int owner[KF_PARTITION_COUNT_MAX];
    for (size_t p = 0; p < KF_PARTITION_COUNT_MAX; p++) {
        owner[p] = -1;
    }
    int rc = KF__CLI_EXIT_OK;
    for (size_t e = 0; e < n; e++) {
        Keyflow__V1__Placement *placement = NULL;
        kf_error_t err;
        if (kf_client_get_placement(cli->client, e, &cli->arena, kf__cli_timeout_ms(cli, 0),
                                    &placement, &err) != KF_OK) {
            fprintf(stderr, "keyflow: partitions: %s: %s: %s\n", kf_client_endpoint(cli->client, e),
                    kf_status_grpc_name(err.status), err.message);
            rc = KF__CLI_EXIT_ERROR;
            continue;
        }
        int print_rc = kf__cli_print(cli, &placement->base);
        if (print_rc != KF__CLI_EXIT_OK) {
            return print_rc;
        }
        if (count != 0 && (uint32_t)placement->partition_count != count) {
            fprintf(stderr, "keyflow: partitions: %s serves a data set of %d partitions, not %u\n",
                    kf_client_endpoint(cli->client, e), (int)placement->partition_count, count);
            rc = KF__CLI_EXIT_ERROR;
            continue;
        }
        count = (uint32_t)placement->partition_count;
        for (size_t i = 0; i < placement->n_partitions; i++) {
            const Keyflow__V1__PartitionHealth *h = placement->partitions[i];
            if (h->partition < 0 || (uint32_t)h->partition >= count) {
                continue;
            }
            if (owner[h->partition] >= 0) {
                fprintf(stderr,
                        "keyflow: partitions: partition %d is served by both %s and %s (two "
                        "copies of it: docs/scaling.md)\n",
                        (int)h->partition,
                        kf_client_endpoint(cli->client, (size_t)owner[h->partition]),
                        kf_client_endpoint(cli->client, e));
                rc = KF__CLI_EXIT_ERROR;
            }
            owner[h->partition] = (int)e;
            if (!h->ready) {
                fprintf(stderr, "keyflow: partitions: partition %d on %s is not ready: %s\n",
                        (int)h->partition, kf_client_endpoint(cli->client, e), h->reason);
                rc = KF__CLI_EXIT_ERROR;
            }
        }
    }
    for (uint32_t p = 0; p < count; p++) {
        if (owner[p] < 0) {
            fprintf(stderr,
                    "keyflow: partitions: partition %u of %u is served by no endpoint given\n", p,
                    count);
            rc = KF__CLI_EXIT_ERROR;
        }
    }
    return rc;
}

/* ---- work (the loop is in cli_work.c) ---------------------------------- */

static const kf__cli_flag_t work_flags[] = {
    {"--worker", KF__CLI_VALUE, "ID", "worker ID the leases are held by (required)"},
    {"--workflow", KF__CLI_LIST, "W", "take runs of workflow W (required; repeatable)"},
    {"--lease-ms", KF__CLI_VALUE, "N", "lease length (default 30000)"},
    {"--wait-ms", KF__CLI_VALUE, "N", "long-poll wait per poll (default 30000)"},
    {"--once", KF__CLI_SWITCH, NULL, "handle one run, then exit (1 if none arrived)"},
    {"--max-runs", KF__CLI_VALUE, "N", "exit after handling N runs"},
};

/* ---- call -------------------------------------------------------------- */

/* Whether kf_client_call can make the method's call: one request, one
 * response (a long poll is one too). Listed by shape, so a new shape is
 * refused until the client learns it. */
static bool method_is_unary(const kf_method_t *method) {
    return method->shape == KF_RPC_UNARY || method->shape == KF_RPC_LONG_POLL;
}

/* The method a name spells, in any of the forms people copy from other
 * tools: "/keyflow.v1.Runs/GetRun" (the HTTP/2 path), "keyflow.v1.Runs/GetRun"
 * (grpcurl) or "keyflow.v1.Runs.GetRun" (grpcurl, and the fully qualified
 * protobuf name). NULL when none is known. */
static const kf_method_t *method_named(const char *name) {
    char path[KF__CLI_METHOD_NAME_BYTES_MAX];
    const char *bare = name[0] == '/' ? name + 1 : name;
    if (snprintf(path, sizeof path, "/%s", bare) >= (int)sizeof path) {
        return NULL;
    }
    if (strchr(path + 1, '/') == NULL) {
        char *dot = strrchr(path, '.');
        if (dot == NULL) {
            return NULL;
        }
        *dot = '/'; /* service.Method -> service/Method */
    }
    return kf_method_by_path(path);
}

static int cmd_call(kf__cli_t *cli, const kf__cli_args_t *args) {
    const char *path = args->positional[0];
    const kf_method_t *method = method_named(path);
    if (method == NULL) {
        return kf__cli_usage_error(args->command,
                                   "unknown method %s ('keyflow call --help' lists them)", path);
    }
    path = method->path;
    if (!method_is_unary(method)) {
        return kf__cli_usage_error(
            args->command, "%s streams its responses; only unary methods can be called", path);
    }
    char *stdin_buf = NULL;
    const char *json = NULL;
    size_t json_len = 0;
    if (args->positional_count == 2) {
        json = args->positional[1];
        json_len = strlen(json);
    } else {
        kf_error_t read_err;
        if (kf__cli_read_fd(STDIN_FILENO, KF__CLI_INPUT_BYTES_MAX, &stdin_buf, &json_len,
                            &read_err) != KF_OK) {
            return kf__cli_usage_error(args->command, "stdin: %s", read_err.message);
        }
        json = stdin_buf;
    }
    ProtobufCMessage *req = NULL;
    kf_error_t err;
    kf_status_t st = kf_json_to_message(json, json_len, method->request, &cli->arena, &req, &err);
    free(stdin_buf);
    if (st != KF_OK) {
        return kf__cli_usage_error(args->command, "JSON request for %s: %s", path, err.message);
    }
    const int64_t *wait_ms = kf_method_wait_ms(method, req); /* a long poll's wait */
    ProtobufCMessage *resp = NULL;
    if (kf_client_call(cli->client, method->path, req, method->response, &cli->arena,
                       kf__cli_timeout_ms(cli, wait_ms != NULL ? *wait_ms : 0), &resp,
                       &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, resp);
}

/* `keyflow completion bash`, written from the table below. */
static int cmd_completion(kf__cli_t *cli, const kf__cli_args_t *args);

/* ---- the command table ------------------------------------------------- */

#define FLAGS(a) a, sizeof a / sizeof a[0]

static const command_t commands[] = {
    {"send",
     "--workflow W --key K [--id ID] (--debounce --window-ms N [--max-wait-ms N] [--edge E] | "
     "--batch [--max-events N] [--max-wait-ms N] [--max-bytes N]) [--dedup-ms N] [--flush] "
     "[--input JSON | --input-file F] [run options] [--wait [--wait-timeout-ms N]]",
     "send an event to a debounce or batch coordinator",
     "Prints the receipt and what the event did: {\"receipt\": {\"runId\": \"<key>@<uuid>\",\n"
     "\"dueMs\": ..., \"commitSeq\": ...}, \"disposition\": \"DISPOSITION_OPENED\"} (OPENED,\n"
     "JOINED, DUPLICATE: a retry of a known --id, CLOSED: its run started). A known --id\n"
     "with another rule or input is refused (ALREADY_EXISTS).\n"
     "Only the rule flags given are sent; the server applies its defaults to the rest.\n"
     "Run options (--key-concurrency, --start-after-ms, --retry-*) go with the window's run.\n"
     "With --wait, then waits until the run finishes and prints it as a second line, like\n"
     "'keyflow run wait' (exit status 1 unless it COMPLETED).",
     FLAGS(send_flags), 0, 0, false, cmd_send},
    {"send-many", "[--file F] [--workflow W] [--batch-events N]",
     "send many events from JSON lines (SendEvents)",
     "Each non-blank line is one event in the SendEvent request's JSON form, as the HTTP\n"
     "gateway takes it: {\"workflow\": \"w\", \"key\": \"k\", \"event\": {\"id\": \"e-1\",\n"
     "\"rule\": {\"kind\": \"batch\", \"maxEvents\": 10}, \"input\": {...}}}. Every line is\n"
     "checked before anything is sent. Events go in input order, --batch-events per call,\n"
     "each call one durable write. Prints one JSON line per event, in order:\n"
     "{\"response\": {\"receipt\": ..., \"disposition\": ...}} or {\"error\": {\"code\",\n"
     "\"status\", \"message\"}}. Exits 1 when any event was refused.",
     FLAGS(send_many_flags), 0, 0, false, kf__cli_send_many},
    {"describe", "--kind debounce|batch --workflow W --key K",
     "show a coordinator: its open window, remembered IDs and journal", NULL,
     FLAGS(coordinator_flags), 0, 0, false, cmd_coordinator},
    {"flush", "--kind debounce|batch --workflow W --key K",
     "close a coordinator's open window now, starting its run",
     "Prints {\"flushed\": true, \"runId\": ..., \"disposition\": \"DISPOSITION_CLOSED\"}, or\n"
     "{\"disposition\": \"DISPOSITION_NO_WINDOW\"} when no window was open.",
     FLAGS(coordinator_flags), 0, 0, false, cmd_coordinator},
    {"cancel", "--kind debounce|batch --workflow W --key K",
     "drop a coordinator's open window; its run will never exist",
     "Prints {\"cancelled\": true, \"runId\": ..., \"eventsDropped\": ..., \"disposition\":\n"
     "\"DISPOSITION_CANCELLED\"}, or {\"disposition\": \"DISPOSITION_NO_WINDOW\"}.",
     FLAGS(coordinator_flags), 0, 0, false, cmd_coordinator},
    {"poll", "--worker ID [--workflow W ...] [--lease-ms N] [--max-runs N] [--wait-ms N]",
     "lease pending runs (long poll with --wait-ms)",
     "Prints {\"runs\": [...]}, each run with its \"lease\" token for heartbeat and complete\n"
     "({\"runs\": []} when no run was leased).",
     FLAGS(poll_flags), 0, 0, false, cmd_poll},
    {"heartbeat", "RUN_ID --lease L [--lease-ms N]", "extend a run's lease", NULL,
     FLAGS(heartbeat_flags), 1, 1, false, cmd_heartbeat},
    {"complete", "RUN_ID --lease L (--result JSON | --error TEXT [--retryable])",
     "finish a leased run with a result or an error", NULL, FLAGS(complete_flags), 1, 1, false,
     cmd_complete},
    {"get", "RUN_ID", "show one run", NULL, NULL, 0, 1, 1, false, cmd_get},
    {"list",
     "[--workflow W] [--key K] [--status pending|leased|delayed|completed|failed|cancelled] "
     "[--page-size N] "
     "[--page-token T]",
     "list runs, one page at a time", NULL, FLAGS(list_flags), 0, 0, false, cmd_list},
    {"health", "[--service NAME]", "check that the server is serving (grpc.health.v1)",
     "Exits 1 when the server answers but is not SERVING.", FLAGS(health_flags), 0, 0, false,
     cmd_health},
    {"work",
     "--worker ID --workflow W [--lease-ms N] [--wait-ms N] [--once] [--max-runs N] -- CMD "
     "[ARGS...]",
     "run CMD for each run of a workflow (a worker loop)",
     "Long-polls for runs and, for each, runs CMD with the run's input JSON on stdin and\n"
     "KEYFLOW_RUN_ID, KEYFLOW_WORKFLOW and KEYFLOW_KEY in its environment. When CMD exits 0\n"
     "its stdout is the result (as is when it is JSON, else as a JSON string without its\n"
     "trailing newlines); otherwise the run fails with \"exit status N: <last stderr line>\".\n"
     "CMD's stderr is passed through. The lease is renewed every half lease while CMD runs;\n"
     "if the lease is lost, CMD gets SIGTERM and the run is left to its next attempt; if the\n"
     "run is cancelled (keyflow run cancel), CMD gets SIGTERM and its outcome ends it CANCELLED.\n"
     "Prints each finished run as one JSON line. --once handles one run and exits 1 if none\n"
     "arrived within --wait-ms; --max-runs N exits 0 after N runs.",
     FLAGS(work_flags), 0, 0, true, kf__cli_work},
    {"partitions", "", "show which partitions each endpoint serves, and check the data set",
     "Asks every endpoint of --addr (a comma-separated list: the processes of one data\n"
     "set) for its placement and prints one JSON line per endpoint: {\"partitionCount\",\n"
     "\"served\": \"0-3\", \"partitions\": [{\"partition\", \"id\", \"ready\", \"reason\"}],\n"
     "\"nodes\": [...], \"routes\": [...]}. Exits 1, naming the problem on stderr, when an\n"
     "endpoint does not answer, a partition is served by no endpoint given or by two, or\n"
     "a partition is not ready. With several endpoints in --addr every other command\n"
     "routes its call by key (docs/scaling.md).",
     NULL, 0, 0, 0, false, cmd_partitions},
    {"call", "METHOD [JSON]", "call any method with a JSON request (stdin without JSON)",
     "METHOD is written as in the list below, or as grpcurl writes it:\n"
     "keyflow.v1.Runs/GetRun or keyflow.v1.Runs.GetRun.",
     NULL, 0, 1, 2, false, cmd_call},
    {"completion", "bash", "print a shell completion script",
     "Prints a bash completion script for keyflow's commands, flags and their values, and\n"
     "the methods of `call`. Load it in the current shell with\n"
     "  source <(keyflow completion bash)\n"
     "or install it as /usr/share/bash-completion/completions/keyflow (cmake --install does).",
     NULL, 0, 1, 1, false, cmd_completion, NULL, true},
    {"functions", "SUBCOMMAND [FLAGS] [ARGS]",
     "keyed process functions: register, push rows, read and tail output", NULL, NULL, 0, 0, 0,
     false, NULL, &kf__cli_functions_group},
    {"keys", "SUBCOMMAND [FLAGS] [ARGS]", "API keys: create, list, revoke (needs keys:admin)", NULL,
     NULL, 0, 0, 0, false, NULL, &kf__cli_keys_group},
    {"run", "SUBCOMMAND [FLAGS] [ARGS]", "one run: cancel it, wait for its end, release it", NULL,
     NULL, 0, 0, 0, false, NULL, &kf__cli_run_group},
};

static const size_t command_count = sizeof commands / sizeof commands[0];

/* ---- completion ---------------------------------------------------------- */

/* Bash completion, written from the command and flag tables so that it
 * never lags behind them: commands and subcommands, each command's flags
 * and the global ones, the words of a flag whose value is a choice
 * ("debounce|batch"), file names for file flags, and method names for
 * `call`. The function only reads COMP_WORDS/COMP_CWORD and fills
 * COMPREPLY. */

static void print_words(FILE *out, const kf__cli_flag_t *flags, size_t count) {
    for (size_t i = 0; i < count; i++) {
        fprintf(out, " %s", flags[i].name);
    }
}

/* The flags that may be given more than once (KF__CLI_LIST): the script
 * offers them again after they were given; the others only once. */
static void print_repeatable(FILE *out, const kf__cli_flag_t *flags, size_t count) {
    for (size_t i = 0; i < count; i++) {
        if (flags[i].kind == KF__CLI_LIST) {
            fprintf(out, " %s", flags[i].name);
        }
    }
}

/* Flag names already given a case in the script (a flag such as --workflow
 * belongs to several commands and means the same in each). */
#define COMPLETION_FLAGS_MAX 256
typedef struct seen_flags {
    const char *names[COMPLETION_FLAGS_MAX];
    size_t count;
} seen_flags_t;

/* Every flag that takes a value, once, and how its value completes. */
static void print_value_flags(FILE *out, seen_flags_t *seen, const kf__cli_flag_t *flags,
                              size_t count) {
    for (size_t i = 0; i < count; i++) {
        const kf__cli_flag_t *f = &flags[i];
        size_t k = 0;
        while (k < seen->count && strcmp(seen->names[k], f->name) != 0) {
            k++;
        }
        if (f->kind == KF__CLI_SWITCH || k < seen->count) {
            continue;
        }
        KF_ASSERT(seen->count < COMPLETION_FLAGS_MAX);
        seen->names[seen->count++] = f->name;
        if (strchr(f->value_name, '|') != NULL) {
            fprintf(out, "    %s) choices=\"", f->name);
            for (const char *c = f->value_name; *c != '\0'; c++) {
                fputc(*c == '|' ? ' ' : *c, out);
            }
            fprintf(out, "\" ;;\n");
        } else if (strcmp(f->value_name, "F") == 0 || strcmp(f->value_name, "FILE") == 0) {
            fprintf(out, "    %s) choices=@files ;;\n", f->name);
        } else {
            fprintf(out, "    %s) choices=@any ;;\n", f->name);
        }
    }
}

static void print_command_flags(FILE *out, const command_t *cmds, size_t count, const char *group) {
    for (size_t i = 0; i < count; i++) {
        if (cmds[i].group != NULL) {
            print_command_flags(out, cmds[i].group->commands, cmds[i].group->count, cmds[i].name);
            continue;
        }
        fprintf(out, "    \"%s%s%s\") flags=\"", group ? group : "", group ? " " : "",
                cmds[i].name);
        print_words(out, cmds[i].flags, cmds[i].flag_count);
        fprintf(out, "\"; repeats=\"$repeats");
        print_repeatable(out, cmds[i].flags, cmds[i].flag_count);
        fprintf(out, " \" ;;\n");
    }
}

static void print_value_cases(FILE *out, seen_flags_t *seen, const command_t *cmds, size_t count) {
    for (size_t i = 0; i < count; i++) {
        if (cmds[i].group != NULL) {
            print_value_cases(out, seen, cmds[i].group->commands, cmds[i].group->count);
        } else {
            print_value_flags(out, seen, cmds[i].flags, cmds[i].flag_count);
        }
    }
}

static int cmd_completion(kf__cli_t *cli, const kf__cli_args_t *args) {
    (void)cli;
    if (strcmp(args->positional[0], "bash") != 0) {
        return kf__cli_usage_error(args->command, "only bash is supported, got \"%s\"",
                                   args->positional[0]);
    }
    FILE *out = stdout;
    fprintf(out, "# bash completion for keyflow, written by `keyflow completion bash`.\n"
                 "# Load it with: source <(keyflow completion bash)\n"
                 "_keyflow_value() { # FLAG: sets choices to words, @files, @any or nothing\n"
                 "  choices=\n"
                 "  case \"$1\" in\n");
    seen_flags_t seen = {.count = 0};
    print_value_flags(out, &seen, kf__cli_global_flags, kf__cli_global_flag_count);
    print_value_cases(out, &seen, commands, command_count);
    fprintf(out,
            "  esac\n"
            "}\n"
            "_keyflow() {\n"
            "  local cur=${COMP_WORDS[COMP_CWORD]} cmd= i w f choices flags offer given=\" \"\n"
            "  local groups=\" ");
    for (size_t i = 0; i < command_count; i++) {
        if (commands[i].group != NULL) {
            fprintf(out, "%s ", commands[i].name);
        }
    }
    fprintf(out, "\"\n"
                 "  COMPREPLY=()\n"
                 "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
                 "    w=${COMP_WORDS[i]}\n"
                 "    case \"$w\" in\n"
                 "      --) return ;;\n"
                 "      -*) given=\"$given${w%%%%=*} \"\n"
                 "          _keyflow_value \"$w\"; [ -n \"$choices\" ] && ((i++)) ;;\n"
                 "      *) if [ -z \"$cmd\" ]; then cmd=$w\n"
                 "         elif [[ $groups == *\" $cmd \"* ]]; then cmd=\"$cmd $w\"\n"
                 "         fi ;;\n"
                 "    esac\n"
                 "  done\n"
                 "  if ((COMP_CWORD > 1)); then\n"
                 "    _keyflow_value \"${COMP_WORDS[COMP_CWORD - 1]}\"\n"
                 "    case \"$choices\" in\n"
                 "      '') ;;\n"
                 "      @files) COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n"
                 "      @any) return ;;\n"
                 "      *) COMPREPLY=($(compgen -W \"$choices\" -- \"$cur\")); return ;;\n"
                 "    esac\n"
                 "  fi\n"
                 "  local globals=\"");
    print_words(out, kf__cli_global_flags, kf__cli_global_flag_count);
    fprintf(out, " --help --version\"\n"
                 "  local repeats=\"");
    print_repeatable(out, kf__cli_global_flags, kf__cli_global_flag_count);
    fprintf(out, " \"\n"
                 "  if [ -z \"$cmd\" ]; then\n"
                 "    if [[ $cur == -* ]]; then flags=\n"
                 "    else COMPREPLY=($(compgen -W \"");
    for (size_t i = 0; i < command_count; i++) {
        fprintf(out, "%s%s", i > 0 ? " " : "", commands[i].name);
    }
    fprintf(out, " help\" -- \"$cur\")); return; fi\n"
                 "  else\n"
                 "  case \"$cmd\" in\n");
    for (size_t i = 0; i < command_count; i++) {
        if (commands[i].group != NULL) {
            fprintf(out, "    \"%s\") COMPREPLY=($(compgen -W \"", commands[i].name);
            for (size_t k = 0; k < commands[i].group->count; k++) {
                fprintf(out, "%s%s", k > 0 ? " " : "", commands[i].group->commands[k].name);
            }
            fprintf(out, "\" -- \"$cur\")); return ;;\n");
        }
    }
    fprintf(out, "  esac\n"
                 "  flags=\n"
                 "  case \"$cmd\" in\n");
    print_command_flags(out, commands, command_count, NULL);
    fprintf(out,
            "  esac\n"
            "  fi\n"
            "  if [[ $cur == -* ]]; then\n"
            "    offer=\n" /* a flag given already only if it repeats */
            "    for f in $flags $globals; do\n"
            "      [[ $given == *\" $f \"* && $repeats != *\" $f \"* ]] || offer=\"$offer $f\"\n"
            "    done\n"
            "    COMPREPLY=($(compgen -W \"$offer\" -- \"$cur\"))\n"
            "  elif [ \"$cmd\" = completion ]; then\n"
            "    COMPREPLY=($(compgen -W \"bash\" -- \"$cur\"))\n"
            "  elif [ \"$cmd\" = call ]; then\n"
            "    COMPREPLY=($(compgen -W \"");
    bool first = true;
    for (size_t i = 0; i < KF_METHOD_COUNT; i++) {
        if (method_is_unary(&kf_methods[i])) {
            fprintf(out, "%s%s", first ? "" : " ", kf_methods[i].path + 1);
            first = false;
        }
    }
    fprintf(out, "\" -- \"$cur\"))\n"
                 "  elif [ \"$cmd\" = \"functions register\" ]; then\n"
                 "    COMPREPLY=($(compgen -f -- \"$cur\"))\n"
                 "  fi\n"
                 "}\n"
                 "complete -o default -F _keyflow keyflow\n");
    return fflush(out) == 0 ? KF__CLI_EXIT_OK : KF__CLI_EXIT_ERROR;
}

static const command_t *find_command(const command_t *table, size_t count, const char *name) {
    for (size_t i = 0; i < count; i++) {
        if (strcmp(table[i].name, name) == 0) {
            return &table[i];
        }
    }
    return NULL;
}

/* ---- help -------------------------------------------------------------- */

static void print_flags(FILE *out, const kf__cli_flag_t *flags, size_t count) {
    for (size_t i = 0; i < count; i++) {
        char left[64];
        snprintf(left, sizeof left, "%s%s%s", flags[i].name, flags[i].value_name ? " " : "",
                 flags[i].value_name ? flags[i].value_name : "");
        fprintf(out, "  %-24s %s\n", left, flags[i].help);
    }
}

static void print_main_help(FILE *out) {
    fprintf(out, "Usage: keyflow [GLOBAL FLAGS] COMMAND [FLAGS] [ARGS]\n"
                 "       keyflow --version\n"
                 "\n"
                 "The command-line client of keyflowd. Each response is printed on stdout as a\n"
                 "table on a terminal, else as one line of JSON (--output json|table chooses);\n"
                 "an error as \"keyflow: <GRPC_CODE>: <message>\" on stderr.\n"
                 "Exit status: 0 success, 1 an RPC or run-time error, 2 a usage error.\n"
                 "\n"
                 "Commands:\n");
    for (size_t i = 0; i < command_count; i++) {
        fprintf(out, "  %-11s %s\n", commands[i].name, commands[i].summary);
    }
    fprintf(out, "  %-11s %s\n", "help", "this help; 'keyflow COMMAND --help': a command's flags");
    fprintf(out, "\nGlobal flags (before or after the command):\n");
    print_flags(out, kf__cli_global_flags, kf__cli_global_flag_count);
    fprintf(out, "\nRun 'keyflow COMMAND --help' for a command's flags.\n");
}

/* `keyflow GROUP --help`: the subcommands of a group. */
static void print_group_help(FILE *out, const command_t *cmd) {
    KF_ASSERT(cmd->group != NULL);
    fprintf(out, "Usage: keyflow %s %s\n\n%s.\n\nSubcommands:\n", cmd->name, cmd->synopsis,
            cmd->summary);
    int width = 8; /* the longest subcommand's name aligns the summaries */
    for (size_t i = 0; i < cmd->group->count; i++) {
        int len = (int)strlen(cmd->group->commands[i].name);
        width = len > width ? len : width;
    }
    for (size_t i = 0; i < cmd->group->count; i++) {
        fprintf(out, "  %-*s %s\n", width, cmd->group->commands[i].name,
                cmd->group->commands[i].summary);
    }
    fprintf(out, "\nRun 'keyflow %s SUBCOMMAND --help' for a subcommand's flags.\n", cmd->name);
}

/* `name` is the command's full name ("send", "functions push"). */
static void print_command_help(FILE *out, const command_t *cmd, const char *name) {
    fprintf(out, "Usage: keyflow %s %s\n\n%s.\n", name, cmd->synopsis, cmd->summary);
    if (cmd->details != NULL) {
        fprintf(out, "\n%s\n", cmd->details);
    }
    if (cmd->run == cmd_call) {
        fprintf(out, "\nMethods:\n");
        for (size_t i = 0; i < KF_METHOD_COUNT; i++) {
            if (method_is_unary(&kf_methods[i])) {
                fprintf(out, "  %-46s %s -> %s\n", kf_methods[i].path,
                        kf_methods[i].request->short_name, kf_methods[i].response->short_name);
            }
        }
    }
    if (cmd->flag_count > 0) {
        fprintf(out, "\nFlags:\n");
        print_flags(out, cmd->flags, cmd->flag_count);
    }
    fprintf(out, "\nGlobal flags:\n");
    print_flags(out, kf__cli_global_flags, kf__cli_global_flag_count);
}

/* ---- main -------------------------------------------------------------- */

static bool is_global_flag_word(const char *word, bool *takes_next) {
    for (size_t i = 0; i < kf__cli_global_flag_count; i++) {
        size_t n = strlen(kf__cli_global_flags[i].name);
        if (strncmp(word, kf__cli_global_flags[i].name, n) == 0 &&
            (word[n] == '\0' || word[n] == '=')) {
            *takes_next = word[n] == '\0' && kf__cli_global_flags[i].kind != KF__CLI_SWITCH;
            return true;
        }
    }
    return false;
}

/* A flag's value, else the environment variable's (empty counts as unset). */
static const char *flag_or_env(const kf__cli_args_t *args, const char *flag, const char *env) {
    const char *v = kf__cli_value(args, flag);
    if (v == NULL) {
        v = getenv(env);
    }
    return v != NULL && v[0] != '\0' ? v : NULL;
}

/* The API key: --api-key-file, $KEYFLOW_API_KEY_FILE or $KEYFLOW_API_KEY
 * (never a flag with the key itself: command lines show up in ps). The
 * file may end with a newline. *key points into *buffer or the
 * environment; the caller frees *buffer. */
static int api_key(const kf__cli_args_t *args, char **buffer, const char **key) {
    *buffer = NULL;
    *key = NULL;
    const char *path = flag_or_env(args, "--api-key-file", "KEYFLOW_API_KEY_FILE");
    if (path == NULL) {
        *key = flag_or_env(args, "--api-key-file", "KEYFLOW_API_KEY");
        return KF__CLI_EXIT_OK;
    }
    size_t len = 0;
    kf_error_t err;
    if (kf__cli_read_path(path, KF_CLIENT_API_KEY_BYTES_MAX + 2, buffer, &len, &err) != KF_OK) {
        return kf__cli_usage_error(args->command, "--api-key-file: %s", err.message);
    }
    while (len > 0 && ((*buffer)[len - 1] == '\n' || (*buffer)[len - 1] == '\r')) {
        (*buffer)[--len] = '\0';
    }
    *key = *buffer;
    return KF__CLI_EXIT_OK;
}

/* Runs one parsed command: resolves the address and deadline, connects,
 * runs, disconnects. args->command is its full name. */
static int run_command(const command_t *cmd, const kf__cli_args_t *args) {
    const char *name = args->command;
    if (args->positional_count < cmd->positional_min) {
        return kf__cli_usage_error(name, "missing argument (usage: keyflow %s %s)", name,
                                   cmd->synopsis);
    }
    if (args->positional_count > cmd->positional_max) {
        return kf__cli_usage_error(name, "unexpected argument '%s'",
                                   args->positional[cmd->positional_max]);
    }
    if (cmd->allow_rest && args->rest_count == 0) {
        return kf__cli_usage_error(name, "missing the command to run after '--'");
    }
    kf__cli_t cli;
    memset(&cli, 0, sizeof cli);
    cli.command = name;
    if (cmd->offline) {
        return cmd->run(&cli, args);
    }
    cli.addr = kf__cli_value(args, "--addr");
    if (cli.addr == NULL) {
        const char *env = getenv("KEYFLOW_ADDR");
        cli.addr = env != NULL && env[0] != '\0' ? env : DEFAULT_ADDR;
    }
    int rc = kf__cli_int64(args, "--timeout-ms", 1, KF__CLI_TIMEOUT_MS_MAX, &cli.timeout_set,
                           &cli.timeout_ms);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    /* Tables for a person at a terminal, JSON for everything else. */
    const char *output = flag_or_env(args, "--output", "KEYFLOW_OUTPUT");
    if (output == NULL) {
        cli.output = isatty(STDOUT_FILENO) ? KF__CLI_OUTPUT_TABLE : KF__CLI_OUTPUT_JSON;
    } else if (strcmp(output, "json") == 0) {
        cli.output = KF__CLI_OUTPUT_JSON;
    } else if (strcmp(output, "table") == 0) {
        cli.output = KF__CLI_OUTPUT_TABLE;
    } else {
        return kf__cli_usage_error(name, "--output: expected json or table, got \"%s\"", output);
    }
    cli.progress_tty = isatty(STDERR_FILENO);
    const char *tls_env = getenv("KEYFLOW_TLS");
    kf_client_options_t options = {
        .tls = kf__cli_has(args, "--tls") ||
               (tls_env != NULL && tls_env[0] != '\0' && strcmp(tls_env, "0") != 0),
        .tls_ca_path = flag_or_env(args, "--tls-ca", "KEYFLOW_TLS_CA"),
        .tls_cert_path = flag_or_env(args, "--tls-cert", "KEYFLOW_TLS_CERT"),
        .tls_key_path = flag_or_env(args, "--tls-key", "KEYFLOW_TLS_KEY"),
        .tls_server_name = flag_or_env(args, "--tls-server-name", "KEYFLOW_TLS_SERVER_NAME"),
    };
    char *key_buffer;
    rc = api_key(args, &key_buffer, &options.api_key);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    kf_error_t err;
    kf_status_t st = kf_client_create_with(cli.addr, &options, &cli.client, &err);
    free(key_buffer);
    if (st != KF_OK) {
        bool about_target = strncmp(err.message, "target:", 7) == 0;
        return kf__cli_usage_error(name, "%s%s", about_target ? "--addr: " : "", err.message);
    }
    kf_arena_init(&cli.arena, 0);
    rc = cmd->run(&cli, args);
    kf_arena_deinit(&cli.arena);
    kf_client_destroy(cli.client);
    return rc;
}

int main(int argc, char **argv) {
    /* Global flags may come before the command; they are moved after it so
     * that one parser sees all flags (and "--addr twice" is caught). */
    int i = 1;
    while (i < argc && argv[i][0] == '-') {
        bool takes_next = false;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            print_main_help(stdout);
            return KF__CLI_EXIT_OK;
        }
        if (strcmp(argv[i], "--version") == 0) {
            printf("keyflow %s (commit %s)\n", kf_version(), kf_version_commit());
            return KF__CLI_EXIT_OK;
        }
        if (!is_global_flag_word(argv[i], &takes_next)) {
            fprintf(stderr, "keyflow: unknown flag %s\nRun 'keyflow --help' for usage.\n", argv[i]);
            return KF__CLI_EXIT_USAGE;
        }
        if (takes_next && i + 1 >= argc) {
            fprintf(stderr, "keyflow: %s requires a value\n", argv[i]);
            return KF__CLI_EXIT_USAGE;
        }
        i += takes_next ? 2 : 1;
    }
    if (i >= argc) {
        print_main_help(stderr);
        return KF__CLI_EXIT_USAGE;
    }
    if (strcmp(argv[i], "help") == 0 && i + 1 == argc) {
        print_main_help(stdout);
        return KF__CLI_EXIT_OK;
    }
    const command_t *cmd = find_command(commands, command_count, argv[i]);
    if (cmd == NULL) {
        fprintf(stderr, "keyflow: unknown command '%s'\nRun 'keyflow --help' for usage.\n",
                argv[i]);
        return KF__CLI_EXIT_USAGE;
    }
    /* The words up to and including the command (and subcommand). */
    int global_words = i - 1;
    int command_end = i + 1;
    char name[COMMAND_NAME_BYTES_MAX];
    snprintf(name, sizeof name, "%s", cmd->name);
    if (cmd->group != NULL) {
        const char *word = i + 1 < argc ? argv[i + 1] : NULL;
        if (word != NULL && (strcmp(word, "-h") == 0 || strcmp(word, "--help") == 0)) {
            print_group_help(stdout, cmd);
            return KF__CLI_EXIT_OK;
        }
        if (word == NULL) {
            print_group_help(stderr, cmd);
            return KF__CLI_EXIT_USAGE;
        }
        const command_t *sub = find_command(cmd->group->commands, cmd->group->count, word);
        if (sub == NULL) {
            fprintf(stderr,
                    "keyflow: %s: unknown subcommand '%s'\nRun 'keyflow %s --help' for usage.\n",
                    cmd->name, word, cmd->name);
            return KF__CLI_EXIT_USAGE;
        }
        snprintf(name, sizeof name, "%s %s", cmd->name, sub->name);
        cmd = sub;
        command_end = i + 2;
    }
    KF_ASSERT(cmd->run != NULL && cmd->group == NULL);
    /* words = [global flags before the command] + [everything after it]. */
    int command_words = argc - command_end;
    char **words = calloc((size_t)argc, sizeof *words);
    if (words == NULL) {
        fprintf(stderr, "keyflow: out of memory\n");
        return KF__CLI_EXIT_ERROR;
    }
    memcpy(words, &argv[1], (size_t)global_words * sizeof *words);
    memcpy(words + global_words, &argv[command_end], (size_t)command_words * sizeof *words);

    kf__cli_args_t args;
    int rc = kf__cli_parse(name, cmd->flags, cmd->flag_count, global_words + command_words, words,
                           cmd->allow_rest, &args);
    if (rc == KF__CLI_EXIT_OK && args.help) {
        print_command_help(stdout, cmd, name);
    } else if (rc == KF__CLI_EXIT_OK) {
        rc = run_command(cmd, &args);
    }
    free(words);
    return rc;
}
