/*
 * test_columns.c - the column type table (service/proto/columns.h): one row
 * per FieldType that agrees with the protos, and every value converts the
 * same way back and forth through JSON and through a columnar batch.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "proto/columns.h"

#define PREFIX "FIELD_TYPE_"

/* Every FieldType but UNSPECIFIED has its row, named as the proto names it,
 * and the Column member it names is the one its values_case selects: a type
 * added to the protos fails here until the table has it. */
Test(columns, one_row_per_field_type_agreeing_with_the_protos) {
    const ProtobufCEnumDescriptor *types = &keyflow__v1__field_type__descriptor;
    size_t rows = 0;
    for (unsigned i = 0; i < types->n_values; i++) {
        const ProtobufCEnumValue *ev = &types->values[i];
        const kf_column_type_t *ct = kf_column_type((Keyflow__V1__FieldType)ev->value);
        if (ev->value == KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UNSPECIFIED) {
            cr_assert_null(ct);
            continue;
        }
        cr_assert_not_null(ct, "%s has no row", ev->name);
        rows++;
        cr_assert_eq((int)ct->type, ev->value);
        cr_assert_str_eq(ct->name, ev->name + strlen(PREFIX));
        const ProtobufCFieldDescriptor *member = protobuf_c_message_descriptor_get_field(
            &keyflow__v1__column__descriptor, (unsigned)ct->values_case);
        cr_assert_not_null(member, "%s: values_case %d", ct->name, (int)ct->values_case);
        cr_assert_str_eq(member->name, ct->values_name);
        cr_assert(member->flags & PROTOBUF_C_FIELD_FLAG_ONEOF, "%s: not in the oneof", ct->name);
        cr_assert(ct->json_form != NULL && ct->json_form[0] != '\0');
    }
    cr_assert_eq(rows, kf_column_types_count());
    for (size_t i = 0; i < kf_column_types_count(); i++) {
        cr_assert_eq(kf_column_type_at(i), kf_column_type(kf_column_type_at(i)->type));
    }
    cr_assert_null(kf_column_type((Keyflow__V1__FieldType)99));
    cr_assert_null(kf_column_type((Keyflow__V1__FieldType)-1));
}

typedef struct sample {
    Keyflow__V1__FieldType type;
    const char *json;     /* a JSON form of the value */
    const char *json_out; /* how the value is written back */
} sample_t;

static const sample_t samples[] = {
    {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BOOL, "true", "true"},
    {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BOOL, "false", "false"},
    {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64, "-12", "\"-12\""},
    {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64, "\"9223372036854775807\"",
     "\"9223372036854775807\""},
    {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64, "0.5", "0.5"},
    {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64, "\"-Infinity\"", "\"-Infinity\""},
    {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64, "\"NaN\"", "\"NaN\""},
    {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64, "\"2.5\"", "2.5"},
    {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, "\"h\\u00e9llo \\u2713\"",
     "\"h\\u00E9llo \\u2713\""},
    {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, "\"\"", "\"\""},
    {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BYTES, "\"AAEC/w==\"", "\"AAEC/w==\""},
    {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BYTES, "\"AAEC_w\"", "\"AAEC/w==\""},
    {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BYTES, "\"\"", "\"\""},
    {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US, "\"-5\"", "\"-5\""},
};

static bool same_value(const kf_column_type_t *ct, const kf_cell_t *a, const kf_cell_t *b) {
    if (ct->type == KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64) {
        return (isnan(a->v.f) && isnan(b->v.f)) || a->v.f == b->v.f;
    }
    if (ct->value_bytes > 0) {
        return a->v.i == b->v.i;
    }
    return a->len == b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
}

/* JSON -> cell -> column -> cell -> JSON, for a value of every type. */
Test(columns, values_survive_json_and_columnar_round_trips) {
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++) {
        const sample_t *s = &samples[i];
        const kf_column_type_t *ct = kf_column_type(s->type);
        json_t *v = json_loads(s->json, JSON_DECODE_ANY, NULL);
        cr_assert_not_null(v, "%s", s->json);
        kf_cell_t cell = {0};
        cr_assert_eq(ct->from_json(v, &arena, &cell), KF_CELL_DECODED, "%s %s", ct->name, s->json);
        json_decref(v);
        cr_assert(ct->valid(&cell), "%s %s", ct->name, s->json);

        Keyflow__V1__Column col = KEYFLOW__V1__COLUMN__INIT;
        cr_assert(ct->values_new(&col, 3, &arena));
        cr_assert_eq(col.values_case, ct->values_case);
        cr_assert_eq(ct->values_count(&col), 3);
        ct->values_set(&col, 1, &cell);
        kf_cell_t back = {0};
        ct->values_get(&col, 1, &back);
        cr_assert(same_value(ct, &cell, &back), "%s %s", ct->name, s->json);
        kf_cell_t other = {0};
        ct->values_get(&col, 0, &other); /* untouched: zero, false or empty */
        cr_assert(other.v.i == 0 && other.len == 0, "%s", ct->name);

        json_t *out = ct->to_json(&back);
        char *text = json_dumps(out, JSON_ENCODE_ANY | JSON_COMPACT | JSON_ENSURE_ASCII);
        cr_assert_str_eq(text, s->json_out, "%s %s: %s", ct->name, s->json, text);
        free(text);
        json_decref(out);
    }
    kf_arena_deinit(&arena);
}

