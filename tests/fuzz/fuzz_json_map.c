/* fuzz_json_map.c - libFuzzer harness: JSON -> message -> JSON -> message
 * round trip through service/proto/json_map.c (README.md). Byte 0 of the
 * input selects the message type. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/json_map.h"
#include "keyflow/v1/coordinators.pb-c.h"
#include "keyflow/v1/functions.pb-c.h"
#include "keyflow/v1/runs.pb-c.h"
#include "mapping_test.pb-c.h"
#include "mapping_test2.pb-c.h"

static const ProtobufCMessageDescriptor *const descs[] = {
    &keyflow__v1__send_event_request__descriptor,
    &keyflow__v1__describe_coordinator_request__descriptor,
    &keyflow__v1__flush_window_request__descriptor,
    &keyflow__v1__cancel_window_request__descriptor,
    &keyflow__v1__poll_runs_request__descriptor,
    &keyflow__v1__heartbeat_run_request__descriptor,
    &keyflow__v1__complete_run_request__descriptor,
    &keyflow__v1__get_run_request__descriptor,
    &keyflow__v1__list_runs_request__descriptor,
    &keyflow__v1__register_function_request__descriptor,
    &keyflow__v1__get_function_request__descriptor,
    &keyflow__v1__list_functions_request__descriptor,
    &keyflow__v1__push_batch_request__descriptor,
    &keyflow__v1__read_output_request__descriptor,
    &keyflow__v1__tail_output_request__descriptor,
    &keyflow__v1__get_key_state_request__descriptor,
    /* test-only messages cover every scalar type, proto2, aliases */
    &keyflow__test__scalars__descriptor,
    &keyflow__test__lists__descriptor,
    &keyflow__test__choice__descriptor,
    &keyflow__test__collide__descriptor,
    &keyflow__test__deep__descriptor,
    &keyflow__test__everything__descriptor,
    &keyflow__test__legacy__descriptor,
    /* a few responses, for the encoder */
    &keyflow__v1__describe_coordinator_response__descriptor,
    &keyflow__v1__run__descriptor,
    &keyflow__v1__function_info__descriptor,
};
#define NDESCS (sizeof descs / sizeof descs[0])

static int strict_json_text = -1;

static size_t vsize(ProtobufCType t) {
    switch (t) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_ENUM: return 4;
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    default: return 8;
    }
}

static int is_json_field(const ProtobufCFieldDescriptor *f) {
    size_t n = strlen(f->name);
    return f->type == PROTOBUF_C_TYPE_STRING && f->label != PROTOBUF_C_LABEL_REPEATED && n > 5 &&
           strcmp(f->name + n - 5, "_json") == 0;
}

static char *canon(const char *s) {
    json_t *v = json_loads(s, JSON_DECODE_ANY, NULL);
    if (!v)
        return NULL;
    char *d = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    json_decref(v);
    return d;
}

static const char *g_diff;

static int msg_eq(const ProtobufCMessage *a, const ProtobufCMessage *b);

static int val_eq(const ProtobufCFieldDescriptor *f, const void *x, const void *y, int jsonish) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_STRING: {
        const char *s, *t;
        memcpy(&s, x, sizeof s);
        memcpy(&t, y, sizeof t);
        if (!s)
            s = "";
        if (!t)
            t = "";
        if (strcmp(s, t) == 0)
            return 1;
        /* documented: a set `_json` oneof member with empty text is emitted as
         * null and comes back as "null" (json_map.h); STRICT_JSON_TEXT=1 reports it */
        if (jsonish == 2 && !strict_json_text &&
            ((s[0] == 0 && strcmp(t, "null") == 0) || (t[0] == 0 && strcmp(s, "null") == 0)))
            return 1;
        if (jsonish && !strict_json_text) {
            char *cs = canon(s), *ct = canon(t);
            int eq = cs && ct && strcmp(cs, ct) == 0;
            free(cs);
            free(ct);
            if (eq)
                return 1;
        }
        return 0;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData s, t;
        memcpy(&s, x, sizeof s);
        memcpy(&t, y, sizeof t);
        return s.len == t.len && (s.len == 0 || memcmp(s.data, t.data, s.len) == 0);
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *s, *t;
        memcpy(&s, x, sizeof s);
        memcpy(&t, y, sizeof t);
        if (!s || !t)
            return s == t;
        return msg_eq(s, t);
    }
    default: return memcmp(x, y, vsize(f->type)) == 0;
    }
}

