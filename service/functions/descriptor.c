/*
 * descriptor.c - descriptor validation and canonical encoding.
 */
#include "functions/descriptor.h"

#include <stdio.h>
#include <string.h>

#include "base/assert.h"
#include "base/limits.h"
#include "proto/columns.h"

static bool is_name(const char *s, size_t max) {
    size_t n = strlen(s);
    if (n == 0 || n > max) {
        return false;
    }
    if (!((s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z') || s[0] == '_')) {
        return false;
    }
    for (size_t i = 1; i < n; i++) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '_')) {
            return false;
        }
    }
    return true;
}

/* Identifiers that travel in URLs and keys: [A-Za-z0-9][A-Za-z0-9._-]*. */
static kf_status_t check_id(const char *field, const char *s, size_t max, kf_error_t *err) {
    size_t n = strlen(s);
    if (n == 0) {
        return kf_error_set(err, KF_E_INVALID, "%s: required", field);
    }
    if (n > max) {
        return kf_error_set(err, KF_E_INVALID, "%s: at most %zu bytes, got %zu", field, max, n);
    }
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  (i > 0 && (c == '.' || c == '_' || c == '-'));
        if (!ok) {
            return kf_error_set(
                err, KF_E_INVALID,
                "%s: only letters, digits, '.', '_' and '-' (not first), got \"%s\"", field, s);
        }
    }
    return KF_OK;
}

static const char *type_name(Keyflow__V1__FieldType t) {
    const kf_column_type_t *ct = kf_column_type(t);
    return ct != NULL ? ct->name : "UNKNOWN";
}

/* "BOOL, INT64, ... or TIMESTAMP_US", from the column type table. */
static void type_names(char *buf, size_t cap) {
    size_t n = kf_column_types_count(), used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && used < cap; i++) {
        const char *sep = i == 0 ? "" : i + 1 == n ? " or " : ", ";
        int w = snprintf(buf + used, cap - used, "%s%s", sep, kf_column_type_at(i)->name);
        used += w > 0 ? (size_t)w : 0;
    }
}

int kf_schema_find(const Keyflow__V1__Schema *schema, const char *name) {
    for (size_t i = 0; schema != NULL && i < schema->n_fields; i++) {
        if (strcmp(schema->fields[i]->name, name) == 0) {
            return (int)i;
        }
    }
    return -1;
}

static kf_status_t check_schema(const char *field, const Keyflow__V1__Schema *s, kf_error_t *err) {
    if (s == NULL || s->n_fields == 0) {
        return kf_error_set(err, KF_E_INVALID, "%s.fields: at least one field is required", field);
    }
    if (s->n_fields > KF_SCHEMA_FIELDS_MAX) {
        return kf_error_set(err, KF_E_INVALID, "%s.fields: at most %d fields, got %zu", field,
                            KF_SCHEMA_FIELDS_MAX, s->n_fields);
    }
    for (size_t i = 0; i < s->n_fields; i++) {
        const Keyflow__V1__Field *f = s->fields[i];
        if (!is_name(f->name, KF_FIELD_NAME_BYTES_MAX)) {
            return kf_error_set(err, KF_E_INVALID,
                                "%s.fields[%zu].name: must match [A-Za-z_][A-Za-z0-9_]* and be at "
                                "most %d bytes, got \"%s\"",
                                field, i, KF_FIELD_NAME_BYTES_MAX, f->name);
        }
        if (kf_column_type(f->type) == NULL) {
            char names[128];
            type_names(names, sizeof names);
            return kf_error_set(err, KF_E_INVALID, "%s.fields[%zu].type: unknown type %d (%s)",
                                field, i, (int)f->type, names);
        }
        for (size_t j = 0; j < i; j++) {
            if (strcmp(s->fields[j]->name, f->name) == 0) {
                return kf_error_set(err, KF_E_INVALID, "%s.fields[%zu].name: duplicate name \"%s\"",
                                    field, i, f->name);
            }
        }
    }
    return KF_OK;
}

