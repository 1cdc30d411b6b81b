/*
 * core.c - composes coordinators and runs over one context, dispatches
 * commands and timers, and recovers everything at creation.
 */
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "base/bytes.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/trim.h"
#include "coord/coord.h"
#include "functions/functions.h"
#include "keys/keys.h"
#include "proto/methods.h"
#include "runs/runs.h"

/* Finished runs are swept from disk at most this often. */
#define SWEEP_INTERVAL_MS 1000

struct kf_core {
    kf_ctx_t ctx;
    uint64_t last_commit_seq; /* as stored when the core was created */
    kf_runs_t *runs;
    kf_coords_t *coords;
    kf_functions_t *functions;
    kf_keys_t *keys;
    kf_auth_t *own_auth;               /* when the config gave none */
    const kf_auth_t *revocations_auth; /* whose revocations end open calls */
    uint64_t revocations_seen;
    int64_t next_sweep_ms;
    int64_t next_retention_ms;                 /* the next output retention sweep */
    bool disk_low;                             /* kf_core_set_disk_low */
    char disk_why[KF_ERROR_MESSAGE_BYTES_MAX]; /* while disk_low */
};

static kf_status_t attach_wakeups(kf_core_t *core, kf_error_t *err) {
    kf_ctx_t *ctx = &core->ctx;
    kf_iter_t *it;
    kf_status_t st = kf_iter_create(ctx->store, KF_CF_WAKEUPS, NULL, 0, NULL, 0, &it, err);
    if (st != KF_OK) {
        return st;
    }
    for (kf_iter_seek_first(it); kf_iter_valid(it); kf_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = kf_iter_key(it, &klen);
        const uint8_t *v = kf_iter_value(it, &vlen);
        kf_key_reader_t r = kf_key_reader(k, klen);
        int64_t due = 0;
        uint8_t type;
        bool ok = kf_key_read_u8(&r, &type);
        if (ok && type == KF_WAKEUP_COORDINATOR) {
            ok = vlen == 8;
            due = ok ? kf_i64_from_ordered(kf_get_be64(v)) : 0;
        } else if (ok && type == KF_WAKEUP_RUN) {
            ok = kf_key_read_time(&r, &due);
        }
        if (!ok) {
            st = kf_error_set(err, KF_E_CORRUPT, "wakeups: malformed record");
            break;
        }
        /* A coordinator's wake-up of store format 1 that the upgrade left
         * (its coordinator had expired): stale. */
        bool owned = false;
        if (type == KF_WAKEUP_RUN) {
            owned = kf_runs_attach_wakeup(core->runs, ctx, (const char *)r.p, r.left, due);
            if (!owned) {
                continue; /* a finished run's retention: the sweep handles it */
            }
        }
        if (!owned) {
            kf_batch_delete(ctx->batch, KF_CF_WAKEUPS, k, klen); /* stale: repair */
        }
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    return st;
}

/* The meta record holding the last written group's id (8 bytes, big-endian). */
static const char commit_seq_key[] = "commit_seq";

static kf_status_t load_commit_seq(kf_core_t *core, kf_error_t *err) {
    kf_value_t v;
    bool found = false;
    kf_status_t st = kf_store_get(core->ctx.store, KF_CF_META, commit_seq_key,
                                  sizeof commit_seq_key - 1, &v, &found, err);
    if (st != KF_OK || !found) {
        return st;
    }
    if (v.len != 8) {
        st = kf_error_set(err, KF_E_CORRUPT, "meta: commit_seq record of %zu bytes", v.len);
    } else {
        core->last_commit_seq = kf_get_be64(v.data);
    }
    kf_store_value_free(&v);
    return st;
}

uint64_t kf_core_last_commit_seq(const kf_core_t *core) {
    return core->last_commit_seq;
}

void kf_core_seal_group(kf_batch_t *batch, uint64_t group_id) {
    uint8_t v[8];
    kf_put_be64(v, group_id);
    kf_batch_put(batch, KF_CF_META, commit_seq_key, sizeof commit_seq_key - 1, v, sizeof v);
}

kf_status_t kf_core_create(const kf_engine_config_t *config, kf_store_t *store, kf_core_t **out,
                           kf_error_t *err) {
    kf_core_t *core = calloc(1, sizeof *core);
    if (core == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate the engine");
    }
    kf_ctx_t *ctx = &core->ctx;
    ctx->config = config;
    ctx->store = store;
    /* The families whose records commands read back by point or range
     * (coord/coord.c); everything else is read at start only, or through
     * module memory that outlives the group. */
    ctx->overlay = kf_overlay_create(store);
    kf_overlay_track(ctx->overlay, KF_CF_COORD_STATE);
    kf_overlay_track(ctx->overlay, KF_CF_COORD_ITEMS);
    kf_overlay_track(ctx->overlay, KF_CF_COORD_WINDOWS);
    kf_heap_init(&ctx->heap);
    ctx->memory.budget_bytes = config->memory_budget_bytes;
    ctx->disk_room_bytes = UINT64_MAX;
    kf_gauge_set(KF_G_MEMORY_BUDGET_BYTES, (int64_t)config->memory_budget_bytes);
    ctx->rng = kf_rng_create(config->rng_seed, config->rng_seed_len);
    core->runs = kf_runs_create();
    core->coords = kf_coords_create(core->runs);
    core->functions = kf_functions_create(config);
    kf_auth_t *auth = config->auth;
    if (auth == NULL) {
        auth = core->own_auth = kf_auth_create(false);
    }
    core->keys = auth != NULL ? kf_keys_create(auth) : NULL;
    core->revocations_auth = config->revocations_auth != NULL ? config->revocations_auth : auth;
    core->revocations_seen = kf_auth_revocations(core->revocations_auth);
    kf_batch_t *batch = kf_batch_create(store);
    if (ctx->rng == NULL || batch == NULL || core->keys == NULL) {
        kf_batch_destroy(batch);
        kf_core_destroy(core);
        return kf_error_set(err, KF_E_INTERNAL, "cannot seed the random source");
    }
    kf_core_begin(core, batch, 0, kf_clock_now_ms(&config->clock));
    int64_t t0 = kf_mono_us();
    kf_status_t st = load_commit_seq(core, err);
    if (st == KF_OK) {
        st = kf_keys_recover(core->keys, ctx, err);
    }
    if (st == KF_OK) {
        st = kf_runs_recover(core->runs, ctx, err);
    }
    if (st == KF_OK) {
        st = kf_coords_recover(core->coords, ctx, err);
    }
    if (st == KF_OK) {
        st = kf_functions_recover(core->functions, ctx, err);
    }
    if (st == KF_OK) {
        st = attach_wakeups(core, err);
    }
    if (st == KF_OK) {
        kf_runs_finish_recovery(core->runs, ctx);
        if (kf_batch_count(batch) > 0) {
            st = kf_store_write(store, batch, err);
        }
    }
    if (st == KF_OK) {
        kf_overlay_durable(ctx->overlay, 0); /* recovery's group is written */
        kf_keys_finish_recovery(core->keys); /* the new key is durable now */
    }
    kf_batch_destroy(batch);
    ctx->batch = NULL;
    if (st != KF_OK) {
        kf_keys_abandon_recovery(core->keys);
        kf_core_destroy(core);
        return st;
    }
    kf_log_kv(KF_LOG_INFO, "engine", "recovered",
              KF_LOG_INT("coordinators", kf_coords_count(core->coords)),
              KF_LOG_INT("open_windows", kf_coords_open_windows(core->coords)),
              KF_LOG_INT("runs_pending", kf_runs_pending(core->runs)),
              KF_LOG_INT("runs_leased", kf_runs_leased(core->runs)),
              KF_LOG_INT("timers", kf_heap_count(&ctx->heap)),
              KF_LOG_INT("duration_ms", (kf_mono_us() - t0) / 1000));
    *out = core;
    return KF_OK;
}

void kf_core_destroy(kf_core_t *core) {
    if (core == NULL) {
        return;
    }
    /* The heap first: its timers live inside the coordinators and runs. */
    kf_heap_deinit(&core->ctx.heap);
    kf_coords_destroy(core->coords);
    kf_functions_destroy(core->functions);
    kf_runs_destroy(core->runs);
    kf_keys_destroy(core->keys);
    kf_auth_destroy(core->own_auth);
    kf_rng_destroy(core->ctx.rng);
    kf_overlay_destroy(core->ctx.overlay);
    free(core->ctx.scratch);
    free(core);
}

/* The engine's tables as the modules estimate them now (step/ctx.h,
 * kf_memory_t): once per group and turn, since the functions' share walks
 * every function. */
static void memory_refresh(kf_core_t *core) {
    kf_memory_t *m = &core->ctx.memory;
    m->used_bytes = kf_coords_memory_bytes(core->coords) + kf_runs_memory_bytes(core->runs) +
                    kf_functions_memory_bytes(core->functions);
    kf_functions_replay_fit(core->functions, m);
    kf_gauge_set(KF_G_MEMORY_USED_BYTES, (int64_t)m->used_bytes);
}

void kf_core_begin(kf_core_t *core, kf_batch_t *batch, uint64_t group_id, int64_t now_ms) {
    core->ctx.batch = batch;
    core->ctx.group_id = group_id;
    core->ctx.now_ms = now_ms;
    memory_refresh(core);
}

void kf_core_execute(kf_core_t *core, kf_cmd_t *cmd) {
    kf_ctx_t *ctx = &core->ctx;
    KF_ASSERT(ctx->batch != NULL);
    kf_error_clear(&cmd->error);
    cmd->response = NULL;
    cmd->parked = NULL;
    /* Which commands grow the store is the RPC table's disk column
     * (proto/rpcs.h). Besides the reserve itself, such a command needs room
     * left in this engine's share of the space above it: the group holds
     * what was admitted but not yet written, and the other partitions'
     * engines fill their own shares meanwhile, so admitting whenever the
     * last measure was above the reserve let each of 8 engines put a 64 MiB
     * group past it at once (kf_core_set_disk_room). */
    if (kf_method_by_op(cmd->op)->grows_store && (core->disk_low || !kf_ctx_disk_room_left(ctx))) {
        if (core->disk_low) {
            kf_error_set(&cmd->error, KF_E_NO_SPACE, "%s", core->disk_why);
        } else {
            kf_error_set(&cmd->error, KF_E_NO_SPACE,
                         "disk reserve reached: the writes not yet on disk fill the %llu bytes "
                         "this partition may still write above the reserve (--disk-reserve); "
                         "new writes are refused until they are measured, retry shortly",
                         (unsigned long long)ctx->disk_room_bytes);
        }
        kf_counter_add(KF_C_REJECTED_DISK_RESERVE, 1);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    /* One case per ENGINE row of proto/rpcs.h, which names the module and
     * its handler. No default: -Wswitch names an op without a case. */
    switch (cmd->op) {
#define DISPATCH_(op, svc, meth, label, req, resp, shape, scope, resource, module, handler, ...)   \
    case KF_OP_##op: handler(core->module, ctx, cmd); return;
        KF_RPC_TABLE(DISPATCH_, KF_RPC_IGNORE)
#undef DISPATCH_
    }
    KF_UNREACHABLE(); /* not an op: a corrupt command */
}

uint32_t kf_core_tick(kf_core_t *core, uint32_t limit) {
    kf_ctx_t *ctx = &core->ctx;
    memory_refresh(core);
    uint64_t revocations = kf_auth_revocations(core->revocations_auth);
    if (revocations != core->revocations_seen) {
        /* A key was revoked (by this engine or the home one): what its
         * calls still hold open here ends now (auth/auth.h). */
        core->revocations_seen = revocations;
        kf_runs_end_revoked(core->runs, ctx);
        kf_functions_end_revoked(core->functions, ctx);
    }
    uint32_t fired = 0;
    while (fired < limit) {
        kf_timer_t *t = kf_heap_peek(&ctx->heap);
        if (t == NULL || t->due_ms > ctx->now_ms) {
            break;
        }
        kf_heap_disarm(&ctx->heap, t);
        fired++;
        switch (t->type) {
        case KF_TIMER_COORDINATOR: kf_coords_fire(core->coords, ctx, t); break;
        case KF_TIMER_RUN:
        case KF_TIMER_POLL:
        case KF_TIMER_RUN_WAIT: kf_runs_fire(core->runs, ctx, t); break;
        case KF_TIMER_FUNCTION: kf_functions_fire(core->functions, ctx, t); break;
        case KF_TIMER_REMOTE_CALL: kf_functions_fire_call(core->functions, ctx, t); break;
        default: KF_UNREACHABLE();
        }
    }
    if (fired > 0) {
        kf_counter_add(KF_C_TIMERS_FIRED, fired);
    }
    if (ctx->now_ms >= core->next_sweep_ms) {
        uint32_t examined = kf_runs_sweep(core->runs, ctx, KF_TIMERS_PER_TURN_MAX);
        core->next_sweep_ms =
            examined >= KF_TIMERS_PER_TURN_MAX ? ctx->now_ms : ctx->now_ms + SWEEP_INTERVAL_MS;
    }
    if (ctx->now_ms >= core->next_retention_ms) {
        uint32_t examined =
            kf_functions_sweep(core->functions, ctx, KF_OUTPUT_TRIM_CHUNKS_PER_TURN);
        core->next_retention_ms = examined >= KF_OUTPUT_TRIM_CHUNKS_PER_TURN
                                      ? ctx->now_ms
                                      : ctx->now_ms + KF_RETENTION_SWEEP_INTERVAL_MS;
    }
    kf_gauge_set(KF_G_TIMERS, kf_heap_count(&ctx->heap));
    return fired;
}

int64_t kf_core_next_due_ms(const kf_core_t *core) {
    const kf_timer_t *t = kf_heap_peek(&core->ctx.heap);
    int64_t due = t ? t->due_ms : INT64_MAX;
    due = due < core->next_sweep_ms ? due : core->next_sweep_ms;
    return due < core->next_retention_ms ? due : core->next_retention_ms;
}

kf_cmd_t *kf_core_take_ready(kf_core_t *core) {
    kf_cmd_t *head = core->ctx.ready_head;
    core->ctx.ready_head = core->ctx.ready_tail = NULL;
    return head;
}

void kf_core_durable(kf_core_t *core, uint64_t group_id) {
    KF_ASSERT(group_id >= core->ctx.durable_group_id);
    core->ctx.durable_group_id = group_id;
    /* What memory drops here was held only until durable: the trimmer
     * gives it back to the system after a burst (base/trim.h). */
    size_t held = kf_overlay_bytes(core->ctx.overlay) + kf_runs_memory_bytes(core->runs);
    kf_overlay_durable(core->ctx.overlay, group_id);
    kf_runs_evict(core->runs, &core->ctx);
    size_t kept = kf_overlay_bytes(core->ctx.overlay) + kf_runs_memory_bytes(core->runs);
    if (held > kept) {
        kf_trim_freed(held - kept);
    }
    kf_functions_durable(core->functions, &core->ctx);
}

bool kf_core_has_work(const kf_core_t *core) {
    return kf_functions_has_due(core->functions);
}

uint32_t kf_core_run_work(kf_core_t *core, uint32_t steps_max) {
    KF_ASSERT(core->ctx.batch != NULL);
    return kf_functions_run_due(core->functions, &core->ctx, steps_max);
}

void kf_core_pump(kf_core_t *core) {
    kf_functions_pump(core->functions, &core->ctx);
}

void kf_core_cancel(kf_core_t *core, kf_cmd_t *cmd, uint64_t id) {
    if (!kf_runs_cancel_poll(core->runs, &core->ctx, cmd, id)) {
        kf_functions_cancel_read(core->functions, &core->ctx, cmd, id);
    }
}

void kf_core_set_disk_low(kf_core_t *core, const char *why) {
    core->disk_low = why != NULL;
    if (why != NULL) {
        snprintf(core->disk_why, sizeof core->disk_why, "%s", why);
    }
}

void kf_core_set_disk_room(kf_core_t *core, uint64_t room_bytes) {
    core->ctx.disk_room_bytes = room_bytes;
}

void kf_core_worker_events(kf_core_t *core, kf_worker_event_t *list) {
    while (list != NULL) {
        kf_worker_event_t *next = list->next;
        kf_functions_worker_event(core->functions, &core->ctx, list);
        kf_worker_event_free(list);
        list = next;
    }
}

void kf_core_shutdown(kf_core_t *core) {
    kf_runs_release_polls(core->runs, &core->ctx);
    kf_functions_release_workers(core->functions, &core->ctx);
    kf_functions_release_reads(core->functions, &core->ctx);
}
