/*
 * cli_functions.c - `keyflow functions ...`: one subcommand per RPC of the
 * Functions service (register, get, list, push, output, tail, trim, delete,
 * delete-producer, state).
 *
 *   push: flags --> read all input (<= KF__CLI_PUSH_INPUT_BYTES_MAX)
 *     --> GetFunction (input schema, max_input_rows)
 *     --> kf__cli_rows_batches (every line converted and checked)
 *     --> PushBatch per batch, sequence, sequence + 1, ... (watermark on
 *         the last), printing each acknowledgement; stop at the first error
 *
 *   tail: TailOutput stream --> print each page --> --count pages: close
 *
 * Invariants
 *   1. As for every command (keyflow.c): each response is one JSON line on
 *      stdout; an RPC error is "keyflow: <CODE>: <message>" on stderr and
 *      exit 1; a usage error names the flag, argument or input line and
 *      exits 2 with nothing sent.
 *   2. push sends nothing unless all of its input converted: a bad line is
 *      found before the first batch goes out. After that, batches go out
 *      one at a time in sequence order; when one fails, the ones before it
 *      stay acknowledged, and a second stderr line names them, so the push
 *      can be resumed from the failed batch's sequence and line.
 *   3. A multi-batch push carries --watermark-us on its last batch only:
 *      the watermark advances after all of the input's rows, as it would
 *      had they fit in one batch (an earlier advance would make the later
 *      rows late and fire timers before them).
 *   4. Output and tail print rows as JSON objects unless --format columnar
 *      asks for the columnar batch: a command line is read by people.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/assert.h"
#include "base/limits.h"
#include "cli.h"
#include "proto/json_map.h"

#define FLAGS(a) a, sizeof a / sizeof a[0]

/* --format json|columnar; json when absent (invariant 4). */
static int parse_format(const kf__cli_args_t *args, Keyflow__V1__RowFormat *out) {
    const char *text = kf__cli_value(args, "--format");
    if (text == NULL || strcasecmp(text, "json") == 0) {
        *out = KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON;
    } else if (strcasecmp(text, "columnar") == 0) {
        *out = KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_COLUMNAR;
    } else {
        return kf__cli_usage_error(args->command, "--format: expected json or columnar, got \"%s\"",
                                   text);
    }
    return KF__CLI_EXIT_OK;
}

/* ---- register ------------------------------------------------------------ */

static const kf__cli_flag_t register_flags[] = {
    {"--placement", KF__CLI_VALUE, "single|split",
     "where the keys live: single (the default: every key in the function's home partition) "
     "or split (over every partition); overrides the file's"},
};

static int cmd_register(kf__cli_t *cli, const kf__cli_args_t *args) {
    /* The flag first: a usage error sends nothing and reads nothing. */
    const char *placement = kf__cli_value(args, "--placement");
    Keyflow__V1__FunctionPlacement placed = KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_UNSPECIFIED;
    if (placement != NULL && strcasecmp(placement, "single") == 0) {
        placed = KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SINGLE;
    } else if (placement != NULL && strcasecmp(placement, "split") == 0) {
        placed = KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SPLIT;
    } else if (placement != NULL) {
        return kf__cli_usage_error(args->command,
                                   "--placement: expected single or split, got \"%s\"", placement);
    }
    const char *path = args->positional[0];
    const char *shown = strcmp(path, "-") == 0 ? "stdin" : path;
    char *text = NULL;
    size_t len = 0;
    kf_error_t err;
    if (kf__cli_read_path(path, KF__CLI_INPUT_BYTES_MAX, &text, &len, &err) != KF_OK) {
        return kf__cli_usage_error(args->command, "%s", err.message);
    }
    ProtobufCMessage *descriptor = NULL;
    kf_status_t st = kf_json_to_message(text, len, &keyflow__v1__function_descriptor__descriptor,
                                        &cli->arena, &descriptor, &err);
    free(text);
    if (st != KF_OK) {
        return kf__cli_usage_error(args->command, "%s: not a FunctionDescriptor: %s", shown,
                                   err.message);
    }
    Keyflow__V1__RegisterFunctionRequest req = KEYFLOW__V1__REGISTER_FUNCTION_REQUEST__INIT;
    req.descriptor = (Keyflow__V1__FunctionDescriptor *)descriptor;
    if (placed != KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_UNSPECIFIED) {
        req.descriptor->placement = placed;
    }
    Keyflow__V1__RegisterFunctionResponse *resp = NULL;
    if (kf_client_register_function(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0),
                                    &resp, &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, &resp->base);
}

