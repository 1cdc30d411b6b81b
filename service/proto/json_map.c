/*
 * json_map.c - the HTTP gateway's generic JSON <-> protobuf mapping (the
 * rules are in json_map.h), driven only by protobuf-c descriptors: decoding
 * walks a jansson tree and writes through the offsets of each
 * ProtobufCFieldDescriptor; encoding reads through the same offsets and
 * builds a jansson tree. No code here knows any particular message.
 *
 * Invariants:
 *   1. Every message this file creates is initialized by its descriptor's
 *      message_init before a field is written, so proto3 strings start as
 *      protobuf_c_empty_string (never NULL) and message fields as NULL.
 *   2. A oneof's shared storage is read only as the member its case names.
 *      Before a different member is written the storage is zeroed, so a
 *      pointer left by one member is never merged into as another.
 *   3. Presence (a oneof case, a proto2 has_ flag) is set only after the
 *      value decoded successfully. A failed merge may leave other fields
 *      changed (json_map.h says so); it never leaves a case naming garbage.
 *   4. Every decoded byte lives in the caller's arena. jansson values and
 *      malloc'd scratch made here are released before each function returns.
 *   5. Decoding recurses only along JSON nesting, and the nesting level is
 *      checked against KF_JSON_DEPTH_MAX before each descent, so the stack is
 *      bounded whatever the input. Encoding follows message nesting, which
 *      the message's owner (our own code) bounds.
 *   6. No mutable static state: every function may run on any thread.
 *
 * Depth is counted in containers: the body object is level 1, an object or
 * array inside it level 2, and so on; a scalar, and an empty array, add no
 * level.
 */
#include "proto/json_map.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/json.h"
#include "base/base64.h"
#include "base/limits.h"

/* Field names come from our own .proto files and are far shorter; a longer
 * one is a programmer error that KF_ASSERT reports. */
#define JSON_NAME_BYTES_MAX 128
/* Longer error paths are shortened (keeping their end): the whole message
 * is bounded anyway. */
#define PATH_BYTES_MAX 256
/* A key per object level and an index per array level, plus a prefix. */
#define PATH_SEGMENTS_MAX (2 * KF_JSON_DEPTH_MAX + 2)
/* How much of an offending value an error message quotes. */
#define EXCERPT_BYTES_MAX 48
/* The list of expected names in an error message. */
#define NAME_LIST_BYTES_MAX 256
/* Shown as the path of errors about the document itself. */
#define ROOT_PATH "body"
/* Up to 2^53 every integer is a double; beyond it a JSON number may already
 * have been rounded by the parser, so large integers must come as strings. */
#define EXACT_INTEGER_MAX 9007199254740992.0
#define JSON_SUFFIX       "_json"
#define JSON_SUFFIX_BYTES (sizeof JSON_SUFFIX - 1)

_Static_assert(PROTOBUF_C_TYPE_MESSAGE == 16, "the type table below follows ProtobufCType");
_Static_assert(KF_JSON_DEPTH_MAX > 1, "a body object and at least one level inside it");

/* ---- names ------------------------------------------------------------ */

/* How a JSON key refers to a field: directly (by its name or lowerCamelCase
 * name), or as the embedded value of a `_json` string field. */
typedef enum form {
    FORM_DIRECT,
    FORM_EMBEDDED,
} form_t;

static const char *const type_names[] = {
    "int32",   "sint32", "sfixed32", "int64", "sint64", "sfixed64", "uint32", "fixed32", "uint64",
    "fixed64", "float",  "double",   "bool",  "enum",   "string",   "bytes",  "message",
};

static const char *type_name(ProtobufCType type) {
    KF_ASSERT((unsigned)type < sizeof type_names / sizeof type_names[0]);
    return type_names[type];
}

/* The lowerCamelCase JSON name of name[0..len), as protoc computes json_name
 * (protobuf-c 1.4.1 descriptors do not carry it): each '_' is dropped and the
 * letter after it upper-cased. */
static void camel_name(const char *name, size_t len, char out[JSON_NAME_BYTES_MAX]) {
    KF_ASSERT(len < JSON_NAME_BYTES_MAX);
    size_t o = 0;
    bool upper = false;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (c == '_') {
            upper = true;
            continue;
        }
        if (upper && c >= 'a' && c <= 'z') {
            c = (char)(c - 'a' + 'A');
        }
        upper = false;
        out[o++] = c;
    }
    out[o] = '\0';
}

/* True when key is name[0..len) or its lowerCamelCase form. */
static bool key_names(const char *key, const char *name, size_t len) {
    if (strncmp(key, name, len) == 0 && key[len] == '\0') {
        return true;
    }
    char camel[JSON_NAME_BYTES_MAX];
    camel_name(name, len, camel);
    return strcmp(key, camel) == 0;
}

/* The length of the embedded name of a `_json` field ("input" for
 * "input_json"), or 0 when f does not use the convention: it must be a
 * singular string, and no other field may answer to the embedded name (a
 * message with both `input` and `input_json` keeps the string form). */
static size_t json_text_base_len(const ProtobufCMessageDescriptor *desc,
                                 const ProtobufCFieldDescriptor *f) {
    if (f->type != PROTOBUF_C_TYPE_STRING || f->label == PROTOBUF_C_LABEL_REPEATED) {
        return 0;
    }
    size_t len = strlen(f->name);
    if (len <= JSON_SUFFIX_BYTES || strcmp(f->name + len - JSON_SUFFIX_BYTES, JSON_SUFFIX) != 0) {
        return 0;
    }
    size_t base_len = len - JSON_SUFFIX_BYTES;
    char base[JSON_NAME_BYTES_MAX];
    char base_camel[JSON_NAME_BYTES_MAX];
    KF_ASSERT(base_len < sizeof base);
    memcpy(base, f->name, base_len);
    base[base_len] = '\0';
    camel_name(base, base_len, base_camel);
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *g = &desc->fields[i];
        size_t g_len = strlen(g->name);
        if (g != f && (key_names(base, g->name, g_len) || key_names(base_camel, g->name, g_len))) {
            return 0;
        }
    }
    return base_len;
}

/* The field a JSON key names, or NULL. Direct names win over embedded ones,
 * which json_text_base_len already keeps from colliding. */
static const ProtobufCFieldDescriptor *find_field(const ProtobufCMessageDescriptor *desc,
                                                  const char *key, form_t *form) {
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        if (key_names(key, f->name, strlen(f->name))) {
            *form = FORM_DIRECT;
            return f;
        }
    }
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        size_t base_len = json_text_base_len(desc, f);
        if (base_len > 0 && key_names(key, f->name, base_len)) {
            *form = FORM_EMBEDDED;
            return f;
        }
    }
    return NULL;
}

/* The key a field is emitted under (and listed under in error messages). */
static void emitted_name(const ProtobufCMessageDescriptor *desc, const ProtobufCFieldDescriptor *f,
                         char out[JSON_NAME_BYTES_MAX]) {
    size_t base_len = json_text_base_len(desc, f);
    camel_name(f->name, base_len > 0 ? base_len : strlen(f->name), out);
}

