/*
 * test_auth.c - principals, the registry and the per-call checks
 * (service/auth/auth.h), without a server: what authentication accepts and
 * refuses, how grants and name prefixes decide, and which listener
 * addresses count as loopback (auth is on for every other one).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "auth/auth.h"
#include "keyflow/v1/coordinators.pb-c.h"
#include "keyflow/v1/runs.pb-c.h"
#include "keyflow/v1/workers.pb-c.h"

static const uint8_t store_secret[KF_AUTH_STORE_SECRET_BYTES] = {1, 2, 3};

static const kf_method_t *method(const char *path) {
    const kf_method_t *m = kf_method_by_path(path);
    cr_assert_not_null(m, "%s", path);
    return m;
}

/* A registry with one key "0123456789abcdef" holding `grants`; its text in
 * `text`. */
static kf_auth_t *registry(const kf_grant_t *grants, size_t n,
                           char text[KF_API_KEY_TEXT_BYTES + 1]) {
    kf_auth_t *auth = kf_auth_create(true);
    kf_auth_set_store_secret(auth, store_secret);
    uint8_t secret[KF_API_KEY_SECRET_BYTES];
    memset(secret, 0x5a, sizeof secret);
    uint8_t hash[KF_SHA256_BYTES];
    kf_auth_hash_secret(auth, secret, hash);
    kf_principal_spec_t spec = {.key_id = "0123456789abcdef",
                                .name = "test",
                                .hash = hash,
                                .grants = grants,
                                .grant_count = n,
                                .created_ms = 1,
                                .created_by = ""};
    kf_auth_put(auth, kf_principal_create(&spec));
    kf_api_key_format("0123456789abcdef", secret, text);
    return auth;
}

static kf_status_t authenticate(kf_auth_t *auth, const char *header, kf_principal_t **p,
                                kf_error_t *err) {
    return kf_auth_authenticate(auth, KF_SCOPE_RUNS_READ, header, header ? strlen(header) : 0,
                                header ? 1 : 0, p, err);
}

Test(auth, authentication_accepts_only_the_right_bearer_key) {
    kf_grant_t g = {.scope = KF_SCOPE_RUNS_READ};
    char text[KF_API_KEY_TEXT_BYTES + 1];
    kf_auth_t *auth = registry(&g, 1, text);
    cr_assert_eq(strlen(text), 84);
    kf_principal_t *p;
    kf_error_t err;
    char header[200];
    snprintf(header, sizeof header, "Bearer %s", text);
    cr_assert_eq(authenticate(auth, header, &p, &err), KF_OK, "%s", err.message);
    cr_assert_str_eq(kf_principal_id(p), "0123456789abcdef");
    kf_principal_unref(p);
    snprintf(header, sizeof header, "bearer %s", text); /* the scheme is case-insensitive */
    cr_assert_eq(authenticate(auth, header, &p, &err), KF_OK);
    kf_principal_unref(p);

    const char *missing = NULL;
    cr_assert_eq(authenticate(auth, missing, &p, &err), KF_E_UNAUTHENTICATED);
    cr_assert(strstr(err.message, "missing") != NULL);
    cr_assert_eq(authenticate(auth, "Basic dXNlcjpwYXNz", &p, &err), KF_E_UNAUTHENTICATED);
    cr_assert_eq(authenticate(auth, "Bearer kf_short", &p, &err), KF_E_UNAUTHENTICATED);
    cr_assert(strstr(err.message, "not a keyflow API key") != NULL);
    /* A wrong secret and an unknown id get the same answer. */
    char wrong[200];
    snprintf(wrong, sizeof wrong, "Bearer %s", text);
    wrong[strlen(wrong) - 1] = wrong[strlen(wrong) - 1] == '0' ? '1' : '0';
    cr_assert_eq(authenticate(auth, wrong, &p, &err), KF_E_UNAUTHENTICATED);
    cr_assert(strstr(err.message, "unknown or revoked") != NULL);
    snprintf(wrong, sizeof wrong, "Bearer %s", text);
    wrong[7 + 3] = wrong[7 + 3] == 'f' ? 'e' : 'f';
    cr_assert_eq(authenticate(auth, wrong, &p, &err), KF_E_UNAUTHENTICATED);
    cr_assert(strstr(err.message, "unknown or revoked") != NULL);
    cr_assert_null(p);
    /* Two authorization headers, even two good ones: refused, never one of
     * them picked. */
    snprintf(header, sizeof header, "Bearer %s", text);
    cr_assert_eq(
        kf_auth_authenticate(auth, KF_SCOPE_RUNS_READ, header, strlen(header), 2, &p, &err),
        KF_E_UNAUTHENTICATED);
    cr_assert(strstr(err.message, "sent 2 times") != NULL, "%s", err.message);
    cr_assert_null(p);
    /* Revoked: the next call is refused. */
    cr_assert(kf_auth_remove(auth, "0123456789abcdef"));
    cr_assert_not(kf_auth_remove(auth, "0123456789abcdef"));
    cr_assert_eq(authenticate(auth, header, &p, &err), KF_E_UNAUTHENTICATED);
    kf_auth_destroy(auth);
}

