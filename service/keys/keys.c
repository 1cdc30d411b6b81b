/*
 * keys.c - API key records, the store secret and the bootstrap admin key
 * (see keys.h).
 */
#include "keys/keys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/log.h"
#include "base/text.h"
#include "keyflow/v1/keys.pb-c.h"
#include "records/records.pb-c.h"

#define REC_KEY   0x01 /* 0x01 <key id> -> ApiKeyRec */
#define META_BYTE 0x00

static const char secret_name[] = "secret";
static const char bootstrap_name[] = "bootstrap";

struct kf_keys {
    kf_auth_t *auth;
    kf_principal_t **list; /* live keys, oldest first; one reference each */
    size_t count;
    /* The file recovery wrote a new admin key to, until the key is durable
     * (finish) or recovery failed (abandon). */
    const char *bootstrap_path;
    bool have_secret; /* the registry's HMAC key is set */
};

kf_keys_t *kf_keys_create(kf_auth_t *auth) {
    kf_keys_t *keys = kf_xcalloc(1, sizeof *keys);
    keys->auth = auth;
    keys->list = kf_xcalloc(KF_API_KEYS_MAX, sizeof *keys->list);
    return keys;
}

void kf_keys_destroy(kf_keys_t *keys) {
    if (keys == NULL) {
        return;
    }
    for (size_t i = 0; i < keys->count; i++) {
        kf_principal_unref(keys->list[i]);
    }
    free(keys->list);
    free(keys);
}

static void meta_key(kf_key_t *k, const char *name) {
    kf_key_reset(k);
    kf_key_u8(k, META_BYTE);
    kf_key_raw(k, name, strlen(name));
}

static void record_key(kf_key_t *k, const char *key_id) {
    kf_key_reset(k);
    kf_key_u8(k, REC_KEY);
    kf_key_raw(k, key_id, KF_API_KEY_ID_CHARS);
}

static kf_principal_t *find(const kf_keys_t *keys, const char *key_id, size_t *index) {
    for (size_t i = 0; i < keys->count; i++) {
        if (strcmp(kf_principal_id(keys->list[i]), key_id) == 0) {
            *index = i;
            return keys->list[i];
        }
    }
    return NULL;
}

/* Publishes a key: the module's list and the front ends' registry. */
static void publish(kf_keys_t *keys, kf_principal_t *p) {
    KF_ASSERT(keys->count < KF_API_KEYS_MAX);
    kf_principal_ref(p);
    keys->list[keys->count++] = p;
    kf_auth_put(keys->auth, p); /* takes the creator's reference */
}

static void put_record(kf_ctx_t *ctx, const kf_principal_t *p) {
    size_t n;
    const kf_grant_t *grants = kf_principal_grants(p, &n);
    Keyflow__Records__GrantRec recs[KF_GRANTS_MAX];
    Keyflow__Records__GrantRec *ptrs[KF_GRANTS_MAX];
    for (size_t i = 0; i < n; i++) {
        keyflow__records__grant_rec__init(&recs[i]);
        recs[i].scope = (char *)kf_scope_name(grants[i].scope);
        recs[i].prefix = (char *)grants[i].prefix;
        ptrs[i] = &recs[i];
    }
    Keyflow__Records__ApiKeyRec rec = KEYFLOW__RECORDS__API_KEY_REC__INIT;
    rec.key_id = (char *)kf_principal_id(p);
    rec.name = (char *)kf_principal_name(p);
    rec.created_ms = kf_principal_created_ms(p);
    rec.created_by = (char *)kf_principal_created_by(p);
    rec.n_grants = n;
    rec.grants = ptrs;
    rec.hash.data = (uint8_t *)kf_principal_hash(p);
    rec.hash.len = KF_SHA256_BYTES;
    kf_key_t k;
    record_key(&k, rec.key_id);
    kf_ctx_put_msg(ctx, KF_CF_API_KEYS, &k, &rec.base);
}

