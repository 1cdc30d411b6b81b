/*
 * auth.c - the principal registry and the per-call checks (see auth.h).
 *
 * Invariants
 *   1. The registry maps key id -> principal and holds one reference per
 *      entry; a lookup takes another reference under the read lock, so a
 *      principal outlives its removal for as long as a call uses it.
 *   2. The per-call path allocates nothing and reads no disk: the header
 *      is parsed in place, the secret decoded on the stack, the HMAC key's
 *      pads were absorbed once (kf_auth_set_store_secret).
 *   3. The stored hash is compared in constant time, and an unknown key id
 *      and a wrong secret get the same answer.
 */
#include "auth/auth.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/map.h"

struct kf_principal {
    atomic_int refs;
    atomic_bool revoked; /* set once, by kf_auth_remove */
    kf_map_node_t node;  /* in the registry, keyed by key_id */
    char key_id[KF_API_KEY_ID_CHARS + 1];
    char name[KF_API_KEY_NAME_BYTES_MAX + 1];
    char created_by[KF_API_KEY_ID_CHARS + 1];
    uint8_t hash[KF_SHA256_BYTES];
    int64_t created_ms;
    size_t grant_count;
    kf_grant_t grants[]; /* grant_count */
};

struct kf_auth {
    bool enabled;
    bool have_secret;
    kf_hmac_key_t hmac; /* the store secret's pads; read-only once set */
    pthread_rwlock_t lock;
    kf_map_t by_id;                   /* key_id -> principal, under lock */
    atomic_uint_fast64_t revocations; /* keys removed so far */
};

/* ---- scopes ------------------------------------------------------------- */

kf_scope_resource_t kf_scope_resource(kf_scope_t scope) {
    switch (scope) {
    case KF_SCOPE_NONE:
    case KF_SCOPE_METRICS_READ:
    case KF_SCOPE_KEYS_ADMIN: return KF_SCOPE_RESOURCE_NONE;
    case KF_SCOPE_EVENTS_SEND:
    case KF_SCOPE_COORDINATORS_READ:
    case KF_SCOPE_COORDINATORS_WRITE:
    case KF_SCOPE_RUNS_WORK:
    case KF_SCOPE_RUNS_READ: return KF_SCOPE_RESOURCE_WORKFLOW;
    case KF_SCOPE_FUNCTIONS_ADMIN:
    case KF_SCOPE_FUNCTIONS_PUSH:
    case KF_SCOPE_FUNCTIONS_READ:
    case KF_SCOPE_FUNCTIONS_SERVE: return KF_SCOPE_RESOURCE_FUNCTION;
    }
    KF_UNREACHABLE();
}

bool kf_scope_parse(const char *name, kf_scope_t *out) {
    for (int s = 0; s < KF_SCOPE_COUNT; s++) {
        if ((kf_scope_t)s != KF_SCOPE_NONE && strcmp(kf_scope_name((kf_scope_t)s), name) == 0) {
            *out = (kf_scope_t)s;
            return true;
        }
    }
    return false;
}

/* ---- principals --------------------------------------------------------- */

kf_principal_t *kf_principal_create(const kf_principal_spec_t *spec) {
    KF_ASSERT(strlen(spec->key_id) == KF_API_KEY_ID_CHARS);
    KF_ASSERT(spec->grant_count >= 1 && spec->grant_count <= KF_GRANTS_MAX);
    KF_ASSERT(strlen(spec->name) <= KF_API_KEY_NAME_BYTES_MAX);
    KF_ASSERT(strlen(spec->created_by) <= KF_API_KEY_ID_CHARS);
    kf_principal_t *p = kf_xcalloc(1, sizeof *p + spec->grant_count * sizeof p->grants[0]);
    atomic_init(&p->refs, 1);
    atomic_init(&p->revoked, false);
    memcpy(p->key_id, spec->key_id, KF_API_KEY_ID_CHARS + 1);
    strcpy(p->name, spec->name);
    strcpy(p->created_by, spec->created_by);
    memcpy(p->hash, spec->hash, KF_SHA256_BYTES);
    p->created_ms = spec->created_ms;
    p->grant_count = spec->grant_count;
    memcpy(p->grants, spec->grants, spec->grant_count * sizeof p->grants[0]);
    return p;
}

void kf_principal_ref(kf_principal_t *p) {
    KF_ASSERT(atomic_fetch_add(&p->refs, 1) > 0);
}

void kf_principal_unref(kf_principal_t *p) {
    if (p == NULL) {
        return;
    }
    int before = atomic_fetch_sub(&p->refs, 1);
    KF_ASSERT(before > 0);
    if (before == 1) {
        free(p);
    }
}

