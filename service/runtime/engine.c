/*
 * engine.c - the engine thread, the committer thread and group commit.
 *
 * Two groups alternate. The engine fills the open group (executes commands,
 * fires timers) while the committer writes the other with sync = true. When
 * the committer is free and the open group holds anything, the engine hands
 * it over at once: under light load a group is one command (latency is one
 * fsync); under heavy load a group is everything that arrived during the
 * previous fsync (throughput grows with concurrency).
 *
 * The committer detaches a synced group's reply list and hands it to the
 * replier thread, so it can start the next group's write at once: sending a
 * reply (packing it, writing the socket) never delays the next fsync.
 * Replies leave in group order (one replier, FIFO).
 *
 * Locking: one mutex guards the inbox, the hand-off slot and the flags. The
 * core is touched only by the engine thread (invariant 1 of engine.h).
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include "runtime/engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/assert.h"
#include "base/health.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/trim.h"
#include "base/watchdog.h"
#include "core/core.h"

typedef struct group {
    uint64_t id;
    kf_batch_t *batch;
    kf_cmd_t *head; /* replies released when the group is durable */
    kf_cmd_t *tail;
    size_t commands;
} group_t;

struct kf_engine {
    kf_watchdog_t *watchdog; /* made here when the config had none; else NULL */
    kf_engine_config_t config;
    kf_store_t *store;
    kf_core_t *core;
    pthread_t engine_thread;
    pthread_t committer_thread;
    pthread_t replier_thread;
    bool threads_started;
    /* Durable replies waiting to be sent (committer -> replier). */
    pthread_mutex_t reply_lock;
    pthread_cond_t reply_cv;
    kf_cmd_t *reply_head; /* guarded by reply_lock */
    kf_cmd_t *reply_tail;
    bool replier_exit;

    pthread_mutex_t lock;
    pthread_cond_t engine_cv;    /* inbox, committer free, stop */
    pthread_cond_t committer_cv; /* a group was handed over, or exit */
    kf_cmd_t *inbox_head;        /* guarded by lock */
    kf_cmd_t *inbox_tail;
    size_t inbox_count;
    size_t inbox_max;
    bool engine_sleeping;
    group_t groups[2];
    group_t *handed; /* the group the committer owns, or NULL */
    /* Its bytes, taken when it was handed over (lock): written, but not
     * yet in a measure of the disk (disk_room). */
    size_t handed_bytes;
    group_t *open;    /* the group being filled (guarded by lock) */
    uint64_t next_id; /* id of the next group to open (lock) */
    bool engine_busy; /* the engine is in a turn: `open` is its own */
    bool stopping;    /* no new commands */
    bool committer_exit;
    atomic_bool failed;   /* a sync failed: acknowledge nothing more */
    kf_error_t failure;   /* why, for every call answered after it; set
                             under lock before `failed` */
    uint64_t next_cmd_id; /* guarded by lock */
    /* Cancels posted by front ends (clients that left a long poll or a
     * tail), guarded by lock. Two arrays that the engine swaps, so posting
     * never waits for a turn; they grow as needed up to KF_CANCELS_MAX (more
     * than the calls that can wait at once), past which a cancel is dropped
     * and its read or poll just runs to its wait. */
    struct cancel {
        kf_cmd_t *cmd;
        uint64_t id;
    } * cancels, *cancels_taken;
    size_t ncancels, cancels_cap, cancels_taken_cap;
    /* Worker events (step/engine_types.h), guarded by lock, in posting order. Bounded
     * by the front end: one HELLO and one GONE per worker stream, and
     * RESULTs only for calls the engine sent (each stream has at most its
     * granted concurrency out). */
    kf_worker_event_t *worker_head;
    kf_worker_event_t *worker_tail;
    atomic_uint_fast64_t durable_group;
    /* The disk reserve (see disk_refresh), guarded by disk_lock. */
    pthread_mutex_t disk_lock;
    uint64_t disk_reserve_bytes;
    uint64_t disk_free_bytes;     /* at the last measure */
    uint64_t disk_written_bytes;  /* group bytes written since */
    int64_t disk_checked_us;      /* monotonic; 0 = never measured */
    int64_t memory_checked_us;    /* the store's memory gauges (engine thread); 0 = never */
    uint64_t memtable_held_bytes; /* the store's memtables at that reading */
    char disk_why[KF_ERROR_MESSAGE_BYTES_MAX];
    bool disk_error_logged; /* statvfs failed, said once */
    atomic_bool disk_low;   /* free space (estimated) below the reserve */
};

static void default_fatal(const kf_error_t *err, void *ctx) {
    (void)ctx;
    kf_log_kv(
        KF_LOG_ERROR, "engine", "fail-stop: a durable write failed; nothing more is acknowledged",
        KF_LOG_STR("reason", err->message), KF_LOG_STR("status", kf_status_name(err->status)));
    abort();
}

