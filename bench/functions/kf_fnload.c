/*
 * kf_fnload.c - load generator for keyflowd's process functions
 * (keyflow.v1.Functions, DESIGN.md section 1) over the gRPC C core API;
 * bench/README.md, section "Process functions", explains the method.
 *
 * Modes:
 *   push    registers a function from a handler's built descriptor JSON
 *           (running_sum), with its function_id and pipeline_state_id
 *           rewritten so that every run starts from empty state, then
 *           --producers producers each keep one PushBatch outstanding
 *           (closed loop) for --warmup-s + --duration-s. A batch is a
 *           columnar RowBatch of --rows rows: `user` UTF8 keys "u0001234"
 *           drawn uniformly from --keys, `ts` TIMESTAMP_US increasing per
 *           producer, `amount` INT64.
 *   fill    the same batches, as fast as possible, until --rows-total rows
 *           were pushed (the setup for read).
 *   read    pages through a function's output with ReadOutput (--limit rows
 *           per page, columnar) from after_seq 0 to the last durable row.
 *   timers  registers session_counter with explicit max_keys and max_timers
 *           limits, pushes --timers rows with distinct keys (each arms the
 *           key's "idle" timer at ts + --idle-us; no watermark is sent, so
 *           none fires), then times one PushBatch that carries only a
 *           watermark past every timer: the server fires them all in that
 *           one step.
 *
 * How batches are built (the client must not be the bottleneck):
 *   * requests are encoded by hand in protobuf wire format as a list of
 *     slices: a small per-batch header (ids, sequence, lengths), the `user`
 *     column, the `ts` column and the third column;
 *   * the `user` columns of full batches are drawn and encoded before the
 *     run (a pool of USER_POOL independent uniform draws, one picked at
 *     random per batch), the third column once; a byte buffer takes a
 *     reference on these shared slices, no copy;
 *   * per batch only the header and the `ts` column (--rows varints) are
 *     encoded; distinct-key batches (timers) and a short last batch (fill)
 *     encode their columns on the fly, outside any timed window;
 *   * the first request of every run is decoded back with protobuf-c and
 *     checked field by field before any load starts.
 *
 * Measurement: as kf_load. Latency from just before the call is created to
 * its completion (monotonic clock) into a log-linear histogram (1/64
 * relative bucket width); statuses into a per-code count; the first error
 * of each kind printed with its details. CPU of the client (getrusage), the
 * server (/proc/PID/stat), each server thread by name (/proc/PID/task) and
 * the machine (/proc/stat) over the window. Output: one human line, then one
 * JSON line per result. The tool reports; it never judges (exit status 0
 * unless the run itself could not be set up).
 *
 * Invariants:
 *   1. A producer has at most one call outstanding, and its sequence
 *      numbers increase by one per batch it starts (a failed batch is not
 *      retried; the next one takes the next number).
 *   2. A producer and its slices are touched only by the worker thread
 *      while the load runs (its completion queue delivers only its tags).
 *   3. Every call ends: a call still pending DRAIN_GRACE_MS after its
 *      deadline is cancelled.
 *   4. Memory is bounded by the flags: the pools and one batch in flight
 *      per producer; histograms are fixed arrays.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include "base/arena.h"
#include "base/status.h"
#include "http/json_map.h"
#include "keyflow/v1/functions.pb-c.h"

/* Flag bounds: enough for anything this machine can drive, small enough
 * that a typo cannot allocate gigabytes. */
#define PRODUCERS_MAX        256
#define CHANNELS_MAX         64
#define ROWS_MAX             65536    /* the server's ceiling for max_input_rows */
#define KEYS_MAX             10000000 /* keys are a letter and 7 digits */
#define ROWS_TOTAL_MAX       100000000
#define DURATION_S_MAX       3600
#define DESCRIPTOR_BYTES_MAX (1024 * 1024)
#define ID_BYTES_MAX         100

/* Independent uniform key draws encoded before a push run. */
#define USER_POOL 16
/* Key text: a letter and KEY_DIGITS digits ("u0001234"). */
#define KEY_DIGITS 7
#define KEY_BYTES  (1 + KEY_DIGITS)
/* A call still outstanding this long after its deadline is cancelled. */
#define DRAIN_GRACE_MS 2000
#define POLL_MS        100
/* Setup calls (register, get) and read pages. */
#define SETUP_DEADLINE_MS 30000

#define METHOD_REGISTER "/keyflow.v1.Functions/RegisterFunction"
#define METHOD_GET      "/keyflow.v1.Functions/GetFunction"
#define METHOD_PUSH     "/keyflow.v1.Functions/PushBatch"
#define METHOD_READ     "/keyflow.v1.Functions/ReadOutput"

/* ---- Histogram ---------------------------------------------------------
 *
 * Log-linear over nanoseconds: every power of two [2^k, 2^(k+1)) above
 * 2^HIST_BITS is cut into 2^HIST_BITS equal buckets (1/64 of the value at
 * most); below that each value has its own bucket. Clamped at 2^40 ns. */
#define HIST_BITS       6
#define HIST_PER_OCTAVE (1u << HIST_BITS)
#define HIST_TOP_BIT    40
#define HIST_CLAMP      ((UINT64_C(1) << HIST_TOP_BIT) - 1)
#define HIST_SIZE       ((HIST_TOP_BIT - HIST_BITS + 1) * HIST_PER_OCTAVE)

typedef struct histogram {
    uint64_t bucket[HIST_SIZE];
    uint64_t count;
    uint64_t sum_ns;
    uint64_t max_ns;
} histogram_t;

static size_t hist_bucket_of(uint64_t ns) {
    if (ns > HIST_CLAMP) {
        ns = HIST_CLAMP;
    }
    if (ns < HIST_PER_OCTAVE) {
        return (size_t)ns;
    }
    unsigned top = 63u - (unsigned)__builtin_clzll(ns);    /* >= HIST_BITS */
    unsigned drop = top - HIST_BITS;                       /* low bits ignored */
    size_t sub = (size_t)((ns >> drop) - HIST_PER_OCTAVE); /* 0 .. 63 */
    return (size_t)(drop + 1) * HIST_PER_OCTAVE + sub;
}

/* The midpoint of a bucket, in nanoseconds. */
static uint64_t hist_bucket_mid(size_t b) {
    if (b < HIST_PER_OCTAVE) {
        return b;
    }
    unsigned drop = (unsigned)(b / HIST_PER_OCTAVE) - 1;
    uint64_t low = ((uint64_t)(b % HIST_PER_OCTAVE) + HIST_PER_OCTAVE) << drop;
    return low + (((UINT64_C(1) << drop) - 1) >> 1);
}

static void hist_add(histogram_t *h, uint64_t ns) {
    h->bucket[hist_bucket_of(ns)]++;
    h->count++;
    h->sum_ns += ns;
    if (ns > h->max_ns) {
        h->max_ns = ns;
    }
}

/* The q-quantile in microseconds: the first bucket whose running count
 * reaches ceil(q * count), reported as its midpoint, never above the max. */
static double hist_q_us(const histogram_t *h, double q) {
    if (h->count == 0) {
        return 0.0;
    }
    double want = q * (double)h->count;
    uint64_t rank = (uint64_t)want;
    if ((double)rank < want || rank == 0) {
        rank++;
    }
    uint64_t run = 0;
    for (size_t b = 0; b < HIST_SIZE; b++) {
        run += h->bucket[b];
        if (run >= rank) {
            uint64_t v = hist_bucket_mid(b);
            return (double)(v < h->max_ns ? v : h->max_ns) / 1e3;
        }
    }
    return (double)h->max_ns / 1e3;
}

static double hist_mean_us(const histogram_t *h) {
    return h->count ? (double)h->sum_ns / (double)h->count / 1e3 : 0.0;
}

/* ---- Clocks, CPU and memory -------------------------------------------- */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void sleep_until(int64_t when_ns) {
    struct timespec ts = {.tv_sec = when_ns / 1000000000, .tv_nsec = when_ns % 1000000000};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* splitmix64: one multiply-xorshift chain per draw, plenty for key picks. */
static uint64_t rand_next(uint64_t *s) {
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static double own_cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* utime + stime clock ticks from a /proc/.../stat text; -1 when unreadable.
 * The command name in parentheses may hold spaces: parse after the last
 * ')'. `comm` (optional) receives the name. */
static long long stat_ticks(const char *path, char *comm, size_t comm_size) {
    char buf[1024];
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *open = strchr(buf, '(');
    char *close = strrchr(buf, ')');
    if (open == NULL || close == NULL || close < open) {
        return -1;
    }
    if (comm != NULL && comm_size > 0) {
        size_t len = (size_t)(close - open - 1);
        if (len >= comm_size) {
            len = comm_size - 1;
        }
        memcpy(comm, open + 1, len);
        comm[len] = '\0';
    }
    unsigned long long ut = 0, st = 0;
    /* state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
     * utime stime */
    if (sscanf(close + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) !=
        2) {
        return -1;
    }
    return (long long)(ut + st);
}

static double ticks_per_s(void) {
    return (double)sysconf(_SC_CLK_TCK);
}

static double process_cpu_s(long pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    long long t = stat_ticks(path, NULL, 0);
    return t < 0 ? -1.0 : (double)t / ticks_per_s();
}

/* Busy CPU seconds of the whole machine (idle and iowait excluded). */
static double machine_cpu_s(void) {
    FILE *f = fopen("/proc/stat", "r");
    if (f == NULL) {
        return -1.0;
    }
    unsigned long long user, nice, sys, idle, iowait, irq, softirq, steal;
    int got = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &sys, &idle,
                     &iowait, &irq, &softirq, &steal);
    fclose(f);
    if (got != 8) {
        return -1.0;
    }
    return (double)(user + nice + sys + irq + softirq + steal) / ticks_per_s();
}

/* One field of /proc/PID/status in kB (VmRSS, VmHWM); -1 when unknown. */
static long proc_status_kb(long pid, const char *field) {
    char path[64];
    char line[256];
    snprintf(path, sizeof path, "/proc/%ld/status", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    long kb = -1;
    size_t flen = strlen(field);
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, field, flen) == 0 && line[flen] == ':') {
            kb = strtol(line + flen + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kb;
}

/* Per-thread CPU of the server, summed by thread name (kf-engine,
 * kf-commit, kf-reply, kf-grpc, gRPC's own threads), so that a run shows
 * which stage is saturated. */
#define THREADS_TRACKED  128
#define THREAD_NAMES_MAX 32

typedef struct thread_sample {
    int tid;
    char name[32];
    long long ticks;
} thread_sample_t;

typedef struct threads_snapshot {
    size_t n;
    thread_sample_t t[THREADS_TRACKED];
} threads_snapshot_t;

static void threads_take(long pid, threads_snapshot_t *s) {
    s->n = 0;
    if (pid <= 0) {
        return;
    }
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%ld/task", pid);
    DIR *d = opendir(dir);
    if (d == NULL) {
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL && s->n < THREADS_TRACKED) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') {
            continue;
        }
        char path[384]; /* d_name is up to 255 bytes */
        snprintf(path, sizeof path, "/proc/%ld/task/%s/stat", pid, e->d_name);
        thread_sample_t *t = &s->t[s->n];
        t->ticks = stat_ticks(path, t->name, sizeof t->name);
        if (t->ticks >= 0) {
            t->tid = atoi(e->d_name);
            s->n++;
        }
    }
    closedir(d);
}

