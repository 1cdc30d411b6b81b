/*
 * reflection.c - gRPC server reflection's index and answers (reflection.h).
 *
 * The index: every file of the descriptor set, serialized on its own (what
 * a FileDescriptorResponse carries), with the indexes of the files it
 * imports; and every symbol (fully qualified, without the leading dot) with
 * the file defining it, sorted for binary search. v1 and v1alpha requests
 * are decoded with v1's generated code: the two protos differ only in their
 * package, so the bytes on the wire are the same.
 */
#include "rpc/reflection.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "descriptor_set.h"
#include "google/protobuf/descriptor.pb-c.h"
#include "grpc/reflection/v1/reflection.pb-c.h"
#include "proto/methods.h"

/* The API is a handful of files with a few hundred definitions; these are
 * far above it and bound the index and every closure walk. */
#define FILES_MAX        64
#define SYMBOLS_MAX      4096
#define NESTING_MAX      16
#define SYMBOL_BYTES_MAX 512

/* gRPC status codes an ErrorResponse carries. */
#define CODE_INVALID_ARGUMENT 3
#define CODE_NOT_FOUND        5

typedef enum symbol_kind {
    SYMBOL_MESSAGE,
    SYMBOL_OTHER, /* enum, service, method */
} symbol_kind_t;

typedef struct symbol {
    char *name; /* "keyflow.v1.Runs.GetRun"; owned */
    int file;
    symbol_kind_t kind;
} symbol_t;

typedef struct file {
    const char *name; /* in the unpacked set */
    uint8_t *bytes;   /* the FileDescriptorProto alone; owned */
    size_t len;
    int deps[FILES_MAX];
    size_t dep_count;
} file_t;

struct kf_reflection {
    Google__Protobuf__FileDescriptorSet *set;
    file_t files[FILES_MAX];
    size_t file_count;
    symbol_t *symbols;
    size_t symbol_count;
};

static kf_status_t add_symbol(kf_reflection_t *r, const char *scope, const char *name, int file,
                              symbol_kind_t kind, kf_error_t *err) {
    if (r->symbol_count == SYMBOLS_MAX) {
        return kf_error_set(err, KF_E_CORRUPT, "reflection: more than %d symbols", SYMBOLS_MAX);
    }
    char full[SYMBOL_BYTES_MAX];
    int n = snprintf(full, sizeof full, "%s%s%s", scope, scope[0] ? "." : "", name);
    if (n < 0 || (size_t)n >= sizeof full) {
        return kf_error_set(err, KF_E_CORRUPT, "reflection: symbol %s.%s is too long", scope, name);
    }
    symbol_t *s = &r->symbols[r->symbol_count++];
    s->name = kf_xstrdup(full);
    s->file = file;
    s->kind = kind;
    return KF_OK;
}

/* An enum and its values. As in protobuf's own scoping (and the reference
 * servers' descriptor pools), a value is a sibling of its enum, not a
 * member: keyflow.v1.RUN_STATUS_PENDING, not keyflow.v1.RunStatus.RUN_... */
static kf_status_t add_enum(kf_reflection_t *r, const char *scope,
                            const Google__Protobuf__EnumDescriptorProto *e, int file,
                            kf_error_t *err) {
    kf_status_t st = add_symbol(r, scope, e->name, file, SYMBOL_OTHER, err);
    for (size_t i = 0; st == KF_OK && i < e->n_value; i++) {
        st = add_symbol(r, scope, e->value[i]->name, file, SYMBOL_OTHER, err);
    }
    return st;
}

/* A message, its fields and oneofs (Message.field), its nested messages
 * and enums. `depth` bounds the recursion (protoc allows deep nesting; the
 * API nests two levels). */