/* Measures the free space of the store's filesystem when the last measure
 * is older than KF_DISK_CHECK_INTERVAL_MS (always when `force`: before
 * each group is written); in between, free space is estimated as the last
 * measure minus the group bytes written since (RocksDB writes a little
 * more: WAL framing now, flushes and compactions later, which the reserve
 * is there for). Updates disk_low and says so in the log when it changes.
 * Returns the estimate. Any thread (engine, committer, front ends through
 * kf_engine_unready, which always measures); statvfs does no I/O (about a
 * microsecond, next to a group's fsync of 100 us or more). */
static uint64_t disk_refresh(kf_engine_t *e, bool force) {
    pthread_mutex_lock(&e->disk_lock);
    int64_t now_us = kf_mono_us();
    if (force || e->disk_checked_us == 0 ||
        now_us - e->disk_checked_us >= KF_DISK_CHECK_INTERVAL_MS * 1000) {
        uint64_t free_bytes;
        kf_error_t err;
        if (kf_store_free_bytes(e->store, &free_bytes, &err) == KF_OK) {
            e->disk_free_bytes = free_bytes;
            e->disk_written_bytes = 0;
            e->disk_error_logged = false;
        } else if (!e->disk_error_logged) {
            /* Keep the estimate; a filesystem that cannot be queried will
             * show in the writes themselves. */
            kf_log(KF_LOG_WARN, "engine", "cannot measure free disk space: %s", err.message);
            e->disk_error_logged = true;
        }
        e->disk_checked_us = now_us;
    }
    uint64_t estimate =
        e->disk_free_bytes > e->disk_written_bytes ? e->disk_free_bytes - e->disk_written_bytes : 0;
    bool low = estimate < e->disk_reserve_bytes;
    if (low) {
        snprintf(e->disk_why, sizeof e->disk_why,
                 "disk reserve reached: %llu bytes free on the data directory's filesystem, "
                 "below the reserve of %llu (--disk-reserve); new writes are refused until "
                 "space is freed",
                 (unsigned long long)estimate, (unsigned long long)e->disk_reserve_bytes);
    }
    if (low != atomic_load(&e->disk_low)) {
        atomic_store(&e->disk_low, low);
        if (low) {
            kf_log(KF_LOG_WARN, "engine", "%s", e->disk_why);
        } else {
            kf_log(KF_LOG_INFO, "engine",
                   "disk reserve clear again: %llu bytes free (reserve %llu); accepting writes",
                   (unsigned long long)estimate, (unsigned long long)e->disk_reserve_bytes);
        }
        kf_gauge_set_in(e->config.metrics_slot, KF_G_DISK_RESERVE_REACHED, low ? 1 : 0);
        /* Not ready while it lasts: gRPC health and /readyz say so. */
        kf_health_degrade(low, low ? e->disk_why : "disk reserve clear again");
    }
    kf_gauge_set_in(e->config.metrics_slot, KF_G_DISK_FREE_BYTES,
                    (int64_t)(estimate > INT64_MAX ? INT64_MAX : estimate));
    pthread_mutex_unlock(&e->disk_lock);
    return estimate;
}

/* Copies the reason writes are refused into why; false when they are not. */
static bool disk_low_why(kf_engine_t *e, char *why, size_t cap) {
    if (!atomic_load(&e->disk_low)) {
        return false;
    }
    pthread_mutex_lock(&e->disk_lock);
    bool low = atomic_load(&e->disk_low);
    snprintf(why, cap, "%s", e->disk_why);
    pthread_mutex_unlock(&e->disk_lock);
    return low;
}

/* What this engine's group may still write before the disk reaches its
 * reserve (kf_core_set_disk_room): the free space above the reserve, less
 * the group its committer is writing now (the measure does not show it
 * yet), and with several partitions in the process only this partition's
 * share. Every partition's engine fills its group from its own measure of
 * the one filesystem at the same time: windows waiting for space in 8
 * partitions each closed into the whole room when space came back, wrote
 * 8 times the room and fail-stopped at the floor (check_space). Shares of
 * one room never add up to more than the room; the next turn measures
 * again and takes a share of what is left. Engine thread. */
static uint64_t disk_room(kf_engine_t *e, uint64_t free_bytes) {
    pthread_mutex_lock(&e->lock);
    uint64_t handed = e->handed_bytes;
    pthread_mutex_unlock(&e->lock);
    uint64_t room = free_bytes > e->disk_reserve_bytes ? free_bytes - e->disk_reserve_bytes : 0;
    uint32_t sharing = e->config.disk_sharing_partitions;
    uint64_t share = sharing > 1 ? room / sharing : room;
    /* The group in flight is this engine's own: it comes off its share,
     * not off the room (an engine whose committer lagged took a second
     * share meanwhile). */
    return share > handed ? share - handed : 0;
}

/* Group ids are the commit sequences receipts carry (docs/semantics.md,
 * "Commit sequence"). Partition i of P numbers its groups i, i + P, i + 2P,
 * ...: each partition's own sequence still increases, and no two partitions
 * of a data set ever answer the same number for different writes (with
 * every partition counting 1, 2, 3, ... a SendEvents over four partitions
 * answered commit_seq 1 four times for four writes). The partition of a
 * number is its remainder by P. A store written before this counted by 1:
 * its next id is the first above the last stored one on its residue. */
