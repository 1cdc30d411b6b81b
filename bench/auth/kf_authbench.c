/*
 * kf_authbench.c - what the API-key check costs per call, without a server:
 * kf_auth_authenticate (header parse, registry lookup under the read lock,
 * one HMAC, a constant-time compare) plus kf_auth_authorize (scope, and the
 * workflow against the grant's prefix) plus the release, for a SendEvent,
 * over a registry of KEYS keys. Prints one line; no arguments.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "auth/auth.h"
#include "keyflow/v1/coordinators.pb-c.h"

#define KEYS  10000
#define CALLS 1000000

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(void) {
    kf_auth_t *auth = kf_auth_create(true);
    static const uint8_t store_secret[KF_AUTH_STORE_SECRET_BYTES] = {7};
    kf_auth_set_store_secret(auth, store_secret);
    kf_grant_t grant = {.scope = KF_SCOPE_EVENTS_SEND};
    strcpy(grant.prefix, "bench-");
    uint8_t secret[KF_API_KEY_SECRET_BYTES];
    char header[16 + KF_API_KEY_TEXT_BYTES];
    for (int i = 0; i < KEYS; i++) {
        char id[KF_API_KEY_ID_CHARS + 1];
        snprintf(id, sizeof id, "%016x", (unsigned)i * 2654435761u);
        memset(secret, i & 0xff, sizeof secret);
        uint8_t hash[KF_SHA256_BYTES];
        kf_auth_hash_secret(auth, secret, hash);
        kf_principal_spec_t spec = {.key_id = id,
                                    .name = "bench",
                                    .hash = hash,
                                    .grants = &grant,
                                    .grant_count = 1,
                                    .created_by = ""};
        kf_auth_put(auth, kf_principal_create(&spec));
        if (i == KEYS / 2) {
            char text[KF_API_KEY_TEXT_BYTES + 1];
            kf_api_key_format(id, secret, text);
            snprintf(header, sizeof header, "Bearer %s", text);
        }
    }
    const kf_method_t *send = kf_method_by_path("/keyflow.v1.Coordinators/SendEvent");
    Keyflow__V1__SendEventRequest req = KEYFLOW__V1__SEND_EVENT_REQUEST__INIT;
    req.workflow = "bench-1";
    size_t len = strlen(header);
    kf_error_t err;
    double t0 = now_s();
    for (int i = 0; i < CALLS; i++) {
        kf_principal_t *p;
        if (kf_auth_authenticate(auth, send->scope, header, len, 1, &p, &err) != KF_OK ||
            kf_auth_authorize(p, send, NULL, &err) != KF_OK ||
            kf_auth_authorize(p, send, &req.base, &err) != KF_OK) {
            fprintf(stderr, "kf_authbench: refused: %s\n", err.message);
            return 1;
        }
        kf_principal_unref(p);
    }
    double s = now_s() - t0;
    printf("auth check (authenticate + authorize + release, %d keys): %d calls in %.2f s, "
           "%.0f ns/call\n",
           KEYS, CALLS, s, s * 1e9 / CALLS);
    kf_auth_destroy(auth);
    return 0;
}