void kf_json_field_name(const ProtobufCMessageDescriptor *desc, const ProtobufCFieldDescriptor *f,
                        char out[KF_JSON_NAME_BYTES_MAX], bool *embedded) {
    _Static_assert(KF_JSON_NAME_BYTES_MAX == JSON_NAME_BYTES_MAX, "one bound");
    emitted_name(desc, f, out);
    *embedded = json_text_base_len(desc, f) > 0;
}

size_t kf_json_field_keys(const ProtobufCMessageDescriptor *desc, const ProtobufCFieldDescriptor *f,
                          kf_json_key_t keys[KF_JSON_FIELD_KEYS_MAX]) {
    size_t n = 0;
    size_t base_len = json_text_base_len(desc, f);
    /* The spellings find_field takes, the emitted one first. */
    const struct {
        size_t len;
        bool camel;
        bool embedded;
    } forms[] = {
        {base_len, true, true},
        {base_len, false, true},
        {strlen(f->name), true, false},
        {strlen(f->name), false, false},
    };
    for (size_t i = base_len > 0 ? 0 : 2; i < sizeof forms / sizeof forms[0]; i++) {
        char name[JSON_NAME_BYTES_MAX];
        KF_ASSERT(forms[i].len < sizeof name);
        if (forms[i].camel) {
            camel_name(f->name, forms[i].len, name);
        } else {
            memcpy(name, f->name, forms[i].len);
            name[forms[i].len] = '\0';
        }
        bool seen = false;
        for (size_t k = 0; k < n && !seen; k++) {
            seen = strcmp(keys[k].name, name) == 0;
        }
        if (!seen) {
            KF_ASSERT(n < KF_JSON_FIELD_KEYS_MAX);
            memcpy(keys[n].name, name, sizeof name);
            keys[n].embedded = forms[i].embedded;
            n++;
        }
    }
    return n;
}

/* Appends item to a ", "-separated list in buf, ending it with "..." once it
 * would not fit, so that error messages stay bounded. */
static void list_append(char *buf, size_t cap, const char *item) {
    size_t len = strlen(buf);
    if (len >= 3 && strcmp(buf + len - 3, "...") == 0) {
        return;
    }
    const char *sep = len > 0 ? ", " : "";
    if (len + strlen(sep) + strlen(item) + 5 < cap) {
        snprintf(buf + len, cap - len, "%s%s", sep, item);
    } else {
        snprintf(buf + len, cap - len, "%s...", sep);
    }
}

/* ---- field storage ---------------------------------------------------- */

/* The size of one value of a type in a protobuf-c struct or repeated array. */
static size_t value_size(ProtobufCType type) {
    switch (type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_ENUM: return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE: return 8;
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
    }
    KF_UNREACHABLE();
}

static void *field_slot(ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f) {
    return (char *)msg + f->offset;
}

static void *field_quantifier(ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f) {
    return (char *)msg + f->quantifier_offset;
}

static const void *field_slot_const(const ProtobufCMessage *msg,
                                    const ProtobufCFieldDescriptor *f) {
    return (const char *)msg + f->offset;
}

static const void *field_quantifier_const(const ProtobufCMessage *msg,
                                          const ProtobufCFieldDescriptor *f) {
    return (const char *)msg + f->quantifier_offset;
}

/* proto2 optional scalars and bytes carry a has_ flag at quantifier_offset;
 * strings and messages show presence by their pointer instead. */
static bool has_flag_field(const ProtobufCFieldDescriptor *f) {
    return f->label == PROTOBUF_C_LABEL_OPTIONAL && (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) == 0 &&
           f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE;
}

static uint32_t oneof_case(const ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f) {
    uint32_t which;
    memcpy(&which, field_quantifier_const(msg, f), sizeof which);
    return which;
}

static void set_oneof_case(ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f,
                           uint32_t which) {
    memcpy(field_quantifier(msg, f), &which, sizeof which);
}

/* Invariant 2: a member about to be written owns the shared storage. */
static void prepare_member(ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f) {
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0 && oneof_case(msg, f) != f->id) {
        memset(field_slot(msg, f), 0, value_size(f->type));
    }
}

/* Invariant 3: called once the value is in place. */
static void mark_present(ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f) {
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0) {
        set_oneof_case(msg, f, f->id);
    } else if (has_flag_field(f)) {
        protobuf_c_boolean yes = 1;
        memcpy(field_quantifier(msg, f), &yes, sizeof yes);
    }
}

/* Puts a singular field back to what message_init gave it. */
static void set_default(const ProtobufCFieldDescriptor *f, void *slot) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_STRING: {
        /* default_value points at the default text itself (for proto3 at
         * protobuf_c_empty_string); NULL for a proto2 string without one. */
        const char *text = f->default_value;
        memcpy(slot, &text, sizeof text);
        return;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        ProtobufCMessage *none = NULL;
        memcpy(slot, &none, sizeof none);
        return;
    }
    default:
        if (f->default_value != NULL) {
            memcpy(slot, f->default_value, value_size(f->type));
        } else {
            memset(slot, 0, value_size(f->type));
        }
        return;
    }
}

/* JSON null: the field becomes absent. A oneof member only clears the oneof
 * when it is the member that is set. */
static void clear_field(ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f) {
    void *slot = field_slot(msg, f);
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        size_t none = 0;
        void *items = NULL;
        memcpy(field_quantifier(msg, f), &none, sizeof none);
        memcpy(slot, &items, sizeof items);
        return;
    }
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0) {
        if (oneof_case(msg, f) == f->id) {
            set_oneof_case(msg, f, 0);
            memset(slot, 0, value_size(f->type));
        }
        return;
    }
    if (has_flag_field(f)) {
        protobuf_c_boolean no = 0;
        memcpy(field_quantifier(msg, f), &no, sizeof no);
    }
    set_default(f, slot);
}

static bool value_is_default(ProtobufCType type, const void *slot) {
    switch (type) {
    case PROTOBUF_C_TYPE_STRING: {
        const char *text;
        memcpy(&text, slot, sizeof text);
        return text == NULL || text[0] == '\0';
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub;
        memcpy(&sub, slot, sizeof sub);
        return sub == NULL;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData data;
        memcpy(&data, slot, sizeof data);
        return data.len == 0;
    }
    default: {
        /* Bitwise, so that -0.0 (not the default bit pattern) round-trips. */
        static const unsigned char zeros[8];
        size_t size = value_size(type);
        KF_ASSERT(size <= sizeof zeros);
        return memcmp(slot, zeros, size) == 0;
    }
    }
}

/* Whether the encoder emits f: explicit presence where the message has it,
 * otherwise (proto3) a value other than the default. */