Test(auth, no_key_is_needed_when_off_or_for_health) {
    kf_auth_t *off = kf_auth_create(false);
    kf_principal_t *p = (kf_principal_t *)1;
    kf_error_t err;
    cr_assert_eq(kf_auth_authenticate(off, KF_SCOPE_KEYS_ADMIN, NULL, 0, 0, &p, &err), KF_OK);
    cr_assert_null(p);
    kf_auth_destroy(off);
    kf_grant_t g = {.scope = KF_SCOPE_RUNS_READ};
    char text[KF_API_KEY_TEXT_BYTES + 1];
    kf_auth_t *on = registry(&g, 1, text);
    cr_assert_eq(kf_auth_authenticate(on, KF_SCOPE_NONE, NULL, 0, 0, &p, &err), KF_OK);
    cr_assert_null(p);
    kf_auth_destroy(on);
}

/* A principal survives its revocation while a call still holds it. */
Test(auth, a_held_principal_outlives_its_revocation) {
    kf_grant_t g = {.scope = KF_SCOPE_RUNS_READ};
    char text[KF_API_KEY_TEXT_BYTES + 1];
    kf_auth_t *auth = registry(&g, 1, text);
    char header[200];
    snprintf(header, sizeof header, "Bearer %s", text);
    kf_principal_t *p;
    kf_error_t err;
    cr_assert_eq(authenticate(auth, header, &p, &err), KF_OK);
    cr_assert_eq(kf_auth_revocations(auth), 0);
    cr_assert_not(kf_principal_revoked(p));
    cr_assert_eq(kf_principal_check_open(p, &err), KF_OK);
    cr_assert(kf_auth_remove(auth, "0123456789abcdef"));
    cr_assert(kf_principal_allows(p, KF_SCOPE_RUNS_READ, "any"));
    /* The call that holds it sees the revocation, and so do the engines. */
    cr_assert(kf_principal_revoked(p));
    cr_assert_eq(kf_auth_revocations(auth), 1);
    cr_assert_eq(kf_principal_check_open(p, &err), KF_E_UNAUTHENTICATED);
    cr_assert(strstr(err.message, "0123456789abcdef was revoked") != NULL, "%s", err.message);
    cr_assert_eq(kf_principal_check_open(NULL, &err), KF_OK); /* auth off */
    kf_principal_unref(p);
    kf_auth_destroy(auth);
}

