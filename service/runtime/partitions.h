/*
 * partitions.h - a data directory as a set of partitions: the layout on
 * disk, the engines of the partitions this process serves, and the router
 * over them (docs/scaling.md).
 *
 *   DATA/KEYFLOW-DATASET          the data set: format, partition count P,
 *                                 hash (written once, checked at every start)
 *   DATA/home/                    RocksDB: this process's API keys
 *   DATA/partitions/<i>/          RocksDB of partition i, with
 *   DATA/partitions/<i>/KEYFLOW-PARTITION   "partition i of P", its id
 *
 * A directory written before partitions existed (a RocksDB in DATA itself,
 * no KEYFLOW-DATASET) is a data set of one partition, in place: that store
 * is partition 0 and home, and nothing on disk changes.
 *
 * Creation: a start that finds no KEYFLOW-DATASET (and no RocksDB) creates
 * the data set: the partitions it serves, home, and KEYFLOW-DATASET last
 * (a start interrupted before that creates it again, reusing what is
 * there). Once KEYFLOW-DATASET exists a partition is never created: a
 * served partition whose directory is missing stops the start, because an
 * empty new one would split every key whose state is elsewhere; a partition
 * arrives by moving its directory in (docs/scaling.md, "Moving a
 * partition").
 *
 * Main's thread only.
 */
#ifndef KF_RUNTIME_PARTITIONS_H
#define KF_RUNTIME_PARTITIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/placement.h"
#include "runtime/router.h"

typedef struct kf_partitions kf_partitions_t;

typedef struct kf_partitions_options {
    const char *data_dir;
    uint32_t partition_count;        /* --partition-count; 0: the stored one (a new data set
                                        gets KF_PARTITION_COUNT_DEFAULT) */
    const char *serve;               /* --partitions ("all", "0-3"); NULL: all, or the node's */
    const kf_placement_t *placement; /* borrowed; NULL: none */
    const char *node;                /* --node: this process in the placement; NULL: none */
    /* Every engine's configuration; the home engine's keeps `auth`, the
     * partitions' get their index and no key registry of their own. */
    kf_engine_config_t engine;
} kf_partitions_options_t;

/* Opens (or creates) the data set and recovers the engines of the served
 * partitions. Errors: KF_E_INVALID (a count or set that does not fit the
 * data set, a partition directory of another data set or partition, a
 * missing partition), KF_E_IO, KF_E_CORRUPT, and what kf_engine_create
 * answers. Nothing is left open on error. */
kf_status_t kf_partitions_open(const kf_partitions_options_t *options, kf_partitions_t **out,
                               kf_error_t *err) KF_MUST_USE;
kf_router_t *kf_partitions_router(kf_partitions_t *partitions);
/* Starts every engine's threads. */
kf_status_t kf_partitions_start(kf_partitions_t *partitions, kf_error_t *err) KF_MUST_USE;
/* Stops every engine (each finishes and syncs what it accepted). */
void kf_partitions_stop(kf_partitions_t *partitions);
/* Stops, destroys the engines and the router, closes the stores. */
void kf_partitions_close(kf_partitions_t *partitions);
/* One line for the log: "8 partitions (kf-hash-1), serving 0-3" or "1
 * partition (a single store written before partitions)". */
const char *kf_partitions_describe(const kf_partitions_t *partitions);
/* How long opening took: the stores (RocksDB replaying its WALs) and the
 * engines' recovery, summed over the partitions. */
void kf_partitions_timing(const kf_partitions_t *partitions, int64_t *open_ms, int64_t *recover_ms);
/* The identity a served partition's directory holds (its KEYFLOW-PARTITION
 * id; "" for a single store written before partitions). */
const char *kf_partitions_id(const kf_partitions_t *partitions, uint32_t partition);

#endif