static bool field_is_present(const ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f) {
    const void *slot = field_slot_const(msg, f);
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        size_t count;
        memcpy(&count, field_quantifier_const(msg, f), sizeof count);
        return count > 0;
    }
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0) {
        return oneof_case(msg, f) == f->id;
    }
    if (has_flag_field(f)) {
        protobuf_c_boolean has;
        memcpy(&has, field_quantifier_const(msg, f), sizeof has);
        return has != 0;
    }
    if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE) {
        const void *pointer;
        memcpy(&pointer, slot, sizeof pointer);
        if (f->label == PROTOBUF_C_LABEL_OPTIONAL) {
            return pointer != NULL && pointer != f->default_value; /* proto2 */
        }
        if (f->label == PROTOBUF_C_LABEL_REQUIRED) {
            return pointer != NULL;
        }
    } else if (f->label == PROTOBUF_C_LABEL_REQUIRED) {
        return true;
    }
    return !value_is_default(f->type, slot);
}

/* ---- numbers ---------------------------------------------------------- */

/* The shortest "%g" text that reads back as the same double, for messages. */
static void format_double(double value, char *buf, size_t cap) {
    for (int precision = 1; precision <= 17; precision++) {
        snprintf(buf, cap, "%.*g", precision, value);
        if (strtod(buf, NULL) == value) {
            return;
        }
    }
}

/* The decimal that a float was most likely written as ("0.1", not
 * 0.100000001490116...), widened to double for jansson. */
static double float_as_double(float value) {
    char buf[32];
    for (int precision = 6; precision <= 9; precision++) {
        snprintf(buf, sizeof buf, "%.*g", precision, (double)value);
        if (strtof(buf, NULL) == value) {
            return strtod(buf, NULL);
        }
    }
    return (double)value;
}

/* ---- decoding --------------------------------------------------------- */

/* The JSON path of the value being decoded, for error messages: a stack of
 * segments that borrow their names (from the JSON object's keys, or from the
 * parameter name in kf_message_set_text), rendered only when an error is
 * reported. Decoding pushes at most one key per object level and one index
 * per array level, and both are bounded by KF_JSON_DEPTH_MAX. */
typedef struct segment {
    const char *name; /* borrowed; NULL for an array index */
    size_t name_len;
    size_t index;
} segment_t;

typedef struct path {
    segment_t segments[PATH_SEGMENTS_MAX];
    size_t count;
} path_t;

/* Pushes return the previous count, to hand to path_pop. */
static size_t path_push_key(path_t *p, const char *name, size_t name_len) {
    KF_ASSERT(p->count < PATH_SEGMENTS_MAX);
    p->segments[p->count] = (segment_t){name, name_len, 0};
    return p->count++;
}

static size_t path_push_index(path_t *p, size_t index) {
    KF_ASSERT(p->count < PATH_SEGMENTS_MAX);
    p->segments[p->count] = (segment_t){NULL, 0, index};
    return p->count++;
}

static void path_pop(path_t *p, size_t count) {
    KF_ASSERT(count <= p->count);
    p->count = count;
}

/* Segment i as text: "name", ".name" or "[index]"; returns its length,
 * writing at most cap bytes (snprintf rules; out may be NULL when cap is 0). */
static size_t path_piece(const path_t *p, size_t i, bool first, char *out, size_t cap) {
    const segment_t *s = &p->segments[i];
    int n = s->name == NULL
                ? snprintf(out, cap, "[%zu]", s->index)
                : snprintf(out, cap, "%s%.*s", first ? "" : ".",
                           (int)(s->name_len < INT_MAX ? s->name_len : INT_MAX), s->name);
    return n > 0 ? (size_t)n : 0;
}

/* The path as text in out (cap bytes). When it does not fit, the end is
 * kept, since the last segments name the offending value: "...rule.kind". */
static void path_render(const path_t *p, char *out, size_t cap) {
    KF_ASSERT(cap > 8);
    if (p->count == 0) {
        snprintf(out, cap, "%s", ROOT_PATH);
        return;
    }
    size_t total = 0;
    for (size_t i = 0; i < p->count; i++) {
        total += path_piece(p, i, i == 0, NULL, 0);
    }
    size_t first = 0;
    size_t o = 0;
    if (total >= cap) {
        /* Keep the longest tail that fits after "...": rendering from
         * segment `first` costs its piece without a dot plus the rest. */
        size_t rest = 0;
        first = p->count;
        while (first > 0 && 3 + path_piece(p, first - 1, true, NULL, 0) + rest < cap) {
            first--;
            rest += path_piece(p, first, false, NULL, 0);
        }
        if (first == p->count) {
            /* Even the last segment is too long: show its start, cut on a
             * UTF-8 boundary. */
            size_t n = path_piece(p, p->count - 1, true, out, cap - 3);
            size_t cut = n < cap - 4 ? n : cap - 4;
            while (cut > 0 && ((unsigned char)out[cut] & 0xc0) == 0x80) {
                cut--;
            }
            snprintf(out + cut, 4, "...");
            return;
        }
        o = (size_t)snprintf(out, cap, "...");
    }
    for (size_t i = first; i < p->count && o < cap; i++) {
        o += path_piece(p, i, i == first, out + o, cap - o);
    }
}

typedef struct decoder {
    kf_arena_t *arena; /* borrowed: receives every decoded byte */
    kf_error_t *err;   /* borrowed: may be NULL */
    path_t path;
} decoder_t;

/* `prefix` (borrowed for the decoder's life) starts every error path. */
static void decoder_init(decoder_t *d, kf_arena_t *arena, kf_error_t *err, const char *prefix) {
    d->arena = arena;
    d->err = err;
    d->path.count = 0;
    if (prefix != NULL && prefix[0] != '\0') {
        path_push_key(&d->path, prefix, strlen(prefix));
    }
}

__attribute__((format(printf, 3, 4))) static kf_status_t fail(decoder_t *d, kf_status_t status,
                                                              const char *fmt, ...) {
    char where[PATH_BYTES_MAX];
    char what[KF_ERROR_MESSAGE_BYTES_MAX];
    path_render(&d->path, where, sizeof where);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kf_error_set(d->err, status, "%s: %s", where, what);
}

static kf_status_t fail_memory(decoder_t *d) {
    return fail(d, KF_E_TOO_LARGE, "the request does not fit in its %zu-byte memory limit",
                d->arena->limit_bytes);
}

static kf_status_t fail_depth(decoder_t *d) {
    return fail(d, KF_E_INVALID, "JSON nested deeper than %d levels", KF_JSON_DEPTH_MAX);
}

/* A short rendering of an offending value for "got ..." in messages. */
typedef struct excerpt {
    char text[EXCERPT_BYTES_MAX + 8];
} excerpt_t;

