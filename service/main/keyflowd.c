/*
 * keyflowd.c - the keyflow server: one process, one embedded RocksDB, the
 * engine, the gRPC front end and the HTTP gateway.
 *
 * Start-up: open the store, recover the engine, bind both ports (port 0
 * picks a free one; --port-file reports them), start serving.
 * SIGTERM/SIGINT, a rollout's order:
 *   1. readiness goes NOT_SERVING (gRPC Health/Check and Watch, /readyz),
 *   2. for --drain-grace-ms both listeners stay open and every request is
 *      served as usual, so that load balancers stop sending new ones first,
 *   3. then stop accepting (gRPC and HTTP), let the engine finish and sync
 *      everything it accepted, answer those calls, close the store, exit 0.
 * A second SIGTERM/SIGINT during the grace ends it early.
 * A failed sync (fail-stop): NOT_SERVING at once with the reason logged,
 * no grace, nothing more acknowledged (calls in flight are answered
 * "storage failure: <what>, stopping"), exit 1.
 * SIGHUP: re-read the TLS files; new connections get the new certificate,
 * open ones keep theirs. A reload that fails changes nothing.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/health.h"
#include "base/limits.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/sysmem.h"
#include "base/trim.h"
#include "base/version.h"
#include "runtime/partitions.h"
#include "http/gateway.h"
#include "main/notify.h"
#include "rpc/grpc_server.h"
#include "auth/auth.h"
#include "storage/store.h"
#include "tls/tls.h"

#define DEFAULT_DATA_DIR     "./data"
#define DEFAULT_GRPC_ADDRESS "127.0.0.1:50051"
#define DEFAULT_HTTP_ADDRESS "127.0.0.1:8070"
/* How long a fail-stop waits for Watch streams to carry NOT_SERVING out. */
#define FAIL_STOP_WATCH_FLUSH_MS 1000

typedef struct options {
    const char *data_dir;
    const char *grpc_address;
    const char *http_address;
    const char *probe_address; /* NULL: no probe listener */
    int64_t http_connections_per_address;
    int64_t http_header_timeout_ms;
    int64_t http_body_timeout_ms;
    const char *port_file;
    const char *plugin_dir;
    kf_tls_files_t tls; /* cert_path NULL: plaintext */
    bool auth_required; /* --auth: API keys even on loopback */
    bool no_auth;       /* --insecure-no-auth */
    bool new_admin_key; /* --new-admin-key */
    const char *bootstrap_key_file;
    const char *admin_key_file; /* --admin-key-file: the operator's admin key */
    int64_t retention_ms;
    int64_t attempts_max;
    int64_t queue_depth;
    int64_t disk_reserve_bytes;
    int grpc_threads;
    kf_log_level_t log_level;
    kf_log_format_t log_format;
    int64_t drain_grace_ms;
    int64_t output_retention_ms; /* --output-retention-*: 0 = no bound */
    int64_t output_retention_rows;
    int64_t output_retention_bytes;
    int64_t producer_idle_expiry_ms; /* --producer-idle-expiry-ms */
    int64_t partition_count;         /* --partition-count; 0: the data set's */
    const char *partitions;          /* --partitions; NULL: all (or the node's) */
    const char *placement_file;      /* --placement */
    const char *node;                /* --node */
    int64_t memory_budget_bytes;     /* --memory-budget; 0: derive the default */
    int64_t replay_batches;          /* --replay-batches */
    int64_t replay_bytes;            /* --replay-bytes */
    int64_t grpc_request_bytes_held; /* --grpc-request-bytes-held */
} options_t;

/* Numeric flags of the engine's retention: each is also read from its
 * environment variable, and checked against its range either way. */
typedef struct number_flag {
    const char *flag;
    const char *env;
    bool bytes; /* a byte count: digits, optionally followed by KiB, MiB or GiB */
    int64_t lo;
    int64_t hi;
    int64_t *value;
} number_flag_t;

#define NUMBER_FLAGS 8

