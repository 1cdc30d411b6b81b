/*
 * kf_load.c - closed-loop gRPC load generator for keyflowd, plus a small
 * fdatasync probe, so that one run reports the server's latency next to the
 * disk's own floor (bench/README.md explains the method).
 *
 * Load mode (--rpc health | send):
 *   * --concurrency calls are kept outstanding: a slot starts its next call
 *     as soon as its previous one completes (closed loop), so the offered
 *     load adapts to the server and never queues up inside the client;
 *   * slots are spread over --threads client threads, each with its own
 *     completion queue, and over --channels channels, each with its own TCP
 *     connection (a local subchannel pool stops gRPC from sharing one);
 *   * SendEvent requests are packed once per key before the run; a call
 *     only wraps the packed slice in a byte buffer (a reference, no copy);
 *   * every call completing inside the measurement window [warmup end,
 *     warmup end + duration) is counted: its latency (monotonic clock, from
 *     just before the call is created to its completion) goes into a
 *     fixed-size log-linear histogram and its status into a per-code count.
 *     Calls completing in the warm-up or after the window are not counted.
 *
 * Fsync probe (--fsync-probe DIR): write 100-byte records with pwrite and
 * fdatasync each one, by default appending to a new file (--fsync-mode picks
 * other file layouts, see fsync_mode_t); the histogram holds the fdatasync
 * time only.
 *
 * Output: one human-readable line, then one JSON line. The tool reports; it
 * never judges (the exit status is 0 even when calls failed, unless the run
 * itself could not be set up).
 *
 * Invariants:
 *   1. Memory is bounded: the histogram is an array of HIST_BUCKETS counters
 *      per thread; slots and request slices are allocated once up front.
 *   2. A slot belongs to one worker thread and is touched only by it (its
 *      completion queue delivers only that worker's tags).
 *   3. A worker stops starting calls at the window's end and drains its own
 *      outstanding calls; a call still pending long after its deadline is
 *      cancelled, so the run always ends.
 */
/* fallocate and FALLOC_FL_KEEP_SIZE are Linux extensions, for the probe
 * that mimics RocksDB's WAL preallocation. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include "grpc/health/v1/health.pb-c.h"
#include "keyflow/v1/coordinators.pb-c.h"

/* Bounds on the flags: large enough for any run this machine can drive,
 * small enough that a typo cannot allocate gigabytes. */
#define CONCURRENCY_MAX    4096
#define THREADS_MAX        16
#define CHANNELS_MAX       64
#define KEYS_MAX           1000000
#define DURATION_S_MAX     3600
#define FSYNC_COUNT_MAX    1000000
#define FSYNC_RECORD_BYTES 100

/* A call still outstanding this long after its deadline is cancelled. */
#define DRAIN_GRACE_MS 2000
/* How often an idle worker wakes up to look at the clock. */
#define POLL_MS 100

/* ---- Histogram --------------------------------------------------------
 *
 * Log-linear over nanoseconds: values below 128 have one bucket each; above,
 * every power of two [2^k, 2^(k+1)) is split into 64 equal buckets, so a
 * bucket is at most 1/64 (1.6%) of its value wide. Values are clamped to
 * 2^40 ns (18 minutes), giving a fixed array of HIST_BUCKETS counters. */
#define HIST_SUB_BITS  6
#define HIST_SUB       (1 << HIST_SUB_BITS)
#define HIST_VALUE_MAX ((UINT64_C(1) << 40) - 1)
#define HIST_BUCKETS   ((40 - HIST_SUB_BITS) * HIST_SUB + 2 * HIST_SUB)

typedef struct histogram {
    uint64_t counts[HIST_BUCKETS];
    uint64_t total;
    uint64_t max_ns;
    uint64_t sum_ns; /* for the mean; 2^64 ns is 584 years */
} histogram_t;

static size_t hist_index(uint64_t v) {
    if (v > HIST_VALUE_MAX) {
        v = HIST_VALUE_MAX;
    }
    if (v < 2 * HIST_SUB) {
        return (size_t)v;
    }
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    unsigned shift = msb - HIST_SUB_BITS;
    /* v >> shift is in [HIST_SUB, 2 * HIST_SUB), so indexes never overlap. */
    return (size_t)shift * HIST_SUB + (size_t)(v >> shift);
}

/* The middle of bucket i, the value reported for it. */
static uint64_t hist_value(size_t i) {
    if (i < 2 * HIST_SUB) {
        return i;
    }
    unsigned shift = (unsigned)(i / HIST_SUB) - 1;
    uint64_t sub = i - (size_t)shift * HIST_SUB;
    uint64_t low = sub << shift;
    return low + ((UINT64_C(1) << shift) - 1) / 2;
}