Test(auth, grants_and_name_prefixes) {
    kf_grant_t grants[3] = {
        {.scope = KF_SCOPE_EVENTS_SEND, .prefix = "orders-"},
        {.scope = KF_SCOPE_EVENTS_SEND, .prefix = "billing-"},
        {.scope = KF_SCOPE_RUNS_WORK, .prefix = ""},
    };
    char text[KF_API_KEY_TEXT_BYTES + 1];
    kf_auth_t *auth = registry(grants, 3, text);
    char header[200];
    snprintf(header, sizeof header, "Bearer %s", text);
    kf_principal_t *p;
    kf_error_t err;
    cr_assert_eq(
        kf_auth_authenticate(auth, KF_SCOPE_EVENTS_SEND, header, strlen(header), 1, &p, &err),
        KF_OK);
    const kf_method_t *send = method("/keyflow.v1.Coordinators/SendEvent");
    Keyflow__V1__SendEventRequest req = KEYFLOW__V1__SEND_EVENT_REQUEST__INIT;
    req.workflow = "orders-eu";
    cr_assert_eq(kf_auth_authorize(p, send, &req.base, &err), KF_OK, "%s", err.message);
    req.workflow = "billing-1";
    cr_assert_eq(kf_auth_authorize(p, send, &req.base, &err), KF_OK);
    req.workflow = "shipping";
    cr_assert_eq(kf_auth_authorize(p, send, &req.base, &err), KF_E_PERMISSION);
    cr_assert(strstr(err.message, "workflow \"shipping\"") != NULL, "%s", err.message);
    req.workflow = "";
    cr_assert_eq(kf_auth_authorize(p, send, &req.base, &err), KF_E_PERMISSION);
    /* A resource in every element of a repeated message: SendEvents' events
     * must all be under the key's prefixes. */
    const kf_method_t *send_many = method("/keyflow.v1.Coordinators/SendEvents");
    Keyflow__V1__SendEventRequest items[2] = {KEYFLOW__V1__SEND_EVENT_REQUEST__INIT,
                                              KEYFLOW__V1__SEND_EVENT_REQUEST__INIT};
    Keyflow__V1__SendEventRequest *item_ptrs[2] = {&items[0], &items[1]};
    items[0].workflow = "orders-eu";
    items[1].workflow = "billing-7";
    Keyflow__V1__SendEventsRequest many = KEYFLOW__V1__SEND_EVENTS_REQUEST__INIT;
    many.events = item_ptrs;
    many.n_events = 2;
    cr_assert_eq(kf_auth_authorize(p, send_many, &many.base, &err), KF_OK, "%s", err.message);
    items[1].workflow = "shipping";
    cr_assert_eq(kf_auth_authorize(p, send_many, &many.base, &err), KF_E_PERMISSION);
    cr_assert(strstr(err.message, "events.workflow \"shipping\"") != NULL, "%s", err.message);
    many.n_events = 0;
    cr_assert_eq(kf_auth_authorize(p, send_many, &many.base, &err), KF_OK,
                 "an empty call names nothing");
    /* No grant of the scope at all: refused before the request is read. */
    cr_assert_eq(kf_auth_authorize(p, method("/keyflow.v1.Runs/GetRun"), NULL, &err),
                 KF_E_PERMISSION);
    cr_assert(strstr(err.message, "runs:read") != NULL, "%s", err.message);
    /* A nested resource field. */
    const kf_method_t *flush = method("/keyflow.v1.Coordinators/FlushWindow");
    cr_assert_eq(kf_auth_authorize(p, flush, NULL, &err),
                 KF_E_PERMISSION); /* no coordinators:write */
    /* A repeated resource field; empty means every workflow. */
    const kf_method_t *poll = method("/keyflow.v1.Runs/PollRuns");
    Keyflow__V1__PollRunsRequest pr = KEYFLOW__V1__POLL_RUNS_REQUEST__INIT;
    cr_assert_eq(kf_auth_authorize(p, poll, &pr.base, &err), KF_OK); /* runs:work unlimited */
    kf_principal_unref(p);
    kf_auth_destroy(auth);

    kf_grant_t limited = {.scope = KF_SCOPE_RUNS_WORK, .prefix = "jobs-"};
    auth = registry(&limited, 1, text);
    snprintf(header, sizeof header, "Bearer %s", text);
    cr_assert_eq(
        kf_auth_authenticate(auth, KF_SCOPE_RUNS_WORK, header, strlen(header), 1, &p, &err), KF_OK);
    cr_assert_eq(kf_auth_authorize(p, poll, &pr.base, &err), KF_E_PERMISSION);
    cr_assert(strstr(err.message, "empty means every") != NULL, "%s", err.message);
    char *workflows[2] = {"jobs-a", "other"};
    pr.workflows = workflows;
    pr.n_workflows = 1;
    cr_assert_eq(kf_auth_authorize(p, poll, &pr.base, &err), KF_OK);
    pr.n_workflows = 2;
    cr_assert_eq(kf_auth_authorize(p, poll, &pr.base, &err), KF_E_PERMISSION);
    kf_principal_unref(p);
    kf_auth_destroy(auth);
}

