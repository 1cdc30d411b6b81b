/*
 * kf_load.c - closed-loop gRPC load generator for keyflowd, plus a small
 * fdatasync probe, so that one run reports the server's latency next to the
 * disk's own floor (bench/README.md explains the method).
 *
 * Load mode (--rpc health | send | send-events):
 *   * --concurrency calls are kept outstanding: a slot starts its next call
 *     as soon as its previous one completes (closed loop), so the offered
 *     load adapts to the server and never queues up inside the client;
 *   * slots are spread over --threads client threads, each with its own
 *     completion queue, and over --channels channels, each with its own TCP
 *     connection (a local subchannel pool stops gRPC from sharing one);
 *   * SendEvent requests are packed once per key before the run; a call
 *     only wraps the packed slice in a byte buffer (a reference, no copy);
 *   * SendEvents (--rpc send-events): BATCH_REQUESTS requests of
 *     --batch-events events each, every event on a key drawn uniformly,
 *     packed before the run (--cover: one request per run of consecutive
 *     keys, each sent once in order, ending the run once every key has
 *     been hit or --duration-s is up: how bench/memory.sh opens a million
 *     windows in seconds); each answer is
 *     scanned for per-event errors
 *     (a call that is OK may still refuse some of its events), so events/s
 *     counts accepted events only;
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
 * The histogram, clocks, flag parsing, CPU sampling and gRPC plumbing are
 * bench/common/bench_util.h's, shared with kf_fnload.
 *
 * Output: one human-readable line, then one JSON line. The tool reports; it
 * never judges (the exit status is 0 even when calls failed, unless the run
 * itself could not be set up).
 *
 * Invariants:
 *   1. Memory is bounded: the histogram is a fixed array of counters per
 *      thread; slots and request slices are allocated once up front.
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
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include "bench/common/bench_util.h"
#include "grpc/health/v1/health.pb-c.h"
#include "keyflow/v1/coordinators.pb-c.h"

/* Bounds on the flags: large enough for any run this machine can drive,
 * small enough that a typo cannot allocate gigabytes. */
#define CONCURRENCY_MAX    4096
#define THREADS_MAX        16
#define CHANNELS_MAX       64
#define KEYS_MAX           1000000
#define INPUT_BYTES_MAX    16384
#define DURATION_S_MAX     3600
#define FSYNC_COUNT_MAX    1000000
#define FSYNC_RECORD_BYTES 100
/* Distinct packed SendEvents requests the calls pick from: enough that
 * consecutive calls hit different keys, few enough to pack in a moment. */
#define BATCH_REQUESTS   256
#define BATCH_EVENTS_MAX 1000 /* KF_SEND_EVENTS_MAX */

/* A call still outstanding this long after its deadline is cancelled. */
#define DRAIN_GRACE_MS 2000
/* How often an idle worker wakes up to look at the clock. */
#define POLL_MS 100

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

/* gap_us > 0: the probe sleeps that long before each record, as a c=1
 * client leaves the disk idle between its syncs (the wait for the reply and
 * the next request); back to back (0) is the reference the target uses. */