static uint32_t id_stride(uint32_t partition_count) {
    return partition_count > 0 ? partition_count : 1; /* 0: a config that never set it */
}

static uint64_t first_group_id(uint64_t last, uint32_t index, uint32_t partition_count) {
    uint32_t count = id_stride(partition_count);
    KF_ASSERT(index < count);
    uint64_t first = last + 1;
    return first + (index + count - first % count) % count;
}

static uint64_t take_group_id(kf_engine_t *e) {
    uint64_t id = e->next_id;
    e->next_id += id_stride(e->config.partition_count);
    return id;
}

kf_status_t kf_engine_create(const kf_engine_config_t *config, kf_store_t *store, kf_engine_t **out,
                             kf_error_t *err) {
    kf_engine_t *e = calloc(1, sizeof *e);
    if (e == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate the engine");
    }
    e->config = *config;
    if (e->config.clock.now_ms == NULL) {
        e->config.clock = kf_clock_system();
    }
    if (e->config.on_fatal == NULL) {
        e->config.on_fatal = default_fatal;
    }
    e->inbox_max = config->queue_depth_max > 0 && config->queue_depth_max < KF_QUEUE_DEPTH_MAX
                       ? (size_t)config->queue_depth_max
                       : KF_QUEUE_DEPTH_MAX;
    e->store = store;
    e->disk_reserve_bytes =
        config->disk_reserve_bytes > 0 ? config->disk_reserve_bytes : KF_DISK_RESERVE_BYTES_DEFAULT;
    pthread_mutex_init(&e->disk_lock, NULL);
    pthread_mutex_init(&e->lock, NULL);
    pthread_mutex_init(&e->reply_lock, NULL);
    pthread_cond_init(&e->reply_cv, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->engine_cv, &ca);
    pthread_cond_init(&e->committer_cv, &ca);
    pthread_condattr_destroy(&ca);
    for (int i = 0; i < 2; i++) {
        e->groups[i].batch = kf_batch_create(store);
        KF_ASSERT(e->groups[i].batch != NULL);
    }
    /* Recovery sets this engine's gauges (its coordinators, its timers). */
    int caller_slot = kf_metrics_bind_slot((int)e->config.metrics_slot);
    kf_status_t st = KF_OK;
    if (e->config.watchdog == NULL) {
        /* One per engine: each watches its own engine thread's calls. */
        st = kf_watchdog_create(&e->watchdog, err);
        e->config.watchdog = e->watchdog;
    }
    if (st == KF_OK) {
        st = kf_core_create(&e->config, store, &e->core, err);
    }
    kf_metrics_bind_slot(caller_slot);
    if (st != KF_OK) {
        kf_engine_destroy(e);
        return st;
    }
    /* Group ids are commit sequences: they continue from the last written,
     * on this partition's residue (first_group_id). */
    e->next_id = first_group_id(kf_core_last_commit_seq(e->core), e->config.partition_index,
                                e->config.partition_count);
    e->open = &e->groups[0];
    e->open->id = take_group_id(e);
    disk_refresh(e, true); /* a start below the reserve refuses writes at once */
    *out = e;
    return KF_OK;
}

bool kf_engine_failed(const kf_engine_t *e) {
    return atomic_load(&e->failed);
}

void kf_engine_fail(kf_engine_t *e, const kf_error_t *err) {
    pthread_mutex_lock(&e->lock);
    bool first = !atomic_load(&e->failed);
    if (first) {
        kf_error_set(&e->failure, KF_E_UNAVAILABLE, "storage failure: %s, stopping", err->message);
        atomic_store(&e->failed, true);
    }
    bool wake = first && e->engine_sleeping;
    pthread_mutex_unlock(&e->lock);
    if (wake) {
        pthread_cond_signal(&e->engine_cv);
    }
}

bool kf_engine_unready(kf_engine_t *e, char *why, size_t cap) {
    if (atomic_load(&e->failed)) {
        pthread_mutex_lock(&e->lock);
        snprintf(why, cap, "%s", e->failure.message);
        pthread_mutex_unlock(&e->lock);
        return true;
    }
    disk_refresh(e, true); /* a probe sees the disk as it is now */
    return disk_low_why(e, why, cap);
}

