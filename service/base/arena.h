/*
 * arena.h - per-request bump allocator.
 *
 * A request decodes into an arena and builds its response in the same
 * arena; kf_arena_deinit frees everything at once at the end of the request.
 * An arena is owned by one thread at a time (the request moves from the front
 * end to the engine and back, never shared). Allocation fails (NULL) past
 * the arena's byte limit, which callers turn into RESOURCE_EXHAUSTED; the
 * host running out of memory ends the process instead (base/alloc.h), so
 * NULL always means the limit.
 */
#ifndef KF_BASE_ARENA_H
#define KF_BASE_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

typedef struct kf_arena_chunk kf_arena_chunk_t;

typedef struct kf_arena {
    kf_arena_chunk_t *chunks;                    /* newest first */
    size_t used_bytes;                           /* bytes handed out, for the limit */
    size_t limit_bytes;                          /* allocation past this fails */
    ProtobufCAllocator pb;                       /* protobuf-c view of this arena */
    _Alignas(16) unsigned char inline_buf[1024]; /* first small allocations, no malloc */
    size_t inline_used;
} kf_arena_t;

/* Caller's memory; limit_bytes 0 means KF_ARENA_BYTES_MAX. */
void kf_arena_init(kf_arena_t *arena, size_t limit_bytes);
void kf_arena_deinit(kf_arena_t *arena);
/* Frees everything but keeps the arena usable. */
void kf_arena_reset(kf_arena_t *arena);

/* 16-byte aligned; NULL past the limit. Valid until deinit/reset. */
void *kf_arena_alloc(kf_arena_t *arena, size_t bytes);
void *kf_arena_zalloc(kf_arena_t *arena, size_t bytes);
/* kf_arena_zalloc for small, bounded objects (response messages): running
 * out of arena there is a bug, so it asserts instead of returning NULL. */
void *kf_arena_new(kf_arena_t *arena, size_t bytes);
char *kf_arena_strndup(kf_arena_t *arena, const char *s, size_t len);
char *kf_arena_strdup(kf_arena_t *arena, const char *s);
void *kf_arena_memdup(kf_arena_t *arena, const void *p, size_t len);
char *kf_arena_printf(kf_arena_t *arena, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The protobuf-c allocator backed by this arena (free is a no-op). */
static inline ProtobufCAllocator *kf_arena_pb(kf_arena_t *arena) {
    return &arena->pb;
}

#endif
