/*
 * rows.h - row batches of process functions.
 *
 *   kf_rows_t    a read-only columnar view of input rows, checked against a
 *                schema: built over a protobuf RowBatch (zero copy: it points
 *                into the unpacked message) or from a JSON array of objects
 *                (converted into a RowBatch first).
 *   kf_outbuf_t  a growable row builder for output rows (cells, row-major),
 *                encoded into a protobuf RowBatch (stored output chunks,
 *                ReadOutput pages) or rendered as JSON objects.
 *
 * Every conversion of a value goes through its type's row in
 * proto/columns.h. All memory comes from the arena given at creation;
 * nothing is freed before the arena is. Engine-thread (or one request) only.
 */
#ifndef KF_FUNCTIONS_ROWS_H
#define KF_FUNCTIONS_ROWS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/arena.h"
#include "base/crypto.h"
#include "base/status.h"
#include "keyflow/v1/functions.pb-c.h"
#include "proto/columns.h"

/* A column's values are read through its type's codec row
 * (kf_rows_value), never as another type's. */
typedef struct kf_column {
    const kf_column_type_t *type;
    bool nullable;
    const char *name;
    const protobuf_c_boolean *nulls;   /* NULL: no nulls */
    const Keyflow__V1__Column *values; /* holds type->values_case */
} kf_column_t;

typedef struct kf_rows {
    uint32_t count;
    uint32_t ncols;
    kf_column_t *cols;
    uint64_t bytes; /* payload bytes, for max_input_bytes */
} kf_rows_t;

/* Errors name the column and row: KF_E_INVALID for shape or type problems,
 * KF_E_TOO_LARGE past max_rows / max_bytes (naming the limit). */
kf_status_t kf_rows_from_batch(const Keyflow__V1__RowBatch *batch,
                               const Keyflow__V1__Schema *schema, int64_t max_rows,
                               int64_t max_bytes, kf_arena_t *arena, kf_rows_t *out,
                               kf_error_t *err) KF_MUST_USE;
kf_status_t kf_rows_from_json(const char *json, size_t len, const Keyflow__V1__Schema *schema,
                              int64_t max_rows, int64_t max_bytes, kf_arena_t *arena,
                              kf_rows_t *out, kf_error_t *err) KF_MUST_USE;

/* Feeds the rows' content into a SHA-256 in one canonical form: the
 * counts, then per column (schema order) per row a null flag and the value
 * (fixed-width values as 8 bytes, UTF8 and BYTES with a 4-byte length).
 * Equal rows give equal bytes whether they came as JSON or columnar, and a
 * null's placeholder value is left out. */
void kf_rows_digest(const kf_rows_t *rows, kf_sha256_ctx_t *h);

static inline bool kf_rows_is_null(const kf_rows_t *r, uint32_t row, uint32_t col) {
    return r->cols[col].nulls != NULL && r->cols[col].nulls[row];
}

/* The value at (row, col), meaningless when the cell is null
 * (kf_rows_is_null); bytes are borrowed from the rows. */
static inline void kf_rows_value(const kf_rows_t *r, uint32_t row, uint32_t col, kf_cell_t *out) {
    const kf_column_t *c = &r->cols[col];
    c->type->values_get(c->values, row, out);
}

/* Rows which[0..n) of `rows` as a RowBatch (a remote handler call's input
 * rows). The batch points into `rows`' values; it lives in the arena and
 * no longer than `rows`. NULL when the arena is full. */
Keyflow__V1__RowBatch *kf_rows_gather(const kf_rows_t *rows, const uint32_t *which, uint32_t n,
                                      kf_arena_t *arena);

/* ---- output rows --------------------------------------------------------- */

typedef struct kf_outbuf {
    const Keyflow__V1__Schema *schema;
    uint32_t ncols;
    kf_cell_t *cells; /* rows * ncols */
    uint32_t rows;
    uint32_t cap;
    uint64_t bytes; /* payload bytes so far */
    kf_arena_t *arena;
} kf_outbuf_t;

void kf_outbuf_init(kf_outbuf_t *out, const Keyflow__V1__Schema *schema, kf_arena_t *arena);
/* Appends an empty row (every cell unset); NULL when the arena is full. */
kf_cell_t *kf_outbuf_add_row(kf_outbuf_t *out);
static inline kf_cell_t *kf_outbuf_row(const kf_outbuf_t *out, uint32_t row) {
    return out->cells + (size_t)row * out->ncols;
}
/* Copies rows [from, from + n) of `rows` (same schema) into the builder. */
kf_status_t kf_outbuf_append_rows(kf_outbuf_t *out, const kf_rows_t *rows, uint32_t from,
                                  uint32_t n, kf_error_t *err) KF_MUST_USE;
/* Copies rows [from, from + n) of another builder. */
kf_status_t kf_outbuf_append_from(kf_outbuf_t *out, const kf_outbuf_t *src, uint32_t from,
                                  uint32_t n, kf_error_t *err) KF_MUST_USE;

/* Encodes rows [from, from + n) as a RowBatch (pointing into the builder's
 * arena). */
Keyflow__V1__RowBatch *kf_outbuf_to_batch(const kf_outbuf_t *out, uint32_t from, uint32_t n,
                                          kf_arena_t *arena);
/* Renders rows [from, from + n) as a JSON array of objects; when seq_base >
 * 0 each object carries "_seq": "<seq_base + i>". NULL on arena exhaustion. */
char *kf_outbuf_to_json(const kf_outbuf_t *out, uint32_t from, uint32_t n, int64_t seq_base,
                        kf_arena_t *arena, size_t *len);

#endif
