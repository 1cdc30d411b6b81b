/*
 * keys.h - the byte layout of every stored key.
 *
 * Integers are big-endian (signed times with the sign bit flipped) so that
 * RocksDB's bytewise order is numeric order; strings are u16-length-prefixed
 * so that no identity's key is a prefix of another identity's key. Each
 * builder asserts its result fits KF_STORE_KEY_BYTES_MAX.
 *
 *   coord_state      id                                               -> state
 *   coord_index      id                                               -> wake-up ord64, flags u8
 *   coord_items      id | 1 | seq be64                                -> remembered ID
 *                    id | 2 | event ID bytes                          -> its seq be64
 *                    id | 3 | seq be64                                -> window event
 *                    id | 4                                           -> recent runs
 *   coord_history    id | seq be64                                    -> journal entry
 *   coord_windows    run_id bytes                                     -> id (open windows)
 *   coord_snapshots  kind u8 | lp(workflow) | lp(key)                 -> snapshot (format 1)
 *   coord_journal    <coord key> | seq be64                           -> entry (format 1)
 *   runs             run_id bytes                                     -> run record
 *   run_index        lp(workflow) | run_seq be64                      -> run_id
 *   run_queue        run_seq be64                                     -> run_id (older builds)
 *   run_live         run_seq be64                                     -> live run state
 *   run_state        run_id bytes                                     -> final run state
 *   wakeups          1 | coordinator key                           -> due_ms ord64
 *                    2 | due_ms ord64 | run_id                     -> (empty)
 *
 * A coordinator's id is a keyed hash of its identity (kf_key_coord's bytes;
 * coord/coord.c): fixed-size keys, and all of a coordinator's records under
 * one prefix. Wake-ups of type 1 (coordinators) are format 1 only; run
 * wake-ups are keyed by time so the retention sweep can scan the due ones of
 * runs no longer in memory.
 */
#ifndef KF_STORAGE_KEYS_H
#define KF_STORAGE_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/limits.h"

/* The longest key any record may have. Each kind of record whose key holds
 * a client's bytes asserts that its longest key fits, here for the
 * coordinators' and in functions/functions_int.h for process functions'
 * (a timer by time: prefix, time and a canonical key of up to
 * KF_FUNCTION_KEY_BYTES_MAX with a timer name, about 4.2 KB), so that no
 * accepted request can reach the builders' assertion. */
#define KF_STORE_KEY_BYTES_MAX 4352

_Static_assert(16 + 1 + KF_EVENT_ID_BYTES_MAX <= KF_STORE_KEY_BYTES_MAX, "item keys fit");
_Static_assert(1 + 2 + KF_WORKFLOW_BYTES_MAX + 2 + KF_KEY_BYTES_MAX + 8 + 9 <=
                   KF_STORE_KEY_BYTES_MAX,
               "coordinator keys fit");

typedef struct kf_key {
    uint8_t bytes[KF_STORE_KEY_BYTES_MAX];
    size_t len;
} kf_key_t;

void kf_key_reset(kf_key_t *k);
void kf_key_u8(kf_key_t *k, uint8_t v);
void kf_key_be64(kf_key_t *k, uint64_t v);
void kf_key_time(kf_key_t *k, int64_t ms);
void kf_key_lp(kf_key_t *k, const char *s, size_t len); /* u16 length, bytes */
void kf_key_raw(kf_key_t *k, const void *p, size_t len);

/* A reader over a key; each getter returns false when the key is too short
 * or malformed (a corrupt key is KF_E_CORRUPT to the caller). */
typedef struct kf_key_reader {
    const uint8_t *p;
    size_t left;
} kf_key_reader_t;

static inline kf_key_reader_t kf_key_reader(const void *p, size_t len) {
    return (kf_key_reader_t){(const uint8_t *)p, len};
}
bool kf_key_read_u8(kf_key_reader_t *r, uint8_t *v);
bool kf_key_read_be64(kf_key_reader_t *r, uint64_t *v);
bool kf_key_read_time(kf_key_reader_t *r, int64_t *ms);
/* Points into the key: valid while the key is. */
bool kf_key_read_lp(kf_key_reader_t *r, const char **s, size_t *len);

/* The key that follows every key starting with `prefix` (prefix with its last
 * non-0xff byte incremented). False when no such key exists (all 0xff). */
bool kf_key_prefix_end(const kf_key_t *prefix, kf_key_t *end);

/* Wake-up identities. */
typedef enum kf_wakeup_type {
    KF_WAKEUP_COORDINATOR = 1, /* a window closes or remembered IDs expire */
    KF_WAKEUP_RUN = 2,         /* a lease expires or a finished run's retention ends */
} kf_wakeup_type_t;

/* A coordinator's identity: the bytes its id hashes (and format 1's key). */
void kf_key_coord(kf_key_t *k, uint8_t kind, const char *workflow, size_t workflow_len,
                  const char *key, size_t key_len);
void kf_key_journal(kf_key_t *k, const kf_key_t *coord, uint64_t seq);

#define KF_COORD_ID_BYTES 16
/* The kinds of record under a coordinator's id in coord_items. */
typedef enum kf_coord_item {
    KF_COORD_ITEM_ID = 1,      /* remembered IDs by seq (arrival order) */
    KF_COORD_ITEM_ID_NAME = 2, /* remembered IDs by ID */
    KF_COORD_ITEM_EVENT = 3,   /* the open window's events by seq */
    KF_COORD_ITEM_RECENT = 4,  /* recent runs */
} kf_coord_item_t;

/* coord_state, coord_index: the id; coord_history: id | seq. */
void kf_key_coord_id(kf_key_t *k, const uint8_t id[KF_COORD_ID_BYTES]);
void kf_key_coord_history(kf_key_t *k, const uint8_t id[KF_COORD_ID_BYTES], uint64_t seq);
/* coord_items: id | item, then seq (KF_COORD_ITEM_ID, _EVENT), the event ID
 * (_ID_NAME) or nothing (_RECENT, and the prefix of an item kind). */
void kf_key_coord_item(kf_key_t *k, const uint8_t id[KF_COORD_ID_BYTES], kf_coord_item_t item);
void kf_key_coord_item_seq(kf_key_t *k, const uint8_t id[KF_COORD_ID_BYTES], kf_coord_item_t item,
                           uint64_t seq);
void kf_key_coord_item_name(kf_key_t *k, const uint8_t id[KF_COORD_ID_BYTES], const char *name,
                            size_t name_len);
/* The wake-up key; due_ms is part of it only for KF_WAKEUP_RUN. */
void kf_key_wakeup(kf_key_t *k, int64_t due_ms, kf_wakeup_type_t type, const void *identity,
                   size_t identity_len);
void kf_key_run_index(kf_key_t *k, const char *workflow, size_t workflow_len, uint64_t run_seq);
void kf_key_run_queue(kf_key_t *k, uint64_t run_seq);
void kf_key_run_live(kf_key_t *k, uint64_t run_seq);

#endif