typedef struct thread_use {
    size_t n;
    char name[THREAD_NAMES_MAX][32];
    double pct[THREAD_NAMES_MAX];
} thread_use_t;

/* Percent of one core per thread name over `window_s`; threads that exist
 * in both snapshots only (a thread started in between is left out). */
static void threads_diff(const threads_snapshot_t *a, const threads_snapshot_t *b, double window_s,
                         thread_use_t *out) {
    out->n = 0;
    if (window_s <= 0) {
        return;
    }
    for (size_t i = 0; i < b->n; i++) {
        long long before = -1;
        for (size_t j = 0; j < a->n; j++) {
            if (a->t[j].tid == b->t[i].tid) {
                before = a->t[j].ticks;
                break;
            }
        }
        if (before < 0) {
            continue;
        }
        double pct = 100.0 * (double)(b->t[i].ticks - before) / ticks_per_s() / window_s;
        size_t k = 0;
        while (k < out->n && strcmp(out->name[k], b->t[i].name) != 0) {
            k++;
        }
        if (k == out->n) {
            if (out->n == THREAD_NAMES_MAX) {
                continue;
            }
            snprintf(out->name[k], sizeof out->name[k], "%s", b->t[i].name);
            out->pct[k] = 0.0;
            out->n++;
        }
        out->pct[k] += pct;
    }
}

/* CPU over a window: client, server, each server thread name, machine. */
typedef struct cpu_window {
    long server_pid;
    int64_t t0_ns, t1_ns;
    double client0, client1, server0, server1, machine0, machine1;
    threads_snapshot_t threads0, threads1;
} cpu_window_t;

static void cpu_begin(cpu_window_t *w, long server_pid) {
    w->server_pid = server_pid;
    w->t0_ns = now_ns();
    w->client0 = own_cpu_s();
    w->server0 = server_pid > 0 ? process_cpu_s(server_pid) : -1.0;
    w->machine0 = machine_cpu_s();
    threads_take(server_pid, &w->threads0);
}

static void cpu_end(cpu_window_t *w) {
    w->t1_ns = now_ns();
    w->machine1 = machine_cpu_s();
    w->client1 = own_cpu_s();
    w->server1 = w->server_pid > 0 ? process_cpu_s(w->server_pid) : -1.0;
    threads_take(w->server_pid, &w->threads1);
}

typedef struct cpu_pct {
    double client, server, other; /* percent of one core; server/other -1 when unknown */
    thread_use_t threads;
} cpu_pct_t;

static void cpu_percent(const cpu_window_t *w, cpu_pct_t *p) {
    double s = (double)(w->t1_ns - w->t0_ns) / 1e9;
    p->client = s > 0 ? 100.0 * (w->client1 - w->client0) / s : 0.0;
    p->server =
        s > 0 && w->server0 >= 0 && w->server1 >= 0 ? 100.0 * (w->server1 - w->server0) / s : -1.0;
    p->other = -1.0;
    if (s > 0 && p->server >= 0 && w->machine0 >= 0 && w->machine1 >= 0) {
        p->other = 100.0 * (w->machine1 - w->machine0) / s - p->client - p->server;
        if (p->other < 0) {
            p->other = 0; /* tick rounding */
        }
    }
    threads_diff(&w->threads0, &w->threads1, s, &p->threads);
}

/* " server 95% other 3% [kf-engine 90% kf-commit 4%]" for the human line. */
static void cpu_text(const cpu_pct_t *p, char *buf, size_t size) {
    int n = snprintf(buf, size, "cpu client %.0f%%", p->client);
    if (p->server >= 0 && n >= 0 && (size_t)n < size) {
        n +=
            snprintf(buf + n, size - (size_t)n, " server %.0f%% other %.0f%%", p->server, p->other);
    }
    bool listed = false;
    for (size_t i = 0; i < p->threads.n && n >= 0 && (size_t)n < size; i++) {
        if (p->threads.pct[i] >= 0.5) {
            n += snprintf(buf + n, size - (size_t)n, "%s%s %.0f%%", listed ? " " : " [",
                          p->threads.name[i], p->threads.pct[i]);
            listed = true;
        }
    }
    if (listed && n >= 0 && (size_t)n < size) {
        snprintf(buf + n, size - (size_t)n, "]");
    }
}

/* ,"client_cpu_pct":..,"server_cpu_pct":..,"other_cpu_pct":..,"server_threads_cpu_pct":{..} */
static void cpu_json(FILE *out, const cpu_pct_t *p) {
    fprintf(out,
            ",\"client_cpu_pct\":%.1f,\"server_cpu_pct\":%.1f,\"other_cpu_pct\":%.1f,"
            "\"server_threads_cpu_pct\":{",
            p->client, p->server, p->other);
    for (size_t i = 0; i < p->threads.n; i++) {
        /* Thread names are short identifiers; quotes would break the line. */
        char name[32];
        snprintf(name, sizeof name, "%s", p->threads.name[i]);
        for (char *c = name; *c; c++) {
            if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) {
                *c = '_';
            }
        }
        fprintf(out, "%s\"%s\":%.1f", i ? "," : "", name, p->threads.pct[i]);
    }
    fputc('}', out);
}

/* The server's synced-write counters from its HTTP /metrics (a plain
 * HTTP/1.0 GET; the gateway closes the connection after the answer).
 * false when the address is unset or anything fails. */
typedef struct sync_counters {
    double sync_s; /* keyflow_commit_sync_seconds_sum */
    double syncs;  /* keyflow_commit_sync_seconds_count */
    double bytes;  /* keyflow_commit_group_bytes_sum */
} sync_counters_t;

#define METRICS_BYTES_MAX (4 * 1024 * 1024)

static bool metric_value(const char *text, const char *name, double *out) {
    size_t n = strlen(name);
    for (const char *p = text; (p = strstr(p, name)) != NULL; p += n) {
        if ((p == text || p[-1] == '\n') && p[n] == ' ') {
            *out = strtod(p + n + 1, NULL);
            return true;
        }
    }
    return false;
}

static bool read_sync_counters(const char *hostport, sync_counters_t *out) {
    if (hostport == NULL) {
        return false;
    }
    char host[256];
    const char *colon = strrchr(hostport, ':');
    if (colon == NULL || (size_t)(colon - hostport) >= sizeof host) {
        return false;
    }
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &res) != 0 || res == NULL) {
        return false;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0;
    freeaddrinfo(res);
    char *buf = ok ? malloc(METRICS_BYTES_MAX + 1) : NULL;
    size_t len = 0;
    if (buf != NULL) {
        struct timeval tv = {.tv_sec = 5};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        const char req[] = "GET /metrics HTTP/1.0\r\nConnection: close\r\n\r\n";
        ok = send(fd, req, sizeof req - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof req - 1);
        ssize_t n;
        while (ok && len < METRICS_BYTES_MAX &&
               (n = recv(fd, buf + len, METRICS_BYTES_MAX - len, 0)) > 0) {
            len += (size_t)n;
        }
        buf[len] = '\0';
    }
    if (fd >= 0) {
        close(fd);
    }
    ok = ok && buf != NULL && metric_value(buf, "keyflow_commit_sync_seconds_sum", &out->sync_s) &&
         metric_value(buf, "keyflow_commit_sync_seconds_count", &out->syncs) &&
         metric_value(buf, "keyflow_commit_group_bytes_sum", &out->bytes);
    free(buf);
    return ok;
}

/* ---- Protobuf wire encoding ------------------------------------------- *
 * Only what a PushBatchRequest needs: varints and length-delimited fields. */

#define WIRE_VARINT      0
#define WIRE_LEN         2
#define TAG(field, wire) ((uint8_t)(((field) << 3) | (wire)))

