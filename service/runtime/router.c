/*
 * router.c - commands to partitions (see router.h).
 *
 * A keyed command goes to its partition's engine as it is. A command the
 * table routes SPLIT, ALL, MERGE or FIRST becomes a fan-out: a series of
 * rounds, each a set of sub-commands (one per partition asked) submitted
 * together; when every sub-command of a round has answered, the RPC's plan
 * either sets up another round or builds the call's answer.
 *
 *   kf_router_submit --plan->begin--> round --all answered--> plan->next
 *                                       ^                        |
 *                                       +------ another round ---+
 *                                                                | done
 *                                               finish: cmd->done(cmd)
 *
 * FIRST plans settle a round early: the first sub-command with something to
 * hand out cancels the others still parked (kf_engine_cancel), which answer
 * at once; anything they took in the same instant is handed out too.
 *
 * Locks, always in this order: router->lock (a command's `routed` pointer
 * while a fan-out is in flight, so that a cancel never meets a freed one) ->
 * fanout->lock (its round) -> an engine's own lock (kf_engine_cancel).
 * Sub-commands' done() runs on the engines' replier threads, which hold no
 * engine lock then.
 *
 * A round's `pending` counts its unanswered sub-commands plus one for the
 * thread submitting them, so the round cannot end (and the fan-out cannot
 * be freed) while that thread still walks it.
 */
#include "runtime/router.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/arena.h"
#include "base/assert.h"
#include "base/log.h"
#include "base/map.h"
#include "functions/rows.h"
#include "keyflow/v1/coordinators.pb-c.h"
#include "keyflow/v1/functions.pb-c.h"
#include "keyflow/v1/partitions.pb-c.h"
#include "keyflow/v1/runs.pb-c.h"
#include "keyflow/v1/workers.pb-c.h"

struct kf_router {
    uint32_t count;
    kf_engine_t *engines[KF_PARTITION_COUNT_MAX];
    kf_engine_t *home;
    uint32_t served[KF_PARTITION_COUNT_MAX]; /* served partitions, ascending */
    uint32_t served_count;
    kf_partition_set_t served_set;
    char served_text[64];
    const kf_placement_t *placement;
    const char *node;
    const char *ids[KF_PARTITION_COUNT_MAX];
    pthread_mutex_t lock; /* see the top of the file */
    atomic_uint rotation; /* where PollRuns starts looking */
    pthread_mutex_t fn_lock;
    kf_map_t functions; /* function_id -> fn_entry_t (fn_lock) */
    pthread_mutex_t fan_lock;
    kf_map_t fans; /* worker streams: front end's link -> worker_fan_t (fan_lock) */
};

/* ---- fan-outs ----------------------------------------------------------- */

typedef struct fanout fanout_t;

typedef struct sub {
    kf_cmd_t cmd;
    kf_arena_t arena; /* the sub-command's response */
    fanout_t *fanout;
    uint32_t partition;
    bool in_engine; /* fanout->lock */
} sub_t;

typedef struct plan {
    const char *name;
    /* Sets up the first round (fanout_add) and returns KF_OK; or refuses the
     * call (cmd->error, nothing submitted); or sets *direct to a served
     * partition that can take the call as it is. */
    kf_status_t (*begin)(fanout_t *f, int32_t *direct);
    /* FIRST plans: whether an answer settles the round (the rest are
     * cancelled). NULL: never. fanout->lock held. */
    bool (*settles)(const sub_t *s);
    /* Every sub-command of the round answered: set up another round and
     * return true, or set the call's answer (response or error) and return
     * false. */
    bool (*next)(fanout_t *f);
    /* The plan sees the call even when the data set has one partition (it
     * translates a cursor into what the engine reads). */
    bool with_one_partition;
} plan_t;

struct fanout {
    kf_router_t *router;
    kf_cmd_t *parent;
    const plan_t *plan;
    pthread_mutex_t lock;
    uint32_t nsubs;   /* this round's */
    uint32_t pending; /* see the top of the file */
    bool cancelled;   /* the caller left */
    bool settled;     /* a FIRST round was answered */
    bool as_is;       /* this round is the call's own request to one partition */
    void *state;      /* the plan's, in the parent's arena */
    sub_t subs[];     /* router->served_count */
};

static void *routed_fanout(const fanout_t *f) {
    return (void *)((uintptr_t)f | 1);
}

/* The next sub-command of the round being set up: partition and request
 * (borrowed until the round ends); its response goes to its own arena. */
static sub_t *fanout_add(fanout_t *f, uint32_t partition, const ProtobufCMessage *request) {
    KF_ASSERT(f->nsubs < f->router->served_count);
    KF_ASSERT(f->router->engines[partition] != NULL);
    sub_t *s = &f->subs[f->nsubs++];
    kf_arena_reset(&s->arena);
    memset(&s->cmd, 0, sizeof s->cmd);
    s->cmd.op = f->parent->op;
    s->cmd.request = request;
    s->cmd.arena = &s->arena;
    s->cmd.principal = f->parent->principal;
    s->cmd.owner = s;
    s->partition = partition;
    s->in_engine = false;
    return s;
}

static void fanout_free(fanout_t *f) {
    for (uint32_t i = 0; i < f->router->served_count; i++) {
        kf_arena_deinit(&f->subs[i].arena);
    }
    pthread_mutex_destroy(&f->lock);
    free(f);
}

static void finish(fanout_t *f) {
    kf_cmd_t *parent = f->parent;
    pthread_mutex_lock(&f->router->lock);
    __atomic_store_n(&parent->routed, NULL, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&f->router->lock);
    fanout_free(f);
    parent->done(parent);
}

static bool round_run(fanout_t *f);

/* A round ended: the next one, or the answer. Any thread, no lock. */
static void round_ended(fanout_t *f) {
    while (f->plan->next(f)) {
        if (!round_run(f)) {
            return; /* a sub-command's done() ends this round */
        }
    }
    finish(f);
}

/* One unit of the round's pending count is gone; the last one ends it. */
static void round_release(fanout_t *f) {
    pthread_mutex_lock(&f->lock);
    KF_ASSERT(f->pending > 0);
    bool last = --f->pending == 0;
    pthread_mutex_unlock(&f->lock);
    if (last) {
        round_ended(f);
    }
}

/* A sub-command answered (its engine's replier thread, or the submitter
 * when the engine refused it). */
static void sub_answered(sub_t *s) {
    fanout_t *f = s->fanout;
    kf_router_t *r = f->router;
    pthread_mutex_lock(&f->lock);
    s->in_engine = false;
    if (!f->settled && f->plan->settles != NULL && f->plan->settles(s)) {
        f->settled = true;
        for (uint32_t i = 0; i < f->nsubs; i++) {
            if (f->subs[i].in_engine) {
                kf_engine_cancel(r->engines[f->subs[i].partition], &f->subs[i].cmd);
            }
        }
    }
    pthread_mutex_unlock(&f->lock);
    round_release(f);
}

static void sub_done(kf_cmd_t *cmd) {
    sub_answered(cmd->owner);
}

/* Submits the round set up by fanout_add. True when this thread ended the
 * round (every sub-command answered before it let go), false when a
 * sub-command's done() will. */
static bool round_run(fanout_t *f) {
    kf_router_t *r = f->router;
    pthread_mutex_lock(&f->lock);
    KF_ASSERT(f->nsubs > 0);
    f->pending = f->nsubs + 1; /* + this thread */
    f->settled = false;
    pthread_mutex_unlock(&f->lock);
    for (uint32_t i = 0; i < f->nsubs; i++) {
        sub_t *s = &f->subs[i];
        s->fanout = f;
        s->cmd.done = sub_done;
        s->cmd.owner = s;
        pthread_mutex_lock(&f->lock);
        bool skip = f->cancelled || f->settled;
        s->in_engine = !skip;
        pthread_mutex_unlock(&f->lock);
        if (skip) {
            kf_error_set(&s->cmd.error, KF_E_CANCELLED, "cancelled");
            sub_answered(s);
            continue;
        }
        kf_engine_t *e = r->engines[s->partition];
        if (kf_engine_submit(e, &s->cmd) != KF_OK) {
            sub_answered(s); /* cmd.error says why */
            continue;
        }
        /* A cancel that came while this one was being submitted missed it. */
        pthread_mutex_lock(&f->lock);
        if ((f->cancelled || f->settled) && s->in_engine) {
            kf_engine_cancel(e, &s->cmd);
        }
        pthread_mutex_unlock(&f->lock);
    }
    pthread_mutex_lock(&f->lock);
    bool last = --f->pending == 0;
    pthread_mutex_unlock(&f->lock);
    return last;
}

/* Sets up the next round: forget the last one's sub-commands. */
static void round_reset(fanout_t *f) {
    f->nsubs = 0;
}

/* ---- helpers the plans share -------------------------------------------- */

/* A deep copy of `msg` in `arena` (a sub-command's answer into the call's
 * arena, which outlives the fan-out). NULL past the arena's limit. */
static ProtobufCMessage *copy_message(const ProtobufCMessage *msg, kf_arena_t *arena) {
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = kf_xmalloc(len > 0 ? len : 1);
    protobuf_c_message_pack(msg, buf);
    ProtobufCMessage *copy =
        protobuf_c_message_unpack(msg->descriptor, kf_arena_pb(arena), len, buf);
    free(buf);
    return copy;
}

static void *copy_into_parent(fanout_t *f, const ProtobufCMessage *msg) {
    ProtobufCMessage *copy = copy_message(msg, f->parent->arena);
    if (copy == NULL) {
        kf_error_set(&f->parent->error, KF_E_LIMIT,
                     "response: the partitions' answers together are larger than a call may "
                     "hold; ask for less (page_size, max_runs)");
    }
    return copy;
}

/* The call fails as the sub-command did, naming its partition when there
 * are several and the call did not go to it as it is. */
static void fail_as(fanout_t *f, const sub_t *s) {
    f->parent->response = NULL;
    if (f->as_is) {
        f->parent->error = s->cmd.error;
        f->parent->foreign_partition = s->cmd.foreign_partition;
        f->parent->resume_after_seq = s->cmd.resume_after_seq;
    } else if (f->router->count > 1 && s->cmd.error.status != KF_E_CANCELLED) {
        kf_error_set(&f->parent->error, s->cmd.error.status, "partition %u: %s", s->partition,
                     s->cmd.error.message);
    } else {
        f->parent->error = s->cmd.error;
    }
}

/* Every served partition gets the call's own request. */
static void add_all_served(fanout_t *f) {
    for (uint32_t i = 0; i < f->router->served_count; i++) {
        fanout_add(f, f->router->served[i], f->parent->request);
    }
}

static void set_not_owner(kf_router_t *r, kf_cmd_t *cmd, uint32_t partition, const char *what) {
    const kf_placement_node_t *owner = kf_router_owner(r, partition);
    cmd->foreign_partition = (int32_t)partition;
    if (owner != NULL) {
        kf_error_set(&cmd->error, KF_E_NOT_OWNER,
                     "%s belongs to partition %u of %u, served by %s at %s, not by this process "
                     "(it serves %s): send the call there (docs/scaling.md)",
                     what, partition, r->count, owner->name, owner->grpc_address, r->served_text);
    } else {
        kf_error_set(&cmd->error, KF_E_NOT_OWNER,
                     "%s belongs to partition %u of %u, which this process does not serve (it "
                     "serves %s); its owner is not in this process's placement (docs/scaling.md)",
                     what, partition, r->count, r->served_text);
    }
}

/* ---- SendEvents: each event to its coordinator's partition --------------- */

typedef struct send_events_state {
    int32_t *partition_of;                  /* per event */
    uint32_t *index_in_sub;                 /* per event: its place in its partition's request */
    int32_t sub_of[KF_PARTITION_COUNT_MAX]; /* partition -> sub index, -1 */
} send_events_state_t;

static kf_status_t send_events_begin(fanout_t *f, int32_t *direct) {
    kf_router_t *r = f->router;
    const Keyflow__V1__SendEventsRequest *req = (const void *)f->parent->request;
    kf_arena_t *arena = f->parent->arena;
    size_t n = req->n_events;
    if (n > KF_SEND_EVENTS_MAX) {
        /* A bound of the call, not of each partition's part of it. */
        return kf_error_set(&f->parent->error, KF_E_INVALID,
                            "events: at most %d per call (KF_SEND_EVENTS_MAX), got %zu",
                            KF_SEND_EVENTS_MAX, n);
    }
    send_events_state_t *st = kf_arena_new(arena, sizeof *st);
    st->partition_of = kf_arena_new(arena, (n + 1) * sizeof *st->partition_of);
    st->index_in_sub = kf_arena_new(arena, (n + 1) * sizeof *st->index_in_sub);
    uint32_t events_in[KF_PARTITION_COUNT_MAX] = {0};
    int32_t first = -1;
    bool one = true;
    for (size_t i = 0; i < n; i++) {
        const Keyflow__V1__SendEventRequest *e = req->events[i];
        uint32_t p = kf_partition_of_coordinator(e->workflow, strlen(e->workflow), e->key,
                                                 strlen(e->key), r->count);
        st->partition_of[i] = (int32_t)p;
        st->index_in_sub[i] = events_in[p]++;
        one = one && (first < 0 || first == (int32_t)p);
        first = first < 0 ? (int32_t)p : first;
    }
    if (n == 0 || (one && r->engines[first] != NULL)) {
        *direct = n == 0 ? (int32_t)r->served[0] : first; /* the engine answers as it is */
        return KF_OK;
    }
    for (uint32_t p = 0; p < r->count; p++) {
        st->sub_of[p] = -1;
        if (events_in[p] == 0 || r->engines[p] == NULL) {
            continue;
        }
        Keyflow__V1__SendEventsRequest *part = kf_arena_new(arena, sizeof *part);
        keyflow__v1__send_events_request__init(part);
        part->events = kf_arena_new(arena, events_in[p] * sizeof *part->events);
        for (size_t i = 0; i < n; i++) {
            if (st->partition_of[i] == (int32_t)p) {
                part->events[part->n_events++] = req->events[i];
            }
        }
        st->sub_of[p] = (int32_t)f->nsubs;
        fanout_add(f, p, &part->base);
    }
    f->state = st;
    if (f->nsubs == 0) {
        /* Every event belongs elsewhere: say so for the first. */
        const Keyflow__V1__SendEventRequest *e = req->events[0];
        char what[KF_WORKFLOW_BYTES_MAX + KF_KEY_BYTES_MAX + 64];
        snprintf(what, sizeof what, "events[0] (workflow \"%.128s\", key \"%.256s\")", e->workflow,
                 e->key);
        set_not_owner(r, f->parent, (uint32_t)st->partition_of[0], what);
        return KF_E_NOT_OWNER;
    }
    return KF_OK;
}