/* The store secret, if the store has one yet. */
static kf_status_t load_secret(kf_keys_t *keys, kf_ctx_t *ctx, kf_error_t *err) {
    kf_key_t k;
    meta_key(&k, secret_name);
    kf_value_t v = {0};
    bool found;
    kf_status_t st = kf_store_get(ctx->store, KF_CF_API_KEYS, k.bytes, k.len, &v, &found, err);
    if (st != KF_OK || !found) {
        return st;
    }
    if (v.len != KF_AUTH_STORE_SECRET_BYTES) {
        kf_store_value_free(&v);
        return kf_error_set(err, KF_E_CORRUPT, "api_keys: the store secret has %zu bytes, not %d",
                            v.len, KF_AUTH_STORE_SECRET_BYTES);
    }
    kf_auth_set_store_secret(keys->auth, v.data);
    keys->have_secret = true;
    kf_store_value_free(&v);
    return KF_OK;
}

/* Makes the store secret with the first key, in the same write: a store
 * that never had a key writes nothing for keys. */
static void ensure_secret(kf_keys_t *keys, kf_ctx_t *ctx) {
    if (keys->have_secret) {
        return;
    }
    uint8_t secret[KF_AUTH_STORE_SECRET_BYTES];
    kf_rng_bytes(ctx->rng, secret, sizeof secret);
    kf_key_t k;
    meta_key(&k, secret_name);
    kf_ctx_put(ctx, KF_CF_API_KEYS, &k, secret, sizeof secret);
    kf_auth_set_store_secret(keys->auth, secret);
    memset(secret, 0, sizeof secret);
    keys->have_secret = true;
}

/* A fresh key: random id (unique among the live keys) and secret. */
/* A key: the given id and secret (an operator's --admin-key-file), or a
 * random id (unique among the live keys) and secret, whose text goes to
 * `text` (NULL: not wanted). */
static kf_principal_t *make_key(kf_keys_t *keys, kf_ctx_t *ctx, const char *name,
                                const kf_grant_t *grants, size_t n, const char *created_by,
                                const char *given_id, const uint8_t *given_secret, char *text) {
    ensure_secret(keys, ctx);
    char id[KF_API_KEY_ID_CHARS + 1];
    uint8_t secret[KF_API_KEY_SECRET_BYTES];
    size_t ignored;
    if (given_id != NULL) {
        memcpy(id, given_id, sizeof id);
        memcpy(secret, given_secret, sizeof secret);
    } else {
        do {
            uint8_t raw[KF_API_KEY_ID_CHARS / 2];
            kf_rng_bytes(ctx->rng, raw, sizeof raw);
            kf_hex_encode(raw, sizeof raw, id);
        } while (find(keys, id, &ignored) != NULL);
        kf_rng_bytes(ctx->rng, secret, sizeof secret);
    }
    KF_ASSERT(find(keys, id, &ignored) == NULL);
    uint8_t hash[KF_SHA256_BYTES];
    kf_auth_hash_secret(keys->auth, secret, hash);
    if (text != NULL) {
        kf_api_key_format(id, secret, text);
    }
    memset(secret, 0, sizeof secret);
    kf_principal_spec_t spec = {
        .key_id = id,
        .name = name,
        .hash = hash,
        .grants = grants,
        .grant_count = n,
        .created_ms = ctx->now_ms,
        .created_by = created_by,
    };
    kf_principal_t *p = kf_principal_create(&spec);
    put_record(ctx, p);
    publish(keys, p);
    return p;
}

/* ---- recovery ------------------------------------------------------------ */