static size_t varint_size(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* A field that holds `len` bytes of payload: tag, length, payload. */
static size_t len_field_size(size_t len) {
    return 1 + varint_size(len) + len;
}

static void key_text(char prefix, uint64_t index, char *out /* KEY_BYTES */) {
    out[0] = prefix;
    for (int i = KEY_DIGITS; i >= 1; i--) {
        out[i] = (char)('0' + index % 10);
        index /= 10;
    }
}

/* RowBatch field 2 (one Column) holding a UTF8 column of `n` keys, key i
 * being prefix + keys[i] in KEY_DIGITS digits:
 *   12 len { 32 len { (0a 08 <8 bytes>) x n } }   (Column.strings) */
static grpc_slice encode_key_column(char prefix, const uint32_t *keys, size_t n) {
    size_t values = n * len_field_size(KEY_BYTES); /* StringValues payload */
    size_t column = len_field_size(values);        /* Column payload */
    grpc_slice s = grpc_slice_malloc(len_field_size(column));
    uint8_t *p = GRPC_SLICE_START_PTR(s);
    *p++ = TAG(2, WIRE_LEN);
    p = put_varint(p, column);
    *p++ = TAG(6, WIRE_LEN);
    p = put_varint(p, values);
    for (size_t i = 0; i < n; i++) {
        *p++ = TAG(1, WIRE_LEN);
        *p++ = KEY_BYTES;
        key_text(prefix, keys[i], (char *)p);
        p += KEY_BYTES;
    }
    return s;
}

/* RowBatch field 2 (one Column) holding an INT64 / TIMESTAMP_US column of
 * `n` values first, first + step, ...:
 *   12 len { 22 len { 0a len <packed varints> } }   (Column.int64s) */
static grpc_slice encode_int64_column(int64_t first, int64_t step, size_t n) {
    size_t packed = 0;
    for (size_t i = 0; i < n; i++) {
        packed += varint_size((uint64_t)(first + (int64_t)i * step));
    }
    size_t values = len_field_size(packed); /* Int64Values payload */
    size_t column = len_field_size(values); /* Column payload */
    grpc_slice s = grpc_slice_malloc(len_field_size(column));
    uint8_t *p = GRPC_SLICE_START_PTR(s);
    *p++ = TAG(2, WIRE_LEN);
    p = put_varint(p, column);
    *p++ = TAG(4, WIRE_LEN);
    p = put_varint(p, values);
    *p++ = TAG(1, WIRE_LEN);
    p = put_varint(p, packed);
    for (size_t i = 0; i < n; i++) {
        p = put_varint(p, (uint64_t)(first + (int64_t)i * step));
    }
    return s;
}

/* The PushBatchRequest up to and including the RowBatch's row_count:
 *   0a fid 12 pid 18 seq [22 len(batch) 08 rows] [30 watermark]
 * `columns_bytes` is the size of the column slices that follow (the
 * batch's remaining bytes); rows < 0 means no batch (watermark only). */
static grpc_slice encode_push_header(const char *function_id, const char *producer_id,
                                     int64_t sequence, int64_t rows, size_t columns_bytes,
                                     bool has_watermark, int64_t watermark_us) {
    size_t fid = strlen(function_id);
    size_t pid = strlen(producer_id);
    size_t batch = rows >= 0 ? 1 + varint_size((uint64_t)rows) + columns_bytes : 0;
    size_t size = len_field_size(fid) + len_field_size(pid) + 1 + varint_size((uint64_t)sequence);
    if (rows >= 0) {
        size += 1 + varint_size(batch) + (batch - columns_bytes);
    }
    if (has_watermark) {
        size += 1 + varint_size((uint64_t)watermark_us);
    }
    grpc_slice s = grpc_slice_malloc(size);
    uint8_t *p = GRPC_SLICE_START_PTR(s);
    *p++ = TAG(1, WIRE_LEN);
    p = put_varint(p, fid);
    memcpy(p, function_id, fid);
    p += fid;
    *p++ = TAG(2, WIRE_LEN);
    p = put_varint(p, pid);
    memcpy(p, producer_id, pid);
    p += pid;
    *p++ = TAG(3, WIRE_VARINT);
    p = put_varint(p, (uint64_t)sequence);
    if (rows >= 0) {
        *p++ = TAG(4, WIRE_LEN);
        p = put_varint(p, batch);
        *p++ = TAG(1, WIRE_VARINT);
        p = put_varint(p, (uint64_t)rows);
    }
    if (has_watermark) {
        *p++ = TAG(6, WIRE_VARINT);
        p = put_varint(p, (uint64_t)watermark_us);
    }
    if (p != GRPC_SLICE_END_PTR(s)) {
        fprintf(stderr, "kf_fnload: header size mismatch\n"); /* a bug in this file */
        abort();
    }
    return s;
}

/* Copies a whole byte buffer into one slice (caller unrefs). */
static grpc_slice buffer_flatten(grpc_byte_buffer *bb) {
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb)) {
        return grpc_empty_slice();
    }
    grpc_slice s = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    return s;
}

/* ---- Options ------------------------------------------------------------ */

typedef enum run_mode {
    MODE_PUSH,
    MODE_FILL,
    MODE_READ,
    MODE_TIMERS,
} run_mode_t;

static const char *const mode_names[] = {"push", "fill", "read", "timers"};

typedef struct options {
    run_mode_t mode;
    const char *target;
    const char *descriptor; /* the handler's built descriptor JSON */
    const char *function_id;
    long producers;
    long rows; /* rows per batch */
    long keys;
    long long rows_total; /* fill */
    long long timers;     /* timers: distinct keys = timers armed */
    long long idle_us;    /* timers: the rows' idle_us */
    long long max_keys;   /* descriptor limits; 0 = leave absent */
    long long max_timers;
    long max_batch_rows;
    long max_timer_callbacks;
    long limit; /* read: rows per page */
    double duration_s;
    double warmup_s;
    long channels;
    long deadline_ms;
    long step_deadline_ms; /* timers: the watermark step */
    long server_pid;
    const char *metrics; /* HOST:PORT of the server's HTTP /metrics, or NULL */
    bool minimal_stack;
} options_t;

static bool parse_ll(const char *flag, const char *text, long long lo, long long hi,
                     long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "kf_fnload: %s must be an integer in %lld..%lld, got '%s'\n", flag, lo, hi,
                text);
        return false;
    }
    *out = v;
    return true;
}

static bool parse_l(const char *flag, const char *text, long lo, long hi, long *out) {
    long long v;
    if (!parse_ll(flag, text, lo, hi, &v)) {
        return false;
    }
    *out = (long)v;
    return true;
}

static bool parse_s(const char *flag, const char *text, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !(v >= 0.0) || v > DURATION_S_MAX) {
        fprintf(stderr, "kf_fnload: %s must be seconds in 0..%d, got '%s'\n", flag, DURATION_S_MAX,
                text);
        return false;
    }
    *out = v;
    return true;
}

/* Identifiers go into JSON output unescaped and into key prefixes: keep them
 * to a safe alphabet. */
static bool check_id(const char *flag, const char *v) {
    size_t n = strlen(v);
    if (n == 0 || n > ID_BYTES_MAX) {
        fprintf(stderr, "kf_fnload: %s must be 1..%d characters\n", flag, ID_BYTES_MAX);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char c = v[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.')) {
            fprintf(stderr, "kf_fnload: %s may hold only letters, digits, '-', '_' and '.'\n",
                    flag);
            return false;
        }
    }
    return true;
}

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: kf_fnload --mode push   --target H:P --descriptor running_sum.descriptor.json\n"
        "                 [--producers N] [--rows N] [--keys N] [--duration-s S] [--warmup-s S]\n"
        "       kf_fnload --mode fill   --target H:P --descriptor ... --function-id ID\n"
        "                 --rows-total N [--producers N] [--rows N] [--keys N]\n"
        "       kf_fnload --mode read   --target H:P --function-id ID [--limit N]\n"
        "       kf_fnload --mode timers --target H:P --descriptor session_counter.descriptor.json\n"
        "                 [--timers N] [--idle-us N] [--producers N] [--rows N]\n"
        "  --function-id ID      function to register / read (default fnbench-PID-MODE);\n"
        "                        its pipeline_state_id is ID.state\n"
        "  --producers N         producers, one PushBatch outstanding each (default 1;\n"
        "                        fill and timers: 4)\n"
        "  --rows N              rows per batch (default 4096)\n"
        "  --keys N              key space, drawn uniformly (default 10000)\n"
        "  --duration-s S        push: measurement window (default 10)\n"
        "  --warmup-s S          push: load before the window, not counted (default 2)\n"
        "  --rows-total N        fill: rows to push (default 10000000)\n"
        "  --timers N            timers: distinct keys, one timer each (default 1000000)\n"
        "  --idle-us N           timers: idle_us of every row (default 60000000)\n"
        "  --max-keys N / --max-timers N   descriptor limits (timers: default 1100000)\n"
        "  --max-batch-rows N / --max-timer-callbacks N   descriptor limits (default: absent)\n"
        "  --limit N             read: rows per page (default 65536)\n"
        "  --channels N          channels = TCP connections (default 1)\n"
        "  --deadline-ms N       per-call deadline (default 30000)\n"
        "  --step-deadline-ms N  timers: the watermark step's deadline (default 300000)\n"
        "  --server-pid PID      also report that process's CPU (and its threads')\n"
        "  --metrics HOST:PORT   the server's HTTP address: timers also reports how long the\n"
        "                        step's synced write took (keyflow_commit_sync_seconds)\n"
        "  --minimal-stack B     1: client channels without optional filters (default 1)\n");
}

