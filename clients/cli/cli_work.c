/*
 * cli_work.c - `keyflow work`: a worker loop that runs a command per run.
 *
 *   kf__cli_work: PollRuns (long poll, max_runs 1) --nothing--> poll again
 *        |                                          (--once: exit 1)
 *        | one leased run -> handle_run
 *        v
 *   spawn_child --> pump_child: stdin <- input, stdout -> result buffer,
 *        |                      stderr -> our stderr + a tail for the error;
 *        |                      heartbeat_if_due every lease/2 (refused:
 *        |                      SIGTERM the child, skip completion)
 *        v
 *   outcome_from_exit --> complete_run (bounded retries) --> print the run
 *        --> poll again (--once, or --max-runs reached: exit 0)
 *
 * Invariants
 *   1. Only one run is leased at a time (max_runs 1 per poll): a worker
 *      never holds a lease it is not working on, so no lease expires while
 *      its run waits behind another.
 *   2. The child gets exactly one copy of the input, its own stdin, stdout
 *      and stderr, the default SIGPIPE disposition and an empty signal mask,
 *      whatever this process set for itself (it ignores SIGPIPE so that a
 *      child that stops reading is an EPIPE, not our death).
 *   3. Every buffer is bounded: stdout at KF_RUN_RESULT_BYTES_MAX (more is
 *      a failed run, never a truncated result), the stderr tail at
 *      STDERR_TAIL_BYTES, the error text at ERROR_TEXT_BYTES; retries of
 *      poll and complete are bounded too.
 *   4. The child is spawned with posix_spawnp, never fork: gRPC's threads
 *      hold locks a forked child could inherit mid-use.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "base/assert.h"
#include "base/clock.h"
#include "base/limits.h"
#include "cli.h"

extern char **environ;

/* The last bytes of the child's stderr, where its last line is found. */
#define STDERR_TAIL_BYTES 1024
/* "exit status N: <last stderr line>", well inside the server's bound. */
#define ERROR_TEXT_BYTES (STDERR_TAIL_BYTES + 64)
#define IO_CHUNK_BYTES   (64 * 1024)
/* Consecutive failed polls (server unavailable) before the loop gives up,
 * and the longest pause between them: about two minutes in all. */
#define POLL_RETRIES_MAX   30
#define RETRY_DELAY_MS_MAX 5000
/* Attempts to deliver one completion through transient failures. */
#define COMPLETE_ATTEMPTS_MAX 5
/* How often a child that closed its output is checked for exit. */
#define EXIT_CHECK_MS 20
/* After a failed (not refused) heartbeat, the next try comes at most this
 * late (a tenth of the lease when that is sooner). */
#define HEARTBEAT_RETRY_MS 1000
/* The shortest deadline a heartbeat gets, whatever the lease. */
#define HEARTBEAT_DEADLINE_MS_MIN 1000

_Static_assert(ERROR_TEXT_BYTES < KF_RUN_ERROR_BYTES_MAX, "error text fits the server's bound");

typedef struct work {
    kf__cli_t *cli;
    const char *worker;
    const char *workflows[KF_POLL_WORKFLOWS_MAX];
    size_t workflow_count;
    int64_t lease_ms; /* requested on every poll, so heartbeats know it */
    int64_t wait_ms;
    bool once;
    int64_t runs_max; /* 0: unbounded */
    char **argv;      /* CMD ARGS..., NULL-terminated (from main's argv) */
} work_t;

typedef struct child {
    pid_t pid;
    int in_fd; /* our ends of the pipes; -1 once closed */
    int out_fd;
    int err_fd;
    const char *input; /* in the arena */
    size_t input_len;
    size_t input_off; /* bytes already written */
    char *out;        /* in the arena, KF_RUN_RESULT_BYTES_MAX + 1 */
    size_t out_len;
    bool out_overflow; /* stdout passed KF_RUN_RESULT_BYTES_MAX */
    char err_tail[STDERR_TAIL_BYTES];
    size_t err_tail_len;
    /* Lease upkeep, in monotonic ms. */
    int64_t heartbeat_due_ms;
    bool lease_lost;
    bool cancel_signalled; /* CancelRun asked: the child got SIGTERM */
    bool wait_failed;      /* the exit status could not be collected */
} child_t;

