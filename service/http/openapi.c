/*
 * openapi.c - the OpenAPI document, from the route table, the RPC table and
 * the protos (openapi.h). Built once, with jansson, when the gateway starts.
 */
#include "http/openapi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/json.h"
#include "descriptor_set.h"
#include "google/protobuf/descriptor.pb-c.h"
#include "http/routes.h"
#include "proto/json_map.h"
#include "proto/methods.h"

/* Nesting of messages a query parameter may reach into ("a.b.c"), and of
 * comments' paths: the API nests two levels. */
#define QUERY_DEPTH_MAX  3
#define COMMENT_PATH_MAX 16
#define NAME_BYTES_MAX   256

/* ---- comments from the descriptor set -------------------------------------- */

static void put_comment(json_t *comments, const char *name,
                        const Google__Protobuf__SourceCodeInfo__Location *loc) {
    const char *text =
        loc->leading_comments != NULL ? loc->leading_comments : loc->trailing_comments;
    if (text == NULL) {
        return;
    }
    /* One paragraph: line breaks and the indentation after them become
     * single spaces. */
    size_t n = strlen(text);
    char *flat = kf_xmalloc(n + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char c = text[i] == '\n' ? ' ' : text[i];
        if (c == ' ' && (o == 0 || flat[o - 1] == ' ')) {
            continue;
        }
        flat[o++] = c;
    }
    while (o > 0 && flat[o - 1] == ' ') {
        o--;
    }
    flat[o] = '\0';
    if (o > 0) {
        json_object_set_new(comments, name, json_string(flat));
    }
    free(flat);
}

/* The fully qualified name a location's path points at (a message, a
 * field "msg.field", an enum, a service or a method), or false. */
static bool location_name(const Google__Protobuf__FileDescriptorProto *f, const int32_t *path,
                          size_t n, char *out, size_t cap) {
    if (n < 2 || n > COMMENT_PATH_MAX) {
        return false;
    }
    const char *package = f->package != NULL ? f->package : "";
    if (path[0] == 6 && (size_t)path[1] < f->n_service) { /* service, method */
        const Google__Protobuf__ServiceDescriptorProto *s = f->service[path[1]];
        if (n == 2) {
            snprintf(out, cap, "%s.%s", package, s->name);
            return true;
        }
        if (n == 4 && path[2] == 2 && (size_t)path[3] < s->n_method) {
            snprintf(out, cap, "%s.%s.%s", package, s->name, s->method[path[3]]->name);
            return true;
        }
        return false;
    }
    if (path[0] == 5 && (size_t)path[1] < f->n_enum_type && n == 2) {
        snprintf(out, cap, "%s.%s", package, f->enum_type[path[1]]->name);
        return true;
    }
    if (path[0] != 4 || (size_t)path[1] >= f->n_message_type) {
        return false;
    }
    const Google__Protobuf__DescriptorProto *m = f->message_type[path[1]];
    int len = snprintf(out, cap, "%s.%s", package, m->name);
    size_t i = 2;
    while (i + 1 < n && path[i] == 3 && (size_t)path[i + 1] < m->n_nested_type) {
        m = m->nested_type[path[i + 1]];
        len += snprintf(out + len, cap - (size_t)len, ".%s", m->name);
        i += 2;
    }
    if (i == n) {
        return true;
    }
    if (i + 2 == n && path[i] == 2 && (size_t)path[i + 1] < m->n_field) {
        snprintf(out + len, cap - (size_t)len, ".%s", m->field[path[i + 1]]->name);
        return true;
    }
    if (i + 2 == n && path[i] == 4 && (size_t)path[i + 1] < m->n_enum_type) {
        snprintf(out + len, cap - (size_t)len, ".%s", m->enum_type[path[i + 1]]->name);
        return true;
    }
    return false;
}

/* name -> comment, for every commented definition of the API. */
static json_t *read_comments(kf_error_t *err) {
    Google__Protobuf__FileDescriptorSet *set = google__protobuf__file_descriptor_set__unpack(
        NULL, kf_api_descriptor_set_bytes, kf_api_descriptor_set);
    if (set == NULL) {
        kf_error_set(err, KF_E_CORRUPT, "openapi: the embedded descriptor set is unreadable");
        return NULL;
    }
    json_t *comments = json_object();
    for (size_t i = 0; i < set->n_file; i++) {
        const Google__Protobuf__FileDescriptorProto *f = set->file[i];
        if (f->source_code_info == NULL) {
            continue;
        }
        for (size_t k = 0; k < f->source_code_info->n_location; k++) {
            const Google__Protobuf__SourceCodeInfo__Location *loc =
                f->source_code_info->location[k];
            char name[NAME_BYTES_MAX];
            if (location_name(f, loc->path, loc->n_path, name, sizeof name)) {
                put_comment(comments, name, loc);
            }
        }
    }
    google__protobuf__file_descriptor_set__free_unpacked(set, NULL);
    return comments;
}

