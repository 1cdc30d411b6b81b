/*
 * test_engine_threads.c - the threaded engine: replies only after the
 * group is durable, group commit across concurrent submitters, a failed
 * sync that stops the engine without acknowledging anything, the disk
 * reserve (refused growth, and a fail-stop instead of a full disk), and
 * memory the store gives back reported to the trimmer.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/metrics.h"
#include "base/trim.h"
#include "runtime/engine.h"
#include "keyflow/v1/coordinators.pb-c.h"
#include "keyflow/v1/runs.pb-c.h"

typedef struct waiter {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;
    int fatal;
    uint64_t writes_at_done[64];
    kf_memdisk_t *disk;
} waiter_t;

static waiter_t w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, {0}, NULL};

static void on_done(kf_cmd_t *cmd) {
    (void)cmd;
    pthread_mutex_lock(&w.lock);
    if (w.done < 64) {
        w.writes_at_done[w.done] = kf_memdisk_writes(w.disk);
    }
    w.done++;
    pthread_cond_broadcast(&w.cond);
    pthread_mutex_unlock(&w.lock);
}

static void on_fatal(const kf_error_t *err, void *ctx) {
    (void)err;
    (void)ctx;
    pthread_mutex_lock(&w.lock);
    w.fatal++;
    pthread_cond_broadcast(&w.cond);
    pthread_mutex_unlock(&w.lock);
}

typedef struct req_slot {
    Keyflow__V1__SendEventRequest req;
    Keyflow__V1__Event ev;
    Keyflow__V1__Rule rule;
    char key[16];
    kf_arena_t arena;
    kf_cmd_t cmd;
} req_slot_t;

static void fill(req_slot_t *s, int i) {
    keyflow__v1__send_event_request__init(&s->req);
    keyflow__v1__event__init(&s->ev);
    keyflow__v1__rule__init(&s->rule);
    s->rule.kind = KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE;
    s->rule.window_ms_present_case = KEYFLOW__V1__RULE__WINDOW_MS_PRESENT_WINDOW_MS;
    s->rule.window_ms = 60000;
    snprintf(s->key, sizeof s->key, "k%d", i);
    s->req.workflow = "wf";
    s->req.key = s->key;
    s->ev.rule = &s->rule;
    s->ev.input_json = "1";
    s->req.event = &s->ev;
    kf_arena_init(&s->arena, 0);
    memset(&s->cmd, 0, sizeof s->cmd);
    s->cmd.op = KF_OP_SEND_EVENT;
    s->cmd.request = &s->req.base;
    s->cmd.arena = &s->arena;
    s->cmd.done = on_done;
}

static void wait_for(int *counter, int target) {
    pthread_mutex_lock(&w.lock);
    while (*counter < target) {
        pthread_cond_wait(&w.cond, &w.lock);
    }
    pthread_mutex_unlock(&w.lock);
}

/* A store on `disk` and a started engine over it, with the system clock
 * and default limits (the config outlives the engine: engines borrow it). */
static kf_engine_t *start_engine(kf_memdisk_t *disk, kf_store_t **store) {
    static kf_engine_config_t cfg;
    cfg = (kf_engine_config_t){.clock = kf_clock_system()};
    kf_error_t err;
    cr_assert_eq(kf_store_open_mem(disk, NULL, store, &err), KF_OK);
    kf_engine_t *engine;
    cr_assert_eq(kf_engine_create(&cfg, *store, &engine, &err), KF_OK, "%s", err.message);
    cr_assert_eq(kf_engine_start(engine, &err), KF_OK);
    return engine;
}

Test(engine_threads, replies_follow_durable_writes, .timeout = 30) {
    kf_memdisk_t *disk = kf_memdisk_create();
    w.disk = disk;
    kf_store_t *store;
    kf_engine_t *engine = start_engine(disk, &store);
    static req_slot_t slots[32];
    uint64_t before = kf_memdisk_writes(disk);
    for (int i = 0; i < 32; i++) {
        fill(&slots[i], i);
        cr_assert_eq(kf_engine_submit(engine, &slots[i].cmd), KF_OK);
    }
    wait_for(&w.done, 32);
    for (int i = 0; i < 32; i++) {
        cr_assert_eq(slots[i].cmd.error.status, KF_OK, "%s", slots[i].cmd.error.message);
        cr_assert_gt(w.writes_at_done[i], before, "each reply comes after a durable write");
    }
    uint64_t groups = kf_memdisk_writes(disk) - before;
    cr_assert_leq(groups, 32, "never more writes than commands");
    kf_engine_stop(engine);
    kf_engine_destroy(engine);
    for (int i = 0; i < 32; i++) {
        kf_arena_deinit(&slots[i].arena);
    }
    kf_store_close(store);
    kf_memdisk_destroy(disk);
}