static kf_status_t load_record(kf_keys_t *keys, const void *v, size_t vlen, kf_error_t *err) {
    Keyflow__Records__ApiKeyRec *rec = keyflow__records__api_key_rec__unpack(NULL, vlen, v);
    bool ok = rec != NULL && strlen(rec->key_id) == KF_API_KEY_ID_CHARS &&
              rec->hash.len == KF_SHA256_BYTES && rec->n_grants >= 1 &&
              rec->n_grants <= KF_GRANTS_MAX && strlen(rec->name) <= KF_API_KEY_NAME_BYTES_MAX &&
              strlen(rec->created_by) <= KF_API_KEY_ID_CHARS && keys->count < KF_API_KEYS_MAX;
    kf_grant_t grants[KF_GRANTS_MAX];
    for (size_t i = 0; ok && i < rec->n_grants; i++) {
        ok = kf_scope_parse(rec->grants[i]->scope, &grants[i].scope) &&
             strlen(rec->grants[i]->prefix) <= KF_GRANT_PREFIX_BYTES_MAX;
        if (ok) {
            strcpy(grants[i].prefix, rec->grants[i]->prefix);
        }
    }
    size_t ignored;
    ok = ok && find(keys, rec->key_id, &ignored) == NULL;
    if (!ok) {
        keyflow__records__api_key_rec__free_unpacked(rec, NULL);
        return kf_error_set(err, KF_E_CORRUPT, "api_keys: malformed key record");
    }
    kf_principal_spec_t spec = {
        .key_id = rec->key_id,
        .name = rec->name,
        .hash = rec->hash.data,
        .grants = grants,
        .grant_count = rec->n_grants,
        .created_ms = rec->created_ms,
        .created_by = rec->created_by,
    };
    kf_principal_t *p = kf_principal_create(&spec);
    keyflow__records__api_key_rec__free_unpacked(rec, NULL);
    publish(keys, p);
    return KF_OK;
}

static int by_created(const void *a, const void *b) {
    int64_t x = kf_principal_created_ms(*(kf_principal_t *const *)a);
    int64_t y = kf_principal_created_ms(*(kf_principal_t *const *)b);
    if (x != y) {
        return x < y ? -1 : 1;
    }
    return strcmp(kf_principal_id(*(kf_principal_t *const *)a),
                  kf_principal_id(*(kf_principal_t *const *)b));
}

static kf_status_t load_records(kf_keys_t *keys, kf_ctx_t *ctx, kf_error_t *err) {
    uint8_t lower = REC_KEY, upper = REC_KEY + 1;
    kf_iter_t *it;
    kf_status_t st = kf_iter_create(ctx->store, KF_CF_API_KEYS, &lower, 1, &upper, 1, &it, err);
    if (st != KF_OK) {
        return st;
    }
    for (kf_iter_seek_first(it); st == KF_OK && kf_iter_valid(it); kf_iter_next(it)) {
        size_t vlen;
        const void *v = kf_iter_value(it, &vlen);
        st = load_record(keys, v, vlen, err);
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    qsort(keys->list, keys->count, sizeof *keys->list, by_created);
    return st;
}

/* Every scope, no prefix. */
static size_t admin_grants(kf_grant_t grants[KF_GRANTS_MAX]) {
    size_t n = 0;
    for (int s = 0; s < KF_SCOPE_COUNT; s++) {
        if ((kf_scope_t)s != KF_SCOPE_NONE) {
            grants[n].scope = (kf_scope_t)s;
            grants[n].prefix[0] = '\0';
            n++;
        }
    }
    return n;
}
_Static_assert(KF_SCOPE_COUNT - 1 <= KF_GRANTS_MAX, "an admin key holds every scope");

/* The operator's admin key (--admin-key-file): "kf_<id>_<secret>" and an
 * optional newline. */
static kf_status_t read_admin_key(const char *path, char id[KF_API_KEY_ID_CHARS + 1],
                                  uint8_t secret[KF_API_KEY_SECRET_BYTES], kf_error_t *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return kf_error_set(err, KF_E_IO, "admin key file %s: %s", path, strerror(errno));
    }
    char text[KF_API_KEY_TEXT_BYTES + 4];
    ssize_t n = read(fd, text, sizeof text);
    close(fd);
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r')) {
        n--;
    }
    bool ok = n > 0 && kf_api_key_parse(text, (size_t)n, id, secret);
    memset(text, 0, sizeof text);
    if (!ok) {
        return kf_error_set(err, KF_E_INVALID,
                            "admin key file %s: expected one line kf_<16 hex digits>_<64 hex "
                            "digits> (docs/security.md says how to make one)",
                            path);
    }
    return KF_OK;
}