/* A column reference: exists in the schema, has the type, is not nullable. */
static kf_status_t check_column(const char *field, const char *name, const Keyflow__V1__Schema *s,
                                const char *schema_name, Keyflow__V1__FieldType type,
                                kf_error_t *err) {
    if (name[0] == '\0') {
        return kf_error_set(err, KF_E_INVALID, "%s: required", field);
    }
    int i = kf_schema_find(s, name);
    if (i < 0) {
        return kf_error_set(err, KF_E_INVALID, "%s: column \"%s\" is not in %s", field, name,
                            schema_name);
    }
    const Keyflow__V1__Field *f = s->fields[i];
    if (f->type != type) {
        return kf_error_set(err, KF_E_INVALID, "%s: column \"%s\" must be %s, it is %s", field,
                            name, type_name(type), type_name(f->type));
    }
    if (f->nullable) {
        return kf_error_set(err, KF_E_INVALID, "%s: column \"%s\" must not be nullable", field,
                            name);
    }
    return KF_OK;
}

typedef struct limit_rule {
    const char *name;
    int64_t def;
    int64_t max;
} limit_rule_t;

static const limit_rule_t limit_rules[9] = {
    {"max_keys", KF_FN_MAX_KEYS_DEFAULT, KF_FN_MAX_KEYS_MAX},
    {"max_timers", KF_FN_MAX_TIMERS_DEFAULT, KF_FN_MAX_TIMERS_MAX},
    {"max_state_bytes", KF_FN_MAX_STATE_BYTES_DEFAULT, KF_FN_MAX_STATE_BYTES_MAX},
    {"max_batch_rows", KF_FN_MAX_BATCH_ROWS_DEFAULT, KF_FN_MAX_BATCH_ROWS_MAX},
    {"max_input_rows", KF_FN_MAX_INPUT_ROWS_DEFAULT, KF_FN_MAX_INPUT_ROWS_MAX},
    {"max_input_bytes", KF_FN_MAX_INPUT_BYTES_DEFAULT, KF_FN_MAX_INPUT_BYTES_MAX},
    {"max_output_rows", KF_FN_MAX_OUTPUT_ROWS_DEFAULT, KF_FN_MAX_OUTPUT_ROWS_MAX},
    {"max_output_bytes", KF_FN_MAX_OUTPUT_BYTES_DEFAULT, KF_FN_MAX_OUTPUT_BYTES_MAX},
    {"max_timer_callbacks_per_step", KF_FN_MAX_TIMER_CALLBACKS_DEFAULT,
     KF_FN_MAX_TIMER_CALLBACKS_MAX},
};

/* The limits message's nine oneofs in order: case field and value field. */
typedef struct limit_slot {
    uint32_t *present;
    int64_t *value;
} limit_slot_t;

static void limit_slots(Keyflow__V1__FunctionLimits *l, limit_slot_t slots[9]) {
    slots[0] = (limit_slot_t){(uint32_t *)&l->max_keys_present_case, &l->max_keys};
    slots[1] = (limit_slot_t){(uint32_t *)&l->max_timers_present_case, &l->max_timers};
    slots[2] = (limit_slot_t){(uint32_t *)&l->max_state_bytes_present_case, &l->max_state_bytes};
    slots[3] = (limit_slot_t){(uint32_t *)&l->max_batch_rows_present_case, &l->max_batch_rows};
    slots[4] = (limit_slot_t){(uint32_t *)&l->max_input_rows_present_case, &l->max_input_rows};
    slots[5] = (limit_slot_t){(uint32_t *)&l->max_input_bytes_present_case, &l->max_input_bytes};
    slots[6] = (limit_slot_t){(uint32_t *)&l->max_output_rows_present_case, &l->max_output_rows};
    slots[7] = (limit_slot_t){(uint32_t *)&l->max_output_bytes_present_case, &l->max_output_bytes};
    slots[8] = (limit_slot_t){(uint32_t *)&l->max_timer_callbacks_per_step_present_case,
                              &l->max_timer_callbacks_per_step};
}

_Static_assert(sizeof(Keyflow__V1__FunctionLimits__MaxKeysPresentCase) == sizeof(uint32_t),
               "oneof cases are 32-bit enums");

