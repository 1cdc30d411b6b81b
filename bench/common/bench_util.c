/*
 * bench_util.c - the measuring instruments shared by the benchmark load
 * generators (bench_util.h says what is here and why it is shared).
 */
#include "bench/common/bench_util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>

#include "base/status.h"

/* ---- Histogram ---------------------------------------------------------- */

#define HIST_VALUE_MAX ((UINT64_C(1) << KF_BENCH_HIST_TOP_BIT) - 1)

static size_t hist_index(uint64_t ns) {
    if (ns > HIST_VALUE_MAX) {
        ns = HIST_VALUE_MAX;
    }
    if (ns < 2 * KF_BENCH_HIST_SUB) {
        return (size_t)ns;
    }
    unsigned msb = 63u - (unsigned)__builtin_clzll(ns);
    unsigned shift = msb - KF_BENCH_HIST_SUB_BITS;
    /* ns >> shift is in [SUB, 2 * SUB), so the octaves' indexes never
     * overlap, and the largest value lands in the last bucket. */
    return (size_t)shift * KF_BENCH_HIST_SUB + (size_t)(ns >> shift);
}

/* The middle of bucket i, the value reported for it. */
static uint64_t hist_value(size_t i) {
    if (i < 2 * KF_BENCH_HIST_SUB) {
        return i;
    }
    unsigned shift = (unsigned)(i / KF_BENCH_HIST_SUB) - 1;
    uint64_t sub = i - (size_t)shift * KF_BENCH_HIST_SUB;
    uint64_t low = sub << shift;
    return low + ((UINT64_C(1) << shift) - 1) / 2;
}

void kf_bench_hist_record(kf_bench_hist_t *h, uint64_t ns) {
    h->buckets[hist_index(ns)]++;
    h->count++;
    h->sum_ns += ns;
    if (ns > h->max_ns) {
        h->max_ns = ns;
    }
}

void kf_bench_hist_merge(kf_bench_hist_t *into, const kf_bench_hist_t *from) {
    for (size_t i = 0; i < KF_BENCH_HIST_BUCKETS; i++) {
        into->buckets[i] += from->buckets[i];
    }
    into->count += from->count;
    into->sum_ns += from->sum_ns;
    if (from->max_ns > into->max_ns) {
        into->max_ns = from->max_ns;
    }
}

double kf_bench_hist_quantile_us(const kf_bench_hist_t *h, double q) {
    if (h->count == 0) {
        return 0.0;
    }
    double want = q * (double)h->count;
    uint64_t rank = (uint64_t)want;
    if ((double)rank < want || rank == 0) {
        rank++;
    }
    uint64_t seen = 0;
    for (size_t i = 0; i < KF_BENCH_HIST_BUCKETS; i++) {
        seen += h->buckets[i];
        if (seen >= rank) {
            uint64_t v = hist_value(i);
            return (double)(v < h->max_ns ? v : h->max_ns) / 1000.0;
        }
    }
    return (double)h->max_ns / 1000.0;
}

double kf_bench_hist_mean_us(const kf_bench_hist_t *h) {
    return h->count > 0 ? (double)h->sum_ns / (double)h->count / 1000.0 : 0.0;
}

double kf_bench_hist_max_us(const kf_bench_hist_t *h) {
    return (double)h->max_ns / 1000.0;
}

/* ---- Clocks and randomness ---------------------------------------------- */

int64_t kf_bench_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t kf_bench_wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void kf_bench_sleep_until_ns(int64_t when_ns) {
    struct timespec ts = {.tv_sec = when_ns / 1000000000, .tv_nsec = when_ns % 1000000000};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

uint64_t kf_bench_rng_next(uint64_t *state) {
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* ---- Flags -------------------------------------------------------------- */

bool kf_bench_parse_ll(const char *prog, const char *flag, const char *text, long long lo,
                       long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "%s: %s must be an integer in %lld..%lld, got '%s'\n", prog, flag, lo, hi,
                text);
        return false;
    }
    *out = v;
    return true;
}

bool kf_bench_parse_long(const char *prog, const char *flag, const char *text, long lo, long hi,
                         long *out) {
    long long v;
    if (!kf_bench_parse_ll(prog, flag, text, lo, hi, &v)) {
        return false;
    }
    *out = (long)v; /* in [lo, hi], so it fits */
    return true;
}

bool kf_bench_parse_seconds(const char *prog, const char *flag, const char *text, long max_s,
                            double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    /* !(v >= 0) also refuses NaN. */
    if (errno != 0 || end == text || *end != '\0' || !(v >= 0.0) || v > (double)max_s) {
        fprintf(stderr, "%s: %s must be seconds in 0..%ld, got '%s'\n", prog, flag, max_s, text);
        return false;
    }
    *out = v;
    return true;
}

