/*
 * rows.c - input views, JSON rows, output builders (see rows.h).
 */
#include "functions/rows.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/assert.h"
#include "base/base64.h"
#include "base/limits.h"
#include "base/text.h"
#include "functions/descriptor.h"

#define T_BOOL    KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BOOL
#define T_INT64   KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64
#define T_FLOAT64 KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64
#define T_UTF8    KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8
#define T_BYTES   KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BYTES
#define T_TS      KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US

static const char *type_word(Keyflow__V1__FieldType t) {
    switch (t) {
    case T_BOOL: return "BOOL";
    case T_INT64: return "INT64";
    case T_FLOAT64: return "FLOAT64";
    case T_UTF8: return "UTF8";
    case T_BYTES: return "BYTES";
    case T_TS: return "TIMESTAMP_US";
    default: return "UNKNOWN";
    }
}

/* The oneof case a column of this type must use. */
static Keyflow__V1__Column__ValuesCase values_case(Keyflow__V1__FieldType t) {
    switch (t) {
    case T_BOOL: return KEYFLOW__V1__COLUMN__VALUES_BOOLS;
    case T_INT64:
    case T_TS: return KEYFLOW__V1__COLUMN__VALUES_INT64S;
    case T_FLOAT64: return KEYFLOW__V1__COLUMN__VALUES_FLOAT64S;
    case T_UTF8: return KEYFLOW__V1__COLUMN__VALUES_STRINGS;
    case T_BYTES: return KEYFLOW__V1__COLUMN__VALUES_BYTES_VALUES;
    default: return KEYFLOW__V1__COLUMN__VALUES__NOT_SET;
    }
}

static const char *case_word(Keyflow__V1__Column__ValuesCase c) {
    switch (c) {
    case KEYFLOW__V1__COLUMN__VALUES_BOOLS: return "bools";
    case KEYFLOW__V1__COLUMN__VALUES_INT64S: return "int64s";
    case KEYFLOW__V1__COLUMN__VALUES_FLOAT64S: return "float64s";
    case KEYFLOW__V1__COLUMN__VALUES_STRINGS: return "strings";
    case KEYFLOW__V1__COLUMN__VALUES_BYTES_VALUES: return "bytes_values";
    default: return "none";
    }
}

