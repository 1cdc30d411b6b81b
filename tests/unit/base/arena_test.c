/*
 * arena_test.c - the per-request bump allocator (service/base/arena.h).
 *
 * Checks the promises of the header: every allocation is 16-byte aligned,
 * allocations never overlap, allocation past the byte limit returns NULL
 * (including sizes that would overflow the bookkeeping), reset and deinit
 * free everything (LeakSanitizer checks that in the sanitizer build), and the
 * protobuf-c allocator view decodes a real message into the arena.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "base/arena.h"
#include "base/limits.h"
#include "grpc/health/v1/health.pb-c.h"

static bool aligned16(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

Test(arena, init_defaults_the_limit) {
    kf_arena_t a;
    kf_arena_init(&a, 0);
    cr_assert_eq(a.limit_bytes, (size_t)KF_ARENA_BYTES_MAX);
    cr_assert_eq(a.used_bytes, 0);
    kf_arena_deinit(&a);
    kf_arena_init(&a, 4096);
    cr_assert_eq(a.limit_bytes, 4096);
    kf_arena_deinit(&a);
}

/* Odd sizes through the inline buffer and then several chunks. */
Test(arena, allocations_are_aligned_and_disjoint) {
    kf_arena_t a;
    kf_arena_init(&a, 0);
    enum { N = 600 };
    unsigned char *ptrs[N];
    size_t sizes[N];
    for (int i = 0; i < N; i++) {
        sizes[i] = (size_t)(1 + (i * 37) % 300);
        ptrs[i] = kf_arena_alloc(&a, sizes[i]);
        cr_assert_not_null(ptrs[i], "allocation %d of %zu bytes", i, sizes[i]);
        cr_assert(aligned16(ptrs[i]), "allocation %d at %p is not 16-byte aligned", i,
                  (void *)ptrs[i]);
        memset(ptrs[i], i & 0xff, sizes[i]);
    }
    for (int i = 0; i < N; i++) {
        for (size_t k = 0; k < sizes[i]; k++) {
            cr_assert_eq(ptrs[i][k], (unsigned char)(i & 0xff), "allocation %d byte %zu", i, k);
        }
    }
    cr_assert_not_null(a.chunks, "600 allocations should have needed chunks");
    kf_arena_deinit(&a);
}

/* The header promises 16-byte alignment wherever the caller keeps the arena,
 * e.g. embedded in a request struct after a pointer field. */
Test(arena, alignment_does_not_depend_on_where_the_arena_lives) {
    struct holder {
        _Alignas(16) void *first;
        kf_arena_t arena;
    };
    struct holder *h = malloc(sizeof *h);
    cr_assert_not_null(h);
    kf_arena_init(&h->arena, 0);
    for (int i = 0; i < 8; i++) {
        void *p = kf_arena_alloc(&h->arena, 24);
        cr_assert_not_null(p);
        cr_assert(aligned16(p), "allocation %d at %p (arena at %p) is not 16-byte aligned", i, p,
                  (void *)&h->arena);
    }
    kf_arena_deinit(&h->arena);
    free(h);
}

Test(arena, limit_is_enforced_exactly) {
    kf_arena_t a;
    kf_arena_init(&a, 4096);
    void *p1 = kf_arena_alloc(&a, 4000);
    cr_assert_not_null(p1);
    cr_assert_null(kf_arena_alloc(&a, 200), "4000 + 200 bytes passed a 4096-byte limit");
    /* A refused allocation consumed nothing: what still fits still fits. */
    cr_assert_not_null(kf_arena_alloc(&a, 80));
    cr_assert_not_null(kf_arena_alloc(&a, 16));
    cr_assert_eq(a.used_bytes, 4096);
    cr_assert_null(kf_arena_alloc(&a, 1), "allocation past a full arena");
    cr_assert_null(kf_arena_zalloc(&a, 1));
    cr_assert_null(kf_arena_strdup(&a, "x"));
    cr_assert_null(kf_arena_printf(&a, "%d", 1));
    cr_assert_null(kf_arena_memdup(&a, "xy", 2));
    kf_arena_deinit(&a);
}

