/*
 * limits.h - every hard limit of keyflow, in one place, each with why.
 *
 * Configuration may lower a limit, never raise it past the value here (see
 * kf_config_validate in service/main). Reaching a limit is a clear error to
 * the caller (RESOURCE_EXHAUSTED / HTTP 413 or 429, or INVALID_ARGUMENT for a
 * malformed field) naming the limit, never silent growth and never a drop.
 * Names carry units: _BYTES_MAX, _MS_MAX, _MAX for counts.
 */
#ifndef KF_BASE_LIMITS_H
#define KF_BASE_LIMITS_H

/* ---- errors and identifiers ------------------------------------------- */

/* Room for "field.path: must be ..., got ...", plus a quoted value. */
#define KF_ERROR_MESSAGE_BYTES_MAX 512

/* Coordinator keys and workflow names are identifiers, not payloads; they
 * appear in every journal key and run ID, so they stay small. */
#define KF_KEY_BYTES_MAX       256
#define KF_WORKFLOW_BYTES_MAX  128
#define KF_EVENT_ID_BYTES_MAX  128
#define KF_WORKER_ID_BYTES_MAX 128
/* "<key>@<uuid>": key, '@', 36 characters of UUID. */
#define KF_UUID_TEXT_BYTES  36
#define KF_RUN_ID_BYTES_MAX (KF_KEY_BYTES_MAX + 1 + KF_UUID_TEXT_BYTES)
#define KF_LEASE_BYTES      KF_UUID_TEXT_BYTES

/* ---- coordinators ----------------------------------------------------- */

/* One event's input JSON: large enough for a real payload, small enough that
 * a burst of them cannot exhaust memory before the queue bound bites. */
#define KF_EVENT_INPUT_BYTES_MAX (256 * 1024)
/* A window's accumulated input (a batch run's input array). An event that
 * would push a batch window past it closes the window first (the run starts)
 * and opens a new one; the event itself is never refused for this. */
#define KF_WINDOW_INPUT_BYTES_MAX (4 * 1024 * 1024)
#define KF_BATCH_EVENTS_MAX       10000
#define KF_BATCH_EVENTS_DEFAULT   100
#define KF_BATCH_WAIT_MS_DEFAULT  1000
/* Windows, waits and dedup spans up to a week, like Inngest's debounce. */
#define KF_WINDOW_MS_MAX    (7LL * 24 * 3600 * 1000)
#define KF_DEDUP_MS_DEFAULT 600000
#define KF_DEDUP_MS_MAX     (7LL * 24 * 3600 * 1000)
/* Remembered event IDs per coordinator; the oldest is forgotten first. */
#define KF_REMEMBERED_IDS_MAX 1024
/* Expired remembered IDs are deleted when every this-many-th ID is pushed
 * (coord/coord.c): a busy coordinator keeps at most about this many expired
 * ones besides its live ones. Each sweep reads the expired ones and the
 * first live one: one iterator per this many events with IDs. */
#define KF_REMEMBERED_IDS_SWEEP_EVERY 32
/* Journal entries between snapshots (continue-as-new): bounds replay work
 * per key at start and storage per key between compactions. */
#define KF_JOURNAL_ENTRIES_MAX 256
/* Run IDs a coordinator lists in DescribeCoordinator. */
#define KF_RECENT_RUNS_MAX 16
/* Coordinators at once (each about 140 bytes of memory; its window and
 * remembered IDs are on disk); beyond it SendEvent answers
 * RESOURCE_EXHAUSTED. */
#define KF_COORDINATORS_MAX 2000000
/* Events in one SendEvents call: enough to amortise a call and a sync over
 * many events (the throughput lever), few enough that one call's execution
 * (at most ~1000 journal entries) never holds the engine for long. Its
 * request stays under KF_REQUEST_BYTES_MAX, which bounds the bytes. */
#define KF_SEND_EVENTS_MAX 1000

/* ---- runs ------------------------------------------------------------- */

#define KF_RUN_RESULT_BYTES_MAX (1024 * 1024)
#define KF_RUN_ERROR_BYTES_MAX  4096
#define KF_LEASE_MS_MIN         100
#define KF_LEASE_MS_MAX         (3600LL * 1000)
#define KF_LEASE_MS_DEFAULT     30000
#define KF_POLL_RUNS_MAX        100
#define KF_POLL_WORKFLOWS_MAX   32
#define KF_POLL_WAIT_MS_MAX     60000
/* Long polls parked in the engine at once; one more is RESOURCE_EXHAUSTED. */
#define KF_PARKED_POLLS_MAX     4096
#define KF_RUN_ATTEMPTS_MAX     100
#define KF_RUN_ATTEMPTS_DEFAULT 3
/* GetRun calls waiting (wait_ms) for a run to finish, at once; one more is
 * RESOURCE_EXHAUSTED. */
