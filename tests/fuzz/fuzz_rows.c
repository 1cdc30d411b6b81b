/*
 * fuzz_rows.c - libFuzzer harness: the row batch decoders of process
 * functions (service/functions/rows.c over service/proto/columns.h), the
 * bytes a PushBatch carries.
 *
 * Input: byte 0 = format (bit 0: 0 a protobuf keyflow.v1.RowBatch, 1 JSON
 * rows) and field count - 1 (bits 1..3); then one byte per field (type
 * 1 + (b & 0x7f) % 6, nullable when bit 7 is set); the rest is the payload.
 *
 * Decoding must never crash. What decodes must hold the schema's shape
 * (a null only in a nullable column, UTF-8 without NUL bytes where UTF8 is
 * declared) and must survive both round trips the engine makes with rows:
 * through the output builder to a columnar batch, its wire form and back,
 * and to JSON rows and back, with every cell equal.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "functions/rows.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ROWS  4096
#define MAX_BYTES (1024 * 1024)

static const char *const names[8] = {"c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7"};

static void fail(const char *what, uint32_t row, uint32_t col) {
    fprintf(stderr, "ROWS: %s (row %u, column %u)\n", what, row, col);
    abort();
}

static bool cells_equal(const kf_column_type_t *ct, const kf_cell_t *a, const kf_cell_t *b) {
    switch (ct->type) {
    case KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64:
        if (isnan(a->v.f) || isnan(b->v.f)) {
            return isnan(a->v.f) && isnan(b->v.f);
        }
        return a->v.f == b->v.f && signbit(a->v.f) == signbit(b->v.f);
    case KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8:
    case KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BYTES:
        return a->len == b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
    default: return a->v.i == b->v.i;
    }
}

/* The decoded rows keep the schema's promises. */
static void check_shape(const kf_rows_t *rows, const Keyflow__V1__Schema *schema) {
    if (rows->ncols != schema->n_fields) {
        fail("column count differs from the schema", 0, 0);
    }
    for (uint32_t r = 0; r < rows->count; r++) {
        for (uint32_t c = 0; c < rows->ncols; c++) {
            if (kf_rows_is_null(rows, r, c)) {
                if (!schema->fields[c]->nullable) {
                    fail("a null in a column that is not nullable", r, c);
                }
                continue;
            }
            kf_cell_t cell = {0};
            kf_rows_value(rows, r, c, &cell);
            const kf_column_type_t *ct = kf_column_type(schema->fields[c]->type);
            if (!ct->valid(&cell)) {
                fail("a decoded value is not valid for its type", r, c);
            }
            if (ct->type == KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8 &&
                (cell.p == NULL || strlen(cell.p) != cell.len)) {
                fail("a UTF8 value's length differs from its text", r, c);
            }
        }
    }
}

static void check_same(const kf_rows_t *a, const kf_rows_t *b, const Keyflow__V1__Schema *schema,
                       const char *how) {
    if (a->count != b->count || a->ncols != b->ncols) {
        fprintf(stderr, "ROWS: %s: %u x %u rows became %u x %u\n", how, a->count, a->ncols,
                b->count, b->ncols);
        abort();
    }
    for (uint32_t r = 0; r < a->count; r++) {
        for (uint32_t c = 0; c < a->ncols; c++) {
            bool an = kf_rows_is_null(a, r, c), bn = kf_rows_is_null(b, r, c);
            if (an != bn) {
                fprintf(stderr, "ROWS: %s: ", how);
                fail("a null changed", r, c);
            }
            if (an) {
                continue;
            }
            kf_cell_t x = {0}, y = {0};
            kf_rows_value(a, r, c, &x);
            kf_rows_value(b, r, c, &y);
            if (!cells_equal(kf_column_type(schema->fields[c]->type), &x, &y)) {
                fprintf(stderr, "ROWS: %s: ", how);
                fail("a value changed", r, c);
            }
        }
    }
}

