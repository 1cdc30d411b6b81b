/*
 * registry.c - the function table: RegisterFunction, GetFunction,
 * ListFunctions, and the lifecycle of kf_functions_t.
 *
 * Invariants
 *   1. A registered function is immutable: its canonical descriptor (and
 *      so its sha256) never changes; registering the same descriptor again
 *      answers the existing function, a different one under the same id is
 *      refused (a new implementation is a new function).
 *   2. Two functions never share a pipeline_state_id, and each has its own
 *      index, the prefix of all its stored records; the next index is
 *      stored with the function, so an index is never reused.
 *   3. A function whose handler is unavailable (plugin missing or changed,
 *      REMOTE runtime) is still registered and listed; only its steps are
 *      refused (fn->host == NULL).
 */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/bytes.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/partition.h"
#include "functions/functions_int.h"

/* ---- the function table ------------------------------------------------ */

static function_t *fn_find(const kf_functions_t *fns, const char *id) {
    kf_map_node_t *n = kf_map_get(&fns->by_id, id, strlen(id));
    return n ? KF_CONTAINER_OF(n, function_t, node) : NULL;
}

static function_t *fn_by_pipeline(const kf_functions_t *fns, const char *pipeline_state_id) {
    size_t b;
    for (kf_map_node_t *n = kf_map_first(&fns->by_id, &b); n; n = kf_map_next(&fns->by_id, &b, n)) {
        function_t *fn = KF_CONTAINER_OF(n, function_t, node);
        if (strcmp(fn->desc->pipeline_state_id, pipeline_state_id) == 0) {
            return fn;
        }
    }
    return NULL;
}

int64_t kf__limit_share(int64_t limit, uint32_t partition, uint32_t partitions) {
    KF_ASSERT(partitions >= 1 && limit >= 0);
    int64_t n = (int64_t)partitions;
    return limit / n + ((int64_t)(partition % partitions) < limit % n ? 1 : 0);
}

function_t *kf__fn_new(kf_functions_t *fns, const Keyflow__V1__FunctionDescriptor *canonical,
                       const char *sha256, uint32_t index, int64_t created_ms) {
    function_t *fn = kf_xcalloc(1, sizeof *fn);
    kf_arena_init(&fn->arena, 0);
    kf_error_t err;
    kf_status_t st = kf_descriptor_canonicalize(canonical, &fn->arena, &fn->desc, &err);
    KF_ASSERT(st == KF_OK); /* it was canonical already */
    fn->id = fn->desc->function_id;
    memcpy(fn->sha256, sha256, KF_SHA256_HEX_BYTES + 1);
    fn->index = index;
    fn->created_ms = created_ms;
    kf_descriptor_limits(fn->desc, &fn->limits);
    uint32_t partitions = fns->config->partition_count > 1 ? fns->config->partition_count : 1;
    fn->split = kf_descriptor_split(fn->desc) && partitions > 1;
    fn->home = kf_partition_home_of_function(fn->id, strlen(fn->id), partitions);
    uint32_t share_of = fn->split ? partitions : 1;
    fn->share_keys = kf__limit_share(fn->limits.max_keys, fns->config->partition_index, share_of);
    fn->share_timers =
        kf__limit_share(fn->limits.max_timers, fns->config->partition_index, share_of);
    fn->share_state_bytes =
        kf__limit_share(fn->limits.max_state_bytes, fns->config->partition_index, share_of);
    fn->nkey_cols = (int)fn->desc->n_key_columns;
    for (int i = 0; i < fn->nkey_cols; i++) {
        fn->key_cols[i] = kf_schema_find(fn->desc->input_schema, fn->desc->key_columns[i]);
    }
    fn->event_col = kf_schema_find(fn->desc->input_schema, fn->desc->event_time_column);
    fn->out_event_col = kf_schema_find(fn->desc->output_schema, fn->desc->output_event_time_column);
    KF_ASSERT(fn->event_col >= 0 && fn->out_event_col >= 0);
    fn->next_activation = 1;
    kf_map_init(&fn->keys);
    kf_map_init(&fn->producers);
    fn->watch_what = kf_arena_printf(&fn->arena, "the native handler of function %s", fn->id);
    kf_ostree_init(&fn->timers, kf__timer_cmp, fn);
    kf_pq_init(&fn->expiries, kf__expiry_before, fn);
    for (size_t i = 0; i < fn->desc->n_timer_names; i++) {
        fn->timer_name_len[i] = (uint32_t)strlen(fn->desc->timer_names[i]);
    }
    kf__host_attach(fns, fn);
    kf_map_insert(&fns->by_id, &fn->node, fn->id, strlen(fn->id));
    kf_gauge_set(KF_G_FUNCTIONS, (int64_t)fns->by_id.count);
    return fn;
}

