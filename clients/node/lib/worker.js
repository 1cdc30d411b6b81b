'use strict';
// keyflow.Worker: runs (async) handler functions for the runs of some workflows.
//
//   const worker = new Worker({ concurrency: 64 });
//   worker.handle('ship', async (input, run) => ({ shipped: input }));
//   await worker.run();        // until SIGTERM / SIGINT / worker.stop()
//
// Poll loops (`pollers`, default 2) lease runs (PollRuns long poll, maxRuns
// = free slots) and start each handler without awaiting it; at most
// `concurrency` runs are held or asked for at once. Each held run has a heartbeat timer every leaseMs *
// heartbeatFraction; a refused heartbeat (the lease expired or was taken
// over) marks the run lost and its result is not reported; one that says
// the run was cancelled sets run.cancelRequested. A handler's return value
// completes the run, a throw fails it (a RetryableError asks for a retry
// under the rule's retry policy).
//
// Lifecycle:
//   run() --SIGTERM/stop()--> stopping: the waiting poll is cancelled (it
//   takes no run), run.signal aborts, held runs may finish for graceMs -->
//   runs still held are released (ReleaseRun: pending again at once for
//   another worker; the attempt does not count) --> run() resolves.
// Connection errors are retried with exponential backoff until stop(); errors
// retrying cannot fix (UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT)
// stop the worker and run() rejects with them.
const os = require('os');
const grpc = require('@grpc/grpc-js');
const protos = require('./protos');
const { Client, KeyflowError, backoff, sleep } = require('./client');

const RUN_ERROR_BYTES_MAX = 4096; // the server's bound on a run's error text
const POLL_MAX_RUNS = 100; // the server's bound on one poll
const FATAL = new Set([grpc.status.UNAUTHENTICATED, grpc.status.PERMISSION_DENIED,
  grpc.status.INVALID_ARGUMENT, grpc.status.UNIMPLEMENTED]);
const RETRYABLE = new Set([grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED]);

function truncateUtf8(text, limitBytes) {
  const buf = Buffer.from(text, 'utf8');
  if (buf.length <= limitBytes) {
    return text;
  }
  // Cut, then drop a partial character at the end (decoded as U+FFFD).
  return buf.subarray(0, limitBytes - 3).toString('utf8').replace(/\uFFFD$/, '') + '...';
}

// Thrown by a handler (or extended): the attempt failed but the run may
// succeed later. The worker completes it with retryable, so it is retried
// under its rule's retry policy while attempts remain (without one: at
// once, up to the server's --run-attempts); other errors fail it for good.
class RetryableError extends Error {
  constructor(message) {
    super(message);
    this.name = 'RetryableError';
  }
}

// What a handler gets besides the input. cancelRequested turns true when a
// heartbeat says the run was cancelled (it ends CANCELLED whatever the
// handler then returns).
class RunContext {
  constructor(worker, run) {
    this._worker = worker;
    this.run = run;
    this.runId = run.runId;
    this.workflow = run.workflow;
    this.key = run.key;
    this.kind = run.kind;
    this.attempts = run.attempts;
    this.maxAttempts = run.maxAttempts;
    this.eventCount = run.eventCount;
    this.eventIds = run.eventIds || [];
    this.createdMs = run.createdMs;
    this.lease = run.lease;
    this.leaseLost = false; // the server refused a heartbeat
    this.cancelRequested = Boolean(run.cancelRequested); // CancelRun asked
    this.released = false; // shutdown gave the run back
    this.signal = worker._abort.signal; // aborts when the worker stops
    this._timer = null;
  }

  get stopping() {
    return this._worker.stopping;
  }
}