static Keyflow__V1__Schema *copy_schema(kf_arena_t *a, const Keyflow__V1__Schema *s) {
    Keyflow__V1__Schema *c = kf_arena_zalloc(a, sizeof *c);
    keyflow__v1__schema__init(c);
    c->n_fields = s->n_fields;
    c->fields = kf_arena_zalloc(a, s->n_fields * sizeof *c->fields);
    for (size_t i = 0; i < s->n_fields; i++) {
        Keyflow__V1__Field *f = kf_arena_zalloc(a, sizeof *f);
        keyflow__v1__field__init(f);
        f->name = kf_arena_strdup(a, s->fields[i]->name);
        f->type = s->fields[i]->type;
        f->nullable = s->fields[i]->nullable;
        c->fields[i] = f;
    }
    return c;
}

static char **copy_strings(kf_arena_t *a, char **v, size_t n) {
    char **c = kf_arena_zalloc(a, (n + 1) * sizeof *c);
    for (size_t i = 0; i < n; i++) {
        c[i] = kf_arena_strdup(a, v[i]);
    }
    return c;
}

static bool is_hex64(const char *s) {
    if (strlen(s) != 64) {
        return false;
    }
    for (size_t i = 0; i < 64; i++) {
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) {
            return false;
        }
    }
    return true;
}

static kf_status_t check_names(const char *field, char **names, size_t n, size_t max,
                               kf_error_t *err) {
    if (n > max) {
        return kf_error_set(err, KF_E_INVALID, "%s: at most %zu, got %zu", field, max, n);
    }
    for (size_t i = 0; i < n; i++) {
        if (!is_name(names[i], KF_FIELD_NAME_BYTES_MAX)) {
            return kf_error_set(err, KF_E_INVALID,
                                "%s[%zu]: must match [A-Za-z_][A-Za-z0-9_]* and be at most %d "
                                "bytes, got \"%s\"",
                                field, i, KF_FIELD_NAME_BYTES_MAX, names[i]);
        }
        for (size_t j = 0; j < i; j++) {
            if (strcmp(names[i], names[j]) == 0) {
                return kf_error_set(err, KF_E_INVALID, "%s[%zu]: duplicate \"%s\"", field, i,
                                    names[i]);
            }
        }
    }
    return KF_OK;
}

/* The output retention as given, each bound checked; NULL when no bound
 * is given, so that a descriptor without one encodes (and hashes) as it
 * did before retention existed. */
static kf_status_t canonical_retention(const Keyflow__V1__OutputRetention *in, kf_arena_t *a,
                                       Keyflow__V1__OutputRetention **out, kf_error_t *err) {
    *out = NULL;
    if (in == NULL || (in->max_age_ms_present_case == 0 && in->max_rows_present_case == 0 &&
                       in->max_bytes_present_case == 0)) {
        return KF_OK;
    }
    if (in->max_age_ms_present_case != 0 &&
        (in->max_age_ms < 0 || in->max_age_ms > KF_OUTPUT_RETENTION_MS_MAX)) {
        return kf_error_set(err, KF_E_INVALID,
                            "descriptor.output_retention.max_age_ms: must be in 0..%lld (0: no "
                            "bound), got %lld",
                            (long long)KF_OUTPUT_RETENTION_MS_MAX, (long long)in->max_age_ms);
    }
    if (in->max_rows_present_case != 0 && in->max_rows < 0) {
        return kf_error_set(err, KF_E_INVALID,
                            "descriptor.output_retention.max_rows: must not be negative (0: no "
                            "bound), got %lld",
                            (long long)in->max_rows);
    }
    if (in->max_bytes_present_case != 0 && in->max_bytes < 0) {
        return kf_error_set(err, KF_E_INVALID,
                            "descriptor.output_retention.max_bytes: must not be negative (0: no "
                            "bound), got %lld",
                            (long long)in->max_bytes);
    }
    Keyflow__V1__OutputRetention *r = kf_arena_new(a, sizeof *r);
    keyflow__v1__output_retention__init(r);
    r->max_age_ms_present_case = in->max_age_ms_present_case;
    r->max_age_ms = in->max_age_ms;
    r->max_rows_present_case = in->max_rows_present_case;
    r->max_rows = in->max_rows;
    r->max_bytes_present_case = in->max_bytes_present_case;
    r->max_bytes = in->max_bytes;
    *out = r;
    return KF_OK;
}

