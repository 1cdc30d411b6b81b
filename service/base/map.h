/*
 * map.h - an intrusive hash map keyed by byte strings.
 *
 * Entries embed a kf_map_node_t and own their key bytes; the map never
 * allocates per entry, only its bucket array (doubling at load factor 1).
 * Single-threaded: the engine thread owns every map it uses.
 */
#ifndef KF_BASE_MAP_H
#define KF_BASE_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kf_map_node {
    struct kf_map_node *next;
    uint64_t hash;
    const void *key; /* borrowed from the entry; valid while inserted */
    size_t key_len;
} kf_map_node_t;

typedef struct kf_map {
    kf_map_node_t **buckets;
    size_t bucket_count; /* power of two, or 0 before the first insert */
    size_t count;
} kf_map_t;

uint64_t kf_hash_bytes(const void *p, size_t len);

void kf_map_init(kf_map_t *map);
/* Entries are not touched; the caller frees them (iterate first). */
void kf_map_deinit(kf_map_t *map);
/* Sizes the bucket array for `count` entries at once (recovery inserting
 * many), so that inserting them rehashes nothing. */
void kf_map_reserve(kf_map_t *map, size_t count);
kf_map_node_t *kf_map_get(const kf_map_t *map, const void *key, size_t key_len);
/* The key must not be present. The node's key pointer must stay valid. */
void kf_map_insert(kf_map_t *map, kf_map_node_t *node, const void *key, size_t key_len);
/* The same for a key that may be present (one lookup, not two): false,
 * and nothing changed, when it is. */
bool kf_map_try_insert(kf_map_t *map, kf_map_node_t *node, const void *key, size_t key_len);
void kf_map_remove(kf_map_t *map, kf_map_node_t *node);
/* A hint, nothing else: loads the bucket of an inserted node that is about
 * to be removed into the cache, so that many removals in random order (a
 * step freeing the keys whose timers it fired) overlap their misses
 * instead of taking them one after the other. */
void kf_map_prefetch(const kf_map_t *map, const kf_map_node_t *node);

/* Iteration: for (kf_map_node_t *n = kf_map_first(m, &i); n; n = kf_map_next(m, &i, n)).
 * Removing the current node during iteration is allowed if the caller fetches
 * the next node first. */
kf_map_node_t *kf_map_first(const kf_map_t *map, size_t *bucket);
kf_map_node_t *kf_map_next(const kf_map_t *map, size_t *bucket, kf_map_node_t *node);

#define KF_CONTAINER_OF(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#endif
