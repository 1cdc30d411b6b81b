/* metrics.c - fixed tables of relaxed atomics and the Prometheus renderer. */
#include "base/metrics.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/status.h"

#define BUCKETS_MAX 16

typedef struct bucket_set {
    int count;
    double bounds[BUCKETS_MAX];
} bucket_set_t;

static const bucket_set_t kf__buckets_count = {
    13, {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096}};
static const bucket_set_t kf__buckets_bytes = {
    9, {256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216}};
static const bucket_set_t kf__buckets_seconds = {15,
                                                 {25e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3,
                                                  5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1, 5}};

typedef struct histogram {
    const char *name;
    const char *help;
    const bucket_set_t *buckets;
    atomic_uint_fast64_t counts[BUCKETS_MAX + 1];
    _Atomic double sum;
} histogram_t;

static const struct {
    const char *name;
    const char *help;
} gauge_info[] =
    {
#define ROW_(id, name, help) {name, help},
        KF_GAUGE_TABLE(ROW_)},
  counter_info[] = {KF_COUNTER_TABLE(ROW_)};
#undef ROW_

/* A gauge per slot: each partition's engine sets its own (its coordinators,
 * its queue), and the exposition adds them up, so partitions never
 * overwrite each other's values. Slot 0 is everything else. */
static atomic_int_fast64_t gauges[KF_METRICS_SLOTS][KF_GAUGE_COUNT];
static _Thread_local int thread_slot;
static atomic_uint_fast64_t counters[KF_COUNTER_COUNT];
static histogram_t histograms[KF_HISTOGRAM_COUNT] = {
#define H_ROW_(id, name, help, buckets) {name, help, &buckets, {0}, 0},
    KF_HISTOGRAM_TABLE(H_ROW_)
#undef H_ROW_
};

/* Request metrics: per method and transport, a count per gRPC code and a
 * latency histogram. */
#define GRPC_CODES 17
static const char *method_names[KF_METRICS_METHODS_MAX];
static int method_count;
/* Whether a front end serves the method over the transport (it has series). */
static bool method_served[KF_METRICS_METHODS_MAX][KF_TRANSPORT_COUNT];
static atomic_uint_fast64_t request_counts[KF_METRICS_METHODS_MAX][KF_TRANSPORT_COUNT][GRPC_CODES];
static histogram_t request_latency[KF_METRICS_METHODS_MAX][KF_TRANSPORT_COUNT];

static const char *build_version;
static const char *build_commit;

void kf_metrics_set_build_info(const char *version, const char *commit) {
    build_version = version;
    build_commit = commit;
}

int kf_metrics_bind_slot(int slot) {
    KF_ASSERT(slot >= 0 && slot < KF_METRICS_SLOTS);
    int before = thread_slot;
    thread_slot = slot;
    return before;
}
void kf_gauge_set_in(int slot, kf_gauge_t g, int64_t v) {
    KF_ASSERT(slot >= 0 && slot < KF_METRICS_SLOTS);
    atomic_store_explicit(&gauges[slot][g], v, memory_order_relaxed);
}
void kf_gauge_set(kf_gauge_t g, int64_t v) {
    kf_gauge_set_in(thread_slot, g, v);
}
void kf_gauge_add(kf_gauge_t g, int64_t d) {
    atomic_fetch_add_explicit(&gauges[thread_slot][g], d, memory_order_relaxed);
}
/* What every slot holds the same of (the functions registered in every
 * partition and their workers, the one filesystem's free space, the one
 * block cache the stores share, readiness) is their largest value; the
 * rest is a sum over the partitions. */
