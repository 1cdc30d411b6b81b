/*
 * overlay.h - read-your-writes across group commit.
 *
 * The engine hands a group's batch to the committer and goes on preparing
 * the next group while the first is written and synced; a read of the store
 * sees a group's records only once the committer has written them, which
 * may be after later commands already ran. An overlay keeps the records
 * that groups not yet durable wrote to the families it tracks, and reads
 * through it (kf_overlay_get, kf_overlay_iter_create) see the store as it
 * will be once every staged group is written: a command always sees what
 * the commands before it wrote, whether their group is written yet or not.
 *
 *   stage: kf_overlay_put / _delete / _delete_prefix (with the batch write)
 *   read:  kf_overlay_get / kf_overlay_iter_create (staged first, then the store)
 *   drop:  kf_overlay_durable(group): the store holds it now
 *
 * Invariants
 *   1. A staged record belongs to the latest group that wrote it and is
 *      dropped when that group is durable; the store then holds that record
 *      or something later.
 *   2. A read through the overlay of a tracked family answers as the store
 *      would after every staged operation, in staging order.
 *   3. A prefix delete hides every stored key under the prefix until its
 *      group is durable, and turns the staged records under it into staged
 *      deletes of the same group; a record staged under the prefix later
 *      belongs to a later or the same group, so no staged record outlives a
 *      prefix delete that it must override.
 *   4. Memory is what the staged groups wrote to tracked families (bounded
 *      by the engine's group limits, KF_GROUP_BYTES_MAX), and nothing once
 *      every group is durable.
 *
 * Only families the owner tracks are staged (kf_overlay_track): a family
 * that is written often and read only by scans at start or by reads that
 * may lag (the journal, output rows) stays out and costs nothing.
 *
 * Single-threaded: the engine thread stages, reads and drops. The store is
 * borrowed and outlives the overlay. Iterators must be destroyed before the
 * next kf_overlay_durable; records staged while one is open may or may not
 * show in it.
 */
#ifndef KF_STORAGE_OVERLAY_H
#define KF_STORAGE_OVERLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "storage/store.h"

typedef struct kf_overlay kf_overlay_t;

kf_overlay_t *kf_overlay_create(kf_store_t *store);
void kf_overlay_destroy(kf_overlay_t *overlay);

/* Stages this family's writes from now on (call before the first write). */
void kf_overlay_track(kf_overlay_t *overlay, kf_cf_t cf);
bool kf_overlay_tracks(const kf_overlay_t *overlay, kf_cf_t cf);

/* Stage one operation of group `group` (groups only increase); the caller
 * puts the same operation in that group's batch. Keys and values are
 * copied. The family must be tracked. */
void kf_overlay_put(kf_overlay_t *overlay, uint64_t group, kf_cf_t cf, const void *key,
                    size_t key_len, const void *value, size_t value_len);
void kf_overlay_delete(kf_overlay_t *overlay, uint64_t group, kf_cf_t cf, const void *key,
                       size_t key_len);
/* Every key that starts with `prefix` (the batch gets the matching range
 * delete: [prefix, kf_key_prefix_end(prefix))). At most
 * KF_OVERLAY_PREFIX_LENGTHS_MAX distinct prefix lengths per family. */
void kf_overlay_delete_prefix(kf_overlay_t *overlay, uint64_t group, kf_cf_t cf, const void *prefix,
                              size_t prefix_len);
#define KF_OVERLAY_PREFIX_LENGTHS_MAX 8

/* Every group <= `group` is durable: forget what they staged. */
void kf_overlay_durable(kf_overlay_t *overlay, uint64_t group);

/* kf_store_get through the overlay (same contract: *found false and an
 * empty value when absent; free the value with kf_store_value_free). */
kf_status_t kf_overlay_get(kf_overlay_t *overlay, kf_cf_t cf, const void *key, size_t key_len,
                           kf_value_t *value, bool *found, kf_error_t *err) KF_MUST_USE;
/* kf_iter_create through the overlay: the store's records under the staged
 * ones, in key order, without the staged deletes. */
kf_status_t kf_overlay_iter_create(kf_overlay_t *overlay, kf_cf_t cf, const void *lower,
                                   size_t lower_len, const void *upper, size_t upper_len,
                                   kf_iter_t **out, kf_error_t *err) KF_MUST_USE;

/* Staged records and the bytes they hold (keys and values), for tests and
 * metrics. */
size_t kf_overlay_count(const kf_overlay_t *overlay);
size_t kf_overlay_bytes(const kf_overlay_t *overlay);

#endif
