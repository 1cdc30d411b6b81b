/* keys.c - stored key builders and readers (layout in keys.h). */
#include "storage/keys.h"

#include <string.h>

#include "base/assert.h"
#include "base/bytes.h"

void kf_key_reset(kf_key_t *k) {
    k->len = 0;
}

static uint8_t *key_room(kf_key_t *k, size_t n) {
    KF_ASSERT(k->len + n <= KF_STORE_KEY_BYTES_MAX);
    uint8_t *p = k->bytes + k->len;
    k->len += n;
    return p;
}

void kf_key_u8(kf_key_t *k, uint8_t v) {
    *key_room(k, 1) = v;
}
void kf_key_be64(kf_key_t *k, uint64_t v) {
    kf_put_be64(key_room(k, 8), v);
}
void kf_key_time(kf_key_t *k, int64_t ms) {
    kf_key_be64(k, kf_i64_ordered(ms));
}

void kf_key_lp(kf_key_t *k, const char *s, size_t len) {
    KF_ASSERT(len <= UINT16_MAX);
    kf_put_be16(key_room(k, 2), (uint16_t)len);
    kf_key_raw(k, s, len);
}

void kf_key_raw(kf_key_t *k, const void *p, size_t len) {
    if (len > 0) {
        memcpy(key_room(k, len), p, len);
    }
}

bool kf_key_read_u8(kf_key_reader_t *r, uint8_t *v) {
    if (r->left < 1) {
        return false;
    }
    *v = r->p[0];
    r->p++;
    r->left--;
    return true;
}

bool kf_key_read_be64(kf_key_reader_t *r, uint64_t *v) {
    if (r->left < 8) {
        return false;
    }
    *v = kf_get_be64(r->p);
    r->p += 8;
    r->left -= 8;
    return true;
}

bool kf_key_read_time(kf_key_reader_t *r, int64_t *ms) {
    uint64_t v;
    if (!kf_key_read_be64(r, &v)) {
        return false;
    }
    *ms = kf_i64_from_ordered(v);
    return true;
}

bool kf_key_read_lp(kf_key_reader_t *r, const char **s, size_t *len) {
    if (r->left < 2) {
        return false;
    }
    size_t n = kf_get_be16(r->p);
    if (r->left - 2 < n) {
        return false;
    }
    *s = (const char *)r->p + 2;
    *len = n;
    r->p += 2 + n;
    r->left -= 2 + n;
    return true;
}

bool kf_key_prefix_end(const kf_key_t *prefix, kf_key_t *end) {
    *end = *prefix;
    while (end->len > 0) {
        if (end->bytes[end->len - 1] != 0xff) {
            end->bytes[end->len - 1]++;
            return true;
        }
        end->len--;
    }
    return false;
}

void kf_key_coord(kf_key_t *k, uint8_t kind, const char *workflow, size_t workflow_len,
                  const char *key, size_t key_len) {
    kf_key_reset(k);
    kf_key_u8(k, kind);
    kf_key_lp(k, workflow, workflow_len);
    kf_key_lp(k, key, key_len);
}

void kf_key_journal(kf_key_t *k, const kf_key_t *coord, uint64_t seq) {
    kf_key_reset(k);
    kf_key_raw(k, coord->bytes, coord->len);
    kf_key_be64(k, seq);
}

void kf_key_coord_id(kf_key_t *k, const uint8_t id[KF_COORD_ID_BYTES]) {
    kf_key_reset(k);
    kf_key_raw(k, id, KF_COORD_ID_BYTES);
}

void kf_key_coord_history(kf_key_t *k, const uint8_t id[KF_COORD_ID_BYTES], uint64_t seq) {
    kf_key_coord_id(k, id);
    kf_key_be64(k, seq);
}

void kf_key_coord_item(kf_key_t *k, const uint8_t id[KF_COORD_ID_BYTES], kf_coord_item_t item) {
    kf_key_coord_id(k, id);
    kf_key_u8(k, (uint8_t)item);
}

void kf_key_coord_item_seq(kf_key_t *k, const uint8_t id[KF_COORD_ID_BYTES], kf_coord_item_t item,
                           uint64_t seq) {
    kf_key_coord_item(k, id, item);
    kf_key_be64(k, seq);
}

void kf_key_coord_item_name(kf_key_t *k, const uint8_t id[KF_COORD_ID_BYTES], const char *name,
                            size_t name_len) {
    kf_key_coord_item(k, id, KF_COORD_ITEM_ID_NAME);
    kf_key_raw(k, name, name_len);
}

void kf_key_wakeup(kf_key_t *k, int64_t due_ms, kf_wakeup_type_t type, const void *identity,
                   size_t identity_len) {
    kf_key_reset(k);
    kf_key_u8(k, (uint8_t)type);
    if (type == KF_WAKEUP_RUN) {
        kf_key_time(k, due_ms);
    }
    kf_key_raw(k, identity, identity_len);
}

void kf_key_run_index(kf_key_t *k, const char *workflow, size_t workflow_len, uint64_t run_seq) {
    kf_key_reset(k);
    kf_key_lp(k, workflow, workflow_len);
    kf_key_be64(k, run_seq);
}

void kf_key_run_queue(kf_key_t *k, uint64_t run_seq) {
    kf_key_reset(k);
    kf_key_be64(k, run_seq);
}

void kf_key_run_live(kf_key_t *k, uint64_t run_seq) {
    kf_key_reset(k);
    kf_key_be64(k, run_seq);
}