/* ---- CPU ---------------------------------------------------------------- */

double kf_bench_self_cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

double kf_bench_ticks_per_s(void) {
    return (double)sysconf(_SC_CLK_TCK);
}

long long kf_bench_stat_ticks(const char *path, char *comm, size_t comm_size) {
    char buf[1024];
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name in parentheses may itself hold spaces and ')':
     * the fields are parsed after the last ')'. */
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
    unsigned long long utime = 0;
    unsigned long long stime = 0;
    /* After ")": state(3) ppid pgrp session tty tpgid flags minflt cminflt
     * majflt cmajflt utime(14) stime(15). */
    if (sscanf(close + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
               &stime) != 2) {
        return -1;
    }
    return (long long)(utime + stime);
}

double kf_bench_process_cpu_s(long pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    long long ticks = kf_bench_stat_ticks(path, NULL, 0);
    return ticks < 0 ? -1.0 : (double)ticks / kf_bench_ticks_per_s();
}

double kf_bench_machine_busy_s(void) {
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
    return (double)busy / kf_bench_ticks_per_s();
}

void kf_bench_cpu_begin(kf_bench_cpu_sample_t *s, long server_pid) {
    s->client_s = kf_bench_self_cpu_s();
    s->server_s = server_pid > 0 ? kf_bench_process_cpu_s(server_pid) : -1.0;
    s->machine_s = kf_bench_machine_busy_s();
}

void kf_bench_cpu_end(kf_bench_cpu_sample_t *s, long server_pid) {
    s->machine_s = kf_bench_machine_busy_s();
    s->client_s = kf_bench_self_cpu_s();
    s->server_s = server_pid > 0 ? kf_bench_process_cpu_s(server_pid) : -1.0;
}

void kf_bench_cpu_pct(const kf_bench_cpu_sample_t *begin, const kf_bench_cpu_sample_t *end,
                      double window_s, kf_bench_cpu_pct_t *out) {
    bool timed = window_s > 0;
    out->client = timed ? 100.0 * (end->client_s - begin->client_s) / window_s : 0.0;
    out->server = timed && begin->server_s >= 0 && end->server_s >= 0
                      ? 100.0 * (end->server_s - begin->server_s) / window_s
                      : -1.0;
    out->machine = timed && begin->machine_s >= 0 && end->machine_s >= 0
                       ? 100.0 * (end->machine_s - begin->machine_s) / window_s
                       : -1.0;
    out->other = -1.0;
    if (out->machine >= 0 && out->server >= 0) {
        out->other = out->machine - out->client - out->server;
        if (out->other < 0) {
            out->other = 0; /* tick rounding */
        }
    }
}

/* ---- gRPC --------------------------------------------------------------- */

/* With the global subchannel pool, channels with equal arguments would share
 * one TCP connection and --channels would measure nothing: hence the local
 * pool, and the index as an argument of its own to keep the arguments
 * distinct as well. Retries are off so that every attempt the server sees is
 * one the client counts. The minimal stack drops the client-side filters
 * (deadline timer, message-size checks, census): about 10% more calls/s from
 * a client that shares two cores with the server. Deadlines still travel as
 * grpc-timeout and the server enforces them; the tools cancel a call still
 * pending well past its deadline, covering a server that never answers. */
static struct {
    char *tls_ca_pem;       /* NULL: plaintext */
    char *authorization;    /* "Bearer <key>", or NULL */
    grpc_metadata metadata; /* over authorization (a static slice) */
} security;

bool kf_bench_security_set(const char *tls_ca_path, const char *api_key) {
    if (tls_ca_path != NULL) {
        FILE *f = fopen(tls_ca_path, "rb");
        char *pem = f != NULL ? calloc(1, 1024 * 1024 + 1) : NULL;
        size_t n = pem != NULL ? fread(pem, 1, 1024 * 1024, f) : 0;
        if (f != NULL) {
            fclose(f);
        }
        if (pem == NULL || n == 0) {
            fprintf(stderr, "cannot read the CA file %s\n", tls_ca_path);
            free(pem);
            return false;
        }
        security.tls_ca_pem = pem;
    }
    if (api_key != NULL) {
        size_t len = strlen("Bearer ") + strlen(api_key) + 1;
        security.authorization = malloc(len);
        if (security.authorization == NULL) {
            return false;
        }
        snprintf(security.authorization, len, "Bearer %s", api_key);
        security.metadata.key = grpc_slice_from_static_string("authorization");
        security.metadata.value = grpc_slice_from_static_string(security.authorization);
    }
    return true;
}