/* Bootstrap from the operator's key instead of writing a new one: it
 * becomes the admin key once, at the store's first start with keys on (or
 * with --new-admin-key). A key the store knows already is simply there. */
static kf_status_t adopt_admin_key(kf_keys_t *keys, kf_ctx_t *ctx, const kf_key_t *marker,
                                   bool bootstrapped, kf_error_t *err) {
    const kf_engine_config_t *config = ctx->config;
    char id[KF_API_KEY_ID_CHARS + 1];
    uint8_t secret[KF_API_KEY_SECRET_BYTES];
    kf_status_t st = read_admin_key(config->admin_key_path, id, secret, err);
    if (st != KF_OK) {
        return st;
    }
    size_t ignored;
    if (find(keys, id, &ignored) != NULL) {
        memset(secret, 0, sizeof secret);
        return KF_OK;
    }
    if (bootstrapped && !config->new_admin_key) {
        memset(secret, 0, sizeof secret);
        kf_log(KF_LOG_WARN, "keys",
               "admin key file %s holds key %s, which this store does not have (it was revoked, "
               "or the store was bootstrapped before): ignored; --new-admin-key adopts it",
               config->admin_key_path, id);
        return KF_OK;
    }
    if (keys->count >= KF_API_KEYS_MAX) {
        memset(secret, 0, sizeof secret);
        return kf_error_set(err, KF_E_LIMIT, "api_keys: KF_API_KEYS_MAX keys; revoke one first");
    }
    kf_grant_t grants[KF_GRANTS_MAX];
    size_t n = admin_grants(grants);
    make_key(keys, ctx, "admin (--admin-key-file)", grants, n, "", id, secret, NULL);
    memset(secret, 0, sizeof secret);
    int64_t now = ctx->now_ms;
    kf_ctx_put(ctx, KF_CF_API_KEYS, marker, &now, sizeof now);
    kf_log(KF_LOG_INFO, "keys", "adopted admin API key %s from %s", id, config->admin_key_path);
    return KF_OK;
}

/* Makes a new (or removed) name in path's directory durable. Best effort:
 * some filesystems refuse fsync on a directory, and the file's own fsync
 * already made its contents durable. */
static void sync_parent(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        snprintf(dir, sizeof dir, ".");
    } else {
        snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* Writes a key's text to a new file (mode 0600, never over an existing
 * one or through a symlink) and makes it durable, name included. On
 * failure nothing is left behind. */
static kf_status_t write_key_file(const char *path, const char *text, kf_error_t *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        return kf_error_set(err, KF_E_IO,
                            "cannot create the bootstrap admin key file %s: %s; nothing was "
                            "stored (give a writable path with --bootstrap-key-file, or adopt a "
                            "key with --admin-key-file)",
                            path, strerror(errno));
    }
    char line[KF_API_KEY_TEXT_BYTES + 2];
    int n = snprintf(line, sizeof line, "%s\n", text);
    bool ok = write(fd, line, (size_t)n) == n && fsync(fd) == 0;
    int saved = errno;
    memset(line, 0, sizeof line);
    if (close(fd) != 0 && ok) {
        ok = false;
        saved = errno;
    }
    if (!ok) {
        unlink(path);
        return kf_error_set(err, KF_E_IO,
                            "cannot write the bootstrap admin key file %s: %s; nothing was stored",
                            path, strerror(saved));
    }
    sync_parent(path);
    return KF_OK;
}

