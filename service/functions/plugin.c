/*
 * plugin.c - digest-addressed loading of native handlers (see plugin.h).
 *
 * Invariants
 *   1. A file is a candidate only if it is a regular file (opened with
 *      O_NOFOLLOW: never through a symlink), owned by root or by the user
 *      keyflowd runs as, and not writable by group or others: nobody else
 *      can have put code there. Files that fail are skipped and logged.
 *      Candidates are opened with O_NONBLOCK, so a FIFO or a device never
 *      stalls the engine thread that looks for a plugin.
 *   2. Messages that go back to clients name digests, never server paths;
 *      the paths go to the server's log.
 */
#define _GNU_SOURCE /* memfd_create */
#include "functions/plugin.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
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
    kf_plugins_t *p = kf_xcalloc(1, sizeof *p);
    if (dir != NULL) {
        p->dir = kf_xstrdup(dir);
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
        /* Unload before closing the memfd: dlopen() knows a loaded library
         * by its path, and a library left loaded under /proc/self/fd/N would
         * be handed out again when a later memfd reuses N - another
         * kf_plugins_t in this process (a recovered engine, another
         * partition) asking for a different plugin would get this one's
         * handler. The functions that used these handlers are gone by now
         * (kf_functions_destroy frees them first). */
        dlclose(l->dl);
        close(l->fd);
        free(l);
        l = next;
    }
    free(p->dir);
    free(p);
}

/* Why a file may not hold code keyflowd runs (invariant 1), or NULL. */
static const char *untrusted(const struct stat *st) {
    if (!S_ISREG(st->st_mode)) {
        return "not a regular file";
    }
    if (st->st_uid != 0 && st->st_uid != geteuid()) {
        return "owned by neither root nor keyflowd's user";
    }
    if ((st->st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        return "writable by group or others";
    }
    return NULL;
}

/* Reads a whole trusted regular file of at most KF_PLUGIN_BYTES_MAX. The
 * open never blocks: this runs on the engine thread (at registration and at
 * start), and opening a FIFO for reading without O_NONBLOCK waits for a
 * writer that may never come. The type is checked on the open descriptor
 * (fstat), so nothing can be swapped in between; only a regular file is
 * then read, in blocking mode again. */
static uint8_t *read_file(const char *path, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ELOOP) {
            kf_log(KF_LOG_WARN, "plugin", "skipping %s: a symbolic link", path);
        }
        return NULL;
    }
    struct stat st;
    const char *why = NULL;
    if (fstat(fd, &st) != 0 || (why = untrusted(&st)) != NULL || st.st_size <= 0 ||
        st.st_size > KF_PLUGIN_BYTES_MAX) {
        if (why != NULL) {
            kf_log(KF_LOG_WARN, "plugin", "skipping %s: %s", path, why);
        }
        close(fd);
        return NULL;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        kf_log(KF_LOG_WARN, "plugin", "skipping %s: %s", path, strerror(errno));
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
        return kf_error_set(err, KF_E_IO, "plugin %s: cannot create a memory file", digest);
    }
    size_t put = 0;
    while (put < len) {
        ssize_t w = write(fd, bytes + put, len - put);
        if (w <= 0) {
            close(fd);
            return kf_error_set(err, KF_E_IO, "plugin %s: cannot copy into a memory file", digest);
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
        kf_log(KF_LOG_WARN, "plugin", "cannot load %s: %s", path, why ? why : "?");
        close(fd);
        return kf_error_set(err, KF_E_INVALID,
                            "plugin with SHA-256 %s: cannot be loaded (the server log says why)",
                            digest);
    }
    for (loaded_t *l = p->loaded; l != NULL; l = l->next) {
        KF_ASSERT(l->dl != dl); /* a new memfd path is a new library */
    }
    const kf_handler_t *h = dlsym(dl, KF_HANDLER_SYMBOL);
    if (h == NULL || h->abi_version != KF_HANDLER_ABI_VERSION || h->invoke == NULL) {
        dlclose(dl);
        close(fd);
        return kf_error_set(err, KF_E_INVALID,
                            "plugin with SHA-256 %s: does not export %s with ABI version %u",
                            digest, KF_HANDLER_SYMBOL, KF_HANDLER_ABI_VERSION);
    }
    loaded_t *l = kf_xcalloc(1, sizeof *l);
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
        kf_log(KF_LOG_WARN, "plugin", "cannot read the plugin directory %s: %s", p->dir,
               strerror(errno));
        return kf_error_set(err, KF_E_PRECONDITION,
                            "runtime NATIVE: the server cannot read its plugin directory");
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
                     "descriptor.implementation_digest: no plugin in the server's plugin "
                     "directory has SHA-256 %s",
                     digest_hex);
    }
    return st;
}