Test(auth, scope_names) {
    kf_scope_t s;
    cr_assert(kf_scope_parse("functions:serve", &s));
    cr_assert_eq(s, KF_SCOPE_FUNCTIONS_SERVE);
    cr_assert_not(kf_scope_parse("none", &s));
    cr_assert_not(kf_scope_parse("events", &s));
    cr_assert_eq(kf_scope_resource(KF_SCOPE_METRICS_READ), KF_SCOPE_RESOURCE_NONE);
    cr_assert_eq(kf_scope_resource(KF_SCOPE_FUNCTIONS_PUSH), KF_SCOPE_RESOURCE_FUNCTION);
    cr_assert_eq(kf_scope_resource(KF_SCOPE_COORDINATORS_WRITE), KF_SCOPE_RESOURCE_WORKFLOW);
}

/* Workers/Serve's resource is "hello.function_id", a member of the
 * WorkerMessage oneof: a message holding another member (a result sent
 * before any hello) names no function. The walk must see that the member is
 * not set rather than read the union as a hello, and refuse with a status
 * every key gets, prefix or not (it used to abort the process). */
Test(auth, a_resource_path_through_an_unset_oneof_member_is_refused) {
    kf_grant_t grants[2] = {
        {.scope = KF_SCOPE_FUNCTIONS_SERVE, .prefix = ""},
        {.scope = KF_SCOPE_FUNCTIONS_READ, .prefix = "fa"},
    };
    char text[KF_API_KEY_TEXT_BYTES + 1];
    kf_auth_t *auth = registry(grants, 2, text);
    char header[200];
    snprintf(header, sizeof header, "Bearer %s", text);
    kf_principal_t *p;
    kf_error_t err;
    cr_assert_eq(
        kf_auth_authenticate(auth, KF_SCOPE_FUNCTIONS_SERVE, header, strlen(header), 1, &p, &err),
        KF_OK);
    const kf_method_t *serve = method("/keyflow.v1.Workers/Serve");
    Keyflow__V1__CallResult result = KEYFLOW__V1__CALL_RESULT__INIT;
    Keyflow__V1__WorkerMessage m = KEYFLOW__V1__WORKER_MESSAGE__INIT;
    m.message_case = KEYFLOW__V1__WORKER_MESSAGE__MESSAGE_RESULT;
    m.result = &result;
    cr_assert_eq(kf_auth_authorize(p, serve, &m.base, &err), KF_E_INVALID);
    cr_assert(strstr(err.message, "hello.function_id") != NULL, "%s", err.message);
    cr_assert(strstr(err.message, "result") != NULL, "%s", err.message);
    /* Nothing set at all: absent too. */
    Keyflow__V1__WorkerMessage empty = KEYFLOW__V1__WORKER_MESSAGE__INIT;
    cr_assert_eq(kf_auth_authorize(p, serve, &empty.base, &err), KF_E_INVALID);
    /* The hello itself is checked as before. */
    Keyflow__V1__WorkerHello hello = KEYFLOW__V1__WORKER_HELLO__INIT;
    hello.function_id = "anything";
    m.message_case = KEYFLOW__V1__WORKER_MESSAGE__MESSAGE_HELLO;
    m.hello = &hello;
    cr_assert_eq(kf_auth_authorize(p, serve, &m.base, &err), KF_OK, "%s", err.message);
    kf_principal_unref(p);
    kf_auth_destroy(auth);

    kf_grant_t limited = {.scope = KF_SCOPE_FUNCTIONS_SERVE, .prefix = "fa"};
    auth = registry(&limited, 1, text);
    snprintf(header, sizeof header, "Bearer %s", text);
    cr_assert_eq(
        kf_auth_authenticate(auth, KF_SCOPE_FUNCTIONS_SERVE, header, strlen(header), 1, &p, &err),
        KF_OK);
    m.message_case = KEYFLOW__V1__WORKER_MESSAGE__MESSAGE_RESULT;
    m.result = &result;
    cr_assert_eq(kf_auth_authorize(p, serve, &m.base, &err), KF_E_INVALID);
    m.message_case = KEYFLOW__V1__WORKER_MESSAGE__MESSAGE_HELLO;
    m.hello = &hello;
    cr_assert_eq(kf_auth_authorize(p, serve, &m.base, &err), KF_E_PERMISSION);
    hello.function_id = "fa_r";
    cr_assert_eq(kf_auth_authorize(p, serve, &m.base, &err), KF_OK, "%s", err.message);
    kf_principal_unref(p);
    kf_auth_destroy(auth);
}

