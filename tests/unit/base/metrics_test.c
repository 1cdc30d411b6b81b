/*
 * metrics_test.c - counters, gauges, histograms and request metrics, and the
 * Prometheus text exposition (service/base/metrics.h).
 *
 * Every rendering is run through a small validator of the text format
 * (version 0.0.4): each family has one HELP and one TYPE line before its
 * samples, names and labels are well formed, values parse, and each
 * histogram series has ascending `le` bounds, cumulative counts, a final
 * le="+Inf" bucket equal to _count, and a _sum. Metrics are process-wide;
 * Criterion runs each test in a fresh process, so each starts from zero.
 */
#include <ctype.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <criterion/criterion.h>

#include "base/metrics.h"

/* ---- a validator for the Prometheus text format ----------------------- */

#define FAMILIES_MAX 64
#define NAME_BYTES   128
#define LABELS_BYTES 256

typedef struct family {
    char name[NAME_BYTES];
    char type[16];
    bool help;
    bool typed;
    bool sampled;
} family_t;

typedef struct series {
    char family[NAME_BYTES];
    char labels[LABELS_BYTES]; /* without le */
    double last_le;
    double last_count;
    int buckets;
    bool saw_inf;
    double inf_count;
    bool has_sum;
    bool has_count;
    double count;
} series_t;

typedef struct exposition {
    family_t families[FAMILIES_MAX];
    int family_count;
    series_t *series;
    int series_count;
    int series_cap;
} exposition_t;

static family_t *family_find(exposition_t *e, const char *name) {
    for (int i = 0; i < e->family_count; i++) {
        if (strcmp(e->families[i].name, name) == 0) {
            return &e->families[i];
        }
    }
    return NULL;
}

static family_t *family_add(exposition_t *e, const char *name) {
    family_t *f = family_find(e, name);
    if (f == NULL) {
        cr_assert_lt(e->family_count, FAMILIES_MAX);
        f = &e->families[e->family_count++];
        memset(f, 0, sizeof *f);
        snprintf(f->name, sizeof f->name, "%s", name);
    }
    return f;
}

static series_t *series_get(exposition_t *e, const char *family, const char *labels) {
    for (int i = 0; i < e->series_count; i++) {
        if (strcmp(e->series[i].family, family) == 0 && strcmp(e->series[i].labels, labels) == 0) {
            return &e->series[i];
        }
    }
    if (e->series_count == e->series_cap) {
        e->series_cap = e->series_cap ? e->series_cap * 2 : 64;
        e->series = realloc(e->series, (size_t)e->series_cap * sizeof *e->series);
        cr_assert_not_null(e->series);
    }
    series_t *s = &e->series[e->series_count++];
    memset(s, 0, sizeof *s);
    snprintf(s->family, sizeof s->family, "%s", family);
    snprintf(s->labels, sizeof s->labels, "%s", labels);
    s->last_le = -INFINITY;
    return s;
}

static bool name_char(char c, bool first) {
    return isalpha((unsigned char)c) || c == '_' || c == ':' ||
           (!first && isdigit((unsigned char)c));
}

/* Reads a metric name at *p into out; returns false when malformed. */
static bool read_name(const char **p, char *out, size_t cap) {
    size_t n = 0;
    while (name_char((*p)[n], n == 0)) {
        if (n + 1 >= cap) {
            return false;
        }
        out[n] = (*p)[n];
        n++;
    }
    out[n] = '\0';
    *p += n;
    return n > 0;
}

static bool parse_value(const char *s, double *out) {
    if (strcmp(s, "+Inf") == 0) {
        *out = INFINITY;
        return true;
    }
    if (strcmp(s, "-Inf") == 0) {
        *out = -INFINITY;
        return true;
    }
    if (strcmp(s, "NaN") == 0) {
        *out = NAN;
        return true;
    }
    char *end;
    *out = strtod(s, &end);
    return end != s && *end == '\0';
}

/* Parses {a="x",b="y"}; copies every label but le into other (as rendered),
 * and le's value into le (empty when absent). */
