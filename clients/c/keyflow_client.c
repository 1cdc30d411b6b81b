/*
 * keyflow_client.c - one gRPC channel, unary calls and server streams on
 * per-call completion queues, protobuf-c (un)packing into the caller's arena.
 *
 * Invariants
 *   1. The client's only state is its channel and its target text, both
 *      fixed at create: calls share nothing else, so any number of threads
 *      may call at once (gRPC's channel is itself thread-safe).
 *   2. Each call owns its completion queue, call object, byte buffers and
 *      metadata arrays, and frees all of them before it returns: nothing a
 *      call allocated outside the caller's arena outlives it.
 *   3. A call either stores a decoded response and returns KF_OK, or stores
 *      NULL and returns the status of the one place it failed (packing, the
 *      gRPC status, or decoding), with a message naming that place.
 *   4. A gRPC status is translated to a kf_status_t once, here, through
 *      status_by_grpc_code; the server's message is copied unchanged.
 *   5. A stream has at most one batch of each kind in flight (start, one
 *      receive, status), counted in `pending`; close cancels the call and
 *      collects every pending batch before it frees what they write into.
 *   6. A stream reads what a batch wrote only after collecting that batch's
 *      completion from its queue: gRPC may fill recv_buffer (on another
 *      thread) well before the event arrives, and a buffer taken early
 *      would make the event look like the end of the messages.
 */
#include "keyflow_client.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/status.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <jansson.h>

#include "base/assert.h"
#include "base/json.h"
#include "base/partition.h"
#include "base/limits.h"

/* What a route of the server's RPC table says (GetPlacement's Route). */
typedef enum route_kind {
    ROUTE_ANY,             /* no key: any endpoint (health, placement, local) */
    ROUTE_HOME,            /* the process's own (API keys): the first endpoint */
    ROUTE_BY_COORDINATOR,  /* fields: workflow, key */
    ROUTE_BY_RUN_ID,       /* fields: run_id */
    ROUTE_BY_FUNCTION_KEY, /* fields: function_id, key text */
    ROUTE_SPLIT,
    ROUTE_ALL,
    ROUTE_MERGE,
    ROUTE_FIRST,
} route_kind_t;

/* Route fields are dotted request paths ("coordinator.workflow"). */
#define ROUTE_FIELD_BYTES_MAX 64
/* Method paths of the RPC table are short constants. */
#define ROUTE_METHOD_BYTES_MAX 96
/* Routes a placement may list: the RPC table has fewer than this. */
#define ROUTES_MAX 64

typedef struct route {
    char method[ROUTE_METHOD_BYTES_MAX];
    route_kind_t kind;
    char fields[2][ROUTE_FIELD_BYTES_MAX];
} route_t;

struct kf_client {
    /* One channel per endpoint, each shared by every call; thread-safe. */
    grpc_channel *channels[KF_CLIENT_ENDPOINTS_MAX];
    const char *endpoints[KF_CLIENT_ENDPOINTS_MAX]; /* into endpoint_text */
    size_t endpoint_count;
    char *target;        /* as given: "a:1" or "a:1,b:2" */
    char *endpoint_text; /* the target with each ',' a NUL */
    /* With several endpoints, the data set's placement as the endpoints told
     * it (GetPlacement), asked for before the first routed call and again
     * when a call is refused as another process's. */
    pthread_mutex_t lock;
    uint32_t partition_count;             /* 0: not known yet */
    int8_t owner[KF_PARTITION_COUNT_MAX]; /* endpoint serving each partition; -1: none */
    route_t routes[ROUTES_MAX];
    size_t route_count;
    unsigned rotation; /* where the next poll starts */
    /* "Bearer <key>", sent as the authorization metadata of every call
     * (static slices over it: it lives as long as the client). */
    char authorization[sizeof "Bearer " + KF_CLIENT_API_KEY_BYTES_MAX];
    grpc_metadata metadata[1];
    size_t metadata_count; /* 0 without a key */
};

/* Reads a PEM file into a NUL-terminated malloc'd string. */
static kf_status_t read_pem(const char *what, const char *path, char **out, kf_error_t *err) {
    *out = NULL;
    if (path == NULL) {
        return KF_OK;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return kf_error_set(err, KF_E_IO, "%s %s: %s", what, path, strerror(errno));
    }
    char *text = malloc(KF_TLS_PEM_BYTES_MAX + 1);
    size_t n = text != NULL ? fread(text, 1, KF_TLS_PEM_BYTES_MAX + 1, f) : 0;
    bool failed = text == NULL || ferror(f);
    fclose(f);
    if (failed) {
        free(text);
        return kf_error_set(err, KF_E_IO, "%s %s: cannot read it", what, path);
    }
    if (n > KF_TLS_PEM_BYTES_MAX) {
        free(text);
        return kf_error_set(err, KF_E_TOO_LARGE, "%s %s: more than %d bytes", what, path,
                            KF_TLS_PEM_BYTES_MAX);
    }
    text[n] = '\0';
    *out = text;
    return KF_OK;
}

/* TLS channel credentials from the options' files. The strings are copied
 * by gRPC, so they are freed here either way. */
static kf_status_t tls_credentials(const kf_client_options_t *o, grpc_channel_credentials **out,
                                   kf_error_t *err) {
    if ((o->tls_cert_path == NULL) != (o->tls_key_path == NULL)) {
        return kf_error_set(err, KF_E_INVALID,
                            "tls: a client certificate needs its key and the other way round "
                            "(--tls-cert with --tls-key)");
    }
    char *ca = NULL, *cert = NULL, *key = NULL;
    kf_status_t st = read_pem("CA file", o->tls_ca_path, &ca, err);
    if (st == KF_OK) {
        st = read_pem("certificate file", o->tls_cert_path, &cert, err);
    }
    if (st == KF_OK) {
        st = read_pem("key file", o->tls_key_path, &key, err);
    }
    if (st == KF_OK) {
        grpc_ssl_pem_key_cert_pair pair = {key, cert};
        *out = grpc_ssl_credentials_create(ca, cert != NULL ? &pair : NULL, NULL, NULL);
        if (*out == NULL) {
            st = kf_error_set(err, KF_E_INTERNAL, "tls: gRPC refused the TLS settings");
        }
    }
    free(ca);
    free(cert);
    free(key);
    return st;
}

/* An API key travels as a header value: printable ASCII without spaces. */
static kf_status_t check_api_key(const char *key, kf_error_t *err) {
    size_t len = strlen(key);
    if (len == 0 || len > KF_CLIENT_API_KEY_BYTES_MAX) {
        return kf_error_set(err, KF_E_INVALID, "api key: must be 1..%d characters, got %zu",
                            KF_CLIENT_API_KEY_BYTES_MAX, len);
    }
    for (size_t i = 0; i < len; i++) {
        if (key[i] <= ' ' || key[i] > '~') {
            return kf_error_set(err, KF_E_INVALID,
                                "api key: character %zu is not printable ASCII (a stray newline?)",
                                i + 1);
        }
    }
    return KF_OK;
}

/*
 * gRPC code -> kf_status_t: the inverse of KF_STATUS_TABLE's grpc column.
 * Where several statuses share a code the general one is chosen; UNKNOWN
 * has no status of its own (keyflowd never sends it; a client-side failure
 * in gRPC itself may produce it).
 */
static const kf_status_t status_by_grpc_code[] = {
    [GRPC_STATUS_OK] = KF_OK,
    [GRPC_STATUS_CANCELLED] = KF_E_CANCELLED,
    [GRPC_STATUS_UNKNOWN] = KF_E_INTERNAL,
    [GRPC_STATUS_INVALID_ARGUMENT] = KF_E_INVALID,
    [GRPC_STATUS_DEADLINE_EXCEEDED] = KF_E_TIMEOUT,
    [GRPC_STATUS_NOT_FOUND] = KF_E_NOT_FOUND,
    [GRPC_STATUS_ALREADY_EXISTS] = KF_E_EXISTS,
    [GRPC_STATUS_PERMISSION_DENIED] = KF_E_PERMISSION,
    [GRPC_STATUS_RESOURCE_EXHAUSTED] = KF_E_LIMIT,
    [GRPC_STATUS_FAILED_PRECONDITION] = KF_E_PRECONDITION,
    [GRPC_STATUS_ABORTED] = KF_E_ABORTED,
    [GRPC_STATUS_OUT_OF_RANGE] = KF_E_RANGE,
    [GRPC_STATUS_UNIMPLEMENTED] = KF_E_UNIMPLEMENTED,
    [GRPC_STATUS_INTERNAL] = KF_E_INTERNAL,
    [GRPC_STATUS_UNAVAILABLE] = KF_E_UNAVAILABLE,
    [GRPC_STATUS_DATA_LOSS] = KF_E_CORRUPT,
    [GRPC_STATUS_UNAUTHENTICATED] = KF_E_UNAUTHENTICATED,
};

#define GRPC_CODE_COUNT (sizeof status_by_grpc_code / sizeof status_by_grpc_code[0])
_Static_assert(GRPC_CODE_COUNT == GRPC_STATUS_UNAUTHENTICATED + 1, "one row per gRPC code");

kf_status_t kf_client_status_from_grpc(int grpc_code) {
    if (grpc_code < 0 || (size_t)grpc_code >= GRPC_CODE_COUNT) {
        return KF_E_INTERNAL;
    }
    return status_by_grpc_code[grpc_code];
}

/* The table must round-trip through status.h for every code keyflowd can
 * send, or the CLI would print a different code name than the server sent.
 * Checked at run time because status.h's codes are not constant
 * expressions that _Static_assert can see through. */
static void check_status_table(void) {
    for (size_t code = 0; code < GRPC_CODE_COUNT; code++) {
        if (code == GRPC_STATUS_UNKNOWN) {
            continue;
        }
        KF_ASSERT((size_t)kf_status_grpc_code(status_by_grpc_code[code]) == code);
    }
}

static void free_client(kf_client_t *client) {
    if (client != NULL) {
        free(client->target);
        free(client->endpoint_text);
        free(client);
    }
}

/* The target's endpoints: "a:1" or "a:1,b:2" (each at most
 * KF_CLIENT_TARGET_BYTES_MAX, at most KF_CLIENT_ENDPOINTS_MAX). */
static kf_status_t split_endpoints(kf_client_t *client, kf_error_t *err) {
    char *p = client->endpoint_text;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma != NULL) {
            *comma = '\0';
        }
        size_t len = strlen(p);
        if (len == 0) {
            return kf_error_set(err, KF_E_INVALID,
                                client->endpoint_count == 0 && comma == NULL
                                    ? "target: required, e.g. 127.0.0.1:50051"
                                    : "target: an empty endpoint in \"%s\"",
                                client->target);
        }
        if (len > KF_CLIENT_TARGET_BYTES_MAX) {
            return kf_error_set(err, KF_E_INVALID, "target: at most %d bytes per endpoint, got %zu",
                                KF_CLIENT_TARGET_BYTES_MAX, len);
        }
        if (client->endpoint_count == KF_CLIENT_ENDPOINTS_MAX) {
            return kf_error_set(err, KF_E_INVALID, "target: at most %d endpoints",
                                KF_CLIENT_ENDPOINTS_MAX);
        }
        client->endpoints[client->endpoint_count++] = p;
        if (comma == NULL) {
            return KF_OK;
        }
        p = comma + 1;
    }
}

kf_status_t kf_client_create(const char *target, kf_client_t **out, kf_error_t *err) {
    return kf_client_create_with(target, NULL, out, err);
}

kf_status_t kf_client_create_with(const char *target, const kf_client_options_t *options,
                                  kf_client_t **out, kf_error_t *err) {
    static const kf_client_options_t plaintext = {0};
    KF_ASSERT(target != NULL && out != NULL);
    const kf_client_options_t *o = options != NULL ? options : &plaintext;
    *out = NULL;
    if (o->api_key != NULL && check_api_key(o->api_key, err) != KF_OK) {
        return err->status;
    }
    check_status_table();
    kf_client_t *client = calloc(1, sizeof *client);
    if (client == NULL || (client->target = strdup(target)) == NULL ||
        (client->endpoint_text = strdup(target)) == NULL) {
        free_client(client);
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate the client");
    }
    if (split_endpoints(client, err) != KF_OK) {
        free_client(client);
        return err->status;
    }
    pthread_mutex_init(&client->lock, NULL);
    memset(client->owner, -1, sizeof client->owner);
    if (o->api_key != NULL) {
        snprintf(client->authorization, sizeof client->authorization, "Bearer %s", o->api_key);
        client->metadata[0].key = grpc_slice_from_static_string("authorization");
        client->metadata[0].value = grpc_slice_from_static_string(client->authorization);
        client->metadata_count = 1;
    }

    grpc_init();
    bool tls = o->tls || o->tls_ca_path != NULL || o->tls_cert_path != NULL ||
               o->tls_key_path != NULL || o->tls_server_name != NULL;
    grpc_channel_credentials *creds = NULL;
    if (tls) {
        kf_status_t st = tls_credentials(o, &creds, err);
        if (st != KF_OK) {
            pthread_mutex_destroy(&client->lock);
            free_client(client);
            grpc_shutdown();
            return st;
        }
    } else {
        creds = grpc_insecure_credentials_create();
    }
    /* Explicit message bounds, matching the server's: gRPC's default 4 MiB
     * receive limit would refuse a legal run list or batch input. */
    grpc_arg args[4];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = KF_RESPONSE_BYTES_MAX;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = KF_REQUEST_BYTES_MAX;
    args[2].type = GRPC_ARG_STRING;
    args[2].key = GRPC_ARG_PRIMARY_USER_AGENT_STRING;
    args[2].value.string = "keyflow-c";
    size_t arg_count = 3;
    if (o->tls_server_name != NULL) {
        args[3].type = GRPC_ARG_STRING;
        args[3].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[3].value.string = (char *)o->tls_server_name; /* copied by gRPC */
        arg_count = 4;
    }
    grpc_channel_args channel_args = {arg_count, args};
    for (size_t i = 0; i < client->endpoint_count; i++) {
        client->channels[i] = grpc_channel_create(client->endpoints[i], creds, &channel_args);
        if (client->channels[i] == NULL) {
            grpc_channel_credentials_release(creds);
            kf_error_set(err, KF_E_INTERNAL, "cannot create a gRPC channel to %s",
                         client->endpoints[i]);
            kf_client_destroy(client);
            return err->status;
        }
    }
    grpc_channel_credentials_release(creds);
    *out = client;
    return KF_OK;
}

