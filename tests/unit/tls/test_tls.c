/*
 * test_tls.c - loading and checking TLS material (service/tls/tls.h).
 *
 * Certificates are made with the openssl command into a fresh directory per
 * test (nothing secret is committed); each case names what must be refused
 * and checks the message names the file.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/limits.h"
#include "tls/tls.h"

static char dir[64];

static void run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void run(const char *fmt, ...) {
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(cmd, sizeof cmd, "cd %s && { ", dir);
    vsnprintf(cmd + n, sizeof cmd - (size_t)n, fmt, ap);
    va_end(ap);
    strncat(cmd, "; } >/dev/null 2>&1", sizeof cmd - strlen(cmd) - 1);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static const char *path(const char *name) {
    static char buf[4][128];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, 128, "%s/%s", dir, name);
    return p;
}

/* ca.pem/ca.key, then a leaf `name`.pem/.key valid for `days` (negative:
 * already expired). */
static void make_leaf(const char *name, int days) {
    run("openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out %s.key && "
        "openssl req -new -key %s.key -subj /CN=%s -out %s.csr && "
        "openssl x509 -req -in %s.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days %d "
        "-out %s.pem",
        name, name, name, name, name, days, name);
}

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/kf-tls-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key "
        "-out ca.pem -days 2 -subj /CN=test-ca");
    make_leaf("server", 2);
}

static void teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(tls, .init = setup, .fini = teardown);

static kf_status_t load(const char *cert, const char *key, const char *ca, kf_tls_t **out,
                        kf_error_t *err) {
    kf_tls_files_t files = {.cert_path = cert, .key_path = key, .client_ca_path = ca};
    return kf_tls_load(&files, out, err);
}

Test(tls, loads_a_matching_pair_and_makes_a_context) {
    kf_tls_t *tls;
    kf_error_t err;
    cr_assert_eq(load(path("server.pem"), path("server.key"), NULL, &tls, &err), KF_OK, "%s",
                 err.message);
    cr_assert_not(kf_tls_requires_client_cert(tls));
    cr_assert_null(kf_tls_client_ca_pem(tls));
    cr_assert(strstr(kf_tls_cert_pem(tls), "BEGIN CERTIFICATE") != NULL);
    cr_assert(strstr(kf_tls_key_pem(tls), "PRIVATE KEY") != NULL);
    char line[512];
    cr_assert(kf_tls_validity(tls, line, sizeof line), "%s", line);
    cr_assert(strstr(line, "CN=server") != NULL, "%s", line);
    SSL_CTX *ctx;
    cr_assert_eq(kf_tls_server_ctx_create(tls, true, &ctx, &err), KF_OK, "%s", err.message);
    cr_assert_eq(SSL_CTX_get_verify_mode(ctx), SSL_VERIFY_NONE);
    SSL_CTX_free(ctx);
    kf_tls_ref(tls);
    kf_tls_unref(tls);
    kf_tls_unref(tls);
}

Test(tls, client_ca_turns_on_verification) {
    kf_tls_t *tls;
    kf_error_t err;
    cr_assert_eq(load(path("server.pem"), path("server.key"), path("ca.pem"), &tls, &err), KF_OK,
                 "%s", err.message);
    cr_assert(kf_tls_requires_client_cert(tls));
    SSL_CTX *ctx;
    cr_assert_eq(kf_tls_server_ctx_create(tls, true, &ctx, &err), KF_OK, "%s", err.message);
    cr_assert_eq(SSL_CTX_get_verify_mode(ctx), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT);
    cr_assert_eq(sk_X509_NAME_num(SSL_CTX_get_client_CA_list(ctx)), 1);
    SSL_CTX_free(ctx);
    /* The probe listener's context asks for no client certificate. */
    cr_assert_eq(kf_tls_server_ctx_create(tls, false, &ctx, &err), KF_OK, "%s", err.message);
    cr_assert_eq(SSL_CTX_get_verify_mode(ctx), SSL_VERIFY_NONE);
    cr_assert_eq(sk_X509_NAME_num(SSL_CTX_get_client_CA_list(ctx)), 0);
    SSL_CTX_free(ctx);
    kf_tls_unref(tls);
}

Test(tls, expired_certificate_loads_but_says_so) {
    make_leaf("old", -1);
    kf_tls_t *tls;
    kf_error_t err;
    cr_assert_eq(load(path("old.pem"), path("old.key"), NULL, &tls, &err), KF_OK, "%s",
                 err.message);
    char line[512];
    cr_assert_not(kf_tls_validity(tls, line, sizeof line));
    cr_assert(strstr(line, "EXPIRED") != NULL, "%s", line);
    kf_tls_unref(tls);
}

static void expect_error(const char *cert, const char *key, const char *ca, kf_status_t status,
                         const char *fragment, const char *named) {
    kf_tls_t *tls = (kf_tls_t *)1;
    kf_error_t err;
    cr_assert_eq(load(cert, key, ca, &tls, &err), status, "%s", err.message);
    cr_assert_null(tls);
    cr_assert(strstr(err.message, fragment) != NULL, "%s", err.message);
    cr_assert(strstr(err.message, named) != NULL, "%s does not name %s", err.message, named);
}

Test(tls, refusals_name_the_file_and_the_problem) {
    make_leaf("other", 2);
    run("echo 'not pem' > junk.pem && head -c %d /dev/zero | tr '\\0' a > big.pem",
        KF_TLS_PEM_BYTES_MAX + 1);
    run("openssl pkey -in server.key -aes256 -passout pass:secret -out locked.key");
    expect_error(path("missing.pem"), path("server.key"), NULL, KF_E_IO, "No such file",
                 "missing.pem");
    expect_error(path("junk.pem"), path("server.key"), NULL, KF_E_INVALID, "no PEM certificate",
                 "junk.pem");
    expect_error(path("big.pem"), path("server.key"), NULL, KF_E_TOO_LARGE, "KF_TLS_PEM_BYTES_MAX",
                 "big.pem");
    expect_error(path("server.pem"), path("junk.pem"), NULL, KF_E_INVALID, "private key",
                 "junk.pem");
    expect_error(path("server.pem"), path("locked.key"), NULL, KF_E_INVALID, "unencrypted",
                 "locked.key");
    expect_error(path("server.pem"), path("other.key"), NULL, KF_E_INVALID, "does not match",
                 "other.key");
    expect_error(path("server.pem"), path("server.key"), path("junk.pem"), KF_E_INVALID,
                 "no PEM certificate", "junk.pem");
    expect_error(path("server.pem"), path("server.key"), dir, KF_E_INVALID, "not a regular file",
                 dir);
}