static void number_flags(options_t *o, number_flag_t out[NUMBER_FLAGS]) {
    out[0] = (number_flag_t){"--output-retention-ms",    "KEYFLOW_OUTPUT_RETENTION_MS", false, 0,
                             KF_OUTPUT_RETENTION_MS_MAX, &o->output_retention_ms};
    out[1] = (number_flag_t){
        "--output-retention-rows", "KEYFLOW_OUTPUT_RETENTION_ROWS", false, 0, INT64_MAX,
        &o->output_retention_rows};
    out[2] = (number_flag_t){
        "--output-retention-bytes", "KEYFLOW_OUTPUT_RETENTION_BYTES", true, 0, INT64_MAX,
        &o->output_retention_bytes};
    out[3] =
        (number_flag_t){"--producer-idle-expiry-ms",    "KEYFLOW_PRODUCER_IDLE_EXPIRY_MS", false, 1,
                        KF_PRODUCER_IDLE_EXPIRY_MS_MAX, &o->producer_idle_expiry_ms};
    out[4] = (number_flag_t){
        "--memory-budget",          "KEYFLOW_MEMORY_BUDGET",    true,
        KF_MEMORY_BUDGET_BYTES_MIN, KF_MEMORY_BUDGET_BYTES_MAX, &o->memory_budget_bytes};
    out[5] = (number_flag_t){"--replay-batches",    "KEYFLOW_REPLAY_BATCHES", false, 0,
                             KF_REPLAY_BATCHES_MAX, &o->replay_batches};
    out[6] = (number_flag_t){"--replay-bytes",    "KEYFLOW_REPLAY_BYTES", true, 1,
                             KF_REPLAY_BYTES_MAX, &o->replay_bytes};
    out[7] = (number_flag_t){"--grpc-request-bytes-held",
                             "KEYFLOW_GRPC_REQUEST_BYTES_HELD",
                             true,
                             KF_GRPC_REQUEST_BYTES_HELD_MIN,
                             KF_GRPC_REQUEST_BYTES_HELD_MAX,
                             &o->grpc_request_bytes_held};
}

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: keyflowd [options]\n"
        "  --data DIR            data directory (default " DEFAULT_DATA_DIR ", env KEYFLOW_DATA)\n"
        "  --partition-count N   partitions of a new data set (default %d, max %d); an\n"
        "                        existing data set keeps its own (docs/scaling.md)\n"
        "  --partitions SET      the partitions this process serves: \"all\" (default) or\n"
        "                        a list such as 0-3,6; a call for another one's key fails\n"
        "                        FAILED_PRECONDITION naming its owner\n"
        "  --placement FILE      which node serves which partitions, and where (names the\n"
        "                        owners of partitions served elsewhere)\n"
        "  --node NAME           this process's node in --placement: serves its partitions\n"
        "  --grpc HOST:PORT      gRPC address (default " DEFAULT_GRPC_ADDRESS
        ", env KEYFLOW_GRPC_ADDRESS; port 0 = any)\n"
        "  --http HOST:PORT      HTTP gateway address (default " DEFAULT_HTTP_ADDRESS
        ", env KEYFLOW_HTTP_ADDRESS)\n"
        "  --probe-address HOST:PORT  a listener of its own for GET /healthz, /readyz and\n"
        "                        /metrics only (its own thread and connections), for\n"
        "                        probes that must be answered whatever clients do; TLS\n"
        "                        with the same certificate, but never a client\n"
        "                        certificate (not even with --tls-client-ca)\n"
        "  --port-file FILE      write \"grpc=PORT\\nhttp=PORT\\n\" (and \"probe=PORT\\n\") once\n"
        "                        listening\n"
        "  --http-connections-per-address N  HTTP connections one client address may hold\n"
        "                        (default %d, max %d; raise it behind a proxy)\n"
        "  --http-header-timeout-ms N  close an HTTP connection that sends no complete\n"
        "                        request head for N ms (default %d, %d..%d)\n"
        "  --http-body-timeout-ms N  ... no complete request, body included (default %d,\n"
        "                        at most %d)\n"
        "  --plugin-dir DIR      directory of native handler .so files (env KEYFLOW_PLUGIN_DIR)\n"
        "  --run-retention-ms N  keep finished runs this long (default %lld)\n"
        "  --run-attempts N      leases per run before it FAILS (default %d, max %d)\n"
        "  --queue-depth N       engine queue bound (default and max %d)\n"
        "  --grpc-threads N      completion-queue threads (default 1)\n"
        "  --grpc-request-bytes-held BYTES  request bytes of gRPC calls not yet answered:\n"
        "                        a call past it is refused RESOURCE_EXHAUSTED, unless it is\n"
        "                        the only one (default 128MiB; suffixes KiB, MiB, GiB)\n"
        "  --disk-reserve BYTES  free space kept on the data directory's filesystem: below\n"
        "                        it new events, batches and functions are refused (HTTP 507)\n"
        "                        while reads, completions and deletions go on (default\n"
        "                        256MiB; suffixes KiB, MiB, GiB; at least 1MiB)\n"
        "  --output-retention-ms N  keep function output rows this long (default %lld,\n"
        "                        a week; 0 = no age bound); a descriptor's output_retention\n"
        "                        overrides each bound it sets\n"
        "  --output-retention-rows N  keep at most the newest N output rows per function\n"
        "                        (default 0 = no bound)\n"
        "  --output-retention-bytes BYTES  keep at most this many stored bytes of output per\n"
        "                        function (default 0 = no bound; suffixes KiB, MiB, GiB)\n"
        "  --memory-budget BYTES the engine's tables (windows, runs, keys, producers,\n"
        "                        functions) in estimated bytes: a new one that would pass it\n"
        "                        is refused RESOURCE_EXHAUSTED (HTTP 429) while existing ones\n"
        "                        keep working (default: half the cgroup's memory limit, else\n"
        "                        half the machine's memory; suffixes KiB, MiB, GiB)\n"
        "  --replay-batches N    input batches kept per REPLAY_SAFE function for ReplayBatch,\n"
        "                        in memory (default %d, max %d; 0 = none)\n"
        "  --replay-bytes BYTES  memory those kept batches may hold in all (shared by the\n"
        "                        partitions), the oldest forgotten first, and only in the\n"
        "                        room the tables leave in --memory-budget (default 64MiB,\n"
        "                        at most 1GiB)\n"
        "  --producer-idle-expiry-ms N  forget a producer (its sequence and kept acks) when\n"
        "                        no batch used it for N ms (default %lld, a week)\n"
        "  --log-level LEVEL     debug (adds a line per request), info (lifecycle events),\n"
        "                        warn, error (default info)\n"
        "  --log-format FORMAT   text or json (one object per line: ts, level, module, msg,\n"
        "                        fields) on stderr (default text)\n"
        "  --tls-cert FILE       PEM certificate chain: TLS on both listeners (needs --tls-key)\n"
        "  --tls-key FILE        PEM private key of --tls-cert\n"
        "  --tls-client-ca FILE  PEM CAs: clients must present a certificate they signed (mTLS)\n"
        "  --drain-grace-ms N    on SIGTERM, report NOT_SERVING and keep serving for N ms\n"
        "                        before stopping (default 0, max %lld)\n"
        "  --version             print the version and source commit, then exit\n"
        "  --auth                require API keys even when both listeners are loopback\n"
        "  --insecure-no-auth    serve without API keys on a non-loopback listener (logged)\n"
        "  --bootstrap-key-file FILE  where the first admin API key is written\n"
        "                        (default DATA/bootstrap-admin.key, mode 0600)\n"
        "  --new-admin-key       write a new admin key to the bootstrap file at start\n"
        "  --admin-key-file FILE the first admin key, made by the operator, instead of a new\n"
        "                        one in the bootstrap file (a Kubernetes or compose secret)\n"
        "API keys are required whenever a listener is not loopback (docs/security.md).\n"
        "SIGHUP re-reads the TLS files (new connections get the new certificate).\n"
        "Each flag also reads an environment variable: KEYFLOW_DATA, KEYFLOW_PARTITION_COUNT,\n"
        "KEYFLOW_PARTITIONS, KEYFLOW_PLACEMENT, KEYFLOW_NODE, KEYFLOW_GRPC_ADDRESS,\n"
        "KEYFLOW_HTTP_ADDRESS, KEYFLOW_PROBE_ADDRESS, KEYFLOW_PORT_FILE, KEYFLOW_PLUGIN_DIR,\n"
        "KEYFLOW_HTTP_CONNECTIONS_PER_ADDRESS, KEYFLOW_HTTP_HEADER_TIMEOUT_MS,\n"
        "KEYFLOW_HTTP_BODY_TIMEOUT_MS, KEYFLOW_RUN_RETENTION_MS,\n"
        "KEYFLOW_RUN_ATTEMPTS, KEYFLOW_QUEUE_DEPTH, KEYFLOW_GRPC_THREADS, KEYFLOW_DISK_RESERVE,\n"
        "KEYFLOW_OUTPUT_RETENTION_MS, KEYFLOW_OUTPUT_RETENTION_ROWS,\n"
        "KEYFLOW_OUTPUT_RETENTION_BYTES, KEYFLOW_PRODUCER_IDLE_EXPIRY_MS, KEYFLOW_MEMORY_BUDGET,\n"
        "KEYFLOW_REPLAY_BATCHES, KEYFLOW_REPLAY_BYTES, KEYFLOW_GRPC_REQUEST_BYTES_HELD,\n"
        "KEYFLOW_LOG_LEVEL, KEYFLOW_LOG_FORMAT, KEYFLOW_DRAIN_GRACE_MS, KEYFLOW_SERVER_TLS_CERT,\n"
        "KEYFLOW_SERVER_TLS_KEY, KEYFLOW_SERVER_TLS_CLIENT_CA, KEYFLOW_AUTH=1,\n"
        "KEYFLOW_INSECURE_NO_AUTH=1, KEYFLOW_BOOTSTRAP_KEY_FILE, KEYFLOW_ADMIN_KEY_FILE.\n",
        KF_PARTITION_COUNT_DEFAULT, KF_PARTITION_COUNT_MAX, KF_HTTP_CONNECTIONS_PER_ADDRESS_DEFAULT,
        KF_HTTP_CONNECTIONS_MAX, KF_HTTP_HEADER_TIMEOUT_MS_DEFAULT, KF_HTTP_TIMEOUT_MS_MIN,
        KF_HTTP_HEADER_TIMEOUT_MS_MAX, KF_HTTP_BODY_TIMEOUT_MS_DEFAULT, KF_HTTP_BODY_TIMEOUT_MS_MAX,
        (long long)KF_RETENTION_MS_DEFAULT, KF_RUN_ATTEMPTS_DEFAULT, KF_RUN_ATTEMPTS_MAX,
        KF_QUEUE_DEPTH_MAX, (long long)KF_OUTPUT_RETENTION_MS_DEFAULT, KF_REPLAY_BATCHES_DEFAULT,
        KF_REPLAY_BATCHES_MAX, (long long)KF_PRODUCER_IDLE_EXPIRY_MS_DEFAULT,
        (long long)KF_DRAIN_GRACE_MS_MAX);
}