static void hist_record(histogram_t *h, uint64_t ns) {
    h->counts[hist_index(ns)]++;
    h->total++;
    h->sum_ns += ns;
    if (ns > h->max_ns) {
        h->max_ns = ns;
    }
}

static void hist_merge(histogram_t *into, const histogram_t *from) {
    for (size_t i = 0; i < HIST_BUCKETS; i++) {
        into->counts[i] += from->counts[i];
    }
    into->total += from->total;
    into->sum_ns += from->sum_ns;
    if (from->max_ns > into->max_ns) {
        into->max_ns = from->max_ns;
    }
}

/* The q-quantile (0 < q < 1) in microseconds: the first bucket whose
 * cumulative count reaches ceil(q * total); never above the exact max. */
static double hist_quantile_us(const histogram_t *h, double q) {
    if (h->total == 0) {
        return 0.0;
    }
    uint64_t rank = (uint64_t)(q * (double)h->total);
    if ((double)rank < q * (double)h->total) {
        rank++;
    }
    if (rank == 0) {
        rank = 1;
    }
    uint64_t seen = 0;
    for (size_t i = 0; i < HIST_BUCKETS; i++) {
        seen += h->counts[i];
        if (seen >= rank) {
            uint64_t v = hist_value(i);
            return (double)(v < h->max_ns ? v : h->max_ns) / 1000.0;
        }
    }
    return (double)h->max_ns / 1000.0;
}

/* ---- Small helpers ---------------------------------------------------- */

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_until_ns(int64_t when_ns) {
    struct timespec ts = {.tv_sec = when_ns / 1000000000, .tv_nsec = when_ns % 1000000000};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* xorshift64*: cheap and good enough to spread keys uniformly. */
static uint64_t rng_next(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * UINT64_C(2685821657736338717);
}

static bool parse_long(const char *flag, const char *text, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "kf_load: %s must be an integer in %ld..%ld, got '%s'\n", flag, lo, hi,
                text);
        return false;
    }
    *out = v;
    return true;
}

static bool parse_seconds(const char *flag, const char *text, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !(v >= 0.0) || v > DURATION_S_MAX) {
        fprintf(stderr, "kf_load: %s must be seconds in 0..%d, got '%s'\n", flag, DURATION_S_MAX,
                text);
        return false;
    }
    *out = v;
    return true;
}

/* CPU seconds (user + system) a process has used, from /proc/PID/stat;
 * negative when it cannot be read. Fields 14 and 15 follow the ")" that
 * closes the command name, which may itself contain spaces. */
static double proc_cpu_s(long pid) {
    char path[64];
    char buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1.0;
    }
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    if (p == NULL) {
        return -1.0;
    }
    unsigned long utime = 0;
    unsigned long stime = 0;
    /* After ")": state(3) ppid pgrp session tty tpgid flags minflt cminflt
     * majflt cmajflt utime(14) stime(15). */
    if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) !=
        2) {
        return -1.0;
    }
    return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

/* CPU seconds the whole machine has been busy (all CPUs; idle and iowait
 * excluded), from the first line of /proc/stat; negative when unreadable.
 * Minus the client's and the server's share, it shows how much other work
 * ran during the window, which is what makes a run on a shared machine
 * trustworthy or not. */
static double machine_busy_s(void) {
    FILE *f = fopen("/proc/stat", "r");
    if (f == NULL) {
        return -1.0;
    }
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n != 8) {
        return -1.0;
    }
    /* user nice system idle iowait irq softirq steal */
    unsigned long long busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    return (double)busy / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* ---- Fsync probe ------------------------------------------------------
 *
 * Three ways to lay out the file, because ext4 makes fdatasync cost depend
 * on whether the write changes metadata:
 *   append    the file grows with every record: each fdatasync also commits
 *             the new size (the reference number);
 *   fallocate space reserved with FALLOC_FL_KEEP_SIZE first, as RocksDB
 *             does for its WAL: each fdatasync also converts the written
 *             part of an unwritten extent and commits the new size;
 *   overwrite the file is written and synced in full first, then rewritten
 *             in place, as RocksDB's recycled WAL files are: data only. */

typedef enum fsync_mode {
    FSYNC_APPEND,
    FSYNC_FALLOCATE,
    FSYNC_OVERWRITE,
} fsync_mode_t;

static const char *const fsync_mode_names[] = {"append", "fallocate", "overwrite"};