static void parse_labels(const char **p, const char *line, char *other, size_t other_cap, char *le,
                         size_t le_cap) {
    size_t used = 0;
    other[0] = '\0';
    le[0] = '\0';
    cr_assert_eq(**p, '{');
    (*p)++;
    while (**p != '}') {
        char lname[64];
        size_t n = 0;
        while (isalnum((unsigned char)(*p)[n]) || (*p)[n] == '_') {
            cr_assert_lt(n + 1, sizeof lname, "label name too long in: %s", line);
            lname[n] = (*p)[n];
            n++;
        }
        lname[n] = '\0';
        cr_assert(n > 0 && !isdigit((unsigned char)lname[0]), "bad label name in: %s", line);
        *p += n;
        cr_assert_eq(**p, '=', "missing '=' in: %s", line);
        cr_assert_eq((*p)[1], '"', "missing quote in: %s", line);
        *p += 2;
        char value[LABELS_BYTES];
        size_t v = 0;
        while (**p != '"') {
            cr_assert_neq(**p, '\0', "unterminated label value in: %s", line);
            cr_assert_neq(**p, '\n', "newline in label value in: %s", line);
            if (**p == '\\') {
                cr_assert((*p)[1] == '\\' || (*p)[1] == '"' || (*p)[1] == 'n', "bad escape in: %s",
                          line);
                value[v++] = (*p)[0];
                (*p)++;
            }
            cr_assert_lt(v + 1, sizeof value);
            value[v++] = **p;
            (*p)++;
        }
        value[v] = '\0';
        (*p)++;
        if (strcmp(lname, "le") == 0) {
            size_t value_len = strlen(value);
            cr_assert_lt(value_len, le_cap, "le label too long: %s", value);
            memcpy(le, value, value_len + 1);
        } else {
            int w = snprintf(other + used, other_cap - used, "%s%s=\"%s\"", used ? "," : "", lname,
                             value);
            cr_assert(w > 0 && (size_t)w < other_cap - used);
            used += (size_t)w;
        }
        if (**p == ',') {
            (*p)++;
        } else {
            cr_assert_eq(**p, '}', "expected ',' or '}' in: %s", line);
        }
    }
    (*p)++;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s);
    size_t b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The family a sample belongs to: its own name, or for histogram samples the
 * name without _bucket/_sum/_count. */
static family_t *family_of_sample(exposition_t *e, const char *name, const char **suffix) {
    *suffix = "";
    family_t *f = family_find(e, name);
    if (f != NULL) {
        return f;
    }
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    for (int i = 0; i < 3; i++) {
        if (ends_with(name, suffixes[i])) {
            char base[NAME_BYTES];
            size_t n = strlen(name) - strlen(suffixes[i]);
            memcpy(base, name, n);
            base[n] = '\0';
            f = family_find(e, base);
            if (f != NULL && strcmp(f->type, "histogram") == 0) {
                *suffix = suffixes[i];
                return f;
            }
        }
    }
    return NULL;
}