/* Without keys, the gateway answers only requests addressed to this
 * machine by a loopback literal, from no web page or a loopback one (DNS
 * rebinding and cross-site requests). */
Test(auth, loopback_hosts_and_origins) {
    const char *hosts[] = {"localhost",    "LOCALHOST:8070", "127.0.0.1",
                           "127.1.2.3:80", "[::1]",          "[::1]:8070"};
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) {
        cr_assert(kf_host_is_loopback(hosts[i], strlen(hosts[i])), "%s", hosts[i]);
    }
    const char *not_hosts[] = {"",
                               "evil.example",
                               "evil.example:8070",
                               "localhost.evil.example",
                               "127.0.0.1.nip.io",
                               "128.0.0.1",
                               "0.0.0.0:8070",
                               "[::]:8070",
                               "[127.0.0.1]",
                               "::1",
                               "[::1]x",
                               "localhost:80x",
                               "localhost:8070:1",
                               "[::1",
                               "10.0.0.1"};
    for (size_t i = 0; i < sizeof not_hosts / sizeof not_hosts[0]; i++) {
        cr_assert_not(kf_host_is_loopback(not_hosts[i], strlen(not_hosts[i])), "%s", not_hosts[i]);
    }
    /* Not NUL-terminated: only len bytes count. */
    cr_assert(kf_host_is_loopback("localhost:80evil", 12));
    const char *origins[] = {"http://localhost:3000", "https://127.0.0.1", "http://[::1]:8070"};
    for (size_t i = 0; i < sizeof origins / sizeof origins[0]; i++) {
        cr_assert(kf_origin_is_loopback(origins[i], strlen(origins[i])), "%s", origins[i]);
    }
    const char *not_origins[] = {"null",     "http://evil.example", "https://evil.example:8070",
                                 "file://",  "ftp://localhost",     "http://localhost/path",
                                 "localhost"};
    for (size_t i = 0; i < sizeof not_origins / sizeof not_origins[0]; i++) {
        cr_assert_not(kf_origin_is_loopback(not_origins[i], strlen(not_origins[i])), "%s",
                      not_origins[i]);
    }
}

/* Auth is on whenever a listener is anything but these. */
Test(auth, loopback_addresses) {
    cr_assert(kf_address_is_loopback("127.0.0.1:50051"));
    cr_assert(kf_address_is_loopback("127.1.2.3:0"));
    cr_assert(kf_address_is_loopback("localhost:8070"));
    cr_assert(kf_address_is_loopback("[::1]:8070"));
    cr_assert_not(kf_address_is_loopback("0.0.0.0:50051"));
    cr_assert_not(kf_address_is_loopback("[::]:50051"));
    cr_assert_not(kf_address_is_loopback("10.0.0.7:50051"));
    cr_assert_not(kf_address_is_loopback("keyflow.internal:50051"));
    cr_assert_not(kf_address_is_loopback("128.0.0.1:1"));
}