/* Lays the file out for the mode before the timed loop. */
static bool fsync_prepare(int fd, fsync_mode_t mode, long count, const char *path) {
    off_t total = (off_t)count * FSYNC_RECORD_BYTES;
    if (mode == FSYNC_FALLOCATE) {
        if (fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, total) != 0) {
            fprintf(stderr, "kf_load: fallocate %s: %s\n", path, strerror(errno));
            return false;
        }
    } else if (mode == FSYNC_OVERWRITE) {
        char block[4096];
        memset(block, 'o', sizeof block);
        for (off_t at = 0; at < total; at += (off_t)sizeof block) {
            if (pwrite(fd, block, sizeof block, at) != (ssize_t)sizeof block) {
                fprintf(stderr, "kf_load: pwrite %s: %s\n", path, strerror(errno));
                return false;
            }
        }
        if (fsync(fd) != 0) {
            fprintf(stderr, "kf_load: fsync %s: %s\n", path, strerror(errno));
            return false;
        }
    }
    return true;
}

static int run_fsync_probe(const char *dir, long count, fsync_mode_t mode) {
    char path[4096];
    snprintf(path, sizeof path, "%s/kf_fsync_probe.%ld", dir, (long)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "kf_load: cannot create %s: %s\n", path, strerror(errno));
        return 1;
    }
    char record[FSYNC_RECORD_BYTES];
    memset(record, 'r', sizeof record);
    record[sizeof record - 1] = '\n';
    static histogram_t hist; /* static: 18 KB is too much for some stacks */
    memset(&hist, 0, sizeof hist);
    int status = fsync_prepare(fd, mode, count, path) ? 0 : 1;
    int64_t t0 = mono_ns();
    for (long i = 0; i < count && status == 0; i++) {
        off_t at = (off_t)i * FSYNC_RECORD_BYTES;
        if (pwrite(fd, record, sizeof record, at) != (ssize_t)sizeof record) {
            fprintf(stderr, "kf_load: pwrite %s: %s\n", path, strerror(errno));
            status = 1;
            break;
        }
        int64_t before = mono_ns();
        if (fdatasync(fd) != 0) {
            fprintf(stderr, "kf_load: fdatasync %s: %s\n", path, strerror(errno));
            status = 1;
            break;
        }
        hist_record(&hist, (uint64_t)(mono_ns() - before));
    }
    double elapsed_s = (double)(mono_ns() - t0) / 1e9;
    close(fd);
    unlink(path);
    if (status != 0) {
        return status;
    }
    const char *name = fsync_mode_names[mode];
    double ops = elapsed_s > 0 ? (double)hist.total / elapsed_s : 0.0;
    double p50 = hist_quantile_us(&hist, 0.50);
    double p99 = hist_quantile_us(&hist, 0.99);
    double max_us = (double)hist.max_ns / 1000.0;
    double mean_us = hist.total > 0 ? (double)hist.sum_ns / (double)hist.total / 1000.0 : 0.0;
    printf("fsync-probe %s dir=%s: %" PRIu64 " x (pwrite %d B + fdatasync) in %.2f s = %.0f ops/s;"
           " fdatasync p50 %.1f us p99 %.1f us mean %.1f us max %.1f us\n",
           name, dir, hist.total, FSYNC_RECORD_BYTES, elapsed_s, ops, p50, p99, mean_us, max_us);
    printf("{\"kind\":\"fsync_probe\",\"mode\":\"%s\",\"count\":%" PRIu64 ",\"record_bytes\":%d,"
           "\"elapsed_s\":%.3f,\"ops_per_s\":%.1f,\"fdatasync_p50_us\":%.1f,"
           "\"fdatasync_p99_us\":%.1f,\"fdatasync_mean_us\":%.1f,\"fdatasync_max_us\":%.1f}\n",
           name, hist.total, FSYNC_RECORD_BYTES, elapsed_s, ops, p50, p99, mean_us, max_us);
    fflush(stdout);
    return 0;
}

/* ---- Load generator --------------------------------------------------- */

typedef enum rpc_kind {
    RPC_HEALTH,
    RPC_SEND,
} rpc_kind_t;

typedef struct options {
    const char *target;
    rpc_kind_t rpc;
    long concurrency;
    double duration_s;
    double warmup_s;
    long keys;
    long channels;
    long threads;
    long deadline_ms;
    long server_pid;    /* 0: do not report the server's CPU */
    bool minimal_stack; /* GRPC_ARG_MINIMAL_STACK on the client channels */
    const char *workflow;
    const char *fsync_dir; /* non-NULL: run the fsync probe instead */
    long fsync_count;
    fsync_mode_t fsync_mode;
} options_t;

/* Status slots: the 17 gRPC codes, then the failures that have no code. */
#define STATUS_CODES        17
#define STATUS_BATCH_FAILED 17 /* the completion queue reported success = 0 */
#define STATUS_NO_MESSAGE   18 /* OK without a response message */
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
    "OK_WITHOUT_MESSAGE",
    "OTHER",
};