static const char *excerpt(const json_t *v, excerpt_t *e) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    case JSON_NULL: return "null";
    case JSON_INTEGER:
        snprintf(e->text, sizeof e->text, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return e->text;
    case JSON_REAL: format_double(json_real_value(v), e->text, sizeof e->text); return e->text;
    case JSON_STRING: break;
    }
    /* Quoted and escaped by jansson, cut on a UTF-8 boundary if long. */
    char *quoted = json_dumps(v, JSON_ENCODE_ANY);
    if (quoted == NULL) {
        return "a string";
    }
    size_t len = strlen(quoted);
    if (len <= EXCERPT_BYTES_MAX) {
        memcpy(e->text, quoted, len + 1);
    } else {
        size_t cut = EXCERPT_BYTES_MAX - 4;
        while (cut > 1 && ((unsigned char)quoted[cut] & 0xc0) == 0x80) {
            cut--;
        }
        snprintf(e->text, sizeof e->text, "%.*s...\"", (int)cut, quoted);
    }
    free(quoted);
    return e->text;
}

/* True when v holds containers nested more than `levels` deep. */
static ProtobufCMessage *new_message(decoder_t *d, const ProtobufCMessageDescriptor *desc) {
    KF_ASSERT(desc->magic == PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC);
    ProtobufCMessage *msg = kf_arena_alloc(d->arena, desc->sizeof_message);
    if (msg != NULL) {
        protobuf_c_message_init(desc, msg); /* invariant 1 */
    }
    return msg;
}

static kf_status_t merge_object(decoder_t *d, json_t *obj, ProtobufCMessage *msg, int level);

static kf_status_t store_integer(decoder_t *d, ProtobufCType type, const json_t *v, bool negative,
                                 uint64_t magnitude, bool overflow, void *slot) {
    bool is_signed = type == PROTOBUF_C_TYPE_INT32 || type == PROTOBUF_C_TYPE_SINT32 ||
                     type == PROTOBUF_C_TYPE_SFIXED32 || type == PROTOBUF_C_TYPE_INT64 ||
                     type == PROTOBUF_C_TYPE_SINT64 || type == PROTOBUF_C_TYPE_SFIXED64;
    bool wide = value_size(type) == 8;
    uint64_t max_positive = is_signed ? (wide ? (uint64_t)INT64_MAX : (uint64_t)INT32_MAX)
                                      : (wide ? UINT64_MAX : (uint64_t)UINT32_MAX);
    uint64_t max_negative = is_signed ? max_positive + 1 : 0;
    if (overflow || magnitude > (negative ? max_negative : max_positive)) {
        excerpt_t e;
        return fail(d, KF_E_INVALID, "out of range for %s, got %s", type_name(type),
                    excerpt(v, &e));
    }
    if (is_signed) {
        /* -(m - 1) - 1 reaches INT64_MIN without overflowing. */
        int64_t value =
            negative && magnitude > 0 ? -(int64_t)(magnitude - 1) - 1 : (int64_t)magnitude;
        if (wide) {
            memcpy(slot, &value, sizeof value);
        } else {
            int32_t narrow = (int32_t)value;
            memcpy(slot, &narrow, sizeof narrow);
        }
    } else if (wide) {
        memcpy(slot, &magnitude, sizeof magnitude);
    } else {
        uint32_t narrow = (uint32_t)magnitude;
        memcpy(slot, &narrow, sizeof narrow);
    }
    return KF_OK;
}

/* Integers come as JSON integers, integral reals within 2^53, or decimal
 * strings (the only way to send a uint64 above INT64_MAX: jansson cannot
 * hold it as a number). */
static kf_status_t decode_integer(decoder_t *d, ProtobufCType type, const json_t *v, void *slot) {
    bool negative = false;
    bool overflow = false;
    uint64_t magnitude = 0;
    excerpt_t e;
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        negative = x < 0;
        magnitude = negative ? (uint64_t)(-(x + 1)) + 1 : (uint64_t)x;
    } else if (json_is_real(v)) {
        double r = json_real_value(v);
        if (r != floor(r)) {
            return fail(d, KF_E_INVALID, "expected an integer, got %s", excerpt(v, &e));
        }
        if (fabs(r) > EXACT_INTEGER_MAX) {
            return fail(d, KF_E_INVALID,
                        "%s is past 2^53, where JSON numbers are not exact; send it as a string",
                        excerpt(v, &e));
        }
        negative = r < 0;
        magnitude = (uint64_t)fabs(r);
    } else if (json_is_string(v)) {
        kf_json_number_t parsed = kf_json_integer_text(json_string_value(v), json_string_length(v),
                                                       &negative, &magnitude);
        if (parsed == KF_JSON_NUMBER_MALFORMED) {
            return fail(d, KF_E_INVALID, "expected an integer, got %s", excerpt(v, &e));
        }
        overflow = parsed == KF_JSON_NUMBER_OUT_OF_RANGE;
    } else {
        return fail(d, KF_E_INVALID, "expected an integer, got %s", excerpt(v, &e));
    }
    return store_integer(d, type, v, negative, magnitude, overflow, slot);
}

static kf_status_t decode_floating(decoder_t *d, ProtobufCType type, const json_t *v, void *slot) {
    double value = 0;
    excerpt_t e;
    if (json_is_number(v)) {
        value = json_number_value(v);
    } else if (json_is_string(v)) {
        switch (kf_json_double_text(json_string_value(v), json_string_length(v), &value)) {
        case KF_JSON_NUMBER_OK: break;
        case KF_JSON_NUMBER_MALFORMED:
            return fail(d, KF_E_INVALID, "expected a number, got %s", excerpt(v, &e));
        case KF_JSON_NUMBER_OUT_OF_RANGE:
            return fail(d, KF_E_INVALID, "out of range for %s, got %s", type_name(type),
                        excerpt(v, &e));
        }
    } else {
        return fail(d, KF_E_INVALID, "expected a number, got %s", excerpt(v, &e));
    }
    if (type == PROTOBUF_C_TYPE_FLOAT) {
        if (isfinite(value) && fabs(value) > FLT_MAX) {
            return fail(d, KF_E_INVALID, "out of range for float, got %s", excerpt(v, &e));
        }
        float narrow = (float)value;
        memcpy(slot, &narrow, sizeof narrow);
    } else {
        memcpy(slot, &value, sizeof value);
    }
    return KF_OK;
}

/* The length of the prefix all of an enum's names share, cut back to its
 * last '_' ("RULE_KIND_"); 0 when there is none. Computed over
 * values_by_name, which includes aliases. */
static size_t enum_prefix_len(const ProtobufCEnumDescriptor *ed) {
    if (ed->n_value_names < 2) {
        return 0;
    }
    const char *first = ed->values_by_name[0].name;
    size_t prefix_len = strlen(first);
    for (unsigned i = 1; i < ed->n_value_names; i++) {
        const char *other = ed->values_by_name[i].name;
        size_t k = 0;
        while (k < prefix_len && other[k] == first[k]) {
            k++;
        }
        prefix_len = k;
    }
    while (prefix_len > 0 && first[prefix_len - 1] != '_') {
        prefix_len--;
    }
    return prefix_len;
}