static Keyflow__V1__SendEventsResult *event_error(kf_arena_t *arena, kf_status_t status,
                                                  const char *message) {
    Keyflow__V1__SendEventsResult *res = kf_arena_new(arena, sizeof *res);
    keyflow__v1__send_events_result__init(res);
    Keyflow__V1__EventError *e = kf_arena_new(arena, sizeof *e);
    keyflow__v1__event_error__init(e);
    e->code = kf_status_grpc_code(status);
    e->status = (char *)kf_status_grpc_name(status);
    e->message = kf_arena_strdup(arena, message);
    res->outcome_case = KEYFLOW__V1__SEND_EVENTS_RESULT__OUTCOME_ERROR;
    res->error = e;
    return res;
}

static bool send_events_next(fanout_t *f) {
    kf_router_t *r = f->router;
    send_events_state_t *st = f->state;
    const Keyflow__V1__SendEventsRequest *req = (const void *)f->parent->request;
    kf_arena_t *arena = f->parent->arena;
    const Keyflow__V1__SendEventsResponse *answers[KF_PARTITION_COUNT_MAX] = {0};
    for (uint32_t i = 0; i < f->nsubs; i++) {
        if (f->subs[i].cmd.error.status == KF_OK) {
            answers[i] = copy_into_parent(f, f->subs[i].cmd.response);
            if (answers[i] == NULL) {
                return false;
            }
        }
    }
    Keyflow__V1__SendEventsResponse *resp = kf_arena_new(arena, sizeof *resp);
    keyflow__v1__send_events_response__init(resp);
    resp->results = kf_arena_new(arena, (req->n_events + 1) * sizeof *resp->results);
    for (size_t i = 0; i < req->n_events; i++) {
        uint32_t p = (uint32_t)st->partition_of[i];
        int32_t sub = st->sub_of[p];
        Keyflow__V1__SendEventsResult *res;
        if (sub < 0) {
            kf_cmd_t probe;
            char what[64];
            snprintf(what, sizeof what, "events[%zu]", i);
            set_not_owner(r, &probe, p, what);
            res = event_error(arena, probe.error.status, probe.error.message);
        } else if (answers[sub] == NULL) {
            const kf_error_t *e = &f->subs[sub].cmd.error;
            res = event_error(arena, e->status, e->message);
        } else {
            KF_ASSERT(st->index_in_sub[i] < answers[sub]->n_results);
            res = answers[sub]->results[st->index_in_sub[i]];
        }
        resp->results[resp->n_results++] = res;
    }
    f->parent->response = &resp->base;
    kf_error_clear(&f->parent->error);
    return false;
}

static const plan_t plan_send_events = {"send_events", send_events_begin, NULL, send_events_next};

/* ---- PollRuns: partitions in turn, then parked on all -------------------
 * First every served partition is asked in turn, without waiting, for what
 * is still wanted (starting at a rotating partition, so that no partition's
 * runs wait behind another's); if none had a run and the call may wait, it
 * parks in every partition and the first to hand out runs answers. */

typedef struct poll_state {
    Keyflow__V1__PollRunsResponse *gathered; /* in the parent's arena */
    size_t gathered_cap;
    int64_t want; /* max_runs */
    uint32_t start;
    uint32_t asked;
    bool parked;
} poll_state_t;

static Keyflow__V1__PollRunsRequest *poll_request(fanout_t *f, int64_t max_runs, int64_t wait_ms) {
    const Keyflow__V1__PollRunsRequest *req = (const void *)f->parent->request;
    Keyflow__V1__PollRunsRequest *sub = kf_arena_new(f->parent->arena, sizeof *sub);
    *sub = *req;
    sub->max_runs = max_runs;
    sub->wait_ms = wait_ms;
    return sub;
}

static kf_status_t poll_begin(fanout_t *f, int32_t *direct) {
    (void)direct;
    kf_router_t *r = f->router;
    const Keyflow__V1__PollRunsRequest *req = (const void *)f->parent->request;
    poll_state_t *st = kf_arena_new(f->parent->arena, sizeof *st);
    st->gathered = kf_arena_new(f->parent->arena, sizeof *st->gathered);
    keyflow__v1__poll_runs_response__init(st->gathered);
    st->want = req->max_runs > 0 ? req->max_runs : 1;
    st->start = atomic_fetch_add(&r->rotation, 1) % r->served_count;
    f->state = st;
    /* The first partition gets the request as it came (but no wait): its
     * engine checks it, and refuses it for all of them. */
    fanout_add(f, r->served[st->start], &poll_request(f, req->max_runs, 0)->base);
    st->asked = 1;
    return KF_OK;
}

static bool poll_settles(const sub_t *s) {
    const Keyflow__V1__PollRunsResponse *resp = (const void *)s->cmd.response;
    return s->cmd.error.status == KF_OK && resp->n_runs > 0;
}

/* Adds a sub-command's runs to what the call hands out. */
static bool poll_gather(fanout_t *f, const sub_t *s) {
    poll_state_t *st = f->state;
    const Keyflow__V1__PollRunsResponse *resp = (const void *)s->cmd.response;
    if (resp->n_runs == 0) {
        return true;
    }
    Keyflow__V1__PollRunsResponse *copy = copy_into_parent(f, &resp->base);
    if (copy == NULL) {
        return false;
    }
    Keyflow__V1__PollRunsResponse *g = st->gathered;
    if (g->n_runs + copy->n_runs > st->gathered_cap) {
        size_t cap = (g->n_runs + copy->n_runs) * 2;
        Keyflow__V1__Run **runs = kf_arena_new(f->parent->arena, cap * sizeof *runs);
        if (g->n_runs > 0) {
            memcpy(runs, g->runs, g->n_runs * sizeof *runs);
        }
        g->runs = runs;
        st->gathered_cap = cap;
    }
    memcpy(g->runs + g->n_runs, copy->runs, copy->n_runs * sizeof *copy->runs);
    g->n_runs += copy->n_runs;
    return true;
}

static bool poll_next(fanout_t *f) {
    kf_router_t *r = f->router;
    poll_state_t *st = f->state;
    const Keyflow__V1__PollRunsRequest *req = (const void *)f->parent->request;
    const sub_t *failed = NULL;
    for (uint32_t i = 0; i < f->nsubs; i++) {
        const sub_t *s = &f->subs[i];
        if (s->cmd.error.status != KF_OK) {
            failed = failed != NULL ? failed : s;
        } else if (!poll_gather(f, s)) {
            return false; /* parent->error is set */
        }
    }
    bool have = st->gathered->n_runs > 0;
    if (!have && failed != NULL &&
        (!st->parked || failed->cmd.error.status != KF_E_CANCELLED || f->cancelled)) {
        fail_as(f, failed);
        return false;
    }
    if (!st->parked && !f->cancelled && (int64_t)st->gathered->n_runs < st->want &&
        st->asked < r->served_count) {
        round_reset(f);
        uint32_t p = r->served[(st->start + st->asked++) % r->served_count];
        int64_t left = st->want - (int64_t)st->gathered->n_runs;
        fanout_add(f, p, &poll_request(f, left, 0)->base);
        return true;
    }
    if (!have && !st->parked && !f->cancelled && req->wait_ms > 0) {
        round_reset(f);
        st->parked = true;
        Keyflow__V1__PollRunsRequest *parked = poll_request(f, st->want, req->wait_ms);
        for (uint32_t i = 0; i < r->served_count; i++) {
            fanout_add(f, r->served[(st->start + i) % r->served_count], &parked->base);
        }
        return true;
    }
    f->parent->response = &st->gathered->base;
    kf_error_clear(&f->parent->error);
    return false;
}

static const plan_t plan_poll_runs = {"poll_runs", poll_begin, poll_settles, poll_next};

/* ---- ListRuns: one partition after the other behind one page token ------
 * A token is "p<partition>:<that partition's token>". A page is filled from
 * one partition after the other until it holds page_size runs or the last
 * partition is done, so with 8 partitions a short list is still one page;
 * the end is an empty next_page_token, as always. */

typedef struct list_state {
    uint32_t at;                             /* index into router->served */
    uint32_t want;                           /* the page's size */
    Keyflow__V1__ListRunsResponse *gathered; /* the page so far */
} list_state_t;

static Keyflow__V1__ListRunsRequest *list_request(fanout_t *f, const char *token, uint32_t size) {
    const Keyflow__V1__ListRunsRequest *req = (const void *)f->parent->request;
    Keyflow__V1__ListRunsRequest *sub = kf_arena_new(f->parent->arena, sizeof *sub);
    *sub = *req;
    sub->page_token = (char *)token;
    sub->page_size = size;
    return sub;
}

static kf_status_t list_runs_begin(fanout_t *f, int32_t *direct) {
    (void)direct;
    kf_router_t *r = f->router;
    const Keyflow__V1__ListRunsRequest *req = (const void *)f->parent->request;
    list_state_t *st = kf_arena_new(f->parent->arena, sizeof *st);
    f->state = st;
    /* An out-of-range size goes to the partition as it came: its engine
     * refuses it with the usual message. */
    st->want = req->page_size > 0 && req->page_size <= KF_LIST_PAGE_MAX ? (uint32_t)req->page_size
               : req->page_size == 0                                    ? KF_LIST_PAGE_DEFAULT
                                                                        : 0;
    const char *inner = "";
    if (req->page_token[0] != '\0') {
        char *end = NULL;
        unsigned long p = req->page_token[0] == 'p' ? strtoul(req->page_token + 1, &end, 10) : 0;
        if (end == NULL || end == req->page_token + 1 || *end != ':' || p >= r->count) {
            return kf_error_set(&f->parent->error, KF_E_INVALID,
                                "page_token: not a token ListRuns gave (they start with "
                                "p<partition>:)");
        }
        if (r->engines[p] == NULL) {
            set_not_owner(r, f->parent, (uint32_t)p, "page_token");
            return KF_E_NOT_OWNER;
        }
        while (r->served[st->at] != p) {
            st->at++;
        }
        inner = end + 1;
    }
    Keyflow__V1__ListRunsRequest *first = list_request(f, inner, st->want);
    first->page_size = req->page_size;
    fanout_add(f, r->served[st->at], &first->base);
    return KF_OK;
}

/* Adds a partition's runs to the page; false when the answer is too large. */
static bool list_gather(fanout_t *f, const Keyflow__V1__ListRunsResponse *resp) {
    list_state_t *st = f->state;
    Keyflow__V1__ListRunsResponse *copy = copy_into_parent(f, &resp->base);
    if (copy == NULL) {
        return false;
    }
    Keyflow__V1__ListRunsResponse *g = st->gathered;
    if (g == NULL) {
        st->gathered = copy;
        return true;
    }
    if (copy->n_runs > 0) {
        Keyflow__V1__Run **runs =
            kf_arena_new(f->parent->arena, (g->n_runs + copy->n_runs) * sizeof *runs);
        if (g->n_runs > 0) {
            memcpy(runs, g->runs, g->n_runs * sizeof *runs);
        }
        memcpy(runs + g->n_runs, copy->runs, copy->n_runs * sizeof *copy->runs);
        g->runs = runs;
        g->n_runs += copy->n_runs;
    }
    return true;
}

static bool list_runs_next(fanout_t *f) {
    kf_router_t *r = f->router;
    list_state_t *st = f->state;
    const sub_t *s = &f->subs[0];
    if (s->cmd.error.status != KF_OK) {
        fail_as(f, s);
        return false;
    }
    const Keyflow__V1__ListRunsResponse *resp = (const void *)s->cmd.response;
    bool more_here = resp->next_page_token[0] != '\0';
    bool last_partition = st->at + 1 >= r->served_count;
    if (!list_gather(f, resp)) {
        return false;
    }
    Keyflow__V1__ListRunsResponse *out = st->gathered;
    if (!more_here && !last_partition && out->n_runs < st->want) {
        round_reset(f);
        st->at++;
        fanout_add(f, r->served[st->at],
                   &list_request(f, "", st->want - (uint32_t)out->n_runs)->base);
        return true;
    }
    if (more_here) {
        out->next_page_token =
            kf_arena_printf(f->parent->arena, "p%u:%s", s->partition, resp->next_page_token);
    } else if (!last_partition) {
        out->next_page_token = kf_arena_printf(f->parent->arena, "p%u:", r->served[st->at + 1]);
    } else {
        out->next_page_token = "";
    }
    f->parent->response = &out->base;
    kf_error_clear(&f->parent->error);
    return false;
}

static const plan_t plan_list_runs = {"list_runs", list_runs_begin, NULL, list_runs_next};

/* ---- functions: registration everywhere, descriptions combined ---------- */

/* Adds `b`'s counters to `a`, the same SPLIT function in another
 * partition, and puts b's shares of the limits beside a's. */
