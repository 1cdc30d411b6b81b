/*
 * runtime/engine.h - the threaded engine around the deterministic core
 * (core/core.h): one thread owns all mutable state, a committer thread
 * makes each group of effects durable, replies leave only after that. This
 * is the engine as front ends see it; commands and configuration are in
 * step/engine_types.h.
 *
 *   front end threads            engine thread                committer thread
 *   ---------------------        --------------------------   -----------------------
 *   kf_engine_submit(cmd) -----> inbox (bounded) -> execute -> group N (one batch)
 *                                fire due timers      |        write group N-1 (sync)
 *                                                     +------> hand N-1's replies to
 *                                                              the replier thread:
 *   cmd->done(cmd) <-------------------------------------------- cmd->done(cmd)
 *
 * Invariants
 *   1. Only the engine thread touches engine state (coordinators, runs,
 *      functions, timers). Front ends hand it commands and get them back.
 *   2. A command's reply (cmd->done) is called only after the group holding
 *      its effects, and every group before it, was written with sync = true.
 *      Reads are released in the same order, so no reply reveals an effect
 *      that is not yet durable.
 *   3. A failed sync is fatal: nothing of that group or any later group is
 *      acknowledged; every call the engine holds, and every later submit,
 *      is answered KF_E_UNAVAILABLE "storage failure: <what>, stopping",
 *      and the process stops (config.on_fatal, default abort()). A group
 *      that would leave less than a quarter of the disk reserve free is not
 *      written at all and fails the same way, so that RocksDB never meets a
 *      full disk.
 *   4. While the committer syncs group N-1, the engine fills group N: one
 *      fsync serves every command that arrived meanwhile (group commit).
 *   5. Every queue is bounded: a full inbox refuses with KF_E_LIMIT.
 *   6. Disk reserve: while the store's filesystem has less free space than
 *      config.disk_reserve_bytes, commands that grow the store are refused
 *      with KF_E_NO_SPACE (see kf_core_set_disk_low); the rest goes on.
 */
#ifndef KF_RUNTIME_ENGINE_H
#define KF_RUNTIME_ENGINE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "step/engine_types.h"
#include "storage/store.h"

typedef struct kf_engine kf_engine_t;

/* Loads every coordinator, run and function from the store (replaying
 * journals) and rebuilds the timer heap. The store is borrowed and must
 * outlive the engine. Errors: KF_E_IO, KF_E_CORRUPT (with the key). */
kf_status_t kf_engine_create(const kf_engine_config_t *config, kf_store_t *store, kf_engine_t **out,
                             kf_error_t *err) KF_MUST_USE;
/* Starts the engine and committer threads. */
kf_status_t kf_engine_start(kf_engine_t *engine, kf_error_t *err) KF_MUST_USE;
/* Hands a command to the engine. On KF_OK the engine owns it until done();
 * otherwise (KF_E_LIMIT: queue full, KF_E_UNAVAILABLE: stopping) done() will
 * not be called and cmd->error says why. Any thread. */
kf_status_t kf_engine_submit(kf_engine_t *engine, kf_cmd_t *cmd) KF_MUST_USE;
/* The submitter's client went away: if `cmd` is still waiting in the engine
 * (a long poll), answer it now with KF_E_CANCELLED instead of letting it
 * take work. Harmless when the command already finished. Any thread; the
 * engine never touches `cmd` unless it is still one of its parked commands. */
void kf_engine_cancel(kf_engine_t *engine, kf_cmd_t *cmd);
/* Hands a worker event to the engine (step/engine_types.h, "remote handler
 * workers"); on KF_OK the engine owns `ev` and frees it
 * (kf_worker_event_free). KF_E_UNAVAILABLE once the engine is stopping:
 * `ev` is still the caller's. Any thread. */
kf_status_t kf_engine_worker_post(kf_engine_t *engine, kf_worker_event_t *ev) KF_MUST_USE;
/* Stops accepting, finishes every accepted command (parked polls answer
 * empty), syncs the last group and joins the threads. Idempotent. */
void kf_engine_stop(kf_engine_t *engine);
void kf_engine_destroy(kf_engine_t *engine);
/* True once a sync failed (the engine acknowledges nothing more). */
bool kf_engine_failed(const kf_engine_t *engine);
/* Another partition's sync failed (`err`, as its on_fatal got it) and the
 * process fail-stops: this engine takes the same failure, so that what it
 * holds (its open group, parked polls and reads, its queue) and every call
 * that comes until the process is gone is answered "storage failure: ...,
 * stopping", as in the partition that failed. A group its committer is
 * writing still completes (its store did not fail). No-op when the engine
 * failed already. Any thread. */
void kf_engine_fail(kf_engine_t *engine, const kf_error_t *err);
/* Why the engine does not take every command now, for /readyz: a storage
 * failure, or the disk reserve reached (free space measured by this call:
 * once it says so, new writes are refused). False, and `why` untouched,
 * when it takes them all. Any thread. */
bool kf_engine_unready(kf_engine_t *engine, char *why, size_t why_cap);

#endif
