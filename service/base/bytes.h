/*
 * bytes.h - big-endian integers and length-prefixed strings for stored keys.
 *
 * Stored keys are big-endian so that RocksDB's bytewise order is numeric
 * order, and strings inside keys are length-prefixed (u16) so that no key is
 * a prefix of another key of a different identity.
 */
#ifndef KF_BASE_BYTES_H
#define KF_BASE_BYTES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline void kf_put_be64(uint8_t *p, uint64_t v) {
    for (int i = 7; i >= 0; i--) {
        p[i] = (uint8_t)(v & 0xff);
        v >>= 8;
    }
}

static inline uint64_t kf_get_be64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        v = (v << 8) | p[i];
    }
    return v;
}

static inline void kf_put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline uint32_t kf_get_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline void kf_put_be16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static inline uint16_t kf_get_be16(const uint8_t *p) {
    return (uint16_t)((p[0] << 8) | p[1]);
}

/* Signed times sort correctly as unsigned after flipping the sign bit. */
static inline uint64_t kf_i64_ordered(int64_t v) {
    return (uint64_t)v ^ 0x8000000000000000ULL;
}
static inline int64_t kf_i64_from_ordered(uint64_t v) {
    return (int64_t)(v ^ 0x8000000000000000ULL);
}

#endif