static int run_fsync_probe(const char *dir, long count, fsync_mode_t mode, long gap_us) {
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
    static kf_bench_hist_t hist; /* static: 18 KB is too much for some stacks */
    memset(&hist, 0, sizeof hist);
    int status = fsync_prepare(fd, mode, count, path) ? 0 : 1;
    int64_t t0 = kf_bench_mono_ns();
    const struct timespec gap = {gap_us / 1000000, (gap_us % 1000000) * 1000};
    for (long i = 0; i < count && status == 0; i++) {
        if (gap_us > 0) {
            nanosleep(&gap, NULL);
        }
        off_t at = (off_t)i * FSYNC_RECORD_BYTES;
        if (pwrite(fd, record, sizeof record, at) != (ssize_t)sizeof record) {
            fprintf(stderr, "kf_load: pwrite %s: %s\n", path, strerror(errno));
            status = 1;
            break;
        }
        int64_t before = kf_bench_mono_ns();
        if (fdatasync(fd) != 0) {
            fprintf(stderr, "kf_load: fdatasync %s: %s\n", path, strerror(errno));
            status = 1;
            break;
        }
        kf_bench_hist_record(&hist, (uint64_t)(kf_bench_mono_ns() - before));
    }
    double elapsed_s = (double)(kf_bench_mono_ns() - t0) / 1e9;
    close(fd);
    unlink(path);
    if (status != 0) {
        return status;
    }
    const char *name = fsync_mode_names[mode];
    double ops = elapsed_s > 0 ? (double)hist.count / elapsed_s : 0.0;
    double p50 = kf_bench_hist_quantile_us(&hist, 0.50);
    double p99 = kf_bench_hist_quantile_us(&hist, 0.99);
    double max_us = kf_bench_hist_max_us(&hist);
    double mean_us = kf_bench_hist_mean_us(&hist);
    printf("fsync-probe %s gap=%ldus dir=%s: %" PRIu64 " x (pwrite %d B + fdatasync) in %.2f s ="
           " %.0f ops/s; fdatasync p50 %.1f us p99 %.1f us mean %.1f us max %.1f us\n",
           name, gap_us, dir, hist.count, FSYNC_RECORD_BYTES, elapsed_s, ops, p50, p99, mean_us,
           max_us);
    printf("{\"kind\":\"fsync_probe\",\"mode\":\"%s\",\"gap_us\":%ld,\"count\":%" PRIu64
           ",\"record_bytes\":%d,\"elapsed_s\":%.3f,\"ops_per_s\":%.1f,\"fdatasync_p50_us\":%.1f,"
           "\"fdatasync_p99_us\":%.1f,\"fdatasync_mean_us\":%.1f,\"fdatasync_max_us\":%.1f}\n",
           name, gap_us, hist.count, FSYNC_RECORD_BYTES, elapsed_s, ops, p50, p99, mean_us, max_us);
    fflush(stdout);
    return 0;
}

/* ---- Load generator --------------------------------------------------- */

typedef enum rpc_kind {
    RPC_HEALTH,
    RPC_SEND,
    RPC_SEND_EVENTS,
} rpc_kind_t;

typedef struct options {
    const char *target;
    rpc_kind_t rpc;
    long concurrency;
    double duration_s;
    double warmup_s;
    long keys;
    long input_bytes;  /* SendEvent input padded to about this size; 0 = tiny */
    long batch_events; /* events per SendEvents call */
    bool cover;        /* send-events: consecutive keys, requests in order */
    long window_ms;    /* the debounce window of every event */
    long channels;
    long threads;
    long deadline_ms;
    long server_pid;    /* 0: do not report the server's CPU */
    bool minimal_stack; /* GRPC_ARG_MINIMAL_STACK on the client channels */
    const char *tls_ca; /* PEM CA file: TLS; NULL: plaintext */
    const char *api_key;
    const char *workflow;
    const char *fsync_dir; /* non-NULL: run the fsync probe instead */
    long fsync_count;
    fsync_mode_t fsync_mode;
    long fsync_gap_us;
} options_t;

/* Calls are counted in kf_bench_status_slot's slots. An OK call must also
 * carry a response message; one without counts in the slot for calls the
 * tool rejects, under this name. */
#define STATUS_NO_MESSAGE KF_BENCH_STATUS_REJECTED
#define NO_MESSAGE_NAME   "OK_WITHOUT_MESSAGE"

/* The first error of each kind prints its details once, so a failing run
 * says why and not only how often. */
static atomic_bool status_reported[KF_BENCH_STATUS_SLOTS];

typedef struct run run_t;
typedef struct worker worker_t;

