/*
 * The C client over one data set of 6 partitions served by three keyflowd
 * processes on loopback (docs/scaling.md, "Clients over several
 * processes"): a target "a,b,c" sends every call about a SINGLE function
 * (the default placement) to the process serving its home partition, as it
 * is: a batch whole, one output sequence paged by after_seq and followed by
 * one TailOutput, the function described as that process sees it. For a
 * SPLIT function it splits PushBatch by the rows' keys, reads the output
 * back behind one merged cursor exactly once, follows it with TailOutput
 * across every process and resumes from a page's cursor without gaps or
 * repeats, routes DryRunBatch to the one process its rows reach, and refuses
 * a batch with a row of a partition no endpoint given serves before
 * anything is sent.
 *
 * Real processes (KF_TEST_KEYFLOWD, built alongside) with real RocksDB; the
 * partition of each key is kf-hash-1 (base/partition.h), pinned by
 * tests/partition/vectors.json.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "base/limits.h"
#include "base/partition.h"
#include "keyflow_client.h"
#include "proto/json_map.h"

#define PARTITIONS        6 /* explicit: independent of the default count */
#define PROCESSES         3
#define START_DEADLINE_MS 30000
#define CALL_TIMEOUT_MS   20000
#define TAIL_DEADLINE_MS  30000

typedef struct server {
    pid_t pid;
    char dir[256];
    char target[64];
} server_t;

static server_t servers[PROCESSES];

static int64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void start_server(server_t *s, const char *partitions) {
    /* Under $TMPDIR when it is set, as mkdtemp(1) and Python's tempfile do. */
    const char *tmp = getenv("TMPDIR");
    int n = snprintf(s->dir, sizeof s->dir, "%s/kf-client-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    cr_assert(n > 0 && (size_t)n < sizeof s->dir, "TMPDIR too long: %s", tmp);
    cr_assert_not_null(mkdtemp(s->dir));
    char data[300], ports[300], log[300];
    snprintf(data, sizeof data, "%s/db", s->dir);
    snprintf(ports, sizeof ports, "%s/ports", s->dir);
    snprintf(log, sizeof log, "%s/keyflowd.log", s->dir);
    s->pid = fork();
    cr_assert_geq(s->pid, 0);
    if (s->pid == 0) {
        /* A test that dies before its teardown (a sanitizer's abort, a
         * timeout) takes its servers with it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(KF_TEST_KEYFLOWD, KF_TEST_KEYFLOWD, "--data", data, "--grpc", "127.0.0.1:0", "--http",
              "127.0.0.1:0", "--port-file", ports, "--partition-count", "6", "--partitions",
              partitions, "--plugin-dir", KF_TEST_HANDLERS, (char *)NULL);
        _exit(127);
    }
    int64_t deadline = now_ms() + START_DEADLINE_MS;
    for (;;) {
        FILE *f = fopen(ports, "r");
        int port = 0;
        char line[64];
        while (f != NULL && fgets(line, sizeof line, f) != NULL) {
            sscanf(line, "grpc=%d", &port);
        }
        if (f != NULL) {
            fclose(f);
        }
        if (port > 0) {
            snprintf(s->target, sizeof s->target, "127.0.0.1:%d", port);
            return;
        }
        cr_assert_eq(waitpid(s->pid, NULL, WNOHANG), 0, "keyflowd exited; see %s", log);
        cr_assert_lt(now_ms(), deadline, "keyflowd did not write %s", ports);
        usleep(20 * 1000);
    }
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void setup(void) {
    static const char *sets[PROCESSES] = {"0-1", "2-3", "4-5"};
    for (int i = 0; i < PROCESSES; i++) {
        start_server(&servers[i], sets[i]);
    }
}

static void teardown(void) {
    for (int i = 0; i < PROCESSES; i++) {
        if (servers[i].pid > 0) {
            kill(servers[i].pid, SIGTERM);
            int status = 0;
            waitpid(servers[i].pid, &status, 0);
            /* A sanitizer's report makes keyflowd exit non-zero. */
            cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "keyflowd %s exited with status %d", servers[i].target, status);
            nftw(servers[i].dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
        }
    }
}

/* A client of the first `n` processes. */
static kf_client_t *client_of(int n) {
    char target[256] = "";
    for (int i = 0; i < n; i++) {
        strcat(target, i > 0 ? "," : "");
        strcat(target, servers[i].target);
    }
    kf_client_t *client = NULL;
    kf_error_t err;
    cr_assert_eq(kf_client_create(target, &client, &err), KF_OK, "%s", err.message);
    return client;
}

