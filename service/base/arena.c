/* arena.c - chunked bump allocation with a byte limit. */
#include "base/arena.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/limits.h"

struct kf_arena_chunk {
    kf_arena_chunk_t *next;
    size_t size;
    size_t used;
    _Alignas(16) unsigned char data[];
};

#define ARENA_ALIGN     16
#define ARENA_CHUNK_MIN (16 * 1024)

static void *pb_alloc(void *ctx, size_t size) {
    return kf_arena_alloc(ctx, size);
}
static void pb_free(void *ctx, void *ptr) {
    (void)ctx;
    (void)ptr;
}

void kf_arena_init(kf_arena_t *arena, size_t limit_bytes) {
    arena->chunks = NULL;
    arena->used_bytes = 0;
    arena->limit_bytes = limit_bytes ? limit_bytes : (size_t)KF_ARENA_BYTES_MAX;
    arena->inline_used = 0;
    arena->pb.alloc = pb_alloc;
    arena->pb.free = pb_free;
    arena->pb.allocator_data = arena;
}

void kf_arena_reset(kf_arena_t *arena) {
    kf_arena_chunk_t *c = arena->chunks;
    while (c != NULL) {
        kf_arena_chunk_t *next = c->next;
        free(c);
        c = next;
    }
    arena->chunks = NULL;
    arena->used_bytes = 0;
    arena->inline_used = 0;
}

void kf_arena_deinit(kf_arena_t *arena) {
    kf_arena_reset(arena);
}

static size_t align_up(size_t n) {
    return (n + (ARENA_ALIGN - 1)) & ~(size_t)(ARENA_ALIGN - 1);
}

void *kf_arena_alloc(kf_arena_t *arena, size_t bytes) {
    size_t need = align_up(bytes == 0 ? 1 : bytes);
    /* Written so that no sum can wrap around for huge requests. */
    if (need < bytes || arena->used_bytes > arena->limit_bytes ||
        need > arena->limit_bytes - arena->used_bytes) {
        return NULL;
    }
    if (arena->chunks == NULL && arena->inline_used + need <= sizeof arena->inline_buf) {
        void *p = arena->inline_buf + arena->inline_used;
        arena->inline_used += need;
        arena->used_bytes += need;
        return p;
    }
    kf_arena_chunk_t *c = arena->chunks;
    if (c == NULL || c->size - c->used < need) {
        size_t size = need > ARENA_CHUNK_MIN ? need : ARENA_CHUNK_MIN;
        if (c != NULL && c->size * 2 > size && c->size * 2 <= 1024 * 1024) {
            size = c->size * 2; /* grow chunk sizes geometrically for big responses */
        }
        c = kf_xmalloc(sizeof *c + size); /* the host's memory: alloc.h */
        c->size = size;
        c->used = 0;
        c->next = arena->chunks;
        arena->chunks = c;
    }
    void *p = c->data + c->used;
    c->used += need;
    arena->used_bytes += need;
    KF_ASSERT(((uintptr_t)p & (ARENA_ALIGN - 1)) == 0);
    return p;
}

void *kf_arena_zalloc(kf_arena_t *arena, size_t bytes) {
    void *p = kf_arena_alloc(arena, bytes);
    if (p != NULL) {
        memset(p, 0, bytes);
    }
    return p;
}

void *kf_arena_new(kf_arena_t *arena, size_t bytes) {
    void *p = kf_arena_zalloc(arena, bytes);
    KF_ASSERT(p != NULL);
    return p;
}

void *kf_arena_memdup(kf_arena_t *arena, const void *src, size_t len) {
    void *p = kf_arena_alloc(arena, len);
    if (p != NULL && len > 0) {
        memcpy(p, src, len);
    }
    return p;
}

char *kf_arena_strndup(kf_arena_t *arena, const char *s, size_t len) {
    char *p = kf_arena_alloc(arena, len + 1);
    if (p != NULL) {
        memcpy(p, s, len);
        p[len] = '\0';
    }
    return p;
}

char *kf_arena_strdup(kf_arena_t *arena, const char *s) {
    return kf_arena_strndup(arena, s, strlen(s));
}

char *kf_arena_printf(kf_arena_t *arena, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        return NULL;
    }
    char *p = kf_arena_alloc(arena, (size_t)n + 1);
    if (p == NULL) {
        return NULL;
    }
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}