void kf_client_destroy(kf_client_t *client) {
    if (client == NULL) {
        return;
    }
    for (size_t i = 0; i < client->endpoint_count; i++) {
        if (client->channels[i] != NULL) {
            grpc_channel_destroy(client->channels[i]);
        }
    }
    pthread_mutex_destroy(&client->lock);
    free_client(client);
    grpc_shutdown();
}

size_t kf_client_endpoint_count(const kf_client_t *client) {
    return client->endpoint_count;
}

const char *kf_client_endpoint(const kf_client_t *client, size_t endpoint) {
    KF_ASSERT(endpoint < client->endpoint_count);
    return client->endpoints[endpoint];
}

const char *kf_client_target(const kf_client_t *client) {
    return client->target;
}

/* protobuf-c allocator over the caller's arena that remembers whether an
 * allocation failed, so that an exhausted arena is told apart from a
 * malformed message (protobuf-c reports both as NULL). */
typedef struct decode_alloc {
    kf_arena_t *arena;
    bool exhausted;
} decode_alloc_t;

static void *decode_alloc(void *data, size_t size) {
    decode_alloc_t *d = data;
    void *p = kf_arena_alloc(d->arena, size);
    if (p == NULL) {
        d->exhausted = true;
    }
    return p;
}

static void decode_free(void *data, void *ptr) {
    /* The arena frees everything at once at reset. */
    (void)data;
    (void)ptr;
}

/* Unpacks the received message into the arena. */
static kf_status_t decode_response(grpc_byte_buffer *payload,
                                   const ProtobufCMessageDescriptor *desc, kf_arena_t *arena,
                                   ProtobufCMessage **response, kf_error_t *err) {
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, payload)) {
        return kf_error_set(err, KF_E_INTERNAL,
                            "response: cannot read the %s message (unsupported compression)",
                            desc->name);
    }
    grpc_slice slice = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    decode_alloc_t state = {arena, false};
    ProtobufCAllocator allocator = {decode_alloc, decode_free, &state};
    size_t len = GRPC_SLICE_LENGTH(slice);
    ProtobufCMessage *msg =
        protobuf_c_message_unpack(desc, &allocator, len, GRPC_SLICE_START_PTR(slice));
    grpc_slice_unref(slice);
    if (msg == NULL) {
        if (state.exhausted) {
            return kf_error_set(err, KF_E_LIMIT,
                                "response: the arena's limit of %zu bytes was reached decoding "
                                "%zu bytes of %s",
                                arena->limit_bytes, len, desc->name);
        }
        return kf_error_set(err, KF_E_INTERNAL, "response: %zu bytes that are not a valid %s", len,
                            desc->name);
    }
    KF_ASSERT(msg->descriptor == desc);
    *response = msg;
    return KF_OK;
}

static void check_call_args(const char *method_path, const ProtobufCMessage *request,
                            const ProtobufCMessageDescriptor *response_desc, int64_t timeout_ms) {
    KF_ASSERT(method_path != NULL && method_path[0] == '/');
    KF_ASSERT(request != NULL && request->descriptor != NULL);
    KF_ASSERT(request->descriptor->magic == PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC);
    KF_ASSERT(response_desc != NULL);
    KF_ASSERT(response_desc->magic == PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC);
    KF_ASSERT(timeout_ms >= 0);
}

/* Packs the request into a new byte buffer (*out; the caller destroys it),
 * refusing one past KF_REQUEST_BYTES_MAX before anything is allocated. */
static kf_status_t pack_request(const ProtobufCMessage *request, grpc_byte_buffer **out,
                                kf_error_t *err) {
    size_t request_len = protobuf_c_message_get_packed_size(request);
    if (request_len > KF_REQUEST_BYTES_MAX) {
        return kf_error_set(err, KF_E_TOO_LARGE,
                            "request: %zu bytes packed, more than KF_REQUEST_BYTES_MAX (%d)",
                            request_len, KF_REQUEST_BYTES_MAX);
    }
    grpc_slice request_slice = grpc_slice_malloc(request_len);
    size_t packed = protobuf_c_message_pack(request, GRPC_SLICE_START_PTR(request_slice));
    KF_ASSERT(packed == request_len);
    *out = grpc_raw_byte_buffer_create(&request_slice, 1);
    grpc_slice_unref(request_slice);
    return KF_OK;
}

/* The call deadline for timeout_ms (0: none). */
static gpr_timespec deadline_after(int64_t timeout_ms) {
    if (timeout_ms == 0) {
        return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    }
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

/* A non-OK gRPC status as the error: the code translated once, the
 * server's message copied verbatim (bounded). */
static kf_status_t status_error(grpc_status_code code, grpc_slice details, const char *method_path,
                                kf_error_t *err) {
    KF_ASSERT(code != GRPC_STATUS_OK);
    size_t details_len = GRPC_SLICE_LENGTH(details);
    if (details_len > KF_ERROR_MESSAGE_BYTES_MAX) {
        details_len = KF_ERROR_MESSAGE_BYTES_MAX;
    }
    if (details_len == 0) {
        return kf_error_set(err, kf_client_status_from_grpc((int)code),
                            "%s failed with no status message", method_path);
    }
    return kf_error_set(err, kf_client_status_from_grpc((int)code), "%.*s", (int)details_len,
                        (const char *)GRPC_SLICE_START_PTR(details));
}

/* One call on one endpoint's channel. *misdirected (may be NULL) tells
 * whether the server refused it as another process's partition (its
 * trailing metadata names the partition). */
static kf_status_t call_on(kf_client_t *client, size_t endpoint, const char *method_path,
                           const ProtobufCMessage *request,
                           const ProtobufCMessageDescriptor *response_desc, kf_arena_t *arena,
                           int64_t timeout_ms, ProtobufCMessage **response, bool *misdirected,
                           kf_error_t *err) {
    *response = NULL;
    if (misdirected != NULL) {
        *misdirected = false;
    }

    grpc_byte_buffer *send_buffer = NULL;
    kf_status_t pack_st = pack_request(request, &send_buffer, err);
    if (pack_st != KF_OK) {
        return pack_st;
    }

    /* A queue per call: pluck needs no shared poller, and no other thread's
     * call can ever show up on it. */
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline = deadline_after(timeout_ms);
    grpc_slice method = grpc_slice_from_copied_string(method_path);
    grpc_call *call =
        grpc_channel_create_call(client->channels[endpoint], NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                 method, NULL, deadline, NULL);
    grpc_slice_unref(method);
    KF_ASSERT(call != NULL);

    grpc_metadata_array initial_metadata;
    grpc_metadata_array trailing_metadata;
    grpc_metadata_array_init(&initial_metadata);
    grpc_metadata_array_init(&trailing_metadata);
    grpc_byte_buffer *recv_buffer = NULL;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *error_string = NULL;

    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = client->metadata_count;
    ops[0].data.send_initial_metadata.metadata = client->metadata;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send_buffer;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_metadata;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv_buffer;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing_metadata;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    ops[5].data.recv_status_on_client.error_string = &error_string;

    kf_status_t st = KF_OK;
    void *tag = &ops; /* any address unique to this call */
    grpc_call_error rc = grpc_call_start_batch(call, ops, sizeof ops / sizeof ops[0], tag, NULL);
    if (rc != GRPC_CALL_OK) {
        st = kf_error_set(err, KF_E_INTERNAL, "%s: grpc_call_start_batch failed (%d)", method_path,
                          (int)rc);
        goto release_call;
    }
    /* The call's deadline bounds this wait; RECV_STATUS always completes. */
    grpc_event ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    KF_ASSERT(ev.type == GRPC_OP_COMPLETE && ev.tag == tag);

    if (code != GRPC_STATUS_OK) {
        st = status_error(code, details, method_path, err);
        for (size_t i = 0; misdirected != NULL && i < trailing_metadata.count; i++) {
            if (grpc_slice_str_cmp(trailing_metadata.metadata[i].key, "keyflow-partition") == 0) {
                *misdirected = true;
            }
        }
    } else if (recv_buffer == NULL) {
        st = kf_error_set(err, KF_E_INTERNAL, "response: %s returned OK without a message",
                          method_path);
    } else {
        st = decode_response(recv_buffer, response_desc, arena, response, err);
    }

release_call:
    grpc_call_unref(call);
    /* Nothing is pending on the queue now, so shutdown needs no drain. */
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    if (recv_buffer != NULL) {
        grpc_byte_buffer_destroy(recv_buffer);
    }
    grpc_byte_buffer_destroy(send_buffer);
    grpc_slice_unref(details);
    if (error_string != NULL) {
        gpr_free((void *)error_string);
    }
    grpc_metadata_array_destroy(&initial_metadata);
    grpc_metadata_array_destroy(&trailing_metadata);
    KF_ASSERT((st == KF_OK) == (*response != NULL));
    return st;
}

/* ---- several endpoints: routing by key ----------------------------------
 *
 * A target "a:1,b:2,c:3" names the processes of one data set (DESIGN.md
 * section 9, docs/scaling.md). Before the first call the client asks every
 * endpoint for its placement (keyflow.v1.Partitions/GetPlacement: the
 * partition count, the partitions it serves, how each RPC routes) and then
 * sends each call where its route says, computing the partition with
 * kf-hash-1 (base/partition.h), as the SDKs do:
 *   a SINGLE function (the default placement): every call about it at the
 *     endpoint serving its home, as it is (see "SINGLE functions" below);
 *   by_coordinator, by_run_id, by_function_key: the key's endpoint; a
 *     refusal as another process's partition asks again and retries once;
 *   all: every endpoint (registration, deletion, descriptions, trims); the
 *     first endpoint's answer, with GetFunction's, RegisterFunction's and
 *     DeleteFunction's counters summed;
 *   merge: ListRuns endpoint after endpoint behind one page token
 *     ("e<endpoint>:<the endpoint's token>");
 *   first: PollRuns asks the endpoints in turn; a long poll waits on each in
 *     turn for at most ROUTED_POLL_SLICE_MS, so a run anywhere is leased
 *     within about that times the endpoints;
 *   split: SendEvents split by the events' endpoints, the answers in order;
 *     a SPLIT function's PushBatch (columnar or rows_json) split by its rows'
 *     key partitions,
 *     a watermark to every endpoint, the answers combined; a row of a
 *     partition no endpoint given serves refuses it before anything is
 *     sent; DryRunBatch to the one endpoint its rows reach (refused when
 *     they reach several, as the server refuses several partitions);
 *   merge, ReadOutput: endpoints in turn behind one merged cursor; a
 *     TailOutput stream: one stream per endpoint, merged (see "TailOutput
 *     over several endpoints" below); other streams are refused;
 *   home (API keys), and calls without a route: the first endpoint.
 */

/* How long a routed long poll waits on one endpoint before the next. */
#define ROUTED_POLL_SLICE_MS 1000

static route_kind_t route_kind_named(const char *name) {
    static const struct {
        const char *name;
        route_kind_t kind;
    } kinds[] = {
        {"home", ROUTE_HOME},           {"by_coordinator", ROUTE_BY_COORDINATOR},
        {"by_run_id", ROUTE_BY_RUN_ID}, {"by_function_key", ROUTE_BY_FUNCTION_KEY},
        {"split", ROUTE_SPLIT},         {"all", ROUTE_ALL},
        {"merge", ROUTE_MERGE},         {"first", ROUTE_FIRST},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (strcmp(kinds[i].name, name) == 0) {
            return kinds[i].kind;
        }
    }
    return ROUTE_ANY; /* local, and kinds this client does not know */
}

kf_status_t kf_client_get_placement(kf_client_t *client, size_t endpoint, kf_arena_t *arena,
                                    int64_t timeout_ms, Keyflow__V1__Placement **response,
                                    kf_error_t *err) {
    KF_ASSERT(client != NULL && endpoint < client->endpoint_count && response != NULL);
    Keyflow__V1__GetPlacementRequest req = KEYFLOW__V1__GET_PLACEMENT_REQUEST__INIT;
    ProtobufCMessage *msg = NULL;
    kf_status_t st =
        call_on(client, endpoint, KF_CLIENT_PATH_GET_PLACEMENT, &req.base,
                &keyflow__v1__placement__descriptor, arena, timeout_ms, &msg, NULL, err);
    *response = (Keyflow__V1__Placement *)msg;
    return st;
}

/* Asks every endpoint for its placement and keeps what they said; an
 * endpoint that does not answer keeps what an earlier answer said. Fails
 * only when no endpoint answered, or the answers contradict each other. */
static kf_status_t discover(kf_client_t *client, int64_t timeout_ms, kf_error_t *err) {
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    pthread_mutex_lock(&client->lock);
    uint32_t count = client->partition_count;
    int8_t owner[KF_PARTITION_COUNT_MAX];
    memcpy(owner, client->owner, sizeof owner);
    pthread_mutex_unlock(&client->lock);
    route_t *routes = calloc(ROUTES_MAX, sizeof *routes);
    size_t route_count = 0;
    kf_error_t first_failure = {0};
    kf_status_t st = routes != NULL ? KF_OK : kf_error_set(err, KF_E_NOMEM, "out of memory");
    for (size_t e = 0; st == KF_OK && e < client->endpoint_count; e++) {
        Keyflow__V1__Placement *p = NULL;
        kf_error_t call_err;
        if (kf_client_get_placement(client, e, &arena, timeout_ms, &p, &call_err) != KF_OK) {
            if (first_failure.status == KF_OK) {
                kf_error_set(&first_failure, call_err.status, "%s: %s", client->endpoints[e],
                             call_err.message);
            }
            continue;
        }
        if (p->partition_count < 1 || p->partition_count > KF_PARTITION_COUNT_MAX ||
            (count != 0 && (uint32_t)p->partition_count != count)) {
            st = kf_error_set(err, KF_E_INVALID,
                              "target: %s serves a data set of %d partitions, another endpoint "
                              "one of %u",
                              client->endpoints[e], (int)p->partition_count, count);
            break;
        }
        count = (uint32_t)p->partition_count;
        for (size_t i = 0; i < p->n_partitions; i++) {
            int32_t part = p->partitions[i]->partition;
            if (part < 0 || (uint32_t)part >= count) {
                continue;
            }
            if (owner[part] >= 0 && (size_t)owner[part] != e) {
                st = kf_error_set(err, KF_E_INVALID,
                                  "target: partition %d is served by both %s and %s (two "
                                  "copies of it: docs/scaling.md)",
                                  (int)part, client->endpoints[owner[part]], client->endpoints[e]);
                break;
            }
            owner[part] = (int8_t)e;
        }
        if (route_count == 0) {
            for (size_t i = 0; i < p->n_routes && route_count < ROUTES_MAX; i++) {
                const Keyflow__V1__Route *r = p->routes[i];
                route_t *out = &routes[route_count++];
                snprintf(out->method, sizeof out->method, "%s", r->method);
                out->kind = route_kind_named(r->kind);
                for (size_t f = 0; f < 2 && f < r->n_fields; f++) {
                    snprintf(out->fields[f], sizeof out->fields[f], "%s", r->fields[f]);
                }
            }
        }
    }
    if (st == KF_OK && count == 0) {
        st = kf_error_set(err,
                          first_failure.status != KF_OK ? first_failure.status : KF_E_UNAVAILABLE,
                          "no endpoint told its placement: %s", first_failure.message);
    }
    if (st == KF_OK) {
        pthread_mutex_lock(&client->lock);
        client->partition_count = count;
        memcpy(client->owner, owner, sizeof owner);
        if (route_count > 0) {
            memcpy(client->routes, routes, route_count * sizeof *routes);
            client->route_count = route_count;
        }
        pthread_mutex_unlock(&client->lock);
    }
    free(routes);
    kf_arena_deinit(&arena);
    return st;
}

/* The method's route and the partition count, asking the endpoints first
 * when nobody has yet. */
static kf_status_t route_of(kf_client_t *client, const char *method_path, int64_t timeout_ms,
                            route_t *out, uint32_t *count, kf_error_t *err) {
    pthread_mutex_lock(&client->lock);
    bool known = client->partition_count != 0;
    pthread_mutex_unlock(&client->lock);
    if (!known) {
        kf_status_t st = discover(client, timeout_ms, err);
        if (st != KF_OK) {
            return st;
        }
    }
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&client->lock);
    *count = client->partition_count;
    for (size_t i = 0; i < client->route_count; i++) {
        if (strcmp(client->routes[i].method, method_path) == 0) {
            *out = client->routes[i];
        }
    }
    pthread_mutex_unlock(&client->lock);
    return KF_OK;
}