static const char *env_or(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : fallback;
}

static bool parse_int(const char *flag, const char *text, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "keyflowd: %s must be an integer in %lld..%lld, got %s\n", flag,
                (long long)lo, (long long)hi, text);
        return false;
    }
    *out = v;
    return true;
}

/* A byte count: digits, optionally followed by KiB, MiB or GiB. */
static bool parse_bytes(const char *flag, const char *text, int64_t lo, int64_t hi, int64_t *out) {
    static const struct {
        const char *suffix;
        int shift;
    } units[] = {{"", 0}, {"KiB", 10}, {"MiB", 20}, {"GiB", 30}};
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    for (size_t i = 0; errno == 0 && end != text && v >= 0 && i < sizeof units / sizeof units[0];
         i++) {
        if (strcmp(end, units[i].suffix) == 0 && v <= (INT64_MAX >> units[i].shift)) {
            int64_t bytes = (int64_t)v << units[i].shift;
            if (bytes >= lo && bytes <= hi) {
                *out = bytes;
                return true;
            }
        }
    }
    fprintf(stderr,
            "keyflowd: %s must be a byte count in %lld..%lld (a number, optionally followed "
            "by KiB, MiB or GiB), got %s\n",
            flag, (long long)lo, (long long)hi, text);
    return false;
}

static bool parse_level(const char *v, kf_log_level_t *out) {
    if (!kf_log_level_parse(v, out)) {
        fprintf(stderr, "keyflowd: log level must be debug, info, warn or error, got %s\n", v);
        return false;
    }
    return true;
}

static bool parse_format(const char *v, kf_log_format_t *out) {
    if (!kf_log_format_parse(v, out)) {
        fprintf(stderr, "keyflowd: log format must be text or json, got %s\n", v);
        return false;
    }
    return true;
}

static bool parse_number(const number_flag_t *f, const char *name, const char *text) {
    return f->bytes ? parse_bytes(name, text, f->lo, f->hi, f->value)
                    : parse_int(name, text, f->lo, f->hi, f->value);
}

/* The number flag named `a`, or NULL. */
static const number_flag_t *find_number_flag(options_t *o, const char *a,
                                             number_flag_t numbers[NUMBER_FLAGS]) {
    number_flags(o, numbers);
    for (size_t i = 0; i < NUMBER_FLAGS; i++) {
        if (strcmp(a, numbers[i].flag) == 0) {
            return &numbers[i];
        }
    }
    return NULL;
}

/* A switch's variable: set to anything but "" or "0". */
static bool env_switch(const char *name) {
    const char *v = env_or(name, NULL);
    return v != NULL && strcmp(v, "0") != 0;
}

/* Every flag also has an environment variable (containers, systemd units);
 * flags win over the environment. */
