/*
 * test_rows.c - row batches of process functions (service/functions/rows.h):
 * JSON rows and columnar batches read the same, output rows written as JSON
 * read back as the same rows, and refusals name the row and the column.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "functions/rows.h"

#define FIELD(name_, type_, nullable_)                                                             \
    {                                                                                              \
        PROTOBUF_C_MESSAGE_INIT(&keyflow__v1__field__descriptor), name_,                           \
            KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_##type_, nullable_                                 \
    }

static Keyflow__V1__Field fields[] = {
    FIELD("user", UTF8, false),    FIELD("ts", TIMESTAMP_US, false), FIELD("n", INT64, true),
    FIELD("ratio", FLOAT64, true), FIELD("blob", BYTES, true),       FIELD("flag", BOOL, true),
};
static Keyflow__V1__Field *field_list[] = {&fields[0], &fields[1], &fields[2],
                                           &fields[3], &fields[4], &fields[5]};
static Keyflow__V1__Schema schema = {PROTOBUF_C_MESSAGE_INIT(&keyflow__v1__schema__descriptor), 6,
                                     field_list};

static const char rows_json[] =
    "[{\"user\":\"h\\u00e9\",\"ts\":1,\"n\":\"-7\",\"ratio\":\"NaN\",\"blob\":\"AAEC/w==\","
    "\"flag\":true},"
    "{\"user\":\"b\",\"ts\":\"2\",\"n\":null,\"ratio\":0.5,\"blob\":\"\",\"flag\":false},"
    "{\"user\":\"c\",\"ts\":3,\"ratio\":\"-Infinity\"}]";

static kf_arena_t arena;
static kf_error_t err;

static void setup(void) {
    kf_arena_init(&arena, 0);
    kf_error_clear(&err);
}
static void teardown(void) {
    kf_arena_deinit(&arena);
}

static kf_rows_t from_json(const char *json) {
    kf_rows_t rows;
    kf_status_t st =
        kf_rows_from_json(json, strlen(json), &schema, 100, 1 << 20, &arena, &rows, &err);
    cr_assert_eq(st, KF_OK, "%s", err.message);
    return rows;
}

static kf_status_t refuse_json(const char *json) {
    kf_rows_t rows;
    kf_error_clear(&err);
    return kf_rows_from_json(json, strlen(json), &schema, 100, 1 << 20, &arena, &rows, &err);
}

static void assert_same_rows(const kf_rows_t *a, const kf_rows_t *b) {
    cr_assert_eq(a->count, b->count);
    cr_assert_eq(a->ncols, b->ncols);
    for (uint32_t r = 0; r < a->count; r++) {
        for (uint32_t c = 0; c < a->ncols; c++) {
            cr_assert_eq(kf_rows_is_null(a, r, c), kf_rows_is_null(b, r, c), "row %u col %u", r, c);
            if (kf_rows_is_null(a, r, c)) {
                continue;
            }
            kf_cell_t x = {0}, y = {0};
            kf_rows_value(a, r, c, &x);
            kf_rows_value(b, r, c, &y);
            if (a->cols[c].type->type == KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64) {
                cr_assert(x.v.f == y.v.f || (isnan(x.v.f) && isnan(y.v.f)), "row %u col %u", r, c);
            } else {
                cr_assert_eq(x.v.i, y.v.i, "row %u col %u", r, c);
                cr_assert_eq(x.len, y.len, "row %u col %u", r, c);
                cr_assert(x.len == 0 || memcmp(x.p, y.p, x.len) == 0, "row %u col %u", r, c);
            }
        }
    }
}

TestSuite(rows, .init = setup, .fini = teardown);

Test(rows, json_rows_read_their_values) {
    kf_rows_t rows = from_json(rows_json);
    cr_assert_eq(rows.count, 3);
    kf_cell_t v = {0};
    kf_rows_value(&rows, 0, 0, &v);
    cr_assert_eq(v.len, 3);
    cr_assert_str_eq(v.p, "h\xc3\xa9");
    kf_rows_value(&rows, 1, 1, &v);
    cr_assert_eq(v.v.i, 2);
    kf_rows_value(&rows, 0, 2, &v);
    cr_assert_eq(v.v.i, -7);
    cr_assert(kf_rows_is_null(&rows, 1, 2) && kf_rows_is_null(&rows, 2, 2));
    kf_rows_value(&rows, 0, 3, &v);
    cr_assert(isnan(v.v.f));
    kf_rows_value(&rows, 2, 3, &v);
    cr_assert(isinf(v.v.f) && v.v.f < 0);
    kf_rows_value(&rows, 0, 4, &v);
    cr_assert_eq(v.len, 4);
    cr_assert_eq((uint8_t)v.p[3], 0xff);
    kf_rows_value(&rows, 0, 5, &v);
    cr_assert_eq(v.v.i, 1);
    /* Bytes of the values given: 3 + 8 + 8 + 8 + 4 + 1, 1 + 8 + 8 + 0 + 1, 1 + 8 + 8. */
    cr_assert_eq(rows.bytes, 32 + 18 + 17);
}

