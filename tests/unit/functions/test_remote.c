/*
 * test_remote.c - REMOTE functions (functions/remote.c and the pipelined
 * step machine of step.c) over the deterministic engine core: a fake front
 * end link records what the engine sends, the test posts the worker's
 * hello, results and end of stream as worker events, and the manual clock
 * drives call deadlines. The real stream is tested end to end in
 * tests/e2e/test_remote_workers.py.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "../engine/sim.h"
#include "keyflow/v1/functions.pb-c.h"
#include "keyflow/v1/workers.pb-c.h"
#include "proto/json_map.h"

#define DIGEST  "abababababababababababababababababababababababababababababababab"
#define OTHER   "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"
#define MAX_OUT 64

/* The front end's side of one stream, as the engine sees it. */
struct kf_worker_link {
    Keyflow__V1__ServerMessage *sent[MAX_OUT]; /* unpacked, in order */
    int nsent;
    int taken; /* messages next_call() has returned */
    bool closed;
    kf_status_t status;
    char message[KF_ERROR_MESSAGE_BYTES_MAX];
    bool released;
};

static void fake_send(kf_worker_link_t *l, uint8_t *m, size_t len, bool is_call) {
    cr_assert_lt(l->nsent, MAX_OUT);
    Keyflow__V1__ServerMessage *msg = keyflow__v1__server_message__unpack(NULL, len, m);
    cr_assert_not_null(msg);
    cr_assert_eq(is_call, msg->message_case == KEYFLOW__V1__SERVER_MESSAGE__MESSAGE_CALL);
    l->sent[l->nsent++] = msg;
    free(m);
}

static void fake_close(kf_worker_link_t *l, kf_status_t st, const char *message) {
    cr_assert(!l->closed, "closed twice");
    l->closed = true;
    l->status = st;
    snprintf(l->message, sizeof l->message, "%s", message);
}

static void fake_release(kf_worker_link_t *l) {
    cr_assert(!l->released, "released twice");
    l->released = true;
}

static const kf_worker_ops_t fake_ops = {fake_send, fake_close, fake_release};

static sim_t sim;
static kf_worker_link_t links[4];

static void setup(void) {
    sim_open(&sim, 5);
    memset(links, 0, sizeof links);
}

static void teardown(void) {
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
        for (int m = 0; m < links[i].nsent; m++) {
            keyflow__v1__server_message__free_unpacked(links[i].sent[m], NULL);
        }
    }
    sim_close(&sim);
}

TestSuite(remote, .init = setup, .fini = teardown, .timeout = 60);

/* Hands one event to the engine as a front end would (the message packed
 * and unpacked onto the heap, which the engine frees). */
static void post(kf_worker_event_kind_t kind, kf_worker_link_t *link,
                 const Keyflow__V1__WorkerMessage *m) {
    kf_worker_event_t *ev = calloc(1, sizeof *ev);
    ev->kind = kind;
    ev->link = link;
    ev->ops = &fake_ops;
    snprintf(ev->peer, sizeof ev->peer, "ipv4:127.0.0.1:1");
    snprintf(ev->reason, sizeof ev->reason, "the test ended it");
    if (m != NULL) {
        size_t len = keyflow__v1__worker_message__get_packed_size(m);
        uint8_t *buf = malloc(len ? len : 1);
        keyflow__v1__worker_message__pack(m, buf);
        ev->message = &keyflow__v1__worker_message__unpack(NULL, len, buf)->base;
        free(buf);
    }
    kf_core_begin(sim.core, sim.batch, sim.group, sim.now_ms);
    kf_core_worker_events(sim.core, ev);
    sim_step(&sim);
}

static void hello(kf_worker_link_t *link, const char *function_id, const char *digest,
                  int concurrency) {
    Keyflow__V1__WorkerHello h = KEYFLOW__V1__WORKER_HELLO__INIT;
    h.function_id = (char *)function_id;
    h.implementation_digest = (char *)digest;
    h.max_concurrent_calls = concurrency;
    Keyflow__V1__WorkerMessage m = KEYFLOW__V1__WORKER_MESSAGE__INIT;
    m.message_case = KEYFLOW__V1__WORKER_MESSAGE__MESSAGE_HELLO;
    m.hello = &h;
    post(KF_WORKER_HELLO, link, &m);
}

