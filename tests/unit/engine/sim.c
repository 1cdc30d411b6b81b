/* sim.c - the deterministic engine driver (see sim.h). */
#include "sim.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "base/assert.h"
#include "storage/keys.h"

static void drop(sim_t *sim);

static void recover(sim_t *sim) {
    kf_error_t err;
    cr_assert_eq(kf_store_open_mem(sim->disk, NULL, &sim->store, &err), KF_OK, "%s", err.message);
    cr_assert_eq(kf_core_create(&sim->config, sim->store, &sim->core, &err), KF_OK, "%s",
                 err.message);
    sim->batch = kf_batch_create(sim->store);
    sim->group = kf_core_last_commit_seq(sim->core); /* as the engine numbers groups */
    kf_core_begin(sim->core, sim->batch, ++sim->group, sim->now_ms);
}

kf_status_t sim_restart_status(sim_t *sim, kf_error_t *err) {
    return sim_restart_faulty(sim, NULL, err);
}

kf_status_t sim_restart_faulty(sim_t *sim, const kf_mem_faults_t *faults, kf_error_t *err) {
    drop(sim);
    cr_assert_eq(kf_store_open_mem(sim->disk, faults, &sim->store, err), KF_OK, "%s", err->message);
    kf_status_t st = kf_core_create(&sim->config, sim->store, &sim->core, err);
    if (st != KF_OK) {
        sim->core = NULL;
        return st;
    }
    sim->batch = kf_batch_create(sim->store);
    sim->group = kf_core_last_commit_seq(sim->core);
    kf_core_begin(sim->core, sim->batch, ++sim->group, sim->now_ms);
    return KF_OK;
}

void sim_put_raw(sim_t *sim, kf_cf_t cf, const void *key, size_t key_len, const void *value,
                 size_t value_len) {
    kf_batch_t *b = kf_batch_create(sim->store);
    kf_batch_put(b, cf, key, key_len, value, value_len);
    kf_error_t err;
    cr_assert_eq(kf_store_write(sim->store, b, &err), KF_OK, "%s", err.message);
    kf_batch_destroy(b);
}

void sim_open(sim_t *sim, uint64_t seed) {
    sim_open_plugins(sim, seed, NULL);
}

void sim_open_plugins(sim_t *sim, uint64_t seed, const char *plugin_dir) {
    memset(sim, 0, sizeof *sim);
    sim->config.plugin_dir = plugin_dir;
    sim->seed = seed;
    sim->now_ms = 1700000000000LL;
    sim->disk = kf_memdisk_create();
    sim->config.clock = kf_clock_manual(&sim->now_ms);
    sim->config.rng_seed = &sim->seed;
    sim->config.rng_seed_len = sizeof sim->seed;
    kf_arena_init(&sim->arena, 0);
    recover(sim);
}

static void drop(sim_t *sim) {
    kf_batch_destroy(sim->batch);
    kf_core_destroy(sim->core);
    kf_store_close(sim->store);
    sim->batch = NULL;
    sim->core = NULL;
    sim->store = NULL;
}

void sim_close(sim_t *sim) {
    drop(sim);
    kf_memdisk_destroy(sim->disk);
    kf_arena_deinit(&sim->arena);
}

bool sim_get_raw(sim_t *sim, kf_cf_t cf, const void *key, size_t key_len, kf_value_t *value) {
    bool found;
    kf_error_t err;
    cr_assert_eq(kf_store_get(sim->store, cf, key, key_len, value, &found, &err), KF_OK, "%s",
                 err.message);
    return found;
}

size_t sim_count_raw(sim_t *sim, kf_cf_t cf) {
    kf_iter_t *it;
    kf_error_t err;
    cr_assert_eq(kf_iter_create(sim->store, cf, NULL, 0, NULL, 0, &it, &err), KF_OK, "%s",
                 err.message);
    size_t n = 0;
    for (kf_iter_seek_first(it); kf_iter_valid(it); kf_iter_next(it)) {
        n++;
    }
    cr_assert_eq(kf_iter_status(it, &err), KF_OK, "%s", err.message);
    kf_iter_destroy(it);
    return n;
}

void sim_step(sim_t *sim) {
    sim->step_bytes = kf_batch_bytes(sim->batch);
    if (kf_batch_count(sim->batch) > 0) {
        kf_error_t err;
        kf_core_seal_group(sim->batch, sim->group);
        cr_assert_eq(kf_store_write(sim->store, sim->batch, &err), KF_OK, "%s", err.message);
        kf_batch_clear(sim->batch);
    }
    (void)kf_core_take_ready(sim->core);
    kf_core_durable(sim->core, sim->group);
    kf_core_begin(sim->core, sim->batch, ++sim->group, sim->now_ms);
}

void sim_crash(sim_t *sim) {
    drop(sim);
    recover(sim);
}

void sim_pump(sim_t *sim) {
    kf_core_begin(sim->core, sim->batch, sim->group, sim->now_ms);
    kf_core_pump(sim->core);
    sim_step(sim);
}