Test(engine_threads, failed_sync_stops_without_acknowledging, .timeout = 30) {
    kf_memdisk_t *disk = kf_memdisk_create();
    w.disk = disk;
    kf_store_t *store;
    kf_error_t err;
    /* The first write is the coordinators' id key, made at the first start
     * (service/coord); the second is the first command's group. */
    kf_mem_faults_t faults = {.fail_write_at = 2};
    cr_assert_eq(kf_store_open_mem(disk, &faults, &store, &err), KF_OK);
    kf_engine_config_t cfg = {.clock = kf_clock_system(), .on_fatal = on_fatal};
    kf_engine_t *engine;
    cr_assert_eq(kf_engine_create(&cfg, store, &engine, &err), KF_OK, "%s", err.message);
    cr_assert_eq(kf_engine_start(engine, &err), KF_OK);
    uint64_t before = kf_memdisk_writes(disk);
    static req_slot_t slot;
    fill(&slot, 1);
    cr_assert_eq(kf_engine_submit(engine, &slot.cmd), KF_OK);
    wait_for(&w.fatal, 1);
    cr_assert(kf_engine_failed(engine));
    static req_slot_t later;
    fill(&later, 2);
    cr_assert_eq(kf_engine_submit(engine, &later.cmd), KF_E_UNAVAILABLE,
                 "no new work after a failure");
    cr_assert_str_eq(later.cmd.error.message, "storage failure: injected fsync failure, stopping");
    /* The call in flight is answered, with the failure, not with a result. */
    wait_for(&w.done, 1);
    cr_assert_eq(slot.cmd.error.status, KF_E_UNAVAILABLE);
    cr_assert_str_eq(slot.cmd.error.message, "storage failure: injected fsync failure, stopping");
    cr_assert_null(slot.cmd.response);
    kf_engine_stop(engine);
    pthread_mutex_lock(&w.lock);
    int done = w.done;
    pthread_mutex_unlock(&w.lock);
    cr_assert_eq(done, 1, "one answer, and no acknowledgement");
    cr_assert_eq(kf_memdisk_writes(disk), before, "nothing reached the disk");
    kf_engine_destroy(engine);
    kf_arena_deinit(&slot.arena);
    kf_arena_deinit(&later.arena);
    kf_store_close(store);
    kf_memdisk_destroy(disk);
}

/* Another partition's sync failed and the process fail-stops
 * (kf_engine_fail): a poll waiting here is answered with that failure, and
 * so is every later call, though this engine's own store works. */
Test(engine_threads, a_failure_elsewhere_is_what_this_engine_answers, .timeout = 30) {
    kf_memdisk_t *disk = kf_memdisk_create();
    w.disk = disk;
    kf_store_t *store;
    kf_error_t err;
    cr_assert_eq(kf_store_open_mem(disk, NULL, &store, &err), KF_OK);
    kf_engine_config_t cfg = {.clock = kf_clock_system(), .on_fatal = on_fatal};
    kf_engine_t *engine;
    cr_assert_eq(kf_engine_create(&cfg, store, &engine, &err), KF_OK, "%s", err.message);
    cr_assert_eq(kf_engine_start(engine, &err), KF_OK);
    static Keyflow__V1__PollRunsRequest poll;
    static char *workflows[] = {"wf"};
    keyflow__v1__poll_runs_request__init(&poll);
    poll.n_workflows = 1;
    poll.workflows = workflows;
    poll.worker_id = "w";
    poll.wait_ms = 60000;
    static kf_arena_t arena;
    kf_arena_init(&arena, 0);
    static kf_cmd_t parked;
    parked.op = KF_OP_POLL_RUNS;
    parked.request = &poll.base;
    parked.arena = &arena;
    parked.done = on_done;
    cr_assert_eq(kf_engine_submit(engine, &parked), KF_OK);
    kf_error_t elsewhere;
    kf_error_set(&elsewhere, KF_E_IO, "injected fsync failure");
    kf_engine_fail(engine, &elsewhere);
    wait_for(&w.done, 1);
    cr_assert_eq(parked.error.status, KF_E_UNAVAILABLE);
    cr_assert_str_eq(parked.error.message, "storage failure: injected fsync failure, stopping");
    cr_assert(kf_engine_failed(engine));
    static req_slot_t later;
    fill(&later, 1);
    cr_assert_eq(kf_engine_submit(engine, &later.cmd), KF_E_UNAVAILABLE);
    cr_assert_str_eq(later.cmd.error.message, "storage failure: injected fsync failure, stopping");
    kf_engine_stop(engine);
    cr_assert_eq(w.fatal, 0, "the failure was the other partition's to report");
    kf_engine_destroy(engine);
    kf_arena_deinit(&arena);
    kf_arena_deinit(&later.arena);
    kf_store_close(store);
    kf_memdisk_destroy(disk);
}

