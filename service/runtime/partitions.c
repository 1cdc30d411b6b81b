/* partitions.c - the data directory's layout and the served partitions'
 * engines (see partitions.h). */
#define _GNU_SOURCE /* getrandom */
#include "runtime/partitions.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/clock.h"
#include "base/log.h"

#define DATASET_FILE   "KEYFLOW-DATASET"
#define PARTITION_FILE "KEYFLOW-PARTITION"
#define DATASET_FORMAT 1
/* Room for the small text records this file writes and reads. */
#define RECORD_BYTES_MAX 1024

struct kf_partitions {
    uint32_t count;
    bool single_store; /* a store written before partitions: home and partition 0 */
    kf_store_t *home_store;
    /* Every store reads through this one cache: with a cache per store the
     * default 8 partitions held 9 x KF_ROCKS_BLOCK_CACHE_BYTES (measured:
     * 267 MB of cache in a soak, bench/README.md, "Soak"). */
    kf_store_cache_t *block_cache;
    kf_engine_t *home;
    kf_store_t *stores[KF_PARTITION_COUNT_MAX];
    kf_engine_t *engines[KF_PARTITION_COUNT_MAX];
    char ids[KF_PARTITION_COUNT_MAX][40];
    kf_router_t *router;
    kf_engine_config_t configs[KF_PARTITION_COUNT_MAX]; /* engines borrow theirs */
    kf_engine_config_t home_config;
    char description[160];
    int64_t open_us;    /* opening the stores (RocksDB replays its WAL) */
    int64_t recover_us; /* recovering the engines */
    /* The engines' on_fatal as the caller gave it (partition_fatal). */
    void (*on_fatal)(const kf_error_t *err, void *ctx);
    void *on_fatal_ctx;
};

/* Room the layout needs under the data directory ("/partitions/255/..."). */
#define LAYOUT_PATH_BYTES_MAX 64

/* snprintf for paths under a data directory whose length was checked
 * (kf_partitions_open), so they always fit. */
__attribute__((format(printf, 3, 4))) static void path_of(char *out, size_t cap, const char *fmt,
                                                          ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    KF_ASSERT(n >= 0 && (size_t)n < cap);
}

/* ---- small text records -------------------------------------------------- */

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Writes `text` to path atomically and durably: a temporary file, fsync,
 * rename, fsync of the directory. */
static kf_status_t write_record(const char *dir, const char *name, const char *text,
                                kf_error_t *err) {
    char path[PATH_MAX], tmp[PATH_MAX];
    path_of(path, sizeof path, "%s/%s", dir, name);
    path_of(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        return kf_error_set(err, KF_E_IO, "cannot create %s: %s", tmp, strerror(errno));
    }
    size_t len = strlen(text);
    bool ok = write(fd, text, len) == (ssize_t)len && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        return kf_error_set(err, KF_E_IO, "cannot write %s: %s", path, strerror(errno));
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0) {
        if (dfd >= 0) {
            close(dfd);
        }
        return kf_error_set(err, KF_E_IO, "cannot sync %s: %s", dir, strerror(errno));
    }
    close(dfd);
    return KF_OK;
}

static kf_status_t read_record(const char *path, char *text, size_t cap, kf_error_t *err) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return kf_error_set(err, KF_E_IO, "cannot read %s: %s", path, strerror(errno));
    }
    size_t n = fread(text, 1, cap - 1, f);
    bool bad = ferror(f) != 0 || n == cap - 1;
    fclose(f);
    if (bad) {
        return kf_error_set(err, KF_E_CORRUPT, "%s: unreadable or longer than %zu bytes", path,
                            cap - 2);
    }
    text[n] = '\0';
    return KF_OK;
}

/* The value of "name value" in a record, or NULL. Points into `text`,
 * which is changed (each line found is cut at its end). */
