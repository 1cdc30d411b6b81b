/* alloc.c - allocations that never return NULL (the policy: alloc.h). */
#include "base/alloc.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void kf__out_of_memory(const char *what, size_t bytes, const char *file, int line) {
    /* No stdio buffering and no malloc: the heap is what just failed. */
    char message[512];
    int n = bytes > 0 ? snprintf(message, sizeof message,
                                 "keyflow: out of memory: %s of %zu bytes at %s:%d\n", what, bytes,
                                 file, line)
                      : snprintf(message, sizeof message, "keyflow: out of memory: %s at %s:%d\n",
                                 what, file, line);
    if (n > 0) {
        size_t len = (size_t)n < sizeof message ? (size_t)n : sizeof message - 1;
        ssize_t written = write(STDERR_FILENO, message, len);
        (void)written; /* nothing left to do if stderr is gone too */
    }
    abort();
}

void *kf__xcheck(void *p, const char *what, const char *file, int line) {
    if (p == NULL) {
        kf__out_of_memory(what, 0, file, line);
    }
    return p;
}

void *kf__xmalloc(size_t bytes, const char *file, int line) {
    void *p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL) {
        kf__out_of_memory("kf_xmalloc", bytes, file, line);
    }
    return p;
}

void *kf__xcalloc(size_t count, size_t size, const char *file, int line) {
    if (size != 0 && count > SIZE_MAX / size) {
        kf__out_of_memory("kf_xcalloc (count * size overflows)", SIZE_MAX, file, line);
    }
    void *p = calloc(count > 0 ? count : 1, size > 0 ? size : 1);
    if (p == NULL) {
        kf__out_of_memory("kf_xcalloc", count * size, file, line);
    }
    return p;
}

void *kf__xrealloc(void *p, size_t bytes, const char *file, int line) {
    void *q = realloc(p, bytes > 0 ? bytes : 1);
    if (q == NULL) {
        kf__out_of_memory("kf_xrealloc", bytes, file, line);
    }
    return q;
}

void *kf__xreallocarray(void *p, size_t count, size_t size, const char *file, int line) {
    if (size != 0 && count > SIZE_MAX / size) {
        kf__out_of_memory("kf_xreallocarray (count * size overflows)", SIZE_MAX, file, line);
    }
    return kf__xrealloc(p, count * size, file, line);
}

char *kf__xstrdup(const char *s, const char *file, int line) {
    return kf__xmemdup(s, strlen(s), 1, file, line);
}

void *kf__xmemdup(const void *p, size_t len, int nul_terminate, const char *file, int line) {
    size_t bytes = len + (nul_terminate ? 1 : 0);
    if (bytes < len) {
        kf__out_of_memory("kf_xmemdup (length overflows)", SIZE_MAX, file, line);
    }
    char *copy = kf__xmalloc(bytes, file, line);
    if (len > 0) {
        memcpy(copy, p, len);
    }
    if (nul_terminate) {
        copy[len] = '\0';
    }
    return copy;
}