/* The endpoint serving `partition`; the first when none is known (its
 * refusal names the owner). */
static size_t endpoint_of(kf_client_t *client, uint32_t partition) {
    pthread_mutex_lock(&client->lock);
    int e = client->owner[partition];
    pthread_mutex_unlock(&client->lock);
    return e >= 0 ? (size_t)e : 0;
}

/* The endpoints serving at least one partition, in order (*n of them). */
static void served_endpoints(kf_client_t *client, size_t out[KF_CLIENT_ENDPOINTS_MAX], size_t *n) {
    bool serves[KF_CLIENT_ENDPOINTS_MAX] = {false};
    pthread_mutex_lock(&client->lock);
    for (uint32_t p = 0; p < client->partition_count; p++) {
        if (client->owner[p] >= 0) {
            serves[client->owner[p]] = true;
        }
    }
    pthread_mutex_unlock(&client->lock);
    *n = 0;
    for (size_t e = 0; e < client->endpoint_count; e++) {
        if (serves[e]) {
            out[(*n)++] = e;
        }
    }
}

/* The string field at a dotted path of a message ("coordinator.workflow");
 * "" when a message on the way is unset. */
static const char *string_at(const ProtobufCMessage *msg, const char *path) {
    char name[ROUTE_FIELD_BYTES_MAX];
    for (;;) {
        const char *dot = strchr(path, '.');
        size_t len = dot != NULL ? (size_t)(dot - path) : strlen(path);
        KF_ASSERT(len < sizeof name);
        memcpy(name, path, len);
        name[len] = '\0';
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field_by_name(msg->descriptor, name);
        if (f == NULL) {
            return "";
        }
        const void *at = (const char *)msg + f->offset;
        if (dot == NULL) {
            const char *text = f->type == PROTOBUF_C_TYPE_STRING ? *(char *const *)at : NULL;
            return text != NULL ? text : "";
        }
        if (f->type != PROTOBUF_C_TYPE_MESSAGE || *(ProtobufCMessage *const *)at == NULL) {
            return "";
        }
        msg = *(ProtobufCMessage *const *)at;
        path = dot + 1;
    }
}

/* The partition of a function key given as its text: the value, or a JSON
 * array of the values when the function has several key columns (which
 * its descriptor says: asked of the first serving endpoint). */
static kf_status_t partition_of_function_key(kf_client_t *client, const char *function_id,
                                             const char *key, uint32_t count, int64_t timeout_ms,
                                             uint32_t *out, kf_error_t *err) {
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    Keyflow__V1__GetFunctionRequest req = KEYFLOW__V1__GET_FUNCTION_REQUEST__INIT;
    req.function_id = (char *)function_id;
    ProtobufCMessage *msg = NULL;
    size_t served[KF_CLIENT_ENDPOINTS_MAX], n = 0;
    served_endpoints(client, served, &n);
    kf_status_t st =
        call_on(client, n > 0 ? served[0] : 0, KF_CLIENT_PATH_GET_FUNCTION, &req.base,
                &keyflow__v1__function_info__descriptor, &arena, timeout_ms, &msg, NULL, err);
    const Keyflow__V1__FunctionInfo *info = (const void *)msg;
    kf_partition_hasher_t h;
    kf_partition_hasher_init(&h);
    if (st == KF_OK && info->descriptor != NULL && info->descriptor->n_key_columns > 1) {
        json_error_t jerr;
        json_t *values = json_loads(key, 0, &jerr);
        size_t i;
        json_t *v;
        if (!json_is_array(values) || json_array_size(values) != info->descriptor->n_key_columns) {
            st = kf_error_set(err, KF_E_INVALID,
                              "key: a JSON array of the %zu key columns' values, got %s",
                              info->descriptor->n_key_columns, key);
        }
        json_array_foreach(values, i, v) {
            if (st == KF_OK && !json_is_string(v)) {
                st = kf_error_set(err, KF_E_INVALID, "key[%zu]: a string, got %s", i, key);
            }
            if (st == KF_OK) {
                kf_partition_hasher_column(&h, json_string_value(v), json_string_length(v));
            }
        }
        json_decref(values);
    } else if (st == KF_OK) {
        kf_partition_hasher_column(&h, key, strlen(key));
    }
    if (st == KF_OK) {
        *out = kf_partition_hasher_partition(&h, count);
    }
    kf_arena_deinit(&arena);
    return st;
}

/* The partition a keyed call names; *known false when it names none (a
 * run ID without one: any endpoint answers it as not found). */
static kf_status_t partition_of(kf_client_t *client, const route_t *route,
                                const ProtobufCMessage *request, uint32_t count, int64_t timeout_ms,
                                uint32_t *out, bool *known, kf_error_t *err) {
    *known = true;
    switch (route->kind) {
    case ROUTE_BY_COORDINATOR: {
        const char *workflow = string_at(request, route->fields[0]);
        const char *key = string_at(request, route->fields[1]);
        *out = kf_partition_of_coordinator(workflow, strlen(workflow), key, strlen(key), count);
        return KF_OK;
    }
    case ROUTE_BY_RUN_ID: {
        int32_t p = kf_partition_of_run_id(string_at(request, route->fields[0]), count);
        *known = p >= 0;
        *out = p >= 0 ? (uint32_t)p : 0;
        return KF_OK;
    }
    case ROUTE_BY_FUNCTION_KEY:
        return partition_of_function_key(client, string_at(request, route->fields[0]),
                                         string_at(request, route->fields[1]), count, timeout_ms,
                                         out, err);
    default: KF_UNREACHABLE();
    }
}

/* The call at the endpoint serving partition `p` (the first endpoint when
 * !known); a refusal as another process's partition asks the endpoints
 * again and retries once, where they now say. *endpoint: who answered. */
static kf_status_t call_at_partition(kf_client_t *client, uint32_t p, bool known,
                                     const char *method_path, const ProtobufCMessage *request,
                                     const ProtobufCMessageDescriptor *response_desc,
                                     kf_arena_t *arena, int64_t timeout_ms,
                                     ProtobufCMessage **response, size_t *endpoint,
                                     kf_error_t *err) {
    for (int attempt = 1;; attempt++) {
        size_t e = known ? endpoint_of(client, p) : 0;
        bool misdirected = false;
        *endpoint = e;
        kf_status_t st = call_on(client, e, method_path, request, response_desc, arena, timeout_ms,
                                 response, &misdirected, err);
        if (!misdirected || attempt == 2) {
            return st;
        }
        /* The partition moved: ask again; once. */
        kf_error_t again;
        if (discover(client, timeout_ms, &again) != KF_OK || endpoint_of(client, p) == e) {
            return st;
        }
    }
}

static kf_status_t call_keyed(kf_client_t *client, const route_t *route, uint32_t count,
                              const char *method_path, const ProtobufCMessage *request,
                              const ProtobufCMessageDescriptor *response_desc, kf_arena_t *arena,
                              int64_t timeout_ms, ProtobufCMessage **response, kf_error_t *err) {
    uint32_t p = 0;
    bool known = false;
    kf_status_t st = partition_of(client, route, request, count, timeout_ms, &p, &known, err);
    size_t e = 0;
    return st != KF_OK ? st
                       : call_at_partition(client, p, known, method_path, request, response_desc,
                                           arena, timeout_ms, response, &e, err);
}

/* ---- SINGLE functions: every call at the home's endpoint -----------------
 *
 * A function of placement SINGLE (the default) keeps every key in its home
 * partition (kf_partition_home_of_function), so every call about it -
 * PushBatch, DryRunBatch, ReplayBatch, ReadOutput, TailOutput, TrimOutput,
 * GetKeyState, GetFunction - goes to the endpoint serving that partition as
 * it is: a batch whole (one atomic step), output paged by after_seq (one
 * sequence, no cursor), the function's description that endpoint's. The
 * placement is asked of that endpoint with GetFunction, which a SPLIT call
 * needs anyway for its key columns; a SPLIT function, and every function of
 * a keyflowd from before placement (which answers UNSPECIFIED), takes the
 * split and merge plans. Issue 22 moves this choice, with those plans, into
 * the module shared with the server's router. */

static bool function_keyed(const char *method_path) {
    static const char *const paths[] = {
        KF_CLIENT_PATH_PUSH_BATCH,    KF_CLIENT_PATH_DRY_RUN_BATCH, KF_CLIENT_PATH_REPLAY_BATCH,
        KF_CLIENT_PATH_READ_OUTPUT,   KF_CLIENT_PATH_TAIL_OUTPUT,   KF_CLIENT_PATH_TRIM_OUTPUT,
        KF_CLIENT_PATH_GET_KEY_STATE, KF_CLIENT_PATH_GET_FUNCTION,
    };
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        if (strcmp(paths[i], method_path) == 0) {
            return true;
        }
    }
    return false;
}

/* GetFunction of `function_id` at the endpoint serving its home: *info (in
 * `arena`) and *endpoint, the endpoint that answered. */
static kf_status_t home_info(kf_client_t *client, const char *function_id, uint32_t count,
                             kf_arena_t *arena, int64_t timeout_ms, size_t *endpoint,
                             Keyflow__V1__FunctionInfo **info, kf_error_t *err) {
    Keyflow__V1__GetFunctionRequest req = KEYFLOW__V1__GET_FUNCTION_REQUEST__INIT;
    req.function_id = (char *)function_id;
    ProtobufCMessage *msg = NULL;
    kf_status_t st = call_at_partition(
        client, kf_partition_home_of_function(function_id, strlen(function_id), count), true,
        KF_CLIENT_PATH_GET_FUNCTION, &req.base, &keyflow__v1__function_info__descriptor, arena,
        timeout_ms, &msg, endpoint, err);
    *info = (Keyflow__V1__FunctionInfo *)msg;
    return st;
}

/* Whether the function a function-keyed request names is SINGLE; then
 * *endpoint serves its home, and *info (in `arena`) is that endpoint's
 * description of it. */
static kf_status_t single_home(kf_client_t *client, const ProtobufCMessage *request, uint32_t count,
                               kf_arena_t *arena, int64_t timeout_ms, bool *single,
                               size_t *endpoint, Keyflow__V1__FunctionInfo **info,
                               kf_error_t *err) {
    *single = false;
    kf_status_t st = home_info(client, string_at(request, "function_id"), count, arena, timeout_ms,
                               endpoint, info, err);
    if (st == KF_OK) {
        *single = (*info)->placement == KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SINGLE;
    }
    return st;
}

/* Adds another endpoint's description of a SPLIT function into `into`
 * (its partitions' shares after into's, in `arena`). */
static kf_status_t function_info_add(Keyflow__V1__FunctionInfo *into,
                                     const Keyflow__V1__FunctionInfo *other, kf_arena_t *arena,
                                     kf_error_t *err) {
    if (other->n_partitions > 0) {
        size_t n = into->n_partitions + other->n_partitions;
        Keyflow__V1__PartitionShare **all = kf_arena_zalloc(arena, (n + 1) * sizeof *all);
        if (all == NULL) {
            return kf_error_set(err, KF_E_LIMIT, "response: the arena is full");
        }
        if (into->n_partitions > 0) {
            memcpy(all, into->partitions, into->n_partitions * sizeof *all);
        }
        memcpy(all + into->n_partitions, other->partitions, other->n_partitions * sizeof *all);
        into->partitions = all;
        into->n_partitions = n;
    }
    into->keys += other->keys;
    into->timers += other->timers;
    into->state_bytes += other->state_bytes;
    into->output_seq += other->output_seq;
    into->due_timers += other->due_timers;
    into->watermark_us =
        other->watermark_us < into->watermark_us ? other->watermark_us : into->watermark_us;
    into->available = into->available && other->available;
    return KF_OK;
}