const char *kf_principal_id(const kf_principal_t *p) {
    return p != NULL ? p->key_id : "";
}

const char *kf_principal_name(const kf_principal_t *p) {
    return p->name;
}

int64_t kf_principal_created_ms(const kf_principal_t *p) {
    return p->created_ms;
}

const char *kf_principal_created_by(const kf_principal_t *p) {
    return p->created_by;
}

const kf_grant_t *kf_principal_grants(const kf_principal_t *p, size_t *count) {
    *count = p->grant_count;
    return p->grants;
}

const uint8_t *kf_principal_hash(const kf_principal_t *p) {
    return p->hash;
}

bool kf_principal_revoked(const kf_principal_t *p) {
    return p != NULL && atomic_load(&p->revoked);
}

kf_status_t kf_principal_check_open(const kf_principal_t *p, kf_error_t *err) {
    if (!kf_principal_revoked(p)) {
        return KF_OK;
    }
    return kf_error_set(err, KF_E_UNAUTHENTICATED,
                        "API key %s was revoked while this call was open", p->key_id);
}

static bool has_scope(const kf_principal_t *p, kf_scope_t scope) {
    for (size_t i = 0; i < p->grant_count; i++) {
        if (p->grants[i].scope == scope) {
            return true;
        }
    }
    return false;
}

bool kf_principal_allows(const kf_principal_t *p, kf_scope_t scope, const char *name) {
    if (p == NULL || scope == KF_SCOPE_NONE) {
        return true;
    }
    for (size_t i = 0; i < p->grant_count; i++) {
        const kf_grant_t *g = &p->grants[i];
        if (g->scope == scope && strncmp(name, g->prefix, strlen(g->prefix)) == 0) {
            return true;
        }
    }
    return false;
}

/* ---- the registry ------------------------------------------------------- */

kf_auth_t *kf_auth_create(bool enabled) {
    kf_auth_t *auth = calloc(1, sizeof *auth);
    if (auth == NULL) {
        return NULL;
    }
    auth->enabled = enabled;
    pthread_rwlock_init(&auth->lock, NULL);
    kf_map_init(&auth->by_id);
    return auth;
}

void kf_auth_destroy(kf_auth_t *auth) {
    if (auth == NULL) {
        return;
    }
    size_t b;
    kf_map_node_t *n = kf_map_first(&auth->by_id, &b);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&auth->by_id, &b, n);
        kf_map_remove(&auth->by_id, n);
        kf_principal_unref(KF_CONTAINER_OF(n, kf_principal_t, node));
        n = next;
    }
    kf_map_deinit(&auth->by_id);
    pthread_rwlock_destroy(&auth->lock);
    if (auth->have_secret) {
        kf_hmac_key_deinit(&auth->hmac);
    }
    free(auth);
}

bool kf_auth_enabled(const kf_auth_t *auth) {
    return auth->enabled;
}

void kf_auth_set_store_secret(kf_auth_t *auth, const uint8_t secret[KF_AUTH_STORE_SECRET_BYTES]) {
    KF_ASSERT(!auth->have_secret);
    kf_hmac_key_init(&auth->hmac, secret, KF_AUTH_STORE_SECRET_BYTES);
    auth->have_secret = true;
}

void kf_auth_hash_secret(const kf_auth_t *auth, const uint8_t secret[KF_API_KEY_SECRET_BYTES],
                         uint8_t out[KF_SHA256_BYTES]) {
    KF_ASSERT(auth->have_secret);
    kf_hmac_sha256(&auth->hmac, secret, KF_API_KEY_SECRET_BYTES, out);
}

void kf_auth_put(kf_auth_t *auth, kf_principal_t *p) {
    pthread_rwlock_wrlock(&auth->lock);
    KF_ASSERT(kf_map_get(&auth->by_id, p->key_id, KF_API_KEY_ID_CHARS) == NULL);
    kf_map_insert(&auth->by_id, &p->node, p->key_id, KF_API_KEY_ID_CHARS);
    pthread_rwlock_unlock(&auth->lock);
}

bool kf_auth_remove(kf_auth_t *auth, const char *key_id) {
    if (strlen(key_id) != KF_API_KEY_ID_CHARS) {
        return false;
    }
    pthread_rwlock_wrlock(&auth->lock);
    kf_map_node_t *n = kf_map_get(&auth->by_id, key_id, KF_API_KEY_ID_CHARS);
    if (n != NULL) {
        kf_map_remove(&auth->by_id, n);
    }
    pthread_rwlock_unlock(&auth->lock);
    if (n == NULL) {
        return false;
    }
    kf_principal_t *p = KF_CONTAINER_OF(n, kf_principal_t, node);
    /* Open calls hold their own references: they see the flag at their
     * next reply, and the engines at their next turn (the counter). */
    atomic_store(&p->revoked, true);
    atomic_fetch_add(&auth->revocations, 1);
    kf_principal_unref(p);
    return true;
}