/* ---- schemas ----------------------------------------------------------------- */

typedef struct doc {
    json_t *root;
    json_t *schemas;  /* components.schemas, filled as messages are met */
    json_t *comments; /* name -> text */
} doc_t;

static void describe(json_t *schema, const doc_t *d, const char *name) {
    json_t *text = json_object_get(d->comments, name);
    if (text != NULL) {
        json_object_set(schema, "description", text);
    }
}

static json_t *ref_to(const char *name) {
    char ref[NAME_BYTES_MAX];
    snprintf(ref, sizeof ref, "#/components/schemas/%s", name);
    return json_pack("{s:s}", "$ref", ref);
}

static void add_message(doc_t *d, const ProtobufCMessageDescriptor *desc);

/* Enum values a request field refuses although the enum has them (the
 * engine's checks: a coordinator is debounce or batch, a WINDOW_OPEN run
 * cannot be listed, ...). The document leaves them out of that field's
 * values, so that it lists exactly what the server takes; test_openapi.py
 * sends every value of every enum parameter, and these, to the running
 * server. Responses never hold them. */
static const struct {
    const char *field; /* "package.Message.field" */
    const char *value; /* the value's full name */
} refused_values[] = {
    {"keyflow.v1.Rule.kind", "RULE_KIND_UNSPECIFIED"},
    {"keyflow.v1.CoordinatorRef.kind", "RULE_KIND_UNSPECIFIED"},
    {"keyflow.v1.ListRunsRequest.status", "RUN_STATUS_WINDOW_OPEN"},
    {"keyflow.v1.FunctionDescriptor.runtime", "RUNTIME_UNSPECIFIED"},
    {"keyflow.v1.Field.type", "FIELD_TYPE_UNSPECIFIED"},
};

static bool refused(const ProtobufCMessageDescriptor *holder, const ProtobufCFieldDescriptor *f,
                    const char *value) {
    char field[NAME_BYTES_MAX];
    snprintf(field, sizeof field, "%s.%s", holder->name, f->name);
    for (size_t i = 0; i < sizeof refused_values / sizeof refused_values[0]; i++) {
        if (strcmp(refused_values[i].field, field) == 0 &&
            strcmp(refused_values[i].value, value) == 0) {
            return true;
        }
    }
    return false;
}

/* An enum field's values, as json_map takes them: each value's full name
 * and its short name ("RULE_KIND_BATCH", "batch"); in a body also its
 * number, as a JSON integer (proto3 JSON); in a path or query (`text`), the
 * names only. Values the field refuses are left out. */
static json_t *enum_schema(doc_t *d, const ProtobufCMessageDescriptor *holder,
                           const ProtobufCFieldDescriptor *f, bool text) {
    const ProtobufCEnumDescriptor *e = f->descriptor;
    json_t *names = json_array();
    json_t *numbers = json_array();
    /* In the order of the values, then their aliases (values_by_name holds
     * every name, sorted). */
    for (unsigned i = 0; i < e->n_values + e->n_value_names; i++) {
        bool alias = i >= e->n_values;
        const ProtobufCEnumValue *v =
            alias ? &e->values[e->values_by_name[i - e->n_values].index] : &e->values[i];
        const char *full = alias ? e->values_by_name[i - e->n_values].name : v->name;
        if ((alias && strcmp(full, v->name) == 0) || refused(holder, f, v->name)) {
            continue; /* listed already; or refused, by its first name, aliases too */
        }
        char short_name[KF_JSON_NAME_BYTES_MAX];
        kf_json_enum_short_name(e, full, short_name);
        json_array_append_new(names, json_string(full));
        json_array_append_new(names, json_string(short_name));
        bool listed = false;
        for (size_t k = 0; k < json_array_size(numbers) && !listed; k++) {
            listed = json_integer_value(json_array_get(numbers, k)) == v->value;
        }
        if (!listed) {
            json_array_append_new(numbers, json_integer(v->value));
        }
    }
    json_t *schema;
    if (text) {
        json_decref(numbers);
        schema = json_pack("{s:s, s:o}", "type", "string", "enum", names);
    } else {
        schema = json_pack("{s:[{s:s, s:o}, {s:s, s:o}]}", "anyOf", "type", "string", "enum", names,
                           "type", "integer", "enum", numbers);
    }
    json_object_set_new(schema, "title", json_string(e->name));
    describe(schema, d, e->name);
    return schema;
}