/* Adds endpoint `endpoint`'s page of ListFunctions into `into` (the first
 * endpoint's page for the same request): a SINGLE function's entry becomes
 * its home's endpoint's, a SPLIT function's entries are added up, and a
 * function `into` does not list is appended (in `arena`). */
static kf_status_t list_functions_add(kf_client_t *client, Keyflow__V1__ListFunctionsResponse *into,
                                      const Keyflow__V1__ListFunctionsResponse *other,
                                      size_t endpoint, kf_arena_t *arena, kf_error_t *err) {
    pthread_mutex_lock(&client->lock);
    uint32_t count = client->partition_count;
    pthread_mutex_unlock(&client->lock);
    for (size_t k = 0; k < other->n_functions; k++) {
        Keyflow__V1__FunctionInfo *b = other->functions[k];
        const char *id = b->descriptor != NULL ? b->descriptor->function_id : "";
        Keyflow__V1__FunctionInfo **a = NULL;
        for (size_t i = 0; i < into->n_functions && a == NULL; i++) {
            const Keyflow__V1__FunctionDescriptor *d = into->functions[i]->descriptor;
            a = d != NULL && strcmp(d->function_id, id) == 0 ? &into->functions[i] : NULL;
        }
        if (a == NULL) {
            Keyflow__V1__FunctionInfo **all =
                kf_arena_zalloc(arena, (into->n_functions + 2) * sizeof *all);
            if (all == NULL) {
                return kf_error_set(err, KF_E_LIMIT, "response: the arena is full");
            }
            if (into->n_functions > 0) {
                memcpy(all, into->functions, into->n_functions * sizeof *all);
            }
            all[into->n_functions] = b;
            into->functions = all;
            into->n_functions++;
        } else if (b->placement == KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SINGLE) {
            if (count > 0 && endpoint_of(client, kf_partition_home_of_function(
                                                     id, strlen(id), count)) == endpoint) {
                *a = b;
            }
        } else {
            kf_status_t st = function_info_add(*a, b, arena, err);
            if (st != KF_OK) {
                return st;
            }
        }
    }
    return KF_OK;
}

static kf_status_t call_all(kf_client_t *client, const char *method_path,
                            const ProtobufCMessage *request,
                            const ProtobufCMessageDescriptor *response_desc, kf_arena_t *arena,
                            int64_t timeout_ms, ProtobufCMessage **response, kf_error_t *err) {
    size_t served[KF_CLIENT_ENDPOINTS_MAX], n = 0;
    served_endpoints(client, served, &n);
    bool deleting = strcmp(method_path, KF_CLIENT_PATH_DELETE_FUNCTION) == 0 ||
                    strcmp(method_path, KF_CLIENT_PATH_DELETE_PRODUCER) == 0;
    ProtobufCMessage *first = NULL;
    kf_error_t missing = {0};
    for (size_t i = 0; i < n; i++) {
        ProtobufCMessage *msg = NULL;
        kf_error_t call_err;
        if (call_on(client, served[i], method_path, request, response_desc, arena, timeout_ms, &msg,
                    NULL, &call_err) != KF_OK) {
            if (deleting && call_err.status == KF_E_NOT_FOUND) {
                missing = call_err; /* only when no endpoint knew it */
                continue;
            }
            *response = NULL;
            return kf_error_set(err, call_err.status, "%s: %s", client->endpoints[served[i]],
                                call_err.message);
        }
        kf_status_t st = KF_OK;
        if (first == NULL) {
            first = msg;
        } else if (response_desc == &keyflow__v1__function_info__descriptor) {
            st = function_info_add((void *)first, (const void *)msg, arena, err);
        } else if (response_desc == &keyflow__v1__register_function_response__descriptor) {
            Keyflow__V1__RegisterFunctionResponse *a = (void *)first;
            const Keyflow__V1__RegisterFunctionResponse *b = (const void *)msg;
            a->already_registered = a->already_registered && b->already_registered;
            if (a->function != NULL && b->function != NULL) {
                /* A SINGLE function's description is its home's endpoint's. */
                if (b->function->placement == KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SINGLE) {
                    const char *id =
                        b->function->descriptor != NULL ? b->function->descriptor->function_id : "";
                    pthread_mutex_lock(&client->lock);
                    uint32_t count = client->partition_count;
                    pthread_mutex_unlock(&client->lock);
                    if (count > 0 && endpoint_of(client, kf_partition_home_of_function(
                                                             id, strlen(id), count)) == served[i]) {
                        a->function = b->function;
                    }
                } else {
                    st = function_info_add(a->function, b->function, arena, err);
                }
            }
        } else if (response_desc == &keyflow__v1__list_functions_response__descriptor) {
            st =
                list_functions_add(client, (void *)first, (const void *)msg, served[i], arena, err);
        } else if (response_desc == &keyflow__v1__delete_function_response__descriptor) {
            Keyflow__V1__DeleteFunctionResponse *a = (void *)first;
            const Keyflow__V1__DeleteFunctionResponse *b = (const void *)msg;
            a->deleted = a->deleted || b->deleted;
            a->keys += b->keys;
            a->timers += b->timers;
            a->output_rows += b->output_rows;
            a->producers += b->producers;
        }
        if (st != KF_OK) {
            *response = NULL;
            return st;
        }
    }
    *response = first;
    if (first == NULL) {
        return missing.status != KF_OK
                   ? kf_error_set(err, missing.status, "%s", missing.message)
                   : kf_error_set(err, KF_E_UNAVAILABLE, "%s: no endpoint serves a partition",
                                  method_path);
    }
    return KF_OK;
}

/* ListRuns endpoint after endpoint behind one page token. */
static kf_status_t call_list_runs(kf_client_t *client, const ProtobufCMessage *request,
                                  kf_arena_t *arena, int64_t timeout_ms,
                                  ProtobufCMessage **response, kf_error_t *err) {
    size_t served[KF_CLIENT_ENDPOINTS_MAX], n = 0;
    served_endpoints(client, served, &n);
    Keyflow__V1__ListRunsRequest req = *(const Keyflow__V1__ListRunsRequest *)request;
    size_t at = 0;
    const char *token = req.page_token != NULL ? req.page_token : "";
    if (token[0] != '\0') {
        char *end = NULL;
        unsigned long e = token[0] == 'e' ? strtoul(token + 1, &end, 10) : 0;
        if (end == NULL || *end != ':' || e >= client->endpoint_count) {
            *response = NULL;
            return kf_error_set(err, KF_E_INVALID,
                                "page_token: not a token of this list of endpoints: \"%s\"", token);
        }
        for (at = 0; at < n && served[at] != e; at++) {
        }
        req.page_token = end + 1;
    }
    for (; at < n; at++) {
        ProtobufCMessage *msg = NULL;
        kf_status_t st = call_on(client, served[at], KF_CLIENT_PATH_LIST_RUNS, &req.base,
                                 &keyflow__v1__list_runs_response__descriptor, arena, timeout_ms,
                                 &msg, NULL, err);
        if (st != KF_OK) {
            *response = NULL;
            return st;
        }
        Keyflow__V1__ListRunsResponse *resp = (void *)msg;
        const char *next = resp->next_page_token != NULL ? resp->next_page_token : "";
        if (next[0] != '\0') {
            resp->next_page_token = kf_arena_printf(arena, "e%zu:%s", served[at], next);
        } else if (at + 1 < n) {
            resp->next_page_token = kf_arena_printf(arena, "e%zu:", served[at + 1]);
        }
        if (resp->next_page_token == NULL) {
            *response = NULL;
            return kf_error_set(err, KF_E_LIMIT, "response: the arena is full");
        }
        *response = msg;
        return KF_OK;
    }
    *response = NULL;
    return kf_error_set(err, KF_E_UNAVAILABLE, "ListRuns: no endpoint serves a partition");
}

