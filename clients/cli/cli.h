/*
 * cli.h - private interface between the files of the `keyflow` CLI:
 * command-line flags (cli_args.c), the shared per-invocation context,
 * output (cli_output.c), the command table (keyflow.c), the worker loop
 * (cli_work.c), the `functions` commands (cli_functions.c) and their JSON
 * lines input (cli_rows.c).
 *
 * Exit codes are the CLI's contract with scripts: 0 success, 1 an RPC or
 * run-time error ("keyflow: <GRPC_CODE_NAME>: <message>" on stderr), 2 a
 * usage error (the message names the offending flag or argument).
 */
#ifndef KF_CLI_CLI_H
#define KF_CLI_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/arena.h"
#include "base/status.h"
#include "keyflow_client.h"

#define KF__CLI_EXIT_OK    0
#define KF__CLI_EXIT_ERROR 1
#define KF__CLI_EXIT_USAGE 2

/* Input read from a file or stdin (--input-file, call's JSON): a 16 MiB
 * input batch is the largest payload any request carries. */
#define KF__CLI_INPUT_BYTES_MAX (16 * 1024 * 1024)
/* `keyflow functions push` input (JSON lines), all read before anything is
 * sent: four batches at the largest max_input_bytes, split by --batch-rows.
 * More than that belongs in a producer program, not on a command line. */
#define KF__CLI_PUSH_INPUT_BYTES_MAX (64 * 1024 * 1024)
/* `keyflow send-many` input (JSON lines), all read and checked before
 * anything is sent, for the same reason and with the same bound. */
#define KF__CLI_SEND_MANY_INPUT_BYTES_MAX (64 * 1024 * 1024)
/* Flag occurrences on one command line; a repeatable flag such as
 * --workflow may appear KF_POLL_WORKFLOWS_MAX times, plus the others. */
#define KF__CLI_OCCURRENCES_MAX 64
#define KF__CLI_POSITIONAL_MAX  4
/* A method's name as `call` takes it: a service name and a method name,
 * both short identifiers. */
#define KF__CLI_METHOD_NAME_BYTES_MAX 256
/* Deadline of an ordinary call; a long poll gets this much past its
 * wait_ms before the client gives up on it. */
#define KF__CLI_TIMEOUT_MS_DEFAULT 30000
/* The largest --timeout-ms: a day is longer than any call should take. */
#define KF__CLI_TIMEOUT_MS_MAX (24LL * 3600 * 1000)

typedef enum kf__cli_flag_kind {
    KF__CLI_SWITCH, /* --once: no value */
    KF__CLI_VALUE,  /* --key K: at most once */
    KF__CLI_LIST,   /* --workflow W: repeatable, kept in order */
} kf__cli_flag_kind_t;

typedef struct kf__cli_flag {
    const char *name; /* "--window-ms" */
    kf__cli_flag_kind_t kind;
    const char *value_name; /* "N", shown in help; NULL for switches */
    const char *help;
} kf__cli_flag_t;

/* One parsed command line. Every string points into argv (borrowed for the
 * life of the process). */
typedef struct kf__cli_args {
    const char *command;         /* "send", for messages */
    const kf__cli_flag_t *flags; /* the command's flags, then the globals */
    size_t flag_count;
    struct {
        const kf__cli_flag_t *flag;
        const char *value; /* NULL for a switch */
    } occurrences[KF__CLI_OCCURRENCES_MAX];
    size_t occurrence_count;
    const char *positional[KF__CLI_POSITIONAL_MAX];
    size_t positional_count;
    char **rest; /* after "--"; NULL when there was none */
    int rest_count;
    bool help; /* -h or --help was given */
} kf__cli_args_t;

/* The flags every command accepts (--addr, --timeout-ms). */
extern const kf__cli_flag_t kf__cli_global_flags[];
extern const size_t kf__cli_global_flag_count;

/*
 * Parses argv[0..argc) (the words after the command name) against `flags`
 * plus the global flags. Returns KF__CLI_EXIT_OK, or KF__CLI_EXIT_USAGE after
 * printing a message that names the bad flag. `allow_rest`: whether "--"
 * may introduce a trailing command.
 */
int kf__cli_parse(const char *command, const kf__cli_flag_t *flags, size_t flag_count, int argc,
                  char **argv, bool allow_rest, kf__cli_args_t *out);

/* Prints "keyflow: <command>: <message>" and the help hint to stderr;
 * returns KF__CLI_EXIT_USAGE. */
