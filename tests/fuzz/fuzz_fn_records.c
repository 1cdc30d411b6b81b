/*
 * fuzz_fn_records.c - libFuzzer harness: the stored records of process
 * functions as recovery and reads decode them (service/functions/
 * recovery.c, output.c): descriptors, checkpoints, value state, timers by
 * key and by time, producers with their stored acknowledgements, output
 * chunks, and the function index counter.
 *
 * Once, a store is filled the ordinary way: the example handlers
 * running_sum and session_counter registered, batches pushed (state,
 * timers, output, producers). Each input then edits a copy of those
 * records - an op byte (low 2 bits: 0 replace a value, 1 delete a record,
 * 2 add a record under a function's prefix, 3 xor one byte of a value;
 * the rest picks the family), a record number, then lengths and bytes - and
 * a new engine core recovers from it. Recovery must answer KF_OK or
 * KF_E_CORRUPT, never crash; after KF_OK every function, key state and the
 * output stream are read, and a batch is pushed, which must not crash
 * either. Bit 0 of the first byte loads the handlers (slower, but the
 * push then runs them over the recovered state).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/log.h"
#include "core/core.h"
#include "keyflow/v1/functions.pb-c.h"
#include "proto/json_map.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The families recovery and reads of functions decode. */
static const kf_cf_t families[] = {
    KF_CF_FUNCTIONS,      KF_CF_CHECKPOINTS, KF_CF_STATE,     KF_CF_TIMERS_BY_KEY,
    KF_CF_TIMERS_BY_TIME, KF_CF_OUTPUT,      KF_CF_PRODUCERS, KF_CF_META,
};
#define NFAMILIES (sizeof families / sizeof families[0])

typedef struct record {
    kf_cf_t cf;
    uint8_t *key;
    size_t key_len;
    uint8_t *value;
    size_t value_len;
} record_t;

static record_t *base;
static size_t nbase;
static int64_t now_ms = 1700000000000;
static const uint64_t rng_seed = 7;

static void die(const char *what, const kf_error_t *err) {
    fprintf(stderr, "FN_RECORDS: %s: %s\n", what, err ? err->message : "");
    abort();
}

static kf_engine_config_t config(const char *plugin_dir) {
    kf_engine_config_t c = {0};
    c.clock = kf_clock_manual(&now_ms);
    c.rng_seed = &rng_seed;
    c.rng_seed_len = sizeof rng_seed;
    c.plugin_dir = plugin_dir;
    return c;
}

static kf_cmd_t *run(kf_core_t *core, kf_batch_t *batch, kf_arena_t *arena, kf_op_t op,
                     const ProtobufCMessage *request) {
    kf_cmd_t *cmd = kf_arena_zalloc(arena, sizeof *cmd);
    cmd->op = op;
    cmd->request = request;
    cmd->arena = arena;
    kf_core_begin(core, batch, 1, now_ms);
    kf_core_execute(core, cmd);
    return cmd;
}

static kf_cmd_t *push(kf_core_t *core, kf_batch_t *batch, kf_arena_t *arena, const char *fn,
                      const char *producer, int64_t seq, const char *rows, int64_t watermark) {
    Keyflow__V1__PushBatchRequest *req = kf_arena_zalloc(arena, sizeof *req);
    keyflow__v1__push_batch_request__init(req);
    req->function_id = (char *)fn;
    req->producer_id = (char *)producer;
    req->sequence = seq;
    req->rows_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_ROWS_JSON;
    req->rows_json = (char *)rows;
    req->watermark_present_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US;
    req->watermark_us = watermark;
    return run(core, batch, arena, KF_OP_PUSH_BATCH, &req->base);
}

static void write_batch(kf_store_t *store, kf_batch_t *batch) {
    kf_error_t err;
    if (kf_batch_count(batch) > 0 && kf_store_write(store, batch, &err) != KF_OK) {
        die("write", &err);
    }
    kf_batch_clear(batch);
}