static void function_info_add(Keyflow__V1__FunctionInfo *a, const Keyflow__V1__FunctionInfo *b,
                              kf_arena_t *arena) {
    a->keys += b->keys;
    a->timers += b->timers;
    a->state_bytes += b->state_bytes;
    a->due_timers += b->due_timers;
    /* b lives in its sub-command's arena, which goes with the fan-out:
     * what a keeps of it is copied into the call's. */
    if (a->due_timers_error[0] == '\0' && b->due_timers_error[0] != '\0') {
        a->due_timers_error = kf_arena_strdup(arena, b->due_timers_error);
    }
    a->output_seq += b->output_seq;
    a->watermark_us = b->watermark_us < a->watermark_us ? b->watermark_us : a->watermark_us;
    if (a->available && !b->available) {
        a->available = false;
        a->unavailable_reason = kf_arena_strdup(arena, b->unavailable_reason);
    }
    if (b->n_partitions > 0) {
        Keyflow__V1__PartitionShare **shares =
            kf_arena_new(arena, (a->n_partitions + b->n_partitions) * sizeof *shares);
        memcpy(shares, a->partitions, a->n_partitions * sizeof *shares);
        for (size_t i = 0; i < b->n_partitions; i++) {
            shares[a->n_partitions + i] = kf_arena_new(arena, sizeof **shares);
            *shares[a->n_partitions + i] = *b->partitions[i];
        }
        a->partitions = shares;
        a->n_partitions += b->n_partitions;
    }
}

/* Which of a function's infos (one per partition) the call answers from:
 * a SINGLE function's home's (the only partition with its keys), else the
 * first. */
static size_t function_info_base(const kf_router_t *r,
                                 const Keyflow__V1__FunctionInfo *const *infos,
                                 const uint32_t *partitions, size_t n) {
    if (r->count > 1 && infos[0]->placement == KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SINGLE) {
        for (size_t i = 0; i < n; i++) {
            if (partitions[i] == (uint32_t)infos[0]->home_partition) {
                return i;
            }
        }
    }
    return 0;
}

/* Every partition's answer OK: the combined info (a SINGLE function's
 * home's, a SPLIT one's counters summed and shares side by side), or false
 * with parent->error set when the partitions hold different descriptors. */
static Keyflow__V1__FunctionInfo *
function_info_combine(fanout_t *f, const Keyflow__V1__FunctionInfo *const *infos,
                      const uint32_t *partitions, size_t n) {
    size_t base = function_info_base(f->router, infos, partitions, n);
    Keyflow__V1__FunctionInfo *out = copy_into_parent(f, &infos[base]->base);
    if (out == NULL) {
        return NULL;
    }
    bool split = out->placement != KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SINGLE;
    for (size_t i = 0; i < n; i++) {
        if (i == base) {
            continue;
        }
        if (strcmp(infos[i]->descriptor_sha256, out->descriptor_sha256) != 0) {
            kf_error_set(&f->parent->error, KF_E_INTERNAL,
                         "function %s: partition %u holds descriptor %.16s..., partition %u "
                         "holds %.16s...: the partitions disagree (docs/scaling.md)",
                         out->descriptor->function_id, partitions[base], out->descriptor_sha256,
                         partitions[i], infos[i]->descriptor_sha256);
            return NULL;
        }
        if (split) {
            function_info_add(out, infos[i], f->parent->arena);
        }
    }
    return out;
}

static kf_status_t all_begin(fanout_t *f, int32_t *direct) {
    (void)direct;
    add_all_served(f);
    return KF_OK;
}

/* The first failed sub-command, or NULL. */
static const sub_t *first_failure(const fanout_t *f) {
    for (uint32_t i = 0; i < f->nsubs; i++) {
        if (f->subs[i].cmd.error.status != KF_OK) {
            return &f->subs[i];
        }
    }
    return NULL;
}

static bool register_next(fanout_t *f) {
    const sub_t *failed = first_failure(f);
    if (failed != NULL) {
        /* Registering again is idempotent: partitions that took it answer
         * already_registered next time. */
        fail_as(f, failed);
        return false;
    }
    const Keyflow__V1__FunctionInfo *infos[KF_PARTITION_COUNT_MAX];
    uint32_t partitions[KF_PARTITION_COUNT_MAX];
    bool already = true;
    for (uint32_t i = 0; i < f->nsubs; i++) {
        const Keyflow__V1__RegisterFunctionResponse *resp = (const void *)f->subs[i].cmd.response;
        infos[i] = resp->function;
        partitions[i] = f->subs[i].partition;
        already = already && resp->already_registered;
    }
    Keyflow__V1__FunctionInfo *info = function_info_combine(f, infos, partitions, f->nsubs);
    if (info == NULL) {
        return false;
    }
    Keyflow__V1__RegisterFunctionResponse *out = kf_arena_new(f->parent->arena, sizeof *out);
    keyflow__v1__register_function_response__init(out);
    out->function = info;
    out->already_registered = already;
    f->parent->response = &out->base;
    kf_error_clear(&f->parent->error);
    return false;
}

static const plan_t plan_register_function = {"register_function", all_begin, NULL, register_next};

static bool get_function_next(fanout_t *f) {
    const Keyflow__V1__FunctionInfo *infos[KF_PARTITION_COUNT_MAX];
    uint32_t partitions[KF_PARTITION_COUNT_MAX];
    size_t n = 0;
    const sub_t *missing = NULL;
    for (uint32_t i = 0; i < f->nsubs; i++) {
        const sub_t *s = &f->subs[i];
        if (s->cmd.error.status == KF_E_NOT_FOUND) {
            missing = missing != NULL ? missing : s;
        } else if (s->cmd.error.status != KF_OK) {
            fail_as(f, s);
            return false;
        } else {
            infos[n] = (const void *)s->cmd.response;
            partitions[n++] = s->partition;
        }
    }
    if (n == 0) {
        f->parent->error = missing->cmd.error; /* the same everywhere: not found */
        return false;
    }
    Keyflow__V1__FunctionInfo *info = function_info_combine(f, infos, partitions, n);
    if (info == NULL) {
        return false;
    }
    if (missing != NULL) {
        info->available = false;
        info->unavailable_reason = kf_arena_printf(
            f->parent->arena,
            "not registered in partition %u: register it again (registration is idempotent and "
            "reaches every partition)",
            missing->partition);
    }
    f->parent->response = &info->base;
    kf_error_clear(&f->parent->error);
    return false;
}

static const plan_t plan_get_function = {"get_function", all_begin, NULL, get_function_next};

/* Every partition lists the same page (they hold the same functions); the
 * pages are combined function by function. */
static bool list_functions_next(fanout_t *f) {
    const sub_t *failed = first_failure(f);
    if (failed != NULL) {
        fail_as(f, failed);
        return false;
    }
    const Keyflow__V1__ListFunctionsResponse *first = (const void *)f->subs[0].cmd.response;
    Keyflow__V1__ListFunctionsResponse *out = copy_into_parent(f, &first->base);
    if (out == NULL) {
        return false;
    }
    for (size_t k = 0; k < out->n_functions; k++) {
        Keyflow__V1__FunctionInfo *fn = out->functions[k];
        const Keyflow__V1__FunctionInfo *infos[KF_PARTITION_COUNT_MAX];
        uint32_t partitions[KF_PARTITION_COUNT_MAX];
        size_t n = 0;
        for (uint32_t i = 0; i < f->nsubs; i++) {
            const Keyflow__V1__ListFunctionsResponse *other = (const void *)f->subs[i].cmd.response;
            const Keyflow__V1__FunctionInfo *found = NULL;
            for (size_t j = 0; j < other->n_functions && found == NULL; j++) {
                const Keyflow__V1__FunctionInfo *o = other->functions[j];
                if (strcmp(o->descriptor->function_id, fn->descriptor->function_id) == 0) {
                    found = o;
                }
            }
            if (found != NULL) {
                infos[n] = found;
                partitions[n++] = f->subs[i].partition;
            } else if (fn->available) {
                fn->available = false;
                fn->unavailable_reason = kf_arena_printf(
                    f->parent->arena, "not registered in partition %u: register it again",
                    f->subs[i].partition);
            }
        }
        /* Every page holds fn: it came from the first. */
        KF_ASSERT(n > 0 && partitions[0] == f->subs[0].partition);
        size_t base = function_info_base(f->router, infos, partitions, n);
        if (base != 0) {
            bool available = fn->available;
            const char *reason = fn->unavailable_reason;
            fn = out->functions[k] = copy_into_parent(f, &infos[base]->base);
            if (fn == NULL) {
                return false;
            }
            if (!available) {
                fn->available = false;
                fn->unavailable_reason = (char *)reason;
            }
        }
        for (size_t i = 0;
             i < n && fn->placement != KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SINGLE; i++) {
            if (i != base) {
                function_info_add(fn, infos[i], f->parent->arena);
            }
        }
    }
    f->parent->response = &out->base;
    kf_error_clear(&f->parent->error);
    return false;
}

static const plan_t plan_list_functions = {"list_functions", all_begin, NULL, list_functions_next};

/* ---- process functions: the descriptors the router splits by ----------
 * A batch is split by its rows' keys, so the router needs each function's
 * input schema and key columns. It keeps the canonical descriptor of each
 * function it has seen (packed; unpacked into a call's arena when used),
 * fetched with a GetFunction from a served partition the first time. A
 * descriptor never changes under its function_id; should a function be
 * replaced by another of the same id with other key columns, every
 * partition still checks that each row it takes is its own
 * (functions/step.c), so a stale entry refuses a batch (and is dropped)
 * rather than splitting a key. */

typedef struct fn_entry {
    kf_map_node_t node; /* by function_id, the copy below */
    char *function_id;  /* its own: the descriptor it came from goes away */
    uint8_t *packed;    /* the canonical FunctionDescriptor */
    size_t len;
    int32_t home; /* fn_home of the descriptor: a SINGLE function's partition, or -1 */
} fn_entry_t;

static void fn_entry_free(fn_entry_t *e) {
    free(e->function_id);
    free(e->packed);
    free(e);
}

/* The descriptor of `function_id` in `arena`, or NULL when not known. */
static Keyflow__V1__FunctionDescriptor *fn_lookup(kf_router_t *r, const char *function_id,
                                                  kf_arena_t *arena) {
    Keyflow__V1__FunctionDescriptor *d = NULL;
    pthread_mutex_lock(&r->fn_lock);
    kf_map_node_t *n = kf_map_get(&r->functions, function_id, strlen(function_id));
    if (n != NULL) {
        fn_entry_t *e = (fn_entry_t *)n;
        d = keyflow__v1__function_descriptor__unpack(kf_arena_pb(arena), e->len, e->packed);
    }
    pthread_mutex_unlock(&r->fn_lock);
    return d;
}

static void fn_forget_locked(kf_router_t *r, const char *function_id) {
    kf_map_node_t *n = kf_map_get(&r->functions, function_id, strlen(function_id));
    if (n != NULL) {
        kf_map_remove(&r->functions, n);
        fn_entry_free((fn_entry_t *)n);
    }
}

static void fn_forget(kf_router_t *r, const char *function_id) {
    pthread_mutex_lock(&r->fn_lock);
    fn_forget_locked(r, function_id);
    pthread_mutex_unlock(&r->fn_lock);
}

static int32_t fn_home(const kf_router_t *r, const Keyflow__V1__FunctionDescriptor *d);

static void fn_remember(kf_router_t *r, const Keyflow__V1__FunctionDescriptor *d) {
    fn_entry_t *e = kf_xcalloc(1, sizeof *e);
    e->home = fn_home(r, d);
    e->len = keyflow__v1__function_descriptor__get_packed_size(d);
    e->packed = kf_xmalloc(e->len > 0 ? e->len : 1);
    keyflow__v1__function_descriptor__pack(d, e->packed);
    e->function_id = kf_xstrdup(d->function_id);
    pthread_mutex_lock(&r->fn_lock);
    fn_forget_locked(r, e->function_id);
    if (r->functions.count < KF_FUNCTIONS_MAX) {
        kf_map_insert(&r->functions, &e->node, e->function_id, strlen(e->function_id));
        e = NULL;
    }
    pthread_mutex_unlock(&r->fn_lock);
    if (e != NULL) { /* full: the next call fetches it again */
        fn_entry_free(e);
    }
}

/* A SINGLE function's home from the descriptors the router keeps, without
 * unpacking one; -1 when it is not known here or its keys are split. */
static int32_t fn_cached_home(kf_router_t *r, const char *function_id) {
    int32_t home = -1;
    pthread_mutex_lock(&r->fn_lock);
    kf_map_node_t *n = kf_map_get(&r->functions, function_id, strlen(function_id));
    if (n != NULL) {
        home = ((const fn_entry_t *)n)->home;
    }
    pthread_mutex_unlock(&r->fn_lock);
    return home;
}

/* The input-schema index of each key column. */
static int key_columns(const Keyflow__V1__FunctionDescriptor *d,
                       uint32_t cols[KF_KEY_COLUMNS_MAX]) {
    int n = 0;
    for (size_t k = 0; k < d->n_key_columns && n < KF_KEY_COLUMNS_MAX; k++) {
        for (size_t i = 0; i < d->input_schema->n_fields; i++) {
            if (strcmp(d->input_schema->fields[i]->name, d->key_columns[k]) == 0) {
                cols[n++] = (uint32_t)i;
                break;
            }
        }
    }
    return n;
}

/* A plan over one function's keys: first the descriptor (a GetFunction
 * round when the router does not know it yet), then the plan's own rounds
 * (`with_descriptor`). */
typedef struct keyed_state {
    Keyflow__V1__FunctionDescriptor *descriptor;
    bool fetching;
    void *plan_state;
} keyed_state_t;

/* The partition holding every key of the function when it is SINGLE and
 * the data set has several partitions; -1 when its keys are split (SPLIT,
 * or registered before placement existed), or with one partition. */
static int32_t fn_home(const kf_router_t *r, const Keyflow__V1__FunctionDescriptor *d) {
    if (r->count == 1 || d->placement != KEYFLOW__V1__FUNCTION_PLACEMENT__PLACEMENT_SINGLE) {
        return -1;
    }
    return (int32_t)kf_partition_home_of_function(d->function_id, strlen(d->function_id), r->count);
}

/* The call goes as it is to the function's home, or is refused
 * KF_E_NOT_OWNER when another process serves it (a routing client asks
 * there, as for any keyed call). */