void kf_json_enum_short_name(const ProtobufCEnumDescriptor *ed, const char *full,
                             char out[KF_JSON_NAME_BYTES_MAX]) {
    size_t prefix_len = enum_prefix_len(ed);
    if (strlen(full) <= prefix_len) {
        prefix_len = 0; /* never an empty short name */
    }
    size_t o = 0;
    for (const char *c = full + prefix_len; *c != '\0'; c++) {
        KF_ASSERT(o + 1 < KF_JSON_NAME_BYTES_MAX);
        out[o++] = *c >= 'A' && *c <= 'Z' ? (char)(*c - 'A' + 'a') : *c;
    }
    out[o] = '\0';
}

/* The enum value a name means: exactly its full name ("RULE_KIND_BATCH"),
 * or exactly its short name (kf_json_enum_short_name: "batch"). Nothing
 * else, so that the OpenAPI document can list every spelling. */
static const ProtobufCEnumValue *enum_by_name(const ProtobufCEnumDescriptor *ed, const char *name) {
    for (unsigned i = 0; i < ed->n_value_names; i++) {
        if (strcmp(ed->values_by_name[i].name, name) == 0) {
            return &ed->values[ed->values_by_name[i].index];
        }
    }
    for (unsigned i = 0; i < ed->n_value_names; i++) {
        char short_name[KF_JSON_NAME_BYTES_MAX];
        kf_json_enum_short_name(ed, ed->values_by_name[i].name, short_name);
        if (strcmp(short_name, name) == 0) {
            return &ed->values[ed->values_by_name[i].index];
        }
    }
    return NULL;
}

static kf_status_t fail_enum(decoder_t *d, const ProtobufCEnumDescriptor *ed, const json_t *v) {
    char names[NAME_LIST_BYTES_MAX] = "";
    char short_names[NAME_LIST_BYTES_MAX] = "";
    for (unsigned i = 0; i < ed->n_values; i++) {
        char short_name[KF_JSON_NAME_BYTES_MAX];
        kf_json_enum_short_name(ed, ed->values[i].name, short_name);
        list_append(names, sizeof names, ed->values[i].name);
        list_append(short_names, sizeof short_names, short_name);
    }
    excerpt_t e;
    return fail(d, KF_E_INVALID, "expected one of %s (or %s), got %s", names, short_names,
                excerpt(v, &e));
}

/* A name (see enum_by_name), or in a body a known number as a JSON integer
 * (proto3 JSON). Unknown numbers are refused: over HTTP they can only be
 * typos. A number as a string is not a name: refused (a query parameter's
 * text always comes as a string, so it takes names only). */
static kf_status_t decode_enum(decoder_t *d, const ProtobufCEnumDescriptor *ed, const json_t *v,
                               void *slot) {
    int value;
    if (json_is_string(v)) {
        const ProtobufCEnumValue *ev = enum_by_name(ed, json_string_value(v));
        if (ev == NULL) {
            return fail_enum(d, ed, v);
        }
        value = ev->value;
    } else if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < INT32_MIN || x > INT32_MAX ||
            protobuf_c_enum_descriptor_get_value(ed, (int)x) == NULL) {
            return fail_enum(d, ed, v);
        }
        value = (int)x;
    } else {
        return fail_enum(d, ed, v);
    }
    memcpy(slot, &value, sizeof value);
    return KF_OK;
}

/* Decodes one value of f's type into slot (a struct member or an element of
 * a repeated array). `level` is the level of the container holding v. */
static kf_status_t decode_value(decoder_t *d, const ProtobufCFieldDescriptor *f, json_t *v,
                                void *slot, int level) {
    excerpt_t e;
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: return decode_integer(d, f->type, v, slot);
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE: return decode_floating(d, f->type, v, slot);
    case PROTOBUF_C_TYPE_BOOL: {
        if (!json_is_boolean(v)) {
            return fail(d, KF_E_INVALID, "expected true or false, got %s", excerpt(v, &e));
        }
        protobuf_c_boolean value = json_is_true(v);
        memcpy(slot, &value, sizeof value);
        return KF_OK;
    }
    case PROTOBUF_C_TYPE_ENUM: return decode_enum(d, f->descriptor, v, slot);
    case PROTOBUF_C_TYPE_STRING: {
        if (!json_is_string(v)) {
            return fail(d, KF_E_INVALID, "expected a string, got %s", excerpt(v, &e));
        }
        size_t len = json_string_length(v);
        if (memchr(json_string_value(v), '\0', len) != NULL) {
            return fail(d, KF_E_INVALID, "must not contain a NUL character");
        }
        char *text = kf_arena_strndup(d->arena, json_string_value(v), len);
        if (text == NULL) {
            return fail_memory(d);
        }
        memcpy(slot, &text, sizeof text);
        return KF_OK;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        if (!json_is_string(v)) {
            return fail(d, KF_E_INVALID, "expected a base64 string, got %s", excerpt(v, &e));
        }
        size_t len = json_string_length(v);
        ProtobufCBinaryData data = {0, NULL};
        if (len > 0) {
            data.data = kf_arena_alloc(d->arena, len / 4 * 3 + 3);
            if (data.data == NULL) {
                return fail_memory(d);
            }
            if (!kf_base64_decode(json_string_value(v), len, data.data, &data.len)) {
                return fail(d, KF_E_INVALID, "expected base64, got %s", excerpt(v, &e));
            }
        }
        memcpy(slot, &data, sizeof data);
        return KF_OK;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        if (!json_is_object(v)) {
            return fail(d, KF_E_INVALID, "expected an object, got %s", excerpt(v, &e));
        }
        ProtobufCMessage *sub;
        memcpy(&sub, slot, sizeof sub);
        if (sub == NULL) {
            sub = new_message(d, f->descriptor);
            if (sub == NULL) {
                return fail_memory(d);
            }
            memcpy(slot, &sub, sizeof sub);
        }
        return merge_object(d, v, sub, level + 1);
    }
    }
    KF_UNREACHABLE();
}

static kf_status_t decode_singular(decoder_t *d, ProtobufCMessage *msg,
                                   const ProtobufCFieldDescriptor *f, json_t *v, int level) {
    prepare_member(msg, f);
    kf_status_t status = decode_value(d, f, v, field_slot(msg, f), level);
    if (status == KF_OK) {
        mark_present(msg, f);
    }
    return status;
}