/* A running_sum key's partition: kf-hash-1 of its one key column. */
static uint32_t partition_of(const char *user) {
    kf_partition_hasher_t h;
    kf_partition_hasher_init(&h);
    kf_partition_hasher_column(&h, user, strlen(user));
    return kf_partition_hasher_partition(&h, PARTITIONS);
}

/* Registers running_sum as `id` on every process (through the client),
 * placed as `placement` says (UNSPECIFIED: as the descriptor file says,
 * which is nothing: SINGLE). */
static void register_function(kf_client_t *client, const char *id,
                              Keyflow__V1__FunctionPlacement placement, kf_arena_t *arena) {
    FILE *f = fopen(KF_TEST_HANDLERS "/running_sum.descriptor.json", "r");
    cr_assert_not_null(f);
    char text[8192];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    ProtobufCMessage *msg = NULL;
    kf_error_t err;
    cr_assert_eq(kf_json_to_message(text, len, &keyflow__v1__function_descriptor__descriptor, arena,
                                    &msg, &err),
                 KF_OK, "%s", err.message);
    Keyflow__V1__FunctionDescriptor *d = (void *)msg;
    d->function_id = (char *)id;
    d->pipeline_state_id = kf_arena_printf(arena, "%s.state", id);
    if (placement != KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_UNSPECIFIED) {
        d->placement = placement;
    }
    Keyflow__V1__RegisterFunctionRequest req = KEYFLOW__V1__REGISTER_FUNCTION_REQUEST__INIT;
    req.descriptor = d;
    Keyflow__V1__RegisterFunctionResponse *resp = NULL;
    cr_assert_eq(kf_client_register_function(client, &req, arena, CALL_TIMEOUT_MS, &resp, &err),
                 KF_OK, "%s", err.message);
}

/* rows_json of users prefix0 .. prefix<n-1>, one row each. */
static char *rows_of(const char *prefix, int first, int n, kf_arena_t *arena) {
    char *text = kf_arena_strdup(arena, "[");
    for (int i = first; i < first + n; i++) {
        text = kf_arena_printf(arena, "%s%s{\"user\": \"%s%d\", \"ts\": %d, \"amount\": 1}", text,
                               i > first ? "," : "", prefix, i, 1000 + i);
    }
    return kf_arena_printf(arena, "%s]", text);
}

static kf_status_t push(kf_client_t *client, const char *id, int64_t sequence, const char *rows,
                        kf_arena_t *arena, Keyflow__V1__PushBatchResponse **resp, kf_error_t *err) {
    Keyflow__V1__PushBatchRequest req = KEYFLOW__V1__PUSH_BATCH_REQUEST__INIT;
    req.function_id = (char *)id;
    req.producer_id = "p";
    req.sequence = sequence;
    req.rows_case = KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_ROWS_JSON;
    req.rows_json = (char *)rows;
    return kf_client_push_batch(client, &req, arena, CALL_TIMEOUT_MS, resp, err);
}

/* What a reader saw: each row's key and (partition, seq). */
typedef struct seen {
    int n;
    char key[256][16];
    int partition[256];
    int64_t seq[256];
} seen_t;

/* Adds a page's rows; every row must be of the page's partition. */
static void take_page(seen_t *seen, const Keyflow__V1__ReadOutputResponse *page) {
    json_error_t jerr;
    json_t *rows = json_loads(page->rows_json, 0, &jerr);
    cr_assert(json_is_array(rows), "rows_json: %s", page->rows_json);
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        const char *key = json_string_value(json_object_get(row, "key"));
        const char *seq = json_string_value(json_object_get(row, "_seq"));
        cr_assert(key != NULL && seq != NULL && seen->n < 256);
        cr_assert_eq(partition_of(key), (uint32_t)page->partition, "%s", key);
        snprintf(seen->key[seen->n], sizeof seen->key[0], "%s", key);
        seen->partition[seen->n] = page->partition;
        seen->seq[seen->n] = atoll(seq);
        seen->n++;
    }
    json_decref(rows);
}

/* Each of prefix<first> .. prefix<first+n-1> exactly once, no (partition,
 * seq) twice, rows of every process. */