static int64_t now_ms(void) {
    gpr_timespec t = gpr_now(GPR_CLOCK_MONOTONIC);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* PollRuns: the endpoints in turn without waiting, then each in turn for a
 * slice of the wait, until one hands out runs or the wait is over. */
static kf_status_t call_poll_runs(kf_client_t *client, const ProtobufCMessage *request,
                                  kf_arena_t *arena, int64_t timeout_ms,
                                  ProtobufCMessage **response, kf_error_t *err) {
    size_t served[KF_CLIENT_ENDPOINTS_MAX], n = 0;
    served_endpoints(client, served, &n);
    Keyflow__V1__PollRunsRequest req = *(const Keyflow__V1__PollRunsRequest *)request;
    int64_t wait_ms = req.wait_ms;
    int64_t deadline_ms = now_ms() + wait_ms;
    pthread_mutex_lock(&client->lock);
    size_t start = client->rotation++;
    pthread_mutex_unlock(&client->lock);
    for (size_t round = 0;; round++) {
        for (size_t k = 0; k < n; k++) {
            int64_t left_ms = deadline_ms - now_ms();
            req.wait_ms = round == 0 || left_ms <= 0
                              ? 0
                              : (left_ms < ROUTED_POLL_SLICE_MS ? left_ms : ROUTED_POLL_SLICE_MS);
            ProtobufCMessage *msg = NULL;
            kf_status_t st = call_on(client, served[(start + k) % n], KF_CLIENT_PATH_POLL_RUNS,
                                     &req.base, &keyflow__v1__poll_runs_response__descriptor, arena,
                                     timeout_ms - wait_ms + req.wait_ms, &msg, NULL, err);
            if (st != KF_OK) {
                *response = NULL;
                return st;
            }
            *response = msg;
            if (((Keyflow__V1__PollRunsResponse *)msg)->n_runs > 0) {
                return KF_OK;
            }
        }
        if (n == 0 || now_ms() >= deadline_ms) {
            return n > 0 ? KF_OK
                         : kf_error_set(err, KF_E_UNAVAILABLE,
                                        "PollRuns: no endpoint serves a partition");
        }
    }
}

/* SendEvents split by the events' endpoints; the results in the events'
 * order. Each endpoint's events are one durable write of their own. */
static kf_status_t call_send_events(kf_client_t *client, const ProtobufCMessage *request,
                                    uint32_t count, kf_arena_t *arena, int64_t timeout_ms,
                                    ProtobufCMessage **response, kf_error_t *err) {
    const Keyflow__V1__SendEventsRequest *req = (const void *)request;
    *response = NULL;
    Keyflow__V1__SendEventsResponse *out = kf_arena_zalloc(arena, sizeof *out);
    size_t *endpoint = kf_arena_zalloc(arena, (req->n_events + 1) * sizeof *endpoint);
    Keyflow__V1__SendEventRequest **part =
        kf_arena_zalloc(arena, (req->n_events + 1) * sizeof *part);
    size_t *where = kf_arena_zalloc(arena, (req->n_events + 1) * sizeof *where);
    if (out == NULL || endpoint == NULL || part == NULL || where == NULL) {
        return kf_error_set(err, KF_E_LIMIT, "request: the arena is full");
    }
    keyflow__v1__send_events_response__init(out);
    out->results = kf_arena_zalloc(arena, (req->n_events + 1) * sizeof *out->results);
    if (out->results == NULL) {
        return kf_error_set(err, KF_E_LIMIT, "request: the arena is full");
    }
    out->n_results = req->n_events;
    for (size_t i = 0; i < req->n_events; i++) {
        const Keyflow__V1__SendEventRequest *ev = req->events[i];
        const char *workflow = ev->workflow != NULL ? ev->workflow : "";
        const char *key = ev->key != NULL ? ev->key : "";
        endpoint[i] = endpoint_of(client, kf_partition_of_coordinator(workflow, strlen(workflow),
                                                                      key, strlen(key), count));
    }
    for (size_t e = 0; e < client->endpoint_count; e++) {
        Keyflow__V1__SendEventsRequest sub = KEYFLOW__V1__SEND_EVENTS_REQUEST__INIT;
        sub.events = part;
        for (size_t i = 0; i < req->n_events; i++) {
            if (endpoint[i] == e) {
                where[sub.n_events] = i;
                part[sub.n_events++] = req->events[i];
            }
        }
        if (sub.n_events == 0) {
            continue;
        }
        ProtobufCMessage *msg = NULL;
        kf_status_t st = call_on(client, e, KF_CLIENT_PATH_SEND_EVENTS, &sub.base,
                                 &keyflow__v1__send_events_response__descriptor, arena, timeout_ms,
                                 &msg, NULL, err);
        if (st != KF_OK) {
            return st;
        }
        const Keyflow__V1__SendEventsResponse *got = (const void *)msg;
        if (got->n_results != sub.n_events) {
            return kf_error_set(err, KF_E_INTERNAL,
                                "SendEvents: %s answered %zu results for %zu events",
                                client->endpoints[e], got->n_results, sub.n_events);
        }
        for (size_t k = 0; k < sub.n_events; k++) {
            out->results[where[k]] = got->results[k];
        }
    }
    *response = &out->base;
    return KF_OK;
}

/* The input-schema index of each key column of `function_id` (asked of the
 * first serving endpoint); *n of them. */
static kf_status_t key_columns_of(kf_client_t *client, const char *function_id, int64_t timeout_ms,
                                  kf_arena_t *arena, const Keyflow__V1__FunctionDescriptor **out,
                                  size_t cols[], size_t *n, kf_error_t *err) {
    Keyflow__V1__GetFunctionRequest req = KEYFLOW__V1__GET_FUNCTION_REQUEST__INIT;
    req.function_id = (char *)function_id;
    ProtobufCMessage *msg = NULL;
    size_t served[KF_CLIENT_ENDPOINTS_MAX], count = 0;
    served_endpoints(client, served, &count);
    kf_status_t st =
        call_on(client, count > 0 ? served[0] : 0, KF_CLIENT_PATH_GET_FUNCTION, &req.base,
                &keyflow__v1__function_info__descriptor, arena, timeout_ms, &msg, NULL, err);
    if (st != KF_OK) {
        return st;
    }
    const Keyflow__V1__FunctionDescriptor *d = ((const Keyflow__V1__FunctionInfo *)msg)->descriptor;
    if (d == NULL || d->input_schema == NULL || d->n_key_columns > KF_KEY_COLUMNS_MAX) {
        return kf_error_set(err, KF_E_INTERNAL, "function %s: no usable descriptor", function_id);
    }
    *n = 0;
    for (size_t k = 0; k < d->n_key_columns; k++) {
        for (size_t i = 0; i < d->input_schema->n_fields; i++) {
            if (strcmp(d->input_schema->fields[i]->name, d->key_columns[k]) == 0) {
                cols[(*n)++] = i;
            }
        }
    }
    *out = d;
    return KF_OK;
}

/* Column values of one kind (`field` of the oneof, message `Type`): the
 * values of rows `which` of `in` into `col`; NULL (from the function) when
 * `in` holds fewer values than a row asks for. */
#define SLICE_VALUES(field, Type, init)                                                            \
    do {                                                                                           \
        Type *v = kf_arena_zalloc(arena, sizeof *v);                                               \
        if (v == NULL || in->field == NULL) {                                                      \
            return NULL;                                                                           \
        }                                                                                          \
        init(v);                                                                                   \
        v->values = kf_arena_zalloc(arena, (n + 1) * sizeof *v->values);                           \
        if (v->values == NULL) {                                                                   \
            return NULL;                                                                           \
        }                                                                                          \
        for (size_t i = 0; i < n; i++) {                                                           \
            if (which[i] >= in->field->n_values) {                                                 \
                return NULL;                                                                       \
            }                                                                                      \
            v->values[i] = in->field->values[which[i]];                                            \
        }                                                                                          \
        v->n_values = n;                                                                           \
        col->field = v;                                                                            \
    } while (0)

/* Rows `which[0..n)` of a columnar batch as a batch of their own. */
static Keyflow__V1__RowBatch *slice_batch(const Keyflow__V1__RowBatch *batch, const size_t *which,
                                          size_t n, kf_arena_t *arena) {
    Keyflow__V1__RowBatch *out = kf_arena_zalloc(arena, sizeof *out);
    Keyflow__V1__Column **cols = kf_arena_zalloc(arena, (batch->n_columns + 1) * sizeof *cols);
    if (out == NULL || cols == NULL) {
        return NULL;
    }
    keyflow__v1__row_batch__init(out);
    out->row_count = (int64_t)n;
    out->columns = cols;
    out->n_columns = batch->n_columns;
    for (size_t c = 0; c < batch->n_columns; c++) {
        const Keyflow__V1__Column *in = batch->columns[c];
        Keyflow__V1__Column *col = kf_arena_zalloc(arena, sizeof *col);
        if (col == NULL) {
            return NULL;
        }
        keyflow__v1__column__init(col);
        cols[c] = col;
        col->name = in->name;
        col->values_case = in->values_case;
        if (in->n_nulls > 0) {
            col->nulls = kf_arena_zalloc(arena, (n + 1) * sizeof *col->nulls);
            if (col->nulls == NULL) {
                return NULL;
            }
            for (size_t i = 0; i < n; i++) {
                col->nulls[i] = which[i] < in->n_nulls ? in->nulls[which[i]] : 0;
            }
            col->n_nulls = n;
        }
        switch (in->values_case) {
        case KEYFLOW__V1__COLUMN__VALUES_BOOLS:
            SLICE_VALUES(bools, Keyflow__V1__BoolValues, keyflow__v1__bool_values__init);
            break;
        case KEYFLOW__V1__COLUMN__VALUES_INT64S:
            SLICE_VALUES(int64s, Keyflow__V1__Int64Values, keyflow__v1__int64_values__init);
            break;
        case KEYFLOW__V1__COLUMN__VALUES_FLOAT64S:
            SLICE_VALUES(float64s, Keyflow__V1__Float64Values, keyflow__v1__float64_values__init);
            break;
        case KEYFLOW__V1__COLUMN__VALUES_STRINGS:
            SLICE_VALUES(strings, Keyflow__V1__StringValues, keyflow__v1__string_values__init);
            break;
        case KEYFLOW__V1__COLUMN__VALUES_BYTES_VALUES:
            SLICE_VALUES(bytes_values, Keyflow__V1__BytesValues, keyflow__v1__bytes_values__init);
            break;
        default: break; /* no values: the server names what is missing */
        }
    }
    return out;
}

/* The rows of a PushBatch or DryRunBatch, columnar or rows_json, with the
 * endpoint of each row's key. */
typedef struct split_rows {
    size_t rows;
    size_t *endpoint; /* per row */
    json_t *json;     /* rows_json parsed (an array), or NULL; freed by split_rows_done */
    size_t endpoints[KF_CLIENT_ENDPOINTS_MAX];
    size_t endpoint_count; /* distinct endpoints the rows reach */
} split_rows_t;

static void split_rows_done(split_rows_t *s) {
    json_decref(s->json);
    s->json = NULL;
}

/* Finds each row's partition with kf-hash-1 over its key columns (the
 * function's descriptor, from the first serving endpoint) and the endpoint
 * serving it. A row of a partition no endpoint given serves refuses the
 * whole call here, before anything is sent: the rows of the other
 * partitions must not be applied without it (the server refuses such a
 * batch as a whole too). */
static kf_status_t split_rows(kf_client_t *client, const char *method, const char *function_id,
                              const Keyflow__V1__RowBatch *batch, const char *rows_json,
                              uint32_t count, kf_arena_t *arena, int64_t timeout_ms,
                              split_rows_t *out, kf_error_t *err) {
    memset(out, 0, sizeof *out);
    const Keyflow__V1__FunctionDescriptor *d = NULL;
    size_t key_cols[KF_KEY_COLUMNS_MAX], n_keys = 0;
    kf_status_t st =
        key_columns_of(client, function_id, timeout_ms, arena, &d, key_cols, &n_keys, err);
    if (st != KF_OK) {
        return st;
    }
    if (batch != NULL) {
        out->rows = batch->row_count > 0 ? (size_t)batch->row_count : 0;
    } else {
        json_error_t jerr;
        const char *text = rows_json != NULL ? rows_json : "";
        out->json = json_loadb(text, strlen(text), KF_JSON_LOAD_FLAGS, &jerr);
        if (!json_is_array(out->json)) {
            split_rows_done(out);
            return kf_error_set(err, KF_E_INVALID, "rows_json: a JSON array of objects (%s)",
                                jerr.text);
        }
        out->rows = json_array_size(out->json);
    }
    out->endpoint = kf_arena_zalloc(arena, (out->rows + 1) * sizeof *out->endpoint);
    if (out->endpoint == NULL) {
        split_rows_done(out);
        return kf_error_set(err, KF_E_LIMIT, "request: the arena is full");
    }
    for (size_t r = 0; r < out->rows; r++) {
        kf_partition_hasher_t h;
        kf_partition_hasher_init(&h);
        for (size_t k = 0; k < n_keys; k++) {
            const char *v = NULL;
            size_t len = 0;
            if (batch != NULL) {
                const Keyflow__V1__Column *col =
                    key_cols[k] < batch->n_columns ? batch->columns[key_cols[k]] : NULL;
                if (col != NULL && col->values_case == KEYFLOW__V1__COLUMN__VALUES_STRINGS &&
                    col->strings != NULL && r < col->strings->n_values) {
                    v = col->strings->values[r];
                    len = strlen(v);
                }
            } else {
                json_t *cell = json_object_get(json_array_get(out->json, r), d->key_columns[k]);
                if (json_is_string(cell)) {
                    v = json_string_value(cell);
                    len = json_string_length(cell);
                }
            }
            if (v == NULL) {
                split_rows_done(out);
                return batch != NULL
                           ? kf_error_set(err, KF_E_INVALID,
                                          "batch.columns[%zu]: key column \"%s\" needs %zu UTF8 "
                                          "values",
                                          key_cols[k], d->key_columns[k], out->rows)
                           : kf_error_set(err, KF_E_INVALID,
                                          "rows_json[%zu]: key column \"%s\" needs a string", r,
                                          d->key_columns[k]);
            }
            kf_partition_hasher_column(&h, v, len);
        }
        uint32_t p = kf_partition_hasher_partition(&h, count);
        pthread_mutex_lock(&client->lock);
        int e = client->owner[p];
        pthread_mutex_unlock(&client->lock);
        if (e < 0) {
            split_rows_done(out);
            return kf_error_set(err, KF_E_NOT_OWNER,
                                "%s: row %zu's key belongs to partition %u of %u, which no "
                                "endpoint given serves; nothing was sent (give every process of "
                                "the data set: docs/scaling.md)",
                                method, r, p, count);
        }
        out->endpoint[r] = (size_t)e;
        bool seen = false;
        for (size_t i = 0; i < out->endpoint_count; i++) {
            seen = seen || out->endpoints[i] == (size_t)e;
        }
        if (!seen) {
            out->endpoints[out->endpoint_count++] = (size_t)e;
        }
    }
    return KF_OK;
}

/* Rows `which[0..n)` of a rows_json array as an array of their own (the
 * objects as parsed, written again: the server reads the same values). */
static char *slice_rows_json(json_t *rows, const size_t *which, size_t n, kf_arena_t *arena) {
    json_t *part = json_array();
    for (size_t i = 0; part != NULL && i < n; i++) {
        if (json_array_append(part, json_array_get(rows, which[i])) != 0) {
            json_decref(part);
            part = NULL;
        }
    }
    char *text = part != NULL ? kf_json_dumps(part, JSON_COMPACT) : NULL;
    json_decref(part);
    char *out = text != NULL ? kf_arena_strdup(arena, text) : NULL;
    free(text);
    return out;
}

/* PushBatch split by the endpoints of its rows' keys: each endpoint gets its
 * rows, in order, under the call's producer and sequence (a retry is a
 * duplicate everywhere); a watermark goes to every serving endpoint. The
 * answers are combined as one process combines its partitions'. */
static kf_status_t call_push_batch(kf_client_t *client, const ProtobufCMessage *request,
                                   uint32_t count, kf_arena_t *arena, int64_t timeout_ms,
                                   ProtobufCMessage **response, kf_error_t *err) {
    const Keyflow__V1__PushBatchRequest *req = (const void *)request;
    *response = NULL;
    bool columnar = req->rows_case == KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_BATCH;
    const Keyflow__V1__RowBatch *batch = columnar ? req->batch : NULL;
    if (columnar && batch == NULL) {
        return kf_error_set(err, KF_E_INVALID, "batch: missing");
    }
    split_rows_t s;
    kf_status_t st =
        split_rows(client, "PushBatch", req->function_id, batch, columnar ? NULL : req->rows_json,
                   count, arena, timeout_ms, &s, err);
    if (st != KF_OK) {
        return st;
    }
    size_t *which = kf_arena_zalloc(arena, (s.rows + 1) * sizeof *which);
    if (which == NULL) {
        split_rows_done(&s);
        return kf_error_set(err, KF_E_LIMIT, "request: the arena is full");
    }
    size_t served[KF_CLIENT_ENDPOINTS_MAX], n_served = 0;
    served_endpoints(client, served, &n_served);
    Keyflow__V1__PushBatchResponse *out = NULL;
    size_t ranges = 0;
    for (size_t e = 0; st == KF_OK && e < client->endpoint_count; e++) {
        size_t n = 0;
        for (size_t r = 0; r < s.rows; r++) {
            if (s.endpoint[r] == e) {
                which[n++] = r;
            }
        }
        bool serving = false;
        for (size_t i = 0; i < n_served; i++) {
            serving = serving || served[i] == e;
        }
        if (n == 0 &&
            !(serving && req->watermark_present_case ==
                             KEYFLOW__V1__PUSH_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US)) {
            continue;
        }
        Keyflow__V1__PushBatchRequest sub = *req;
        if (columnar) {
            sub.batch = slice_batch(batch, which, n, arena);
        } else {
            sub.rows_json = slice_rows_json(s.json, which, n, arena);
        }
        if (columnar ? sub.batch == NULL : sub.rows_json == NULL) {
            st = columnar ? kf_error_set(err, KF_E_INVALID,
                                         "batch: a column holds fewer values than row_count (%zu)",
                                         s.rows)
                          : kf_error_set(err, KF_E_LIMIT, "request: the arena is full");
            break;
        }
        ProtobufCMessage *msg = NULL;
        st = call_on(client, e, KF_CLIENT_PATH_PUSH_BATCH, &sub.base,
                     &keyflow__v1__push_batch_response__descriptor, arena, timeout_ms, &msg, NULL,
                     err);
        if (st != KF_OK) {
            break; /* safe to retry as a whole: each endpoint has it once */
        }
        Keyflow__V1__PushBatchResponse *a = (void *)msg;
        if (out == NULL) {
            out = a;
            ranges = a->n_output_ranges;
            continue;
        }
        out->rows_accepted += a->rows_accepted;
        out->activations += a->activations;
        out->timer_callbacks += a->timer_callbacks;
        out->handler_calls += a->handler_calls;
        out->due_timers += a->due_timers;
        out->duplicate = out->duplicate && a->duplicate;
        out->watermark_us =
            a->watermark_us < out->watermark_us ? a->watermark_us : out->watermark_us;
        Keyflow__V1__OutputRange **all =
            kf_arena_zalloc(arena, (ranges + a->n_output_ranges + 1) * sizeof *all);
        if (all == NULL) {
            st = kf_error_set(err, KF_E_LIMIT, "response: the arena is full");
            break;
        }
        /* An answer without output rows has no array (memcpy takes no NULL). */
        if (ranges > 0) {
            memcpy(all, out->output_ranges, ranges * sizeof *all);
        }
        if (a->n_output_ranges > 0) {
            memcpy(all + ranges, a->output_ranges, a->n_output_ranges * sizeof *all);
        }
        ranges += a->n_output_ranges;
        out->output_ranges = all;
        out->n_output_ranges = ranges;
        out->first_output_seq = ranges == 1 ? all[0]->first_seq : 0;
        out->last_output_seq = ranges == 1 ? all[0]->last_seq : 0;
    }
    split_rows_done(&s);
    if (st != KF_OK) {
        return st;
    }
    if (out == NULL) {
        return kf_error_set(err, KF_E_INVALID, "batch: no rows and no watermark");
    }
    *response = &out->base;
    return KF_OK;
}

/* DryRunBatch as the server routes it: a batch that stays with one
 * endpoint goes there as it is (which refuses it in turn when it reaches
 * several of that process's partitions); one whose rows, or watermark,
 * would reach several endpoints is refused: a dry run steps one
 * partition's engine, and several engines' answers do not add up to one
 * step. */
static kf_status_t call_dry_run_batch(kf_client_t *client, const ProtobufCMessage *request,
                                      uint32_t count, kf_arena_t *arena, int64_t timeout_ms,
                                      ProtobufCMessage **response, kf_error_t *err) {
    const Keyflow__V1__DryRunBatchRequest *req = (const void *)request;
    *response = NULL;
    bool columnar = req->rows_case == KEYFLOW__V1__DRY_RUN_BATCH_REQUEST__ROWS_BATCH;
    if (columnar && req->batch == NULL) {
        return kf_error_set(err, KF_E_INVALID, "batch: missing");
    }
    split_rows_t s;
    kf_status_t st =
        split_rows(client, "DryRunBatch", req->function_id, columnar ? req->batch : NULL,
                   columnar ? NULL : req->rows_json, count, arena, timeout_ms, &s, err);
    if (st != KF_OK) {
        return st;
    }
    split_rows_done(&s);
    size_t served[KF_CLIENT_ENDPOINTS_MAX], n_served = 0;
    served_endpoints(client, served, &n_served);
    bool watermark = req->watermark_present_case ==
                     KEYFLOW__V1__DRY_RUN_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US;
    if (s.endpoint_count > 1 || (watermark && n_served > 1)) {
        return kf_error_set(err, KF_E_UNIMPLEMENTED,
                            "DryRunBatch: the batch would reach %zu processes (%s); dry-run one "
                            "partition's rows at a time",
                            watermark ? n_served : s.endpoint_count,
                            watermark ? "a watermark goes to every process" : "its rows' keys");
    }
    size_t e = s.endpoint_count == 1 ? s.endpoints[0] : (n_served > 0 ? served[0] : 0);
    return call_on(client, e, KF_CLIENT_PATH_DRY_RUN_BATCH, request,
                   &keyflow__v1__dry_run_batch_response__descriptor, arena, timeout_ms, response,
                   NULL, err);
}

/* An output cursor (docs/scaling.md): the partition read last and each
 * partition's position, "o1.<count>.<last>" then ".<partition>-<seq>". */
typedef struct cursor {
    uint32_t last;
    int64_t pos[KF_PARTITION_COUNT_MAX];
} cursor_t;

static bool cursor_parse(const char *text, uint32_t count, cursor_t *c) {
    memset(c, 0, sizeof *c);
    if (text == NULL || text[0] == '\0') {
        return true;
    }
    unsigned p = 0, last = 0;
    int used = 0;
    if (sscanf(text, "o1.%u.%u%n", &p, &last, &used) != 2 || p != count || last >= count) {
        return false;
    }
    c->last = last;
    for (const char *at = text + used; *at != '\0'; at += used) {
        unsigned part = 0;
        long long seq = 0;
        if (sscanf(at, ".%u-%lld%n", &part, &seq, &used) != 2 || part >= count || seq < 0) {
            return false;
        }
        c->pos[part] = seq;
    }
    return true;
}

static char *cursor_format(const cursor_t *c, uint32_t count, kf_arena_t *arena) {
    char *out = kf_arena_alloc(arena, KF_OUTPUT_CURSOR_BYTES_MAX);
    if (out == NULL) {
        return NULL;
    }
    size_t n = (size_t)snprintf(out, KF_OUTPUT_CURSOR_BYTES_MAX, "o1.%u.%u", count, c->last);
    for (uint32_t p = 0; p < count && n < KF_OUTPUT_CURSOR_BYTES_MAX; p++) {
        if (c->pos[p] > 0) {
            n += (size_t)snprintf(out + n, KF_OUTPUT_CURSOR_BYTES_MAX - n, ".%u-%lld", p,
                                  (long long)c->pos[p]);
        }
    }
    return out;
}

/* ReadOutput behind one cursor across endpoints: each endpoint in turn,
 * starting after the one holding the partition read last, moves only its
 * own partitions' positions, which are merged (per partition the furthest);
 * the first page with rows answers. A long poll then waits on each endpoint
 * in turn for a slice of the wait, as PollRuns does. */
static kf_status_t call_read_output(kf_client_t *client, const ProtobufCMessage *request,
                                    uint32_t count, kf_arena_t *arena, int64_t timeout_ms,
                                    ProtobufCMessage **response, kf_error_t *err) {
    Keyflow__V1__ReadOutputRequest req = *(const Keyflow__V1__ReadOutputRequest *)request;
    *response = NULL;
    size_t served[KF_CLIENT_ENDPOINTS_MAX], n = 0;
    served_endpoints(client, served, &n);
    cursor_t *c = kf_arena_zalloc(arena, sizeof *c);
    cursor_t *page_cursor = kf_arena_zalloc(arena, sizeof *page_cursor);
    if (c == NULL || page_cursor == NULL) {
        return kf_error_set(err, KF_E_LIMIT, "request: the arena is full");
    }
    if (!cursor_parse(req.cursor, count, c)) {
        return kf_error_set(err, KF_E_INVALID,
                            "cursor: \"%s\" is not an output cursor of a data set of %u "
                            "partitions",
                            req.cursor, count);
    }
    if (n == 0) {
        return kf_error_set(err, KF_E_UNAVAILABLE, "ReadOutput: no endpoint serves a partition");
    }
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        start = served[i] == endpoint_of(client, c->last) ? i + 1 : start;
    }
    int64_t wait_ms = req.wait_ms;
    int64_t deadline_ms = now_ms() + wait_ms;
    for (size_t round = 0;; round++) {
        for (size_t k = 0; k < n; k++) {
            int64_t left_ms = deadline_ms - now_ms();
            req.wait_ms = round == 0 || left_ms <= 0
                              ? 0
                              : (left_ms < ROUTED_POLL_SLICE_MS ? left_ms : ROUTED_POLL_SLICE_MS);
            req.cursor = cursor_format(c, count, arena);
            if (req.cursor == NULL) {
                return kf_error_set(err, KF_E_LIMIT, "request: the arena is full");
            }
            ProtobufCMessage *msg = NULL;
            kf_status_t st = call_on(client, served[(start + k) % n], KF_CLIENT_PATH_READ_OUTPUT,
                                     &req.base, &keyflow__v1__read_output_response__descriptor,
                                     arena, timeout_ms - wait_ms + req.wait_ms, &msg, NULL, err);
            if (st != KF_OK) {
                return st;
            }
            Keyflow__V1__ReadOutputResponse *page = (void *)msg;
            if (!cursor_parse(page->next_cursor, count, page_cursor)) {
                return kf_error_set(err, KF_E_INTERNAL, "ReadOutput: %s answered cursor \"%s\"",
                                    client->endpoints[served[(start + k) % n]], page->next_cursor);
            }
            for (uint32_t p = 0; p < count; p++) {
                c->pos[p] = page_cursor->pos[p] > c->pos[p] ? page_cursor->pos[p] : c->pos[p];
            }
            c->last = page->first_seq > 0 ? page_cursor->last : c->last;
            page->next_cursor = cursor_format(c, count, arena);
            if (page->next_cursor == NULL) {
                return kf_error_set(err, KF_E_LIMIT, "response: the arena is full");
            }
            *response = msg;
            if (page->first_seq > 0) {
                return KF_OK;
            }
        }
        if (now_ms() >= deadline_ms) {
            return KF_OK; /* no rows anywhere: the last (empty) page, the merged cursor */
        }
    }
}