kf_status_t kf_engine_submit(kf_engine_t *e, kf_cmd_t *cmd) {
    cmd->next = NULL;
    cmd->submitted_ns = kf_mono_ns();
    pthread_mutex_lock(&e->lock);
    if (atomic_load(&e->failed)) {
        cmd->error = e->failure;
        pthread_mutex_unlock(&e->lock);
        return cmd->error.status;
    }
    if (e->stopping) {
        pthread_mutex_unlock(&e->lock);
        return kf_error_set(&cmd->error, KF_E_UNAVAILABLE, "the engine is shutting down");
    }
    if (e->inbox_count >= e->inbox_max) {
        pthread_mutex_unlock(&e->lock);
        kf_counter_add(KF_C_REJECTED_QUEUE_FULL, 1);
        return kf_error_set(
            &cmd->error, KF_E_LIMIT,
            "engine queue full: %zu commands waiting (--queue-depth, at most %d); retry later",
            e->inbox_max, KF_QUEUE_DEPTH_MAX);
    }
    cmd->id = ++e->next_cmd_id;
    if (e->inbox_tail) {
        e->inbox_tail->next = cmd;
    } else {
        e->inbox_head = cmd;
    }
    e->inbox_tail = cmd;
    e->inbox_count++;
    kf_gauge_set_in(e->config.metrics_slot, KF_G_QUEUE_DEPTH, (int64_t)e->inbox_count);
    bool wake = e->engine_sleeping;
    pthread_mutex_unlock(&e->lock);
    if (wake) {
        pthread_cond_signal(&e->engine_cv);
    }
    return KF_OK;
}

void kf_engine_cancel(kf_engine_t *e, kf_cmd_t *cmd) {
    pthread_mutex_lock(&e->lock);
    if (e->ncancels == e->cancels_cap && e->cancels_cap < KF_CANCELS_MAX) {
        size_t cap = e->cancels_cap ? e->cancels_cap * 2 : 256;
        struct cancel *grown = realloc(e->cancels, cap * sizeof *grown);
        if (grown != NULL) {
            e->cancels = grown;
            e->cancels_cap = cap;
        }
    }
    if (e->ncancels < e->cancels_cap) {
        /* The id is read now, while the submitter still owns the command. */
        e->cancels[e->ncancels].cmd = cmd;
        e->cancels[e->ncancels].id = cmd->id;
        e->ncancels++;
    } else {
        kf_log(KF_LOG_WARN, "engine", "%d cancels pending; one dropped (its wait runs out)",
               KF_CANCELS_MAX);
    }
    bool wake = e->engine_sleeping;
    pthread_mutex_unlock(&e->lock);
    if (wake) {
        pthread_cond_signal(&e->engine_cv);
    }
}

kf_status_t kf_engine_worker_post(kf_engine_t *e, kf_worker_event_t *ev) {
    ev->next = NULL;
    pthread_mutex_lock(&e->lock);
    if (e->stopping || atomic_load(&e->failed)) {
        pthread_mutex_unlock(&e->lock);
        return KF_E_UNAVAILABLE;
    }
    if (e->worker_tail) {
        e->worker_tail->next = ev;
    } else {
        e->worker_head = ev;
    }
    e->worker_tail = ev;
    bool wake = e->engine_sleeping;
    pthread_mutex_unlock(&e->lock);
    if (wake) {
        pthread_cond_signal(&e->engine_cv);
    }
    return KF_OK;
}

static void group_append(group_t *g, kf_cmd_t *list) {
    while (list != NULL) {
        kf_cmd_t *next = list->next;
        list->next = NULL;
        if (g->tail) {
            g->tail->next = list;
        } else {
            g->head = list;
        }
        g->tail = list;
        g->commands++;
        list = next;
    }
}

static bool group_empty(const group_t *g) {
    return g->head == NULL && kf_batch_count(g->batch) == 0;
}

static bool group_full(const group_t *g) {
    return g->commands >= KF_GROUP_COMMANDS_MAX || kf_batch_bytes(g->batch) >= KF_GROUP_BYTES_MAX;
}

static void deadline_after_ms(struct timespec *ts, int64_t ms) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    if (ms > 3600 * 1000) {
        ms = 3600 * 1000;
    }
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static bool commit_group(kf_engine_t *e, group_t *g, bool reply_here);
static void release_replies(kf_engine_t *e, kf_cmd_t *replies, bool reply_here);

/* Answers each command of the list with the engine's failure. */
static void reply_failed(kf_engine_t *e, kf_cmd_t *list, bool reply_here) {
    pthread_mutex_lock(&e->lock);
    kf_error_t failure = e->failure;
    pthread_mutex_unlock(&e->lock);
    for (kf_cmd_t *c = list; c != NULL; c = c->next) {
        c->response = NULL;
        c->error = failure;
    }
    release_replies(e, list, reply_here);
}

/* After a failed sync, on the engine thread: everything the engine still
 * holds (commands of its open group, parked polls and reads, the inbox) is
 * answered with the failure, never with a result that is not durable. The
 * open group's effects are dropped. */
static void fail_held(kf_engine_t *e, group_t *open) {
    pthread_mutex_lock(&e->lock);
    kf_cmd_t *inbox = e->inbox_head;
    e->inbox_head = e->inbox_tail = NULL;
    e->inbox_count = 0;
    pthread_mutex_unlock(&e->lock);
    kf_core_begin(e->core, open->batch, open->id, kf_clock_now_ms(&e->config.clock));
    kf_core_shutdown(e->core);
    group_append(open, kf_core_take_ready(e->core));
    group_append(open, inbox);
    kf_cmd_t *held = open->head;
    open->head = open->tail = NULL;
    open->commands = 0;
    kf_batch_clear(open->batch);
    reply_failed(e, held, false);
}

