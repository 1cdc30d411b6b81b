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
 *           none fires), then sends one PushBatch that carries only a
 *           watermark past every timer and calls GetFunction back to back
 *           until no due timer is left: the batch's step fires
 *           max_timer_callbacks_per_step of them, the server's follow-on
 *           steps the rest. Reports the time until then, the steps and
 *           their engine time (keyflow_function_step_seconds) and the
 *           server's memory.
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
 * Measurement: as kf_load, with the same instruments (bench/common/
 * bench_util.h). Latency from just before the call is created to its
 * completion (monotonic clock) into a log-linear histogram (1/64 relative
 * bucket width); statuses into a per-code count; the first error of each
 * kind printed with its details. CPU of the client (getrusage), the server
 * (/proc/PID/stat), each server thread by name (/proc/PID/task) and the
 * machine (/proc/stat) over the window. Output: one human line, then one
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
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include "base/arena.h"
#include "base/status.h"
#include "bench/common/bench_util.h"
#include "proto/json_map.h"
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

/* ---- Server CPU and memory ---------------------------------------------- */

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
        t->ticks = kf_bench_stat_ticks(path, t->name, sizeof t->name);
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
        double pct = 100.0 * (double)(b->t[i].ticks - before) / kf_bench_ticks_per_s() / window_s;
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

/* CPU over a window: client, server and machine (kf_bench_cpu_*), and
 * each server thread name. */
typedef struct cpu_window {
    long server_pid;
    int64_t t0_ns, t1_ns;
    kf_bench_cpu_sample_t cpu0, cpu1;
    threads_snapshot_t threads0, threads1;
} cpu_window_t;

static void cpu_begin(cpu_window_t *w, long server_pid) {
    w->server_pid = server_pid;
    w->t0_ns = kf_bench_mono_ns();
    kf_bench_cpu_begin(&w->cpu0, server_pid);
    threads_take(server_pid, &w->threads0);
}

static void cpu_end(cpu_window_t *w) {
    w->t1_ns = kf_bench_mono_ns();
    kf_bench_cpu_end(&w->cpu1, w->server_pid);
    threads_take(w->server_pid, &w->threads1);
}

typedef struct cpu_pct {
    kf_bench_cpu_pct_t cpu;
    thread_use_t threads;
} cpu_pct_t;

static void cpu_percent(const cpu_window_t *w, cpu_pct_t *p) {
    double s = (double)(w->t1_ns - w->t0_ns) / 1e9;
    kf_bench_cpu_pct(&w->cpu0, &w->cpu1, s, &p->cpu);
    threads_diff(&w->threads0, &w->threads1, s, &p->threads);
}