static kf_status_t call_routed(kf_client_t *client, const char *method_path,
                               const ProtobufCMessage *request,
                               const ProtobufCMessageDescriptor *response_desc, kf_arena_t *arena,
                               int64_t timeout_ms, ProtobufCMessage **response, kf_error_t *err) {
    *response = NULL;
    route_t route;
    uint32_t count = 0;
    kf_status_t st = route_of(client, method_path, timeout_ms, &route, &count, err);
    if (st != KF_OK) {
        return st;
    }
    if (function_keyed(method_path)) {
        bool single = false;
        size_t home = 0;
        Keyflow__V1__FunctionInfo *info = NULL;
        st = single_home(client, request, count, arena, timeout_ms, &single, &home, &info, err);
        if (st != KF_OK) {
            return st;
        }
        if (single && strcmp(method_path, KF_CLIENT_PATH_GET_FUNCTION) == 0) {
            *response = &info->base;
            return KF_OK;
        }
        if (single) {
            const char *id = string_at(request, "function_id");
            return call_at_partition(client, kf_partition_home_of_function(id, strlen(id), count),
                                     true, method_path, request, response_desc, arena, timeout_ms,
                                     response, &home, err);
        }
    }
    switch (route.kind) {
    case ROUTE_BY_COORDINATOR:
    case ROUTE_BY_RUN_ID:
    case ROUTE_BY_FUNCTION_KEY:
        return call_keyed(client, &route, count, method_path, request, response_desc, arena,
                          timeout_ms, response, err);
    case ROUTE_ALL:
        return call_all(client, method_path, request, response_desc, arena, timeout_ms, response,
                        err);
    case ROUTE_MERGE:
        if (strcmp(method_path, KF_CLIENT_PATH_LIST_RUNS) == 0) {
            return call_list_runs(client, request, arena, timeout_ms, response, err);
        }
        if (strcmp(method_path, KF_CLIENT_PATH_READ_OUTPUT) == 0) {
            return call_read_output(client, request, count, arena, timeout_ms, response, err);
        }
        break;
    case ROUTE_FIRST:
        if (strcmp(method_path, KF_CLIENT_PATH_POLL_RUNS) == 0) {
            return call_poll_runs(client, request, arena, timeout_ms, response, err);
        }
        break;
    case ROUTE_SPLIT:
        if (strcmp(method_path, KF_CLIENT_PATH_SEND_EVENTS) == 0) {
            return call_send_events(client, request, count, arena, timeout_ms, response, err);
        }
        if (strcmp(method_path, KF_CLIENT_PATH_PUSH_BATCH) == 0) {
            return call_push_batch(client, request, count, arena, timeout_ms, response, err);
        }
        if (strcmp(method_path, KF_CLIENT_PATH_DRY_RUN_BATCH) == 0) {
            return call_dry_run_batch(client, request, count, arena, timeout_ms, response, err);
        }
        break;
    case ROUTE_HOME:
    case ROUTE_ANY:
        return call_on(client, 0, method_path, request, response_desc, arena, timeout_ms, response,
                       NULL, err);
    }
    return kf_error_set(err, KF_E_UNIMPLEMENTED,
                        "%s: with several endpoints the C client does not split or merge this "
                        "call (the Python and Node SDKs do); call each endpoint with a client of "
                        "its own",
                        method_path);
}

kf_status_t kf_client_call(kf_client_t *client, const char *method_path,
                           const ProtobufCMessage *request,
                           const ProtobufCMessageDescriptor *response_desc, kf_arena_t *arena,
                           int64_t timeout_ms, ProtobufCMessage **response, kf_error_t *err) {
    KF_ASSERT(client != NULL && arena != NULL && response != NULL);
    check_call_args(method_path, request, response_desc, timeout_ms);
    if (client->endpoint_count == 1) {
        return call_on(client, 0, method_path, request, response_desc, arena, timeout_ms, response,
                       NULL, err);
    }
    kf_status_t st =
        call_routed(client, method_path, request, response_desc, arena, timeout_ms, response, err);
    KF_ASSERT((st == KF_OK) == (*response != NULL));
    return st;
}

/* ---- streams ------------------------------------------------------------
 *
 *   open: START (send metadata, the request, half-close) and STATUS batches
 *     |
 *   next: RECV batch (the first also takes the initial metadata); its
 *     |   buffer counts only once its completion is collected (invariant 6)
 *     |   --message--> decode into the caller's arena, return it
 *     |   --none-----> messages_ended; with STATUS in: finish
 *     |   --timeout--> KF_AGAIN, the RECV stays in flight for the next call
 *     v
 *   finished: the outcome (OK end or error) is kept and returned again
 *   close: cancel, collect every pending batch, free
 *
 * The stream finishes only once the status is in and the messages have
 * ended, so every message the server sent before its status is handed out
 * first (after the status, a receive completes at once).
 */

/* Method paths are short constants; this bounds the copy kept for errors. */
#define STREAM_METHOD_PATH_BYTES_MAX 128

typedef enum stream_batch {
    STREAM_START,  /* send metadata, the request, half-close */
    STREAM_RECV,   /* one message (the first: initial metadata too) */
    STREAM_STATUS, /* the final status */
    STREAM_BATCH_KINDS,
} stream_batch_t;

struct kf_client_stream {
    grpc_call *call;
    grpc_completion_queue *cq; /* this stream's alone; drained at close */
    const ProtobufCMessageDescriptor *response_desc;
    char method_path[STREAM_METHOD_PATH_BYTES_MAX];
    grpc_byte_buffer *send_buffer; /* the request, until close */
    grpc_metadata_array initial_metadata;
    grpc_metadata_array trailing_metadata;
    grpc_byte_buffer *recv_buffer; /* written by the RECV batch in flight */
    grpc_byte_buffer *message;     /* a collected RECV's message, until next takes it */
    grpc_status_code code;         /* written by the STATUS batch */
    grpc_slice details;
    const char *error_string;
    char tags[STREAM_BATCH_KINDS]; /* one distinct address per batch kind */
    int pending;                   /* batches started and not yet collected */
    bool recv_pending;
    bool initial_metadata_asked;
    bool messages_ended; /* a RECV completed without a message */
    bool status_received;
    bool finished;      /* `outcome` is final */
    kf_error_t outcome; /* KF_OK: the server ended the stream with OK */
    /* A TailOutput over several endpoints (a fan): no call of its own but
     * one stream per serving endpoint, asked in turn, and the cursor
     * merged from every page handed out (docs/scaling.md). */
    kf_client_t *client;
    struct kf_client_stream *subs[KF_CLIENT_ENDPOINTS_MAX];
    size_t sub_endpoint[KF_CLIENT_ENDPOINTS_MAX];
    size_t sub_count; /* 0: an ordinary stream */
    size_t turn;      /* the sub-stream asked first by the next next */
    uint32_t partition_count;
    cursor_t *cursor;
};

