/*
 * base64.h - RFC 4648 base64 for BYTES values in JSON.
 */
#ifndef KF_BASE_BASE64_H
#define KF_BASE_BASE64_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Encoded length without the NUL (standard alphabet, padded). */
static inline size_t kf_base64_encoded_len(size_t len) {
    return (len + 2) / 3 * 4;
}
/* Writes kf_base64_encoded_len(len) characters and a NUL. */
void kf_base64_encode(const uint8_t *in, size_t len, char *out);
/* Decodes the standard or URL-safe alphabet, padded or not; out has room
 * for len * 3 / 4 + 3 bytes. False on a malformed input. */
bool kf_base64_decode(const char *in, size_t len, uint8_t *out, size_t *out_len);

#endif