/* Below the disk reserve, a new event is refused with KF_E_NO_SPACE naming
 * the reserve, and a read still works; with space back, events go in. */
Test(engine_threads, disk_reserve_refuses_new_writes_only, .timeout = 30) {
    kf_memdisk_t *disk = kf_memdisk_create();
    w.disk = disk;
    w.done = 0;
    kf_store_t *store;
    kf_error_t err;
    cr_assert_eq(kf_store_open_mem(disk, NULL, &store, &err), KF_OK);
    kf_engine_config_t cfg = {.clock = kf_clock_system(), .disk_reserve_bytes = 1 << 20};
    kf_engine_t *engine;
    cr_assert_eq(kf_engine_create(&cfg, store, &engine, &err), KF_OK, "%s", err.message);
    cr_assert_eq(kf_engine_start(engine, &err), KF_OK);
    char why[KF_ERROR_MESSAGE_BYTES_MAX] = "";
    cr_assert_not(kf_engine_unready(engine, why, sizeof why));

    kf_memdisk_set_free_bytes(disk, 1000 * 1000); /* below 1 MiB */
    /* The engine measures at most every KF_DISK_CHECK_INTERVAL_MS: wait for
     * /readyz's view to change (a condition, not a sleep). */
    while (!kf_engine_unready(engine, why, sizeof why)) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    cr_assert(strstr(why, "disk reserve reached: 1000000 bytes free") != NULL, "%s", why);
    static req_slot_t refused;
    fill(&refused, 1);
    cr_assert_eq(kf_engine_submit(engine, &refused.cmd), KF_OK);
    wait_for(&w.done, 1);
    cr_assert_eq(refused.cmd.error.status, KF_E_NO_SPACE, "%s", refused.cmd.error.message);
    cr_assert(strstr(refused.cmd.error.message, "--disk-reserve") != NULL, "%s",
              refused.cmd.error.message);

    static req_slot_t describe;
    static Keyflow__V1__DescribeCoordinatorRequest dreq =
        KEYFLOW__V1__DESCRIBE_COORDINATOR_REQUEST__INIT;
    static Keyflow__V1__CoordinatorRef ref = KEYFLOW__V1__COORDINATOR_REF__INIT;
    ref.kind = KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE;
    ref.workflow = "wf";
    ref.key = "k1";
    dreq.coordinator = &ref;
    fill(&describe, 2);
    describe.cmd.op = KF_OP_DESCRIBE_COORDINATOR;
    describe.cmd.request = &dreq.base;
    cr_assert_eq(kf_engine_submit(engine, &describe.cmd), KF_OK);
    wait_for(&w.done, 2);
    cr_assert_neq(describe.cmd.error.status, KF_E_NO_SPACE, "reads go on: %s",
                  describe.cmd.error.message);

    kf_memdisk_set_free_bytes(disk, UINT64_MAX);
    while (kf_engine_unready(engine, why, sizeof why)) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    static req_slot_t accepted;
    fill(&accepted, 3);
    cr_assert_eq(kf_engine_submit(engine, &accepted.cmd), KF_OK);
    wait_for(&w.done, 3);
    cr_assert_eq(accepted.cmd.error.status, KF_OK, "%s", accepted.cmd.error.message);

    kf_engine_stop(engine);
    kf_engine_destroy(engine);
    kf_arena_deinit(&refused.arena);
    kf_arena_deinit(&describe.arena);
    kf_arena_deinit(&accepted.arena);
    kf_store_close(store);
    kf_memdisk_destroy(disk);
}

/* A write that would leave less than a quarter of the reserve free is not
 * made: the engine fail-stops with its own message, and the call in
 * flight gets it. (The reserve refuses new events long before; here the
 * space vanishes between two measures, as if another process filled the
 * disk.) */
