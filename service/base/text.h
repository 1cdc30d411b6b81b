/*
 * text.h - checks on identifiers and text fields from requests.
 */
#ifndef KF_BASE_TEXT_H
#define KF_BASE_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* True when s[0..len) is valid UTF-8 (no overlongs, no surrogates) and has
 * no control characters. */
bool kf_utf8_clean(const char *s, size_t len);
/* True when s[0..len) is valid UTF-8 (control characters allowed). */
bool kf_utf8_valid(const char *s, size_t len);

/* An identifier (workflow, key, event ID, worker ID): at most max_bytes
 * (KF_E_TOO_LARGE), non-empty when required (KF_E_INVALID), clean UTF-8
 * (KF_E_INVALID). The message names `field`. */
kf_status_t kf_check_identifier(const char *field, const char *s, size_t max_bytes, bool required,
                                kf_error_t *err) KF_MUST_USE;

/* A number field within lo..hi: KF_E_INVALID "<field>: must be in lo..hi,
 * got v" otherwise. */
kf_status_t kf_check_range(const char *field, int64_t v, int64_t lo, int64_t hi,
                           kf_error_t *err) KF_MUST_USE;

#endif