/* The first error of each kind prints its details once, so a failing run
 * says why and not only how often. */
static atomic_bool status_reported[STATUS_SLOTS];

typedef struct run run_t;
typedef struct worker worker_t;

typedef struct slot {
    worker_t *worker;
    grpc_channel *channel; /* borrowed from the run */
    void *method;          /* the channel's registered-call handle */
    grpc_call *call;       /* NULL when no call is outstanding */
    grpc_byte_buffer *request;
    grpc_byte_buffer *response;
    grpc_metadata_array initial_metadata;
    grpc_metadata_array trailing_metadata;
    grpc_status_code status;
    grpc_slice status_details;
    int64_t start_ns;
} slot_t;

struct worker {
    run_t *run;
    pthread_t thread;
    grpc_completion_queue *cq;
    slot_t *slots; /* borrowed from run_load's array; only this thread
                      touches them while it runs */
    size_t slot_count;
    size_t outstanding;
    uint64_t rng;
    uint64_t statuses[STATUS_SLOTS]; /* calls completed in the window, by status */
    uint64_t abandoned;              /* calls cancelled by the drain timeout */
    histogram_t hist;
};

struct run {
    const options_t *options;
    const char *method_path;
    grpc_channel *channels[CHANNELS_MAX];
    void *methods[CHANNELS_MAX];
    grpc_slice *requests; /* one packed request per key (one for health) */
    size_t request_count;
    int64_t measure_start_ns;
    int64_t measure_end_ns;
    worker_t *workers;
};

/* Packs every request once. SendEvent: one per key, a debounce rule whose
 * window stays open for the whole run, so each call is one durable event
 * append to an open window. Health/Check: one empty request. */
static bool build_requests(run_t *r) {
    const options_t *o = r->options;
    r->request_count = o->rpc == RPC_SEND ? (size_t)o->keys : 1;
    r->requests = calloc(r->request_count, sizeof *r->requests);
    if (r->requests == NULL) {
        return false;
    }
    for (size_t i = 0; i < r->request_count; i++) {
        ProtobufCMessage *m;
        Grpc__Health__V1__HealthCheckRequest health = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
        Keyflow__V1__SendEventRequest send = KEYFLOW__V1__SEND_EVENT_REQUEST__INIT;
        Keyflow__V1__Event event = KEYFLOW__V1__EVENT__INIT;
        Keyflow__V1__Rule rule = KEYFLOW__V1__RULE__INIT;
        char key[32];
        char input[32];
        if (o->rpc == RPC_SEND) {
            snprintf(key, sizeof key, "key-%06zu", i);
            snprintf(input, sizeof input, "{\"n\":%zu}", i);
            rule.kind = KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE;
            rule.window_ms_present_case = KEYFLOW__V1__RULE__WINDOW_MS_PRESENT_WINDOW_MS;
            rule.window_ms = 60000;
            event.rule = &rule;
            event.input_json = input;
            send.workflow = (char *)o->workflow;
            send.key = key;
            send.event = &event;
            m = &send.base;
        } else {
            m = &health.base;
        }
        size_t len = protobuf_c_message_get_packed_size(m);
        r->requests[i] = grpc_slice_malloc(len);
        protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(r->requests[i]));
    }
    return true;
}

static void slot_start(slot_t *s) {
    worker_t *w = s->worker;
    run_t *r = w->run;
    size_t key = r->request_count == 1 ? 0 : (size_t)(rng_next(&w->rng) % r->request_count);
    gpr_timespec deadline = gpr_time_add(
        gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(r->options->deadline_ms, GPR_TIMESPAN));
    s->start_ns = mono_ns();
    s->call = grpc_channel_create_registered_call(s->channel, NULL, GRPC_PROPAGATE_DEFAULTS, w->cq,
                                                  s->method, deadline, NULL);
    /* The byte buffer takes a reference on the shared slice: no copy. */
    s->request = grpc_raw_byte_buffer_create(&r->requests[key], 1);
    s->response = NULL;
    grpc_metadata_array_init(&s->initial_metadata);
    grpc_metadata_array_init(&s->trailing_metadata);
    s->status_details = grpc_empty_slice();

    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = s->request;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->initial_metadata;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &s->response;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &s->trailing_metadata;
    ops[5].data.recv_status_on_client.status = &s->status;
    ops[5].data.recv_status_on_client.status_details = &s->status_details;
    grpc_call_error rc = grpc_call_start_batch(s->call, ops, 6, s, NULL);
    /* Only a programming error (bad ops) makes this fail: stop loudly. */
    if (rc != GRPC_CALL_OK) {
        fprintf(stderr, "kf_load: grpc_call_start_batch failed: %d\n", (int)rc);
        abort();
    }
    w->outstanding++;
}