static kf_status_t to_home(fanout_t *f, uint32_t home, int32_t *direct) {
    if (f->router->engines[home] == NULL) {
        char what[KF_FUNCTION_ID_BYTES_MAX + 64];
        snprintf(what, sizeof what, "function %s (SINGLE: every key in its home)",
                 ((const keyed_state_t *)f->state)->descriptor->function_id);
        set_not_owner(f->router, f->parent, home, what);
        return KF_E_NOT_OWNER;
    }
    *direct = (int32_t)home;
    return KF_OK;
}

/* f->state, when the plan set one up, starts with a keyed_state_t. */
static kf_status_t keyed_begin(fanout_t *f, const char *function_id, int32_t *direct,
                               kf_status_t (*with_descriptor)(fanout_t *, int32_t *)) {
    if (f->state == NULL) {
        f->state = kf_arena_new(f->parent->arena, sizeof(keyed_state_t));
    }
    keyed_state_t *st = f->state;
    st->descriptor = fn_lookup(f->router, function_id, f->parent->arena);
    if (st->descriptor != NULL) {
        return with_descriptor(f, direct);
    }
    Keyflow__V1__GetFunctionRequest *get = kf_arena_new(f->parent->arena, sizeof *get);
    keyflow__v1__get_function_request__init(get);
    get->function_id = (char *)function_id;
    sub_t *s = fanout_add(f, f->router->served[0], &get->base);
    s->cmd.op = KF_OP_GET_FUNCTION;
    st->fetching = true;
    return KF_OK;
}

/* After the GetFunction round: true when the plan may go on (its first
 * round set up, or the answer set by with_descriptor). */
static bool keyed_fetched(fanout_t *f, kf_status_t (*with_descriptor)(fanout_t *, int32_t *)) {
    keyed_state_t *st = f->state;
    const sub_t *s = &f->subs[0];
    st->fetching = false;
    if (s->cmd.error.status != KF_OK) {
        fail_as(f, s); /* not found, permission: as the call itself would be */
        return false;
    }
    const Keyflow__V1__FunctionInfo *info = (const void *)s->cmd.response;
    fn_remember(f->router, info->descriptor);
    st->descriptor = copy_into_parent(f, &info->descriptor->base);
    if (st->descriptor == NULL) {
        return false;
    }
    round_reset(f);
    int32_t direct = -1;
    kf_status_t status = with_descriptor(f, &direct);
    if (status != KF_OK) {
        f->parent->response = NULL;
        return false; /* parent->error is set */
    }
    if (direct >= 0) {
        /* Mid-plan the call cannot be handed over as it is: one round of
         * its own request. */
        fanout_add(f, (uint32_t)direct, f->parent->request);
        f->as_is = true; /* its answer reads as if it had gone there at once */
    }
    return true;
}

/* ---- PushBatch: a SINGLE function's batch to its home, a SPLIT one's rows
 * to their keys' partitions -------------------------------------------------
 * A SINGLE function's batch goes to its home as it is: one atomic step, as
 * with one partition. A SPLIT function's rows (columnar, or JSON converted
 * to columnar) are grouped by the partition of their key; each partition
 * gets its rows, in their order, as one batch with the call's producer and
 * sequence (so a retry is a duplicate in every partition that took its
 * part, and new in the others). A watermark goes to every served
 * partition, rows or not: their timers fire by it. The call as a whole is
 * held to the function's max_input_rows and max_input_bytes before it is
 * split; each partition's part is then one step there (docs/scaling.md,
 * "Placement"). */

typedef struct split {
    uint32_t n; /* parts, in served order */
    uint32_t partition[KF_PARTITION_COUNT_MAX];
    Keyflow__V1__RowBatch *batch[KF_PARTITION_COUNT_MAX]; /* NULL: the watermark only */
} split_t;

/* Splits the rows of a SPLIT function's call (`rows_case`: the
 * PushBatchRequest's, which DryRunBatchRequest's mirrors) by partition into
 * `out` (in the call's arena); or sets *direct to the one partition that
 * can take the call as it is. Errors (parent->error): the rows' own, a row
 * of a partition served elsewhere (KF_E_NOT_OWNER: nothing applied
 * anywhere). */
static kf_status_t split_rows(fanout_t *f, uint32_t rows_case, const Keyflow__V1__RowBatch *batch,
                              const char *rows_json, bool watermark, int32_t *direct,
                              split_t **out) {
    kf_router_t *r = f->router;
    keyed_state_t *st = f->state;
    const Keyflow__V1__FunctionDescriptor *d = st->descriptor;
    kf_arena_t *arena = f->parent->arena;
    kf_error_t *err = &f->parent->error;
    kf_rows_t rows;
    memset(&rows, 0, sizeof rows);
    kf_status_t status = KF_OK;
    const Keyflow__V1__FunctionLimits *limits = d->limits;
    if (rows_case == KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_BATCH) {
        status = kf_rows_from_batch(batch, d->input_schema, limits->max_input_rows,
                                    limits->max_input_bytes, arena, &rows, err);
    } else if (rows_case == KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_ROWS_JSON) {
        status =
            kf_rows_from_json(rows_json, strlen(rows_json), d->input_schema, limits->max_input_rows,
                              limits->max_input_bytes, arena, &rows, err);
    }
    if (status != KF_OK) {
        return status;
    }
    uint32_t cols[KF_KEY_COLUMNS_MAX];
    int ncols = key_columns(d, cols);
    uint32_t *partition_of = kf_arena_new(arena, ((size_t)rows.count + 1) * sizeof *partition_of);
    uint32_t in[KF_PARTITION_COUNT_MAX] = {0};
    for (uint32_t i = 0; i < rows.count; i++) {
        kf_partition_hasher_t h;
        kf_partition_hasher_init(&h);
        for (int c = 0; c < ncols; c++) {
            kf_cell_t v;
            kf_rows_value(&rows, i, cols[c], &v);
            kf_partition_hasher_column(&h, v.p, v.len);
        }
        partition_of[i] = kf_partition_hasher_partition(&h, r->count);
        if (r->engines[partition_of[i]] == NULL) {
            char what[64];
            snprintf(what, sizeof what, "rows[%u]'s key", i);
            set_not_owner(r, f->parent, partition_of[i], what);
            return KF_E_NOT_OWNER; /* nothing of the batch is applied anywhere */
        }
        in[partition_of[i]]++;
    }
    uint32_t targets = 0;
    int32_t only = -1;
    for (uint32_t i = 0; i < r->served_count; i++) {
        uint32_t p = r->served[i];
        if (in[p] > 0 || watermark) {
            targets++;
            only = (int32_t)p;
        }
    }
    if (targets <= 1) {
        /* One partition (or none: the engine says what is wrong with an
         * empty batch) takes the call as it is. */
        *direct = targets == 1 ? only : (int32_t)r->served[0];
        return KF_OK;
    }
    split_t *sp = kf_arena_new(arena, sizeof *sp);
    uint32_t *which = kf_arena_new(arena, ((size_t)rows.count + 1) * sizeof *which);
    for (uint32_t i = 0; i < r->served_count; i++) {
        uint32_t p = r->served[i];
        if (in[p] == 0 && !watermark) {
            continue;
        }
        sp->partition[sp->n] = p;
        sp->batch[sp->n] = NULL;
        if (in[p] > 0) {
            uint32_t n = 0;
            for (uint32_t row = 0; row < rows.count; row++) {
                if (partition_of[row] == p) {
                    which[n++] = row;
                }
            }
            sp->batch[sp->n] = kf_rows_gather(&rows, which, n, arena);
            if (sp->batch[sp->n] == NULL) {
                return kf_error_set(err, KF_E_LIMIT, "rows: out of memory for this batch");
            }
        }
        sp->n++;
    }
    *out = sp;
    return KF_OK;
}

static kf_status_t push_split(fanout_t *f, int32_t *direct) {
    const Keyflow__V1__PushBatchRequest *req = (const void *)f->parent->request;
    int32_t home = fn_home(f->router, ((const keyed_state_t *)f->state)->descriptor);
    if (home >= 0) {
        return to_home(f, (uint32_t)home, direct);
    }
    split_t *sp = NULL;
    kf_status_t st = split_rows(f, req->rows_case, req->batch, req->rows_json,
                                req->watermark_present_case ==
                                    KEYFLOW__V1__PUSH_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US,
                                direct, &sp);
    for (uint32_t i = 0; st == KF_OK && sp != NULL && i < sp->n; i++) {
        Keyflow__V1__PushBatchRequest *part = kf_arena_new(f->parent->arena, sizeof *part);
        *part = *req;
        part->rows_case = sp->batch[i] != NULL ? KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_BATCH
                                               : KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS__NOT_SET;
        part->batch = sp->batch[i];
        fanout_add(f, sp->partition[i], &part->base);
    }
    return st;
}

static kf_status_t push_begin(fanout_t *f, int32_t *direct) {
    const Keyflow__V1__PushBatchRequest *req = (const void *)f->parent->request;
    return keyed_begin(f, req->function_id, direct, push_split);
}

/* Some partitions took their part of a SPLIT batch and others refused
 * theirs: the answer fails as the first refusal did, and says so, with the
 * partitions that applied theirs (cmd->applied_partitions: gRPC trailing
 * metadata keyflow-applied-partitions, HTTP "appliedPartitions"). The
 * parts applied stay applied (each partition's step is atomic and
 * durable); repeating the same batch is a duplicate where it was applied
 * and a new batch where it was refused, so a retry that succeeds leaves the
 * batch applied exactly once everywhere (docs/semantics.md, "Split
 * functions"). */
static void push_partly_applied(fanout_t *f, const sub_t *refused) {
    kf_arena_t *arena = f->parent->arena;
    char *applied = kf_arena_new(arena, (size_t)f->nsubs * 4 + 1);
    size_t n = 0;
    uint32_t refusals = 0;
    for (uint32_t i = 0; i < f->nsubs; i++) {
        const sub_t *s = &f->subs[i];
        if (s->cmd.error.status == KF_OK) {
            n += (size_t)sprintf(applied + n, "%s%u", n > 0 ? "," : "", s->partition);
        } else {
            refusals++;
        }
    }
    f->parent->response = NULL;
    f->parent->applied_partitions = applied;
    kf_error_set(&f->parent->error, refused->cmd.error.status,
                 "partly applied: partitions %s applied their rows of this batch, %u refused "
                 "theirs; repeating the same batch (producer_id, sequence, rows) applies only "
                 "what was refused (docs/semantics.md, \"Split functions\"). Partition %u: %s",
                 applied, refusals, refused->partition, refused->cmd.error.message);
}

static bool push_next(fanout_t *f) {
    keyed_state_t *st = f->state;
    if (st->fetching) {
        return keyed_fetched(f, push_split);
    }
    const Keyflow__V1__PushBatchRequest *req = (const void *)f->parent->request;
    const sub_t *refused = NULL;
    bool any_applied = false;
    for (uint32_t i = 0; i < f->nsubs; i++) {
        const sub_t *s = &f->subs[i];
        if (s->cmd.error.status == KF_E_NOT_OWNER) {
            fn_forget(f->router, req->function_id); /* a stale descriptor */
        }
        if (s->cmd.error.status != KF_OK) {
            refused = refused != NULL ? refused : s;
        } else {
            any_applied = true;
        }
    }
    if (refused != NULL && any_applied) {
        push_partly_applied(f, refused);
        return false;
    }
    if (refused != NULL) {
        fail_as(f, refused); /* nothing applied anywhere */
        return false;
    }
    Keyflow__V1__PushBatchResponse *out = kf_arena_new(f->parent->arena, sizeof *out);
    keyflow__v1__push_batch_response__init(out);
    out->sequence = req->sequence;
    out->duplicate = true;
    out->output_ranges = kf_arena_new(f->parent->arena, f->nsubs * sizeof *out->output_ranges);
    for (uint32_t i = 0; i < f->nsubs; i++) {
        const Keyflow__V1__PushBatchResponse *a = (const void *)f->subs[i].cmd.response;
        out->rows_accepted += a->rows_accepted;
        out->activations += a->activations;
        out->timer_callbacks += a->timer_callbacks;
        out->handler_calls += a->handler_calls;
        out->due_timers += a->due_timers;
        out->duplicate = out->duplicate && a->duplicate;
        out->watermark_us =
            i == 0 || a->watermark_us < out->watermark_us ? a->watermark_us : out->watermark_us;
        if (a->first_output_seq > 0) {
            Keyflow__V1__OutputRange *range = kf_arena_new(f->parent->arena, sizeof *range);
            keyflow__v1__output_range__init(range);
            range->partition = (int32_t)f->subs[i].partition;
            range->first_seq = a->first_output_seq;
            range->last_seq = a->last_output_seq;
            out->output_ranges[out->n_output_ranges++] = range;
        }
    }
    if (out->n_output_ranges == 1) {
        out->first_output_seq = out->output_ranges[0]->first_seq;
        out->last_output_seq = out->output_ranges[0]->last_seq;
    }
    f->parent->response = &out->base;
    kf_error_clear(&f->parent->error);
    return false;
}

static const plan_t plan_push_batch = {"push_batch", push_begin, NULL, push_next};

/* ---- DryRunBatch: as PushBatch, nothing applied ---------------------------
 * A SINGLE function's dry run goes to its home; a SPLIT one's rows and
 * watermark route as a PushBatch's would, each partition dry-runs its part,
 * and the answers are combined: counters summed, the lowest watermark, the
 * output rows and key changes partition after partition (each part's in
 * its own order), first_output_seq only when one partition writes. A
 * refusal in any partition is the call's (nothing is applied anyway). */

