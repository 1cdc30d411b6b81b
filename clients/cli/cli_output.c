/*
 * cli_output.c - how the `keyflow` CLI prints a response: JSON (one
 * document per line, for scripts) or tables (aligned columns, for people).
 *
 * Invariants
 *   1. JSON is the gateway's mapping (kf_message_to_jansson), byte for
 *      byte what curl gets: every repeated field is there, [] when empty
 *      (json_map.h), so `jq '.runs[]'` works on an empty list.
 *   2. A table shows the same data: the message is flattened into
 *      "label  value" lines, and each list of objects (runs, functions,
 *      output rows) becomes a table of one row per element, its columns the
 *      union of the elements' keys in the order first seen. Nothing is
 *      dropped; only embedded JSON values (inputs, results, row fields of
 *      object type) are cut to EMBEDDED_CELL_CHARS_MAX characters.
 *   3. Meaning comes from the descriptor, never from the value: enum values
 *      lose their common prefix (RUN_STATUS_PENDING -> PENDING), a field
 *      named *_ms / *_us is a time of day (due_ms, created_ms, watermark_us,
 *      ...; TIMESTAMP_FIELDS) printed as UTC with how long ago or ahead it
 *      is, and every other *_ms field is a duration (1m30s). Embedded JSON
 *      has no descriptor and is printed as it is, except an output row's
 *      columns, whose descriptor is the function's output schema: its
 *      TIMESTAMP_US columns are times like watermark_us (kf__cli_t's
 *      row_schema).
 *   4. Memory: everything a rendering allocates is freed before it returns.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/json.h"
#include "cli.h"
#include "proto/json_map.h"

/* Characters of an embedded JSON value shown in a table cell. */
#define EMBEDDED_CELL_CHARS_MAX 40
/* Bytes of one field name converted to its JSON name or a label. */
#define NAME_BYTES_MAX 128

/* ---- names ---------------------------------------------------------------- */

/* The field of `desc` that JSON key `key` names, and whether it is a
 * `_json` string shown as an embedded value under its short name. */
static const ProtobufCFieldDescriptor *field_for_key(const ProtobufCMessageDescriptor *desc,
                                                     const char *key, bool *embedded) {
    *embedded = false;
    if (desc == NULL) {
        return NULL;
    }
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        char name[KF_JSON_NAME_BYTES_MAX];
        bool is_embedded;
        kf_json_field_name(desc, f, name, &is_embedded);
        if (strcmp(name, key) == 0 || strcmp(f->name, key) == 0) {
            *embedded = is_embedded;
            return f;
        }
    }
    return NULL;
}

typedef enum time_kind {
    TIME_NONE,
    TIME_STAMP_MS, /* unix milliseconds */
    TIME_STAMP_US, /* unix microseconds (event time) */
    TIME_SPAN_MS,  /* a duration in milliseconds */
} time_kind_t;

/* Fields that hold a point in time; any other *_ms field is a duration. */
static const char *const TIMESTAMP_FIELDS[] = {"due",      "created", "updated", "opened",   "last",
                                               "finished", "expires", "at",      "watermark"};

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static time_kind_t time_kind_of(const ProtobufCFieldDescriptor *f) {
    if (f == NULL || f->label == PROTOBUF_C_LABEL_REPEATED ||
        (f->type != PROTOBUF_C_TYPE_INT64 && f->type != PROTOBUF_C_TYPE_UINT64)) {
        return TIME_NONE;
    }
    bool ms = ends_with(f->name, "_ms"), us = ends_with(f->name, "_us");
    if (!ms && !us) {
        return TIME_NONE;
    }
    char stem[NAME_BYTES_MAX];
    snprintf(stem, sizeof stem, "%.*s", (int)(strlen(f->name) - 3), f->name);
    for (size_t i = 0; i < sizeof TIMESTAMP_FIELDS / sizeof TIMESTAMP_FIELDS[0]; i++) {
        const char *t = TIMESTAMP_FIELDS[i];
        size_t n = strlen(stem), m = strlen(t);
        if (n >= m && strcmp(stem + n - m, t) == 0 && (n == m || stem[n - m - 1] == '_')) {
            return ms ? TIME_STAMP_MS : TIME_STAMP_US;
        }
    }
    return ms ? TIME_SPAN_MS : TIME_NONE;
}