/* ---- get / list ---------------------------------------------------------- */

static int cmd_get(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__GetFunctionRequest req = KEYFLOW__V1__GET_FUNCTION_REQUEST__INIT;
    req.function_id = (char *)args->positional[0];
    Keyflow__V1__FunctionInfo *info = NULL;
    kf_error_t err;
    if (kf_client_get_function(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &info,
                               &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, &info->base);
}

static const kf__cli_flag_t list_flags[] = {
    {"--page-size", KF__CLI_VALUE, "N", "functions per page (default 100, at most 1000)"},
    {"--page-token", KF__CLI_VALUE, "T", "continue from a previous page's nextPageToken"},
};

static int cmd_list(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__ListFunctionsRequest req = KEYFLOW__V1__LIST_FUNCTIONS_REQUEST__INIT;
    bool present = false;
    int rc = kf__cli_int64(args, "--page-size", INT64_MIN, INT64_MAX, &present, &req.page_size);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    const char *token = kf__cli_value(args, "--page-token");
    if (token != NULL) {
        req.page_token = (char *)token;
    }
    Keyflow__V1__ListFunctionsResponse *resp = NULL;
    kf_error_t err;
    if (kf_client_list_functions(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &resp,
                                 &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, &resp->base);
}

/* ---- push ---------------------------------------------------------------- */

static const kf__cli_flag_t push_flags[] = {
    {"--producer", KF__CLI_VALUE, "P", "producer ID (required)"},
    {"--sequence", KF__CLI_VALUE, "N",
     "sequence of the first batch (required); later batches take N+1, N+2, ..."},
    {"--watermark-us", KF__CLI_VALUE, "W", "advance the watermark to W after the rows"},
    {"--file", KF__CLI_VALUE, "F", "read JSON lines from file F ('-' for stdin, the default)"},
    {"--json-rows", KF__CLI_SWITCH, NULL,
     "send the rows as JSON (rows_json) for the server to convert, not as columns"},
    {"--batch-rows", KF__CLI_VALUE, "N",
     "at most N rows per batch (default: the function's max_input_rows)"},
};

/* The function's input schema and the default batch size, from
 * GetFunction; the response lives in `arena`. */
static int describe_input(kf__cli_t *cli, const char *function_id, kf_arena_t *arena,
                          const Keyflow__V1__Schema **schema, int64_t *rows_max) {
    Keyflow__V1__GetFunctionRequest req = KEYFLOW__V1__GET_FUNCTION_REQUEST__INIT;
    req.function_id = (char *)function_id;
    Keyflow__V1__FunctionInfo *info = NULL;
    kf_error_t err;
    if (kf_client_get_function(cli->client, &req, arena, kf__cli_timeout_ms(cli, 0), &info, &err) !=
        KF_OK) {
        return kf__cli_fail(&err);
    }
    const Keyflow__V1__FunctionDescriptor *d = info->descriptor;
    if (d == NULL || d->input_schema == NULL) {
        fprintf(stderr, "keyflow: INTERNAL: GetFunction of %s returned no input schema\n",
                function_id);
        return KF__CLI_EXIT_ERROR;
    }
    *schema = d->input_schema;
    /* The descriptor comes back canonical, every limit filled in; the
     * default covers a server that left it out anyway. */
    *rows_max = KF_FN_MAX_INPUT_ROWS_DEFAULT;
    if (d->limits != NULL &&
        d->limits->max_input_rows_present_case ==
            KEYFLOW__V1__FUNCTION_LIMITS__MAX_INPUT_ROWS_PRESENT_MAX_INPUT_ROWS &&
        d->limits->max_input_rows > 0) {
        *rows_max = d->limits->max_input_rows;
    }
    return KF__CLI_EXIT_OK;
}

/* Sends the batches in order; returns an exit code (invariants 2 and 3). */
static int push_batches(kf__cli_t *cli, Keyflow__V1__PushBatchRequest *req,
                        const kf__cli_batch_t *batches, size_t count, bool watermark,
                        int64_t watermark_us) {
    int64_t first_sequence = req->sequence;
    size_t rows_total = 0, rows_done = 0;
    for (size_t b = 0; b < count; b++) {
        rows_total += batches[b].row_count;
    }
    for (size_t b = 0; b < count; b++) {
        if (count > 1) { /* a long push shows where it is (on a terminal) */
            kf__cli_progress(cli, "keyflow: pushing batch %zu of %zu (%zu of %zu rows sent)", b + 1,
                             count, rows_done, rows_total);
        }
        kf_arena_reset(&cli->arena);
        const kf__cli_batch_t *batch = &batches[b];
        req->sequence = first_sequence + (int64_t)b;
        if (batch->columnar != NULL) {
            req->rows_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_BATCH;
            req->batch = batch->columnar;
        } else {
            req->rows_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_ROWS_JSON;
            req->rows_json = batch->rows_json;
        }
        if (watermark && b + 1 == count) {
            req->watermark_present_case =
                KEYFLOW__V1__PUSH_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US;
            req->watermark_us = watermark_us;
        }
        Keyflow__V1__PushBatchResponse *ack = NULL;
        kf_error_t err;
        if (kf_client_push_batch(cli->client, req, &cli->arena, kf__cli_timeout_ms(cli, 0), &ack,
                                 &err) != KF_OK) {
            kf__cli_progress_end(cli);
            int rc = kf__cli_fail(&err);
            if (count > 1) {
                fprintf(stderr,
                        "keyflow: %s: batch %zu of %zu (sequence %lld, input lines %zu..%zu) "
                        "failed; ",
                        cli->command, b + 1, count, (long long)req->sequence, batch->first_line,
                        batch->last_line);
                if (b == 0) {
                    fprintf(stderr, "nothing was applied\n");
                } else {
                    fprintf(stderr, "batches 1..%zu (sequences %lld..%lld) were acknowledged\n", b,
                            (long long)first_sequence, (long long)req->sequence - 1);
                }
            }
            return rc;
        }
        rows_done += batch->row_count;
        int rc = kf__cli_print(cli, &ack->base);
        if (rc != KF__CLI_EXIT_OK) {
            kf__cli_progress_end(cli);
            return rc;
        }
    }
    kf__cli_progress_end(cli);
    return KF__CLI_EXIT_OK;
}

static int cmd_push(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__PushBatchRequest req = KEYFLOW__V1__PUSH_BATCH_REQUEST__INIT;
    req.function_id = (char *)args->positional[0];
    const char *producer = NULL;
    int rc = kf__cli_require(args, "--producer", &producer);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    req.producer_id = (char *)producer;
    bool present = false;
    /* Full int64 ranges: the server owns the bounds of what it stores. */
    if ((rc = kf__cli_int64(args, "--sequence", INT64_MIN, INT64_MAX, &present, &req.sequence)) !=
        KF__CLI_EXIT_OK) {
        return rc;
    }
    if (!present) {
        return kf__cli_usage_error(args->command, "--sequence N is required");
    }
    bool watermark = false;
    int64_t watermark_us = 0;
    if ((rc = kf__cli_int64(args, "--watermark-us", INT64_MIN, INT64_MAX, &watermark,
                            &watermark_us)) != KF__CLI_EXIT_OK) {
        return rc;
    }
    /* --batch-rows splits locally, so it is checked here, against the
     * largest batch any function may accept. */
    bool batch_rows_given = false;
    int64_t batch_rows = 0;
    if ((rc = kf__cli_int64(args, "--batch-rows", 1, KF_FN_MAX_INPUT_ROWS_MAX, &batch_rows_given,
                            &batch_rows)) != KF__CLI_EXIT_OK) {
        return rc;
    }
    bool json_rows = kf__cli_has(args, "--json-rows");
    const char *shown = NULL;
    char *text = NULL;
    size_t len = 0;
    if ((rc = kf__cli_read_file_flag(args, KF__CLI_PUSH_INPUT_BYTES_MAX, &text, &len, &shown)) !=
        KF__CLI_EXIT_OK) {
        return rc;
    }
    kf_error_t err;
    /* Batches, and the function they were converted for, live here until
     * the last one was sent; responses live in cli->arena, reset per batch. */
    kf_arena_t rows_arena;
    kf_arena_init(&rows_arena, 0);
    const Keyflow__V1__Schema *schema = NULL;
    int64_t rows_max = 0;
    rc = describe_input(cli, req.function_id, &rows_arena, &schema, &rows_max);
    kf__cli_batch_t *batches = NULL;
    size_t count = 0;
    if (rc == KF__CLI_EXIT_OK) {
        if (batch_rows_given) {
            rows_max = batch_rows;
        }
        if (kf__cli_rows_batches(text, len, json_rows ? NULL : schema, (size_t)rows_max,
                                 &rows_arena, &batches, &count, &err) != KF_OK) {
            rc = kf__cli_usage_error(args->command, "%s: %s", shown, err.message);
        }
    }
    free(text);
    if (rc == KF__CLI_EXIT_OK && count == 1 && batches[0].row_count == 0 && !watermark) {
        /* The server would accept it and spend the sequence on nothing; a
         * later push of real rows under that sequence would then be taken
         * for a retry and dropped. */
        rc = kf__cli_usage_error(args->command,
                                 "%s has no rows and --watermark-us is not given: nothing to push",
                                 shown);
    }
    /* The last batch's sequence must exist; the server judges the first. */
    if (rc == KF__CLI_EXIT_OK && req.sequence > 0 &&
        (uint64_t)(count - 1) > (uint64_t)(INT64_MAX - req.sequence)) {
        rc = kf__cli_usage_error(args->command,
                                 "--sequence: %lld + %zu batches passes the largest sequence",
                                 (long long)req.sequence, count);
    }
    if (rc == KF__CLI_EXIT_OK) {
        rc = push_batches(cli, &req, batches, count, watermark, watermark_us);
    }
    kf_arena_deinit(&rows_arena);
    return rc;
}

/* ---- output / tail ------------------------------------------------------- */

/* For a table: the function's output schema into cli->row_schema (in
 * `arena`), so that its TIMESTAMP_US columns print as times. A function
 * that cannot be read leaves the numbers as they are: the rows are what
 * was asked for, and their own call says what is wrong. */
static void fetch_row_schema(kf__cli_t *cli, const char *function_id, kf_arena_t *arena) {
    cli->row_schema = NULL;
    if (cli->output != KF__CLI_OUTPUT_TABLE) {
        return;
    }
    Keyflow__V1__GetFunctionRequest req = KEYFLOW__V1__GET_FUNCTION_REQUEST__INIT;
    req.function_id = (char *)function_id;
    Keyflow__V1__FunctionInfo *info = NULL;
    kf_error_t err;
    if (kf_client_get_function(cli->client, &req, arena, kf__cli_timeout_ms(cli, 0), &info, &err) ==
            KF_OK &&
        info->descriptor != NULL) {
        cli->row_schema = info->descriptor->output_schema;
    }
}

static const kf__cli_flag_t output_flags[] = {
    {"--after", KF__CLI_VALUE, "N", "rows with a sequence number after N (default 0: all)"},
    {"--limit", KF__CLI_VALUE, "N", "most rows (default 1000, at most 65536)"},
    {"--format", KF__CLI_VALUE, "json|columnar",
     "rows as JSON objects (\"rows\", the default) or as columns (\"batch\")"},
    {"--wait-ms", KF__CLI_VALUE, "N", "long poll: wait up to N ms for a row after --after"},
    {"--cursor", KF__CLI_VALUE, "C",
     "a split function's: the previous page's nextCursor instead of --after"},
};

static int cmd_output(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__ReadOutputRequest req = KEYFLOW__V1__READ_OUTPUT_REQUEST__INIT;
    req.function_id = (char *)args->positional[0];
    bool present = false;
    int rc;
    if ((rc = kf__cli_int64(args, "--after", INT64_MIN, INT64_MAX, &present, &req.after_seq)) !=
            KF__CLI_EXIT_OK ||
        (rc = kf__cli_int64(args, "--limit", INT64_MIN, INT64_MAX, &present, &req.limit)) !=
            KF__CLI_EXIT_OK ||
        (rc = kf__cli_int64(args, "--wait-ms", INT64_MIN, INT64_MAX, &present, &req.wait_ms)) !=
            KF__CLI_EXIT_OK ||
        (rc = parse_format(args, &req.format)) != KF__CLI_EXIT_OK) {
        return rc;
    }
    const char *cursor = kf__cli_value(args, "--cursor");
    req.cursor = (char *)(cursor != NULL ? cursor : "");
    Keyflow__V1__ReadOutputResponse *resp = NULL;
    kf_error_t err;
    if (kf_client_read_output(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, req.wait_ms),
                              &resp, &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    fetch_row_schema(cli, req.function_id, &cli->arena);
    return kf__cli_print(cli, &resp->base);
}

static const kf__cli_flag_t tail_flags[] = {
    {"--after", KF__CLI_VALUE, "N", "rows with a sequence number after N (default 0: all)"},
    {"--max-rows", KF__CLI_VALUE, "N", "most rows per page (default 1000, at most 65536)"},
    {"--count", KF__CLI_VALUE, "N", "exit after N pages (default: follow until interrupted)"},
    {"--format", KF__CLI_VALUE, "json|columnar",
     "rows as JSON objects (\"rows\", the default) or as columns (\"batch\")"},
    {"--cursor", KF__CLI_VALUE, "C",
     "a split function's: start after a page's nextCursor (from output or tail) instead of "
     "--after"},
};

static int cmd_tail(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__TailOutputRequest req = KEYFLOW__V1__TAIL_OUTPUT_REQUEST__INIT;
    req.function_id = (char *)args->positional[0];
    bool present = false;
    int64_t pages_max = 0;
    int rc;
    if ((rc = kf__cli_int64(args, "--after", INT64_MIN, INT64_MAX, &present, &req.after_seq)) !=
            KF__CLI_EXIT_OK ||
        (rc = kf__cli_int64(args, "--max-rows", INT64_MIN, INT64_MAX, &present,
                            &req.max_rows_per_message)) != KF__CLI_EXIT_OK ||
        (rc = kf__cli_int64(args, "--count", 1, INT64_MAX, &present, &pages_max)) !=
            KF__CLI_EXIT_OK ||
        (rc = parse_format(args, &req.format)) != KF__CLI_EXIT_OK) {
        return rc;
    }
    const char *cursor = kf__cli_value(args, "--cursor");
    req.cursor = (char *)(cursor != NULL ? cursor : "");
    /* A tail follows the output for as long as it is wanted: it has no
     * deadline unless --timeout-ms gives one to the whole stream. */
    kf_client_stream_t *stream = NULL;
    kf_error_t err;
    if (kf_client_tail_output(cli->client, &req, cli->timeout_set ? cli->timeout_ms : 0, &stream,
                              &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    /* Each page resets cli->arena: the schema lives in its own. */
    kf_arena_t schema_arena;
    kf_arena_init(&schema_arena, 0);
    fetch_row_schema(cli, req.function_id, &schema_arena);
    int64_t pages = 0;
    rc = KF__CLI_EXIT_OK;
    while (pages_max == 0 || pages < pages_max) {
        /* One page at a time in memory, however long the tail runs. */
        kf_arena_reset(&cli->arena);
        Keyflow__V1__ReadOutputResponse *page = NULL;
        if (kf_client_tail_output_next(stream, &cli->arena, 0, &page, &err) != KF_OK) {
            rc = kf__cli_fail(&err);
            break;
        }
        if (page == NULL) {
            if (pages_max > 0) {
                fprintf(stderr,
                        "keyflow: %s: the server ended the stream after %lld of %lld "
                        "pages\n",
                        cli->command, (long long)pages, (long long)pages_max);
                rc = KF__CLI_EXIT_ERROR;
            }
            break;
        }
        rc = kf__cli_print(cli, &page->base);
        if (rc != KF__CLI_EXIT_OK) {
            break;
        }
        pages++;
    }
    kf_client_stream_close(stream);
    cli->row_schema = NULL;
    kf_arena_deinit(&schema_arena);
    return rc;
}

/* ---- state --------------------------------------------------------------- */

static int cmd_state(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__GetKeyStateRequest req = KEYFLOW__V1__GET_KEY_STATE_REQUEST__INIT;
    req.function_id = (char *)args->positional[0];
    req.key = (char *)args->positional[1];
    Keyflow__V1__GetKeyStateResponse *resp = NULL;
    kf_error_t err;
    if (kf_client_get_key_state(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &resp,
                                &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, &resp->base);
}

/* ---- trim ---------------------------------------------------------------- */

static const kf__cli_flag_t trim_flags[] = {
    {"--before", KF__CLI_VALUE, "SEQ",
     "drop the output rows before SEQ (the last row read + 1; or --before-cursor)"},
    {"--before-cursor", KF__CLI_VALUE, "C",
     "a split function's: each partition's rows up to its position in an output cursor"},
};

static int cmd_trim(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__TrimOutputRequest req = KEYFLOW__V1__TRIM_OUTPUT_REQUEST__INIT;
    req.function_id = (char *)args->positional[0];
    bool present = false;
    int rc = kf__cli_int64(args, "--before", INT64_MIN, INT64_MAX, &present, &req.before_seq);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    const char *cursor = kf__cli_value(args, "--before-cursor");
    if (present == (cursor != NULL)) {
        return kf__cli_usage_error(args->command, "--before or --before-cursor: give one");
    }
    req.before_cursor = (char *)(cursor != NULL ? cursor : "");
    Keyflow__V1__TrimOutputResponse *resp = NULL;
    kf_error_t err;
    if (kf_client_trim_output(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &resp,
                              &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, &resp->base);
}

/* ---- delete / delete-producer -------------------------------------------- */

static const kf__cli_flag_t delete_flags[] = {
    {"--allow-missing", KF__CLI_SWITCH, NULL,
     "succeed (\"deleted\" false) when there is nothing to delete"},
};

static int cmd_delete(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__DeleteFunctionRequest req = KEYFLOW__V1__DELETE_FUNCTION_REQUEST__INIT;
    req.function_id = (char *)args->positional[0];
    req.allow_missing = kf__cli_has(args, "--allow-missing");
    Keyflow__V1__DeleteFunctionResponse *resp = NULL;
    kf_error_t err;
    if (kf_client_delete_function(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &resp,
                                  &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, &resp->base);
}

static int cmd_delete_producer(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__DeleteProducerRequest req = KEYFLOW__V1__DELETE_PRODUCER_REQUEST__INIT;
    req.function_id = (char *)args->positional[0];
    req.producer_id = (char *)args->positional[1];
    req.allow_missing = kf__cli_has(args, "--allow-missing");
    Keyflow__V1__DeleteProducerResponse *resp = NULL;
    kf_error_t err;
    if (kf_client_delete_producer(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &resp,
                                  &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, &resp->base);
}

/* ---- the subcommand table ------------------------------------------------ */

static const kf__cli_command_t functions_commands[] = {
    {"register", "FILE|- [--placement single|split]",
     "register a function from its descriptor (proto3 JSON)",
     "FILE holds a keyflow.v1.FunctionDescriptor in proto3 JSON form, e.g. the build's\n"
     "handlers/running_sum.descriptor.json ('-' reads stdin). Registering the identical\n"
     "descriptor again answers \"alreadyRegistered\": true; a different one under the same\n"
     "functionId is ALREADY_EXISTS. --placement (docs/scaling.md, \"Placement\"): single,\n"
     "the default, keeps every key in the function's home partition (one atomic step per\n"
     "batch, one output sequence read with --after); split spreads the keys over every\n"
     "partition for a function that needs more than one core (output read with --cursor).",
     FLAGS(register_flags), 1, 1, false, cmd_register, NULL},
    {"get", "ID", "show a function: its canonical descriptor, placement, watermark and counters",
     "A single function shows its home partition; a split one each partition's part and\n"
     "share of the limits (\"partitions\").",
     NULL, 0, 1, 1, false, cmd_get, NULL},
    {"list", "[--page-size N] [--page-token T]", "list functions, one page at a time", NULL,
     FLAGS(list_flags), 0, 0, false, cmd_list, NULL},
    {"push",
     "ID --producer P --sequence N [--watermark-us W] [--file F|-] [--json-rows] "
     "[--batch-rows N]",
     "push rows, one JSON object per line, as one or more batches",
     "Reads JSON lines (one object per line, one row per object; blank lines are skipped)\n"
     "from --file or stdin, at most 64 MiB. By default each row is converted by the\n"
     "function's input schema (fetched with GetFunction) into a columnar batch: BOOL\n"
     "true/false, INT64 and TIMESTAMP_US an integer or a decimal string, FLOAT64 a number,\n"
     "a decimal string, \"NaN\", \"Infinity\" or \"-Infinity\", UTF8 a string, BYTES base64;\n"
     "a missing or null value is null. A field the schema does not have is a usage error\n"
     "naming the line. --json-rows sends the lines as rows_json instead, for the server to\n"
     "convert (by the same rules).\n"
     "The rows go out in batches of at most --batch-rows (default: the function's\n"
     "max_input_rows) with sequences N, N+1, ...; --watermark-us goes with the last one, so\n"
     "the watermark advances after all the rows. Each acknowledgement is printed as one\n"
     "JSON line. Every line is checked before the first batch is sent; if a batch fails,\n"
     "a second stderr line says which batches were acknowledged before it. A retry of an\n"
     "acknowledged (producer, sequence) answers \"duplicate\": true and changes nothing.",
     FLAGS(push_flags), 1, 1, false, cmd_push, NULL},
    {"output", "ID [--after N | --cursor C] [--limit N] [--format json|columnar] [--wait-ms N]",
     "read one page of a function's output rows",
     "Prints the page: \"rows\" (JSON objects with their \"_seq\") or \"batch\" (columns),\n"
     "plus \"nextAfterSeq\" to pass as --after for the next page and \"highWaterSeq\".\n"
     "A single function (the default placement) has one output sequence, whatever the\n"
     "partitions. For a split one (docs/scaling.md) a page holds one partition's rows\n"
     "(\"partition\"; its own sequences) and \"nextCursor\" is what to pass as --cursor.",
     FLAGS(output_flags), 1, 1, false, cmd_output, NULL},
    {"tail", "ID [--after N | --cursor C] [--max-rows N] [--count N] [--format json|columnar]",
     "follow a function's output as rows are written",
     "Prints each page the server streams as one JSON line, as for output. Without --count\n"
     "it follows until interrupted; --count N exits 0 after N pages. The stream has no\n"
     "deadline unless --timeout-ms is given. A single function's rows are one sequence\n"
     "(resume with --after); with several endpoints (--addr a,b,c) the one serving its home\n"
     "is followed. For a split function each page holds one partition's rows (\"partition\",\n"
     "its own sequences) and \"nextCursor\" is where to resume (--cursor); with several\n"
     "endpoints every endpoint is followed and \"nextCursor\" merges their positions.",
     FLAGS(tail_flags), 1, 1, false, cmd_tail, NULL},
    {"trim", "ID (--before SEQ | --before-cursor C)", "drop a function's output rows before SEQ",
     "For a consumer that has committed its position: rows before SEQ are gone for\n"
     "readers at once (reading below the retained range is OUT_OF_RANGE, naming the\n"
     "first retained sequence) and from disk soon after. SEQ is at most the last output\n"
     "row + 1. Trimming again to the same or an earlier position changes nothing. Prints\n"
     "the first retained sequence; \"functions get\" shows the retained range.",
     FLAGS(trim_flags), 1, 1, false, cmd_trim, NULL},
    {"delete", "ID [--allow-missing]", "delete a function and everything of it",
     "Deletes the function's state, timers, output, producers and descriptor, durably.\n"
     "Batches waiting for it are refused ABORTED, reads waiting on it NOT_FOUND, and its\n"
     "remote workers' streams end. Afterwards ID (and its pipeline state ID) can be\n"
     "registered again, with any descriptor. Prints what went with it.",
     FLAGS(delete_flags), 1, 1, false, cmd_delete, NULL},
    {"delete-producer", "ID PRODUCER [--allow-missing]",
     "forget a producer: its last sequence and kept acknowledgements",
     "The next batch under PRODUCER starts a new producer (any sequence >= 1), owned by the\n"
     "key that pushes it. Producers are also forgotten by themselves after keyflowd's\n"
     "--producer-idle-expiry-ms without a batch (default a week).",
     FLAGS(delete_flags), 2, 2, false, cmd_delete_producer, NULL},
    {"state", "ID KEY", "show a key's value state (absent, null or a value) and its timers",
     "KEY is the key's text: the value of the one key column, or a JSON array of the\n"
     "values when the function has several key columns.",
     NULL, 0, 2, 2, false, cmd_state, NULL},
};

const kf__cli_command_group_t kf__cli_functions_group = {
    functions_commands, sizeof functions_commands / sizeof functions_commands[0]};