typedef struct slot {
    worker_t *worker;
    grpc_channel *channel; /* borrowed from the run */
    void *method;          /* the channel's registered-call handle */
    grpc_call *call;       /* NULL when no call is outstanding */
    kf_bench_unary_t unary;
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
    uint64_t statuses[KF_BENCH_STATUS_SLOTS]; /* calls completed in the window, by status */
    uint64_t abandoned;                       /* calls cancelled by the drain timeout */
    uint64_t events_ok;                       /* SendEvents: events accepted in the window */
    uint64_t event_errors;                    /* SendEvents: events refused in OK calls */
    kf_bench_hist_t hist;
};

struct run {
    const options_t *options;
    const char *method_path;
    grpc_channel *channels[CHANNELS_MAX];
    void *methods[CHANNELS_MAX];
    grpc_slice *requests; /* one packed request per key (one for health) */
    size_t request_count;
    atomic_size_t next_request; /* --cover: the next request to send */
    atomic_long workers_done;   /* --cover: workers whose slots are all idle */
    int64_t measure_start_ns;
    int64_t measure_end_ns;
    worker_t *workers;
};

/* The event of key `i`: a debounce rule whose window stays open for the
 * whole run, so each event is one durable append to an open window, and
 * the input {"n":i} (padded to --input-bytes). Strings point into `key`
 * and `input`, which the caller keeps until the request is packed. */
static void fill_event(const options_t *o, size_t i, Keyflow__V1__SendEventRequest *send,
                       Keyflow__V1__Event *event, Keyflow__V1__Rule *rule, char key[32],
                       char input[INPUT_BYTES_MAX + 64]) {
    snprintf(key, 32, "key-%06zu", i);
    size_t cap = INPUT_BYTES_MAX + 64;
    int n = snprintf(input, cap, "{\"n\":%zu", i);
    if (o->input_bytes > 0) {
        /* {"n":I,"pad":"xxx..."}: a bigger event makes the WAL and the
         * memtables grow faster (bench/restart.sh). */
        long pad = o->input_bytes - n - 10;
        n += snprintf(input + n, cap - (size_t)n, ",\"pad\":\"");
        for (long p = 0; p < pad; p++) {
            input[n++] = 'x';
        }
        input[n++] = '"';
    }
    snprintf(input + n, cap - (size_t)n, "}");
    keyflow__v1__rule__init(rule);
    rule->kind = KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE;
    rule->window_ms_present_case = KEYFLOW__V1__RULE__WINDOW_MS_PRESENT_WINDOW_MS;
    rule->window_ms = o->window_ms;
    keyflow__v1__event__init(event);
    event->rule = rule;
    event->input_json = input;
    keyflow__v1__send_event_request__init(send);
    send->workflow = (char *)o->workflow;
    send->key = key;
    send->event = event;
}

static grpc_slice pack(const ProtobufCMessage *m) {
    size_t len = protobuf_c_message_get_packed_size(m);
    grpc_slice slice = grpc_slice_malloc(len);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(slice));
    return slice;
}

/* BATCH_REQUESTS SendEvents requests of --batch-events events, each on a
 * key drawn uniformly (a fixed seed: every run sends the same requests). */
