/*
 * tls.h - the listeners' TLS material: the server's certificate chain, its
 * private key and, for mTLS, the CAs that sign client certificates. Read
 * from PEM files, checked once with OpenSSL (the library both gRPC and h2o
 * use on Debian), and shared by the gRPC front end and the HTTP gateway.
 *
 * A kf_tls_t is immutable and reference counted: a reload (SIGHUP) loads a
 * new one and hands it to both front ends, while connections that began
 * under the old one keep it. Loading is all or nothing: on any error the
 * caller has nothing new and keeps serving what it had.
 *
 * Threads: load on any thread; a loaded kf_tls_t may be read and ref'd or
 * unref'd from any thread.
 */
#ifndef KF_TLS_TLS_H
#define KF_TLS_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/ssl.h>

#include "base/status.h"

typedef struct kf_tls kf_tls_t;

typedef struct kf_tls_files {
    const char *cert_path;      /* PEM: the server's certificate, then its chain */
    const char *key_path;       /* PEM: the certificate's private key */
    const char *client_ca_path; /* PEM: CAs of client certificates (mTLS), or NULL */
} kf_tls_files_t;

/*
 * Reads and checks the files: at least one certificate, a private key that
 * matches the first certificate, and (when client_ca_path is set) at least
 * one CA certificate. Every file is bounded by KF_TLS_PEM_BYTES_MAX. The
 * result has one reference. Errors (message naming the file and the
 * problem): KF_E_INVALID (not PEM, no certificate, key mismatch),
 * KF_E_TOO_LARGE, KF_E_IO (cannot read), KF_E_NOMEM.
 * An expired or not yet valid certificate loads (kf_tls_validity says so):
 * the operator decides, the log tells.
 */
kf_status_t kf_tls_load(const kf_tls_files_t *files, kf_tls_t **out, kf_error_t *err) KF_MUST_USE;

void kf_tls_ref(kf_tls_t *tls);
/* Drops a reference; the last one frees. NULL is a no-op. */
void kf_tls_unref(kf_tls_t *tls);

/* NUL-terminated PEM text as read (the chain file, the key file, the client
 * CA file or NULL). Valid while the caller holds a reference. */
const char *kf_tls_cert_pem(const kf_tls_t *tls);
const char *kf_tls_key_pem(const kf_tls_t *tls);
const char *kf_tls_client_ca_pem(const kf_tls_t *tls);

/* Whether client certificates are required (a client CA file was given). */
bool kf_tls_requires_client_cert(const kf_tls_t *tls);

/*
 * One line for the log: the first certificate's subject, its validity end
 * and, when it is not valid now, why ("EXPIRED", "NOT YET VALID"). Returns
 * false when the certificate is not valid at this moment.
 */
bool kf_tls_validity(const kf_tls_t *tls, char *out, size_t cap);

/*
 * A new OpenSSL server context (TLS 1.2 and later) serving the chain and
 * key and, with a client CA and verify_clients, requiring and verifying a
 * client certificate. verify_clients false is for the probe listener, whose
 * clients (the kubelet, a container healthcheck) have no certificate and
 * need none for what it serves. The caller owns the context (SSL_CTX_free)
 * and adds what its protocol needs (ALPN). Errors: KF_E_INTERNAL (OpenSSL
 * refused; message says what).
 */
kf_status_t kf_tls_server_ctx_create(const kf_tls_t *tls, bool verify_clients, SSL_CTX **out,
                                     kf_error_t *err) KF_MUST_USE;

#endif