typedef enum outcome_kind {
    OUTCOME_RESULT,     /* complete with result_json */
    OUTCOME_ERROR,      /* complete with error */
    OUTCOME_LEASE_LOST, /* do not complete: the run is someone else's now */
} outcome_kind_t;

typedef struct outcome {
    outcome_kind_t kind;
    const char *result_json; /* in the arena */
    char error[ERROR_TEXT_BYTES];
} outcome_t;

static int64_t mono_ms(void) {
    return kf_mono_us() / 1000;
}

static void sleep_ms(int64_t ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static bool transient(kf_status_t st) {
    return st == KF_E_UNAVAILABLE || st == KF_E_TIMEOUT;
}

/* ---- text helpers ------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s[0..len), 0 when it is not one
 * (bad lead or continuation byte, overlong form, surrogate, > U+10FFFF). */
static size_t utf8_sequence(const unsigned char *s, size_t len) {
    static const uint32_t min_code_point[5] = {0, 0, 0x80, 0x800, 0x10000};
    unsigned char b = s[0];
    size_t n;
    uint32_t cp;
    if (b < 0x80) {
        return 1;
    } else if ((b & 0xE0) == 0xC0) {
        n = 2;
        cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
        n = 3;
        cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
        n = 4;
        cp = b & 0x07;
    } else {
        return 0;
    }
    if (n > len) {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            return 0;
        }
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min_code_point[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
        return 0;
    }
    return n;
}

/* Appends s[0..len) to dst (NUL-terminated, capacity cap) as clean text:
 * the server stores the error as a protobuf string, which must be UTF-8,
 * and shows it on one line, so invalid bytes and control characters become
 * '?' (a tab becomes a space). Stops at the capacity. */
static void append_clean(char *dst, size_t cap, const char *s, size_t len) {
    size_t used = strlen(dst);
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t n = utf8_sequence(u + i, len - i);
        if (used + (n > 0 ? n : 1) + 1 > cap) {
            break;
        }
        if (n == 1 && u[i] == '\t') {
            dst[used++] = ' ';
        } else if (n == 0 || (n == 1 && (u[i] < 0x20 || u[i] == 0x7F))) {
            dst[used++] = '?';
            n = 1;
        } else {
            memcpy(dst + used, s + i, n);
            used += n;
        }
        i += n;
    }
    dst[used] = '\0';
}

/* The last non-empty line of the stderr tail (without its newline). */
static size_t last_line(const char *buf, size_t len, const char **start) {
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' ' ||
                       buf[len - 1] == '\t')) {
        len--;
    }
    size_t i = len;
    while (i > 0 && buf[i - 1] != '\n') {
        i--;
    }
    *start = buf + i;
    return len - i;
}

/* ---- the child process -------------------------------------------------- */

static int make_pipe(int fds[2]) {
    if (pipe(fds) != 0) {
        return -1;
    }
    /* Close-on-exec on both ends: the child gets only the dup2'd copies,
     * so no other child (or grandchild) can hold a pipe open. */
    (void)fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    (void)fcntl(fds[1], F_SETFD, FD_CLOEXEC);
    return 0;
}

