/* placement.c - the placement file (see placement.h). */
#include "base/placement.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"

#define PLACEMENT_FILE_BYTES_MAX (1024 * 1024)

void kf_placement_destroy(kf_placement_t *p) {
    if (p != NULL) {
        free(p->nodes);
        free(p);
    }
}

/* The next whitespace-separated word of *line (NUL-terminated in place). */
static char *next_word(char **line) {
    char *p = *line + strspn(*line, " \t\r");
    if (*p == '\0') {
        *line = p;
        return NULL;
    }
    char *end = p + strcspn(p, " \t\r");
    if (*end != '\0') {
        *end++ = '\0';
    }
    *line = end;
    return p;
}

static kf_status_t copy_word(char *dst, size_t cap, const char *word, const char *source, int line,
                             const char *what, kf_error_t *err) {
    if (strlen(word) >= cap) {
        return kf_error_set(err, KF_E_INVALID, "%s:%d: %s: at most %zu bytes", source, line, what,
                            cap - 1);
    }
    memcpy(dst, word, strlen(word) + 1);
    return KF_OK;
}

static kf_status_t parse_node(kf_placement_t *p, char *rest, const char *source, int line,
                              kf_error_t *err) {
    char *name = next_word(&rest);
    char *set = next_word(&rest);
    char *grpc = next_word(&rest);
    char *http = next_word(&rest);
    if (name == NULL || set == NULL || grpc == NULL || next_word(&rest) != NULL) {
        return kf_error_set(err, KF_E_INVALID,
                            "%s:%d: a node line is \"node NAME PARTITIONS GRPC-ADDRESS "
                            "[HTTP-ADDRESS]\"",
                            source, line);
    }
    if (p->node_count >= KF_PLACEMENT_NODES_MAX) {
        return kf_error_set(err, KF_E_INVALID, "%s:%d: at most %d nodes", source, line,
                            KF_PLACEMENT_NODES_MAX);
    }
    if (kf_placement_node(p, name) != NULL) {
        return kf_error_set(err, KF_E_INVALID, "%s:%d: node %s is named twice", source, line, name);
    }
    kf_placement_node_t *n = &p->nodes[p->node_count];
    memset(n, 0, sizeof *n);
    char what[64];
    snprintf(what, sizeof what, "%s:%d: partitions", source, line);
    kf_status_t st;
    if ((st = copy_word(n->name, sizeof n->name, name, source, line, "node name", err)) != KF_OK ||
        (st = kf_partition_set_parse(what, set, p->partition_count, &n->partitions, err)) !=
            KF_OK ||
        (st = copy_word(n->grpc_address, sizeof n->grpc_address, grpc, source, line, "gRPC address",
                        err)) != KF_OK ||
        (http != NULL && (st = copy_word(n->http_address, sizeof n->http_address, http, source,
                                         line, "HTTP address", err)) != KF_OK)) {
        return st;
    }
    for (uint32_t i = 0; i < p->partition_count; i++) {
        const kf_placement_node_t *other = kf_placement_owner(p, i);
        if (other != NULL && kf_partition_set_has(&n->partitions, i)) {
            return kf_error_set(err, KF_E_INVALID,
                                "%s:%d: partition %u is given to %s and to %s: a partition has "
                                "one owner",
                                source, line, i, other->name, n->name);
        }
    }
    p->node_count++;
    return KF_OK;
}

