/*
 * columns.c - the column type table (see columns.h).
 *
 * Invariants
 *   1. Row i of the table describes FieldType i + 1, in FieldType order, so
 *      kf_column_type() is an index; a static assertion and the table's
 *      test keep the two in step.
 *   2. Values are read and written only through the member values_case
 *      names, so a column's oneof is never read as another member.
 *   3. JSON forms are proto3 JSON's, through base/json.h, which the
 *      gateway's generic mapping uses too.
 */
#include "proto/columns.h"

#include <string.h>

#include "base/assert.h"
#include "base/base64.h"
#include "base/json.h"
#include "base/text.h"

/* ---- shared pieces ------------------------------------------------------- */

static bool always_valid(const kf_cell_t *cell) {
    (void)cell;
    return true;
}

/* Allocates a values message and its array of `rows` elements, zeroed. */
static void *values_alloc(kf_arena_t *arena, size_t message_bytes, size_t rows,
                          size_t element_bytes, void **elements) {
    void *message = kf_arena_zalloc(arena, message_bytes);
    *elements = kf_arena_zalloc(arena, (rows > 0 ? rows : 1) * element_bytes);
    return message != NULL && *elements != NULL ? message : NULL;
}

/* Wraps a message writer: `type` names the values message (Int64Values),
 * `lower` its protobuf-c function prefix, `member` the Column member,
 * `elem` the element type. */
#define VALUES_NEW(fn, type, lower, member, elem, values_case_)                                    \
    static bool fn(Keyflow__V1__Column *col, size_t rows, kf_arena_t *arena) {                     \
        void *elements;                                                                            \
        Keyflow__V1__##type *v = values_alloc(arena, sizeof *v, rows, sizeof(elem), &elements);    \
        if (v == NULL) {                                                                           \
            return false;                                                                          \
        }                                                                                          \
        keyflow__v1__##lower##__init(v);                                                           \
        v->n_values = rows;                                                                        \
        v->values = elements;                                                                      \
        col->values_case = values_case_;                                                           \
        col->member = v;                                                                           \
        return true;                                                                               \
    }

/* ---- BOOL ------------------------------------------------------------------ */

static kf_cell_decode_t bool_from_json(const json_t *v, kf_arena_t *arena, kf_cell_t *out) {
    (void)arena;
    if (!json_is_boolean(v)) {
        return KF_CELL_WRONG_FORM;
    }
    out->v.i = json_is_true(v);
    return KF_CELL_DECODED;
}

static json_t *bool_to_json(const kf_cell_t *cell) {
    return json_boolean(cell->v.i != 0);
}

VALUES_NEW(bool_values_new, BoolValues, bool_values, bools, protobuf_c_boolean,
           KEYFLOW__V1__COLUMN__VALUES_BOOLS)

static size_t bool_values_count(const Keyflow__V1__Column *col) {
    return col->bools->n_values;
}

static void bool_values_get(const Keyflow__V1__Column *col, size_t row, kf_cell_t *out) {
    out->v.i = col->bools->values[row] ? 1 : 0;
}

static void bool_values_set(Keyflow__V1__Column *col, size_t row, const kf_cell_t *cell) {
    col->bools->values[row] = cell->v.i != 0;
}

/* ---- INT64 and TIMESTAMP_US ------------------------------------------------ */

static kf_cell_decode_t int64_from_json(const json_t *v, kf_arena_t *arena, kf_cell_t *out) {
    (void)arena;
    return kf_json_int64_value(v, &out->v.i) ? KF_CELL_DECODED : KF_CELL_WRONG_FORM;
}

static json_t *int64_to_json(const kf_cell_t *cell) {
    return kf_json_int64(cell->v.i); /* proto3 JSON: 64-bit integers as strings */
}

VALUES_NEW(int64_values_new, Int64Values, int64_values, int64s, int64_t,
           KEYFLOW__V1__COLUMN__VALUES_INT64S)

static size_t int64_values_count(const Keyflow__V1__Column *col) {
    return col->int64s->n_values;
}

static void int64_values_get(const Keyflow__V1__Column *col, size_t row, kf_cell_t *out) {
    out->v.i = col->int64s->values[row];
}

static void int64_values_set(Keyflow__V1__Column *col, size_t row, const kf_cell_t *cell) {
    col->int64s->values[row] = cell->v.i;
}