kf_status_t kf_keys_recover(kf_keys_t *keys, kf_ctx_t *ctx, kf_error_t *err) {
    kf_status_t st = load_secret(keys, ctx, err);
    if (st == KF_OK) {
        st = load_records(keys, ctx, err);
    }
    if (st != KF_OK || !kf_auth_enabled(keys->auth)) {
        return st;
    }
    kf_key_t marker;
    meta_key(&marker, bootstrap_name);
    kf_value_t v = {0};
    bool bootstrapped;
    st = kf_store_get(ctx->store, KF_CF_API_KEYS, marker.bytes, marker.len, &v, &bootstrapped, err);
    kf_store_value_free(&v);
    if (st != KF_OK) {
        return st;
    }
    const kf_engine_config_t *config = ctx->config;
    if (config->admin_key_path != NULL) {
        return adopt_admin_key(keys, ctx, &marker, bootstrapped, err);
    }
    if (bootstrapped && !config->new_admin_key) {
        return KF_OK;
    }
    KF_ASSERT(config->bootstrap_key_path != NULL);
    struct stat sb;
    if (lstat(config->bootstrap_key_path, &sb) == 0) {
        return kf_error_set(err, KF_E_EXISTS,
                            "bootstrap key file %s already exists; it is not this store's key: "
                            "move it away",
                            config->bootstrap_key_path);
    }
    if (keys->count >= KF_API_KEYS_MAX) {
        return kf_error_set(err, KF_E_LIMIT, "api_keys: KF_API_KEYS_MAX keys; revoke one first");
    }
    kf_grant_t grants[KF_GRANTS_MAX];
    size_t n = admin_grants(grants);
    char text[KF_API_KEY_TEXT_BYTES + 1];
    kf_principal_t *p =
        make_key(keys, ctx, bootstrapped ? "admin (--new-admin-key)" : "bootstrap admin", grants, n,
                 "", NULL, NULL, text);
    /* The file first: a key whose file could not be written must never be
     * committed (nobody would hold it, and the marker would stop the next
     * start from making another). On failure the caller writes nothing. */
    st = write_key_file(config->bootstrap_key_path, text, err);
    memset(text, 0, sizeof text);
    if (st != KF_OK) {
        return st;
    }
    int64_t now = ctx->now_ms;
    kf_ctx_put(ctx, KF_CF_API_KEYS, &marker, &now, sizeof now);
    keys->bootstrap_path = config->bootstrap_key_path;
    kf_log(KF_LOG_INFO, "keys", "made admin API key %s", kf_principal_id(p));
    return KF_OK;
}

void kf_keys_finish_recovery(kf_keys_t *keys) {
    if (keys->bootstrap_path == NULL) {
        return;
    }
    /* The path, never the key. */
    kf_log(KF_LOG_WARN, "keys",
           "wrote the admin API key to %s (mode 0600): use it to create keys "
           "(keyflow keys create), then move it somewhere safe or delete it",
           keys->bootstrap_path);
    keys->bootstrap_path = NULL;
}

void kf_keys_abandon_recovery(kf_keys_t *keys) {
    if (keys->bootstrap_path == NULL) {
        return;
    }
    /* Its key was never committed: the next start makes another, and must
     * not find this file in the way (nor must anyone use a dead key). */
    const char *path = keys->bootstrap_path;
    keys->bootstrap_path = NULL;
    if (unlink(path) != 0 && errno != ENOENT) {
        kf_log(KF_LOG_ERROR, "keys",
               "cannot remove %s, which holds a key that was never stored: %s; delete it before "
               "the next start",
               path, strerror(errno));
        return;
    }
    sync_parent(path);
}

/* ---- the RPCs ------------------------------------------------------------- */

static Keyflow__V1__ApiKey *key_to_pb(kf_arena_t *arena, const kf_principal_t *p) {
    Keyflow__V1__ApiKey *k = kf_arena_new(arena, sizeof *k);
    keyflow__v1__api_key__init(k);
    k->key_id = (char *)kf_principal_id(p);
    k->name = (char *)kf_principal_name(p);
    k->created_ms = kf_principal_created_ms(p);
    k->created_by = (char *)kf_principal_created_by(p);
    size_t n;
    const kf_grant_t *grants = kf_principal_grants(p, &n);
    k->n_grants = n;
    k->grants = kf_arena_new(arena, n * sizeof *k->grants);
    for (size_t i = 0; i < n; i++) {
        Keyflow__V1__Grant *g = kf_arena_new(arena, sizeof *g);
        keyflow__v1__grant__init(g);
        g->scope = (char *)kf_scope_name(grants[i].scope);
        g->prefix = (char *)grants[i].prefix;
        k->grants[i] = g;
    }
    return k;
}

/* Copies the strings a response points at into the arena: the principal
 * may be freed (revoked) before the reply is packed. */