static void round_trips(const kf_rows_t *rows, const Keyflow__V1__Schema *schema,
                        kf_arena_t *arena) {
    kf_error_t err;
    kf_outbuf_t out;
    kf_outbuf_init(&out, schema, arena);
    if (kf_outbuf_append_rows(&out, rows, 0, rows->count, &err) != KF_OK) {
        return; /* the arena's bound: not a finding */
    }
    /* Columnar: builder -> RowBatch -> wire -> RowBatch -> rows. */
    Keyflow__V1__RowBatch *batch = kf_outbuf_to_batch(&out, 0, out.rows, arena);
    if (batch == NULL) {
        return;
    }
    size_t len = protobuf_c_message_get_packed_size(&batch->base);
    uint8_t *wire = kf_arena_alloc(arena, len ? len : 1);
    if (wire == NULL) {
        return;
    }
    protobuf_c_message_pack(&batch->base, wire);
    Keyflow__V1__RowBatch *back = keyflow__v1__row_batch__unpack(kf_arena_pb(arena), len, wire);
    if (back == NULL) {
        fail("a batch the builder wrote does not unpack", 0, 0);
    }
    kf_rows_t again;
    if (kf_rows_from_batch(back, schema, MAX_ROWS, INT64_MAX, arena, &again, &err) != KF_OK) {
        fprintf(stderr, "ROWS: columnar round trip refused: %s\n", err.message);
        abort();
    }
    check_same(rows, &again, schema, "columnar round trip");
    /* JSON: builder -> JSON rows -> rows. */
    size_t json_len = 0;
    char *json = kf_outbuf_to_json(&out, 0, out.rows, 0, arena, &json_len);
    if (json == NULL) {
        return;
    }
    kf_rows_t from_json;
    if (kf_rows_from_json(json, json_len, schema, MAX_ROWS, INT64_MAX / 8, arena, &from_json,
                          &err) != KF_OK) {
        fprintf(stderr, "ROWS: JSON round trip refused: %s\n%s\n", err.message, json);
        abort();
    }
    check_same(rows, &from_json, schema, "JSON round trip");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) {
        return 0;
    }
    bool json = data[0] & 1;
    size_t nfields = 1 + ((data[0] >> 1) & 7);
    if (size < 1 + nfields) {
        return 0;
    }
    kf_arena_t arena;
    kf_arena_init(&arena, 64 * 1024 * 1024);
    Keyflow__V1__Schema schema = KEYFLOW__V1__SCHEMA__INIT;
    Keyflow__V1__Field fields[8];
    Keyflow__V1__Field *field_ptrs[8];
    for (size_t i = 0; i < nfields; i++) {
        keyflow__v1__field__init(&fields[i]);
        fields[i].name = (char *)names[i];
        fields[i].type = (Keyflow__V1__FieldType)(1 + (data[1 + i] & 0x7f) % 6);
        fields[i].nullable = (data[1 + i] & 0x80) != 0;
        field_ptrs[i] = &fields[i];
    }
    schema.n_fields = nfields;
    schema.fields = field_ptrs;
    const uint8_t *payload = data + 1 + nfields;
    size_t len = size - 1 - nfields;
    /* An exact-size heap copy, so ASan sees any read past the end. */
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, payload, len);
    kf_rows_t rows;
    kf_error_t err;
    kf_status_t st;
    if (json) {
        st = kf_rows_from_json((const char *)copy, len, &schema, MAX_ROWS, MAX_BYTES, &arena, &rows,
                               &err);
    } else {
        Keyflow__V1__RowBatch *batch =
            keyflow__v1__row_batch__unpack(kf_arena_pb(&arena), len, copy);
        st = batch == NULL
                 ? KF_E_INVALID
                 : kf_rows_from_batch(batch, &schema, MAX_ROWS, MAX_BYTES, &arena, &rows, &err);
        if (batch == NULL) {
            err.message[0] = 'x';
        }
    }
    if (getenv("DEBUG_ROWS")) {
        fprintf(stderr, "rows: %s %s (%u rows)\n", kf_status_name(st),
                st == KF_OK ? "" : err.message, st == KF_OK ? rows.count : 0);
    }
    if (st == KF_OK) {
        check_shape(&rows, &schema);
        round_trips(&rows, &schema, &arena);
    } else if ((st != KF_E_INVALID && st != KF_E_TOO_LARGE) || err.message[0] == '\0') {
        fprintf(stderr, "ROWS: refused with %s and message \"%s\"\n", kf_status_name(st),
                err.message);
        abort();
    }
    free(copy);
    kf_arena_deinit(&arena);
    return 0;
}
