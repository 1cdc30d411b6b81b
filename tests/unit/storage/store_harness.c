/*
 * store_harness.c - the shared store test harness (see store_harness.h).
 */
#include "store_harness.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>

void harness_make_temp_dir(char *out) {
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] == '\0') {
        tmp = "/tmp";
    }
    int n = snprintf(out, HARNESS_PATH_BYTES, "%s/kf-store-test-XXXXXX", tmp);
    cr_assert(n > 0 && n < HARNESS_PATH_BYTES, "TMPDIR too long");
    cr_assert_not_null(mkdtemp(out), "mkdtemp(%s): %s", out, strerror(errno));
}

void harness_remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        return;
    }
    if (S_ISDIR(st.st_mode)) {
        DIR *dir = opendir(path);
        if (dir != NULL) {
            struct dirent *d;
            while ((d = readdir(dir)) != NULL) {
                if (strcmp(d->d_name, ".") == 0 || strcmp(d->d_name, "..") == 0) {
                    continue;
                }
                size_t len = strlen(path) + 1 + strlen(d->d_name) + 1;
                char *child = malloc(len);
                if (child == NULL) {
                    break;
                }
                snprintf(child, len, "%s/%s", path, d->d_name);
                harness_remove_tree(child);
                free(child);
            }
            closedir(dir);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

kf_status_t harness_open(store_harness_t *h, kf_error_t *err) {
    cr_assert_null(h->store, "the harness store is already open");
    if (h->rocks) {
        kf_rocks_options_t options = {.path = h->dir, .write_buffer_bytes = 0};
        return kf_store_open_rocks(&options, &h->store, err);
    }
    return kf_store_open_mem(h->disk, &h->faults, &h->store, err);
}

void harness_close(store_harness_t *h) {
    kf_store_close(h->store);
    h->store = NULL;
}

void harness_reopen(store_harness_t *h) {
    harness_close(h);
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = harness_open(h, &err);
    cr_assert_eq(st, KF_OK, "reopen: %s: %s", kf_status_name(st), err.message);
    cr_assert_not_null(h->store);
}

static void harness_first_open(store_harness_t *h) {
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = harness_open(h, &err);
    cr_assert_eq(st, KF_OK, "open: %s: %s", kf_status_name(st), err.message);
    cr_assert_not_null(h->store);
}

void harness_setup_mem(store_harness_t *h) {
    memset(h, 0, sizeof *h);
    h->rocks = false;
    h->disk = kf_memdisk_create();
    cr_assert_not_null(h->disk);
    harness_first_open(h);
}

void harness_setup_rocks(store_harness_t *h) {
    memset(h, 0, sizeof *h);
    h->rocks = true;
    harness_make_temp_dir(h->dir);
    harness_first_open(h);
}

void harness_teardown(store_harness_t *h) {
    harness_close(h);
    if (h->disk != NULL) {
        kf_memdisk_destroy(h->disk);
        h->disk = NULL;
    }
    if (h->dir[0] != '\0') {
        harness_remove_tree(h->dir);
        h->dir[0] = '\0';
    }
}

void harness_write(kf_store_t *store, kf_batch_t *batch) {
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_store_write(store, batch, &err);
    cr_assert_eq(st, KF_OK, "write: %s: %s", kf_status_name(st), err.message);
}

void harness_put(kf_store_t *store, kf_cf_t cf, const void *key, size_t key_len, const void *value,
                 size_t value_len) {
    kf_batch_t *batch = kf_batch_create(store);
    cr_assert_not_null(batch);
    kf_batch_put(batch, cf, key, key_len, value, value_len);
    harness_write(store, batch);
    kf_batch_destroy(batch);
}

void harness_put_str(kf_store_t *store, kf_cf_t cf, const char *key, const char *value) {
    harness_put(store, cf, key, strlen(key), value, strlen(value));
}

void harness_delete_str(kf_store_t *store, kf_cf_t cf, const char *key) {
    kf_batch_t *batch = kf_batch_create(store);
    cr_assert_not_null(batch);
    kf_batch_delete(batch, cf, key, strlen(key));
    harness_write(store, batch);
    kf_batch_destroy(batch);
}

bool harness_get_str(kf_store_t *store, kf_cf_t cf, const char *key, char *out, size_t cap) {
    kf_value_t value;
    bool found = true;
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_store_get(store, cf, key, strlen(key), &value, &found, &err);
    cr_assert_eq(st, KF_OK, "get %s: %s: %s", key, kf_status_name(st), err.message);
    if (!found) {
        cr_assert_null(value.data, "absent key %s has value data", key);
        cr_assert_eq(value.len, 0, "absent key %s has a value length", key);
        return false;
    }
    cr_assert_lt(value.len, cap, "value of %s too long for the test buffer", key);
    if (value.len > 0) {
        memcpy(out, value.data, value.len);
    }
    out[value.len] = '\0';
    kf_store_value_free(&value);
    return true;
}

bool harness_has(kf_store_t *store, kf_cf_t cf, const void *key, size_t key_len) {
    kf_value_t value;
    bool found = false;
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_store_get(store, cf, key, key_len, &value, &found, &err);
    cr_assert_eq(st, KF_OK, "get: %s: %s", kf_status_name(st), err.message);
    kf_store_value_free(&value);
    return found;
}

/* Appends key bytes, escaping anything but plain printable ASCII. */
static void append_key(char *out, size_t cap, size_t *used, const uint8_t *key, size_t len) {
    for (size_t i = 0; i < len; i++) {
        char piece[8];
        uint8_t c = key[i];
        if (c > 0x20 && c < 0x7f && c != ',' && c != '\\') {
            piece[0] = (char)c;
            piece[1] = '\0';
        } else {
            snprintf(piece, sizeof piece, "\\x%02x", c);
        }
        size_t n = strlen(piece);
        cr_assert_lt(*used + n, cap, "key list too long for the test buffer");
        memcpy(out + *used, piece, n + 1);
        *used += n;
    }
}

int harness_collect(kf_iter_t *iter, char *out, size_t cap) {
    size_t used = 0;
    int count = 0;
    out[0] = '\0';
    for (; kf_iter_valid(iter); kf_iter_next(iter)) {
        size_t len = 0;
        const uint8_t *key = kf_iter_key(iter, &len);
        if (count > 0) {
            cr_assert_lt(used + 1, cap);
            out[used++] = ',';
            out[used] = '\0';
        }
        append_key(out, cap, &used, key, len);
        count++;
    }
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_iter_status(iter, &err);
    cr_assert_eq(st, KF_OK, "iterate: %s: %s", kf_status_name(st), err.message);
    return count;
}

int harness_keys(kf_store_t *store, kf_cf_t cf, const char *lower, const char *upper, char *out,
                 size_t cap) {
    kf_iter_t *iter = NULL;
    kf_error_t err;
    kf_error_clear(&err);
    kf_status_t st = kf_iter_create(store, cf, lower, lower ? strlen(lower) : 0, upper,
                                    upper ? strlen(upper) : 0, &iter, &err);
    cr_assert_eq(st, KF_OK, "iter_create: %s: %s", kf_status_name(st), err.message);
    kf_iter_seek_first(iter);
    int n = harness_collect(iter, out, cap);
    kf_iter_destroy(iter);
    return n;
}
