/* store.c - dispatch through the storage seam, plus the format check. */
#include "storage/store.h"

#include <stdlib.h>

#include "base/assert.h"
#include "base/bytes.h"
#include "storage/store_int.h"

static const char *const cf_names[] = {
#define KF_CF_NAME_(id, name) name,
    KF_CF_TABLE(KF_CF_NAME_)
#undef KF_CF_NAME_
};

const char *kf_cf_name(kf_cf_t cf) {
    KF_ASSERT((unsigned)cf < KF_CF_COUNT);
    return cf_names[cf];
}

void kf_store_close(kf_store_t *store) {
    if (store != NULL) {
        store->ops->close(store);
    }
}

kf_status_t kf_store_get(kf_store_t *store, kf_cf_t cf, const void *key, size_t key_len,
                         kf_value_t *value, bool *found, kf_error_t *err) {
    KF_ASSERT((unsigned)cf < KF_CF_COUNT);
    value->data = NULL;
    value->len = 0;
    *found = false;
    return store->ops->get(store, cf, key, key_len, value, found, err);
}

void kf_store_value_free(kf_value_t *value) {
    free(value->data);
    value->data = NULL;
    value->len = 0;
}

kf_status_t kf_iter_create(kf_store_t *store, kf_cf_t cf, const void *lower, size_t lower_len,
                           const void *upper, size_t upper_len, kf_iter_t **out, kf_error_t *err) {
    KF_ASSERT((unsigned)cf < KF_CF_COUNT);
    return store->ops->iter_create(store, cf, lower, lower_len, upper, upper_len, out, err);
}

void kf_iter_destroy(kf_iter_t *iter) {
    if (iter != NULL) {
        iter->ops->destroy(iter);
    }
}
void kf_iter_seek(kf_iter_t *iter, const void *key, size_t key_len) {
    iter->ops->seek(iter, key, key_len);
}
void kf_iter_seek_first(kf_iter_t *iter) {
    iter->ops->seek_first(iter);
}
bool kf_iter_valid(kf_iter_t *iter) {
    return iter->ops->valid(iter);
}
void kf_iter_next(kf_iter_t *iter) {
    iter->ops->next(iter);
}
const void *kf_iter_key(kf_iter_t *iter, size_t *len) {
    return iter->ops->key(iter, len);
}
const void *kf_iter_value(kf_iter_t *iter, size_t *len) {
    return iter->ops->value(iter, len);
}
kf_status_t kf_iter_status(kf_iter_t *iter, kf_error_t *err) {
    return iter->ops->status(iter, err);
}

kf_batch_t *kf_batch_create(kf_store_t *store) {
    return store->ops->batch_create(store);
}
void kf_batch_destroy(kf_batch_t *batch) {
    if (batch != NULL) {
        batch->ops->destroy(batch);
    }
}

void kf_batch_put(kf_batch_t *batch, kf_cf_t cf, const void *key, size_t key_len, const void *value,
                  size_t value_len) {
    KF_ASSERT((unsigned)cf < KF_CF_COUNT);
    batch->ops->put(batch, cf, key, key_len, value, value_len);
    batch->count++;
    batch->bytes += key_len + value_len;
}

void kf_batch_delete(kf_batch_t *batch, kf_cf_t cf, const void *key, size_t key_len) {
    KF_ASSERT((unsigned)cf < KF_CF_COUNT);
    batch->ops->del(batch, cf, key, key_len);
    batch->count++;
    batch->bytes += key_len;
}

void kf_batch_delete_range(kf_batch_t *batch, kf_cf_t cf, const void *begin, size_t begin_len,
                           const void *end, size_t end_len) {
    KF_ASSERT((unsigned)cf < KF_CF_COUNT);
    batch->ops->del_range(batch, cf, begin, begin_len, end, end_len);
    batch->count++;
    batch->bytes += begin_len + end_len;
}

void kf_batch_clear(kf_batch_t *batch) {
    batch->ops->clear(batch);
    batch->count = 0;
    batch->bytes = 0;
}

size_t kf_batch_count(const kf_batch_t *batch) {
    return batch->count;
}
size_t kf_batch_bytes(const kf_batch_t *batch) {
    return batch->bytes;
}

kf_status_t kf_store_write(kf_store_t *store, kf_batch_t *batch, kf_error_t *err) {
    return store->ops->write(store, batch, err);
}

kf_status_t kf_store_free_bytes(kf_store_t *store, uint64_t *free_bytes, kf_error_t *err) {
    return store->ops->free_bytes(store, free_bytes, err);
}

void kf_store_memory(kf_store_t *store, kf_store_memory_t *out) {
    out->memtable_bytes = 0;
    out->block_cache_bytes = 0;
    store->ops->memory(store, out);
}

static const char format_key[] = "format_version";

kf_status_t kf__store_check_format(kf_store_t *store, kf_error_t *err) {
    kf_value_t value;
    bool found;
    kf_status_t st =
        kf_store_get(store, KF_CF_META, format_key, sizeof format_key - 1, &value, &found, err);
    if (st != KF_OK) {
        return st;
    }
    if (found) {
        uint32_t version = value.len == 4 ? kf_get_be32(value.data) : 0;
        kf_store_value_free(&value);
        if (version < KF_STORE_FORMAT_OLDEST || version > KF_STORE_FORMAT_VERSION) {
            return kf_error_set(err, KF_E_CORRUPT,
                                "store format version %u, this build reads %u to %u", version,
                                KF_STORE_FORMAT_OLDEST, KF_STORE_FORMAT_VERSION);
        }
        store->format_version = version;
        return KF_OK;
    }
    kf_batch_t *batch = kf_batch_create(store);
    if (batch == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate a write batch");
    }
    kf_batch_put_format_version(batch);
    st = kf_store_write(store, batch, err);
    kf_batch_destroy(batch);
    store->format_version = KF_STORE_FORMAT_VERSION;
    return st;
}

void kf_batch_put_format_version(kf_batch_t *batch) {
    uint8_t buf[4];
    kf_put_be32(buf, KF_STORE_FORMAT_VERSION);
    kf_batch_put(batch, KF_CF_META, format_key, sizeof format_key - 1, buf, sizeof buf);
}

uint32_t kf_store_format_version(const kf_store_t *store) {
    return store->format_version;
}