class Worker {
  // options: client (a Client) or the Client's options (addr, tlsCa, ...),
  // workerId, concurrency (16), leaseMs (30000), heartbeatFraction (1/3),
  // pollWaitMs (10000), graceMs (20000), pollers (2), installSignalHandlers (true).
  constructor(options = {}) {
    this._ownsClient = !options.client;
    this.client = options.client || new Client(options);
    this.workerId = options.workerId || `${os.hostname()}-${process.pid}`;
    this.concurrency = options.concurrency || 16;
    if (!(this.concurrency >= 1 && this.concurrency <= 10000)) {
      throw new TypeError(`concurrency: ${options.concurrency} is not in 1..10000`);
    }
    this.leaseMs = options.leaseMs || 30000;
    const fraction = options.heartbeatFraction || 1 / 3;
    if (!(fraction > 0 && fraction < 1)) {
      throw new TypeError(`heartbeatFraction: ${fraction} is not in (0, 1)`);
    }
    this.heartbeatMs = this.leaseMs * fraction;
    this.pollWaitMs = options.pollWaitMs === undefined ? 10000 : options.pollWaitMs;
    this.graceMs = options.graceMs === undefined ? 20000 : options.graceMs;
    this.installSignalHandlers = options.installSignalHandlers !== false;
    this.handlers = new Map();
    this.completed = 0; // runs completed with a result
    this.failed = 0; // runs completed with an error (FAILED)
    this.retried = 0; // runs whose retryable error scheduled another attempt
    this.cancelled = 0; // runs completed after a CancelRun (CANCELLED)
    this.lost = 0; // runs whose lease was lost before completion
    this.released = 0; // runs given back at shutdown
    this.stopping = false;
    this._active = new Map(); // runId -> RunContext
    this._abort = new AbortController();
    this._stopped = new Promise((resolve) =>
      this._abort.signal.addEventListener('abort', resolve, { once: true }));
    this._polls = new Map(); // outstanding PollRuns call -> its client
    this._share = this.concurrency; // most slots one poll reserves (_pollLoops)
    this._tickets = 0; // pollers reserve slots in turn (_reserveSlots)
    this._turn = 0;
    this._reserved = 0; // slots promised to outstanding polls
    this.pollers = Math.max(1, options.pollers || 2);
    this._pollBatchMin = Math.max(1, Math.min(16, Math.floor(this.concurrency / 4)));
    this._slotWaiters = [];
    this._idleWaiters = [];
    this._stopStartedMs = 0; // performance.now() of the first stop()
    this._graceChanged = null; // re-arms the grace timer of _shutdown
    this._done = null;
  }

  // Registers handler(input, run) for a workflow (sync or async). Its value
  // (any JSON value) completes the run; a throw fails it with "<Name>: <message>"
  // (a RetryableError asks for another attempt).
  handle(workflow, handler) {
    if (typeof handler !== 'function') {
      throw new TypeError(`handle(${JSON.stringify(workflow)}): the handler is not a function`);
    }
    this.handlers.set(workflow, handler);
    return this;
  }

  // Polls until stop() (or SIGTERM / SIGINT) has finished or released every
  // held run. Resolves then; rejects with a fatal error of the server.
  run() {
    if (this._done) {
      return this._done;
    }
    if (this.handlers.size === 0) {
      return Promise.reject(new TypeError('no handlers: call worker.handle(workflow, fn) first'));
    }
    const onSignal = () => this.stop();
    if (this.installSignalHandlers) {
      process.on('SIGTERM', onSignal);
      process.on('SIGINT', onSignal);
    }
    this._done = this._pollLoops().finally(() => {
      process.removeListener('SIGTERM', onSignal);
      process.removeListener('SIGINT', onSignal);
    });
    return this._done;
  }

  // Stops taking runs; held runs may finish for graceMs (default: the
  // worker's), then the rest are released. Resolves when run() is done.
  // The grace counts from the first stop(); a later call may change it
  // (stop({ graceMs: 0 }) releases what is still held at once).
  stop({ graceMs } = {}) {
    if (graceMs !== undefined) {
      this.graceMs = graceMs;
      if (this._graceChanged) {
        this._graceChanged();
      }
    }
    if (!this.stopping) {
      this.stopping = true;
      this._stopStartedMs = performance.now();
      this._abort.abort();
      for (const call of this._polls.keys()) {
        call.cancel();
      }
      this._wake(this._slotWaiters);
    }
    return this._done || Promise.resolve();
  }

  _wake(list) {
    for (const resolve of list.splice(0)) {
      resolve();
    }
  }

