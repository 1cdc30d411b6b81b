/* map.c - chained hash map with power-of-two buckets. */
#include "base/map.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"

uint64_t kf_hash_bytes(const void *p, size_t len) {
    /* FNV-1a with a final avalanche (splitmix64's finalizer), so that keys
     * differing only in their last bytes still spread over the low bits. */
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 31;
    return h;
}

void kf_map_init(kf_map_t *map) {
    map->buckets = NULL;
    map->bucket_count = 0;
    map->count = 0;
}

void kf_map_deinit(kf_map_t *map) {
    free(map->buckets);
    kf_map_init(map);
}

static bool node_matches(const kf_map_node_t *n, uint64_t hash, const void *key, size_t key_len) {
    return n->hash == hash && n->key_len == key_len && memcmp(n->key, key, key_len) == 0;
}

kf_map_node_t *kf_map_get(const kf_map_t *map, const void *key, size_t key_len) {
    if (map->bucket_count == 0) {
        return NULL;
    }
    uint64_t h = kf_hash_bytes(key, key_len);
    for (kf_map_node_t *n = map->buckets[h & (map->bucket_count - 1)]; n != NULL; n = n->next) {
        if (node_matches(n, h, key, key_len)) {
            return n;
        }
    }
    return NULL;
}

static void map_resize(kf_map_t *map, size_t count) {
    kf_map_node_t **buckets = kf_xcalloc(count, sizeof *buckets);
    for (size_t i = 0; i < map->bucket_count; i++) {
        kf_map_node_t *n = map->buckets[i];
        while (n != NULL) {
            kf_map_node_t *next = n->next;
            size_t b = n->hash & (count - 1);
            n->next = buckets[b];
            buckets[b] = n;
            n = next;
        }
    }
    free(map->buckets);
    map->buckets = buckets;
    map->bucket_count = count;
}

static void map_grow(kf_map_t *map) {
    map_resize(map, map->bucket_count ? map->bucket_count * 2 : 64);
}

void kf_map_reserve(kf_map_t *map, size_t count) {
    size_t buckets = map->bucket_count ? map->bucket_count : 64;
    while (buckets < count) {
        KF_ASSERT(buckets <= SIZE_MAX / 2);
        buckets *= 2;
    }
    if (buckets != map->bucket_count) {
        map_resize(map, buckets);
    }
}

bool kf_map_try_insert(kf_map_t *map, kf_map_node_t *node, const void *key, size_t key_len) {
    uint64_t h = kf_hash_bytes(key, key_len);
    if (map->bucket_count > 0) {
        for (kf_map_node_t *n = map->buckets[h & (map->bucket_count - 1)]; n; n = n->next) {
            if (node_matches(n, h, key, key_len)) {
                return false;
            }
        }
    }
    if (map->count >= map->bucket_count) {
        map_grow(map);
    }
    node->hash = h;
    node->key = key;
    node->key_len = key_len;
    size_t b = node->hash & (map->bucket_count - 1);
    node->next = map->buckets[b];
    map->buckets[b] = node;
    map->count++;
    return true;
}

void kf_map_insert(kf_map_t *map, kf_map_node_t *node, const void *key, size_t key_len) {
    bool inserted = kf_map_try_insert(map, node, key, key_len);
    KF_ASSERT(inserted);
}

void kf_map_remove(kf_map_t *map, kf_map_node_t *node) {
    KF_ASSERT(map->bucket_count > 0);
    kf_map_node_t **link = &map->buckets[node->hash & (map->bucket_count - 1)];
    while (*link != node) {
        KF_ASSERT(*link != NULL);
        link = &(*link)->next;
    }
    *link = node->next;
    node->next = NULL;
    map->count--;
}

void kf_map_prefetch(const kf_map_t *map, const kf_map_node_t *node) {
    if (map->bucket_count > 0) {
        __builtin_prefetch(&map->buckets[node->hash & (map->bucket_count - 1)], 1);
    }
}

kf_map_node_t *kf_map_first(const kf_map_t *map, size_t *bucket) {
    for (*bucket = 0; *bucket < map->bucket_count; (*bucket)++) {
        if (map->buckets[*bucket] != NULL) {
            return map->buckets[*bucket];
        }
    }
    return NULL;
}

kf_map_node_t *kf_map_next(const kf_map_t *map, size_t *bucket, kf_map_node_t *node) {
    if (node->next != NULL) {
        return node->next;
    }
    for ((*bucket)++; *bucket < map->bucket_count; (*bucket)++) {
        if (map->buckets[*bucket] != NULL) {
            return map->buckets[*bucket];
        }
    }
    return NULL;
}