/* What the store holds in memory, for /metrics: now and then (each of
 * RocksDB's property reads takes its mutex). Engine thread (its metrics
 * slot). */
static void store_memory_refresh(kf_engine_t *e) {
    int64_t now_us = kf_mono_us();
    if (e->memory_checked_us != 0 &&
        now_us - e->memory_checked_us < KF_STORE_MEMORY_CHECK_INTERVAL_MS * 1000) {
        return;
    }
    kf_store_memory_t memory;
    kf_store_memory(e->store, &memory);
    kf_gauge_set(KF_G_STORE_MEMTABLE_BYTES, (int64_t)memory.memtable_bytes);
    kf_gauge_set(KF_G_STORE_BLOCK_CACHE_BYTES, (int64_t)memory.block_cache_bytes);
    /* RocksDB frees a memtable on its own thread when the memtable's flush
     * ends, often after a burst's last trim: what the store's memtables
     * gave back is reported like the engine's own frees, so the trimmer
     * returns it to the system (base/trim.h). Without it the memtables
     * flushed after 100k pending runs stayed resident, about 37 MiB over 8
     * partitions (bench/README.md, "Where the fixed share goes at 100k").
     * The block cache is shared by every partition's store: its falls are
     * not this store's to report. */
    if (memory.memtable_bytes < e->memtable_held_bytes) {
        kf_trim_freed(e->memtable_held_bytes - memory.memtable_bytes);
    }
    e->memtable_held_bytes = memory.memtable_bytes;
    e->memory_checked_us = now_us;
}

