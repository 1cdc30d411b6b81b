/*
 * partition.h - which partition a key belongs to, sets of partitions, and
 * the partition a run ID names (docs/scaling.md).
 *
 * The hash ("kf-hash-1") is part of the data format: every client, the
 * proxy's Lua script and keyflowd compute it the same way, and
 * tests/partition_vectors.json pins it for all of them. Never change it
 * for an existing data set.
 *
 *   kf-hash-1(bytes) = fmix32(fnv1a32(bytes))
 *     fnv1a32: h = 2166136261; for each byte b: h = (h ^ b) * 16777619
 *     fmix32 (MurmurHash3's finalizer, so that every bit of h depends on
 *     every input bit; FNV's low bits alone depend only on the inputs' low
 *     bits): h ^= h >> 16; h *= 0x85ebca6b; h ^= h >> 13;
 *            h *= 0xc2b2ae35; h ^= h >> 16
 *     (all arithmetic mod 2^32)
 *   partition = kf-hash-1(input) mod P, where the input is
 *     a coordinator (workflow, key): u32be(len(workflow)) workflow
 *                                     u32be(len(key)) key
 *     a process-function key: its canonical key (per key column, u32be
 *                                     length and the UTF-8 bytes) for a
 *                                     SPLIT function; for a SINGLE one
 *                                     (the default) every key is in the
 *                                     function's home:
 *     a function's home:              u32be(len(function_id)) function_id
 *   so a coordinator hashes like a key of two columns, and a home like a
 *   key of one.
 *
 * Run IDs ("<key>@<uuid>") carry their partition: the UUIDv7's 12 rand_a
 * bits (the three hex digits after the version digit '7') hold it, so a
 * call naming only a run ID (GetRun, CompleteRun, HeartbeatRun) routes
 * without the workflow.
 *
 * Pure functions; any thread.
 */
#ifndef KF_BASE_PARTITION_H
#define KF_BASE_PARTITION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/limits.h"
#include "base/status.h"

#define KF_PARTITION_HASH_NAME "kf-hash-1"

/* kf-hash-1 of `len` bytes. */
uint32_t kf_partition_hash(const void *bytes, size_t len);
/* The partition of a canonical function key. count >= 1. */
uint32_t kf_partition_of_key(const void *canonical_key, size_t len, uint32_t count);
/* The partition of a coordinator (workflow, key) of any kind. count >= 1. */
uint32_t kf_partition_of_coordinator(const char *workflow, size_t workflow_len, const char *key,
                                     size_t key_len, uint32_t count);

/* The home partition of a function (every key of a SINGLE function is
 * there). count >= 1. */
uint32_t kf_partition_home_of_function(const char *function_id, size_t len, uint32_t count);

/* The same hash fed one key column at a time, for a key that is not one
 * string in memory (a row's key columns): init, then per column its bytes
 * (the length prefix is added here), then the partition. */
typedef struct kf_partition_hasher {
    uint32_t h;
} kf_partition_hasher_t;
void kf_partition_hasher_init(kf_partition_hasher_t *hasher);
void kf_partition_hasher_column(kf_partition_hasher_t *hasher, const void *bytes, size_t len);
uint32_t kf_partition_hasher_partition(const kf_partition_hasher_t *hasher, uint32_t count);

/* Writes `partition` into a UUIDv7's text (8-4-4-4-12) as its rand_a. */
void kf_partition_tag_uuid(char uuid[KF_UUID_TEXT_BYTES + 1], uint32_t partition);
/* The partition a run ID names: always 0 when count == 1 (IDs written
 * before partitions existed carry random bits there); -1 when the ID has
 * no UUIDv7 after its last '@' or names a partition >= count. */
int32_t kf_partition_of_run_id(const char *run_id, uint32_t count);

/* A set of partitions of a data set of `count`. */
typedef struct kf_partition_set {
    uint32_t count;                             /* the data set's P */
    uint64_t bits[KF_PARTITION_COUNT_MAX / 64]; /* bit i: partition i is in */
} kf_partition_set_t;

/* Parses "all", or a comma-separated list of partitions and ranges
 * ("0-3,6"), of a data set of `count` partitions. Errors (KF_E_INVALID,
 * naming `what`): a malformed list, a partition >= count, an empty set. */
kf_status_t kf_partition_set_parse(const char *what, const char *text, uint32_t count,
                                   kf_partition_set_t *out, kf_error_t *err) KF_MUST_USE;
/* Every partition of `count`. */
void kf_partition_set_all(uint32_t count, kf_partition_set_t *out);
bool kf_partition_set_has(const kf_partition_set_t *set, uint32_t partition);
void kf_partition_set_add(kf_partition_set_t *set, uint32_t partition);
uint32_t kf_partition_set_size(const kf_partition_set_t *set);
/* The set as ranges ("0-3,6"); cut short (ending in "...") when it does not
 * fit `cap`. */
void kf_partition_set_format(const kf_partition_set_t *set, char *out, size_t cap);

#endif