static const char *record_value(char *text, const char *name) {
    size_t n = strlen(name);
    for (char *line = text; line != NULL && *line != '\0';) {
        char *nl = strchr(line, '\n');
        if (strncmp(line, name, n) == 0 && line[n] == ' ') {
            if (nl != NULL) {
                *nl = '\0';
            }
            return line + n + 1;
        }
        line = nl != NULL ? nl + 1 : NULL;
    }
    return NULL;
}

static bool record_u32(char *text, const char *name, uint32_t *out) {
    char copy[RECORD_BYTES_MAX];
    snprintf(copy, sizeof copy, "%s", text);
    const char *v = record_value(copy, name);
    char *end = NULL;
    unsigned long n = v != NULL ? strtoul(v, &end, 10) : 0;
    if (v == NULL || end == v || *end != '\0' || n > UINT32_MAX) {
        return false;
    }
    *out = (uint32_t)n;
    return true;
}

static bool make_dir(const char *path, kf_error_t *err) {
    if (mkdir(path, 0700) != 0 && errno != EEXIST) {
        kf_error_set(err, KF_E_IO, "cannot create %s: %s", path, strerror(errno));
        return false;
    }
    return true;
}

/* ---- the data set record --------------------------------------------------- */

static kf_status_t read_dataset(const char *dir, uint32_t *count, kf_error_t *err) {
    char path[PATH_MAX], text[RECORD_BYTES_MAX];
    path_of(path, sizeof path, "%s/%s", dir, DATASET_FILE);
    kf_status_t st = read_record(path, text, sizeof text, err);
    if (st != KF_OK) {
        return st;
    }
    uint32_t format;
    char hash_copy[RECORD_BYTES_MAX];
    snprintf(hash_copy, sizeof hash_copy, "%s", text);
    const char *hash = record_value(hash_copy, "hash");
    if (strncmp(text, "keyflow data set\n", 17) != 0 || !record_u32(text, "format", &format) ||
        !record_u32(text, "partitions", count) || hash == NULL) {
        return kf_error_set(err, KF_E_CORRUPT, "%s: not a keyflow data set record", path);
    }
    if (format != DATASET_FORMAT || strcmp(hash, KF_PARTITION_HASH_NAME) != 0) {
        return kf_error_set(err, KF_E_CORRUPT,
                            "%s: format %u with hash %s; this keyflowd reads format %d with "
                            "hash %s",
                            path, format, hash, DATASET_FORMAT, KF_PARTITION_HASH_NAME);
    }
    if (*count < 1 || *count > KF_PARTITION_COUNT_MAX) {
        return kf_error_set(err, KF_E_CORRUPT, "%s: partitions %u is outside 1..%d", path, *count,
                            KF_PARTITION_COUNT_MAX);
    }
    return KF_OK;
}

static kf_status_t write_dataset(const char *dir, uint32_t count, kf_error_t *err) {
    char text[RECORD_BYTES_MAX];
    snprintf(text, sizeof text,
             "keyflow data set\nformat %d\npartitions %u\nhash %s\n"
             "# Written once, when the data set was created; checked at every start.\n"
             "# The partition count never changes (docs/scaling.md).\n",
             DATASET_FORMAT, count, KF_PARTITION_HASH_NAME);
    return write_record(dir, DATASET_FILE, text, err);
}

/* ---- a partition's directory ----------------------------------------------- */

/* Checks (or, when `create`, makes) DATA/partitions/<p> and its identity
 * record; *id gets the partition's id. */
