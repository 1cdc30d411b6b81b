/*
 * recovery.c - kf_functions_recover: rebuilds every function from the
 * store at start (layout in functions_int.h).
 *
 * Invariants
 *   1. Every stored record is checked as it is decoded (the disk
 *      boundary): a descriptor must match its sha256, a checkpoint its
 *      descriptor and the state codec version, keys and timers must be well
 *      formed and declared, a producer must appear once with decodable
 *      acknowledgements. Anything else is KF_E_CORRUPT and the start fails.
 *   2. Recovery goes through the same in-memory setters a step uses
 *      (kf__key_set_state, kf__key_set_timer), so counters and the timer
 *      queue agree with the keys exactly as after the steps that wrote them.
 *   3. A function whose handler is unavailable is still recovered, with a
 *      warning; its data stays untouched until the handler returns.
 */
#include <string.h>

#include "base/alloc.h"
#include "base/bytes.h"
#include "base/log.h"
#include "functions/functions_int.h"

static fn_key_t *recover_key(function_t *fn, const uint8_t *key, size_t len) {
    fn_key_t *k = kf__key_find(fn, key, len);
    if (k != NULL) {
        return k;
    }
    char *text;
    size_t text_len;
    if (!kf__key_text_of(fn, key, len, &text, &text_len)) {
        return NULL;
    }
    k = kf__key_new(fn, key, len, text, text_len);
    free(text);
    return k;
}

typedef kf_status_t (*scan_fn)(function_t *fn, const uint8_t *rest, size_t rest_len,
                               const uint8_t *value, size_t value_len, kf_error_t *err);

