/*
 * partition_test.c - kf-hash-1, partitions of keys and coordinators, run ID
 * tags and partition sets (service/base/partition.h).
 *
 * The expected values come from tests/partition/vectors.json, written by an
 * independent implementation (tests/partition/make_vectors.py) and checked
 * by the Python and Node SDKs and the proxy's Lua script too: a change of
 * the hash fails here before it could send a key to another partition.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "base/partition.h"

static json_t *vectors(void) {
    json_error_t jerr;
    json_t *doc = json_load_file(KF_PARTITION_VECTORS, 0, &jerr);
    cr_assert_not_null(doc, "%s: %s", KF_PARTITION_VECTORS, jerr.text);
    cr_assert_str_eq(json_string_value(json_object_get(doc, "hash")), KF_PARTITION_HASH_NAME);
    return doc;
}

static size_t unhex(const char *hex, uint8_t *out, size_t cap) {
    size_t n = strlen(hex) / 2;
    cr_assert(n <= cap);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        cr_assert_eq(sscanf(hex + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
    return n;
}

Test(partition, hash_vectors) {
    json_t *doc = vectors();
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(doc, "hashes"), i, v) {
        uint8_t bytes[1024];
        size_t n = unhex(json_string_value(json_object_get(v, "hex")), bytes, sizeof bytes);
        uint32_t want = (uint32_t)json_integer_value(json_object_get(v, "hash"));
        cr_expect_eq(kf_partition_hash(bytes, n), want, "vector %zu: %u, want %u", i,
                     kf_partition_hash(bytes, n), want);
    }
    cr_assert_gt(json_array_size(json_object_get(doc, "hashes")), 5);
    json_decref(doc);
}

Test(partition, coordinator_vectors) {
    json_t *doc = vectors();
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(doc, "coordinators"), i, v) {
        const char *wf = json_string_value(json_object_get(v, "workflow"));
        const char *key = json_string_value(json_object_get(v, "key"));
        uint32_t count = (uint32_t)json_integer_value(json_object_get(v, "count"));
        uint32_t want = (uint32_t)json_integer_value(json_object_get(v, "partition"));
        cr_expect_eq(kf_partition_of_coordinator(wf, strlen(wf), key, strlen(key), count), want,
                     "(%s, %s) of %u", wf, key, count);
    }
    json_decref(doc);
}

Test(partition, key_vectors) {
    json_t *doc = vectors();
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(doc, "keys"), i, v) {
        uint8_t key[1024];
        size_t n = unhex(json_string_value(json_object_get(v, "canonical_hex")), key, sizeof key);
        uint32_t count = (uint32_t)json_integer_value(json_object_get(v, "count"));
        uint32_t want = (uint32_t)json_integer_value(json_object_get(v, "partition"));
        cr_expect_eq(kf_partition_of_key(key, n, count), want, "key vector %zu", i);
    }
    json_decref(doc);
}

Test(partition, function_home_vectors) {
    json_t *doc = vectors();
    size_t i;
    json_t *v;
    size_t n = 0;
    json_array_foreach(json_object_get(doc, "function_homes"), i, v) {
        const char *id = json_string_value(json_object_get(v, "function_id"));
        uint32_t count = (uint32_t)json_integer_value(json_object_get(v, "count"));
        uint32_t want = (uint32_t)json_integer_value(json_object_get(v, "partition"));
        cr_expect_eq(kf_partition_home_of_function(id, strlen(id), count), want, "%s of %u", id,
                     count);
        n++;
    }
    cr_assert_gt(n, 0, "the vectors hold function homes");
    json_decref(doc);
}

Test(partition, run_id_vectors) {
    json_t *doc = vectors();
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(doc, "run_ids"), i, v) {
        const char *id = json_string_value(json_object_get(v, "run_id"));
        uint32_t count = (uint32_t)json_integer_value(json_object_get(v, "count"));
        int32_t want = (int32_t)json_integer_value(json_object_get(v, "partition"));
        cr_expect_eq(kf_partition_of_run_id(id, count), want, "%s of %u", id, count);
    }
    json_decref(doc);
}

/* A coordinator hashes like a function key of two columns (workflow, key). */
Test(partition, coordinator_is_a_two_column_key) {
    const uint8_t key[] = {0, 0, 0, 4, 's', 'h', 'i', 'p', 0, 0, 0, 1, 'k'};
    for (uint32_t count = 1; count <= 64; count++) {
        cr_assert_eq(kf_partition_of_coordinator("ship", 4, "k", 1, count),
                     kf_partition_of_key(key, sizeof key, count));
    }
}