static grpc_call_error stream_start_batch(kf_client_stream_t *stream, stream_batch_t kind,
                                          const grpc_op *ops, size_t count) {
    grpc_call_error rc = grpc_call_start_batch(stream->call, ops, count, &stream->tags[kind], NULL);
    if (rc == GRPC_CALL_OK) {
        stream->pending++;
    }
    return rc;
}

/* Books one completed batch. */
static void stream_collect(kf_client_stream_t *stream, const grpc_event *ev) {
    KF_ASSERT(ev->type == GRPC_OP_COMPLETE && stream->pending > 0);
    const char *tag = ev->tag;
    KF_ASSERT(tag >= stream->tags && tag < stream->tags + STREAM_BATCH_KINDS);
    stream->pending--;
    switch ((stream_batch_t)(tag - stream->tags)) {
    case STREAM_START: break; /* a failed send shows up in the status */
    case STREAM_RECV:
        /* Only now is recv_buffer this batch's answer (invariant 6). */
        KF_ASSERT(stream->recv_pending && stream->message == NULL);
        stream->recv_pending = false;
        stream->message = stream->recv_buffer;
        stream->recv_buffer = NULL;
        if (stream->message == NULL) {
            stream->messages_ended = true;
        }
        break;
    case STREAM_STATUS: stream->status_received = true; break;
    case STREAM_BATCH_KINDS: KF_UNREACHABLE();
    }
}

/* Makes `st` with err's message the stream's final outcome. */
static kf_status_t stream_finish(kf_client_stream_t *stream, kf_status_t st,
                                 const kf_error_t *err) {
    KF_ASSERT(!stream->finished);
    stream->finished = true;
    stream->outcome = *err;
    stream->outcome.status = st;
    return st;
}

static kf_status_t fan_open(kf_client_t *client, const ProtobufCMessage *request,
                            const ProtobufCMessageDescriptor *response_desc, int64_t timeout_ms,
                            kf_client_stream_t **out, kf_error_t *err);

static kf_status_t stream_open_on(kf_client_t *client, size_t endpoint, const char *method_path,
                                  const ProtobufCMessage *request,
                                  const ProtobufCMessageDescriptor *response_desc,
                                  int64_t timeout_ms, kf_client_stream_t **out, kf_error_t *err);

/* Opening a TailOutput over several endpoints asks for the placement and
 * the function's placement first; a stream without a deadline (0) still
 * bounds those calls. */
#define FAN_DISCOVER_TIMEOUT_MS 10000

kf_status_t kf_client_stream_open(kf_client_t *client, const char *method_path,
                                  const ProtobufCMessage *request,
                                  const ProtobufCMessageDescriptor *response_desc,
                                  int64_t timeout_ms, kf_client_stream_t **out, kf_error_t *err) {
    KF_ASSERT(client != NULL && out != NULL);
    check_call_args(method_path, request, response_desc, timeout_ms);
    KF_ASSERT(strlen(method_path) < STREAM_METHOD_PATH_BYTES_MAX);
    *out = NULL;
    if (client->endpoint_count == 1) {
        return stream_open_on(client, 0, method_path, request, response_desc, timeout_ms, out, err);
    }
    if (strcmp(method_path, KF_CLIENT_PATH_TAIL_OUTPUT) == 0) {
        /* A SINGLE function's output is one stream, at its home's endpoint. */
        int64_t ask_ms = timeout_ms > 0 ? timeout_ms : FAN_DISCOVER_TIMEOUT_MS;
        route_t route;
        uint32_t count = 0;
        bool single = false;
        size_t home = 0;
        Keyflow__V1__FunctionInfo *info = NULL;
        kf_arena_t arena;
        kf_arena_init(&arena, 0);
        kf_status_t st = route_of(client, method_path, ask_ms, &route, &count, err);
        if (st == KF_OK) {
            st = single_home(client, request, count, &arena, ask_ms, &single, &home, &info, err);
        }
        kf_arena_deinit(&arena);
        if (st != KF_OK) {
            return st;
        }
        return single ? stream_open_on(client, home, method_path, request, response_desc,
                                       timeout_ms, out, err)
                      : fan_open(client, request, response_desc, timeout_ms, out, err);
    }
    return kf_error_set(err, KF_E_UNIMPLEMENTED,
                        "%s: a stream over several endpoints is routed by the C client for "
                        "TailOutput only; open it on each endpoint (a client of one target each)",
                        method_path);
}