/* The schema of one value of field f of `holder` (not the array around a
 * repeated one); `text`: as a path or query parameter. */
static json_t *value_schema(doc_t *d, const ProtobufCMessageDescriptor *holder,
                            const ProtobufCFieldDescriptor *f, bool embedded, bool text) {
    if (embedded) {
        return json_pack("{s:s}", "description",
                         "Any JSON value (carried over gRPC as JSON text in the *_json field).");
    }
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        /* proto3 JSON takes integers as decimal strings too */
        return json_pack("{s:[s,s], s:s, s:s}", "type", "integer", "string", "format", "int32",
                         "pattern", "^-?[0-9]+$");
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return json_pack("{s:[s,s], s:i, s:I, s:s}", "type", "integer", "string", "minimum", 0,
                         "maximum", (json_int_t)4294967295LL, "pattern", "^[0-9]+$");
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        return json_pack("{s:[s,s], s:s, s:s, s:s}", "type", "string", "integer", "format", "int64",
                         "pattern", "^-?[0-9]+$", "description",
                         "A 64-bit integer: a decimal string in responses; a string or an exact "
                         "integer in requests.");
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return json_pack("{s:[s,s], s:s, s:s}", "type", "string", "integer", "format", "uint64",
                         "pattern", "^[0-9]+$");
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE:
        /* A number, a decimal string, or proto3 JSON's non-finite names. */
        return json_pack("{s:[{s:s}, {s:s, s:s}, {s:s, s:[s,s,s]}]}", "anyOf", "type", "number",
                         "type", "string", "pattern",
                         "^-?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][+-]?[0-9]+)?$", "type", "string",
                         "enum", "NaN", "Infinity", "-Infinity");
    case PROTOBUF_C_TYPE_BOOL: return json_pack("{s:s}", "type", "boolean");
    case PROTOBUF_C_TYPE_STRING: return json_pack("{s:s}", "type", "string");
    case PROTOBUF_C_TYPE_BYTES:
        return json_pack("{s:s, s:s}", "type", "string", "contentEncoding", "base64");
    case PROTOBUF_C_TYPE_ENUM: return enum_schema(d, holder, f, text);
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessageDescriptor *m = f->descriptor;
        add_message(d, m);
        return ref_to(m->name);
    }
    }
    KF_UNREACHABLE();
}

static json_t *field_schema(doc_t *d, const ProtobufCMessageDescriptor *desc,
                            const ProtobufCFieldDescriptor *f, bool text) {
    char json_name[KF_JSON_NAME_BYTES_MAX];
    bool embedded;
    kf_json_field_name(desc, f, json_name, &embedded);
    json_t *value = value_schema(d, desc, f, embedded, text);
    json_t *schema = value;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        schema = json_pack("{s:s, s:o}", "type", "array", "items", value);
    }
    char name[NAME_BYTES_MAX];
    snprintf(name, sizeof name, "%s.%s", desc->name, f->name);
    if (json_object_get(schema, "$ref") != NULL) {
        /* 3.1 lets a description sit beside $ref. */
        describe(schema, d, name);
    } else {
        json_t *own = json_object_get(d->comments, name);
        if (own != NULL) {
            json_object_set(schema, "description", own);
        }
    }
    return schema;
}

/* `{"not": {"anyOf": [{"required": [a, b]}, ...]}}` for every pair of
 * `keys`: at most one of them may appear. */
static json_t *at_most_one(json_t *keys) {
    json_t *pairs = json_array();
    for (size_t a = 0; a < json_array_size(keys); a++) {
        for (size_t b = a + 1; b < json_array_size(keys); b++) {
            json_array_append_new(pairs, json_pack("{s:[O,O]}", "required", json_array_get(keys, a),
                                                   json_array_get(keys, b)));
        }
    }
    return json_pack("{s:{s:o}}", "not", "anyOf", pairs);
}

