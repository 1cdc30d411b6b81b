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
 *   5. Values convert by the column type table (proto/columns.h), as the
 *      server converts rows_json, so both accept the same JSON forms.
 *   6. The CLI converts types and nothing else: the server still checks
 *      every limit, nullability of key columns included, in one place. The
 *      one check repeated here is nullability, because the server's
 *      message names a row of one batch and this one names the input line.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/assert.h"
#include "base/limits.h"
#include "proto/columns.h"

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

/* ---- rows --------------------------------------------------------------- */

static kf_status_t out_of_arena(size_t number, kf_error_t *err) {
    return kf_error_set(err, KF_E_TOO_LARGE,
                        "line %zu: the input does not fit the CLI's %lld-byte conversion arena",
                        number, (long long)KF_ARENA_BYTES_MAX);
}

/* Converts one row object into row `row` of `batch`, by the column type
 * table (proto/columns.h) the server converts rows_json with. */
static kf_status_t convert_row(const Keyflow__V1__Schema *schema, const json_t *obj, size_t number,
                               Keyflow__V1__RowBatch *batch, size_t row, kf_arena_t *arena,
                               kf_error_t *err) {
    kf_row_result_t res;
    kf_row_from_json(schema, obj, batch, row, arena, &res);
    switch (res.problem) {
    case KF_ROW_CONVERTED: return KF_OK;
    case KF_ROW_UNKNOWN_FIELD:
        return kf_error_set(err, KF_E_INVALID,
                            "line %zu: %s: not a field of the function's input schema", number,
                            res.field);
    case KF_ROW_REQUIRED:
        return kf_error_set(err, KF_E_INVALID,
                            "line %zu: %s: required (the input schema says it is not nullable)",
                            number, res.field);
    case KF_ROW_WRONG_FORM: {
        char got[EXCERPT_BYTES + 8];
        excerpt(res.value, got, sizeof got);
        return kf_error_set(err, KF_E_INVALID, "line %zu: %s: expected %s (%s), got %s", number,
                            res.field, res.type->name, res.type->json_form, got);
    }
    case KF_ROW_NO_MEMORY: return out_of_arena(number, err);
    }
    KF_UNREACHABLE();
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
            out[b].columnar = kf_row_batch_new(schema, in_batch, arena);
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
                return out_of_arena(reader.number, err);
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