static void report_status_once(int slot, const slot_t *s) {
    if (atomic_exchange(&status_reported[slot], true)) {
        return;
    }
    char *details = grpc_slice_to_c_string(s->status_details);
    fprintf(stderr, "kf_load: first %s: %s\n", status_names[slot], details);
    gpr_free(details);
}

/* Records the finished call (when it completed inside the window) and frees
 * everything it held. Worker thread. */
static void slot_finish(slot_t *s, bool ok, int64_t now_ns) {
    worker_t *w = s->worker;
    run_t *r = w->run;
    if (now_ns >= r->measure_start_ns && now_ns < r->measure_end_ns) {
        int slot;
        if (!ok) {
            slot = STATUS_BATCH_FAILED;
        } else if ((int)s->status < 0 || (int)s->status >= STATUS_CODES) {
            slot = STATUS_OTHER;
        } else if (s->status == GRPC_STATUS_OK && s->response == NULL) {
            slot = STATUS_NO_MESSAGE;
        } else {
            slot = (int)s->status;
        }
        w->statuses[slot]++;
        if (slot != GRPC_STATUS_OK) {
            report_status_once(slot, s);
        }
        hist_record(&w->hist, (uint64_t)(now_ns - s->start_ns));
    }
    if (s->response != NULL) {
        grpc_byte_buffer_destroy(s->response);
    }
    grpc_byte_buffer_destroy(s->request);
    grpc_metadata_array_destroy(&s->initial_metadata);
    grpc_metadata_array_destroy(&s->trailing_metadata);
    grpc_slice_unref(s->status_details);
    grpc_call_unref(s->call);
    s->call = NULL;
    w->outstanding--;
}