Test(arena, single_allocation_larger_than_the_limit_fails) {
    kf_arena_t a;
    kf_arena_init(&a, 64 * 1024);
    cr_assert_null(kf_arena_alloc(&a, 64 * 1024 + 1));
    cr_assert_null(kf_arena_alloc(&a, SIZE_MAX));
    cr_assert_eq(a.used_bytes, 0);
    cr_assert_not_null(kf_arena_alloc(&a, 64 * 1024));
    kf_arena_deinit(&a);
}

/* Sizes near SIZE_MAX must not wrap the limit check around, whether the arena
 * is still in its inline buffer or already in chunks. */
Test(arena, huge_sizes_fail_after_small_inline_allocations) {
    kf_arena_t a;
    kf_arena_init(&a, 0);
    cr_assert_not_null(kf_arena_alloc(&a, 32));
    void *p = kf_arena_alloc(&a, SIZE_MAX - 20);
    cr_assert_null(p, "alloc(SIZE_MAX - 20) returned %p", p);
    kf_arena_deinit(&a);
}

Test(arena, huge_sizes_fail_after_chunk_allocations) {
    kf_arena_t a;
    kf_arena_init(&a, 0);
    cr_assert_not_null(kf_arena_alloc(&a, 2000));
    cr_assert_not_null(a.chunks);
    void *p = kf_arena_alloc(&a, SIZE_MAX - 20);
    cr_assert_null(p, "alloc(SIZE_MAX - 20) returned %p", p);
    kf_arena_deinit(&a);
}

Test(arena, big_allocations_get_their_own_room) {
    kf_arena_t a;
    kf_arena_init(&a, 0);
    size_t big = 3u * 1024 * 1024;
    unsigned char *p = kf_arena_alloc(&a, big);
    cr_assert_not_null(p);
    cr_assert(aligned16(p));
    memset(p, 0x5a, big);
    unsigned char *q = kf_arena_alloc(&a, 100);
    cr_assert_not_null(q);
    memset(q, 0x11, 100);
    cr_assert_eq(p[0], 0x5a);
    cr_assert_eq(p[big - 1], 0x5a);
    cr_assert_geq(a.used_bytes, big + 100);
    kf_arena_deinit(&a);
}

Test(arena, zalloc_zeroes_reused_memory) {
    kf_arena_t a;
    kf_arena_init(&a, 0);
    unsigned char *p = kf_arena_alloc(&a, 512);
    cr_assert_not_null(p);
    memset(p, 0xaa, 512);
    kf_arena_reset(&a);
    unsigned char *z = kf_arena_zalloc(&a, 512);
    cr_assert_not_null(z);
    for (int i = 0; i < 512; i++) {
        cr_assert_eq(z[i], 0, "byte %d", i);
    }
    unsigned char *big = kf_arena_zalloc(&a, 40000);
    cr_assert_not_null(big);
    for (int i = 0; i < 40000; i++) {
        cr_assert_eq(big[i], 0, "byte %d", i);
    }
    kf_arena_deinit(&a);
}

Test(arena, strdup_strndup_memdup) {
    kf_arena_t a;
    kf_arena_init(&a, 0);
    char src[] = "hello, world";
    char *d = kf_arena_strdup(&a, src);
    cr_assert_not_null(d);
    cr_assert_neq(d, src);
    src[0] = 'J';
    cr_assert_str_eq(d, "hello, world");
    char *n = kf_arena_strndup(&a, "abcdef", 3);
    cr_assert_str_eq(n, "abc");
    char *e = kf_arena_strdup(&a, "");
    cr_assert_not_null(e);
    cr_assert_str_eq(e, "");
    static const unsigned char bin[] = {0, 1, 2, 0xff, 0, 7};
    unsigned char *m = kf_arena_memdup(&a, bin, sizeof bin);
    cr_assert_not_null(m);
    cr_assert_eq(memcmp(m, bin, sizeof bin), 0);
    cr_assert_not_null(kf_arena_memdup(&a, NULL, 0), "memdup of nothing still succeeds");
    kf_arena_deinit(&a);
}

