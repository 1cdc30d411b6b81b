/*
 * policy.c - a rule's run options (key concurrency, retry policy, delayed
 * start): validation, records, and the backoff formula. Pure functions: no
 * state, no clock, no I/O (runs.h, "Run options").
 */
#include "runs/runs_int.h"

#include <math.h>
#include <stdio.h>

#include "base/assert.h"
#include "base/clock.h"
#include "base/limits.h"
#include "base/text.h"

#define RETRY_HAS_INITIAL(p)                                                                       \
    ((p)->initial_backoff_ms_present_case ==                                                       \
     KEYFLOW__V1__RETRY_POLICY__INITIAL_BACKOFF_MS_PRESENT_INITIAL_BACKOFF_MS)

static kf_status_t range(kf_error_t *err, const char *field, const char *name, int64_t v,
                         int64_t lo, int64_t hi) {
    char path[96];
    snprintf(path, sizeof path, "%s.%s", field, name);
    return kf_check_range(path, v, lo, hi, err);
}

static bool in_range(int64_t v, int64_t lo, int64_t hi) {
    return v >= lo && v <= hi;
}

static bool retry_is_none(const kf_retry_policy_t *p) {
    return p->max_attempts == 0 && p->initial_backoff_ms == 0 && p->max_backoff_ms == 0 &&
           p->multiplier == 0;
}

/* The one check of a resolved policy, for requests and records alike. */
static bool retry_valid(const kf_retry_policy_t *p) {
    return retry_is_none(p) ||
           (in_range(p->max_attempts, 0, KF_RUN_ATTEMPTS_MAX) &&
            in_range(p->initial_backoff_ms, 0, KF_BACKOFF_MS_MAX) &&
            in_range(p->max_backoff_ms, p->initial_backoff_ms, KF_BACKOFF_MS_MAX) &&
            p->multiplier >= 1.0 && p->multiplier <= KF_BACKOFF_MULTIPLIER_MAX);
}

kf_status_t kf_run_options_resolve(const Keyflow__V1__Rule *rule, const char *field,
                                   kf_run_options_t *out, kf_error_t *err) {
    kf_run_options_t o = {.retry = KF_RETRY_POLICY_NONE};
    kf_status_t st;
    if ((st = range(err, field, "key_concurrency", rule->key_concurrency, 0,
                    KF_KEY_CONCURRENCY_MAX)) != KF_OK ||
        (st = range(err, field, "start_after_ms", rule->start_after_ms, 0,
                    KF_START_AFTER_MS_MAX)) != KF_OK) {
        return st;
    }
    o.key_concurrency = rule->key_concurrency;
    o.start_after_ms = rule->start_after_ms;
    const Keyflow__V1__RetryPolicy *r = rule->retry;
    if (r != NULL) {
        char name[64];
        snprintf(name, sizeof name, "%s.retry", field);
        o.retry.max_attempts = r->max_attempts;
        o.retry.initial_backoff_ms =
            RETRY_HAS_INITIAL(r) ? r->initial_backoff_ms : KF_BACKOFF_INITIAL_MS_DEFAULT;
        if ((st = range(err, name, "max_attempts", o.retry.max_attempts, 0, KF_RUN_ATTEMPTS_MAX)) !=
                KF_OK ||
            (st = range(err, name, "initial_backoff_ms", o.retry.initial_backoff_ms, 0,
                        KF_BACKOFF_MS_MAX)) != KF_OK) {
            return st;
        }
        if (r->max_backoff_ms != 0) {
            o.retry.max_backoff_ms = r->max_backoff_ms;
        } else {
            o.retry.max_backoff_ms = o.retry.initial_backoff_ms > KF_BACKOFF_MAX_MS_DEFAULT
                                         ? o.retry.initial_backoff_ms
                                         : KF_BACKOFF_MAX_MS_DEFAULT;
        }
        if ((st = range(err, name, "max_backoff_ms", o.retry.max_backoff_ms,
                        o.retry.initial_backoff_ms, KF_BACKOFF_MS_MAX)) != KF_OK) {
            return st;
        }
        o.retry.multiplier = r->multiplier != 0 ? r->multiplier : KF_BACKOFF_MULTIPLIER_DEFAULT;
        /* NaN fails both comparisons. */
        if (!(o.retry.multiplier >= 1.0 && o.retry.multiplier <= KF_BACKOFF_MULTIPLIER_MAX)) {
            return kf_error_set(err, KF_E_INVALID, "%s.multiplier: must be in 1..%d, got %g", name,
                                KF_BACKOFF_MULTIPLIER_MAX, r->multiplier);
        }
    }
    KF_ASSERT(retry_valid(&o.retry));
    *out = o;
    return KF_OK;
}