static void close_fd(int *fd) {
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

/* The environment for the child: ours, with KEYFLOW_RUN_ID, _WORKFLOW and
 * _KEY replaced by this run's. In the arena. */
static char **child_environment(kf_arena_t *arena, const Keyflow__V1__Run *run) {
    static const char *const replaced[] = {"KEYFLOW_RUN_ID=", "KEYFLOW_WORKFLOW=", "KEYFLOW_KEY="};
    size_t n = 0;
    while (environ[n] != NULL) {
        n++;
    }
    char **envp = kf_arena_alloc(arena, (n + 4) * sizeof *envp);
    if (envp == NULL) {
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool skip = false;
        for (size_t r = 0; r < sizeof replaced / sizeof replaced[0]; r++) {
            skip = skip || strncmp(environ[i], replaced[r], strlen(replaced[r])) == 0;
        }
        if (!skip) {
            envp[k++] = environ[i];
        }
    }
    envp[k++] = kf_arena_printf(arena, "KEYFLOW_RUN_ID=%s", run->run_id);
    envp[k++] = kf_arena_printf(arena, "KEYFLOW_WORKFLOW=%s", run->workflow);
    envp[k++] = kf_arena_printf(arena, "KEYFLOW_KEY=%s", run->key);
    envp[k] = NULL;
    for (size_t i = k - 3; i < k; i++) {
        if (envp[i] == NULL) {
            return NULL;
        }
    }
    return envp;
}

/* Starts the child with its pipes. On failure, *err says why (the run
 * then fails with that text) and nothing is left open. */
static kf_status_t spawn_child(work_t *w, const Keyflow__V1__Run *run, child_t *c,
                               kf_error_t *err) {
    kf_arena_t *arena = &w->cli->arena;
    char **envp = child_environment(arena, run);
    c->out = kf_arena_alloc(arena, KF_RUN_RESULT_BYTES_MAX + 1);
    if (envp == NULL || c->out == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "cannot run %s: out of memory", w->argv[0]);
    }
    int in_p[2] = {-1, -1};
    int out_p[2] = {-1, -1};
    int err_p[2] = {-1, -1};
    if (make_pipe(in_p) != 0 || make_pipe(out_p) != 0 || make_pipe(err_p) != 0) {
        int saved = errno;
        for (int i = 0; i < 2; i++) {
            close_fd(&in_p[i]);
            close_fd(&out_p[i]);
            close_fd(&err_p[i]);
        }
        return kf_error_set(err, KF_E_IO, "cannot run %s: pipe: %s", w->argv[0], strerror(saved));
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in_p[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out_p[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err_p[1], STDERR_FILENO);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t empty;
    sigset_t defaults;
    sigemptyset(&empty);
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);
    posix_spawnattr_setsigmask(&attr, &empty);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    int rc = posix_spawnp(&c->pid, w->argv[0], &actions, &attr, w->argv, envp);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    close_fd(&in_p[0]);
    close_fd(&out_p[1]);
    close_fd(&err_p[1]);
    c->in_fd = in_p[1];
    c->out_fd = out_p[0];
    c->err_fd = err_p[0];
    if (rc != 0) {
        close_fd(&c->in_fd);
        close_fd(&c->out_fd);
        close_fd(&c->err_fd);
        return kf_error_set(err, KF_E_IO, "cannot run %s: %s", w->argv[0], strerror(rc));
    }
    /* Writes to the child's stdin must not block us while it is busy
     * writing its own output: everything goes through poll. */
    int flags = fcntl(c->in_fd, F_GETFL);
    (void)fcntl(c->in_fd, F_SETFL, flags | O_NONBLOCK);
    if (c->input_len == 0) {
        close_fd(&c->in_fd);
    }
    return KF_OK;
}

/* Renews the lease when it is due. A refusal (the lease expired or was
 * taken over) stops the child: its work can no longer be completed. */
static void heartbeat_if_due(work_t *w, const Keyflow__V1__Run *run, child_t *c) {
    int64_t now = mono_ms();
    if (c->lease_lost || now < c->heartbeat_due_ms) {
        return;
    }
    Keyflow__V1__HeartbeatRunRequest req = KEYFLOW__V1__HEARTBEAT_RUN_REQUEST__INIT;
    req.run_id = run->run_id;
    req.lease = run->lease;
    req.lease_ms = w->lease_ms;
    Keyflow__V1__HeartbeatRunResponse *resp = NULL;
    kf_error_t err;
    /* Half a lease is as late as a heartbeat can usefully be, but a short
     * lease must not turn an ordinary hiccup into a timeout. */
    int64_t deadline_ms =
        w->lease_ms / 2 > HEARTBEAT_DEADLINE_MS_MIN ? w->lease_ms / 2 : HEARTBEAT_DEADLINE_MS_MIN;
    /* A scratch arena per heartbeat: a long run renews its lease many
     * times, and the run's arena must not grow with each reply. */
    kf_arena_t scratch;
    kf_arena_init(&scratch, 0);
    kf_status_t st =
        kf_client_heartbeat_run(w->cli->client, &req, &scratch, deadline_ms, &resp, &err);
    bool cancel_requested = st == KF_OK && resp->cancel_requested;
    kf_arena_deinit(&scratch);
    if (st == KF_OK) {
        c->heartbeat_due_ms = mono_ms() + w->lease_ms / 2;
        if (cancel_requested && !c->cancel_signalled) {
            /* Its report, whatever it is, now ends the run CANCELLED. */
            fprintf(stderr, "keyflow: work: run %s was cancelled; stopping its command\n",
                    run->run_id);
            c->cancel_signalled = true;
            (void)kill(c->pid, SIGTERM);
        }
        return;
    }
    fprintf(stderr, "keyflow: work: heartbeat of %s failed: %s: %s\n", run->run_id,
            kf_status_grpc_name(st), err.message);
    if (transient(st)) {
        /* Retry well before the lease runs out; the server says when it has. */
        int64_t retry_ms =
            w->lease_ms / 10 < HEARTBEAT_RETRY_MS ? w->lease_ms / 10 : HEARTBEAT_RETRY_MS;
        c->heartbeat_due_ms = mono_ms() + retry_ms;
        return;
    }
    c->lease_lost = true;
    (void)kill(c->pid, SIGTERM);
}

static void keep_stderr_tail(child_t *c, const char *buf, size_t n) {
    if (n >= STDERR_TAIL_BYTES) {
        memcpy(c->err_tail, buf + n - STDERR_TAIL_BYTES, STDERR_TAIL_BYTES);
        c->err_tail_len = STDERR_TAIL_BYTES;
        return;
    }
    if (c->err_tail_len + n > STDERR_TAIL_BYTES) {
        size_t drop = c->err_tail_len + n - STDERR_TAIL_BYTES;
        memmove(c->err_tail, c->err_tail + drop, c->err_tail_len - drop);
        c->err_tail_len -= drop;
    }
    memcpy(c->err_tail + c->err_tail_len, buf, n);
    c->err_tail_len += n;
}

/* One readable pipe: stdout into the bounded result buffer, stderr to our
 * stderr and into the tail. Closes the fd at EOF or on error. */
static void drain(child_t *c, int *fd, bool is_stdout) {
    char chunk[IO_CHUNK_BYTES];
    ssize_t n = read(*fd, chunk, sizeof chunk);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
        return;
    }
    if (n <= 0) {
        close_fd(fd);
        return;
    }
    size_t len = (size_t)n;
    if (is_stdout) {
        size_t room = KF_RUN_RESULT_BYTES_MAX - c->out_len;
        if (len > room) {
            /* Keep reading so the child is not blocked, but the result is
             * lost: the run fails rather than carry a truncated result. */
            c->out_overflow = true;
            len = room;
        }
        memcpy(c->out + c->out_len, chunk, len);
        c->out_len += len;
    } else {
        ssize_t written = write(STDERR_FILENO, chunk, len);
        (void)written; /* our stderr is best effort; the tail is what counts */
        keep_stderr_tail(c, chunk, len);
    }
}