static void *engine_main(void *arg) {
    kf_engine_t *e = arg;
    pthread_setname_np(pthread_self(), "kf-engine");
    kf_metrics_bind_slot((int)e->config.metrics_slot);
    uint64_t durable_seen = 0;
    bool shutdown_done = false;
    for (;;) {
        pthread_mutex_lock(&e->lock);
        /* While the engine is busy the open group is its own; while it waits,
         * the committer may take the open group itself (see committer_main). */
        e->engine_busy = true;
        group_t *open = e->open;
        kf_cmd_t *cmds = NULL;
        if (!group_full(open)) {
            /* Take at most what fits in this group; the rest waits. */
            size_t room = KF_GROUP_COMMANDS_MAX - open->commands;
            cmds = e->inbox_head;
            kf_cmd_t *last = NULL, *c = cmds;
            size_t n = 0;
            while (c != NULL && n < room) {
                last = c;
                c = c->next;
                n++;
            }
            if (last != NULL) {
                last->next = NULL;
                e->inbox_head = c;
                if (c == NULL) {
                    e->inbox_tail = NULL;
                }
                e->inbox_count -= n;
                kf_gauge_set_in(e->config.metrics_slot, KF_G_QUEUE_DEPTH, (int64_t)e->inbox_count);
            } else {
                cmds = NULL;
            }
        }
        bool stopping = e->stopping;
        /* Take the posted cancels by swapping the two arrays. */
        struct cancel *cancels = e->cancels;
        size_t ncancels = e->ncancels;
        size_t cap = e->cancels_cap;
        e->cancels = e->cancels_taken;
        e->cancels_cap = e->cancels_taken_cap;
        e->cancels_taken = cancels;
        e->cancels_taken_cap = cap;
        e->ncancels = 0;
        kf_worker_event_t *worker_events = e->worker_head;
        e->worker_head = e->worker_tail = NULL;
        pthread_mutex_unlock(&e->lock);

        uint64_t durable = atomic_load(&e->durable_group);
        if (durable != durable_seen) {
            kf_core_durable(e->core, durable);
            durable_seen = durable;
        }
        int64_t now = kf_clock_now_ms(&e->config.clock);
        kf_core_begin(e->core, open->batch, open->id, now);
        /* The free space, measured now and then (and at the first turn,
         * before any timer fires), so writes resume soon after space is
         * freed even when nothing is written, and windows due while the
         * disk is low wait instead of filling it (kf_ctx_disk_room_left).
         * With several partitions the others' writes to the same
         * filesystem are not in this engine's estimate: measure at every
         * turn (statvfs does no I/O, about a microsecond), so a partition
         * that wrote nothing lately still refuses once another filled the
         * disk to the reserve. */
        char disk_why[KF_ERROR_MESSAGE_BYTES_MAX];
        uint64_t disk_free_bytes = disk_refresh(e, e->config.partition_count > 1);
        kf_core_set_disk_low(e->core, disk_low_why(e, disk_why, sizeof disk_why) ? disk_why : NULL);
        kf_core_set_disk_room(e->core, disk_room(e, disk_free_bytes));
        store_memory_refresh(e);
        /* Due timers first: a request that arrives after a window's due
         * time must find that window closed (its run started), not join it. */
        kf_core_tick(e->core, KF_TIMERS_PER_TURN_MAX);
        int64_t now_ns = kf_mono_ns();
        for (kf_cmd_t *c = cmds; c != NULL;) {
            kf_cmd_t *next = c->next;
            kf_histogram_observe_us(KF_H_QUEUE_WAIT_SECONDS, (now_ns - c->submitted_ns) / 1000);
            kf_core_execute(e->core, c);
            c = next;
        }
        for (size_t i = 0; i < ncancels; i++) {
            kf_core_cancel(e->core, cancels[i].cmd, cancels[i].id);
        }
        /* Worker events after the commands: a result resumes a step whose
         * batch may have arrived in this very turn. */
        kf_core_worker_events(e->core, worker_events);
        kf_core_tick(e->core, KF_TIMERS_PER_TURN_MAX);
        if (!stopping) {
            /* Work the engine starts by itself (follow-on timer steps), one
             * step at a time for a bounded slice of the turn: commands that
             * arrive meanwhile wait at most about KF_WORK_TURN_US. */
            int64_t until_us = kf_mono_us() + KF_WORK_TURN_US;
            while (kf_core_has_work(e->core) &&
                   kf_batch_bytes(open->batch) < KF_WORK_GROUP_BYTES_MAX &&
                   kf_core_run_work(e->core, 1) > 0 && kf_mono_us() < until_us) {
            }
        }
        if (stopping && !shutdown_done) {
            kf_core_shutdown(e->core);
            shutdown_done = true;
        }
        group_append(open, kf_core_take_ready(e->core));

        pthread_mutex_lock(&e->lock);
        bool inline_commit = false;
        if (e->handed == NULL && !group_empty(open) && !atomic_load(&e->failed)) {
            if (e->inbox_head == NULL && open->commands <= 1 && !kf_core_has_work(e->core)) {
                /* A lone command and nothing else waiting: write it here
                 * rather than wake the committer and then the replier (each
                 * wake-up of an idle thread costs tens of microseconds on a
                 * VM). Under load groups hold more, and with work of its own
                 * the engine has more to do, so they go to the committer
                 * and the engine keeps filling the next group meanwhile. */
                inline_commit = true;
            } else {
                e->handed = open;
                e->handed_bytes = kf_batch_bytes(open->batch);
                pthread_cond_signal(&e->committer_cv);
                open = open == &e->groups[0] ? &e->groups[1] : &e->groups[0];
                KF_ASSERT(group_empty(open));
                open->id = take_group_id(e);
                e->open = open;
            }
        }
        pthread_mutex_unlock(&e->lock);
        if (inline_commit) {
            uint64_t id = open->id;
            if (commit_group(e, open, true)) {
                pthread_mutex_lock(&e->lock);
                open->id = take_group_id(e);
                pthread_mutex_unlock(&e->lock);
                durable_seen = id;
                kf_core_durable(e->core, durable_seen);
            }
        }
        if (atomic_load(&e->failed)) {
            /* Nothing more will be acknowledged: answer everything held
             * with the failure, then wait to be stopped (the group the
             * committer holds was answered by commit_group). */
            fail_held(e, open);
            pthread_mutex_lock(&e->lock);
            e->engine_busy = false;
            while (!e->stopping) {
                e->engine_sleeping = true;
                pthread_cond_wait(&e->engine_cv, &e->lock);
                e->engine_sleeping = false;
            }
            pthread_mutex_unlock(&e->lock);
            break;
        }
        pthread_mutex_lock(&e->lock);
        e->engine_busy = false;
        if (stopping && e->inbox_head == NULL && e->handed == NULL && group_empty(e->open)) {
            pthread_mutex_unlock(&e->lock);
            break;
        }
        /* Sleep until there is work: commands (if the group has room), the
         * committer free while this group holds something, a timer, a stop. */
        for (;;) {
            bool can_take = (e->inbox_head != NULL && !group_full(e->open)) || e->ncancels > 0 ||
                            e->worker_head != NULL;
            bool can_hand = e->handed == NULL && !group_empty(e->open);
            bool can_work = !e->stopping && kf_core_has_work(e->core) &&
                            kf_batch_bytes(e->open->batch) < KF_WORK_GROUP_BYTES_MAX;
            if (can_take || can_hand || can_work || atomic_load(&e->failed) ||
                (e->stopping && !shutdown_done) ||
                (e->stopping && e->inbox_head == NULL && e->handed == NULL)) {
                break;
            }
            int64_t due = kf_core_next_due_ms(e->core);
            int64_t wait_ms =
                due == INT64_MAX ? KF_ENGINE_IDLE_WAKE_MS : due - kf_clock_now_ms(&e->config.clock);
            if (wait_ms <= 0) {
                break;
            }
            if (wait_ms > KF_ENGINE_IDLE_WAKE_MS) {
                wait_ms = KF_ENGINE_IDLE_WAKE_MS;
            }
            struct timespec ts;
            deadline_after_ms(&ts, wait_ms);
            e->engine_sleeping = true;
            int rc = pthread_cond_timedwait(&e->engine_cv, &e->lock, &ts);
            e->engine_sleeping = false;
            if (rc == ETIMEDOUT) {
                break;
            }
        }
        pthread_mutex_unlock(&e->lock);
    }
    return NULL;
}