/* ---- FLOAT64 --------------------------------------------------------------- */

static kf_cell_decode_t float64_from_json(const json_t *v, kf_arena_t *arena, kf_cell_t *out) {
    (void)arena;
    return kf_json_double_value(v, &out->v.f) ? KF_CELL_DECODED : KF_CELL_WRONG_FORM;
}

static json_t *float64_to_json(const kf_cell_t *cell) {
    return kf_json_double(cell->v.f);
}

VALUES_NEW(float64_values_new, Float64Values, float64_values, float64s, double,
           KEYFLOW__V1__COLUMN__VALUES_FLOAT64S)

static size_t float64_values_count(const Keyflow__V1__Column *col) {
    return col->float64s->n_values;
}

static void float64_values_get(const Keyflow__V1__Column *col, size_t row, kf_cell_t *out) {
    out->v.f = col->float64s->values[row];
}

static void float64_values_set(Keyflow__V1__Column *col, size_t row, const kf_cell_t *cell) {
    col->float64s->values[row] = cell->v.f;
}

/* ---- UTF8 ------------------------------------------------------------------ */

static kf_cell_decode_t utf8_from_json(const json_t *v, kf_arena_t *arena, kf_cell_t *out) {
    if (!json_is_string(v)) {
        return KF_CELL_WRONG_FORM;
    }
    size_t len = json_string_length(v);
    /* A string holding "\u0000" (only readable with JSON_ALLOW_NUL) is no
     * C string, so it is not a UTF8 value. */
    if (memchr(json_string_value(v), 0, len) != NULL) {
        return KF_CELL_WRONG_FORM;
    }
    char *copy = kf_arena_strndup(arena, json_string_value(v), len);
    if (copy == NULL) {
        return KF_CELL_NO_MEMORY;
    }
    out->p = copy;
    out->len = (uint32_t)len;
    return KF_CELL_DECODED;
}

static json_t *utf8_to_json(const kf_cell_t *cell) {
    return json_stringn(cell->p != NULL ? cell->p : "", cell->len);
}

/* protobuf-c packs strings with strlen, so every slot needs one. */
static char empty_text[] = "";

static bool utf8_values_new(Keyflow__V1__Column *col, size_t rows, kf_arena_t *arena) {
    void *elements;
    Keyflow__V1__StringValues *v = values_alloc(arena, sizeof *v, rows, sizeof(char *), &elements);
    if (v == NULL) {
        return false;
    }
    keyflow__v1__string_values__init(v);
    v->n_values = rows;
    v->values = elements;
    for (size_t r = 0; r < rows; r++) {
        v->values[r] = empty_text;
    }
    col->values_case = KEYFLOW__V1__COLUMN__VALUES_STRINGS;
    col->strings = v;
    return true;
}

static size_t utf8_values_count(const Keyflow__V1__Column *col) {
    return col->strings->n_values;
}

static void utf8_values_get(const Keyflow__V1__Column *col, size_t row, kf_cell_t *out) {
    out->p = col->strings->values[row];
    out->len = (uint32_t)strlen(out->p);
}

static void utf8_values_set(Keyflow__V1__Column *col, size_t row, const kf_cell_t *cell) {
    /* Cell strings are NUL-terminated copies or protobuf-c strings. */
    KF_ASSERT(cell->p == NULL || cell->p[cell->len] == '\0');
    col->strings->values[row] = cell->p != NULL ? (char *)cell->p : empty_text;
}

static bool utf8_valid(const kf_cell_t *cell) {
    return kf_utf8_valid(cell->p, cell->len) &&
           (cell->len == 0 || memchr(cell->p, 0, cell->len) == NULL);
}

/* ---- BYTES ----------------------------------------------------------------- */

static kf_cell_decode_t bytes_from_json(const json_t *v, kf_arena_t *arena, kf_cell_t *out) {
    if (!json_is_string(v)) {
        return KF_CELL_WRONG_FORM;
    }
    size_t text_len = json_string_length(v);
    uint8_t *bytes = kf_arena_alloc(arena, text_len * 3 / 4 + 3);
    if (bytes == NULL) {
        return KF_CELL_NO_MEMORY;
    }
    size_t len = 0;
    if (!kf_base64_decode(json_string_value(v), text_len, bytes, &len)) {
        return KF_CELL_WRONG_FORM;
    }
    out->p = (const char *)bytes;
    out->len = (uint32_t)len;
    return KF_CELL_DECODED;
}