/* A REMOTE running_sum-shaped function "f" (max_batch_rows 2: small calls). */
static void register_remote(const char *runtime) {
    char json[2048];
    snprintf(json, sizeof json,
             "{\"version\":1,\"functionId\":\"f\",\"pipelineStateId\":\"f.v1\",\"runtime\":\"%s\","
             "\"implementationDigest\":\"" DIGEST "\",\"inputSchema\":{\"fields\":["
             "{\"name\":\"user\",\"type\":\"FIELD_TYPE_UTF8\"},"
             "{\"name\":\"ts\",\"type\":\"FIELD_TYPE_TIMESTAMP_US\"},"
             "{\"name\":\"amount\",\"type\":\"FIELD_TYPE_INT64\",\"nullable\":true}]},"
             "\"outputSchema\":{\"fields\":[{\"name\":\"key\",\"type\":\"FIELD_TYPE_UTF8\"},"
             "{\"name\":\"ts\",\"type\":\"FIELD_TYPE_TIMESTAMP_US\"},"
             "{\"name\":\"sum\",\"type\":\"FIELD_TYPE_INT64\",\"nullable\":true}]},"
             "\"keyColumns\":[\"user\"],\"eventTimeColumn\":\"ts\",\"outputEventTimeColumn\":"
             "\"ts\",\"valueStateName\":\"sum\",\"limits\":{\"maxBatchRows\":2%s}}",
             runtime, strcmp(runtime, "RUNTIME_REMOTE") == 0 ? ",\"callTimeoutMs\":500" : "");
    ProtobufCMessage *d;
    kf_error_t err;
    cr_assert_eq(kf_json_to_message(json, strlen(json),
                                    &keyflow__v1__function_descriptor__descriptor, &sim.arena, &d,
                                    &err),
                 KF_OK, "%s", err.message);
    Keyflow__V1__RegisterFunctionRequest *req = kf_arena_zalloc(&sim.arena, sizeof *req);
    keyflow__v1__register_function_request__init(req);
    req->descriptor = (Keyflow__V1__FunctionDescriptor *)d;
    kf_cmd_t *c = sim_exec(&sim, KF_OP_REGISTER_FUNCTION, &req->base);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
}

static kf_cmd_t *push(int64_t seq, const char *rows_json) {
    Keyflow__V1__PushBatchRequest *req = kf_arena_zalloc(&sim.arena, sizeof *req);
    keyflow__v1__push_batch_request__init(req);
    req->function_id = "f";
    req->producer_id = "p";
    req->sequence = seq;
    req->rows_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_ROWS_JSON;
    req->rows_json = kf_arena_strdup(&sim.arena, rows_json);
    return sim_exec(&sim, KF_OP_PUSH_BATCH, &req->base);
}

/* The next call the link received (fails when there is none). */
static Keyflow__V1__HandlerCall *next_call(kf_worker_link_t *l) {
    while (l->taken < l->nsent) {
        Keyflow__V1__ServerMessage *m = l->sent[l->taken++];
        if (m->message_case == KEYFLOW__V1__SERVER_MESSAGE__MESSAGE_CALL) {
            return m->call;
        }
    }
    cr_assert_fail("no call was sent");
    return NULL;
}

static int calls_waiting(const kf_worker_link_t *l) {
    int n = 0;
    for (int i = l->taken; i < l->nsent; i++) {
        n += l->sent[i]->message_case == KEYFLOW__V1__SERVER_MESSAGE__MESSAGE_CALL;
    }
    return n;
}