uint64_t kf_auth_revocations(const kf_auth_t *auth) {
    return auth != NULL ? atomic_load(&((kf_auth_t *)auth)->revocations) : 0;
}

size_t kf_auth_count(kf_auth_t *auth) {
    pthread_rwlock_rdlock(&auth->lock);
    size_t n = auth->by_id.count;
    pthread_rwlock_unlock(&auth->lock);
    return n;
}

/* ---- the key's text ------------------------------------------------------ */

void kf_api_key_format(const char *key_id, const uint8_t secret[KF_API_KEY_SECRET_BYTES],
                       char *out) {
    KF_ASSERT(strlen(key_id) == KF_API_KEY_ID_CHARS);
    memcpy(out, "kf_", 3);
    memcpy(out + 3, key_id, KF_API_KEY_ID_CHARS);
    out[3 + KF_API_KEY_ID_CHARS] = '_';
    kf_hex_encode(secret, KF_API_KEY_SECRET_BYTES, out + 4 + KF_API_KEY_ID_CHARS);
    KF_ASSERT(strlen(out) == KF_API_KEY_TEXT_BYTES);
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    return -1;
}

static bool all_hex(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (hex_digit(p[i]) < 0) {
            return false;
        }
    }
    return true;
}

/* Splits "kf_<id>_<secret hex>" in place: *id points into text. */
static bool parse_key(const char *text, size_t len, const char **id,
                      uint8_t secret[KF_API_KEY_SECRET_BYTES]) {
    if (len != KF_API_KEY_TEXT_BYTES || memcmp(text, "kf_", 3) != 0 ||
        text[3 + KF_API_KEY_ID_CHARS] != '_' || !all_hex(text + 3, KF_API_KEY_ID_CHARS)) {
        return false;
    }
    const char *hex = text + 4 + KF_API_KEY_ID_CHARS;
    for (size_t i = 0; i < KF_API_KEY_SECRET_BYTES; i++) {
        int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            return false;
        }
        secret[i] = (uint8_t)(hi << 4 | lo);
    }
    *id = text + 3;
    return true;
}

bool kf_api_key_parse(const char *text, size_t len, char id[KF_API_KEY_ID_CHARS + 1],
                      uint8_t secret[KF_API_KEY_SECRET_BYTES]) {
    const char *at;
    if (!parse_key(text, len, &at, secret)) {
        return false;
    }
    memcpy(id, at, KF_API_KEY_ID_CHARS);
    id[KF_API_KEY_ID_CHARS] = '\0';
    return true;
}

kf_status_t kf_auth_authenticate(kf_auth_t *auth, kf_scope_t scope, const char *authorization,
                                 size_t len, size_t count, kf_principal_t **out, kf_error_t *err) {
    *out = NULL;
    if (!auth->enabled || scope == KF_SCOPE_NONE) {
        return KF_OK;
    }
    if (authorization == NULL || count == 0) {
        return kf_error_set(err, KF_E_UNAUTHENTICATED,
                            "authorization: missing; send \"authorization: Bearer <API key>\"");
    }
    if (count > 1) {
        return kf_error_set(err, KF_E_UNAUTHENTICATED,
                            "authorization: sent %zu times; send exactly one "
                            "\"authorization: Bearer <API key>\"",
                            count);
    }
    /* RFC 7235: the scheme is case-insensitive; one space before the token. */
    static const char scheme[] = "Bearer ";
    if (len < sizeof scheme - 1 || strncasecmp(authorization, scheme, sizeof scheme - 1) != 0) {
        return kf_error_set(err, KF_E_UNAUTHENTICATED,
                            "authorization: expected \"Bearer <API key>\"");
    }
    const char *token = authorization + sizeof scheme - 1;
    size_t token_len = len - (sizeof scheme - 1);
    const char *id;
    uint8_t secret[KF_API_KEY_SECRET_BYTES];
    if (!parse_key(token, token_len, &id, secret)) {
        return kf_error_set(err, KF_E_UNAUTHENTICATED,
                            "authorization: not a keyflow API key (kf_<id>_<secret>)");
    }
    KF_ASSERT(auth->have_secret);
    pthread_rwlock_rdlock(&auth->lock);
    kf_map_node_t *n = kf_map_get(&auth->by_id, id, KF_API_KEY_ID_CHARS);
    kf_principal_t *p = n != NULL ? KF_CONTAINER_OF(n, kf_principal_t, node) : NULL;
    if (p != NULL) {
        kf_principal_ref(p);
    }
    pthread_rwlock_unlock(&auth->lock);
    /* The HMAC runs whether or not the id is known, so the answer's timing
     * does not tell which key ids exist. */
    uint8_t hash[KF_SHA256_BYTES];
    kf_hmac_sha256(&auth->hmac, secret, sizeof secret, hash);
    static const uint8_t nothing[KF_SHA256_BYTES];
    bool match = kf_ct_equal(hash, p != NULL ? p->hash : nothing, sizeof hash) && p != NULL;
    memset(secret, 0, sizeof secret);
    if (!match) {
        kf_principal_unref(p);
        return kf_error_set(err, KF_E_UNAUTHENTICATED, "authorization: unknown or revoked API key");
    }
    *out = p;
    return KF_OK;
}