static void expect_once(const seen_t *seen, int from, const char *prefix, int first, int n) {
    bool process[PROCESSES] = {false};
    for (int k = first; k < first + n; k++) {
        char key[16];
        snprintf(key, sizeof key, "%s%d", prefix, k);
        int times = 0;
        for (int i = from; i < seen->n; i++) {
            times += strcmp(seen->key[i], key) == 0;
        }
        cr_expect_eq(times, 1, "%s read %d times", key, times);
        process[partition_of(key) / 2] = true;
    }
    for (int i = from; i < seen->n; i++) {
        for (int j = from; j < i; j++) {
            cr_expect(seen->partition[i] != seen->partition[j] || seen->seq[i] != seen->seq[j],
                      "(%d, %lld) twice", seen->partition[i], (long long)seen->seq[i]);
        }
    }
    cr_expect(process[0] && process[1] && process[2]);
}

/* Reads every page after *cursor into `seen`; *cursor becomes the last. */
static void read_all(kf_client_t *client, const char *id, char *cursor, seen_t *seen) {
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    for (int pages = 0;; pages++) {
        cr_assert_lt(pages, 200, "output did not end");
        Keyflow__V1__ReadOutputRequest req = KEYFLOW__V1__READ_OUTPUT_REQUEST__INIT;
        req.function_id = (char *)id;
        req.limit = 7;
        req.format = KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON;
        req.cursor = cursor;
        Keyflow__V1__ReadOutputResponse *page = NULL;
        kf_error_t err;
        cr_assert_eq(kf_client_read_output(client, &req, &arena, CALL_TIMEOUT_MS, &page, &err),
                     KF_OK, "%s", err.message);
        cr_assert(strlen(page->next_cursor) < KF_OUTPUT_CURSOR_BYTES_MAX);
        strcpy(cursor, page->next_cursor);
        if (page->first_seq == 0) {
            break;
        }
        take_page(seen, page);
        kf_arena_reset(&arena);
    }
    kf_arena_deinit(&arena);
}

#define SPLIT KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SPLIT

TestSuite(client_partitions, .init = setup, .fini = teardown, .timeout = 60);

/* A function ID whose home partition the last process serves: a client
 * that sent the calls to its first endpoint would miss it. */
static const char *id_at_the_last_process(kf_arena_t *arena) {
    for (int i = 0;; i++) {
        char *id = kf_arena_printf(arena, "rs_single_%d", i);
        if (kf_partition_home_of_function(id, strlen(id), PARTITIONS) / 2 == PROCESSES - 1) {
            return id;
        }
    }
}

/* The _seq of each row of a page, appended to seqs[*n]. */
static void take_seqs(const Keyflow__V1__ReadOutputResponse *page, int64_t *seqs, int *n) {
    json_error_t jerr;
    json_t *rows = json_loads(page->rows_json, 0, &jerr);
    cr_assert(json_is_array(rows), "rows_json: %s", page->rows_json);
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        cr_assert_lt(*n, 256);
        seqs[(*n)++] = atoll(json_string_value(json_object_get(row, "_seq")));
    }
    json_decref(rows);
}