#define KF_RUN_WAITS_MAX 4096
/* A rule's run options (docs/semantics.md, "Runs"). Leases per key: more
 * than any worker fleet holds for one key; a week of delay or backoff, like
 * the windows. */
#define KF_KEY_CONCURRENCY_MAX        10000
#define KF_START_AFTER_MS_MAX         (7LL * 24 * 3600 * 1000)
#define KF_BACKOFF_MS_MAX             (7LL * 24 * 3600 * 1000)
#define KF_BACKOFF_INITIAL_MS_DEFAULT 1000
#define KF_BACKOFF_MAX_MS_DEFAULT     60000
#define KF_BACKOFF_MULTIPLIER_DEFAULT 2.0
#define KF_BACKOFF_MULTIPLIER_MAX     100
/* Event IDs a run records: the latest ones, as many as a coordinator's
 * journal holds between snapshots (128 bytes each at most: 32 KiB). */
#define KF_RUN_EVENT_IDS_MAX KF_JOURNAL_ENTRIES_MAX
/* Pending and leased runs in memory; windows that would start one more
 * stay open (and SendEvent answers RESOURCE_EXHAUSTED) until workers drain. */
#define KF_LIVE_RUNS_MAX        2000000
#define KF_RETENTION_MS_DEFAULT (7LL * 24 * 3600 * 1000)
#define KF_RETENTION_MS_MAX     (365LL * 24 * 3600 * 1000)
#define KF_LIST_PAGE_DEFAULT    100
#define KF_LIST_PAGE_MAX        1000
/* Records a list call may examine before it returns a partial page with a
 * continuation token, so one call never scans without bound. */
#define KF_LIST_SCAN_MAX 10000
/* A move of a listing's iterator this slow stepped over many deleted index
 * entries (about 0.1 us each in a memtable); the listing remembers where it
 * landed so that the next one seeks there (runs/ops.c). A live entry's step
 * takes under 1 us, a block read from disk longer: a useless shortcut
 * costs only its memory. */
#define KF_LIST_HINT_LEARN_US 100
/* Shortcuts remembered (each under 300 bytes); all are forgotten when one
 * more would pass this, and slow moves learn them again. */
#define KF_LIST_HINTS_MAX 4096

/* ---- engine ----------------------------------------------------------- */

/* Commands waiting for the engine thread; one more is RESOURCE_EXHAUSTED
 * (HTTP 429), so that overload shows at the edge instead of in memory. */
#define KF_QUEUE_DEPTH_MAX 8192
/* Commands whose effects share one synced write. */
#define KF_GROUP_COMMANDS_MAX 4096
/* Bytes one group may write; a command that would pass it starts the next
 * group instead. */
#define KF_GROUP_BYTES_MAX (64 * 1024 * 1024)
/* Processing-time timers fired per engine turn, so that a backlog after a
 * restart cannot starve requests. */
#define KF_TIMERS_PER_TURN_MAX 1024
#define KF_TIMERS_MAX          (KF_COORDINATORS_MAX + KF_LIVE_RUNS_MAX)
/* Work the engine starts by itself (follow-on timer steps of process
 * functions) runs for at most this long per turn before the engine looks at
 * its inbox again: a command waits behind it for about this long plus one
 * step. */
#define KF_WORK_TURN_US 2000
/* Follow-on steps stop adding to a group past this many bytes and wait for
 * the committer: it bounds what a timer backlog keeps in memory (two groups)
 * and keeps each synced write short. */
#define KF_WORK_GROUP_BYTES_MAX (8 * 1024 * 1024)

/* ---- process functions ------------------------------------------------ */

#define KF_FUNCTION_ID_BYTES_MAX 128
#define KF_PRODUCER_ID_BYTES_MAX 128
#define KF_FUNCTIONS_MAX         1024
/* Schema width and name lengths: descriptors are small, reviewed objects. */
#define KF_SCHEMA_FIELDS_MAX    64
#define KF_FIELD_NAME_BYTES_MAX 64
#define KF_KEY_COLUMNS_MAX      8
#define KF_TIMER_NAMES_MAX      16
/* A canonical key: every key column's value with a 4-byte length. */
#define KF_FUNCTION_KEY_BYTES_MAX 4096
/* A key's readable text (key_text, GetKeyState's key): with several key
 * columns a JSON array of their values, where JSON may spell one byte in
 * six (\u0001) and adds quotes and commas, so it can be several times
 * longer than the canonical key it names. */
#define KF_FUNCTION_KEY_TEXT_BYTES_MAX (8 * KF_FUNCTION_KEY_BYTES_MAX)
/* Defaults (DESIGN.md section 1) and the hard ceilings a descriptor may ask for. */
#define KF_FN_MAX_KEYS_DEFAULT   100000
#define KF_FN_MAX_KEYS_MAX       2000000
#define KF_FN_MAX_TIMERS_DEFAULT 100000
/* Timers live in memory (about 100 bytes each with their key's share);
 * due ones fire in steps of at most max_timer_callbacks_per_step, so a
 * large backlog delays the function, not the engine. */
