// Types of the keyflow Node SDK's public API (README.md).
//
// Responses are plain objects converted from the protos at run time, so
// fields added to the protos appear before these types name them: the
// interfaces below list the fields this version knows and allow more.

/** Any JSON value: what inputs and results are. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
/** An int64: a number when it is a safe integer, else a bigint. */
export type Int64 = number | bigint;

export interface ConnectionOptions {
  /** host:port; default KEYFLOW_ADDR or 127.0.0.1:50051 */
  /** several endpoints (an array, or comma-separated): a routing client (docs/scaling.md) */
  addr?: string | string[];
  /** PEM CA file (turns TLS on); default KEYFLOW_TLS_CA */
  tlsCa?: string;
  /** PEM client certificate and key (mTLS); default KEYFLOW_TLS_CERT / KEYFLOW_TLS_KEY */
  tlsCert?: string;
  tlsKey?: string;
  /** name expected in the server certificate; default KEYFLOW_TLS_SERVER_NAME */
  tlsServerName?: string;
  /** TLS with gRPC's default roots; default KEYFLOW_TLS=1 */
  tls?: boolean;
  /** sent as `authorization: Bearer <key>`; default KEYFLOW_API_KEY */
  apiKey?: string;
  /** the key read from a file (wins over apiKey); default KEYFLOW_API_KEY_FILE */
  apiKeyFile?: string;
  /** per call, default 30000 (long polls add their wait) */
  timeoutMs?: number;
}

/** A run's retry policy (absent fields: the server's defaults). */
export interface RetryPolicy {
  /** attempts in all, 1..100; default the server's --run-attempts */
  maxAttempts?: number;
  /** wait before the first retry, default 1000; 0 retries at once */
  initialBackoffMs?: number;
  /** the longest wait, default 60000 */
  maxBackoffMs?: number;
  /** growth per attempt, 1..100, default 2 */
  multiplier?: number;
}
/** Options of the window's run, on either kind of rule. */
export interface RunOptions {
  /** leased runs of (workflow, key) at once; 0 = unlimited */
  keyConcurrency?: number;
  retry?: RetryPolicy;
  /** the run is DELAYED this long after its window closes */
  startAfterMs?: number;
}
export interface Rule extends RunOptions {
  kind: 'debounce' | 'batch';
  windowMs?: number;
  maxWaitMs?: number;
  maxEvents?: number;
  dedupMs?: number;
  /** debounce: which edge of the window starts a run (default 'trailing') */
  edge?: Edge;
  /** batch: bytes of the run's input array, 1..4194304 (the default) */
  maxBytes?: number;
}
export type Edge = 'trailing' | 'leading' | 'both';
export function debounce(windowMs: number, options?: { maxWaitMs?: number; dedupMs?: number; edge?: Edge } & RunOptions): Rule;
export function batch(options?: { maxEvents?: number; maxWaitMs?: number; dedupMs?: number; maxBytes?: number } & RunOptions): Rule;
export function retry(policy?: RetryPolicy): RetryPolicy;

export type RuleKind = 'debounce' | 'batch';
export type RunStatus = 'pending' | 'leased' | 'completed' | 'failed' | 'cancelled' | 'delayed' | 'window_open';

export interface Receipt {
  runId: string;
  dueMs: Int64;
  /** the durable write holding the event: server-wide, increasing */
  commitSeq: Int64;
  /** what the event did (docs/semantics.md, "Dispositions") */
  disposition: 'opened' | 'joined' | 'duplicate' | 'closed';
  duplicate: boolean;
  runStarted: boolean;
}
export interface EventToSend {
  workflow: string;
  key: string;
  input?: Json;
  rule: Rule;
  id?: string;
  flush?: boolean;
}

