/*
 * cli_events.c - `keyflow send-many`: many events from JSON lines, sent
 * with SendEvents, one result line per event.
 *
 * Invariants
 *   1. Every line is read and checked before anything is sent: a line that
 *      is not a SendEvent request in its JSON form is a usage error naming
 *      the line, and nothing is sent.
 *   2. Events go in input order, --batch-events per call (each call one
 *      durable write); the output has one JSON line per input event, in
 *      order: {"response": {...}} (the receipt and disposition, as `send`
 *      prints) or {"error": {"code", "status", "message"}}.
 *   3. Exit 0 when every event was accepted; 1 when any was refused (all
 *      results are still printed) or a call failed (the lines acknowledged
 *      before it are named on stderr; nothing after it was sent).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/limits.h"
#include "cli.h"
#include "proto/json_map.h"

/* One parsed input line. */
typedef struct line_event {
    Keyflow__V1__SendEventRequest *request;
    size_t line; /* 1-based */
} line_event_t;

static kf_status_t parse_lines(const char *text, size_t len, const char *workflow,
                               kf_arena_t *arena, line_event_t **out, size_t *count,
                               kf_error_t *err) {
    size_t cap = 0;
    for (size_t i = 0; i < len; i++) {
        cap += text[i] == '\n';
    }
    cap++;
    line_event_t *events = kf_arena_alloc(arena, cap * sizeof *events);
    if (events == NULL) {
        return kf_error_set(err, KF_E_TOO_LARGE, "too many lines");
    }
    size_t n = 0, line = 0;
    for (const char *p = text, *end = text + len; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t line_len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        line++;
        size_t blank = 0;
        while (blank < line_len && strchr(" \t\r", p[blank]) != NULL) {
            blank++;
        }
        if (blank < line_len) {
            ProtobufCMessage *msg = NULL;
            kf_error_t e;
            if (kf_json_to_message(p, line_len, &keyflow__v1__send_event_request__descriptor, arena,
                                   &msg, &e) != KF_OK) {
                return kf_error_set(err, e.status, "line %zu: %s", line, e.message);
            }
            Keyflow__V1__SendEventRequest *req = (Keyflow__V1__SendEventRequest *)msg;
            if (workflow != NULL && req->workflow[0] == '\0') {
                req->workflow = (char *)workflow;
            }
            events[n].request = req;
            events[n].line = line;
            n++;
        }
        p += line_len + 1;
    }
    *out = events;
    *count = n;
    return KF_OK;
}

/* Sends events[0..count) in calls of `per_call`; prints every result. */
static int send_calls(kf__cli_t *cli, const line_event_t *events, size_t count, size_t per_call) {
    size_t refused = 0;
    for (size_t first = 0; first < count; first += per_call) {
        size_t n = count - first < per_call ? count - first : per_call;
        kf_arena_reset(&cli->arena);
        Keyflow__V1__SendEventsRequest req = KEYFLOW__V1__SEND_EVENTS_REQUEST__INIT;
        Keyflow__V1__SendEventRequest *batch[KF_SEND_EVENTS_MAX];
        for (size_t i = 0; i < n; i++) {
            batch[i] = events[first + i].request;
        }
        req.events = batch;
        req.n_events = n;
        Keyflow__V1__SendEventsResponse *resp = NULL;
        kf_error_t err;
        if (kf_client_send_events(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &resp,
                                  &err) != KF_OK) {
            int rc = kf__cli_fail(&err);
            if (first == 0) {
                fprintf(stderr, "keyflow: %s: nothing was sent\n", cli->command);
            } else {
                fprintf(stderr,
                        "keyflow: %s: the events of lines %zu..%zu were answered above; lines "
                        "%zu.. were not sent\n",
                        cli->command, events[0].line, events[first - 1].line, events[first].line);
            }
            return rc;
        }
        if (resp->n_results != n) {
            fprintf(stderr, "keyflow: INTERNAL: %zu results for %zu events\n", resp->n_results, n);
            return KF__CLI_EXIT_ERROR;
        }
        for (size_t i = 0; i < n; i++) {
            Keyflow__V1__SendEventsResult *r = resp->results[i];
            refused += r->outcome_case == KEYFLOW__V1__SEND_EVENTS_RESULT__OUTCOME_ERROR;
            int rc = kf__cli_print(cli, &r->base);
            if (rc != KF__CLI_EXIT_OK) {
                return rc;
            }
        }
    }
    if (refused > 0) {
        fprintf(stderr, "keyflow: %s: %zu of %zu events were refused (see their error lines)\n",
                cli->command, refused, count);
        return KF__CLI_EXIT_ERROR;
    }
    return KF__CLI_EXIT_OK;
}

int kf__cli_send_many(kf__cli_t *cli, const kf__cli_args_t *args) {
    bool present = false;
    int64_t per_call = KF_SEND_EVENTS_MAX;
    int rc = kf__cli_int64(args, "--batch-events", 1, KF_SEND_EVENTS_MAX, &present, &per_call);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    const char *shown = NULL;
    char *text = NULL;
    size_t len = 0;
    if ((rc = kf__cli_read_file_flag(args, KF__CLI_SEND_MANY_INPUT_BYTES_MAX, &text, &len,
                                     &shown)) != KF__CLI_EXIT_OK) {
        return rc;
    }
    kf_error_t err;
    /* Requests live here until the last call; responses in cli->arena,
     * reset per call. */
    kf_arena_t lines_arena;
    kf_arena_init(&lines_arena, 0);
    line_event_t *events = NULL;
    size_t count = 0;
    if (parse_lines(text, len, kf__cli_value(args, "--workflow"), &lines_arena, &events, &count,
                    &err) != KF_OK) {
        rc = kf__cli_usage_error(args->command, "%s: %s", shown, err.message);
    } else if (count == 0) {
        rc = kf__cli_usage_error(args->command, "%s has no events", shown);
    } else {
        rc = send_calls(cli, events, count, (size_t)per_call);
    }
    free(text);
    kf_arena_deinit(&lines_arena);
    return rc;
}