/* Column by column gives what the whole canonical key gives. */
Test(partition, hasher_matches_the_canonical_key) {
    const uint8_t key[] = {0, 0, 0, 3, 'a', 'n', 'n', 0, 0, 0, 0, 0, 0, 0, 2, 'x', 'y'};
    kf_partition_hasher_t h;
    kf_partition_hasher_init(&h);
    kf_partition_hasher_column(&h, "ann", 3);
    kf_partition_hasher_column(&h, "", 0);
    kf_partition_hasher_column(&h, "xy", 2);
    for (uint32_t count = 1; count <= 300; count++) {
        cr_assert_eq(kf_partition_hasher_partition(&h, count),
                     kf_partition_of_key(key, sizeof key, count));
    }
}

Test(partition, tag_round_trips) {
    char uuid[KF_UUID_TEXT_BYTES + 1] = "0190f7a2-5b3c-7abc-8a4e-1c2d3e4f5a6b";
    char run_id[64];
    for (uint32_t p = 0; p < KF_PARTITION_COUNT_MAX; p++) {
        kf_partition_tag_uuid(uuid, p);
        snprintf(run_id, sizeof run_id, "order@7@%s", uuid);
        cr_assert_eq(kf_partition_of_run_id(run_id, KF_PARTITION_COUNT_MAX), (int32_t)p);
        cr_assert_eq(kf_partition_of_run_id(run_id, p + 1), (int32_t)p);
        if (p > 1) { /* a data set of one partition routes every ID to it */
            cr_assert_eq(kf_partition_of_run_id(run_id, p), -1, "partition %u of %u", p, p);
        }
    }
    cr_assert_str_eq(uuid + 19, "8a4e-1c2d3e4f5a6b", "only rand_a changes");
}

/* Keys spread: 10000 keys over 8 partitions, each within 10% of fair. */
Test(partition, spreads_keys) {
    uint32_t counts[8] = {0};
    for (int i = 0; i < 10000; i++) {
        char key[32];
        int n = snprintf(key, sizeof key, "order-%d", i);
        counts[kf_partition_of_coordinator("ship", 4, key, (size_t)n, 8)]++;
    }
    for (int p = 0; p < 8; p++) {
        cr_expect(counts[p] > 1125 && counts[p] < 1375, "partition %d has %u of 10000", p,
                  counts[p]);
    }
}

Test(partition, sets_parse_and_format) {
    kf_partition_set_t set;
    kf_error_t err;
    char text[128];
    cr_assert_eq(kf_partition_set_parse("--partitions", "0-3,6", 8, &set, &err), KF_OK);
    cr_assert_eq(kf_partition_set_size(&set), 5);
    cr_assert(kf_partition_set_has(&set, 3) && kf_partition_set_has(&set, 6));
    cr_assert(!kf_partition_set_has(&set, 4) && !kf_partition_set_has(&set, 7));
    kf_partition_set_format(&set, text, sizeof text);
    cr_assert_str_eq(text, "0-3,6");
    cr_assert_eq(kf_partition_set_parse("--partitions", "all", 3, &set, &err), KF_OK);
    kf_partition_set_format(&set, text, sizeof text);
    cr_assert_str_eq(text, "0-2");
    cr_assert_eq(kf_partition_set_parse("--partitions", "5", 256, &set, &err), KF_OK);
    kf_partition_set_format(&set, text, sizeof text);
    cr_assert_str_eq(text, "5");
    cr_assert(!kf_partition_set_has(&set, 300), "out of range is never in");
}

Test(partition, sets_refuse_bad_text) {
    static const char *const bad[] = {"", "x", "1-", "-1", "3-1", "1,,2", "1 2", "0-8", "8", "1,"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kf_partition_set_t set;
        kf_error_t err;
        cr_expect_eq(kf_partition_set_parse("--partitions", bad[i], 8, &set, &err), KF_E_INVALID,
                     "\"%s\"", bad[i]);
        cr_expect(strstr(err.message, "--partitions") != NULL, "%s", err.message);
    }
}
