/*
 * rows.c - input views, JSON rows, output builders (see rows.h). Every
 * per-type step (checking, reading, writing, JSON) is a call into the
 * column type's row of proto/columns.h; nothing here switches on a type.
 */
#include "functions/rows.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/assert.h"
#include "base/limits.h"
#include "functions/descriptor.h"

/* The column type of a schema field: schemas here are canonical, so every
 * field has a known type. */
static const kf_column_type_t *field_type(const Keyflow__V1__Field *f) {
    const kf_column_type_t *ct = kf_column_type(f->type);
    KF_ASSERT(ct != NULL);
    return ct;
}

/* Checks a batch's columns against the schema and points *out into it.
 * out->bytes counts every value, a null's placeholder too. */
static kf_status_t bind_batch(const Keyflow__V1__RowBatch *batch, const Keyflow__V1__Schema *schema,
                              kf_arena_t *arena, kf_rows_t *out, kf_error_t *err) {
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
        const kf_column_type_t *ct = field_type(f);
        kf_column_t *k = &r.cols[c];
        k->type = ct;
        k->nullable = f->nullable;
        k->name = f->name;
        if (col->name[0] != '\0' && strcmp(col->name, f->name) != 0) {
            return kf_error_set(err, KF_E_INVALID,
                                "batch.columns[%u].name: \"%s\" where the schema has \"%s\"", c,
                                col->name, f->name);
        }
        if (col->values_case != ct->values_case) {
            return kf_error_set(err, KF_E_INVALID,
                                "batch.columns[%u] (%s): %s is %s, expected %s values", c, f->name,
                                f->name, ct->name, ct->values_name);
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
        size_t have = ct->values_count(col);
        if (have != n) {
            return kf_error_set(err, KF_E_INVALID,
                                "batch.columns[%u] (%s): %zu values for %zu rows", c, f->name, have,
                                n);
        }
        k->values = col;
        if (ct->value_bytes > 0) {
            r.bytes += (uint64_t)ct->value_bytes * n;
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            kf_cell_t cell = {0};
            ct->values_get(col, i, &cell);
            if (!ct->valid(&cell)) {
                return kf_error_set(err, KF_E_INVALID,
                                    "batch.columns[%u] (%s): row %zu is not a valid %s value", c,
                                    f->name, i, ct->name);
            }
            r.bytes += cell.len;
        }
    }
    *out = r;
    return KF_OK;
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
    kf_rows_t r;
    kf_status_t st = bind_batch(batch, schema, arena, &r, err);
    if (st != KF_OK) {
        return st;
    }
    if ((int64_t)r.bytes > max_bytes) {
        return kf_error_set(err, KF_E_TOO_LARGE,
                            "batch: %llu bytes of values, the function's max_input_bytes is %lld",
                            (unsigned long long)r.bytes, (long long)max_bytes);
    }
    *out = r;
    return KF_OK;
}

/* Converts the rows of a parsed JSON array into `batch`; *bytes counts the
 * values given (nulls weigh nothing). */
