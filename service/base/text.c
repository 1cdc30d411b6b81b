/* text.c - identifier and UTF-8 checks. */
#include "base/text.h"

#include <stdint.h>
#include <string.h>

static bool utf8_check(const char *s, size_t len, bool allow_control) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        unsigned c = p[i];
        size_t n;
        uint32_t cp;
        if (c < 0x80) {
            if (!allow_control && (c < 0x20 || c == 0x7f)) {
                return false;
            }
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            n = 1;
            cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            n = 2;
            cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            n = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        for (size_t k = 1; k <= n; k++) {
            if (i + k >= len || (p[i + k] & 0xc0) != 0x80) {
                return false;
            }
            cp = (cp << 6) | (p[i + k] & 0x3f);
        }
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
            cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ||
            (!allow_control && cp >= 0x80 && cp <= 0x9f)) { /* C1 controls */
            return false;
        }
        i += n + 1;
    }
    return true;
}

bool kf_utf8_clean(const char *s, size_t len) {
    return utf8_check(s, len, false);
}
bool kf_utf8_valid(const char *s, size_t len) {
    return utf8_check(s, len, true);
}

kf_status_t kf_check_identifier(const char *field, const char *s, size_t max_bytes, bool required,
                                kf_error_t *err) {
    size_t len = strlen(s);
    if (len == 0) {
        return required ? kf_error_set(err, KF_E_INVALID, "%s: required, must not be empty", field)
                        : KF_OK;
    }
    if (len > max_bytes) {
        return kf_error_set(err, KF_E_TOO_LARGE, "%s: at most %zu bytes, got %zu", field, max_bytes,
                            len);
    }
    if (!kf_utf8_clean(s, len)) {
        return kf_error_set(err, KF_E_INVALID, "%s: must be UTF-8 without control characters",
                            field);
    }
    return KF_OK;
}

kf_status_t kf_check_range(const char *field, int64_t v, int64_t lo, int64_t hi, kf_error_t *err) {
    if (v < lo || v > hi) {
        return kf_error_set(err, KF_E_INVALID, "%s: must be in %lld..%lld, got %lld", field,
                            (long long)lo, (long long)hi, (long long)v);
    }
    return KF_OK;
}