kf_status_t kf_placement_parse(const char *text, const char *source, kf_placement_t **out,
                               kf_error_t *err) {
    kf_placement_t *p = calloc(1, sizeof *p);
    char *copy = strdup(text);
    if (p == NULL || copy == NULL ||
        (p->nodes = calloc(KF_PLACEMENT_NODES_MAX, sizeof *p->nodes)) == NULL) {
        free(copy);
        kf_placement_destroy(p);
        return kf_error_set(err, KF_E_NOMEM, "%s: out of memory", source);
    }
    kf_status_t st = KF_OK;
    int line = 0;
    for (char *cursor = copy; st == KF_OK && cursor != NULL;) {
        char *text_line = cursor;
        char *nl = strchr(cursor, '\n');
        cursor = nl != NULL ? nl + 1 : NULL;
        if (nl != NULL) {
            *nl = '\0';
        }
        line++;
        char *hash = strchr(text_line, '#');
        if (hash != NULL) {
            *hash = '\0';
        }
        if (strlen(text_line) >= KF_PLACEMENT_LINE_BYTES_MAX) {
            st = kf_error_set(err, KF_E_INVALID, "%s:%d: longer than %d bytes", source, line,
                              KF_PLACEMENT_LINE_BYTES_MAX);
            break;
        }
        char *rest = text_line;
        char *word = next_word(&rest);
        if (word == NULL) {
            continue;
        }
        if (strcmp(word, "partitions") == 0) {
            char *count = next_word(&rest);
            char *end = NULL;
            long v = count != NULL ? strtol(count, &end, 10) : 0;
            if (p->partition_count != 0 || count == NULL || *end != '\0' || v < 1 ||
                v > KF_PARTITION_COUNT_MAX || next_word(&rest) != NULL) {
                st = kf_error_set(err, KF_E_INVALID,
                                  "%s:%d: \"partitions N\" comes once, first, with N in 1..%d",
                                  source, line, KF_PARTITION_COUNT_MAX);
            } else {
                p->partition_count = (uint32_t)v;
            }
        } else if (strcmp(word, "node") == 0) {
            if (p->partition_count == 0) {
                st = kf_error_set(err, KF_E_INVALID,
                                  "%s:%d: \"partitions N\" must come before the nodes", source,
                                  line);
            } else {
                st = parse_node(p, rest, source, line, err);
            }
        } else {
            st = kf_error_set(err, KF_E_INVALID,
                              "%s:%d: unknown line \"%.32s\" (want \"partitions N\" or \"node "
                              "...\")",
                              source, line, word);
        }
    }
    free(copy);
    if (st == KF_OK && p->partition_count == 0) {
        st = kf_error_set(err, KF_E_INVALID, "%s: no \"partitions N\" line", source);
    }
    if (st != KF_OK) {
        kf_placement_destroy(p);
        return st;
    }
    *out = p;
    return KF_OK;
}

kf_status_t kf_placement_load(const char *path, kf_placement_t **out, kf_error_t *err) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return kf_error_set(err, KF_E_IO, "cannot read the placement file %s: %s", path,
                            strerror(errno));
    }
    char *text = malloc(PLACEMENT_FILE_BYTES_MAX + 1);
    if (text == NULL) {
        fclose(f);
        return kf_error_set(err, KF_E_NOMEM, "%s: out of memory", path);
    }
    size_t n = fread(text, 1, PLACEMENT_FILE_BYTES_MAX + 1, f);
    bool failed = ferror(f) != 0;
    fclose(f);
    kf_status_t st;
    if (failed) {
        st = kf_error_set(err, KF_E_IO, "cannot read the placement file %s", path);
    } else if (n > PLACEMENT_FILE_BYTES_MAX) {
        st = kf_error_set(err, KF_E_INVALID, "placement file %s: larger than %d bytes", path,
                          PLACEMENT_FILE_BYTES_MAX);
    } else {
        text[n] = '\0';
        st = kf_placement_parse(text, path, out, err);
    }
    free(text);
    return st;
}

const kf_placement_node_t *kf_placement_owner(const kf_placement_t *p, uint32_t partition) {
    for (size_t i = 0; p != NULL && i < p->node_count; i++) {
        if (kf_partition_set_has(&p->nodes[i].partitions, partition)) {
            return &p->nodes[i];
        }
    }
    return NULL;
}

const kf_placement_node_t *kf_placement_node(const kf_placement_t *p, const char *name) {
    for (size_t i = 0; p != NULL && i < p->node_count; i++) {
        if (strcmp(p->nodes[i].name, name) == 0) {
            return &p->nodes[i];
        }
    }
    return NULL;
}
