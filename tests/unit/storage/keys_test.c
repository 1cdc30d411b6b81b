/*
 * keys_test.c - the byte layout of stored keys (storage/keys.h).
 *
 * RocksDB compares keys bytewise, so the encodings must make byte order the
 * order the engine means: big-endian integers sort numerically, signed times
 * (sign bit flipped) sort numerically including negatives, and length
 * prefixes make one identity's key never a prefix of another's, so a prefix
 * scan over one coordinator's journal never reaches into a neighbour's.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "base/bytes.h"
#include "storage/keys.h"

/* memcmp order with the shorter key first on a tie, as RocksDB compares. */
static int key_cmp(const kf_key_t *a, const kf_key_t *b) {
    size_t n = a->len < b->len ? a->len : b->len;
    int c = n ? memcmp(a->bytes, b->bytes, n) : 0;
    if (c != 0) {
        return c < 0 ? -1 : 1;
    }
    return a->len < b->len ? -1 : (a->len > b->len ? 1 : 0);
}

static bool is_prefix(const kf_key_t *prefix, const kf_key_t *key) {
    return prefix->len <= key->len && memcmp(prefix->bytes, key->bytes, prefix->len) == 0;
}

/* Is key inside [prefix, kf_key_prefix_end(prefix))? */
static bool in_prefix_range(const kf_key_t *prefix, const kf_key_t *key) {
    kf_key_t end;
    bool bounded = kf_key_prefix_end(prefix, &end);
    return key_cmp(key, prefix) >= 0 && (!bounded || key_cmp(key, &end) < 0);
}

static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int sign(int v) {
    return (v > 0) - (v < 0);
}

/* ---- integers and times ----------------------------------------------- */

Test(keys, be64_layout_is_big_endian) {
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_be64(&k, 0x0102030405060708ULL);
    static const uint8_t want[] = {1, 2, 3, 4, 5, 6, 7, 8};
    cr_assert_eq(k.len, 8);
    cr_assert_eq(memcmp(k.bytes, want, 8), 0);
}

Test(keys, be64_sorts_numerically_as_bytes) {
    static const uint64_t edges[] = {
        0,          1,          255,       256,        65535,          65536,
        UINT32_MAX, 1ULL << 32, INT64_MAX, 1ULL << 63, UINT64_MAX - 1, UINT64_MAX};
    uint64_t values[212];
    memcpy(values, edges, sizeof edges);
    uint64_t rs = 42;
    for (size_t i = sizeof edges / sizeof edges[0]; i < 212; i++) {
        uint64_t r = next_random(&rs);
        values[i] = r >> (r % 64); /* all magnitudes */
    }
    for (size_t i = 0; i < 212; i++) {
        for (size_t j = 0; j < 212; j++) {
            kf_key_t a;
            kf_key_t b;
            kf_key_reset(&a);
            kf_key_reset(&b);
            kf_key_be64(&a, values[i]);
            kf_key_be64(&b, values[j]);
            int want = values[i] < values[j] ? -1 : (values[i] > values[j] ? 1 : 0);
            cr_assert_eq(key_cmp(&a, &b), want, "%llu vs %llu", (unsigned long long)values[i],
                         (unsigned long long)values[j]);
        }
    }
}

