/*
 * columns.h - the column types of process functions (keyflow.v1.FieldType)
 * as one table: per type its name, its width, its JSON form, how one value
 * is read from and written to a columnar keyflow.v1.Column, and what makes
 * a value valid. The engine (functions/rows.c, descriptor.c, host.c) and
 * the CLI (clients/cli/cli_rows.c) both go through it, so a value converts
 * the same way in every front end, and a new type is one more row (the
 * table's test fails until every FieldType has one).
 *
 * A value travels as a kf_cell_t:
 *   BOOL             v.i (0 or 1)
 *   INT64            v.i
 *   FLOAT64          v.f
 *   UTF8             p, len (p NUL-terminated at len, valid UTF-8, no NUL)
 *   BYTES            p, len
 *   TIMESTAMP_US     v.i (UTC microseconds)
 *
 * JSON rows (rows_json, HTTP "rows", `keyflow functions push`) write a value
 * in its proto3 JSON form: BOOL true/false; INT64 and TIMESTAMP_US an
 * integer or a decimal string; FLOAT64 a number, a decimal string, "NaN",
 * "Infinity" or "-Infinity"; UTF8 a string; BYTES base64 (standard or
 * URL-safe, padded or not). A null or missing value is a null.
 *
 * The table is constant: any thread. Nothing here allocates except into
 * the arena a caller passes.
 */
#ifndef KF_PROTO_COLUMNS_H
#define KF_PROTO_COLUMNS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/arena.h"
#include "keyflow/v1/functions.pb-c.h"

/* One cell of a row: a value of its column's type, or a null. */
typedef struct kf_cell {
    union {
        int64_t i;
        double f;
    } v;
    const char *p; /* UTF8 / BYTES bytes (borrowed: an arena or a message) */
    uint32_t len;
    uint8_t set; /* a value or an explicit null was given */
    uint8_t null;
} kf_cell_t;

typedef enum kf_cell_decode {
    KF_CELL_DECODED,
    KF_CELL_WRONG_FORM, /* not a JSON form of this type */
    KF_CELL_NO_MEMORY,  /* the arena is full */
} kf_cell_decode_t;

typedef struct kf_column_type {
    Keyflow__V1__FieldType type;
    const char *name;      /* FieldType's name without its prefix: "INT64" */
    const char *json_form; /* the JSON forms of a value, for messages and help */
    /* Bytes a value counts against max_input_bytes; 0: variable, its len. */
    uint32_t value_bytes;
    /* The keyflow.v1.Column member that carries this type's values. */
    Keyflow__V1__Column__ValuesCase values_case;
    const char *values_name; /* that member's name: "int64s" */

    /* Reads a JSON value (not null) into *out; UTF8 and BYTES bytes are
     * copied into `arena`. */
    kf_cell_decode_t (*from_json)(const json_t *v, kf_arena_t *arena, kf_cell_t *out);
    /* The JSON form of a (non-null) cell; NULL when jansson is out of
     * memory. */
    json_t *(*to_json)(const kf_cell_t *cell);
    /* Sets col's values member (and values_case) to `rows` values, each
     * zero, false, "" or empty; false when the arena is full. */
    bool (*values_new)(Keyflow__V1__Column *col, size_t rows, kf_arena_t *arena);
    /* How many values col's member holds (col->values_case must be this
     * type's). */
    size_t (*values_count)(const Keyflow__V1__Column *col);
    /* Value `row` (< values_count) into *out; bytes are borrowed from col. */
    void (*values_get)(const Keyflow__V1__Column *col, size_t row, kf_cell_t *out);
    /* Stores the cell's value at `row`: bytes are borrowed, so they must
     * outlive col; a UTF8 cell without bytes is stored as "". */
    void (*values_set)(Keyflow__V1__Column *col, size_t row, const kf_cell_t *cell);
    /* Whether a value from outside (a message, a handler) is one of this
     * type: UTF8 must be valid UTF-8 without NUL bytes; others always are. */
    bool (*valid)(const kf_cell_t *cell);
} kf_column_type_t;

/* The row of `type`; NULL for FIELD_TYPE_UNSPECIFIED and numbers this build
 * does not know. */
const kf_column_type_t *kf_column_type(Keyflow__V1__FieldType type);

/* The rows in FieldType order, for listing them: i in [0, count). */
size_t kf_column_types_count(void);
const kf_column_type_t *kf_column_type_at(size_t i);

/* ---- JSON rows into columnar batches ---------------------------------------- */

/* A batch of `rows` rows for `schema` (fields of known types), every
 * column named, every value zero (kf_column_type_t.values_new) and a nulls
 * array ready (n_nulls stays 0 until a null is stored). NULL when the arena
 * is full. */
Keyflow__V1__RowBatch *kf_row_batch_new(const Keyflow__V1__Schema *schema, size_t rows,
                                        kf_arena_t *arena);

typedef enum kf_row_problem {
    KF_ROW_CONVERTED,
    KF_ROW_UNKNOWN_FIELD, /* a key the schema does not have */
    KF_ROW_REQUIRED,      /* null or missing, and the field is not nullable */
    KF_ROW_WRONG_FORM,    /* not a JSON form of the field's type */
    KF_ROW_NO_MEMORY,     /* the arena is full */
} kf_row_problem_t;

typedef struct kf_row_result {
    kf_row_problem_t problem;
    const char *field;            /* the key or field at fault (borrowed) */
    const json_t *value;          /* KF_ROW_WRONG_FORM: the value (borrowed) */
    const kf_column_type_t *type; /* the field's type, for messages */
    uint64_t value_bytes;         /* bytes of the values stored (a null: 0) */
} kf_row_result_t;

/* Converts one row, a JSON object `obj`, into row `row` of `batch`
 * (kf_row_batch_new for the same schema). Keys are checked first, then the
 * fields in schema order; the first problem stops the conversion and the
 * batch must then be dropped. Bytes are copied into `arena`. */
void kf_row_from_json(const Keyflow__V1__Schema *schema, const json_t *obj,
                      Keyflow__V1__RowBatch *batch, size_t row, kf_arena_t *arena,
                      kf_row_result_t *result);

#endif