Test(arena, printf_formats_short_and_long) {
    kf_arena_t a;
    kf_arena_init(&a, 0);
    char *s = kf_arena_printf(&a, "%s@%d-%05.1f", "key", 42, 3.14159);
    cr_assert_str_eq(s, "key@42-003.1");
    char *empty = kf_arena_printf(&a, "%s", "");
    cr_assert_str_eq(empty, "");
    /* Longer than the inline buffer and than one minimum chunk. */
    char *long_text = kf_arena_printf(&a, "%040000d|", 7);
    cr_assert_not_null(long_text);
    cr_assert_eq(strlen(long_text), 40001);
    cr_assert_eq(long_text[39999], '7');
    cr_assert_eq(long_text[40000], '|');
    cr_assert_eq(long_text[0], '0');
    kf_arena_deinit(&a);
}

Test(arena, printf_past_the_limit_fails) {
    kf_arena_t a;
    kf_arena_init(&a, 256);
    cr_assert_null(kf_arena_printf(&a, "%0300d", 1));
    char *ok = kf_arena_printf(&a, "%0100d", 1);
    cr_assert_not_null(ok);
    cr_assert_eq(strlen(ok), 100);
    kf_arena_deinit(&a);
}

Test(arena, reset_frees_and_allows_reuse_up_to_the_limit) {
    kf_arena_t a;
    kf_arena_init(&a, 100000);
    size_t first_total = 0;
    for (int round = 0; round < 3; round++) {
        size_t total = 0;
        for (;;) {
            void *p = kf_arena_alloc(&a, 1000);
            if (p == NULL) {
                break;
            }
            memset(p, round, 1000);
            total += 1000;
        }
        /* Alignment padding may cost a little, never more than the limit. */
        cr_assert(total <= 100000 && total >= 98000, "round %d: %zu bytes", round, total);
        if (round == 0) {
            first_total = total;
        }
        cr_assert_eq(total, first_total, "round %d got less room after reset", round);
        kf_arena_reset(&a);
        cr_assert_eq(a.used_bytes, 0);
        cr_assert_null(a.chunks);
        cr_assert_eq(a.limit_bytes, 100000, "reset keeps the limit");
    }
    kf_arena_deinit(&a);
}

Test(arena, protobuf_allocator_allocates_from_the_arena) {
    kf_arena_t a;
    kf_arena_init(&a, 0);
    ProtobufCAllocator *pb = kf_arena_pb(&a);
    cr_assert_eq(pb->allocator_data, &a);
    void *p = pb->alloc(pb->allocator_data, 100);
    cr_assert_not_null(p);
    cr_assert(aligned16(p));
    size_t used = a.used_bytes;
    cr_assert_geq(used, 100);
    pb->free(pb->allocator_data, p); /* a no-op: the arena owns it */
    cr_assert_eq(a.used_bytes, used);
    kf_arena_deinit(&a);
}

/* Encode a real message with the system allocator, decode it into the arena,
 * and let deinit free it (free_unpacked through the arena is a no-op). */
Test(arena, protobuf_unpack_into_the_arena) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    char service[2000];
    memset(service, 's', sizeof service - 1);
    service[sizeof service - 1] = '\0';
    req.service = service;
    size_t len = grpc__health__v1__health_check_request__get_packed_size(&req);
    uint8_t *buf = malloc(len);
    cr_assert_not_null(buf);
    cr_assert_eq(grpc__health__v1__health_check_request__pack(&req, buf), len);

    kf_arena_t a;
    kf_arena_init(&a, 0);
    Grpc__Health__V1__HealthCheckRequest *out =
        grpc__health__v1__health_check_request__unpack(kf_arena_pb(&a), len, buf);
    free(buf);
    cr_assert_not_null(out);
    cr_assert_str_eq(out->service, service);
    cr_assert_geq(a.used_bytes, sizeof service, "the string was decoded into the arena");
    grpc__health__v1__health_check_request__free_unpacked(out, kf_arena_pb(&a));
    kf_arena_deinit(&a);
}

Test(arena, protobuf_unpack_fails_cleanly_past_the_limit) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    char service[600];
    memset(service, 'q', sizeof service - 1);
    service[sizeof service - 1] = '\0';
    req.service = service;
    uint8_t buf[700];
    size_t len = grpc__health__v1__health_check_request__pack(&req, buf);
    cr_assert_leq(len, sizeof buf);

    kf_arena_t a;
    kf_arena_init(&a, 256);
    cr_assert_null(grpc__health__v1__health_check_request__unpack(kf_arena_pb(&a), len, buf));
    kf_arena_deinit(&a);
}