#define KF_FN_MAX_TIMERS_MAX              2000000
#define KF_FN_MAX_STATE_BYTES_DEFAULT     (64LL * 1024 * 1024)
#define KF_FN_MAX_STATE_BYTES_MAX         (4LL * 1024 * 1024 * 1024)
#define KF_FN_MAX_BATCH_ROWS_DEFAULT      256
#define KF_FN_MAX_BATCH_ROWS_MAX          4096
#define KF_FN_MAX_INPUT_ROWS_DEFAULT      4096
#define KF_FN_MAX_INPUT_ROWS_MAX          65536
#define KF_FN_MAX_INPUT_BYTES_DEFAULT     (16LL * 1024 * 1024)
#define KF_FN_MAX_INPUT_BYTES_MAX         (16LL * 1024 * 1024)
#define KF_FN_MAX_OUTPUT_ROWS_DEFAULT     4096
#define KF_FN_MAX_OUTPUT_ROWS_MAX         65536
#define KF_FN_MAX_OUTPUT_BYTES_DEFAULT    (16LL * 1024 * 1024)
#define KF_FN_MAX_OUTPUT_BYTES_MAX        (64LL * 1024 * 1024)
#define KF_FN_MAX_TIMER_CALLBACKS_DEFAULT 256
#define KF_FN_MAX_TIMER_CALLBACKS_MAX     4096
/* timer_set/timer_cancel calls one handler call may make (each is kept until
 * the call's response is validated). */
#define KF_FN_TIMER_OPS_PER_CALL_MAX 262144
/* Producers remembered per function, and acknowledgements per producer kept
 * for retries of recent sequences. */
#define KF_PRODUCERS_MAX 10000
/* A producer no batch used for this long is forgotten (its sequence and
 * acks; --producer-idle-expiry-ms), so that producer IDs do not fill
 * KF_PRODUCERS_MAX for good. A week: a producer that pauses longer starts
 * over as a new one (any sequence), as Kafka forgets idle producer IDs. A
 * retry of a batch older than that is not recognised as a duplicate. */
#define KF_PRODUCER_IDLE_EXPIRY_MS_DEFAULT (7LL * 24 * 3600 * 1000)
#define KF_PRODUCER_IDLE_EXPIRY_MS_MAX     (365LL * 24 * 3600 * 1000)
/* Producers expired per engine turn, so a mass expiry is spread out. */
#define KF_PRODUCERS_EXPIRED_PER_TURN 1024
#define KF_PRODUCER_ACKS_KEPT         16
/* PushBatch commands waiting behind a function's step whose handler call
 * is out: each step starts from the state the previous one left, so they
 * wait in order, and a slow handler must not let them pile up. */
#define KF_FN_QUEUED_MAX 1024
/* Output rows per stored chunk, and per ReadOutput page. */
#define KF_OUTPUT_CHUNK_ROWS_MAX     4096
#define KF_READ_OUTPUT_LIMIT_DEFAULT 1000
#define KF_READ_OUTPUT_LIMIT_MAX     65536
#define KF_PARKED_READS_MAX          4096
/* Cancels of parked polls and reads waiting for the engine's next turn:
 * more than can be parked at once, so none is dropped in practice. */
#define KF_CANCELS_MAX (2 * (KF_PARKED_POLLS_MAX + KF_PARKED_READS_MAX + KF_RUN_WAITS_MAX))
/* Output retention (functions/retention.c). Unless a descriptor or the
 * server's flags say otherwise, output rows are kept a week, like finished
 * runs: long enough for any consumer to catch up after an outage, short
 * enough that a steady load reaches a steady disk size. */
#define KF_OUTPUT_RETENTION_MS_DEFAULT (7LL * 24 * 3600 * 1000)
#define KF_OUTPUT_RETENTION_MS_MAX     (10LL * 365 * 24 * 3600 * 1000)
/* Output chunks retention examines (and deletes) per engine turn, over all
 * functions: about 1 us each here, so a backlog of millions is trimmed in
 * slices of a few ms between requests; more than the chunks a saturated
 * engine writes per turn, so retention keeps up. */
#define KF_OUTPUT_TRIM_CHUNKS_PER_TURN 4096
/* How often retention looks for rows to trim when the last slice finished
 * its backlog: the precision of age bounds. */
#define KF_RETENTION_SWEEP_INTERVAL_MS 1000
/* REMOTE functions (workers on the Workers stream, functions/remote.c).
 * A worker's answer to one handler call may take up to the descriptor's
 * limits.call_timeout_ms: long enough by default for a garbage-collection
 * pause or a cold import, and at most 5 minutes, since the function's
 * batches queue behind the call meanwhile. A call past it fails its batch
 * (DEADLINE_EXCEEDED) and ends the worker's stream. */