static bool build_batches(run_t *r) {
    const options_t *o = r->options;
    size_t n = (size_t)o->batch_events;
    Keyflow__V1__SendEventRequest *sends = calloc(n, sizeof *sends);
    Keyflow__V1__SendEventRequest **ptrs = calloc(n, sizeof *ptrs);
    Keyflow__V1__Event *events = calloc(n, sizeof *events);
    Keyflow__V1__Rule *rules = calloc(n, sizeof *rules);
    char(*keys)[32] = calloc(n, sizeof *keys);
    char(*inputs)[INPUT_BYTES_MAX + 64] = calloc(n, sizeof *inputs);
    bool ok = sends && ptrs && events && rules && keys && inputs;
    uint64_t rng = UINT64_C(0x2545F4914F6CDD1D);
    for (size_t b = 0; ok && b < r->request_count; b++) {
        for (size_t e = 0; e < n; e++) {
            size_t key = o->cover ? (b * n + e) % (size_t)o->keys
                                  : (size_t)(kf_bench_rng_next(&rng) % (uint64_t)o->keys);
            fill_event(o, key, &sends[e], &events[e], &rules[e], keys[e], inputs[e]);
            ptrs[e] = &sends[e];
        }
        Keyflow__V1__SendEventsRequest req = KEYFLOW__V1__SEND_EVENTS_REQUEST__INIT;
        req.events = ptrs;
        req.n_events = n;
        r->requests[b] = pack(&req.base);
    }
    free(sends);
    free(ptrs);
    free(events);
    free(rules);
    free(keys);
    free(inputs);
    return ok;
}

/* Packs every request once. SendEvent: one per key (fill_event).
 * SendEvents: build_batches. Health/Check: one empty request. */
static bool build_requests(run_t *r) {
    const options_t *o = r->options;
    r->request_count = o->rpc == RPC_SEND          ? (size_t)o->keys
                       : o->rpc == RPC_SEND_EVENTS ? BATCH_REQUESTS
                                                   : 1;
    if (o->rpc == RPC_SEND_EVENTS && o->cover) {
        r->request_count =
            ((size_t)o->keys + (size_t)o->batch_events - 1) / (size_t)o->batch_events;
    }
    r->requests = calloc(r->request_count, sizeof *r->requests);
    if (r->requests == NULL) {
        return false;
    }
    if (o->rpc == RPC_SEND_EVENTS) {
        return build_batches(r);
    }
    for (size_t i = 0; i < r->request_count; i++) {
        if (o->rpc == RPC_SEND) {
            Keyflow__V1__SendEventRequest send;
            Keyflow__V1__Event event;
            Keyflow__V1__Rule rule;
            char key[32];
            char input[INPUT_BYTES_MAX + 64];
            fill_event(o, i, &send, &event, &rule, key, input);
            r->requests[i] = pack(&send.base);
        } else {
            Grpc__Health__V1__HealthCheckRequest health =
                GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
            r->requests[i] = pack(&health.base);
        }
    }
    return true;
}

/* Counts the accepted and refused events of a SendEventsResponse without
 * unpacking it: results is field 1 (length-delimited); each result holds
 * its outcome as field 1 (response) or field 2 (error). A malformed answer
 * counts all its events as refused. */
static void count_events(const grpc_byte_buffer *bb, size_t expected, uint64_t *ok_out,
                         uint64_t *errors_out) {
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, (grpc_byte_buffer *)bb)) {
        *errors_out += expected;
        return;
    }
    grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    const uint8_t *p = GRPC_SLICE_START_PTR(all);
    const uint8_t *end = p + GRPC_SLICE_LENGTH(all);
    uint64_t ok = 0, errors = 0;
    bool malformed = false;
    while (p < end && !malformed) {
        uint64_t len = 0;
        int shift = 0;
        malformed = *p++ != 0x0a;
        while (!malformed && p < end && shift < 64) {
            uint8_t b = *p++;
            len |= (uint64_t)(b & 0x7f) << shift;
            shift += 7;
            if ((b & 0x80) == 0) {
                break;
            }
        }
        malformed = malformed || len == 0 || len > (uint64_t)(end - p);
        if (!malformed) {
            ok += p[0] == 0x0a;
            errors += p[0] != 0x0a;
            p += len;
        }
    }
    grpc_slice_unref(all);
    if (malformed || ok + errors != expected) {
        *errors_out += expected;
        return;
    }
    *ok_out += ok;
    *errors_out += errors;
}

