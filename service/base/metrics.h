/*
 * metrics.h - process-wide counters, gauges and histograms, rendered in the
 * Prometheus text format by GET /metrics.
 *
 * Every update is a relaxed atomic, so any thread may record; rendering reads
 * a consistent-enough view without stopping anyone. The set of metrics is
 * fixed at compile time (tables below), except request metrics, which are
 * per registered method (kf_metrics_method_register, before serving starts).
 *
 * The exposition also carries the standard process metrics of Prometheus
 * clients (process_cpu_seconds_total, process_resident_memory_bytes,
 * process_virtual_memory_bytes, process_open_fds, process_max_fds,
 * process_start_time_seconds), read from the kernel at render time; one the
 * kernel does not answer (no /proc, no descriptor left) is left out.
 */
#ifndef KF_BASE_METRICS_H
#define KF_BASE_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "base/limits.h"

/* X(id, prometheus name, help) */
#define KF_GAUGE_TABLE(X)                                                                          \
    X(KF_G_QUEUE_DEPTH, "keyflow_engine_queue_depth", "Commands waiting for the engine")           \
    X(KF_G_COORDINATORS, "keyflow_coordinators", "Coordinators held in memory")                    \
    X(KF_G_OPEN_WINDOWS, "keyflow_open_windows", "Coordinator windows open now")                   \
    X(KF_G_RUNS_PENDING, "keyflow_runs_pending", "Runs waiting for a worker")                      \
    X(KF_G_RUNS_LEASED, "keyflow_runs_leased", "Runs leased to a worker")                          \
    X(KF_G_RUNS_DELAYED, "keyflow_runs_delayed",                                                   \
      "Runs waiting for a start delay or retry backoff")                                           \
    X(KF_G_RUN_WAITS, "keyflow_run_waits", "GetRun calls waiting for a run to finish")             \
    X(KF_G_RUNS_MEMORY_BYTES, "keyflow_runs_memory_bytes",                                         \
      "Bytes the run table holds (runs, their details and unsettled bodies), allocator "           \
      "overhead and hash buckets aside")                                                           \
    X(KF_G_PARKED_POLLS, "keyflow_parked_polls", "PollRuns calls waiting for a run")               \
    X(KF_G_PARKED_READS, "keyflow_parked_reads", "ReadOutput/TailOutput reads waiting for rows")   \
    X(KF_G_TIMERS, "keyflow_timers", "Processing-time timers armed")                               \
    X(KF_G_FUNCTIONS, "keyflow_functions", "Registered process functions")                         \
    X(KF_G_BATCHES_QUEUED, "keyflow_function_batches_queued",                                      \
      "PushBatch calls waiting behind a function's step")                                          \
    X(KF_G_FUNCTION_WORKERS, "keyflow_function_workers", "Remote handler workers serving")         \
    X(KF_G_READY, "keyflow_ready", "1 when the service is ready to serve")                         \
    X(KF_G_MEMORY_BUDGET_BYTES, "keyflow_memory_budget_bytes",                                     \
      "--memory-budget: the engine's tables may not pass it with new entries (0: none)")           \
    X(KF_G_MEMORY_USED_BYTES, "keyflow_memory_used_bytes",                                         \
      "Estimated bytes of the engine's tables (windows, runs, keys, producers, functions)")        \
    X(KF_G_REPLAY_BYTES, "keyflow_replay_bytes",                                                   \
      "Bytes of input batches kept for ReplayBatch (within --replay-bytes and the room "           \
      "--memory-budget leaves)")                                                                   \
    X(KF_G_STORE_MEMTABLE_BYTES, "keyflow_store_memtable_bytes",                                   \
      "Bytes in RocksDB's memtables (every family), last measured")                                \
    X(KF_G_STORE_BLOCK_CACHE_BYTES, "keyflow_store_block_cache_bytes",                             \
      "Bytes in RocksDB's block cache, last measured")                                             \
    X(KF_G_DISK_FREE_BYTES, "keyflow_disk_free_bytes",                                             \
      "Free bytes on the data directory's filesystem, last measured")                              \
    X(KF_G_DISK_RESERVE_REACHED, "keyflow_disk_reserve_reached",                                   \
      "1 while free space is below --disk-reserve (new writes refused)")                           \
    X(KF_G_HTTP_OFFLOADING, "keyflow_http_offloading",                                             \
      "HTTP bodies and responses being decoded or rendered off the event loop")