/* running_sum's answer to a call: SET prior + amount, one row each. */
static void answer(kf_worker_link_t *l, const Keyflow__V1__HandlerCall *c) {
    size_t n = c->n_activation_ids;
    Keyflow__V1__CallResult r = KEYFLOW__V1__CALL_RESULT__INIT;
    r.call_id = c->call_id;
    Keyflow__V1__Mutation muts[8];
    int64_t values[8], sums[8];
    uint32_t acts[8];
    cr_assert_leq(n, 8);
    for (size_t i = 0; i < n; i++) {
        int64_t base =
            c->states[i] == KEYFLOW__V1__STATE_KIND__STATE_KIND_VALUE ? c->state_values[i] : 0;
        muts[i] = KEYFLOW__V1__MUTATION__MUTATION_SET;
        values[i] = sums[i] = base + c->rows->columns[2]->int64s->values[i];
        acts[i] = (uint32_t)i;
    }
    r.n_mutations = r.n_state_values = n;
    r.mutations = muts;
    r.state_values = values;
    Keyflow__V1__StringValues keys = KEYFLOW__V1__STRING_VALUES__INIT;
    keys.n_values = n;
    keys.values = c->key_texts;
    Keyflow__V1__Int64Values ts = KEYFLOW__V1__INT64_VALUES__INIT;
    ts.n_values = n;
    ts.values = c->event_times_us;
    Keyflow__V1__Int64Values sum = KEYFLOW__V1__INT64_VALUES__INIT;
    sum.n_values = n;
    sum.values = sums;
    Keyflow__V1__Column cols[3] = {KEYFLOW__V1__COLUMN__INIT, KEYFLOW__V1__COLUMN__INIT,
                                   KEYFLOW__V1__COLUMN__INIT};
    cols[0].values_case = KEYFLOW__V1__COLUMN__VALUES_STRINGS;
    cols[0].strings = &keys;
    cols[1].values_case = KEYFLOW__V1__COLUMN__VALUES_INT64S;
    cols[1].int64s = &ts;
    cols[2].values_case = KEYFLOW__V1__COLUMN__VALUES_INT64S;
    cols[2].int64s = &sum;
    Keyflow__V1__Column *colp[3] = {&cols[0], &cols[1], &cols[2]};
    Keyflow__V1__RowBatch out = KEYFLOW__V1__ROW_BATCH__INIT;
    out.row_count = (int64_t)n;
    out.n_columns = 3;
    out.columns = colp;
    r.output = &out;
    r.n_output_activations = n;
    r.output_activations = acts;
    Keyflow__V1__WorkerMessage m = KEYFLOW__V1__WORKER_MESSAGE__INIT;
    m.message_case = KEYFLOW__V1__WORKER_MESSAGE__MESSAGE_RESULT;
    m.result = &r;
    post(KF_WORKER_RESULT, l, &m);
}

#define ROW(k, ts, amount) "{\"user\":\"" k "\",\"ts\":" #ts ",\"amount\":" #amount "}"

static Keyflow__V1__GetKeyStateResponse *state_of(const char *key) {
    Keyflow__V1__GetKeyStateRequest *req = kf_arena_zalloc(&sim.arena, sizeof *req);
    keyflow__v1__get_key_state_request__init(req);
    req->function_id = "f";
    req->key = (char *)key;
    kf_cmd_t *c = sim_exec(&sim, KF_OP_GET_KEY_STATE, &req->base);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    return (Keyflow__V1__GetKeyStateResponse *)c->response;
}

static Keyflow__V1__ReadOutputResponse *output(void) {
    Keyflow__V1__ReadOutputRequest *req = kf_arena_zalloc(&sim.arena, sizeof *req);
    keyflow__v1__read_output_request__init(req);
    req->function_id = "f";
    req->limit = 100;
    kf_cmd_t *c = sim_exec(&sim, KF_OP_READ_OUTPUT, &req->base);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    return (Keyflow__V1__ReadOutputResponse *)c->response;
}