/* Adds the message's schema to components (once), and every message it
 * reaches. Recursion follows the API's message graph, which is finite and
 * guarded by the schema being registered before its fields are walked.
 * Its properties are every key json_map takes (kf_json_field_keys): the
 * lowerCamelCase name, and the proto name as another spelling (proto3
 * JSON), a `_json` field's text form too; one field may come under one of
 * them only, and a oneof's members are exclusive (json_map refuses two).
 * The other spellings are writeOnly: answers use the first. */
static void add_message(doc_t *d, const ProtobufCMessageDescriptor *desc) {
    if (json_object_get(d->schemas, desc->name) != NULL) {
        return;
    }
    json_t *schema =
        json_pack("{s:s, s:{}, s:b}", "type", "object", "properties", "additionalProperties", 0);
    json_object_set_new(schema, "title", json_string(desc->name));
    describe(schema, d, desc->name);
    json_object_set_new(d->schemas, desc->name, schema);
    json_t *properties = json_object_get(schema, "properties");
    json_t *oneofs = json_object();
    json_t *all_of = json_array();
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        kf_json_key_t keys[KF_JSON_FIELD_KEYS_MAX];
        size_t count = kf_json_field_keys(desc, f, keys);
        json_t *names = json_array();
        for (size_t k = 0; k < count; k++) {
            json_t *property;
            char text[NAME_BYTES_MAX * 2];
            if (k == 0) {
                property = field_schema(d, desc, f, false);
            } else if (keys[0].embedded && !keys[k].embedded) {
                snprintf(text, sizeof text,
                         "`%s` as JSON text in a string (its gRPC form); give one of the two",
                         keys[0].name);
                property = json_pack("{s:s, s:s}", "type", "string", "description", text);
            } else {
                snprintf(text, sizeof text,
                         "`%s` under its proto field name (proto3 JSON takes either spelling, "
                         "not both)",
                         keys[0].name);
                property = field_schema(d, desc, f, false);
                json_object_set_new(property, "description", json_string(text));
            }
            if (k > 0) {
                /* Answers use the first spelling only. */
                json_object_set_new(property, "writeOnly", json_true());
            }
            json_object_set_new(properties, keys[k].name, property);
            json_array_append_new(names, json_string(keys[k].name));
        }
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            /* Members of one oneof share its quantifier: group by it. */
            char group[32];
            snprintf(group, sizeof group, "%u", f->quantifier_offset);
            json_t *members = json_object_get(oneofs, group);
            if (members == NULL) {
                members = json_array();
                json_object_set_new(oneofs, group, members);
            }
            json_array_extend(members, names);
        } else if (json_array_size(names) > 1) {
            json_array_append_new(all_of, at_most_one(names));
        }
        json_decref(names);
    }
    const char *group;
    json_t *members;
    json_object_foreach(oneofs, group, members) {
        if (json_array_size(members) > 1) {
            json_array_append_new(all_of, at_most_one(members));
        }
    }
    if (json_array_size(all_of) > 0) {
        json_object_set_new(schema, "allOf", all_of);
    } else {
        json_decref(all_of);
    }
    json_decref(oneofs);
}

/* ---- operations -------------------------------------------------------------- */

static json_t *json_response(const char *description, json_t *schema) {
    return json_pack("{s:s, s:{s:{s:o}}}", "description", description, "content",
                     "application/json", "schema", schema);
}

static json_t *responses(doc_t *d, const kf_method_t *m) {
    add_message(d, m->response);
    json_t *r = json_object();
    json_object_set_new(r, "200",
                        json_response(m->response->short_name, ref_to(m->response->name)));
    json_object_set_new(r, "4XX", json_pack("{s:s}", "$ref", "#/components/responses/Error"));
    json_object_set_new(r, "5XX", json_pack("{s:s}", "$ref", "#/components/responses/Error"));
    return r;
}

static json_t *operation(doc_t *d, const kf_method_t *m, const char *operation_id) {
    json_t *op = json_pack("{s:s, s:[s]}", "operationId", operation_id, "tags", m->service);
    char name[NAME_BYTES_MAX];
    snprintf(name, sizeof name, "%s.%s", m->service, m->name);
    json_t *text = json_object_get(d->comments, name);
    char summary[NAME_BYTES_MAX];
    snprintf(summary, sizeof summary, "%s (gRPC %s)", m->name, m->path);
    json_object_set_new(op, "summary", json_string(summary));
    if (text != NULL) {
        json_object_set(op, "description", text);
    }
    json_object_set_new(op, "responses", responses(d, m));
    return op;
}