static kf_status_t dry_split(fanout_t *f, int32_t *direct) {
    const Keyflow__V1__DryRunBatchRequest *dry = (const void *)f->parent->request;
    int32_t home = fn_home(f->router, ((const keyed_state_t *)f->state)->descriptor);
    if (home >= 0) {
        return to_home(f, (uint32_t)home, direct);
    }
    _Static_assert((int)KEYFLOW__V1__DRY_RUN_BATCH_REQUEST__ROWS_BATCH ==
                           (int)KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_BATCH - 2 &&
                       (int)KEYFLOW__V1__DRY_RUN_BATCH_REQUEST__ROWS_ROWS_JSON ==
                           (int)KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS_ROWS_JSON - 2,
                   "a dry run's rows are a batch's, two field numbers lower");
    uint32_t rows_case = dry->rows_case == KEYFLOW__V1__DRY_RUN_BATCH_REQUEST__ROWS__NOT_SET
                             ? KEYFLOW__V1__PUSH_BATCH_REQUEST__ROWS__NOT_SET
                             : (uint32_t)dry->rows_case + 2;
    split_t *sp = NULL;
    kf_status_t st =
        split_rows(f, rows_case, dry->batch, dry->rows_json,
                   dry->watermark_present_case ==
                       KEYFLOW__V1__DRY_RUN_BATCH_REQUEST__WATERMARK_PRESENT_WATERMARK_US,
                   direct, &sp);
    for (uint32_t i = 0; st == KF_OK && sp != NULL && i < sp->n; i++) {
        Keyflow__V1__DryRunBatchRequest *part = kf_arena_new(f->parent->arena, sizeof *part);
        *part = *dry;
        part->rows_case = sp->batch[i] != NULL ? KEYFLOW__V1__DRY_RUN_BATCH_REQUEST__ROWS_BATCH
                                               : KEYFLOW__V1__DRY_RUN_BATCH_REQUEST__ROWS__NOT_SET;
        part->batch = sp->batch[i];
        fanout_add(f, sp->partition[i], &part->base);
    }
    return st;
}

static kf_status_t dry_begin(fanout_t *f, int32_t *direct) {
    const Keyflow__V1__DryRunBatchRequest *req = (const void *)f->parent->request;
    return keyed_begin(f, req->function_id, direct, dry_split);
}

/* Appends `b`'s rows to `a` (the same output schema, column by column). */
static bool batch_append(Keyflow__V1__RowBatch *a, const Keyflow__V1__RowBatch *b,
                         kf_arena_t *arena) {
    if (b == NULL || b->row_count == 0) {
        return true;
    }
    if (a->n_columns != b->n_columns) {
        return false;
    }
    for (size_t c = 0; c < a->n_columns; c++) {
        Keyflow__V1__Column *x = a->columns[c];
        const Keyflow__V1__Column *y = b->columns[c];
        if (x->values_case != y->values_case) {
            return false;
        }
        if (x->n_nulls > 0 || y->n_nulls > 0) {
            protobuf_c_boolean *nulls =
                kf_arena_new(arena, ((size_t)(a->row_count + b->row_count) + 1) * sizeof *nulls);
            for (int64_t i = 0; i < a->row_count; i++) {
                nulls[i] = x->n_nulls > 0 && x->nulls[i];
            }
            for (int64_t i = 0; i < b->row_count; i++) {
                nulls[a->row_count + i] = y->n_nulls > 0 && y->nulls[i];
            }
            x->nulls = nulls;
            x->n_nulls = (size_t)(a->row_count + b->row_count);
        }
#define APPEND_VALUES(field, type)                                                                 \
    do {                                                                                           \
        size_t n = x->field->n_values + y->field->n_values;                                        \
        type *v = kf_arena_new(arena, (n + 1) * sizeof *v);                                        \
        memcpy(v, x->field->values, x->field->n_values * sizeof *v);                               \
        memcpy(v + x->field->n_values, y->field->values, y->field->n_values * sizeof *v);          \
        x->field->values = v;                                                                      \
        x->field->n_values = n;                                                                    \
    } while (0)
        switch (x->values_case) {
        case KEYFLOW__V1__COLUMN__VALUES_BOOLS: APPEND_VALUES(bools, protobuf_c_boolean); break;
        case KEYFLOW__V1__COLUMN__VALUES_INT64S: APPEND_VALUES(int64s, int64_t); break;
        case KEYFLOW__V1__COLUMN__VALUES_FLOAT64S: APPEND_VALUES(float64s, double); break;
        case KEYFLOW__V1__COLUMN__VALUES_STRINGS: APPEND_VALUES(strings, char *); break;
        case KEYFLOW__V1__COLUMN__VALUES_BYTES_VALUES:
            APPEND_VALUES(bytes_values, ProtobufCBinaryData);
            break;
        case KEYFLOW__V1__COLUMN__VALUES__NOT_SET: break;
        case _KEYFLOW__V1__COLUMN__VALUES__CASE_IS_INT_SIZE: KF_UNREACHABLE();
        }
#undef APPEND_VALUES
    }
    a->row_count += b->row_count;
    return true;
}

/* Appends a JSON array's items to another's text ("[...]"), in the arena. */
static char *json_rows_append(const char *a, const char *b, kf_arena_t *arena) {
    size_t alen = strlen(a), blen = strlen(b);
    bool a_empty = alen < 2 || strspn(a + 1, " \n") >= alen - 2;
    bool b_empty = blen < 2 || strspn(b + 1, " \n") >= blen - 2;
    if (b_empty) {
        return (char *)a;
    }
    if (a_empty) {
        return (char *)b;
    }
    /* "[x" + "," + "y]" */
    return kf_arena_printf(arena, "%.*s,%s", (int)(alen - 1), a, b + 1);
}

static bool dry_next(fanout_t *f) {
    keyed_state_t *st = f->state;
    if (st->fetching) {
        return keyed_fetched(f, dry_split);
    }
    const sub_t *failed = first_failure(f);
    if (failed != NULL) {
        fail_as(f, failed);
        return false;
    }
    Keyflow__V1__DryRunBatchResponse *out = copy_into_parent(f, f->subs[0].cmd.response);
    if (out == NULL) {
        return false;
    }
    size_t changes = 0, writers = out->first_output_seq > 0 ? 1 : 0;
    for (uint32_t i = 0; i < f->nsubs; i++) {
        changes += ((const Keyflow__V1__DryRunBatchResponse *)f->subs[i].cmd.response)->n_changes;
    }
    Keyflow__V1__KeyChange **all = kf_arena_new(f->parent->arena, (changes + 1) * sizeof *all);
    memcpy(all, out->changes, out->n_changes * sizeof *all);
    for (uint32_t i = 1; i < f->nsubs; i++) {
        Keyflow__V1__DryRunBatchResponse *a = copy_into_parent(f, f->subs[i].cmd.response);
        if (a == NULL) {
            return false;
        }
        out->rows_accepted += a->rows_accepted;
        out->activations += a->activations;
        out->timer_callbacks += a->timer_callbacks;
        out->handler_calls += a->handler_calls;
        out->due_timers += a->due_timers;
        out->watermark_us =
            a->watermark_us < out->watermark_us ? a->watermark_us : out->watermark_us;
        writers += a->first_output_seq > 0 ? 1 : 0;
        out->first_output_seq =
            out->first_output_seq > 0 ? out->first_output_seq : a->first_output_seq;
        if (out->output != NULL && !batch_append(out->output, a->output, f->parent->arena)) {
            kf_error_set(&f->parent->error, KF_E_INTERNAL,
                         "partition %u: its dry run's output rows do not match partition %u's "
                         "columns",
                         f->subs[i].partition, f->subs[0].partition);
            f->parent->response = NULL;
            return false;
        }
        if (out->output == NULL) {
            out->output = a->output;
        }
        out->output_json = json_rows_append(out->output_json, a->output_json, f->parent->arena);
        memcpy(all + out->n_changes, a->changes, a->n_changes * sizeof *all);
        out->n_changes += a->n_changes;
    }
    out->changes = all;
    if (writers > 1) {
        out->first_output_seq = 0; /* each partition numbers its own rows */
    }
    f->parent->response = &out->base;
    kf_error_clear(&f->parent->error);
    return false;
}

static const plan_t plan_dry_run_batch = {"dry_run_batch", dry_begin, NULL, dry_next};

/* ---- GetKeyState: the key's partition ------------------------------------ */

static kf_status_t key_state_route(fanout_t *f, int32_t *direct) {
    kf_router_t *r = f->router;
    keyed_state_t *st = f->state;
    const Keyflow__V1__GetKeyStateRequest *req = (const void *)f->parent->request;
    int32_t home = fn_home(r, st->descriptor);
    if (home >= 0) {
        return to_home(f, (uint32_t)home, direct);
    }
    kf_partition_hasher_t h;
    kf_partition_hasher_init(&h);
    bool ok = true;
    if (st->descriptor->n_key_columns == 1) {
        kf_partition_hasher_column(&h, req->key, strlen(req->key));
    } else {
        /* Several key columns: the key text is a JSON array of them. */
        json_t *arr = json_loads(req->key, 0, NULL);
        ok = arr != NULL && json_is_array(arr) &&
             json_array_size(arr) == st->descriptor->n_key_columns;
        for (size_t i = 0; ok && i < json_array_size(arr); i++) {
            json_t *v = json_array_get(arr, i);
            ok = json_is_string(v);
            if (ok) {
                kf_partition_hasher_column(&h, json_string_value(v), json_string_length(v));
            }
        }
        json_decref(arr);
    }
    if (!ok) {
        *direct = (int32_t)r->served[0]; /* its engine says what is wrong with the key */
        return KF_OK;
    }
    uint32_t p = kf_partition_hasher_partition(&h, r->count);
    if (r->engines[p] == NULL) {
        set_not_owner(r, f->parent, p, "the key");
        return KF_E_NOT_OWNER;
    }
    *direct = (int32_t)p;
    return KF_OK;
}

static kf_status_t key_state_begin(fanout_t *f, int32_t *direct) {
    const Keyflow__V1__GetKeyStateRequest *req = (const void *)f->parent->request;
    return keyed_begin(f, req->function_id, direct, key_state_route);
}

/* After the GetFunction round, or the key's own round. */
static bool key_state_next(fanout_t *f) {
    keyed_state_t *st = f->state;
    if (st->fetching) {
        return keyed_fetched(f, key_state_route);
    }
    const sub_t *s = &f->subs[0];
    if (s->cmd.error.status != KF_OK) {
        f->parent->error = s->cmd.error;
        f->parent->foreign_partition = s->cmd.foreign_partition;
        return false;
    }
    f->parent->response = copy_into_parent(f, s->cmd.response);
    if (f->parent->response != NULL) {
        kf_error_clear(&f->parent->error);
    }
    return false;
}

static const plan_t plan_get_key_state = {"get_key_state", key_state_begin, NULL, key_state_next};

/* ---- ReadOutput: partitions in turn behind one cursor ---------------------
 * Output sequences are per partition. A cursor holds a position in every
 * partition and the partition read last:
 *
 *   "o1.<count>.<last>" then ".<partition>-<seq>" for each position > 0
 *
 * (URL-safe: it goes in query strings). A page holds rows of one partition
 * (`partition` says which; first_seq..last_seq are its own) and the cursor
 * moves past them (next_cursor). The partitions are asked in turn, from the
 * one after the last read, without waiting; if none has rows after its
 * position and the call may wait, the read parks in every served partition
 * and the first to have rows answers (the others' rows stay unread: a read
 * takes nothing). With one partition the cursor is just after_seq. */

typedef struct cursor {
    uint32_t last;
    int64_t pos[KF_PARTITION_COUNT_MAX];
} cursor_t;

/* A decimal number at *s of digits only (no sign, no space, as
 * cursor_format writes them) of at most `max`; *s moves past it. */
static bool cursor_number(const char **s, uint64_t max, uint64_t *out) {
    const char *p = *s;
    uint64_t v = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        uint64_t digit = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - digit) / 10 || v * 10 + digit > max) {
            return false;
        }
        v = v * 10 + digit;
    }
    if (p == *s) {
        return false;
    }
    *s = p;
    *out = v;
    return true;
}

static kf_status_t cursor_parse(const char *text, uint32_t count, const char *field, cursor_t *c,
                                kf_error_t *err) {
    memset(c, 0, sizeof *c);
    if (text[0] == '\0') {
        return KF_OK;
    }
    const char *end = text + 3;
    uint64_t n = 0, last = 0;
    /* A position is a row's sequence, so below INT64_MAX: TrimOutput
     * trims to the position + 1. A forged larger one is refused, not
     * clamped (it would skip that partition's rows for good). */
    bool ok = strncmp(text, "o1.", 3) == 0 && cursor_number(&end, UINT32_MAX, &n) && n == count &&
              *end == '.';
    if (ok) {
        end++;
        ok = cursor_number(&end, count - 1, &last);
    }
    while (ok && *end == '.') {
        end++;
        uint64_t p = 0, seq = 0;
        ok = cursor_number(&end, count - 1, &p) && *end == '-';
        if (ok) {
            end++;
            ok = cursor_number(&end, INT64_MAX - 1, &seq) && seq > 0 && c->pos[p] == 0;
        }
        if (ok) {
            c->pos[p] = (int64_t)seq;
        }
    }
    if (!ok || *end != '\0') {
        return kf_error_set(err, KF_E_INVALID,
                            "%s: not a cursor of this data set of %u partitions (pass the "
                            "next_cursor a read of this function answered)",
                            field, count);
    }
    c->last = (uint32_t)last;
    return KF_OK;
}

static char *cursor_format(const cursor_t *c, uint32_t count, kf_arena_t *arena) {
    char *out = kf_arena_new(arena, KF_OUTPUT_CURSOR_BYTES_MAX);
    size_t n = (size_t)snprintf(out, KF_OUTPUT_CURSOR_BYTES_MAX, "o1.%u.%u", count, c->last);
    for (uint32_t p = 0; p < count; p++) {
        if (c->pos[p] > 0) {
            n += (size_t)snprintf(out + n, KF_OUTPUT_CURSOR_BYTES_MAX - n, ".%u-%lld", p,
                                  (long long)c->pos[p]);
        }
    }
    KF_ASSERT(n < KF_OUTPUT_CURSOR_BYTES_MAX);
    return out;
}