static void feed_stdin(child_t *c) {
    size_t left = c->input_len - c->input_off;
    size_t chunk = left < IO_CHUNK_BYTES ? left : IO_CHUNK_BYTES;
    ssize_t n = write(c->in_fd, c->input + c->input_off, chunk);
    if (n < 0) {
        if (errno != EINTR && errno != EAGAIN) {
            /* EPIPE: the child does not read its input; not an error. */
            close_fd(&c->in_fd);
        }
        return;
    }
    c->input_off += (size_t)n;
    if (c->input_off == c->input_len) {
        close_fd(&c->in_fd); /* EOF tells the child the input is complete */
    }
}

/* Moves bytes until the child has closed its output and exited, renewing
 * the lease meanwhile. Returns the wait status. */
static int pump_child(work_t *w, const Keyflow__V1__Run *run, child_t *c) {
    while (c->in_fd >= 0 || c->out_fd >= 0 || c->err_fd >= 0) {
        struct pollfd fds[3];
        int *owners[3];
        nfds_t n = 0;
        if (c->in_fd >= 0) {
            fds[n] = (struct pollfd){c->in_fd, POLLOUT, 0};
            owners[n++] = &c->in_fd;
        }
        if (c->out_fd >= 0) {
            fds[n] = (struct pollfd){c->out_fd, POLLIN, 0};
            owners[n++] = &c->out_fd;
        }
        if (c->err_fd >= 0) {
            fds[n] = (struct pollfd){c->err_fd, POLLIN, 0};
            owners[n++] = &c->err_fd;
        }
        int64_t wait = c->lease_lost ? -1 : c->heartbeat_due_ms - mono_ms();
        int timeout = wait < 0 ? (c->lease_lost ? -1 : 0) : (wait > INT_MAX ? INT_MAX : (int)wait);
        int ready = poll(fds, n, timeout);
        if (ready < 0 && errno != EINTR) {
            /* Cannot watch the pipes any more: stop the child rather than
             * spin, and report what it managed. */
            fprintf(stderr, "keyflow: work: poll: %s\n", strerror(errno));
            (void)kill(c->pid, SIGKILL);
            close_fd(&c->in_fd);
            close_fd(&c->out_fd);
            close_fd(&c->err_fd);
            break;
        }
        for (nfds_t i = 0; ready > 0 && i < n; i++) {
            if (fds[i].revents == 0) {
                continue;
            }
            if (owners[i] == &c->in_fd) {
                if (fds[i].revents & (POLLERR | POLLHUP | POLLNVAL)) {
                    close_fd(&c->in_fd);
                } else {
                    feed_stdin(c);
                }
            } else {
                drain(c, owners[i], owners[i] == &c->out_fd);
            }
        }
        heartbeat_if_due(w, run, c);
    }
    /* The child may outlive its output (it closed stdout and kept going). */
    for (;;) {
        int status = 0;
        pid_t r = waitpid(c->pid, &status, WNOHANG);
        if (r == c->pid) {
            return status;
        }
        if (r < 0 && errno != EINTR) {
            /* ECHILD cannot happen: SIGCHLD is at its default (see
             * kf__cli_work), so nothing reaps the child behind our back. */
            fprintf(stderr, "keyflow: work: waitpid: %s\n", strerror(errno));
            c->wait_failed = true;
            return 0;
        }
        heartbeat_if_due(w, run, c);
        sleep_ms(EXIT_CHECK_MS);
    }
}