#define KF_FN_CALL_TIMEOUT_MS_DEFAULT 10000
#define KF_FN_CALL_TIMEOUT_MS_MAX     300000
/* How often the watchdog (base/watchdog.h) looks at the call it watches: a
 * native handler that overruns its call_timeout_ms is caught within this
 * much more. */
#define KF_WATCHDOG_POLL_MS 20
/* ReplayBatch keeps the last input batches of each REPLAY_SAFE function in
 * memory, each with the state its step touched and its output: up to
 * --replay-batches per function (a debugging aid: a few are enough) and
 * --replay-bytes in all per process (each served partition gets an equal
 * share, as of --memory-budget), the oldest forgotten first. They also stay
 * within the room the engine's tables leave in --memory-budget: 64 MiB per
 * partition, outside the budget, was 512 MiB at 8 partitions. */
#define KF_REPLAY_BATCHES_DEFAULT 8
#define KF_REPLAY_BATCHES_MAX     64
#define KF_REPLAY_BYTES_DEFAULT   (64LL * 1024 * 1024)
#define KF_REPLAY_BYTES_MAX       (1024LL * 1024 * 1024)
/* Calls one worker takes at once (its hello's max_concurrent_calls): enough
 * to keep a worker busy while results and the next calls travel; each call
 * out costs the step a call buffer (max_batch_rows activations). */
#define KF_WORKER_CONCURRENCY_MAX 64
/* Calls one step has out at once, over all of its function's workers. */
#define KF_FN_CALLS_IN_FLIGHT_MAX 64
/* Worker streams the server holds at once, and workers one function has
 * (more are refused RESOURCE_EXHAUSTED before they reach the engine). */
#define KF_WORKER_STREAMS_MAX       1024
#define KF_WORKERS_PER_FUNCTION_MAX 64
#define KF_WORKER_NAME_BYTES_MAX    128
/* Native handler plugins: files scanned and bytes read per file. */
#define KF_PLUGIN_FILES_MAX 256
#define KF_PLUGIN_BYTES_MAX (64LL * 1024 * 1024)

/* ---- storage ---------------------------------------------------------- */

/* Live RocksDB WAL bytes of the whole process before the families pinning
 * the oldest WAL file are flushed. A clean stop flushes everything, but a
 * crash (SIGKILL, OOM kill, power loss) leaves up to about this much to
 * replay before the stores serve, and the replay also flushes the small
 * memtables it fills: at 64 MiB a restart after a SIGKILL under the soak's
 * load took 6.8-31 s on a busy 2-core machine, at 16 MiB 2.9-4.3 s against
 * 1.9-2.3 s for an empty store in the same runs (bench/README.md, "Restart
 * after a crash"). Lower means more, smaller flushes: no loss of SendEvent
 * or PushBatch throughput was measurable between 8, 16 and 64 MiB. It is a
 * process-wide budget: each served partition's store gets an equal share
 * (8 partitions: 2 MiB each), never less than
 * KF_ROCKS_WAL_BYTES_PER_STORE_MIN (at P = 256 a share would be 64 KiB,
 * a flush of the small families every few group commits). The home store
 * (API keys only) gets that minimum. */
#define KF_ROCKS_WAL_BYTES_MAX           (16 * 1024 * 1024)
#define KF_ROCKS_WAL_BYTES_PER_STORE_MIN (2 * 1024 * 1024)
/* Table files of the families of pending work (live runs, wake-ups,
 * event-time timers) are rewritten at this age, which drops the
 * tombstones of work done since (storage/store_rocks.c): about 17 files
 * per family and partition at the soak's load rather than ever more.
 * These families hold only pending work, so the rewrite is small. */
#define KF_ROCKS_PENDING_REWRITE_S 600
/* A table file of a family that retention deletes from (runs, wake-ups) is
 * compacted as soon as some run of this many consecutive entries in it
 * holds at least KF_ROCKS_DELETION_TRIGGER_ENTRIES tombstones: reads then
 * stop stepping over them (storage/store_rocks.c). */
#define KF_ROCKS_DELETION_WINDOW_ENTRIES  10000
#define KF_ROCKS_DELETION_TRIGGER_ENTRIES 5000
/* RocksDB's block cache, one for every family of every partition's store
 * (and home's): what the engine does not keep in memory (run bodies,
 * finished runs, journals) is read through it. Without one of its own each
 * family would have RocksDB's default 8 MiB cache, up to 8 MiB times the
 * families, unaccounted; with one per store, 8 partitions held 9 times
 * this (267 MB in a soak). */
#define KF_ROCKS_BLOCK_CACHE_BYTES (32 * 1024 * 1024)
/* How often the engine reads what RocksDB holds in memory for /metrics
 * (keyflow_store_memtable_bytes, _block_cache_bytes): each read takes
 * RocksDB's mutex once per family. */