typedef struct read_state {
    keyed_state_t keyed; /* first: keyed_begin's */
    bool single;         /* a SINGLE function's read: its home only */
    cursor_t cursor;
    uint32_t start; /* index into served: where this call's turn began */
    uint32_t asked;
    bool parked;
} read_state_t;

static Keyflow__V1__ReadOutputRequest *read_request(fanout_t *f, uint32_t p, int64_t wait_ms) {
    const Keyflow__V1__ReadOutputRequest *req = (const void *)f->parent->request;
    read_state_t *st = f->state;
    Keyflow__V1__ReadOutputRequest *sub = kf_arena_new(f->parent->arena, sizeof *sub);
    *sub = *req;
    sub->after_seq = st->cursor.pos[p];
    sub->cursor = (char *)"";
    sub->wait_ms = wait_ms;
    return sub;
}

/* After the descriptor: a SINGLE function's output is its home's one
 * sequence, read at after_seq (or at the home's position in a cursor) with
 * the call's own wait; a SPLIT function's is read partition after
 * partition behind the cursor. */
static kf_status_t read_route(fanout_t *f, int32_t *direct) {
    (void)direct;
    kf_router_t *r = f->router;
    const Keyflow__V1__ReadOutputRequest *req = (const void *)f->parent->request;
    read_state_t *st = f->state;
    int32_t home = fn_home(r, st->keyed.descriptor);
    if (home >= 0) {
        if (r->engines[home] == NULL) {
            int32_t unused;
            return to_home(f, (uint32_t)home, &unused);
        }
        if (req->cursor[0] == '\0') {
            st->cursor.pos[home] = req->after_seq;
        }
        st->single = true;
        st->parked = true; /* the one read waits, if the call may */
        st->asked = r->served_count;
        fanout_add(f, (uint32_t)home, &read_request(f, (uint32_t)home, req->wait_ms)->base);
        return KF_OK;
    }
    if (req->cursor[0] == '\0' && req->after_seq != 0) {
        return kf_error_set(&f->parent->error, KF_E_INVALID,
                            "after_seq: function %s is SPLIT: its output is in %u partitions, "
                            "each with its own sequence; pass cursor (the last page's "
                            "next_cursor) instead (docs/scaling.md)",
                            req->function_id, r->count);
    }
    /* Start after the partition read last. */
    while (st->start < r->served_count && r->served[st->start] <= st->cursor.last) {
        st->start++;
    }
    st->start %= r->served_count;
    fanout_add(f, r->served[st->start], &read_request(f, r->served[st->start], 0)->base);
    st->asked = 1;
    return KF_OK;
}

static kf_status_t read_begin(fanout_t *f, int32_t *direct) {
    kf_router_t *r = f->router;
    Keyflow__V1__ReadOutputRequest *req = (void *)f->parent->request;
    read_state_t *st = kf_arena_new(f->parent->arena, sizeof *st);
    f->state = st;
    kf_status_t status =
        cursor_parse(req->cursor, r->count, "cursor", &st->cursor, &f->parent->error);
    if (status != KF_OK) {
        return status;
    }
    if (r->count == 1) {
        if (req->cursor[0] != '\0') {
            /* The engine reads after_seq: a copy of the call's request
             * carries the cursor's position. */
            Keyflow__V1__ReadOutputRequest *copy = read_request(f, 0, req->wait_ms);
            f->parent->request = &copy->base;
        }
        *direct = 0;
        return KF_OK;
    }
    return keyed_begin(f, req->function_id, direct, read_route);
}

static bool read_settles(const sub_t *s) {
    const Keyflow__V1__ReadOutputResponse *resp = (const void *)s->cmd.response;
    return s->cmd.op == KF_OP_READ_OUTPUT && s->cmd.error.status == KF_OK && resp->first_seq != 0;
}

/* The call answers with partition p's page (or, with `resp` NULL, no rows). */
static void read_answer(fanout_t *f, const sub_t *s) {
    kf_router_t *r = f->router;
    read_state_t *st = f->state;
    Keyflow__V1__ReadOutputResponse *out;
    if (s != NULL) {
        out = copy_into_parent(f, s->cmd.response);
        if (out == NULL) {
            return;
        }
        out->partition = (int32_t)s->partition;
        if (out->next_after_seq > st->cursor.pos[s->partition]) {
            st->cursor.pos[s->partition] = out->next_after_seq;
        }
        st->cursor.last = s->partition;
    } else {
        out = kf_arena_new(f->parent->arena, sizeof *out);
        keyflow__v1__read_output_response__init(out);
    }
    out->next_cursor = cursor_format(&st->cursor, r->count, f->parent->arena);
    f->parent->response = &out->base;
    kf_error_clear(&f->parent->error);
}

/* A partition's position in the cursor is before its retained rows (a
 * trim or the retention passed it): the error names the partition and
 * gives the cursor to resume with, every other position kept, so that a
 * reader need not take the cursor apart. A cursor too long for an error
 * message (many partitions) is described instead. */
static void read_fail_range(fanout_t *f, const sub_t *s) {
    kf_router_t *r = f->router;
    read_state_t *st = f->state;
    uint32_t p = s->partition;
    int64_t resume = s->cmd.resume_after_seq;
    int64_t was = st->cursor.pos[p];
    f->parent->response = NULL;
    if (r->count == 1 || resume <= was) {
        fail_as(f, s);
        return;
    }
    cursor_t next = st->cursor;
    next.pos[p] = resume;
    const char *text = cursor_format(&next, r->count, f->parent->arena);
    static const char fmt[] =
        "cursor: its position in partition %u (%lld) is before that partition's retained "
        "output: rows up to %lld were trimmed; resume with cursor %s";
    if (strlen(text) + sizeof fmt + 3 * 20 < KF_ERROR_MESSAGE_BYTES_MAX) {
        kf_error_set(&f->parent->error, KF_E_RANGE, fmt, p, (long long)was, (long long)resume,
                     text);
    } else {
        kf_error_set(&f->parent->error, KF_E_RANGE,
                     "cursor: its position in partition %u (%lld) is before that partition's "
                     "retained output: rows up to %lld were trimmed; resume with the same cursor "
                     "with partition %u's position set to %lld (docs/scaling.md)",
                     p, (long long)was, (long long)resume, p, (long long)resume);
    }
}

static bool read_next(fanout_t *f) {
    kf_router_t *r = f->router;
    read_state_t *st = f->state;
    if (st->keyed.fetching) {
        return keyed_fetched(f, read_route);
    }
    const Keyflow__V1__ReadOutputRequest *req = (const void *)f->parent->request;
    const sub_t *failed = NULL, *rows = NULL;
    for (uint32_t i = 0; i < f->nsubs; i++) {
        const sub_t *s = &f->subs[i];
        if (s->cmd.error.status != KF_OK) {
            if (s->cmd.error.status != KF_E_CANCELLED || !st->parked || f->cancelled) {
                failed = failed != NULL ? failed : s;
            }
        } else if (rows == NULL && read_settles(s)) {
            rows = s;
        }
    }
    if (rows != NULL) {
        read_answer(f, rows);
        return false;
    }
    if (failed != NULL && st->single) {
        /* As the home answered, about after_seq, as with one partition. */
        f->parent->response = NULL;
        f->parent->error = failed->cmd.error;
        f->parent->resume_after_seq = failed->cmd.resume_after_seq;
        return false;
    }
    if (failed != NULL && failed->cmd.error.status == KF_E_RANGE) {
        read_fail_range(f, failed);
        return false;
    }
    if (failed != NULL) {
        fail_as(f, failed);
        return false;
    }
    if (!st->parked && !f->cancelled && st->asked < r->served_count) {
        round_reset(f);
        uint32_t p = r->served[(st->start + st->asked++) % r->served_count];
        fanout_add(f, p, &read_request(f, p, 0)->base);
        return true;
    }
    if (!st->parked && !f->cancelled && req->wait_ms > 0) {
        round_reset(f);
        st->parked = true;
        for (uint32_t i = 0; i < r->served_count; i++) {
            uint32_t p = r->served[(st->start + i) % r->served_count];
            fanout_add(f, p, &read_request(f, p, req->wait_ms)->base);
        }
        return true;
    }
    /* No rows anywhere: a partition's empty page, so the answer has the
     * page's format (JSON "rows": [], or an empty batch) as with one. */
    const sub_t *empty = f->nsubs > 0 && f->subs[f->nsubs - 1].cmd.error.status == KF_OK
                             ? &f->subs[f->nsubs - 1]
                             : NULL;
    read_answer(f, empty);
    return false;
}

static const plan_t plan_read_output = {"read_output", read_begin, read_settles, read_next, true};

/* ---- TrimOutput: every partition up to its position in a cursor ---------- */

typedef struct trim_state {
    keyed_state_t keyed; /* first: keyed_begin's */
    cursor_t cursor;     /* before_cursor */
} trim_state_t;

/* After the descriptor: a SINGLE function's output is trimmed in its home
 * (before_seq, or the home's position in a cursor); a SPLIT function's in
 * every partition up to its position in the cursor. */
static kf_status_t trim_route(fanout_t *f, int32_t *direct) {
    kf_router_t *r = f->router;
    const Keyflow__V1__TrimOutputRequest *req = (const void *)f->parent->request;
    trim_state_t *st = f->state;
    int32_t home = fn_home(r, st->keyed.descriptor);
    if (home >= 0) {
        if (req->before_cursor[0] != '\0') {
            Keyflow__V1__TrimOutputRequest *copy = kf_arena_new(f->parent->arena, sizeof *copy);
            *copy = *req;
            copy->before_cursor = (char *)"";
            copy->before_seq = st->cursor.pos[home] + 1; /* the rows read: up to the position */
            f->parent->request = &copy->base;
        }
        return to_home(f, (uint32_t)home, direct);
    }
    if (req->before_cursor[0] == '\0' && req->before_seq != 0) {
        return kf_error_set(&f->parent->error, KF_E_INVALID,
                            "before_seq: function %s is SPLIT: its output is in %u partitions; "
                            "pass before_cursor (a ReadOutput cursor) instead (docs/scaling.md)",
                            req->function_id, r->count);
    }
    for (uint32_t i = 0; i < r->served_count; i++) {
        uint32_t p = r->served[i];
        Keyflow__V1__TrimOutputRequest *part = kf_arena_new(f->parent->arena, sizeof *part);
        *part = *req;
        part->before_cursor = (char *)"";
        part->before_seq = st->cursor.pos[p] + 1; /* the rows read: up to the position */
        fanout_add(f, p, &part->base);
    }
    return KF_OK;
}

static kf_status_t trim_begin(fanout_t *f, int32_t *direct) {
    kf_router_t *r = f->router;
    const Keyflow__V1__TrimOutputRequest *req = (const void *)f->parent->request;
    trim_state_t *st = kf_arena_new(f->parent->arena, sizeof *st);
    f->state = st;
    kf_status_t status =
        cursor_parse(req->before_cursor, r->count, "before_cursor", &st->cursor, &f->parent->error);
    if (status != KF_OK) {
        return status;
    }
    if (req->before_cursor[0] != '\0' && req->before_seq != 0) {
        return kf_error_set(&f->parent->error, KF_E_INVALID,
                            "before_seq: give before_seq or before_cursor, not both");
    }
    if (r->count == 1) {
        if (req->before_cursor[0] != '\0') {
            Keyflow__V1__TrimOutputRequest *copy = kf_arena_new(f->parent->arena, sizeof *copy);
            *copy = *req;
            copy->before_cursor = (char *)"";
            copy->before_seq = st->cursor.pos[0] + 1;
            f->parent->request = &copy->base;
        }
        *direct = 0;
        return KF_OK;
    }
    return keyed_begin(f, req->function_id, direct, trim_route);
}

static bool trim_next(fanout_t *f) {
    trim_state_t *st = f->state;
    if (st->keyed.fetching) {
        return keyed_fetched(f, trim_route);
    }
    const sub_t *failed = first_failure(f);
    if (failed != NULL) {
        fail_as(f, failed);
        return false;
    }
    Keyflow__V1__TrimOutputResponse *out = kf_arena_new(f->parent->arena, sizeof *out);
    keyflow__v1__trim_output_response__init(out);
    if (f->nsubs == 1) {
        const Keyflow__V1__TrimOutputResponse *a = (const void *)f->subs[0].cmd.response;
        *out = *a;
    }
    f->parent->response = &out->base;
    kf_error_clear(&f->parent->error);
    return false;
}

static const plan_t plan_trim_output = {"trim_output", trim_begin, NULL, trim_next, true};

/* Every served partition does the same (deleting a function, a producer):
 * the call succeeds when each partition did it or had nothing to do; it is
 * NOT_FOUND only when no partition knew the thing. A failure names its
 * partition; the call is safe to repeat. */
static bool everywhere_next(fanout_t *f) {
    const sub_t *done = NULL, *missing = NULL;
    for (uint32_t i = 0; i < f->nsubs; i++) {
        const sub_t *s = &f->subs[i];
        if (s->cmd.error.status == KF_E_NOT_FOUND) {
            missing = missing != NULL ? missing : s;
        } else if (s->cmd.error.status != KF_OK) {
            fail_as(f, s);
            return false;
        } else if (done == NULL) {
            done = s;
        }
    }
    if (done == NULL) {
        f->parent->error = missing->cmd.error;
        return false;
    }
    f->parent->response = copy_into_parent(f, done->cmd.response);
    if (f->parent->response != NULL) {
        kf_error_clear(&f->parent->error);
    }
    return false;
}

/* A deleted function's descriptor is forgotten: the id may come back with
 * another one. */
