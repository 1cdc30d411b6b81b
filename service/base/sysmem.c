/* sysmem.c - the cgroup's memory limit and the machine's memory (sysmem.h). */
#define _POSIX_C_SOURCE 200809L /* sysconf */
#include "base/sysmem.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PATH_BYTES_MAX 4096
#define LINE_BYTES_MAX 4096
/* cgroup v1 writes "no limit" as the largest page-aligned int64. */
#define V1_UNLIMITED (1ULL << 62)

/* The number in a limit file: 0 for "max", absent or unreadable. */
static uint64_t read_limit(const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    char text[64] = "";
    bool got = fgets(text, sizeof text, f) != NULL;
    fclose(f);
    if (!got || strncmp(text, "max", 3) == 0) {
        return 0;
    }
    errno = 0;
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || end == text || v >= V1_UNLIMITED) {
        return 0;
    }
    return (uint64_t)v;
}

static void note(char *source, size_t cap, const char *path) {
    if (cap > 0) {
        snprintf(source, cap, "%s", path);
    }
}

/* The lowest memory.max from <root><path> up to <root>. */
static uint64_t v2_limit(const char *root, const char *path, char *source, size_t cap) {
    char dir[PATH_BYTES_MAX], file[PATH_BYTES_MAX + 16];
    snprintf(dir, sizeof dir, "%s%s", root, strcmp(path, "/") == 0 ? "" : path);
    uint64_t best = 0;
    for (;;) {
        snprintf(file, sizeof file, "%s/memory.max", dir);
        uint64_t v = read_limit(file);
        if (v != 0 && (best == 0 || v < best)) {
            best = v;
            note(source, cap, file);
        }
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= strlen(root) || slash == NULL) {
            return best;
        }
        *slash = '\0';
    }
}

static uint64_t v1_limit(const char *root, const char *path, char *source, size_t cap) {
    char file[PATH_BYTES_MAX * 2];
    snprintf(file, sizeof file, "%s/memory%s/memory.limit_in_bytes", root,
             strcmp(path, "/") == 0 ? "" : path);
    uint64_t v = read_limit(file);
    if (v == 0) {
        snprintf(file, sizeof file, "%s/memory/memory.limit_in_bytes", root);
        v = read_limit(file);
    }
    if (v != 0) {
        note(source, cap, file);
    }
    return v;
}

/* Whether a v1 controller list ("cpu,memory") names the memory controller. */
static bool names_memory(const char *list, size_t len) {
    for (size_t i = 0; i + 6 <= len; i++) {
        if (memcmp(list + i, "memory", 6) == 0 && (i == 0 || list[i - 1] == ',') &&
            (i + 6 == len || list[i + 6] == ',')) {
            return true;
        }
    }
    return false;
}

uint64_t kf_cgroup_memory_limit(const char *proc_cgroup, const char *root, char *source,
                                size_t source_cap) {
    note(source, source_cap, "");
    FILE *f = fopen(proc_cgroup, "r");
    if (f == NULL) {
        return 0;
    }
    char line[LINE_BYTES_MAX];
    uint64_t limit = 0;
    while (limit == 0 && fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        char *first = strchr(line, ':');
        char *second = first != NULL ? strchr(first + 1, ':') : NULL;
        if (second == NULL || second[1] != '/') {
            continue;
        }
        const char *path = second + 1;
        if (strncmp(line, "0::", 3) == 0) {
            limit = v2_limit(root, path, source, source_cap);
        } else if (names_memory(first + 1, (size_t)(second - first - 1))) {
            limit = v1_limit(root, path, source, source_cap);
        }
    }
    fclose(f);
    return limit;
}

uint64_t kf_physical_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES);
    long page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}