static bool parse_env(options_t *o) {
    int64_t n;
    const char *v;
    o->data_dir = env_or("KEYFLOW_DATA", DEFAULT_DATA_DIR);
    o->grpc_address = env_or("KEYFLOW_GRPC_ADDRESS", DEFAULT_GRPC_ADDRESS);
    o->http_address = env_or("KEYFLOW_HTTP_ADDRESS", DEFAULT_HTTP_ADDRESS);
    o->probe_address = env_or("KEYFLOW_PROBE_ADDRESS", NULL);
    o->plugin_dir = env_or("KEYFLOW_PLUGIN_DIR", NULL);
    o->port_file = env_or("KEYFLOW_PORT_FILE", NULL);
    /* KEYFLOW_TLS_* are the clients' variables (their CA, their own
     * certificate); the server's have SERVER in the name so that a CLI run
     * beside keyflowd never mistakes the server's key for its own. */
    o->tls.cert_path = env_or("KEYFLOW_SERVER_TLS_CERT", NULL);
    o->tls.key_path = env_or("KEYFLOW_SERVER_TLS_KEY", NULL);
    o->tls.client_ca_path = env_or("KEYFLOW_SERVER_TLS_CLIENT_CA", NULL);
    o->auth_required = env_switch("KEYFLOW_AUTH");
    o->no_auth = env_switch("KEYFLOW_INSECURE_NO_AUTH");
    o->bootstrap_key_file = env_or("KEYFLOW_BOOTSTRAP_KEY_FILE", NULL);
    o->admin_key_file = env_or("KEYFLOW_ADMIN_KEY_FILE", NULL);
    o->partitions = env_or("KEYFLOW_PARTITIONS", NULL);
    o->placement_file = env_or("KEYFLOW_PLACEMENT", NULL);
    o->node = env_or("KEYFLOW_NODE", NULL);
    if ((v = env_or("KEYFLOW_PARTITION_COUNT", NULL)) != NULL &&
        !parse_int("KEYFLOW_PARTITION_COUNT", v, 1, KF_PARTITION_COUNT_MAX, &o->partition_count))
        return false;
    o->log_level = KF_LOG_INFO;
    o->log_format = KF_LOG_FORMAT_TEXT;
    o->grpc_threads = 1;
    if ((v = env_or("KEYFLOW_LOG_LEVEL", NULL)) != NULL && !parse_level(v, &o->log_level))
        return false;
    if ((v = env_or("KEYFLOW_LOG_FORMAT", NULL)) != NULL && !parse_format(v, &o->log_format))
        return false;
    if ((v = env_or("KEYFLOW_DRAIN_GRACE_MS", NULL)) != NULL &&
        !parse_int("KEYFLOW_DRAIN_GRACE_MS", v, 0, KF_DRAIN_GRACE_MS_MAX, &o->drain_grace_ms))
        return false;
    if ((v = env_or("KEYFLOW_RUN_RETENTION_MS", NULL)) != NULL &&
        !parse_int("KEYFLOW_RUN_RETENTION_MS", v, 1000, KF_RETENTION_MS_MAX, &o->retention_ms))
        return false;
    if ((v = env_or("KEYFLOW_RUN_ATTEMPTS", NULL)) != NULL &&
        !parse_int("KEYFLOW_RUN_ATTEMPTS", v, 1, KF_RUN_ATTEMPTS_MAX, &o->attempts_max))
        return false;
    if ((v = env_or("KEYFLOW_QUEUE_DEPTH", NULL)) != NULL &&
        !parse_int("KEYFLOW_QUEUE_DEPTH", v, 1, KF_QUEUE_DEPTH_MAX, &o->queue_depth))
        return false;
    if ((v = env_or("KEYFLOW_HTTP_CONNECTIONS_PER_ADDRESS", NULL)) != NULL &&
        !parse_int("KEYFLOW_HTTP_CONNECTIONS_PER_ADDRESS", v, 1, KF_HTTP_CONNECTIONS_MAX,
                   &o->http_connections_per_address))
        return false;
    if ((v = env_or("KEYFLOW_HTTP_HEADER_TIMEOUT_MS", NULL)) != NULL &&
        !parse_int("KEYFLOW_HTTP_HEADER_TIMEOUT_MS", v, KF_HTTP_TIMEOUT_MS_MIN,
                   KF_HTTP_HEADER_TIMEOUT_MS_MAX, &o->http_header_timeout_ms))
        return false;
    if ((v = env_or("KEYFLOW_HTTP_BODY_TIMEOUT_MS", NULL)) != NULL &&
        !parse_int("KEYFLOW_HTTP_BODY_TIMEOUT_MS", v, KF_HTTP_TIMEOUT_MS_MIN,
                   KF_HTTP_BODY_TIMEOUT_MS_MAX, &o->http_body_timeout_ms))
        return false;
    if ((v = env_or("KEYFLOW_DISK_RESERVE", NULL)) != NULL &&
        !parse_bytes("KEYFLOW_DISK_RESERVE", v, KF_DISK_RESERVE_BYTES_MIN,
                     KF_DISK_RESERVE_BYTES_MAX, &o->disk_reserve_bytes))
        return false;
    if ((v = env_or("KEYFLOW_GRPC_THREADS", NULL)) != NULL) {
        if (!parse_int("KEYFLOW_GRPC_THREADS", v, 1, 8, &n))
            return false;
        o->grpc_threads = (int)n;
    }
    o->output_retention_ms = KF_OUTPUT_RETENTION_MS_DEFAULT;
    o->producer_idle_expiry_ms = KF_PRODUCER_IDLE_EXPIRY_MS_DEFAULT;
    o->replay_batches = KF_REPLAY_BATCHES_DEFAULT;
    o->replay_bytes = KF_REPLAY_BYTES_DEFAULT;
    o->grpc_request_bytes_held = KF_GRPC_REQUEST_BYTES_HELD_DEFAULT;
    number_flag_t numbers[NUMBER_FLAGS];
    number_flags(o, numbers);
    for (size_t i = 0; i < NUMBER_FLAGS; i++) {
        if ((v = env_or(numbers[i].env, NULL)) != NULL &&
            !parse_number(&numbers[i], numbers[i].env, v))
            return false;
    }
    return true;
}