static void validate_sample(exposition_t *e, const char *line) {
    const char *p = line;
    char name[NAME_BYTES];
    cr_assert(read_name(&p, name, sizeof name), "bad metric name in: %s", line);
    char labels[LABELS_BYTES];
    char le[64];
    labels[0] = '\0';
    le[0] = '\0';
    if (*p == '{') {
        parse_labels(&p, line, labels, sizeof labels, le, sizeof le);
    }
    cr_assert_eq(*p, ' ', "expected one space before the value in: %s", line);
    p++;
    double value;
    cr_assert(parse_value(p, &value), "bad value in: %s", line);
    const char *suffix;
    family_t *f = family_of_sample(e, name, &suffix);
    cr_assert_not_null(f, "sample without a TYPE line: %s", line);
    cr_assert(f->typed, "sample before its TYPE line: %s", line);
    f->sampled = true;
    if (strcmp(f->type, "counter") == 0) {
        cr_assert_geq(value, 0, "negative counter: %s", line);
        /* keyflow's counters count things; process_cpu_seconds_total is
         * the one (standard) counter of seconds. */
        cr_assert(value == floor(value) || strncmp(name, "process_", 8) == 0,
                  "fractional counter: %s", line);
    }
    if (strcmp(f->type, "histogram") != 0) {
        cr_assert_eq(le[0], '\0', "le label outside a histogram: %s", line);
        return;
    }
    series_t *s = series_get(e, f->name, labels);
    if (strcmp(suffix, "_bucket") == 0) {
        cr_assert_neq(le[0], '\0', "bucket without le: %s", line);
        cr_assert_not(s->saw_inf, "bucket after +Inf: %s", line);
        double bound;
        cr_assert(parse_value(le, &bound), "bad le in: %s", line);
        cr_assert_gt(bound, s->last_le, "le not ascending: %s", line);
        cr_assert_geq(value, s->last_count, "bucket counts not cumulative: %s", line);
        s->last_le = bound;
        s->last_count = value;
        s->buckets++;
        if (isinf(bound)) {
            s->saw_inf = true;
            s->inf_count = value;
        }
    } else if (strcmp(suffix, "_sum") == 0) {
        s->has_sum = true;
    } else if (strcmp(suffix, "_count") == 0) {
        s->has_count = true;
        s->count = value;
    } else {
        cr_assert_fail("histogram sample without a suffix: %s", line);
    }
}

/* Validates the whole text; the caller frees e->series with exposition_free. */
static void validate(const char *text, size_t len, exposition_t *e) {
    memset(e, 0, sizeof *e);
    cr_assert_eq(strlen(text), len, "length %zu but strlen %zu", len, strlen(text));
    cr_assert_gt(len, 0);
    cr_assert_eq(text[len - 1], '\n', "the exposition must end with a newline");
    const char *p = text;
    while (*p != '\0') {
        const char *nl = strchr(p, '\n');
        cr_assert_not_null(nl);
        size_t n = (size_t)(nl - p);
        char *line = malloc(n + 1);
        cr_assert_not_null(line);
        memcpy(line, p, n);
        line[n] = '\0';
        cr_assert_gt(n, 0, "empty line in the exposition");
        if (strncmp(line, "# HELP ", 7) == 0) {
            const char *q = line + 7;
            char name[NAME_BYTES];
            cr_assert(read_name(&q, name, sizeof name), "bad HELP: %s", line);
            cr_assert(*q == ' ' && q[1] != '\0', "HELP without text: %s", line);
            family_t *f = family_add(e, name);
            cr_assert_not(f->help, "second HELP: %s", line);
            cr_assert_not(f->sampled, "HELP after samples: %s", line);
            f->help = true;
        } else if (strncmp(line, "# TYPE ", 7) == 0) {
            const char *q = line + 7;
            char name[NAME_BYTES];
            cr_assert(read_name(&q, name, sizeof name), "bad TYPE: %s", line);
            cr_assert_eq(*q, ' ', "bad TYPE: %s", line);
            q++;
            cr_assert(strcmp(q, "counter") == 0 || strcmp(q, "gauge") == 0 ||
                          strcmp(q, "histogram") == 0 || strcmp(q, "summary") == 0 ||
                          strcmp(q, "untyped") == 0,
                      "unknown type: %s", line);
            family_t *f = family_add(e, name);
            cr_assert_not(f->typed, "second TYPE: %s", line);
            cr_assert_not(f->sampled, "TYPE after samples: %s", line);
            f->typed = true;
            snprintf(f->type, sizeof f->type, "%s", q);
        } else {
            cr_assert_neq(line[0], '#', "unknown comment line: %s", line);
            validate_sample(e, line);
        }
        free(line);
        p = nl + 1;
    }
    for (int i = 0; i < e->family_count; i++) {
        family_t *f = &e->families[i];
        cr_assert(f->help && f->typed, "family %s lacks HELP or TYPE", f->name);
    }
    for (int i = 0; i < e->series_count; i++) {
        series_t *s = &e->series[i];
        cr_assert(s->saw_inf, "%s{%s} has no le=\"+Inf\" bucket", s->family, s->labels);
        cr_assert(s->has_sum && s->has_count, "%s{%s} lacks _sum or _count", s->family, s->labels);
        cr_assert_eq(s->inf_count, s->count, "%s{%s}: +Inf bucket %g but _count %g", s->family,
                     s->labels, s->inf_count, s->count);
    }
}

