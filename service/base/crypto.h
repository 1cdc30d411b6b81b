/*
 * crypto.h - SHA-256, a CTR_DRBG random source and UUIDs (mbedTLS).
 *
 * A kf_rng_t belongs to one thread (the engine owns its own). Seeded from
 * the system entropy source, or from a fixed seed for deterministic tests.
 */
#ifndef KF_BASE_CRYPTO_H
#define KF_BASE_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define KF_SHA256_BYTES     32
#define KF_SHA256_HEX_BYTES 64

void kf_sha256(const void *data, size_t len, uint8_t out[KF_SHA256_BYTES]);
/* KF_E_IO (message names the path) when the file cannot be read. */
kf_status_t kf_sha256_file(const char *path, uint8_t out[KF_SHA256_BYTES],
                           kf_error_t *err) KF_MUST_USE;
/* Lowercase hex, NUL-terminated: out has KF_SHA256_HEX_BYTES + 1 bytes. */
void kf_hex_encode(const uint8_t *bytes, size_t len, char *out);

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