#define KF_STORE_MEMORY_CHECK_INTERVAL_MS 1000
/* The heap's free memory goes back to the system (base/trim.h) at most
 * once per interval, and only once this much was freed since the last
 * trim: a burst of 1M runs left 500 bytes per run of freed but resident
 * heap without it. A trim walks the free lists of every arena (a few ms
 * for hundreds of MiB) on its own thread; 8 MiB is about 20k runs' bodies,
 * so a quiet process never trims and a busy one about once a second. */
#define KF_TRIM_INTERVAL_MS     1000
#define KF_TRIM_FREED_BYTES_MIN (8u * 1024 * 1024)
/* The coordinator journal's memtables are unsorted vectors (one append per
 * event, where a skiplist insert at a random place cost the committer about
 * 5 us; bench/README.md, "SendEvents"), so a read of the family sorts the
 * mutable one first: a small mutable memtable bounds what a
 * DescribeCoordinator sorts (about 8k entries, a few ms), and merging
 * several of them per flush keeps level-0 files as large as a flush of one
 * 8 MiB memtable would make them. */
#define KF_ROCKS_JOURNAL_MEMTABLE_BYTES (1024 * 1024)
#define KF_ROCKS_JOURNAL_MEMTABLES      10
#define KF_ROCKS_JOURNAL_FLUSH_MERGE    8

/* Free space kept on the data directory's filesystem (--disk-reserve): below
 * it, commands that grow the store (new events, batches, functions) are
 * refused with KF_E_NO_SPACE while reads, completions, deletions and timers
 * go on. The default leaves room for RocksDB's flushes and compactions,
 * which need space to free space. A group is written only if it leaves a
 * quarter of the reserve free; else keyflowd fail-stops before RocksDB can
 * meet a full disk (see engine.c). */
#define KF_DISK_RESERVE_BYTES_DEFAULT (256LL * 1024 * 1024)
/* Small values are for tests on small filesystems. */
#define KF_DISK_RESERVE_BYTES_MIN (1LL * 1024 * 1024)
#define KF_DISK_RESERVE_BYTES_MAX (1LL << 50)
/* Free space is measured (statvfs) before every group is written, and
 * otherwise (readiness, recovery from a low disk) at most this often. */
#define KF_DISK_CHECK_INTERVAL_MS 100
/* A window due while the disk has no room above the reserve waits, open,
 * and is looked at again this often: each look is a heap operation, no
 * read, so many waiting windows cost little; with space back they close
 * within this time (or at once, when a request touches one). */
#define KF_DISK_WAIT_RETRY_MS 500

/* An idle engine wakes at least this often, so that a key revoked through
 * another engine (the home one) ends the open calls this engine parks for
 * it within about this long (auth/auth.h); one wake-up a second costs
 * nothing measurable. */
#define KF_ENGINE_IDLE_WAKE_MS 1000

/* ---- memory ----------------------------------------------------------- */

/* --memory-budget: the engine's tables (windows, runs, keys, producers,
 * functions, remembered IDs; docs/semantics.md, "Memory budget") may grow
 * past it only in entries that already exist. Its default is this share
 * of the cgroup's memory limit, else of the machine's memory: the rest is
 * for RocksDB (memtables bounded by the WAL cap, the block cache), request
 * buffers, threads and the allocator's slack. */
#define KF_MEMORY_BUDGET_SHARE_PERCENT 50
/* Small values are for tests; a real budget is hundreds of MiB. */
#define KF_MEMORY_BUDGET_BYTES_MIN (64LL * 1024)
#define KF_MEMORY_BUDGET_BYTES_MAX (1LL << 50)

/* ---- API keys ---------------------------------------------------------- */

/* Live keys: each is a few hundred bytes in memory and looked up on every
 * call; ten thousand is more keys than any deployment hands out. Revoked
 * keys are deleted, so the table shrinks again. */
#define KF_API_KEYS_MAX 10000
/* Grants per key (scope + optional name prefix). */
#define KF_GRANTS_MAX 32
/* A grant's prefix is a workflow or function name prefix. */
#define KF_GRANT_PREFIX_BYTES_MAX 128
#define KF_API_KEY_NAME_BYTES_MAX 128

/* ---- front ends ------------------------------------------------------- */

