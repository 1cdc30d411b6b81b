/* crypto.c - mbedTLS-backed hashing and randomness. */
#include "base/crypto.h"

#include <stdlib.h>
#include <string.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/md.h>
#include <mbedtls/platform_util.h>

#include "base/assert.h"

struct kf_rng {
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
    uint8_t seed[64]; /* fixed seed for deterministic mode */
    size_t seed_len;
    size_t seed_offset;
    int fixed;
};

/* ---- SipHash-2-4 ---------------------------------------------------------- */

static uint64_t rotl64(uint64_t x, int b) {
    return (x << b) | (x >> (64 - b));
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

/* One SipRound over the state v[0..3]. */
static void sip_round(uint64_t v[4]) {
    v[0] += v[1];
    v[1] = rotl64(v[1], 13);
    v[1] ^= v[0];
    v[0] = rotl64(v[0], 32);
    v[2] += v[3];
    v[3] = rotl64(v[3], 16);
    v[3] ^= v[2];
    v[0] += v[3];
    v[3] = rotl64(v[3], 21);
    v[3] ^= v[0];
    v[2] += v[1];
    v[1] = rotl64(v[1], 17);
    v[1] ^= v[2];
    v[2] = rotl64(v[2], 32);
}

static void sip_absorb(uint64_t v[4], uint64_t m) {
    v[3] ^= m;
    sip_round(v); /* c = 2 compression rounds */
    sip_round(v);
    v[0] ^= m;
}

uint64_t kf_siphash(const uint8_t key[KF_SIPHASH_KEY_BYTES], const void *data, size_t len) {
    uint64_t k0 = le64(key), k1 = le64(key + 8);
    /* "somepseudorandomlygeneratedbytes" */
    uint64_t v[4] = {k0 ^ 0x736f6d6570736575ULL, k1 ^ 0x646f72616e646f6dULL,
                     k0 ^ 0x6c7967656e657261ULL, k1 ^ 0x7465646279746573ULL};
    const uint8_t *p = data;
    size_t whole = len - len % 8;
    for (size_t i = 0; i < whole; i += 8) {
        sip_absorb(v, le64(p + i));
    }
    /* The last block: the remaining bytes, little-endian, with the length's
     * low byte on top. */
    uint64_t last = (uint64_t)(len & 0xff) << 56;
    for (size_t i = 0; i < len % 8; i++) {
        last |= (uint64_t)p[whole + i] << (8 * i);
    }
    sip_absorb(v, last);
    v[2] ^= 0xff;
    for (int i = 0; i < 4; i++) { /* d = 4 finalization rounds */
        sip_round(v);
    }
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}

void kf_sha256(const void *data, size_t len, uint8_t out[KF_SHA256_BYTES]) {
    int rc = mbedtls_md(mbedtls_md_info_from_type(MBEDTLS_MD_SHA256), data, len, out);
    KF_ASSERT(rc == 0);
}

void kf_sha256_pair(const void *a, size_t a_len, const void *b, size_t b_len,
                    uint8_t out[KF_SHA256_BYTES]) {
    mbedtls_md_context_t md;
    mbedtls_md_init(&md);
    int rc = mbedtls_md_setup(&md, mbedtls_md_info_from_type(MBEDTLS_MD_SHA256), 0);
    KF_ASSERT(rc == 0); /* only an allocation failure: abort like any OOM */
    rc = mbedtls_md_starts(&md) || mbedtls_md_update(&md, a, a_len) ||
         mbedtls_md_update(&md, b, b_len) || mbedtls_md_finish(&md, out);
    KF_ASSERT(rc == 0);
    mbedtls_md_free(&md);
}

void kf_sha256_begin(kf_sha256_ctx_t *h) {
    mbedtls_sha256_init(&h->c);
    KF_ASSERT(mbedtls_sha256_starts_ret(&h->c, 0) == 0);
}

void kf_sha256_update(kf_sha256_ctx_t *h, const void *data, size_t len) {
    KF_ASSERT(mbedtls_sha256_update_ret(&h->c, data, len) == 0);
}

void kf_sha256_finish(kf_sha256_ctx_t *h, uint8_t out[KF_SHA256_BYTES]) {
    KF_ASSERT(mbedtls_sha256_finish_ret(&h->c, out) == 0);
    mbedtls_sha256_free(&h->c);
}

kf_status_t kf_sha256_file(const char *path, uint8_t out[KF_SHA256_BYTES], kf_error_t *err) {
    int rc = mbedtls_md_file(mbedtls_md_info_from_type(MBEDTLS_MD_SHA256), path, out);
    if (rc != 0) {
        return kf_error_set(err, KF_E_IO, "cannot read %s to hash it", path);
    }
    return KF_OK;
}

#define SHA256_BLOCK_BYTES 64

void kf_hmac_key_init(kf_hmac_key_t *key, const void *secret, size_t secret_len) {
    /* A key longer than a block is hashed first (RFC 2104, section 2). */
    uint8_t k[SHA256_BLOCK_BYTES] = {0};
    if (secret_len > SHA256_BLOCK_BYTES) {
        kf_sha256(secret, secret_len, k);
    } else {
        memcpy(k, secret, secret_len);
    }
    uint8_t pad[SHA256_BLOCK_BYTES];
    for (size_t i = 0; i < sizeof pad; i++) {
        pad[i] = k[i] ^ 0x36;
    }
    mbedtls_sha256_init(&key->inner);
    KF_ASSERT(mbedtls_sha256_starts_ret(&key->inner, 0) == 0);
    KF_ASSERT(mbedtls_sha256_update_ret(&key->inner, pad, sizeof pad) == 0);
    for (size_t i = 0; i < sizeof pad; i++) {
        pad[i] = k[i] ^ 0x5c;
    }
    mbedtls_sha256_init(&key->outer);
    KF_ASSERT(mbedtls_sha256_starts_ret(&key->outer, 0) == 0);
    KF_ASSERT(mbedtls_sha256_update_ret(&key->outer, pad, sizeof pad) == 0);
    mbedtls_platform_zeroize(k, sizeof k);
    mbedtls_platform_zeroize(pad, sizeof pad);
}

void kf_hmac_key_deinit(kf_hmac_key_t *key) {
    mbedtls_sha256_free(&key->inner);
    mbedtls_sha256_free(&key->outer);
}

void kf_hmac_sha256(const kf_hmac_key_t *key, const void *data, size_t len,
                    uint8_t out[KF_SHA256_BYTES]) {
    mbedtls_sha256_context ctx;
    uint8_t inner[KF_SHA256_BYTES];
    mbedtls_sha256_init(&ctx);
    mbedtls_sha256_clone(&ctx, &key->inner);
    KF_ASSERT(mbedtls_sha256_update_ret(&ctx, data, len) == 0);
    KF_ASSERT(mbedtls_sha256_finish_ret(&ctx, inner) == 0);
    mbedtls_sha256_clone(&ctx, &key->outer);
    KF_ASSERT(mbedtls_sha256_update_ret(&ctx, inner, sizeof inner) == 0);
    KF_ASSERT(mbedtls_sha256_finish_ret(&ctx, out) == 0);
    mbedtls_sha256_free(&ctx);
}

bool kf_ct_equal(const void *a, const void *b, size_t len) {
    /* Every byte is read whatever the others are: the time depends on len
     * only. (mbedtls_ct_memcmp does the same through volatile byte reads,
     * several times slower on the per-call path of the API-key check.) */
    const uint8_t *x = a, *y = b;
    uint8_t diff = 0;
    for (size_t i = 0; i < len; i++) {
        diff |= (uint8_t)(x[i] ^ y[i]);
    }
    return diff == 0;
}

void kf_hex_encode(const uint8_t *bytes, size_t len, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * len] = '\0';
}