static bool known_flag(const char *a) {
    static const char *const flags[] = {
        "--data",
        "--grpc",
        "--http",
        "--port-file",
        "--plugin-dir",
        "--run-retention-ms",
        "--run-attempts",
        "--queue-depth",
        "--grpc-threads",
        "--log-level",
        "--log-format",
        "--drain-grace-ms",
        "--tls-cert",
        "--tls-key",
        "--tls-client-ca",
        "--bootstrap-key-file",
        "--disk-reserve",
        "--admin-key-file",
        "--probe-address",
        "--http-connections-per-address",
        "--http-header-timeout-ms",
        "--http-body-timeout-ms",
        "--partition-count",
        "--partitions",
        "--placement",
        "--node",
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        if (strcmp(a, flags[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* Flags without a value. */
static bool parse_switch(const char *a, options_t *o) {
    if (strcmp(a, "--auth") == 0) {
        o->auth_required = true;
    } else if (strcmp(a, "--insecure-no-auth") == 0) {
        o->no_auth = true;
    } else if (strcmp(a, "--new-admin-key") == 0) {
        o->new_admin_key = true;
    } else {
        return false;
    }
    return true;
}

/* "host:port" or "[v6]:port" with a non-empty host and a decimal port in
 * 0..65535: checked here, so a typo is a usage error (exit 2, which the
 * systemd unit does not restart) before any storage is opened. */
static bool check_address(const char *what, const char *address) {
    const char *colon = strrchr(address, ':');
    const char *port = colon ? colon + 1 : "";
    size_t digits = strspn(port, "0123456789");
    bool ok = colon != NULL && colon != address && digits > 0 && digits <= 5 &&
              port[digits] == '\0' && atol(port) <= 65535;
    if (!ok) {
        fprintf(stderr, "keyflowd: %s: expected host:port with a port in 0..65535, got \"%s\"\n",
                what, address);
    }
    return ok;
}

static bool parse_args(int argc, char **argv, options_t *o) {
    if (!parse_env(o)) {
        return false;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        if (strcmp(a, "--version") == 0) {
            printf("keyflowd %s (commit %s)\n", kf_version(), kf_version_commit());
            exit(0);
        }
        if (parse_switch(a, o)) {
            continue;
        }
        number_flag_t numbers[NUMBER_FLAGS];
        const number_flag_t *number = find_number_flag(o, a, numbers);
        if (number != NULL) {
            if (v == NULL || !parse_number(number, a, v)) {
                if (v == NULL)
                    fprintf(stderr, "keyflowd: %s needs a value\n", a);
                return false;
            }
            i++;
            continue;
        }
        if (!known_flag(a)) {
            fprintf(stderr, "keyflowd: unknown option %s\n", a);
            usage(stderr);
            return false;
        }
        if (v == NULL) {
            fprintf(stderr, "keyflowd: %s needs a value\n", a);
            return false;
        }
        i++;
        if (strcmp(a, "--data") == 0) {
            o->data_dir = v;
        } else if (strcmp(a, "--grpc") == 0) {
            o->grpc_address = v;
        } else if (strcmp(a, "--http") == 0) {
            o->http_address = v;
        } else if (strcmp(a, "--probe-address") == 0) {
            o->probe_address = v;
        } else if (strcmp(a, "--http-connections-per-address") == 0) {
            if (!parse_int(a, v, 1, KF_HTTP_CONNECTIONS_MAX, &o->http_connections_per_address))
                return false;
        } else if (strcmp(a, "--http-header-timeout-ms") == 0) {
            if (!parse_int(a, v, KF_HTTP_TIMEOUT_MS_MIN, KF_HTTP_HEADER_TIMEOUT_MS_MAX,
                           &o->http_header_timeout_ms))
                return false;
        } else if (strcmp(a, "--http-body-timeout-ms") == 0) {
            if (!parse_int(a, v, KF_HTTP_TIMEOUT_MS_MIN, KF_HTTP_BODY_TIMEOUT_MS_MAX,
                           &o->http_body_timeout_ms))
                return false;
        } else if (strcmp(a, "--port-file") == 0) {
            o->port_file = v;
        } else if (strcmp(a, "--plugin-dir") == 0) {
            o->plugin_dir = v;
        } else if (strcmp(a, "--run-retention-ms") == 0) {
            if (!parse_int(a, v, 1000, KF_RETENTION_MS_MAX, &o->retention_ms))
                return false;
        } else if (strcmp(a, "--run-attempts") == 0) {
            if (!parse_int(a, v, 1, KF_RUN_ATTEMPTS_MAX, &o->attempts_max))
                return false;
        } else if (strcmp(a, "--queue-depth") == 0) {
            if (!parse_int(a, v, 1, KF_QUEUE_DEPTH_MAX, &o->queue_depth))
                return false;
        } else if (strcmp(a, "--grpc-threads") == 0) {
            if (!parse_int(a, v, 1, 8, &n))
                return false;
            o->grpc_threads = (int)n;
        } else if (strcmp(a, "--disk-reserve") == 0) {
            if (!parse_bytes(a, v, KF_DISK_RESERVE_BYTES_MIN, KF_DISK_RESERVE_BYTES_MAX,
                             &o->disk_reserve_bytes))
                return false;
        } else if (strcmp(a, "--log-level") == 0) {
            if (!parse_level(v, &o->log_level))
                return false;
        } else if (strcmp(a, "--tls-cert") == 0) {
            o->tls.cert_path = v;
        } else if (strcmp(a, "--tls-key") == 0) {
            o->tls.key_path = v;
        } else if (strcmp(a, "--tls-client-ca") == 0) {
            o->tls.client_ca_path = v;
        } else if (strcmp(a, "--log-format") == 0) {
            if (!parse_format(v, &o->log_format))
                return false;
        } else if (strcmp(a, "--drain-grace-ms") == 0) {
            if (!parse_int(a, v, 0, KF_DRAIN_GRACE_MS_MAX, &o->drain_grace_ms))
                return false;
        } else if (strcmp(a, "--partition-count") == 0) {
            if (!parse_int(a, v, 1, KF_PARTITION_COUNT_MAX, &o->partition_count))
                return false;
        } else if (strcmp(a, "--partitions") == 0) {
            o->partitions = v;
        } else if (strcmp(a, "--placement") == 0) {
            o->placement_file = v;
        } else if (strcmp(a, "--node") == 0) {
            o->node = v;
        } else if (strcmp(a, "--bootstrap-key-file") == 0) {
            o->bootstrap_key_file = v;
        } else if (strcmp(a, "--admin-key-file") == 0) {
            o->admin_key_file = v;
        } else {
            KF_UNREACHABLE(); /* known_flag() lists every flag above */
        }
    }
    if ((o->tls.cert_path == NULL) != (o->tls.key_path == NULL)) {
        fprintf(stderr, "keyflowd: --tls-cert and --tls-key go together (got only %s)\n",
                o->tls.cert_path != NULL ? "--tls-cert" : "--tls-key");
        return false;
    }
    if (o->tls.client_ca_path != NULL && o->tls.cert_path == NULL) {
        fprintf(stderr, "keyflowd: --tls-client-ca needs --tls-cert and --tls-key (mTLS is TLS)\n");
        return false;
    }
    if (o->node != NULL && o->placement_file == NULL) {
        fprintf(stderr, "keyflowd: --node names a node of --placement, which is missing\n");
        return false;
    }
    if (o->auth_required && o->no_auth) {
        fprintf(stderr, "keyflowd: --auth and --insecure-no-auth contradict each other\n");
        return false;
    }
    return check_address("gRPC address (--grpc, KEYFLOW_GRPC_ADDRESS)", o->grpc_address) &&
           check_address("HTTP address (--http, KEYFLOW_HTTP_ADDRESS)", o->http_address) &&
           (o->probe_address == NULL ||
            check_address("probe address (--probe-address, KEYFLOW_PROBE_ADDRESS)",
                          o->probe_address));
}

/* --memory-budget, or its default: a share of the cgroup's memory limit,
 * else of the machine's memory (limits.h), logged with where it came from. */
static uint64_t memory_budget(const options_t *o) {
    if (o->memory_budget_bytes > 0) {
        kf_log_kv(KF_LOG_INFO, "main", "memory budget", KF_LOG_INT("bytes", o->memory_budget_bytes),
                  KF_LOG_STR("from", "--memory-budget"));
        return (uint64_t)o->memory_budget_bytes;
    }
    char source[256];
    uint64_t limit =
        kf_cgroup_memory_limit("/proc/self/cgroup", "/sys/fs/cgroup", source, sizeof source);
    if (limit == 0) {
        limit = kf_physical_memory_bytes();
        snprintf(source, sizeof source, "the machine's memory (no cgroup limit)");
    }
    uint64_t budget = limit / 100 * KF_MEMORY_BUDGET_SHARE_PERCENT;
    if (budget < (uint64_t)KF_MEMORY_BUDGET_BYTES_MIN) {
        budget = KF_MEMORY_BUDGET_BYTES_MIN;
    }
    kf_log_kv(KF_LOG_INFO, "main", "memory budget", KF_LOG_INT("bytes", (int64_t)budget),
              KF_LOG_INT("limit_bytes", (int64_t)limit), KF_LOG_STR("from", source));
    return budget;
}

/* API keys are required when anyone but this machine can reach a listener,
 * unless the operator says otherwise in so many words (and the log says
 * so at every start). */
static bool decide_auth(const options_t *o) {
    bool loopback = kf_address_is_loopback(o->grpc_address) &&
                    kf_address_is_loopback(o->http_address) &&
                    (o->probe_address == NULL || kf_address_is_loopback(o->probe_address));
    if (o->auth_required) {
        return true;
    }
    if (o->no_auth) {
        if (!loopback) {
            kf_log(KF_LOG_WARN, "main",
                   "--insecure-no-auth: API keys are OFF on a listener other machines can reach "
                   "(grpc=%s http=%s): anyone who can connect can read and change everything",
                   o->grpc_address, o->http_address);
        }
        return false;
    }
    return !loopback;
}

/* Loads the TLS files and logs what they hold (an expired certificate is
 * served, loudly: refusing to start would not make it valid). */
static kf_status_t load_tls(const kf_tls_files_t *files, kf_tls_t **out, kf_error_t *err) {
    kf_status_t st = kf_tls_load(files, out, err);
    if (st == KF_OK) {
        char line[512];
        bool valid = kf_tls_validity(*out, line, sizeof line);
        kf_log(valid ? KF_LOG_INFO : KF_LOG_WARN, "tls", "%s from %s%s%s", line, files->cert_path,
               files->client_ca_path != NULL ? "; client certificates required, CAs from " : "",
               files->client_ca_path != NULL ? files->client_ca_path : "");
    }
    return st;
}

/* SIGHUP: both listeners switch together, or neither does. */
static void reload_tls(const kf_tls_files_t *files, kf_grpc_server_t *grpc, kf_gateway_t *gateway) {
    if (files->cert_path == NULL) {
        kf_log(KF_LOG_INFO, "tls", "SIGHUP: TLS is off, nothing to reload");
        return;
    }
    kf_error_t err;
    kf_tls_t *tls;
    if (load_tls(files, &tls, &err) != KF_OK || kf_gateway_set_tls(gateway, tls, &err) != KF_OK) {
        kf_log(KF_LOG_ERROR, "tls",
               "SIGHUP: reload failed, still serving the previous certificate: %s", err.message);
        return;
    }
    kf_grpc_server_set_tls(grpc, tls);
    kf_tls_unref(tls);
    kf_log(KF_LOG_INFO, "tls", "SIGHUP: new connections get the reloaded certificate");
}

static bool write_port_file(const char *path, int grpc_port, int http_port, int probe_port) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        return false;
    }
    fprintf(f, "grpc=%d\nhttp=%d\n", grpc_port, http_port);
    if (probe_port > 0) {
        fprintf(f, "probe=%d\n", probe_port);
    }
    bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    return ok && rename(tmp, path) == 0; /* readers never see a partial file */
}

/* mkdir -p: the data directory (0700: it holds every input and the key
 * hashes) and any missing parents (0755, as mkdir -p makes them). */
static bool make_dirs(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) {
        errno = ENAMETOOLONG;
        return false;
    }
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char saved = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, saved == '\0' ? 0700 : 0755) != 0 && errno != EEXIST) {
                return false;
            }
            buf[i] = saved;
        }
    }
    return true;
}