static bool parse_args(int argc, char **argv, options_t *o) {
    static char default_id[64];
    *o = (options_t){
        .mode = MODE_PUSH,
        .producers = 0,
        .rows = 4096,
        .keys = 10000,
        .rows_total = 10000000,
        .timers = 1000000,
        .idle_us = 60000000,
        .limit = 65536,
        .duration_s = 10.0,
        .warmup_s = 2.0,
        .channels = 1,
        .deadline_ms = 30000,
        .step_deadline_ms = 300000,
        .minimal_stack = true,
    };
    bool mode_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kf_fnload: %s needs a value\n", a);
            return false;
        }
        const char *v = argv[++i];
        bool ok = true;
        long long ll;
        if (strcmp(a, "--mode") == 0) {
            mode_given = true;
            size_t m = 0;
            while (m < sizeof mode_names / sizeof mode_names[0] && strcmp(v, mode_names[m]) != 0) {
                m++;
            }
            if (m == sizeof mode_names / sizeof mode_names[0]) {
                fprintf(stderr, "kf_fnload: --mode must be push, fill, read or timers\n");
                ok = false;
            } else {
                o->mode = (run_mode_t)m;
            }
        } else if (strcmp(a, "--target") == 0) {
            o->target = v;
        } else if (strcmp(a, "--descriptor") == 0) {
            o->descriptor = v;
        } else if (strcmp(a, "--function-id") == 0) {
            ok = check_id(a, v);
            o->function_id = v;
        } else if (strcmp(a, "--producers") == 0) {
            ok = parse_l(a, v, 1, PRODUCERS_MAX, &o->producers);
        } else if (strcmp(a, "--rows") == 0) {
            ok = parse_l(a, v, 1, ROWS_MAX, &o->rows);
        } else if (strcmp(a, "--keys") == 0) {
            ok = parse_l(a, v, 1, KEYS_MAX, &o->keys);
        } else if (strcmp(a, "--rows-total") == 0) {
            ok = parse_ll(a, v, 1, ROWS_TOTAL_MAX, &o->rows_total);
        } else if (strcmp(a, "--timers") == 0) {
            ok = parse_ll(a, v, 1, KEYS_MAX, &o->timers);
        } else if (strcmp(a, "--idle-us") == 0) {
            ok = parse_ll(a, v, 1, 1000000000000LL, &o->idle_us);
        } else if (strcmp(a, "--max-keys") == 0) {
            ok = parse_ll(a, v, 1, 10000000, &o->max_keys);
        } else if (strcmp(a, "--max-timers") == 0) {
            ok = parse_ll(a, v, 1, 10000000, &o->max_timers);
        } else if (strcmp(a, "--max-batch-rows") == 0) {
            ok = parse_l(a, v, 1, 4096, &o->max_batch_rows);
        } else if (strcmp(a, "--max-timer-callbacks") == 0) {
            ok = parse_l(a, v, 1, 4096, &o->max_timer_callbacks);
        } else if (strcmp(a, "--limit") == 0) {
            ok = parse_l(a, v, 1, 65536, &o->limit);
        } else if (strcmp(a, "--duration-s") == 0) {
            ok = parse_s(a, v, &o->duration_s);
        } else if (strcmp(a, "--warmup-s") == 0) {
            ok = parse_s(a, v, &o->warmup_s);
        } else if (strcmp(a, "--channels") == 0) {
            ok = parse_l(a, v, 1, CHANNELS_MAX, &o->channels);
        } else if (strcmp(a, "--deadline-ms") == 0) {
            ok = parse_l(a, v, 1, 3600000, &o->deadline_ms);
        } else if (strcmp(a, "--step-deadline-ms") == 0) {
            ok = parse_l(a, v, 1, 3600000, &o->step_deadline_ms);
        } else if (strcmp(a, "--server-pid") == 0) {
            ok = parse_ll(a, v, 1, 1LL << 30, &ll);
            o->server_pid = (long)ll;
        } else if (strcmp(a, "--metrics") == 0) {
            o->metrics = v;
        } else if (strcmp(a, "--minimal-stack") == 0) {
            ok = parse_ll(a, v, 0, 1, &ll);
            o->minimal_stack = ll != 0;
        } else {
            fprintf(stderr, "kf_fnload: unknown option %s\n", a);
            usage(stderr);
            ok = false;
        }
        if (!ok) {
            return false;
        }
    }
    if (!mode_given || o->target == NULL) {
        fprintf(stderr, "kf_fnload: --mode and --target are required\n");
        usage(stderr);
        return false;
    }
    if (o->mode != MODE_READ && o->descriptor == NULL) {
        fprintf(stderr, "kf_fnload: --mode %s needs --descriptor\n", mode_names[o->mode]);
        return false;
    }
    if (o->mode == MODE_READ && o->function_id == NULL) {
        fprintf(stderr, "kf_fnload: --mode read needs --function-id\n");
        return false;
    }
    if (o->function_id == NULL) {
        snprintf(default_id, sizeof default_id, "fnbench-%ld-%s", (long)getpid(),
                 mode_names[o->mode]);
        o->function_id = default_id;
    }
    if (o->producers == 0) {
        o->producers = o->mode == MODE_PUSH ? 1 : 4;
    }
    if (o->mode == MODE_PUSH && o->duration_s <= 0.0) {
        fprintf(stderr, "kf_fnload: --duration-s must be above 0\n");
        return false;
    }
    if (o->mode == MODE_TIMERS) {
        /* Every key holds a count and a timer until the watermark step. */
        if (o->max_keys == 0) {
            o->max_keys = 1100000;
        }
        if (o->max_timers == 0) {
            o->max_timers = 1100000;
        }
    }
    if (o->channels > o->producers) {
        o->channels = o->producers;
    }
    return true;
}

/* ---- gRPC plumbing ------------------------------------------------------ */

/* One TCP connection per channel (local subchannel pool), no retries (every
 * attempt the server sees is one the client counts), no receive limit (a
 * 65536-row output page is several MB). The minimal stack drops the
 * client-side filters, as in kf_load; deadlines still travel as
 * grpc-timeout and invariant 3 covers a server that never answers. */
static grpc_channel *channel_open(const char *target, int index, bool minimal_stack) {
    grpc_arg args[5];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
    args[0].value.integer = 1;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_ENABLE_RETRIES;
    args[1].value.integer = 0;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = "kf_fnload.channel"; /* distinct args: distinct connections */
    args[2].value.integer = index;
    args[3].type = GRPC_ARG_INTEGER;
    args[3].key = GRPC_ARG_MINIMAL_STACK;
    args[3].value.integer = minimal_stack;
    args[4].type = GRPC_ARG_INTEGER;
    args[4].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[4].value.integer = -1;
    grpc_channel_args list = {5, args};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(target, creds, &list);
    grpc_channel_credentials_release(creds);
    return ch;
}

/* A blocking unary call: sends `request` (a reference is taken), fills
 * `*response` (a slice the caller unrefs; empty without a message) and
 * `details` (the status message). Returns the status; -1 for a failed
 * batch (the connection broke). */
static int unary_call(grpc_channel *ch, const char *method, grpc_slice request, long deadline_ms,
                      grpc_slice *response, char *details, size_t details_size) {
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(deadline_ms, GPR_TIMESPAN));
    grpc_slice method_slice = grpc_slice_from_static_string(method);
    grpc_call *call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method_slice,
                                               NULL, deadline, NULL);
    grpc_byte_buffer *req = grpc_raw_byte_buffer_create(&request, 1);
    grpc_byte_buffer *resp = NULL;
    grpc_metadata_array md_initial, md_trailing;
    grpc_metadata_array_init(&md_initial);
    grpc_metadata_array_init(&md_trailing);
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice status_details = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = req;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &md_initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &resp;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &md_trailing;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &status_details;
    if (grpc_call_start_batch(call, ops, 6, call, NULL) != GRPC_CALL_OK) {
        fprintf(stderr, "kf_fnload: grpc_call_start_batch failed\n");
        abort(); /* only bad ops make this fail */
    }
    /* The minimal stack has no client deadline filter: wait a little past
     * the deadline, then cancel (invariant 3). */
    gpr_timespec give_up =
        gpr_time_add(deadline, gpr_time_from_millis(DRAIN_GRACE_MS, GPR_TIMESPAN));
    grpc_event ev = grpc_completion_queue_pluck(cq, call, give_up, NULL);
    if (ev.type != GRPC_OP_COMPLETE) {
        grpc_call_cancel(call, NULL);
        ev = grpc_completion_queue_pluck(cq, call, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    }
    int result = ev.success ? (int)status : -1;
    *response = resp != NULL ? buffer_flatten(resp) : grpc_empty_slice();
    char *text = grpc_slice_to_c_string(status_details);
    snprintf(details, details_size, "%s", ev.success ? text : "the call's batch failed");
    gpr_free(text);
    if (resp != NULL) {
        grpc_byte_buffer_destroy(resp);
    }
    grpc_byte_buffer_destroy(req);
    grpc_slice_unref(status_details);
    grpc_metadata_array_destroy(&md_initial);
    grpc_metadata_array_destroy(&md_trailing);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    return result;
}

static grpc_slice pack_message(const ProtobufCMessage *m) {
    grpc_slice s = grpc_slice_malloc(protobuf_c_message_get_packed_size(m));
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    return s;
}

/* Status names: the 17 gRPC codes, then failures without a code. */
#define STATUS_CODES        17
#define STATUS_BATCH_FAILED 17 /* the completion queue reported success = 0 */
#define STATUS_BAD_ACK      18 /* OK, but no or an unexpected acknowledgement */
#define STATUS_OTHER        19 /* a code outside 0..16 */
#define STATUS_SLOTS        20

static const char *const status_names[STATUS_SLOTS] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
    "BATCH_FAILED",
    "BAD_ACK",
    "OTHER",
};

static const char *status_name(int st) {
    if (st < 0) {
        return "BATCH_FAILED";
    }
    return st < STATUS_CODES ? status_names[st] : "OTHER";
}

/* ---- Registration ------------------------------------------------------- */

typedef struct registered {
    bool available;
    bool already;
    char sha256[72];
} registered_t;

/* Reads the handler's descriptor JSON, rewrites function_id and
 * pipeline_state_id (and the limits asked for), registers it. */
static bool register_function(grpc_channel *ch, const options_t *o, registered_t *out) {
    FILE *f = fopen(o->descriptor, "r");
    if (f == NULL) {
        fprintf(stderr, "kf_fnload: cannot open %s: %s\n", o->descriptor, strerror(errno));
        return false;
    }
    char *json = malloc(DESCRIPTOR_BYTES_MAX + 1);
    size_t len = json ? fread(json, 1, DESCRIPTOR_BYTES_MAX + 1, f) : 0;
    fclose(f);
    if (json == NULL || len > DESCRIPTOR_BYTES_MAX) {
        fprintf(stderr, "kf_fnload: %s: too large or out of memory\n", o->descriptor);
        free(json);
        return false;
    }
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    kf_error_t err;
    ProtobufCMessage *msg = NULL;
    bool ok = kf_json_to_message(json, len, &keyflow__v1__function_descriptor__descriptor, &arena,
                                 &msg, &err) == KF_OK;
    free(json);
    if (!ok) {
        fprintf(stderr, "kf_fnload: %s: %s\n", o->descriptor, err.message);
        kf_arena_deinit(&arena);
        return false;
    }
    Keyflow__V1__FunctionDescriptor *d = (Keyflow__V1__FunctionDescriptor *)msg;
    char state_id[ID_BYTES_MAX + 16];
    snprintf(state_id, sizeof state_id, "%s.state", o->function_id);
    d->function_id = (char *)o->function_id;
    d->pipeline_state_id = state_id;
    Keyflow__V1__FunctionLimits limits = KEYFLOW__V1__FUNCTION_LIMITS__INIT;
    if (d->limits != NULL) {
        limits = *d->limits;
    }
    bool set_limits = d->limits != NULL;
    if (o->max_keys > 0) {
        limits.max_keys_present_case = KEYFLOW__V1__FUNCTION_LIMITS__MAX_KEYS_PRESENT_MAX_KEYS;
        limits.max_keys = o->max_keys;
        set_limits = true;
    }
    if (o->max_timers > 0) {
        limits.max_timers_present_case =
            KEYFLOW__V1__FUNCTION_LIMITS__MAX_TIMERS_PRESENT_MAX_TIMERS;
        limits.max_timers = o->max_timers;
        set_limits = true;
    }
    if (o->max_batch_rows > 0) {
        limits.max_batch_rows_present_case =
            KEYFLOW__V1__FUNCTION_LIMITS__MAX_BATCH_ROWS_PRESENT_MAX_BATCH_ROWS;
        limits.max_batch_rows = o->max_batch_rows;
        set_limits = true;
    }
    if (o->max_timer_callbacks > 0) {
        limits.max_timer_callbacks_per_step_present_case =
            KEYFLOW__V1__FUNCTION_LIMITS__MAX_TIMER_CALLBACKS_PER_STEP_PRESENT_MAX_TIMER_CALLBACKS_PER_STEP;
        limits.max_timer_callbacks_per_step = o->max_timer_callbacks;
        set_limits = true;
    }
    d->limits = set_limits ? &limits : NULL;
    Keyflow__V1__RegisterFunctionRequest req = KEYFLOW__V1__REGISTER_FUNCTION_REQUEST__INIT;
    req.descriptor = d;
    grpc_slice packed = pack_message(&req.base);
    kf_arena_deinit(&arena);

    grpc_slice resp;
    char details[512];
    int st =
        unary_call(ch, METHOD_REGISTER, packed, SETUP_DEADLINE_MS, &resp, details, sizeof details);
    grpc_slice_unref(packed);
    Keyflow__V1__RegisterFunctionResponse *r = NULL;
    if (st == GRPC_STATUS_OK) {
        r = keyflow__v1__register_function_response__unpack(NULL, GRPC_SLICE_LENGTH(resp),
                                                            GRPC_SLICE_START_PTR(resp));
    }
    grpc_slice_unref(resp);
    if (r == NULL || r->function == NULL) {
        fprintf(stderr, "kf_fnload: RegisterFunction %s: %s: %s\n", o->function_id, status_name(st),
                st == GRPC_STATUS_OK ? "no response" : details);
        if (r != NULL) {
            keyflow__v1__register_function_response__free_unpacked(r, NULL);
        }
        return false;
    }
    out->available = r->function->available;
    out->already = r->already_registered;
    snprintf(out->sha256, sizeof out->sha256, "%s", r->function->descriptor_sha256);
    if (!r->function->available) {
        fprintf(stderr, "kf_fnload: function %s is registered but unavailable: %s\n",
                o->function_id, r->function->unavailable_reason);
    }
    keyflow__v1__register_function_response__free_unpacked(r, NULL);
    return out->available;
}