static void *worker_main(void *arg) {
    worker_t *w = arg;
    run_t *r = w->run;
    int64_t give_up_ns =
        r->measure_end_ns + (int64_t)(r->options->deadline_ms + DRAIN_GRACE_MS) * 1000000;
    bool cancelled = false;
    for (size_t i = 0; i < w->slot_count; i++) {
        slot_start(&w->slots[i]);
    }
    while (w->outstanding > 0) {
        gpr_timespec wait =
            gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(POLL_MS, GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_next(w->cq, wait, NULL);
        int64_t now = mono_ns();
        if (ev.type == GRPC_OP_COMPLETE) {
            slot_t *s = ev.tag;
            slot_finish(s, ev.success != 0, now);
            if (now < r->measure_end_ns) {
                slot_start(s);
            }
        } else if (!cancelled && now > give_up_ns) {
            /* The deadline should have ended these calls; make sure. */
            for (size_t i = 0; i < w->slot_count; i++) {
                if (w->slots[i].call != NULL) {
                    grpc_call_cancel(w->slots[i].call, NULL);
                    w->abandoned++;
                }
            }
            cancelled = true;
        }
    }
    grpc_completion_queue_shutdown(w->cq);
    while (grpc_completion_queue_next(w->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(w->cq);
    return NULL;
}

/* Each channel gets its own connection: with the global subchannel pool,
 * channels with equal arguments would share one TCP connection and
 * --channels would measure nothing. Retries are off so that every attempt
 * the server sees is one the client counts. The minimal stack drops the
 * client-side filters (deadline timer, message-size checks, census): about
 * 10% more calls/s from a client that shares two cores with the server. The
 * deadline still travels as grpc-timeout and the server enforces it; the
 * drain timeout in worker_main covers a server that never answers. */
static grpc_channel *channel_create(const char *target, int index, bool minimal_stack) {
    grpc_arg args[4];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
    args[0].value.integer = 1;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_ENABLE_RETRIES;
    args[1].value.integer = 0;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = "kf_load.channel_index"; /* also keeps the args distinct */
    args[2].value.integer = index;
    args[3].type = GRPC_ARG_INTEGER;
    args[3].key = GRPC_ARG_MINIMAL_STACK;
    args[3].value.integer = minimal_stack;
    grpc_channel_args channel_args = {4, args};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(target, creds, &channel_args);
    grpc_channel_credentials_release(creds);
    return ch;
}

static const char *rpc_name(rpc_kind_t rpc) {
    return rpc == RPC_SEND ? "send" : "health";
}

/* CPU used during the window, in seconds; negative when not measured. */
typedef struct cpu_use {
    double client_s;
    double server_s;
    double machine_s;
} cpu_use_t;

static void print_results(const run_t *r, const histogram_t *hist, const uint64_t *statuses,
                          uint64_t abandoned, const cpu_use_t *cpu) {
    const options_t *o = r->options;
    double window_s = (double)(r->measure_end_ns - r->measure_start_ns) / 1e9;
    uint64_t errors = hist->total - statuses[GRPC_STATUS_OK];
    double rate = window_s > 0 ? (double)statuses[GRPC_STATUS_OK] / window_s : 0.0;
    double p50 = hist_quantile_us(hist, 0.50);
    double p99 = hist_quantile_us(hist, 0.99);
    double p999 = hist_quantile_us(hist, 0.999);
    double max_us = (double)hist->max_ns / 1000.0;
    double mean_us = hist->total > 0 ? (double)hist->sum_ns / (double)hist->total / 1000.0 : 0.0;
    /* Percent of one core, like top: 200% is both cores of this machine. */
    double client_pct = window_s > 0 ? 100.0 * cpu->client_s / window_s : 0.0;
    double server_pct = window_s > 0 && cpu->server_s >= 0 ? 100.0 * cpu->server_s / window_s : -1;
    double machine_pct =
        window_s > 0 && cpu->machine_s >= 0 ? 100.0 * cpu->machine_s / window_s : -1;
    double other_pct = -1;
    if (machine_pct >= 0 && server_pct >= 0) {
        other_pct = machine_pct - client_pct - server_pct;
        other_pct = other_pct < 0 ? 0 : other_pct; /* tick rounding */
    }

    char errtext[512] = "";
    size_t used = 0;
    for (int i = 1; i < STATUS_SLOTS; i++) {
        if (statuses[i] != 0 && used < sizeof errtext) {
            int n = snprintf(errtext + used, sizeof errtext - used, " %s=%" PRIu64, status_names[i],
                             statuses[i]);
            used += n > 0 ? (size_t)n : 0;
        }
    }
    char server_text[64] = "";
    if (server_pct >= 0) {
        snprintf(server_text, sizeof server_text, " server %.0f%% other %.0f%%", server_pct,
                 other_pct);
    }
    printf("%s c=%ld ch=%ld th=%ld: %" PRIu64 " calls in %.1f s, %.0f ok/s; latency us p50 %.1f"
           " p99 %.1f p999 %.1f max %.1f; errors %" PRIu64 "%s; cpu client %.0f%%%s\n",
           rpc_name(o->rpc), o->concurrency, o->channels, o->threads, hist->total, window_s, rate,
           p50, p99, p999, max_us, errors, errtext, client_pct, server_text);

    printf("{\"kind\":\"grpc_load\",\"rpc\":\"%s\",\"target\":\"%s\",\"concurrency\":%ld,"
           "\"channels\":%ld,\"threads\":%ld,\"keys\":%ld,\"workflow\":\"%s\","
           "\"duration_s\":%.3f,\"warmup_s\":%.3f,\"calls\":%" PRIu64 ",\"ok\":%" PRIu64 ","
           "\"errors\":%" PRIu64 ",\"errors_by_status\":{",
           rpc_name(o->rpc), o->target, o->concurrency, o->channels, o->threads, o->keys,
           o->workflow, window_s, o->warmup_s, hist->total, statuses[GRPC_STATUS_OK], errors);
    bool first = true;
    for (int i = 1; i < STATUS_SLOTS; i++) {
        if (statuses[i] != 0) {
            printf("%s\"%s\":%" PRIu64, first ? "" : ",", status_names[i], statuses[i]);
            first = false;
        }
    }
    printf("},\"abandoned\":%" PRIu64 ",\"throughput_per_s\":%.1f,\"p50_us\":%.1f,"
           "\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f,\"mean_us\":%.1f,"
           "\"client_cpu_pct\":%.1f,\"server_cpu_pct\":%.1f,\"machine_cpu_pct\":%.1f,"
           "\"other_cpu_pct\":%.1f}\n",
           abandoned, rate, p50, p99, p999, max_us, mean_us, client_pct, server_pct, machine_pct,
           other_pct);
    fflush(stdout);
}

static int run_load(const options_t *o) {
    static run_t run; /* static: zeroed, and too large to want on a stack */
    run_t *r = &run;
    r->options = o;
    r->method_path =
        o->rpc == RPC_SEND ? "/keyflow.v1.Coordinators/SendEvent" : "/grpc.health.v1.Health/Check";
    grpc_init();
    gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);
    if (!build_requests(r)) {
        fprintf(stderr, "kf_load: out of memory packing requests\n");
        return 1;
    }
    for (long i = 0; i < o->channels; i++) {
        r->channels[i] = channel_create(o->target, (int)i, o->minimal_stack);
        r->methods[i] = grpc_channel_register_call(r->channels[i], r->method_path, NULL, NULL);
    }
    r->workers = calloc((size_t)o->threads, sizeof *r->workers);
    slot_t *slots = calloc((size_t)o->concurrency, sizeof *slots);
    if (r->workers == NULL || slots == NULL) {
        fprintf(stderr, "kf_load: out of memory\n");
        return 1;
    }
    /* Slot i runs on worker i % threads over channel i % channels, so every
     * worker and every channel carries a near-equal share. Each worker's
     * slots are contiguous in the array. */
    size_t next = 0;
    for (long t = 0; t < o->threads; t++) {
        worker_t *w = &r->workers[t];
        w->run = r;
        w->cq = grpc_completion_queue_create_for_next(NULL);
        w->rng = UINT64_C(0x9E3779B97F4A7C15) * (uint64_t)(t + 1) ^ (uint64_t)mono_ns();
        w->rng |= 1; /* xorshift must not start at 0 */
        w->slots = &slots[next];
        for (long i = t; i < o->concurrency; i += o->threads) {
            slot_t *s = &slots[next++];
            s->worker = w;
            s->channel = r->channels[i % o->channels];
            s->method = r->methods[i % o->channels];
            w->slot_count++;
        }
    }

    int64_t start = mono_ns();
    r->measure_start_ns = start + (int64_t)(o->warmup_s * 1e9);
    r->measure_end_ns = r->measure_start_ns + (int64_t)(o->duration_s * 1e9);
    for (long t = 0; t < o->threads; t++) {
        if (pthread_create(&r->workers[t].thread, NULL, worker_main, &r->workers[t]) != 0) {
            fprintf(stderr, "kf_load: cannot start a worker thread\n");
            abort(); /* earlier workers are already driving calls */
        }
    }
    /* CPU is sampled at the window's edges so that it covers what the
     * latency numbers cover. */
    sleep_until_ns(r->measure_start_ns);
    double client0 = self_cpu_s();
    double server0 = o->server_pid > 0 ? proc_cpu_s(o->server_pid) : -1.0;
    double machine0 = machine_busy_s();
    sleep_until_ns(r->measure_end_ns);
    double machine1 = machine_busy_s();
    double client_cpu = self_cpu_s() - client0;
    double server_cpu = -1.0;
    if (server0 >= 0) {
        double server1 = proc_cpu_s(o->server_pid);
        server_cpu = server1 >= 0 ? server1 - server0 : -1.0;
    }

    static histogram_t hist;
    uint64_t statuses[STATUS_SLOTS] = {0};
    uint64_t abandoned = 0;
    for (long t = 0; t < o->threads; t++) {
        worker_t *w = &r->workers[t];
        pthread_join(w->thread, NULL);
        hist_merge(&hist, &w->hist);
        for (int i = 0; i < STATUS_SLOTS; i++) {
            statuses[i] += w->statuses[i];
        }
        abandoned += w->abandoned;
    }
    cpu_use_t cpu = {
        .client_s = client_cpu,
        .server_s = server_cpu,
        .machine_s = machine0 >= 0 && machine1 >= 0 ? machine1 - machine0 : -1.0,
    };
    print_results(r, &hist, statuses, abandoned, &cpu);

    for (long i = 0; i < o->channels; i++) {
        grpc_channel_destroy(r->channels[i]);
    }
    for (size_t i = 0; i < r->request_count; i++) {
        grpc_slice_unref(r->requests[i]);
    }
    free(r->requests);
    free(slots);
    free(r->workers);
    grpc_shutdown();
    return 0;
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: kf_load --target HOST:PORT --rpc health|send [options]\n"
            "       kf_load --fsync-probe DIR [--count N] [--fsync-mode M]\n"
            "  --concurrency N   calls kept outstanding (default 1, max %d)\n"
            "  --duration-s S    measurement window (default 10)\n"
            "  --warmup-s S      load before the window, not counted (default 2)\n"
            "  --keys N          SendEvent keys, drawn uniformly (default 10000)\n"
            "  --channels N      channels = TCP connections (default 1, max %d)\n"
            "  --threads N       client threads, one completion queue each (default 1)\n"
            "  --workflow NAME   SendEvent workflow (default bench-PID)\n"
            "  --deadline-ms N   per-call deadline (default 10000)\n"
            "  --server-pid PID  also report that process's CPU use in the window\n"
            "  --minimal-stack B 1: client channels without optional filters (default 1)\n"
            "  --count N         fsync probe records (default 2000)\n"
            "  --fsync-mode M    append (default), fallocate or overwrite (see the source)\n",
            CONCURRENCY_MAX, CHANNELS_MAX);
}

static bool parse_args(int argc, char **argv, options_t *o) {
    static char default_workflow[64];
    snprintf(default_workflow, sizeof default_workflow, "bench-%ld", (long)getpid());
    *o = (options_t){
        .rpc = RPC_HEALTH,
        .concurrency = 1,
        .duration_s = 10.0,
        .warmup_s = 2.0,
        .keys = 10000,
        .channels = 1,
        .threads = 1,
        .deadline_ms = 10000,
        .minimal_stack = true,
        .workflow = default_workflow,
        .fsync_count = 2000,
    };
    bool rpc_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) {
            fprintf(stderr, "kf_load: %s needs a value\n", a);
            return false;
        }
        i++;
        bool ok = true;
        if (strcmp(a, "--target") == 0) {
            o->target = v;
        } else if (strcmp(a, "--rpc") == 0) {
            rpc_given = true;
            if (strcmp(v, "health") == 0) {
                o->rpc = RPC_HEALTH;
            } else if (strcmp(v, "send") == 0) {
                o->rpc = RPC_SEND;
            } else {
                fprintf(stderr, "kf_load: --rpc must be health or send\n");
                ok = false;
            }
        } else if (strcmp(a, "--concurrency") == 0) {
            ok = parse_long(a, v, 1, CONCURRENCY_MAX, &o->concurrency);
        } else if (strcmp(a, "--duration-s") == 0) {
            ok = parse_seconds(a, v, &o->duration_s);
        } else if (strcmp(a, "--warmup-s") == 0) {
            ok = parse_seconds(a, v, &o->warmup_s);
        } else if (strcmp(a, "--keys") == 0) {
            ok = parse_long(a, v, 1, KEYS_MAX, &o->keys);
        } else if (strcmp(a, "--channels") == 0) {
            ok = parse_long(a, v, 1, CHANNELS_MAX, &o->channels);
        } else if (strcmp(a, "--threads") == 0) {
            ok = parse_long(a, v, 1, THREADS_MAX, &o->threads);
        } else if (strcmp(a, "--workflow") == 0) {
            o->workflow = v;
        } else if (strcmp(a, "--deadline-ms") == 0) {
            ok = parse_long(a, v, 1, 3600000, &o->deadline_ms);
        } else if (strcmp(a, "--server-pid") == 0) {
            ok = parse_long(a, v, 1, 1L << 30, &o->server_pid);
        } else if (strcmp(a, "--minimal-stack") == 0) {
            long flag;
            ok = parse_long(a, v, 0, 1, &flag);
            o->minimal_stack = flag != 0;
        } else if (strcmp(a, "--fsync-probe") == 0) {
            o->fsync_dir = v;
        } else if (strcmp(a, "--fsync-mode") == 0) {
            if (strcmp(v, "append") == 0) {
                o->fsync_mode = FSYNC_APPEND;
            } else if (strcmp(v, "fallocate") == 0) {
                o->fsync_mode = FSYNC_FALLOCATE;
            } else if (strcmp(v, "overwrite") == 0) {
                o->fsync_mode = FSYNC_OVERWRITE;
            } else {
                fprintf(stderr, "kf_load: --fsync-mode must be append, fallocate or overwrite\n");
                ok = false;
            }
        } else if (strcmp(a, "--count") == 0) {
            ok = parse_long(a, v, 1, FSYNC_COUNT_MAX, &o->fsync_count);
        } else {
            fprintf(stderr, "kf_load: unknown option %s\n", a);
            usage(stderr);
            ok = false;
        }
        if (!ok) {
            return false;
        }
    }
    if (o->fsync_dir != NULL) {
        return true;
    }
    if (o->target == NULL || !rpc_given) {
        fprintf(stderr, "kf_load: --target and --rpc are required\n");
        usage(stderr);
        return false;
    }
    if (o->duration_s <= 0.0) {
        fprintf(stderr, "kf_load: --duration-s must be above 0\n");
        return false;
    }
    /* More threads than calls would leave threads with nothing to do. */
    if (o->threads > o->concurrency) {
        o->threads = o->concurrency;
    }
    if (strchr(o->workflow, '"') != NULL || strchr(o->workflow, '\\') != NULL) {
        fprintf(stderr, "kf_load: --workflow must not contain quotes or backslashes\n");
        return false; /* it is echoed into the JSON line unescaped */
    }
    return true;
}

int main(int argc, char **argv) {
    options_t o;
    if (!parse_args(argc, argv, &o)) {
        return 2;
    }
    if (o.fsync_dir != NULL) {
        return run_fsync_probe(o.fsync_dir, o.fsync_count, o.fsync_mode);
    }
    return run_load(&o);
}