static kf_status_t prepare_partition(const char *data_dir, uint32_t p, uint32_t count, bool create,
                                     char *dir, size_t dir_cap, char id[40], kf_error_t *err) {
    char parent[PATH_MAX], path[PATH_MAX], text[RECORD_BYTES_MAX];
    path_of(parent, sizeof parent, "%s/partitions", data_dir);
    path_of(dir, dir_cap, "%s/%u", parent, p);
    path_of(path, sizeof path, "%s/%s", dir, PARTITION_FILE);
    if (!exists(path)) {
        if (!create) {
            return kf_error_set(
                err, KF_E_INVALID,
                "partition %u is not in %s (no %s): this process is told to serve it, but its "
                "directory is elsewhere; move it here (docs/scaling.md, \"Moving a partition\") "
                "or leave it out of --partitions. A new, empty partition %u is never made for an "
                "existing data set: it would split the state of its keys",
                p, data_dir, path, p);
        }
        if (exists(dir)) {
            char current[PATH_MAX];
            path_of(current, sizeof current, "%s/CURRENT", dir);
            if (exists(current)) {
                return kf_error_set(err, KF_E_INVALID,
                                    "%s holds a store but no %s: not a partition this keyflowd "
                                    "made",
                                    dir, PARTITION_FILE);
            }
        }
        uint8_t random[8];
        if (getrandom(random, sizeof random, 0) != (ssize_t)sizeof random) {
            return kf_error_set(err, KF_E_IO, "getrandom: %s", strerror(errno));
        }
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        snprintf(id, 40, "%llx-%02x%02x%02x%02x%02x%02x%02x%02x",
                 (unsigned long long)now.tv_sec * 1000 + (unsigned long long)now.tv_nsec / 1000000,
                 random[0], random[1], random[2], random[3], random[4], random[5], random[6],
                 random[7]);
        snprintf(text, sizeof text,
                 "keyflow partition\npartition %u\npartitions %u\nid %s\n"
                 "# Partition %u of a data set of %u (docs/scaling.md). Move this whole\n"
                 "# directory to move the partition; never copy it to two places.\n",
                 p, count, id, p, count);
        if (!make_dir(parent, err) || !make_dir(dir, err)) {
            return err->status;
        }
        return write_record(dir, PARTITION_FILE, text, err);
    }
    kf_status_t st = read_record(path, text, sizeof text, err);
    if (st != KF_OK) {
        return st;
    }
    uint32_t index, of;
    char id_copy[RECORD_BYTES_MAX];
    snprintf(id_copy, sizeof id_copy, "%s", text);
    const char *stored_id = record_value(id_copy, "id");
    if (strncmp(text, "keyflow partition\n", 18) != 0 || !record_u32(text, "partition", &index) ||
        !record_u32(text, "partitions", &of) || stored_id == NULL) {
        return kf_error_set(err, KF_E_CORRUPT, "%s: not a keyflow partition record", path);
    }
    if (index != p || of != count) {
        return kf_error_set(err, KF_E_INVALID,
                            "%s says partition %u of %u, but it is in the place of partition %u "
                            "of %u: a directory moved to the wrong place",
                            path, index, of, p, count);
    }
    snprintf(id, 40, "%s", stored_id);
    return KF_OK;
}

/* A data set is being created (DATA has no KEYFLOW-DATASET) where
 * DATA/partitions already holds partitions: moved here from a data set of
 * theirs, or left by a creation that was interrupted. Each must belong to a
 * data set of `count` partitions, or creating would hide them: a new data
 * set of another count (the default one, a forgotten --partition-count)
 * would serve their keys from new, empty partitions, a split of every key
 * they hold, and leave directories of the wrong count behind. Checked
 * before anything is made. */