static void detach(kf_arena_t *arena, Keyflow__V1__ApiKey *k) {
    k->key_id = kf_arena_strdup(arena, k->key_id);
    k->name = kf_arena_strdup(arena, k->name);
    k->created_by = kf_arena_strdup(arena, k->created_by);
    for (size_t i = 0; i < k->n_grants; i++) {
        k->grants[i]->prefix = kf_arena_strdup(arena, k->grants[i]->prefix);
    }
}

static kf_status_t check_grants(const Keyflow__V1__CreateKeyRequest *req, kf_grant_t *grants,
                                kf_error_t *err) {
    if (req->n_grants == 0 || req->n_grants > KF_GRANTS_MAX) {
        return kf_error_set(err, KF_E_INVALID, "grants: 1..%d (KF_GRANTS_MAX), got %zu",
                            KF_GRANTS_MAX, req->n_grants);
    }
    for (size_t i = 0; i < req->n_grants; i++) {
        const Keyflow__V1__Grant *g = req->grants[i];
        if (!kf_scope_parse(g->scope, &grants[i].scope)) {
            return kf_error_set(
                err, KF_E_INVALID,
                "grants[%zu].scope: \"%.64s\" is not a scope (see docs/security.md)", i, g->scope);
        }
        size_t len = strlen(g->prefix);
        if (len > 0 && kf_scope_resource(grants[i].scope) == KF_SCOPE_RESOURCE_NONE) {
            return kf_error_set(err, KF_E_INVALID, "grants[%zu].prefix: %s takes no prefix", i,
                                g->scope);
        }
        if (len > KF_GRANT_PREFIX_BYTES_MAX) {
            return kf_error_set(err, KF_E_INVALID,
                                "grants[%zu].prefix: at most %d bytes (KF_GRANT_PREFIX_BYTES_MAX), "
                                "got %zu",
                                i, KF_GRANT_PREFIX_BYTES_MAX, len);
        }
        /* A prefix is compared with workflow names, which refuse control
         * bytes and bad UTF-8 (text.h): a prefix holding one matches no
         * name, and would show up in logs and listings as a key that
         * silently allows nothing, or breaks the line it is printed on. */
        char field[48];
        snprintf(field, sizeof field, "grants[%zu].prefix", i);
        kf_status_t st =
            kf_check_identifier(field, g->prefix, KF_GRANT_PREFIX_BYTES_MAX, false, err);
        if (st != KF_OK) {
            return st;
        }
        memcpy(grants[i].prefix, g->prefix, len + 1);
    }
    return KF_OK;
}

/* Who created or revoked a key, for the log. */
static const char *by_whom(const kf_cmd_t *cmd) {
    return cmd->principal != NULL ? kf_principal_id(cmd->principal) : "(no key: auth off)";
}

/* The Keys service works only while keys are checked: a key made while they
 * are off would be made by anyone who can reach the port (or a web page, on
 * loopback), and would hold its grants at the first start with --auth. On
 * refusal cmd is failed. */
static bool keys_are_on(const kf_keys_t *keys, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    if (kf_auth_enabled(keys->auth)) {
        return true;
    }
    kf_error_set(&cmd->error, KF_E_PRECONDITION,
                 "API keys are off (a loopback listener without --auth, or "
                 "--insecure-no-auth): keys are managed only while keyflowd checks them; "
                 "restart it with --auth and use the bootstrap admin key");
    kf_ctx_fail(ctx, cmd);
    return false;
}