#define KF_COUNTER_TABLE(X)                                                                        \
    X(KF_C_EVENTS_ACCEPTED, "keyflow_events_accepted_total", "Events accepted into a window")      \
    X(KF_C_EVENTS_DUPLICATE, "keyflow_events_duplicate_total", "Retries answered by dedup")        \
    X(KF_C_EVENTS_CONFLICT, "keyflow_events_conflict_total",                                       \
      "Remembered event IDs sent again with another payload (refused)")                            \
    X(KF_C_RUNS_CREATED, "keyflow_runs_created_total", "Runs started by closing windows")          \
    X(KF_C_RUNS_COMPLETED, "keyflow_runs_completed_total", "Runs completed by workers")            \
    X(KF_C_RUNS_FAILED, "keyflow_runs_failed_total", "Runs that ended FAILED")                     \
    X(KF_C_RUNS_CANCELLED, "keyflow_runs_cancelled_total", "Runs that ended CANCELLED")            \
    X(KF_C_RUN_RETRIES, "keyflow_run_retries_total", "Failed attempts retried")                    \
    X(KF_C_LEASES_EXPIRED, "keyflow_leases_expired_total", "Leases that expired")                  \
    X(KF_C_RUNS_DELETED, "keyflow_runs_deleted_total", "Finished runs deleted by retention")       \
    X(KF_C_COMPACTIONS, "keyflow_journal_compactions_total", "Coordinator continue-as-new")        \
    X(KF_C_GROUPS, "keyflow_commit_groups_total", "Synced write groups")                           \
    X(KF_C_TIMERS_FIRED, "keyflow_timers_fired_total", "Processing-time timers fired")             \
    X(KF_C_INPUT_ROWS, "keyflow_function_input_rows_total", "Process function input rows")         \
    X(KF_C_OUTPUT_ROWS, "keyflow_function_output_rows_total", "Process function output rows")      \
    X(KF_C_EVENT_TIMERS_FIRED, "keyflow_function_timers_fired_total", "Event-time timers fired")   \
    X(KF_C_HANDLER_CALLS, "keyflow_function_handler_calls_total", "Handler invocations")           \
    X(KF_C_PRODUCERS_EXPIRED, "keyflow_function_producers_expired_total",                          \
      "Producers forgotten after --producer-idle-expiry-ms")                                       \
    X(KF_C_REJECTED_QUEUE_FULL, "keyflow_rejected_queue_full_total",                               \
      "Commands refused: queue full")                                                              \
    X(KF_C_REJECTED_MEMORY_BUDGET, "keyflow_rejected_memory_budget_total",                         \
      "New windows, keys, producers or functions refused: memory budget reached")                  \
    X(KF_C_REJECTED_DISK_RESERVE, "keyflow_rejected_disk_reserve_total",                           \
      "Commands refused: disk reserve reached")                                                    \
    X(KF_C_HTTP_CONNECTIONS_REFUSED, "keyflow_http_connections_refused_total",                     \
      "HTTP connections closed at accept: too many from one client address")                       \
    X(KF_C_HTTP_CONNECTIONS_TIMED_OUT, "keyflow_http_connections_timed_out_total",                 \
      "HTTP connections closed: no complete request head or request in time")                      \
    X(KF_C_HTTP_CONNECTIONS_SHED, "keyflow_http_connections_shed_total",                           \
      "HTTP connections closed: connections held more request bytes than the gateway's bound")     \
    X(KF_C_HTTP_STREAMS_SHED, "keyflow_http_streams_shed_total",                                   \
      "HTTP/2 streams refused while sending their body: connections held more request bytes than " \
      "the gateway's bound")                                                                       \
    X(KF_C_GRPC_REFUSED_REQUEST_BYTES, "keyflow_grpc_requests_refused_bytes_total",                \
      "gRPC calls refused: calls not yet answered held --grpc-request-bytes-held of requests")     \
    X(KF_C_HTTP_OFFLOADED, "keyflow_http_offloaded_total",                                         \
      "HTTP bodies decoded and responses rendered by the gateway's worker threads")