/* One request message or HTTP body: a 16 MiB input batch plus framing. */
#define KF_REQUEST_BYTES_MAX (20 * 1024 * 1024)
/* One response message (an output page, a run list). */
#define KF_RESPONSE_BYTES_MAX (64 * 1024 * 1024)
/* Per-request arena: request decode plus response build. */
#define KF_ARENA_BYTES_MAX (256LL * 1024 * 1024)
/* gRPC calls awaiting a request at once, per method. */
#define KF_GRPC_PENDING_PER_METHOD 64
/* Request bytes of gRPC calls received and not yet answered, process-wide
 * (--grpc-request-bytes-held): a call that would pass it is refused
 * RESOURCE_EXHAUSTED at once, unless it is the only one. The engine queues
 * calls by count (KF_QUEUE_DEPTH_MAX a partition), each up to
 * KF_REQUEST_BYTES_MAX: without it 8192 queued 20 MiB calls were
 * possible. Six 20 MiB requests at once, as the gateway's
 * KF_HTTP_BUFFERED_BYTES_MAX: a request taken costs about three times its
 * bytes while it waits (its unpacked copy, the partitions' commands, the
 * write group), and with the disk stuck 128 MiB held came to 565 MiB of
 * RSS (bench/README.md, "Request bytes held"). */
#define KF_GRPC_REQUEST_BYTES_HELD_DEFAULT (128LL * 1024 * 1024)
#define KF_GRPC_REQUEST_BYTES_HELD_MIN     (1LL * 1024 * 1024)
#define KF_GRPC_REQUEST_BYTES_HELD_MAX     (1LL << 40)
/* gRPC core's own memory (a resource quota on the server): it grants each
 * stream the window for its whole message and buffers it before the call
 * reaches keyflowd, on any number of streams, so unfinished messages are
 * outside the count above (40 streams of 18 MiB pinned 720 MiB). Past the
 * quota gRPC resets streams (RESOURCE_EXHAUSTED "Buffers full"); 32
 * concurrent 16 MiB calls went through under it. */
#define KF_GRPC_MEMORY_QUOTA_BYTES (512LL * 1024 * 1024)
/* HTTP connections the gateway serves at once. */
#define KF_HTTP_CONNECTIONS_MAX 4096
/* Connections from one client address (--http-connections-per-address):
 * one client cannot take the whole gateway (a slowloris from one host holds
 * at most this many), while a proxy in front may be given more. */
#define KF_HTTP_CONNECTIONS_PER_ADDRESS_DEFAULT 64
/* A request head (request line and headers, as sent; HTTP/2: the decoded
 * names and values) is at most this long; past it the gateway answers 431
 * (service/http/gateway.c) and closes an HTTP/1 connection. keyflow's own
 * heads are a few hundred bytes (a path, Host, Authorization, Content-Type);
 * 32 KiB is nginx's default (4 buffers of 8 KiB) and leaves room for what a
 * proxy in front adds (X-Forwarded-For chains, tracing headers). h2o 2.2.5
 * would take 408 KiB (H2O_MAX_REQLEN), and every connection may hold a head
 * while it is answered: at this bound all KF_HTTP_CONNECTIONS_MAX of them
 * hold at most KF_HTTP_BUFFERED_BYTES_MAX. */
#define KF_HTTP_HEADER_BYTES_MAX (32u * 1024)
/* Request bytes the gateway's connections may hold in all while they are
 * read (service/http/conns.c): HTTP/1 requests, and HTTP/2 streams' bodies
 * (h2o buffers each whole, up to 100 a connection). Past it, checked every
 * 100 ms, the connections still sending that hold the most lose what they
 * send: HTTP/1 ones are closed, HTTP/2 ones' streams are refused. Six
 * 20 MiB bodies at once. */
#define KF_HTTP_BUFFERED_BYTES_MAX (128u * 1024 * 1024)
/* A connection must deliver a complete request head (request line and
 * headers) within this long of being accepted or of its last request's
 * answer (--http-header-timeout-ms), and the whole request, body included,
 * within the body timeout (--http-body-timeout-ms: a 20 MiB body at about
 * 1 MB/s), and take its answer as fast. Past them it is closed. A slowloris
 * client therefore holds a connection for at most a few seconds. */
#define KF_HTTP_HEADER_TIMEOUT_MS_DEFAULT 5000
#define KF_HTTP_HEADER_TIMEOUT_MS_MAX     60000
#define KF_HTTP_BODY_TIMEOUT_MS_DEFAULT   30000
#define KF_HTTP_BODY_TIMEOUT_MS_MAX       300000
#define KF_HTTP_TIMEOUT_MS_MIN            100
/* The probe listener (--probe-address: /healthz, /readyz, /metrics only) has
 * its own thread and its own small connection budget, so that probes are
 * answered whatever the gateway's clients do. Probes are small and quick. */
#define KF_PROBE_CONNECTIONS_MAX             64
#define KF_PROBE_CONNECTIONS_PER_ADDRESS_MAX 16
#define KF_PROBE_TIMEOUT_MS                  2000
#define KF_PROBE_REQUEST_BYTES_MAX           4096
/* A request of a gRPC stream the front end serves itself and that stays
 * open as long as the client likes (reflection, TailOutput; health takes
 * KF_PROBE_REQUEST_BYTES_MAX): a function ID and a cursor of up to
 * KF_OUTPUT_CURSOR_BYTES_MAX fit many times over. Bounded so that idle
 * streams cannot hold --grpc-request-bytes-held (service/rpc). */