  _poll(maxRuns, c) {
    let call;
    const result = new Promise((resolve, reject) => {
      call = c._runs.PollRuns({
        workflows: [...this.handlers.keys()].sort(), workerId: this.workerId,
        leaseMs: this.leaseMs, maxRuns, waitMs: this.pollWaitMs,
      }, c.metadata, { deadline: Date.now() + c.timeoutMs + this.pollWaitMs },
      (err, resp) => (err ? reject(err) : resolve(resp)));
    });
    this._polls.set(call, c);
    return result.finally(() => this._polls.delete(call));
  }

  // Waits until this poller may poll and reserves the slots it asks for
  // (0: stopping). An endpoint's first poll needs one free slot; another at
  // the same time needs a batch of them, so that polls overlap the runs in
  // flight (lease and completion writes share commit groups) without
  // splitting free slots into polls of one run each. Pollers reserve in the
  // order they asked: a poller whose poll just came back does not take the
  // slots again before the others (with several endpoints, one would starve
  // the others' partitions).
  async _reserveSlots(client) {
    const ticket = this._tickets++;
    try {
      while (!this.stopping) {
        const free = this.concurrency - this._active.size - this._reserved;
        const busy = [...this._polls.values()].includes(client);
        if (ticket === this._turn && free >= (busy ? this._pollBatchMin : 1)) {
          const n = Math.min(free, POLL_MAX_RUNS, this._share);
          this._reserved += n;
          return n;
        }
        await new Promise((resolve) => this._slotWaiters.push(resolve));
      }
      return 0;
    } finally {
      this._turn++;
      this._wake(this._slotWaiters);
    }
  }

  async _pollLoops() {
    // A client of several endpoints (lib/routing.js): pollers for each, so
    // runs of every partition reach this worker; each endpoint's poll
    // reserves only its share of the slots, so every endpoint has a long
    // poll out at once.
    const endpoints = this.client.endpointClients ? this.client.endpointClients() : [this.client];
    this._share = Math.max(1, Math.floor(this.concurrency / endpoints.length));
    const results = await Promise.allSettled(endpoints.flatMap((c) =>
      Array.from({ length: this.pollers }, () => this._pollLoop(c))));
    await this._shutdown();
    const fatal = results.find((r) => r.status === 'rejected');
    if (fatal) {
      throw fatal.reason;
    }
  }

  async _pollLoop(client) {
    let delays = null;
    for (;;) {
      const n = await this._reserveSlots(client);
      if (n === 0) {
        return;
      }
      let resp = null;
      let error = null;
      try {
        resp = await this._poll(n, client);
      } catch (e) {
        error = e;
      }
      // The runs take their slots in the same step that frees the reservation.
      this._reserved -= n;
      for (const run of resp ? resp.runs : []) {
        const ctx = new RunContext(this, protos.toNative('keyflow.v1.Run', run));
        this._active.set(ctx.runId, ctx);
        this._scheduleHeartbeat(ctx, this.heartbeatMs);
        this._execute(ctx);
      }
      this._wake(this._slotWaiters);
      if (!error) {
        delays = null;
        continue;
      }
      if (this.stopping) {
        return;
      }
      if (FATAL.has(error.code)) {
        this.stop();
        throw KeyflowError.from(error);
      }
      delays = delays || backoff(100, 5000);
      const delay = delays.next().value;
      process.emitWarning(`keyflow worker: poll failed (${error.details || error.message}); ` +
        `retrying in ${Math.round(delay)} ms`);
      await Promise.race([sleep(delay), this._stopped]);
    }
  }

  async _shutdown() {
    if (this._active.size > 0) {
      const idle = new Promise((resolve) => this._idleWaiters.push(resolve));
      let timer;
      const graceOver = new Promise((resolve) => {
        this._graceChanged = () => {
          clearTimeout(timer);
          const leftMs = this._stopStartedMs + this.graceMs - performance.now();
          timer = setTimeout(resolve, Math.max(0, leftMs));
        };
        this._graceChanged();
      });
      await Promise.race([idle, graceOver]);
      clearTimeout(timer);
      this._graceChanged = null;
    }
    const held = [...this._active.values()].filter((ctx) => !ctx.leaseLost);
    await Promise.all(held.map(async (ctx) => {
      ctx.released = true;
      clearTimeout(ctx._timer);
      try {
        await this.client.releaseRun(ctx.runId, ctx.lease);
        this.released++;
      } catch (e) {
        process.emitWarning(`keyflow worker: releasing run ${ctx.runId}: ${e.message}`);
      }
    }));
    for (const ctx of this._active.values()) {
      clearTimeout(ctx._timer);
    }
    if (this._ownsClient) {
      this.client.close();
    }
  }