typedef struct fn_info {
    bool ok;
    int64_t keys, timers, output_seq, watermark_us, state_bytes;
} fn_info_t;

static fn_info_t get_function(grpc_channel *ch, const char *function_id) {
    fn_info_t info = {0};
    Keyflow__V1__GetFunctionRequest req = KEYFLOW__V1__GET_FUNCTION_REQUEST__INIT;
    req.function_id = (char *)function_id;
    grpc_slice packed = pack_message(&req.base);
    grpc_slice resp;
    char details[512];
    int st = unary_call(ch, METHOD_GET, packed, SETUP_DEADLINE_MS, &resp, details, sizeof details);
    grpc_slice_unref(packed);
    if (st != GRPC_STATUS_OK) {
        fprintf(stderr, "kf_fnload: GetFunction %s: %s: %s\n", function_id, status_name(st),
                details);
        grpc_slice_unref(resp);
        return info;
    }
    Keyflow__V1__FunctionInfo *fi = keyflow__v1__function_info__unpack(
        NULL, GRPC_SLICE_LENGTH(resp), GRPC_SLICE_START_PTR(resp));
    grpc_slice_unref(resp);
    if (fi != NULL) {
        info = (fn_info_t){true,           fi->keys,         fi->timers,
                           fi->output_seq, fi->watermark_us, fi->state_bytes};
        keyflow__v1__function_info__free_unpacked(fi, NULL);
    }
    return info;
}

/* ---- Producers ---------------------------------------------------------- */

typedef enum key_source {
    KEYS_UNIFORM,  /* push, fill: "u%07d" uniform over --keys */
    KEYS_DISTINCT, /* timers: "s%07d", row i of the run has key i */
} key_source_t;

typedef struct load load_t;

typedef struct producer {
    load_t *load;
    char id[32];
    grpc_channel *channel;
    void *method;
    grpc_call *call; /* NULL when idle */
    grpc_byte_buffer *request;
    grpc_byte_buffer *response;
    grpc_metadata_array md_initial;
    grpc_metadata_array md_trailing;
    grpc_status_code status;
    grpc_slice details;
    int64_t start_ns;
    int64_t sequence; /* of the last batch started */
    int64_t rows_in_call;
    int64_t rows_sent; /* rows started by this producer (ts offsets) */
    bool cancelled;
} producer_t;

struct load {
    const options_t *o;
    key_source_t keys;
    grpc_completion_queue *cq;
    grpc_channel *channels[CHANNELS_MAX];
    void *methods[CHANNELS_MAX];
    producer_t *producers;
    size_t outstanding;
    uint64_t rng;
    /* what to send */
    char key_prefix;
    grpc_slice user_pool[USER_POOL]; /* full batches, uniform keys */
    grpc_slice third_full;           /* amount / idle_us column of a full batch */
    int64_t third_value;
    int64_t ts_base_us;
    /* when to stop */
    bool timed;
    int64_t window_start_ns; /* timed: the measured window */
    int64_t window_end_ns;
    long long rows_total; /* untimed: rows to start in all */
    long long rows_started;
    /* results (calls completing inside the window; untimed: all) */
    histogram_t hist;
    uint64_t statuses[STATUS_SLOTS];
    bool status_printed[STATUS_SLOTS];
    uint64_t rows_acked;
    uint64_t batches_ok;
    uint64_t duplicates;
    uint64_t activations;
    uint64_t handler_calls;
    uint64_t abandoned;
    int64_t first_start_ns;
    int64_t last_done_ns;
};

/* Encodes the columns of one batch of `n` rows starting at the producer's
 * row `first_row` (uniform: per producer; distinct: of the whole run). */
static void build_columns(load_t *l, int64_t first_row, int64_t n, grpc_slice cols[3]) {
    if (l->keys == KEYS_UNIFORM && n == l->o->rows) {
        cols[0] = grpc_slice_ref(l->user_pool[rand_next(&l->rng) % USER_POOL]);
        cols[2] = grpc_slice_ref(l->third_full);
    } else {
        uint32_t *keys = malloc((size_t)n * sizeof *keys);
        if (keys == NULL) {
            fprintf(stderr, "kf_fnload: out of memory\n");
            abort();
        }
        for (int64_t i = 0; i < n; i++) {
            keys[i] = l->keys == KEYS_UNIFORM
                          ? (uint32_t)(rand_next(&l->rng) % (uint64_t)l->o->keys)
                          : (uint32_t)(first_row + i);
        }
        cols[0] = encode_key_column(l->key_prefix, keys, (size_t)n);
        cols[2] = encode_int64_column(l->third_value, 0, (size_t)n);
        free(keys);
    }
    /* ts: increasing per producer (uniform) or over the run (distinct). */
    cols[1] = encode_int64_column(l->ts_base_us + first_row, 1, (size_t)n);
}

/* Builds the next request of producer p; false when there is nothing left
 * to send (untimed runs). */
static bool producer_request(load_t *l, producer_t *p, grpc_byte_buffer **out, int64_t *rows) {
    int64_t n = l->o->rows;
    int64_t first_row;
    if (!l->timed) {
        long long left = l->rows_total - l->rows_started;
        if (left <= 0) {
            return false;
        }
        if (n > left) {
            n = left;
        }
    }
    if (l->keys == KEYS_DISTINCT) {
        first_row = l->rows_started;
    } else {
        first_row = p->rows_sent;
    }
    l->rows_started += n;
    p->rows_sent += n;
    grpc_slice s[4];
    build_columns(l, first_row, n, &s[1]);
    size_t columns = GRPC_SLICE_LENGTH(s[1]) + GRPC_SLICE_LENGTH(s[2]) + GRPC_SLICE_LENGTH(s[3]);
    s[0] = encode_push_header(l->o->function_id, p->id, ++p->sequence, n, columns, false, 0);
    *out = grpc_raw_byte_buffer_create(s, 4); /* takes its own references */
    for (int i = 0; i < 4; i++) {
        grpc_slice_unref(s[i]);
    }
    *rows = n;
    return true;
}

static void producer_start(producer_t *p) {
    load_t *l = p->load;
    int64_t rows;
    if (!producer_request(l, p, &p->request, &rows)) {
        return;
    }
    p->rows_in_call = rows;
    p->response = NULL;
    p->cancelled = false;
    grpc_metadata_array_init(&p->md_initial);
    grpc_metadata_array_init(&p->md_trailing);
    p->details = grpc_empty_slice();
    gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                         gpr_time_from_millis(l->o->deadline_ms, GPR_TIMESPAN));
    p->start_ns = now_ns();
    if (l->first_start_ns == 0) {
        l->first_start_ns = p->start_ns;
    }
    p->call = grpc_channel_create_registered_call(p->channel, NULL, GRPC_PROPAGATE_DEFAULTS, l->cq,
                                                  p->method, deadline, NULL);
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = p->request;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &p->md_initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &p->response;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &p->md_trailing;
    ops[5].data.recv_status_on_client.status = &p->status;
    ops[5].data.recv_status_on_client.status_details = &p->details;
    if (grpc_call_start_batch(p->call, ops, 6, p, NULL) != GRPC_CALL_OK) {
        fprintf(stderr, "kf_fnload: grpc_call_start_batch failed\n");
        abort(); /* only bad ops make this fail */
    }
    l->outstanding++;
}

static void report_once(load_t *l, int slot, const char *text) {
    if (!l->status_printed[slot]) {
        l->status_printed[slot] = true;
        fprintf(stderr, "kf_fnload: first %s: %s\n", status_names[slot], text);
    }
}