void kf_descriptor_retention(const Keyflow__V1__FunctionDescriptor *c, const kf_retention_t *server,
                             kf_retention_t *out) {
    *out = *server;
    const Keyflow__V1__OutputRetention *r = c->output_retention;
    if (r == NULL) {
        return;
    }
    if (r->max_age_ms_present_case != 0) {
        out->max_age_ms = r->max_age_ms;
    }
    if (r->max_rows_present_case != 0) {
        out->max_rows = r->max_rows;
    }
    if (r->max_bytes_present_case != 0) {
        out->max_bytes = r->max_bytes;
    }
}

kf_status_t kf_descriptor_canonicalize(const Keyflow__V1__FunctionDescriptor *d, kf_arena_t *a,
                                       Keyflow__V1__FunctionDescriptor **out, kf_error_t *err) {
    kf_status_t st;
    if (d == NULL) {
        return kf_error_set(err, KF_E_INVALID, "descriptor: required");
    }
    if (d->version != 1) {
        return kf_error_set(err, KF_E_INVALID, "descriptor.version: only 1 is admitted, got %d",
                            d->version);
    }
    if ((st = check_id("descriptor.function_id", d->function_id, KF_FUNCTION_ID_BYTES_MAX, err)) !=
            KF_OK ||
        (st = check_id("descriptor.pipeline_state_id", d->pipeline_state_id,
                       KF_FUNCTION_ID_BYTES_MAX, err)) != KF_OK) {
        return st;
    }
    if (d->runtime != KEYFLOW__V1__RUNTIME__RUNTIME_NATIVE &&
        d->runtime != KEYFLOW__V1__RUNTIME__RUNTIME_REMOTE) {
        return kf_error_set(err, KF_E_INVALID,
                            "descriptor.runtime: must be NATIVE or REMOTE, got %d",
                            (int)d->runtime);
    }
    if (!is_hex64(d->implementation_digest)) {
        return kf_error_set(err, KF_E_INVALID,
                            "descriptor.implementation_digest: must be 64 lowercase hex characters "
                            "(SHA-256), got \"%.80s\"",
                            d->implementation_digest);
    }
    if (d->determinism != KEYFLOW__V1__DETERMINISM__DETERMINISM_UNSPECIFIED &&
        d->determinism != KEYFLOW__V1__DETERMINISM__DETERMINISM_UNDECLARED &&
        d->determinism != KEYFLOW__V1__DETERMINISM__DETERMINISM_REPLAY_SAFE) {
        return kf_error_set(err, KF_E_INVALID,
                            "descriptor.determinism: must be UNDECLARED or REPLAY_SAFE, got %d",
                            (int)d->determinism);
    }
    if (d->placement != KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_UNSPECIFIED &&
        d->placement != KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SINGLE &&
        d->placement != KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SPLIT) {
        return kf_error_set(err, KF_E_INVALID,
                            "descriptor.placement: must be SINGLE or SPLIT, got %d",
                            (int)d->placement);
    }
    if ((st = check_schema("descriptor.input_schema", d->input_schema, err)) != KF_OK ||
        (st = check_schema("descriptor.output_schema", d->output_schema, err)) != KF_OK) {
        return st;
    }
    if (d->n_key_columns == 0) {
        return kf_error_set(err, KF_E_INVALID, "descriptor.key_columns: at least one is required");
    }
    if ((st = check_names("descriptor.key_columns", d->key_columns, d->n_key_columns,
                          KF_KEY_COLUMNS_MAX, err)) != KF_OK) {
        return st;
    }
    for (size_t i = 0; i < d->n_key_columns; i++) {
        char field[64];
        snprintf(field, sizeof field, "descriptor.key_columns[%zu]", i);
        if ((st = check_column(field, d->key_columns[i], d->input_schema, "input_schema",
                               KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_UTF8, err)) != KF_OK) {
            return st;
        }
    }
    if ((st = check_column("descriptor.event_time_column", d->event_time_column, d->input_schema,
                           "input_schema", KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US,
                           err)) != KF_OK ||
        (st = check_column("descriptor.output_event_time_column", d->output_event_time_column,
                           d->output_schema, "output_schema",
                           KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US, err)) != KF_OK) {
        return st;
    }
    if (!is_name(d->value_state_name, KF_FIELD_NAME_BYTES_MAX)) {
        return d->value_state_name[0] == '\0'
                   ? kf_error_set(err, KF_E_INVALID, "descriptor.value_state_name: required")
                   : kf_error_set(err, KF_E_INVALID,
                                  "descriptor.value_state_name: must match "
                                  "[A-Za-z_][A-Za-z0-9_]* and be at most %d bytes, got \"%s\"",
                                  KF_FIELD_NAME_BYTES_MAX, d->value_state_name);
    }
    if ((st = check_names("descriptor.timer_names", d->timer_names, d->n_timer_names,
                          KF_TIMER_NAMES_MAX, err)) != KF_OK) {
        return st;
    }

    Keyflow__V1__FunctionLimits *limits = kf_arena_new(a, sizeof *limits);
    keyflow__v1__function_limits__init(limits);
    limit_slot_t in_slots[9], out_slots[9];
    Keyflow__V1__FunctionLimits empty = KEYFLOW__V1__FUNCTION_LIMITS__INIT;
    limit_slots(d->limits != NULL ? d->limits : &empty, in_slots);
    limit_slots(limits, out_slots);
    for (int i = 0; i < 9; i++) {
        int64_t v = limit_rules[i].def;
        if (*in_slots[i].present != 0) {
            v = *in_slots[i].value;
            if (v < 1 || v > limit_rules[i].max) {
                return kf_error_set(
                    err, KF_E_INVALID, "descriptor.limits.%s: must be in 1..%lld, got %lld",
                    limit_rules[i].name, (long long)limit_rules[i].max, (long long)v);
            }
        }
        *out_slots[i].present =
            (uint32_t)(i + 1); /* each oneof's single member has case = field number */
        *out_slots[i].value = v;
    }

    /* The call timeout bounds one handler call: a REMOTE worker's answer
     * (the batch fails), a NATIVE handler's return (the watchdog ends the
     * process, base/watchdog.h). REMOTE functions always carry it in their
     * canonical form; NATIVE ones only when it is not the default, so the
     * descriptors registered before NATIVE had one keep their identity. */
    bool remote = d->runtime == KEYFLOW__V1__RUNTIME__RUNTIME_REMOTE;
    bool timeout_given = d->limits != NULL &&
                         d->limits->call_timeout_ms_present_case ==
                             KEYFLOW__V1__FUNCTION_LIMITS__CALL_TIMEOUT_MS_PRESENT_CALL_TIMEOUT_MS;
    if (timeout_given && (d->limits->call_timeout_ms < 1 ||
                          d->limits->call_timeout_ms > KF_FN_CALL_TIMEOUT_MS_MAX)) {
        return kf_error_set(err, KF_E_INVALID,
                            "descriptor.limits.call_timeout_ms: must be in 1..%d, got %lld",
                            KF_FN_CALL_TIMEOUT_MS_MAX, (long long)d->limits->call_timeout_ms);
    }
    if (remote || (timeout_given && d->limits->call_timeout_ms != KF_FN_CALL_TIMEOUT_MS_DEFAULT)) {
        limits->call_timeout_ms_present_case =
            KEYFLOW__V1__FUNCTION_LIMITS__CALL_TIMEOUT_MS_PRESENT_CALL_TIMEOUT_MS;
        limits->call_timeout_ms =
            timeout_given ? d->limits->call_timeout_ms : KF_FN_CALL_TIMEOUT_MS_DEFAULT;
    }

    if (d->state_ttl_us < 0) {
        return kf_error_set(err, KF_E_INVALID,
                            "descriptor.state_ttl_us: must be 0 (no expiry) or a positive number "
                            "of microseconds, got %lld",
                            (long long)d->state_ttl_us);
    }

    Keyflow__V1__OutputRetention *retention;
    if ((st = canonical_retention(d->output_retention, a, &retention, err)) != KF_OK) {
        return st;
    }

    Keyflow__V1__FunctionDescriptor *c = kf_arena_new(a, sizeof *c);
    keyflow__v1__function_descriptor__init(c);
    c->version = 1;
    c->function_id = kf_arena_strdup(a, d->function_id);
    c->pipeline_state_id = kf_arena_strdup(a, d->pipeline_state_id);
    c->runtime = d->runtime;
    c->implementation_digest = kf_arena_strdup(a, d->implementation_digest);
    c->determinism = d->determinism == KEYFLOW__V1__DETERMINISM__DETERMINISM_UNSPECIFIED
                         ? KEYFLOW__V1__DETERMINISM__DETERMINISM_UNDECLARED
                         : d->determinism;
    c->input_schema = copy_schema(a, d->input_schema);
    c->output_schema = copy_schema(a, d->output_schema);
    c->n_key_columns = d->n_key_columns;
    c->key_columns = copy_strings(a, d->key_columns, d->n_key_columns);
    c->event_time_column = kf_arena_strdup(a, d->event_time_column);
    c->output_event_time_column = kf_arena_strdup(a, d->output_event_time_column);
    c->value_state_name = kf_arena_strdup(a, d->value_state_name);
    c->n_timer_names = d->n_timer_names;
    c->timer_names = copy_strings(a, d->timer_names, d->n_timer_names);
    c->limits = limits;
    c->state_ttl_us = d->state_ttl_us;
    c->output_retention = retention;
    /* UNSPECIFIED stays: in a stored descriptor it is a function registered
     * before placement existed (kf_descriptor_split), and a registration
     * resolves it against what is registered (functions/registry.c). */
    c->placement = d->placement;
    *out = c;
    return KF_OK;
}