static void exposition_free(exposition_t *e) {
    free(e->series);
    e->series = NULL;
}

/* Renders, validates, and returns the text (caller frees). */
static char *render_valid(exposition_t *e) {
    size_t len = 0;
    char *text = kf_metrics_render(&len);
    cr_assert_not_null(text);
    validate(text, len, e);
    return text;
}

/* The value of the sample whose text before the value is exactly `series`,
 * e.g. `keyflow_coordinators` or `x_bucket{le="4"}`; NAN when absent. */
static double sample(const char *text, const char *series) {
    size_t n = strlen(series);
    const char *p = text;
    while (*p != '\0') {
        if (strncmp(p, series, n) == 0 && p[n] == ' ') {
            return strtod(p + n + 1, NULL);
        }
        const char *nl = strchr(p, '\n');
        if (nl == NULL) {
            break;
        }
        p = nl + 1;
    }
    return NAN;
}

static bool has_line(const char *text, const char *line) {
    size_t n = strlen(line);
    for (const char *p = strstr(text, line); p != NULL; p = strstr(p + 1, line)) {
        if ((p == text || p[-1] == '\n') && p[n] == '\n') {
            return true;
        }
    }
    return false;
}

/* ---- tests ------------------------------------------------------------ */

Test(metrics, fresh_rendering_is_valid_and_lists_every_family) {
    exposition_t e;
    char *text = render_valid(&e);
    /* + requests and request latency, + the six process_* families. */
    cr_assert_eq(e.family_count, KF_GAUGE_COUNT + KF_COUNTER_COUNT + KF_HISTOGRAM_COUNT + 2 + 6,
                 "%d families", e.family_count);
    cr_assert(isnan(sample(text, "keyflow_build_info{version=\"0.1.0\",commit=\"x\"}")),
              "no build info before it is set");
    cr_assert(has_line(text, "# TYPE keyflow_engine_queue_depth gauge"));
    cr_assert(has_line(text, "# TYPE keyflow_events_accepted_total counter"));
    cr_assert(has_line(text, "# TYPE keyflow_commit_sync_seconds histogram"));
    cr_assert(has_line(text, "# TYPE keyflow_requests_total counter"));
    cr_assert(has_line(text, "# TYPE keyflow_request_duration_seconds histogram"));
    cr_assert(has_line(text, "# HELP keyflow_coordinators Coordinators held in memory"));
    cr_assert_eq(sample(text, "keyflow_ready"), 0);
    cr_assert_eq(sample(text, "keyflow_commit_group_bytes_count"), 0);
    cr_assert_eq(sample(text, "keyflow_commit_group_bytes_bucket{le=\"+Inf\"}"), 0);
    exposition_free(&e);
    free(text);
}

Test(metrics, build_info_once_set) {
    kf_metrics_set_build_info("1.2.3", "abc123-dirty");
    exposition_t e;
    char *text = render_valid(&e);
    cr_assert(has_line(text, "# TYPE keyflow_build_info gauge"));
    cr_assert(has_line(text, "keyflow_build_info{version=\"1.2.3\",commit=\"abc123-dirty\"} 1"),
              "%s", text);
    exposition_free(&e);
    free(text);
}

/* The standard process metrics, checked against what this process can see
 * of itself: they are read from the kernel at each rendering. */
