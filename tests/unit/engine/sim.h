/*
 * sim.h - drives the engine core deterministically for tests: a memory store
 * (optionally faulty), a manual clock, a seeded random source, and explicit
 * group boundaries. sim_step() writes the current group, releases its
 * replies and reports it durable, exactly as the threaded engine would.
 * sim_crash() drops the core without writing the open group, then recovers
 * a new core from the store, like a SIGKILL and restart.
 */
#ifndef KF_TEST_SIM_H
#define KF_TEST_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "base/arena.h"
#include "core/core.h"
#include "keyflow/v1/coordinators.pb-c.h"
#include "keyflow/v1/runs.pb-c.h"

typedef struct sim {
    kf_memdisk_t *disk;
    kf_store_t *store;
    kf_core_t *core;
    kf_engine_config_t config;
    int64_t now_ms;
    uint64_t group;
    kf_batch_t *batch;
    kf_arena_t arena; /* requests and responses of the test */
    uint64_t seed;
    size_t step_bytes; /* what the latest sim_step wrote (kf_batch_bytes; 0: nothing) */
    bool hold_group;   /* sim_exec does not step: commands share the open group, whose
                          writes reach the store at the next sim_step (group commit) */
} sim_t;

void sim_open(sim_t *sim, uint64_t seed);
/* The same, loading native handlers from plugin_dir. */
void sim_open_plugins(sim_t *sim, uint64_t seed, const char *plugin_dir);
void sim_close(sim_t *sim);
/* Writes the open group (if anything) and marks it durable. */
void sim_step(sim_t *sim);
/* Loses the open group (never written) and recovers from the store. */
void sim_crash(sim_t *sim);
/* Like sim_crash, but recovery may fail: its status (KF_OK: running again;
 * otherwise no core, and only sim_close is left). */
kf_status_t sim_restart_status(sim_t *sim, kf_error_t *err);
/* The same over a store handle with these faults (NULL: none). */
kf_status_t sim_restart_faulty(sim_t *sim, const kf_mem_faults_t *faults, kf_error_t *err);
/* Writes one record straight to the store, as corruption or a bug would. */
void sim_put_raw(sim_t *sim, kf_cf_t cf, const void *key, size_t key_len, const void *value,
                 size_t value_len);
/* Reads one record straight from the store: true and *value (free with
 * kf_store_value_free) when the key is present. */
bool sim_get_raw(sim_t *sim, kf_cf_t cf, const void *key, size_t key_len, kf_value_t *value);
/* Counts the records of one family. */
size_t sim_count_raw(sim_t *sim, kf_cf_t cf);
/* Answers handler calls that are out (config.defer_handler_calls), then steps. */
void sim_pump(sim_t *sim);
/* Runs up to `steps_max` steps of the engine's own work (follow-on timer
 * steps), each in its own group as the threaded engine may; returns how
 * many ran. sim_exec does not run them, so tests see what is pending. */
uint32_t sim_run_work(sim_t *sim, uint32_t steps_max);
/* Runs the engine's own work until there is none (at most `steps_max`
 * steps; fails the test past that). */
void sim_drain_work(sim_t *sim, uint32_t steps_max);
/* Moves the clock and fires due timers, then steps. */
void sim_advance(sim_t *sim, int64_t to_ms);

/* Executes one command and steps (unless hold_group); returns the cmd (in
 * the sim arena). A parked command has cmd->parked != NULL after the call. */
kf_cmd_t *sim_exec(sim_t *sim, kf_op_t op, const ProtobufCMessage *request);

/* Convenience builders (all memory in the sim arena). kind: 'd' or 'b'. */
Keyflow__V1__Rule *sim_debounce(sim_t *sim, int64_t window_ms, int64_t max_wait_ms);
Keyflow__V1__Rule *sim_batch(sim_t *sim, int64_t max_events, int64_t max_wait_ms);
kf_cmd_t *sim_send(sim_t *sim, const char *workflow, const char *key, const char *id,
                   Keyflow__V1__Rule *rule, const char *input_json);
/* An event to adjust (flush) before sending it with sim_send_event. */
Keyflow__V1__Event *sim_event(sim_t *sim, const char *id, Keyflow__V1__Rule *rule,
                              const char *input_json);
Keyflow__V1__SendEventRequest *sim_send_request(sim_t *sim, const char *workflow, const char *key,
                                                Keyflow__V1__Event *event);
kf_cmd_t *sim_send_event(sim_t *sim, const char *workflow, const char *key,
                         Keyflow__V1__Event *event);
kf_cmd_t *sim_describe(sim_t *sim, int kind, const char *workflow, const char *key);
kf_cmd_t *sim_flush(sim_t *sim, int kind, const char *workflow, const char *key);
kf_cmd_t *sim_cancel(sim_t *sim, int kind, const char *workflow, const char *key);
kf_cmd_t *sim_poll(sim_t *sim, const char *workflow, int64_t lease_ms, int64_t max_runs,
                   int64_t wait_ms);
kf_cmd_t *sim_complete(sim_t *sim, const char *run_id, const char *lease, const char *result,
                       const char *error);
kf_cmd_t *sim_release(sim_t *sim, const char *run_id, const char *lease);
kf_cmd_t *sim_heartbeat(sim_t *sim, const char *run_id, const char *lease);
kf_cmd_t *sim_cancel_run(sim_t *sim, const char *run_id);
kf_cmd_t *sim_get(sim_t *sim, const char *run_id);

/* Shorthands for responses. */
#define SEND_RESP(cmd)     ((Keyflow__V1__SendEventResponse *)(cmd)->response)
#define DESCRIBE_RESP(cmd) ((Keyflow__V1__DescribeCoordinatorResponse *)(cmd)->response)
#define POLL_RESP(cmd)     ((Keyflow__V1__PollRunsResponse *)(cmd)->response)
#define RUN_RESP(cmd)      ((Keyflow__V1__Run *)(cmd)->response)
#define FLUSH_RESP(cmd)    ((Keyflow__V1__FlushWindowResponse *)(cmd)->response)
#define CANCEL_RESP(cmd)   ((Keyflow__V1__CancelWindowResponse *)(cmd)->response)

#endif