/* ---- outcomes ----------------------------------------------------------- */

static void fail_outcome(outcome_t *o, const char *fmt, const char *detail, size_t detail_len) {
    o->kind = OUTCOME_ERROR;
    o->error[0] = '\0';
    append_clean(o->error, sizeof o->error, fmt, strlen(fmt));
    if (detail_len > 0) {
        append_clean(o->error, sizeof o->error, ": ", 2);
        append_clean(o->error, sizeof o->error, detail, detail_len);
    }
}

/* The child exited 0: its stdout is the result, as is when it is JSON,
 * else as a JSON string. */
static void result_from_stdout(kf_arena_t *arena, const child_t *c, outcome_t *o) {
    if (c->out_overflow) {
        char msg[128];
        snprintf(msg, sizeof msg, "stdout: more than %d bytes (KF_RUN_RESULT_BYTES_MAX)",
                 KF_RUN_RESULT_BYTES_MAX);
        fail_outcome(o, msg, NULL, 0);
        return;
    }
    const char *text = c->out;
    size_t len = c->out_len;
    while (len > 0 && (text[0] == ' ' || text[0] == '\n' || text[0] == '\r' || text[0] == '\t')) {
        text++;
        len--;
    }
    while (len > 0 && (text[len - 1] == ' ' || text[len - 1] == '\n' || text[len - 1] == '\r' ||
                       text[len - 1] == '\t')) {
        len--;
    }
    json_error_t jerr;
    json_t *value = len > 0 ? json_loadb(text, len, JSON_DECODE_ANY, &jerr) : NULL;
    if (value != NULL) {
        json_decref(value);
        o->kind = OUTCOME_RESULT;
        o->result_json = kf_arena_strndup(arena, text, len);
    } else {
        /* Plain text: only trailing newlines go, as with $(...) in sh. */
        size_t text_len = c->out_len;
        while (text_len > 0 && (c->out[text_len - 1] == '\n' || c->out[text_len - 1] == '\r')) {
            text_len--;
        }
        json_t *str = json_stringn(c->out, text_len);
        if (str == NULL) {
            fail_outcome(o, "stdout: neither JSON nor UTF-8 text", NULL, 0);
            return;
        }
        char *quoted = json_dumps(str, JSON_ENCODE_ANY | JSON_COMPACT);
        json_decref(str);
        if (quoted == NULL || strlen(quoted) > KF_RUN_RESULT_BYTES_MAX) {
            free(quoted);
            fail_outcome(o, "stdout: too large once quoted as a JSON string", NULL, 0);
            return;
        }
        o->kind = OUTCOME_RESULT;
        o->result_json = kf_arena_strdup(arena, quoted);
        free(quoted);
    }
    if (o->result_json == NULL) {
        fail_outcome(o, "stdout: out of memory", NULL, 0);
    }
}

