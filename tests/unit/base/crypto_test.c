/*
 * crypto_test.c - SHA-256, hex, the deterministic random source and UUIDv7
 * (service/base/crypto.h).
 *
 * Hashes are checked against the FIPS 180-2 example vectors; file hashing
 * against a temporary file per test. The seeded generator must be a pure
 * function of its seed (same seed, same stream; different seeds, different
 * streams), which is what deterministic simulation relies on.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "base/crypto.h"

static void sha256_hex(const void *data, size_t len, char out[KF_SHA256_HEX_BYTES + 1]) {
    uint8_t digest[KF_SHA256_BYTES];
    kf_sha256(data, len, digest);
    kf_hex_encode(digest, sizeof digest, out);
}

static const char abc_hex[] = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
static const char empty_hex[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
static const char two_block_hex[] =
    "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1";
static const char million_a_hex[] =
    "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
static const char two_block_text[] = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";

Test(sha256, known_vectors) {
    char hex[KF_SHA256_HEX_BYTES + 1];
    sha256_hex("abc", 3, hex);
    cr_assert_str_eq(hex, abc_hex);
    sha256_hex("", 0, hex);
    cr_assert_str_eq(hex, empty_hex);
    sha256_hex(two_block_text, strlen(two_block_text), hex);
    cr_assert_str_eq(hex, two_block_hex);
}

/* The reference vectors of SipHash-2-4 (key 00 01 .. 0f, message 00 01 ..
 * of each length), including the paper's worked example (15 bytes). */
Test(siphash, reference_vectors) {
    uint8_t key[KF_SIPHASH_KEY_BYTES], msg[16];
    for (int i = 0; i < 16; i++) {
        key[i] = (uint8_t)i;
        msg[i] = (uint8_t)i;
    }
    cr_assert_eq(kf_siphash(key, msg, 0), UINT64_C(0x726fdb47dd0e0e31));
    cr_assert_eq(kf_siphash(key, msg, 1), UINT64_C(0x74f839c593dc67fd));
    cr_assert_eq(kf_siphash(key, msg, 8), UINT64_C(0x93f5f5799a932462));
    cr_assert_eq(kf_siphash(key, msg, 15), UINT64_C(0xa129ca6149be45e5));
    key[0] ^= 1; /* another key, another hash */
    cr_assert_neq(kf_siphash(key, msg, 15), UINT64_C(0xa129ca6149be45e5));
}

Test(sha256, one_million_a) {
    size_t n = 1000000;
    char *data = malloc(n);
    cr_assert_not_null(data);
    memset(data, 'a', n);
    char hex[KF_SHA256_HEX_BYTES + 1];
    sha256_hex(data, n, hex);
    free(data);
    cr_assert_str_eq(hex, million_a_hex);
}

/* Writes `len` bytes of `data` to a fresh temporary file; returns its path in
 * `path` (caller unlinks). */
static void write_temp(char path[64], const void *data, size_t len) {
    snprintf(path, 64, "/tmp/kf-crypto-test-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0, "mkstemp failed");
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        cr_assert_gt(n, 0, "write to %s failed", path);
        p += n;
        left -= (size_t)n;
    }
    cr_assert_eq(close(fd), 0);
}

Test(sha256, file_matches_memory) {
    char path[64];
    write_temp(path, "abc", 3);
    uint8_t digest[KF_SHA256_BYTES];
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_sha256_file(path, digest, &err);
    unlink(path);
    cr_assert_eq(st, KF_OK, "%s", err.message);
    char hex[KF_SHA256_HEX_BYTES + 1];
    kf_hex_encode(digest, sizeof digest, hex);
    cr_assert_str_eq(hex, abc_hex);
}

