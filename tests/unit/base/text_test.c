/*
 * text_test.c - UTF-8 and identifier checks (service/base/text.h).
 *
 * kf_utf8_clean must accept exactly well-formed UTF-8 (RFC 3629: no
 * overlongs, no surrogates, nothing above U+10FFFF, no truncated sequences)
 * without control characters, and must read only the bytes it is given.
 * kf_check_identifier must answer KF_E_TOO_LARGE for too long, KF_E_INVALID
 * for empty-when-required or bad bytes, with a message naming the field.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "base/limits.h"
#include "base/text.h"

typedef struct sample {
    const char *bytes;
    size_t len;
    const char *what;
} sample_t;

#define S(lit, what)                                                                               \
    { lit, sizeof(lit) - 1, what }

static char *show(const sample_t *s, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < s->len && used + 4 < cap; i++) {
        used += (size_t)snprintf(buf + used, cap - used, "%02x ", (unsigned char)s->bytes[i]);
    }
    return buf;
}

static const sample_t valid_samples[] = {
    S("", "empty"),
    S("hello world", "ASCII"),
    S(" ~!", "printable ASCII edges"),
    S("\xc2\xa0", "U+00A0, first non-control two-byte"),
    S("\xc3\xbc", "U+00FC"),
    S("\xdf\xbf", "U+07FF, last two-byte"),
    S("\xe0\xa0\x80", "U+0800, first three-byte"),
    S("\xe2\x82\xac", "U+20AC euro"),
    S("\xed\x9f\xbf", "U+D7FF, below the surrogates"),
    S("\xee\x80\x80", "U+E000, above the surrogates"),
    S("\xef\xbf\xbd", "U+FFFD"),
    S("\xef\xbf\xbf", "U+FFFF, last three-byte"),
    S("\xf0\x90\x80\x80", "U+10000, first four-byte"),
    S("\xf0\x9d\x84\x9e", "U+1D11E"),
    S("\xf4\x8f\xbf\xbf", "U+10FFFF, last code point"),
    S("k\xc3\xa9y-\xe6\x97\xa5\xe6\x9c\xac-\xf0\x9f\x98\x80", "mixed"),
};

static const sample_t invalid_samples[] = {
    /* overlong encodings */
    S("\xc0\x80", "overlong NUL"),
    S("\xc0\xaf", "overlong '/' in two bytes"),
    S("\xc1\xbf", "overlong U+007F"),
    S("\xe0\x80\xaf", "overlong '/' in three bytes"),
    S("\xe0\x9f\xbf", "overlong U+07FF"),
    S("\xf0\x80\x80\xaf", "overlong '/' in four bytes"),
    S("\xf0\x8f\xbf\xbf", "overlong U+FFFF"),
    /* surrogates */
    S("\xed\xa0\x80", "U+D800 high surrogate"),
    S("\xed\xaf\xbf", "U+DBFF"),
    S("\xed\xb0\x80", "U+DC00 low surrogate"),
    S("\xed\xbf\xbf", "U+DFFF"),
    S("\xed\xa0\xbd\xed\xb8\x80", "CESU-8 surrogate pair"),
    /* beyond Unicode and invalid lead bytes */
    S("\xf4\x90\x80\x80", "U+110000"),
    S("\xf5\x80\x80\x80", "lead F5"),
    S("\xf7\xbf\xbf\xbf", "lead F7"),
    S("\xf8\x88\x80\x80\x80", "five-byte form"),
    S("\xfc\x84\x80\x80\x80\x80", "six-byte form"),
    S("\xfe", "FE"),
    S("\xff", "FF"),
    /* stray and missing continuation bytes */
    S("\x80", "lone continuation 80"),
    S("\xbf", "lone continuation BF"),
    S("a\x80z", "continuation after ASCII"),
    S("\xc3", "truncated two-byte at end"),
    S("\xe2\x82", "truncated three-byte at end"),
    S("\xf0\x9d\x84", "truncated four-byte at end"),
    S("\xc3\x41", "two-byte lead then ASCII"),
    S("\xe2\x28\xa1", "three-byte with bad second byte"),
    S("\xe2\x82\x28", "three-byte with bad third byte"),
    S("\xf0\x9d\x84\x41", "four-byte with bad last byte"),
    S("\xc3\xbc\xc3", "valid then truncated"),
    /* control characters */
    S("\x01", "SOH"),
    S("a\tb", "tab"),
    S("a\nb", "newline"),
    S("a\rb", "carriage return"),
    S("\x1b[0m", "escape"),
    S("\x1f", "unit separator"),
    S("\x7f", "DEL"),
    {"a\0b", 3, "embedded NUL"},
};

Test(utf8, accepts_well_formed_text) {
    char buf[64];
    for (size_t i = 0; i < sizeof valid_samples / sizeof valid_samples[0]; i++) {
        const sample_t *s = &valid_samples[i];
        cr_assert(kf_utf8_clean(s->bytes, s->len), "rejected %s: %s", s->what,
                  show(s, buf, sizeof buf));
    }
}

Test(utf8, rejects_malformed_text_and_controls) {
    char buf[64];
    for (size_t i = 0; i < sizeof invalid_samples / sizeof invalid_samples[0]; i++) {
        const sample_t *s = &invalid_samples[i];
        cr_assert_not(kf_utf8_clean(s->bytes, s->len), "accepted %s: %s", s->what,
                      show(s, buf, sizeof buf));
    }
}