/* The field at a dotted path ("coordinator.kind"), and the message that
 * holds it. */
static const ProtobufCFieldDescriptor *field_at(const ProtobufCMessageDescriptor *desc,
                                                const char *path, size_t len,
                                                const ProtobufCMessageDescriptor **holder) {
    char name[NAME_BYTES_MAX];
    KF_ASSERT(len < sizeof name);
    memcpy(name, path, len);
    name[len] = '\0';
    char *part = name;
    for (;;) {
        char *dot = strchr(part, '.');
        if (dot != NULL) {
            *dot = '\0';
        }
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field_by_name(desc, part);
        KF_ASSERT(f != NULL); /* test_rpc_table.py checks every route's fields */
        if (dot == NULL) {
            *holder = desc;
            return f;
        }
        KF_ASSERT(f->type == PROTOBUF_C_TYPE_MESSAGE);
        desc = f->descriptor;
        part = dot + 1;
    }
}

static json_t *parameter(doc_t *d, const char *name, const char *in,
                         const ProtobufCMessageDescriptor *holder,
                         const ProtobufCFieldDescriptor *f) {
    json_t *p = json_pack("{s:s, s:s, s:b, s:o}", "name", name, "in", in, "required",
                          strcmp(in, "path") == 0, "schema", field_schema(d, holder, f, true));
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        json_object_set_new(p, "explode", json_true()); /* ?workflow=a&workflow=b */
    }
    return p;
}

/* The value of `key` in a "k=v&k2=v2" list, or NULL (into buf). */
static const char *list_value(const char *list, const char *key, char *buf, size_t cap) {
    size_t n = strlen(key);
    for (const char *p = list; p != NULL && *p != '\0';) {
        const char *amp = strchr(p, '&');
        size_t len = amp != NULL ? (size_t)(amp - p) : strlen(p);
        if (len > n && strncmp(p, key, n) == 0 && p[n] == '=') {
            snprintf(buf, cap, "%.*s", (int)(len - n - 1), p + n + 1);
            return buf;
        }
        p = amp != NULL ? amp + 1 : NULL;
    }
    return NULL;
}

/* The query name of `field` under the route's aliases ("after" for
 * after_seq), else its JSON name. */
static void query_name(const char *aliases, const char *field, const char *json_name, char *out,
                       size_t cap) {
    for (const char *p = aliases; p != NULL && *p != '\0';) {
        const char *amp = strchr(p, '&');
        size_t len = amp != NULL ? (size_t)(amp - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (eq != NULL && strlen(field) == len - (size_t)(eq - p) - 1 &&
            strncmp(eq + 1, field, len - (size_t)(eq - p) - 1) == 0) {
            snprintf(out, cap, "%.*s", (int)(eq - p), p);
            return;
        }
        p = amp != NULL ? amp + 1 : NULL;
    }
    snprintf(out, cap, "%s", json_name);
}

static bool captured(const char *pattern, const char *path) {
    char brace[NAME_BYTES_MAX + 2];
    snprintf(brace, sizeof brace, "{%s}", path);
    return strstr(pattern, brace) != NULL;
}

/* Query parameters: every scalar field the path does not capture, nested
 * messages by dotted path. */
static void query_parameters(doc_t *d, json_t *params, const kf_http_route_def_t *r,
                             const ProtobufCMessageDescriptor *desc, const char *prefix,
                             int depth) {
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        char path[NAME_BYTES_MAX];
        snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", f->name);
        if (captured(r->pattern, path)) {
            continue;
        }
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            if (depth + 1 < QUERY_DEPTH_MAX && f->label != PROTOBUF_C_LABEL_REPEATED) {
                query_parameters(d, params, r, f->descriptor, path, depth + 1);
            }
            continue;
        }
        char json_name[KF_JSON_NAME_BYTES_MAX];
        bool embedded;
        kf_json_field_name(desc, f, json_name, &embedded);
        char full[NAME_BYTES_MAX], name[NAME_BYTES_MAX];
        snprintf(full, sizeof full, "%s%s%s", prefix, prefix[0] ? "." : "", json_name);
        query_name(r->aliases, path, full, name, sizeof name);
        json_t *p = parameter(d, name, "query", desc, f);
        char buf[NAME_BYTES_MAX];
        const char *dflt = list_value(r->defaults, path, buf, sizeof buf);
        if (dflt != NULL) {
            json_object_set_new(json_object_get(p, "schema"), "default", json_string(dflt));
        }
        json_array_append_new(params, p);
    }
}

