/*
 * recover.c - what a start rebuilds, and what retention deletes from disk.
 *
 * A start reads the run_live family alone: each live record holds all that
 * memory keeps of a live run (runs_int.h), so recovery costs one small
 * record per live run and never reads a body. Live runs of an older build
 * (run_queue, whole records) are read whole once and move to run_live.
 *
 * The sweep deletes finished runs that are no longer in memory when their
 * retention ends, found through their wake-ups; it reads a run's final
 * state, never its body.
 */
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/assert.h"
#include "base/log.h"
#include "runs/runs_int.h"

/* One live run from its live record, decoded in `scratch` (reset by the
 * caller): a start decodes one per live run, without a malloc per field. */
static kf_status_t recover_live(kf_runs_t *rs, kf_ctx_t *ctx, kf_arena_t *scratch, uint64_t seq,
                                const void *value, size_t len, kf_error_t *err) {
    Keyflow__Records__RunLiveRec *live =
        keyflow__records__run_live_rec__unpack(kf_arena_pb(scratch), len, value);
    size_t key_len = 0;
    run_t *r = NULL;
    if (live == NULL || !kf__run_live_valid(live)) {
        return kf_error_set(err, KF_E_CORRUPT, "run_live: undecodable record at %llu",
                            (unsigned long long)seq);
    }
    bool ok = kf__run_id_split(live->run_id, &key_len);
    KF_ASSERT(ok); /* kf__run_live_valid */
    if (seq >= rs->next_seq ||
        (r = kf__run_new(rs, live->run_id, live->workflow, key_len, seq)) == NULL) {
        return kf_error_set(err, KF_E_CORRUPT, "run_live: %s is not a live run, or is listed twice",
                            live->run_id);
    }
    r->status = (uint8_t)live->status;
    r->attempts = (uint8_t)live->attempts;
    r->updated_ms = live->updated_ms;
    r->key_concurrency = (uint16_t)live->key_concurrency;
    r->flags = live->cancel_requested ? RUN_CANCEL_REQUESTED : 0;
    if (r->status != ST_PENDING) {
        kf__detail_load(rs, r, live); /* its timer, its lease */
    }
    kf__runs_adopt(rs, ctx, r);
    return KF_OK;
}

/* One live run of an older build, listed in run_queue by its ID: its whole
 * record is read, and it moves to run_live (the record stays as its body).
 * `k` is its run_queue key. */
static kf_status_t recover_queued(kf_runs_t *rs, kf_ctx_t *ctx, const kf_key_t *k,
                                  const char *run_id, kf_error_t *err) {
    if (kf__run_find(rs, run_id) != NULL) {
        return kf_error_set(err, KF_E_CORRUPT,
                            "run_queue: %s is not a live run, or is listed twice", run_id);
    }
    kf_stored_run_t *sr;
    kf_status_t st = kf__run_load(ctx, run_id, &sr, err);
    if (st != KF_OK) {
        return st;
    }
    const Keyflow__Records__RunRec *w = sr ? &sr->view : NULL;
    size_t key_len;
    if (w == NULL || sr->state != NULL || kf__run_finished(w->status) || w->seq >= rs->next_seq ||
        w->attempts < 0 || w->attempts > KF_RUN_ATTEMPTS_MAX ||
        !kf__run_id_split(w->run_id, &key_len)) {
        kf__stored_run_free(sr);
        return kf_error_set(err, KF_E_CORRUPT, "run_queue: %s is not a live run", run_id);
    }
    run_t *r = kf__run_new(rs, w->run_id, w->workflow, key_len, w->seq);
    KF_ASSERT(r != NULL); /* not in memory: checked above */
    r->status = (uint8_t)w->status;
    r->attempts = (uint8_t)w->attempts;
    r->updated_ms = w->updated_ms;
    r->key_concurrency = (uint16_t)w->key_concurrency;
    r->flags = w->cancel_requested ? RUN_CANCEL_REQUESTED : 0;
    /* The whole record's state is a live record's. */
    Keyflow__Records__RunLiveRec live;
    keyflow__records__run_live_rec__init(&live);
    live.retry = w->retry;
    live.due_ms = w->due_ms;
    live.lease_ms = w->lease_ms;
    live.lease_expires_ms = w->lease_expires_ms;
    live.lease = w->lease;
    live.lease_owner = w->lease_owner;
    live.worker_id = w->worker_id;
    live.last_error = w->last_error;
    kf__detail_load(rs, r, &live);
    kf__stored_run_free(sr);
    kf_ctx_delete(ctx, KF_CF_RUN_QUEUE, k);
    kf__run_save(ctx, r);
    kf__runs_adopt(rs, ctx, r);
    return KF_OK;
}