static bool gauge_is_shared(kf_gauge_t g) {
    return g == KF_G_FUNCTIONS || g == KF_G_FUNCTION_WORKERS || g == KF_G_DISK_FREE_BYTES ||
           g == KF_G_STORE_BLOCK_CACHE_BYTES || g == KF_G_DISK_RESERVE_REACHED || g == KF_G_READY;
}
int64_t kf_gauge_get(kf_gauge_t g) {
    int64_t v = 0;
    for (int slot = 0; slot < KF_METRICS_SLOTS; slot++) {
        int64_t x = atomic_load_explicit(&gauges[slot][g], memory_order_relaxed);
        v = gauge_is_shared(g) ? (x > v ? x : v) : v + x;
    }
    return v;
}
void kf_counter_add(kf_counter_t c, uint64_t d) {
    atomic_fetch_add_explicit(&counters[c], d, memory_order_relaxed);
}
uint64_t kf_counter_get(kf_counter_t c) {
    return atomic_load_explicit(&counters[c], memory_order_relaxed);
}

static void observe(histogram_t *h, double v) {
    int i = 0;
    while (i < h->buckets->count && v > h->buckets->bounds[i]) {
        i++;
    }
    atomic_fetch_add_explicit(&h->counts[i], 1, memory_order_relaxed);
    double old = atomic_load_explicit(&h->sum, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&h->sum, &old, old + v, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
}

void kf_histogram_observe(kf_histogram_t h, double v) {
    observe(&histograms[h], v);
}
void kf_histogram_observe_us(kf_histogram_t h, int64_t us) {
    observe(&histograms[h], (double)us / 1e6);
}

int kf_metrics_method_register(const char *name, kf_transport_t transport) {
    KF_ASSERT((unsigned)transport < KF_TRANSPORT_COUNT);
    for (int i = 0; i < method_count; i++) {
        if (strcmp(method_names[i], name) == 0) {
            method_served[i][transport] = true;
            return i;
        }
    }
    KF_ASSERT(method_count < KF_METRICS_METHODS_MAX);
    method_served[method_count][transport] = true;
    method_names[method_count] = name;
    for (int t = 0; t < KF_TRANSPORT_COUNT; t++) {
        request_latency[method_count][t].name = "keyflow_request_duration_seconds";
        request_latency[method_count][t].buckets = &kf__buckets_seconds;
    }
    return method_count++;
}

void kf_metrics_request(int method, kf_transport_t transport, int grpc_code, int64_t latency_us) {
    if (method < 0 || method >= method_count || grpc_code < 0 || grpc_code >= GRPC_CODES ||
        !method_served[method][transport]) {
        return;
    }
    atomic_fetch_add_explicit(&request_counts[method][transport][grpc_code], 1,
                              memory_order_relaxed);
    observe(&request_latency[method][transport], (double)latency_us / 1e6);
}

void kf_metrics_reset(void) {
    for (int slot = 0; slot < KF_METRICS_SLOTS; slot++)
        for (int i = 0; i < KF_GAUGE_COUNT; i++)
            atomic_store(&gauges[slot][i], 0);
    for (int i = 0; i < KF_COUNTER_COUNT; i++)
        atomic_store(&counters[i], 0);
    for (int i = 0; i < KF_HISTOGRAM_COUNT; i++) {
        for (int b = 0; b <= BUCKETS_MAX; b++)
            atomic_store(&histograms[i].counts[b], 0);
        atomic_store(&histograms[i].sum, 0);
    }
    for (int m = 0; m < KF_METRICS_METHODS_MAX; m++) {
        for (int t = 0; t < KF_TRANSPORT_COUNT; t++) {
            for (int c = 0; c < GRPC_CODES; c++)
                atomic_store(&request_counts[m][t][c], 0);
            for (int b = 0; b <= BUCKETS_MAX; b++)
                atomic_store(&request_latency[m][t].counts[b], 0);
            atomic_store(&request_latency[m][t].sum, 0);
        }
    }
}

typedef struct out {
    char *buf;
    size_t len;
    size_t cap;
    int failed;
} out_t;

__attribute__((format(printf, 2, 3))) static void outf(out_t *o, const char *fmt, ...) {
    if (o->failed) {
        return;
    }
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            o->failed = 1;
            return;
        }
        if (o->len + (size_t)n < o->cap) {
            o->len += (size_t)n;
            return;
        }
        size_t cap = o->cap * 2 + (size_t)n;
        char *b = realloc(o->buf, cap);
        if (b == NULL) {
            o->failed = 1;
            return;
        }
        o->buf = b;
        o->cap = cap;
    }
}