Test(metrics, process_metrics_describe_this_process) {
    exposition_t e;
    char *text = render_valid(&e);
    cr_assert(has_line(text, "# TYPE process_cpu_seconds_total counter"));
    cr_assert(has_line(text, "# TYPE process_open_fds gauge"));
    cr_assert_geq(sample(text, "process_cpu_seconds_total"), 0);
    double rss = sample(text, "process_resident_memory_bytes");
    cr_assert(rss > 1024 * 1024 && rss < 1e12, "rss %g", rss);
    cr_assert_geq(sample(text, "process_virtual_memory_bytes"), rss);
    /* Three more descriptors open now must show as three more. */
    double fds = sample(text, "process_open_fds");
    cr_assert_geq(fds, 3, "stdin, stdout and stderr at least: %g", fds);
    FILE *extra[3];
    for (int i = 0; i < 3; i++) {
        extra[i] = fopen("/dev/null", "r");
        cr_assert_not_null(extra[i]);
    }
    exposition_free(&e);
    free(text);
    text = render_valid(&e);
    cr_assert_eq(sample(text, "process_open_fds"), fds + 3);
    for (int i = 0; i < 3; i++) {
        fclose(extra[i]);
    }
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    cr_assert_eq(sample(text, "process_max_fds"), (double)rl.rlim_cur);
    /* Started within the last ten minutes (Criterion forks each test). */
    double start_s = sample(text, "process_start_time_seconds");
    double now_s = (double)time(NULL);
    cr_assert(start_s <= now_s + 1 && start_s > now_s - 600, "start %f now %f", start_s, now_s);
    exposition_free(&e);
    free(text);
}

Test(metrics, gauges_set_add_and_render) {
    kf_gauge_set(KF_G_COORDINATORS, 40);
    kf_gauge_add(KF_G_COORDINATORS, 2);
    kf_gauge_set(KF_G_QUEUE_DEPTH, 7);
    kf_gauge_add(KF_G_QUEUE_DEPTH, -10);
    kf_gauge_set(KF_G_READY, 1);
    cr_assert_eq(kf_gauge_get(KF_G_COORDINATORS), 42);
    cr_assert_eq(kf_gauge_get(KF_G_QUEUE_DEPTH), -3);
    exposition_t e;
    char *text = render_valid(&e);
    cr_assert(has_line(text, "keyflow_coordinators 42"));
    cr_assert(has_line(text, "keyflow_engine_queue_depth -3"));
    cr_assert(has_line(text, "keyflow_ready 1"));
    cr_assert(has_line(text, "keyflow_timers 0"));
    exposition_free(&e);
    free(text);
}

Test(metrics, counters_add_and_render) {
    kf_counter_add(KF_C_EVENTS_ACCEPTED, 3);
    kf_counter_add(KF_C_EVENTS_ACCEPTED, 4);
    kf_counter_add(KF_C_GROUPS, 5000000000ULL);
    cr_assert_eq(kf_counter_get(KF_C_EVENTS_ACCEPTED), 7);
    cr_assert_eq(kf_counter_get(KF_C_GROUPS), 5000000000ULL);
    exposition_t e;
    char *text = render_valid(&e);
    cr_assert(has_line(text, "keyflow_events_accepted_total 7"));
    cr_assert(has_line(text, "keyflow_commit_groups_total 5000000000"));
    cr_assert(has_line(text, "keyflow_runs_failed_total 0"));
    exposition_free(&e);
    free(text);
}

Test(metrics, histogram_buckets_are_cumulative) {
    static const double values[] = {0, 1, 1.5, 3, 4, 5000};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        kf_histogram_observe(KF_H_GROUP_COMMANDS, values[i]);
    }
    exposition_t e;
    char *text = render_valid(&e);
    const char *h = "keyflow_commit_group_commands";
    char series[128];
    struct {
        const char *le;
        double count;
    } want[] = {{"1", 2}, {"2", 3}, {"4", 5}, {"8", 5}, {"4096", 5}, {"+Inf", 6}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        snprintf(series, sizeof series, "%s_bucket{le=\"%s\"}", h, want[i].le);
        cr_assert_eq(sample(text, series), want[i].count, "%s = %g", series, sample(text, series));
    }
    snprintf(series, sizeof series, "%s_count", h);
    cr_assert_eq(sample(text, series), 6);
    snprintf(series, sizeof series, "%s_sum", h);
    cr_assert_float_eq(sample(text, series), 5009.5, 1e-9);
    exposition_free(&e);
    free(text);
}