void kf__fn_free(function_t *fn) {
    if (fn->active != NULL) {
        /* A step still waiting for a handler call (the engine stops, or a
         * test drops the core): a PushBatch's is in its command's arena but
         * the undo log; a follow-on step owns its memory. */
        step_t *s = fn->active;
        free(s->undo);
        if (s->cmd == NULL) {
            kf_arena_deinit(&s->own_arena);
            free(s);
        }
    }
    kf_ostree_deinit(&fn->timers); /* first: its nodes live in the keys' timers */
    kf_pq_deinit(&fn->expiries);   /* and these in the keys */
    size_t b;
    kf_map_node_t *n = kf_map_first(&fn->keys, &b);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&fn->keys, &b, n);
        kf__key_free(fn, KF_CONTAINER_OF(n, fn_key_t, node));
        n = next;
    }
    n = kf_map_first(&fn->producers, &b);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&fn->producers, &b, n);
        kf__producer_free(fn, KF_CONTAINER_OF(n, producer_t, node));
        n = next;
    }
    kf_map_deinit(&fn->keys);
    kf_map_deinit(&fn->producers);
    kf_arena_deinit(&fn->arena);
    free(fn);
}

/* The retention in force, every bound resolved (0: none). */
static Keyflow__V1__OutputRetention *retention_info(kf_arena_t *a, const kf_functions_t *fns,
                                                    const function_t *fn) {
    kf_retention_t r;
    kf__output_retention(fns, fn, &r);
    Keyflow__V1__OutputRetention *out = kf_arena_new(a, sizeof *out);
    keyflow__v1__output_retention__init(out);
    out->max_age_ms_present_case = KEYFLOW__V1__OUTPUT_RETENTION__MAX_AGE_MS_PRESENT_MAX_AGE_MS;
    out->max_age_ms = r.max_age_ms;
    out->max_rows_present_case = KEYFLOW__V1__OUTPUT_RETENTION__MAX_ROWS_PRESENT_MAX_ROWS;
    out->max_rows = r.max_rows;
    out->max_bytes_present_case = KEYFLOW__V1__OUTPUT_RETENTION__MAX_BYTES_PRESENT_MAX_BYTES;
    out->max_bytes = r.max_bytes;
    return out;
}