/* A JSON array replaces the repeated field's elements. */
static kf_status_t decode_repeated(decoder_t *d, ProtobufCMessage *msg,
                                   const ProtobufCFieldDescriptor *f, json_t *v, int level) {
    excerpt_t e;
    if (!json_is_array(v)) {
        return fail(d, KF_E_INVALID, "expected an array, got %s", excerpt(v, &e));
    }
    size_t count = json_array_size(v);
    /* An empty array nests nothing, so it adds no level: every response
     * (which holds all its lists, [] when empty) reads back as a request. */
    if (count > 0 && level + 1 > KF_JSON_DEPTH_MAX) {
        return fail_depth(d);
    }
    size_t size = value_size(f->type);
    char *items = NULL;
    if (count > 0) {
        if (count > SIZE_MAX / size) {
            return fail_memory(d);
        }
        items = kf_arena_zalloc(d->arena, count * size);
        if (items == NULL) {
            return fail_memory(d);
        }
    }
    for (size_t i = 0; i < count; i++) {
        json_t *item = json_array_get(v, i);
        size_t mark = path_push_index(&d->path, i);
        if (json_is_null(item)) {
            return fail(d, KF_E_INVALID, "null is not allowed in a repeated field");
        }
        kf_status_t status = decode_value(d, f, item, items + i * size, level + 1);
        if (status != KF_OK) {
            return status;
        }
        path_pop(&d->path, mark);
    }
    memcpy(field_quantifier(msg, f), &count, sizeof count);
    memcpy(field_slot(msg, f), &items, sizeof items);
    return KF_OK;
}

/* Adds one element to a repeated field (kf_message_set_text). */
static kf_status_t append_element(decoder_t *d, ProtobufCMessage *msg,
                                  const ProtobufCFieldDescriptor *f, json_t *v, int level) {
    size_t count;
    char *old_items;
    memcpy(&count, field_quantifier(msg, f), sizeof count);
    memcpy(&old_items, field_slot(msg, f), sizeof old_items);
    size_t size = value_size(f->type);
    if (count >= SIZE_MAX / size - 1) {
        return fail_memory(d);
    }
    char *items = kf_arena_zalloc(d->arena, (count + 1) * size);
    if (items == NULL) {
        return fail_memory(d);
    }
    if (count > 0) {
        memcpy(items, old_items, count * size);
    }
    kf_status_t status = decode_value(d, f, v, items + count * size, level);
    if (status != KF_OK) {
        return status;
    }
    count++;
    memcpy(field_quantifier(msg, f), &count, sizeof count);
    memcpy(field_slot(msg, f), &items, sizeof items);
    return KF_OK;
}

/* The embedded form of a `_json` field: any JSON value, null included (it is
 * a value here, not absence), stored as compact JSON text. */
static kf_status_t decode_embedded(decoder_t *d, ProtobufCMessage *msg,
                                   const ProtobufCFieldDescriptor *f, json_t *v, int level) {
    (void)level; /* an embedded value's own depth counts, as over gRPC */
    if (kf_json_deeper_than(v, KF_JSON_DEPTH_MAX)) {
        return fail_depth(d);
    }
    char *dumped = kf_json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (dumped == NULL) {
        return fail(d, KF_E_NOMEM, "out of memory re-serializing the value");
    }
    char *text = kf_arena_strdup(d->arena, dumped);
    free(dumped);
    if (text == NULL) {
        return fail_memory(d);
    }
    prepare_member(msg, f);
    memcpy(field_slot(msg, f), &text, sizeof text);
    mark_present(msg, f);
    return KF_OK;
}

static kf_status_t merge_member(decoder_t *d, ProtobufCMessage *msg,
                                const ProtobufCFieldDescriptor *f, form_t form, json_t *v,
                                int level) {
    if (form == FORM_EMBEDDED) {
        return decode_embedded(d, msg, f, v, level);
    }
    if (json_is_null(v)) {
        clear_field(msg, f);
        return KF_OK;
    }
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        return decode_repeated(d, msg, f, v, level);
    }
    return decode_singular(d, msg, f, v, level);
}

/* What one object has said about each field, to refuse a field given twice
 * under two spellings and two members of one oneof. */
typedef struct seen {
    const char *key; /* the key that named the field; borrowed from the object */
    bool valued;     /* not JSON null: counts as a oneof member that is set */
} seen_t;

static kf_status_t fail_unknown(decoder_t *d, const ProtobufCMessageDescriptor *desc) {
    char names[NAME_LIST_BYTES_MAX] = "";
    for (unsigned i = 0; i < desc->n_fields; i++) {
        char name[JSON_NAME_BYTES_MAX];
        emitted_name(desc, &desc->fields[i], name);
        list_append(names, sizeof names, name);
    }
    return fail(d, KF_E_INVALID, "unknown field (known: %s)", names[0] ? names : "none");
}

