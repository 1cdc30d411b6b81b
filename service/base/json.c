/* json.c - client JSON text: checks and compact output (see json.h). */
#include "base/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

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