Test(client_partitions, a_single_function_lives_at_its_home_process) {
    kf_client_t *client = client_of(PROCESSES);
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    const char *id = id_at_the_last_process(&arena);
    uint32_t home = kf_partition_home_of_function(id, strlen(id), PARTITIONS);
    register_function(client, id, KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_UNSPECIFIED, &arena);
    /* Keys of every partition, one batch: one step at the home, one sequence. */
    const char *rows = rows_of("u", 0, 60, &arena);
    Keyflow__V1__PushBatchResponse *ack = NULL;
    kf_error_t err;
    cr_assert_eq(push(client, id, 1, rows, &arena, &ack, &err), KF_OK, "%s", err.message);
    cr_expect_eq(ack->rows_accepted, 60);
    cr_expect_eq(ack->first_output_seq, 1);
    cr_expect_eq(ack->last_output_seq, 60);
    cr_assert_eq(push(client, id, 1, rows, &arena, &ack, &err), KF_OK, "%s", err.message);
    cr_expect(ack->duplicate);
    /* All of it at the home's process, as a client of that process alone sees it. */
    kf_client_t *at_home = NULL;
    cr_assert_eq(kf_client_create(servers[PROCESSES - 1].target, &at_home, &err), KF_OK);
    Keyflow__V1__GetFunctionRequest get = KEYFLOW__V1__GET_FUNCTION_REQUEST__INIT;
    get.function_id = (char *)id;
    Keyflow__V1__FunctionInfo *info = NULL;
    cr_assert_eq(kf_client_get_function(at_home, &get, &arena, CALL_TIMEOUT_MS, &info, &err), KF_OK,
                 "%s", err.message);
    cr_expect_eq(info->keys, 60);
    cr_expect_eq(info->output_seq, 60);
    kf_client_destroy(at_home);
    /* Described through every endpoint: the home's counters. */
    cr_assert_eq(kf_client_get_function(client, &get, &arena, CALL_TIMEOUT_MS, &info, &err), KF_OK,
                 "%s", err.message);
    cr_expect_eq(info->placement, KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SINGLE);
    cr_expect_eq(info->home_partition, (int32_t)home);
    cr_expect_eq(info->keys, 60);
    cr_expect_eq(info->output_seq, 60);
    Keyflow__V1__ListFunctionsRequest list = KEYFLOW__V1__LIST_FUNCTIONS_REQUEST__INIT;
    Keyflow__V1__ListFunctionsResponse *listed = NULL;
    cr_assert_eq(kf_client_list_functions(client, &list, &arena, CALL_TIMEOUT_MS, &listed, &err),
                 KF_OK, "%s", err.message);
    int found = 0;
    for (size_t i = 0; i < listed->n_functions; i++) {
        if (strcmp(listed->functions[i]->descriptor->function_id, id) == 0) {
            found++;
            cr_expect_eq(listed->functions[i]->keys, 60);
            cr_expect_eq(listed->functions[i]->output_seq, 60);
        }
    }
    cr_expect_eq(found, 1);
    /* One sequence, paged by after_seq, in the batch's order; no cursor. */
    int64_t seqs[256];
    int n = 0;
    int64_t after = 0;
    for (int pages = 0;; pages++) {
        cr_assert_lt(pages, 20, "output did not end");
        Keyflow__V1__ReadOutputRequest req = KEYFLOW__V1__READ_OUTPUT_REQUEST__INIT;
        req.function_id = (char *)id;
        req.after_seq = after;
        req.limit = 7;
        req.format = KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON;
        Keyflow__V1__ReadOutputResponse *page = NULL;
        cr_assert_eq(kf_client_read_output(client, &req, &arena, CALL_TIMEOUT_MS, &page, &err),
                     KF_OK, "%s", err.message);
        if (page->first_seq == 0) {
            break;
        }
        cr_expect_eq(page->first_seq, after + 1);
        take_seqs(page, seqs, &n);
        after = page->last_seq;
    }
    cr_assert_eq(n, 60);
    for (int i = 0; i < n; i++) {
        cr_expect_eq(seqs[i], i + 1);
    }
    /* One TailOutput, after a sequence. */
    Keyflow__V1__TailOutputRequest treq = KEYFLOW__V1__TAIL_OUTPUT_REQUEST__INIT;
    treq.function_id = (char *)id;
    treq.after_seq = 58;
    treq.format = KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON;
    kf_client_stream_t *tail = NULL;
    cr_assert_eq(kf_client_tail_output(client, &treq, 0, &tail, &err), KF_OK, "%s", err.message);
    n = 0;
    int64_t deadline = now_ms() + TAIL_DEADLINE_MS;
    while (n < 2) {
        cr_assert_lt(now_ms(), deadline, "the tail saw %d of 2 rows", n);
        Keyflow__V1__ReadOutputResponse *page = NULL;
        kf_status_t st = kf_client_tail_output_next(tail, &arena, 200, &page, &err);
        if (st == KF_AGAIN) {
            continue;
        }
        cr_assert_eq(st, KF_OK, "%s", err.message);
        cr_assert_not_null(page, "the tail ended");
        take_seqs(page, seqs, &n);
    }
    kf_client_stream_close(tail);
    cr_expect(n == 2 && seqs[0] == 59 && seqs[1] == 60);
    kf_arena_deinit(&arena);
    kf_client_destroy(client);
}