/* Merges the members of obj (at `level`) into msg. */
static kf_status_t merge_object(decoder_t *d, json_t *obj, ProtobufCMessage *msg, int level) {
    excerpt_t e;
    if (!json_is_object(obj)) {
        return fail(d, KF_E_INVALID, "expected an object, got %s", excerpt(obj, &e));
    }
    if (level > KF_JSON_DEPTH_MAX) {
        return fail_depth(d);
    }
    const ProtobufCMessageDescriptor *desc = msg->descriptor;
    KF_ASSERT(desc->magic == PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC);
    seen_t *seen = kf_arena_zalloc(d->arena, (desc->n_fields + 1) * sizeof *seen);
    if (seen == NULL) {
        return fail_memory(d);
    }
    const char *key;
    json_t *value;
    json_object_foreach(obj, key, value) {
        size_t mark = path_push_key(&d->path, key, strlen(key));
        form_t form;
        const ProtobufCFieldDescriptor *f = find_field(desc, key, &form);
        if (f == NULL) {
            return fail_unknown(d, desc);
        }
        size_t index = (size_t)(f - desc->fields);
        if (seen[index].key != NULL) {
            return fail(d, KF_E_INVALID, "the same field as \"%s\"; give it once", seen[index].key);
        }
        bool valued = form == FORM_EMBEDDED || !json_is_null(value);
        if (valued && (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0) {
            for (unsigned i = 0; i < desc->n_fields; i++) {
                const ProtobufCFieldDescriptor *g = &desc->fields[i];
                if (seen[i].valued && (g->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0 &&
                    g->quantifier_offset == f->quantifier_offset) {
                    return fail(d, KF_E_INVALID,
                                "\"%s\" and \"%s\" are members of one oneof; set at most one",
                                seen[i].key, key);
                }
            }
        }
        seen[index].key = key;
        seen[index].valued = valued;
        kf_status_t status = merge_member(d, msg, f, form, value, level);
        if (status != KF_OK) {
            return status;
        }
        path_pop(&d->path, mark);
    }
    return KF_OK;
}

/* ---- public: decoding ------------------------------------------------- */

kf_status_t kf_json_to_message(const char *json, size_t len, const ProtobufCMessageDescriptor *desc,
                               kf_arena_t *arena, ProtobufCMessage **out, kf_error_t *err) {
    KF_ASSERT(desc != NULL && arena != NULL && out != NULL);
    KF_ASSERT(json != NULL || len == 0);
    decoder_t d;
    decoder_init(&d, arena, err, "");
    ProtobufCMessage *msg = new_message(&d, desc);
    if (msg == NULL) {
        return fail_memory(&d);
    }
    size_t blank = 0;
    while (blank < len && (json[blank] == ' ' || json[blank] == '\t' || json[blank] == '\r' ||
                           json[blank] == '\n')) {
        blank++;
    }
    if (blank == len) {
        *out = msg; /* an empty body is {} */
        return KF_OK;
    }
    json_error_t jerr;
    json_t *root = json_loadb(json, len, KF_JSON_LOAD_FLAGS, &jerr);
    if (root == NULL) {
        return fail(&d, KF_E_INVALID, "not valid JSON: %s (line %d, column %d)", jerr.text,
                    jerr.line, jerr.column);
    }
    kf_status_t status = merge_object(&d, root, msg, 1);
    json_decref(root);
    if (status == KF_OK) {
        *out = msg;
    }
    return status;
}

kf_status_t kf_json_merge(json_t *obj, ProtobufCMessage *msg, const char *path, kf_arena_t *arena,
                          kf_error_t *err) {
    KF_ASSERT(obj != NULL && msg != NULL && arena != NULL);
    decoder_t d;
    decoder_init(&d, arena, err, path);
    return merge_object(&d, obj, msg, 1);
}

/* A parameter's text as the JSON value the body decoder expects: strings
 * for everything (integers, enums, base64 and numbers are accepted as
 * strings), true/false for bools, parsed JSON for an embedded `_json`. */
static kf_status_t text_to_jansson(decoder_t *d, const ProtobufCFieldDescriptor *f, form_t form,
                                   const char *text, json_t **out) {
    size_t len = strlen(text);
    if (form == FORM_EMBEDDED) {
        json_error_t jerr;
        *out = json_loadb(text, len, KF_JSON_LOAD_FLAGS, &jerr);
        if (*out == NULL) {
            return fail(d, KF_E_INVALID, "not valid JSON: %s", jerr.text);
        }
        return KF_OK;
    }
    if (f->type == PROTOBUF_C_TYPE_BOOL &&
        (strcmp(text, "true") == 0 || strcmp(text, "false") == 0)) {
        *out = text[0] == 't' ? json_true() : json_false(); /* as OpenAPI writes a boolean */
        return KF_OK;
    }
    *out = json_stringn(text, len);
    if (*out == NULL) {
        return fail(d, KF_E_INVALID, "not valid UTF-8");
    }
    return KF_OK;
}

kf_status_t kf_message_set_text(ProtobufCMessage *msg, const char *name, const char *text,
                                kf_arena_t *arena, kf_error_t *err) {
    return kf_message_set_text_as(msg, name, text, KF_SET_REPLACE, arena, err);
}

kf_status_t kf_message_set_text_as(ProtobufCMessage *msg, const char *name, const char *text,
                                   kf_set_mode_t mode, kf_arena_t *arena, kf_error_t *err) {
    KF_ASSERT(msg != NULL && name != NULL && text != NULL && arena != NULL);
    decoder_t d;
    decoder_init(&d, arena, err, "");
    const char *segment = name;
    for (int level = 1;; level++) {
        const char *dot = strchr(segment, '.');
        size_t segment_len = dot != NULL ? (size_t)(dot - segment) : strlen(segment);
        char key[JSON_NAME_BYTES_MAX];
        if (segment_len == 0 || segment_len >= sizeof key) {
            decoder_init(&d, arena, err, name);
            return fail(&d, KF_E_INVALID, "not a field name or dotted path of field names");
        }
        memcpy(key, segment, segment_len);
        key[segment_len] = '\0';
        path_push_key(&d.path, segment, segment_len);
        form_t form;
        const ProtobufCFieldDescriptor *f = find_field(msg->descriptor, key, &form);
        if (f == NULL) {
            return fail_unknown(&d, msg->descriptor);
        }
        if (dot == NULL) {
            if (form == FORM_DIRECT && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                return fail(&d, KF_E_INVALID, "is a message; set one of its fields (%s.<field>)",
                            name);
            }
            if (mode != KF_SET_REPLACE && f->label != PROTOBUF_C_LABEL_REPEATED &&
                field_is_present(msg, f)) {
                if (mode == KF_SET_DEFAULT) {
                    return KF_OK;
                }
                const char *held = NULL;
                if (form == FORM_DIRECT && f->type == PROTOBUF_C_TYPE_STRING) {
                    memcpy(&held, field_slot(msg, f), sizeof held);
                }
                if (held == NULL || strcmp(held, text) != 0) {
                    return fail(&d, KF_E_INVALID,
                                "given more than once (in the path, the query or the body)");
                }
                return KF_OK;
            }
            json_t *v;
            kf_status_t status = text_to_jansson(&d, f, form, text, &v);
            if (status != KF_OK) {
                return status;
            }
            if (form == FORM_EMBEDDED) {
                status = decode_embedded(&d, msg, f, v, level);
            } else if (f->label == PROTOBUF_C_LABEL_REPEATED) {
                status = append_element(&d, msg, f, v, level);
            } else {
                status = decode_singular(&d, msg, f, v, level);
            }
            json_decref(v);
            return status;
        }
        if (form != FORM_DIRECT || f->type != PROTOBUF_C_TYPE_MESSAGE ||
            f->label == PROTOBUF_C_LABEL_REPEATED) {
            return fail(&d, KF_E_INVALID, "not a singular message field, so \"%s\" cannot be set",
                        name);
        }
        if (level >= KF_JSON_DEPTH_MAX) {
            return fail_depth(&d);
        }
        prepare_member(msg, f);
        ProtobufCMessage *sub;
        memcpy(&sub, field_slot(msg, f), sizeof sub);
        if (sub == NULL) {
            sub = new_message(&d, f->descriptor);
            if (sub == NULL) {
                return fail_memory(&d);
            }
            memcpy(field_slot(msg, f), &sub, sizeof sub);
        }
        mark_present(msg, f);
        msg = sub;
        segment = dot + 1;
    }
}

/* ---- encoding --------------------------------------------------------- */

/* The length of the well-formed UTF-8 sequence (RFC 3629) at s, 0 if none. */
static size_t utf8_sequence_len(const unsigned char *s, size_t avail) {
    unsigned char c = s[0];
    unsigned char low = 0x80;
    unsigned char high = 0xbf;
    size_t len;
    if (c < 0x80) {
        return 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        low = c == 0xe0 ? 0xa0 : low;   /* no overlongs */
        high = c == 0xed ? 0x9f : high; /* no surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        low = c == 0xf0 ? 0x90 : low;
        high = c == 0xf4 ? 0x8f : high; /* nothing past U+10FFFF */
    } else {
        return 0;
    }
    if (avail < len || s[1] < low || s[1] > high) {
        return 0;
    }
    for (size_t k = 2; k < len; k++) {
        if ((s[k] & 0xc0) != 0x80) {
            return 0;
        }
    }
    return len;
}

/* A string value. protobuf-c does not check UTF-8, so a string that came in
 * over gRPC may not be; jansson refuses those, and one bad string must not
 * fail a whole response, so invalid bytes become U+FFFD. */
static json_t *string_to_jansson(const char *text, size_t len) {
    json_t *v = json_stringn(text, len);
    if (v != NULL || len > SIZE_MAX / 3) {
        return v;
    }
    char *fixed = malloc(len * 3 + 1);
    if (fixed == NULL) {
        return NULL;
    }
    const unsigned char *in = (const unsigned char *)text;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t n = utf8_sequence_len(in + i, len - i);
        if (n == 0) {
            memcpy(fixed + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        } else {
            memcpy(fixed + o, in + i, n);
            o += n;
            i += n;
        }
    }
    v = json_stringn(fixed, o);
    free(fixed);
    return v;
}

/* proto3 JSON spells the non-finite values as strings. */
static json_t *message_to_jansson(const ProtobufCMessage *msg);

/* One value of f's type at slot; NULL when jansson is out of memory. */
static json_t *value_to_jansson(const ProtobufCFieldDescriptor *f, const void *slot) {
    char digits[24];
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32: {
        int32_t value;
        memcpy(&value, slot, sizeof value);
        return json_integer(value);
    }
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32: {
        uint32_t value;
        memcpy(&value, slot, sizeof value);
        return json_integer((json_int_t)value);
    }
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64: {
        /* As strings: JavaScript clients would round numbers past 2^53. */
        int64_t value;
        memcpy(&value, slot, sizeof value);
        return kf_json_int64(value);
    }
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: {
        uint64_t value;
        memcpy(&value, slot, sizeof value);
        snprintf(digits, sizeof digits, "%" PRIu64, value);
        return json_string(digits);
    }
    case PROTOBUF_C_TYPE_FLOAT: {
        float value;
        memcpy(&value, slot, sizeof value);
        return isfinite(value) ? kf_json_double(float_as_double(value))
                               : kf_json_double((double)value);
    }
    case PROTOBUF_C_TYPE_DOUBLE: {
        double value;
        memcpy(&value, slot, sizeof value);
        return kf_json_double(value);
    }
    case PROTOBUF_C_TYPE_BOOL: {
        protobuf_c_boolean value;
        memcpy(&value, slot, sizeof value);
        return json_boolean(value);
    }
    case PROTOBUF_C_TYPE_ENUM: {
        /* Numbers this build does not know (proto3 enums are open) stay
         * numbers rather than being dropped. */
        int value;
        memcpy(&value, slot, sizeof value);
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, value);
        return ev != NULL ? json_string(ev->name) : json_integer(value);
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *text;
        memcpy(&text, slot, sizeof text);
        return text != NULL ? string_to_jansson(text, strlen(text)) : json_string("");
    }
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData data;
        memcpy(&data, slot, sizeof data);
        return kf_json_bytes(data.data, data.len);
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub;
        memcpy(&sub, slot, sizeof sub);
        KF_ASSERT(sub != NULL); /* a NULL element in a repeated message field */
        return message_to_jansson(sub);
    }
    }
    KF_UNREACHABLE();
}