Test(keys, time_layout_flips_the_sign_bit) {
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_time(&k, 0);
    static const uint8_t zero[] = {0x80, 0, 0, 0, 0, 0, 0, 0};
    cr_assert_eq(memcmp(k.bytes, zero, 8), 0);
    kf_key_reset(&k);
    kf_key_time(&k, -1);
    static const uint8_t minus_one[] = {0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    cr_assert_eq(memcmp(k.bytes, minus_one, 8), 0);
    kf_key_reset(&k);
    kf_key_time(&k, INT64_MIN);
    static const uint8_t min[] = {0, 0, 0, 0, 0, 0, 0, 0};
    cr_assert_eq(memcmp(k.bytes, min, 8), 0);
}

Test(keys, signed_times_sort_numerically_including_negatives) {
    static const int64_t edges[] = {
        INT64_MIN,     INT64_MIN + 1, -1000000,        -86400000,       -2, -1, 0, 1, 2, 1000,
        INT64_MAX - 1, INT64_MAX,     1700000000000LL, -1700000000000LL};
    enum { N = 214 };
    int64_t values[N];
    memcpy(values, edges, sizeof edges);
    uint64_t rs = 7;
    for (size_t i = sizeof edges / sizeof edges[0]; i < N; i++) {
        uint64_t r = next_random(&rs);
        values[i] = (int64_t)(r >> (r % 64)) * ((r & 1) ? -1 : 1);
    }
    for (size_t i = 0; i < N; i++) {
        for (size_t j = 0; j < N; j++) {
            kf_key_t a;
            kf_key_t b;
            kf_key_reset(&a);
            kf_key_reset(&b);
            kf_key_time(&a, values[i]);
            kf_key_time(&b, values[j]);
            int want = values[i] < values[j] ? -1 : (values[i] > values[j] ? 1 : 0);
            cr_assert_eq(key_cmp(&a, &b), want, "%lld vs %lld", (long long)values[i],
                         (long long)values[j]);
        }
    }
}

Test(keys, integers_and_times_read_back) {
    static const int64_t times[] = {INT64_MIN, -1, 0, 1, INT64_MAX, -1700000000000LL};
    for (size_t i = 0; i < sizeof times / sizeof times[0]; i++) {
        kf_key_t k;
        kf_key_reset(&k);
        kf_key_u8(&k, 9);
        kf_key_time(&k, times[i]);
        kf_key_be64(&k, (uint64_t)times[i] * 3);
        kf_key_reader_t r = kf_key_reader(k.bytes, k.len);
        uint8_t u;
        int64_t t;
        uint64_t v;
        cr_assert(kf_key_read_u8(&r, &u));
        cr_assert(kf_key_read_time(&r, &t));
        cr_assert(kf_key_read_be64(&r, &v));
        cr_assert_eq(u, 9);
        cr_assert_eq(t, times[i]);
        cr_assert_eq(v, (uint64_t)times[i] * 3);
        cr_assert_eq(r.left, 0);
        cr_assert_not(kf_key_read_u8(&r, &u), "read past the end");
    }
}

/* ---- length-prefixed strings and coordinator keys --------------------- */

Test(keys, lp_layout) {
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_lp(&k, "abc", 3);
    kf_key_lp(&k, "", 0);
    static const uint8_t want[] = {0, 3, 'a', 'b', 'c', 0, 0};
    cr_assert_eq(k.len, sizeof want);
    cr_assert_eq(memcmp(k.bytes, want, sizeof want), 0);
    kf_key_reader_t r = kf_key_reader(k.bytes, k.len);
    const char *s;
    size_t len;
    cr_assert(kf_key_read_lp(&r, &s, &len));
    cr_assert_eq(len, 3);
    cr_assert_eq(memcmp(s, "abc", 3), 0);
    cr_assert_eq((const uint8_t *)s, k.bytes + 2, "lp points into the key");
    cr_assert(kf_key_read_lp(&r, &s, &len));
    cr_assert_eq(len, 0);
    cr_assert_eq(r.left, 0);
}

Test(keys, coordinator_key_layout_and_read_back) {
    kf_key_t k;
    kf_key_coord(&k, 2, "wf", 2, "ke\0y", 4);
    static const uint8_t want[] = {2, 0, 2, 'w', 'f', 0, 4, 'k', 'e', 0, 'y'};
    cr_assert_eq(k.len, sizeof want);
    cr_assert_eq(memcmp(k.bytes, want, sizeof want), 0);
    kf_key_reader_t r = kf_key_reader(k.bytes, k.len);
    uint8_t kind;
    const char *w;
    const char *key;
    size_t wlen;
    size_t klen;
    cr_assert(kf_key_read_u8(&r, &kind));
    cr_assert(kf_key_read_lp(&r, &w, &wlen));
    cr_assert(kf_key_read_lp(&r, &key, &klen));
    cr_assert_eq(kind, 2);
    cr_assert_eq(wlen, 2);
    cr_assert_eq(memcmp(w, "wf", 2), 0);
    cr_assert_eq(klen, 4);
    cr_assert_eq(memcmp(key, "ke\0y", 4), 0);
    cr_assert_eq(r.left, 0);
}

Test(keys, coordinator_keys_are_prefix_free) {
    kf_key_t a;
    kf_key_t b;
    kf_key_coord(&a, 1, "a", 1, "bc", 2);
    kf_key_coord(&b, 1, "ab", 2, "c", 1);
    cr_assert_neq(key_cmp(&a, &b), 0, "workflow a + key bc equals workflow ab + key c");
    cr_assert_not(is_prefix(&a, &b));
    cr_assert_not(is_prefix(&b, &a));
    /* A key that extends another key of the same workflow. */
    kf_key_coord(&a, 1, "w", 1, "k", 1);
    kf_key_coord(&b, 1, "w", 1, "k2", 2);
    cr_assert_not(is_prefix(&a, &b));
    cr_assert_not(is_prefix(&b, &a));
    /* An empty key against a key that starts like the next field. */
    kf_key_coord(&a, 1, "w", 1, "", 0);
    kf_key_coord(&b, 1, "w", 1, "\0", 1);
    cr_assert_not(is_prefix(&a, &b));
    /* The kind separates otherwise equal identities. */
    kf_key_coord(&a, 1, "w", 1, "k", 1);
    kf_key_coord(&b, 2, "w", 1, "k", 1);
    cr_assert_neq(key_cmp(&a, &b), 0);
}

/* Random identities over a tiny alphabet (so that many share prefixes):
 * distinct identities never have one key a prefix of the other, and one
 * coordinator's journal keys never fall in another coordinator's range. */
Test(keys, prefix_freedom_holds_for_random_identities) {
    enum { N = 300 };
    static const char alphabet[] = {'a', 'b', '\0', '\x01', '\xff'};
    static char workflows[N][4];
    static char keys[N][4];
    static size_t wlens[N];
    static size_t klens[N];
    static kf_key_t coords[N];
    uint64_t rs = 2024;
    for (int i = 0; i < N; i++) {
        wlens[i] = next_random(&rs) % 4;
        klens[i] = next_random(&rs) % 4;
        for (size_t c = 0; c < wlens[i]; c++) {
            workflows[i][c] = alphabet[next_random(&rs) % sizeof alphabet];
        }
        for (size_t c = 0; c < klens[i]; c++) {
            keys[i][c] = alphabet[next_random(&rs) % sizeof alphabet];
        }
        kf_key_coord(&coords[i], 1, workflows[i], wlens[i], keys[i], klens[i]);
    }
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < N; j++) {
            bool same = wlens[i] == wlens[j] && klens[i] == klens[j] &&
                        memcmp(workflows[i], workflows[j], wlens[i]) == 0 &&
                        memcmp(keys[i], keys[j], klens[i]) == 0;
            if (same) {
                cr_assert_eq(key_cmp(&coords[i], &coords[j]), 0);
                continue;
            }
            cr_assert_not(is_prefix(&coords[i], &coords[j]), "identity %d is a prefix of %d", i, j);
            kf_key_t journal;
            kf_key_journal(&journal, &coords[i], next_random(&rs));
            cr_assert_not(in_prefix_range(&coords[j], &journal),
                          "a journal key of %d is inside the range of %d", i, j);
        }
    }
}

