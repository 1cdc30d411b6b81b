/*
 * router.h - the partitions a process serves, as front ends see them: one
 * kf_engine_t per served partition (runtime/engine.h: an engine thread, a
 * committer and a RocksDB each), plus the home engine that keeps the
 * process's API keys. Front ends hand every command to the router, which
 * sends it where the RPC table's route column says (proto/rpcs.h,
 * docs/scaling.md):
 *
 *   BY_COORDINATOR / BY_RUN_ID   one partition; a partition this process does
 *                                not serve is refused KF_E_NOT_OWNER, with
 *                                cmd->foreign_partition set: a key's state is
 *                                never split
 *   HOME                         the home engine
 *   SPLIT / ALL / MERGE / FIRST  sub-commands to several partitions, their
 *                                answers combined into the call's answer
 *                                (a "fan-out"; the plans are in router.c)
 *
 * With one partition every command goes straight to its engine: nothing is
 * copied or combined, and a data set written before partitions existed
 * behaves exactly as before.
 *
 * Invariants
 *   1. A command's done() is called exactly once after kf_router_submit
 *      returned KF_OK, on some engine's replier thread; a fan-out calls it
 *      after every sub-command was answered, so an answer never reveals an
 *      effect that is not yet durable in its partition.
 *   2. Each partition keeps its own guarantees (runtime/engine.h); a call
 *      that spans partitions (SendEvents over several keys, a registration)
 *      is atomic per partition, not across them: its answer says what each
 *      part did, and a retry is idempotent per partition.
 *   3. The router owns no engine: whoever made them (runtime/partitions.h)
 *      starts, stops and destroys them, after the router is done.
 *
 * Thread-safe: any thread may call any function.
 */
#ifndef KF_RUNTIME_ROUTER_H
#define KF_RUNTIME_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/arena.h"
#include "base/partition.h"
#include "base/placement.h"
#include "runtime/engine.h"

typedef struct kf_router kf_router_t;

typedef struct kf_router_config {
    uint32_t partition_count;                     /* the data set's P */
    kf_engine_t *engines[KF_PARTITION_COUNT_MAX]; /* by partition; NULL: not served */
    kf_engine_t *home;                            /* API keys; may be one of engines[] */
    const kf_placement_t *placement; /* owners of other partitions; NULL: unknown (borrowed) */
    const char *node;                /* this process's name in the placement, or NULL */
    /* Each served partition's directory id (KEYFLOW-PARTITION), borrowed;
     * NULL or "" when it has none. */
    const char *ids[KF_PARTITION_COUNT_MAX];
} kf_router_config_t;

/* Engines and placement are borrowed and outlive the router. At least one
 * partition is served. Errors: KF_E_NOMEM. */
kf_status_t kf_router_create(const kf_router_config_t *config, kf_router_t **out,
                             kf_error_t *err) KF_MUST_USE;
void kf_router_destroy(kf_router_t *router);

/* kf_engine_submit for the partitions: on KF_OK the router owns `cmd` until
 * done(); otherwise done() is not called and cmd->error says why
 * (KF_E_NOT_OWNER: cmd->foreign_partition is the key's partition). */
kf_status_t kf_router_submit(kf_router_t *router, kf_cmd_t *cmd) KF_MUST_USE;
/* kf_engine_cancel for the partitions: every sub-command of `cmd` still
 * waiting (a long poll parked in several partitions) is answered now. */
void kf_router_cancel(kf_router_t *router, kf_cmd_t *cmd);
/* kf_engine_worker_post for the partitions (step/engine_types.h, "remote
 * handler workers"). Errors (the event is still the caller's, err says why):
 * KF_E_UNAVAILABLE (stopping), KF_E_UNIMPLEMENTED. */
kf_status_t kf_router_worker_post(kf_router_t *router, kf_worker_event_t *ev,
                                  kf_error_t *err) KF_MUST_USE;

/* True once any engine's sync failed (the process is stopping). */
bool kf_router_failed(const kf_router_t *router);
/* kf_engine_unready over every engine: the first reason, naming its
 * partition when there are several. */
bool kf_router_unready(kf_router_t *router, char *why, size_t why_cap);

uint32_t kf_router_partition_count(const kf_router_t *router);
/* The partitions served here. */
const kf_partition_set_t *kf_router_served(const kf_router_t *router);
/* Who serves `partition` according to the placement; NULL when unknown. */
const kf_placement_node_t *kf_router_owner(const kf_router_t *router, uint32_t partition);
/* The engine of a served partition, or NULL. */
kf_engine_t *kf_router_engine(const kf_router_t *router, uint32_t partition);
/* This process's node name, or NULL. */
const char *kf_router_node(const kf_router_t *router);
/* keyflow.v1.Partitions/GetPlacement's answer, built in `arena`: the count,
 * the served partitions with their ids and readiness, the placement's nodes
 * and every RPC's route. NULL when the arena is full. Any thread. */
struct Keyflow__V1__Placement *kf_router_placement(kf_router_t *router, kf_arena_t *arena);

#endif