/* "/v1/runs/{run_id}" + verb -> "/v1/runs/{run_id}:heartbeat" */
static void openapi_path(const kf_http_route_def_t *r, char *out, size_t cap) {
    snprintf(out, cap, "%s%s%s", r->pattern, r->verb ? ":" : "", r->verb ? r->verb : "");
}

static void add_route(doc_t *d, json_t *paths, const kf_http_route_def_t *r) {
    const kf_method_t *m = kf_method_by_path(r->rpc);
    KF_ASSERT(m != NULL && kf_http_serves(m)); /* test_rpc_table.py checks every route */
    char path[NAME_BYTES_MAX];
    openapi_path(r, path, sizeof path);
    json_t *item = json_object_get(paths, path);
    if (item == NULL) {
        item = json_object();
        json_object_set_new(paths, path, item);
    }
    json_t *op = operation(d, m, m->name);
    json_t *params = json_array();
    /* Path captures, in order. */
    for (const char *p = strchr(r->pattern, '{'); p != NULL; p = strchr(p + 1, '{')) {
        const char *end = strchr(p, '}');
        KF_ASSERT(end != NULL);
        const ProtobufCMessageDescriptor *holder;
        const ProtobufCFieldDescriptor *f =
            field_at(m->request, p + 1, (size_t)(end - p - 1), &holder);
        char name[NAME_BYTES_MAX];
        snprintf(name, sizeof name, "%.*s", (int)(end - p - 1), p + 1);
        json_array_append_new(params, parameter(d, name, "path", holder, f));
    }
    add_message(d, m->request);
    if (r->body == NULL) {
        query_parameters(d, params, r, m->request, "", 0);
    } else {
        json_t *schema;
        if (strcmp(r->body, "*") == 0) {
            schema = ref_to(m->request->name);
        } else {
            const ProtobufCMessageDescriptor *holder;
            const ProtobufCFieldDescriptor *f =
                field_at(m->request, r->body, strlen(r->body), &holder);
            schema = field_schema(d, holder, f, false);
        }
        json_object_set_new(op, "requestBody",
                            json_pack("{s:b, s:{s:{s:o}}}", "required", strcmp(r->body, "*") != 0,
                                      "content", "application/json", "schema", schema));
    }
    if (json_array_size(params) > 0) {
        json_object_set_new(op, "parameters", params);
    } else {
        json_decref(params);
    }
    char method[8];
    snprintf(method, sizeof method, "%s", r->http_method);
    for (char *c = method; *c != '\0'; c++) {
        *c = (char)(*c - 'A' + 'a');
    }
    json_object_set_new(item, method, op);
}

static void add_generic(doc_t *d, json_t *paths, const kf_method_t *m) {
    char path[NAME_BYTES_MAX], id[NAME_BYTES_MAX];
    snprintf(path, sizeof path, "/v1/%s/%s", m->service, m->name);
    snprintf(id, sizeof id, "%s.%s", m->service, m->name);
    json_t *op = operation(d, m, id);
    add_message(d, m->request);
    json_object_set_new(op, "requestBody",
                        json_pack("{s:b, s:{s:{s:o}}}", "required", 0, "content",
                                  "application/json", "schema", ref_to(m->request->name)));
    json_object_set_new(paths, path, json_pack("{s:o}", "post", op));
}

