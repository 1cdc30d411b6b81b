/*
 * tls.c - PEM loading and checking with OpenSSL (see tls.h).
 *
 * Invariants
 *   1. A kf_tls_t is complete when it exists: at least one certificate, a
 *      key matching the first one, the client CAs when asked for. Nothing
 *      in it changes after kf_tls_load returns, so readers need no lock.
 *   2. The PEM text is kept as read (the gRPC core takes PEM strings) next
 *      to the parsed objects (OpenSSL contexts take those): both come from
 *      the same bytes, so both front ends always serve the same identity.
 *   3. No call here prompts: an encrypted key is refused, never asked for.
 */
#include "tls/tls.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "base/assert.h"
#include "base/limits.h"
#include "base/log.h"

struct kf_tls {
    atomic_int refs;
    char *cert_pem;
    char *key_pem;
    char *client_ca_pem;         /* NULL without mTLS */
    STACK_OF(X509) * certs;      /* the leaf first, then its chain */
    EVP_PKEY *key;               /* matches certs[0] */
    STACK_OF(X509) * client_cas; /* NULL without mTLS */
};

/* The most recent OpenSSL error as text (the queue is cleared). */
static const char *openssl_reason(char *buf, size_t cap) {
    unsigned long e = ERR_peek_last_error();
    if (e == 0) {
        snprintf(buf, cap, "no detail from OpenSSL");
    } else {
        ERR_error_string_n(e, buf, cap);
    }
    ERR_clear_error();
    return buf;
}

/* Reads the whole file into a NUL-terminated malloc'd string. */
static kf_status_t read_pem(const char *what, const char *path, char **out, kf_error_t *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return kf_error_set(err, KF_E_IO, "%s %s: %s", what, path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kf_error_set(err, KF_E_INVALID, "%s %s: not a regular file", what, path);
    }
    if (st.st_size > KF_TLS_PEM_BYTES_MAX) {
        close(fd);
        return kf_error_set(err, KF_E_TOO_LARGE,
                            "%s %s: %lld bytes, more than %d (KF_TLS_PEM_BYTES_MAX)", what, path,
                            (long long)st.st_size, KF_TLS_PEM_BYTES_MAX);
    }
    char *text = malloc((size_t)st.st_size + 1);
    if (text == NULL) {
        close(fd);
        return kf_error_set(err, KF_E_NOMEM, "%s %s: out of memory", what, path);
    }
    size_t used = 0;
    while (used < (size_t)st.st_size) {
        ssize_t n = read(fd, text + used, (size_t)st.st_size - used);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            free(text);
            close(fd);
            return kf_error_set(err, KF_E_IO, "%s %s: %s", what, path,
                                n < 0 ? strerror(e) : "the file shrank while being read");
        }
        used += (size_t)n;
    }
    close(fd);
    text[used] = '\0';
    *out = text;
    return KF_OK;
}

/* Every certificate in the PEM text, in order; none is an error. */
static kf_status_t parse_certs(const char *what, const char *path, const char *pem,
                               STACK_OF(X509) * *out, kf_error_t *err) {
    char reason[256];
    BIO *bio = BIO_new_mem_buf(pem, -1);
    STACK_OF(X509) *certs = sk_X509_new_null();
    if (bio == NULL || certs == NULL) {
        BIO_free(bio);
        sk_X509_free(certs);
        return kf_error_set(err, KF_E_NOMEM, "%s %s: out of memory", what, path);
    }
    ERR_clear_error();
    X509 *cert;
    while ((cert = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL) {
        if (sk_X509_push(certs, cert) == 0) {
            X509_free(cert);
            BIO_free(bio);
            sk_X509_pop_free(certs, X509_free);
            return kf_error_set(err, KF_E_NOMEM, "%s %s: out of memory", what, path);
        }
    }
    /* The loop ends at the end of the text (no further "BEGIN" line) or at
     * a block that does not parse; only the first is fine. */
    unsigned long e = ERR_peek_last_error();
    bool clean_end =
        e == 0 || (ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE);
    BIO_free(bio);
    if (!clean_end || sk_X509_num(certs) == 0) {
        sk_X509_pop_free(certs, X509_free);
        if (!clean_end) {
            return kf_error_set(err, KF_E_INVALID, "%s %s: a certificate does not parse: %s", what,
                                path, openssl_reason(reason, sizeof reason));
        }
        ERR_clear_error();
        return kf_error_set(err, KF_E_INVALID, "%s %s: no PEM certificate in it", what, path);
    }
    ERR_clear_error();
    *out = certs;
    return KF_OK;
}

/* Never prompts for a passphrase: an encrypted key fails to load. */
static int no_passphrase(char *buf, int size, int rwflag, void *u) {
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)u;
    return 0;
}

