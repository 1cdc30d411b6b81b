/*
 * cli_rows.c - the input of `keyflow functions push`: JSON lines (one
 * object per line, one row per object) turned into PushBatch payloads,
 * either columnar RowBatches converted by the function's input schema, or
 * rows_json arrays of the lines as written, for the server to convert.
 *
 *   kf__cli_rows_batches: count_rows (pass 1: line boundaries only)
 *        --> size every batch's arrays --> convert_line per row (pass 2:
 *        parse, check, store at its batch and index)
 *
 * Invariants
 *   1. Every line is parsed and checked before any batch exists, so bad
 *      input stops the push before anything is sent: a push either sends
 *      rows that all converted or sends nothing.
 *   2. Errors name the 1-based input line, and the field when a value is
 *      at fault, so a user can find it in a file of millions of lines.
 *   3. Rows keep their input order: batch b holds rows [b * rows_max,
 *      (b + 1) * rows_max). Blank lines are skipped but still counted as
 *      lines.
 *   4. Memory: everything is in the caller's arena, sized from the row
 *      counts of pass 1 (no per-row bookkeeping, no growth); the jansson
 *      value of one line lives only while that line is converted.
 *   5. The CLI converts types and nothing else: the server still checks
 *      every limit, nullability of key columns included, in one place. The
 *      one check repeated here is nullability, because the server's
 *      message names a row of one batch and this one names the input line.
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/assert.h"
#include "base/base64.h"
#include "base/limits.h"

#define T_BOOL    KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BOOL
#define T_INT64   KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64
#define T_FLOAT64 KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64
#define T_UTF8    KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8
#define T_BYTES   KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BYTES
#define T_TS      KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US

/* The most of an offending value quoted in a message. */
#define EXCERPT_BYTES 48

/* ---- lines -------------------------------------------------------------- */

typedef struct line_reader {
    const char *text;
    size_t len;
    size_t pos;    /* start of the next line */
    size_t number; /* 1-based number of the line last returned */
} line_reader_t;

/* The next non-blank line (without its "\n" or "\r\n"); false at the end. */
static bool next_line(line_reader_t *r, const char **line, size_t *line_len) {
    while (r->pos < r->len) {
        const char *start = r->text + r->pos;
        const char *nl = memchr(start, '\n', r->len - r->pos);
        size_t n = nl != NULL ? (size_t)(nl - start) : r->len - r->pos;
        r->pos += n + (nl != NULL ? 1 : 0);
        r->number++;
        if (n > 0 && start[n - 1] == '\r') {
            n--;
        }
        bool blank = true;
        for (size_t i = 0; i < n && blank; i++) {
            blank = start[i] == ' ' || start[i] == '\t' || start[i] == '\r';
        }
        if (!blank) {
            *line = start;
            *line_len = n;
            return true;
        }
    }
    return false;
}

static size_t count_rows(const char *text, size_t len) {
    line_reader_t r = {text, len, 0, 0};
    const char *line;
    size_t line_len;
    size_t rows = 0;
    while (next_line(&r, &line, &line_len)) {
        rows++;
    }
    return rows;
}

/* Parses one line; it must be a JSON object. Keys may not repeat: the
 * second of two values for one field is more likely a mistake than an
 * update. */
static kf_status_t parse_line(const char *line, size_t len, size_t number, json_t **out,
                              kf_error_t *err) {
    json_error_t jerr;
    json_t *v = json_loadb(line, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    if (v == NULL) {
        return kf_error_set(err, KF_E_INVALID, "line %zu: not valid JSON: %s (at column %d)",
                            number, jerr.text, jerr.column);
    }
    if (!json_is_object(v)) {
        const char *what = json_is_array(v)    ? "an array"
                           : json_is_string(v) ? "a string"
                           : json_is_number(v) ? "a number"
                           : json_is_null(v)   ? "null"
                                               : "a boolean";
        json_decref(v);
        return kf_error_set(err, KF_E_INVALID,
                            "line %zu: expected a JSON object (one row per line), got %s", number,
                            what);
    }
    *out = v;
    return KF_OK;
}

/* ---- values ------------------------------------------------------------- */

static const char *type_word(Keyflow__V1__FieldType type) {
    switch (type) {
    case T_BOOL: return "BOOL (true or false)";
    case T_INT64: return "INT64 (an integer or a decimal string)";
    case T_FLOAT64: return "FLOAT64 (a number, \"NaN\", \"Infinity\" or \"-Infinity\")";
    case T_UTF8: return "UTF8 (a string)";
    case T_BYTES: return "BYTES (a base64 string)";
    case T_TS: return "TIMESTAMP_US (an integer of microseconds or a decimal string)";
    default: return "a type this CLI does not know";
    }
}

/* The value as compact JSON, cut at EXCERPT_BYTES, for messages. */
static void excerpt(const json_t *v, char *buf, size_t cap) {
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (text == NULL) {
        snprintf(buf, cap, "(a value)");
        return;
    }
    if (strlen(text) > EXCERPT_BYTES) {
        snprintf(buf, cap, "%.*s...", EXCERPT_BYTES, text);
    } else {
        snprintf(buf, cap, "%s", text);
    }
    free(text);
}

/* An integer from a JSON integer or a whole base-10 string (the proto3
 * JSON form of int64): an optional '-' and digits, nothing else. */
static bool json_int64(const json_t *v, int64_t *out) {
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return true;
    }
    if (!json_is_string(v)) {
        return false;
    }
    const char *s = json_string_value(v);
    const char *digits = s[0] == '-' ? s + 1 : s;
    if (digits[0] < '0' || digits[0] > '9') {
        return false;
    }
    errno = 0;
    char *end = NULL;
    long long x = strtoll(s, &end, 10);
    if (errno == ERANGE || *end != '\0') {
        return false;
    }
    *out = (int64_t)x;
    return true;
}