static bool delete_function_next(fanout_t *f) {
    const Keyflow__V1__DeleteFunctionRequest *req = (const void *)f->parent->request;
    fn_forget(f->router, req->function_id);
    everywhere_next(f);
    if (f->parent->error.status != KF_OK || f->parent->response == NULL) {
        return false;
    }
    /* What went with it is what went from every partition. */
    Keyflow__V1__DeleteFunctionResponse *out = (void *)f->parent->response;
    *out = (Keyflow__V1__DeleteFunctionResponse)KEYFLOW__V1__DELETE_FUNCTION_RESPONSE__INIT;
    for (uint32_t i = 0; i < f->nsubs; i++) {
        const Keyflow__V1__DeleteFunctionResponse *a = (const void *)f->subs[i].cmd.response;
        if (f->subs[i].cmd.error.status != KF_OK || a == NULL) {
            continue;
        }
        out->deleted = out->deleted || a->deleted;
        out->keys += a->keys;
        out->timers += a->timers;
        out->output_rows += a->output_rows;
        out->producers += a->producers;
    }
    return false;
}

static const plan_t plan_delete_function = {"delete_function", all_begin, NULL,
                                            delete_function_next};
static const plan_t plan_delete_producer = {"delete_producer", all_begin, NULL, everywhere_next};

/* ReplayBatch: each partition replays its part of the batch (a batch split
 * across partitions was kept by each of them); reproduced when every part
 * was, the first difference named with its partition. NOT_FOUND only when
 * no partition kept the batch. */
static kf_status_t replay_route(fanout_t *f, int32_t *direct) {
    int32_t home = fn_home(f->router, ((const keyed_state_t *)f->state)->descriptor);
    if (home >= 0) {
        return to_home(f, (uint32_t)home, direct);
    }
    add_all_served(f);
    return KF_OK;
}

static kf_status_t replay_begin(fanout_t *f, int32_t *direct) {
    const Keyflow__V1__ReplayBatchRequest *req = (const void *)f->parent->request;
    return keyed_begin(f, req->function_id, direct, replay_route);
}

static bool replay_next(fanout_t *f) {
    if (((keyed_state_t *)f->state)->fetching) {
        return keyed_fetched(f, replay_route);
    }
    Keyflow__V1__ReplayBatchResponse *out = NULL;
    const sub_t *missing = NULL;
    for (uint32_t i = 0; i < f->nsubs; i++) {
        const sub_t *s = &f->subs[i];
        if (s->cmd.error.status == KF_E_NOT_FOUND) {
            missing = missing != NULL ? missing : s;
            continue;
        }
        if (s->cmd.error.status != KF_OK) {
            fail_as(f, s);
            return false;
        }
        const Keyflow__V1__ReplayBatchResponse *r = (const void *)s->cmd.response;
        if (out == NULL) {
            out = kf_arena_new(f->parent->arena, sizeof *out);
            keyflow__v1__replay_batch_response__init(out);
            out->reproduced = true;
        }
        out->recorded_output_rows += r->recorded_output_rows;
        out->replayed_output_rows += r->replayed_output_rows;
        out->keys_compared += r->keys_compared;
        if (!r->reproduced && out->reproduced) {
            out->reproduced = false;
            out->first_difference = kf_arena_printf(f->parent->arena, "partition %u: %s",
                                                    s->partition, r->first_difference);
        }
    }
    if (out == NULL) {
        f->parent->error = missing->cmd.error;
        return false;
    }
    f->parent->response = &out->base;
    kf_error_clear(&f->parent->error);
    return false;
}

static const plan_t plan_replay_batch = {"replay_batch", replay_begin, NULL, replay_next};

/* The plan of each fanned-out op, from the table's route column. */
static const plan_t *plan_of(kf_op_t op) {
    switch (op) {
#define SPLIT(plan)          &plan_##plan
#define ALL(plan)            &plan_##plan
#define MERGE(plan)          &plan_##plan
#define FIRST(plan)          &plan_##plan
#define BY_COORDINATOR(...)  NULL
#define BY_RUN_ID(...)       NULL
#define BY_FUNCTION_KEY(...) &plan_get_key_state
#define HOME()               NULL
#define PLAN_OF_(op, s, m, n, rq, rs, sh, sc, res, module, handler, disk, route)                   \
    case KF_OP_##op: return route;
        KF_RPC_TABLE(PLAN_OF_, KF_RPC_IGNORE)
#undef PLAN_OF_
#undef SPLIT
#undef ALL
#undef MERGE
#undef FIRST
#undef BY_COORDINATOR
#undef BY_RUN_ID
#undef BY_FUNCTION_KEY
#undef HOME
    }
    KF_UNREACHABLE();
}

static kf_status_t fan_out(kf_router_t *r, kf_cmd_t *cmd, const plan_t *plan) {
    fanout_t *f = kf_xcalloc(1, sizeof *f + r->served_count * sizeof f->subs[0]);
    f->router = r;
    f->parent = cmd;
    f->plan = plan;
    pthread_mutex_init(&f->lock, NULL);
    for (uint32_t i = 0; i < r->served_count; i++) {
        kf_arena_init(&f->subs[i].arena, 0);
    }
    int32_t direct = -1;
    kf_error_clear(&cmd->error);
    kf_status_t st = plan->begin(f, &direct);
    if (st != KF_OK || direct >= 0) {
        fanout_free(f);
        if (st != KF_OK) {
            return st;
        }
        KF_ASSERT(r->engines[direct] != NULL);
        __atomic_store_n(&cmd->routed, (void *)r->engines[direct], __ATOMIC_RELEASE);
        return kf_engine_submit(r->engines[direct], cmd);
    }
    pthread_mutex_lock(&r->lock);
    __atomic_store_n(&cmd->routed, routed_fanout(f), __ATOMIC_RELEASE);
    pthread_mutex_unlock(&r->lock);
    if (round_run(f)) {
        round_ended(f);
    }
    return KF_OK;
}

/* ---- the router --------------------------------------------------------- */

kf_status_t kf_router_create(const kf_router_config_t *config, kf_router_t **out, kf_error_t *err) {
    KF_ASSERT(config->partition_count >= 1 && config->partition_count <= KF_PARTITION_COUNT_MAX);
    kf_router_t *r = calloc(1, sizeof *r);
    if (r == NULL) {
        return kf_error_set(err, KF_E_NOMEM, "cannot allocate the router");
    }
    r->count = config->partition_count;
    r->home = config->home;
    r->placement = config->placement;
    r->node = config->node;
    memcpy(r->ids, config->ids, sizeof r->ids);
    memset(&r->served_set, 0, sizeof r->served_set);
    r->served_set.count = r->count;
    for (uint32_t p = 0; p < r->count; p++) {
        r->engines[p] = config->engines[p];
        if (r->engines[p] != NULL) {
            r->served[r->served_count++] = p;
            kf_partition_set_add(&r->served_set, p);
        }
    }
    KF_ASSERT(r->served_count > 0 && r->home != NULL);
    kf_partition_set_format(&r->served_set, r->served_text, sizeof r->served_text);
    pthread_mutex_init(&r->lock, NULL);
    pthread_mutex_init(&r->fn_lock, NULL);
    kf_map_init(&r->functions);
    pthread_mutex_init(&r->fan_lock, NULL);
    kf_map_init(&r->fans);
    *out = r;
    return KF_OK;
}