kf_status_t kf_rows_from_batch(const Keyflow__V1__RowBatch *batch,
                               const Keyflow__V1__Schema *schema, int64_t max_rows,
                               int64_t max_bytes, kf_arena_t *arena, kf_rows_t *out,
                               kf_error_t *err) {
    if (batch->row_count < 0) {
        return kf_error_set(err, KF_E_INVALID, "batch.row_count: must not be negative");
    }
    if (batch->row_count > max_rows) {
        return kf_error_set(err, KF_E_TOO_LARGE,
                            "batch.row_count: %lld rows, the function's max_input_rows is %lld",
                            (long long)batch->row_count, (long long)max_rows);
    }
    if (batch->n_columns != schema->n_fields) {
        return kf_error_set(err, KF_E_INVALID,
                            "batch.columns: %zu columns, the input schema has %zu fields",
                            batch->n_columns, schema->n_fields);
    }
    size_t n = (size_t)batch->row_count;
    kf_rows_t r = {.count = (uint32_t)n, .ncols = (uint32_t)schema->n_fields};
    r.cols = kf_arena_zalloc(arena, r.ncols * sizeof *r.cols);
    if (r.cols == NULL) {
        return kf_error_set(err, KF_E_TOO_LARGE, "batch: too large");
    }
    for (uint32_t c = 0; c < r.ncols; c++) {
        const Keyflow__V1__Field *f = schema->fields[c];
        const Keyflow__V1__Column *col = batch->columns[c];
        kf_column_t *k = &r.cols[c];
        k->type = f->type;
        k->nullable = f->nullable;
        k->name = f->name;
        if (col->name[0] != '\0' && strcmp(col->name, f->name) != 0) {
            return kf_error_set(err, KF_E_INVALID,
                                "batch.columns[%u].name: \"%s\" where the schema has \"%s\"", c,
                                col->name, f->name);
        }
        if (col->values_case != values_case(f->type)) {
            return kf_error_set(err, KF_E_INVALID,
                                "batch.columns[%u] (%s): %s is %s, expected %s values", c, f->name,
                                f->name, type_word(f->type), case_word(values_case(f->type)));
        }
        if (col->n_nulls != 0 && col->n_nulls != n) {
            return kf_error_set(err, KF_E_INVALID,
                                "batch.columns[%u] (%s).nulls: %zu flags for %zu rows", c, f->name,
                                col->n_nulls, n);
        }
        if (col->n_nulls != 0) {
            k->nulls = col->nulls;
            if (!f->nullable) {
                for (size_t i = 0; i < n; i++) {
                    if (col->nulls[i]) {
                        return kf_error_set(err, KF_E_INVALID,
                                            "batch.columns[%u] (%s): row %zu is null but %s is not "
                                            "nullable",
                                            c, f->name, i, f->name);
                    }
                }
            }
        }
        size_t have = 0;
        switch (col->values_case) {
        case KEYFLOW__V1__COLUMN__VALUES_BOOLS:
            have = col->bools->n_values;
            k->b = col->bools->values;
            r.bytes += n;
            break;
        case KEYFLOW__V1__COLUMN__VALUES_INT64S:
            have = col->int64s->n_values;
            k->i64 = col->int64s->values;
            r.bytes += 8 * n;
            break;
        case KEYFLOW__V1__COLUMN__VALUES_FLOAT64S:
            have = col->float64s->n_values;
            k->f64 = col->float64s->values;
            r.bytes += 8 * n;
            break;
        case KEYFLOW__V1__COLUMN__VALUES_STRINGS: {
            have = col->strings->n_values;
            k->str = col->strings->values;
            if (have != n) {
                break;
            }
            uint32_t *lens = kf_arena_alloc(arena, (n ? n : 1) * sizeof *lens);
            if (lens == NULL) {
                return kf_error_set(err, KF_E_TOO_LARGE, "batch: too large");
            }
            for (size_t i = 0; i < n; i++) {
                size_t len = strlen(k->str[i]);
                if (!kf_utf8_valid(k->str[i], len)) {
                    return kf_error_set(err, KF_E_INVALID,
                                        "batch.columns[%u] (%s): row %zu is not valid UTF-8", c,
                                        f->name, i);
                }
                lens[i] = (uint32_t)len;
                r.bytes += len;
            }
            k->str_len = lens;
            break;
        }
        case KEYFLOW__V1__COLUMN__VALUES_BYTES_VALUES:
            have = col->bytes_values->n_values;
            k->bin = col->bytes_values->values;
            for (size_t i = 0; i < have; i++) {
                r.bytes += k->bin[i].len;
            }
            break;
        default: KF_UNREACHABLE();
        }
        if (have != n) {
            return kf_error_set(err, KF_E_INVALID,
                                "batch.columns[%u] (%s): %zu values for %zu rows", c, f->name, have,
                                n);
        }
    }
    if ((int64_t)r.bytes > max_bytes) {
        return kf_error_set(err, KF_E_TOO_LARGE,
                            "batch: %llu bytes of values, the function's max_input_bytes is %lld",
                            (unsigned long long)r.bytes, (long long)max_bytes);
    }
    *out = r;
    return KF_OK;
}

/* Reads an integer from a JSON number or a decimal string. */
static bool json_int64(const json_t *v, int64_t *out) {
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return true;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;
        errno = 0;
        long long x = strtoll(s, &end, 10);
        if (errno == 0 && end != s && *end == '\0') {
            *out = x;
            return true;
        }
    }
    return false;
}