export interface Run {
  runId: string;
  workflow: string;
  key: string;
  kind: RuleKind;
  /** debounce: the latest event's input; batch: the array of inputs */
  input: Json;
  eventCount: Int64;
  status: RunStatus;
  attempts: Int64;
  createdMs: Int64;
  updatedMs: Int64;
  workerId: string;
  lease: string;
  leaseExpiresMs: Int64;
  result: Json;
  error: string;
  finishedMs: Int64;
  /** window_open, delayed: when the run becomes pending */
  dueMs: Int64;
  /** leased: CancelRun asked; the worker's report ends it cancelled */
  cancelRequested: boolean;
  /** the latest failed attempt's error, while the run is retried */
  lastError: string;
  maxAttempts: Int64;
  /** IDs of the run's events (the latest 256), oldest first */
  eventIds: string[];
  eventIdsDropped: Int64;
  [field: string]: unknown;
}

export interface Coordinator {
  exists: boolean;
  coordinator: { kind: RuleKind; workflow: string; key: string } | null;
  window: {
    runId: string; eventCount: Int64; openedMs: Int64; lastMs: Int64; dueMs: Int64;
    inputBytes: Int64; rule: { kind: RuleKind; windowMs?: Int64; maxWaitMs?: Int64; maxEvents?: Int64; dedupMs?: Int64 };
  } | null;
  runsStarted: Int64;
  recentRunIds: string[];
  rememberedIds: { id: string; receipt: { runId: string; dueMs: Int64 }; expiresMs: Int64 }[];
  journal: { seq: Int64; atMs: Int64; what: string; runId: string; eventId: string; detail: string }[];
  [field: string]: unknown;
}

export type FieldType = 'bool' | 'int64' | 'float64' | 'utf8' | 'bytes' | 'timestamp_us';
export interface Field { name: string; type: FieldType; nullable: boolean }
export interface FunctionInfo {
  descriptor: {
    functionId: string;
    pipelineStateId: string;
    runtime: 'native' | 'remote';
    implementationDigest: string;
    inputSchema: { fields: Field[] };
    outputSchema: { fields: Field[] };
    keyColumns: string[];
    /** as registered: 'PLACEMENT_SINGLE' or 'PLACEMENT_SPLIT' (absent before placement) */
    placement?: string;
    [field: string]: unknown;
  };
  descriptorSha256: string;
  available: boolean;
  unavailableReason: string;
  watermarkUs: Int64;
  outputSeq: Int64;
  keys: Int64;
  timers: Int64;
  stateBytes: Int64;
  /** due timers the server's follow-on steps have yet to fire */
  dueTimers: Int64;
  /** why the last follow-on timer step was refused ("" when it was not) */
  dueTimersError: string;
  /** Output rows firstRetainedSeq..outputSeq are still stored (retention). */
  firstRetainedSeq: Int64;
  retainedRows: Int64;
  retainedBytes: Int64;
  producers: Int64;
  /** in force: 'single' (every key in homePartition) or 'split' */
  placement: FunctionPlacement;
  /** single: the partition that holds every key */
  homePartition: number;
  /** split with several partitions: each partition's part and share of the limits */
  partitions: PartitionShare[];
  [field: string]: unknown;
}

/** Where a function's keys live (docs/scaling.md, "Placement"); 'unspecified'
 * only from a keyflowd from before placement (its functions are split). */
export type FunctionPlacement = 'single' | 'split' | 'unspecified';
export interface PartitionShare {
  partition: number;
  keys: Int64;
  timers: Int64;
  stateBytes: Int64;
  maxKeys: Int64;
  maxTimers: Int64;
  maxStateBytes: Int64;
  watermarkUs: Int64;
  outputSeq: Int64;
}

/** A row: field name -> value (BOOL boolean, INT64 / TIMESTAMP_US number,
 * bigint or decimal string, FLOAT64 number, UTF8 string, BYTES Buffer, null). */
export type Row = { [field: string]: boolean | number | bigint | string | Uint8Array | null | undefined };
/** An output row as read back: "_seq" plus the output schema's fields. */
export type OutputRow = { _seq: Int64; [field: string]: boolean | Int64 | string | Buffer | null };

export interface PushAck {
  rowsAccepted: Int64;
  activations: Int64;
  timerCallbacks: Int64;
  handlerCalls: Int64;
  firstOutputSeq: Int64;
  lastOutputSeq: Int64;
  watermarkUs: Int64;
  duplicate: boolean;
  sequence: Int64;
  /** due timers left for the server's follow-on steps */
  dueTimers: Int64;
  [field: string]: unknown;
}