Test(metrics, seconds_histograms_take_microseconds) {
    kf_histogram_observe_us(KF_H_SYNC_SECONDS, 30);
    kf_histogram_observe_us(KF_H_SYNC_SECONDS, 1000);
    kf_histogram_observe_us(KF_H_SYNC_SECONDS, 7000000);
    exposition_t e;
    char *text = render_valid(&e);
    const char *h = "keyflow_commit_sync_seconds";
    char series[128];
    snprintf(series, sizeof series, "%s_bucket{le=\"2.5e-05\"}", h);
    cr_assert_eq(sample(text, series), 0, "%s", series);
    snprintf(series, sizeof series, "%s_bucket{le=\"5e-05\"}", h);
    cr_assert_eq(sample(text, series), 1, "%s", series);
    snprintf(series, sizeof series, "%s_bucket{le=\"0.001\"}", h);
    cr_assert_eq(sample(text, series), 2, "%s", series);
    snprintf(series, sizeof series, "%s_bucket{le=\"5\"}", h);
    cr_assert_eq(sample(text, series), 2, "%s", series);
    snprintf(series, sizeof series, "%s_bucket{le=\"+Inf\"}", h);
    cr_assert_eq(sample(text, series), 3, "%s", series);
    snprintf(series, sizeof series, "%s_sum", h);
    cr_assert_float_eq(sample(text, series), 7.00103, 1e-9);
    exposition_free(&e);
    free(text);
}

/* Each bucket must hold exactly the observations <= its rendered le value,
 * as a Prometheus reader interprets it; checked for every histogram in the
 * table with values on and just past each bucket bound. */
static void check_buckets_match_labels(const char *text, const char *name, const double *values,
                                       size_t count) {
    char prefix[160];
    int n = snprintf(prefix, sizeof prefix, "%s_bucket{le=\"", name);
    const char *p = text;
    int buckets = 0;
    while ((p = strstr(p, prefix)) != NULL) {
        p += n;
        char le[64];
        size_t k = 0;
        while (p[k] != '"' && k + 1 < sizeof le) {
            le[k] = p[k];
            k++;
        }
        le[k] = '\0';
        double bound;
        cr_assert(parse_value(le, &bound));
        double got = strtod(p + k + 2, NULL);
        double want = 0;
        for (size_t i = 0; i < count; i++) {
            want += values[i] <= bound ? 1 : 0;
        }
        cr_assert_eq(got, want, "%s le=\"%s\": bucket holds %g observations, %g are <= %s", name,
                     le, got, want, le);
        buckets++;
    }
    cr_assert_gt(buckets, 1, "no buckets for %s", name);
}

Test(metrics, bucket_counts_agree_with_le_labels) {
    static const double bytes[] = {255,     256,     257,     1048575,  1048576,
                                   1048577, 4194304, 4194305, 16777216, 16777217};
    for (size_t i = 0; i < sizeof bytes / sizeof bytes[0]; i++) {
        kf_histogram_observe(KF_H_GROUP_BYTES, bytes[i]);
    }
    static const double commands[] = {1, 2, 3, 4096, 4097};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        kf_histogram_observe(KF_H_GROUP_COMMANDS, commands[i]);
    }
    exposition_t e;
    char *text = render_valid(&e);
    check_buckets_match_labels(text, "keyflow_commit_group_commands", commands,
                               sizeof commands / sizeof commands[0]);
    check_buckets_match_labels(text, "keyflow_commit_group_bytes", bytes,
                               sizeof bytes / sizeof bytes[0]);
    exposition_free(&e);
    free(text);
}

Test(metrics, method_registration_is_idempotent) {
    int send = kf_metrics_method_register("SendEvent", KF_TRANSPORT_GRPC);
    int poll = kf_metrics_method_register("PollRuns", KF_TRANSPORT_GRPC);
    cr_assert_neq(send, poll);
    cr_assert(send >= 0 && send < KF_METRICS_METHODS_MAX);
    cr_assert(poll >= 0 && poll < KF_METRICS_METHODS_MAX);
    char again[] = "SendEvent"; /* a different pointer, the same name */
    cr_assert_eq(kf_metrics_method_register(again, KF_TRANSPORT_GRPC), send);
    cr_assert_eq(kf_metrics_method_register(again, KF_TRANSPORT_HTTP), send, "one id, both");
}

