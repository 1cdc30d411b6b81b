/* partition.c - kf-hash-1, partition sets and run ID tags (see partition.h). */
#include "base/partition.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"

typedef struct hash_state {
    uint32_t h;
} hash_state_t;

static void hash_begin(hash_state_t *s) {
    s->h = 2166136261u;
}

static void hash_update(hash_state_t *s, const void *bytes, size_t len) {
    const uint8_t *b = bytes;
    uint32_t h = s->h;
    for (size_t i = 0; i < len; i++) {
        h = (h ^ b[i]) * 16777619u;
    }
    s->h = h;
}

/* A u32 big-endian length, as the canonical key writes it. */
static void hash_update_length(hash_state_t *s, size_t len) {
    KF_ASSERT(len <= UINT32_MAX);
    uint8_t be[4] = {(uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len};
    hash_update(s, be, sizeof be);
}

static uint32_t hash_end(const hash_state_t *s) {
    uint32_t h = s->h;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

uint32_t kf_partition_hash(const void *bytes, size_t len) {
    hash_state_t s;
    hash_begin(&s);
    hash_update(&s, bytes, len);
    return hash_end(&s);
}

uint32_t kf_partition_of_key(const void *canonical_key, size_t len, uint32_t count) {
    KF_ASSERT(count >= 1);
    return kf_partition_hash(canonical_key, len) % count;
}

uint32_t kf_partition_of_coordinator(const char *workflow, size_t workflow_len, const char *key,
                                     size_t key_len, uint32_t count) {
    KF_ASSERT(count >= 1);
    hash_state_t s;
    hash_begin(&s);
    hash_update_length(&s, workflow_len);
    hash_update(&s, workflow, workflow_len);
    hash_update_length(&s, key_len);
    hash_update(&s, key, key_len);
    return hash_end(&s) % count;
}

uint32_t kf_partition_home_of_function(const char *function_id, size_t len, uint32_t count) {
    KF_ASSERT(count >= 1);
    hash_state_t s;
    hash_begin(&s);
    hash_update_length(&s, len);
    hash_update(&s, function_id, len);
    return hash_end(&s) % count;
}

void kf_partition_hasher_init(kf_partition_hasher_t *hasher) {
    hash_state_t s;
    hash_begin(&s);
    hasher->h = s.h;
}

void kf_partition_hasher_column(kf_partition_hasher_t *hasher, const void *bytes, size_t len) {
    hash_state_t s = {hasher->h};
    hash_update_length(&s, len);
    hash_update(&s, bytes, len);
    hasher->h = s.h;
}

uint32_t kf_partition_hasher_partition(const kf_partition_hasher_t *hasher, uint32_t count) {
    KF_ASSERT(count >= 1);
    hash_state_t s = {hasher->h};
    return hash_end(&s) % count;
}

/* 8-4-4-4-12: the version digit is at 14, rand_a at 15..17. */
enum { UUID_VERSION_AT = 14, UUID_RAND_A_AT = 15 };

void kf_partition_tag_uuid(char uuid[KF_UUID_TEXT_BYTES + 1], uint32_t partition) {
    static const char hex[] = "0123456789abcdef";
    KF_ASSERT(partition < 4096 && strlen(uuid) == KF_UUID_TEXT_BYTES);
    KF_ASSERT(uuid[UUID_VERSION_AT] == '7');
    uuid[UUID_RAND_A_AT] = hex[(partition >> 8) & 0xf];
    uuid[UUID_RAND_A_AT + 1] = hex[(partition >> 4) & 0xf];
    uuid[UUID_RAND_A_AT + 2] = hex[partition & 0xf];
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

int32_t kf_partition_of_run_id(const char *run_id, uint32_t count) {
    KF_ASSERT(count >= 1);
    if (count == 1) {
        return 0;
    }
    const char *at = strrchr(run_id, '@');
    if (at == NULL || strlen(at + 1) != KF_UUID_TEXT_BYTES || at[1 + UUID_VERSION_AT] != '7') {
        return -1;
    }
    int32_t partition = 0;
    for (int i = 0; i < 3; i++) {
        int v = hex_value(at[1 + UUID_RAND_A_AT + i]);
        if (v < 0) {
            return -1;
        }
        partition = partition * 16 + v;
    }
    return (uint32_t)partition < count ? partition : -1;
}

void kf_partition_set_all(uint32_t count, kf_partition_set_t *out) {
    KF_ASSERT(count >= 1 && count <= KF_PARTITION_COUNT_MAX);
    memset(out, 0, sizeof *out);
    out->count = count;
    for (uint32_t i = 0; i < count; i++) {
        kf_partition_set_add(out, i);
    }
}

bool kf_partition_set_has(const kf_partition_set_t *set, uint32_t partition) {
    return partition < set->count && (set->bits[partition / 64] >> (partition % 64)) & 1;
}

void kf_partition_set_add(kf_partition_set_t *set, uint32_t partition) {
    KF_ASSERT(partition < set->count);
    set->bits[partition / 64] |= 1ull << (partition % 64);
}

uint32_t kf_partition_set_size(const kf_partition_set_t *set) {
    uint32_t n = 0;
    for (size_t i = 0; i < sizeof set->bits / sizeof set->bits[0]; i++) {
        n += (uint32_t)__builtin_popcountll(set->bits[i]);
    }
    return n;
}

/* A decimal partition number at *p, advancing it; -1 when there is none. */
static long parse_number(const char **p) {
    if (**p < '0' || **p > '9') {
        return -1;
    }
    char *end;
    errno = 0;
    long v = strtol(*p, &end, 10);
    if (errno != 0 || v > 1000000) {
        return -1;
    }
    *p = end;
    return v;
}

kf_status_t kf_partition_set_parse(const char *what, const char *text, uint32_t count,
                                   kf_partition_set_t *out, kf_error_t *err) {
    KF_ASSERT(count >= 1 && count <= KF_PARTITION_COUNT_MAX);
    kf_partition_set_t set;
    memset(&set, 0, sizeof set);
    set.count = count;
    if (strcmp(text, "all") == 0) {
        kf_partition_set_all(count, out);
        return KF_OK;
    }
    const char *p = text;
    for (;;) {
        long lo = parse_number(&p);
        long hi = lo;
        if (lo >= 0 && *p == '-') {
            p++;
            hi = parse_number(&p);
        }
        if (lo < 0 || hi < lo || (*p != ',' && *p != '\0')) {
            return kf_error_set(err, KF_E_INVALID,
                                "%s: \"%.64s\" is not \"all\" or a list of partitions and ranges "
                                "such as 0-3,6",
                                what, text);
        }
        if ((uint32_t)hi >= count) {
            return kf_error_set(err, KF_E_INVALID,
                                "%s: partition %ld is out of range: the data set has %u "
                                "partitions, 0..%u",
                                what, hi, count, count - 1);
        }
        for (long i = lo; i <= hi; i++) {
            kf_partition_set_add(&set, (uint32_t)i);
        }
        if (*p == '\0') {
            break;
        }
        p++;
    }
    *out = set;
    return KF_OK;
}

void kf_partition_set_format(const kf_partition_set_t *set, char *out, size_t cap) {
    KF_ASSERT(cap >= 8);
    size_t n = 0;
    out[0] = '\0';
    for (uint32_t i = 0; i < set->count; i++) {
        if (!kf_partition_set_has(set, i)) {
            continue;
        }
        uint32_t j = i;
        while (j + 1 < set->count && kf_partition_set_has(set, j + 1)) {
            j++;
        }
        char part[32];
        int len = j == i ? snprintf(part, sizeof part, "%s%u", n ? "," : "", i)
                         : snprintf(part, sizeof part, "%s%u-%u", n ? "," : "", i, j);
        if (n + (size_t)len + 4 > cap) {
            snprintf(out + n, cap - n, "...");
            return;
        }
        memcpy(out + n, part, (size_t)len + 1);
        n += (size_t)len;
        i = j;
    }
}