static bool json_float64(const json_t *v, double *out) {
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return true;
    }
    if (!json_is_string(v)) {
        return false;
    }
    const char *s = json_string_value(v);
    if (strcmp(s, "NaN") == 0) {
        *out = NAN;
    } else if (strcmp(s, "Infinity") == 0) {
        *out = INFINITY;
    } else if (strcmp(s, "-Infinity") == 0) {
        *out = -INFINITY;
    } else {
        return false;
    }
    return true;
}

/* ---- columns ------------------------------------------------------------ */

/* Placeholder of a null UTF8 cell: protobuf-c packs strings with strlen. */
static char empty_text[] = "";

/* A column of `rows` values for `field`, every cell null-free and zero. */
static Keyflow__V1__Column *new_column(const Keyflow__V1__Field *field, size_t rows,
                                       kf_arena_t *arena) {
    size_t cap = rows > 0 ? rows : 1;
    Keyflow__V1__Column *col = kf_arena_zalloc(arena, sizeof *col);
    protobuf_c_boolean *nulls = kf_arena_zalloc(arena, cap * sizeof *nulls);
    if (col == NULL || nulls == NULL) {
        return NULL;
    }
    keyflow__v1__column__init(col);
    col->name = field->name;
    col->nulls = nulls; /* n_nulls stays 0 until a null is stored */
    void *values = NULL;
    switch (field->type) {
    case T_BOOL: {
        Keyflow__V1__BoolValues *b = kf_arena_zalloc(arena, sizeof *b);
        values = b;
        if (b != NULL) {
            keyflow__v1__bool_values__init(b);
            b->n_values = rows;
            b->values = kf_arena_zalloc(arena, cap * sizeof *b->values);
            values = b->values != NULL ? b : NULL;
        }
        col->values_case = KEYFLOW__V1__COLUMN__VALUES_BOOLS;
        col->bools = b;
        break;
    }
    case T_INT64:
    case T_TS: {
        Keyflow__V1__Int64Values *i = kf_arena_zalloc(arena, sizeof *i);
        values = i;
        if (i != NULL) {
            keyflow__v1__int64_values__init(i);
            i->n_values = rows;
            i->values = kf_arena_zalloc(arena, cap * sizeof *i->values);
            values = i->values != NULL ? i : NULL;
        }
        col->values_case = KEYFLOW__V1__COLUMN__VALUES_INT64S;
        col->int64s = i;
        break;
    }
    case T_FLOAT64: {
        Keyflow__V1__Float64Values *f = kf_arena_zalloc(arena, sizeof *f);
        values = f;
        if (f != NULL) {
            keyflow__v1__float64_values__init(f);
            f->n_values = rows;
            f->values = kf_arena_zalloc(arena, cap * sizeof *f->values);
            values = f->values != NULL ? f : NULL;
        }
        col->values_case = KEYFLOW__V1__COLUMN__VALUES_FLOAT64S;
        col->float64s = f;
        break;
    }
    case T_UTF8: {
        Keyflow__V1__StringValues *t = kf_arena_zalloc(arena, sizeof *t);
        values = t;
        if (t != NULL) {
            keyflow__v1__string_values__init(t);
            t->n_values = rows;
            t->values = kf_arena_zalloc(arena, cap * sizeof *t->values);
            values = t->values != NULL ? t : NULL;
            for (size_t r = 0; values != NULL && r < rows; r++) {
                t->values[r] = empty_text;
            }
        }
        col->values_case = KEYFLOW__V1__COLUMN__VALUES_STRINGS;
        col->strings = t;
        break;
    }
    case T_BYTES: {
        Keyflow__V1__BytesValues *y = kf_arena_zalloc(arena, sizeof *y);
        values = y;
        if (y != NULL) {
            keyflow__v1__bytes_values__init(y);
            y->n_values = rows;
            y->values = kf_arena_zalloc(arena, cap * sizeof *y->values);
            values = y->values != NULL ? y : NULL;
        }
        col->values_case = KEYFLOW__V1__COLUMN__VALUES_BYTES_VALUES;
        col->bytes_values = y;
        break;
    }
    default:
        /* The server canonicalized the schema: every field has a type. */
        KF_UNREACHABLE();
    }
    return values != NULL ? col : NULL;
}

