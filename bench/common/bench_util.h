/*
 * bench_util.h - what the benchmark load generators (bench/load/kf_load.c,
 * bench/functions/kf_fnload.c) measure with, in one place, so that their
 * numbers are taken the same way and stay comparable (bench/README.md).
 *
 *   * a fixed-size log-linear latency histogram (1/64 relative bucket width);
 *   * the monotonic and wall clocks, and sleeping until a monotonic instant;
 *   * a small PRNG for drawing keys;
 *   * strict flag parsing (whole integers in a range, seconds);
 *   * CPU sampling: this process (getrusage), another process and its threads
 *     (/proc/PID/stat), the whole machine (/proc/stat), and the client /
 *     server / other split over a window;
 *   * gRPC: channels with one connection each, status names and the op
 *     batch of a unary call.
 *
 * Nothing here keeps global state; every function is thread-safe on
 * distinct arguments.
 */
#ifndef KF_BENCH_UTIL_H
#define KF_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

/* ---- Histogram -------------------------------------------------------------
 *
 * Log-linear over nanoseconds: values below 2^KF_BENCH_HIST_SUB_BITS have one
 * bucket each; above, every power of two [2^k, 2^(k+1)) is split into
 * 2^KF_BENCH_HIST_SUB_BITS equal buckets, so a bucket is at most 1/64 (1.6%)
 * of its value wide. Values are clamped to 2^40 ns (18 minutes), giving a
 * fixed array: recording never allocates, and merging is a loop of adds. */
#define KF_BENCH_HIST_SUB_BITS 6
#define KF_BENCH_HIST_SUB      (1 << KF_BENCH_HIST_SUB_BITS)
#define KF_BENCH_HIST_TOP_BIT  40
#define KF_BENCH_HIST_BUCKETS                                                                      \
    ((KF_BENCH_HIST_TOP_BIT - KF_BENCH_HIST_SUB_BITS + 1) * KF_BENCH_HIST_SUB)

typedef struct kf_bench_hist {
    uint64_t buckets[KF_BENCH_HIST_BUCKETS];
    uint64_t count;
    uint64_t sum_ns; /* for the mean; 2^64 ns is 584 years */
    uint64_t max_ns; /* exact, not a bucket's value */
} kf_bench_hist_t;

/* Zero-initialise a kf_bench_hist_t before the first record. */
void kf_bench_hist_record(kf_bench_hist_t *h, uint64_t ns);
void kf_bench_hist_merge(kf_bench_hist_t *into, const kf_bench_hist_t *from);
/* The q-quantile (0 < q < 1) in microseconds: the middle of the first bucket
 * whose cumulative count reaches ceil(q * count), never above the exact max;
 * 0 for an empty histogram. */
double kf_bench_hist_quantile_us(const kf_bench_hist_t *h, double q);
double kf_bench_hist_mean_us(const kf_bench_hist_t *h);
double kf_bench_hist_max_us(const kf_bench_hist_t *h);

/* ---- Clocks and randomness ---------------------------------------------- */

/* CLOCK_MONOTONIC, for every duration and window edge. */
int64_t kf_bench_mono_ns(void);
/* CLOCK_REALTIME in Unix microseconds, for event times that look real. */
int64_t kf_bench_wall_us(void);
/* Sleeps until kf_bench_mono_ns() reaches when_ns (absolute, so that window
 * edges do not drift); at once when it has passed. */
void kf_bench_sleep_until_ns(int64_t when_ns);

/* splitmix64: a fast generator for uniform key draws, not for anything that
 * needs unpredictability. Any seed is valid, zero included. */
uint64_t kf_bench_rng_next(uint64_t *state);

/* ---- Flags -----------------------------------------------------------------
 *
 * Strict: the whole text must be the number, inside [lo, hi]; otherwise a
 * one-line diagnostic "PROG: FLAG must be ..." goes to stderr and the result
 * is false (`*out` untouched). A typo must stop the run, not change it. */
bool kf_bench_parse_ll(const char *prog, const char *flag, const char *text, long long lo,
                       long long hi, long long *out);
bool kf_bench_parse_long(const char *prog, const char *flag, const char *text, long lo, long hi,
                         long *out);
/* Seconds as a decimal in [0, max_s]. */
bool kf_bench_parse_seconds(const char *prog, const char *flag, const char *text, long max_s,
                            double *out);

/* ---- CPU -------------------------------------------------------------------
 *
 * All in CPU seconds; a reading that cannot be taken is negative. */

/* This process, user + system (getrusage). */
double kf_bench_self_cpu_s(void);
/* Clock ticks per second of /proc's time fields. */
double kf_bench_ticks_per_s(void);
/* utime + stime clock ticks from a /proc/PID/stat or /proc/PID/task/TID/stat
 * file; -1 when unreadable. `comm` (optional) receives the command name. */
