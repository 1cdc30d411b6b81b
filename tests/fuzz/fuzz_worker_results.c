/*
 * fuzz_worker_results.c - libFuzzer harness: what a remote handler worker
 * sends keyflowd (service/functions/remote.c, the results a step takes in
 * step.c), decoded the way the gRPC front end decodes it (kf_wire_check,
 * then protobuf-c) and handed to the engine core as worker events.
 *
 * Each input runs on a fresh core over a memory store: a REMOTE function
 * (running_sum's schemas plus a declared timer "t", max_batch_rows 2) is
 * registered, a fake link says hello with 4 calls at once, and a batch of
 * six rows over three keys is pushed, so several calls are out. The input
 * is then a sequence of messages: a selector byte (bit 7: send the bytes
 * as they are; otherwise its low bits pick a call that is out, whose id
 * replaces the message's call_id), a length byte, and that many bytes of a
 * keyflow.v1.WorkerMessage. A message the front end could not read ends
 * the stream, as it would. Finally the stream ends (GONE).
 *
 * Checks: nothing crashes; the batch is answered by the end; when it was
 * refused, no key has state and no output row exists (nothing applied);
 * every link is released exactly once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/log.h"
#include "core/core.h"
#include "keyflow/v1/functions.pb-c.h"
#include "keyflow/v1/workers.pb-c.h"
#include "proto/json_map.h"
#include "rpc/wire_check.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define DIGEST         "abababababababababababababababababababababababababababababababab"
#define CALLS_SEEN_MAX 64

struct kf_worker_link {
    uint64_t call_ids[CALLS_SEEN_MAX]; /* every call sent, in order */
    int ncalls;
    int releases;
    bool closed;
};

static void link_send(kf_worker_link_t *l, uint8_t *m, size_t len, bool is_call) {
    Keyflow__V1__ServerMessage *msg = keyflow__v1__server_message__unpack(NULL, len, m);
    if (msg == NULL) {
        abort(); /* the engine packs what it sends */
    }
    if (is_call && l->ncalls < CALLS_SEEN_MAX) {
        l->call_ids[l->ncalls++] = msg->call->call_id;
    }
    keyflow__v1__server_message__free_unpacked(msg, NULL);
    free(m);
}

static void link_close(kf_worker_link_t *l, kf_status_t st, const char *message) {
    (void)st;
    (void)message;
    l->closed = true;
}

static void link_release(kf_worker_link_t *l) {
    l->releases++;
}

static const kf_worker_ops_t ops = {link_send, link_close, link_release};

static int64_t now_ms = 1700000000000;
static const uint64_t rng_seed = 7;

static const char descriptor_json[] =
    "{\"version\":1,\"functionId\":\"f\",\"pipelineStateId\":\"f.v1\",\"runtime\":"
    "\"RUNTIME_REMOTE\",\"implementationDigest\":\"" DIGEST "\",\"inputSchema\":{\"fields\":["
    "{\"name\":\"user\",\"type\":\"FIELD_TYPE_UTF8\"},"
    "{\"name\":\"ts\",\"type\":\"FIELD_TYPE_TIMESTAMP_US\"},"
    "{\"name\":\"amount\",\"type\":\"FIELD_TYPE_INT64\",\"nullable\":true}]},"
    "\"outputSchema\":{\"fields\":[{\"name\":\"key\",\"type\":\"FIELD_TYPE_UTF8\"},"
    "{\"name\":\"ts\",\"type\":\"FIELD_TYPE_TIMESTAMP_US\"},"
    "{\"name\":\"sum\",\"type\":\"FIELD_TYPE_INT64\",\"nullable\":true},"
    "{\"name\":\"previous\",\"type\":\"FIELD_TYPE_UTF8\"}]},"
    "\"keyColumns\":[\"user\"],\"eventTimeColumn\":\"ts\",\"outputEventTimeColumn\":\"ts\","
    "\"valueStateName\":\"sum\",\"timerNames\":[\"t\"],\"limits\":{\"maxBatchRows\":2}}";

