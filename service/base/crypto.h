/*
 * crypto.h - SHA-256, a CTR_DRBG random source and UUIDs (mbedTLS), and
 * SipHash-2-4 (a keyed hash for identities a client chooses).
 *
 * A kf_rng_t belongs to one thread (the engine owns its own). Seeded from
 * the system entropy source, or from a fixed seed for deterministic tests.
 */
#ifndef KF_BASE_CRYPTO_H
#define KF_BASE_CRYPTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mbedtls/sha256.h>

#include "base/status.h"

#define KF_SHA256_BYTES     32
#define KF_SHA256_HEX_BYTES 64

void kf_sha256(const void *data, size_t len, uint8_t out[KF_SHA256_BYTES]);
/* SHA-256 of the concatenation a | b, without copying them together. */
void kf_sha256_pair(const void *a, size_t a_len, const void *b, size_t b_len,
                    uint8_t out[KF_SHA256_BYTES]);

/* Incremental SHA-256: begin, any number of updates, finish. The context is
 * the caller's (on the stack); finish leaves nothing to free. */
typedef struct kf_sha256_ctx {
    mbedtls_sha256_context c;
} kf_sha256_ctx_t;
void kf_sha256_begin(kf_sha256_ctx_t *h);
void kf_sha256_update(kf_sha256_ctx_t *h, const void *data, size_t len);
void kf_sha256_finish(kf_sha256_ctx_t *h, uint8_t out[KF_SHA256_BYTES]);
/* KF_E_IO (message names the path) when the file cannot be read. */
kf_status_t kf_sha256_file(const char *path, uint8_t out[KF_SHA256_BYTES],
                           kf_error_t *err) KF_MUST_USE;
/* Lowercase hex, NUL-terminated: out has KF_SHA256_HEX_BYTES + 1 bytes. */
void kf_hex_encode(const uint8_t *bytes, size_t len, char *out);

/*
 * HMAC-SHA256 (RFC 2104) under one fixed key. kf_hmac_key_init absorbs the
 * key's inner and outer pads once; each kf_hmac_sha256 afterwards clones
 * those states, so a MAC costs four SHA-256 blocks and allocates nothing
 * (the API-key check runs once per call). A key is read-only after init and
 * may be used from any number of threads.
 */
typedef struct kf_hmac_key {
    mbedtls_sha256_context inner; /* after (key ^ ipad) */
    mbedtls_sha256_context outer; /* after (key ^ opad) */
} kf_hmac_key_t;

void kf_hmac_key_init(kf_hmac_key_t *key, const void *secret, size_t secret_len);
void kf_hmac_key_deinit(kf_hmac_key_t *key);
void kf_hmac_sha256(const kf_hmac_key_t *key, const void *data, size_t len,
                    uint8_t out[KF_SHA256_BYTES]);

/* Whether a and b (len bytes each) are equal, in time that depends on len
 * only: for comparing secrets and their hashes. */
bool kf_ct_equal(const void *a, const void *b, size_t len);

/* SipHash-2-4 (Aumasson and Bernstein) of data under a 128-bit key, as
 * the reference's 64-bit output: a keyed hash whose collisions a client
 * cannot find without the key, at a few ns per byte. */
#define KF_SIPHASH_KEY_BYTES 16
uint64_t kf_siphash(const uint8_t key[KF_SIPHASH_KEY_BYTES], const void *data, size_t len);

typedef struct kf_rng kf_rng_t;

/* seed == NULL: seed from system entropy. Otherwise the stream is a pure
 * function of all the seed bytes (hashed; any length), for tests. NULL on
 * failure. */
kf_rng_t *kf_rng_create(const void *seed, size_t seed_len);
void kf_rng_destroy(kf_rng_t *rng);
void kf_rng_bytes(kf_rng_t *rng, void *out, size_t len);

/* A UUIDv7 (48-bit Unix ms, then random) as 36 characters plus NUL, so that
 * run IDs sort roughly by creation time. */
void kf_uuid7(kf_rng_t *rng, int64_t now_ms, char out[KF_UUID_TEXT_BYTES + 1]);

#endif