static kf_status_t add_message(kf_reflection_t *r, const char *scope,
                               const Google__Protobuf__DescriptorProto *m, int file, int depth,
                               kf_error_t *err) {
    if (depth > NESTING_MAX) {
        return kf_error_set(err, KF_E_CORRUPT, "reflection: %s.%s nests too deep", scope, m->name);
    }
    kf_status_t st = add_symbol(r, scope, m->name, file, SYMBOL_MESSAGE, err);
    if (st != KF_OK) {
        return st;
    }
    const char *self = r->symbols[r->symbol_count - 1].name;
    for (size_t i = 0; st == KF_OK && i < m->n_field; i++) {
        st = add_symbol(r, self, m->field[i]->name, file, SYMBOL_OTHER, err);
    }
    for (size_t i = 0; st == KF_OK && i < m->n_oneof_decl; i++) {
        st = add_symbol(r, self, m->oneof_decl[i]->name, file, SYMBOL_OTHER, err);
    }
    for (size_t i = 0; st == KF_OK && i < m->n_enum_type; i++) {
        st = add_enum(r, self, m->enum_type[i], file, err);
    }
    for (size_t i = 0; st == KF_OK && i < m->n_nested_type; i++) {
        st = add_message(r, self, m->nested_type[i], file, depth + 1, err);
    }
    return st;
}

static kf_status_t add_file(kf_reflection_t *r, const Google__Protobuf__FileDescriptorProto *f,
                            int file, kf_error_t *err) {
    const char *package = f->package != NULL ? f->package : "";
    kf_status_t st = KF_OK;
    for (size_t i = 0; st == KF_OK && i < f->n_message_type; i++) {
        st = add_message(r, package, f->message_type[i], file, 0, err);
    }
    for (size_t i = 0; st == KF_OK && i < f->n_enum_type; i++) {
        st = add_enum(r, package, f->enum_type[i], file, err);
    }
    for (size_t i = 0; st == KF_OK && i < f->n_service; i++) {
        const Google__Protobuf__ServiceDescriptorProto *svc = f->service[i];
        st = add_symbol(r, package, svc->name, file, SYMBOL_OTHER, err);
        const char *service = st == KF_OK ? r->symbols[r->symbol_count - 1].name : "";
        for (size_t k = 0; st == KF_OK && k < svc->n_method; k++) {
            st = add_symbol(r, service, svc->method[k]->name, file, SYMBOL_OTHER, err);
        }
    }
    return st;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const symbol_t *)a)->name, ((const symbol_t *)b)->name);
}

static int file_index(const kf_reflection_t *r, const char *name) {
    for (size_t i = 0; i < r->file_count; i++) {
        if (strcmp(r->files[i].name, name) == 0) {
            return (int)i;
        }
    }
    return -1;
}

kf_status_t kf_reflection_create(kf_reflection_t **out, kf_error_t *err) {
    kf_reflection_t *r = kf_xcalloc(1, sizeof *r);
    r->symbols = kf_xcalloc(SYMBOLS_MAX, sizeof *r->symbols);
    r->set = google__protobuf__file_descriptor_set__unpack(NULL, kf_api_descriptor_set_bytes,
                                                           kf_api_descriptor_set);
    kf_status_t st = KF_OK;
    if (r->set == NULL) {
        st = kf_error_set(err, KF_E_CORRUPT,
                          "reflection: the embedded descriptor set is unreadable");
    } else if (r->set->n_file > FILES_MAX) {
        st = kf_error_set(err, KF_E_CORRUPT, "reflection: more than %d files", FILES_MAX);
    }
    for (size_t i = 0; st == KF_OK && i < r->set->n_file; i++) {
        const Google__Protobuf__FileDescriptorProto *f = r->set->file[i];
        file_t *file = &r->files[r->file_count++];
        file->name = f->name;
        file->len = google__protobuf__file_descriptor_proto__get_packed_size(f);
        file->bytes = kf_xmalloc(file->len);
        google__protobuf__file_descriptor_proto__pack(f, file->bytes);
        st = add_file(r, f, (int)i, err);
    }
    /* Imports come before the files that import them in a set protoc
     * writes with --include_imports, but look them up by name anyway. */
    for (size_t i = 0; st == KF_OK && i < r->file_count; i++) {
        const Google__Protobuf__FileDescriptorProto *f = r->set->file[i];
        for (size_t k = 0; st == KF_OK && k < f->n_dependency; k++) {
            int dep = file_index(r, f->dependency[k]);
            if (dep < 0) {
                st = kf_error_set(err, KF_E_CORRUPT, "reflection: %s imports %s, which is missing",
                                  f->name, f->dependency[k]);
            } else {
                r->files[i].deps[r->files[i].dep_count++] = dep;
            }
        }
    }
    if (st != KF_OK) {
        kf_reflection_destroy(r);
        return st;
    }
    qsort(r->symbols, r->symbol_count, sizeof *r->symbols, by_name);
    for (size_t i = 1; i < r->symbol_count; i++) {
        /* protoc refuses a name defined twice in one scope; across files,
         * the set would be unusable. Either way a build error. */
        KF_ASSERT(strcmp(r->symbols[i - 1].name, r->symbols[i].name) != 0);
    }
    *out = r;
    return KF_OK;
}