Test(keys, journal_keys_sort_by_seq_inside_their_coordinator) {
    kf_key_t coord;
    kf_key_coord(&coord, 1, "workflow", 8, "key", 3);
    static const uint64_t seqs[] = {0,         1, 2, 255, 256, 65536, 1ULL << 40, UINT64_MAX - 1,
                                    UINT64_MAX};
    enum { N = sizeof seqs / sizeof seqs[0] };
    kf_key_t journal[N];
    for (size_t i = 0; i < N; i++) {
        kf_key_journal(&journal[i], &coord, seqs[i]);
        cr_assert_eq(journal[i].len, coord.len + 8);
        cr_assert(is_prefix(&coord, &journal[i]));
        cr_assert(in_prefix_range(&coord, &journal[i]), "seq %llu outside the coordinator",
                  (unsigned long long)seqs[i]);
        kf_key_reader_t r = kf_key_reader(journal[i].bytes + coord.len, 8);
        uint64_t seq;
        cr_assert(kf_key_read_be64(&r, &seq));
        cr_assert_eq(seq, seqs[i]);
        if (i > 0) {
            cr_assert_lt(key_cmp(&journal[i - 1], &journal[i]), 0, "seq %llu before %llu",
                         (unsigned long long)seqs[i - 1], (unsigned long long)seqs[i]);
        }
    }
    /* The neighbours: the next key of the same workflow and the next
     * workflow stay outside the range. */
    kf_key_t other;
    kf_key_coord(&other, 1, "workflow", 8, "kez", 3);
    kf_key_journal(&journal[0], &other, 0);
    cr_assert_not(in_prefix_range(&coord, &journal[0]));
    kf_key_coord(&other, 1, "workflow", 8, "key\x01", 4);
    kf_key_journal(&journal[0], &other, 0);
    cr_assert_not(in_prefix_range(&coord, &journal[0]));
}