static kf_status_t check_present_partitions(const char *data_dir, uint32_t count, kf_error_t *err) {
    char parent[PATH_MAX];
    path_of(parent, sizeof parent, "%s/partitions", data_dir);
    DIR *d = opendir(parent);
    if (d == NULL) {
        return KF_OK; /* none: a new data set */
    }
    kf_status_t st = KF_OK;
    struct dirent *de;
    while (st == KF_OK && (de = readdir(d)) != NULL) {
        char path[PATH_MAX + 300], text[RECORD_BYTES_MAX];
        snprintf(path, sizeof path, "%s/%s/%s", parent, de->d_name, PARTITION_FILE);
        if (de->d_name[0] == '.' || !exists(path)) {
            continue;
        }
        uint32_t index, of;
        st = read_record(path, text, sizeof text, err);
        if (st == KF_OK &&
            (strncmp(text, "keyflow partition\n", 18) != 0 ||
             !record_u32(text, "partition", &index) || !record_u32(text, "partitions", &of))) {
            st = kf_error_set(err, KF_E_CORRUPT, "%s: not a keyflow partition record", path);
        }
        if (st == KF_OK && of != count) {
            st = kf_error_set(err, KF_E_INVALID,
                              "%s has no %s, but %s holds partition %u of a data set of %u "
                              "partitions: creating a data set of %u here would hide it and split "
                              "its keys. Start with --partition-count %u to adopt it "
                              "(docs/scaling.md, \"Moving a partition\")",
                              data_dir, DATASET_FILE, path, index, of, count, of);
        }
    }
    closedir(d);
    return st;
}

/* Partition directories present but not served, for the log. */
static void note_unserved(const char *data_dir, const kf_partition_set_t *served) {
    char parent[PATH_MAX];
    path_of(parent, sizeof parent, "%s/partitions", data_dir);
    DIR *d = opendir(parent);
    if (d == NULL) {
        return;
    }
    kf_partition_set_t here;
    memset(&here, 0, sizeof here);
    here.count = served->count;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char *end;
        unsigned long p = strtoul(de->d_name, &end, 10);
        if (end != de->d_name && *end == '\0' && p < served->count &&
            !kf_partition_set_has(served, (uint32_t)p)) {
            kf_partition_set_add(&here, (uint32_t)p);
        }
    }
    closedir(d);
    if (kf_partition_set_size(&here) > 0) {
        char text[128];
        kf_partition_set_format(&here, text, sizeof text);
        kf_log(KF_LOG_INFO, "partitions",
               "%s/partitions also holds partitions %s, which this process does not serve",
               data_dir, text);
    }
}

/* ---- opening ------------------------------------------------------------- */

/* One store to open (or close), on a thread of its own. */
typedef struct store_job {
    char path[PATH_MAX];
    size_t wal_bytes_max;
    kf_store_cache_t *block_cache;
    kf_store_t **store;
    kf_status_t status;
    kf_error_t err;
} store_job_t;

static void *open_store_main(void *arg) {
    store_job_t *job = arg;
    kf_rocks_options_t ro = {
        .path = job->path, .wal_bytes_max = job->wal_bytes_max, .block_cache = job->block_cache};
    job->status = kf_store_open_rocks(&ro, job->store, &job->err);
    if (job->status != KF_OK) {
        char inner[KF_ERROR_MESSAGE_BYTES_MAX];
        snprintf(inner, sizeof inner, "%s", job->err.message);
        kf_error_set(&job->err, job->status, "%s: %s", job->path, inner);
    }
    return NULL;
}

static void *close_store_main(void *arg) {
    store_job_t *job = arg;
    kf_store_close(*job->store); /* flushes its memtables first */
    *job->store = NULL;
    return NULL;
}

/* Runs fn over the jobs, up to KF_PARTITION_OPEN_THREADS_MAX at once: a
 * store's open or close is mostly waiting for fsync, and with 8 partitions
 * opened one after the other that wait was most of a start. A thread that
 * cannot be started runs its job here. */
static void run_store_jobs(store_job_t *jobs, size_t n, void *(*fn)(void *)) {
    for (size_t first = 0; first < n; first += KF_PARTITION_OPEN_THREADS_MAX) {
        size_t count = n - first;
        if (count > KF_PARTITION_OPEN_THREADS_MAX) {
            count = KF_PARTITION_OPEN_THREADS_MAX;
        }
        pthread_t threads[KF_PARTITION_OPEN_THREADS_MAX];
        bool started[KF_PARTITION_OPEN_THREADS_MAX];
        for (size_t i = 0; i < count; i++) {
            started[i] = pthread_create(&threads[i], NULL, fn, &jobs[first + i]) == 0;
            if (!started[i]) {
                fn(&jobs[first + i]);
            }
        }
        for (size_t i = 0; i < count; i++) {
            if (started[i]) {
                pthread_join(threads[i], NULL);
            }
        }
    }
}