Test(sha256, empty_and_large_files) {
    char path[64];
    uint8_t digest[KF_SHA256_BYTES];
    char hex[KF_SHA256_HEX_BYTES + 1];
    kf_error_t err;

    write_temp(path, "", 0);
    kf_status_t st = kf_sha256_file(path, digest, &err);
    unlink(path);
    cr_assert_eq(st, KF_OK);
    kf_hex_encode(digest, sizeof digest, hex);
    cr_assert_str_eq(hex, empty_hex);

    size_t n = 1000000;
    char *data = malloc(n);
    cr_assert_not_null(data);
    memset(data, 'a', n);
    write_temp(path, data, n);
    free(data);
    st = kf_sha256_file(path, digest, &err);
    unlink(path);
    cr_assert_eq(st, KF_OK);
    kf_hex_encode(digest, sizeof digest, hex);
    cr_assert_str_eq(hex, million_a_hex);
}

Test(sha256, missing_file_is_an_io_error_naming_the_path) {
    char path[64];
    write_temp(path, "x", 1);
    unlink(path); /* a name that certainly does not exist now */
    uint8_t digest[KF_SHA256_BYTES];
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_sha256_file(path, digest, &err);
    cr_assert_eq(st, KF_E_IO, "got %s", kf_status_name(st));
    cr_assert_eq(err.status, KF_E_IO);
    cr_assert_not_null(strstr(err.message, path), "message '%s' does not name %s", err.message,
                       path);
}

Test(hex, encodes_lowercase_and_terminates) {
    static const uint8_t bytes[] = {0x00, 0x01, 0x7f, 0x80, 0xab, 0xcd, 0xef, 0xff};
    char out[2 * sizeof bytes + 2];
    memset(out, '#', sizeof out);
    kf_hex_encode(bytes, sizeof bytes, out);
    cr_assert_str_eq(out, "00017f80abcdefff");
    cr_assert_eq(out[2 * sizeof bytes + 1], '#', "wrote past the terminator");
    kf_hex_encode(bytes, 0, out);
    cr_assert_str_eq(out, "");
}

static void rng_stream(const void *seed, size_t seed_len, uint8_t *out, size_t len) {
    kf_rng_t *rng = kf_rng_create(seed, seed_len);
    cr_assert_not_null(rng);
    kf_rng_bytes(rng, out, len);
    kf_rng_destroy(rng);
}

Test(rng, same_seed_gives_the_same_stream) {
    uint8_t a[4096];
    uint8_t b[4096];
    rng_stream("seed-1", 6, a, sizeof a);
    rng_stream("seed-1", 6, b, sizeof b);
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
    /* And the stream looks random: not constant, most byte values present. */
    bool seen[256] = {false};
    int distinct = 0;
    for (size_t i = 0; i < sizeof a; i++) {
        if (!seen[a[i]]) {
            seen[a[i]] = true;
            distinct++;
        }
    }
    cr_assert_gt(distinct, 200, "only %d distinct byte values in 4096", distinct);
}

Test(rng, different_seeds_differ) {
    uint8_t a[64];
    uint8_t b[64];
    rng_stream("seed-1", 6, a, sizeof a);
    rng_stream("seed-2", 6, b, sizeof b);
    cr_assert_neq(memcmp(a, b, sizeof a), 0);
    rng_stream("seed-1", 5, b, sizeof b); /* "seed-" */
    cr_assert_neq(memcmp(a, b, sizeof a), 0);
    uint8_t zero = 0;
    rng_stream(&zero, 1, b, sizeof b);
    cr_assert_neq(memcmp(a, b, sizeof a), 0);
}

/* The generator keeps up to 64 seed bytes; each of them must matter. */
Test(rng, every_kept_seed_byte_matters) {
    uint8_t seed[64];
    for (size_t i = 0; i < sizeof seed; i++) {
        seed[i] = (uint8_t)(i * 7 + 1);
    }
    uint8_t base[64];
    rng_stream(seed, sizeof seed, base, sizeof base);
    for (size_t i = 0; i < sizeof seed; i++) {
        uint8_t changed[64];
        memcpy(changed, seed, sizeof seed);
        changed[i] ^= 0x01;
        uint8_t other[64];
        rng_stream(changed, sizeof changed, other, sizeof other);
        cr_assert_neq(memcmp(base, other, sizeof base), 0,
                      "seeds differing only in byte %zu of 64 give the same stream", i);
    }
}