static Keyflow__V1__RowBatch *new_row_batch(const Keyflow__V1__Schema *schema, size_t rows,
                                            kf_arena_t *arena) {
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
        columns[c] = new_column(schema->fields[c], rows, arena);
        if (columns[c] == NULL) {
            return NULL;
        }
    }
    return batch;
}

static int find_field(const Keyflow__V1__Schema *schema, const char *name) {
    for (size_t c = 0; c < schema->n_fields; c++) {
        if (strcmp(schema->fields[c]->name, name) == 0) {
            return (int)c;
        }
    }
    return -1;
}

/* Stores value `v` (not null) of `field` at `row` of `col`. */
static kf_status_t store_value(const Keyflow__V1__Field *field, Keyflow__V1__Column *col,
                               size_t row, const json_t *v, size_t number, kf_arena_t *arena,
                               kf_error_t *err) {
    bool ok = false;
    switch (field->type) {
    case T_BOOL:
        ok = json_is_boolean(v);
        col->bools->values[row] = json_is_true(v);
        break;
    case T_INT64:
    case T_TS: ok = json_int64(v, &col->int64s->values[row]); break;
    case T_FLOAT64: ok = json_float64(v, &col->float64s->values[row]); break;
    case T_UTF8:
        ok = json_is_string(v);
        if (ok) {
            /* jansson has checked the UTF-8 and refuses "\u0000", so the
             * text is a valid C string. */
            char *copy = kf_arena_strndup(arena, json_string_value(v), json_string_length(v));
            if (copy == NULL) {
                return kf_error_set(err, KF_E_TOO_LARGE,
                                    "line %zu: the input does not fit the CLI's %lld-byte "
                                    "conversion arena",
                                    number, (long long)KF_ARENA_BYTES_MAX);
            }
            col->strings->values[row] = copy;
        }
        break;
    case T_BYTES:
        ok = json_is_string(v);
        if (ok) {
            size_t text_len = json_string_length(v);
            uint8_t *bytes = kf_arena_alloc(arena, text_len * 3 / 4 + 3);
            size_t bytes_len = 0;
            if (bytes == NULL) {
                return kf_error_set(err, KF_E_TOO_LARGE,
                                    "line %zu: the input does not fit the CLI's %lld-byte "
                                    "conversion arena",
                                    number, (long long)KF_ARENA_BYTES_MAX);
            }
            ok = kf_base64_decode(json_string_value(v), text_len, bytes, &bytes_len);
            col->bytes_values->values[row].data = bytes;
            col->bytes_values->values[row].len = bytes_len;
        }
        break;
    default: KF_UNREACHABLE();
    }
    if (!ok) {
        char got[EXCERPT_BYTES + 8];
        excerpt(v, got, sizeof got);
        return kf_error_set(err, KF_E_INVALID, "line %zu: %s: expected %s, got %s", number,
                            field->name, type_word(field->type), got);
    }
    return KF_OK;
}

/* Converts one row object into row `row` of `batch`. */
static kf_status_t convert_row(const Keyflow__V1__Schema *schema, json_t *obj, size_t number,
                               Keyflow__V1__RowBatch *batch, size_t row, kf_arena_t *arena,
                               kf_error_t *err) {
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v) {
        if (find_field(schema, name) < 0) {
            return kf_error_set(err, KF_E_INVALID,
                                "line %zu: %s: not a field of the function's input schema", number,
                                name);
        }
    }
    for (size_t c = 0; c < schema->n_fields; c++) {
        const Keyflow__V1__Field *field = schema->fields[c];
        Keyflow__V1__Column *col = batch->columns[c];
        v = json_object_get(obj, field->name);
        if (v == NULL || json_is_null(v)) {
            if (!field->nullable) {
                return kf_error_set(err, KF_E_INVALID,
                                    "line %zu: %s: required (the input schema says it is not "
                                    "nullable)",
                                    number, field->name);
            }
            col->nulls[row] = 1;
            col->n_nulls = (size_t)batch->row_count;
            continue;
        }
        kf_status_t st = store_value(field, col, row, v, number, arena, err);
        if (st != KF_OK) {
            return st;
        }
    }
    return KF_OK;
}