/* Output rows rendered as JSON and read back as input are the same rows;
 * so are the same rows as a columnar batch. */
Test(rows, json_and_columnar_forms_round_trip) {
    kf_rows_t rows = from_json(rows_json);
    kf_outbuf_t out;
    kf_outbuf_init(&out, &schema, &arena);
    cr_assert_eq(kf_outbuf_append_rows(&out, &rows, 0, rows.count, &err), KF_OK);
    size_t len = 0;
    char *json = kf_outbuf_to_json(&out, 0, out.rows, 0, &arena, &len);
    cr_assert_not_null(json);
    kf_rows_t again = from_json(json);
    assert_same_rows(&rows, &again);

    Keyflow__V1__RowBatch *batch = kf_outbuf_to_batch(&out, 0, out.rows, &arena);
    cr_assert_not_null(batch);
    kf_rows_t columnar;
    cr_assert_eq(kf_rows_from_batch(batch, &schema, 100, 1 << 20, &arena, &columnar, &err), KF_OK,
                 "%s", err.message);
    assert_same_rows(&rows, &columnar);
}

static void digest_of(const kf_rows_t *rows, uint8_t out[KF_SHA256_BYTES]) {
    kf_sha256_ctx_t h;
    kf_sha256_begin(&h);
    kf_rows_digest(rows, &h);
    kf_sha256_finish(&h, out);
}

/* The digest that tells a producer's retry from other content: the same
 * rows digest alike as JSON and as a columnar batch, empty strings and
 * bytes included (an empty value may have no pointer at all), and another
 * value digests otherwise. */
Test(rows, digest_is_the_same_for_both_forms_and_tells_values_apart) {
    kf_rows_t rows = from_json("[{\"user\":\"\",\"ts\":1,\"blob\":\"\"},"
                               "{\"user\":\"x\",\"ts\":2,\"blob\":\"\"}]");
    kf_outbuf_t out;
    kf_outbuf_init(&out, &schema, &arena);
    cr_assert_eq(kf_outbuf_append_rows(&out, &rows, 0, rows.count, &err), KF_OK);
    Keyflow__V1__RowBatch *built = kf_outbuf_to_batch(&out, 0, out.rows, &arena);
    cr_assert_not_null(built);
    /* Through the wire, as a client's batch arrives: protobuf-c gives an
     * empty bytes value no data pointer. */
    uint8_t wire[1024];
    size_t wire_len = keyflow__v1__row_batch__get_packed_size(built);
    cr_assert_leq(wire_len, sizeof wire);
    keyflow__v1__row_batch__pack(built, wire);
    Keyflow__V1__RowBatch *batch = keyflow__v1__row_batch__unpack(NULL, wire_len, wire);
    cr_assert_not_null(batch);
    kf_rows_t columnar;
    cr_assert_eq(kf_rows_from_batch(batch, &schema, 100, 1 << 20, &arena, &columnar, &err), KF_OK,
                 "%s", err.message);
    uint8_t a[KF_SHA256_BYTES], b[KF_SHA256_BYTES], c[KF_SHA256_BYTES];
    digest_of(&rows, a);
    digest_of(&columnar, b);
    cr_assert_arr_eq(a, b, sizeof a);
    kf_rows_t other = from_json("[{\"user\":\"\",\"ts\":1,\"blob\":\"\"},"
                                "{\"user\":\"y\",\"ts\":2,\"blob\":\"\"}]");
    digest_of(&other, c);
    cr_assert(memcmp(a, c, sizeof a) != 0);
    keyflow__v1__row_batch__free_unpacked(batch, NULL);
}

