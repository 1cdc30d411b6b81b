/*
 * cli_args.c - command-line flags, integer flags and bounded input reading
 * for the `keyflow` CLI.
 *
 * Invariants
 *   1. Flags are long options only ("--name VALUE" or "--name=VALUE"); a
 *      word after "--" is never a flag. Every rejected word is named in the
 *      message, so the user sees which flag to fix.
 *   2. A value flag given twice is an error rather than "last one wins":
 *      a command line that says two things is more likely a mistake.
 *   3. Every buffer is bounded: the occurrence and positional arrays by
 *      their constants, input reads by the caller's max_bytes.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/assert.h"

const kf__cli_flag_t kf__cli_global_flags[] = {
    {"--addr", KF__CLI_VALUE, "HOST:PORT[,...]",
     "server address (default: $KEYFLOW_ADDR, else 127.0.0.1:50051); several, comma-separated: "
     "the processes of one data set, each call routed by key"},
    {"--output", KF__CLI_VALUE, "json|table",
     "print responses as JSON lines or as tables ($KEYFLOW_OUTPUT; default: table on a "
     "terminal, JSON otherwise)"},
    {"--timeout-ms", KF__CLI_VALUE, "N",
     "deadline of each call (default 30000, plus the wait of a long poll; a value given "
     "here bounds the whole call, long poll included)"},
    {"--tls", KF__CLI_SWITCH, NULL,
     "use TLS, verifying the server with gRPC's default roots ($KEYFLOW_TLS=1); implied by "
     "any --tls-* flag"},
    {"--tls-ca", KF__CLI_VALUE, "FILE",
     "PEM CAs that verify the server's certificate ($KEYFLOW_TLS_CA)"},
    {"--tls-cert", KF__CLI_VALUE, "FILE",
     "PEM client certificate, for servers that require one (mTLS; $KEYFLOW_TLS_CERT)"},
    {"--tls-key", KF__CLI_VALUE, "FILE", "PEM private key of --tls-cert ($KEYFLOW_TLS_KEY)"},
    {"--tls-server-name", KF__CLI_VALUE, "NAME",
     "name the server's certificate must carry, when it is not --addr's host "
     "($KEYFLOW_TLS_SERVER_NAME)"},
    {"--api-key-file", KF__CLI_VALUE, "FILE",
     "file holding the API key sent with every call ($KEYFLOW_API_KEY_FILE; or the key "
     "itself in $KEYFLOW_API_KEY)"},
};
const size_t kf__cli_global_flag_count =
    sizeof kf__cli_global_flags / sizeof kf__cli_global_flags[0];

int kf__cli_usage_error(const char *command, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "keyflow: %s: ", command);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nRun 'keyflow %s --help' for usage.\n", command);
    va_end(ap);
    return KF__CLI_EXIT_USAGE;
}

static const kf__cli_flag_t *find_flag(const kf__cli_flag_t *flags, size_t count, const char *name,
                                       size_t name_len) {
    for (size_t i = 0; i < count; i++) {
        if (strlen(flags[i].name) == name_len && memcmp(flags[i].name, name, name_len) == 0) {
            return &flags[i];
        }
    }
    for (size_t i = 0; i < kf__cli_global_flag_count; i++) {
        const kf__cli_flag_t *g = &kf__cli_global_flags[i];
        if (strlen(g->name) == name_len && memcmp(g->name, name, name_len) == 0) {
            return g;
        }
    }
    return NULL;
}

static size_t count_occurrences(const kf__cli_args_t *args, const kf__cli_flag_t *flag) {
    size_t n = 0;
    for (size_t i = 0; i < args->occurrence_count; i++) {
        if (args->occurrences[i].flag == flag) {
            n++;
        }
    }
    return n;
}

int kf__cli_parse(const char *command, const kf__cli_flag_t *flags, size_t flag_count, int argc,
                  char **argv, bool allow_rest, kf__cli_args_t *out) {
    memset(out, 0, sizeof *out);
    out->command = command;
    out->flags = flags;
    out->flag_count = flag_count;
    for (int i = 0; i < argc; i++) {
        const char *word = argv[i];
        if (strcmp(word, "--") == 0) {
            if (!allow_rest) {
                return kf__cli_usage_error(command, "unexpected '--': this command runs nothing");
            }
            out->rest = &argv[i + 1];
            out->rest_count = argc - i - 1;
            return KF__CLI_EXIT_OK;
        }
        if (strcmp(word, "-h") == 0 || strcmp(word, "--help") == 0) {
            out->help = true;
            continue;
        }
        if (word[0] != '-' || word[1] == '\0') {
            /* A positional argument ("-" alone is one too: stdin). */
            if (out->positional_count == KF__CLI_POSITIONAL_MAX) {
                return kf__cli_usage_error(command, "too many arguments at '%s'", word);
            }
            out->positional[out->positional_count++] = word;
            continue;
        }
        const char *eq = strchr(word, '=');
        size_t name_len = eq != NULL ? (size_t)(eq - word) : strlen(word);
        const kf__cli_flag_t *flag = find_flag(flags, flag_count, word, name_len);
        if (flag == NULL || word[1] != '-') {
            return kf__cli_usage_error(command, "unknown flag %.*s", (int)name_len, word);
        }
        const char *value = NULL;
        if (flag->kind == KF__CLI_SWITCH) {
            if (eq != NULL) {
                return kf__cli_usage_error(command, "%s takes no value", flag->name);
            }
        } else if (eq != NULL) {
            value = eq + 1;
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            return kf__cli_usage_error(command, "%s requires a value (%s %s)", flag->name,
                                       flag->name, flag->value_name);
        }
        if (flag->kind != KF__CLI_LIST && count_occurrences(out, flag) > 0) {
            return kf__cli_usage_error(command, "%s given more than once", flag->name);
        }
        if (out->occurrence_count == KF__CLI_OCCURRENCES_MAX) {
            return kf__cli_usage_error(command, "too many flags at %s (at most %d)", flag->name,
                                       KF__CLI_OCCURRENCES_MAX);
        }
        out->occurrences[out->occurrence_count].flag = flag;
        out->occurrences[out->occurrence_count].value = value;
        out->occurrence_count++;
    }
    return KF__CLI_EXIT_OK;
}

