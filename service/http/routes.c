/*
 * routes.c - REST route matching and request building (see routes.h).
 */
#include "http/routes.h"

#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "base/assert.h"
#include "base/json.h"
#include "base/limits.h"
#include "proto/json_map.h"

typedef kf_http_route_def_t route_t;

static const route_t routes[] = {
    {"POST", "/v1/workflows/{workflow}/keys/{key}/events", NULL,
     "/keyflow.v1.Coordinators/SendEvent", "event"},
    {"POST", "/v1/events", "batch", "/keyflow.v1.Coordinators/SendEvents", "events"},
    {"GET", "/v1/coordinators/{coordinator.kind}/{coordinator.workflow}/{coordinator.key}", NULL,
     "/keyflow.v1.Coordinators/DescribeCoordinator", NULL},
    {"POST", "/v1/coordinators/{coordinator.kind}/{coordinator.workflow}/{coordinator.key}",
     "flush", "/keyflow.v1.Coordinators/FlushWindow", "*"},
    {"POST", "/v1/coordinators/{coordinator.kind}/{coordinator.workflow}/{coordinator.key}",
     "cancel", "/keyflow.v1.Coordinators/CancelWindow", "*"},
    {"POST", "/v1/runs", "poll", "/keyflow.v1.Runs/PollRuns", "*"},
    {"POST", "/v1/runs/{run_id}", "heartbeat", "/keyflow.v1.Runs/HeartbeatRun", "*"},
    {"POST", "/v1/runs/{run_id}", "complete", "/keyflow.v1.Runs/CompleteRun", "*"},
    {"POST", "/v1/runs/{run_id}", "release", "/keyflow.v1.Runs/ReleaseRun", "*"},
    {"POST", "/v1/runs/{run_id}", "cancel", "/keyflow.v1.Runs/CancelRun", "*"},
    {"GET", "/v1/runs/{run_id}", NULL, "/keyflow.v1.Runs/GetRun", NULL},
    {"GET", "/v1/runs", NULL, "/keyflow.v1.Runs/ListRuns", NULL},
    {"POST", "/v1/functions", NULL, "/keyflow.v1.Functions/RegisterFunction", "descriptor"},
    {"GET", "/v1/functions", NULL, "/keyflow.v1.Functions/ListFunctions", NULL},
    {"GET", "/v1/functions/{function_id}", NULL, "/keyflow.v1.Functions/GetFunction", NULL},
    {"DELETE", "/v1/functions/{function_id}", NULL, "/keyflow.v1.Functions/DeleteFunction", NULL},
    {"POST", "/v1/functions/{function_id}/batches", NULL, "/keyflow.v1.Functions/PushBatch", "*"},
    {"POST", "/v1/functions/{function_id}/dry-run", NULL, "/keyflow.v1.Functions/DryRunBatch", "*"},
    {"POST", "/v1/functions/{function_id}/producers/{producer_id}/batches/{sequence}", "replay",
     "/keyflow.v1.Functions/ReplayBatch", "*"},
    {"DELETE", "/v1/functions/{function_id}/producers/{producer_id}", NULL,
     "/keyflow.v1.Functions/DeleteProducer", NULL},
    {"GET", "/v1/functions/{function_id}/output", NULL, "/keyflow.v1.Functions/ReadOutput", NULL,
     "format=ROW_FORMAT_JSON", "after=after_seq&wait=wait_ms"},
    {"POST", "/v1/functions/{function_id}/output", "trim", "/keyflow.v1.Functions/TrimOutput", "*"},
    {"GET", "/v1/functions/{function_id}/keys/{key}", NULL, "/keyflow.v1.Functions/GetKeyState",
     NULL},
    {"POST", "/v1/keys", NULL, "/keyflow.v1.Keys/CreateKey", "*"},
    {"GET", "/v1/keys", NULL, "/keyflow.v1.Keys/ListKeys", NULL},
    {"POST", "/v1/keys/{key_id}", "revoke", "/keyflow.v1.Keys/RevokeKey", "*"},
};

const kf_http_route_def_t *kf_http_routes(size_t *count) {
    *count = sizeof routes / sizeof routes[0];
    return routes;
}

#define SEGMENTS_MAX 16
/* A query parameter's name as a path of fields: the API nests two levels. */
#define QUERY_NAME_BYTES_MAX 256

typedef struct span {
    const char *p;
    size_t len;
} span_t;