grpc_channel *kf_bench_channel_create(const char *target, int index, bool minimal_stack,
                                      bool unlimited_receive) {
    grpc_arg args[5];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
    args[0].value.integer = 1;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_ENABLE_RETRIES;
    args[1].value.integer = 0;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = "kf_bench.channel_index";
    args[2].value.integer = index;
    args[3].type = GRPC_ARG_INTEGER;
    args[3].key = GRPC_ARG_MINIMAL_STACK;
    args[3].value.integer = minimal_stack;
    size_t count = 4;
    if (unlimited_receive) {
        args[count].type = GRPC_ARG_INTEGER;
        args[count].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
        args[count].value.integer = -1;
        count++;
    }
    grpc_channel_args channel_args = {count, args};
    grpc_channel_credentials *creds =
        security.tls_ca_pem != NULL
            ? grpc_ssl_credentials_create(security.tls_ca_pem, NULL, NULL, NULL)
            : grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(target, creds, &channel_args);
    grpc_channel_credentials_release(creds);
    return ch;
}

int kf_bench_status_slot(bool batch_ok, grpc_status_code status) {
    if (!batch_ok) {
        return KF_BENCH_STATUS_BATCH_FAILED;
    }
    if ((int)status < 0 || (int)status >= KF_BENCH_STATUS_CODES) {
        return KF_BENCH_STATUS_OTHER;
    }
    return (int)status;
}

const char *kf_bench_status_name(int slot, const char *rejected) {
    if (slot >= 0 && slot < KF_BENCH_STATUS_CODES) {
        return kf_grpc_code_name(slot);
    }
    if (slot == KF_BENCH_STATUS_BATCH_FAILED) {
        return "BATCH_FAILED";
    }
    if (slot == KF_BENCH_STATUS_REJECTED) {
        return rejected;
    }
    return "OTHER";
}

uint64_t kf_bench_errors_total(const uint64_t statuses[KF_BENCH_STATUS_SLOTS]) {
    uint64_t errors = 0;
    for (int i = 1; i < KF_BENCH_STATUS_SLOTS; i++) {
        errors += statuses[i];
    }
    return errors;
}

void kf_bench_errors_text(const uint64_t statuses[KF_BENCH_STATUS_SLOTS], const char *rejected,
                          bool json, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    bool first = true;
    for (int i = 1; i < KF_BENCH_STATUS_SLOTS && used < size; i++) {
        if (statuses[i] == 0) {
            continue;
        }
        const char *name = kf_bench_status_name(i, rejected);
        int n = json ? snprintf(buf + used, size - used, "%s\"%s\":%" PRIu64, first ? "" : ",",
                                name, statuses[i])
                     : snprintf(buf + used, size - used, " %s=%" PRIu64, name, statuses[i]);
        used += n > 0 ? (size_t)n : 0; /* past `size` after a truncation: the loop ends */
        first = false;
    }
}

void kf_bench_unary_start(grpc_call *call, kf_bench_unary_t *u, grpc_byte_buffer *request,
                          void *tag) {
    u->request = request;
    u->response = NULL;
    u->status = GRPC_STATUS_UNKNOWN; /* until the batch sets it */
    grpc_metadata_array_init(&u->initial_metadata);
    grpc_metadata_array_init(&u->trailing_metadata);
    u->details = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (security.authorization != NULL) {
        ops[0].data.send_initial_metadata.count = 1;
        ops[0].data.send_initial_metadata.metadata = &security.metadata;
    }
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = u->request;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &u->initial_metadata;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &u->response;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &u->trailing_metadata;
    ops[5].data.recv_status_on_client.status = &u->status;
    ops[5].data.recv_status_on_client.status_details = &u->details;
    grpc_call_error rc = grpc_call_start_batch(call, ops, 6, tag, NULL);
    if (rc != GRPC_CALL_OK) {
        fprintf(stderr, "kf_bench_unary_start: grpc_call_start_batch failed: %d\n", (int)rc);
        abort();
    }
}

void kf_bench_unary_release(kf_bench_unary_t *u) {
    if (u->response != NULL) {
        grpc_byte_buffer_destroy(u->response);
        u->response = NULL;
    }
    grpc_byte_buffer_destroy(u->request);
    u->request = NULL;
    grpc_metadata_array_destroy(&u->initial_metadata);
    grpc_metadata_array_destroy(&u->trailing_metadata);
    grpc_slice_unref(u->details);
}