Test(rows, json_refusals_name_row_and_column) {
    static const struct {
        const char *json;
        const char *message;
    } cases[] = {
        {"[{\"user\":\"a\",\"ts\":1,\"n\":\" 12\"}]",
         "rows[0].n: expected INT64 (an integer or a decimal string)"},
        {"[{\"user\":\"a\",\"ts\":1},{\"user\":\"a\",\"ts\":1.5}]",
         "rows[1].ts: expected TIMESTAMP_US"},
        {"[{\"user\":\"a\",\"ts\":1,\"blob\":\"not base64!\"}]",
         "rows[0].blob: expected BYTES (a base64 string)"},
        {"[{\"user\":\"a\",\"ts\":1,\"ratio\":\"inf\"}]", "rows[0].ratio: expected FLOAT64"},
        {"[{\"ts\":1}]", "rows[0].user: required (not nullable)"},
        {"[{\"user\":\"a\",\"ts\":1,\"other\":1}]",
         "rows[0].other: not a column of the input schema"},
        {"[1]", "rows[0]: must be an object"},
        {"{}", "rows: must be a JSON array of objects"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(refuse_json(cases[i].json), KF_E_INVALID, "%s", cases[i].json);
        cr_assert(strstr(err.message, cases[i].message) != NULL, "%s: %s", cases[i].json,
                  err.message);
    }
}

Test(rows, limits_are_named) {
    kf_rows_t rows;
    cr_assert_eq(
        kf_rows_from_json(rows_json, strlen(rows_json), &schema, 2, 1 << 20, &arena, &rows, &err),
        KF_E_TOO_LARGE);
    cr_assert(strstr(err.message, "max_input_rows is 2") != NULL, "%s", err.message);
    cr_assert_eq(
        kf_rows_from_json(rows_json, strlen(rows_json), &schema, 100, 60, &arena, &rows, &err),
        KF_E_TOO_LARGE);
    cr_assert(strstr(err.message, "rows: 67 bytes of values") != NULL, "%s", err.message);
}

Test(rows, batch_refusals_name_the_column) {
    kf_rows_t rows = from_json(rows_json);
    kf_outbuf_t out;
    kf_outbuf_init(&out, &schema, &arena);
    cr_assert_eq(kf_outbuf_append_rows(&out, &rows, 0, rows.count, &err), KF_OK);
    Keyflow__V1__RowBatch *batch = kf_outbuf_to_batch(&out, 0, out.rows, &arena);
    kf_rows_t got;

    Keyflow__V1__Column *ratio = batch->columns[3];
    ratio->values_case = KEYFLOW__V1__COLUMN__VALUES_INT64S; /* the wrong member */
    cr_assert_eq(kf_rows_from_batch(batch, &schema, 100, 1 << 20, &arena, &got, &err),
                 KF_E_INVALID);
    cr_assert_str_eq(err.message,
                     "batch.columns[3] (ratio): ratio is FLOAT64, expected float64s values");
    ratio->values_case = KEYFLOW__V1__COLUMN__VALUES_FLOAT64S;

    batch->columns[1]->int64s->n_values = 2;
    cr_assert_eq(kf_rows_from_batch(batch, &schema, 100, 1 << 20, &arena, &got, &err),
                 KF_E_INVALID);
    cr_assert_str_eq(err.message, "batch.columns[1] (ts): 2 values for 3 rows");
    batch->columns[1]->int64s->n_values = 3;

    batch->columns[0]->strings->values[1] = "\xff";
    cr_assert_eq(kf_rows_from_batch(batch, &schema, 100, 1 << 20, &arena, &got, &err),
                 KF_E_INVALID);
    cr_assert_str_eq(err.message, "batch.columns[0] (user): row 1 is not a valid UTF8 value");
}