static void retry_to_rec(const kf_retry_policy_t *p, Keyflow__Records__RetryRec *rec) {
    keyflow__records__retry_rec__init(rec);
    rec->max_attempts = p->max_attempts;
    rec->initial_backoff_ms = p->initial_backoff_ms;
    rec->max_backoff_ms = p->max_backoff_ms;
    rec->multiplier = p->multiplier;
}

/* An absent record is the policy of runs that had none (and of records
 * written before retry policies existed). */
static bool retry_from_rec(const Keyflow__Records__RetryRec *rec, kf_retry_policy_t *out) {
    if (rec == NULL) {
        *out = KF_RETRY_POLICY_NONE;
        return true;
    }
    kf_retry_policy_t p = {
        .max_attempts = rec->max_attempts,
        .initial_backoff_ms = rec->initial_backoff_ms,
        .max_backoff_ms = rec->max_backoff_ms,
        .multiplier = rec->multiplier,
    };
    if (!retry_valid(&p)) {
        return false;
    }
    *out = p;
    return true;
}

void kf_run_options_to_rule_rec(const kf_run_options_t *o, Keyflow__Records__RuleRec *rec,
                                Keyflow__Records__RetryRec *retry) {
    rec->key_concurrency = o->key_concurrency;
    rec->start_after_ms = o->start_after_ms;
    rec->retry = NULL;
    if (!retry_is_none(&o->retry)) {
        retry_to_rec(&o->retry, retry);
        rec->retry = retry;
    }
}

bool kf_run_options_from_rule_rec(const Keyflow__Records__RuleRec *rec, kf_run_options_t *out) {
    if (!in_range(rec->key_concurrency, 0, KF_KEY_CONCURRENCY_MAX) ||
        !in_range(rec->start_after_ms, 0, KF_START_AFTER_MS_MAX)) {
        return false;
    }
    out->key_concurrency = rec->key_concurrency;
    out->start_after_ms = rec->start_after_ms;
    return retry_from_rec(rec->retry, &out->retry);
}

void kf_run_options_to_rule(kf_arena_t *arena, const kf_run_options_t *o, Keyflow__V1__Rule *r) {
    r->key_concurrency = o->key_concurrency;
    r->start_after_ms = o->start_after_ms;
    if (!retry_is_none(&o->retry)) {
        Keyflow__V1__RetryPolicy *p = kf_arena_new(arena, sizeof *p);
        keyflow__v1__retry_policy__init(p);
        p->max_attempts = o->retry.max_attempts;
        p->initial_backoff_ms_present_case =
            KEYFLOW__V1__RETRY_POLICY__INITIAL_BACKOFF_MS_PRESENT_INITIAL_BACKOFF_MS;
        p->initial_backoff_ms = o->retry.initial_backoff_ms;
        p->max_backoff_ms = o->retry.max_backoff_ms;
        p->multiplier = o->retry.multiplier;
        r->retry = p;
    }
}

void kf__retry_to_rec(const kf_retry_policy_t *p, Keyflow__Records__RetryRec *storage,
                      Keyflow__Records__RetryRec **out) {
    *out = NULL;
    if (!retry_is_none(p)) {
        retry_to_rec(p, storage);
        *out = storage;
    }
}

bool kf__retry_from_rec(const Keyflow__Records__RetryRec *rec, kf_retry_policy_t *out) {
    return retry_from_rec(rec, out);
}

int64_t kf_retry_backoff_ms(const kf_retry_policy_t *p, int64_t attempt) {
    KF_ASSERT(attempt >= 1);
    if (p->initial_backoff_ms == 0) {
        return 0;
    }
    /* initial * multiplier^(attempt - 1), in doubles: the cap bounds it
     * long before it could overflow (and pow's inf compares fine). */
    double backoff = (double)p->initial_backoff_ms * pow(p->multiplier, (double)(attempt - 1));
    if (!(backoff < (double)p->max_backoff_ms)) {
        return p->max_backoff_ms;
    }
    return (int64_t)backoff;
}

int64_t kf_retry_attempts_max(const kf_retry_policy_t *p, int64_t server_default) {
    return p->max_attempts > 0 ? p->max_attempts : server_default;
}