/* Each bad sample stays bad with clean text around it. */
Test(utf8, rejects_malformed_text_inside_clean_text) {
    char buf[64];
    for (size_t i = 0; i < sizeof invalid_samples / sizeof invalid_samples[0]; i++) {
        const sample_t *s = &invalid_samples[i];
        char wrapped[32];
        memcpy(wrapped, "ok-", 3);
        memcpy(wrapped + 3, s->bytes, s->len);
        memcpy(wrapped + 3 + s->len, "-ok", 3);
        cr_assert_not(kf_utf8_clean(wrapped, s->len + 6), "accepted ok-%s-ok: %s", s->what,
                      show(s, buf, sizeof buf));
    }
}

/* C1 controls (U+0080..U+009F) are control characters too (Unicode Cc). */
Test(utf8, rejects_c1_control_characters) {
    cr_assert_not(kf_utf8_clean("\xc2\x80", 2), "accepted U+0080");
    cr_assert_not(kf_utf8_clean("\xc2\x85", 2), "accepted U+0085 (NEL)");
    cr_assert_not(kf_utf8_clean("\xc2\x9f", 2), "accepted U+009F");
}

/* Only the first len bytes count: a sequence cut by len is truncated, and
 * bad bytes past len are not read. */
Test(utf8, reads_only_len_bytes) {
    cr_assert(kf_utf8_clean("abc\xff", 3));
    cr_assert(kf_utf8_clean("abc\n", 3));
    cr_assert_not(kf_utf8_clean("\xe2\x82\xac", 2));
    cr_assert_not(kf_utf8_clean("\xf0\x9f\x98\x80", 3));
    cr_assert(kf_utf8_clean("\xf0\x9f\x98\x80", 4));
    cr_assert(kf_utf8_clean("\xff", 0));
}

Test(identifier, accepts_clean_identifiers) {
    kf_error_t err;
    kf_error_clear(&err);
    cr_assert_eq(kf_check_identifier("workflow", "billing-v2", KF_WORKFLOW_BYTES_MAX, true, &err),
                 KF_OK);
    cr_assert_eq(kf_check_identifier("key", "cust\xc3\xbcmer:42", KF_KEY_BYTES_MAX, true, &err),
                 KF_OK);
    cr_assert_eq(err.status, KF_OK, "success leaves the error alone");
}

Test(identifier, empty_is_invalid_only_when_required) {
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_check_identifier("event.id", "", KF_EVENT_ID_BYTES_MAX, false, &err);
    cr_assert_eq(st, KF_OK);
    st = kf_check_identifier("workflow", "", KF_WORKFLOW_BYTES_MAX, true, &err);
    cr_assert_eq(st, KF_E_INVALID, "got %s", kf_status_name(st));
    cr_assert_eq(err.status, KF_E_INVALID);
    cr_assert_not_null(strstr(err.message, "workflow"), "message '%s'", err.message);
}

Test(identifier, length_limit_is_in_bytes) {
    kf_error_t err;
    char text[KF_WORKFLOW_BYTES_MAX + 2];
    memset(text, 'w', KF_WORKFLOW_BYTES_MAX);
    text[KF_WORKFLOW_BYTES_MAX] = '\0';
    cr_assert_eq(kf_check_identifier("workflow", text, KF_WORKFLOW_BYTES_MAX, true, &err), KF_OK,
                 "exactly the limit is allowed");
    text[KF_WORKFLOW_BYTES_MAX] = 'w';
    text[KF_WORKFLOW_BYTES_MAX + 1] = '\0';
    kf_error_clear(&err);
    kf_status_t st = kf_check_identifier("workflow", text, KF_WORKFLOW_BYTES_MAX, true, &err);
    cr_assert_eq(st, KF_E_TOO_LARGE, "got %s", kf_status_name(st));
    cr_assert_eq(err.status, KF_E_TOO_LARGE);
    cr_assert_not_null(strstr(err.message, "workflow"), "message '%s'", err.message);
    cr_assert_not_null(strstr(err.message, "128"), "message '%s' lacks the limit", err.message);
    cr_assert_not_null(strstr(err.message, "129"), "message '%s' lacks the length", err.message);

    /* 64 two-byte characters are 128 bytes; 65 are too many. */
    char wide[2 * 65 + 1];
    for (int i = 0; i < 65; i++) {
        wide[2 * i] = '\xc3';
        wide[2 * i + 1] = '\xbc';
    }
    wide[128] = '\0';
    cr_assert_eq(kf_check_identifier("key", wide, 128, true, &err), KF_OK);
    wide[128] = '\xc3';
    wide[130] = '\0';
    cr_assert_eq(kf_check_identifier("key", wide, 128, true, &err), KF_E_TOO_LARGE);
}

Test(identifier, bad_bytes_are_invalid_and_named) {
    static const char *const bad[] = {"a\nb",      "\xc0\xaf", "\xed\xa0\x80",
                                      "tab\there", "\xff",     "cut\xe2\x82"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kf_error_t err;
        kf_error_clear(&err);
        kf_status_t st =
            kf_check_identifier("worker_id", bad[i], KF_WORKER_ID_BYTES_MAX, true, &err);
        cr_assert_eq(st, KF_E_INVALID, "sample %zu: got %s", i, kf_status_name(st));
        cr_assert_eq(err.status, KF_E_INVALID);
        cr_assert_not_null(strstr(err.message, "worker_id"), "message '%s'", err.message);
    }
}

Test(identifier, null_error_is_allowed) {
    cr_assert_eq(kf_check_identifier("key", "", 10, true, NULL), KF_E_INVALID);
    cr_assert_eq(kf_check_identifier("key", "01234567890", 10, true, NULL), KF_E_TOO_LARGE);
    cr_assert_eq(kf_check_identifier("key", "\x01", 10, true, NULL), KF_E_INVALID);
    cr_assert_eq(kf_check_identifier("key", "0123456789", 10, true, NULL), KF_OK);
}