/* A group is written only if it leaves a quarter of the disk reserve free:
 * RocksDB must never meet a full disk (Debian's build then aborts inside
 * it, see storage/store_rocks.c), and a group already applied in memory
 * cannot be refused, so running out is a fail-stop with keyflowd's own
 * message instead. The reserve, refusing new writes far earlier, makes
 * this the exception: something else filled the disk. */
static kf_status_t check_space(kf_engine_t *e, size_t bytes, kf_error_t *err) {
    uint64_t floor = e->disk_reserve_bytes / 4;
    uint64_t free_bytes = disk_refresh(e, true);
    if (free_bytes < bytes + floor) {
        return kf_error_set(err, KF_E_NO_SPACE,
                            "disk full: %llu bytes free on the data directory's filesystem; a "
                            "write of %zu bytes would leave less than %llu (a quarter of "
                            "--disk-reserve)",
                            (unsigned long long)free_bytes, bytes, (unsigned long long)floor);
    }
    return KF_OK;
}

/* Writes a group durably and releases its replies: on the replier thread,
 * or here when `reply_here` (the engine's inline commit, when idle).
 * False when the sync failed (fail-stop: nothing is acknowledged). */
static bool commit_group(kf_engine_t *e, group_t *g, bool reply_here) {
    if (kf_batch_count(g->batch) > 0) {
        kf_error_t err;
        kf_core_seal_group(g->batch, g->id);
        kf_status_t st = check_space(e, kf_batch_bytes(g->batch), &err);
        if (st == KF_OK) {
            int64_t t0 = kf_mono_us();
            st = kf_store_write(e->store, g->batch, &err);
            kf_histogram_observe_us(KF_H_SYNC_SECONDS, kf_mono_us() - t0);
        }
        if (st != KF_OK) {
            /* Fail-stop: the group's effects are in memory but maybe not
             * on disk, so nothing more is acknowledged; its calls, and all
             * the engine still holds, are answered with the failure. */
            pthread_mutex_lock(&e->lock);
            kf_error_set(&e->failure, KF_E_UNAVAILABLE, "storage failure: %s, stopping",
                         err.message);
            atomic_store(&e->failed, true);
            bool wake = e->engine_sleeping;
            pthread_mutex_unlock(&e->lock);
            if (wake) {
                pthread_cond_signal(&e->engine_cv);
            }
            e->config.on_fatal(&err, e->config.on_fatal_ctx);
            kf_cmd_t *held = g->head;
            g->head = g->tail = NULL;
            g->commands = 0;
            kf_batch_clear(g->batch);
            reply_failed(e, held, reply_here);
            return false;
        }
        pthread_mutex_lock(&e->disk_lock);
        e->disk_written_bytes += kf_batch_bytes(g->batch);
        pthread_mutex_unlock(&e->disk_lock);
        kf_histogram_observe(KF_H_GROUP_BYTES, (double)kf_batch_bytes(g->batch));
        /* Only groups that wrote something were synced (reads alone wait
         * for the group before them, not for a sync of their own). */
        kf_counter_add(KF_C_GROUPS, 1);
        kf_histogram_observe(KF_H_GROUP_COMMANDS, (double)g->commands);
    }
    atomic_store(&e->durable_group, g->id);
    kf_cmd_t *replies = g->head;
    g->head = g->tail = NULL;
    g->commands = 0;
    kf_batch_clear(g->batch);
    release_replies(e, replies, reply_here);
    return true;
}

/* Releases a list of answered commands: here (the engine's inline commit),
 * or through the replier thread, in order. */
static void release_replies(kf_engine_t *e, kf_cmd_t *replies, bool reply_here) {
    if (reply_here) {
        while (replies != NULL) {
            kf_cmd_t *next = replies->next;
            replies->next = NULL;
            replies->done(replies);
            replies = next;
        }
        return;
    }
    if (replies != NULL) {
        kf_cmd_t *last = replies;
        while (last->next != NULL) {
            last = last->next;
        }
        pthread_mutex_lock(&e->reply_lock);
        if (e->reply_tail) {
            e->reply_tail->next = replies;
        } else {
            e->reply_head = replies;
        }
        e->reply_tail = last;
        pthread_cond_signal(&e->reply_cv);
        pthread_mutex_unlock(&e->reply_lock);
    }
}