/* " server 95% other 3% [kf-engine 90% kf-commit 4%]" for the human line. */
static void cpu_text(const cpu_pct_t *p, char *buf, size_t size) {
    int n = snprintf(buf, size, "cpu client %.0f%%", p->cpu.client);
    if (p->cpu.server >= 0 && n >= 0 && (size_t)n < size) {
        n += snprintf(buf + n, size - (size_t)n, " server %.0f%% other %.0f%%", p->cpu.server,
                      p->cpu.other);
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
            p->cpu.client, p->cpu.server, p->cpu.other);
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
    double sync_s;      /* keyflow_commit_sync_seconds_sum */
    double syncs;       /* keyflow_commit_sync_seconds_count */
    double bytes;       /* keyflow_commit_group_bytes_sum */
    double steps;       /* keyflow_function_step_seconds_count */
    double step_s;      /* keyflow_function_step_seconds_sum */
    double steps_50ms;  /* ..._bucket{le="0.05"}: steps of at most 50 ms */
    double steps_100ms; /* ..._bucket{le="0.1"} */
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
         metric_value(buf, "keyflow_commit_group_bytes_sum", &out->bytes) &&
         metric_value(buf, "keyflow_function_step_seconds_count", &out->steps) &&
         metric_value(buf, "keyflow_function_step_seconds_sum", &out->step_s) &&
         metric_value(buf, "keyflow_function_step_seconds_bucket{le=\"0.05\"}", &out->steps_50ms) &&
         metric_value(buf, "keyflow_function_step_seconds_bucket{le=\"0.1\"}", &out->steps_100ms);
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
    double wait_available_s; /* push: wait this long for a REMOTE function's worker */
    long channels;
    long deadline_ms;
    long step_deadline_ms; /* timers: the watermark step */
    long server_pid;
    const char *metrics; /* HOST:PORT of the server's HTTP /metrics, or NULL */
    bool minimal_stack;
} options_t;

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
        "  --wait-available-s S  wait up to S s for the function to be available (a REMOTE\n"
        "                        function's worker to connect) before loading (default 0)\n"
        "  --rows-total N        fill: rows to push (default 10000000)\n"
        "  --timers N            timers: distinct keys, one timer each (default 1000000)\n"
        "  --idle-us N           timers: idle_us of every row (default 60000000)\n"
        "  --max-keys N / --max-timers N   descriptor limits (timers: default 1100000)\n"
        "  --max-batch-rows N / --max-timer-callbacks N   descriptor limits (default: absent)\n"
        "  --limit N             read: rows per page (default 65536)\n"
        "  --channels N          channels = TCP connections (default 1)\n"
        "  --deadline-ms N       per-call deadline (default 30000)\n"
        "  --step-deadline-ms N  timers: how long the firing may take (default 300000)\n"
        "  --server-pid PID      also report that process's CPU (and its threads')\n"
        "  --metrics HOST:PORT   the server's HTTP address: timers also reports its steps and\n"
        "                        synced writes (keyflow_function_step_seconds, "
        "..._commit_sync_...)\n"
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
            ok = kf_bench_parse_long("kf_fnload", a, v, 1, PRODUCERS_MAX, &o->producers);
        } else if (strcmp(a, "--rows") == 0) {
            ok = kf_bench_parse_long("kf_fnload", a, v, 1, ROWS_MAX, &o->rows);
        } else if (strcmp(a, "--keys") == 0) {
            ok = kf_bench_parse_long("kf_fnload", a, v, 1, KEYS_MAX, &o->keys);
        } else if (strcmp(a, "--rows-total") == 0) {
            ok = kf_bench_parse_ll("kf_fnload", a, v, 1, ROWS_TOTAL_MAX, &o->rows_total);
        } else if (strcmp(a, "--timers") == 0) {
            ok = kf_bench_parse_ll("kf_fnload", a, v, 1, KEYS_MAX, &o->timers);
        } else if (strcmp(a, "--idle-us") == 0) {
            ok = kf_bench_parse_ll("kf_fnload", a, v, 1, 1000000000000LL, &o->idle_us);
        } else if (strcmp(a, "--max-keys") == 0) {
            ok = kf_bench_parse_ll("kf_fnload", a, v, 1, 10000000, &o->max_keys);
        } else if (strcmp(a, "--max-timers") == 0) {
            ok = kf_bench_parse_ll("kf_fnload", a, v, 1, 10000000, &o->max_timers);
        } else if (strcmp(a, "--max-batch-rows") == 0) {
            ok = kf_bench_parse_long("kf_fnload", a, v, 1, 4096, &o->max_batch_rows);
        } else if (strcmp(a, "--max-timer-callbacks") == 0) {
            ok = kf_bench_parse_long("kf_fnload", a, v, 1, 4096, &o->max_timer_callbacks);
        } else if (strcmp(a, "--limit") == 0) {
            ok = kf_bench_parse_long("kf_fnload", a, v, 1, 65536, &o->limit);
        } else if (strcmp(a, "--duration-s") == 0) {
            ok = kf_bench_parse_seconds("kf_fnload", a, v, DURATION_S_MAX, &o->duration_s);
        } else if (strcmp(a, "--wait-available-s") == 0) {
            o->wait_available_s = atof(v);
        } else if (strcmp(a, "--warmup-s") == 0) {
            ok = kf_bench_parse_seconds("kf_fnload", a, v, DURATION_S_MAX, &o->warmup_s);
        } else if (strcmp(a, "--channels") == 0) {
            ok = kf_bench_parse_long("kf_fnload", a, v, 1, CHANNELS_MAX, &o->channels);
        } else if (strcmp(a, "--deadline-ms") == 0) {
            ok = kf_bench_parse_long("kf_fnload", a, v, 1, 3600000, &o->deadline_ms);
        } else if (strcmp(a, "--step-deadline-ms") == 0) {
            ok = kf_bench_parse_long("kf_fnload", a, v, 1, 3600000, &o->step_deadline_ms);
        } else if (strcmp(a, "--server-pid") == 0) {
            ok = kf_bench_parse_ll("kf_fnload", a, v, 1, 1LL << 30, &ll);
            o->server_pid = (long)ll;
        } else if (strcmp(a, "--metrics") == 0) {
            o->metrics = v;
        } else if (strcmp(a, "--minimal-stack") == 0) {
            ok = kf_bench_parse_ll("kf_fnload", a, v, 0, 1, &ll);
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
    kf_bench_unary_t u;
    kf_bench_unary_start(call, &u, grpc_raw_byte_buffer_create(&request, 1), call);
    /* The minimal stack has no client deadline filter: wait a little past
     * the deadline, then cancel (invariant 3). */
    gpr_timespec give_up =
        gpr_time_add(deadline, gpr_time_from_millis(DRAIN_GRACE_MS, GPR_TIMESPAN));
    grpc_event ev = grpc_completion_queue_pluck(cq, call, give_up, NULL);
    if (ev.type != GRPC_OP_COMPLETE) {
        grpc_call_cancel(call, NULL);
        ev = grpc_completion_queue_pluck(cq, call, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    }
    int result = ev.success ? (int)u.status : -1;
    *response = u.response != NULL ? buffer_flatten(u.response) : grpc_empty_slice();
    char *text = grpc_slice_to_c_string(u.details);
    snprintf(details, details_size, "%s", ev.success ? text : "the call's batch failed");
    gpr_free(text);
    kf_bench_unary_release(&u);
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

/* Calls are counted in kf_bench_status_slot's slots. An OK PushBatch must
 * also carry the acknowledgement of the batch sent (and a read page must
 * decode); one that does not counts in the slot for calls the tool rejects,
 * under this name. */
#define STATUS_BAD_ACK KF_BENCH_STATUS_REJECTED
#define BAD_ACK_NAME   "BAD_ACK"

/* The name of a unary_call result (-1: the batch failed). */
static const char *status_name(int st) {
    return kf_bench_status_name(kf_bench_status_slot(st >= 0, (grpc_status_code)st), BAD_ACK_NAME);
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
    /* Registering again is idempotent: a REMOTE function is polled this way
     * until a worker serves it (--wait-available-s). */
    int64_t wait_until = kf_bench_mono_ns() + (int64_t)(o->wait_available_s * 1e9);
    int st;
    Keyflow__V1__RegisterFunctionResponse *r;
    for (;;) {
        st = unary_call(ch, METHOD_REGISTER, packed, SETUP_DEADLINE_MS, &resp, details,
                        sizeof details);
        r = NULL;
        if (st == GRPC_STATUS_OK) {
            r = keyflow__v1__register_function_response__unpack(NULL, GRPC_SLICE_LENGTH(resp),
                                                                GRPC_SLICE_START_PTR(resp));
        }
        grpc_slice_unref(resp);
        if (r == NULL || r->function == NULL || r->function->available ||
            kf_bench_mono_ns() > wait_until) {
            break;
        }
        keyflow__v1__register_function_response__free_unpacked(r, NULL);
        struct timespec pause = {0, 100 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    grpc_slice_unref(packed);
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
    int64_t keys, timers, output_seq, watermark_us, state_bytes, due_timers;
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
                           fi->output_seq, fi->watermark_us, fi->state_bytes,
                           fi->due_timers};
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
    kf_bench_unary_t unary;
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
    kf_bench_hist_t hist;
    uint64_t statuses[KF_BENCH_STATUS_SLOTS];
    bool status_printed[KF_BENCH_STATUS_SLOTS];
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
        cols[0] = grpc_slice_ref(l->user_pool[kf_bench_rng_next(&l->rng) % USER_POOL]);
        cols[2] = grpc_slice_ref(l->third_full);
    } else {
        uint32_t *keys = malloc((size_t)n * sizeof *keys);
        if (keys == NULL) {
            fprintf(stderr, "kf_fnload: out of memory\n");
            abort();
        }
        for (int64_t i = 0; i < n; i++) {
            keys[i] = l->keys == KEYS_UNIFORM
                          ? (uint32_t)(kf_bench_rng_next(&l->rng) % (uint64_t)l->o->keys)
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
    grpc_byte_buffer *request;
    if (!producer_request(l, p, &request, &rows)) {
        return;
    }
    p->rows_in_call = rows;
    p->cancelled = false;
    gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                         gpr_time_from_millis(l->o->deadline_ms, GPR_TIMESPAN));
    p->start_ns = kf_bench_mono_ns();
    if (l->first_start_ns == 0) {
        l->first_start_ns = p->start_ns;
    }
    p->call = grpc_channel_create_registered_call(p->channel, NULL, GRPC_PROPAGATE_DEFAULTS, l->cq,
                                                  p->method, deadline, NULL);
    kf_bench_unary_start(p->call, &p->unary, request, p);
    l->outstanding++;
}

static void report_once(load_t *l, int slot, const char *text) {
    if (!l->status_printed[slot]) {
        l->status_printed[slot] = true;
        fprintf(stderr, "kf_fnload: first %s: %s\n", kf_bench_status_name(slot, BAD_ACK_NAME),
                text);
    }
}

/* Accounts for the finished call and frees what it held. */
static void producer_finish(producer_t *p, bool ok, int64_t t) {
    load_t *l = p->load;
    bool counted = !l->timed || (t >= l->window_start_ns && t < l->window_end_ns);
    if (counted) {
        int slot = kf_bench_status_slot(ok, p->unary.status);
        if (slot == GRPC_STATUS_OK) {
            Keyflow__V1__PushBatchResponse *ack = NULL;
            if (p->unary.response != NULL) {
                grpc_slice flat = buffer_flatten(p->unary.response);
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
            char *text = grpc_slice_to_c_string(p->unary.details);
            report_once(l, slot, text);
            gpr_free(text);
        }
        l->statuses[slot]++;
        kf_bench_hist_record(&l->hist, (uint64_t)(t - p->start_ns));
        l->last_done_ns = t;
    }
    kf_bench_unary_release(&p->unary);
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
        int64_t t = kf_bench_mono_ns();
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
    l->rng = (uint64_t)kf_bench_mono_ns() ^ ((uint64_t)getpid() << 32);
    l->key_prefix = keys == KEYS_UNIFORM ? 'u' : 's';
    /* Event times start now, so output timestamps look like real ones. */
    l->ts_base_us = kf_bench_wall_us();
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
                draw[i] = (uint32_t)(kf_bench_rng_next(&l->rng) % (uint64_t)o->keys);
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

/* One human line and one JSON line for a push or fill run. */
static void print_load(const load_t *l, const char *kind, double window_s, const cpu_pct_t *cpu,
                       const registered_t *reg) {
    const options_t *o = l->o;
    double rows_s = window_s > 0 ? (double)l->rows_acked / window_s : 0.0;
    double batches_s = window_s > 0 ? (double)l->batches_ok / window_s : 0.0;
    uint64_t errors = kf_bench_errors_total(l->statuses);
    long long keys = l->keys == KEYS_DISTINCT ? o->timers : o->keys;
    char etext[512], ejson[512], ctext[512];
    kf_bench_errors_text(l->statuses, BAD_ACK_NAME, false, etext, sizeof etext);
    kf_bench_errors_text(l->statuses, BAD_ACK_NAME, true, ejson, sizeof ejson);
    cpu_text(cpu, ctext, sizeof ctext);
    printf("%s producers=%ld rows/batch=%ld keys=%lld: %" PRIu64 " batches ok in %.1f s = %.0f "
           "batches/s, %.0f rows/s; ack latency us p50 %.1f p99 %.1f max %.1f; errors %" PRIu64
           "%s; %s\n",
           kind, o->producers, o->rows, keys, l->batches_ok, window_s, batches_s, rows_s,
           kf_bench_hist_quantile_us(&l->hist, 0.50), kf_bench_hist_quantile_us(&l->hist, 0.99),
           kf_bench_hist_max_us(&l->hist), errors, etext, ctext);
    printf("{\"kind\":\"%s\",\"function_id\":\"%s\",\"descriptor_sha256\":\"%s\","
           "\"producers\":%ld,\"rows_per_batch\":%ld,\"keys\":%lld,\"channels\":%ld,"
           "\"window_s\":%.3f,\"warmup_s\":%.3f,\"batches_ok\":%" PRIu64 ",\"rows_acked\":%" PRIu64
           ",\"batches_per_s\":%.1f,\"rows_per_s\":%.1f,\"activations\":%" PRIu64
           ",\"handler_calls\":%" PRIu64 ",\"duplicates\":%" PRIu64 ",\"p50_us\":%.1f,"
           "\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f,\"mean_us\":%.1f,\"errors\":%" PRIu64
           ",\"errors_by_status\":{%s},\"abandoned\":%" PRIu64,
           kind, o->function_id, reg->sha256, o->producers, o->rows, keys, o->channels, window_s,
           l->timed ? o->warmup_s : 0.0, l->batches_ok, l->rows_acked, batches_s, rows_s,
           l->activations, l->handler_calls, l->duplicates,
           kf_bench_hist_quantile_us(&l->hist, 0.50), kf_bench_hist_quantile_us(&l->hist, 0.99),
           kf_bench_hist_quantile_us(&l->hist, 0.999), kf_bench_hist_max_us(&l->hist),
           kf_bench_hist_mean_us(&l->hist), errors, ejson, l->abandoned);
    cpu_json(stdout, cpu);
    printf("}\n");
    fflush(stdout);
}

/* No receive limit: a 65536-row output page is several MB. */
static grpc_channel *open_channel(const options_t *o, int index) {
    return kf_bench_channel_create(o->target, index, o->minimal_stack, true);
}

static bool open_channels(const options_t *o, grpc_channel **channels) {
    for (long c = 0; c < o->channels; c++) {
        channels[c] = open_channel(o, (int)c);
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
    int64_t start = kf_bench_mono_ns();
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
        kf_bench_sleep_until_ns(l->window_start_ns);
        cpu_begin(&cw, o->server_pid);
        kf_bench_sleep_until_ns(l->window_end_ns);
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
    grpc_channel *ch = open_channel(o, 0);
    static kf_bench_hist_t hist;
    uint64_t statuses[KF_BENCH_STATUS_SLOTS] = {0};
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
    int64_t t0 = kf_bench_mono_ns();
    for (;;) {
        req.after_seq = after;
        grpc_slice packed = pack_message(&req.base);
        grpc_slice resp;
        char details[512];
        int64_t s0 = kf_bench_mono_ns();
        int st =
            unary_call(ch, METHOD_READ, packed, o->deadline_ms, &resp, details, sizeof details);
        int64_t s1 = kf_bench_mono_ns();
        grpc_slice_unref(packed);
        int slot = kf_bench_status_slot(st >= 0, (grpc_status_code)st);
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
                         kf_bench_status_name(slot, BAD_ACK_NAME), after, details);
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
        kf_bench_hist_record(&hist, (uint64_t)(s1 - s0));
        bytes += GRPC_SLICE_LENGTH(resp);
        rows += n;
        pages++;
        after = pg.next_after_seq;
        grpc_slice_unref(resp);
    }
    int64_t t1 = kf_bench_mono_ns();
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
    kf_bench_errors_text(statuses, BAD_ACK_NAME, false, etext, sizeof etext);
    kf_bench_errors_text(statuses, BAD_ACK_NAME, true, ejson, sizeof ejson);
    uint64_t errors = kf_bench_errors_total(statuses);
    printf("read limit=%ld: %" PRId64 " rows in %" PRId64 " pages in %.2f s = %.0f rows/s, "
           "%.1f MB/s; page latency us p50 %.1f p99 %.1f max %.1f; high water %" PRId64
           "; errors %" PRIu64 "%s%s%s; %s\n",
           o->limit, rows, pages, s, rows_s, s > 0 ? (double)bytes / s / 1e6 : 0.0,
           kf_bench_hist_quantile_us(&hist, 0.50), kf_bench_hist_quantile_us(&hist, 0.99),
           kf_bench_hist_max_us(&hist), high, errors, etext,
           verify_problem ? "; CHECK FAILED: " : "", verify_problem ? verify_problem : "", ctext);
    printf("{\"kind\":\"fn_read\",\"function_id\":\"%s\",\"limit\":%ld,\"rows\":%" PRId64
           ",\"pages\":%" PRId64 ",\"bytes\":%" PRIu64 ",\"elapsed_s\":%.3f,\"rows_per_s\":%.1f,"
           "\"page_p50_us\":%.1f,\"page_p99_us\":%.1f,\"page_max_us\":%.1f,"
           "\"high_water_seq\":%" PRId64 ",\"complete\":%s,\"check_ok\":%s,\"errors\":%" PRIu64
           ",\"errors_by_status\":{%s}",
           o->function_id, o->limit, rows, pages, bytes, s, rows_s,
           kf_bench_hist_quantile_us(&hist, 0.50), kf_bench_hist_quantile_us(&hist, 0.99),
           kf_bench_hist_max_us(&hist), high, errors == 0 && after >= high ? "true" : "false",
           verify_problem ? "false" : "true", errors, ejson);
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
     * ts + idle_us, plus one. Its step fires max_timer_callbacks_per_step
     * timers and is acknowledged; the server fires the rest in follow-on
     * steps of its own. GetFunction is then called back to back until it
     * reports no due timer: its reply leaves only after every group before
     * it is durable, so the last one marks the end of the firing. */
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
    int64_t t0 = kf_bench_mono_ns();
    int st = unary_call(channels[0], METHOD_PUSH, header, o->step_deadline_ms, &resp, details,
                        sizeof details);
    int64_t t_ack = kf_bench_mono_ns();
    fn_info_t after = {0};
    int64_t polls = 0, poll_max_ns = 0;
    int64_t give_up = t0 + (int64_t)o->step_deadline_ms * 1000000;
    while (st == GRPC_STATUS_OK && kf_bench_mono_ns() < give_up) {
        int64_t p0 = kf_bench_mono_ns();
        after = get_function(channels[0], o->function_id);
        int64_t took = kf_bench_mono_ns() - p0;
        poll_max_ns = took > poll_max_ns ? took : poll_max_ns;
        polls++;
        if (!after.ok || after.due_timers == 0) {
            break;
        }
    }
    int64_t t1 = kf_bench_mono_ns();
    cpu_end(&cw);
    long rss1 = proc_status_kb(o->server_pid, "VmRSS");
    long hwm1 = proc_status_kb(o->server_pid, "VmHWM");
    have_sync = have_sync && read_sync_counters(o->metrics, &sc1);
    /* The groups written meanwhile (memtables + WAL + fdatasync) and the
     * engine's steps (keyflow_function_step_seconds). */
    double write_s = have_sync ? sc1.sync_s - sc0.sync_s : -1.0;
    double write_mb = have_sync ? (sc1.bytes - sc0.bytes) / 1e6 : -1.0;
    double writes = have_sync ? sc1.syncs - sc0.syncs : -1.0;
    double steps = have_sync ? sc1.steps - sc0.steps : -1.0;
    double step_mean_ms = steps > 0 ? 1000.0 * (sc1.step_s - sc0.step_s) / steps : -1.0;
    double steps_over_50ms = have_sync ? steps - (sc1.steps_50ms - sc0.steps_50ms) : -1.0;
    double steps_over_100ms = have_sync ? steps - (sc1.steps_100ms - sc0.steps_100ms) : -1.0;
    grpc_slice_unref(header);
    Keyflow__V1__PushBatchResponse *ack = NULL;
    if (st == GRPC_STATUS_OK) {
        ack = keyflow__v1__push_batch_response__unpack(NULL, GRPC_SLICE_LENGTH(resp),
                                                       GRPC_SLICE_START_PTR(resp));
    }
    grpc_slice_unref(resp);
    double ack_s = (double)(t_ack - t0) / 1e9;
    double total_s = (double)(t1 - t0) / 1e9;
    int64_t fired = after.ok ? after.output_seq - before.output_seq : 0;
    bool done = after.ok && after.due_timers == 0 && after.timers == 0;
    bool as_expected = done && fired == o->timers && (int64_t)l->rows_acked == o->timers;
    cpu_pct_t cpu;
    cpu_percent(&cw, &cpu);
    char ctext[512];
    cpu_text(&cpu, ctext, sizeof ctext);
    if (st != GRPC_STATUS_OK) {
        fprintf(stderr, "kf_fnload: timers: the watermark batch failed: %s: %s\n", status_name(st),
                details);
    }
    char mem_text[128] = "", sync_text[256] = "";
    if (o->server_pid > 0) {
        snprintf(mem_text, sizeof mem_text, "; server RSS %ld -> %ld MB (peak %ld -> %ld MB)",
                 rss0 / 1024, rss1 / 1024, hwm0 / 1024, hwm1 / 1024);
    }
    if (have_sync) {
        snprintf(sync_text, sizeof sync_text,
                 "; %.0f steps (mean %.2f ms, %.0f over 50 ms); %.0f synced writes taking %.3f s "
                 "for %.1f MB",
                 steps, step_mean_ms, steps_over_50ms, writes, write_s, write_mb);
    }
    printf("timers: %lld rows pushed (%" PRIu64 " acked; the server holds %" PRId64
           " timers, %" PRId64 " keys): watermark batch %s in %.3f s (its step fired %" PRId64
           "); all fired (%s) after %.3f s = %.0f timers/s, %" PRId64
           " GetFunction polls (slowest %.1f ms); after: %" PRId64 " timers, %" PRId64
           " keys%s%s; %s\n",
           o->timers, l->rows_acked, before.timers, before.keys, status_name(st), ack_s,
           ack ? ack->timer_callbacks : 0, as_expected ? "as expected" : "NOT as expected", total_s,
           total_s > 0 ? (double)fired / total_s : 0.0, polls, (double)poll_max_ns / 1e6,
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
           "\"status_details\":\"%s\",\"ack_s\":%.3f,\"step_timer_callbacks\":%" PRId64
           ",\"total_s\":%.3f,\"fired\":%" PRId64 ",\"fired_as_expected\":%s"
           ",\"timers_per_s\":%.1f,\"polls\":%" PRId64 ",\"poll_max_ms\":%.2f"
           ",\"timers_after\":%" PRId64 ",\"keys_after\":%" PRId64 ",\"due_after\":%" PRId64
           ",\"output_seq_after\":%" PRId64 ",\"server_rss_kb_before\":%ld,"
           "\"server_rss_kb_after\":%ld,\"server_peak_rss_kb_before\":%ld,"
           "\"server_peak_rss_kb_after\":%ld,\"steps\":%.0f,\"step_mean_ms\":%.3f,"
           "\"steps_over_50ms\":%.0f,\"steps_over_100ms\":%.0f,\"synced_writes\":%.0f,"
           "\"write_s\":%.3f,\"write_mb\":%.1f,\"load_s\":%.3f,\"load_rows_per_s\":%.1f",
           o->function_id, o->timers, l->rows_acked, before.timers, before.keys, status_name(st),
           detail_json ? detail_json : "", ack_s, ack ? ack->timer_callbacks : 0, total_s, fired,
           as_expected ? "true" : "false", total_s > 0 ? (double)fired / total_s : 0.0, polls,
           (double)poll_max_ns / 1e6, after.timers, after.keys, after.due_timers, after.output_seq,
           rss0, rss1, hwm0, hwm1, steps, step_mean_ms, steps_over_50ms, steps_over_100ms, writes,
           write_s, write_mb, load_s, load_s > 0 ? (double)l->rows_acked / load_s : 0.0);
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