uint32_t sim_run_work(sim_t *sim, uint32_t steps_max) {
    uint32_t ran = 0;
    while (ran < steps_max && kf_core_has_work(sim->core)) {
        kf_core_begin(sim->core, sim->batch, sim->group, sim->now_ms);
        if (kf_core_run_work(sim->core, 1) == 0) {
            break;
        }
        ran++;
        sim_step(sim);
    }
    return ran;
}

void sim_drain_work(sim_t *sim, uint32_t steps_max) {
    sim_run_work(sim, steps_max);
    cr_assert_not(kf_core_has_work(sim->core), "work left after %u steps", steps_max);
}

void sim_advance(sim_t *sim, int64_t to_ms) {
    cr_assert_geq(to_ms, sim->now_ms);
    sim->now_ms = to_ms;
    kf_core_begin(sim->core, sim->batch, sim->group, sim->now_ms);
    while (kf_core_tick(sim->core, KF_TIMERS_PER_TURN_MAX) == KF_TIMERS_PER_TURN_MAX) {
    }
    sim_step(sim);
}

kf_cmd_t *sim_exec(sim_t *sim, kf_op_t op, const ProtobufCMessage *request) {
    kf_cmd_t *cmd = kf_arena_zalloc(&sim->arena, sizeof *cmd);
    cmd->op = op;
    cmd->request = request;
    cmd->arena = &sim->arena;
    kf_core_begin(sim->core, sim->batch, sim->group, sim->now_ms);
    kf_core_execute(sim->core, cmd);
    if (!sim->hold_group) {
        sim_step(sim);
    }
    return cmd;
}

#define NEW(T, init)                                                                               \
    ({                                                                                             \
        T *p_ = kf_arena_zalloc(&sim->arena, sizeof(T));                                           \
        init(p_);                                                                                  \
        p_;                                                                                        \
    })

Keyflow__V1__Rule *sim_debounce(sim_t *sim, int64_t window_ms, int64_t max_wait_ms) {
    Keyflow__V1__Rule *r = NEW(Keyflow__V1__Rule, keyflow__v1__rule__init);
    r->kind = KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE;
    r->window_ms_present_case = KEYFLOW__V1__RULE__WINDOW_MS_PRESENT_WINDOW_MS;
    r->window_ms = window_ms;
    if (max_wait_ms >= 0) {
        r->max_wait_ms_present_case = KEYFLOW__V1__RULE__MAX_WAIT_MS_PRESENT_MAX_WAIT_MS;
        r->max_wait_ms = max_wait_ms;
    }
    return r;
}

Keyflow__V1__Rule *sim_batch(sim_t *sim, int64_t max_events, int64_t max_wait_ms) {
    Keyflow__V1__Rule *r = NEW(Keyflow__V1__Rule, keyflow__v1__rule__init);
    r->kind = KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH;
    if (max_events >= 0) {
        r->max_events_present_case = KEYFLOW__V1__RULE__MAX_EVENTS_PRESENT_MAX_EVENTS;
        r->max_events = max_events;
    }
    if (max_wait_ms >= 0) {
        r->max_wait_ms_present_case = KEYFLOW__V1__RULE__MAX_WAIT_MS_PRESENT_MAX_WAIT_MS;
        r->max_wait_ms = max_wait_ms;
    }
    return r;
}

Keyflow__V1__Event *sim_event(sim_t *sim, const char *id, Keyflow__V1__Rule *rule,
                              const char *input_json) {
    Keyflow__V1__Event *ev = NEW(Keyflow__V1__Event, keyflow__v1__event__init);
    if (id != NULL) {
        ev->id = kf_arena_strdup(&sim->arena, id);
    }
    ev->rule = rule;
    if (input_json != NULL) {
        ev->input_json = kf_arena_strdup(&sim->arena, input_json);
    }
    return ev;
}

Keyflow__V1__SendEventRequest *sim_send_request(sim_t *sim, const char *workflow, const char *key,
                                                Keyflow__V1__Event *event) {
    Keyflow__V1__SendEventRequest *req =
        NEW(Keyflow__V1__SendEventRequest, keyflow__v1__send_event_request__init);
    req->workflow = kf_arena_strdup(&sim->arena, workflow);
    req->key = kf_arena_strdup(&sim->arena, key);
    req->event = event;
    return req;
}

kf_cmd_t *sim_send_event(sim_t *sim, const char *workflow, const char *key,
                         Keyflow__V1__Event *event) {
    return sim_exec(sim, KF_OP_SEND_EVENT, &sim_send_request(sim, workflow, key, event)->base);
}

kf_cmd_t *sim_send(sim_t *sim, const char *workflow, const char *key, const char *id,
                   Keyflow__V1__Rule *rule, const char *input_json) {
    return sim_send_event(sim, workflow, key, sim_event(sim, id, rule, input_json));
}

static Keyflow__V1__CoordinatorRef *ref(sim_t *sim, int kind, const char *workflow,
                                        const char *key) {
    Keyflow__V1__CoordinatorRef *r =
        NEW(Keyflow__V1__CoordinatorRef, keyflow__v1__coordinator_ref__init);
    r->kind = kind == 'd' ? KEYFLOW__V1__RULE_KIND__RULE_KIND_DEBOUNCE
                          : KEYFLOW__V1__RULE_KIND__RULE_KIND_BATCH;
    r->workflow = kf_arena_strdup(&sim->arena, workflow);
    r->key = kf_arena_strdup(&sim->arena, key);
    return r;
}