export interface OutputPage {
  rows: OutputRow[];
  firstSeq: Int64;
  lastSeq: Int64;
  nextAfterSeq: Int64;
  highWaterSeq: Int64;
  firstRetainedSeq: Int64;
  /** with several partitions: the partition of this page's rows */
  partition: number;
  /** with several partitions: pass as `cursor` for the next page ('' with one) */
  nextCursor: string;
}

export interface Placement {
  partitionCount: number;
  hash: string;
  node: string;
  served: string;
  partitions: { partition: number; id: string; ready: boolean; reason: string }[];
  nodes: { name: string; partitions: string; grpcAddress: string; httpAddress: string }[];
  routes: { method: string; kind: string; fields: string[]; plan: string }[];
}

export interface TrimResult {
  firstRetainedSeq: Int64;
  outputSeq: Int64;
}

export interface DeleteFunctionResult {
  deleted: boolean;
  keys: Int64;
  timers: Int64;
  outputRows: Int64;
  producers: Int64;
}

export interface DeleteProducerResult {
  deleted: boolean;
  lastSequence: Int64;
}

export interface KeyState {
  keyText: string;
  state: 'absent' | 'null' | 'value';
  value: Int64 | null;
  timers: { name: string; atUs: Int64 }[];
  valueStateName: string;
}

export class KeyflowError extends Error {
  /** the gRPC status code number */
  code: number;
  /** its name: "INVALID_ARGUMENT", "UNAVAILABLE", ... */
  codeName: string;
  /** the server's message, naming the field and the limit */
  details: string;
  /** a call for a partition another process serves: that partition */
  partition?: number;
  /** ... and its owner, when the server's placement knows it */
  owner?: { node: string; grpc: string; http: string };
}

export class Client {
  constructor(options?: ConnectionOptions | string | string[]);
  readonly addr: string;
  /** keyflow.v1.Partitions/GetPlacement of this endpoint */
  placement(): Promise<Placement>;
  /** PushBatch attempts retried so far (UNAVAILABLE, DEADLINE_EXCEEDED) */
  pushRetries: number;
  close(): void;

  /** flush: close the window with this event in it */
  sendEvent(workflow: string, key: string, input: Json, options: { rule: Rule; id?: string; flush?: boolean }): Promise<Receipt>;
  /** up to 1000 events, durable in one write: a receipt or the refusal of each, in order */
  sendEvents(events: EventToSend[]): Promise<Array<Receipt | KeyflowError>>;
  describe(kind: RuleKind, workflow: string, key: string): Promise<Coordinator>;
  flush(kind: RuleKind, workflow: string, key: string): Promise<{ flushed: boolean; runId: string }>;
  cancel(kind: RuleKind, workflow: string, key: string): Promise<{ cancelled: boolean; runId: string; eventsDropped: Int64 }>;

  /** waitMs (at most 60000): wait that long for the run to finish */
  getRun(runId: string, options?: { waitMs?: number }): Promise<Run>;
  /** resolves when the run is completed, failed or cancelled (or as it is at timeoutMs) */
  waitRun(runId: string, options?: { timeoutMs?: number }): Promise<Run>;
  cancelRun(runId: string): Promise<Run>;
  releaseRun(runId: string, lease: string): Promise<Run>;
  listRuns(options?: { workflow?: string; key?: string; status?: RunStatus; pageSize?: number }): AsyncIterable<Run>;
  pollRuns(options: { workflows?: string[]; workerId?: string; leaseMs?: number; maxRuns?: number; waitMs?: number }): Promise<Run[]>;
  heartbeatRun(runId: string, lease: string, leaseMs?: number): Promise<Int64>;
  completeRun(runId: string, lease: string, result?: Json, options?: { error?: string; retryable?: boolean }): Promise<{ run: Run; alreadyFinished: boolean }>;