/* Every live run listed in `cf` (run_live, or run_queue of older builds). */
static kf_status_t recover_family(kf_runs_t *rs, kf_ctx_t *ctx, kf_cf_t cf, kf_error_t *err) {
    kf_iter_t *it;
    kf_status_t st = kf_iter_create(ctx->store, cf, NULL, 0, NULL, 0, &it, err);
    if (st != KF_OK) {
        return st;
    }
    kf_arena_t scratch;
    kf_arena_init(&scratch, 0);
    for (kf_iter_seek_first(it); kf_iter_valid(it) && st == KF_OK; kf_iter_next(it)) {
        kf_arena_reset(&scratch);
        size_t klen, vlen;
        const uint8_t *kb = kf_iter_key(it, &klen);
        const char *val = kf_iter_value(it, &vlen);
        kf_key_reader_t rd = kf_key_reader(kb, klen);
        uint64_t seq;
        if (!kf_key_read_be64(&rd, &seq) || rd.left != 0) {
            st = kf_error_set(err, KF_E_CORRUPT, "%s: malformed key", kf_cf_name(cf));
            break;
        }
        if (cf == KF_CF_RUN_LIVE) {
            st = recover_live(rs, ctx, &scratch, seq, val, vlen, err);
            continue;
        }
        char run_id[KF_RUN_ID_BYTES_MAX + 1];
        if (vlen == 0 || vlen > KF_RUN_ID_BYTES_MAX) {
            st = kf_error_set(err, KF_E_CORRUPT, "run_queue: malformed entry");
            break;
        }
        memcpy(run_id, val, vlen);
        run_id[vlen] = '\0';
        kf_key_t k;
        kf_key_reset(&k);
        kf_key_raw(&k, kb, klen);
        st = recover_queued(rs, ctx, &k, run_id, err);
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_arena_deinit(&scratch);
    kf_iter_destroy(it);
    return st;
}

kf_status_t kf_runs_recover(kf_runs_t *rs, kf_ctx_t *ctx, kf_error_t *err) {
    kf_status_t st = kf__runs_load_seq(rs, ctx, err);
    /* run_live first: a run of an older build found there too is listed
     * twice. */
    if (st == KF_OK) {
        st = recover_family(rs, ctx, KF_CF_RUN_LIVE, err);
    }
    if (st == KF_OK) {
        st = recover_family(rs, ctx, KF_CF_RUN_QUEUE, err);
    }
    kf__runs_publish(rs);
    return st;
}

/* ---- retention's sweep ---------------------------------------------------------- */

uint32_t kf_runs_sweep(kf_runs_t *rs, kf_ctx_t *ctx, uint32_t limit) {
    kf_key_t lower, upper;
    kf_key_reset(&lower);
    kf_key_u8(&lower, KF_WAKEUP_RUN);
    kf_key_wakeup(&upper, kf_time_add_sat(ctx->now_ms, 1), KF_WAKEUP_RUN, NULL, 0);
    kf_iter_t *it;
    kf_error_t err;
    if (kf_iter_create(ctx->store, KF_CF_WAKEUPS, lower.bytes, lower.len, upper.bytes, upper.len,
                       &it, &err) != KF_OK) {
        return 0;
    }
    if (rs->sweep_started) {
        kf_iter_seek(it, rs->sweep_cursor.bytes, rs->sweep_cursor.len);
    } else {
        kf_iter_seek_first(it);
    }
    uint32_t examined = 0;
    for (; kf_iter_valid(it) && examined < limit; kf_iter_next(it)) {
        size_t klen;
        const uint8_t *k = kf_iter_key(it, &klen);
        if (rs->sweep_started && klen == rs->sweep_cursor.len &&
            memcmp(k, rs->sweep_cursor.bytes, klen) == 0) {
            continue;
        }
        examined++;
        kf_key_reset(&rs->sweep_cursor);
        kf_key_raw(&rs->sweep_cursor, k, klen);
        rs->sweep_started = true;
        kf_key_reader_t rd = kf_key_reader(k, klen);
        int64_t due;
        uint8_t type;
        if (!kf_key_read_u8(&rd, &type) || type != KF_WAKEUP_RUN || !kf_key_read_time(&rd, &due)) {
            continue;
        }
        char run_id[KF_RUN_ID_BYTES_MAX + 1];
        if (rd.left == 0 || rd.left > KF_RUN_ID_BYTES_MAX) {
            continue;
        }
        memcpy(run_id, rd.p, rd.left);
        run_id[rd.left] = '\0';
        if (kf__run_find(rs, run_id) != NULL) {
            continue; /* in memory: its own timer handles it */
        }
        kf_key_t wk;
        kf_key_reset(&wk);
        kf_key_raw(&wk, k, klen);
        kf_stored_final_t fin;
        if (kf__run_load_final(ctx, run_id, &fin, &err) != KF_OK) {
            continue;
        }
        if (!fin.found) {
            kf_ctx_delete(ctx, KF_CF_WAKEUPS, &wk); /* stale: the run is gone */
            continue;
        }
        if (fin.finished) {
            kf__run_delete_stored(ctx, run_id, fin.workflow, fin.seq, due);
        }
        kf__stored_final_free(&fin);
    }
    kf_iter_destroy(it);
    return examined;
}