kf_status_t kf_rows_from_json(const char *json, size_t len, const Keyflow__V1__Schema *schema,
                              int64_t max_rows, int64_t max_bytes, kf_arena_t *arena,
                              kf_rows_t *out, kf_error_t *err) {
    if ((int64_t)len > max_bytes * 4 + 1024) {
        return kf_error_set(err, KF_E_TOO_LARGE,
                            "rows: %zu bytes of JSON is far past max_input_bytes %lld", len,
                            (long long)max_bytes);
    }
    json_error_t jerr;
    json_t *doc = json_loadb(json, len, 0, &jerr);
    if (doc == NULL || !json_is_array(doc)) {
        kf_status_t st =
            kf_error_set(err, KF_E_INVALID, "rows: must be a JSON array of objects%s%s",
                         doc ? "" : ": ", doc ? "" : jerr.text);
        json_decref(doc);
        return st;
    }
    size_t n = json_array_size(doc);
    if ((int64_t)n > max_rows) {
        json_decref(doc);
        return kf_error_set(err, KF_E_TOO_LARGE,
                            "rows: %zu rows, the function's max_input_rows is %lld", n,
                            (long long)max_rows);
    }
    kf_status_t st = KF_OK;
    kf_rows_t r = {.count = (uint32_t)n, .ncols = (uint32_t)schema->n_fields};
    r.cols = kf_arena_zalloc(arena, r.ncols * sizeof *r.cols);
    size_t cap = n ? n : 1;
    for (uint32_t c = 0; r.cols != NULL && c < r.ncols; c++) {
        const Keyflow__V1__Field *f = schema->fields[c];
        kf_column_t *k = &r.cols[c];
        k->type = f->type;
        k->nullable = f->nullable;
        k->name = f->name;
        k->nulls = kf_arena_zalloc(arena, cap * sizeof *k->nulls);
        switch (f->type) {
        case T_BOOL: k->b = kf_arena_zalloc(arena, cap * sizeof *k->b); break;
        case T_INT64:
        case T_TS: k->i64 = kf_arena_zalloc(arena, cap * sizeof *k->i64); break;
        case T_FLOAT64: k->f64 = kf_arena_zalloc(arena, cap * sizeof *k->f64); break;
        case T_UTF8:
            k->str = kf_arena_zalloc(arena, cap * sizeof *k->str);
            k->str_len = kf_arena_zalloc(arena, cap * sizeof *k->str_len);
            break;
        case T_BYTES: k->bin = kf_arena_zalloc(arena, cap * sizeof *k->bin); break;
        default: KF_UNREACHABLE();
        }
    }
    if (r.cols == NULL) {
        json_decref(doc);
        return kf_error_set(err, KF_E_TOO_LARGE, "rows: too large");
    }
    for (size_t i = 0; i < n && st == KF_OK; i++) {
        json_t *row = json_array_get(doc, i);
        if (!json_is_object(row)) {
            st = kf_error_set(err, KF_E_INVALID, "rows[%zu]: must be an object", i);
            break;
        }
        const char *name;
        json_t *val;
        json_object_foreach(row, name, val) {
            if (kf_schema_find(schema, name) < 0) {
                st = kf_error_set(err, KF_E_INVALID,
                                  "rows[%zu].%s: not a column of the input schema", i, name);
                break;
            }
        }
        for (uint32_t c = 0; st == KF_OK && c < r.ncols; c++) {
            kf_column_t *k = &r.cols[c];
            json_t *v = json_object_get(row, k->name);
            if (v == NULL || json_is_null(v)) {
                if (!k->nullable) {
                    st = kf_error_set(err, KF_E_INVALID, "rows[%zu].%s: required (not nullable)", i,
                                      k->name);
                }
                ((protobuf_c_boolean *)k->nulls)[i] = 1;
                continue;
            }
            bool ok = true;
            switch (k->type) {
            case T_BOOL:
                ok = json_is_boolean(v);
                ((protobuf_c_boolean *)k->b)[i] = json_is_true(v);
                r.bytes += 1;
                break;
            case T_INT64:
            case T_TS:
                ok = json_int64(v, &((int64_t *)k->i64)[i]);
                r.bytes += 8;
                break;
            case T_FLOAT64:
                ok = json_is_number(v);
                ((double *)k->f64)[i] = json_number_value(v);
                r.bytes += 8;
                break;
            case T_UTF8: {
                ok = json_is_string(v);
                if (ok) {
                    size_t sl = json_string_length(v);
                    char *s = kf_arena_strndup(arena, json_string_value(v), sl);
                    if (s == NULL) {
                        st = kf_error_set(err, KF_E_TOO_LARGE, "rows: too large");
                        break;
                    }
                    if (strlen(s) != sl) {
                        st = kf_error_set(err, KF_E_INVALID,
                                          "rows[%zu].%s: contains a NUL character", i, k->name);
                        break;
                    }
                    ((char **)k->str)[i] = s;
                    ((uint32_t *)k->str_len)[i] = (uint32_t)sl;
                    r.bytes += sl;
                }
                break;
            }
            case T_BYTES: {
                ok = json_is_string(v);
                if (ok) {
                    const char *s = json_string_value(v);
                    size_t sl = json_string_length(v);
                    uint8_t *b = kf_arena_alloc(arena, sl * 3 / 4 + 4);
                    size_t bl = 0;
                    ok = b != NULL && kf_base64_decode(s, sl, b, &bl);
                    ((ProtobufCBinaryData *)k->bin)[i] = (ProtobufCBinaryData){bl, b};
                    r.bytes += bl;
                }
                break;
            }
            default: KF_UNREACHABLE();
            }
            if (st == KF_OK && !ok) {
                st = kf_error_set(err, KF_E_INVALID, "rows[%zu].%s: expected %s%s", i, k->name,
                                  type_word(k->type),
                                  k->type == T_BYTES                        ? " as base64"
                                  : (k->type == T_INT64 || k->type == T_TS) ? " (an integer)"
                                                                            : "");
            }
        }
    }
    json_decref(doc);
    if (st == KF_OK && (int64_t)r.bytes > max_bytes) {
        st = kf_error_set(err, KF_E_TOO_LARGE,
                          "rows: %llu bytes of values, the function's max_input_bytes is %lld",
                          (unsigned long long)r.bytes, (long long)max_bytes);
    }
    if (st == KF_OK) {
        *out = r;
    }
    return st;
}