/* "host:port" with the bound port, for the log. */
static void bound_address(const char *configured, int port, char *out, size_t cap) {
    const char *colon = strrchr(configured, ':');
    int host_len = colon ? (int)(colon - configured) : (int)strlen(configured);
    snprintf(out, cap, "%.*s:%d", host_len, configured, port);
}

/* main's thread: the one that takes the signals (sigwait). */
static pthread_t main_thread;

/* The engine's fail-stop (committer thread): a write failed, or would
 * have filled the disk (runtime/engine.h, invariant 3); nothing more is
 * acknowledged from now on. Say so and why, turn NOT_SERVING (Watch streams
 * learn it at once), and have main stop without a grace. */
static void on_engine_fatal(const kf_error_t *err, void *ctx) {
    (void)ctx;
    kf_log_kv(KF_LOG_ERROR, "main",
              "fail-stop: a durable write failed (storage failure); nothing more is acknowledged",
              KF_LOG_STR("reason", err->message),
              KF_LOG_STR("status", kf_status_name(err->status)));
    kf_health_fail("a durable write failed");
    pthread_kill(main_thread, SIGTERM);
}

/* After a failed sync: the engine acknowledges nothing more and answers the
 * calls it held with "storage failure: <what>, stopping"; there is nothing
 * to finish. Stop accepting, let those answers and the health watchers'
 * NOT_SERVING go out (bounded), and exit 1; the store is left to RocksDB's
 * recovery at the next start, which replays exactly what was synced. */