static json_t *bytes_to_json(const kf_cell_t *cell) {
    return kf_json_bytes((const uint8_t *)cell->p, cell->len);
}

VALUES_NEW(bytes_values_new, BytesValues, bytes_values, bytes_values, ProtobufCBinaryData,
           KEYFLOW__V1__COLUMN__VALUES_BYTES_VALUES)

static size_t bytes_values_count(const Keyflow__V1__Column *col) {
    return col->bytes_values->n_values;
}

static void bytes_values_get(const Keyflow__V1__Column *col, size_t row, kf_cell_t *out) {
    out->p = (const char *)col->bytes_values->values[row].data;
    out->len = (uint32_t)col->bytes_values->values[row].len;
}

static void bytes_values_set(Keyflow__V1__Column *col, size_t row, const kf_cell_t *cell) {
    col->bytes_values->values[row].data = (uint8_t *)cell->p;
    col->bytes_values->values[row].len = cell->len;
}

/* ---- the table ------------------------------------------------------------- */

#define INT64_FUNCTIONS                                                                            \
    .from_json = int64_from_json, .to_json = int64_to_json, .values_new = int64_values_new,        \
    .values_count = int64_values_count, .values_get = int64_values_get,                            \
    .values_set = int64_values_set, .valid = always_valid

static const kf_column_type_t column_types[] = {
    {
        .type = KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BOOL,
        .name = "BOOL",
        .json_form = "true or false",
        .value_bytes = 1,
        .values_case = KEYFLOW__V1__COLUMN__VALUES_BOOLS,
        .values_name = "bools",
        .from_json = bool_from_json,
        .to_json = bool_to_json,
        .values_new = bool_values_new,
        .values_count = bool_values_count,
        .values_get = bool_values_get,
        .values_set = bool_values_set,
        .valid = always_valid,
    },
    {
        .type = KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64,
        .name = "INT64",
        .json_form = "an integer or a decimal string",
        .value_bytes = 8,
        .values_case = KEYFLOW__V1__COLUMN__VALUES_INT64S,
        .values_name = "int64s",
        INT64_FUNCTIONS,
    },
    {
        .type = KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64,
        .name = "FLOAT64",
        .json_form = "a number, a decimal string, \"NaN\", \"Infinity\" or \"-Infinity\"",
        .value_bytes = 8,
        .values_case = KEYFLOW__V1__COLUMN__VALUES_FLOAT64S,
        .values_name = "float64s",
        .from_json = float64_from_json,
        .to_json = float64_to_json,
        .values_new = float64_values_new,
        .values_count = float64_values_count,
        .values_get = float64_values_get,
        .values_set = float64_values_set,
        .valid = always_valid,
    },
    {
        .type = KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8,
        .name = "UTF8",
        .json_form = "a string",
        .value_bytes = 0,
        .values_case = KEYFLOW__V1__COLUMN__VALUES_STRINGS,
        .values_name = "strings",
        .from_json = utf8_from_json,
        .to_json = utf8_to_json,
        .values_new = utf8_values_new,
        .values_count = utf8_values_count,
        .values_get = utf8_values_get,
        .values_set = utf8_values_set,
        .valid = utf8_valid,
    },
    {
        .type = KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BYTES,
        .name = "BYTES",
        .json_form = "a base64 string",
        .value_bytes = 0,
        .values_case = KEYFLOW__V1__COLUMN__VALUES_BYTES_VALUES,
        .values_name = "bytes_values",
        .from_json = bytes_from_json,
        .to_json = bytes_to_json,
        .values_new = bytes_values_new,
        .values_count = bytes_values_count,
        .values_get = bytes_values_get,
        .values_set = bytes_values_set,
        .valid = always_valid,
    },
    {
        .type = KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US,
        .name = "TIMESTAMP_US",
        .json_form = "an integer of microseconds or a decimal string",
        .value_bytes = 8,
        .values_case = KEYFLOW__V1__COLUMN__VALUES_INT64S,
        .values_name = "int64s",
        INT64_FUNCTIONS,
    },
};

#define COLUMN_TYPES_COUNT (sizeof column_types / sizeof column_types[0])