/* Splits "/a/b/c" into segments; false when there are too many. */
static bool split(const char *path, size_t len, span_t *segs, size_t *n) {
    *n = 0;
    size_t i = 0;
    while (i < len) {
        if (path[i] == '/') {
            i++;
            continue;
        }
        size_t j = i;
        while (j < len && path[j] != '/') {
            j++;
        }
        if (*n == SEGMENTS_MAX) {
            return false;
        }
        segs[(*n)++] = (span_t){path + i, j - i};
        i = j;
    }
    return true;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Percent-decodes into the arena; '+' is a space only in query strings.
 * `*nul` tells whether the text decoded to a NUL byte (%00): the result is
 * a C string, so such a value would silently end early and name something
 * else (the key "k%00x" would act on "k"); callers refuse it. */
static char *decode(kf_arena_t *arena, const char *s, size_t len, bool plus_is_space, bool *nul) {
    *nul = false;
    char *out = kf_arena_alloc(arena, len + 1);
    if (out == NULL) {
        return NULL;
    }
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '%' && i + 2 < len && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
            out[o++] = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
            *nul = *nul || out[o - 1] == '\0';
            i += 2;
        } else if (plus_is_space && s[i] == '+') {
            out[o++] = ' ';
        } else {
            out[o++] = s[i];
        }
    }
    out[o] = '\0';
    return out;
}

typedef struct capture {
    const char *field; /* from the pattern, e.g. "coordinator.kind" */
    size_t field_len;
    span_t value; /* raw, not yet decoded */
} capture_t;

/* Matches request segments against a route's pattern. */
static bool match(const route_t *r, const span_t *segs, size_t n, capture_t *caps, size_t *ncaps) {
    span_t pat[SEGMENTS_MAX];
    size_t np;
    bool ok = split(r->pattern, strlen(r->pattern), pat, &np);
    KF_ASSERT(ok);
    if (np != n) {
        return false;
    }
    *ncaps = 0;
    for (size_t i = 0; i < n; i++) {
        span_t seg = segs[i];
        if (i == n - 1) {
            /* The verb is the text after the last ':' of the last segment. */
            const char *colon = NULL;
            for (size_t k = seg.len; k > 0; k--) {
                if (seg.p[k - 1] == ':') {
                    colon = seg.p + k - 1;
                    break;
                }
            }
            if (r->verb != NULL) {
                size_t vlen = strlen(r->verb);
                if (colon == NULL || (size_t)(seg.p + seg.len - colon - 1) != vlen ||
                    memcmp(colon + 1, r->verb, vlen) != 0) {
                    return false;
                }
                seg.len = (size_t)(colon - seg.p);
            } else if (colon != NULL && pat[i].p[0] != '{') {
                return false;
            }
        }
        if (pat[i].p[0] == '{') {
            if (seg.len == 0) {
                return false;
            }
            caps[*ncaps].field = pat[i].p + 1;
            caps[*ncaps].field_len = pat[i].len - 2;
            caps[*ncaps].value = seg;
            (*ncaps)++;
        } else if (pat[i].len != seg.len || memcmp(pat[i].p, seg.p, seg.len) != 0) {
            return false;
        }
    }
    return true;
}

static bool method_is(const kf_http_request_t *req, const char *m) {
    size_t n = strlen(m);
    if (strcmp(m, "GET") == 0 && req->method_len == 4 && memcmp(req->method, "HEAD", 4) == 0) {
        return true; /* HEAD is GET without the body (h2o leaves the body out) */
    }
    return req->method_len == n && memcmp(req->method, m, n) == 0;
}

/* Parses the body and merges it into msg, whole or under one field. */
static kf_status_t merge_body(const kf_http_request_t *req, const char *body_field,
                              ProtobufCMessage *msg, kf_arena_t *arena, kf_error_t *err) {
    size_t blank = 0;
    while (blank < req->body_len && strchr(" \t\r\n", req->body[blank]) != NULL) {
        blank++;
    }
    if (req->body == NULL || blank == req->body_len) {
        return KF_OK; /* an empty (or all-whitespace) body is {} */
    }
    json_error_t jerr;
    json_t *doc = json_loadb(req->body, req->body_len, KF_JSON_LOAD_FLAGS, &jerr);
    if (doc == NULL) {
        return kf_error_set(err, KF_E_INVALID,
                            "body: cannot be read as JSON: %s (line %d, column %d)", jerr.text,
                            jerr.line, jerr.column);
    }
    /* A body is a JSON object, except for a repeated field (SendEvents'
     * "events"), which takes the JSON array itself. */
    const ProtobufCFieldDescriptor *fd =
        strcmp(body_field, "*") == 0
            ? NULL
            : protobuf_c_message_descriptor_get_field_by_name(msg->descriptor, body_field);
    bool array = fd != NULL && fd->label == PROTOBUF_C_LABEL_REPEATED;
    if (array ? !json_is_array(doc) : !json_is_object(doc)) {
        json_decref(doc);
        return kf_error_set(err, KF_E_INVALID, "body: must be a JSON %s",
                            array ? "array" : "object");
    }
    json_t *root = doc;
    if (strcmp(body_field, "*") != 0) {
        root = json_object();
        json_object_set_new(root, body_field, doc);
    }
    kf_status_t st = kf_json_merge(root, msg, "", arena, err);
    json_decref(root);
    return st;
}