  /** descriptor: proto3 JSON form (as the build's *.descriptor.json) or a path to one */
  registerFunction(descriptor: object | string): Promise<{ function: FunctionInfo; alreadyRegistered: boolean }>;
  getFunction(functionId: string): Promise<FunctionInfo>;
  listFunctions(options?: { pageSize?: number }): AsyncIterable<FunctionInfo>;
  makeBatch(functionId: string, data: { rows?: Row[]; columns?: { [field: string]: Row[string][] } }): Promise<object>;
  pushBatch(functionId: string, producerId: string, sequence: Int64 | string, options: {
    rows?: Row[]; columns?: { [field: string]: Row[string][] }; batch?: object; watermarkUs?: Int64; attempts?: number;
  }): Promise<PushAck>;
  producer(functionId: string, options?: { producerId?: string; nextSequence?: Int64 }): Producer;
  readOutput(functionId: string, options?: { afterSeq?: Int64; limit?: number; waitMs?: number; cursor?: string }): Promise<OutputPage>;
  tailOutput(functionId: string, options?: { afterSeq?: Int64; maxRowsPerMessage?: number; cursor?: string }): OutputTail;
  /** Drops the output rows before beforeSeq (idempotent). */
  trimOutput(functionId: string, beforeSeq?: Int64, options?: { beforeCursor?: string }): Promise<TrimResult>;
  /** Deletes the function and everything of it; its id can be registered again. */
  deleteFunction(functionId: string, options?: { allowMissing?: boolean }): Promise<DeleteFunctionResult>;
  /** Forgets a producer: its next batch starts a new producer. */
  deleteProducer(functionId: string, producerId: string, options?: { allowMissing?: boolean }): Promise<DeleteProducerResult>;
  /** key: the value, or an array of values for several key columns */
  keyState(functionId: string, key: string | string[]): Promise<KeyState>;
}

export class Producer {
  readonly functionId: string;
  readonly producerId: string;
  lastSequence: bigint | null;
  push(rows: Row[] | null, options?: { columns?: { [field: string]: Row[string][] }; watermarkUs?: Int64 }): Promise<PushAck>;
}

export class OutputTail implements AsyncIterable<OutputRow> {
  [Symbol.asyncIterator](): AsyncIterator<OutputRow>;
  cancel(): void;
}

export class RunContext {
  readonly run: Run;
  readonly runId: string;
  readonly workflow: string;
  readonly key: string;
  readonly kind: RuleKind;
  readonly attempts: Int64;
  readonly maxAttempts: Int64;
  readonly eventCount: Int64;
  readonly eventIds: string[];
  readonly createdMs: Int64;
  readonly lease: string;
  /** the server refused a heartbeat: the result will not be reported */
  readonly leaseLost: boolean;
  /** a heartbeat said the run was cancelled: it ends cancelled whatever the handler returns */
  readonly cancelRequested: boolean;
  /** shutdown gave the run back */
  readonly released: boolean;
  /** true once the worker stops */
  readonly stopping: boolean;
  /** aborts when the worker stops */
  readonly signal: AbortSignal;
}

/** Throw it (or a subclass) from a handler to ask for another attempt. */
export class RetryableError extends Error {
  constructor(message?: string);
}

export type Handler = (input: Json, run: RunContext) => Json | Promise<Json>;

export interface WorkerOptions extends ConnectionOptions {
  /** a Client to share; otherwise one is made from the connection options */
  client?: Client;
  /** default: <hostname>-<pid> */
  workerId?: string;
  /** runs held at once, default 16 */
  concurrency?: number;
  /** default 30000 */
  leaseMs?: number;
  /** heartbeat every leaseMs * heartbeatFraction, default 1/3 */
  heartbeatFraction?: number;
  /** long poll, default 10000 */
  pollWaitMs?: number;
  /** time held runs get to finish at shutdown before they are released, default 20000 */
  graceMs?: number;
  /** concurrent long polls, default 2 */
  pollers?: number;
  /** stop on SIGTERM / SIGINT while run() is active, default true */
  installSignalHandlers?: boolean;
}