/* Registers the example handlers and pushes a few batches, then keeps
 * every record of the store as the base each input edits. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    kf_log_set_level(KF_LOG_ERROR);
    kf_memdisk_t *disk = kf_memdisk_create();
    kf_store_t *store;
    kf_core_t *core;
    kf_error_t err;
    kf_engine_config_t c = config(KF_FUZZ_HANDLER_DIR);
    if (kf_store_open_mem(disk, NULL, &store, &err) != KF_OK ||
        kf_core_create(&c, store, &core, &err) != KF_OK) {
        die("setup", &err);
    }
    kf_batch_t *batch = kf_batch_create(store);
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    const char *names[] = {"running_sum", "session_counter"};
    for (int i = 0; i < 2; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.descriptor.json", KF_FUZZ_HANDLER_DIR, names[i]);
        FILE *f = fopen(path, "rb");
        char text[8192];
        size_t len = f ? fread(text, 1, sizeof text, f) : 0;
        if (f) {
            fclose(f);
        }
        ProtobufCMessage *desc;
        if (kf_json_to_message(text, len, &keyflow__v1__function_descriptor__descriptor, &arena,
                               &desc, &err) != KF_OK) {
            die(path, &err);
        }
        Keyflow__V1__RegisterFunctionRequest *req = kf_arena_zalloc(&arena, sizeof *req);
        keyflow__v1__register_function_request__init(req);
        req->descriptor = (Keyflow__V1__FunctionDescriptor *)desc;
        kf_cmd_t *cmd = run(core, batch, &arena, KF_OP_REGISTER_FUNCTION, &req->base);
        if (cmd->error.status != KF_OK) {
            die("register", &cmd->error);
        }
        write_batch(store, batch);
    }
    const char *rs_rows[] = {
        "[{\"user\":\"ann\",\"ts\":10,\"amount\":5},{\"user\":\"bo\",\"ts\":11,\"amount\":null}]",
        "[{\"user\":\"ann\",\"ts\":20,\"amount\":7},{\"user\":\"x\",\"ts\":21,\"amount\":-3}]",
    };
    const char *sc_rows[] = {
        "[{\"user\":\"ann\",\"ts\":10,\"idle_us\":100},{\"user\":\"bo\",\"ts\":11}]",
        "[{\"user\":\"ann\",\"ts\":300,\"idle_us\":50},{\"user\":\"cy\",\"ts\":301,\"idle_us\":9}]",
    };
    for (int i = 0; i < 2; i++) {
        kf_cmd_t *a = push(core, batch, &arena, "running_sum", i ? "p2" : "p1", i + 1, rs_rows[i],
                           15 + i * 10);
        kf_cmd_t *b =
            push(core, batch, &arena, "session_counter", "p1", i + 1, sc_rows[i], 200 + i * 100);
        if (a->error.status != KF_OK || b->error.status != KF_OK) {
            die("push", a->error.status != KF_OK ? &a->error : &b->error);
        }
        write_batch(store, batch);
    }
    kf_batch_destroy(batch);
    kf_core_destroy(core);
    kf_arena_deinit(&arena);
    for (int cf = 0; cf < KF_CF_COUNT; cf++) {
        kf_iter_t *it;
        if (kf_iter_create(store, (kf_cf_t)cf, NULL, 0, NULL, 0, &it, &err) != KF_OK) {
            die("iterate", &err);
        }
        for (kf_iter_seek_first(it); kf_iter_valid(it); kf_iter_next(it)) {
            base = realloc(base, (nbase + 1) * sizeof *base);
            record_t *r = &base[nbase++];
            const void *k = kf_iter_key(it, &r->key_len);
            const void *v = kf_iter_value(it, &r->value_len);
            r->cf = (kf_cf_t)cf;
            r->key = malloc(r->key_len + 1);
            r->value = malloc(r->value_len + 1);
            memcpy(r->key, k, r->key_len);
            memcpy(r->value, v, r->value_len);
        }
        kf_iter_destroy(it);
    }
    kf_store_close(store);
    kf_memdisk_destroy(disk);
    return 0;
}

/* Reads a byte; 0 past the end. */
static uint8_t next(const uint8_t **p, const uint8_t *end) {
    return *p < end ? *(*p)++ : 0;
}

/* Takes up to n bytes; *got says how many. */
static const uint8_t *take(const uint8_t **p, const uint8_t *end, size_t n, size_t *got) {
    const uint8_t *at = *p;
    *got = (size_t)(end - at) < n ? (size_t)(end - at) : n;
    *p += *got;
    return at;
}

/* The base records of the functions' families. */
static record_t *nth_record(uint8_t n) {
    size_t count = 0;
    for (size_t i = 0; i < nbase; i++) {
        for (size_t f = 0; f < NFAMILIES; f++) {
            count += base[i].cf == families[f];
        }
    }
    if (count == 0) {
        return NULL;
    }
    size_t want = n % count;
    for (size_t i = 0; i < nbase; i++) {
        for (size_t f = 0; f < NFAMILIES; f++) {
            if (base[i].cf == families[f] && want-- == 0) {
                return &base[i];
            }
        }
    }
    return NULL;
}