Test(keys, largest_identities_fit) {
    char workflow[KF_WORKFLOW_BYTES_MAX];
    char key[KF_KEY_BYTES_MAX];
    memset(workflow, 'w', sizeof workflow);
    memset(key, 'k', sizeof key);
    kf_key_t coord;
    kf_key_coord(&coord, 1, workflow, sizeof workflow, key, sizeof key);
    kf_key_t journal;
    kf_key_journal(&journal, &coord, UINT64_MAX);
    cr_assert_eq(journal.len, 1 + 2 + sizeof workflow + 2 + sizeof key + 8);
    cr_assert_leq(journal.len, KF_STORE_KEY_BYTES_MAX);
}

Test(keys, overflowing_a_key_asserts, .signal = SIGABRT) {
    static char big[KF_STORE_KEY_BYTES_MAX];
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_u8(&k, 1);
    kf_key_raw(&k, big, sizeof big);
}

Test(keys, too_long_lp_string_asserts, .signal = SIGABRT) {
    static char big[UINT16_MAX + 1];
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_lp(&k, big, sizeof big);
}

/* ---- wake-ups and run keys -------------------------------------------- */

typedef struct wakeup {
    int64_t due_ms;
    kf_wakeup_type_t type;
    const char *identity;
} wakeup_t;

Test(keys, wakeups_coordinators_by_identity_runs_by_due_then_identity) {
    /* Coordinator wake-ups (type 1) are keyed by the coordinator alone, so a
     * moving due time is one put; they sort before every run wake-up
     * (type 2), which sort by due time, then run ID. */
    static const wakeup_t order[] = {
        {INT64_MAX, KF_WAKEUP_COORDINATOR, ""},
        {0, KF_WAKEUP_COORDINATOR, "a"},
        {-5000, KF_WAKEUP_COORDINATOR, "ab"},
        {1, KF_WAKEUP_COORDINATOR, "b"},
        {INT64_MIN, KF_WAKEUP_RUN, "z"},
        {-1, KF_WAKEUP_RUN, "a"},
        {0, KF_WAKEUP_RUN, "a"},
        {0, KF_WAKEUP_RUN, "b"},
        {1700000000000LL, KF_WAKEUP_RUN, "run@x"},
        {INT64_MAX, KF_WAKEUP_RUN, "a"},
    };
    enum { N = sizeof order / sizeof order[0] };
    kf_key_t keys[N];
    for (size_t i = 0; i < N; i++) {
        kf_key_wakeup(&keys[i], order[i].due_ms, order[i].type, order[i].identity,
                      strlen(order[i].identity));
    }
    for (size_t i = 0; i < N; i++) {
        for (size_t j = 0; j < N; j++) {
            int want = i < j ? -1 : (i > j ? 1 : 0);
            cr_assert_eq(sign(key_cmp(&keys[i], &keys[j])), want, "wake-up %zu vs %zu", i, j);
        }
    }
    /* A coordinator's key does not depend on its due time. */
    kf_key_t other;
    kf_key_wakeup(&other, 12345, KF_WAKEUP_COORDINATOR, "a", 1);
    cr_assert_eq(key_cmp(&other, &keys[1]), 0);
    /* And run keys decode. */
    kf_key_reader_t r = kf_key_reader(keys[8].bytes, keys[8].len);
    int64_t due;
    uint8_t type;
    cr_assert(kf_key_read_u8(&r, &type));
    cr_assert(kf_key_read_time(&r, &due));
    cr_assert_eq(due, 1700000000000LL);
    cr_assert_eq(type, KF_WAKEUP_RUN);
    cr_assert_eq(r.left, 5);
    cr_assert_eq(memcmp(r.p, "run@x", 5), 0);
}