static _Noreturn void fail_stop(kf_partitions_t *partitions, kf_grpc_server_t *grpc,
                                kf_gateway_t *gateway) {
    kf_gateway_shutdown(gateway);
    kf_grpc_server_shutdown(grpc);
    kf_notify_stopping("fail-stop: a durable write failed");
    kf_partitions_stop(partitions); /* the repliers hand the failure answers to the front ends */
    kf_grpc_server_wait_watches(grpc, FAIL_STOP_WATCH_FLUSH_MS);
    kf_grpc_server_destroy(grpc, FAIL_STOP_WATCH_FLUSH_MS);
    kf_gateway_destroy(gateway);
    kf_log(KF_LOG_ERROR, "main", "fail-stop: exiting without acknowledging anything more");
    _exit(1);
}

/* Waits for SIGTERM/SIGINT, reloading TLS on each SIGHUP meanwhile; with
 * deadline_ms >= 0, gives up at that time (kf_mono_us / 1000). Returns the
 * signal, or 0 when the deadline passed. */
static int wait_for_stop(const sigset_t *sigs, int64_t deadline_ms, const kf_tls_files_t *tls,
                         kf_grpc_server_t *grpc, kf_gateway_t *gateway) {
    for (;;) {
        int sig;
        if (deadline_ms < 0) {
            if (sigwait(sigs, &sig) != 0) {
                continue;
            }
        } else {
            int64_t left_ms = deadline_ms - kf_mono_us() / 1000;
            if (left_ms <= 0) {
                return 0;
            }
            struct timespec ts = {left_ms / 1000, (left_ms % 1000) * 1000000};
            sig = sigtimedwait(sigs, NULL, &ts);
            if (sig < 0) {
                continue; /* EAGAIN (the deadline: checked above) or EINTR */
            }
        }
        if (sig != SIGHUP) {
            return sig;
        }
        reload_tls(tls, grpc, gateway);
    }
}

/* The soft descriptor limit up to the hard one: each partition's RocksDB
 * holds about 30 descriptors while idle (a directory handle per column
 * family, its WAL, manifest and log), so 8 partitions take about 270 of a
 * common soft limit of 1024 before the first connection. The hard limit is
 * what the operator allows; connections are bounded by their own flags. */
static void raise_descriptor_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) == 0) {
            kf_log(KF_LOG_DEBUG, "main", "descriptor limit raised from %llu to %llu",
                   (unsigned long long)was, (unsigned long long)rl.rlim_max);
        }
    }
}