int kf__cli_usage_error(const char *command, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Whether the switch or value flag `name` was given. */
bool kf__cli_has(const kf__cli_args_t *args, const char *name);
/* The value of `name`, or NULL when it was not given. */
const char *kf__cli_value(const kf__cli_args_t *args, const char *name);
/* Every value of the list flag `name`, in order, into out[0..max). Returns
 * the count (at most max; kf__cli_parse already bounded it). */
size_t kf__cli_list(const kf__cli_args_t *args, const char *name, const char **out, size_t max);
/* The value of `name` when it is required: a usage error naming it when
 * it is absent. */
int kf__cli_require(const kf__cli_args_t *args, const char *name, const char **out);

/*
 * An integer flag: *present tells whether it was given; *out is set only
 * then. The text must be a whole base-10 int64 (strtoll, with overflow,
 * empty text and trailing characters all refused) within [min, max].
 * Returns KF__CLI_EXIT_OK or a usage error naming the flag.
 */
int kf__cli_int64(const kf__cli_args_t *args, const char *name, int64_t min, int64_t max,
                  bool *present, int64_t *out);

/*
 * Reads all of fd into a new NUL-terminated malloc'd buffer (*out, caller
 * frees; *len excludes the NUL). Errors: KF_E_TOO_LARGE past max_bytes,
 * KF_E_INVALID when the bytes contain a NUL (they become C strings), KF_E_IO.
 * On error nothing is allocated.
 */
kf_status_t kf__cli_read_fd(int fd, size_t max_bytes, char **out, size_t *len,
                            kf_error_t *err) KF_MUST_USE;
/* The same for a path ("-" is stdin). */
kf_status_t kf__cli_read_path(const char *path, size_t max_bytes, char **out, size_t *len,
                              kf_error_t *err) KF_MUST_USE;

/* Reads all of the --file flag's file (absent or "-": stdin) like
 * kf__cli_read_path; *shown names it in messages ("stdin" or the path).
 * Returns KF__CLI_EXIT_OK or a usage error naming --file. */
int kf__cli_read_file_flag(const kf__cli_args_t *args, size_t max_bytes, char **text, size_t *len,
                           const char **shown);

/* How responses are printed (--output; cli_output.c). */
typedef enum kf__cli_output {
    KF__CLI_OUTPUT_JSON,  /* one JSON document per line (not a terminal) */
    KF__CLI_OUTPUT_TABLE, /* aligned columns, readable times (a terminal) */
} kf__cli_output_t;

/* The progress line's text (stderr, a terminal only). */
#define KF__CLI_PROGRESS_BYTES_MAX 160

/* Per invocation: the connection and the arena responses live in. */
typedef struct kf__cli {
    const char *command;
    const char *addr;   /* --addr, $KEYFLOW_ADDR, or the default */
    int64_t timeout_ms; /* --timeout-ms; meaningful when timeout_set */
    bool timeout_set;
    kf__cli_output_t output;
    kf_client_t *client; /* owned; created before a command runs */
    kf_arena_t arena;    /* responses and JSON text; reset per call */
    bool progress_tty;   /* stderr is a terminal: progress lines are shown */
    bool progress_shown; /* the progress line is on the screen now */
    char progress[KF__CLI_PROGRESS_BYTES_MAX];
    /* The output schema of the function whose rows are printed (`functions
     * output` and `tail` in a table), so that its TIMESTAMP_US columns
     * print as times; NULL otherwise. Borrowed from the command. */
    const Keyflow__V1__Schema *row_schema;
} kf__cli_t;

/* Prints a response on stdout as --output says: one line of JSON, with
 * every list present ([] when empty), or a table. Returns an exit code. */
int kf__cli_print(kf__cli_t *cli, const ProtobufCMessage *msg);
/* The progress line of a long operation, rewritten in place on stderr when
 * it is a terminal (nothing otherwise). kf__cli_print clears it before it
 * prints and draws it again after; kf__cli_progress_end removes it. */
void kf__cli_progress(kf__cli_t *cli, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kf__cli_progress_redraw(kf__cli_t *cli);
void kf__cli_progress_clear(kf__cli_t *cli);
void kf__cli_progress_end(kf__cli_t *cli);
/* Prints "keyflow: <GRPC_CODE_NAME>: <message>"; returns KF__CLI_EXIT_ERROR. */
int kf__cli_fail(const kf_error_t *err);
/* The deadline for a call: --timeout-ms when given, else the default plus
 * the call's own wait (a long poll's wait_ms, clamped to the server's bound). */
int64_t kf__cli_timeout_ms(const kf__cli_t *cli, int64_t wait_ms);

/* `keyflow work`: the worker loop (cli_work.c); its flags are declared
 * with the other commands' in keyflow.c. */
int kf__cli_work(kf__cli_t *cli, const kf__cli_args_t *args);
/* `keyflow send-many`: JSON lines of events through SendEvents
 * (cli_events.c); its flags are declared in keyflow.c. */
int kf__cli_send_many(kf__cli_t *cli, const kf__cli_args_t *args);

/* ---- the command table -------------------------------------------------- */

typedef int (*kf__cli_command_fn)(kf__cli_t *cli, const kf__cli_args_t *args);

typedef struct kf__cli_command kf__cli_command_t;

/* The subcommands of a command word ("functions" -> "functions push"). */
typedef struct kf__cli_command_group {
    const kf__cli_command_t *commands;
    size_t count;
} kf__cli_command_group_t;

struct kf__cli_command {
    const char *name;     /* "send"; a subcommand's own word ("push") */
    const char *synopsis; /* what follows "keyflow NAME" in usage */
    const char *summary;  /* one line, for `keyflow --help` */
    const char *details;  /* paragraphs for `keyflow NAME --help`, or NULL */
    const kf__cli_flag_t *flags;
    size_t flag_count;
    size_t positional_min;
    size_t positional_max;
    bool allow_rest;                      /* "-- CMD ARGS..." */
    kf__cli_command_fn run;               /* NULL exactly when `group` is set */
    const kf__cli_command_group_t *group; /* subcommands, or NULL */
    bool offline;                         /* runs without a connection */
};

/* `keyflow functions ...` (cli_functions.c). */
extern const kf__cli_command_group_t kf__cli_functions_group;
/* `keyflow keys ...` (cli_keys.c). */
extern const kf__cli_command_group_t kf__cli_keys_group;
/* `keyflow run ...` (cli_runs.c). */
extern const kf__cli_command_group_t kf__cli_run_group;

/* Waits until the run is COMPLETED, FAILED or CANCELLED (GetRun long polls)
 * or timeout_ms passes (0: no limit), prints the run and returns the exit
 * code: 0 only when it COMPLETED. */
int kf__cli_wait_run(kf__cli_t *cli, const char *run_id, int64_t timeout_ms);
/* --wait-timeout-ms N into *out (0 when absent); a usage error otherwise. */
int kf__cli_wait_timeout(const kf__cli_args_t *args, int64_t *out);

/* ---- JSON lines -> PushBatch payloads (cli_rows.c) ---------------------- */

/* One PushBatch's rows: exactly one of `columnar` and `rows_json` is set. */
typedef struct kf__cli_batch {
    Keyflow__V1__RowBatch *columnar;
    char *rows_json; /* a JSON array of the lines' objects, as written */
    size_t row_count;
    size_t first_line; /* 1-based input lines of the first and last */
    size_t last_line;  /* row; both 0 for a batch of no rows */
} kf__cli_batch_t;

/*
 * Turns `text` (len bytes, NUL-terminated) into batches of at most
 * rows_max rows, in input order. Each non-blank line is one JSON object,
 * one row. With `schema` the batches are columnar, each value converted by
 * its field's type by the column type table (proto/columns.h: BOOL
 * true/false; INT64 and TIMESTAMP_US an integer or a decimal string;
 * FLOAT64 a number, a decimal string or "NaN"/"Infinity"/"-Infinity";
 * UTF8 a string; BYTES base64 text); a missing or null value is a null.
 * Without it, each batch is the lines' objects as a rows_json array, for
 * the server to convert. Every line is checked before this returns, so an
 * error means no batch: KF_E_INVALID with "line N: FIELD: problem"; a
 * bound reached is KF_E_TOO_LARGE. An input without rows gives one batch
 * of no rows (a watermark-only push). Everything lives in `arena`;
 * *batches is an array of *count (>= 1).
 */
kf_status_t kf__cli_rows_batches(const char *text, size_t len, const Keyflow__V1__Schema *schema,
                                 size_t rows_max, kf_arena_t *arena, kf__cli_batch_t **batches,
                                 size_t *count, kf_error_t *err) KF_MUST_USE;

#endif