/* The share of the process's WAL budget (limits.h) each of n stores gets. */
static size_t wal_share_bytes(uint32_t n) {
    size_t share = KF_ROCKS_WAL_BYTES_MAX / (n > 0 ? n : 1);
    return share > KF_ROCKS_WAL_BYTES_PER_STORE_MIN ? share : KF_ROCKS_WAL_BYTES_PER_STORE_MIN;
}

/* Opens the served partitions' stores and home's together; on an error
 * the ones that opened stay in ps for kf_partitions_close. */
static kf_status_t open_stores(kf_partitions_t *ps, const char *data_dir,
                               const kf_partition_set_t *served, kf_error_t *err) {
    store_job_t *jobs = calloc(KF_PARTITION_COUNT_MAX + 1, sizeof *jobs);
    if (jobs == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate the store openings");
    }
    size_t n = 0;
    size_t share = wal_share_bytes(kf_partition_set_size(served));
    for (uint32_t p = 0; p < ps->count; p++) {
        if (kf_partition_set_has(served, p)) {
            path_of(jobs[n].path, sizeof jobs[n].path, "%s/partitions/%u", data_dir, p);
            jobs[n].wal_bytes_max = share;
            jobs[n].block_cache = ps->block_cache;
            jobs[n++].store = &ps->stores[p];
        }
    }
    path_of(jobs[n].path, sizeof jobs[n].path, "%s/home", data_dir);
    jobs[n].wal_bytes_max = KF_ROCKS_WAL_BYTES_PER_STORE_MIN; /* API keys only */
    jobs[n].block_cache = ps->block_cache;
    jobs[n++].store = &ps->home_store;
    int64_t begin_us = kf_mono_us();
    run_store_jobs(jobs, n, open_store_main);
    ps->open_us += kf_mono_us() - begin_us;
    kf_status_t st = KF_OK;
    for (size_t i = 0; i < n && st == KF_OK; i++) {
        if (jobs[i].status != KF_OK) {
            *err = jobs[i].err;
            st = jobs[i].status;
        }
    }
    free(jobs);
    return st;
}

/* Closes every store still open, several at once (each flushes first). */
static void close_stores(kf_partitions_t *ps) {
    store_job_t *jobs = calloc(KF_PARTITION_COUNT_MAX + 1, sizeof *jobs);
    size_t n = 0;
    for (uint32_t p = 0; p < ps->count; p++) {
        if (ps->stores[p] != NULL && ps->stores[p] != ps->home_store) {
            if (jobs != NULL) {
                jobs[n++].store = &ps->stores[p];
            } else {
                kf_store_close(ps->stores[p]);
                ps->stores[p] = NULL;
            }
        }
    }
    if (jobs != NULL) {
        run_store_jobs(jobs, n, close_store_main);
        free(jobs);
    }
    if (ps->home_store != NULL) {
        kf_store_close(ps->home_store);
        ps->home_store = NULL;
    }
}

static kf_status_t open_store(kf_partitions_t *ps, const char *path, kf_store_t **out,
                              kf_error_t *err) {
    kf_rocks_options_t ro = {.path = path, .block_cache = ps->block_cache};
    int64_t begin_us = kf_mono_us();
    kf_status_t st = kf_store_open_rocks(&ro, out, err);
    ps->open_us += kf_mono_us() - begin_us;
    if (st != KF_OK) {
        char inner[KF_ERROR_MESSAGE_BYTES_MAX];
        snprintf(inner, sizeof inner, "%s", err->message);
        kf_error_set(err, st, "%s: %s", path, inner);
    }
    return st;
}