int main(int argc, char **argv) {
    options_t o = {0};
    if (!parse_args(argc, argv, &o)) {
        return 2;
    }
    kf_log_set_level(o.log_level);
    kf_log_set_format(o.log_format);
    kf_metrics_set_build_info(kf_version(), kf_version_commit());
    struct stat st_plugins;
    if (o.plugin_dir != NULL &&
        (stat(o.plugin_dir, &st_plugins) != 0 || !S_ISDIR(st_plugins.st_mode))) {
        /* Not fatal: the directory may be mounted later (registrations look
         * it up each time), but say so now rather than at the first one. */
        kf_log(KF_LOG_WARN, "main",
               "plugin directory %s is not a readable directory; NATIVE "
               "functions will not register until it is",
               o.plugin_dir);
    }
    /* Signals are taken by sigwait in main; every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    main_thread = pthread_self();
    raise_descriptor_limit();

    /* Every file keyflowd creates is its user's alone: RocksDB creates its
     * files (tables, WAL, manifest, LOG) with 0644 less the umask, and has
     * no option for a mode, so the umask is what makes them 0600. */
    mode_t inherited = umask(0077);
    umask(inherited | 0077);
    if (!make_dirs(o.data_dir)) {
        kf_log(KF_LOG_ERROR, "main", "cannot create %s: %s", o.data_dir, strerror(errno));
        return 1;
    }
    struct stat st_data;
    if (stat(o.data_dir, &st_data) == 0 &&
        ((st_data.st_mode & 0007) != 0 ||
         ((st_data.st_mode & 0070) != 0 && st_data.st_gid != getegid()))) {
        /* Not changed behind the operator's back (a volume may be shared on
         * purpose), but said: other users can read what it holds. Access for
         * keyflowd's own group (the image's 0750, a pod's fsGroup) is not
         * "other users". */
        kf_log(KF_LOG_WARN, "main",
               "data directory %s is accessible to other users (mode %03o); "
               "chmod 700 it unless that is intended",
               o.data_dir, (unsigned)(st_data.st_mode & 0777));
    }
    kf_error_t err;
    kf_tls_t *tls = NULL;
    if (o.tls.cert_path != NULL && load_tls(&o.tls, &tls, &err) != KF_OK) {
        kf_log(KF_LOG_ERROR, "main", "TLS: %s", err.message);
        return 1;
    }
    const char *tls_mode = tls == NULL                        ? "off"
                           : kf_tls_requires_client_cert(tls) ? "on (mTLS)"
                                                              : "on";
    kf_placement_t *placement = NULL;
    if (o.placement_file != NULL &&
        kf_placement_load(o.placement_file, &placement, &err) != KF_OK) {
        kf_log(KF_LOG_ERROR, "main", "%s", err.message);
        kf_tls_unref(tls);
        return 1;
    }
    bool auth_on = decide_auth(&o);
    kf_auth_t *auth = kf_auth_create(auth_on);
    char bootstrap_path[4096];
    snprintf(bootstrap_path, sizeof bootstrap_path, "%s/bootstrap-admin.key", o.data_dir);
    kf_partitions_options_t po = {
        .data_dir = o.data_dir,
        .partition_count = (uint32_t)o.partition_count,
        .serve = o.partitions,
        .placement = placement,
        .node = o.node,
        .engine =
            {
                .clock = kf_clock_system(),
                .run_retention_ms = o.retention_ms,
                .run_attempts_max = o.attempts_max,
                .queue_depth_max = o.queue_depth,
                .disk_reserve_bytes = (uint64_t)o.disk_reserve_bytes,
                .output_retention_set = true,
                .output_retention = {o.output_retention_ms, o.output_retention_rows,
                                     o.output_retention_bytes},
                .producer_idle_expiry_ms = o.producer_idle_expiry_ms,
                .memory_budget_bytes = memory_budget(&o),
                .replay_batches = o.replay_batches,
                .replay_bytes = o.replay_bytes,
                .plugin_dir = o.plugin_dir,
                .auth = auth,
                .bootstrap_key_path =
                    o.bootstrap_key_file != NULL ? o.bootstrap_key_file : bootstrap_path,
                .new_admin_key = o.new_admin_key,
                .admin_key_path = o.admin_key_file,
                .on_fatal = on_engine_fatal,
            },
    };
    kf_partitions_t *partitions;
    kf_notify_status("opening the store and recovering");
    if (auth == NULL || kf_partitions_open(&po, &partitions, &err) != KF_OK) {
        kf_log(KF_LOG_ERROR, "main", "cannot open the data set: %s",
               auth == NULL ? "out of memory" : err.message);
        kf_auth_destroy(auth);
        kf_placement_destroy(placement);
        kf_tls_unref(tls);
        return 1;
    }
    kf_router_t *router = kf_partitions_router(partitions);
    /* Start-up cost in two parts: opening the stores (RocksDB replays its
     * WAL) and recovering the engines (loading what they keep in memory).
     * bench/restart.sh reads them. */
    int64_t open_ms, recover_ms;
    kf_partitions_timing(partitions, &open_ms, &recover_ms);
    kf_log_kv(KF_LOG_INFO, "main", "store opened", KF_LOG_INT("open_ms", open_ms),
              KF_LOG_INT("recover_ms", recover_ms),
              KF_LOG_STR("partitions", kf_partitions_describe(partitions)));
    kf_grpc_options_t go = {.address = o.grpc_address,
                            .threads = o.grpc_threads,
                            .tls = tls,
                            .auth = auth,
                            .request_bytes_held_max = o.grpc_request_bytes_held};
    kf_grpc_server_t *grpc;
    int grpc_port;
    if (kf_grpc_server_create(&go, router, &grpc, &grpc_port, &err) != KF_OK) {
        kf_log(KF_LOG_ERROR, "main", "%s", err.message);
        kf_partitions_close(partitions);
        kf_auth_destroy(auth);
        kf_placement_destroy(placement);
        kf_tls_unref(tls);
        return 1;
    }
    kf_gateway_options_t ho = {
        .address = o.http_address,
        .tls = tls,
        .auth = auth,
        .probe_address = o.probe_address,
        .connections_per_address = (int)o.http_connections_per_address,
        .header_timeout_ms = o.http_header_timeout_ms,
        .body_timeout_ms = o.http_body_timeout_ms,
        .version = kf_version(),
    };
    kf_gateway_t *gateway;
    int http_port;
    kf_status_t gateway_st = kf_gateway_create(&ho, router, &gateway, &http_port, &err);
    kf_tls_unref(tls); /* the front ends hold what they need */
    if (gateway_st != KF_OK) {
        kf_log(KF_LOG_ERROR, "main", "%s", err.message);
        kf_grpc_server_destroy(grpc, 0);
        kf_partitions_close(partitions);
        kf_auth_destroy(auth);
        kf_placement_destroy(placement);
        return 1;
    }
    if (kf_partitions_start(partitions, &err) != KF_OK ||
        kf_grpc_server_start(grpc, &err) != KF_OK || kf_gateway_start(gateway, &err) != KF_OK) {
        kf_log(KF_LOG_ERROR, "main", "cannot start: %s", err.message);
        return 1;
    }
    /* Memory freed after bursts goes back to the system (base/trim.h). */
    kf_trimmer_t *trimmer = NULL;
    if (kf_trimmer_create(KF_TRIM_INTERVAL_MS, KF_TRIM_FREED_BYTES_MIN, &trimmer, &err) != KF_OK) {
        kf_log(KF_LOG_ERROR, "main", "cannot start: %s", err.message);
        return 1;
    }
    kf_health_set(true, "started");
    if (o.port_file != NULL &&
        !write_port_file(o.port_file, grpc_port, http_port, kf_gateway_probe_port(gateway))) {
        kf_log(KF_LOG_ERROR, "main", "cannot write %s", o.port_file);
        return 1;
    }
    char grpc_at[160], http_at[160];
    bound_address(o.grpc_address, grpc_port, grpc_at, sizeof grpc_at);
    bound_address(o.http_address, http_port, http_at, sizeof http_at);
    kf_log_kv(KF_LOG_INFO, "main", "serving", KF_LOG_STR("version", kf_version()),
              KF_LOG_STR("commit", kf_version_commit()), KF_LOG_STR("data", o.data_dir),
              KF_LOG_STR("grpc", grpc_at), KF_LOG_STR("http", http_at), KF_LOG_STR("tls", tls_mode),
              KF_LOG_STR("auth", auth_on ? "on" : "off"));
    char status[400];
    snprintf(status, sizeof status, "serving gRPC on %s, HTTP on %s", grpc_at, http_at);
    kf_notify_ready(status);

    int sig = wait_for_stop(&sigs, -1, &o.tls, grpc, gateway);
    if (!kf_health_failed()) {
        /* Readiness first: load balancers stop sending new requests while
         * both listeners still serve the ones that come. Then systemd hears
         * it: whoever reads "NOT_SERVING" there must find it so. */
        kf_health_set(false, "draining");
        kf_notify_stopping("draining: NOT_SERVING, still serving requests");
        kf_log_kv(KF_LOG_INFO, "main", "draining", KF_LOG_INT("signal", sig),
                  KF_LOG_INT("grace_ms", o.drain_grace_ms));
        if (o.drain_grace_ms > 0) {
            int again =
                wait_for_stop(&sigs, kf_mono_us() / 1000 + o.drain_grace_ms, &o.tls, grpc, gateway);
            if (again != 0) {
                kf_log_kv(KF_LOG_INFO, "main", "drain cut short", KF_LOG_INT("signal", again));
            }
        }
    }
    if (kf_health_failed()) {
        fail_stop(partitions, grpc, gateway);
    }
    kf_log_kv(KF_LOG_INFO, "main", "stopping", KF_LOG_INT("signal", sig));
    kf_notify_stopping("stopping: finishing and syncing what was accepted");
    kf_gateway_shutdown(gateway);
    kf_grpc_server_shutdown(grpc);
    kf_partitions_stop(partitions); /* each finishes and syncs everything accepted */
    kf_grpc_server_destroy(grpc, 2000);
    kf_gateway_destroy(gateway);
    bool failed = kf_router_failed(router);
    kf_partitions_close(partitions);
    kf_auth_destroy(auth); /* after every call that could hold a principal */
    kf_placement_destroy(placement);
    kf_trimmer_destroy(trimmer);
    kf_log(KF_LOG_INFO, "main", "stopped");
    return failed ? 1 : 0;
}
