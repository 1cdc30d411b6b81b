/* fuzz_routes.c - libFuzzer harness: the HTTP gateway's request building
 * (service/http/routes.c: path matching, percent-decoding, query parameters, body merge) without
 * h2o, plus a round trip: the built request rendered as JSON and posted to the generic route POST
 * /v1/<Service>/<Method> must build the same request. Input: method u8 (0 GET, 1 POST, else DELETE)
 * | path \0 query \0 body */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/json_map.h"
#include "http/routes.h"

/* libFuzzer's entry point. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    const char *methods[] = {"GET", "POST", "DELETE"};
    const char *method = methods[data[0] < 2 ? data[0] : 2];
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    const char *z1 = memchr(p, 0, n);
    if (!z1)
        return 0;
    const char *q = z1 + 1;
    const char *z2 = memchr(q, 0, n - (size_t)(q - p));
    if (!z2)
        return 0;
    const char *body = z2 + 1;
    size_t body_len = n - (size_t)(body - p);
    /* exact-size heap copies so ASan sees any over-read */
    size_t path_len = (size_t)(z1 - p), query_len = (size_t)(z2 - q);
    char *path = malloc(path_len ? path_len : 1);
    memcpy(path, p, path_len);
    char *query = query_len ? malloc(query_len) : NULL;
    if (query)
        memcpy(query, q, query_len);
    char *b = body_len ? malloc(body_len) : NULL;
    if (b)
        memcpy(b, body, body_len);
    kf_http_request_t req = {method, strlen(method), path, path_len, query, query_len, b, body_len};
    kf_arena_t arena;
    kf_arena_init(&arena, 32 * 1024 * 1024);
    kf_error_t err;
    const kf_method_t *m = NULL;
    ProtobufCMessage *msg = NULL;
    kf_status_t rst = kf_http_route(&req, &arena, &m, &msg, &err);
    if (getenv("DEBUG_ROUTES"))
        fprintf(stderr, "route: %d %s\n", rst, rst ? err.message : m->path);
    if (rst == KF_OK) {
        size_t l1 = 0;
        char *j1 = kf_message_to_json(msg, &arena, &l1);
        if (!j1)
            abort();
        kf_http_request_t again = {"POST", 4, m->path, strlen(m->path) /* "/pkg.Svc/Method" */,
                                   NULL,   0, j1,      l1};
        char *gpath = kf_arena_printf(&arena, "/v1%s", m->path);
        again.path = gpath;
        again.path_len = strlen(gpath);
        const kf_method_t *m2 = NULL;
        ProtobufCMessage *msg2 = NULL;
        kf_error_t err2;
        if (kf_http_route(&again, &arena, &m2, &msg2, &err2) != KF_OK) {
            fprintf(stderr, "ROUTES: re-posting the built request failed: %s\n%.400s\n",
                    err2.message, j1);
            abort();
        }
        if (m2 != m)
            abort();
        size_t l2 = 0;
        char *j2 = kf_message_to_json(msg2, &arena, &l2);
        if (!j2 || l1 != l2 || memcmp(j1, j2, l1) != 0) {
            fprintf(stderr, "ROUTES: round trip changed the request\n%.400s\n%.400s\n", j1,
                    j2 ? j2 : "");
            abort();
        }
    }
    kf_arena_deinit(&arena);
    free(path);
    free(query);
    free(b);
    return 0;
}