static kf_status_t scan_prefix(kf_ctx_t *ctx, function_t *fn, kf_cf_t cf, scan_fn each,
                               kf_error_t *err) {
    kf_key_t lower, upper;
    kf__key_prefix(&lower, fn);
    bool ok = kf_key_prefix_end(&lower, &upper);
    kf_iter_t *it;
    kf_status_t st = kf_iter_create(ctx->store, cf, lower.bytes, lower.len, ok ? upper.bytes : NULL,
                                    ok ? upper.len : 0, &it, err);
    if (st != KF_OK) {
        return st;
    }
    for (kf_iter_seek_first(it); kf_iter_valid(it) && st == KF_OK; kf_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = kf_iter_key(it, &klen);
        const uint8_t *v = kf_iter_value(it, &vlen);
        st = each(fn, k + 4, klen - 4, v, vlen, err);
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    return st;
}

static kf_status_t load_state(function_t *fn, const uint8_t *key, size_t len, const uint8_t *v,
                              size_t vlen, kf_error_t *err) {
    /* kind | value, then the expiry when the function has state_ttl_us. */
    bool ttl = fn->desc->state_ttl_us > 0;
    fn_key_t *k = vlen == (ttl ? 17u : 9u) && (v[0] == KF_STATE_NULL || v[0] == KF_STATE_VALUE)
                      ? recover_key(fn, key, len)
                      : NULL;
    if (k == NULL) {
        return kf_error_set(err, KF_E_CORRUPT, "state of %s: malformed record", fn->id);
    }
    int64_t expires_us = ttl ? (int64_t)kf_get_be64(v + 9) : KF__NO_TIME;
    if (expires_us == KF__NO_TIME && ttl) {
        return kf_error_set(err, KF_E_CORRUPT, "state of %s: malformed expiry", fn->id);
    }
    kf__key_set_state(fn, k, v[0], (int64_t)kf_get_be64(v + 1), expires_us);
    return KF_OK;
}

static kf_status_t load_timer(function_t *fn, const uint8_t *rest, size_t len, const uint8_t *v,
                              size_t vlen, kf_error_t *err) {
    kf_key_reader_t r = kf_key_reader(rest, len);
    const char *key, *name;
    size_t key_len, name_len;
    if (!kf_key_read_lp(&r, &key, &key_len) || !kf_key_read_lp(&r, &name, &name_len) ||
        r.left != 0 || vlen != 8) {
        return kf_error_set(err, KF_E_CORRUPT, "timers of %s: malformed record", fn->id);
    }
    int idx = -1;
    for (size_t i = 0; i < fn->desc->n_timer_names; i++) {
        if (strlen(fn->desc->timer_names[i]) == name_len &&
            memcmp(fn->desc->timer_names[i], name, name_len) == 0) {
            idx = (int)i;
        }
    }
    fn_key_t *k = idx >= 0 ? recover_key(fn, (const uint8_t *)key, key_len) : NULL;
    if (k == NULL) {
        return kf_error_set(err, KF_E_CORRUPT, "timers of %s: unknown timer or malformed key",
                            fn->id);
    }
    kf__key_set_timer(fn, k, (uint8_t)idx, kf_i64_from_ordered(kf_get_be64(v)));
    return KF_OK;
}

static kf_status_t load_producer(function_t *fn, const uint8_t *rest, size_t len, const uint8_t *v,
                                 size_t vlen, kf_error_t *err) {
    (void)rest;
    (void)len;
    Keyflow__Records__ProducerRec *rec = keyflow__records__producer_rec__unpack(NULL, vlen, v);
    if (rec == NULL || rec->n_acks > KF_PRODUCER_ACKS_KEPT) {
        if (rec) {
            keyflow__records__producer_rec__free_unpacked(rec, NULL);
        }
        return kf_error_set(err, KF_E_CORRUPT, "producers of %s: malformed record", fn->id);
    }
    /* Each stored acknowledgement must decode, and a producer appear once:
     * a retry is answered from these later, with no way left to refuse. */
    bool ok = kf__producer_get(fn, rec->producer_id, false) == NULL;
    for (size_t i = 0; ok && i < rec->n_acks; i++) {
        Keyflow__V1__PushBatchResponse *ack = keyflow__v1__push_batch_response__unpack(
            NULL, rec->acks[i]->ack.len, rec->acks[i]->ack.data);
        ok = ack != NULL &&
             (rec->acks[i]->digest.len == 0 || rec->acks[i]->digest.len == KF_SHA256_BYTES);
        if (ack != NULL) {
            keyflow__v1__push_batch_response__free_unpacked(ack, NULL);
        }
    }
    if (!ok) {
        kf_status_t st = kf_error_set(err, KF_E_CORRUPT,
                                      "producers of %s: producer %s stored twice or with an "
                                      "undecodable acknowledgement or digest",
                                      fn->id, rec->producer_id);
        keyflow__records__producer_rec__free_unpacked(rec, NULL);
        return st;
    }
    producer_t *p = kf__producer_get(fn, rec->producer_id, true);
    if (strlen(rec->owner) <= KF_API_KEY_ID_CHARS) {
        strcpy(p->owner, rec->owner);
    }
    p->last_sequence = rec->last_sequence;
    for (size_t i = 0; i < rec->n_acks; i++) {
        p->ack_seq[i] = rec->acks[i]->sequence;
        p->ack_len[i] = rec->acks[i]->ack.len;
        p->ack[i] = kf_xmemdup(rec->acks[i]->ack.data, p->ack_len[i]);
        /* An ack stored before digests were kept has none: it answers any
         * retry of its sequence, as it did when it was written. */
        p->ack_has_digest[i] = rec->acks[i]->digest.len == KF_SHA256_BYTES;
        if (p->ack_has_digest[i]) {
            memcpy(p->ack_digest[i], rec->acks[i]->digest.data, KF_SHA256_BYTES);
        }
    }
    p->nacks = (uint32_t)rec->n_acks;
    p->last_used_ms = rec->last_used_ms; /* ordered by kf__producers_recovered */
    keyflow__records__producer_rec__free_unpacked(rec, NULL);
    return KF_OK;
}

static kf_status_t load_checkpoint(kf_ctx_t *ctx, function_t *fn, kf_error_t *err) {
    kf_key_t k;
    kf__key_prefix(&k, fn);
    kf_value_t v;
    bool found;
    kf_status_t st = kf_store_get(ctx->store, KF_CF_CHECKPOINTS, k.bytes, k.len, &v, &found, err);
    if (st != KF_OK) {
        return st;
    }
    if (!found) {
        return kf_error_set(err, KF_E_CORRUPT, "checkpoint of %s: missing", fn->id);
    }
    Keyflow__Records__CheckpointRec *cp =
        keyflow__records__checkpoint_rec__unpack(NULL, v.len, v.data);
    kf_store_value_free(&v);
    if (cp != NULL && (cp->purged_seq > cp->trimmed_seq || cp->trimmed_seq > cp->output_seq)) {
        st = kf_error_set(err, KF_E_CORRUPT,
                          "checkpoint of %s: output purged to %llu and trimmed to %llu, past the "
                          "last row %llu",
                          fn->id, (unsigned long long)cp->purged_seq,
                          (unsigned long long)cp->trimmed_seq, (unsigned long long)cp->output_seq);
    } else if (cp == NULL || cp->codec_version != KF__STATE_CODEC_VERSION ||
               strcmp(cp->descriptor_sha256, fn->sha256) != 0) {
        st = kf_error_set(err, KF_E_CORRUPT,
                          "checkpoint of %s: state codec %d for descriptor %s, expected codec %d "
                          "for %s",
                          fn->id, cp ? cp->codec_version : -1, cp ? cp->descriptor_sha256 : "?",
                          KF__STATE_CODEC_VERSION, fn->sha256);
    } else {
        fn->has_watermark = cp->has_watermark;
        fn->watermark_us = cp->watermark_us;
        fn->next_activation = cp->next_activation_id;
        fn->output_seq = fn->durable_output_seq = cp->output_seq;
        fn->trimmed_seq = cp->trimmed_seq;
        fn->purged_seq = cp->purged_seq;
        fn->retained_bytes = cp->retained_bytes;
    }
    if (cp) {
        keyflow__records__checkpoint_rec__free_unpacked(cp, NULL);
    }
    return st;
}

/* A function's index prefixes every record of its state: two functions
 * under one index would read and write each other's keys, and an index at
 * or past the stored counter would be handed to a new function again. */
static kf_status_t check_index(const kf_functions_t *fns, const char *id, uint32_t index,
                               kf_error_t *err) {
    if (fns->index_counter_found ? index >= fns->next_index : index == UINT32_MAX) {
        return kf_error_set(err, KF_E_CORRUPT,
                            "functions: %s has index %u, not below the stored counter %u", id,
                            index, fns->next_index);
    }
    size_t b;
    for (kf_map_node_t *n = kf_map_first(&fns->by_id, &b); n != NULL;
         n = kf_map_next(&fns->by_id, &b, n)) {
        const function_t *other = KF_CONTAINER_OF(n, function_t, node);
        if (other->index == index) {
            return kf_error_set(err, KF_E_CORRUPT, "functions: %s and %s have the same index %u",
                                other->id, id, index);
        }
    }
    return KF_OK;
}

static kf_status_t recover_function(kf_functions_t *fns, kf_ctx_t *ctx, const void *v, size_t vlen,
                                    kf_error_t *err) {
    Keyflow__Records__FunctionRec *rec = keyflow__records__function_rec__unpack(NULL, vlen, v);
    if (rec == NULL) {
        return kf_error_set(err, KF_E_CORRUPT, "functions: undecodable record");
    }
    kf_arena_t arena;
    kf_arena_init(&arena, 0);
    kf_status_t st = KF_OK;
    Keyflow__V1__FunctionDescriptor *d = keyflow__v1__function_descriptor__unpack(
        kf_arena_pb(&arena), rec->descriptor.len, rec->descriptor.data);
    Keyflow__V1__FunctionDescriptor *canonical = NULL;
    uint8_t *bytes;
    size_t len;
    char sha[KF_SHA256_HEX_BYTES + 1];
    if (d == NULL || kf_descriptor_canonicalize(d, &arena, &canonical, err) != KF_OK ||
        kf_descriptor_encode(canonical, &arena, &bytes, &len, sha, err) != KF_OK ||
        strcmp(sha, rec->sha256) != 0) {
        st =
            kf_error_set(err, KF_E_CORRUPT, "functions: descriptor of %s does not match its sha256",
                         d ? d->function_id : "?");
    }
    if (st == KF_OK &&
        kf_map_get(&fns->by_id, canonical->function_id, strlen(canonical->function_id)) != NULL) {
        st = kf_error_set(err, KF_E_CORRUPT, "functions: %s is stored twice",
                          canonical->function_id);
    }
    if (st == KF_OK) {
        st = check_index(fns, canonical->function_id, rec->index, err);
    }
    if (st == KF_OK) {
        function_t *fn = kf__fn_new(fns, canonical, sha, rec->index, rec->created_ms);
        if (fn->index >= fns->next_index) {
            fns->next_index = fn->index + 1;
        }
        if (fn->host == NULL) {
            kf_log(KF_LOG_WARN, "functions", "%s is unavailable: %s", fn->id, fn->unavailable);
        }
        if ((st = load_checkpoint(ctx, fn, err)) == KF_OK &&
            (st = scan_prefix(ctx, fn, KF_CF_STATE, load_state, err)) == KF_OK &&
            (st = scan_prefix(ctx, fn, KF_CF_TIMERS_BY_KEY, load_timer, err)) == KF_OK) {
            st = scan_prefix(ctx, fn, KF_CF_PRODUCERS, load_producer, err);
        }
        if (st == KF_OK) {
            kf__producers_recovered(fn, ctx->now_ms);
            kf__due_update(fns, fn); /* timers a crash left due fire in follow-on steps */
        }
    }
    kf_arena_deinit(&arena);
    keyflow__records__function_rec__free_unpacked(rec, NULL);
    return st;
}

kf_status_t kf_functions_recover(kf_functions_t *fns, kf_ctx_t *ctx, kf_error_t *err) {
    kf_value_t v;
    bool found;
    kf_status_t st = kf_store_get(ctx->store, KF_CF_META, KF__FN_INDEX_KEY,
                                  sizeof KF__FN_INDEX_KEY - 1, &v, &found, err);
    if (st != KF_OK) {
        return st;
    }
    if (found) {
        bool well_formed = v.len == 4;
        fns->next_index = well_formed ? kf_get_be32(v.data) : 0;
        fns->index_counter_found = well_formed;
        kf_store_value_free(&v);
        if (!well_formed) {
            /* Guessing would hand a new function an index in use. */
            return kf_error_set(err, KF_E_CORRUPT, "meta: malformed function index counter");
        }
    }
    kf_iter_t *it;
    if ((st = kf_iter_create(ctx->store, KF_CF_FUNCTIONS, NULL, 0, NULL, 0, &it, err)) != KF_OK) {
        return st;
    }
    for (kf_iter_seek_first(it); kf_iter_valid(it) && st == KF_OK; kf_iter_next(it)) {
        size_t vlen;
        const void *val = kf_iter_value(it, &vlen);
        st = recover_function(fns, ctx, val, vlen, err);
    }
    if (st == KF_OK) {
        st = kf_iter_status(it, err);
    }
    kf_iter_destroy(it);
    return st;
}