/* ---- batches ------------------------------------------------------------ */

kf_status_t kf__cli_rows_batches(const char *text, size_t len, const Keyflow__V1__Schema *schema,
                                 size_t rows_max, kf_arena_t *arena, kf__cli_batch_t **batches,
                                 size_t *count, kf_error_t *err) {
    KF_ASSERT(text != NULL && text[len] == '\0' && rows_max > 0);
    size_t rows = count_rows(text, len);
    size_t n = rows == 0 ? 1 : (rows - 1) / rows_max + 1;
    kf__cli_batch_t *out = kf_arena_zalloc(arena, n * sizeof *out);
    if (out == NULL) {
        return kf_error_set(err, KF_E_TOO_LARGE,
                            "input: %zu rows in %zu batches do not fit the "
                            "CLI's %lld-byte conversion arena",
                            rows, n, (long long)KF_ARENA_BYTES_MAX);
    }
    /* Sizes first, so that every array is allocated once. */
    for (size_t b = 0; b < n; b++) {
        size_t in_batch = rows - b * rows_max < rows_max ? rows - b * rows_max : rows_max;
        out[b].row_count = in_batch;
        if (schema != NULL) {
            out[b].columnar = new_row_batch(schema, in_batch, arena);
            if (out[b].columnar == NULL) {
                return kf_error_set(err, KF_E_TOO_LARGE,
                                    "input: %zu rows do not fit the CLI's %lld-byte conversion "
                                    "arena; push fewer at a time",
                                    rows, (long long)KF_ARENA_BYTES_MAX);
            }
        }
    }
    /* rows_json: each batch is "[" line "," line ... "]", so all of them
     * together are about the size of the input. */
    line_reader_t reader = {text, len, 0, 0};
    size_t json_used = 0;
    char *json = NULL;
    for (size_t row = 0; row < rows; row++) {
        const char *line = NULL;
        size_t line_len = 0;
        bool more = next_line(&reader, &line, &line_len);
        KF_ASSERT(more);
        size_t b = row / rows_max;
        size_t at = row % rows_max;
        kf__cli_batch_t *batch = &out[b];
        if (at == 0) {
            batch->first_line = reader.number;
        }
        batch->last_line = reader.number;
        json_t *obj = NULL;
        kf_status_t st = parse_line(line, line_len, reader.number, &obj, err);
        if (st != KF_OK) {
            return st;
        }
        if (schema != NULL) {
            st = convert_row(schema, obj, reader.number, batch->columnar, at, arena, err);
            json_decref(obj);
            if (st != KF_OK) {
                return st;
            }
            continue;
        }
        json_decref(obj);
        if (at == 0) {
            /* Sized exactly by a look-ahead over this batch's lines: the
             * lines, a comma between two, the brackets and a NUL. */
            line_reader_t ahead = reader;
            size_t bytes = line_len;
            for (size_t k = 1; k < batch->row_count; k++) {
                const char *next = NULL;
                size_t next_len = 0;
                more = next_line(&ahead, &next, &next_len);
                KF_ASSERT(more);
                bytes += next_len;
            }
            json = kf_arena_alloc(arena, bytes + batch->row_count + 2);
            if (json == NULL) {
                return kf_error_set(err, KF_E_TOO_LARGE,
                                    "line %zu: the input does not fit the CLI's %lld-byte "
                                    "conversion arena",
                                    reader.number, (long long)KF_ARENA_BYTES_MAX);
            }
            batch->rows_json = json;
            json[0] = '[';
            json_used = 1;
        } else {
            json[json_used++] = ',';
        }
        memcpy(json + json_used, line, line_len);
        json_used += line_len;
        if (at + 1 == batch->row_count) {
            json[json_used++] = ']';
            json[json_used] = '\0';
        }
    }
    if (schema == NULL && rows == 0) {
        out[0].rows_json = kf_arena_strdup(arena, "[]");
        if (out[0].rows_json == NULL) {
            return kf_error_set(err, KF_E_TOO_LARGE, "input: out of conversion arena");
        }
    }
    *batches = out;
    *count = n;
    return KF_OK;
}