_Static_assert(COLUMN_TYPES_COUNT == KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US,
               "one row per FieldType after UNSPECIFIED, in order (invariant 1)");

const kf_column_type_t *kf_column_type(Keyflow__V1__FieldType type) {
    if ((int)type < 1 || (size_t)type > COLUMN_TYPES_COUNT) {
        return NULL;
    }
    const kf_column_type_t *ct = &column_types[type - 1];
    KF_ASSERT(ct->type == type);
    return ct;
}

size_t kf_column_types_count(void) {
    return COLUMN_TYPES_COUNT;
}

const kf_column_type_t *kf_column_type_at(size_t i) {
    KF_ASSERT(i < COLUMN_TYPES_COUNT);
    return &column_types[i];
}

/* ---- JSON rows into columnar batches ---------------------------------------- */

Keyflow__V1__RowBatch *kf_row_batch_new(const Keyflow__V1__Schema *schema, size_t rows,
                                        kf_arena_t *arena) {
    size_t cap = rows > 0 ? rows : 1;
    Keyflow__V1__RowBatch *batch = kf_arena_zalloc(arena, sizeof *batch);
    Keyflow__V1__Column **columns =
        kf_arena_zalloc(arena, (schema->n_fields > 0 ? schema->n_fields : 1) * sizeof *columns);
    if (batch == NULL || columns == NULL) {
        return NULL;
    }
    keyflow__v1__row_batch__init(batch);
    batch->row_count = (int64_t)rows;
    batch->n_columns = schema->n_fields;
    batch->columns = columns;
    for (size_t c = 0; c < schema->n_fields; c++) {
        const Keyflow__V1__Field *field = schema->fields[c];
        const kf_column_type_t *ct = kf_column_type(field->type);
        KF_ASSERT(ct != NULL);
        Keyflow__V1__Column *col = kf_arena_zalloc(arena, sizeof *col);
        protobuf_c_boolean *nulls = kf_arena_zalloc(arena, cap * sizeof *nulls);
        if (col == NULL || nulls == NULL) {
            return NULL;
        }
        keyflow__v1__column__init(col);
        col->name = field->name;
        col->nulls = nulls; /* n_nulls stays 0 until a null is stored */
        if (!ct->values_new(col, rows, arena)) {
            return NULL;
        }
        columns[c] = col;
    }
    return batch;
}

static bool schema_has(const Keyflow__V1__Schema *schema, const char *name) {
    for (size_t c = 0; c < schema->n_fields; c++) {
        if (strcmp(schema->fields[c]->name, name) == 0) {
            return true;
        }
    }
    return false;
}

void kf_row_from_json(const Keyflow__V1__Schema *schema, const json_t *obj,
                      Keyflow__V1__RowBatch *batch, size_t row, kf_arena_t *arena,
                      kf_row_result_t *result) {
    KF_ASSERT(json_is_object(obj) && (int64_t)row < batch->row_count);
    memset(result, 0, sizeof *result);
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)obj, name, v) {
        if (!schema_has(schema, name)) {
            result->problem = KF_ROW_UNKNOWN_FIELD;
            result->field = name;
            return;
        }
    }
    for (size_t c = 0; c < schema->n_fields; c++) {
        const Keyflow__V1__Field *field = schema->fields[c];
        const kf_column_type_t *ct = kf_column_type(field->type);
        Keyflow__V1__Column *col = batch->columns[c];
        result->field = field->name;
        result->type = ct;
        v = json_object_get(obj, field->name);
        if (v == NULL || json_is_null(v)) {
            if (!field->nullable) {
                result->problem = KF_ROW_REQUIRED;
                return;
            }
            col->nulls[row] = 1;
            col->n_nulls = (size_t)batch->row_count;
            continue;
        }
        kf_cell_t cell = {0};
        switch (ct->from_json(v, arena, &cell)) {
        case KF_CELL_DECODED: break;
        case KF_CELL_WRONG_FORM:
            result->problem = KF_ROW_WRONG_FORM;
            result->value = v;
            return;
        case KF_CELL_NO_MEMORY: result->problem = KF_ROW_NO_MEMORY; return;
        }
        ct->values_set(col, row, &cell);
        result->value_bytes += ct->value_bytes > 0 ? ct->value_bytes : cell.len;
    }
    result->problem = KF_ROW_CONVERTED;
    result->field = NULL;
    result->type = NULL;
}