Test(metrics, requests_by_method_transport_and_code) {
    int send = kf_metrics_method_register("SendEvent", KF_TRANSPORT_GRPC);
    (void)kf_metrics_method_register("SendEvent", KF_TRANSPORT_HTTP);
    int poll = kf_metrics_method_register("PollRuns", KF_TRANSPORT_HTTP);
    int stream = kf_metrics_method_register("TailOutput", KF_TRANSPORT_GRPC);
    kf_metrics_request(send, KF_TRANSPORT_GRPC, 0, 120);
    kf_metrics_request(send, KF_TRANSPORT_GRPC, 0, 80);
    kf_metrics_request(send, KF_TRANSPORT_GRPC, 3, 40);
    kf_metrics_request(send, KF_TRANSPORT_HTTP, 8, 2000000);
    kf_metrics_request(poll, KF_TRANSPORT_HTTP, 5, 10);
    kf_metrics_request(stream, KF_TRANSPORT_HTTP, 0, 10); /* not served there: not counted */
    exposition_t e;
    char *text = render_valid(&e);
    cr_assert(has_line(text, "keyflow_requests_total{method=\"SendEvent\",transport=\"grpc\","
                             "code=\"OK\"} 2"));
    cr_assert(has_line(text, "keyflow_requests_total{method=\"SendEvent\",transport=\"grpc\","
                             "code=\"INVALID_ARGUMENT\"} 1"));
    cr_assert(has_line(text, "keyflow_requests_total{method=\"SendEvent\",transport=\"http\","
                             "code=\"RESOURCE_EXHAUSTED\"} 1"));
    cr_assert(has_line(text, "keyflow_requests_total{method=\"PollRuns\",transport=\"http\","
                             "code=\"NOT_FOUND\"} 1"));
    cr_assert_null(strstr(text, "method=\"PollRuns\",transport=\"grpc\",code="),
                   "codes never seen are not rendered");
    cr_assert_eq(sample(text, "keyflow_request_duration_seconds_count{method=\"SendEvent\","
                              "transport=\"grpc\"}"),
                 3);
    cr_assert_float_eq(sample(text, "keyflow_request_duration_seconds_sum{method=\"SendEvent\","
                                    "transport=\"grpc\"}"),
                       0.00024, 1e-12);
    cr_assert_eq(sample(text, "keyflow_request_duration_seconds_bucket{method=\"SendEvent\","
                              "transport=\"grpc\",le=\"5e-05\"}"),
                 1);
    cr_assert_eq(sample(text, "keyflow_request_duration_seconds_bucket{method=\"SendEvent\","
                              "transport=\"http\",le=\"1\"}"),
                 0);
    cr_assert_eq(sample(text, "keyflow_request_duration_seconds_count{method=\"SendEvent\","
                              "transport=\"http\"}"),
                 1);
    cr_assert_eq(sample(text, "keyflow_request_duration_seconds_count{method=\"PollRuns\","
                              "transport=\"http\"}"),
                 1);
    /* A latency series for each (method, transport) a front end serves, and
     * no other: SendEvent over both, PollRuns over HTTP, TailOutput over
     * gRPC (PollRuns over gRPC was not registered here). */
    int request_series = 0;
    for (int i = 0; i < e.series_count; i++) {
        request_series += strcmp(e.series[i].family, "keyflow_request_duration_seconds") == 0;
    }
    cr_assert_eq(request_series, 4);
    cr_assert_null(strstr(text, "method=\"TailOutput\",transport=\"http\""));
    cr_assert_null(strstr(text, "method=\"PollRuns\",transport=\"grpc\""));
    cr_assert_eq(sample(text, "keyflow_request_duration_seconds_count{method=\"TailOutput\","
                              "transport=\"grpc\"}"),
                 0);
    exposition_free(&e);
    free(text);
}

