/*
 * keys.h - the Keys service: API keys created, listed and revoked through
 * the engine, stored in the api_keys column family, published to the
 * front ends' registry (auth/auth.h).
 *
 *   api_keys  0x00 "secret"      -> the store's 32-byte HMAC key
 *             0x00 "bootstrap"   -> created_ms of the bootstrap admin key
 *             0x01 <key id>      -> ApiKeyRec (name, hash, grants)
 *
 * Invariants
 *   1. The store secret is made once, in the write of the first key, and
 *      never changes: every stored hash depends on it.
 *   2. A key's secret exists only in the CreateKey response (and the
 *      bootstrap file): what is stored and held in memory is its hash.
 *   3. The registry holds exactly the keys whose records are stored: a key
 *      is published when its record is put in the step's batch and
 *      withdrawn when its delete is (a revoke takes effect for the next
 *      call, before its reply leaves).
 *   4. The bootstrap admin key is made at most once per store (a marker
 *      records it), so revoking every key never brings a new one back by
 *      itself; --new-admin-key asks for one explicitly.
 *
 * Engine-thread only.
 */
#ifndef KF_KEYS_KEYS_H
#define KF_KEYS_KEYS_H

#include "auth/auth.h"
#include "step/ctx.h"

typedef struct kf_keys kf_keys_t;

/* `auth` is borrowed and outlives the module. */
kf_keys_t *kf_keys_create(kf_auth_t *auth);
void kf_keys_destroy(kf_keys_t *keys);

/*
 * Loads the store secret and every key into the registry. When the
 * registry is enabled and the store never had a bootstrap key, or
 * config->new_admin_key asks for one, makes an admin key (every scope, no
 * prefix): the operator's, from config->admin_key_path, or a new one whose
 * text is written to config->bootstrap_key_path (mode 0600, created, never
 * overwritten, fsynced) BEFORE its record goes into the batch: if the file
 * cannot be written, recovery fails and the caller must write nothing.
 * Errors: KF_E_CORRUPT (a malformed record), KF_E_IO (the key file cannot
 * be written), KF_E_INVALID (the admin key file holds no key), KF_E_EXISTS
 * (the bootstrap file already exists: it would be another store's key).
 */
kf_status_t kf_keys_recover(kf_keys_t *keys, kf_ctx_t *ctx, kf_error_t *err) KF_MUST_USE;
/* After recovery's write is durable: logs the bootstrap key file's path
 * (never the key) if recovery wrote one. */
void kf_keys_finish_recovery(kf_keys_t *keys);
/* Recovery failed after kf_keys_recover (its batch is not written):
 * removes the bootstrap key file it wrote, whose key was never stored. */
void kf_keys_abandon_recovery(kf_keys_t *keys);

/* The Keys RPCs (rows of proto/rpcs.h). */
void kf_keys_create_key(kf_keys_t *keys, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_keys_list(kf_keys_t *keys, kf_ctx_t *ctx, kf_cmd_t *cmd);
void kf_keys_revoke(kf_keys_t *keys, kf_ctx_t *ctx, kf_cmd_t *cmd);

#endif