/* The served set: --partitions, else the node's in the placement, else all. */
static kf_status_t served_set(const kf_partitions_options_t *o, uint32_t count,
                              kf_partition_set_t *out, kf_error_t *err) {
    if (o->placement != NULL && o->placement->partition_count != count) {
        return kf_error_set(err, KF_E_INVALID,
                            "the placement names %u partitions, the data set in %s has %u",
                            o->placement->partition_count, o->data_dir, count);
    }
    const kf_placement_node_t *node =
        o->node != NULL ? kf_placement_node(o->placement, o->node) : NULL;
    if (o->node != NULL && o->placement != NULL && node == NULL) {
        return kf_error_set(err, KF_E_INVALID, "--node %s: the placement has no such node",
                            o->node);
    }
    if (o->serve != NULL) {
        kf_status_t st = kf_partition_set_parse("--partitions", o->serve, count, out, err);
        if (st == KF_OK && node != NULL &&
            memcmp(out->bits, node->partitions.bits, sizeof out->bits) != 0) {
            return kf_error_set(err, KF_E_INVALID,
                                "--partitions %s differs from what the placement gives node %s",
                                o->serve, o->node);
        }
        return st;
    }
    if (node != NULL) {
        *out = node->partitions;
        if (kf_partition_set_size(out) == 0) {
            return kf_error_set(err, KF_E_INVALID, "the placement gives node %s no partition",
                                o->node);
        }
        return KF_OK;
    }
    kf_partition_set_all(count, out);
    return KF_OK;
}

/* A failed sync in one partition fail-stops the whole process. The other
 * engines take the same failure first: what they hold and whatever comes
 * until the process is gone is answered "storage failure: ..., stopping"
 * (docs/semantics.md, "Durability and visibility"), not "shutting down"
 * or, for a parked poll or wait, an empty or stale answer at the stop.
 * Then the caller's on_fatal stops the process. Committer thread. */
static void partition_fatal(const kf_error_t *err, void *ctx) {
    kf_partitions_t *ps = ctx;
    for (uint32_t p = 0; p < ps->count; p++) {
        if (ps->engines[p] != NULL) {
            kf_engine_fail(ps->engines[p], err);
        }
    }
    if (ps->home != NULL) {
        kf_engine_fail(ps->home, err);
    }
    ps->on_fatal(err, ps->on_fatal_ctx);
}

/* Each served partition's share of the process's --replay-bytes: at least
 * a byte, since 0 would mean the default. */
static int64_t replay_share(const kf_engine_config_t *c, const kf_partition_set_t *served) {
    int64_t total = c->replay_bytes > 0 ? c->replay_bytes : KF_REPLAY_BYTES_DEFAULT;
    int64_t share = total / (int64_t)kf_partition_set_size(served);
    return share > 0 ? share : 1;
}

static kf_status_t open_engine(kf_partitions_t *ps, kf_engine_config_t *config, kf_store_t *store,
                               kf_engine_t **out, kf_error_t *err) {
    if (config->on_fatal != NULL && config->on_fatal != partition_fatal) {
        ps->on_fatal = config->on_fatal;
        ps->on_fatal_ctx = config->on_fatal_ctx;
        config->on_fatal = partition_fatal;
        config->on_fatal_ctx = ps;
    }
    int64_t begin_us = kf_mono_us();
    kf_status_t st = kf_engine_create(config, store, out, err);
    ps->recover_us += kf_mono_us() - begin_us;
    return st;
}