void kf_reflection_destroy(kf_reflection_t *r) {
    if (r == NULL) {
        return;
    }
    for (size_t i = 0; i < r->symbol_count; i++) {
        free(r->symbols[i].name);
    }
    free(r->symbols);
    for (size_t i = 0; i < r->file_count; i++) {
        free(r->files[i].bytes);
    }
    if (r->set != NULL) {
        google__protobuf__file_descriptor_set__free_unpacked(r->set, NULL);
    }
    free(r);
}

static const symbol_t *find_symbol(const kf_reflection_t *r, const char *name) {
    if (name[0] == '.') {
        name++; /* ".keyflow.v1.Run", as type names are written in descriptors */
    }
    symbol_t key = {.name = (char *)name};
    return bsearch(&key, r->symbols, r->symbol_count, sizeof *r->symbols, by_name);
}

/* ---- the request's own bytes ---------------------------------------------- */

/* protobuf-c keeps a string NUL-terminated without its length, so "h\0x"
 * arrives as "h". The answer echoes valid_host and original_request, and
 * looks names up, from the request's bytes instead, as a reference server
 * (which keeps the length) would. */

static bool read_varint(const uint8_t *p, size_t len, size_t *at, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && *at < len; shift += 7) {
        uint8_t b = p[(*at)++];
        v |= (uint64_t)(b & 0x7f) << shift;
        if ((b & 0x80) == 0) {
            *out = v;
            return true;
        }
    }
    return false;
}

/* The bytes of the last occurrence of length-delimited field `number` at
 * the top level of a message (the one protobuf keeps), or false when the
 * message has none or its bytes do not walk. */
static bool raw_field(const uint8_t *p, size_t len, uint32_t number, const uint8_t **value,
                      size_t *value_len) {
    bool found = false;
    size_t at = 0;
    while (at < len) {
        uint64_t key, size;
        if (!read_varint(p, len, &at, &key)) {
            return false;
        }
        switch (key & 7) {
        case 0:
            if (!read_varint(p, len, &at, &size)) {
                return false;
            }
            break;
        case 1: size = 8; goto skip;
        case 5: size = 4; goto skip;
        case 2:
            if (!read_varint(p, len, &at, &size)) {
                return false;
            }
            if ((key >> 3) == number && size <= len - at) {
                *value = p + at;
                *value_len = (size_t)size;
                found = true;
            }
        skip:
            if (size > len - at) {
                return false;
            }
            at += (size_t)size;
            break;
        default: return false; /* groups: not in this protocol */
        }
    }
    return found;
}

/* Whether the string the request holds in field `number` is `text` whole:
 * false when its bytes hold a NUL that cut `text` short (such a name names
 * nothing). */
static bool string_is_whole(const uint8_t *request, size_t len, uint32_t number, const char *text) {
    const uint8_t *raw;
    size_t raw_len;
    return !raw_field(request, len, number, &raw, &raw_len) || raw_len == strlen(text);
}