static kf_status_t stream_open_on(kf_client_t *client, size_t endpoint, const char *method_path,
                                  const ProtobufCMessage *request,
                                  const ProtobufCMessageDescriptor *response_desc,
                                  int64_t timeout_ms, kf_client_stream_t **out, kf_error_t *err) {
    grpc_byte_buffer *send_buffer = NULL;
    kf_status_t st = pack_request(request, &send_buffer, err);
    if (st != KF_OK) {
        return st;
    }
    kf_client_stream_t *stream = calloc(1, sizeof *stream);
    if (stream == NULL) {
        grpc_byte_buffer_destroy(send_buffer);
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate a stream");
    }
    stream->send_buffer = send_buffer;
    stream->response_desc = response_desc;
    memcpy(stream->method_path, method_path, strlen(method_path) + 1);
    grpc_metadata_array_init(&stream->initial_metadata);
    grpc_metadata_array_init(&stream->trailing_metadata);
    stream->code = GRPC_STATUS_UNKNOWN;
    stream->details = grpc_empty_slice();
    /* A next-queue of its own: a stream waits with a timeout and may leave
     * a receive in flight between calls, which pluck could not express. */
    stream->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_slice method = grpc_slice_from_copied_string(method_path);
    stream->call =
        grpc_channel_create_call(client->channels[endpoint], NULL, GRPC_PROPAGATE_DEFAULTS,
                                 stream->cq, method, NULL, deadline_after(timeout_ms), NULL);
    grpc_slice_unref(method);
    KF_ASSERT(stream->call != NULL);

    grpc_op start[3];
    memset(start, 0, sizeof start);
    start[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    start[0].data.send_initial_metadata.count = client->metadata_count;
    start[0].data.send_initial_metadata.metadata = client->metadata;
    start[1].op = GRPC_OP_SEND_MESSAGE;
    start[1].data.send_message.send_message = stream->send_buffer;
    start[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    grpc_op status[1];
    memset(status, 0, sizeof status);
    status[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    status[0].data.recv_status_on_client.trailing_metadata = &stream->trailing_metadata;
    status[0].data.recv_status_on_client.status = &stream->code;
    status[0].data.recv_status_on_client.status_details = &stream->details;
    status[0].data.recv_status_on_client.error_string = &stream->error_string;
    grpc_call_error rc = stream_start_batch(stream, STREAM_START, start, 3);
    if (rc == GRPC_CALL_OK) {
        rc = stream_start_batch(stream, STREAM_STATUS, status, 1);
    }
    if (rc != GRPC_CALL_OK) {
        kf_client_stream_close(stream);
        return kf_error_set(err, KF_E_INTERNAL, "%s: grpc_call_start_batch failed (%d)",
                            method_path, (int)rc);
    }
    *out = stream;
    return KF_OK;
}

/* ---- TailOutput over several endpoints ----------------------------------
 *
 * One TailOutput stream per serving endpoint, each given the merged cursor
 * (a process reads only its own partitions' positions in it). A next asks
 * the streams in turn, starting after the one that answered last so that
 * none starves the others: first each without waiting, then each for at
 * most FAN_SLICE_MS at a time (every stream has its completion queue of its
 * own, so the fan cannot wait on all of them at once). A page is handed out
 * as its endpoint sent it, its next_cursor replaced by the merged cursor:
 * per partition the furthest position any page gave, so a reader resumes
 * from it without gaps or repeats. The first stream to end ends the fan
 * (with its outcome, naming the endpoint): the reader opens it again from
 * the last cursor. */

/* How long a waiting next waits on one endpoint's stream before the next
 * one's: a row is handed out at most about this times the endpoints after
 * it arrived. */
#define FAN_SLICE_MS 20

static kf_status_t fan_open(kf_client_t *client, const ProtobufCMessage *request,
                            const ProtobufCMessageDescriptor *response_desc, int64_t timeout_ms,
                            kf_client_stream_t **out, kf_error_t *err) {
    route_t route;
    uint32_t count = 0;
    kf_status_t st =
        route_of(client, KF_CLIENT_PATH_TAIL_OUTPUT,
                 timeout_ms > 0 ? timeout_ms : FAN_DISCOVER_TIMEOUT_MS, &route, &count, err);
    if (st != KF_OK) {
        return st;
    }
    Keyflow__V1__TailOutputRequest sub = *(const Keyflow__V1__TailOutputRequest *)request;
    kf_client_stream_t *fan = calloc(1, sizeof *fan);
    cursor_t *cursor = calloc(1, sizeof *cursor);
    if (fan == NULL || cursor == NULL) {
        free(fan);
        free(cursor);
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate a stream");
    }
    fan->client = client;
    fan->cursor = cursor;
    fan->partition_count = count;
    fan->response_desc = response_desc;
    snprintf(fan->method_path, sizeof fan->method_path, "%s", KF_CLIENT_PATH_TAIL_OUTPUT);
    if (!cursor_parse(sub.cursor, count, cursor)) {
        st = kf_error_set(err, KF_E_INVALID,
                          "cursor: \"%s\" is not an output cursor of a data set of %u partitions",
                          sub.cursor, count);
    }
    size_t served[KF_CLIENT_ENDPOINTS_MAX], n = 0;
    served_endpoints(client, served, &n);
    if (st == KF_OK && n == 0) {
        st = kf_error_set(err, KF_E_UNAVAILABLE, "TailOutput: no endpoint serves a partition");
    }
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    for (size_t i = 0; st == KF_OK && i < n; i++) {
        sub.cursor = cursor_format(cursor, count, &arena);
        st = sub.cursor != NULL
                 ? stream_open_on(client, served[i], KF_CLIENT_PATH_TAIL_OUTPUT, &sub.base,
                                  response_desc, timeout_ms, &fan->subs[i], err)
                 : kf_error_set(err, KF_E_NOMEM, "cannot format the cursor");
        if (st == KF_OK) {
            fan->sub_endpoint[i] = served[i];
            fan->sub_count = i + 1;
        }
    }
    kf_arena_deinit(&arena);
    if (st != KF_OK) {
        kf_client_stream_close(fan);
        return st;
    }
    *out = fan;
    return KF_OK;
}

/* Ends the fan with `st`: every stream is cancelled, every next returns it. */
static kf_status_t fan_finish(kf_client_stream_t *fan, kf_status_t st, const kf_error_t *why,
                              kf_error_t *err) {
    for (size_t i = 0; i < fan->sub_count; i++) {
        kf_client_stream_cancel(fan->subs[i]);
    }
    *err = *why;
    err->status = st;
    return stream_finish(fan, st, err);
}

static kf_status_t fan_next(kf_client_stream_t *fan, kf_arena_t *arena, int64_t timeout_ms,
                            ProtobufCMessage **response, kf_error_t *err) {
    if (fan->finished) {
        *err = fan->outcome;
        return fan->outcome.status;
    }
    int64_t deadline_ms = timeout_ms > 0 ? now_ms() + timeout_ms : INT64_MAX;
    for (size_t round = 0;; round++) {
        for (size_t k = 0; k < fan->sub_count; k++) {
            size_t i = (fan->turn + k) % fan->sub_count;
            const char *endpoint = fan->client->endpoints[fan->sub_endpoint[i]];
            int64_t left_ms = deadline_ms - now_ms();
            int64_t wait_ms = round == 0 || left_ms <= 1 ? 1
                              : left_ms < FAN_SLICE_MS   ? left_ms
                                                         : FAN_SLICE_MS;
            ProtobufCMessage *msg = NULL;
            kf_error_t sub_err;
            kf_status_t st = kf_client_stream_next(fan->subs[i], arena, wait_ms, &msg, &sub_err);
            if (st == KF_AGAIN) {
                continue;
            }
            kf_error_t why;
            if (st != KF_OK) {
                kf_error_set(&why, st, "%s: %s (resume from the last page's next_cursor)", endpoint,
                             sub_err.message);
                return fan_finish(fan, st, &why, err);
            }
            if (msg == NULL) {
                kf_error_set(&why, KF_OK, "%s: the server ended the stream", endpoint);
                return fan_finish(fan, KF_OK, &why, err);
            }
            Keyflow__V1__ReadOutputResponse *page = (void *)msg;
            cursor_t *at = kf_arena_zalloc(arena, sizeof *at);
            if (at == NULL) {
                return kf_error_set(err, KF_E_LIMIT, "response: the arena is full");
            }
            if (!cursor_parse(page->next_cursor, fan->partition_count, at)) {
                kf_error_set(&why, KF_E_INTERNAL, "TailOutput: %s answered cursor \"%s\"", endpoint,
                             page->next_cursor);
                return fan_finish(fan, KF_E_INTERNAL, &why, err);
            }
            for (uint32_t p = 0; p < fan->partition_count; p++) {
                fan->cursor->pos[p] =
                    at->pos[p] > fan->cursor->pos[p] ? at->pos[p] : fan->cursor->pos[p];
            }
            fan->cursor->last = at->last;
            page->next_cursor = cursor_format(fan->cursor, fan->partition_count, arena);
            if (page->next_cursor == NULL) {
                return kf_error_set(err, KF_E_LIMIT, "response: the arena is full");
            }
            fan->turn = i + 1;
            *response = msg;
            return KF_OK;
        }
        if (now_ms() >= deadline_ms) {
            return kf_error_set(err, KF_AGAIN, "%s: no message within %lld ms", fan->method_path,
                                (long long)timeout_ms);
        }
    }
}

kf_status_t kf_client_stream_next(kf_client_stream_t *stream, kf_arena_t *arena, int64_t timeout_ms,
                                  ProtobufCMessage **response, kf_error_t *err) {
    KF_ASSERT(stream != NULL && arena != NULL && response != NULL && timeout_ms >= 0);
    *response = NULL;
    if (stream->sub_count > 0) {
        return fan_next(stream, arena, timeout_ms, response, err);
    }
    gpr_timespec deadline = deadline_after(timeout_ms);
    for (;;) {
        if (stream->finished) {
            *err = stream->outcome;
            return stream->outcome.status;
        }
        if (stream->message != NULL) {
            grpc_byte_buffer *payload = stream->message;
            stream->message = NULL;
            kf_status_t st = decode_response(payload, stream->response_desc, arena, response, err);
            grpc_byte_buffer_destroy(payload);
            if (st != KF_OK) {
                /* What follows a message this side cannot read could not
                 * be trusted to follow on from it: the stream ends here. */
                grpc_call_cancel(stream->call, NULL);
                stream_finish(stream, st, err);
            }
            KF_ASSERT((st == KF_OK) == (*response != NULL));
            return st;
        }
        if (stream->status_received && stream->messages_ended) {
            kf_error_t final;
            kf_status_t st = KF_OK;
            if (stream->code != GRPC_STATUS_OK) {
                st = status_error(stream->code, stream->details, stream->method_path, &final);
            } else {
                kf_error_set(&final, KF_OK, "%s: the server ended the stream", stream->method_path);
            }
            stream_finish(stream, st, &final);
            continue;
        }
        if (!stream->messages_ended && !stream->recv_pending) {
            grpc_op ops[2];
            memset(ops, 0, sizeof ops);
            size_t n = 0;
            if (!stream->initial_metadata_asked) {
                ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
                ops[n].data.recv_initial_metadata.recv_initial_metadata = &stream->initial_metadata;
                n++;
            }
            ops[n].op = GRPC_OP_RECV_MESSAGE;
            ops[n].data.recv_message.recv_message = &stream->recv_buffer;
            n++;
            grpc_call_error rc = stream_start_batch(stream, STREAM_RECV, ops, n);
            if (rc != GRPC_CALL_OK) {
                grpc_call_cancel(stream->call, NULL);
                kf_error_t failed;
                kf_error_set(&failed, KF_E_INTERNAL, "%s: grpc_call_start_batch failed (%d)",
                             stream->method_path, (int)rc);
                stream_finish(stream, KF_E_INTERNAL, &failed);
                continue;
            }
            stream->initial_metadata_asked = true;
            stream->recv_pending = true;
        }
        /* Something is always in flight here: the receive, or the status
         * that must follow the end of the messages. */
        KF_ASSERT(stream->pending > 0);
        grpc_event ev = grpc_completion_queue_next(stream->cq, deadline, NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT) {
            return kf_error_set(err, KF_AGAIN, "%s: no message within %lld ms", stream->method_path,
                                (long long)timeout_ms);
        }
        stream_collect(stream, &ev);
    }
}

void kf_client_stream_cancel(kf_client_stream_t *stream) {
    KF_ASSERT(stream != NULL);
    for (size_t i = 0; i < stream->sub_count; i++) {
        kf_client_stream_cancel(stream->subs[i]);
    }
    if (stream->sub_count > 0) {
        return;
    }
    /* gRPC allows a cancel from any thread, any number of times. */
    grpc_call_cancel(stream->call, NULL);
}

void kf_client_stream_close(kf_client_stream_t *stream) {
    if (stream == NULL) {
        return;
    }
    if (stream->call == NULL) { /* a fan, or one whose open failed part way */
        for (size_t i = 0; i < stream->sub_count; i++) {
            kf_client_stream_close(stream->subs[i]);
        }
        free(stream->cursor);
        free(stream);
        return;
    }
    /* A no-op for a call that has ended; otherwise every pending batch
     * completes promptly, with or without success. */
    grpc_call_cancel(stream->call, NULL);
    while (stream->pending > 0) {
        grpc_event ev =
            grpc_completion_queue_next(stream->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        stream_collect(stream, &ev);
    }
    grpc_call_unref(stream->call);
    grpc_completion_queue_shutdown(stream->cq);
    /* Nothing is pending, so the next event is the shutdown itself. */
    grpc_event ev =
        grpc_completion_queue_next(stream->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    KF_ASSERT(ev.type == GRPC_QUEUE_SHUTDOWN);
    grpc_completion_queue_destroy(stream->cq);
    /* Every batch was collected, so recv_buffer has moved to message. */
    KF_ASSERT(stream->recv_buffer == NULL);
    if (stream->message != NULL) {
        grpc_byte_buffer_destroy(stream->message);
    }
    grpc_byte_buffer_destroy(stream->send_buffer);
    grpc_slice_unref(stream->details);
    if (stream->error_string != NULL) {
        gpr_free((void *)stream->error_string);
    }
    grpc_metadata_array_destroy(&stream->initial_metadata);
    grpc_metadata_array_destroy(&stream->trailing_metadata);
    free(stream);
}

kf_status_t kf_client_tail_output(kf_client_t *client,
                                  const Keyflow__V1__TailOutputRequest *request, int64_t timeout_ms,
                                  kf_client_stream_t **out, kf_error_t *err) {
    KF_ASSERT(request != NULL &&
              request->base.descriptor == &keyflow__v1__tail_output_request__descriptor);
    return kf_client_stream_open(client, KF_CLIENT_PATH_TAIL_OUTPUT, &request->base,
                                 &keyflow__v1__read_output_response__descriptor, timeout_ms, out,
                                 err);
}

kf_status_t kf_client_tail_output_next(kf_client_stream_t *stream, kf_arena_t *arena,
                                       int64_t timeout_ms,
                                       Keyflow__V1__ReadOutputResponse **response,
                                       kf_error_t *err) {
    KF_ASSERT(stream != NULL &&
              stream->response_desc == &keyflow__v1__read_output_response__descriptor);
    ProtobufCMessage *msg = NULL;
    kf_status_t st = kf_client_stream_next(stream, arena, timeout_ms, &msg, err);
    *response = (Keyflow__V1__ReadOutputResponse *)msg;
    return st;
}

/* One typed wrapper: checks the request's type (an uninitialized or wrong
 * message is a programmer error) and narrows the response's. */
#define KF_CLIENT_WRAPPER(fn, path, Req, req_desc, Resp, resp_desc)                                \
    kf_status_t fn(kf_client_t *client, const Req *request, kf_arena_t *arena, int64_t timeout_ms, \
                   Resp **response, kf_error_t *err) {                                             \
        KF_ASSERT(request != NULL && request->base.descriptor == &req_desc);                       \
        ProtobufCMessage *msg = NULL;                                                              \
        kf_status_t st = kf_client_call(client, path, &request->base, &resp_desc, arena,           \
                                        timeout_ms, &msg, err);                                    \
        *response = (Resp *)msg;                                                                   \
        return st;                                                                                 \
    }

KF_CLIENT_WRAPPER(kf_client_send_event, KF_CLIENT_PATH_SEND_EVENT, Keyflow__V1__SendEventRequest,
                  keyflow__v1__send_event_request__descriptor, Keyflow__V1__SendEventResponse,
                  keyflow__v1__send_event_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_send_events, KF_CLIENT_PATH_SEND_EVENTS, Keyflow__V1__SendEventsRequest,
                  keyflow__v1__send_events_request__descriptor, Keyflow__V1__SendEventsResponse,
                  keyflow__v1__send_events_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_describe_coordinator, KF_CLIENT_PATH_DESCRIBE_COORDINATOR,
                  Keyflow__V1__DescribeCoordinatorRequest,
                  keyflow__v1__describe_coordinator_request__descriptor,
                  Keyflow__V1__DescribeCoordinatorResponse,
                  keyflow__v1__describe_coordinator_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_flush_window, KF_CLIENT_PATH_FLUSH_WINDOW,
                  Keyflow__V1__FlushWindowRequest, keyflow__v1__flush_window_request__descriptor,
                  Keyflow__V1__FlushWindowResponse, keyflow__v1__flush_window_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_cancel_window, KF_CLIENT_PATH_CANCEL_WINDOW,
                  Keyflow__V1__CancelWindowRequest, keyflow__v1__cancel_window_request__descriptor,
                  Keyflow__V1__CancelWindowResponse,
                  keyflow__v1__cancel_window_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_poll_runs, KF_CLIENT_PATH_POLL_RUNS, Keyflow__V1__PollRunsRequest,
                  keyflow__v1__poll_runs_request__descriptor, Keyflow__V1__PollRunsResponse,
                  keyflow__v1__poll_runs_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_heartbeat_run, KF_CLIENT_PATH_HEARTBEAT_RUN,
                  Keyflow__V1__HeartbeatRunRequest, keyflow__v1__heartbeat_run_request__descriptor,
                  Keyflow__V1__HeartbeatRunResponse,
                  keyflow__v1__heartbeat_run_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_complete_run, KF_CLIENT_PATH_COMPLETE_RUN,
                  Keyflow__V1__CompleteRunRequest, keyflow__v1__complete_run_request__descriptor,
                  Keyflow__V1__CompleteRunResponse, keyflow__v1__complete_run_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_release_run, KF_CLIENT_PATH_RELEASE_RUN, Keyflow__V1__ReleaseRunRequest,
                  keyflow__v1__release_run_request__descriptor, Keyflow__V1__ReleaseRunResponse,
                  keyflow__v1__release_run_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_cancel_run, KF_CLIENT_PATH_CANCEL_RUN, Keyflow__V1__CancelRunRequest,
                  keyflow__v1__cancel_run_request__descriptor, Keyflow__V1__CancelRunResponse,
                  keyflow__v1__cancel_run_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_get_run, KF_CLIENT_PATH_GET_RUN, Keyflow__V1__GetRunRequest,
                  keyflow__v1__get_run_request__descriptor, Keyflow__V1__Run,
                  keyflow__v1__run__descriptor)
KF_CLIENT_WRAPPER(kf_client_list_runs, KF_CLIENT_PATH_LIST_RUNS, Keyflow__V1__ListRunsRequest,
                  keyflow__v1__list_runs_request__descriptor, Keyflow__V1__ListRunsResponse,
                  keyflow__v1__list_runs_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_health_check, KF_CLIENT_PATH_HEALTH_CHECK,
                  Grpc__Health__V1__HealthCheckRequest,
                  grpc__health__v1__health_check_request__descriptor,
                  Grpc__Health__V1__HealthCheckResponse,
                  grpc__health__v1__health_check_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_register_function, KF_CLIENT_PATH_REGISTER_FUNCTION,
                  Keyflow__V1__RegisterFunctionRequest,
                  keyflow__v1__register_function_request__descriptor,
                  Keyflow__V1__RegisterFunctionResponse,
                  keyflow__v1__register_function_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_get_function, KF_CLIENT_PATH_GET_FUNCTION,
                  Keyflow__V1__GetFunctionRequest, keyflow__v1__get_function_request__descriptor,
                  Keyflow__V1__FunctionInfo, keyflow__v1__function_info__descriptor)
KF_CLIENT_WRAPPER(kf_client_list_functions, KF_CLIENT_PATH_LIST_FUNCTIONS,
                  Keyflow__V1__ListFunctionsRequest,
                  keyflow__v1__list_functions_request__descriptor,
                  Keyflow__V1__ListFunctionsResponse,
                  keyflow__v1__list_functions_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_push_batch, KF_CLIENT_PATH_PUSH_BATCH, Keyflow__V1__PushBatchRequest,
                  keyflow__v1__push_batch_request__descriptor, Keyflow__V1__PushBatchResponse,
                  keyflow__v1__push_batch_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_dry_run_batch, KF_CLIENT_PATH_DRY_RUN_BATCH,
                  Keyflow__V1__DryRunBatchRequest, keyflow__v1__dry_run_batch_request__descriptor,
                  Keyflow__V1__DryRunBatchResponse, keyflow__v1__dry_run_batch_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_read_output, KF_CLIENT_PATH_READ_OUTPUT, Keyflow__V1__ReadOutputRequest,
                  keyflow__v1__read_output_request__descriptor, Keyflow__V1__ReadOutputResponse,
                  keyflow__v1__read_output_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_get_key_state, KF_CLIENT_PATH_GET_KEY_STATE,
                  Keyflow__V1__GetKeyStateRequest, keyflow__v1__get_key_state_request__descriptor,
                  Keyflow__V1__GetKeyStateResponse, keyflow__v1__get_key_state_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_trim_output, KF_CLIENT_PATH_TRIM_OUTPUT, Keyflow__V1__TrimOutputRequest,
                  keyflow__v1__trim_output_request__descriptor, Keyflow__V1__TrimOutputResponse,
                  keyflow__v1__trim_output_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_delete_function, KF_CLIENT_PATH_DELETE_FUNCTION,
                  Keyflow__V1__DeleteFunctionRequest,
                  keyflow__v1__delete_function_request__descriptor,
                  Keyflow__V1__DeleteFunctionResponse,
                  keyflow__v1__delete_function_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_delete_producer, KF_CLIENT_PATH_DELETE_PRODUCER,
                  Keyflow__V1__DeleteProducerRequest,
                  keyflow__v1__delete_producer_request__descriptor,
                  Keyflow__V1__DeleteProducerResponse,
                  keyflow__v1__delete_producer_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_create_key, KF_CLIENT_PATH_CREATE_KEY, Keyflow__V1__CreateKeyRequest,
                  keyflow__v1__create_key_request__descriptor, Keyflow__V1__CreateKeyResponse,
                  keyflow__v1__create_key_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_list_keys, KF_CLIENT_PATH_LIST_KEYS, Keyflow__V1__ListKeysRequest,
                  keyflow__v1__list_keys_request__descriptor, Keyflow__V1__ListKeysResponse,
                  keyflow__v1__list_keys_response__descriptor)
KF_CLIENT_WRAPPER(kf_client_revoke_key, KF_CLIENT_PATH_REVOKE_KEY, Keyflow__V1__RevokeKeyRequest,
                  keyflow__v1__revoke_key_request__descriptor, Keyflow__V1__RevokeKeyResponse,
                  keyflow__v1__revoke_key_response__descriptor)