/* Accounts for the finished call and frees what it held. */
static void producer_finish(producer_t *p, bool ok, int64_t t) {
    load_t *l = p->load;
    bool counted = !l->timed || (t >= l->window_start_ns && t < l->window_end_ns);
    if (counted) {
        int slot;
        if (!ok) {
            slot = STATUS_BATCH_FAILED;
        } else if ((int)p->status < 0 || (int)p->status >= STATUS_CODES) {
            slot = STATUS_OTHER;
        } else {
            slot = (int)p->status;
        }
        if (slot == GRPC_STATUS_OK) {
            Keyflow__V1__PushBatchResponse *ack = NULL;
            if (p->response != NULL) {
                grpc_slice flat = buffer_flatten(p->response);
                ack = keyflow__v1__push_batch_response__unpack(NULL, GRPC_SLICE_LENGTH(flat),
                                                               GRPC_SLICE_START_PTR(flat));
                grpc_slice_unref(flat);
            }
            if (ack == NULL || ack->rows_accepted != p->rows_in_call ||
                ack->sequence != p->sequence) {
                slot = STATUS_BAD_ACK;
                char text[160];
                snprintf(text, sizeof text, "producer %s sequence %" PRId64 ": %s", p->id,
                         p->sequence,
                         ack == NULL ? "no acknowledgement"
                                     : "rows_accepted or sequence differ from the batch");
                report_once(l, slot, text);
            } else {
                l->rows_acked += (uint64_t)ack->rows_accepted;
                l->batches_ok++;
                l->duplicates += ack->duplicate;
                l->activations += (uint64_t)ack->activations;
                l->handler_calls += (uint64_t)ack->handler_calls;
            }
            if (ack != NULL) {
                keyflow__v1__push_batch_response__free_unpacked(ack, NULL);
            }
        } else {
            char *text = grpc_slice_to_c_string(p->details);
            report_once(l, slot, text);
            gpr_free(text);
        }
        l->statuses[slot]++;
        hist_add(&l->hist, (uint64_t)(t - p->start_ns));
        l->last_done_ns = t;
    }
    if (p->response != NULL) {
        grpc_byte_buffer_destroy(p->response);
    }
    grpc_byte_buffer_destroy(p->request);
    grpc_metadata_array_destroy(&p->md_initial);
    grpc_metadata_array_destroy(&p->md_trailing);
    grpc_slice_unref(p->details);
    grpc_call_unref(p->call);
    p->call = NULL;
    l->outstanding--;
}

