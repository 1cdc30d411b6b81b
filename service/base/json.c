/* json.c - client JSON text: checks, compact output and the proto3 JSON
 * scalar forms (see json.h). */
#include "base/json.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base64.h"
#include "base/limits.h"

bool kf_json_deeper_than(const json_t *v, int levels) {
    if (!json_is_object(v) && !json_is_array(v)) {
        return false;
    }
    if (levels <= 0) {
        return true;
    }
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (kf_json_deeper_than(json_array_get(v, i), levels - 1)) {
                return true;
            }
        }
        return false;
    }
    /* jansson's iteration takes a non-const object; nothing is changed. */
    json_t *obj = (json_t *)v;
    const char *key;
    json_t *item;
    json_object_foreach(obj, key, item) {
        if (kf_json_deeper_than(item, levels - 1)) {
            return true;
        }
    }
    return false;
}

kf_status_t kf_json_check(const char *field, const char *text, size_t len, size_t max_bytes,
                          kf_error_t *err) {
    if (len > max_bytes) {
        return kf_error_set(err, KF_E_TOO_LARGE, "%s: at most %zu bytes of JSON, got %zu", field,
                            max_bytes, len);
    }
    if (len == 0) {
        return KF_OK;
    }
    json_error_t jerr;
    json_t *v = json_loadb(text, len, KF_JSON_LOAD_FLAGS, &jerr);
    if (v == NULL) {
        return kf_error_set(err, KF_E_INVALID, "%s: not valid JSON: %s (line %d, column %d)", field,
                            jerr.text, jerr.line, jerr.column);
    }
    bool deep = kf_json_deeper_than(v, KF_JSON_DEPTH_MAX);
    json_decref(v);
    if (deep) {
        return kf_error_set(err, KF_E_INVALID, "%s: nested deeper than %d levels", field,
                            KF_JSON_DEPTH_MAX);
    }
    return KF_OK;
}

/* The fewest significant digits (1..17) that print x so that it reads back
 * as x; 17 always does for a finite double. At least the digits of the
 * integer part, so that 100.0 stays "100.0" rather than becoming "1e2". */
static int shortest_digits(double x) {
    char buf[40];
    int start = 1;
    double magnitude = fabs(x);
    while (magnitude < 1e17 && magnitude >= 10.0) {
        magnitude /= 10.0;
        start++;
    }
    for (int digits = start; digits < 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, x);
        if (strtod(buf, NULL) == x) {
            return digits;
        }
    }
    return 17;
}

/* The most digits any real in v needs (0 when it holds none). */
static int digits_needed(const json_t *v) {
    if (json_is_real(v)) {
        return shortest_digits(json_real_value(v));
    }
    int most = 0;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            int d = digits_needed(json_array_get(v, i));
            most = d > most ? d : most;
        }
    } else if (json_is_object(v)) {
        json_t *obj = (json_t *)v;
        const char *key;
        json_t *item;
        json_object_foreach(obj, key, item) {
            int d = digits_needed(item);
            most = d > most ? d : most;
        }
    }
    return most;
}

char *kf_json_dumps(const json_t *v, size_t flags) {
    /* jansson writes every real of one document with one precision, so the
     * document gets the most that any of its reals needs. */
    int digits = digits_needed(v);
    if (digits > 0) {
        flags |= JSON_REAL_PRECISION(digits);
    }
    return json_dumps(v, flags);
}

/* ---- proto3 JSON scalars -------------------------------------------------- */

kf_json_number_t kf_json_integer_text(const char *s, size_t len, bool *negative,
                                      uint64_t *magnitude) {
    size_t i = 0;
    *negative = len > 0 && s[0] == '-';
    if (*negative) {
        i++;
    }
    if (i == len) {
        return KF_JSON_NUMBER_MALFORMED;
    }
    uint64_t m = 0;
    bool overflow = false;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return KF_JSON_NUMBER_MALFORMED;
        }
        unsigned digit = (unsigned)(s[i] - '0');
        if (m > (UINT64_MAX - digit) / 10) {
            overflow = true; /* keep going: "99999999999999999999x" is malformed */
        } else {
            m = m * 10 + digit;
        }
    }
    *magnitude = m;
    return overflow ? KF_JSON_NUMBER_OUT_OF_RANGE : KF_JSON_NUMBER_OK;
}

/* The character check keeps strtod's other spellings (hex, "inf", blanks)
 * out. */
kf_json_number_t kf_json_double_text(const char *s, size_t len, double *out) {
    if (strcmp(s, "NaN") == 0) {
        *out = NAN;
        return KF_JSON_NUMBER_OK;
    }
    if (strcmp(s, "Infinity") == 0 || strcmp(s, "-Infinity") == 0) {
        *out = s[0] == '-' ? -INFINITY : INFINITY;
        return KF_JSON_NUMBER_OK;
    }
    if (len == 0 || !(s[0] == '-' || (s[0] >= '0' && s[0] <= '9'))) {
        return KF_JSON_NUMBER_MALFORMED;
    }
    if (strspn(s, "0123456789+-.eE") != len) {
        return KF_JSON_NUMBER_MALFORMED;
    }
    char *end;
    errno = 0;
    double value = strtod(s, &end);
    if (end != s + len) {
        return KF_JSON_NUMBER_MALFORMED;
    }
    if (errno == ERANGE && isinf(value)) {
        return KF_JSON_NUMBER_OUT_OF_RANGE;
    }
    *out = value;
    return KF_JSON_NUMBER_OK;
}

bool kf_json_int64_value(const json_t *v, int64_t *out) {
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return true;
    }
    bool negative;
    uint64_t magnitude;
    if (!json_is_string(v) || kf_json_integer_text(json_string_value(v), json_string_length(v),
                                                   &negative, &magnitude) != KF_JSON_NUMBER_OK) {
        return false;
    }
    if (negative ? magnitude > (uint64_t)INT64_MAX + 1 : magnitude > (uint64_t)INT64_MAX) {
        return false;
    }
    /* -(2^63) has no positive twin: negate in unsigned arithmetic. */
    *out = negative ? (int64_t)(0 - magnitude) : (int64_t)magnitude;
    return true;
}

bool kf_json_double_value(const json_t *v, double *out) {
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return true;
    }
    return json_is_string(v) && kf_json_double_text(json_string_value(v), json_string_length(v),
                                                    out) == KF_JSON_NUMBER_OK;
}

json_t *kf_json_int64(int64_t value) {
    char digits[24];
    snprintf(digits, sizeof digits, "%" PRId64, value);
    return json_string(digits);
}

json_t *kf_json_double(double value) {
    if (isnan(value)) {
        return json_string("NaN");
    }
    if (isinf(value)) {
        return json_string(value > 0 ? "Infinity" : "-Infinity");
    }
    return json_real(value);
}

json_t *kf_json_bytes(const uint8_t *data, size_t len) {
    if (len == 0) {
        return json_string("");
    }
    if (len > SIZE_MAX / 4 * 3 - 3) {
        return NULL;
    }
    size_t text_len = kf_base64_encoded_len(len);
    char *text = malloc(text_len + 1);
    if (text == NULL) {
        return NULL;
    }
    kf_base64_encode(data, len, text);
    json_t *v = json_stringn_nocheck(text, text_len);
    free(text);
    return v;
}