static size_t varint_size(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* Appends field `number` (length-delimited) holding bytes[0..n). */
static uint8_t *put_bytes(uint8_t *p, uint32_t number, const uint8_t *bytes, size_t n) {
    p = put_varint(p, (uint64_t)number << 3 | 2);
    p = put_varint(p, n);
    memcpy(p, bytes, n);
    return p + n;
}

/* ---- answers ------------------------------------------------------------- */

typedef Grpc__Reflection__V1__ServerReflectionRequest request_t;
typedef Grpc__Reflection__V1__ServerReflectionResponse response_t;

static void answer_error(response_t *resp, kf_arena_t *arena, int code, const char *message) {
    Grpc__Reflection__V1__ErrorResponse *e = kf_arena_new(arena, sizeof *e);
    KF_ASSERT(e != NULL);
    grpc__reflection__v1__error_response__init(e);
    e->error_code = code;
    e->error_message = kf_arena_strdup(arena, message);
    KF_ASSERT(e->error_message != NULL);
    resp->message_response_case =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
    resp->error_response = e;
}

/* The file and every file it imports, transitively, the file first. */
static void answer_file(const kf_reflection_t *r, response_t *resp, kf_arena_t *arena, int file) {
    int order[FILES_MAX];
    bool seen[FILES_MAX] = {false};
    size_t count = 0;
    order[count++] = file;
    seen[file] = true;
    for (size_t i = 0; i < count; i++) { /* breadth first; each file once */
        const file_t *f = &r->files[order[i]];
        for (size_t k = 0; k < f->dep_count; k++) {
            if (!seen[f->deps[k]]) {
                KF_ASSERT(count < FILES_MAX);
                seen[f->deps[k]] = true;
                order[count++] = f->deps[k];
            }
        }
    }
    Grpc__Reflection__V1__FileDescriptorResponse *fr = kf_arena_new(arena, sizeof *fr);
    ProtobufCBinaryData *protos = kf_arena_new(arena, count * sizeof *protos);
    KF_ASSERT(fr != NULL && protos != NULL);
    grpc__reflection__v1__file_descriptor_response__init(fr);
    for (size_t i = 0; i < count; i++) {
        protos[i].data = r->files[order[i]].bytes; /* borrowed: lives as long as the index */
        protos[i].len = r->files[order[i]].len;
    }
    fr->n_file_descriptor_proto = count;
    fr->file_descriptor_proto = protos;
    resp->message_response_case =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
    resp->file_descriptor_response = fr;
}

static void answer_services(response_t *resp, kf_arena_t *arena) {
    Grpc__Reflection__V1__ServiceResponse **list =
        kf_arena_new(arena, KF_METHOD_COUNT * sizeof *list);
    KF_ASSERT(list != NULL);
    size_t count = 0;
    for (size_t i = 0; i < KF_METHOD_COUNT; i++) {
        bool listed = false;
        for (size_t k = 0; k < count && !listed; k++) {
            listed = strcmp(list[k]->name, kf_methods[i].service) == 0;
        }
        if (!listed) {
            list[count] = kf_arena_new(arena, sizeof *list[count]);
            KF_ASSERT(list[count] != NULL);
            grpc__reflection__v1__service_response__init(list[count]);
            list[count]->name = (char *)kf_methods[i].service;
            count++;
        }
    }
    Grpc__Reflection__V1__ListServiceResponse *ls = kf_arena_new(arena, sizeof *ls);
    KF_ASSERT(ls != NULL);
    grpc__reflection__v1__list_service_response__init(ls);
    ls->n_service = count;
    ls->service = list;
    resp->message_response_case =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
    resp->list_services_response = ls;
}

static void answer_extensions(const kf_reflection_t *r, response_t *resp, kf_arena_t *arena,
                              const char *type) {
    const symbol_t *s = find_symbol(r, type);
    if (s == NULL || s->kind != SYMBOL_MESSAGE) {
        char message[SYMBOL_BYTES_MAX + 64];
        snprintf(message, sizeof message, "all_extension_numbers_of_type: no message type %.*s",
                 SYMBOL_BYTES_MAX, type);
        answer_error(resp, arena, CODE_NOT_FOUND, message);
        return;
    }
    Grpc__Reflection__V1__ExtensionNumberResponse *en = kf_arena_new(arena, sizeof *en);
    KF_ASSERT(en != NULL);
    grpc__reflection__v1__extension_number_response__init(en);
    en->base_type_name = s->name; /* no extension numbers: the API defines none */
    resp->message_response_case =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ALL_EXTENSION_NUMBERS_RESPONSE;
    resp->all_extension_numbers_response = en;
}

/* The name a request looks up (a file, a symbol, a type), or NULL. */
static const char *name_asked(const request_t *req) {
    switch (req->message_request_case) {
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
        return req->file_by_filename;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
        return req->file_containing_symbol;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
        return req->all_extension_numbers_of_type;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES:
        return NULL; /* its text means nothing */
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST__NOT_SET: return NULL;
    default:
        /* protobuf-c's enum also has a _PROTOBUF_C_..._IS_INT_SIZE member. */
        KF_UNREACHABLE();
    }
}

static const char *request_field_name(const request_t *req) {
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(
        req->base.descriptor, (unsigned)req->message_request_case);
    KF_ASSERT(f != NULL);
    return f->name;
}

/* The answer to one decoded request, into resp. */
static void answer(const kf_reflection_t *r, const request_t *req, response_t *resp,
                   kf_arena_t *arena) {
    char message[SYMBOL_BYTES_MAX + 64];
    switch (req->message_request_case) {
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES:
        answer_services(resp, arena);
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME: {
        int file = file_index(r, req->file_by_filename);
        if (file >= 0) {
            answer_file(r, resp, arena, file);
        } else {
            snprintf(message, sizeof message, "file_by_filename: no file %.*s", SYMBOL_BYTES_MAX,
                     req->file_by_filename);
            answer_error(resp, arena, CODE_NOT_FOUND, message);
        }
        break;
    }
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL: {
        const symbol_t *s = find_symbol(r, req->file_containing_symbol);
        if (s != NULL) {
            answer_file(r, resp, arena, s->file);
        } else {
            snprintf(message, sizeof message, "file_containing_symbol: no symbol %.*s",
                     SYMBOL_BYTES_MAX, req->file_containing_symbol);
            answer_error(resp, arena, CODE_NOT_FOUND, message);
        }
        break;
    }
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
        answer_error(resp, arena, CODE_NOT_FOUND,
                     "file_containing_extension: keyflow's API defines no extensions");
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
        answer_extensions(r, resp, arena, req->all_extension_numbers_of_type);
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST__NOT_SET:
        answer_error(resp, arena, CODE_INVALID_ARGUMENT,
                     "message_request: none of its fields is set");
        break;
    default:
        /* protobuf-c's enum also has a _PROTOBUF_C_..._IS_INT_SIZE member. */
        KF_UNREACHABLE();
    }
}

kf_status_t kf_reflection_answer(const kf_reflection_t *r, const uint8_t *bytes, size_t len,
                                 kf_arena_t *arena, uint8_t **out, size_t *out_len,
                                 kf_error_t *err) {
    request_t *req =
        grpc__reflection__v1__server_reflection_request__unpack(kf_arena_pb(arena), len, bytes);
    if (req == NULL) {
        return kf_error_set(err, KF_E_INVALID, "request: not a ServerReflectionRequest");
    }
    response_t resp = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__INIT;
    /* valid_host (1) and original_request (2) are appended below, from the
     * request's bytes. */
    const uint8_t *host = NULL;
    size_t host_len = 0;
    if (!raw_field(bytes, len, 1, &host, &host_len)) {
        host_len = 0;
    }
    char message[SYMBOL_BYTES_MAX + 64];
    const char *name = name_asked(req);
    if (name != NULL && !string_is_whole(bytes, len, (uint32_t)req->message_request_case, name)) {
        snprintf(message, sizeof message, "%s: holds a NUL byte, which no name does",
                 request_field_name(req));
        answer_error(&resp, arena, CODE_NOT_FOUND, message);
    } else {
        answer(r, req, &resp, arena);
    }
    size_t n = grpc__reflection__v1__server_reflection_response__get_packed_size(&resp);
    size_t echo = 1 + varint_size(len) + len;
    if (host_len > 0) {
        echo += 1 + varint_size(host_len) + host_len; /* proto3: an empty host is absent */
    }
    uint8_t *buf = kf_arena_alloc(arena, n + echo);
    if (buf == NULL) {
        return kf_error_set(err, KF_E_TOO_LARGE, "response: larger than the call's arena");
    }
    size_t packed = grpc__reflection__v1__server_reflection_response__pack(&resp, buf);
    KF_ASSERT(packed == n);
    /* Fields may come in any order on the wire: the echoes go last. */
    uint8_t *end = buf + n;
    if (host_len > 0) {
        end = put_bytes(end, 1, host, host_len);
    }
    end = put_bytes(end, 2, bytes, len);
    KF_ASSERT((size_t)(end - buf) == n + echo);
    *out = buf;
    *out_len = n + echo;
    return KF_OK;
}