static Keyflow__V1__FunctionInfo *fn_info(kf_arena_t *a, const kf_functions_t *fns,
                                          const function_t *fn) {
    Keyflow__V1__FunctionInfo *info = kf_arena_new(a, sizeof *info);
    keyflow__v1__function_info__init(info);
    info->descriptor = fn->desc; /* lives in the function's arena, outlives the reply */
    info->descriptor_sha256 = (char *)fn->sha256;
    info->created_ms = fn->created_ms;
    info->available =
        fn->host != NULL && (fn->host != &kf__remote_host || kf__remote_available(fn));
    info->unavailable_reason = info->available ? "" : kf_arena_strdup(a, fn->unavailable);
    info->watermark_us = fn->has_watermark ? fn->watermark_us : 0;
    info->output_seq = (int64_t)fn->output_seq;
    /* While a step waits for a handler call, its applied calls are in the
     * counters already; report them as they were before it: the step may
     * still be rolled back, and a reply must not show what never commits. */
    const step_t *s = fn->active;
    info->keys = (int64_t)(s ? s->live_keys0 : fn->live_keys);
    info->timers = (int64_t)(s ? s->timer_count0 : fn->timer_count);
    info->state_bytes = (int64_t)(s ? s->state_bytes0 : fn->state_bytes);
    info->due_timers = (int64_t)(s ? s->due_timers0 : kf__due_timers(fn));
    info->due_timers_error = fn->due_error[0] ? kf_arena_strdup(a, fn->due_error) : "";
    info->first_retained_seq = (int64_t)fn->trimmed_seq + 1;
    info->retained_rows = (int64_t)(fn->durable_output_seq - fn->trimmed_seq);
    info->retained_bytes = (int64_t)fn->retained_bytes;
    info->output_retention = retention_info(a, fns, fn);
    info->producers = (int64_t)fn->producers.count;
    info->placement = kf_descriptor_split(fn->desc)
                          ? KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SPLIT
                          : KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SINGLE;
    info->home_partition = (int32_t)fn->home;
    if (fn->split) {
        /* The router puts the partitions' shares side by side. */
        Keyflow__V1__PartitionShare *share = kf_arena_new(a, sizeof *share);
        keyflow__v1__partition_share__init(share);
        share->partition = (int32_t)fns->config->partition_index;
        share->keys = info->keys;
        share->timers = info->timers;
        share->state_bytes = info->state_bytes;
        share->max_keys = fn->share_keys;
        share->max_timers = fn->share_timers;
        share->max_state_bytes = fn->share_state_bytes;
        share->watermark_us = info->watermark_us;
        share->output_seq = info->output_seq;
        info->partitions = kf_arena_new(a, sizeof *info->partitions);
        info->partitions[0] = share;
        info->n_partitions = 1;
    }
    return info;
}

/* ---- RPCs -------------------------------------------------------------- */

/* A registration's placement: SPLIT or SINGLE as given, UNSPECIFIED (left
 * out) is SINGLE; but a function registered before placement existed keeps
 * UNSPECIFIED in its canonical descriptor (and so its sha256), so the same
 * descriptor registered again, with or without SPLIT, is the same function
 * (docs/scaling.md, "Functions registered before placement"). */
static void resolve_placement(Keyflow__V1__FunctionDescriptor *canonical,
                              const function_t *existing) {
    bool legacy = existing != NULL && existing->desc->placement ==
                                          KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_UNSPECIFIED;
    if (legacy && canonical->placement != KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SINGLE) {
        canonical->placement = KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_UNSPECIFIED;
    } else if (canonical->placement == KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_UNSPECIFIED) {
        canonical->placement = KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SINGLE;
    }
}

