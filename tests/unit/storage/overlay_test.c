/*
 * overlay_test.c - read-your-writes across group commit (storage/overlay.h),
 * over both stores: staged records answer before the store, deletes and
 * prefix deletes hide stored records, a record leaves when the latest group
 * that wrote it is durable, merged iteration, and a seeded comparison with
 * a reference map while groups are written behind the commands that follow
 * them (the committer's pipeline).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "storage/keys.h"
#include "storage/overlay.h"
#include "store_harness.h"

static store_harness_t h;
static kf_overlay_t *ov;

static void setup_mem(void) {
    harness_setup_mem(&h);
    ov = kf_overlay_create(h.store);
    kf_overlay_track(ov, KF_CF_RUNS);
}
static void setup_rocks(void) {
    harness_setup_rocks(&h);
    ov = kf_overlay_create(h.store);
    kf_overlay_track(ov, KF_CF_RUNS);
}
static void teardown(void) {
    kf_overlay_destroy(ov);
    harness_teardown(&h);
}

#define OVERLAY_TEST(name)                                                                         \
    static void body_##name(void);                                                                 \
    Test(overlay_mem, name, .init = setup_mem, .fini = teardown) {                                 \
        body_##name();                                                                             \
    }                                                                                              \
    Test(overlay_rocks, name, .init = setup_rocks, .fini = teardown) {                             \
        body_##name();                                                                             \
    }                                                                                              \
    static void body_##name(void)

/* The value of `key` through the overlay as a string, or NULL when absent
 * (a static buffer). */
static const char *get(kf_cf_t cf, const char *key) {
    static char out[256];
    kf_value_t v;
    bool found;
    kf_error_t err;
    kf_status_t st = kf_overlay_get(ov, cf, key, strlen(key), &v, &found, &err);
    cr_assert_eq(st, KF_OK, "get %s: %s", key, err.message);
    if (!found) {
        return NULL;
    }
    cr_assert(v.len < sizeof out);
    memcpy(out, v.data, v.len);
    out[v.len] = '\0';
    kf_store_value_free(&v);
    return out;
}

static void put(uint64_t group, kf_batch_t *b, const char *key, const char *value) {
    kf_overlay_put(ov, group, KF_CF_RUNS, key, strlen(key), value, strlen(value));
    kf_batch_put(b, KF_CF_RUNS, key, strlen(key), value, strlen(value));
}

static void del(uint64_t group, kf_batch_t *b, const char *key) {
    kf_overlay_delete(ov, group, KF_CF_RUNS, key, strlen(key));
    kf_batch_delete(b, KF_CF_RUNS, key, strlen(key));
}

static void del_prefix(uint64_t group, kf_batch_t *b, const char *prefix) {
    kf_key_t p, end;
    kf_key_reset(&p);
    kf_key_raw(&p, prefix, strlen(prefix));
    cr_assert(kf_key_prefix_end(&p, &end));
    kf_overlay_delete_prefix(ov, group, KF_CF_RUNS, p.bytes, p.len);
    kf_batch_delete_range(b, KF_CF_RUNS, p.bytes, p.len, end.bytes, end.len);
}

/* "k=v,k=v" of every record in [lower, upper) through the overlay. */
static void list(const char *lower, const char *upper, char *out, size_t cap) {
    kf_iter_t *it;
    kf_error_t err;
    kf_status_t st = kf_overlay_iter_create(ov, KF_CF_RUNS, lower, lower ? strlen(lower) : 0, upper,
                                            upper ? strlen(upper) : 0, &it, &err);
    cr_assert_eq(st, KF_OK, "%s", err.message);
    size_t n = 0;
    out[0] = '\0';
    for (kf_iter_seek_first(it); kf_iter_valid(it); kf_iter_next(it)) {
        size_t kl, vl;
        const char *k = kf_iter_key(it, &kl);
        const char *v = kf_iter_value(it, &vl);
        int w = snprintf(out + n, cap - n, "%s%.*s=%.*s", n ? "," : "", (int)kl, k, (int)vl, v);
        cr_assert(w > 0 && (size_t)w < cap - n);
        n += (size_t)w;
    }
    cr_assert_eq(kf_iter_status(it, &err), KF_OK);
    kf_iter_destroy(it);
}

OVERLAY_TEST(a_staged_record_answers_until_its_group_is_durable) {
    harness_put_str(h.store, KF_CF_RUNS, "a", "old");
    kf_batch_t *b = kf_batch_create(h.store);
    put(1, b, "a", "new");
    put(1, b, "b", "born");
    cr_assert_str_eq(get(KF_CF_RUNS, "a"), "new");
    cr_assert_str_eq(get(KF_CF_RUNS, "b"), "born");
    cr_assert_eq(kf_overlay_count(ov), 2);
    cr_assert_eq(kf_overlay_bytes(ov), 1 + 3 + 1 + 4);
    /* Written but not yet durable: still staged (the same answer). */
    harness_write(h.store, b);
    cr_assert_str_eq(get(KF_CF_RUNS, "a"), "new");
    kf_overlay_durable(ov, 1);
    cr_assert_eq(kf_overlay_count(ov), 0);
    cr_assert_eq(kf_overlay_bytes(ov), 0);
    cr_assert_str_eq(get(KF_CF_RUNS, "a"), "new"); /* from the store now */
    cr_assert_str_eq(get(KF_CF_RUNS, "b"), "born");
    kf_batch_destroy(b);
}