void kf_router_destroy(kf_router_t *r) {
    if (r == NULL) {
        return;
    }
    size_t bucket;
    kf_map_node_t *n = kf_map_first(&r->functions, &bucket);
    while (n != NULL) {
        kf_map_node_t *next = kf_map_next(&r->functions, &bucket, n);
        kf_map_remove(&r->functions, n);
        fn_entry_free((fn_entry_t *)n);
        n = next;
    }
    kf_map_deinit(&r->functions);
    pthread_mutex_destroy(&r->fn_lock);
    KF_ASSERT(r->fans.count == 0); /* every engine released its worker links at its stop */
    kf_map_deinit(&r->fans);
    pthread_mutex_destroy(&r->fan_lock);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

static kf_status_t submit_to(kf_engine_t *e, kf_cmd_t *cmd) {
    __atomic_store_n(&cmd->routed, (void *)e, __ATOMIC_RELEASE);
    return kf_engine_submit(e, cmd);
}

static kf_status_t submit_partition(kf_router_t *r, kf_cmd_t *cmd, uint32_t p, const char *what) {
    if (r->engines[p] == NULL) {
        set_not_owner(r, cmd, p, what);
        return KF_E_NOT_OWNER;
    }
    return submit_to(r->engines[p], cmd);
}

kf_status_t kf_router_submit(kf_router_t *r, kf_cmd_t *cmd) {
    cmd->foreign_partition = -1;
    cmd->applied_partitions = NULL;
    const kf_method_t *m = kf_method_by_op(cmd->op);
    if (m->route.kind == KF_ROUTE_HOME) {
        return submit_to(r->home, cmd);
    }
    if (r->count == 1) {
        /* One partition: nothing to route, unless a cursor must become the
         * sequence its engine reads. */
        const plan_t *plan = m->route.plan != NULL ? plan_of(cmd->op) : NULL;
        if (plan == NULL || !plan->with_one_partition) {
            return submit_to(r->engines[0], cmd);
        }
        return fan_out(r, cmd, plan);
    }
    switch (m->route.kind) {
    case KF_ROUTE_BY_COORDINATOR: {
        const char *wf = kf_method_string_at(cmd->request, m->route.fields[0]);
        const char *key = kf_method_string_at(cmd->request, m->route.fields[1]);
        wf = wf != NULL ? wf : "";
        key = key != NULL ? key : "";
        char what[KF_WORKFLOW_BYTES_MAX + KF_KEY_BYTES_MAX + 64];
        snprintf(what, sizeof what, "the coordinator of workflow \"%.128s\", key \"%.256s\"", wf,
                 key);
        return submit_partition(
            r, cmd, kf_partition_of_coordinator(wf, strlen(wf), key, strlen(key), r->count), what);
    }
    case KF_ROUTE_BY_RUN_ID: {
        const char *id = kf_method_string_at(cmd->request, m->route.fields[0]);
        int32_t p = kf_partition_of_run_id(id != NULL ? id : "", r->count);
        if (p < 0) {
            /* Not a run ID of this data set: its engine says what is wrong
             * with it, as with one partition. */
            return submit_to(r->engines[r->served[0]], cmd);
        }
        char what[KF_RUN_ID_BYTES_MAX + 32];
        snprintf(what, sizeof what, "run %.300s", id);
        return submit_partition(r, cmd, (uint32_t)p, what);
    }
    case KF_ROUTE_SPLIT:
        if (cmd->op == KF_OP_PUSH_BATCH) {
            /* The hot path: a SINGLE function's batch, whose home is known,
             * goes there as it is, with no fan-out set up. */
            const Keyflow__V1__PushBatchRequest *req = (const void *)cmd->request;
            int32_t home = fn_cached_home(r, req->function_id);
            if (home >= 0 && r->engines[home] != NULL) {
                __atomic_store_n(&cmd->routed, (void *)r->engines[home], __ATOMIC_RELEASE);
                return kf_engine_submit(r->engines[home], cmd);
            }
        }
        return fan_out(r, cmd, plan_of(cmd->op));
    case KF_ROUTE_BY_FUNCTION_KEY:
    case KF_ROUTE_ALL:
    case KF_ROUTE_MERGE:
    case KF_ROUTE_FIRST: return fan_out(r, cmd, plan_of(cmd->op));
    case KF_ROUTE_HOME:
    case KF_ROUTE_LOCAL: break;
    }
    KF_UNREACHABLE(); /* tests/unit/proto: every ENGINE row has a route */
}

void kf_router_cancel(kf_router_t *r, kf_cmd_t *cmd) {
    pthread_mutex_lock(&r->lock);
    uintptr_t routed = (uintptr_t)__atomic_load_n(&cmd->routed, __ATOMIC_ACQUIRE);
    if (routed & 1) {
        fanout_t *f = (fanout_t *)(routed & ~(uintptr_t)1);
        pthread_mutex_lock(&f->lock);
        f->cancelled = true;
        for (uint32_t i = 0; i < f->nsubs; i++) {
            if (f->subs[i].in_engine) {
                kf_engine_cancel(r->engines[f->subs[i].partition], &f->subs[i].cmd);
            }
        }
        pthread_mutex_unlock(&f->lock);
    } else if (routed != 0) {
        kf_engine_cancel((kf_engine_t *)routed, cmd);
    }
    pthread_mutex_unlock(&r->lock);
}

/* ---- worker streams: one stream, every served partition ---------------
 * A remote handler's stream serves the function in every partition of the
 * process: its HELLO goes to each partition's engine, which knows the
 * stream as a sub-link of its own (below); what the engines send goes out
 * on the one stream (one welcome: the worker says hello once), a close
 * from any of them closes it, and the front end's link is
 * released once every engine released its sub-link. A result goes back to
 * the partition whose engine made the call: call IDs are
 * n * partition_count + partition (functions/remote.c).
 *
 * The welcome goes out once EVERY partition has welcomed the worker: a
 * client that pushes as soon as its worker is welcomed must find the
 * worker in every partition. A partition that welcomed earlier may already
 * call; its calls wait behind the welcome (at most the granted concurrency
 * per partition, so the hold is bounded). */

typedef struct held_call {
    uint8_t *message;
    size_t len;
} held_call_t;

typedef struct worker_fan worker_fan_t;

typedef struct sub_link {
    worker_fan_t *fan;
    uint32_t partition;
    bool accepted; /* its engine took the HELLO (and will release it) */
} sub_link_t;

struct worker_fan {
    kf_map_node_t node; /* in router->fans, by `link` */
    kf_router_t *router;
    kf_worker_link_t *link; /* the front end's */
    const kf_worker_ops_t *ops;
    pthread_mutex_t lock;
    bool welcomed;         /* a welcome went out (lock) */
    uint32_t welcomes_due; /* partitions yet to welcome (lock) */
    uint8_t *welcome;      /* the first welcome, held until the last (lock) */
    size_t welcome_len;
    held_call_t *held; /* calls made before the welcome went out (lock) */
    size_t held_count, held_cap;
    uint32_t live;         /* sub-links not yet released (lock) */
    bool release_upstream; /* the front end awaits its ops->release */
    sub_link_t subs[];     /* router->served_count */
};

static void fan_send(kf_worker_link_t *link, uint8_t *message, size_t len, bool is_call) {
    worker_fan_t *fan = ((sub_link_t *)(void *)link)->fan;
    pthread_mutex_lock(&fan->lock);
    if (fan->welcomed) {
        if (is_call) {
            fan->ops->send(fan->link, message, len, true);
        } else {
            free(message); /* the worker hears one welcome */
        }
    } else if (is_call) {
        if (fan->held_count == fan->held_cap) {
            fan->held_cap = fan->held_cap > 0 ? 2 * fan->held_cap : 8;
            fan->held = kf_xrealloc(fan->held, fan->held_cap * sizeof fan->held[0]);
        }
        fan->held[fan->held_count++] = (held_call_t){message, len};
    } else {
        KF_ASSERT(fan->welcomes_due > 0);
        if (fan->welcome == NULL) {
            fan->welcome = message;
            fan->welcome_len = len;
        } else {
            free(message);
        }
        if (--fan->welcomes_due == 0) {
            fan->welcomed = true;
            fan->ops->send(fan->link, fan->welcome, fan->welcome_len, false);
            fan->welcome = NULL;
            for (size_t i = 0; i < fan->held_count; i++) {
                fan->ops->send(fan->link, fan->held[i].message, fan->held[i].len, true);
            }
            fan->held_count = 0;
        }
    }
    pthread_mutex_unlock(&fan->lock);
}

static void fan_free(worker_fan_t *fan) {
    free(fan->welcome);
    for (size_t i = 0; i < fan->held_count; i++) {
        free(fan->held[i].message);
    }
    free(fan->held);
    pthread_mutex_destroy(&fan->lock);
    free(fan);
}

static void fan_close(kf_worker_link_t *link, kf_status_t status, const char *message) {
    worker_fan_t *fan = ((sub_link_t *)(void *)link)->fan;
    fan->ops->close(fan->link, status, message); /* the first decision wins */
}

static void fan_release(kf_worker_link_t *link) {
    worker_fan_t *fan = ((sub_link_t *)(void *)link)->fan;
    kf_router_t *r = fan->router;
    pthread_mutex_lock(&fan->lock);
    KF_ASSERT(fan->live > 0);
    bool last = --fan->live == 0;
    pthread_mutex_unlock(&fan->lock);
    if (!last) {
        return;
    }
    pthread_mutex_lock(&r->fan_lock);
    kf_map_remove(&r->fans, &fan->node);
    pthread_mutex_unlock(&r->fan_lock);
    if (fan->release_upstream) {
        fan->ops->release(fan->link);
    }
    fan_free(fan);
}

static const kf_worker_ops_t fan_ops = {
    .send = fan_send,
    .close = fan_close,
    .release = fan_release,
};

static kf_worker_event_t *fan_event(const kf_worker_event_t *ev, sub_link_t *sub) {
    kf_worker_event_t *copy = kf_xcalloc(1, sizeof *copy);
    copy->kind = ev->kind;
    copy->link = (kf_worker_link_t *)(void *)sub;
    copy->ops = &fan_ops;
    copy->principal = ev->principal; /* the front end's call outlives every sub-link */
    memcpy(copy->peer, ev->peer, sizeof copy->peer);
    memcpy(copy->reason, ev->reason, sizeof copy->reason);
    if (ev->message != NULL) {
        size_t len = protobuf_c_message_get_packed_size(ev->message);
        uint8_t *buf = kf_xmalloc(len > 0 ? len : 1);
        protobuf_c_message_pack(ev->message, buf);
        copy->message = protobuf_c_message_unpack(ev->message->descriptor, NULL, len, buf);
        free(buf);
        KF_ASSERT(copy->message != NULL); /* it was packed from a valid message */
    }
    return copy;
}

static worker_fan_t *fan_find(kf_router_t *r, kf_worker_link_t *link) {
    kf_map_node_t *n = kf_map_get(&r->fans, &link, sizeof link);
    return n != NULL ? (worker_fan_t *)n : NULL;
}

static kf_status_t fan_hello(kf_router_t *r, kf_worker_event_t *ev, kf_error_t *err) {
    worker_fan_t *fan = kf_xcalloc(1, sizeof *fan + r->served_count * sizeof fan->subs[0]);
    fan->router = r;
    fan->link = ev->link;
    fan->ops = ev->ops;
    pthread_mutex_init(&fan->lock, NULL);
    fan->welcomes_due = r->served_count;
    pthread_mutex_lock(&r->fan_lock);
    kf_map_insert(&r->fans, &fan->node, &fan->link, sizeof fan->link);
    uint32_t accepted = 0;
    for (uint32_t i = 0; i < r->served_count; i++) {
        sub_link_t *sub = &fan->subs[i];
        sub->fan = fan;
        sub->partition = r->served[i];
        kf_worker_event_t *copy = fan_event(ev, sub);
        pthread_mutex_lock(&fan->lock);
        fan->live++; /* before the engine can release it */
        pthread_mutex_unlock(&fan->lock);
        if (kf_engine_worker_post(r->engines[sub->partition], copy) == KF_OK) {
            sub->accepted = true;
            accepted++;
        } else {
            kf_worker_event_free(copy);
            pthread_mutex_lock(&fan->lock);
            fan->live--;
            pthread_mutex_unlock(&fan->lock);
        }
    }
    if (accepted < r->served_count) {
        /* Stopping: the partitions that took it hear the stream is gone
         * and release their sub-links; the front end gets no release (it
         * keeps the event and drops the engine's reference itself). */
        for (uint32_t i = 0; i < r->served_count; i++) {
            if (fan->subs[i].accepted) {
                kf_worker_event_t *gone = kf_xcalloc(1, sizeof *gone);
                gone->kind = KF_WORKER_GONE;
                gone->link = (kf_worker_link_t *)(void *)&fan->subs[i];
                snprintf(gone->reason, sizeof gone->reason, "keyflowd is shutting down");
                if (kf_engine_worker_post(r->engines[fan->subs[i].partition], gone) != KF_OK) {
                    kf_worker_event_free(gone); /* that engine releases at its stop */
                }
            }
        }
        bool none = accepted == 0;
        if (none) {
            kf_map_remove(&r->fans, &fan->node);
        }
        pthread_mutex_unlock(&r->fan_lock);
        if (none) {
            fan_free(fan);
        }
        return kf_error_set(err, KF_E_UNAVAILABLE, "keyflowd is shutting down");
    }
    fan->release_upstream = true;
    pthread_mutex_unlock(&r->fan_lock);
    kf_worker_event_free(ev);
    return KF_OK;
}

kf_status_t kf_router_worker_post(kf_router_t *r, kf_worker_event_t *ev, kf_error_t *err) {
    if (r->count == 1) {
        if (kf_engine_worker_post(r->engines[0], ev) != KF_OK) {
            return kf_error_set(err, KF_E_UNAVAILABLE, "keyflowd is shutting down");
        }
        return KF_OK;
    }
    if (ev->kind == KF_WORKER_HELLO) {
        return fan_hello(r, ev, err);
    }
    pthread_mutex_lock(&r->fan_lock);
    worker_fan_t *fan = fan_find(r, ev->link);
    if (fan == NULL) { /* its HELLO was refused: nothing to tell */
        pthread_mutex_unlock(&r->fan_lock);
        return kf_error_set(err, KF_E_UNAVAILABLE, "keyflowd is shutting down");
    }
    kf_status_t status = KF_OK;
    if (ev->kind == KF_WORKER_RESULT) {
        const Keyflow__V1__WorkerMessage *m = (const void *)ev->message;
        uint32_t p = (uint32_t)(m->result->call_id % r->count);
        sub_link_t *sub = &fan->subs[0]; /* an unknown call: that engine says so */
        for (uint32_t i = 0; i < r->served_count; i++) {
            if (fan->subs[i].partition == p) {
                sub = &fan->subs[i];
            }
        }
        ev->link = (kf_worker_link_t *)(void *)sub;
        if (kf_engine_worker_post(r->engines[sub->partition], ev) != KF_OK) {
            ev->link = fan->link;
            status = kf_error_set(err, KF_E_UNAVAILABLE, "keyflowd is shutting down");
        }
    } else {
        KF_ASSERT(ev->kind == KF_WORKER_GONE);
        for (uint32_t i = 0; i < r->served_count; i++) {
            kf_worker_event_t *gone = fan_event(ev, &fan->subs[i]);
            if (kf_engine_worker_post(r->engines[fan->subs[i].partition], gone) != KF_OK) {
                kf_worker_event_free(gone); /* stopping: that engine releases by itself */
            }
        }
        kf_worker_event_free(ev);
    }
    pthread_mutex_unlock(&r->fan_lock);
    return status;
}

bool kf_router_failed(const kf_router_t *r) {
    if (kf_engine_failed(r->home)) {
        return true;
    }
    for (uint32_t i = 0; i < r->served_count; i++) {
        if (kf_engine_failed(r->engines[r->served[i]])) {
            return true;
        }
    }
    return false;
}

bool kf_router_unready(kf_router_t *r, char *why, size_t cap) {
    /* Every engine is asked, not only until the first says no: asking is
     * also what makes an engine measure the disk again (runtime/engine.h),
     * and each partition refuses writes by its own measure. */
    bool unready = kf_engine_unready(r->home, why, cap);
    for (uint32_t i = 0; i < r->served_count; i++) {
        kf_engine_t *e = r->engines[r->served[i]];
        char inner[KF_ERROR_MESSAGE_BYTES_MAX];
        if (e == r->home || !kf_engine_unready(e, inner, sizeof inner) || unready) {
            continue;
        }
        unready = true;
        if (r->count > 1) {
            snprintf(why, cap, "partition %u: %s", r->served[i], inner);
        } else {
            snprintf(why, cap, "%s", inner);
        }
    }
    return unready;
}

uint32_t kf_router_partition_count(const kf_router_t *r) {
    return r->count;
}

const kf_partition_set_t *kf_router_served(const kf_router_t *r) {
    return &r->served_set;
}

const kf_placement_node_t *kf_router_owner(const kf_router_t *r, uint32_t partition) {
    return r->placement != NULL && r->placement->partition_count == r->count
               ? kf_placement_owner(r->placement, partition)
               : NULL;
}

kf_engine_t *kf_router_engine(const kf_router_t *r, uint32_t partition) {
    return partition < r->count ? r->engines[partition] : NULL;
}

const char *kf_router_node(const kf_router_t *r) {
    return r->node;
}

Keyflow__V1__Placement *kf_router_placement(kf_router_t *r, kf_arena_t *arena) {
    Keyflow__V1__Placement *out = kf_arena_zalloc(arena, sizeof *out);
    if (out == NULL) {
        return NULL;
    }
    keyflow__v1__placement__init(out);
    out->partition_count = (int32_t)r->count;
    out->hash = (char *)KF_PARTITION_HASH_NAME;
    out->node = (char *)(r->node != NULL ? r->node : "");
    out->served = r->served_text;
    out->partitions = kf_arena_zalloc(arena, r->served_count * sizeof *out->partitions);
    out->nodes = kf_arena_zalloc(
        arena, (r->placement != NULL ? r->placement->node_count : 0) * sizeof *out->nodes + 1);
    out->routes = kf_arena_zalloc(arena, KF_METHOD_COUNT * sizeof *out->routes);
    if (out->partitions == NULL || out->nodes == NULL || out->routes == NULL) {
        return NULL;
    }
    for (uint32_t i = 0; i < r->served_count; i++) {
        uint32_t p = r->served[i];
        Keyflow__V1__PartitionHealth *h = kf_arena_zalloc(arena, sizeof *h);
        char *why = kf_arena_zalloc(arena, KF_ERROR_MESSAGE_BYTES_MAX);
        if (h == NULL || why == NULL) {
            return NULL;
        }
        keyflow__v1__partition_health__init(h);
        h->partition = (int32_t)p;
        h->id = (char *)(r->ids[p] != NULL ? r->ids[p] : "");
        h->ready = !kf_engine_unready(r->engines[p], why, KF_ERROR_MESSAGE_BYTES_MAX);
        h->reason = h->ready ? (char *)"" : why;
        out->partitions[out->n_partitions++] = h;
    }
    for (size_t i = 0; r->placement != NULL && r->placement->partition_count == r->count &&
                       i < r->placement->node_count;
         i++) {
        const kf_placement_node_t *n = &r->placement->nodes[i];
        Keyflow__V1__PlacementNode *pn = kf_arena_zalloc(arena, sizeof *pn);
        char *set = kf_arena_zalloc(arena, 1024);
        if (pn == NULL || set == NULL) {
            return NULL;
        }
        keyflow__v1__placement_node__init(pn);
        kf_partition_set_format(&n->partitions, set, 1024);
        pn->name = (char *)n->name;
        pn->partitions = set;
        pn->grpc_address = (char *)n->grpc_address;
        pn->http_address = (char *)n->http_address;
        out->nodes[out->n_nodes++] = pn;
    }
    for (size_t i = 0; i < KF_METHOD_COUNT; i++) {
        const kf_method_t *m = &kf_methods[i];
        Keyflow__V1__Route *route = kf_arena_zalloc(arena, sizeof *route);
        char **fields = kf_arena_zalloc(arena, 2 * sizeof *fields);
        if (route == NULL || fields == NULL) {
            return NULL;
        }
        keyflow__v1__route__init(route);
        route->method = (char *)m->path;
        route->kind = (char *)kf_route_kind_name(m->route.kind);
        route->plan = (char *)(m->route.plan != NULL ? m->route.plan : "");
        route->fields = fields;
        for (int f = 0; f < 2; f++) {
            if (m->route.fields[f] != NULL) {
                fields[route->n_fields++] = (char *)m->route.fields[f];
            }
        }
        out->routes[out->n_routes++] = route;
    }
    return out;
}