Test(remote, hellos_are_checked_and_every_link_is_released) {
    register_remote("RUNTIME_REMOTE");
    hello(&links[0], "f", OTHER, 1);
    cr_assert(links[0].closed);
    cr_assert_eq(links[0].status, KF_E_PRECONDITION, "%s", links[0].message);
    cr_assert_not_null(strstr(links[0].message, "implementation_digest"));
    hello(&links[1], "nope", DIGEST, 1);
    cr_assert_eq(links[1].status, KF_E_NOT_FOUND, "%s", links[1].message);
    hello(&links[2], "f", DIGEST, KF_WORKER_CONCURRENCY_MAX + 1);
    cr_assert_eq(links[2].status, KF_E_INVALID, "%s", links[2].message);
    for (int i = 0; i < 3; i++) {
        cr_assert(!links[i].released, "held until the stream's end");
        post(KF_WORKER_GONE, &links[i], NULL);
        cr_assert(links[i].released);
    }
    kf_cmd_t *c = push(1, "[" ROW("a", 1, 1) "]");
    cr_assert_eq(c->error.status, KF_E_UNAVAILABLE, "%s", c->error.message);
    cr_assert_not_null(strstr(c->error.message, "no worker serves f"));
    hello(&links[3], "f", DIGEST, 2);
    cr_assert(!links[3].closed);
    cr_assert_eq(links[3].sent[0]->message_case, KEYFLOW__V1__SERVER_MESSAGE__MESSAGE_WELCOME);
    cr_assert_eq(links[3].sent[0]->welcome->max_concurrent_calls, 2);
    cr_assert_eq(links[3].sent[0]->welcome->descriptor->limits->call_timeout_ms, 500);
}

/* With room for three calls, a step sends every call whose keys are free:
 * the second "a" waits for the call holding the first, "e" goes ahead of
 * it. Answered in reverse order, the output still follows the input, and
 * activation ids are the rows'. */
Test(remote, calls_are_pipelined_and_output_keeps_input_order) {
    register_remote("RUNTIME_REMOTE");
    hello(&links[0], "f", DIGEST, 3);
    kf_cmd_t *c = push(1, "[" ROW("a", 1, 1) "," ROW("b", 2, 2) "," ROW("c", 3, 3) "," ROW(
                              "d", 4, 4) "," ROW("a", 5, 10) "," ROW("e", 6, 6) "]");
    cr_assert_null(c->response);
    cr_assert_eq(calls_waiting(&links[0]), 3, "three calls out at once");
    Keyflow__V1__HandlerCall *c1 = next_call(&links[0]);
    Keyflow__V1__HandlerCall *c2 = next_call(&links[0]);
    Keyflow__V1__HandlerCall *c3 = next_call(&links[0]);
    cr_assert_str_eq(c1->key_texts[0], "a");
    cr_assert_str_eq(c2->key_texts[0], "c");
    cr_assert_eq(c3->n_activation_ids, 1);
    cr_assert_str_eq(c3->key_texts[0], "e");
    cr_assert_eq(c3->activation_ids[0], 6, "the row's id, not the call's order");
    answer(&links[0], c3);
    answer(&links[0], c2);
    cr_assert_null(c->response, "the oldest call is still out");
    cr_assert_eq(calls_waiting(&links[0]), 0, "the second a waits for the first");
    answer(&links[0], c1);
    Keyflow__V1__HandlerCall *c4 = next_call(&links[0]);
    cr_assert_str_eq(c4->key_texts[0], "a");
    cr_assert_eq(c4->activation_ids[0], 5);
    cr_assert_eq(c4->states[0], KEYFLOW__V1__STATE_KIND__STATE_KIND_VALUE);
    cr_assert_eq(c4->state_values[0], 1, "it sees the state the first a left");
    answer(&links[0], c4);
    cr_assert_eq(c->error.status, KF_OK, "%s", c->error.message);
    Keyflow__V1__ReadOutputResponse *out = output();
    const char *want_keys[] = {"a", "b", "c", "d", "a", "e"};
    const int64_t want_sums[] = {1, 2, 3, 4, 11, 6};
    cr_assert_eq(out->batch->row_count, 6);
    for (int i = 0; i < 6; i++) {
        cr_assert_str_eq(out->batch->columns[0]->strings->values[i], want_keys[i]);
        cr_assert_eq(out->batch->columns[2]->int64s->values[i], want_sums[i]);
    }
    cr_assert_eq(state_of("a")->value, 11);
}