/* ---- output rows --------------------------------------------------------- */

void kf_outbuf_init(kf_outbuf_t *out, const Keyflow__V1__Schema *schema, kf_arena_t *arena) {
    memset(out, 0, sizeof *out);
    out->schema = schema;
    out->ncols = (uint32_t)schema->n_fields;
    out->arena = arena;
}

kf_cell_t *kf_outbuf_add_row(kf_outbuf_t *out) {
    if (out->rows == out->cap) {
        uint32_t cap = out->cap ? out->cap * 2 : 64;
        kf_cell_t *cells = kf_arena_alloc(out->arena, (size_t)cap * out->ncols * sizeof *cells);
        if (cells == NULL) {
            return NULL;
        }
        if (out->rows > 0) {
            memcpy(cells, out->cells, (size_t)out->rows * out->ncols * sizeof *cells);
        }
        out->cells = cells; /* the old block stays in the arena until it is freed */
        out->cap = cap;
    }
    kf_cell_t *row = kf_outbuf_row(out, out->rows++);
    memset(row, 0, out->ncols * sizeof *row);
    return row;
}

kf_status_t kf_outbuf_append_rows(kf_outbuf_t *out, const kf_rows_t *rows, uint32_t from,
                                  uint32_t n, kf_error_t *err) {
    KF_ASSERT(rows->ncols == out->ncols && from + n <= rows->count);
    for (uint32_t i = from; i < from + n; i++) {
        kf_cell_t *cells = kf_outbuf_add_row(out);
        if (cells == NULL) {
            return kf_error_set(err, KF_E_TOO_LARGE, "output: too large for one response");
        }
        for (uint32_t c = 0; c < out->ncols; c++) {
            const kf_column_t *k = &rows->cols[c];
            kf_cell_t *cell = &cells[c];
            cell->set = 1;
            if (kf_rows_is_null(rows, i, c)) {
                cell->null = 1;
                continue;
            }
            switch (k->type) {
            case T_BOOL: cell->v.i = k->b[i] ? 1 : 0; break;
            case T_INT64:
            case T_TS: cell->v.i = k->i64[i]; break;
            case T_FLOAT64: cell->v.f = k->f64[i]; break;
            case T_UTF8:
                cell->p = k->str[i];
                cell->len = k->str_len[i];
                break;
            case T_BYTES:
                cell->p = (const char *)k->bin[i].data;
                cell->len = (uint32_t)k->bin[i].len;
                break;
            default: KF_UNREACHABLE();
            }
            out->bytes += cell->len + 8;
        }
    }
    return KF_OK;
}