/* "receipt.runId" -> "receipt run id"; a time field's unit is left out
 * ("dueMs" -> "due"). */
static void label_of(const char *path, time_kind_t kind, bool upper, char *out, size_t cap) {
    size_t n = strlen(path);
    if (kind != TIME_NONE && n > 2 && (ends_with(path, "Ms") || ends_with(path, "Us"))) {
        n -= 2;
    }
    size_t o = 0;
    for (size_t i = 0; i < n && o + 2 < cap; i++) {
        char c = path[i];
        if (c == '.' || c == '_') {
            if (o > 0 && out[o - 1] != ' ') {
                out[o++] = ' ';
            }
            continue;
        }
        if (c >= 'A' && c <= 'Z' && i > 0 && path[i - 1] != '.') {
            out[o++] = ' ';
            c = (char)(c - 'A' + 'a');
        }
        out[o++] = upper && c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c;
    }
    out[o] = '\0';
}

/* ---- values --------------------------------------------------------------- */

/* "250ms", "1.5s", "1m30s", "2h5m", "7d". */
static void format_span(int64_t ms, char *out, size_t cap) {
    static const struct {
        int64_t ms;
        const char *unit;
    } units[] = {{86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}};
    if (ms < 0) {
        snprintf(out, cap, "%lldms", (long long)ms);
        return;
    }
    if (ms < 1000) {
        snprintf(out, cap, "%lldms", (long long)ms);
        return;
    }
    if (ms < 60000) {
        if (ms % 1000 == 0) {
            snprintf(out, cap, "%llds", (long long)(ms / 1000));
        } else {
            snprintf(out, cap, "%.1fs", (double)ms / 1000.0);
        }
        return;
    }
    for (size_t i = 0; i < 3; i++) {
        if (ms >= units[i].ms) {
            int64_t big = ms / units[i].ms;
            int64_t small = (ms % units[i].ms) / units[i + 1].ms;
            if (small > 0) {
                snprintf(out, cap, "%lld%s%lld%s", (long long)big, units[i].unit, (long long)small,
                         units[i + 1].unit);
            } else {
                snprintf(out, cap, "%lld%s", (long long)big, units[i].unit);
            }
            return;
        }
    }
    KF_UNREACHABLE();
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* "2026-12-01 14:16:58Z (in 59s)"; "(12s ago)" in the past. */
static void format_stamp_ms(int64_t ms, char *out, size_t cap) {
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    if (ms < 0 || gmtime_r(&s, &tm) == NULL) {
        snprintf(out, cap, "%lld", (long long)ms);
        return;
    }
    char when[40];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%SZ", &tm);
    int64_t delta = ms - now_ms();
    char span[32];
    format_span(delta < 0 ? -delta : delta, span, sizeof span);
    if (delta > -1000 && delta < 1000) {
        snprintf(out, cap, "%s (now)", when);
    } else {
        snprintf(out, cap, "%s (%s%s%s)", when, delta > 0 ? "in " : "", span,
                 delta > 0 ? "" : " ago");
    }
}

/* The enum value's name without the prefix its values share
 * (RUN_STATUS_PENDING -> PENDING): short in a table column. */
static const char *enum_short(const ProtobufCEnumDescriptor *e, const char *name) {
    size_t common = strlen(name);
    for (unsigned i = 0; i < e->n_values; i++) {
        const char *v = e->values[i].name;
        size_t k = 0;
        while (k < common && v[k] == name[k]) {
            k++;
        }
        common = k;
    }
    while (common > 0 && name[common - 1] != '_') {
        common--;
    }
    return name[common] != '\0' ? name + common : name;
}

/* Cuts `text` to `chars` characters (UTF-8 code points) with "...". */
static char *cut(char *text, size_t chars) {
    size_t seen = 0;
    for (char *p = text; *p != '\0'; p++) {
        if (((unsigned char)*p & 0xc0) != 0x80 && seen++ == chars) {
            strcpy(p, "...");
            break;
        }
    }
    return text;
}

/* Text without control characters (a cell is one line). malloc'd. */
static char *one_line(const char *text) {
    size_t n = strlen(text);
    char *out = malloc(n + 1);
    KF_ASSERT(out != NULL);
    for (size_t i = 0; i <= n; i++) {
        unsigned char c = (unsigned char)text[i];
        out[i] = c != '\0' && (c < 0x20 || c == 0x7f) ? ' ' : (char)c;
    }
    return out;
}

/* A scalar (or, embedded, any) JSON value as cell text. malloc'd. */
static char *value_text(const ProtobufCFieldDescriptor *f, json_t *v, bool embedded) {
    char buf[96];
    if (embedded || f == NULL) {
        char *dumped = json_is_string(v) ? strdup(json_string_value(v))
                                         : kf_json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        KF_ASSERT(dumped != NULL);
        char *text = one_line(dumped);
        free(dumped);
        return embedded ? cut(text, EMBEDDED_CELL_CHARS_MAX) : text;
    }
    if (json_is_string(v) && f->type == PROTOBUF_C_TYPE_ENUM) {
        return one_line(enum_short(f->descriptor, json_string_value(v)));
    }
    time_kind_t kind = time_kind_of(f);
    if (kind != TIME_NONE && (json_is_string(v) || json_is_integer(v))) {
        char *end = NULL;
        long long n = json_is_integer(v) ? (long long)json_integer_value(v)
                                         : strtoll(json_string_value(v), &end, 10);
        if (end == NULL || *end == '\0') {
            if (kind == TIME_SPAN_MS) {
                format_span(n, buf, sizeof buf);
            } else {
                format_stamp_ms(kind == TIME_STAMP_US ? n / 1000 : n, buf, sizeof buf);
            }
            return strdup(buf);
        }
    }
    if (json_is_string(v)) {
        return one_line(json_string_value(v));
    }
    char *dumped = kf_json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    KF_ASSERT(dumped != NULL);
    return dumped;
}

/* Whether column `name` of an output row is a TIMESTAMP_US column of the
 * function's output schema. */
static bool is_stamp_column(const Keyflow__V1__Schema *schema, const char *name) {
    for (size_t i = 0; schema != NULL && i < schema->n_fields; i++) {
        if (schema->fields[i]->type == KEYFLOW__V1__FIELD_TYPE__FIELD_TYPE_TIMESTAMP_US &&
            strcmp(schema->fields[i]->name, name) == 0) {
            return true;
        }
    }
    return false;
}

/* A row's TIMESTAMP_US cell (a decimal string in the rows' JSON) as a
 * time; NULL when it is no integer (null in a nullable column). */
static char *row_stamp_text(json_t *v) {
    char buf[96];
    if (!json_is_string(v)) {
        return NULL;
    }
    char *end = NULL;
    long long us = strtoll(json_string_value(v), &end, 10);
    if (end == json_string_value(v) || *end != '\0') {
        return NULL;
    }
    format_stamp_ms(us / 1000, buf, sizeof buf);
    return strdup(buf);
}

/* ---- flattening ---------------------------------------------------------- */

typedef struct cell {
    char *label; /* "receipt run id" */
    char *text;
} cell_t;

typedef struct cells {
    cell_t *items;
    size_t count;
    size_t cap;
} cells_t;

typedef struct list {
    char *title;
    json_t *array;                          /* borrowed from the document */
    const ProtobufCMessageDescriptor *desc; /* of the elements; NULL: embedded JSON */
} list_t;

typedef struct lists {
    list_t *items;
    size_t count;
    size_t cap;
} lists_t;

static void *grow(void *items, size_t *cap, size_t count, size_t size) {
    if (count < *cap) {
        return items;
    }
    *cap = *cap == 0 ? 16 : *cap * 2;
    void *bigger = realloc(items, *cap * size);
    KF_ASSERT(bigger != NULL);
    return bigger;
}

static void cells_add(cells_t *c, const char *path, time_kind_t kind, bool upper, char *text) {
    c->items = grow(c->items, &c->cap, c->count, sizeof *c->items);
    char label[2 * NAME_BYTES_MAX];
    label_of(path, kind, upper, label, sizeof label);
    c->items[c->count].label = strdup(label);
    KF_ASSERT(c->items[c->count].label != NULL);
    c->items[c->count].text = text;
    c->count++;
}

static void cells_free(cells_t *c) {
    for (size_t i = 0; i < c->count; i++) {
        free(c->items[i].label);
        free(c->items[i].text);
    }
    free(c->items);
    memset(c, 0, sizeof *c);
}

static bool all_objects(json_t *array) {
    size_t i;
    json_t *v;
    json_array_foreach(array, i, v) {
        if (!json_is_object(v)) {
            return false;
        }
    }
    return json_array_size(array) > 0;
}

/* Compact JSON of `v`, cut for a cell. malloc'd. */
static char *json_cell(json_t *v) {
    char *dumped = kf_json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    KF_ASSERT(dumped != NULL);
    char *text = cut(one_line(dumped), EMBEDDED_CELL_CHARS_MAX);
    free(dumped);
    return text;
}

/* Scalars joined with ", ". malloc'd. */
static char *joined_cell(const ProtobufCFieldDescriptor *f, json_t *array) {
    char *joined = strdup("");
    KF_ASSERT(joined != NULL);
    size_t len = 0, i;
    json_t *e;
    json_array_foreach(array, i, e) {
        char *t = value_text(f, e, false);
        char *bigger = realloc(joined, len + strlen(t) + 3);
        KF_ASSERT(bigger != NULL);
        joined = bigger;
        len += (size_t)sprintf(joined + len, "%s%s", i > 0 ? ", " : "", t);
        free(t);
    }
    return joined;
}

/*
 * Flattens `obj` into cells with dotted paths under `prefix`. At the top of
 * a document (`lists` given) every message is flattened and each list of
 * objects goes to `lists`, to become a table of its own. Inside a table row
 * (`lists` NULL) a message is flattened only when it is small (at most
 * ROW_NESTED_FIELDS_MAX fields: a receipt, not a descriptor), else it is a
 * cut JSON cell like any list. Embedded JSON values (`_json` fields) are
 * cut JSON cells, except the elements of an embedded list at the top (the
 * rows of ReadOutput), whose own fields are the row's columns. Nesting is
 * that of the API's messages, a few levels.
 */
#define ROW_NESTED_FIELDS_MAX 3

static void flatten(json_t *obj, const ProtobufCMessageDescriptor *desc, bool embedded,
                    const Keyflow__V1__Schema *row_schema, const char *prefix, bool upper,
                    cells_t *out, lists_t *lists) {
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        bool is_embedded = embedded;
        const ProtobufCFieldDescriptor *f =
            embedded ? NULL : field_for_key(desc, key, &is_embedded);
        char path[2 * NAME_BYTES_MAX];
        snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", key);
        const ProtobufCMessageDescriptor *sub =
            f != NULL && !is_embedded && f->type == PROTOBUF_C_TYPE_MESSAGE ? f->descriptor : NULL;
        if (json_is_object(v) && sub != NULL &&
            (lists != NULL || json_object_size(v) <= ROW_NESTED_FIELDS_MAX)) {
            flatten(v, sub, false, NULL, path, upper, out, lists);
        } else if (json_is_array(v) && lists != NULL && all_objects(v) &&
                   (sub != NULL || is_embedded)) {
            lists->items = grow(lists->items, &lists->cap, lists->count, sizeof *lists->items);
            char title[2 * NAME_BYTES_MAX];
            label_of(path, TIME_NONE, false, title, sizeof title);
            lists->items[lists->count] = (list_t){strdup(title), v, sub};
            KF_ASSERT(lists->items[lists->count].title != NULL);
            lists->count++;
        } else if (json_is_array(v) && json_array_size(v) == 0) {
            cells_add(out, path, TIME_NONE, upper, strdup(lists != NULL ? "(none)" : ""));
        } else if (json_is_array(v) && !is_embedded && sub == NULL) {
            cells_add(out, path, TIME_NONE, upper, joined_cell(f, v));
        } else if (json_is_object(v) || json_is_array(v)) {
            cells_add(out, path, TIME_NONE, upper, json_cell(v));
        } else {
            char *stamp = embedded && prefix[0] == '\0' && is_stamp_column(row_schema, key)
                              ? row_stamp_text(v)
                              : NULL;
            if (stamp != NULL) {
                cells_add(out, path, TIME_STAMP_US, upper, stamp);
            } else {
                cells_add(out, path, is_embedded ? TIME_NONE : time_kind_of(f), upper,
                          value_text(f, v, is_embedded));
            }
        }
    }
}