kf_cmd_t *sim_flush(sim_t *sim, int kind, const char *workflow, const char *key) {
    Keyflow__V1__FlushWindowRequest *req =
        NEW(Keyflow__V1__FlushWindowRequest, keyflow__v1__flush_window_request__init);
    req->coordinator = ref(sim, kind, workflow, key);
    return sim_exec(sim, KF_OP_FLUSH_WINDOW, &req->base);
}

kf_cmd_t *sim_cancel(sim_t *sim, int kind, const char *workflow, const char *key) {
    Keyflow__V1__CancelWindowRequest *req =
        NEW(Keyflow__V1__CancelWindowRequest, keyflow__v1__cancel_window_request__init);
    req->coordinator = ref(sim, kind, workflow, key);
    return sim_exec(sim, KF_OP_CANCEL_WINDOW, &req->base);
}

kf_cmd_t *sim_describe(sim_t *sim, int kind, const char *workflow, const char *key) {
    Keyflow__V1__DescribeCoordinatorRequest *req = NEW(
        Keyflow__V1__DescribeCoordinatorRequest, keyflow__v1__describe_coordinator_request__init);
    req->coordinator = ref(sim, kind, workflow, key);
    return sim_exec(sim, KF_OP_DESCRIBE_COORDINATOR, &req->base);
}

kf_cmd_t *sim_poll(sim_t *sim, const char *workflow, int64_t lease_ms, int64_t max_runs,
                   int64_t wait_ms) {
    Keyflow__V1__PollRunsRequest *req =
        NEW(Keyflow__V1__PollRunsRequest, keyflow__v1__poll_runs_request__init);
    if (workflow != NULL) {
        req->workflows = kf_arena_alloc(&sim->arena, sizeof(char *));
        req->workflows[0] = kf_arena_strdup(&sim->arena, workflow);
        req->n_workflows = 1;
    }
    req->worker_id = "worker-1";
    req->lease_ms = lease_ms;
    req->max_runs = max_runs;
    req->wait_ms = wait_ms;
    return sim_exec(sim, KF_OP_POLL_RUNS, &req->base);
}

kf_cmd_t *sim_complete(sim_t *sim, const char *run_id, const char *lease, const char *result,
                       const char *error) {
    Keyflow__V1__CompleteRunRequest *req =
        NEW(Keyflow__V1__CompleteRunRequest, keyflow__v1__complete_run_request__init);
    req->run_id = kf_arena_strdup(&sim->arena, run_id);
    req->lease = kf_arena_strdup(&sim->arena, lease);
    if (result != NULL) {
        req->outcome_case = KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_RESULT_JSON;
        req->result_json = kf_arena_strdup(&sim->arena, result);
    } else if (error != NULL) {
        req->outcome_case = KEYFLOW__V1__COMPLETE_RUN_REQUEST__OUTCOME_ERROR;
        req->error = kf_arena_strdup(&sim->arena, error);
    }
    return sim_exec(sim, KF_OP_COMPLETE_RUN, &req->base);
}

kf_cmd_t *sim_release(sim_t *sim, const char *run_id, const char *lease) {
    Keyflow__V1__ReleaseRunRequest *req =
        NEW(Keyflow__V1__ReleaseRunRequest, keyflow__v1__release_run_request__init);
    req->run_id = kf_arena_strdup(&sim->arena, run_id);
    req->lease = kf_arena_strdup(&sim->arena, lease);
    return sim_exec(sim, KF_OP_RELEASE_RUN, &req->base);
}

kf_cmd_t *sim_heartbeat(sim_t *sim, const char *run_id, const char *lease) {
    Keyflow__V1__HeartbeatRunRequest *req =
        NEW(Keyflow__V1__HeartbeatRunRequest, keyflow__v1__heartbeat_run_request__init);
    req->run_id = kf_arena_strdup(&sim->arena, run_id);
    req->lease = kf_arena_strdup(&sim->arena, lease);
    return sim_exec(sim, KF_OP_HEARTBEAT_RUN, &req->base);
}

kf_cmd_t *sim_cancel_run(sim_t *sim, const char *run_id) {
    Keyflow__V1__CancelRunRequest *req =
        NEW(Keyflow__V1__CancelRunRequest, keyflow__v1__cancel_run_request__init);
    req->run_id = kf_arena_strdup(&sim->arena, run_id);
    return sim_exec(sim, KF_OP_CANCEL_RUN, &req->base);
}

kf_cmd_t *sim_get(sim_t *sim, const char *run_id) {
    Keyflow__V1__GetRunRequest *req =
        NEW(Keyflow__V1__GetRunRequest, keyflow__v1__get_run_request__init);
    req->run_id = kf_arena_strdup(&sim->arena, run_id);
    return sim_exec(sim, KF_OP_GET_RUN, &req->base);
}