Test(keys, run_index_sorts_by_seq_within_a_workflow) {
    kf_key_t prefix;
    kf_key_reset(&prefix);
    kf_key_lp(&prefix, "billing", 7);
    kf_key_t prev;
    kf_key_reset(&prev);
    for (uint64_t seq = 0; seq < 2000; seq += 7) {
        kf_key_t k;
        kf_key_run_index(&k, "billing", 7, seq);
        cr_assert(in_prefix_range(&prefix, &k));
        if (seq > 0) {
            cr_assert_lt(key_cmp(&prev, &k), 0);
        }
        prev = k;
    }
    kf_key_t other;
    kf_key_run_index(&other, "billing2", 8, 0);
    cr_assert_not(in_prefix_range(&prefix, &other), "another workflow inside the range");
    kf_key_run_index(&other, "billin", 6, UINT64_MAX);
    cr_assert_not(in_prefix_range(&prefix, &other));
}

Test(keys, run_queue_is_the_bare_sequence) {
    kf_key_t k;
    kf_key_run_queue(&k, 0x1122334455667788ULL);
    static const uint8_t want[] = {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88};
    cr_assert_eq(k.len, 8);
    cr_assert_eq(memcmp(k.bytes, want, 8), 0);
    kf_key_t a;
    kf_key_t b;
    kf_key_run_queue(&a, 255);
    kf_key_run_queue(&b, 256);
    cr_assert_lt(key_cmp(&a, &b), 0);
}

/* ---- readers on truncated and malformed keys -------------------------- */

Test(keys, readers_reject_truncated_keys) {
    static const uint8_t bytes[] = {0, 5, 'a', 'b', 'c', 'd', 1, 2, 3, 4, 5, 6, 7};
    kf_key_reader_t r = kf_key_reader(bytes, 0);
    uint8_t u;
    cr_assert_not(kf_key_read_u8(&r, &u));
    for (size_t len = 0; len < 8; len++) {
        r = kf_key_reader(bytes + 6, len);
        uint64_t v;
        int64_t t;
        cr_assert_not(kf_key_read_be64(&r, &v), "be64 from %zu bytes", len);
        cr_assert_not(kf_key_read_time(&r, &t), "time from %zu bytes", len);
        cr_assert_eq(r.left, len, "a failed read consumed bytes");
        cr_assert_eq(r.p, bytes + 6);
    }
    const char *s;
    size_t slen;
    r = kf_key_reader(bytes, 1);
    cr_assert_not(kf_key_read_lp(&r, &s, &slen), "lp from a 1-byte header");
    /* The length says 5, only 4 bytes follow. */
    r = kf_key_reader(bytes, 6);
    cr_assert_not(kf_key_read_lp(&r, &s, &slen), "lp longer than the key");
    cr_assert_eq(r.left, 6);
    cr_assert_eq(r.p, bytes);
    r = kf_key_reader(bytes, 7);
    cr_assert(kf_key_read_lp(&r, &s, &slen));
    cr_assert_eq(slen, 5);
    cr_assert_eq(r.left, 0);
}

Test(keys, lp_with_a_huge_length_is_rejected) {
    static const uint8_t bytes[] = {0xff, 0xff, 'a', 'b'};
    kf_key_reader_t r = kf_key_reader(bytes, sizeof bytes);
    const char *s;
    size_t len;
    cr_assert_not(kf_key_read_lp(&r, &s, &len));
}