export class Worker {
  constructor(options?: WorkerOptions);
  readonly client: Client;
  readonly workerId: string;
  completed: number;
  failed: number;
  /** retryable errors that scheduled another attempt */
  retried: number;
  /** runs completed after a CancelRun */
  cancelled: number;
  lost: number;
  released: number;
  stopping: boolean;
  handle(workflow: string, handler: Handler): this;
  /** resolves after stop() finished or released every held run */
  run(): Promise<void>;
  /** graceMs counts from the first stop(); a later call may change it (0: release now) */
  stop(options?: { graceMs?: number }): Promise<void>;
}

// --- remote process-function handlers (lib/handler.js) ---------------------

/** One activation as a handler sees it. Reused for the next activation of
 * the call: read what you need during the handler call, keep nothing. */
export class Activation {
  /** per-function activation sequence */
  readonly id: Int64;
  /** canonical key: (u32 big-endian length, UTF-8 bytes) per key column */
  readonly key: Buffer;
  /** the key's value, or a JSON array of them for several key columns */
  readonly keyText: string;
  /** the row's event time, or the timer's time (UTC microseconds) */
  readonly eventTimeUs: Int64;
  readonly isTimer: boolean;
  /** the timer that fired, or null for a row */
  readonly timerName: string | null;
  /** the key's value before this activation (null when absent or null) */
  readonly state: Int64 | null;
  readonly stateKind: 'absent' | 'null' | 'value';
  /** the watermark before the call, or null before the first */
  readonly watermarkUs: Int64 | null;
  /** the input row (null for a timer) */
  readonly row: { [field: string]: unknown } | null;
  /** whether the input schema has the field */
  has(name: string): boolean;
  /** one input value (undefined for a timer); throws for an unknown field */
  get(name: string): unknown;
  /** SET the value (null: SET_NULL); one state mutation per activation */
  setState(value: Int64 | null): void;
  setStateNull(): void;
  clearState(): void;
  /** sets (or moves) a declared timer of this key; atUs after the watermark */
  setTimer(name: string, atUs: Int64): void;
  cancelTimer(name: string): void;
  /** an output row for this activation by field name; fields left out are null */
  emit(row: { [field: string]: unknown }): void;
  /** refuses the whole call: nothing of it is applied */
  fail(message: string): never;
}

export class HandlerError extends Error {}

export type ProcessHandler = (act: Activation) => void;

export interface FunctionWorkerOptions extends ConnectionOptions {
  functionId: string;
  handler: ProcessHandler;
  client?: Client;
  /** calls keyflowd may have out on the stream: 1..64, default 8 */
  concurrency?: number;
  /** the files whose bytes (concatenated in order) make the digest */
  sources?: string[];
  /** the implementation digest itself, instead of sources */
  digest?: string;
  /** shown in keyflowd's logs */
  name?: string;
}

export class FunctionWorker {
  constructor(options: FunctionWorkerOptions);
  readonly client: Client;
  readonly digest: string;
  calls: number;
  activations: number;
  refused: number;
  connects: number;
  /** the canonical descriptor from keyflowd's welcome */
  descriptor: object | null;
  workerId: string | null;
  descriptorFor(base: object | string, options?: { callTimeoutMs?: number }): object;
  /** resolves once keyflowd welcomed a stream */
  welcomed(): Promise<void>;
  /** serves until stop() (or SIGTERM/SIGINT); rejects with a refusal retrying cannot fix */
  run(options?: { signals?: boolean }): Promise<void>;
  stop(): Promise<void>;
}

/** Lowercase hex SHA-256 of the files' bytes concatenated in order. */
export function implementationDigest(...paths: string[]): string;
/** A copy of a descriptor (object or path) as a REMOTE function with this digest;
 * with placement, placed so (see withPlacement). */
export function remoteDescriptor(descriptor: object | string, digest: string,
  options?: { callTimeoutMs?: number; placement?: 'single' | 'split' }): object;
/** A copy of a descriptor (object or path) with its placement: 'single' (the
 * default: every key in the function's home partition, one atomic step per
 * batch, one output sequence) or 'split' (keys spread over the partitions). */
export function withPlacement(descriptor: object | string, placement: 'single' | 'split'): object;