/* ---- printing ------------------------------------------------------------- */

/* Display width: UTF-8 code points (close enough for a terminal). */
static size_t width_of(const char *s) {
    size_t n = 0;
    for (; *s != '\0'; s++) {
        n += ((unsigned char)*s & 0xc0) != 0x80;
    }
    return n;
}

static void pad(FILE *out, const char *text, size_t width) {
    fputs(text, out);
    for (size_t w = width_of(text); w < width; w++) {
        fputc(' ', out);
    }
}

/* "label   value" lines, labels aligned. */
static void print_cells(FILE *out, const cells_t *c) {
    size_t width = 0;
    for (size_t i = 0; i < c->count; i++) {
        size_t w = width_of(c->items[i].label);
        width = w > width ? w : width;
    }
    for (size_t i = 0; i < c->count; i++) {
        pad(out, c->items[i].label, width + 2);
        fprintf(out, "%s\n", c->items[i].text);
    }
}

/* One row per element; columns are the union of the elements' labels in
 * the order first seen. */
static void print_list(FILE *out, const list_t *l, const Keyflow__V1__Schema *row_schema) {
    size_t rows = json_array_size(l->array);
    cells_t *flat = calloc(rows, sizeof *flat);
    KF_ASSERT(flat != NULL);
    cells_t columns = {0}; /* label only; text is the column width */
    size_t *widths = NULL;
    size_t widths_cap = 0;
    for (size_t r = 0; r < rows; r++) {
        json_t *element = json_array_get(l->array, r);
        flatten(element, l->desc, l->desc == NULL, l->desc == NULL ? row_schema : NULL, "", true,
                &flat[r], NULL);
        for (size_t i = 0; i < flat[r].count; i++) {
            size_t k = 0;
            while (k < columns.count &&
                   strcmp(columns.items[k].label, flat[r].items[i].label) != 0) {
                k++;
            }
            if (k == columns.count) {
                columns.items =
                    grow(columns.items, &columns.cap, columns.count, sizeof *columns.items);
                columns.items[k].label = strdup(flat[r].items[i].label);
                columns.items[k].text = NULL;
                columns.count++;
                widths = grow(widths, &widths_cap, k, sizeof *widths);
                widths[k] = width_of(columns.items[k].label);
            }
            size_t w = width_of(flat[r].items[i].text);
            widths[k] = w > widths[k] ? w : widths[k];
        }
    }
    /* Spaces are owed, and written only before the next text, so that no
     * line ends in blanks. */
    size_t owed = 0;
    for (size_t k = 0; k < columns.count; k++) {
        fprintf(out, "%*s%s", (int)owed, "", columns.items[k].label);
        owed = widths[k] + 2 - width_of(columns.items[k].label);
    }
    fputc('\n', out);
    for (size_t r = 0; r < rows; r++) {
        owed = 0;
        for (size_t k = 0; k < columns.count; k++) {
            const char *text = "";
            for (size_t i = 0; i < flat[r].count; i++) {
                if (strcmp(flat[r].items[i].label, columns.items[k].label) == 0) {
                    text = flat[r].items[i].text;
                    break;
                }
            }
            if (text[0] != '\0') {
                fprintf(out, "%*s%s", (int)owed, "", text);
                owed = 0;
            }
            owed += widths[k] + 2 - width_of(text);
        }
        fputc('\n', out);
        cells_free(&flat[r]);
    }
    free(flat);
    free(widths);
    cells_free(&columns);
}

