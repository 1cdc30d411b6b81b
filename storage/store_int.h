/*
 * store_int.h - the vtables behind store.h. Only storage/ includes this.
 * Each object begins with its ops pointer; store.c dispatches through it.
 */
#ifndef KF_STORAGE_STORE_INT_H
#define KF_STORAGE_STORE_INT_H

#include "storage/store.h"

typedef struct kf_store_ops {
    void (*close)(kf_store_t *store);
    kf_status_t (*get)(kf_store_t *store, kf_cf_t cf, const void *key, size_t key_len,
                       kf_value_t *value, bool *found, kf_error_t *err);
    kf_status_t (*write)(kf_store_t *store, kf_batch_t *batch, kf_error_t *err);
    kf_batch_t *(*batch_create)(kf_store_t *store);
    kf_status_t (*iter_create)(kf_store_t *store, kf_cf_t cf, const void *lower, size_t lower_len,
                               const void *upper, size_t upper_len, kf_iter_t **out,
                               kf_error_t *err);
    kf_status_t (*free_bytes)(kf_store_t *store, uint64_t *free_bytes, kf_error_t *err);
    void (*memory)(kf_store_t *store, kf_store_memory_t *out);
} kf_store_ops_t;

typedef struct kf_batch_ops {
    void (*destroy)(kf_batch_t *batch);
    void (*put)(kf_batch_t *batch, kf_cf_t cf, const void *key, size_t key_len, const void *value,
                size_t value_len);
    void (*del)(kf_batch_t *batch, kf_cf_t cf, const void *key, size_t key_len);
    void (*del_range)(kf_batch_t *batch, kf_cf_t cf, const void *begin, size_t begin_len,
                      const void *end, size_t end_len);
    void (*clear)(kf_batch_t *batch);
} kf_batch_ops_t;

typedef struct kf_iter_ops {
    void (*destroy)(kf_iter_t *iter);
    void (*seek)(kf_iter_t *iter, const void *key, size_t key_len);
    void (*seek_first)(kf_iter_t *iter);
    bool (*valid)(kf_iter_t *iter);
    void (*next)(kf_iter_t *iter);
    const void *(*key)(kf_iter_t *iter, size_t *len);
    const void *(*value)(kf_iter_t *iter, size_t *len);
    kf_status_t (*status)(kf_iter_t *iter, kf_error_t *err);
} kf_iter_ops_t;

struct kf_store {
    const kf_store_ops_t *ops;
    uint32_t format_version; /* found at open (kf__store_check_format) */
};

struct kf_batch {
    const kf_batch_ops_t *ops;
    size_t count; /* operations added since the last clear */
    size_t bytes; /* key + value bytes added since the last clear */
};

struct kf_iter {
    const kf_iter_ops_t *ops;
};

/* Checks or records the format version; called by each open. */
kf_status_t kf__store_check_format(kf_store_t *store, kf_error_t *err);

#endif