/* The field a query parameter names, after the route's aliases. */
static const char *alias_of(const char *aliases, const char *name, kf_arena_t *arena) {
    size_t n = strlen(name);
    for (const char *a = aliases; a != NULL && *a != '\0';) {
        const char *eq = strchr(a, '=');
        const char *amp = strchr(a, '&');
        size_t end = amp ? (size_t)(amp - a) : strlen(a);
        if (eq != NULL && (size_t)(eq - a) == n && memcmp(a, name, n) == 0) {
            return kf_arena_strndup(arena, eq + 1, end - n - 1);
        }
        a = amp ? amp + 1 : NULL;
    }
    return name;
}

/* The route's query name for `field_path` (a dotted path of proto field
 * names) when one of its aliases targets it, which is then its only query
 * name: written into out, true. */
static bool alias_for(const char *aliases, const char *field_path, char *out, size_t cap) {
    size_t n = strlen(field_path);
    for (const char *a = aliases; a != NULL && *a != '\0';) {
        const char *eq = strchr(a, '=');
        const char *amp = strchr(a, '&');
        size_t end = amp ? (size_t)(amp - a) : strlen(a);
        if (eq != NULL && eq < a + end && (size_t)(a + end - eq - 1) == n &&
            memcmp(eq + 1, field_path, n) == 0) {
            snprintf(out, cap, "%.*s", (int)(eq - a), a);
            return true;
        }
        a = amp ? amp + 1 : NULL;
    }
    return false;
}

/* A client's query parameter must be spelled as the OpenAPI document
 * spells it: the route's alias, else the lowerCamelCase JSON name of each
 * dotted segment ("pageSize", not "page_size"; "after", not "afterSeq",
 * where the route aliases after_seq). A name that fits no field at all is
 * left to kf_message_set_text_as, which names the fields there are. */
static kf_status_t check_query_name(const ProtobufCMessageDescriptor *desc, const char *name,
                                    const char *aliases, kf_error_t *err) {
    char field_path[QUERY_NAME_BYTES_MAX] = "";
    char documented[QUERY_NAME_BYTES_MAX] = "";
    bool exact = true;
    for (const char *segment = name; desc != NULL;) {
        const char *dot = strchr(segment, '.');
        size_t len = dot != NULL ? (size_t)(dot - segment) : strlen(segment);
        const ProtobufCFieldDescriptor *found = NULL;
        char json_name[KF_JSON_NAME_BYTES_MAX];
        for (unsigned i = 0; i < desc->n_fields && found == NULL; i++) {
            const ProtobufCFieldDescriptor *f = &desc->fields[i];
            bool embedded;
            kf_json_field_name(desc, f, json_name, &embedded);
            bool same_json = strlen(json_name) == len && memcmp(json_name, segment, len) == 0;
            bool same_proto = strlen(f->name) == len && memcmp(f->name, segment, len) == 0;
            if (same_json || same_proto) {
                found = f;
                exact = exact && same_json;
            }
        }
        if (found == NULL) {
            return KF_OK; /* unknown: kf_message_set_text_as says so */
        }
        size_t used = strlen(field_path);
        snprintf(field_path + used, sizeof field_path - used, "%s%s", used > 0 ? "." : "",
                 found->name);
        used = strlen(documented);
        snprintf(documented + used, sizeof documented - used, "%s%s", used > 0 ? "." : "",
                 json_name);
        if (dot == NULL) {
            break;
        }
        desc = found->type == PROTOBUF_C_TYPE_MESSAGE ? found->descriptor : NULL;
        segment = dot + 1;
    }
    if (alias_for(aliases, field_path, documented, sizeof documented) || !exact) {
        return kf_error_set(err, KF_E_INVALID, "query: %s: spelled %s in a query", name,
                            documented);
    }
    return KF_OK;
}

/* Sets the fields a query string names. A singular field may be given once
 * in all of path, query and body (mode KF_SET_ONCE); the route's defaults
 * use KF_SET_DEFAULT, after everything the client sent, and are written
 * with proto field names (`strict` false); a client's names are checked
 * (check_query_name). The number of parameters is bounded before any is
 * read. */