static void print_table(FILE *out, json_t *doc, const ProtobufCMessageDescriptor *desc,
                        const Keyflow__V1__Schema *row_schema) {
    cells_t cells = {0};
    lists_t lists = {0};
    flatten(doc, desc, false, NULL, "", false, &cells, &lists);
    if (cells.count == 0 && lists.count == 0) {
        fputs("(empty)\n", out); /* every field at its default */
    }
    print_cells(out, &cells);
    for (size_t i = 0; i < lists.count; i++) {
        if (cells.count > 0 || lists.count > 1) {
            fprintf(out, "%s%s:\n", cells.count > 0 || i > 0 ? "\n" : "", lists.items[i].title);
        }
        print_list(out, &lists.items[i], row_schema);
        free(lists.items[i].title);
    }
    free(lists.items);
    cells_free(&cells);
}

/* A SINGLE function's home partition in a table even when it is 0, the
 * proto3 default its JSON leaves out: a table without the line would read
 * as a function without a home. */
static void show_home_partition(json_t *info) {
    const char *placement = json_string_value(json_object_get(info, "placement"));
    if (placement != NULL && strcmp(placement, "PLACEMENT_SINGLE") == 0 &&
        json_object_get(info, "homePartition") == NULL) {
        json_object_set_new(info, "homePartition", json_integer(0));
    }
}