static const char *const keys[] = {"a", "b", "c"};

typedef struct world {
    kf_memdisk_t *disk;
    kf_store_t *store;
    kf_core_t *core;
    kf_batch_t *batch;
    kf_arena_t arena;
    kf_engine_config_t config;
} world_t;

static void die(const char *what, const kf_error_t *err) {
    fprintf(stderr, "WORKER_RESULTS: %s: %s\n", what, err ? err->message : "");
    abort();
}

/* Writes the core's batch and tells it the group is durable. */
static void step(world_t *w) {
    kf_error_t err;
    if (kf_batch_count(w->batch) > 0 && kf_store_write(w->store, w->batch, &err) != KF_OK) {
        die("write", &err);
    }
    kf_batch_clear(w->batch);
    kf_core_take_ready(w->core);
    kf_core_durable(w->core, 1);
}

static kf_cmd_t *run(world_t *w, kf_op_t op, const ProtobufCMessage *request) {
    kf_cmd_t *cmd = kf_arena_zalloc(&w->arena, sizeof *cmd);
    cmd->op = op;
    cmd->request = request;
    cmd->arena = &w->arena;
    kf_core_begin(w->core, w->batch, 1, now_ms);
    kf_core_execute(w->core, cmd);
    step(w);
    return cmd;
}