kf_status_t kf_partitions_open(const kf_partitions_options_t *o, kf_partitions_t **out,
                               kf_error_t *err) {
    if (strlen(o->data_dir) + LAYOUT_PATH_BYTES_MAX >= PATH_MAX) {
        return kf_error_set(err, KF_E_INVALID, "data directory: at most %d bytes",
                            PATH_MAX - LAYOUT_PATH_BYTES_MAX - 1);
    }
    kf_partitions_t *ps = calloc(1, sizeof *ps);
    if (ps == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate the partitions");
    }
    char path[PATH_MAX];
    path_of(path, sizeof path, "%s/%s", o->data_dir, DATASET_FILE);
    bool have_dataset = exists(path);
    path_of(path, sizeof path, "%s/CURRENT", o->data_dir);
    ps->single_store = !have_dataset && exists(path);
    kf_status_t st = KF_OK;
    kf_partition_set_t served;
    if (ps->single_store) {
        ps->count = 1;
        if (o->partition_count > 1) {
            st = kf_error_set(err, KF_E_INVALID,
                              "--partition-count %u: %s is a single store written before "
                              "partitions, a data set of one partition; the count of a data "
                              "set never changes (docs/scaling.md)",
                              o->partition_count, o->data_dir);
        }
    } else if (have_dataset) {
        st = read_dataset(o->data_dir, &ps->count, err);
        if (st == KF_OK && o->partition_count != 0 && o->partition_count != ps->count) {
            st = kf_error_set(err, KF_E_INVALID,
                              "--partition-count %u: the data set in %s has %u partitions, fixed "
                              "when it was created (docs/scaling.md)",
                              o->partition_count, o->data_dir, ps->count);
        }
    } else {
        ps->count = o->partition_count != 0 ? o->partition_count : KF_PARTITION_COUNT_DEFAULT;
        st = check_present_partitions(o->data_dir, ps->count, err);
    }
    if (st == KF_OK) {
        st = served_set(o, ps->count, &served, err);
    }
    if (st == KF_OK) {
        ps->block_cache = kf_store_cache_create(KF_ROCKS_BLOCK_CACHE_BYTES);
        if (ps->block_cache == NULL) {
            st = kf_error_set(err, KF_E_NOMEM, "cannot allocate the block cache");
        }
    }
    if (st != KF_OK) {
        free(ps);
        return st;
    }
    ps->home_config = o->engine;
    ps->home_config.partition_index = 0;
    ps->home_config.partition_count = ps->count;
    char served_text[64];
    kf_partition_set_format(&served, served_text, sizeof served_text);
    if (ps->single_store) {
        /* In place: the store is home and partition 0, keys and all. */
        st = open_store(ps, o->data_dir, &ps->stores[0], err);
        if (st == KF_OK) {
            ps->home_store = ps->stores[0];
            st = open_engine(ps, &ps->home_config, ps->stores[0], &ps->engines[0], err);
        }
        if (st == KF_OK) {
            ps->home = ps->engines[0];
        }
        snprintf(ps->description, sizeof ps->description,
                 "1 partition (a single store written before partitions, opened in place)");
    } else {
        bool create = !have_dataset;
        for (uint32_t p = 0; st == KF_OK && p < ps->count; p++) {
            char dir[PATH_MAX];
            if (kf_partition_set_has(&served, p)) {
                st = prepare_partition(o->data_dir, p, ps->count, create, dir, sizeof dir,
                                       ps->ids[p], err);
            }
        }
        if (st == KF_OK) {
            st = open_stores(ps, o->data_dir, &served, err);
        }
        for (uint32_t p = 0; st == KF_OK && p < ps->count; p++) {
            if (kf_partition_set_has(&served, p)) {
                ps->configs[p] = o->engine;
                /* The process's memory budget, shared by its partitions. */
                ps->configs[p].memory_budget_bytes =
                    o->engine.memory_budget_bytes / kf_partition_set_size(&served);
                ps->configs[p].memory_budget_process_bytes = o->engine.memory_budget_bytes;
                ps->configs[p].memory_budget_partitions = kf_partition_set_size(&served);
                /* And --replay-bytes, so that the batches kept for
                 * ReplayBatch take a fixed amount of memory whatever the
                 * partition count (each partition keeps its part of a
                 * batch, so its share holds as many batches). */
                ps->configs[p].replay_bytes = replay_share(&o->engine, &served);
                ps->configs[p].disk_sharing_partitions = kf_partition_set_size(&served);
                ps->configs[p].partition_index = p;
                ps->configs[p].partition_count = ps->count;
                ps->configs[p].metrics_slot = p + 1;
                /* API keys live in home; the partition's own registry is a
                 * disabled one (core/core.c) that never bootstraps. */
                ps->configs[p].auth = NULL;
                ps->configs[p].revocations_auth = o->engine.auth;
                ps->configs[p].admin_key_path = NULL;
                ps->configs[p].new_admin_key = false;
                st = open_engine(ps, &ps->configs[p], ps->stores[p], &ps->engines[p], err);
            }
        }
        ps->home_config.memory_budget_bytes = 0; /* API keys only: nothing to budget */
        if (st == KF_OK) {
            st = open_engine(ps, &ps->home_config, ps->home_store, &ps->home, err);
        }
        if (st == KF_OK && create) {
            st = write_dataset(o->data_dir, ps->count, err);
            if (st == KF_OK) {
                kf_log(KF_LOG_INFO, "partitions",
                       "created a data set of %u partitions in %s (partitions %s made here)",
                       ps->count, o->data_dir, served_text);
            }
        }
        if (st == KF_OK) {
            note_unserved(o->data_dir, &served);
        }
        snprintf(ps->description, sizeof ps->description, "%u partition%s (%s), serving %s",
                 ps->count, ps->count == 1 ? "" : "s", KF_PARTITION_HASH_NAME, served_text);
    }
    if (st == KF_OK) {
        kf_router_config_t rc = {
            .partition_count = ps->count,
            .home = ps->home,
            .placement = o->placement,
            .node = o->node,
        };
        memcpy(rc.engines, ps->engines, sizeof rc.engines);
        for (uint32_t p = 0; p < ps->count; p++) {
            rc.ids[p] = ps->ids[p];
        }
        st = kf_router_create(&rc, &ps->router, err);
    }
    if (st != KF_OK) {
        kf_partitions_close(ps);
        return st;
    }
    *out = ps;
    return KF_OK;
}