static json_t *repeated_to_jansson(const ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f) {
    size_t count;
    const char *items;
    memcpy(&count, field_quantifier_const(msg, f), sizeof count);
    memcpy(&items, field_slot_const(msg, f), sizeof items);
    json_t *array = json_array();
    if (array == NULL) {
        return NULL;
    }
    size_t size = value_size(f->type);
    for (size_t i = 0; i < count; i++) {
        if (json_array_append_new(array, value_to_jansson(f, items + i * size)) != 0) {
            json_decref(array);
            return NULL;
        }
    }
    return array;
}

/* A `_json` field: its text embedded as a value under the short name, or,
 * when the text is not JSON (it came in over gRPC unchecked) or nests
 * deeper than the decoder takes (KF_JSON_DEPTH_MAX), the text as a string
 * under the full name, so that the response is still valid and says
 * which form it is. Empty text reaches here only as a oneof member whose
 * case is set, and is shown as null, which the engine takes it to mean. */
static json_t *json_text_to_jansson(const ProtobufCFieldDescriptor *f, const void *slot,
                                    size_t base_len, char key[JSON_NAME_BYTES_MAX]) {
    const char *text;
    memcpy(&text, slot, sizeof text);
    camel_name(f->name, base_len, key);
    if (text == NULL || text[0] == '\0') {
        return json_null();
    }
    json_t *v = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (v != NULL && !kf_json_deeper_than(v, KF_JSON_DEPTH_MAX)) {
        return v;
    }
    /* Not JSON, or deeper than the decoder takes back: the string form, so
     * that the response can be read again as a request. */
    json_decref(v);
    camel_name(f->name, strlen(f->name), key);
    return string_to_jansson(text, strlen(text));
}

static json_t *message_to_jansson(const ProtobufCMessage *msg) {
    const ProtobufCMessageDescriptor *desc = msg->descriptor;
    KF_ASSERT(desc->magic == PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC);
    json_t *obj = json_object();
    if (obj == NULL) {
        return NULL;
    }
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        /* A repeated field is always there, [] when empty, so that a
         * client can iterate it without a presence check (`jq '.runs[]'`). */
        if (f->label != PROTOBUF_C_LABEL_REPEATED && !field_is_present(msg, f)) {
            continue;
        }
        char key[JSON_NAME_BYTES_MAX];
        json_t *v;
        size_t base_len = json_text_base_len(desc, f);
        if (base_len > 0) {
            v = json_text_to_jansson(f, field_slot_const(msg, f), base_len, key);
        } else if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            camel_name(f->name, strlen(f->name), key);
            v = repeated_to_jansson(msg, f);
        } else {
            camel_name(f->name, strlen(f->name), key);
            v = value_to_jansson(f, field_slot_const(msg, f));
        }
        /* json_object_set_new takes v even when it fails. */
        if (v == NULL || json_object_set_new(obj, key, v) != 0) {
            json_decref(obj);
            return NULL;
        }
    }
    return obj;
}

/* ---- public: encoding ------------------------------------------------- */

json_t *kf_message_to_jansson(const ProtobufCMessage *msg) {
    KF_ASSERT(msg != NULL);
    return message_to_jansson(msg);
}

char *kf_message_to_json(const ProtobufCMessage *msg, kf_arena_t *arena, size_t *len) {
    KF_ASSERT(msg != NULL && arena != NULL);
    json_t *v = message_to_jansson(msg);
    if (v == NULL) {
        return NULL;
    }
    char *dumped = kf_json_dumps(v, JSON_COMPACT);
    json_decref(v);
    if (dumped == NULL) {
        return NULL;
    }
    size_t dumped_len = strlen(dumped);
    char *text = kf_arena_strndup(arena, dumped, dumped_len);
    free(dumped);
    if (text != NULL && len != NULL) {
        *len = dumped_len;
    }
    return text;
}