static void slot_start(slot_t *s) {
    worker_t *w = s->worker;
    run_t *r = w->run;
    size_t key;
    if (r->options->cover) {
        key = atomic_fetch_add(&r->next_request, 1);
        if (key >= r->request_count) {
            return; /* the pass is done: the slot stays idle */
        }
    } else {
        key = r->request_count == 1 ? 0 : (size_t)(kf_bench_rng_next(&w->rng) % r->request_count);
    }
    gpr_timespec deadline = gpr_time_add(
        gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(r->options->deadline_ms, GPR_TIMESPAN));
    s->start_ns = kf_bench_mono_ns();
    s->call = grpc_channel_create_registered_call(s->channel, NULL, GRPC_PROPAGATE_DEFAULTS, w->cq,
                                                  s->method, deadline, NULL);
    /* The byte buffer takes a reference on the shared slice: no copy. */
    kf_bench_unary_start(s->call, &s->unary, grpc_raw_byte_buffer_create(&r->requests[key], 1), s);
    w->outstanding++;
}

static void report_status_once(int slot, const slot_t *s) {
    if (atomic_exchange(&status_reported[slot], true)) {
        return;
    }
    char *details = grpc_slice_to_c_string(s->unary.details);
    fprintf(stderr, "kf_load: first %s: %s\n", kf_bench_status_name(slot, NO_MESSAGE_NAME),
            details);
    gpr_free(details);
}

/* Records the finished call (when it completed inside the window) and frees
 * everything it held. Worker thread. */
static void slot_finish(slot_t *s, bool ok, int64_t now_ns) {
    worker_t *w = s->worker;
    run_t *r = w->run;
    if (now_ns >= r->measure_start_ns && now_ns < r->measure_end_ns) {
        int slot = kf_bench_status_slot(ok, s->unary.status);
        if (slot == GRPC_STATUS_OK && s->unary.response == NULL) {
            slot = STATUS_NO_MESSAGE;
        }
        w->statuses[slot]++;
        if (slot != GRPC_STATUS_OK) {
            report_status_once(slot, s);
        } else if (r->options->rpc == RPC_SEND_EVENTS) {
            count_events(s->unary.response, (size_t)r->options->batch_events, &w->events_ok,
                         &w->event_errors);
        }
        kf_bench_hist_record(&w->hist, (uint64_t)(now_ns - s->start_ns));
    }
    kf_bench_unary_release(&s->unary);
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
        int64_t now = kf_bench_mono_ns();
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
    atomic_fetch_add(&r->workers_done, 1);
    return NULL;
}

static const char *rpc_name(rpc_kind_t rpc) {
    switch (rpc) {
    case RPC_HEALTH: return "health";
    case RPC_SEND: return "send";
    case RPC_SEND_EVENTS: return "send-events";
    }
    return "?";
}