  _scheduleHeartbeat(ctx, delayMs) {
    ctx._timer = setTimeout(() => this._heartbeat(ctx), delayMs);
  }

  async _heartbeat(ctx) {
    if (!this._active.has(ctx.runId) || ctx.released) {
      return;
    }
    let next = this.heartbeatMs;
    try {
      const c = this.client;
      const resp = await c._unary(c._runs, 'HeartbeatRun',
        { runId: ctx.runId, lease: ctx.lease, leaseMs: this.leaseMs });
      if (resp.cancelRequested) {
        ctx.cancelRequested = true;
      }
    } catch (e) {
      if (e.code === grpc.status.FAILED_PRECONDITION || e.code === grpc.status.NOT_FOUND) {
        ctx.leaseLost = true;
        process.emitWarning(`keyflow worker: run ${ctx.runId}: lease lost (${e.details})`);
        return;
      }
      next = this.heartbeatMs / 4; // try again well before expiry
    }
    if (this._active.has(ctx.runId) && !ctx.released) {
      this._scheduleHeartbeat(ctx, next);
    }
  }

  async _execute(ctx) {
    let outcome = null;
    try {
      let resultJson = null;
      let error = null;
      let retryable = false;
      try {
        const handler = this.handlers.get(ctx.workflow);
        if (!handler) {
          throw new Error(`no handler for workflow ${JSON.stringify(ctx.workflow)}`);
        }
        resultJson = protos.encodeJson(await handler(ctx.run.input, ctx), 'result');
      } catch (e) {
        const name = (e && e.name) || 'Error';
        error = truncateUtf8(`${name}: ${e && e.message !== undefined ? e.message : e}`,
          RUN_ERROR_BYTES_MAX);
        retryable = e instanceof RetryableError;
      }
      outcome = await this._complete(ctx, resultJson, error, retryable);
    } finally {
      clearTimeout(ctx._timer);
      this._active.delete(ctx.runId);
      if (outcome) {
        this[outcome]++;
      }
      this._wake(this._slotWaiters);
      if (this._active.size === 0) {
        this._wake(this._idleWaiters);
      }
    }
  }

  // CompleteRun with retries; resolves with the counter to bump.
  async _complete(ctx, resultJson, error, retryable = false) {
    const c = this.client;
    const delays = backoff(50, 1000);
    const deadline = Date.now() + this.leaseMs;
    for (;;) {
      if (ctx.released) {
        return null;
      }
      if (ctx.leaseLost) {
        return 'lost';
      }
      const req = { runId: ctx.runId, lease: ctx.lease };
      if (error !== null) {
        req.error = error;
        req.retryable = retryable;
      } else {
        req.resultJson = resultJson;
      }
      try {
        const { run } = protos.toNative('keyflow.v1.CompleteRunResponse',
          await c._unary(c._runs, 'CompleteRun', req));
        if (run.status === 'cancelled') {
          return 'cancelled';
        }
        if (error === null) {
          return 'completed';
        }
        return run.status === 'pending' || run.status === 'delayed' ? 'retried' : 'failed';
      } catch (e) {
        if (RETRYABLE.has(e.code) && Date.now() < deadline) {
          await sleep(delays.next().value);
          continue;
        }
        if (e.code === grpc.status.FAILED_PRECONDITION) {
          process.emitWarning(`keyflow worker: run ${ctx.runId}: completion refused (${e.details})`);
          return 'lost';
        }
        if (error === null && (e.code === grpc.status.INVALID_ARGUMENT ||
            e.code === grpc.status.RESOURCE_EXHAUSTED)) {
          // The result itself was refused (too large): fail the run with the
          // reason rather than let its lease run out.
          error = truncateUtf8(`result refused: ${e.details}`, RUN_ERROR_BYTES_MAX);
          continue;
        }
        process.emitWarning(`keyflow worker: run ${ctx.runId}: completion failed: ${e.message}`);
        return 'lost';
      }
    }
  }
}

module.exports = { Worker, RunContext, RetryableError };
