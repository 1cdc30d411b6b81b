/*
 * auth.h - API keys as principals: who is calling (authentication) and
 * whether the call is within the key's grants (authorization).
 *
 * An API key is the text "kf_" <key id: 16 hex> "_" <secret: 64 hex>. The
 * key id is public (listings, logs, ownership records); the secret is 32
 * random bytes (the engine's CTR_DRBG) that only the caller knows. keyflowd
 * keeps HMAC-SHA256(store secret, secret bytes) and nothing else, in memory
 * (this registry) and in the api_keys column family (service/keys).
 *
 * A call is checked in two steps by the front end that received it:
 *   kf_auth_authenticate  the authorization header -> a principal (no disk
 *                         read, no allocation: a hash lookup by key id under
 *                         a read lock, one HMAC, a constant-time compare)
 *   kf_auth_authorize     the principal, the RPC's row (scope, resource
 *                         field) and the decoded request -> allowed or
 *                         PERMISSION_DENIED
 * and, for requests that name their resource only indirectly (a run id),
 * by the engine with kf_principal_allows once it knows the workflow.
 *
 * Threads: the registry is written by the engine thread (key created,
 * revoked, loaded at recovery) and read by every front-end thread. A
 * principal is immutable but for its revoked flag, and reference counted:
 * a call holds its principal from authentication until its reply, so a
 * revocation during the call frees nothing the call still reads.
 *
 * Revocation reaches open calls too (long polls, tails, worker streams):
 * kf_auth_remove marks the principal revoked; a front end checks the flag
 * (kf_principal_check_open) before each reply or stream message it sends,
 * so nothing more leaves for a revoked key, and every engine, seeing
 * kf_auth_revocations move, ends its parked commands and worker streams
 * of revoked keys with UNAUTHENTICATED at its next turn.
 */
#ifndef KF_AUTH_AUTH_H
#define KF_AUTH_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "base/crypto.h"
#include "base/status.h"
#include "proto/methods.h"

#define KF_API_KEY_ID_CHARS     16
#define KF_API_KEY_SECRET_BYTES 32
/* "kf_" id "_" secret-hex */
#define KF_API_KEY_TEXT_BYTES (3 + KF_API_KEY_ID_CHARS + 1 + 2 * KF_API_KEY_SECRET_BYTES)
/* The per-store HMAC key. */
#define KF_AUTH_STORE_SECRET_BYTES 32

/* Which names a scope's prefix limits. */
typedef enum kf_scope_resource {
    KF_SCOPE_RESOURCE_NONE,     /* no prefix allowed (metrics:read, keys:admin) */
    KF_SCOPE_RESOURCE_WORKFLOW, /* events, coordinators, runs */
    KF_SCOPE_RESOURCE_FUNCTION, /* functions:* */
} kf_scope_resource_t;

kf_scope_resource_t kf_scope_resource(kf_scope_t scope);
/* The scope named `name` ("events:send"); false when there is none (or it
 * is "none", which no key can be granted). */
bool kf_scope_parse(const char *name, kf_scope_t *out);

typedef struct kf_grant {
    kf_scope_t scope;
    char prefix[KF_GRANT_PREFIX_BYTES_MAX + 1]; /* "" = every name */
} kf_grant_t;

typedef struct kf_principal kf_principal_t;

/* What a key is, for kf_principal_create (copied). */
typedef struct kf_principal_spec {
    const char *key_id; /* KF_API_KEY_ID_CHARS lowercase hex */
    const char *name;
    const uint8_t *hash; /* KF_SHA256_BYTES: HMAC of the secret */
    const kf_grant_t *grants;
    size_t grant_count; /* 1..KF_GRANTS_MAX */
    int64_t created_ms;
    const char *created_by; /* key id, or "" */
} kf_principal_spec_t;

/* One reference; never NULL (out of memory ends the process: base/alloc.h). */
kf_principal_t *kf_principal_create(const kf_principal_spec_t *spec);
void kf_principal_ref(kf_principal_t *p);
/* NULL is a no-op. */
void kf_principal_unref(kf_principal_t *p);

/* The key id ("" for NULL: no key, auth off), for ownership records. */
const char *kf_principal_id(const kf_principal_t *p);
const char *kf_principal_name(const kf_principal_t *p);
int64_t kf_principal_created_ms(const kf_principal_t *p);
const char *kf_principal_created_by(const kf_principal_t *p);
const kf_grant_t *kf_principal_grants(const kf_principal_t *p, size_t *count);
/* The stored hash (KF_SHA256_BYTES), for the key's record. */
const uint8_t *kf_principal_hash(const kf_principal_t *p);
/* Whether p's key was revoked (NULL p: false). Any thread. */
bool kf_principal_revoked(const kf_principal_t *p);
/* KF_OK while p's key is live (or p is NULL); KF_E_UNAUTHENTICATED, saying
 * the key was revoked during the call, once it is not. For a front end
 * about to send an open call's next reply or message. Any thread. */