static void print_results(const run_t *r, const kf_bench_hist_t *hist, const uint64_t *statuses,
                          uint64_t abandoned, uint64_t events_ok, uint64_t event_errors,
                          const kf_bench_cpu_pct_t *cpu) {
    const options_t *o = r->options;
    double window_s = (double)(r->measure_end_ns - r->measure_start_ns) / 1e9;
    uint64_t errors = hist->count - statuses[GRPC_STATUS_OK];
    double rate = window_s > 0 ? (double)statuses[GRPC_STATUS_OK] / window_s : 0.0;
    /* Durable events per second: SendEvent's OK calls, SendEvents' accepted
     * events (0 for health). */
    double events_rate = o->rpc == RPC_SEND_EVENTS ? (window_s > 0 ? events_ok / window_s : 0.0)
                         : o->rpc == RPC_SEND      ? rate
                                                   : 0.0;
    char events_text[96] = "";
    if (o->rpc == RPC_SEND_EVENTS) {
        snprintf(events_text, sizeof events_text,
                 " (%ld events each: %.0f events/s, %" PRIu64 " events refused)", o->batch_events,
                 events_rate, event_errors);
    }
    double p50 = kf_bench_hist_quantile_us(hist, 0.50);
    double p99 = kf_bench_hist_quantile_us(hist, 0.99);
    double p999 = kf_bench_hist_quantile_us(hist, 0.999);
    double max_us = kf_bench_hist_max_us(hist);
    double mean_us = kf_bench_hist_mean_us(hist);

    /* Large enough for every slot's name and count: no truncation. */
    char errtext[1024];
    char errjson[1024];
    kf_bench_errors_text(statuses, NO_MESSAGE_NAME, false, errtext, sizeof errtext);
    kf_bench_errors_text(statuses, NO_MESSAGE_NAME, true, errjson, sizeof errjson);
    char server_text[64] = "";
    if (cpu->server >= 0) {
        snprintf(server_text, sizeof server_text, " server %.0f%% other %.0f%%", cpu->server,
                 cpu->other);
    }
    printf("%s c=%ld ch=%ld th=%ld: %" PRIu64 " calls in %.1f s, %.0f ok/s%s; latency us p50 %.1f"
           " p99 %.1f p999 %.1f max %.1f; errors %" PRIu64 "%s; cpu client %.0f%%%s\n",
           rpc_name(o->rpc), o->concurrency, o->channels, o->threads, hist->count, window_s, rate,
           events_text, p50, p99, p999, max_us, errors, errtext, cpu->client, server_text);

    printf("{\"kind\":\"grpc_load\",\"rpc\":\"%s\",\"target\":\"%s\",\"concurrency\":%ld,"
           "\"channels\":%ld,\"threads\":%ld,\"keys\":%ld,\"workflow\":\"%s\","
           "\"duration_s\":%.3f,\"warmup_s\":%.3f,\"calls\":%" PRIu64 ",\"ok\":%" PRIu64 ","
           "\"errors\":%" PRIu64 ",\"errors_by_status\":{%s",
           rpc_name(o->rpc), o->target, o->concurrency, o->channels, o->threads, o->keys,
           o->workflow, window_s, o->warmup_s, hist->count, statuses[GRPC_STATUS_OK], errors,
           errjson);
    printf("},\"batch_events\":%ld,\"events_ok\":%" PRIu64 ",\"event_errors\":%" PRIu64
           ",\"events_per_s\":%.1f",
           o->rpc == RPC_SEND_EVENTS ? o->batch_events : (o->rpc == RPC_SEND ? 1L : 0L),
           o->rpc == RPC_SEND_EVENTS ? events_ok : (o->rpc == RPC_SEND ? statuses[0] : 0),
           event_errors, events_rate);
    printf(",\"abandoned\":%" PRIu64 ",\"throughput_per_s\":%.1f,\"p50_us\":%.1f,"
           "\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f,\"mean_us\":%.1f,"
           "\"client_cpu_pct\":%.1f,\"server_cpu_pct\":%.1f,\"machine_cpu_pct\":%.1f,"
           "\"other_cpu_pct\":%.1f}\n",
           abandoned, rate, p50, p99, p999, max_us, mean_us, cpu->client, cpu->server, cpu->machine,
           cpu->other);
    fflush(stdout);
}