static void render_histogram(out_t *o, const histogram_t *h, const char *labels) {
    uint64_t cumulative = 0;
    const char *sep = labels[0] ? "," : "";
    for (int i = 0; i <= h->buckets->count; i++) {
        cumulative += atomic_load_explicit(&h->counts[i], memory_order_relaxed);
        if (i < h->buckets->count) {
            outf(o, "%s_bucket{%s%sle=\"%.15g\"} %llu\n", h->name, labels, sep,
                 h->buckets->bounds[i], (unsigned long long)cumulative);
        } else {
            outf(o, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", h->name, labels, sep,
                 (unsigned long long)cumulative);
        }
    }
    const char *open = labels[0] ? "{" : "", *close = labels[0] ? "}" : "";
    outf(o, "%s_sum%s%s%s %.9g\n", h->name, open, labels, close,
         atomic_load_explicit(&h->sum, memory_order_relaxed));
    outf(o, "%s_count%s%s%s %llu\n", h->name, open, labels, close, (unsigned long long)cumulative);
}

/* ---- process metrics (the names every Prometheus client library uses) ---- */

/* Fields 22 (starttime, in clock ticks after boot) and 23 (vsize, bytes) of
 * /proc/self/stat. The command name (field 2) may hold spaces and
 * parentheses, so parsing starts after its last ')'. */
static bool proc_stat(unsigned long long *start_ticks, unsigned long long *vsize_bytes) {
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "re");
    if (f == NULL) {
        return false;
    }
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    if (p == NULL) {
        return false;
    }
    /* After ")": field 3 (state) is the first; starttime is the 20th of
     * them, vsize the 21st. */
    int field = 2;
    for (const char *q = p + 1; *q != '\0'; q++) {
        if (*q == ' ') {
            field++;
            if (field == 22) {
                *start_ticks = strtoull(q + 1, NULL, 10);
            } else if (field == 23) {
                *vsize_bytes = strtoull(q + 1, NULL, 10);
                return true;
            }
        }
    }
    return false;
}

/* The boot time (unix seconds), "btime" of /proc/stat. */
static bool boot_time(unsigned long long *out) {
    FILE *f = fopen("/proc/stat", "re");
    if (f == NULL) {
        return false;
    }
    char line[256];
    bool found = false;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        found = sscanf(line, "btime %llu", out) == 1;
    }
    fclose(f);
    return found;
}

static void render_process(out_t *o) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                     (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
        outf(o,
             "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
             "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.6f\n",
             cpu);
    }
    long page_bytes = sysconf(_SC_PAGESIZE);
    unsigned long long pages_total = 0, pages_resident = 0;
    FILE *f = fopen("/proc/self/statm", "re");
    if (f != NULL) {
        if (fscanf(f, "%llu %llu", &pages_total, &pages_resident) == 2 && page_bytes > 0) {
            outf(o,
                 "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
                 "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes "
                 "%llu\n",
                 pages_resident * (unsigned long long)page_bytes);
        }
        fclose(f);
    }
    unsigned long long start_ticks = 0, vsize_bytes = 0, boot_s = 0;
    bool have_stat = proc_stat(&start_ticks, &vsize_bytes);
    if (have_stat) {
        outf(o,
             "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
             "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %llu\n",
             vsize_bytes);
    }
    DIR *d = opendir("/proc/self/fd");
    if (d != NULL) {
        long fds = 0;
        for (struct dirent *e = readdir(d); e != NULL; e = readdir(d)) {
            fds += e->d_name[0] != '.';
        }
        closedir(d);
        outf(o,
             "# HELP process_open_fds Number of open file descriptors.\n"
             "# TYPE process_open_fds gauge\nprocess_open_fds %ld\n",
             fds - 1); /* less the one this count itself held open */
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        outf(o,
             "# HELP process_max_fds Maximum number of open file descriptors.\n"
             "# TYPE process_max_fds gauge\nprocess_max_fds %llu\n",
             (unsigned long long)rl.rlim_cur);
    }
    long ticks_per_s = sysconf(_SC_CLK_TCK);
    if (have_stat && ticks_per_s > 0 && boot_time(&boot_s)) {
        outf(o,
             "# HELP process_start_time_seconds Start time of the process since unix epoch in "
             "seconds.\n"
             "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %.2f\n",
             (double)boot_s + (double)start_ticks / (double)ticks_per_s);
    }
}