/* ---- authorization ------------------------------------------------------ */

static const char *resource_word(kf_scope_t scope) {
    return kf_scope_resource(scope) == KF_SCOPE_RESOURCE_FUNCTION ? "function" : "workflow";
}

static kf_status_t check_name(const kf_principal_t *p, const kf_method_t *m, const char *name,
                              kf_error_t *err) {
    if (kf_principal_allows(p, m->scope, name)) {
        return KF_OK;
    }
    if (name[0] == '\0') {
        return kf_error_set(err, KF_E_PERMISSION,
                            "%s: empty means every %s, but this API key's %s grants are limited "
                            "to name prefixes; name the %ss",
                            m->resource, resource_word(m->scope), kf_scope_name(m->scope),
                            resource_word(m->scope));
    }
    return kf_error_set(err, KF_E_PERMISSION,
                        "%s \"%.*s\": outside this API key's %s grants (name prefixes)",
                        m->resource, KF_GRANT_PREFIX_BYTES_MAX, name, kf_scope_name(m->scope));
}

/* The field of `msg` named by `path` up to `end` (NULL: all of it). */
static const ProtobufCFieldDescriptor *field_named(const ProtobufCMessage *msg, const char *path,
                                                   const char *end) {
    size_t len = end != NULL ? (size_t)(end - path) : strlen(path);
    char part[64];
    KF_ASSERT(len < sizeof part);
    memcpy(part, path, len);
    part[len] = '\0';
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(msg->descriptor, part);
    KF_ASSERT(f != NULL); /* tests/unit/proto checks every row's path */
    return f;
}

/* Whether `f` of `msg` holds a value: a member of a oneof does only while
 * the oneof's case names it (the members share one union, so reading an
 * unset member reads another member's value). */
static bool field_present(const ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f) {
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) == 0) {
        return true;
    }
    uint32_t set = *(const uint32_t *)((const char *)msg + f->quantifier_offset);
    return set == f->id;
}

/* A request whose resource path runs through an unset oneof member names
 * no resource at all: refused, whatever the key's grants. */
static kf_status_t absent_member(const kf_method_t *m, const ProtobufCMessage *msg,
                                 const ProtobufCFieldDescriptor *f, kf_error_t *err) {
    uint32_t set = *(const uint32_t *)((const char *)msg + f->quantifier_offset);
    const ProtobufCFieldDescriptor *holds =
        set != 0 ? protobuf_c_message_descriptor_get_field(msg->descriptor, set) : NULL;
    return kf_error_set(err, KF_E_INVALID,
                        "%s: absent: this %s holds %s%s%s, not %s, so it names no %s", m->resource,
                        msg->descriptor->name, holds ? "\"" : "nothing", holds ? holds->name : "",
                        holds ? "\"" : "", f->name, resource_word(m->scope));
}

/* Checks the names at the dotted `path` of `msg`, through singular messages
 * to a string or repeated string field. */