static void *committer_main(void *arg) {
    kf_engine_t *e = arg;
    pthread_setname_np(pthread_self(), "kf-commit");
    kf_metrics_bind_slot((int)e->config.metrics_slot);
    for (;;) {
        pthread_mutex_lock(&e->lock);
        while (e->handed == NULL && !e->committer_exit) {
            pthread_cond_wait(&e->committer_cv, &e->lock);
        }
        group_t *g = e->handed;
        pthread_mutex_unlock(&e->lock);
        if (g == NULL) {
            break;
        }
        if (!commit_group(e, g, false)) {
            /* on_fatal returned: acknowledge nothing, ever (the group's
             * calls were answered with the failure). The group stays handed
             * so the engine never hands another. */
            pthread_mutex_lock(&e->lock);
            pthread_cond_signal(&e->engine_cv);
            while (!e->committer_exit) {
                pthread_cond_wait(&e->committer_cv, &e->lock);
            }
            pthread_mutex_unlock(&e->lock);
            break;
        }
        pthread_mutex_lock(&e->lock);
        e->handed = NULL;
        e->handed_bytes = 0;
        if (!e->engine_busy && !group_empty(e->open) && !atomic_load(&e->failed)) {
            /* The engine is waiting and the open group holds work: take it
             * now instead of waking the engine to hand it over (two thread
             * wake-ups per cycle that the next fsync would wait for). The
             * group just written, now empty, becomes the open one. */
            KF_ASSERT(group_empty(g));
            e->handed = e->open;
            e->handed_bytes = kf_batch_bytes(e->open->batch);
            g->id = take_group_id(e);
            e->open = g;
        }
        bool wake = e->engine_sleeping;
        pthread_mutex_unlock(&e->lock);
        if (wake) {
            pthread_cond_signal(&e->engine_cv);
        }
    }
    return NULL;
}

static void *replier_main(void *arg) {
    kf_engine_t *e = arg;
    pthread_setname_np(pthread_self(), "kf-reply");
    for (;;) {
        pthread_mutex_lock(&e->reply_lock);
        while (e->reply_head == NULL && !e->replier_exit) {
            pthread_cond_wait(&e->reply_cv, &e->reply_lock);
        }
        kf_cmd_t *replies = e->reply_head;
        e->reply_head = e->reply_tail = NULL;
        bool exit_now = e->replier_exit && replies == NULL;
        pthread_mutex_unlock(&e->reply_lock);
        if (exit_now) {
            break;
        }
        while (replies != NULL) {
            kf_cmd_t *next = replies->next;
            replies->next = NULL;
            replies->done(replies);
            replies = next;
        }
    }
    return NULL;
}

static void stop_replier(kf_engine_t *e) {
    pthread_mutex_lock(&e->reply_lock);
    e->replier_exit = true;
    pthread_cond_signal(&e->reply_cv);
    pthread_mutex_unlock(&e->reply_lock);
    pthread_join(e->replier_thread, NULL);
}

kf_status_t kf_engine_start(kf_engine_t *e, kf_error_t *err) {
    KF_ASSERT(!e->threads_started);
    if (pthread_create(&e->replier_thread, NULL, replier_main, e) != 0) {
        return kf_error_set(err, KF_E_INTERNAL, "cannot start the replier thread");
    }
    if (pthread_create(&e->committer_thread, NULL, committer_main, e) != 0) {
        stop_replier(e);
        return kf_error_set(err, KF_E_INTERNAL, "cannot start the committer thread");
    }
    if (pthread_create(&e->engine_thread, NULL, engine_main, e) != 0) {
        pthread_mutex_lock(&e->lock);
        e->committer_exit = true;
        pthread_cond_signal(&e->committer_cv);
        pthread_mutex_unlock(&e->lock);
        pthread_join(e->committer_thread, NULL);
        stop_replier(e);
        return kf_error_set(err, KF_E_INTERNAL, "cannot start the engine thread");
    }
    e->threads_started = true;
    return KF_OK;
}

void kf_engine_stop(kf_engine_t *e) {
    if (!e->threads_started) {
        return;
    }
    pthread_mutex_lock(&e->lock);
    e->stopping = true;
    pthread_cond_signal(&e->engine_cv);
    pthread_mutex_unlock(&e->lock);
    pthread_join(e->engine_thread, NULL);
    pthread_mutex_lock(&e->lock);
    e->committer_exit = true;
    pthread_cond_signal(&e->committer_cv);
    pthread_mutex_unlock(&e->lock);
    pthread_join(e->committer_thread, NULL);
    stop_replier(e); /* after the committer: it sends every reply queued */
    e->threads_started = false;
}

void kf_engine_destroy(kf_engine_t *e) {
    if (e == NULL) {
        return;
    }
    kf_engine_stop(e);
    if (atomic_load(&e->disk_low)) {
        /* Its condition goes with it; the process's readiness counts one
         * per engine (base/health.h). */
        kf_health_degrade(false, "disk reserve: engine closed");
    }
    kf_core_destroy(e->core);
    kf_watchdog_destroy(e->watchdog); /* after the engine thread: no call is armed */
    for (int i = 0; i < 2; i++) {
        kf_batch_destroy(e->groups[i].batch);
    }
    pthread_cond_destroy(&e->engine_cv);
    pthread_cond_destroy(&e->committer_cv);
    pthread_mutex_destroy(&e->lock);
    pthread_cond_destroy(&e->reply_cv);
    pthread_mutex_destroy(&e->reply_lock);
    free(e->cancels);
    free(e->cancels_taken);
    while (e->worker_head != NULL) { /* posted, never taken: the engine never ran */
        kf_worker_event_t *ev = e->worker_head;
        e->worker_head = ev->next;
        kf_worker_event_free(ev);
    }
    free(e);
}