Test(client_partitions, push_splits_by_key_and_reads_back_merged_once) {
    kf_client_t *client = client_of(PROCESSES);
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    register_function(client, "rs_push", SPLIT, &arena);
    Keyflow__V1__PushBatchResponse *ack = NULL;
    kf_error_t err;
    const char *rows = rows_of("u", 0, 60, &arena);
    cr_assert_eq(push(client, "rs_push", 1, rows, &arena, &ack, &err), KF_OK, "%s", err.message);
    cr_expect_eq(ack->rows_accepted, 60);
    cr_expect_eq(ack->n_output_ranges, PARTITIONS);
    cr_expect(!ack->duplicate);
    /* A retry is a duplicate on every process. */
    cr_assert_eq(push(client, "rs_push", 1, rows, &arena, &ack, &err), KF_OK, "%s", err.message);
    cr_expect(ack->duplicate);
    char cursor[KF_OUTPUT_CURSOR_BYTES_MAX] = "";
    seen_t *seen = calloc(1, sizeof *seen);
    read_all(client, "rs_push", cursor, seen);
    cr_expect_eq(seen->n, 60);
    expect_once(seen, 0, "u", 0, 60);
    /* Rows written later are read after the cursor, and only they. */
    cr_assert_eq(push(client, "rs_push", 2, rows_of("v", 0, 30, &arena), &arena, &ack, &err), KF_OK,
                 "%s", err.message);
    int before = seen->n;
    read_all(client, "rs_push", cursor, seen);
    cr_expect_eq(seen->n - before, 30);
    expect_once(seen, before, "v", 0, 30);
    free(seen);
    kf_arena_deinit(&arena);
    kf_client_destroy(client);
}

/* Takes tail pages until `want` rows were seen. The first page after
 * which at least `half` rows were seen leaves its cursor in half_cursor and
 * the count in *half_rows. */
static void tail_until(kf_client_stream_t *tail, seen_t *seen, int want, int half,
                       char *half_cursor, int *half_rows) {
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    int64_t deadline = now_ms() + TAIL_DEADLINE_MS;
    while (seen->n < want) {
        cr_assert_lt(now_ms(), deadline, "the tail saw %d of %d rows", seen->n, want);
        Keyflow__V1__ReadOutputResponse *page = NULL;
        kf_error_t err;
        kf_status_t st = kf_client_tail_output_next(tail, &arena, 200, &page, &err);
        if (st == KF_AGAIN) {
            continue;
        }
        cr_assert_eq(st, KF_OK, "%s", err.message);
        cr_assert_not_null(page, "the tail ended");
        take_page(seen, page);
        if (half_cursor != NULL && half_cursor[0] == '\0' && seen->n >= half) {
            cr_assert(strlen(page->next_cursor) < KF_OUTPUT_CURSOR_BYTES_MAX);
            strcpy(half_cursor, page->next_cursor);
            *half_rows = seen->n;
        }
        kf_arena_reset(&arena);
    }
    kf_arena_deinit(&arena);
}

Test(client_partitions, tail_follows_every_process_and_resumes_from_a_cursor) {
    kf_client_t *client = client_of(PROCESSES);
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    register_function(client, "rs_tail", SPLIT, &arena);
    Keyflow__V1__TailOutputRequest req = KEYFLOW__V1__TAIL_OUTPUT_REQUEST__INIT;
    req.function_id = "rs_tail";
    req.format = KEYFLOW__V1__ROW_FORMAT__ROW_FORMAT_JSON;
    kf_client_stream_t *tail = NULL;
    kf_error_t err;
    cr_assert_eq(kf_client_tail_output(client, &req, 0, &tail, &err), KF_OK, "%s", err.message);
    /* Rows pushed once the tail is open: one, then (once it was seen) more. */
    Keyflow__V1__PushBatchResponse *ack = NULL;
    seen_t *seen = calloc(1, sizeof *seen);
    char half[KF_OUTPUT_CURSOR_BYTES_MAX] = "";
    int half_rows = 0;
    cr_assert_eq(push(client, "rs_tail", 1, rows_of("t", 0, 1, &arena), &arena, &ack, &err), KF_OK,
                 "%s", err.message);
    tail_until(tail, seen, 1, 0, NULL, NULL);
    cr_assert_eq(push(client, "rs_tail", 2, rows_of("t", 1, 47, &arena), &arena, &ack, &err), KF_OK,
                 "%s", err.message);
    tail_until(tail, seen, 48, 24, half, &half_rows);
    kf_client_stream_close(tail);
    cr_expect_eq(seen->n, 48);
    expect_once(seen, 0, "t", 0, 48);
    cr_assert_gt(half_rows, 0);
    cr_assert_lt(half_rows, 48, "every row came in one page: no cursor in the middle");
    /* From the cursor in the middle: exactly the rows after it, old and new. */
    cr_assert_eq(push(client, "rs_tail", 3, rows_of("t", 48, 12, &arena), &arena, &ack, &err),
                 KF_OK, "%s", err.message);
    req.cursor = half;
    cr_assert_eq(kf_client_tail_output(client, &req, 0, &tail, &err), KF_OK, "%s", err.message);
    seen->n = half_rows; /* what the first reader had read up to the cursor */
    tail_until(tail, seen, 60, 0, NULL, NULL);
    /* Nothing more after the last row: a short wait finds no page. */
    Keyflow__V1__ReadOutputResponse *extra = NULL;
    cr_expect_eq(kf_client_tail_output_next(tail, &arena, 300, &extra, &err), KF_AGAIN,
                 "a row after the last: %s", extra != NULL ? extra->rows_json : err.message);
    kf_client_stream_close(tail);
    cr_expect_eq(seen->n, 60);
    expect_once(seen, 0, "t", 0, 60);
    free(seen);
    kf_arena_deinit(&arena);
    kf_client_destroy(client);
}