kf_router_t *kf_partitions_router(kf_partitions_t *ps) {
    return ps->router;
}

kf_status_t kf_partitions_start(kf_partitions_t *ps, kf_error_t *err) {
    if (!ps->single_store) {
        kf_status_t st = kf_engine_start(ps->home, err);
        if (st != KF_OK) {
            return st;
        }
    }
    for (uint32_t p = 0; p < ps->count; p++) {
        if (ps->engines[p] != NULL) {
            kf_status_t st = kf_engine_start(ps->engines[p], err);
            if (st != KF_OK) {
                return st;
            }
        }
    }
    return KF_OK;
}

void kf_partitions_stop(kf_partitions_t *ps) {
    for (uint32_t p = 0; p < ps->count; p++) {
        if (ps->engines[p] != NULL) {
            kf_engine_stop(ps->engines[p]);
        }
    }
    if (ps->home != NULL) {
        kf_engine_stop(ps->home);
    }
}

void kf_partitions_close(kf_partitions_t *ps) {
    if (ps == NULL) {
        return;
    }
    kf_partitions_stop(ps);
    kf_router_destroy(ps->router);
    for (uint32_t p = 0; p < ps->count; p++) {
        if (ps->engines[p] != NULL && ps->engines[p] != ps->home) {
            kf_engine_destroy(ps->engines[p]);
        }
    }
    kf_engine_destroy(ps->home);
    close_stores(ps);
    kf_store_cache_destroy(ps->block_cache); /* after every store using it */
    free(ps);
}

const char *kf_partitions_describe(const kf_partitions_t *ps) {
    return ps->description;
}

void kf_partitions_timing(const kf_partitions_t *ps, int64_t *open_ms, int64_t *recover_ms) {
    *open_ms = ps->open_us / 1000;
    *recover_ms = ps->recover_us / 1000;
}

const char *kf_partitions_id(const kf_partitions_t *ps, uint32_t partition) {
    return partition < ps->count ? ps->ids[partition] : "";
}