OVERLAY_TEST(a_record_rewritten_by_a_later_group_stays_until_that_one_is_durable) {
    kf_batch_t *b1 = kf_batch_create(h.store);
    kf_batch_t *b2 = kf_batch_create(h.store);
    put(1, b1, "a", "one");
    put(2, b2, "a", "two");
    harness_write(h.store, b1);
    kf_overlay_durable(ov, 1);
    cr_assert_eq(kf_overlay_count(ov), 1);
    cr_assert_str_eq(get(KF_CF_RUNS, "a"), "two"); /* the store still says "one" */
    harness_write(h.store, b2);
    kf_overlay_durable(ov, 2);
    cr_assert_eq(kf_overlay_count(ov), 0);
    cr_assert_str_eq(get(KF_CF_RUNS, "a"), "two");
    kf_batch_destroy(b1);
    kf_batch_destroy(b2);
}

OVERLAY_TEST(a_staged_delete_hides_the_stored_record) {
    harness_put_str(h.store, KF_CF_RUNS, "a", "old");
    kf_batch_t *b = kf_batch_create(h.store);
    del(3, b, "a");
    cr_assert_null(get(KF_CF_RUNS, "a"));
    put(3, b, "a", "again");
    cr_assert_str_eq(get(KF_CF_RUNS, "a"), "again");
    del(4, b, "a");
    cr_assert_null(get(KF_CF_RUNS, "a"));
    harness_write(h.store, b);
    kf_overlay_durable(ov, 4);
    cr_assert_null(get(KF_CF_RUNS, "a"));
    kf_batch_destroy(b);
}

OVERLAY_TEST(a_prefix_delete_hides_stored_and_staged_records_under_it_only) {
    harness_put_str(h.store, KF_CF_RUNS, "pa", "stored");
    harness_put_str(h.store, KF_CF_RUNS, "p", "stored-p");
    harness_put_str(h.store, KF_CF_RUNS, "q", "other");
    kf_batch_t *b = kf_batch_create(h.store);
    put(1, b, "pb", "staged");
    del_prefix(2, b, "p");
    cr_assert_null(get(KF_CF_RUNS, "pa"));
    cr_assert_null(get(KF_CF_RUNS, "pb"));
    cr_assert_null(get(KF_CF_RUNS, "p"));
    cr_assert_str_eq(get(KF_CF_RUNS, "q"), "other");
    /* The staged record became a delete of group 2: group 1 being durable
     * does not bring the stored one back. */
    kf_overlay_durable(ov, 1);
    cr_assert_null(get(KF_CF_RUNS, "pb"));
    put(2, b, "pc", "after");
    cr_assert_str_eq(get(KF_CF_RUNS, "pc"), "after");
    char out[256];
    list(NULL, NULL, out, sizeof out);
    cr_assert_str_eq(out, "pc=after,q=other");
    harness_write(h.store, b);
    kf_overlay_durable(ov, 2);
    cr_assert_eq(kf_overlay_count(ov), 0);
    list(NULL, NULL, out, sizeof out);
    cr_assert_str_eq(out, "pc=after,q=other");
    kf_batch_destroy(b);
}

OVERLAY_TEST(iteration_merges_staged_records_within_the_bounds) {
    harness_put_str(h.store, KF_CF_RUNS, "a", "1");
    harness_put_str(h.store, KF_CF_RUNS, "b", "2");
    harness_put_str(h.store, KF_CF_RUNS, "c", "3");
    harness_put_str(h.store, KF_CF_RUNS, "e", "5");
    kf_batch_t *b = kf_batch_create(h.store);
    put(1, b, "b", "two");
    put(1, b, "bb", "22");
    del(1, b, "c");
    put(1, b, "d", "4");
    put(1, b, "f", "6");
    char out[256];
    list(NULL, NULL, out, sizeof out);
    cr_assert_str_eq(out, "a=1,b=two,bb=22,d=4,e=5,f=6");
    list("b", "e", out, sizeof out);
    cr_assert_str_eq(out, "b=two,bb=22,d=4");
    list("bc", "f", out, sizeof out);
    cr_assert_str_eq(out, "d=4,e=5");
    /* seek into the middle */
    kf_iter_t *it;
    kf_error_t err;
    cr_assert_eq(kf_overlay_iter_create(ov, KF_CF_RUNS, NULL, 0, NULL, 0, &it, &err), KF_OK);
    kf_iter_seek(it, "c", 1);
    size_t kl;
    cr_assert(kf_iter_valid(it));
    cr_assert_eq(memcmp(kf_iter_key(it, &kl), "d", 1), 0);
    kf_iter_destroy(it);
    kf_batch_destroy(b);
}