#define KF_FRONT_REQUEST_BYTES_MAX (64 * 1024)
/* Request bodies larger than this are decoded (JSON to the request message)
 * by the gateway's worker threads instead of its event loop, and responses
 * whose message is larger are rendered there: decoding JSON runs at about
 * 10 MB/s here, so one 16 MB body used to hold the loop (and every other
 * client, /healthz included) for about two seconds. 64 KiB takes well under
 * a millisecond. */
#define KF_HTTP_INLINE_BODY_BYTES_MAX (64 * 1024)
#define KF_HTTP_WORKERS               2
/* Bodies waiting for a worker; one more is refused (429, retry). */
#define KF_HTTP_WORK_QUEUE_MAX 64
/* Parameters in one HTTP query string (repeated ones each count): enough for
 * PollRuns' 32 workflows and the rest, and it bounds the work a query costs. */
#define KF_HTTP_QUERY_PARAMS_MAX 64
/* One PEM file of TLS material (a certificate chain, a key, a CA bundle):
 * a chain of a few certificates is a few KiB; a CA bundle as large as a
 * system trust store is about 200 KiB. */
#define KF_TLS_PEM_BYTES_MAX (1024 * 1024)
/* Nesting depth of JSON documents the gateway accepts. */
#define KF_JSON_DEPTH_MAX 64

/* ---- operations ------------------------------------------------------- */

/* How long keyflowd keeps serving after SIGTERM while it reports NOT_SERVING
 * (--drain-grace-ms): long enough for any load balancer to notice, short
 * enough that a stop never looks hung (Kubernetes' default grace is 30 s). */
#define KF_DRAIN_GRACE_MS_MAX (5LL * 60 * 1000)

/* ---- partitions (docs/scaling.md) ------------------------------------ */

/* Partitions of a data set. Each served partition is an engine thread, a
 * committer, a replier and a RocksDB instance; 256 covers a machine with
 * 256 cores, and the partition a run belongs to is written in its run ID's
 * 12 spare UUID bits (base/partition.h), which hold up to 4096. */
#define KF_PARTITION_COUNT_MAX 256
/* The count a new data set gets when --partition-count is not given: room
 * to spread over 8 cores or processes later (the count never changes), at
 * a fixed cost per idle partition of about 0.2 MB of disk and 2-3 MB of
 * memory (docs/scaling.md, "Choosing P"). */
#define KF_PARTITION_COUNT_DEFAULT 8
/* Stores opened (RocksDB recovers its WAL) or closed at once at start and
 * stop: opening is mostly fsync waits, so a few at a time overlap them
 * without one thread per partition at P = 256. */
#define KF_PARTITION_OPEN_THREADS_MAX 8
/* One line of a placement file (a node name, a partition set, two
 * addresses) and the nodes one file may name. */
#define KF_PLACEMENT_LINE_BYTES_MAX 1024
#define KF_PLACEMENT_NODES_MAX      KF_PARTITION_COUNT_MAX
#define KF_ADDRESS_BYTES_MAX        256
/* A merged output cursor: "kfo1:P:" then "partition=seq" for every
 * partition with a position (docs/scaling.md). */
#define KF_OUTPUT_CURSOR_BYTES_MAX (16 + KF_PARTITION_COUNT_MAX * 26)

/* One log line, built on the stack and written with one write(2) (which
 * keeps concurrent lines whole): room for a function key, the longest
 * identifier a line carries, escaped, plus the rest; longer values are cut. */
#define KF_LOG_LINE_BYTES_MAX 8192
/* The path an HTTP request that names no RPC is logged with (debug),
 * percent-encoded: enough to recognise it, bounded like everything a client
 * can make the log hold. */
#define KF_LOG_PATH_BYTES_MAX 512

_Static_assert(KF_BATCH_EVENTS_DEFAULT <= KF_BATCH_EVENTS_MAX, "default within bound");
_Static_assert(KF_ROCKS_JOURNAL_FLUSH_MERGE < KF_ROCKS_JOURNAL_MEMTABLES,
               "a mutable journal memtable remains while a merged flush waits");
_Static_assert(KF_EVENT_INPUT_BYTES_MAX * 2 <= KF_WINDOW_INPUT_BYTES_MAX,
               "a window holds more than one maximal input");
_Static_assert(KF_WINDOW_INPUT_BYTES_MAX < KF_REQUEST_BYTES_MAX,
               "a run's input fits in one response");
_Static_assert(KF_EVENT_INPUT_BYTES_MAX < KF_REQUEST_BYTES_MAX, "an event fits in a request");
_Static_assert(KF_GROUP_COMMANDS_MAX <= KF_QUEUE_DEPTH_MAX, "a group drains at most a queue");
_Static_assert(KF_HTTP_CONNECTIONS_PER_ADDRESS_DEFAULT <= KF_HTTP_CONNECTIONS_MAX,
               "default within bound");