static int msg_eq(const ProtobufCMessage *a, const ProtobufCMessage *b) {
    const ProtobufCMessageDescriptor *d = a->descriptor;
    if (d != b->descriptor)
        return 0;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *pa = (const char *)a, *pb = (const char *)b;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t na, nb;
            memcpy(&na, pa + f->quantifier_offset, sizeof na);
            memcpy(&nb, pb + f->quantifier_offset, sizeof nb);
            if (na != nb) {
                g_diff = f->name;
                return 0;
            }
            const char *ia, *ib;
            memcpy(&ia, pa + f->offset, sizeof ia);
            memcpy(&ib, pb + f->offset, sizeof ib);
            for (size_t k = 0; k < na; k++)
                if (!val_eq(f, ia + k * vsize(f->type), ib + k * vsize(f->type), 0)) {
                    g_diff = f->name;
                    return 0;
                }
            continue;
        }
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            uint32_t ca, cb;
            memcpy(&ca, pa + f->quantifier_offset, 4);
            memcpy(&cb, pb + f->quantifier_offset, 4);
            if ((ca == f->id) != (cb == f->id)) {
                g_diff = f->name;
                return 0;
            }
            if (ca != f->id)
                continue;
        } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_STRING &&
                   f->type != PROTOBUF_C_TYPE_MESSAGE && d->fields[0].label != 0xff &&
                   f->quantifier_offset != 0) {
            protobuf_c_boolean ha, hb;
            memcpy(&ha, pa + f->quantifier_offset, sizeof ha);
            memcpy(&hb, pb + f->quantifier_offset, sizeof hb);
            if (ha != hb) {
                g_diff = f->name;
                return 0;
            }
            if (!ha)
                continue;
        }
        if (!val_eq(f, pa + f->offset, pb + f->offset,
                    is_json_field(f) ? ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) ? 2 : 1) : 0)) {
            g_diff = f->name;
            return 0;
        }
    }
    return 1;
}

/* libFuzzer's entry point. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (strict_json_text < 0)
        strict_json_text = getenv("STRICT_JSON_TEXT") != NULL;
    if (size < 1)
        return 0;
    const ProtobufCMessageDescriptor *desc = descs[data[0] % NDESCS];
    const char *json = (const char *)data + 1;
    size_t len = size - 1;
    kf_arena_t arena;
    kf_arena_init(&arena, 64 * 1024 * 1024);
    kf_error_t err;
    kf_error_clear(&err);
    ProtobufCMessage *m1 = NULL;
    if (kf_json_to_message(json, len, desc, &arena, &m1, &err) != KF_OK) {
        kf_arena_deinit(&arena);
        return 0;
    }
    size_t l1 = 0;
    char *j1 = kf_message_to_json(m1, &arena, &l1);
    if (j1 == NULL)
        abort();
    ProtobufCMessage *m2 = NULL;
    kf_error_clear(&err);
    if (kf_json_to_message(j1, l1, desc, &arena, &m2, &err) != KF_OK) {
        fprintf(stderr, "ROUNDTRIP: re-decoding our own output failed: %s\noutput: %.500s\n",
                err.message, j1);
        abort();
    }
    if (!msg_eq(m1, m2)) {
        fprintf(stderr, "ROUNDTRIP: message mismatch at field %s\njson1: %.500s\n", g_diff, j1);
        abort();
    }
    size_t l2 = 0;
    char *j2 = kf_message_to_json(m2, &arena, &l2);
    if (j2 == NULL)
        abort();
    if (l1 != l2 || memcmp(j1, j2, l1) != 0) {
        fprintf(stderr, "ROUNDTRIP: json mismatch\njson1: %.500s\njson2: %.500s\n", j1, j2);
        abort();
    }
    /* a well-formed protobuf-c struct packs and unpacks to the same JSON */
    /* protobuf-c 1.4.1 drops proto3 -0.0 when packing (value compare with 0):
     * not this project's bug, so skip those */
    if (protobuf_c_message_check(m1) && strstr(j1, "-0.0") == NULL && strstr(j1, "-0e") == NULL &&
        strstr(j1, "-0E") == NULL) {
        size_t ps = protobuf_c_message_get_packed_size(m1);
        uint8_t *wire = malloc(ps + 1);
        protobuf_c_message_pack(m1, wire);
        ProtobufCMessage *back = protobuf_c_message_unpack(desc, NULL, ps, wire);
        if (!back) {
            fprintf(stderr, "ROUNDTRIP: unpack of packed message failed\n");
            abort();
        }
        size_t l3 = 0;
        char *j3 = kf_message_to_json(back, &arena, &l3);
        if (!j3 || l3 != l1 || memcmp(j1, j3, l1) != 0) {
            fprintf(stderr,
                    "ROUNDTRIP: binary round trip changed JSON\njson1: %.500s\njson3: %.500s\n", j1,
                    j3 ? j3 : "(null)");
            abort();
        }
        protobuf_c_message_free_unpacked(back, NULL);
        free(wire);
    }
    kf_arena_deinit(&arena);
    return 0;
}
