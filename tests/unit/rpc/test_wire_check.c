/*
 * test_wire_check.c - the wire check refuses NUL bytes and invalid UTF-8 in
 * string fields at any depth, naming the field, and malformed messages.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "keyflow/v1/coordinators.pb-c.h"
#include "rpc/wire_check.h"

static uint8_t buf[512];
static size_t len;

/* Packs a SendEventRequest with key "kX" and event id "iY" (X, Y patched). */
static void pack(void) {
    Keyflow__V1__SendEventRequest req = KEYFLOW__V1__SEND_EVENT_REQUEST__INIT;
    Keyflow__V1__Event ev = KEYFLOW__V1__EVENT__INIT;
    req.workflow = "wf";
    req.key = "kX";
    ev.id = "iY";
    ev.input_json = "{}";
    req.event = &ev;
    len = keyflow__v1__send_event_request__pack(&req, buf);
}

static void patch(char from, uint8_t to) {
    uint8_t *p = memchr(buf, from, len);
    cr_assert_not_null(p);
    *p = to;
}

static void expect(kf_status_t st, const char *words) {
    kf_error_t err;
    kf_error_clear(&err);
    cr_assert_eq(kf_wire_check(&keyflow__v1__send_event_request__descriptor, buf, len, &err), st,
                 "%s", err.message);
    if (words != NULL) {
        cr_assert(strstr(err.message, words) != NULL, "'%s' should say '%s'", err.message, words);
    }
}

Test(wire_check, a_valid_message_passes) {
    pack();
    expect(KF_OK, NULL);
}

Test(wire_check, a_nul_in_a_top_level_string_is_named) {
    pack();
    patch('X', 0);
    expect(KF_E_INVALID, "key: contains a NUL byte");
}

Test(wire_check, a_nul_in_a_nested_string_is_named) {
    pack();
    patch('Y', 0);
    expect(KF_E_INVALID, "event.id: contains a NUL byte");
}

Test(wire_check, invalid_utf8_is_refused) {
    pack();
    patch('X', 0xff);
    expect(KF_E_INVALID, "key: not valid UTF-8");
}

Test(wire_check, truncated_bytes_are_malformed) {
    pack();
    len -= 3;
    expect(KF_E_INVALID, "malformed");
}