static void post(world_t *w, kf_worker_event_kind_t kind, kf_worker_link_t *link,
                 ProtobufCMessage *message) {
    kf_worker_event_t *ev = calloc(1, sizeof *ev);
    ev->kind = kind;
    ev->link = link;
    ev->ops = &ops;
    ev->message = message;
    snprintf(ev->reason, sizeof ev->reason, "fuzz");
    kf_core_begin(w->core, w->batch, 1, now_ms);
    kf_core_worker_events(w->core, ev);
    step(w);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    kf_log_set_level(KF_LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    world_t w = {0};
    kf_error_t err;
    w.config.clock = kf_clock_manual(&now_ms);
    w.config.rng_seed = &rng_seed;
    w.config.rng_seed_len = sizeof rng_seed;
    w.disk = kf_memdisk_create();
    if (kf_store_open_mem(w.disk, NULL, &w.store, &err) != KF_OK ||
        kf_core_create(&w.config, w.store, &w.core, &err) != KF_OK) {
        die("open", &err);
    }
    w.batch = kf_batch_create(w.store);
    kf_arena_init(&w.arena, 0);

    ProtobufCMessage *d;
    if (kf_json_to_message(descriptor_json, sizeof descriptor_json - 1,
                           &keyflow__v1__function_descriptor__descriptor, &w.arena, &d,
                           &err) != KF_OK) {
        die("descriptor", &err);
    }
    Keyflow__V1__RegisterFunctionRequest reg = KEYFLOW__V1__REGISTER_FUNCTION_REQUEST__INIT;
    reg.descriptor = (Keyflow__V1__FunctionDescriptor *)d;
    if (run(&w, KF_OP_REGISTER_FUNCTION, &reg.base)->error.status != KF_OK) {
        die("register", NULL);
    }

    kf_worker_link_t link = {0};
    Keyflow__V1__WorkerHello hello = KEYFLOW__V1__WORKER_HELLO__INIT;
    hello.function_id = "f";
    hello.implementation_digest = DIGEST;
    hello.max_concurrent_calls = 4;
    Keyflow__V1__WorkerMessage hm = KEYFLOW__V1__WORKER_MESSAGE__INIT;
    hm.message_case = KEYFLOW__V1__WORKER_MESSAGE__MESSAGE_HELLO;
    hm.hello = &hello;
    uint8_t buf[256];
    size_t len = keyflow__v1__worker_message__pack(&hm, buf);
    post(&w, KF_WORKER_HELLO, &link, &keyflow__v1__worker_message__unpack(NULL, len, buf)->base);

    Keyflow__V1__PushBatchRequest *push = kf_arena_zalloc(&w.arena, sizeof *push);
    keyflow__v1__push_batch_request__init(push);
    push->function_id = "f";
    push->producer_id = "p";
    push->sequence = 1;
    push->rows_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_ROWS_JSON;
    push->rows_json =
        "[{\"user\":\"a\",\"ts\":1,\"amount\":1},{\"user\":\"b\",\"ts\":2,\"amount\":2},"
        "{\"user\":\"c\",\"ts\":3,\"amount\":null},{\"user\":\"a\",\"ts\":4,"
        "\"amount\":4},{\"user\":\"b\",\"ts\":5,\"amount\":5},{\"user\":\"c\","
        "\"ts\":6,\"amount\":6}]";
    push->watermark_present_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US;
    push->watermark_us = 3;
    kf_cmd_t *cmd = run(&w, KF_OP_PUSH_BATCH, &push->base);

    const uint8_t *p = data, *end = data + size;
    int results = 0;
    while (end - p >= 2 && !link.closed) {
        uint8_t selector = *p++;
        size_t n = *p++;
        if ((size_t)(end - p) < n) {
            n = (size_t)(end - p);
        }
        /* As the front end reads a message: checked, then unpacked. */
        kf_error_t werr;
        Keyflow__V1__WorkerMessage *m = NULL;
        if (kf_wire_check(&keyflow__v1__worker_message__descriptor, p, n, &werr) == KF_OK) {
            m = keyflow__v1__worker_message__unpack(NULL, n, p);
        }
        p += n;
        /* The front end ends the stream on what it cannot read, on a
         * second hello, and on more results than calls it carried. */
        if (m == NULL || m->message_case != KEYFLOW__V1__WORKER_MESSAGE__MESSAGE_RESULT ||
            ++results > link.ncalls) {
            if (m != NULL) {
                keyflow__v1__worker_message__free_unpacked(m, NULL);
            }
            break;
        }
        if (!(selector & 0x80)) {
            m->result->call_id = link.call_ids[(selector & 0x7f) % link.ncalls];
        }
        post(&w, KF_WORKER_RESULT, &link, &m->base);
    }
    post(&w, KF_WORKER_GONE, &link, NULL);
    if (link.releases != 1) {
        die("the link was not released exactly once", NULL);
    }
    if (cmd->error.status == KF_OK && cmd->response == NULL) {
        die("the batch was never answered", NULL);
    }
    if (cmd->error.status != KF_OK) {
        /* Refused: nothing of it may show. */
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
            Keyflow__V1__GetKeyStateRequest *q = kf_arena_zalloc(&w.arena, sizeof *q);
            keyflow__v1__get_key_state_request__init(q);
            q->function_id = "f";
            q->key = (char *)keys[i];
            kf_cmd_t *s = run(&w, KF_OP_GET_KEY_STATE, &q->base);
            const Keyflow__V1__GetKeyStateResponse *r = (const void *)s->response;
            if (r == NULL || r->state != KEYFLOW__V1__STATE_KIND__STATE_KIND_ABSENT ||
                r->n_timers != 0) {
                die("a refused batch left state behind", NULL);
            }
        }
        Keyflow__V1__ReadOutputRequest *q = kf_arena_zalloc(&w.arena, sizeof *q);
        keyflow__v1__read_output_request__init(q);
        q->function_id = "f";
        kf_cmd_t *o = run(&w, KF_OP_READ_OUTPUT, &q->base);
        const Keyflow__V1__ReadOutputResponse *r = (const void *)o->response;
        if (r == NULL || r->high_water_seq != 0) {
            die("a refused batch left output behind", NULL);
        }
    }
    kf_core_destroy(w.core);
    kf_batch_destroy(w.batch);
    kf_arena_deinit(&w.arena);
    kf_store_close(w.store);
    kf_memdisk_destroy(w.disk);
    return 0;
}