/* The flag named `name`; asking for a flag the command does not declare is
 * a programmer error, caught here rather than silently reading "absent". */
static const kf__cli_flag_t *declared(const kf__cli_args_t *args, const char *name) {
    const kf__cli_flag_t *flag = find_flag(args->flags, args->flag_count, name, strlen(name));
    KF_ASSERT(flag != NULL);
    return flag;
}

bool kf__cli_has(const kf__cli_args_t *args, const char *name) {
    return count_occurrences(args, declared(args, name)) > 0;
}

const char *kf__cli_value(const kf__cli_args_t *args, const char *name) {
    const kf__cli_flag_t *flag = declared(args, name);
    KF_ASSERT(flag->kind != KF__CLI_SWITCH);
    for (size_t i = 0; i < args->occurrence_count; i++) {
        if (args->occurrences[i].flag == flag) {
            return args->occurrences[i].value;
        }
    }
    return NULL;
}

size_t kf__cli_list(const kf__cli_args_t *args, const char *name, const char **out, size_t max) {
    const kf__cli_flag_t *flag = declared(args, name);
    KF_ASSERT(flag->kind == KF__CLI_LIST);
    size_t n = 0;
    for (size_t i = 0; i < args->occurrence_count && n < max; i++) {
        if (args->occurrences[i].flag == flag) {
            out[n++] = args->occurrences[i].value;
        }
    }
    return n;
}

int kf__cli_require(const kf__cli_args_t *args, const char *name, const char **out) {
    const kf__cli_flag_t *flag = declared(args, name);
    const char *value = kf__cli_value(args, name);
    if (value == NULL) {
        return kf__cli_usage_error(args->command, "%s %s is required", flag->name,
                                   flag->value_name);
    }
    *out = value;
    return KF__CLI_EXIT_OK;
}