static kf_status_t convert_json_rows(const json_t *doc, const Keyflow__V1__Schema *schema,
                                     Keyflow__V1__RowBatch *batch, kf_arena_t *arena,
                                     uint64_t *bytes, kf_error_t *err) {
    for (size_t i = 0; i < json_array_size(doc); i++) {
        const json_t *row = json_array_get(doc, i);
        if (!json_is_object(row)) {
            return kf_error_set(err, KF_E_INVALID, "rows[%zu]: must be an object", i);
        }
        kf_row_result_t res;
        kf_row_from_json(schema, row, batch, i, arena, &res);
        switch (res.problem) {
        case KF_ROW_CONVERTED: *bytes += res.value_bytes; break;
        case KF_ROW_UNKNOWN_FIELD:
            return kf_error_set(err, KF_E_INVALID, "rows[%zu].%s: not a column of the input schema",
                                i, res.field);
        case KF_ROW_REQUIRED:
            return kf_error_set(err, KF_E_INVALID, "rows[%zu].%s: required (not nullable)", i,
                                res.field);
        case KF_ROW_WRONG_FORM:
            return kf_error_set(err, KF_E_INVALID, "rows[%zu].%s: expected %s (%s)", i, res.field,
                                res.type->name, res.type->json_form);
        case KF_ROW_NO_MEMORY: return kf_error_set(err, KF_E_TOO_LARGE, "rows: too large");
        }
    }
    return KF_OK;
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
    /* The rows become a columnar batch, which then goes the way of one that
     * came in columnar. */
    Keyflow__V1__RowBatch *batch = kf_row_batch_new(schema, n, arena);
    uint64_t bytes = 0;
    kf_status_t st = batch != NULL ? convert_json_rows(doc, schema, batch, arena, &bytes, err)
                                   : kf_error_set(err, KF_E_TOO_LARGE, "rows: too large");
    json_decref(doc);
    kf_rows_t r;
    if (st == KF_OK && (st = bind_batch(batch, schema, arena, &r, err)) == KF_OK) {
        r.bytes = bytes;
        if ((int64_t)r.bytes > max_bytes) {
            st = kf_error_set(err, KF_E_TOO_LARGE,
                              "rows: %llu bytes of values, the function's max_input_bytes is %lld",
                              (unsigned long long)r.bytes, (long long)max_bytes);
        }
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
            kf_cell_t *cell = &cells[c];
            cell->set = 1;
            if (kf_rows_is_null(rows, i, c)) {
                cell->null = 1;
                continue;
            }
            kf_rows_value(rows, i, c, cell);
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

/* A batch of n rows with ncols empty columns; NULL when the arena is full. */
static Keyflow__V1__RowBatch *batch_new(uint32_t ncols, uint32_t n, kf_arena_t *a) {
    Keyflow__V1__RowBatch *b = kf_arena_zalloc(a, sizeof *b);
    Keyflow__V1__Column **cols = kf_arena_zalloc(a, (ncols + 1) * sizeof *cols);
    if (b == NULL || cols == NULL) {
        return NULL;
    }
    keyflow__v1__row_batch__init(b);
    b->row_count = n;
    b->n_columns = ncols;
    b->columns = cols;
    for (uint32_t c = 0; c < ncols; c++) {
        cols[c] = kf_arena_zalloc(a, sizeof *cols[c]);
        if (cols[c] == NULL) {
            return NULL;
        }
        keyflow__v1__column__init(cols[c]);
    }
    return b;
}

Keyflow__V1__RowBatch *kf_outbuf_to_batch(const kf_outbuf_t *out, uint32_t from, uint32_t n,
                                          kf_arena_t *a) {
    KF_ASSERT(from + n <= out->rows);
    Keyflow__V1__RowBatch *b = batch_new(out->ncols, n, a);
    if (b == NULL) {
        return NULL;
    }
    size_t cap = n ? n : 1;
    for (uint32_t c = 0; c < out->ncols; c++) {
        const Keyflow__V1__Field *f = out->schema->fields[c];
        Keyflow__V1__Column *col = b->columns[c];
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
        const kf_column_type_t *ct = field_type(f);
        if (!ct->values_new(col, n, a)) {
            return NULL;
        }
        /* Every cell's value is written, a null's too (zero unless a
         * handler set a value before it set null); readers ignore it. */
        for (uint32_t i = 0; i < n; i++) {
            ct->values_set(col, i, &kf_outbuf_row(out, from + i)[c]);
        }
    }
    return b;
}

Keyflow__V1__RowBatch *kf_rows_gather(const kf_rows_t *rows, const uint32_t *which, uint32_t n,
                                      kf_arena_t *a) {
    Keyflow__V1__RowBatch *b = batch_new(rows->ncols, n, a);
    if (b == NULL) {
        return NULL;
    }
    size_t cap = n ? n : 1;
    for (uint32_t c = 0; c < rows->ncols; c++) {
        const kf_column_t *in = &rows->cols[c];
        Keyflow__V1__Column *col = b->columns[c];
        bool any_null = false;
        for (uint32_t i = 0; i < n && in->nulls != NULL && !any_null; i++) {
            any_null = in->nulls[which[i]] != 0;
        }
        if (any_null) {
            col->nulls = kf_arena_zalloc(a, cap * sizeof *col->nulls);
            if (col->nulls == NULL) {
                return NULL;
            }
            col->n_nulls = n;
            for (uint32_t i = 0; i < n; i++) {
                col->nulls[i] = in->nulls[which[i]] != 0;
            }
        }
        if (!in->type->values_new(col, n, a)) {
            return NULL;
        }
        /* Values (a null's placeholder too) are borrowed from the rows: the
         * batch lives no longer than they do. */
        for (uint32_t i = 0; i < n; i++) {
            kf_cell_t cell;
            kf_rows_value(rows, which[i], c, &cell);
            in->type->values_set(col, i, &cell);
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
            json_t *v = cell->null || !cell->set ? json_null() : field_type(f)->to_json(cell);
            if (v == NULL) { /* jansson is out of memory */
                json_decref(obj);
                json_decref(arr);
                return NULL;
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

/* ---- digest -------------------------------------------------------------- */

/* Small writes go through a buffer: one SHA-256 update per few KB. */
typedef struct digest_buf {
    kf_sha256_ctx_t *h;
    size_t used;
    uint8_t bytes[4096];
} digest_buf_t;

static void digest_put(digest_buf_t *b, const void *p, size_t len) {
    if (len == 0) {
        return; /* an empty string's p may be NULL: memcpy must not see it */
    }
    if (b->used + len > sizeof b->bytes) {
        kf_sha256_update(b->h, b->bytes, b->used);
        b->used = 0;
        if (len > sizeof b->bytes) {
            kf_sha256_update(b->h, p, len);
            return;
        }
    }
    memcpy(b->bytes + b->used, p, len);
    b->used += len;
}

static void digest_be(digest_buf_t *b, uint64_t v, size_t bytes) {
    uint8_t out[8];
    for (size_t i = 0; i < bytes; i++) {
        out[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    }
    digest_put(b, out, bytes);
}

void kf_rows_digest(const kf_rows_t *rows, kf_sha256_ctx_t *h) {
    digest_buf_t b = {.h = h};
    digest_be(&b, rows->count, 4);
    digest_be(&b, rows->ncols, 4);
    for (uint32_t c = 0; c < rows->ncols && rows->count > 0; c++) {
        const kf_column_type_t *t = rows->cols[c].type;
        for (uint32_t r = 0; r < rows->count; r++) {
            uint8_t is_null = kf_rows_is_null(rows, r, c) ? 1 : 0;
            digest_put(&b, &is_null, 1);
            if (is_null) {
                continue;
            }
            kf_cell_t v;
            kf_rows_value(rows, r, c, &v);
            if (t->value_bytes == 0) {
                digest_be(&b, v.len, 4);
                digest_put(&b, v.p, v.len);
            } else if (t->type == KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64) {
                uint64_t bits;
                memcpy(&bits, &v.v.f, sizeof bits);
                digest_be(&b, bits, 8);
            } else {
                digest_be(&b, (uint64_t)v.v.i, 8);
            }
        }
    }
    kf_sha256_update(h, b.bytes, b.used);
}