static void add_probes(json_t *paths) {
    json_t *error = json_pack("{s:s}", "$ref", "#/components/responses/Error");
    json_object_set_new(
        paths, "/healthz",
        json_pack("{s:{s:s, s:s, s:[s], s:{s:o}}}", "get", "operationId", "healthz", "summary",
                  "Liveness: 200 while the process is up", "tags", "probes", "responses", "200",
                  json_response("up", json_pack("{s:s, s:{s:{s:s}}}", "type", "object",
                                                "properties", "status", "type", "string"))));
    json_object_set_new(
        paths, "/readyz",
        json_pack("{s:{s:s, s:s, s:[s], s:{s:o, s:O}}}", "get", "operationId", "readyz", "summary",
                  "Readiness: 200 exactly while gRPC Health/Check says SERVING, else 503", "tags",
                  "probes", "responses", "200",
                  json_response("serving", json_pack("{s:s, s:{s:{s:s}}}", "type", "object",
                                                     "properties", "status", "type", "string")),
                  "503", error));
    json_object_set_new(paths, "/metrics",
                        json_pack("{s:{s:s, s:s, s:[s], s:{s:{s:s, s:{s:{s:{s:s}}}}, s:O}}}", "get",
                                  "operationId", "metrics", "summary",
                                  "Prometheus text exposition (0.0.4)", "tags", "probes",
                                  "responses", "200", "description", "the metrics", "content",
                                  "text/plain", "schema", "type", "string", "4XX", error));
    json_object_set_new(
        paths, "/openapi.json",
        json_pack("{s:{s:s, s:s, s:[s], s:{s:o}}}", "get", "operationId", "openapi", "summary",
                  "This document", "tags", "probes", "responses", "200",
                  json_response("the OpenAPI document", json_pack("{s:s}", "type", "object"))));
    json_decref(error);
}

kf_status_t kf_openapi_render(const char *version, char **out, size_t *len, kf_error_t *err) {
    doc_t d;
    d.comments = read_comments(err);
    if (d.comments == NULL) {
        return KF_E_CORRUPT;
    }
    d.schemas = json_object();
    json_object_set_new(
        d.schemas, "Error",
        json_pack("{s:s, s:{s:{s:s, s:s}, s:{s:s, s:s}, s:{s:s}}, s:[s,s,s], s:s}", "type",
                  "object", "properties", "code", "type", "integer", "description",
                  "The gRPC status code", "status", "type", "string", "description",
                  "Its name, e.g. INVALID_ARGUMENT", "message", "type", "string", "required",
                  "code", "status", "message", "description",
                  "An error: the gRPC status and a message naming the offending field and "
                  "limit."));
    json_t *paths = json_object();
    d.root = json_pack(
        "{s:s, s:{s:s, s:s, s:s}, s:o, s:{s:o, s:{s:{s:s, s:{s:{s:{s:s}}}}}, s:{s:{s:s, s:s, "
        "s:s}}}, s:[{s:[]}, {}]}",
        "openapi", "3.1.0", "info", "title", "keyflow HTTP/JSON gateway", "version",
        version != NULL ? version : "unknown", "description",
        "The HTTP/JSON mapping of keyflow's gRPC API (proto3 JSON: lowerCamelCase names, the "
        "proto names taken in bodies too; 64-bit integers as strings; enums by their full or "
        "lowercase short name, and in bodies their number; `*_json` fields as embedded JSON "
        "values; unknown fields are refused). Every list of a response is present, [] when "
        "empty. Query parameters only on routes without a body, named as listed here. Every "
        "GET also answers HEAD. Generated by keyflowd from its route table and protos; it "
        "lists every spelling the gateway takes and no other.",
        "paths", paths, "components", "schemas", d.schemas, "responses", "Error", "description",
        "An error", "content", "application/json", "schema", "$ref", "#/components/schemas/Error",
        "securitySchemes", "apiKey", "type", "http", "scheme", "bearer", "description",
        "An API key (`authorization: Bearer ...`), needed when keyflowd authenticates "
        "(listeners off loopback); see docs/security.md",
        "security", "apiKey");
    KF_ASSERT(d.root != NULL);
    size_t route_count;
    const kf_http_route_def_t *routes = kf_http_routes(&route_count);
    for (size_t i = 0; i < route_count; i++) {
        add_route(&d, paths, &routes[i]);
    }
    for (size_t i = 0; i < KF_METHOD_COUNT; i++) {
        if (kf_http_serves(&kf_methods[i])) {
            add_generic(&d, paths, &kf_methods[i]);
        }
        /* GET /v1/partitions is the gateway's own route (gateway.c, no key
         * to route by), outside routes.c's table: the same answer. */
        if (strcmp(kf_methods[i].path, "/keyflow.v1.Partitions/GetPlacement") == 0) {
            json_object_set_new(
                paths, "/v1/partitions",
                json_pack("{s:o}", "get", operation(&d, &kf_methods[i], "GetPlacement")));
        }
    }
    add_probes(paths);
    char *text = kf_json_dumps(d.root, JSON_COMPACT);
    json_decref(d.root);
    json_decref(d.comments);
    if (text == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "openapi: out of memory");
    }
    *out = text;
    *len = strlen(text);
    return KF_OK;
}