/* Requests larger than one CTR_DRBG request are split; the split must be the
 * same every time, so one big read equals the same reads in 1024-byte steps. */
Test(rng, big_reads_are_deterministic) {
    uint8_t one[3000];
    rng_stream("chunks", 6, one, sizeof one);
    kf_rng_t *rng = kf_rng_create("chunks", 6);
    cr_assert_not_null(rng);
    uint8_t parts[3000];
    kf_rng_bytes(rng, parts, 1024);
    kf_rng_bytes(rng, parts + 1024, 1024);
    kf_rng_bytes(rng, parts + 2048, 952);
    kf_rng_destroy(rng);
    cr_assert_eq(memcmp(one, parts, sizeof one), 0);
}

Test(rng, system_seeded_generators_differ) {
    uint8_t a[32];
    uint8_t b[32];
    rng_stream(NULL, 0, a, sizeof a);
    rng_stream(NULL, 0, b, sizeof b);
    cr_assert_neq(memcmp(a, b, sizeof a), 0);
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    return -1;
}

/* Checks the 8-4-4-4-12 lowercase layout, version 7 and variant 10xx, and
 * returns the embedded 48-bit millisecond timestamp. */
static uint64_t check_uuid7(const char *u) {
    cr_assert_eq(strlen(u), KF_UUID_TEXT_BYTES, "'%s'", u);
    for (int i = 0; i < KF_UUID_TEXT_BYTES; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            cr_assert_eq(u[i], '-', "'%s' position %d", u, i);
        } else {
            cr_assert_geq(hex_value(u[i]), 0, "'%s' position %d", u, i);
        }
    }
    cr_assert_eq(u[14], '7', "'%s' is not version 7", u);
    int variant = hex_value(u[19]);
    cr_assert_eq(variant & 0xc, 0x8, "'%s' variant nibble %x", u, variant);
    uint64_t ms = 0;
    for (int i = 0; i < 13; i++) {
        if (i != 8) {
            ms = (ms << 4) | (uint64_t)hex_value(u[i]);
        }
    }
    return ms;
}

Test(uuid7, layout_version_variant_and_timestamp) {
    kf_rng_t *rng = kf_rng_create("uuid", 4);
    cr_assert_not_null(rng);
    char u[KF_UUID_TEXT_BYTES + 1];
    kf_uuid7(rng, 0x0123456789abLL, u);
    cr_assert_eq(check_uuid7(u), 0x0123456789abULL);
    cr_assert_eq(strncmp(u, "01234567-89ab-7", 15), 0, "'%s'", u);
    kf_uuid7(rng, 1700000000123LL, u);
    cr_assert_eq(check_uuid7(u), 1700000000123ULL);
    kf_uuid7(rng, 0, u);
    cr_assert_eq(check_uuid7(u), 0);
    cr_assert_eq(strncmp(u, "00000000-0000-7", 15), 0, "'%s'", u);
    kf_uuid7(rng, 0xffffffffffffLL, u);
    cr_assert_eq(check_uuid7(u), 0xffffffffffffULL);
    kf_rng_destroy(rng);
}

Test(uuid7, negative_time_clamps_to_zero) {
    kf_rng_t *rng = kf_rng_create("uuid", 4);
    cr_assert_not_null(rng);
    char u[KF_UUID_TEXT_BYTES + 1];
    kf_uuid7(rng, -5, u);
    cr_assert_eq(check_uuid7(u), 0);
    kf_rng_destroy(rng);
}

Test(uuid7, random_part_varies_within_one_millisecond) {
    kf_rng_t *rng = kf_rng_create("uuid", 4);
    cr_assert_not_null(rng);
    char a[KF_UUID_TEXT_BYTES + 1];
    char b[KF_UUID_TEXT_BYTES + 1];
    kf_uuid7(rng, 1000, a);
    kf_uuid7(rng, 1000, b);
    cr_assert_str_neq(a, b);
    cr_assert_eq(strncmp(a, b, 13), 0, "same millisecond, same prefix");
    kf_rng_destroy(rng);
}