kf_status_t kf_outbuf_append_from(kf_outbuf_t *out, const kf_outbuf_t *src, uint32_t from,
                                  uint32_t n, kf_error_t *err) {
    KF_ASSERT(src->ncols == out->ncols && from + n <= src->rows);
    for (uint32_t i = from; i < from + n; i++) {
        kf_cell_t *cells = kf_outbuf_add_row(out);
        if (cells == NULL) {
            return kf_error_set(err, KF_E_TOO_LARGE, "output: too large");
        }
        memcpy(cells, kf_outbuf_row(src, i), out->ncols * sizeof *cells);
    }
    out->bytes += src->bytes; /* approximate: used for bounds only */
    return KF_OK;
}

Keyflow__V1__RowBatch *kf_outbuf_to_batch(const kf_outbuf_t *out, uint32_t from, uint32_t n,
                                          kf_arena_t *a) {
    KF_ASSERT(from + n <= out->rows);
    Keyflow__V1__RowBatch *b = kf_arena_zalloc(a, sizeof *b);
    Keyflow__V1__Column **cols = kf_arena_zalloc(a, (out->ncols + 1) * sizeof *cols);
    if (b == NULL || cols == NULL) {
        return NULL;
    }
    keyflow__v1__row_batch__init(b);
    b->row_count = n;
    b->n_columns = out->ncols;
    b->columns = cols;
    size_t cap = n ? n : 1;
    for (uint32_t c = 0; c < out->ncols; c++) {
        const Keyflow__V1__Field *f = out->schema->fields[c];
        Keyflow__V1__Column *col = kf_arena_zalloc(a, sizeof *col);
        if (col == NULL) {
            return NULL;
        }
        keyflow__v1__column__init(col);
        cols[c] = col;
        bool any_null = false;
        for (uint32_t i = 0; i < n; i++) {
            if (kf_outbuf_row(out, from + i)[c].null || !kf_outbuf_row(out, from + i)[c].set) {
                any_null = true;
                break;
            }
        }
        if (any_null) {
            col->nulls = kf_arena_zalloc(a, cap * sizeof *col->nulls);
            if (col->nulls == NULL) {
                return NULL;
            }
            col->n_nulls = n;
            for (uint32_t i = 0; i < n; i++) {
                const kf_cell_t *cell = &kf_outbuf_row(out, from + i)[c];
                col->nulls[i] = cell->null || !cell->set;
            }
        }
        col->values_case = values_case(f->type);
        switch (f->type) {
        case T_BOOL: {
            Keyflow__V1__BoolValues *v = kf_arena_zalloc(a, sizeof *v);
            protobuf_c_boolean *vals = kf_arena_zalloc(a, cap * sizeof *vals);
            if (v == NULL || vals == NULL)
                return NULL;
            keyflow__v1__bool_values__init(v);
            for (uint32_t i = 0; i < n; i++)
                vals[i] = kf_outbuf_row(out, from + i)[c].v.i != 0;
            v->n_values = n;
            v->values = vals;
            col->bools = v;
            break;
        }
        case T_INT64:
        case T_TS: {
            Keyflow__V1__Int64Values *v = kf_arena_zalloc(a, sizeof *v);
            int64_t *vals = kf_arena_zalloc(a, cap * sizeof *vals);
            if (v == NULL || vals == NULL)
                return NULL;
            keyflow__v1__int64_values__init(v);
            for (uint32_t i = 0; i < n; i++)
                vals[i] = kf_outbuf_row(out, from + i)[c].v.i;
            v->n_values = n;
            v->values = vals;
            col->int64s = v;
            break;
        }
        case T_FLOAT64: {
            Keyflow__V1__Float64Values *v = kf_arena_zalloc(a, sizeof *v);
            double *vals = kf_arena_zalloc(a, cap * sizeof *vals);
            if (v == NULL || vals == NULL)
                return NULL;
            keyflow__v1__float64_values__init(v);
            for (uint32_t i = 0; i < n; i++)
                vals[i] = kf_outbuf_row(out, from + i)[c].v.f;
            v->n_values = n;
            v->values = vals;
            col->float64s = v;
            break;
        }
        case T_UTF8: {
            Keyflow__V1__StringValues *v = kf_arena_zalloc(a, sizeof *v);
            char **vals = kf_arena_zalloc(a, cap * sizeof *vals);
            if (v == NULL || vals == NULL)
                return NULL;
            keyflow__v1__string_values__init(v);
            for (uint32_t i = 0; i < n; i++) {
                /* Cell strings are NUL-terminated copies or protobuf-c strings. */
                const kf_cell_t *cell = &kf_outbuf_row(out, from + i)[c];
                KF_ASSERT(cell->p == NULL || cell->p[cell->len] == '\0');
                vals[i] = cell->p ? (char *)cell->p : (char *)"";
            }
            v->n_values = n;
            v->values = vals;
            col->strings = v;
            break;
        }
        case T_BYTES: {
            Keyflow__V1__BytesValues *v = kf_arena_zalloc(a, sizeof *v);
            ProtobufCBinaryData *vals = kf_arena_zalloc(a, cap * sizeof *vals);
            if (v == NULL || vals == NULL)
                return NULL;
            keyflow__v1__bytes_values__init(v);
            for (uint32_t i = 0; i < n; i++) {
                const kf_cell_t *cell = &kf_outbuf_row(out, from + i)[c];
                vals[i].data = (uint8_t *)cell->p;
                vals[i].len = cell->len;
            }
            v->n_values = n;
            v->values = vals;
            col->bytes_values = v;
            break;
        }
        default: KF_UNREACHABLE();
        }
    }
    return b;
}