int kf__cli_int64(const kf__cli_args_t *args, const char *name, int64_t min, int64_t max,
                  bool *present, int64_t *out) {
    KF_ASSERT(min <= max);
    const char *text = kf__cli_value(args, name);
    *present = text != NULL;
    if (text == NULL) {
        return KF__CLI_EXIT_OK;
    }
    /* strtoll skips leading blanks and accepts a lone sign; neither is a
     * number a user meant to write, so both are refused up front. */
    if (text[0] == '\0' ||
        !((text[0] >= '0' && text[0] <= '9') || text[0] == '-' || text[0] == '+')) {
        return kf__cli_usage_error(args->command, "%s: expected an integer, got \"%s\"", name,
                                   text);
    }
    errno = 0;
    char *end = NULL;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end != '\0') {
        return kf__cli_usage_error(args->command, "%s: expected an integer, got \"%s\"", name,
                                   text);
    }
    if (errno == ERANGE || v < min || v > max) {
        return kf__cli_usage_error(args->command, "%s: must be in %lld..%lld, got %s", name,
                                   (long long)min, (long long)max, text);
    }
    *out = (int64_t)v;
    return KF__CLI_EXIT_OK;
}

kf_status_t kf__cli_read_fd(int fd, size_t max_bytes, char **out, size_t *len, kf_error_t *err) {
    size_t cap = 64 * 1024;
    size_t used = 0;
    char *buf = malloc(cap);
    if (buf == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate %zu bytes", cap);
    }
    for (;;) {
        if (used == cap) {
            /* Grow, but never past max_bytes + 1: one byte more than the
             * bound is enough to know the input is too large. */
            size_t next = cap * 2 > max_bytes + 1 ? max_bytes + 1 : cap * 2;
            if (next <= cap) {
                free(buf);
                return kf_error_set(err, KF_E_TOO_LARGE, "larger than %zu bytes", max_bytes);
            }
            char *grown = realloc(buf, next);
            if (grown == NULL) {
                free(buf);
                return kf_error_set(err, KF_E_NOMEM, "cannot allocate %zu bytes", next);
            }
            buf = grown;
            cap = next;
        }
        ssize_t n = read(fd, buf + used, cap - used);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            int saved = errno;
            free(buf);
            return kf_error_set(err, KF_E_IO, "read failed: %s", strerror(saved));
        }
        if (n == 0) {
            break;
        }
        used += (size_t)n;
        if (used > max_bytes) {
            free(buf);
            return kf_error_set(err, KF_E_TOO_LARGE, "larger than %zu bytes", max_bytes);
        }
    }
    if (memchr(buf, '\0', used) != NULL) {
        free(buf);
        return kf_error_set(err, KF_E_INVALID, "contains a NUL byte");
    }
    if (used == cap) {
        char *grown = realloc(buf, cap + 1);
        if (grown == NULL) {
            free(buf);
            return kf_error_set(err, KF_E_NOMEM, "cannot allocate %zu bytes", cap + 1);
        }
        buf = grown;
    }
    buf[used] = '\0';
    *out = buf;
    *len = used;
    return KF_OK;
}

kf_status_t kf__cli_read_path(const char *path, size_t max_bytes, char **out, size_t *len,
                              kf_error_t *err) {
    if (strcmp(path, "-") == 0) {
        return kf__cli_read_fd(STDIN_FILENO, max_bytes, out, len, err);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return kf_error_set(err, KF_E_IO, "%s: %s", path, strerror(errno));
    }
    kf_status_t st = kf__cli_read_fd(fd, max_bytes, out, len, err);
    close(fd);
    if (st != KF_OK) {
        /* Name the file in the message the caller prints. */
        char inner[sizeof err->message];
        snprintf(inner, sizeof inner, "%s", err->message);
        kf_error_set(err, st, "%s: %s", path, inner);
    }
    return st;
}

int kf__cli_read_file_flag(const kf__cli_args_t *args, size_t max_bytes, char **text, size_t *len,
                           const char **shown) {
    const char *path = kf__cli_value(args, "--file");
    if (path == NULL) {
        path = "-";
    }
    *shown = strcmp(path, "-") == 0 ? "stdin" : path;
    kf_error_t err;
    if (kf__cli_read_path(path, max_bytes, text, len, &err) != KF_OK) {
        return kf__cli_usage_error(args->command, "--file: %s", err.message);
    }
    return KF__CLI_EXIT_OK;
}
