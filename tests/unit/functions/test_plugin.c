/*
 * test_plugin.c - digest-addressed plugin loading (service/functions/plugin.c)
 * over the example handlers' directory.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "base/crypto.h"
#include "functions/plugin.h"

static void digest_of(const char *path, char hex[KF_SHA256_HEX_BYTES + 1]) {
    uint8_t d[KF_SHA256_BYTES];
    kf_error_t err;
    cr_assert_eq(kf_sha256_file(path, d, &err), KF_OK, "%s", err.message);
    kf_hex_encode(d, sizeof d, hex);
}

static const kf_handler_t *find(kf_plugins_t *p, const char *digest) {
    const kf_handler_t *h = NULL;
    kf_error_t err;
    cr_assert_eq(kf_plugins_find(p, digest, &h, &err), KF_OK, "%s", err.message);
    cr_assert_not_null(h);
    return h;
}

/* Found by the seeded simulation: a plugin set that was destroyed left its
 * library loaded under /proc/self/fd/N; the next set's memfd reused N, and
 * dlopen() handed back the old library, so a recovered engine ran
 * running_sum's batches through session_counter. */
Test(plugins, a_later_plugin_set_loads_its_own_handler) {
    char rs[KF_SHA256_HEX_BYTES + 1], sc[KF_SHA256_HEX_BYTES + 1];
    digest_of(KF_TEST_RUNNING_SUM_SO, rs);
    digest_of(KF_TEST_SESSION_COUNTER_SO, sc);
    for (int round = 0; round < 3; round++) {
        kf_plugins_t *first = kf_plugins_create(KF_TEST_HANDLER_DIR);
        cr_assert_str_eq(find(first, sc)->name, "session_counter");
        kf_plugins_destroy(first);
        kf_plugins_t *second = kf_plugins_create(KF_TEST_HANDLER_DIR);
        cr_assert_str_eq(find(second, rs)->name, "running_sum");
        cr_assert_str_eq(find(second, sc)->name, "session_counter");
        kf_plugins_destroy(second);
    }
}

Test(plugins, one_set_shares_a_handler_and_refuses_unknown_digests) {
    char rs[KF_SHA256_HEX_BYTES + 1];
    digest_of(KF_TEST_RUNNING_SUM_SO, rs);
    kf_plugins_t *p = kf_plugins_create(KF_TEST_HANDLER_DIR);
    cr_assert_eq(find(p, rs), find(p, rs));
    const kf_handler_t *h = NULL;
    kf_error_t err;
    cr_assert_eq(kf_plugins_find(p,
                                 "00000000000000000000000000000000000000000000000000000000000000"
                                 "00",
                                 &h, &err),
                 KF_E_PRECONDITION);
    cr_assert(strstr(err.message, "no plugin") != NULL, "%s", err.message);
    kf_plugins_destroy(p);
}