_Static_assert(KF_HTTP_TIMEOUT_MS_MIN <= KF_HTTP_HEADER_TIMEOUT_MS_DEFAULT &&
                   KF_HTTP_HEADER_TIMEOUT_MS_DEFAULT <= KF_HTTP_HEADER_TIMEOUT_MS_MAX &&
                   KF_HTTP_BODY_TIMEOUT_MS_DEFAULT <= KF_HTTP_BODY_TIMEOUT_MS_MAX,
               "default timeouts within bounds");
_Static_assert(KF_HTTP_HEADER_BYTES_MAX *KF_HTTP_CONNECTIONS_MAX <= KF_HTTP_BUFFERED_BYTES_MAX,
               "every connection's head fits in the buffered bound");
_Static_assert(KF_PROBE_CONNECTIONS_PER_ADDRESS_MAX <= KF_PROBE_CONNECTIONS_MAX,
               "per-address within the listener's bound");
_Static_assert(KF_WORK_GROUP_BYTES_MAX <= KF_GROUP_BYTES_MAX, "follow-on steps stop earlier");
_Static_assert(KF_LEASE_MS_DEFAULT >= KF_LEASE_MS_MIN && KF_LEASE_MS_DEFAULT <= KF_LEASE_MS_MAX,
               "default lease within bounds");
_Static_assert(KF_DEDUP_MS_DEFAULT <= KF_DEDUP_MS_MAX, "default dedup within bound");
_Static_assert(KF_BACKOFF_INITIAL_MS_DEFAULT <= KF_BACKOFF_MAX_MS_DEFAULT &&
                   KF_BACKOFF_MAX_MS_DEFAULT <= KF_BACKOFF_MS_MAX,
               "default backoffs within bounds");
_Static_assert(KF_RUN_ATTEMPTS_DEFAULT <= KF_RUN_ATTEMPTS_MAX, "default attempts within bound");
_Static_assert(KF_FN_MAX_INPUT_BYTES_MAX < KF_REQUEST_BYTES_MAX,
               "a full input batch fits a request");
_Static_assert(KF_FN_MAX_BATCH_ROWS_DEFAULT <= KF_FN_MAX_BATCH_ROWS_MAX, "default within bound");
_Static_assert(KF_FN_MAX_INPUT_ROWS_DEFAULT <= KF_FN_MAX_INPUT_ROWS_MAX, "default within bound");
_Static_assert(KF_FN_CALL_TIMEOUT_MS_DEFAULT <= KF_FN_CALL_TIMEOUT_MS_MAX, "default within bound");
_Static_assert(KF_WORKER_CONCURRENCY_MAX <= KF_FN_CALLS_IN_FLIGHT_MAX,
               "one worker's calls fit a step's window");
_Static_assert(KF_WORKERS_PER_FUNCTION_MAX <= KF_WORKER_STREAMS_MAX, "workers are streams");
_Static_assert(KF_KEY_COLUMNS_MAX <= KF_SCHEMA_FIELDS_MAX, "key columns are input columns");
_Static_assert(KF_FUNCTION_KEY_BYTES_MAX < KF_LOG_LINE_BYTES_MAX, "a key fits a log line");
_Static_assert(KF_LOG_PATH_BYTES_MAX < KF_LOG_LINE_BYTES_MAX, "a logged path fits a log line");
_Static_assert(KF_GRANT_PREFIX_BYTES_MAX >= KF_WORKFLOW_BYTES_MAX &&
                   KF_GRANT_PREFIX_BYTES_MAX >= KF_FUNCTION_ID_BYTES_MAX,
               "a prefix can be a whole workflow or function name");
_Static_assert(KF_OUTPUT_RETENTION_MS_DEFAULT <= KF_OUTPUT_RETENTION_MS_MAX,
               "default retention within bound");
_Static_assert(KF_PARTITION_COUNT_DEFAULT >= 1 &&
                   KF_PARTITION_COUNT_DEFAULT <= KF_PARTITION_COUNT_MAX,
               "default partition count within bound");
_Static_assert(KF_OUTPUT_CURSOR_BYTES_MAX + KF_FUNCTION_ID_BYTES_MAX + 64 <=
                   KF_FRONT_REQUEST_BYTES_MAX,
               "a TailOutput request with the longest cursor fits");
_Static_assert(KF_PARTITION_COUNT_MAX <= 4096, "a run ID's 12 tag bits name every partition");
_Static_assert(KF_PARTITION_COUNT_MAX % 64 == 0, "partition sets are whole 64-bit words");
_Static_assert(KF_DISK_RESERVE_BYTES_MIN <= KF_DISK_RESERVE_BYTES_DEFAULT &&
                   KF_DISK_RESERVE_BYTES_DEFAULT <= KF_DISK_RESERVE_BYTES_MAX,
               "default reserve within bounds");

#endif