static kf_status_t apply_query(const char *q, size_t left, const char *aliases, kf_set_mode_t mode,
                               bool strict, ProtobufCMessage *msg, kf_arena_t *arena,
                               kf_error_t *err) {
    size_t params = 0;
    for (size_t i = 0; i < left; i++) {
        if ((i == 0 || q[i - 1] == '&') && q[i] != '&') {
            params++;
        }
    }
    if (params > KF_HTTP_QUERY_PARAMS_MAX) {
        return kf_error_set(err, KF_E_INVALID, "query: at most %d parameters",
                            KF_HTTP_QUERY_PARAMS_MAX);
    }
    while (q != NULL && left > 0) {
        const char *amp = memchr(q, '&', left);
        size_t len = amp ? (size_t)(amp - q) : left;
        if (len > 0) {
            const char *eq = memchr(q, '=', len);
            size_t name_len = eq ? (size_t)(eq - q) : len;
            bool nul_name = false, nul_value = false;
            char *name = decode(arena, q, name_len, true, &nul_name);
            char *value = eq ? decode(arena, eq + 1, len - name_len - 1, true, &nul_value) : "";
            if (name == NULL || value == NULL) {
                return kf_error_set(err, KF_E_TOO_LARGE, "query: too large");
            }
            if (nul_name || nul_value) {
                return kf_error_set(err, KF_E_INVALID, "query: %s contains a NUL byte (%%00)",
                                    nul_name ? "a parameter name" : name);
            }
            const char *field = alias_of(aliases, name, arena);
            if (strict && field == name) {
                kf_status_t st = check_query_name(msg->descriptor, name, aliases, err);
                if (st != KF_OK) {
                    return st;
                }
            }
            kf_status_t st = field ? kf_message_set_text_as(msg, field, value, mode, arena, err)
                                   : kf_error_set(err, KF_E_TOO_LARGE, "query: too large");
            if (st != KF_OK) {
                return st;
            }
        }
        if (amp == NULL) {
            break;
        }
        left -= len + 1;
        q = amp + 1;
    }
    return KF_OK;
}

static ProtobufCMessage *new_message(const ProtobufCMessageDescriptor *desc, kf_arena_t *arena) {
    ProtobufCMessage *m = kf_arena_zalloc(arena, desc->sizeof_message);
    if (m != NULL) {
        desc->message_init(m);
    }
    return m;
}

bool kf_http_serves(const kf_method_t *m) {
    return m->executor == KF_RPC_ENGINE && !kf_method_streams(m);
}

/* POST /v1/{package.Service}/{Method}: every RPC by its gRPC name. */
static const kf_method_t *generic_method(const span_t *segs, size_t n) {
    if (n != 3 || segs[0].len != 2 || memcmp(segs[0].p, "v1", 2) != 0) {
        return NULL;
    }
    char path[256]; /* longer than any RPC's path: such a path names none */
    int len = snprintf(path, sizeof path, "/%.*s/%.*s", (int)segs[1].len, segs[1].p,
                       (int)segs[2].len, segs[2].p);
    const kf_method_t *m = len > 0 && (size_t)len < sizeof path ? kf_method_by_path(path) : NULL;
    return m != NULL && kf_http_serves(m) ? m : NULL;
}

/* The route matching the path and method (its captures in caps), else
 * NULL with *path_known saying whether another method would match. */
static const route_t *find_route(const kf_http_request_t *req, const span_t *segs, size_t n,
                                 capture_t *caps, size_t *ncaps, bool *path_known) {
    *path_known = false;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (match(&routes[i], segs, n, caps, ncaps)) {
            *path_known = true;
            if (method_is(req, routes[i].http_method)) {
                return &routes[i];
            }
        }
    }
    return NULL;
}

const kf_method_t *kf_http_route_method(const kf_http_request_t *req) {
    span_t segs[SEGMENTS_MAX];
    size_t n;
    if (!split(req->path, req->path_len, segs, &n)) {
        return NULL;
    }
    capture_t caps[SEGMENTS_MAX];
    size_t ncaps = 0;
    bool path_known;
    const route_t *found = find_route(req, segs, n, caps, &ncaps, &path_known);
    if (found != NULL) {
        return kf_method_by_path(found->rpc);
    }
    const kf_method_t *m = generic_method(segs, n);
    return m != NULL && method_is(req, "POST") ? m : NULL;
}