static kf_status_t parse_key(const char *path, const char *pem, EVP_PKEY **out, kf_error_t *err) {
    char reason[256];
    BIO *bio = BIO_new_mem_buf(pem, -1);
    if (bio == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "key file %s: out of memory", path);
    }
    ERR_clear_error();
    EVP_PKEY *key = PEM_read_bio_PrivateKey(bio, NULL, no_passphrase, NULL);
    BIO_free(bio);
    if (key == NULL) {
        return kf_error_set(err, KF_E_INVALID,
                            "key file %s: no unencrypted PEM private key in it: %s", path,
                            openssl_reason(reason, sizeof reason));
    }
    *out = key;
    return KF_OK;
}

static void tls_free(kf_tls_t *tls) {
    free(tls->cert_pem);
    free(tls->key_pem);
    free(tls->client_ca_pem);
    if (tls->certs != NULL) {
        sk_X509_pop_free(tls->certs, X509_free);
    }
    EVP_PKEY_free(tls->key);
    if (tls->client_cas != NULL) {
        sk_X509_pop_free(tls->client_cas, X509_free);
    }
    free(tls);
}

/* A private key anyone can read is worth a line in the log, not a refusal
 * (a group-readable one is normal: a Kubernetes secret with fsGroup). */
static void warn_key_mode(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & S_IRWXO) != 0) {
        kf_log(KF_LOG_WARN, "tls", "key file %s is accessible to every user (mode %03o)", path,
               (unsigned)(st.st_mode & 0777));
    }
}

kf_status_t kf_tls_load(const kf_tls_files_t *files, kf_tls_t **out, kf_error_t *err) {
    KF_ASSERT(files != NULL && files->cert_path != NULL && files->key_path != NULL);
    *out = NULL;
    kf_tls_t *tls = calloc(1, sizeof *tls);
    if (tls == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "out of memory loading TLS files");
    }
    atomic_init(&tls->refs, 1);
    kf_status_t st = read_pem("certificate file", files->cert_path, &tls->cert_pem, err);
    if (st == KF_OK) {
        st = parse_certs("certificate file", files->cert_path, tls->cert_pem, &tls->certs, err);
    }
    if (st == KF_OK) {
        st = read_pem("key file", files->key_path, &tls->key_pem, err);
    }
    if (st == KF_OK) {
        st = parse_key(files->key_path, tls->key_pem, &tls->key, err);
    }
    if (st == KF_OK && X509_check_private_key(sk_X509_value(tls->certs, 0), tls->key) != 1) {
        ERR_clear_error();
        st = kf_error_set(err, KF_E_INVALID,
                          "key file %s: the key does not match the first certificate of %s",
                          files->key_path, files->cert_path);
    }
    if (st == KF_OK && files->client_ca_path != NULL) {
        st = read_pem("client CA file", files->client_ca_path, &tls->client_ca_pem, err);
        if (st == KF_OK) {
            st = parse_certs("client CA file", files->client_ca_path, tls->client_ca_pem,
                             &tls->client_cas, err);
        }
    }
    if (st != KF_OK) {
        tls_free(tls);
        return st;
    }
    warn_key_mode(files->key_path);
    *out = tls;
    return KF_OK;
}

void kf_tls_ref(kf_tls_t *tls) {
    KF_ASSERT(atomic_fetch_add(&tls->refs, 1) > 0);
}

void kf_tls_unref(kf_tls_t *tls) {
    if (tls == NULL) {
        return;
    }
    int before = atomic_fetch_sub(&tls->refs, 1);
    KF_ASSERT(before > 0);
    if (before == 1) {
        tls_free(tls);
    }
}