Test(columns, wrong_forms_are_refused) {
    static const struct {
        Keyflow__V1__FieldType type;
        const char *json;
    } bad[] = {
        {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BOOL, "1"},
        {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BOOL, "\"true\""},
        {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64, "1.5"},
        {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64, "\" 12\""},
        {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64, "\"12abc\""},
        {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64, "[1]"},
        {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US, "1.5"},
        {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64, "\"half\""},
        {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_FLOAT64, "true"},
        {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, "7"},
        {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BYTES, "\"not base64!\""},
        {KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BYTES, "1"},
    };
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *v = json_loads(bad[i].json, JSON_DECODE_ANY, NULL);
        cr_assert_not_null(v);
        kf_cell_t cell = {0};
        const kf_column_type_t *ct = kf_column_type(bad[i].type);
        cr_assert_eq(ct->from_json(v, &arena, &cell), KF_CELL_WRONG_FORM, "%s %s", ct->name,
                     bad[i].json);
        json_decref(v);
    }
    /* "\u0000" (readable only with JSON_ALLOW_NUL) is no UTF8 value. */
    json_t *nul = json_loads("\"a\\u0000b\"", JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    kf_cell_t cell = {0};
    const kf_column_type_t *utf8 = kf_column_type(KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8);
    cr_assert_eq(utf8->from_json(nul, &arena, &cell), KF_CELL_WRONG_FORM);
    json_decref(nul);
    kf_cell_t broken = {.p = "\xff", .len = 1};
    cr_assert(!utf8->valid(&broken));
    kf_cell_t with_nul = {.p = "a\0b", .len = 3};
    cr_assert(!utf8->valid(&with_nul));
    kf_arena_deinit(&arena);
}

/* ---- JSON rows --------------------------------------------------------------- */

static Keyflow__V1__Field fields[] = {
    {PROTOBUF_C_MESSAGE_INIT(&keyflow__v1__field__descriptor), "user",
     KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, false},
    {PROTOBUF_C_MESSAGE_INIT(&keyflow__v1__field__descriptor), "n",
     KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_INT64, true},
    {PROTOBUF_C_MESSAGE_INIT(&keyflow__v1__field__descriptor), "blob",
     KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_BYTES, true},
};
static Keyflow__V1__Field *field_list[] = {&fields[0], &fields[1], &fields[2]};
static Keyflow__V1__Schema schema = {PROTOBUF_C_MESSAGE_INIT(&keyflow__v1__schema__descriptor), 3,
                                     field_list};

/* Converts one row; the caller drops the returned object after it has
 * looked at res (which may borrow from it). */
static json_t *convert(const char *row_json, Keyflow__V1__RowBatch *batch, size_t row,
                       kf_arena_t *arena, kf_row_result_t *res) {
    json_t *obj = json_loads(row_json, 0, NULL);
    cr_assert_not_null(obj, "%s", row_json);
    kf_row_from_json(&schema, obj, batch, row, arena, res);
    return obj;
}

Test(rows, convert_into_a_batch_that_packs) {
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    Keyflow__V1__RowBatch *batch = kf_row_batch_new(&schema, 2, &arena);
    cr_assert_not_null(batch);
    kf_row_result_t res;
    json_decref(convert("{\"user\":\"a\",\"n\":\"7\",\"blob\":\"AAE=\"}", batch, 0, &arena, &res));
    cr_assert_eq(res.problem, KF_ROW_CONVERTED);
    cr_assert_eq(res.value_bytes, 1 + 8 + 2);
    json_decref(convert("{\"user\":\"b\",\"n\":null}", batch, 1, &arena, &res));
    cr_assert_eq(res.problem, KF_ROW_CONVERTED);
    cr_assert_eq(res.value_bytes, 1, "nulls weigh nothing");
    cr_assert_eq(batch->columns[1]->n_nulls, 2);
    cr_assert(!batch->columns[1]->nulls[0] && batch->columns[1]->nulls[1]);
    cr_assert_eq(batch->columns[1]->int64s->values[0], 7);
    cr_assert_str_eq(batch->columns[0]->strings->values[1], "b");
    cr_assert_str_eq(batch->columns[0]->name, "user");
    /* It is a well-formed message: it packs and unpacks to the same rows. */
    size_t len = protobuf_c_message_get_packed_size(&batch->base);
    uint8_t *buf = kf_arena_alloc(&arena, len);
    protobuf_c_message_pack(&batch->base, buf);
    Keyflow__V1__RowBatch *back = keyflow__v1__row_batch__unpack(NULL, len, buf);
    cr_assert_not_null(back);
    cr_assert_eq(back->row_count, 2);
    cr_assert_eq(back->columns[2]->bytes_values->values[0].len, 2);
    cr_assert_eq(back->columns[2]->bytes_values->values[1].len, 0);
    keyflow__v1__row_batch__free_unpacked(back, NULL);
    kf_arena_deinit(&arena);
}

Test(rows, problems_name_the_field) {
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    Keyflow__V1__RowBatch *batch = kf_row_batch_new(&schema, 1, &arena);
    kf_row_result_t res;
    json_t *obj = convert("{\"user\":\"a\",\"extra\":1}", batch, 0, &arena, &res);
    cr_assert_eq(res.problem, KF_ROW_UNKNOWN_FIELD);
    cr_assert_str_eq(res.field, "extra");
    json_decref(obj);
    obj = convert("{\"n\":1}", batch, 0, &arena, &res);
    cr_assert_eq(res.problem, KF_ROW_REQUIRED);
    cr_assert_str_eq(res.field, "user");
    json_decref(obj);
    obj = convert("{\"user\":\"a\",\"n\":\"1.5\"}", batch, 0, &arena, &res);
    cr_assert_eq(res.problem, KF_ROW_WRONG_FORM);
    cr_assert_str_eq(res.field, "n");
    cr_assert_str_eq(res.type->name, "INT64");
    cr_assert_str_eq(json_string_value(res.value), "1.5");
    json_decref(obj);
    kf_arena_deinit(&arena);
}