/* Deterministic "entropy": hands out the fixed seed, then zeros. Only the
 * initial seeding reads it (reseeding is off), so the stream is a function
 * of the seed alone. */
static int fixed_entropy(void *ctx, unsigned char *out, size_t len) {
    kf_rng_t *rng = ctx;
    for (size_t i = 0; i < len; i++) {
        out[i] = rng->seed_offset < rng->seed_len ? rng->seed[rng->seed_offset++] : 0;
    }
    return 0;
}

kf_rng_t *kf_rng_create(const void *seed, size_t seed_len) {
    kf_rng_t *rng = calloc(1, sizeof *rng);
    if (rng == NULL) {
        return NULL;
    }
    mbedtls_ctr_drbg_init(&rng->drbg);
    int rc;
    static const unsigned char pers[] = "keyflow";
    if (seed != NULL) {
        /* CTR_DRBG reads only 48 bytes of entropy, so hand it the SHA-256 of
         * the whole seed: every seed byte then matters, whatever its length. */
        rng->fixed = 1;
        memset(rng->seed, 0, sizeof rng->seed);
        kf_sha256(seed, seed_len, rng->seed);
        rng->seed_len = KF_SHA256_BYTES;
        rc = mbedtls_ctr_drbg_seed(&rng->drbg, fixed_entropy, rng, pers, sizeof pers - 1);
        mbedtls_ctr_drbg_set_reseed_interval(&rng->drbg, INT32_MAX);
    } else {
        mbedtls_entropy_init(&rng->entropy);
        rc = mbedtls_ctr_drbg_seed(&rng->drbg, mbedtls_entropy_func, &rng->entropy, pers,
                                   sizeof pers - 1);
    }
    if (rc != 0) {
        kf_rng_destroy(rng);
        return NULL;
    }
    return rng;
}

void kf_rng_destroy(kf_rng_t *rng) {
    if (rng == NULL) {
        return;
    }
    mbedtls_ctr_drbg_free(&rng->drbg);
    if (!rng->fixed) {
        mbedtls_entropy_free(&rng->entropy);
    }
    free(rng);
}

void kf_rng_bytes(kf_rng_t *rng, void *out, size_t len) {
    unsigned char *p = out;
    while (len > 0) {
        size_t n = len > MBEDTLS_CTR_DRBG_MAX_REQUEST ? MBEDTLS_CTR_DRBG_MAX_REQUEST : len;
        int rc = mbedtls_ctr_drbg_random(&rng->drbg, p, n);
        KF_ASSERT(rc == 0); /* reseed failures would mean no entropy source at all */
        p += n;
        len -= n;
    }
}

void kf_uuid7(kf_rng_t *rng, int64_t now_ms, char out[KF_UUID_TEXT_BYTES + 1]) {
    uint8_t b[16];
    kf_rng_bytes(rng, b + 6, 10);
    uint64_t ms = (uint64_t)(now_ms < 0 ? 0 : now_ms);
    for (int i = 5; i >= 0; i--) {
        b[i] = (uint8_t)(ms & 0xff);
        ms >>= 8;
    }
    b[6] = (uint8_t)((b[6] & 0x0f) | 0x70);
    b[8] = (uint8_t)((b[8] & 0x3f) | 0x80);
    char hex[33];
    kf_hex_encode(b, 16, hex);
    /* 8-4-4-4-12 */
    memcpy(out, hex, 8);
    out[8] = '-';
    memcpy(out + 9, hex + 8, 4);
    out[13] = '-';
    memcpy(out + 14, hex + 12, 4);
    out[18] = '-';
    memcpy(out + 19, hex + 16, 4);
    out[23] = '-';
    memcpy(out + 24, hex + 20, 12);
    out[36] = '\0';
}