Test(remote, a_missed_deadline_fails_the_batch_and_closes_the_worker) {
    register_remote("RUNTIME_REMOTE");
    hello(&links[0], "f", DIGEST, 2);
    kf_cmd_t *c = push(1, "[" ROW("a", 1, 1) "," ROW("b", 2, 2) "," ROW("c", 3, 3) "]");
    Keyflow__V1__HandlerCall *c1 = next_call(&links[0]);
    answer(&links[0], c1); /* the first call is applied; the second is not answered */
    cr_assert_null(c->response);
    sim_advance(&sim, sim.now_ms + 499);
    cr_assert_null(c->response, "not yet due");
    sim_advance(&sim, sim.now_ms + 1);
    cr_assert_eq(c->error.status, KF_E_TIMEOUT, "%s", c->error.message);
    cr_assert_not_null(strstr(c->error.message, "within 500 ms"), "%s", c->error.message);
    cr_assert(links[0].closed);
    cr_assert_eq(links[0].status, KF_E_TIMEOUT);
    cr_assert_eq(state_of("a")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT,
                 "nothing of the batch, the answered call included");
    post(KF_WORKER_GONE, &links[0], NULL);
    cr_assert(links[0].released);
}

Test(remote, a_lost_worker_or_a_stray_result_fails_the_batch) {
    register_remote("RUNTIME_REMOTE");
    hello(&links[0], "f", DIGEST, 1);
    hello(&links[1], "f", DIGEST, 1);
    kf_cmd_t *c = push(1, "[" ROW("a", 1, 1) "," ROW("b", 2, 2) "," ROW("c", 3, 3) "]");
    cr_assert_eq(calls_waiting(&links[0]) + calls_waiting(&links[1]), 2, "one call each");
    post(KF_WORKER_GONE, &links[1], NULL);
    cr_assert(links[1].released);
    cr_assert_eq(c->error.status, KF_E_UNAVAILABLE, "%s", c->error.message);
    cr_assert_not_null(strstr(c->error.message, "was lost"), "%s", c->error.message);
    /* Its call's result from the other worker comes later: dropped. */
    if (calls_waiting(&links[0]) > 0) {
        answer(&links[0], next_call(&links[0]));
    }
    cr_assert_eq(state_of("a")->state, KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT);
    /* The retry goes to the remaining worker; a result for no call ends it. */
    kf_cmd_t *retry = push(1, "[" ROW("a", 1, 1) "]");
    Keyflow__V1__HandlerCall *call = next_call(&links[0]);
    call->call_id += 100;
    answer(&links[0], call);
    cr_assert(links[0].closed);
    cr_assert_eq(links[0].status, KF_E_PRECONDITION, "%s", links[0].message);
    cr_assert_eq(retry->error.status, KF_E_UNAVAILABLE, "%s", retry->error.message);
    post(KF_WORKER_GONE, &links[0], NULL);
    cr_assert(links[0].released);
}

Test(remote, shutdown_fails_what_is_out_and_releases_every_link) {
    register_remote("RUNTIME_REMOTE");
    hello(&links[0], "f", DIGEST, 1);
    hello(&links[1], "f", OTHER, 1); /* refused, still held */
    kf_cmd_t *c = push(1, "[" ROW("a", 1, 1) "]");
    kf_cmd_t *queued = push(2, "[" ROW("b", 2, 2) "]");
    cr_assert_null(c->response);
    kf_core_begin(sim.core, sim.batch, sim.group, sim.now_ms);
    kf_core_shutdown(sim.core);
    sim_step(&sim);
    cr_assert_eq(c->error.status, KF_E_UNAVAILABLE, "%s", c->error.message);
    cr_assert_eq(queued->error.status, KF_E_UNAVAILABLE, "%s", queued->error.message);
    cr_assert(links[0].closed && links[0].released && links[1].released);
    cr_assert_not_null(strstr(links[0].message, "shutting down"));
}
