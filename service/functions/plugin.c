/* plugin.c - digest-addressed loading of native handlers (see plugin.h). */
#define _GNU_SOURCE /* memfd_create */
#include "functions/plugin.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/crypto.h"
#include "base/limits.h"
#include "base/log.h"

typedef struct loaded {
    char digest[KF_SHA256_HEX_BYTES + 1];
    void *dl;
    int fd; /* the memfd stays open: its /proc path must stay unique */
    const kf_handler_t *handler;
    struct loaded *next;
} loaded_t;

struct kf_plugins {
    char *dir;
    loaded_t *loaded;
};

kf_plugins_t *kf_plugins_create(const char *dir) {
    kf_plugins_t *p = calloc(1, sizeof *p);
    KF_ASSERT(p != NULL);
    if (dir != NULL) {
        p->dir = strdup(dir);
        KF_ASSERT(p->dir != NULL);
    }
    return p;
}

void kf_plugins_destroy(kf_plugins_t *p) {
    if (p == NULL) {
        return;
    }
    loaded_t *l = p->loaded;
    while (l != NULL) {
        loaded_t *next = l->next;
        /* dlclose is deliberately not called: handlers may be referenced by
         * function objects until the very end, and unloading code at exit
         * buys nothing. */
        close(l->fd);
        free(l);
        l = next;
    }
    free(p->dir);
    free(p);
}

/* Reads a whole regular file of at most KF_PLUGIN_BYTES_MAX. */
static uint8_t *read_file(const char *path, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
        st.st_size > KF_PLUGIN_BYTES_MAX) {
        close(fd);
        return NULL;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = malloc(n);
    size_t got = 0;
    while (buf != NULL && got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r <= 0) {
            free(buf);
            buf = NULL;
            break;
        }
        got += (size_t)r;
    }
    close(fd);
    *len = n;
    return buf;
}

static kf_status_t load_bytes(kf_plugins_t *p, const char *path, const char *digest,
                              const uint8_t *bytes, size_t len, const kf_handler_t **out,
                              kf_error_t *err) {
    int fd = memfd_create("keyflow-plugin", MFD_CLOEXEC);
    if (fd < 0) {
        return kf_error_set(err, KF_E_IO, "plugin %s: cannot create a memory file", path);
    }
    size_t put = 0;
    while (put < len) {
        ssize_t w = write(fd, bytes + put, len - put);
        if (w <= 0) {
            close(fd);
            return kf_error_set(err, KF_E_IO, "plugin %s: cannot copy into a memory file", path);
        }
        put += (size_t)w;
    }
    char fd_path[64];
    snprintf(fd_path, sizeof fd_path, "/proc/self/fd/%d", fd);
    /* The memfd stays open while the plugin is loaded: dlopen() recognises
     * libraries by path, so a closed and reused descriptor number would make
     * the next plugin's path name the one already loaded. */
    void *dl = dlopen(fd_path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL) {
        const char *why = dlerror();
        close(fd);
        return kf_error_set(err, KF_E_INVALID, "plugin %s: cannot load: %s", path, why ? why : "?");
    }
    for (loaded_t *l = p->loaded; l != NULL; l = l->next) {
        KF_ASSERT(l->dl != dl); /* a new memfd path is a new library */
    }
    const kf_handler_t *h = dlsym(dl, KF_HANDLER_SYMBOL);
    if (h == NULL || h->abi_version != KF_HANDLER_ABI_VERSION || h->invoke == NULL) {
        dlclose(dl);
        close(fd);
        return kf_error_set(err, KF_E_INVALID, "plugin %s: does not export %s with ABI version %u",
                            path, KF_HANDLER_SYMBOL, KF_HANDLER_ABI_VERSION);
    }
    loaded_t *l = calloc(1, sizeof *l);
    KF_ASSERT(l != NULL);
    memcpy(l->digest, digest, KF_SHA256_HEX_BYTES + 1);
    l->dl = dl;
    l->fd = fd;
    l->handler = h;
    l->next = p->loaded;
    p->loaded = l;
    kf_log_kv(KF_LOG_INFO, "plugin", "handler loaded", KF_LOG_STR("path", path),
              KF_LOG_STR("name", h->name ? h->name : "?"), KF_LOG_STR("sha256", digest));
    *out = h;
    return KF_OK;
}

kf_status_t kf_plugins_find(kf_plugins_t *p, const char *digest_hex, const kf_handler_t **out,
                            kf_error_t *err) {
    for (loaded_t *l = p->loaded; l != NULL; l = l->next) {
        if (strcmp(l->digest, digest_hex) == 0) {
            *out = l->handler;
            return KF_OK;
        }
    }
    if (p->dir == NULL) {
        return kf_error_set(err, KF_E_PRECONDITION,
                            "runtime NATIVE: keyflowd has no plugin directory (--plugin-dir)");
    }
    DIR *d = opendir(p->dir);
    if (d == NULL) {
        return kf_error_set(err, KF_E_PRECONDITION,
                            "runtime NATIVE: cannot read plugin directory %s", p->dir);
    }
    kf_status_t st = KF_E_PRECONDITION;
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && files < KF_PLUGIN_FILES_MAX) {
        size_t n = strlen(e->d_name);
        if (n < 4 || strcmp(e->d_name + n - 3, ".so") != 0) {
            continue;
        }
        files++;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", p->dir, e->d_name);
        size_t len;
        uint8_t *bytes = read_file(path, &len);
        if (bytes == NULL) {
            continue;
        }
        uint8_t digest[KF_SHA256_BYTES];
        char hex[KF_SHA256_HEX_BYTES + 1];
        kf_sha256(bytes, len, digest);
        kf_hex_encode(digest, sizeof digest, hex);
        if (strcmp(hex, digest_hex) == 0) {
            st = load_bytes(p, path, hex, bytes, len, out, err);
            free(bytes);
            break;
        }
        free(bytes);
    }
    closedir(d);
    if (st == KF_E_PRECONDITION) {
        kf_error_set(err, KF_E_PRECONDITION,
                     "descriptor.implementation_digest: no plugin in %s has SHA-256 %s", p->dir,
                     digest_hex);
    }
    return st;
}