void kf_functions_register(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__RegisterFunctionRequest *req =
        (const Keyflow__V1__RegisterFunctionRequest *)cmd->request;
    kf_error_t *err = &cmd->error;
    Keyflow__V1__FunctionDescriptor *canonical;
    uint8_t *bytes;
    size_t len;
    char sha[KF_SHA256_HEX_BYTES + 1];
    if (kf_descriptor_canonicalize(req->descriptor, cmd->arena, &canonical, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    function_t *existing = fn_find(fns, canonical->function_id);
    resolve_placement(canonical, existing);
    if (kf_descriptor_encode(canonical, cmd->arena, &bytes, &len, sha, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    Keyflow__V1__RegisterFunctionResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__register_function_response__init(resp);
    if (existing != NULL) {
        bool was_split = kf_descriptor_split(existing->desc);
        if (strcmp(existing->sha256, sha) != 0 && was_split != kf_descriptor_split(canonical)) {
            kf_error_set(err, KF_E_EXISTS,
                         "descriptor.placement: %s is registered as a %s function (sha256 %s); "
                         "this descriptor makes it %s, and where its keys live never changes: "
                         "a new placement is a new function",
                         existing->id, was_split ? "SPLIT" : "SINGLE", existing->sha256,
                         was_split ? "SINGLE" : "SPLIT");
            kf_ctx_fail(ctx, cmd);
            return;
        }
        if (strcmp(existing->sha256, sha) != 0) {
            kf_error_set(err, KF_E_EXISTS,
                         "descriptor.function_id: %s is registered with a different descriptor "
                         "(sha256 %s, this one %s); a new implementation is a new function",
                         existing->id, existing->sha256, sha);
            kf_ctx_fail(ctx, cmd);
            return;
        }
        resp->function = fn_info(cmd->arena, fns, existing);
        resp->already_registered = true;
        cmd->response = &resp->base;
        kf_ctx_ready(ctx, cmd);
        return;
    }
    function_t *other = fn_by_pipeline(fns, canonical->pipeline_state_id);
    if (other != NULL) {
        kf_error_set(err, KF_E_EXISTS,
                     "descriptor.pipeline_state_id: %s is already the state of function %s; two "
                     "functions never share one",
                     canonical->pipeline_state_id, other->id);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (fns->by_id.count >= KF_FUNCTIONS_MAX) {
        kf_error_set(err, KF_E_LIMIT, "functions: at most %d (KF_FUNCTIONS_MAX)", KF_FUNCTIONS_MAX);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    if (canonical->runtime == KEYFLOW__V1__RUNTIME__RUNTIME_NATIVE) {
        const kf_handler_t *h;
        if (kf_plugins_find(fns->plugins, canonical->implementation_digest, &h, err) != KF_OK) {
            kf_ctx_fail(ctx, cmd);
            return;
        }
    }
    if (kf__fn_admit(ctx, len, err) != KF_OK) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    function_t *fn = kf__fn_new(fns, canonical, sha, fns->next_index++, ctx->now_ms);
    Keyflow__Records__FunctionRec rec = KEYFLOW__RECORDS__FUNCTION_REC__INIT;
    rec.descriptor.data = bytes;
    rec.descriptor.len = len;
    rec.sha256 = sha;
    rec.created_ms = fn->created_ms;
    rec.index = fn->index;
    kf_key_t k;
    kf_key_reset(&k);
    kf_key_raw(&k, fn->id, strlen(fn->id));
    kf_ctx_put_msg(ctx, KF_CF_FUNCTIONS, &k, &rec.base);
    uint8_t next[4];
    kf_put_be32(next, fns->next_index);
    kf_key_reset(&k);
    kf_key_raw(&k, KF__FN_INDEX_KEY, sizeof KF__FN_INDEX_KEY - 1);
    kf_ctx_put(ctx, KF_CF_META, &k, next, sizeof next);
    kf__put_checkpoint(ctx, fn);
    kf_log_kv(KF_LOG_INFO, "functions", "function registered", KF_LOG_STR("function_id", fn->id),
              KF_LOG_STR("descriptor_sha256", fn->sha256),
              KF_LOG_STR("runtime", canonical->runtime == KEYFLOW__V1__RUNTIME__RUNTIME_NATIVE
                                        ? "NATIVE"
                                        : "REMOTE"));
    resp->function = fn_info(cmd->arena, fns, fn);
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

function_t *kf__fn_require(kf_functions_t *fns, const char *id, kf_error_t *err) {
    if (id[0] == '\0') {
        kf_error_set(err, KF_E_INVALID, "function_id: required");
        return NULL;
    }
    function_t *fn = fn_find(fns, id);
    if (fn == NULL) {
        kf_error_set(err, KF_E_NOT_FOUND, "function_id: no function %.128s", id);
    }
    return fn;
}

void kf_functions_get(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__GetFunctionRequest *req =
        (const Keyflow__V1__GetFunctionRequest *)cmd->request;
    function_t *fn = kf__fn_require(fns, req->function_id, &cmd->error);
    if (fn == NULL) {
        kf_ctx_fail(ctx, cmd);
        return;
    }
    cmd->response = &fn_info(cmd->arena, fns, fn)->base;
    kf_ctx_ready(ctx, cmd);
}

static int cmp_ids(const void *a, const void *b) {
    return strcmp((*(function_t *const *)a)->id, (*(function_t *const *)b)->id);
}

void kf_functions_list(kf_functions_t *fns, kf_ctx_t *ctx, kf_cmd_t *cmd) {
    const Keyflow__V1__ListFunctionsRequest *req =
        (const Keyflow__V1__ListFunctionsRequest *)cmd->request;
    if (req->page_size < 0 || req->page_size > KF_LIST_PAGE_MAX) {
        kf_error_set(&cmd->error, KF_E_INVALID, "page_size: must be in 0..%d, got %lld",
                     KF_LIST_PAGE_MAX, (long long)req->page_size);
        kf_ctx_fail(ctx, cmd);
        return;
    }
    size_t n = fns->by_id.count, i = 0, b;
    function_t **all = kf_arena_new(cmd->arena, (n + 1) * sizeof *all);
    for (kf_map_node_t *m = kf_map_first(&fns->by_id, &b); m; m = kf_map_next(&fns->by_id, &b, m)) {
        all[i++] = KF_CONTAINER_OF(m, function_t, node);
    }
    qsort(all, n, sizeof *all, cmp_ids);
    int64_t page = req->page_size ? req->page_size : KF_LIST_PAGE_DEFAULT;
    Keyflow__V1__ListFunctionsResponse *resp = kf_arena_new(cmd->arena, sizeof *resp);
    keyflow__v1__list_functions_response__init(resp);
    resp->functions = kf_arena_new(cmd->arena, (size_t)page * sizeof *resp->functions);
    for (i = 0; i < n; i++) {
        if (req->page_token[0] != '\0' && strcmp(all[i]->id, req->page_token) <= 0) {
            continue;
        }
        /* A key limited to name prefixes lists only what it may read. */
        if (!kf_principal_allows(cmd->principal, KF_SCOPE_FUNCTIONS_READ, all[i]->id)) {
            continue;
        }
        if ((int64_t)resp->n_functions == page) {
            resp->next_page_token = resp->functions[resp->n_functions - 1]->descriptor->function_id;
            break;
        }
        resp->functions[resp->n_functions++] = fn_info(cmd->arena, fns, all[i]);
    }
    cmd->response = &resp->base;
    kf_ctx_ready(ctx, cmd);
}

/* ---- lifecycle --------------------------------------------------------- */

kf_functions_t *kf_functions_create(const kf_engine_config_t *config) {
    kf_functions_t *fns = kf_xcalloc(1, sizeof *fns);
    fns->config = config;
    fns->defer_calls = config->defer_handler_calls;
    kf_map_init(&fns->by_id);
    fns->plugins = kf_plugins_create(config->plugin_dir);
    kf__remote_init(fns);
    return fns;
}

void kf_functions_destroy(kf_functions_t *fns) {
    if (fns == NULL) {
        return;
    }
    kf__remote_release_all(fns, NULL);
    size_t b;
    kf_map_node_t *n = kf_map_first(&fns->by_id, &b);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&fns->by_id, &b, n);
        kf__replay_forget(fns, KF_CONTAINER_OF(n, function_t, node));
        kf__fn_free(KF_CONTAINER_OF(n, function_t, node));
        n = next;
    }
    kf_map_deinit(&fns->by_id);
    kf_plugins_destroy(fns->plugins);
    free(fns->pending);
    free(fns->scratch);
    free(fns);
}