static void *load_main(void *arg) {
    load_t *l = arg;
    for (long i = 0; i < l->o->producers; i++) {
        producer_start(&l->producers[i]);
    }
    int64_t give_up_after_ns = ((int64_t)l->o->deadline_ms + DRAIN_GRACE_MS) * 1000000;
    while (l->outstanding > 0) {
        gpr_timespec wait =
            gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(POLL_MS, GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_next(l->cq, wait, NULL);
        int64_t t = now_ns();
        if (ev.type == GRPC_OP_COMPLETE) {
            producer_t *p = ev.tag;
            producer_finish(p, ev.success != 0, t);
            if (!l->timed || t < l->window_end_ns) {
                producer_start(p);
            }
        } else {
            for (long i = 0; i < l->o->producers; i++) {
                producer_t *p = &l->producers[i];
                if (p->call != NULL && !p->cancelled && t - p->start_ns > give_up_after_ns) {
                    grpc_call_cancel(p->call, NULL);
                    p->cancelled = true;
                    l->abandoned++;
                }
            }
        }
    }
    return NULL;
}

/* Checks the first request the load would send, decoded with protobuf-c:
 * a hand-encoding mistake must fail here, not as server errors. */
static bool self_check(load_t *l) {
    producer_t probe = {.load = l};
    snprintf(probe.id, sizeof probe.id, "self-check");
    long long saved_started = l->rows_started;
    uint64_t saved_rng = l->rng;
    grpc_byte_buffer *bb;
    int64_t rows;
    if (!producer_request(l, &probe, &bb, &rows)) {
        return true; /* nothing to send */
    }
    l->rows_started = saved_started;
    l->rng = saved_rng;
    grpc_slice flat = buffer_flatten(bb);
    grpc_byte_buffer_destroy(bb);
    Keyflow__V1__PushBatchRequest *r = keyflow__v1__push_batch_request__unpack(
        NULL, GRPC_SLICE_LENGTH(flat), GRPC_SLICE_START_PTR(flat));
    grpc_slice_unref(flat);
    const char *why = NULL;
    if (r == NULL) {
        why = "does not decode";
    } else if (strcmp(r->function_id, l->o->function_id) != 0 ||
               strcmp(r->producer_id, probe.id) != 0 || r->sequence != 1) {
        why = "ids or sequence differ";
    } else if (r->rows_case != KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_BATCH || r->batch == NULL ||
               r->batch->row_count != rows || r->batch->n_columns != 3) {
        why = "batch shape differs";
    } else {
        Keyflow__V1__Column **c = r->batch->columns;
        if (c[0]->values_case != KEYFLOW__V1__COLUMN__VALUES_STRINGS ||
            c[0]->strings->n_values != (size_t)rows ||
            strlen(c[0]->strings->values[0]) != KEY_BYTES ||
            c[0]->strings->values[0][0] != l->key_prefix) {
            why = "key column differs";
        } else if (c[1]->values_case != KEYFLOW__V1__COLUMN__VALUES_INT64S ||
                   c[1]->int64s->n_values != (size_t)rows ||
                   c[1]->int64s->values[0] != l->ts_base_us ||
                   c[1]->int64s->values[rows - 1] != l->ts_base_us + rows - 1) {
            why = "ts column differs";
        } else if (c[2]->values_case != KEYFLOW__V1__COLUMN__VALUES_INT64S ||
                   c[2]->int64s->n_values != (size_t)rows ||
                   c[2]->int64s->values[rows - 1] != l->third_value) {
            why = "third column differs";
        }
    }
    if (r != NULL) {
        keyflow__v1__push_batch_request__free_unpacked(r, NULL);
    }
    if (why != NULL) {
        fprintf(stderr, "kf_fnload: self-check of the encoded request failed: %s\n", why);
        return false;
    }
    return true;
}

static bool load_init(load_t *l, const options_t *o, key_source_t keys, grpc_channel **channels) {
    memset(l, 0, sizeof *l);
    l->o = o;
    l->keys = keys;
    l->cq = grpc_completion_queue_create_for_next(NULL);
    l->rng = (uint64_t)now_ns() ^ ((uint64_t)getpid() << 32);
    l->key_prefix = keys == KEYS_UNIFORM ? 'u' : 's';
    /* Event times start now, so output timestamps look like real ones. */
    l->ts_base_us = wall_us();
    /* running_sum's amount; session_counter's idle_us. */
    l->third_value = keys == KEYS_UNIFORM ? 7 : o->idle_us;
    for (long c = 0; c < o->channels; c++) {
        l->channels[c] = channels[c];
        l->methods[c] = grpc_channel_register_call(channels[c], METHOD_PUSH, NULL, NULL);
    }
    if (keys == KEYS_UNIFORM) {
        uint32_t *draw = malloc((size_t)o->rows * sizeof *draw);
        if (draw == NULL) {
            return false;
        }
        for (int k = 0; k < USER_POOL; k++) {
            for (long i = 0; i < o->rows; i++) {
                draw[i] = (uint32_t)(rand_next(&l->rng) % (uint64_t)o->keys);
            }
            l->user_pool[k] = encode_key_column(l->key_prefix, draw, (size_t)o->rows);
        }
        free(draw);
        l->third_full = encode_int64_column(l->third_value, 0, (size_t)o->rows);
    } else {
        l->third_full = grpc_empty_slice();
        for (int k = 0; k < USER_POOL; k++) {
            l->user_pool[k] = grpc_empty_slice();
        }
    }
    l->producers = calloc((size_t)o->producers, sizeof *l->producers);
    if (l->producers == NULL) {
        return false;
    }
    for (long i = 0; i < o->producers; i++) {
        producer_t *p = &l->producers[i];
        p->load = l;
        snprintf(p->id, sizeof p->id, "producer-%02ld", i);
        p->channel = l->channels[i % o->channels];
        p->method = l->methods[i % o->channels];
    }
    return self_check(l);
}

static void load_destroy(load_t *l) {
    grpc_completion_queue_shutdown(l->cq);
    while (grpc_completion_queue_next(l->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(l->cq);
    for (int k = 0; k < USER_POOL; k++) {
        grpc_slice_unref(l->user_pool[k]);
    }
    grpc_slice_unref(l->third_full);
    free(l->producers);
}

static void errors_text(const uint64_t *statuses, char *buf, size_t size, bool json) {
    size_t used = 0;
    buf[0] = '\0';
    bool first = true;
    for (int i = 1; i < STATUS_SLOTS && used < size; i++) {
        if (statuses[i] == 0) {
            continue;
        }
        int n =
            json ? snprintf(buf + used, size - used, "%s\"%s\":%" PRIu64, first ? "" : ",",
                            status_names[i], statuses[i])
                 : snprintf(buf + used, size - used, " %s=%" PRIu64, status_names[i], statuses[i]);
        used += n > 0 ? (size_t)n : 0;
        first = false;
    }
}

static uint64_t errors_total(const uint64_t *statuses) {
    uint64_t e = 0;
    for (int i = 1; i < STATUS_SLOTS; i++) {
        e += statuses[i];
    }
    return e;
}

/* One human line and one JSON line for a push or fill run. */
static void print_load(const load_t *l, const char *kind, double window_s, const cpu_pct_t *cpu,
                       const registered_t *reg) {
    const options_t *o = l->o;
    double rows_s = window_s > 0 ? (double)l->rows_acked / window_s : 0.0;
    double batches_s = window_s > 0 ? (double)l->batches_ok / window_s : 0.0;
    uint64_t errors = errors_total(l->statuses);
    long long keys = l->keys == KEYS_DISTINCT ? o->timers : o->keys;
    char etext[512], ejson[512], ctext[512];
    errors_text(l->statuses, etext, sizeof etext, false);
    errors_text(l->statuses, ejson, sizeof ejson, true);
    cpu_text(cpu, ctext, sizeof ctext);
    printf("%s producers=%ld rows/batch=%ld keys=%lld: %" PRIu64 " batches ok in %.1f s = %.0f "
           "batches/s, %.0f rows/s; ack latency us p50 %.1f p99 %.1f max %.1f; errors %" PRIu64
           "%s; %s\n",
           kind, o->producers, o->rows, keys, l->batches_ok, window_s, batches_s, rows_s,
           hist_q_us(&l->hist, 0.50), hist_q_us(&l->hist, 0.99), (double)l->hist.max_ns / 1e3,
           errors, etext, ctext);
    printf("{\"kind\":\"%s\",\"function_id\":\"%s\",\"descriptor_sha256\":\"%s\","
           "\"producers\":%ld,\"rows_per_batch\":%ld,\"keys\":%lld,\"channels\":%ld,"
           "\"window_s\":%.3f,\"warmup_s\":%.3f,\"batches_ok\":%" PRIu64 ",\"rows_acked\":%" PRIu64
           ",\"batches_per_s\":%.1f,\"rows_per_s\":%.1f,\"activations\":%" PRIu64
           ",\"handler_calls\":%" PRIu64 ",\"duplicates\":%" PRIu64 ",\"p50_us\":%.1f,"
           "\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f,\"mean_us\":%.1f,\"errors\":%" PRIu64
           ",\"errors_by_status\":{%s},\"abandoned\":%" PRIu64,
           kind, o->function_id, reg->sha256, o->producers, o->rows, keys, o->channels, window_s,
           l->timed ? o->warmup_s : 0.0, l->batches_ok, l->rows_acked, batches_s, rows_s,
           l->activations, l->handler_calls, l->duplicates, hist_q_us(&l->hist, 0.50),
           hist_q_us(&l->hist, 0.99), hist_q_us(&l->hist, 0.999), (double)l->hist.max_ns / 1e3,
           hist_mean_us(&l->hist), errors, ejson, l->abandoned);
    cpu_json(stdout, cpu);
    printf("}\n");
    fflush(stdout);
}

static bool open_channels(const options_t *o, grpc_channel **channels) {
    for (long c = 0; c < o->channels; c++) {
        channels[c] = channel_open(o->target, (int)c, o->minimal_stack);
        if (channels[c] == NULL) {
            return false;
        }
    }
    return true;
}

static void close_channels(const options_t *o, grpc_channel **channels) {
    for (long c = 0; c < o->channels; c++) {
        grpc_channel_destroy(channels[c]);
    }
}

/* push (timed) and fill (until --rows-total). */
static int run_push(const options_t *o) {
    grpc_channel *channels[CHANNELS_MAX];
    if (!open_channels(o, channels)) {
        fprintf(stderr, "kf_fnload: cannot create a channel to %s\n", o->target);
        return 1;
    }
    registered_t reg = {0};
    if (!register_function(channels[0], o, &reg)) {
        close_channels(o, channels);
        return 1;
    }
    static load_t load; /* static: its histogram is 18 KB */
    load_t *l = &load;
    if (!load_init(l, o, KEYS_UNIFORM, channels)) {
        fprintf(stderr, "kf_fnload: could not prepare the batches\n");
        close_channels(o, channels);
        return 1;
    }
    pthread_t worker;
    cpu_window_t cw;
    int64_t start = now_ns();
    if (o->mode == MODE_PUSH) {
        l->timed = true;
        l->window_start_ns = start + (int64_t)(o->warmup_s * 1e9);
        l->window_end_ns = l->window_start_ns + (int64_t)(o->duration_s * 1e9);
    } else {
        l->rows_total = o->rows_total;
    }
    if (!l->timed) {
        cpu_begin(&cw, o->server_pid);
    }
    if (pthread_create(&worker, NULL, load_main, l) != 0) {
        fprintf(stderr, "kf_fnload: cannot start the worker thread\n");
        return 1;
    }
    if (l->timed) {
        /* CPU over exactly the window the latencies cover. */
        sleep_until(l->window_start_ns);
        cpu_begin(&cw, o->server_pid);
        sleep_until(l->window_end_ns);
        cpu_end(&cw);
    }
    pthread_join(worker, NULL);
    double window_s;
    if (!l->timed) {
        cpu_end(&cw);
        window_s = l->last_done_ns > l->first_start_ns
                       ? (double)(l->last_done_ns - l->first_start_ns) / 1e9
                       : 0.0;
    } else {
        window_s = (double)(l->window_end_ns - l->window_start_ns) / 1e9;
    }
    cpu_pct_t cpu;
    cpu_percent(&cw, &cpu);
    print_load(l, o->mode == MODE_PUSH ? "fn_push" : "fn_fill", window_s, &cpu, &reg);
    load_destroy(l);
    close_channels(o, channels);
    return 0;
}

/* ---- read --------------------------------------------------------------- */

typedef struct wire_reader {
    const uint8_t *p, *end;
} wire_reader_t;

static bool wire_varint(wire_reader_t *r, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64 && r->p < r->end; shift += 7) {
        uint8_t b = *r->p++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            return true;
        }
    }
    return false;
}

/* The top-level fields of a ReadOutputResponse, and the RowBatch's
 * row_count, without decoding the rows (a full decode of a 65536-row page
 * would put the client's CPU, not the server's, into the measurement). */
typedef struct page {
    int64_t first_seq, last_seq, next_after_seq, high_water_seq, row_count;
} page_t;

static bool page_scan(const uint8_t *data, size_t len, page_t *pg) {
    memset(pg, 0, sizeof *pg);
    wire_reader_t r = {data, data + len};
    while (r.p < r.end) {
        uint64_t key, v;
        if (!wire_varint(&r, &key)) {
            return false;
        }
        unsigned field = (unsigned)(key >> 3), wire = (unsigned)(key & 7);
        if (wire == WIRE_VARINT) {
            if (!wire_varint(&r, &v)) {
                return false;
            }
            switch (field) {
            case 1: pg->first_seq = (int64_t)v; break;
            case 2: pg->last_seq = (int64_t)v; break;
            case 5: pg->next_after_seq = (int64_t)v; break;
            case 6: pg->high_water_seq = (int64_t)v; break;
            default: break;
            }
        } else if (wire == WIRE_LEN) {
            if (!wire_varint(&r, &v) || v > (uint64_t)(r.end - r.p)) {
                return false;
            }
            if (field == 3) { /* RowBatch: field 1 is row_count */
                wire_reader_t b = {r.p, r.p + v};
                uint64_t bkey, bv;
                if (wire_varint(&b, &bkey) && bkey == TAG(1, WIRE_VARINT) && wire_varint(&b, &bv)) {
                    pg->row_count = (int64_t)bv;
                }
            }
            r.p += v;
        } else {
            return false; /* the response has no other wire types */
        }
    }
    return true;
}

/* Decodes a page fully and checks its shape: 4 columns of row_count values. */
static const char *page_verify(const uint8_t *data, size_t len, int64_t rows) {
    Keyflow__V1__ReadOutputResponse *r = keyflow__v1__read_output_response__unpack(NULL, len, data);
    const char *why = NULL;
    if (r == NULL || r->batch == NULL) {
        why = "does not decode";
    } else if (r->batch->row_count != rows || r->batch->n_columns != 4) {
        why = "row count or column count differs";
    } else {
        for (size_t c = 0; c < 4 && why == NULL; c++) {
            const Keyflow__V1__Column *col = r->batch->columns[c];
            size_t n =
                col->values_case == KEYFLOW__V1__COLUMN__VALUES_STRINGS  ? col->strings->n_values
                : col->values_case == KEYFLOW__V1__COLUMN__VALUES_INT64S ? col->int64s->n_values
                                                                         : 0;
            if (n != (size_t)rows) {
                why = "a column has the wrong number of values";
            }
        }
    }
    if (r != NULL) {
        keyflow__v1__read_output_response__free_unpacked(r, NULL);
    }
    return why;
}

static int run_read(const options_t *o) {
    grpc_channel *ch = channel_open(o->target, 0, o->minimal_stack);
    static histogram_t hist;
    uint64_t statuses[STATUS_SLOTS] = {0};
    int64_t after = 0, rows = 0, pages = 0, high = 0;
    uint64_t bytes = 0;
    const char *verify_problem = NULL;
    char first_error[640] = "";
    Keyflow__V1__ReadOutputRequest req = KEYFLOW__V1__READ_OUTPUT_REQUEST__INIT;
    req.function_id = (char *)o->function_id;
    req.limit = o->limit;
    req.format = KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_COLUMNAR;
    cpu_window_t cw;
    cpu_begin(&cw, o->server_pid);
    int64_t t0 = now_ns();
    for (;;) {
        req.after_seq = after;
        grpc_slice packed = pack_message(&req.base);
        grpc_slice resp;
        char details[512];
        int64_t s0 = now_ns();
        int st =
            unary_call(ch, METHOD_READ, packed, o->deadline_ms, &resp, details, sizeof details);
        int64_t s1 = now_ns();
        grpc_slice_unref(packed);
        int slot = st < 0 ? STATUS_BATCH_FAILED : st < STATUS_CODES ? st : STATUS_OTHER;
        page_t pg;
        if (slot == GRPC_STATUS_OK &&
            !page_scan(GRPC_SLICE_START_PTR(resp), GRPC_SLICE_LENGTH(resp), &pg)) {
            slot = STATUS_BAD_ACK;
            snprintf(details, sizeof details, "undecodable page after %" PRId64, after);
        }
        statuses[slot]++;
        if (slot != GRPC_STATUS_OK) {
            if (first_error[0] == '\0') {
                snprintf(first_error, sizeof first_error, "%s after_seq %" PRId64 ": %s",
                         status_names[slot], after, details);
                fprintf(stderr, "kf_fnload: read: %s\n", first_error);
            }
            grpc_slice_unref(resp);
            break; /* paging cannot go on past a failed page */
        }
        high = pg.high_water_seq;
        if (pg.first_seq == 0) {
            grpc_slice_unref(resp);
            break; /* nothing after `after`: the end of the durable output */
        }
        int64_t n = pg.last_seq - pg.first_seq + 1;
        if (pg.first_seq != after + 1 || pg.row_count != n || pg.next_after_seq != pg.last_seq) {
            verify_problem =
                verify_problem ? verify_problem : "page sequence numbers do not follow";
        }
        /* The first page is decoded fully to check its shape (outside the
         * page's latency, inside the total time). */
        if (pages == 0 && verify_problem == NULL) {
            verify_problem = page_verify(GRPC_SLICE_START_PTR(resp), GRPC_SLICE_LENGTH(resp), n);
        }
        hist_add(&hist, (uint64_t)(s1 - s0));
        bytes += GRPC_SLICE_LENGTH(resp);
        rows += n;
        pages++;
        after = pg.next_after_seq;
        grpc_slice_unref(resp);
    }
    int64_t t1 = now_ns();
    cpu_end(&cw);
    grpc_channel_destroy(ch);
    if (verify_problem != NULL) {
        fprintf(stderr, "kf_fnload: read: %s\n", verify_problem);
    }
    double s = (double)(t1 - t0) / 1e9;
    double rows_s = s > 0 ? (double)rows / s : 0.0;
    cpu_pct_t cpu;
    cpu_percent(&cw, &cpu);
    char ctext[512], etext[512], ejson[512];
    cpu_text(&cpu, ctext, sizeof ctext);
    errors_text(statuses, etext, sizeof etext, false);
    errors_text(statuses, ejson, sizeof ejson, true);
    uint64_t errors = errors_total(statuses);
    printf("read limit=%ld: %" PRId64 " rows in %" PRId64 " pages in %.2f s = %.0f rows/s, "
           "%.1f MB/s; page latency us p50 %.1f p99 %.1f max %.1f; high water %" PRId64
           "; errors %" PRIu64 "%s%s%s; %s\n",
           o->limit, rows, pages, s, rows_s, s > 0 ? (double)bytes / s / 1e6 : 0.0,
           hist_q_us(&hist, 0.50), hist_q_us(&hist, 0.99), (double)hist.max_ns / 1e3, high, errors,
           etext, verify_problem ? "; CHECK FAILED: " : "", verify_problem ? verify_problem : "",
           ctext);
    printf("{\"kind\":\"fn_read\",\"function_id\":\"%s\",\"limit\":%ld,\"rows\":%" PRId64
           ",\"pages\":%" PRId64 ",\"bytes\":%" PRIu64 ",\"elapsed_s\":%.3f,\"rows_per_s\":%.1f,"
           "\"page_p50_us\":%.1f,\"page_p99_us\":%.1f,\"page_max_us\":%.1f,"
           "\"high_water_seq\":%" PRId64 ",\"complete\":%s,\"check_ok\":%s,\"errors\":%" PRIu64
           ",\"errors_by_status\":{%s}",
           o->function_id, o->limit, rows, pages, bytes, s, rows_s, hist_q_us(&hist, 0.50),
           hist_q_us(&hist, 0.99), (double)hist.max_ns / 1e3, high,
           errors == 0 && after >= high ? "true" : "false", verify_problem ? "false" : "true",
           errors, ejson);
    cpu_json(stdout, &cpu);
    printf("}\n");
    fflush(stdout);
    return 0;
}

/* ---- timers ------------------------------------------------------------- */

static int run_timers(const options_t *o) {
    grpc_channel *channels[CHANNELS_MAX];
    if (!open_channels(o, channels)) {
        fprintf(stderr, "kf_fnload: cannot create a channel to %s\n", o->target);
        return 1;
    }
    registered_t reg = {0};
    if (!register_function(channels[0], o, &reg)) {
        close_channels(o, channels);
        return 1;
    }
    static load_t load;
    load_t *l = &load;
    if (!load_init(l, o, KEYS_DISTINCT, channels)) {
        fprintf(stderr, "kf_fnload: could not prepare the batches\n");
        close_channels(o, channels);
        return 1;
    }
    /* 1. Arm the timers: one row per key, no watermark. */
    l->rows_total = o->timers;
    cpu_window_t cw_load;
    cpu_begin(&cw_load, o->server_pid);
    pthread_t worker;
    if (pthread_create(&worker, NULL, load_main, l) != 0) {
        fprintf(stderr, "kf_fnload: cannot start the worker thread\n");
        return 1;
    }
    pthread_join(worker, NULL);
    cpu_end(&cw_load);
    double load_s = l->last_done_ns > l->first_start_ns
                        ? (double)(l->last_done_ns - l->first_start_ns) / 1e9
                        : 0.0;
    cpu_pct_t cpu_load;
    cpu_percent(&cw_load, &cpu_load);
    print_load(l, "fn_timers_load", load_s, &cpu_load, &reg);
    fn_info_t before = get_function(channels[0], o->function_id);

    /* 2. One watermark-only batch past every timer: the last row's
     * ts + idle_us, plus one. */
    int64_t watermark = l->ts_base_us + (int64_t)o->timers - 1 + o->idle_us + 1;
    grpc_slice header = encode_push_header(o->function_id, "watermark", 1, -1, 0, true, watermark);
    long rss0 = proc_status_kb(o->server_pid, "VmRSS");
    long hwm0 = proc_status_kb(o->server_pid, "VmHWM");
    sync_counters_t sc0 = {0}, sc1 = {0};
    bool have_sync = read_sync_counters(o->metrics, &sc0);
    cpu_window_t cw;
    cpu_begin(&cw, o->server_pid);
    grpc_slice resp;
    char details[512];
    int64_t t0 = now_ns();
    int st = unary_call(channels[0], METHOD_PUSH, header, o->step_deadline_ms, &resp, details,
                        sizeof details);
    int64_t t1 = now_ns();
    cpu_end(&cw);
    long rss1 = proc_status_kb(o->server_pid, "VmRSS");
    long hwm1 = proc_status_kb(o->server_pid, "VmHWM");
    have_sync = have_sync && read_sync_counters(o->metrics, &sc1);
    /* The step's group(s): the RocksDB write (memtables + WAL) and the
     * fdatasync; the rest of the step is the engine running the timers. */
    double write_s = have_sync ? sc1.sync_s - sc0.sync_s : -1.0;
    double write_mb = have_sync ? (sc1.bytes - sc0.bytes) / 1e6 : -1.0;
    double writes = have_sync ? sc1.syncs - sc0.syncs : -1.0;
    grpc_slice_unref(header);
    Keyflow__V1__PushBatchResponse *ack = NULL;
    if (st == GRPC_STATUS_OK) {
        ack = keyflow__v1__push_batch_response__unpack(NULL, GRPC_SLICE_LENGTH(resp),
                                                       GRPC_SLICE_START_PTR(resp));
    }
    grpc_slice_unref(resp);
    fn_info_t after = get_function(channels[0], o->function_id);
    double step_s = (double)(t1 - t0) / 1e9;
    int64_t callbacks = ack ? ack->timer_callbacks : 0;
    int64_t out_rows =
        ack && ack->first_output_seq > 0 ? ack->last_output_seq - ack->first_output_seq + 1 : 0;
    cpu_pct_t cpu;
    cpu_percent(&cw, &cpu);
    char ctext[512];
    cpu_text(&cpu, ctext, sizeof ctext);
    if (st != GRPC_STATUS_OK) {
        fprintf(stderr, "kf_fnload: timers: the watermark batch failed: %s: %s\n", status_name(st),
                details);
    }
    bool as_expected = ack != NULL && callbacks == (int64_t)l->rows_acked && callbacks == o->timers;
    char mem_text[128] = "", sync_text[128] = "";
    if (o->server_pid > 0) {
        snprintf(mem_text, sizeof mem_text, "; server RSS %ld -> %ld MB (peak %ld -> %ld MB)",
                 rss0 / 1024, rss1 / 1024, hwm0 / 1024, hwm1 / 1024);
    }
    if (have_sync) {
        snprintf(sync_text, sizeof sync_text, "; synced writes %.0f taking %.3f s for %.1f MB",
                 writes, write_s, write_mb);
    }
    printf(
        "timers: %lld rows pushed (%" PRIu64 " acked; the server holds %" PRId64 " timers, %" PRId64
        " keys): watermark step %s in %.3f s; timer_callbacks %" PRId64 " (%s), "
        "activations %" PRId64 ", handler calls %" PRId64 ", output rows %" PRId64
        " = %.0f timers/s; after: %" PRId64 " timers, %" PRId64 " keys%s%s; %s\n",
        o->timers, l->rows_acked, before.timers, before.keys, status_name(st), step_s, callbacks,
        as_expected ? "as expected" : "NOT the number of rows pushed", ack ? ack->activations : 0,
        ack ? ack->handler_calls : 0, out_rows, step_s > 0 ? (double)callbacks / step_s : 0.0,
        after.timers, after.keys, mem_text, sync_text, ctext);
    char *detail_json = NULL;
    if (st != GRPC_STATUS_OK) {
        /* JSON-safe copy of the status message. */
        detail_json = strdup(details);
        for (char *c = detail_json; c && *c; c++) {
            if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) {
                *c = '\'';
            }
        }
    }
    printf("{\"kind\":\"fn_timers\",\"function_id\":\"%s\",\"timers\":%lld,\"rows_acked\":%" PRIu64
           ",\"timers_before\":%" PRId64 ",\"keys_before\":%" PRId64 ",\"status\":\"%s\","
           "\"status_details\":\"%s\",\"step_s\":%.3f,\"timer_callbacks\":%" PRId64
           ",\"timer_callbacks_as_expected\":%s,\"activations\":%" PRId64
           ",\"handler_calls\":%" PRId64 ",\"output_rows\":%" PRId64
           ",\"timers_per_s\":%.1f,\"timers_after\":%" PRId64 ",\"keys_after\":%" PRId64
           ",\"output_seq_after\":%" PRId64 ",\"server_rss_kb_before\":%ld,"
           "\"server_rss_kb_after\":%ld,\"server_peak_rss_kb_before\":%ld,"
           "\"server_peak_rss_kb_after\":%ld,\"step_synced_writes\":%.0f,"
           "\"step_write_s\":%.3f,\"step_write_mb\":%.1f,\"load_s\":%.3f,\"load_rows_per_s\":%.1f",
           o->function_id, o->timers, l->rows_acked, before.timers, before.keys, status_name(st),
           detail_json ? detail_json : "", step_s, callbacks, as_expected ? "true" : "false",
           ack ? ack->activations : 0, ack ? ack->handler_calls : 0, out_rows,
           step_s > 0 ? (double)callbacks / step_s : 0.0, after.timers, after.keys,
           after.output_seq, rss0, rss1, hwm0, hwm1, writes, write_s, write_mb, load_s,
           load_s > 0 ? (double)l->rows_acked / load_s : 0.0);
    cpu_json(stdout, &cpu);
    printf("}\n");
    fflush(stdout);
    free(detail_json);
    if (ack != NULL) {
        keyflow__v1__push_batch_response__free_unpacked(ack, NULL);
    }
    load_destroy(l);
    close_channels(o, channels);
    return 0;
}

int main(int argc, char **argv) {
    options_t o;
    if (!parse_args(argc, argv, &o)) {
        return 2;
    }
    grpc_init();
    gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);
    int rc;
    switch (o.mode) {
    case MODE_PUSH:
    case MODE_FILL: rc = run_push(&o); break;
    case MODE_READ: rc = run_read(&o); break;
    case MODE_TIMERS: rc = run_timers(&o); break;
    default: rc = 2; break;
    }
    grpc_shutdown();
    return rc;
}