kf_status_t kf_descriptor_encode(const Keyflow__V1__FunctionDescriptor *c, kf_arena_t *a,
                                 uint8_t **bytes, size_t *len,
                                 char sha256_hex[KF_SHA256_HEX_BYTES + 1], kf_error_t *err) {
    size_t n = keyflow__v1__function_descriptor__get_packed_size(c);
    uint8_t *buf = kf_arena_alloc(a, n ? n : 1);
    if (buf == NULL) {
        return kf_error_set(err, KF_E_TOO_LARGE, "descriptor: too large to encode");
    }
    size_t packed = keyflow__v1__function_descriptor__pack(c, buf);
    KF_ASSERT(packed == n);
    uint8_t digest[KF_SHA256_BYTES];
    kf_sha256(buf, n, digest);
    kf_hex_encode(digest, sizeof digest, sha256_hex);
    *bytes = buf;
    *len = n;
    return KF_OK;
}

bool kf_descriptor_split(const Keyflow__V1__FunctionDescriptor *canonical) {
    return canonical->placement != KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SINGLE;
}

void kf_descriptor_limits(const Keyflow__V1__FunctionDescriptor *c, kf_fn_limits_t *out) {
    const Keyflow__V1__FunctionLimits *l = c->limits;
    KF_ASSERT(l != NULL);
    out->max_keys = l->max_keys;
    out->max_timers = l->max_timers;
    out->max_state_bytes = l->max_state_bytes;
    out->max_batch_rows = l->max_batch_rows;
    out->max_input_rows = l->max_input_rows;
    out->max_input_bytes = l->max_input_bytes;
    out->max_output_rows = l->max_output_rows;
    out->max_output_bytes = l->max_output_bytes;
    out->max_timer_callbacks = l->max_timer_callbacks_per_step;
    out->call_timeout_ms =
        l->call_timeout_ms_present_case ==
                KEYFLOW__V1__FUNCTION_LIMITS__CALL_TIMEOUT_MS_PRESENT_CALL_TIMEOUT_MS
            ? l->call_timeout_ms
            : KF_FN_CALL_TIMEOUT_MS_DEFAULT; /* a NATIVE one left out */
}