static int run_load(const options_t *o) {
    static run_t run; /* static: zeroed, and too large to want on a stack */
    run_t *r = &run;
    r->options = o;
    r->method_path = o->rpc == RPC_SEND          ? "/keyflow.v1.Coordinators/SendEvent"
                     : o->rpc == RPC_SEND_EVENTS ? "/keyflow.v1.Coordinators/SendEvents"
                                                 : "/grpc.health.v1.Health/Check";
    grpc_init();
    gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);
    if (!kf_bench_security_set(o->tls_ca, o->api_key)) {
        return 2;
    }
    if (!build_requests(r)) {
        fprintf(stderr, "kf_load: out of memory packing requests\n");
        return 1;
    }
    for (long i = 0; i < o->channels; i++) {
        r->channels[i] = kf_bench_channel_create(o->target, (int)i, o->minimal_stack, false);
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
        w->rng = UINT64_C(0x9E3779B97F4A7C15) * (uint64_t)(t + 1) ^ (uint64_t)kf_bench_mono_ns();
        w->slots = &slots[next];
        for (long i = t; i < o->concurrency; i += o->threads) {
            slot_t *s = &slots[next++];
            s->worker = w;
            s->channel = r->channels[i % o->channels];
            s->method = r->methods[i % o->channels];
            w->slot_count++;
        }
    }

    int64_t start = kf_bench_mono_ns();
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
    kf_bench_cpu_sample_t cpu0;
    kf_bench_cpu_sample_t cpu1;
    kf_bench_sleep_until_ns(r->measure_start_ns);
    kf_bench_cpu_begin(&cpu0, o->server_pid);
    if (o->cover) {
        /* The window ends with the pass: every worker done. */
        while (kf_bench_mono_ns() < r->measure_end_ns &&
               atomic_load(&r->workers_done) < o->threads) {
            kf_bench_sleep_until_ns(kf_bench_mono_ns() + 10 * 1000000);
        }
        if (atomic_load(&r->workers_done) == o->threads) {
            r->measure_end_ns = kf_bench_mono_ns();
        }
    } else {
        kf_bench_sleep_until_ns(r->measure_end_ns);
    }
    kf_bench_cpu_end(&cpu1, o->server_pid);

    static kf_bench_hist_t hist;
    uint64_t statuses[KF_BENCH_STATUS_SLOTS] = {0};
    uint64_t abandoned = 0;
    uint64_t events_ok = 0;
    uint64_t event_errors = 0;
    for (long t = 0; t < o->threads; t++) {
        worker_t *w = &r->workers[t];
        pthread_join(w->thread, NULL);
        kf_bench_hist_merge(&hist, &w->hist);
        for (int i = 0; i < KF_BENCH_STATUS_SLOTS; i++) {
            statuses[i] += w->statuses[i];
        }
        abandoned += w->abandoned;
        events_ok += w->events_ok;
        event_errors += w->event_errors;
    }
    kf_bench_cpu_pct_t cpu;
    kf_bench_cpu_pct(&cpu0, &cpu1, (double)(r->measure_end_ns - r->measure_start_ns) / 1e9, &cpu);
    print_results(r, &hist, statuses, abandoned, events_ok, event_errors, &cpu);

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
            "usage: kf_load --target HOST:PORT --rpc health|send|send-events [options]\n"
            "       kf_load --fsync-probe DIR [--count N] [--fsync-mode M] [--gap-us N]\n"
            "  --concurrency N   calls kept outstanding (default 1, max %d)\n"
            "  --duration-s S    measurement window (default 10)\n"
            "  --warmup-s S      load before the window, not counted (default 2)\n"
            "  --keys N          SendEvent keys, drawn uniformly (default 10000)\n"
            "  --batch-events N  send-events: events per SendEvents call (default 100,\n"
            "                    max %d)\n"
            "  --cover 1         send-events: each call on the next --batch-events\n"
            "                    consecutive keys; stop once every key is hit\n"
            "  --window-ms N     the events' debounce window (default 60000)\n"
            "  --input-bytes N   SendEvent input padded to about N bytes (default: tiny,\n"
            "                    max %d; the client holds one request per key)\n"
            "  --channels N      channels = TCP connections (default 1, max %d)\n"
            "  --threads N       client threads, one completion queue each (default 1)\n"
            "  --workflow NAME   SendEvent workflow (default bench-PID)\n"
            "  --deadline-ms N   per-call deadline (default 10000)\n"
            "  --server-pid PID  also report that process's CPU use in the window\n"
            "  --minimal-stack B 1: client channels without optional filters (default 1)\n"
            "  --tls-ca FILE     TLS, verifying the server with these PEM CAs\n"
            "  --api-key KEY     sent as \"authorization: Bearer KEY\" with every call\n"
            "  --count N         fsync probe records (default 2000)\n"
            "  --fsync-mode M    append (default), fallocate or overwrite (see the source)\n"
            "  --gap-us N        fsync probe: idle this long before each record (default 0)\n",
            CONCURRENCY_MAX, BATCH_EVENTS_MAX, INPUT_BYTES_MAX, CHANNELS_MAX);
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
        .batch_events = 100,
        .window_ms = 60000,
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
            } else if (strcmp(v, "send-events") == 0) {
                o->rpc = RPC_SEND_EVENTS;
            } else {
                fprintf(stderr, "kf_load: --rpc must be health, send or send-events\n");
                ok = false;
            }
        } else if (strcmp(a, "--concurrency") == 0) {
            ok = kf_bench_parse_long("kf_load", a, v, 1, CONCURRENCY_MAX, &o->concurrency);
        } else if (strcmp(a, "--duration-s") == 0) {
            ok = kf_bench_parse_seconds("kf_load", a, v, DURATION_S_MAX, &o->duration_s);
        } else if (strcmp(a, "--warmup-s") == 0) {
            ok = kf_bench_parse_seconds("kf_load", a, v, DURATION_S_MAX, &o->warmup_s);
        } else if (strcmp(a, "--keys") == 0) {
            ok = kf_bench_parse_long("kf_load", a, v, 1, KEYS_MAX, &o->keys);
        } else if (strcmp(a, "--batch-events") == 0) {
            ok = kf_bench_parse_long("kf_load", a, v, 1, BATCH_EVENTS_MAX, &o->batch_events);
        } else if (strcmp(a, "--cover") == 0) {
            long flag;
            ok = kf_bench_parse_long("kf_load", a, v, 0, 1, &flag);
            o->cover = flag != 0;
        } else if (strcmp(a, "--window-ms") == 0) {
            ok = kf_bench_parse_long("kf_load", a, v, 1, 7L * 24 * 3600 * 1000, &o->window_ms);
        } else if (strcmp(a, "--input-bytes") == 0) {
            ok = kf_bench_parse_long("kf_load", a, v, 0, INPUT_BYTES_MAX, &o->input_bytes);
        } else if (strcmp(a, "--channels") == 0) {
            ok = kf_bench_parse_long("kf_load", a, v, 1, CHANNELS_MAX, &o->channels);
        } else if (strcmp(a, "--threads") == 0) {
            ok = kf_bench_parse_long("kf_load", a, v, 1, THREADS_MAX, &o->threads);
        } else if (strcmp(a, "--workflow") == 0) {
            o->workflow = v;
        } else if (strcmp(a, "--deadline-ms") == 0) {
            ok = kf_bench_parse_long("kf_load", a, v, 1, 3600000, &o->deadline_ms);
        } else if (strcmp(a, "--server-pid") == 0) {
            ok = kf_bench_parse_long("kf_load", a, v, 1, 1L << 30, &o->server_pid);
        } else if (strcmp(a, "--minimal-stack") == 0) {
            long flag;
            ok = kf_bench_parse_long("kf_load", a, v, 0, 1, &flag);
            o->minimal_stack = flag != 0;
        } else if (strcmp(a, "--tls-ca") == 0) {
            o->tls_ca = v;
        } else if (strcmp(a, "--api-key") == 0) {
            o->api_key = v;
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
        } else if (strcmp(a, "--gap-us") == 0) {
            ok = kf_bench_parse_long("kf_load", a, v, 0, 1000000, &o->fsync_gap_us);
        } else if (strcmp(a, "--count") == 0) {
            ok = kf_bench_parse_long("kf_load", a, v, 1, FSYNC_COUNT_MAX, &o->fsync_count);
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
        return run_fsync_probe(o.fsync_dir, o.fsync_count, o.fsync_mode, o.fsync_gap_us);
    }
    return run_load(&o);
}