Test(client_partitions, a_row_of_an_unserved_partition_refuses_the_whole_push) {
    kf_client_t *all = client_of(PROCESSES);
    kf_client_t *two = client_of(2);
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    register_function(all, "rs_unserved", SPLIT, &arena);
    Keyflow__V1__PushBatchResponse *ack = NULL;
    kf_error_t err;
    const char *rows = rows_of("x", 0, 24, &arena);
    cr_assert_eq(push(two, "rs_unserved", 1, rows, &arena, &ack, &err), KF_E_NOT_OWNER, "%s",
                 err.message);
    cr_expect(strstr(err.message, "which no endpoint given serves") != NULL, "%s", err.message);
    /* Nothing anywhere: no key, no output, the sequence still unused. */
    Keyflow__V1__GetFunctionRequest get = KEYFLOW__V1__GET_FUNCTION_REQUEST__INIT;
    get.function_id = "rs_unserved";
    Keyflow__V1__FunctionInfo *info = NULL;
    cr_assert_eq(kf_client_get_function(all, &get, &arena, CALL_TIMEOUT_MS, &info, &err), KF_OK,
                 "%s", err.message);
    cr_expect_eq(info->keys, 0);
    cr_expect_eq(info->output_seq, 0);
    cr_assert_eq(push(all, "rs_unserved", 1, rows, &arena, &ack, &err), KF_OK, "%s", err.message);
    cr_expect(!ack->duplicate);
    cr_expect_eq(ack->rows_accepted, 24);
    kf_arena_deinit(&arena);
    kf_client_destroy(two);
    kf_client_destroy(all);
}

Test(client_partitions, dry_run_goes_to_the_one_process_of_its_rows) {
    kf_client_t *client = client_of(PROCESSES);
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    register_function(client, "rs_dry", SPLIT, &arena);
    Keyflow__V1__DryRunBatchRequest req = KEYFLOW__V1__DRY_RUN_BATCH_REQUEST__INIT;
    req.function_id = "rs_dry";
    req.rows_case = KEYFLOW__V1__DRY_RUN_BATCH_REQUEST__ROWS_ROWS_JSON;
    /* One key: its process answers, whichever it is. */
    for (int i = 0; i < 6; i++) {
        req.rows_json = kf_arena_printf(&arena,
                                        "[{\"user\": \"d%d\", \"ts\": 1, \"amount\": 5}, "
                                        "{\"user\": \"d%d\", \"ts\": 2, \"amount\": 2}]",
                                        i, i);
        Keyflow__V1__DryRunBatchResponse *resp = NULL;
        kf_error_t err;
        cr_assert_eq(kf_client_dry_run_batch(client, &req, &arena, CALL_TIMEOUT_MS, &resp, &err),
                     KF_OK, "d%d: %s", i, err.message);
        cr_expect_eq(resp->rows_accepted, 2);
        cr_expect_eq(resp->n_changes, 1);
    }
    /* Keys of several processes: refused, naming why. */
    req.rows_json = rows_of("d", 0, 12, &arena);
    Keyflow__V1__DryRunBatchResponse *resp = NULL;
    kf_error_t err;
    cr_assert_eq(kf_client_dry_run_batch(client, &req, &arena, CALL_TIMEOUT_MS, &resp, &err),
                 KF_E_UNIMPLEMENTED);
    cr_expect(strstr(err.message, "would reach 3 processes") != NULL, "%s", err.message);
    /* A dry run changes nothing. */
    Keyflow__V1__GetFunctionRequest get = KEYFLOW__V1__GET_FUNCTION_REQUEST__INIT;
    get.function_id = "rs_dry";
    Keyflow__V1__FunctionInfo *info = NULL;
    cr_assert_eq(kf_client_get_function(client, &get, &arena, CALL_TIMEOUT_MS, &info, &err), KF_OK,
                 "%s", err.message);
    cr_expect_eq(info->keys, 0);
    kf_arena_deinit(&arena);
    kf_client_destroy(client);
}