static void outcome_from_exit(kf_arena_t *arena, const child_t *c, int status, outcome_t *o) {
    if (c->lease_lost) {
        o->kind = OUTCOME_LEASE_LOST;
        return;
    }
    const char *line = NULL;
    size_t line_len = last_line(c->err_tail, c->err_tail_len, &line);
    char head[64];
    if (c->wait_failed) {
        fail_outcome(o, "the command's exit status could not be collected", line, line_len);
        return;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        result_from_stdout(arena, c, o);
        return;
    }
    if (WIFEXITED(status)) {
        snprintf(head, sizeof head, "exit status %d", WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
        snprintf(head, sizeof head, "killed by signal %d", WTERMSIG(status));
    } else {
        snprintf(head, sizeof head, "ended with wait status %d", status);
    }
    fail_outcome(o, head, line, line_len);
}

/* ---- one run ------------------------------------------------------------ */

/* Completes the run, retrying transient failures a bounded number of times
 * (a retry with the same lease and outcome is idempotent on the server). */
static kf_status_t complete_run(work_t *w, const Keyflow__V1__Run *run, const outcome_t *o,
                                Keyflow__V1__CompleteRunResponse **resp, kf_error_t *err) {
    Keyflow__V1__CompleteRunRequest req = KEYFLOW__V1__COMPLETE_RUN_REQUEST__INIT;
    req.run_id = run->run_id;
    req.lease = run->lease;
    if (o->kind == OUTCOME_RESULT) {
        req.outcome_case = KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_RESULT_JSON;
        req.result_json = (char *)o->result_json;
    } else {
        req.outcome_case = KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_ERROR;
        req.error = (char *)o->error;
    }
    kf_status_t st = KF_OK;
    int64_t delay_ms = 100;
    for (int attempt = 1; attempt <= COMPLETE_ATTEMPTS_MAX; attempt++) {
        st = kf_client_complete_run(w->cli->client, &req, &w->cli->arena,
                                    kf__cli_timeout_ms(w->cli, 0), resp, err);
        if (st == KF_OK || !transient(st) || attempt == COMPLETE_ATTEMPTS_MAX) {
            break;
        }
        sleep_ms(delay_ms);
        delay_ms *= 2;
    }
    return st;
}

/* Runs CMD for one leased run and completes it. Returns an exit code:
 * OK when the run was completed (whatever CMD's own status). */
static int handle_run(work_t *w, const Keyflow__V1__Run *run) {
    child_t c;
    memset(&c, 0, sizeof c);
    c.in_fd = c.out_fd = c.err_fd = -1;
    c.heartbeat_due_ms = mono_ms() + w->lease_ms / 2;
    /* An empty input is JSON null by the API's convention; the newline
     * makes it a text line for line-oriented tools. */
    c.input = kf_arena_printf(&w->cli->arena, "%s\n",
                              run->input_json[0] != '\0' ? run->input_json : "null");
    c.input_len = c.input != NULL ? strlen(c.input) : 0;

    outcome_t o;
    memset(&o, 0, sizeof o);
    kf_error_t err;
    if (c.input == NULL) {
        fail_outcome(&o, "cannot run the command: out of memory", NULL, 0);
    } else if (spawn_child(w, run, &c, &err) != KF_OK) {
        fail_outcome(&o, err.message, NULL, 0);
    } else {
        int status = pump_child(w, run, &c);
        outcome_from_exit(&w->cli->arena, &c, status, &o);
    }
    if (o.kind == OUTCOME_LEASE_LOST) {
        fprintf(stderr,
                "keyflow: work: lost the lease of %s; the run is left to its next "
                "attempt\n",
                run->run_id);
        return KF__CLI_EXIT_ERROR;
    }
    Keyflow__V1__CompleteRunResponse *resp = NULL;
    if (complete_run(w, run, &o, &resp, &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(w->cli, resp->run != NULL ? &resp->run->base : &resp->base);
}

/* ---- the loop ----------------------------------------------------------- */

static int parse_work(const kf__cli_args_t *args, work_t *w) {
    int rc = kf__cli_require(args, "--worker", &w->worker);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    const char *all[KF__CLI_OCCURRENCES_MAX];
    size_t count = kf__cli_list(args, "--workflow", all, KF__CLI_OCCURRENCES_MAX);
    if (count == 0) {
        return kf__cli_usage_error(args->command, "--workflow W is required");
    }
    if (count > KF_POLL_WORKFLOWS_MAX) {
        return kf__cli_usage_error(args->command, "--workflow: at most %d, got %zu",
                                   KF_POLL_WORKFLOWS_MAX, count);
    }
    memcpy(w->workflows, all, count * sizeof all[0]);
    w->workflow_count = count;
    bool present = false;
    /* These bound local timing, so they are checked here, against the
     * server's own bounds. */
    w->lease_ms = KF_LEASE_MS_DEFAULT;
    if ((rc = kf__cli_int64(args, "--lease-ms", KF_LEASE_MS_MIN, KF_LEASE_MS_MAX, &present,
                            &w->lease_ms)) != KF__CLI_EXIT_OK) {
        return rc;
    }
    w->wait_ms = 30000;
    if ((rc = kf__cli_int64(args, "--wait-ms", 0, KF_POLL_WAIT_MS_MAX, &present, &w->wait_ms)) !=
        KF__CLI_EXIT_OK) {
        return rc;
    }
    if ((rc = kf__cli_int64(args, "--max-runs", 1, INT64_MAX, &present, &w->runs_max)) !=
        KF__CLI_EXIT_OK) {
        return rc;
    }
    w->once = kf__cli_has(args, "--once");
    if (w->once && present) {
        return kf__cli_usage_error(args->command, "--once and --max-runs exclude each other");
    }
    w->argv = args->rest;
    KF_ASSERT(w->argv != NULL && args->rest_count > 0 && w->argv[args->rest_count] == NULL);
    return KF__CLI_EXIT_OK;
}

int kf__cli_work(kf__cli_t *cli, const kf__cli_args_t *args) {
    work_t w;
    memset(&w, 0, sizeof w);
    w.cli = cli;
    int rc = parse_work(args, &w);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    /* A child that exits without reading all of its input must show up as
     * EPIPE on our write, not kill the worker. */
    signal(SIGPIPE, SIG_IGN);
    /* An inherited SIG_IGN for SIGCHLD would reap children automatically
     * and leave waitpid without an exit status to report. */
    signal(SIGCHLD, SIG_DFL);

    int64_t handled = 0;
    int failures = 0;
    int64_t delay_ms = 100;
    for (;;) {
        if (w.runs_max > 0 && handled >= w.runs_max) {
            return KF__CLI_EXIT_OK;
        }
        kf_arena_reset(&cli->arena);
        Keyflow__V1__PollRunsRequest req = KEYFLOW__V1__POLL_RUNS_REQUEST__INIT;
        req.workflows = (char **)w.workflows;
        req.n_workflows = w.workflow_count;
        req.worker_id = (char *)w.worker;
        req.lease_ms = w.lease_ms;
        req.max_runs = 1;
        req.wait_ms = w.wait_ms;
        Keyflow__V1__PollRunsResponse *resp = NULL;
        kf_error_t err;
        kf_status_t st = kf_client_poll_runs(cli->client, &req, &cli->arena,
                                             kf__cli_timeout_ms(cli, w.wait_ms), &resp, &err);
        if (st != KF_OK) {
            if (w.once || !transient(st) || ++failures > POLL_RETRIES_MAX) {
                return kf__cli_fail(&err);
            }
            fprintf(stderr, "keyflow: work: poll failed (%s: %s); retrying in %lld ms\n",
                    kf_status_grpc_name(st), err.message, (long long)delay_ms);
            sleep_ms(delay_ms);
            delay_ms = delay_ms * 2 > RETRY_DELAY_MS_MAX ? RETRY_DELAY_MS_MAX : delay_ms * 2;
            continue;
        }
        failures = 0;
        delay_ms = 100;
        if (resp->n_runs == 0) {
            if (w.once) {
                fprintf(stderr, "keyflow: work: no run arrived within %lld ms\n",
                        (long long)w.wait_ms);
                return KF__CLI_EXIT_ERROR;
            }
            continue;
        }
        for (size_t i = 0; i < resp->n_runs; i++) {
            rc = handle_run(&w, resp->runs[i]);
            handled++;
            if (w.once) {
                return rc;
            }
        }
    }
}