Test(uuid7, same_seed_same_uuids) {
    kf_rng_t *r1 = kf_rng_create("run-ids", 7);
    kf_rng_t *r2 = kf_rng_create("run-ids", 7);
    cr_assert(r1 != NULL && r2 != NULL);
    for (int i = 0; i < 100; i++) {
        char a[KF_UUID_TEXT_BYTES + 1];
        char b[KF_UUID_TEXT_BYTES + 1];
        kf_uuid7(r1, 5000 + i, a);
        kf_uuid7(r2, 5000 + i, b);
        cr_assert_str_eq(a, b, "uuid %d", i);
    }
    kf_rng_destroy(r1);
    kf_rng_destroy(r2);
}

/* Lowercase hex of a big-endian timestamp sorts like the timestamp, so IDs
 * made at increasing milliseconds sort in creation order as text. */
Test(uuid7, text_order_follows_milliseconds) {
    kf_rng_t *rng = kf_rng_create("order", 5);
    cr_assert_not_null(rng);
    char prev[KF_UUID_TEXT_BYTES + 1];
    int64_t ms = 0;
    kf_uuid7(rng, ms, prev);
    uint64_t step = 1;
    for (int i = 0; i < 2000; i++) {
        ms += (int64_t)(step % 100000 + 1);
        step = step * 6364136223846793005ULL + 1442695040888963407ULL;
        char next[KF_UUID_TEXT_BYTES + 1];
        kf_uuid7(rng, ms, next);
        cr_assert_eq(check_uuid7(next), (uint64_t)ms);
        cr_assert_lt(strcmp(prev, next), 0, "'%s' (earlier) sorts after '%s' at %lld ms", prev,
                     next, (long long)ms);
        memcpy(prev, next, sizeof prev);
    }
    kf_rng_destroy(rng);
}

/* ---- HMAC-SHA256 ---------------------------------------------------------- */

static void hmac_hex(const void *key, size_t key_len, const void *data, size_t len,
                     char out[KF_SHA256_HEX_BYTES + 1]) {
    kf_hmac_key_t k;
    kf_hmac_key_init(&k, key, key_len);
    uint8_t mac[KF_SHA256_BYTES];
    kf_hmac_sha256(&k, data, len, mac);
    kf_hex_encode(mac, sizeof mac, out);
    kf_hmac_key_deinit(&k);
}

/* RFC 4231 test cases 1, 2 and 6 (a key longer than a block). */
Test(hmac, rfc4231_vectors) {
    char hex[KF_SHA256_HEX_BYTES + 1];
    uint8_t key1[20];
    memset(key1, 0x0b, sizeof key1);
    hmac_hex(key1, sizeof key1, "Hi There", 8, hex);
    cr_assert_str_eq(hex, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    hmac_hex("Jefe", 4, "what do ya want for nothing?", 28, hex);
    cr_assert_str_eq(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    uint8_t key6[131];
    memset(key6, 0xaa, sizeof key6);
    const char *msg6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    hmac_hex(key6, sizeof key6, msg6, strlen(msg6), hex);
    cr_assert_str_eq(hex, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

/* One key, many messages: each MAC starts from the key's saved pads. */
Test(hmac, a_key_is_reusable) {
    kf_hmac_key_t k;
    kf_hmac_key_init(&k, "Jefe", 4);
    uint8_t a[KF_SHA256_BYTES], b[KF_SHA256_BYTES], c[KF_SHA256_BYTES];
    kf_hmac_sha256(&k, "what do ya want for nothing?", 28, a);
    kf_hmac_sha256(&k, "something else", 14, b);
    kf_hmac_sha256(&k, "what do ya want for nothing?", 28, c);
    cr_assert(kf_ct_equal(a, c, sizeof a));
    cr_assert_not(kf_ct_equal(a, b, sizeof a));
    kf_hmac_key_deinit(&k);
}
