/*
 * event_ids.c - the bounded list of event IDs a window collects for its run
 * (runs.h, "event IDs a run holds"): a ring that grows by doubling up to
 * KF_RUN_EVENT_IDS_MAX, so a window of a few events costs a few pointers.
 */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/limits.h"
#include "runs/runs.h"

static char **at(const kf_event_ids_t *e, uint32_t i) {
    return &e->ring[(e->head + i) % e->cap];
}

void kf_event_ids_push(kf_event_ids_t *e, const char *id) {
    KF_ASSERT(id != NULL && id[0] != '\0');
    if (e->count == KF_RUN_EVENT_IDS_MAX) {
        free(*at(e, 0)); /* the oldest goes */
        e->head = (e->head + 1) % e->cap;
        e->count--;
        e->dropped++;
    }
    if (e->count == e->cap) {
        uint32_t cap = e->cap ? e->cap * 2 : 4;
        cap = cap < KF_RUN_EVENT_IDS_MAX ? cap : KF_RUN_EVENT_IDS_MAX;
        char **ring = kf_xcalloc(cap, sizeof *ring);
        for (uint32_t i = 0; i < e->count; i++) {
            ring[i] = *at(e, i);
        }
        free(e->ring);
        e->ring = ring;
        e->cap = cap;
        e->head = 0;
    }
    *at(e, e->count) = kf_xstrdup(id);
    e->count++;
}

void kf_event_ids_clear(kf_event_ids_t *e) {
    for (uint32_t i = 0; i < e->count; i++) {
        free(*at(e, i));
    }
    free(e->ring);
    memset(e, 0, sizeof *e);
}

uint32_t kf_event_ids_list(const kf_event_ids_t *e, const char **out) {
    for (uint32_t i = 0; i < e->count; i++) {
        out[i] = *at(e, i);
    }
    return e->count;
}