long long kf_bench_stat_ticks(const char *path, char *comm, size_t comm_size);
/* A process, user + system (/proc/PID/stat). */
double kf_bench_process_cpu_s(long pid);
/* The whole machine's busy time, all CPUs, idle and iowait excluded
 * (/proc/stat). */
double kf_bench_machine_busy_s(void);

/* The three readings at one edge of a measurement window. */
typedef struct kf_bench_cpu_sample {
    double client_s;  /* this process */
    double server_s;  /* the server process; -1 without a server pid */
    double machine_s; /* the whole machine */
} kf_bench_cpu_sample_t;

/* The window's opening and closing samples. The machine reading is taken
 * innermost (last at the start, first at the end), so that the machine's
 * share never covers more time than the client's and server's and "other"
 * is not inflated. server_pid <= 0: no server reading. */
void kf_bench_cpu_begin(kf_bench_cpu_sample_t *s, long server_pid);
void kf_bench_cpu_end(kf_bench_cpu_sample_t *s, long server_pid);

/* Percent of one core over the window, as top shows it (200% is two cores
 * busy). "Other" is the machine's busy time minus client and server: other
 * work on the machine, which is what tells a trustworthy run on a shared
 * machine from one that is not. server, machine and other are -1 when
 * unknown. */
typedef struct kf_bench_cpu_pct {
    double client;
    double server;
    double machine;
    double other;
} kf_bench_cpu_pct_t;

void kf_bench_cpu_pct(const kf_bench_cpu_sample_t *begin, const kf_bench_cpu_sample_t *end,
                      double window_s, kf_bench_cpu_pct_t *out);

/* ---- gRPC --------------------------------------------------------------- */

/* How every channel and call of the process reaches the server: TLS with
 * the CA in `tls_ca_path` (NULL: plaintext), and "authorization: Bearer
 * <api_key>" on every call (NULL: none). Call once, before the first
 * channel; reads the file here. False (with a message on stderr) when the
 * file cannot be read. */
bool kf_bench_security_set(const char *tls_ca_path, const char *api_key);

/* A client channel to `target` (see kf_bench_security_set) with its own TCP connection,
 * `index` telling the channels of one run apart. minimal_stack drops the
 * optional client filters; unlimited_receive lifts the 4 MB limit on a
 * received message. */
grpc_channel *kf_bench_channel_create(const char *target, int index, bool minimal_stack,
                                      bool unlimited_receive);

/* Status slots for counting call outcomes: gRPC's 17 codes, then the
 * failures that have no code. The tool names KF_BENCH_STATUS_REJECTED (an OK
 * call whose response it does not accept) after its own check. */
#define KF_BENCH_STATUS_CODES        17
#define KF_BENCH_STATUS_BATCH_FAILED 17 /* the completion queue reported success = 0 */
#define KF_BENCH_STATUS_REJECTED     18 /* OK, but the response is missing or wrong */
#define KF_BENCH_STATUS_OTHER        19 /* a code outside 0..16 */
#define KF_BENCH_STATUS_SLOTS        20

/* The slot of a finished call: `batch_ok` is the completion's success. */
int kf_bench_status_slot(bool batch_ok, grpc_status_code status);
/* The slot's name ("OK", "CANCELLED", ..., "BATCH_FAILED", `rejected`,
 * "OTHER"); "OTHER" outside 0..KF_BENCH_STATUS_SLOTS-1. */
const char *kf_bench_status_name(int slot, const char *rejected);
/* The calls counted in the non-OK slots. */
uint64_t kf_bench_errors_total(const uint64_t statuses[KF_BENCH_STATUS_SLOTS]);
/* The non-OK slots that counted anything, as " NAME=N NAME=N" (json false,
 * for the human line) or "\"NAME\":N,\"NAME\":N" (json true, the inside of
 * a JSON object); "" when there were none. Truncated to `size`. */
void kf_bench_errors_text(const uint64_t statuses[KF_BENCH_STATUS_SLOTS], const char *rejected,
                          bool json, char *buf, size_t size);

/* One unary call's buffers: what the single batch of kf_bench_unary_start
 * sends from and receives into. */
typedef struct kf_bench_unary {
    grpc_byte_buffer *request;  /* owned from start to release */
    grpc_byte_buffer *response; /* NULL: no message arrived */
    grpc_metadata_array initial_metadata;
    grpc_metadata_array trailing_metadata;
    grpc_status_code status;
    grpc_slice details; /* the status message */
} kf_bench_unary_t;

/* Starts the whole call as one batch (send metadata, message and close;
 * receive metadata, message and status) with `tag`, taking ownership of
 * `request`. A rejected batch is a bug in the ops, so it aborts. */
void kf_bench_unary_start(grpc_call *call, kf_bench_unary_t *u, grpc_byte_buffer *request,
                          void *tag);
/* After the batch completed: frees the buffers, the metadata and the details
 * (not the call). */
void kf_bench_unary_release(kf_bench_unary_t *u);

#endif