void kf_keys_create_key(kf_keys_t *keys, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__CreateKeyRequest *req = (const void *)cmd->request;
    kf_error_t *err = &cmd->error;
    if (!keys_are_on(keys, ctx, cmd)) {
        return;
    }
    kf_grant_t grants[KF_GRANTS_MAX];
    size_t name_len = strlen(req->name);
    if (name_len == 0 || name_len > KF_API_KEY_NAME_BYTES_MAX) {
        kf_error_set(err, KF_E_INVALID, "name: 1..%d bytes (KF_API_KEY_NAME_BYTES_MAX), got %zu",
                     KF_API_KEY_NAME_BYTES_MAX, name_len);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (check_grants(req, grants, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (keys->count >= KF_API_KEYS_MAX) {
        kf_error_set(err, KF_E_LIMIT,
                     "at most %d live API keys (KF_API_KEYS_MAX); revoke one first",
                     KF_API_KEYS_MAX);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    Keyflow__V1__CreateKeyResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__create_key_response__init(resp);
    resp->api_key = kf_arena_alloc(cmd->arena, KF_API_KEY_TEXT_BYTES + 1);
    kf_principal_t *p = make_key(keys, ctx, req->name, grants, req->n_grants,
                                 kf_principal_id(cmd->principal), NULL, NULL, resp->api_key);
    resp->key = key_to_pb(cmd->arena, p);
    detach(cmd->arena, resp->key);
    /* The name is the caller's text: a field, which the log quotes and
     * escapes, so that no name can end its quotes and forge the rest of the
     * line (or another line). */
    kf_log_kv(KF_LOG_INFO, "keys", "created API key", KF_LOG_STR("key_id", kf_principal_id(p)),
              KF_LOG_STR("name", req->name), KF_LOG_STR("by", by_whom(cmd)));
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

void kf_keys_list(kf_keys_t *keys, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    if (!keys_are_on(keys, ctx, cmd)) {
        return;
    }
    Keyflow__V1__ListKeysResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__list_keys_response__init(resp);
    resp->n_keys = keys->count;
    resp->keys = kf_arena_new(cmd->arena, (keys->count + 1) * sizeof *resp->keys);
    for (size_t i = 0; i < keys->count; i++) {
        resp->keys[i] = key_to_pb(cmd->arena, keys->list[i]);
        detach(cmd->arena, resp->keys[i]);
    }
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

static bool holds_scope(const kf_principal_t *p, kf_scope_t scope) {
    size_t n;
    const kf_grant_t *g = kf_principal_grants(p, &n);
    for (size_t i = 0; i < n; i++) {
        if (g[i].scope == scope) {
            return true;
        }
    }
    return false;
}

void kf_keys_revoke(kf_keys_t *keys, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__RevokeKeyRequest *req = (const void *)cmd->request;
    kf_error_t *err = &cmd->error;
    if (!keys_are_on(keys, ctx, cmd)) {
        return;
    }
    size_t index;
    kf_principal_t *p = find(keys, req->key_id, &index);
    if (p == NULL) {
        kf_error_set(err, KF_E_NOT_FOUND, "key_id: no live API key \"%.32s\"", req->key_id);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    /* Revoking the last admin key would leave nobody able to make keys but
     * a restart with --new-admin-key. */
    size_t admins = 0;
    for (size_t i = 0; i < keys->count; i++) {
        admins += holds_scope(keys->list[i], KF_SCOPE_KEYS_ADMIN);
    }
    if (admins == 1 && holds_scope(p, KF_SCOPE_KEYS_ADMIN)) {
        kf_error_set(err, KF_E_PRECONDITION,
                     "key_id: %s is the last key with keys:admin; create another admin key "
                     "before revoking it",
                     req->key_id);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    kf_key_t k;
    record_key(&k, kf_principal_id(p));
    kf_ctx_delete(ctx, KF_CF_API_KEYS, &k);
    Keyflow__V1__RevokeKeyResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__revoke_key_response__init(resp);
    resp->key = key_to_pb(cmd->arena, p);
    detach(cmd->arena, resp->key);
    kf_log_kv(KF_LOG_INFO, "keys", "revoked API key", KF_LOG_STR("key_id", kf_principal_id(p)),
              KF_LOG_STR("name", kf_principal_name(p)), KF_LOG_STR("by", by_whom(cmd)));
    KF_ASSERT(kf_auth_remove(keys->auth, kf_principal_id(p)));
    keys->list[index] = keys->list[--keys->count];
    /* Keep the list oldest first. */
    qsort(keys->list, keys->count, sizeof *keys->list, by_created);
    kf_principal_unref(p);
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}