static void exercise(kf_core_t *core, kf_store_t *store) {
    kf_arena_t arena;
    kf_arena_init(&arena, 256 * 1024 * 1024);
    kf_batch_t *batch = kf_batch_create(store);
    const char *fns[] = {"running_sum", "session_counter"};
    const char *keys[] = {"ann", "bo", "x", "cy", "[\"ann\"]", ""};
    for (int f = 0; f < 2; f++) {
        Keyflow__V1__GetFunctionRequest get = KEYFLOW__V1__GET_FUNCTION_REQUEST__INIT;
        get.function_id = (char *)fns[f];
        (void)run(core, batch, &arena, KF_OP_GET_FUNCTION, &get.base);
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            Keyflow__V1__GetKeyStateRequest ks = KEYFLOW__V1__GET_KEY_STATE_REQUEST__INIT;
            ks.function_id = (char *)fns[f];
            ks.key = (char *)keys[k];
            (void)run(core, batch, &arena, KF_OP_GET_KEY_STATE, &ks.base);
        }
        for (int format = 0; format < 3; format++) {
            Keyflow__V1__ReadOutputRequest read = KEYFLOW__V1__READ_OUTPUT_REQUEST__INIT;
            read.function_id = (char *)fns[f];
            read.after_seq = format == 2 ? 1 : 0;
            read.format = (Keyflow__V1__RowFormat)format;
            (void)run(core, batch, &arena, KF_OP_READ_OUTPUT, &read.base);
        }
    }
    Keyflow__V1__ListFunctionsRequest list = KEYFLOW__V1__LIST_FUNCTIONS_REQUEST__INIT;
    (void)run(core, batch, &arena, KF_OP_LIST_FUNCTIONS, &list.base);
    (void)push(core, batch, &arena, "running_sum", "p1", 3,
               "[{\"user\":\"ann\",\"ts\":40,\"amount\":1},{\"user\":\"bo\",\"ts\":41,"
               "\"amount\":2}]",
               1000);
    (void)push(core, batch, &arena, "running_sum", "p2", 2, "[]", 1000); /* a retry: stored ack */
    (void)push(core, batch, &arena, "session_counter", "p1", 3,
               "[{\"user\":\"bo\",\"ts\":900,\"idle_us\":1}]", 100000);
    kf_error_t err;
    if (kf_batch_count(batch) > 0) {
        (void)kf_store_write(store, batch, &err);
    }
    (void)kf_core_take_ready(core);
    kf_core_durable(core, 1);
    kf_batch_destroy(batch);
    kf_arena_deinit(&arena);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) {
        return 0;
    }
    const uint8_t *p = data, *end = data + size;
    bool handlers = next(&p, end) & 1;
    kf_memdisk_t *disk = kf_memdisk_create();
    kf_store_t *store;
    kf_error_t err;
    if (kf_store_open_mem(disk, NULL, &store, &err) != KF_OK) {
        die("open", &err);
    }
    /* Edits first (on copies of the values), then the base written once. */
    bool *dropped = calloc(nbase + 1, sizeof *dropped);
    uint8_t **values = calloc(nbase + 1, sizeof *values);
    size_t *lens = calloc(nbase + 1, sizeof *lens);
    kf_batch_t *batch = kf_batch_create(store);
    for (int ops = 0; p < end && ops < 16; ops++) {
        uint8_t op = next(&p, end);
        record_t *r = nth_record(next(&p, end));
        size_t i = r ? (size_t)(r - base) : 0;
        size_t n;
        const uint8_t *bytes;
        switch (op & 3) {
        case 0: /* replace a value */
            bytes = take(&p, end, next(&p, end), &n);
            if (r) {
                free(values[i]);
                values[i] = malloc(n + 1);
                memcpy(values[i], bytes, n);
                lens[i] = n;
            }
            break;
        case 1: /* delete a record */
            if (r) {
                dropped[i] = true;
            }
            break;
        case 2: { /* a new record under a function's prefix (index 0..3) */
            uint8_t key[4 + 255];
            key[0] = key[1] = key[2] = 0;
            key[3] = (op >> 2) & 3;
            const uint8_t *k = take(&p, end, next(&p, end), &n);
            memcpy(key + 4, k, n);
            size_t vn;
            const uint8_t *v = take(&p, end, next(&p, end), &vn);
            kf_batch_put(batch, families[(op >> 4) % NFAMILIES], key, 4 + n, v, vn);
            break;
        }
        case 3: /* xor one byte of a value */
            if (r) {
                if (values[i] == NULL) {
                    values[i] = malloc(r->value_len + 1);
                    memcpy(values[i], r->value, r->value_len);
                    lens[i] = r->value_len;
                }
                uint8_t at = next(&p, end), x = next(&p, end);
                if (lens[i] > 0) {
                    values[i][at % lens[i]] ^= x ? x : 0x80;
                }
            }
            break;
        }
    }
    kf_batch_t *all = kf_batch_create(store);
    for (size_t i = 0; i < nbase; i++) {
        if (!dropped[i]) {
            kf_batch_put(all, base[i].cf, base[i].key, base[i].key_len,
                         values[i] ? values[i] : base[i].value,
                         values[i] ? lens[i] : base[i].value_len);
        }
    }
    write_batch(store, all);
    write_batch(store, batch); /* the added records win over the base */
    kf_batch_destroy(all);
    kf_batch_destroy(batch);
    for (size_t i = 0; i < nbase; i++) {
        free(values[i]);
    }
    free(values);
    free(lens);
    free(dropped);

    kf_engine_config_t c = config(handlers ? KF_FUZZ_HANDLER_DIR : NULL);
    kf_core_t *core = NULL;
    kf_status_t st = kf_core_create(&c, store, &core, &err);
    if (getenv("DEBUG_FN_RECORDS")) {
        fprintf(stderr, "recovery: %s %s\n", kf_status_name(st), st == KF_OK ? "" : err.message);
    }
    if (st == KF_OK) {
        exercise(core, store);
        kf_core_destroy(core);
    } else if (st != KF_E_CORRUPT) {
        fprintf(stderr, "FN_RECORDS: recovery answered %s: %s\n", kf_status_name(st), err.message);
        abort();
    }
    kf_store_close(store);
    kf_memdisk_destroy(disk);
    return 0;
}