kf_status_t kf_principal_check_open(const kf_principal_t *p, kf_error_t *err) KF_MUST_USE;
/* Whether p may act under `scope` on the workflow or function `name`
 * (NULL p: auth is off or the row needs no key: true). */
bool kf_principal_allows(const kf_principal_t *p, kf_scope_t scope, const char *name);

/* ---- the registry ------------------------------------------------------ */

typedef struct kf_auth kf_auth_t;

/* enabled false: every call passes without a key (authenticate gives NULL
 * principals). NULL when out of memory. */
kf_auth_t *kf_auth_create(bool enabled);
/* Drops every principal the registry holds. No call may be in progress. */
void kf_auth_destroy(kf_auth_t *auth);
bool kf_auth_enabled(const kf_auth_t *auth);

/* The store's HMAC key (service/keys loads or makes it at recovery), set
 * once before any key is put or any call is authenticated. */
void kf_auth_set_store_secret(kf_auth_t *auth, const uint8_t secret[KF_AUTH_STORE_SECRET_BYTES]);
/* The stored hash of a key's secret. */
void kf_auth_hash_secret(const kf_auth_t *auth, const uint8_t secret[KF_API_KEY_SECRET_BYTES],
                         uint8_t out[KF_SHA256_BYTES]);

/* Adds a principal (the registry takes the reference); its key id must not
 * be present. Engine thread. */
void kf_auth_put(kf_auth_t *auth, kf_principal_t *p);
/* Removes the key and marks its principal revoked; the next call with it
 * is UNAUTHENTICATED, and open calls end (above). Returns false when the
 * id is not present. Engine thread. */
bool kf_auth_remove(kf_auth_t *auth, const char *key_id);
/* How many keys were removed since the registry was made (0 for NULL): an
 * engine that sees it move looks for open calls of revoked keys. Any
 * thread. */
uint64_t kf_auth_revocations(const kf_auth_t *auth);
size_t kf_auth_count(kf_auth_t *auth);

/* Splits a key's text (len bytes, exactly KF_API_KEY_TEXT_BYTES) into its
 * id (NUL-terminated) and secret; false when it is not one. */
bool kf_api_key_parse(const char *text, size_t len, char id[KF_API_KEY_ID_CHARS + 1],
                      uint8_t secret[KF_API_KEY_SECRET_BYTES]);
/* The text of a key: out has KF_API_KEY_TEXT_BYTES + 1 bytes. */
void kf_api_key_format(const char *key_id, const uint8_t secret[KF_API_KEY_SECRET_BYTES],
                       char *out);

/*
 * Authentication for a call of an RPC that needs `scope`. `authorization`
 * is the first authorization header's value (len bytes, not NUL-terminated;
 * NULL when absent) and `count` how many authorization headers the call
 * carried: more than one is refused, never resolved by taking one of them
 * (a proxy and a client that disagree on which one counts must not make
 * two different callers of one request).
 * On KF_OK *out is the caller's principal with a reference the caller
 * drops (kf_principal_unref), or NULL when auth is off or the scope is
 * KF_SCOPE_NONE. Errors: KF_E_UNAUTHENTICATED (no header, several, not a
 * bearer keyflow key, unknown or revoked key: the message says which,
 * without telling an unknown key from a wrong secret). Any thread.
 */
kf_status_t kf_auth_authenticate(kf_auth_t *auth, kf_scope_t scope, const char *authorization,
                                 size_t len, size_t count, kf_principal_t **out,
                                 kf_error_t *err) KF_MUST_USE;

/*
 * Authorization of a decoded request of `method` (its row's scope and
 * resource field): the principal needs a grant of the scope whose prefix
 * starts every name in the resource field. An empty name in an optional
 * filter (ListRuns' workflow, PollRuns' workflows) means "every name", so
 * only a grant without a prefix covers it. NULL principal: allowed. NULL
 * request: the scope alone (checked before the request is decoded, so a
 * key without the scope learns nothing about its request).
 * Errors: KF_E_PERMISSION naming the scope or the field and its value.
 */
kf_status_t kf_auth_authorize(const kf_principal_t *p, const kf_method_t *method,
                              const ProtobufCMessage *request, kf_error_t *err) KF_MUST_USE;

/* A listener address ("host:port") that only this machine can reach:
 * 127.0.0.0/8, [::1] or localhost. Anything else, names included, is not. */
bool kf_address_is_loopback(const char *address);

/* An HTTP Host header (or HTTP/2 :authority) naming this machine by a
 * loopback literal: "localhost", an IPv4 address in 127.0.0.0/8 or "[::1]",
 * each with an optional ":port" (len bytes, not NUL-terminated). Other names
 * are not, even if they resolve to 127.0.0.1 (that is what DNS rebinding
 * relies on). */
bool kf_host_is_loopback(const char *host, size_t len);

/* An Origin header ("http://localhost:3000") whose scheme is http or https
 * and whose host is a loopback literal as above. "null" and anything else
 * are not. */
bool kf_origin_is_loopback(const char *origin, size_t len);

#endif
