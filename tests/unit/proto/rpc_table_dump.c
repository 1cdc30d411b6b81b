/*
 * rpc_table_dump.c - prints the RPC table (proto/methods.h) and the HTTP
 * routes (http/routes.h) as JSON, for test_rpc_table.py to check against
 * the .proto files in api/. No arguments; writes stdout.
 */
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "http/routes.h"
#include "proto/methods.h"

static json_t *text_or_null(const char *s) {
    return s != NULL ? json_string(s) : json_null();
}

static json_t *methods(void) {
    json_t *out = json_array();
    for (size_t i = 0; i < KF_METHOD_COUNT; i++) {
        const kf_method_t *m = &kf_methods[i];
        json_t *row = json_object();
        json_object_set_new(row, "path", json_string(m->path));
        json_object_set_new(row, "service", json_string(m->service));
        json_object_set_new(row, "name", json_string(m->name));
        json_object_set_new(row, "request", json_string(m->request->name));
        json_object_set_new(row, "response", json_string(m->response->name));
        json_object_set_new(row, "executor",
                            json_string(m->executor == KF_RPC_ENGINE ? "engine" : "front_end"));
        json_object_set_new(row, "shape", json_string(kf_rpc_shape_name(m->shape)));
        json_object_set_new(row, "scope", json_string(kf_scope_name(m->scope)));
        json_object_set_new(row, "resource", text_or_null(m->resource));
        json_object_set_new(row, "http", json_boolean(kf_http_serves(m)));
        json_t *route = json_object();
        json_object_set_new(route, "kind", json_string(kf_route_kind_name(m->route.kind)));
        json_t *fields = json_array();
        for (int f = 0; f < 2; f++) {
            if (m->route.fields[f] != NULL) {
                json_array_append_new(fields, json_string(m->route.fields[f]));
            }
        }
        json_object_set_new(route, "fields", fields);
        json_object_set_new(route, "plan", text_or_null(m->route.plan));
        json_object_set_new(row, "route", route);
        if (m->executor == KF_RPC_ENGINE) {
            json_object_set_new(row, "op", json_string(kf_op_name(m->op)));
            json_object_set_new(row, "disk", json_string(m->grows_store ? "grows" : "bounded"));
            /* The op's row is this one (kf_method_by_op agrees with the table). */
            json_object_set_new(row, "op_row_matches", json_boolean(kf_method_by_op(m->op) == m));
        }
        json_array_append_new(out, row);
    }
    return out;
}

static json_t *routes(void) {
    json_t *out = json_array();
    size_t n;
    const kf_http_route_def_t *r = kf_http_routes(&n);
    for (size_t i = 0; i < n; i++) {
        json_t *row = json_object();
        json_object_set_new(row, "http_method", json_string(r[i].http_method));
        json_object_set_new(row, "pattern", json_string(r[i].pattern));
        json_object_set_new(row, "verb", text_or_null(r[i].verb));
        json_object_set_new(row, "rpc", json_string(r[i].rpc));
        json_object_set_new(row, "body", text_or_null(r[i].body));
        json_object_set_new(row, "defaults", text_or_null(r[i].defaults));
        json_object_set_new(row, "aliases", text_or_null(r[i].aliases));
        json_array_append_new(out, row);
    }
    return out;
}

static json_t *scopes(void) {
    json_t *out = json_array();
    for (int s = 0; s < KF_SCOPE_COUNT; s++) {
        json_array_append_new(out, json_string(kf_scope_name((kf_scope_t)s)));
    }
    return out;
}

int main(void) {
    json_t *doc = json_object();
    json_object_set_new(doc, "methods", methods());
    json_object_set_new(doc, "routes", routes());
    json_object_set_new(doc, "scopes", scopes());
    char *text = json_dumps(doc, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_decref(doc);
    if (text == NULL) {
        return 1;
    }
    puts(text);
    free(text);
    return 0;
}