char *kf_metrics_render(size_t *len) {
    static const char *const transport_names[KF_TRANSPORT_COUNT] = {"grpc", "http"};
    out_t o = {malloc(16384), 0, 16384, 0};
    if (o.buf == NULL) {
        return NULL;
    }
    o.buf[0] = '\0';
    if (build_version != NULL) {
        outf(
            &o,
            "# HELP keyflow_build_info The running build: version and source commit\n"
            "# TYPE keyflow_build_info gauge\nkeyflow_build_info{version=\"%s\",commit=\"%s\"} 1\n",
            build_version, build_commit != NULL ? build_commit : "unknown");
    }
    render_process(&o);
    for (int i = 0; i < KF_GAUGE_COUNT; i++) {
        outf(&o, "# HELP %s %s\n# TYPE %s gauge\n%s %lld\n", gauge_info[i].name, gauge_info[i].help,
             gauge_info[i].name, gauge_info[i].name, (long long)kf_gauge_get((kf_gauge_t)i));
    }
    for (int i = 0; i < KF_COUNTER_COUNT; i++) {
        outf(&o, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", counter_info[i].name,
             counter_info[i].help, counter_info[i].name, counter_info[i].name,
             (unsigned long long)atomic_load_explicit(&counters[i], memory_order_relaxed));
    }
    for (int i = 0; i < KF_HISTOGRAM_COUNT; i++) {
        outf(&o, "# HELP %s %s\n# TYPE %s histogram\n", histograms[i].name, histograms[i].help,
             histograms[i].name);
        render_histogram(&o, &histograms[i], "");
    }
    outf(&o, "# HELP keyflow_requests_total Requests by method, transport and gRPC code\n"
             "# TYPE keyflow_requests_total counter\n");
    for (int m = 0; m < method_count; m++) {
        for (int t = 0; t < KF_TRANSPORT_COUNT; t++) {
            for (int c = 0; c < GRPC_CODES; c++) {
                uint64_t n = atomic_load_explicit(&request_counts[m][t][c], memory_order_relaxed);
                if (n > 0) {
                    outf(
                        &o,
                        "keyflow_requests_total{method=\"%s\",transport=\"%s\",code=\"%s\"} %llu\n",
                        method_names[m], transport_names[t], kf_grpc_code_name((int)c),
                        (unsigned long long)n);
                }
            }
        }
    }
    outf(&o, "# HELP keyflow_request_duration_seconds Request latency by method and transport\n"
             "# TYPE keyflow_request_duration_seconds histogram\n");
    for (int m = 0; m < method_count; m++) {
        for (int t = 0; t < KF_TRANSPORT_COUNT; t++) {
            if (!method_served[m][t]) {
                continue;
            }
            char labels[160];
            snprintf(labels, sizeof labels, "method=\"%s\",transport=\"%s\"", method_names[m],
                     transport_names[t]);
            render_histogram(&o, &request_latency[m][t], labels);
        }
    }
    if (o.failed) {
        free(o.buf);
        return NULL;
    }
    *len = o.len;
    return o.buf;
}