static void show_home_partitions(json_t *doc, const ProtobufCMessageDescriptor *desc) {
    if (desc == &keyflow__v1__function_info__descriptor) {
        show_home_partition(doc);
    } else if (desc == &keyflow__v1__register_function_response__descriptor) {
        show_home_partition(json_object_get(doc, "function"));
    } else if (desc == &keyflow__v1__list_functions_response__descriptor) {
        size_t i;
        json_t *info;
        json_array_foreach(json_object_get(doc, "functions"), i, info) {
            show_home_partition(info);
        }
    }
}

int kf__cli_print(kf__cli_t *cli, const ProtobufCMessage *msg) {
    json_t *doc = kf_message_to_jansson(msg);
    if (doc == NULL) {
        fprintf(stderr, "keyflow: RESOURCE_EXHAUSTED: cannot render the %s response\n",
                msg->descriptor->name);
        return KF__CLI_EXIT_ERROR;
    }
    kf__cli_progress_clear(cli);
    int rc = KF__CLI_EXIT_OK;
    if (cli->output == KF__CLI_OUTPUT_TABLE) {
        show_home_partitions(doc, msg->descriptor);
        print_table(stdout, doc, msg->descriptor, cli->row_schema);
    } else {
        char *text = kf_json_dumps(doc, JSON_COMPACT);
        if (text == NULL) {
            fprintf(stderr, "keyflow: RESOURCE_EXHAUSTED: cannot render the %s response\n",
                    msg->descriptor->name);
            rc = KF__CLI_EXIT_ERROR;
        } else {
            fputs(text, stdout);
            fputc('\n', stdout);
            free(text);
        }
    }
    json_decref(doc);
    if (rc == KF__CLI_EXIT_OK && (ferror(stdout) || fflush(stdout) != 0)) {
        fprintf(stderr, "keyflow: cannot write to stdout\n");
        rc = KF__CLI_EXIT_ERROR;
    }
    kf__cli_progress_redraw(cli);
    return rc;
}

/* ---- the progress line ---------------------------------------------------- */

void kf__cli_progress(kf__cli_t *cli, const char *fmt, ...) {
    if (!cli->progress_tty) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cli->progress, sizeof cli->progress, fmt, ap);
    va_end(ap);
    kf__cli_progress_redraw(cli);
}

void kf__cli_progress_redraw(kf__cli_t *cli) {
    if (cli->progress_tty && cli->progress[0] != '\0') {
        /* \r and "erase to the end of the line": the line is rewritten in place. */
        fprintf(stderr, "\r\033[K%s", cli->progress);
        fflush(stderr);
        cli->progress_shown = true;
    }
}

void kf__cli_progress_clear(kf__cli_t *cli) {
    if (cli->progress_shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        cli->progress_shown = false;
    }
}

void kf__cli_progress_end(kf__cli_t *cli) {
    kf__cli_progress_clear(cli);
    cli->progress[0] = '\0';
}