/* Every truncation of a full coordinator key fails to decode somewhere. */
Test(keys, every_truncated_coordinator_key_is_rejected) {
    kf_key_t k;
    kf_key_coord(&k, 1, "work", 4, "key", 3);
    for (size_t len = 0; len < k.len; len++) {
        kf_key_reader_t r = kf_key_reader(k.bytes, len);
        uint8_t kind;
        const char *w;
        const char *key;
        size_t wlen;
        size_t klen;
        bool ok = kf_key_read_u8(&r, &kind) && kf_key_read_lp(&r, &w, &wlen) &&
                  kf_key_read_lp(&r, &key, &klen);
        cr_assert_not(ok, "a %zu-byte prefix of a %zu-byte key decoded", len, k.len);
    }
}

/* ---- prefix ends ------------------------------------------------------- */

static kf_key_t key_of(const uint8_t *bytes, size_t len) {
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_raw(&k, bytes, len);
    return k;
}

Test(keys, prefix_end_increments_the_last_byte) {
    static const uint8_t p[] = {0x01, 0x02};
    kf_key_t prefix = key_of(p, sizeof p);
    kf_key_t end;
    cr_assert(kf_key_prefix_end(&prefix, &end));
    static const uint8_t want[] = {0x01, 0x03};
    cr_assert_eq(end.len, 2);
    cr_assert_eq(memcmp(end.bytes, want, 2), 0);
    cr_assert_eq(prefix.len, 2, "the prefix is unchanged");
    cr_assert_eq(prefix.bytes[1], 0x02);
}

Test(keys, prefix_end_drops_trailing_ff_bytes) {
    static const uint8_t p[] = {0x01, 0xfe, 0xff, 0xff};
    kf_key_t prefix = key_of(p, sizeof p);
    kf_key_t end;
    cr_assert(kf_key_prefix_end(&prefix, &end));
    static const uint8_t want[] = {0x01, 0xff};
    cr_assert_eq(end.len, 2);
    cr_assert_eq(memcmp(end.bytes, want, 2), 0);

    static const uint8_t q[] = {0x00, 0xff};
    prefix = key_of(q, sizeof q);
    cr_assert(kf_key_prefix_end(&prefix, &end));
    cr_assert_eq(end.len, 1);
    cr_assert_eq(end.bytes[0], 0x01);
}

Test(keys, prefix_end_of_all_ff_or_empty_does_not_exist) {
    static const uint8_t p[] = {0xff, 0xff, 0xff};
    kf_key_t prefix = key_of(p, sizeof p);
    kf_key_t end;
    cr_assert_not(kf_key_prefix_end(&prefix, &end));
    prefix = key_of(p, 0);
    cr_assert_not(kf_key_prefix_end(&prefix, &end));
}

/* For random prefixes (heavy in 0x00 and 0xff) and random extensions: every
 * key that starts with the prefix is in [prefix, end), and every key that
 * does not is outside it. */
Test(keys, prefix_range_contains_exactly_the_prefixed_keys) {
    static const uint8_t alphabet[] = {0x00, 0x01, 0x7f, 0xfe, 0xff};
    uint64_t rs = 99;
    for (int round = 0; round < 2000; round++) {
        uint8_t p[6];
        size_t plen = 1 + next_random(&rs) % 5;
        for (size_t i = 0; i < plen; i++) {
            p[i] = alphabet[next_random(&rs) % sizeof alphabet];
        }
        kf_key_t prefix = key_of(p, plen);
        uint8_t q[10];
        size_t qlen = next_random(&rs) % 10;
        for (size_t i = 0; i < qlen; i++) {
            q[i] = alphabet[next_random(&rs) % sizeof alphabet];
        }
        if (next_random(&rs) % 2 == 0 && qlen >= plen) {
            memcpy(q, p, plen); /* half the time, make it an extension */
        }
        kf_key_t key = key_of(q, qlen);
        cr_assert_eq(in_prefix_range(&prefix, &key), is_prefix(&prefix, &key),
                     "round %d: prefix len %zu, key len %zu", round, plen, qlen);
    }
}