#define KF_HISTOGRAM_TABLE(X)                                                                      \
    X(KF_H_GROUP_COMMANDS, "keyflow_commit_group_commands", "Commands per synced group",           \
      kf__buckets_count)                                                                           \
    X(KF_H_GROUP_BYTES, "keyflow_commit_group_bytes", "Bytes per synced group", kf__buckets_bytes) \
    X(KF_H_SYNC_SECONDS, "keyflow_commit_sync_seconds", "Durable write latency",                   \
      kf__buckets_seconds)                                                                         \
    X(KF_H_QUEUE_WAIT_SECONDS, "keyflow_engine_queue_wait_seconds",                                \
      "Time a command waited for the engine", kf__buckets_seconds)                                 \
    X(KF_H_FN_STEP_SECONDS, "keyflow_function_step_seconds",                                       \
      "Engine time of one process-function step (a batch or a follow-on timer step)",              \
      kf__buckets_seconds)

typedef enum kf_gauge {
#define KF_M_ENUM_(id, name, help) id,
    KF_GAUGE_TABLE(KF_M_ENUM_) KF_GAUGE_COUNT
} kf_gauge_t;

typedef enum kf_counter { KF_COUNTER_TABLE(KF_M_ENUM_) KF_COUNTER_COUNT } kf_counter_t;
#undef KF_M_ENUM_

typedef enum kf_histogram {
#define KF_H_ENUM_(id, name, help, buckets) id,
    KF_HISTOGRAM_TABLE(KF_H_ENUM_) KF_HISTOGRAM_COUNT
#undef KF_H_ENUM_
} kf_histogram_t;

/* Gauge slots: 0, and one per partition (index + 1), so that each
 * partition's engine keeps its own value of a gauge (GET /metrics shows
 * their sum, or their largest for what every partition holds alike).
 * kf_metrics_bind_slot sets the calling thread's slot (an engine's threads
 * bind theirs); kf_gauge_set/add write the calling thread's. Each slot is
 * written by one engine, so a value is never the last of several writers. */
#define KF_METRICS_SLOTS (KF_PARTITION_COUNT_MAX + 1)
int kf_metrics_bind_slot(int slot); /* returns the slot bound before */
void kf_gauge_set_in(int slot, kf_gauge_t g, int64_t value);
void kf_gauge_set(kf_gauge_t g, int64_t value);
void kf_gauge_add(kf_gauge_t g, int64_t delta);
int64_t kf_gauge_get(kf_gauge_t g);
void kf_counter_add(kf_counter_t c, uint64_t delta);
uint64_t kf_counter_get(kf_counter_t c);
/* value in the histogram's unit: counts, bytes, or seconds as microseconds
 * (use kf_histogram_observe_us for seconds histograms). */
void kf_histogram_observe(kf_histogram_t h, double value);
void kf_histogram_observe_us(kf_histogram_t h, int64_t us);

/* Requests, by method and outcome. */
#define KF_METRICS_METHODS_MAX 64
typedef enum kf_transport {
    KF_TRANSPORT_GRPC,
    KF_TRANSPORT_HTTP,
    KF_TRANSPORT_COUNT
} kf_transport_t;

/* Returns the method's id (0..KF_METRICS_METHODS_MAX-1); the same name twice
 * gives the same id. A front end registers what it serves over its
 * transport, and only those (method, transport) pairs have series: the
 * gateway never renders a latency histogram for a stream it cannot serve.
 * A request of a pair never registered is not counted. Call before serving
 * (not thread-safe against record). */
int kf_metrics_method_register(const char *name, kf_transport_t transport);
void kf_metrics_request(int method, kf_transport_t transport, int grpc_code, int64_t latency_us);

/* The build, rendered as keyflow_build_info{version="...",commit="..."} 1.
 * Both strings are borrowed for the life of the process (base/version.h's
 * are static). Call before serving; until then the metric is absent. */
void kf_metrics_set_build_info(const char *version, const char *commit);

/* The whole exposition, malloc'd and NUL-terminated; *len excludes the NUL.
 * NULL when out of memory. */
char *kf_metrics_render(size_t *len);

/* Zeroes everything (tests). */
void kf_metrics_reset(void);

#endif
