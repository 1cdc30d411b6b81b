/*
 * console.c - which console file a path names (see console.h).
 */
#include "http/console.h"

#include <string.h>

#define UI_PREFIX  "/ui/"
#define INDEX_PATH "/ui/index.html"

static bool path_is(const char *path, size_t path_len, const char *want) {
    return path_len == strlen(want) && memcmp(path, want, path_len) == 0;
}

bool kf_console_claims(const char *path, size_t path_len) {
    size_t prefix_len = strlen(UI_PREFIX);
    return path_is(path, path_len, "/") || path_is(path, path_len, "/ui") ||
           (path_len >= prefix_len && memcmp(path, UI_PREFIX, prefix_len) == 0);
}

const kf_console_file_t *kf_console_find(const char *path, size_t path_len) {
    if (path_is(path, path_len, "/") || path_is(path, path_len, "/ui") ||
        path_is(path, path_len, UI_PREFIX)) {
        path = INDEX_PATH;
        path_len = strlen(INDEX_PATH);
    }
    for (size_t i = 0; i < kf__console_file_count; i++) {
        if (path_is(path, path_len, kf__console_files[i].path)) {
            return &kf__console_files[i];
        }
    }
    return NULL;
}