Test(engine_threads, a_write_into_a_full_disk_fail_stops_first, .timeout = 30) {
    kf_memdisk_t *disk = kf_memdisk_create();
    w.disk = disk;
    w.done = 0;
    w.fatal = 0;
    kf_store_t *store;
    kf_error_t err;
    cr_assert_eq(kf_store_open_mem(disk, NULL, &store, &err), KF_OK);
    kf_engine_config_t cfg = {
        .clock = kf_clock_system(), .disk_reserve_bytes = 1 << 20, .on_fatal = on_fatal};
    kf_engine_t *engine;
    cr_assert_eq(kf_engine_create(&cfg, store, &engine, &err), KF_OK, "%s", err.message);
    cr_assert_eq(kf_engine_start(engine, &err), KF_OK);
    uint64_t before = kf_memdisk_writes(disk);
    kf_memdisk_set_free_bytes(disk, 1000); /* measured again before the write */
    static req_slot_t slot;
    fill(&slot, 1);
    cr_assert_eq(kf_engine_submit(engine, &slot.cmd), KF_OK);
    wait_for(&w.done, 1);
    cr_assert_eq(slot.cmd.error.status, KF_E_UNAVAILABLE);
    cr_assert(strncmp(slot.cmd.error.message, "storage failure: disk full: 1000 bytes free", 43) ==
                  0,
              "%s", slot.cmd.error.message);
    cr_assert_eq(w.fatal, 1);
    cr_assert(kf_engine_failed(engine));
    cr_assert_eq(kf_memdisk_writes(disk), before, "nothing was written");
    kf_engine_stop(engine);
    kf_engine_destroy(engine);
    kf_arena_deinit(&slot.arena);
    kf_store_close(store);
    kf_memdisk_destroy(disk);
}

/* Polls cond (every 10 ms) until it holds or 10 s passed. */
static bool eventually(bool (*cond)(void *), void *arg) {
    int64_t deadline_us = kf_mono_us() + 10 * 1000 * 1000;
    while (!cond(arg)) {
        if (kf_mono_us() > deadline_us) {
            return false;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return true;
}

#define GIVEN_BACK_RECORDS 64
#define GIVEN_BACK_VALUE   1024

static bool gauge_holds_records(void *arg) {
    (void)arg;
    return kf_gauge_get(KF_G_STORE_MEMTABLE_BYTES) >= GIVEN_BACK_RECORDS * GIVEN_BACK_VALUE;
}

static bool reported_freed(void *arg) {
    return kf_trim_freed_total() - *(uint64_t *)arg >= GIVEN_BACK_RECORDS * GIVEN_BACK_VALUE;
}

/* RocksDB frees a flushed memtable on its own thread, with no command in
 * sight: the engine sees the store's memory fall at its next reading and
 * reports the fall as freed, so the trimmer gives it back (the memory
 * store's records stand in for memtables here). */
Test(engine_threads, memory_the_store_gives_back_is_reported_freed, .timeout = 30) {
    kf_memdisk_t *disk = kf_memdisk_create();
    kf_store_t *store;
    kf_error_t err;
    kf_engine_t *engine = start_engine(disk, &store);

    static uint8_t value[GIVEN_BACK_VALUE];
    kf_batch_t *batch = kf_batch_create(store);
    for (int i = 0; i < GIVEN_BACK_RECORDS; i++) {
        char key[16];
        snprintf(key, sizeof key, "given%03d", i);
        kf_batch_put(batch, KF_CF_RUNS, key, strlen(key), value, sizeof value);
    }
    cr_assert_eq(kf_store_write(store, batch, &err), KF_OK, "%s", err.message);
    cr_assert(eventually(gauge_holds_records, NULL), "the engine never read the store's memory");

    uint64_t before = kf_trim_freed_total();
    kf_batch_clear(batch);
    for (int i = 0; i < GIVEN_BACK_RECORDS; i++) {
        char key[16];
        snprintf(key, sizeof key, "given%03d", i);
        kf_batch_delete(batch, KF_CF_RUNS, key, strlen(key));
    }
    cr_assert_eq(kf_store_write(store, batch, &err), KF_OK, "%s", err.message);
    cr_assert(eventually(reported_freed, &before),
              "the store gave back %d bytes; %llu were reported freed",
              GIVEN_BACK_RECORDS * GIVEN_BACK_VALUE,
              (unsigned long long)(kf_trim_freed_total() - before));

    kf_batch_destroy(batch);
    kf_engine_stop(engine);
    kf_engine_destroy(engine);
    kf_store_close(store);
    kf_memdisk_destroy(disk);
}