static kf_status_t authorize_path(const kf_principal_t *p, const kf_method_t *m,
                                  const ProtobufCMessage *msg, const char *path, kf_error_t *err) {
    for (;;) {
        const char *dot = strchr(path, '.');
        const ProtobufCFieldDescriptor *f = field_named(msg, path, dot);
        if (!field_present(msg, f)) {
            return absent_member(m, msg, f, err);
        }
        const char *base = (const char *)msg + f->offset;
        if (dot != NULL) {
            KF_ASSERT(f->type == PROTOBUF_C_TYPE_MESSAGE && f->label != PROTOBUF_C_LABEL_REPEATED);
            msg = *(const ProtobufCMessage *const *)base;
            if (msg == NULL) {
                return check_name(p, m, "", err); /* absent: names nothing */
            }
            path = dot + 1;
            continue;
        }
        KF_ASSERT(f->type == PROTOBUF_C_TYPE_STRING);
        if (f->label != PROTOBUF_C_LABEL_REPEATED) {
            return check_name(p, m, *(const char *const *)base, err);
        }
        size_t n = *(const size_t *)((const char *)msg + f->quantifier_offset);
        char *const *values = *(char *const *const *)base;
        if (n == 0) {
            return check_name(p, m, "", err); /* an empty filter: every name */
        }
        for (size_t i = 0; i < n; i++) {
            kf_status_t st = check_name(p, m, values[i], err);
            if (st != KF_OK) {
                return st;
            }
        }
        return KF_OK;
    }
}

kf_status_t kf_auth_authorize(const kf_principal_t *p, const kf_method_t *m,
                              const ProtobufCMessage *request, kf_error_t *err) {
    if (p == NULL || m->scope == KF_SCOPE_NONE) {
        return KF_OK;
    }
    if (!has_scope(p, m->scope)) {
        return kf_error_set(err, KF_E_PERMISSION, "%s needs the %s scope, which this API key lacks",
                            m->name, kf_scope_name(m->scope));
    }
    if (request == NULL || m->resource == NULL) {
        return KF_OK; /* NULL resource: the engine checks what the request resolves to */
    }
    /* A repeated message on the path (SendEvents' "events.workflow") names
     * the rest of the path in every element. */
    const char *dot = strchr(m->resource, '.');
    const ProtobufCFieldDescriptor *f = field_named(request, m->resource, dot);
    if (dot != NULL && f->label == PROTOBUF_C_LABEL_REPEATED) {
        KF_ASSERT(f->type == PROTOBUF_C_TYPE_MESSAGE);
        size_t n = *(const size_t *)((const char *)request + f->quantifier_offset);
        const ProtobufCMessage *const *elements =
            *(const ProtobufCMessage *const *const *)((const char *)request + f->offset);
        for (size_t i = 0; i < n; i++) {
            kf_status_t st = authorize_path(p, m, elements[i], dot + 1, err);
            if (st != KF_OK) {
                return st;
            }
        }
        return KF_OK; /* no elements: the call names nothing and does nothing */
    }
    return authorize_path(p, m, request, m->resource, err);
}

/* Whether the host part (no brackets, no port) is a loopback literal: an
 * IPv6 one only when it came in brackets, the others only without. */
static bool loopback_literal(const char *host, size_t len, bool bracketed) {
    char text[64];
    if (len == 0 || len >= sizeof text) {
        return false;
    }
    memcpy(text, host, len);
    text[len] = '\0';
    struct in6_addr v6;
    if (bracketed) {
        return inet_pton(AF_INET6, text, &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
    }
    if (strcasecmp(text, "localhost") == 0) {
        return true;
    }
    struct in_addr v4;
    return inet_pton(AF_INET, text, &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

static bool all_digits(const char *p, const char *end) {
    for (; p < end; p++) {
        if (*p < '0' || *p > '9') {
            return false;
        }
    }
    return true;
}

bool kf_host_is_loopback(const char *host, size_t len) {
    const char *end = host + len;
    const char *name = host;
    const char *name_end;
    const char *rest;
    bool bracketed = len > 0 && host[0] == '[';
    if (bracketed) {
        name_end = memchr(host, ']', len);
        if (name_end == NULL) {
            return false;
        }
        name = host + 1;
        rest = name_end + 1;
    } else {
        name_end = memchr(host, ':', len);
        if (name_end == NULL) {
            name_end = end;
        }
        rest = name_end;
    }
    /* After the name: nothing, or ':' and a port. */
    if (rest < end && (*rest != ':' || !all_digits(rest + 1, end))) {
        return false;
    }
    return loopback_literal(name, (size_t)(name_end - name), bracketed);
}

bool kf_origin_is_loopback(const char *origin, size_t len) {
    static const char *const schemes[] = {"http://", "https://"};
    for (size_t i = 0; i < 2; i++) {
        size_t n = strlen(schemes[i]);
        if (len > n && strncasecmp(origin, schemes[i], n) == 0) {
            return kf_host_is_loopback(origin + n, len - n);
        }
    }
    return false;
}

bool kf_address_is_loopback(const char *address) {
    return kf_host_is_loopback(address, strlen(address)); /* the same "host:port" form */
}
