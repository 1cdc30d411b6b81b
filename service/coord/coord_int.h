/*
 * coord_int.h - what the coordinator files share: rule records (coord.c)
 * and the upgrade of store format 1 (upgrade.c). Not for other modules.
 *
 * Engine-thread only.
 */
#ifndef KF_COORD_COORD_INT_H
#define KF_COORD_COORD_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/crypto.h"
#include "coord/window.h"
#include "records/records.pb-c.h"
#include "step/ctx.h"

/* The two SipHash keys of a store's coordinator ids (coord.c, 1). */
typedef struct kf_coord_id_key {
    uint8_t k[2][KF_SIPHASH_KEY_BYTES];
} kf_coord_id_key_t;

/* A coordinator's id: both keyed hashes of its identity bytes (kf_key_coord). */
void kf__coord_id(const kf_coord_id_key_t *key, const void *ident, size_t ident_len,
                  uint8_t id[KF_COORD_ID_BYTES]);

/* `retry` is storage the record may point at while it is encoded. */
void kf__rule_to_rec(const kf_rule_t *rule, Keyflow__Records__RuleRec *rec,
                     Keyflow__Records__RetryRec *retry);
/* A stored rule must be one kf_rule_resolve could have produced (the same
 * ranges): anything else was not written by this engine. */
bool kf__rule_from_rec(const Keyflow__Records__RuleRec *rec, kf_rule_t *rule);

/* Rewrites every coordinator of store format 1 (snapshots and journals in
 * coord_snapshots and coord_journal, wake-ups of type 1) as format 2's
 * records, a bounded batch of whole coordinators per write, deleting the
 * old records in the same writes: a crash part way leaves each coordinator
 * in one format or the other, and the next start goes on. Coordinators
 * that had nothing left to do at now_ms are dropped. Records the current
 * format version with the last write. Errors: KF_E_CORRUPT (a record this
 * engine could not have written: nothing of it is rewritten), KF_E_IO. */
kf_status_t kf__coords_upgrade(const kf_coord_id_key_t *key, kf_ctx_t *ctx,
                               kf_error_t *err) KF_MUST_USE;

#endif