Test(metrics, requests_with_bad_method_or_code_are_ignored) {
    int send = kf_metrics_method_register("SendEvent", KF_TRANSPORT_GRPC);
    kf_metrics_request(send + 1, KF_TRANSPORT_GRPC, 0, 1);
    kf_metrics_request(-1, KF_TRANSPORT_GRPC, 0, 1);
    kf_metrics_request(send, KF_TRANSPORT_GRPC, 17, 1);
    kf_metrics_request(send, KF_TRANSPORT_GRPC, -1, 1);
    exposition_t e;
    char *text = render_valid(&e);
    cr_assert_null(strstr(text, "keyflow_requests_total{"), "an ignored request was counted");
    cr_assert_eq(sample(text, "keyflow_request_duration_seconds_count{method=\"SendEvent\","
                              "transport=\"grpc\"}"),
                 0);
    exposition_free(&e);
    free(text);
}

/* Many methods make the exposition far larger than the renderer's first
 * buffer; it must grow and stay valid. */
Test(metrics, large_renderings_stay_valid) {
    static char names[KF_METRICS_METHODS_MAX][24];
    for (int i = 0; i < KF_METRICS_METHODS_MAX; i++) {
        snprintf(names[i], sizeof names[i], "Method%02d", i);
        int id = kf_metrics_method_register(names[i], KF_TRANSPORT_GRPC);
        cr_assert_eq(kf_metrics_method_register(names[i], KF_TRANSPORT_HTTP), id);
        cr_assert_eq(id, i);
        for (int code = 0; code < 17; code++) {
            kf_metrics_request(id, KF_TRANSPORT_GRPC, code, 100 * code);
            kf_metrics_request(id, KF_TRANSPORT_HTTP, code, 1000 * code);
        }
    }
    exposition_t e;
    char *text = render_valid(&e);
    cr_assert_gt(strlen(text), 65536);
    cr_assert(has_line(text, "keyflow_requests_total{method=\"Method63\",transport=\"http\","
                             "code=\"UNAUTHENTICATED\"} 1"));
    cr_assert_eq(sample(text, "keyflow_request_duration_seconds_count{method=\"Method63\","
                              "transport=\"http\"}"),
                 17);
    exposition_free(&e);
    free(text);
}

Test(metrics, too_many_methods_asserts, .signal = SIGABRT) {
    static char names[KF_METRICS_METHODS_MAX + 1][24];
    for (int i = 0; i <= KF_METRICS_METHODS_MAX; i++) {
        snprintf(names[i], sizeof names[i], "M%d", i);
        (void)kf_metrics_method_register(names[i], KF_TRANSPORT_GRPC);
    }
}

/* "Zeroes everything": gauges, counters, histograms and request metrics. */
Test(metrics, reset_zeroes_everything) {
    int send = kf_metrics_method_register("SendEvent", KF_TRANSPORT_GRPC);
    kf_gauge_set(KF_G_TIMERS, 9);
    kf_counter_add(KF_C_RUNS_CREATED, 9);
    kf_histogram_observe(KF_H_GROUP_BYTES, 9);
    kf_metrics_request(send, KF_TRANSPORT_GRPC, 0, 9);
    kf_metrics_reset();
    cr_assert_eq(kf_gauge_get(KF_G_TIMERS), 0);
    cr_assert_eq(kf_counter_get(KF_C_RUNS_CREATED), 0);
    exposition_t e;
    char *text = render_valid(&e);
    cr_assert(has_line(text, "keyflow_timers 0"));
    cr_assert(has_line(text, "keyflow_runs_created_total 0"));
    cr_assert_eq(sample(text, "keyflow_commit_group_bytes_count"), 0);
    cr_assert_eq(sample(text, "keyflow_commit_group_bytes_sum"), 0);
    cr_assert_null(strstr(text, "keyflow_requests_total{"), "request counts survive a reset");
    cr_assert_eq(sample(text, "keyflow_request_duration_seconds_count{method=\"SendEvent\","
                              "transport=\"grpc\"}"),
                 0, "request latency survives a reset");
    exposition_free(&e);
    free(text);
}