char *kf_outbuf_to_json(const kf_outbuf_t *out, uint32_t from, uint32_t n, int64_t seq_base,
                        kf_arena_t *arena, size_t *len) {
    json_t *arr = json_array();
    for (uint32_t i = 0; i < n; i++) {
        json_t *obj = json_object();
        if (seq_base > 0) {
            char seq[24];
            snprintf(seq, sizeof seq, "%" PRId64, seq_base + i);
            json_object_set_new(obj, "_seq", json_string(seq));
        }
        const kf_cell_t *cells = kf_outbuf_row(out, from + i);
        for (uint32_t c = 0; c < out->ncols; c++) {
            const Keyflow__V1__Field *f = out->schema->fields[c];
            const kf_cell_t *cell = &cells[c];
            json_t *v;
            if (cell->null || !cell->set) {
                v = json_null();
            } else {
                switch (f->type) {
                case T_BOOL: v = json_boolean(cell->v.i != 0); break;
                case T_INT64:
                case T_TS: {
                    char s[24];
                    snprintf(s, sizeof s, "%" PRId64, cell->v.i);
                    v = json_string(s); /* proto3 JSON: 64-bit integers as strings */
                    break;
                }
                case T_FLOAT64:
                    v = isfinite(cell->v.f) ? json_real(cell->v.f)
                                            : json_string(isnan(cell->v.f) ? "NaN"
                                                          : cell->v.f > 0  ? "Infinity"
                                                                           : "-Infinity");
                    break;
                case T_UTF8: v = json_stringn(cell->p ? cell->p : "", cell->len); break;
                case T_BYTES: {
                    char *b64 = malloc(kf_base64_encoded_len(cell->len) + 1);
                    KF_ASSERT(b64 != NULL);
                    kf_base64_encode((const uint8_t *)cell->p, cell->len, b64);
                    v = json_string(b64);
                    free(b64);
                    break;
                }
                default: KF_UNREACHABLE();
                }
            }
            json_object_set_new(obj, f->name, v);
        }
        json_array_append_new(arr, obj);
    }
    char *text = json_dumps(arr, JSON_COMPACT);
    json_decref(arr);
    if (text == NULL) {
        return NULL;
    }
    char *copy = kf_arena_strdup(arena, text);
    free(text);
    if (copy != NULL) {
        *len = strlen(copy);
    }
    return copy;
}