const char *kf_tls_cert_pem(const kf_tls_t *tls) {
    return tls->cert_pem;
}

const char *kf_tls_key_pem(const kf_tls_t *tls) {
    return tls->key_pem;
}

const char *kf_tls_client_ca_pem(const kf_tls_t *tls) {
    return tls->client_ca_pem;
}

bool kf_tls_requires_client_cert(const kf_tls_t *tls) {
    return tls->client_cas != NULL;
}

bool kf_tls_validity(const kf_tls_t *tls, char *out, size_t cap) {
    X509 *leaf = sk_X509_value(tls->certs, 0);
    char subject[256];
    X509_NAME_oneline(X509_get_subject_name(leaf), subject, sizeof subject);
    char until[64] = "?";
    BIO *bio = BIO_new(BIO_s_mem());
    if (bio != NULL && ASN1_TIME_print(bio, X509_get0_notAfter(leaf)) == 1) {
        int n = BIO_read(bio, until, (int)sizeof until - 1);
        until[n > 0 ? n : 0] = '\0';
    }
    BIO_free(bio);
    const char *problem = NULL;
    if (X509_cmp_current_time(X509_get0_notAfter(leaf)) < 0) {
        problem = "EXPIRED";
    } else if (X509_cmp_current_time(X509_get0_notBefore(leaf)) > 0) {
        problem = "NOT YET VALID";
    }
    snprintf(out, cap, "certificate %s valid until %s%s%s%s", subject, until, problem ? " (" : "",
             problem ? problem : "", problem ? ")" : "");
    return problem == NULL;
}

kf_status_t kf_tls_server_ctx_create(const kf_tls_t *tls, bool verify_clients, SSL_CTX **out,
                                     kf_error_t *err) {
    char reason[256];
    *out = NULL;
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL) {
        return kf_error_set(err, KF_E_INTERNAL, "tls: cannot create an OpenSSL context: %s",
                            openssl_reason(reason, sizeof reason));
    }
    /* Session resumption with client verification needs an ID context;
     * renegotiation is what h2o does not support. */
    static const unsigned char session_context[] = "keyflow";
    bool ok =
        SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) == 1 &&
        SSL_CTX_set_session_id_context(ctx, session_context, sizeof session_context - 1) == 1 &&
        SSL_CTX_use_certificate(ctx, sk_X509_value(tls->certs, 0)) == 1;
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    for (int i = 1; ok && i < sk_X509_num(tls->certs); i++) {
        ok = SSL_CTX_add1_chain_cert(ctx, sk_X509_value(tls->certs, i)) == 1;
    }
    ok = ok && SSL_CTX_use_PrivateKey(ctx, tls->key) == 1 && SSL_CTX_check_private_key(ctx) == 1;
    if (ok && tls->client_cas != NULL && verify_clients) {
        X509_STORE *store = SSL_CTX_get_cert_store(ctx);
        STACK_OF(X509_NAME) *names = sk_X509_NAME_new_null();
        ok = names != NULL;
        for (int i = 0; ok && i < sk_X509_num(tls->client_cas); i++) {
            X509 *ca = sk_X509_value(tls->client_cas, i);
            X509_NAME *name = X509_NAME_dup(X509_get_subject_name(ca));
            ok = X509_STORE_add_cert(store, ca) == 1 && name != NULL &&
                 sk_X509_NAME_push(names, name) > 0;
            if (!ok) {
                X509_NAME_free(name);
            }
        }
        if (ok) {
            SSL_CTX_set_client_CA_list(ctx, names); /* takes the names */
            SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
        } else if (names != NULL) {
            sk_X509_NAME_pop_free(names, X509_NAME_free);
        }
    }
    if (!ok) {
        kf_error_set(err, KF_E_INTERNAL, "tls: OpenSSL refused the certificate or key: %s",
                     openssl_reason(reason, sizeof reason));
        SSL_CTX_free(ctx);
        return KF_E_INTERNAL;
    }
    *out = ctx;
    return KF_OK;
}