/* Appends `method` to the comma-separated list in out unless it is there. */
static void allow_add(char *out, size_t cap, const char *method) {
    size_t n = strlen(method);
    for (const char *p = strstr(out, method); p != NULL; p = strstr(p + 1, method)) {
        if ((p == out || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0')) {
            return;
        }
    }
    size_t len = strlen(out);
    snprintf(out + len, cap - len, "%s%s", len > 0 ? ", " : "", method);
}

void kf_http_allowed(const char *path, size_t path_len, char *out, size_t cap) {
    KF_ASSERT(cap > 0);
    out[0] = '\0';
    span_t segs[SEGMENTS_MAX];
    size_t n;
    if (!split(path, path_len, segs, &n)) {
        return;
    }
    capture_t caps[SEGMENTS_MAX];
    size_t ncaps;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (match(&routes[i], segs, n, caps, &ncaps)) {
            allow_add(out, cap, routes[i].http_method);
            if (strcmp(routes[i].http_method, "GET") == 0) {
                allow_add(out, cap, "HEAD"); /* wherever GET is (method_is) */
            }
        }
    }
    if (out[0] == '\0' && generic_method(segs, n) != NULL) {
        allow_add(out, cap, "POST");
    }
}

kf_status_t kf_http_route(const kf_http_request_t *req, kf_arena_t *arena,
                          const kf_method_t **method_out, ProtobufCMessage **message_out,
                          kf_error_t *err) {
    *method_out = NULL;
    span_t segs[SEGMENTS_MAX];
    size_t n;
    if (!split(req->path, req->path_len, segs, &n)) {
        return kf_error_set(err, KF_E_NOT_FOUND, "path: no such route");
    }
    capture_t caps[SEGMENTS_MAX];
    size_t ncaps = 0;
    bool path_known;
    const route_t *found = find_route(req, segs, n, caps, &ncaps, &path_known);
    const kf_method_t *m;
    const char *body_field;
    const char *defaults = NULL, *aliases = NULL;
    if (found != NULL) {
        m = kf_method_by_path(found->rpc);
        KF_ASSERT(m != NULL && kf_http_serves(m)); /* test_rpc_table.py checks every route */
        body_field = found->body;
        defaults = found->defaults;
        aliases = found->aliases;
    } else if ((m = generic_method(segs, n)) != NULL) {
        if (!method_is(req, "POST")) {
            return kf_error_set(err, KF_E_UNIMPLEMENTED, "method: use POST for %s", m->path);
        }
        body_field = "*";
        ncaps = 0;
    } else if (path_known) {
        return kf_error_set(err, KF_E_UNIMPLEMENTED, "method: %.*s is not allowed on this path",
                            (int)req->method_len, req->method);
    } else {
        return kf_error_set(err, KF_E_NOT_FOUND, "path: no such route: %.*s", (int)req->path_len,
                            req->path);
    }
    *method_out = m; /* known from here on, failures included (metrics) */
    ProtobufCMessage *msg = new_message(m->request, arena);
    if (msg == NULL) {
        return kf_error_set(err, KF_E_TOO_LARGE, "request: too large");
    }
    kf_status_t st = KF_OK;
    if (body_field != NULL) {
        st = merge_body(req, body_field, msg, arena, err);
    } else if (req->body_len > 0) {
        st = kf_error_set(err, KF_E_INVALID, "body: %s takes no body", m->name);
    }
    if (st == KF_OK && req->query_len > 0) {
        /* A route with a body takes its request in the path and the body:
         * its query would be a third, undocumented place. */
        st = body_field != NULL
                 ? kf_error_set(err, KF_E_INVALID,
                                "query: %s takes no query parameters; its fields go in the %s",
                                m->name, ncaps > 0 ? "path or the body" : "body")
                 : apply_query(req->query, req->query_len, aliases, KF_SET_ONCE, true, msg, arena,
                               err);
    }
    for (size_t i = 0; st == KF_OK && i < ncaps; i++) {
        char *field = kf_arena_strndup(arena, caps[i].field, caps[i].field_len);
        bool nul;
        char *value = decode(arena, caps[i].value.p, caps[i].value.len, false, &nul);
        if (field == NULL || value == NULL) {
            return kf_error_set(err, KF_E_TOO_LARGE, "path: too large");
        }
        if (nul) {
            return kf_error_set(err, KF_E_INVALID, "%s: contains a NUL byte (%%00)", field);
        }
        st = kf_message_set_text_as(msg, field, value, KF_SET_ONCE, arena, err);
    }
    if (st == KF_OK && defaults != NULL) {
        st = apply_query(defaults, strlen(defaults), NULL, KF_SET_DEFAULT, false, msg, arena, err);
    }
    if (st != KF_OK) {
        return st;
    }
    *message_out = msg;
    return KF_OK;
}