OVERLAY_TEST(an_untracked_family_reads_the_store) {
    harness_put_str(h.store, KF_CF_STATE, "a", "stored");
    cr_assert_not(kf_overlay_tracks(ov, KF_CF_STATE));
    cr_assert_str_eq(get(KF_CF_STATE, "a"), "stored");
}

/* ---- seeded comparison with a reference map -------------------------------- */

#define MODEL_KEYS 48

typedef struct model {
    bool present[MODEL_KEYS];
    char value[MODEL_KEYS][16];
} model_t;

/* Key i: two letters, so that one-letter prefixes cover groups of keys. */
static void model_key(int i, char out[3]) {
    out[0] = (char)('a' + i / 8);
    out[1] = (char)('a' + i % 8);
    out[2] = '\0';
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void model_check(const model_t *m, uint64_t seed, int step) {
    char expect[2048], got[2048];
    size_t n = 0;
    expect[0] = '\0';
    for (int i = 0; i < MODEL_KEYS; i++) {
        char k[3];
        model_key(i, k);
        const char *v = get(KF_CF_RUNS, k);
        if (m->present[i]) {
            cr_assert(v != NULL && strcmp(v, m->value[i]) == 0,
                      "seed %llu step %d: %s is %s, the model says %s", (unsigned long long)seed,
                      step, k, v ? v : "(absent)", m->value[i]);
            n += (size_t)snprintf(expect + n, sizeof expect - n, "%s%s=%s", n ? "," : "", k,
                                  m->value[i]);
        } else {
            cr_assert_null(v, "seed %llu step %d: %s is %s, the model says absent",
                           (unsigned long long)seed, step, k, v);
        }
    }
    list(NULL, NULL, got, sizeof got);
    cr_assert_str_eq(got, expect, "seed %llu step %d", (unsigned long long)seed, step);
}

/* Groups are staged one after another; each is written some steps later
 * (at most three are in flight) and declared durable later still, as the
 * committer does, so reads meet records of every stage. */
OVERLAY_TEST(seeded_groups_read_as_the_reference_map) {
    for (uint64_t seed = 1; seed <= 40; seed++) {
        uint64_t s = seed * 0x9E3779B97F4A7C15ULL;
        model_t m;
        memset(&m, 0, sizeof m);
        /* a clean store per seed: delete everything through the store */
        kf_batch_t *wipe = kf_batch_create(h.store);
        kf_batch_delete_range(wipe, KF_CF_RUNS, "", 0, "\xff", 1);
        harness_write(h.store, wipe);
        kf_batch_destroy(wipe);
        kf_batch_t *pending[8];
        int npending = 0;
        uint64_t group = 100 * seed, written = group - 1;
        pending[npending++] = kf_batch_create(h.store);
        for (int step = 0; step < 300; step++) {
            kf_batch_t *b = pending[npending - 1];
            uint64_t r = rng_next(&s) % 100;
            int i = (int)(rng_next(&s) % MODEL_KEYS);
            char k[3];
            model_key(i, k);
            if (r < 45) {
                snprintf(m.value[i], sizeof m.value[i], "v%d", step);
                m.present[i] = true;
                put(group, b, k, m.value[i]);
            } else if (r < 65) {
                m.present[i] = false;
                del(group, b, k);
            } else if (r < 70) {
                char p[2] = {k[0], '\0'};
                for (int j = 0; j < MODEL_KEYS; j++) {
                    char kj[3];
                    model_key(j, kj);
                    if (kj[0] == p[0]) {
                        m.present[j] = false;
                    }
                }
                del_prefix(group, b, p);
            } else if (r < 85 && npending < 3) {
                pending[npending++] = kf_batch_create(h.store); /* the next group opens */
                group++;
            } else if (r < 95 && npending > 1) {
                /* the committer writes the oldest group */
                harness_write(h.store, pending[0]);
                kf_batch_destroy(pending[0]);
                memmove(&pending[0], &pending[1], (size_t)(npending - 1) * sizeof pending[0]);
                npending--;
                written = group - (uint64_t)npending;
            } else {
                kf_overlay_durable(ov, written); /* ... and reports it durable */
            }
            model_check(&m, seed, step);
        }
        for (int j = 0; j < npending; j++) {
            harness_write(h.store, pending[j]);
            kf_batch_destroy(pending[j]);
        }
        kf_overlay_durable(ov, group);
        cr_assert_eq(kf_overlay_count(ov), 0);
        cr_assert_eq(kf_overlay_bytes(ov), 0);
        model_check(&m, seed, -1);
    }
}
