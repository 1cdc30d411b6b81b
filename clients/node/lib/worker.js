'use strict';
// keyflow.Worker: runs (async) handler functions for the runs of some workflows.
//
//   const worker = new Worker({ concurrency: 64 });
//   worker.handle('ship', async (input, run) => ({ shipped: input }));
//   await worker.run();        // until SIGTERM / SIGINT / worker.stop()
//
// One poll loop leases runs (PollRuns long poll, maxRuns = free slots) and
// starts each handler without awaiting it; at most `concurrency` runs are
// held at once. Each held run has a heartbeat timer every leaseMs *
// heartbeatFraction; a refused heartbeat (the lease expired or was taken
// over) marks the run lost and its result is not reported. A handler's
// return value completes the run, a throw fails it.
//
// Lifecycle:
//   run() --SIGTERM/stop()--> stopping: the waiting poll is cancelled (it
//   takes no run), run.signal aborts, held runs may finish for graceMs -->
//   runs still held are released (lease cut to the 100 ms minimum, so another
//   worker takes them at once; the attempt counts) --> run() resolves.
// Connection errors are retried with exponential backoff until stop(); errors
// retrying cannot fix (UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT)
// stop the worker and run() rejects with them.
const os = require('os');
const grpc = require('@grpc/grpc-js');
const protos = require('./protos');
const { Client, KeyflowError, backoff, sleep } = require('./client');

const LEASE_MS_MIN = 100; // the server's shortest lease: a release
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

// What a handler gets besides the input.
class RunContext {
  constructor(worker, run) {
    this._worker = worker;
    this.run = run;
    this.runId = run.runId;
    this.workflow = run.workflow;
    this.key = run.key;
    this.kind = run.kind;
    this.attempts = run.attempts;
    this.eventCount = run.eventCount;
    this.createdMs = run.createdMs;
    this.lease = run.lease;
    this.leaseLost = false; // the server refused a heartbeat
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
  // pollWaitMs (10000), graceMs (20000), installSignalHandlers (true).
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
    this.failed = 0; // runs completed with an error
    this.lost = 0; // runs whose lease was lost before completion
    this.released = 0; // runs given back at shutdown
    this.stopping = false;
    this._active = new Map(); // runId -> RunContext
    this._abort = new AbortController();
    this._pollCall = null;
    this._slotWaiters = [];
    this._idleWaiters = [];
    this._done = null;
  }

  // Registers handler(input, run) for a workflow (sync or async). Its value
  // (any JSON value) completes the run; a throw fails it with "<Name>: <message>".
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
    this._done = this._pollLoop().finally(() => {
      process.removeListener('SIGTERM', onSignal);
      process.removeListener('SIGINT', onSignal);
    });
    return this._done;
  }

  // Stops taking runs; held runs may finish for graceMs (default: the
  // worker's), then the rest are released. Resolves when run() is done.
  stop({ graceMs } = {}) {
    if (graceMs !== undefined) {
      this.graceMs = graceMs;
    }
    if (!this.stopping) {
      this.stopping = true;
      this._abort.abort();
      if (this._pollCall) {
        this._pollCall.cancel();
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

  _poll(maxRuns) {
    const c = this.client;
    return new Promise((resolve, reject) => {
      this._pollCall = c._runs.PollRuns({
        workflows: [...this.handlers.keys()].sort(), workerId: this.workerId,
        leaseMs: this.leaseMs, maxRuns, waitMs: this.pollWaitMs,
      }, c.metadata, { deadline: Date.now() + c.timeoutMs + this.pollWaitMs }, (err, resp) => {
        this._pollCall = null;
        return err ? reject(err) : resolve(resp);
      });
    });
  }

  async _pollLoop() {
    let delays = null;
    let fatal = null;
    while (!this.stopping) {
      while (this._active.size >= this.concurrency && !this.stopping) {
        await new Promise((resolve) => this._slotWaiters.push(resolve));
      }
      if (this.stopping) {
        break;
      }
      if (this._active.size > (this.concurrency * 3) / 4) {
        // Most slots busy: let a few more free up so one poll leases several.
        await new Promise((resolve) => {
          this._slotWaiters.push(resolve);
          setTimeout(resolve, 2);
        });
      }
      let resp;
      try {
        resp = await this._poll(Math.min(this.concurrency - this._active.size, POLL_MAX_RUNS));
      } catch (e) {
        if (this.stopping) {
          break;
        }
        if (FATAL.has(e.code)) {
          fatal = KeyflowError.from(e);
          this.stop();
          break;
        }
        delays = delays || backoff(100, 5000);
        const delay = delays.next().value;
        process.emitWarning(`keyflow worker: poll failed (${e.details || e.message}); ` +
          `retrying in ${Math.round(delay)} ms`);
        await Promise.race([sleep(delay), new Promise((resolve) => this._slotWaiters.push(resolve))]);
        continue;
      }
      delays = null;
      for (const run of resp.runs) {
        const ctx = new RunContext(this, protos.toNative('keyflow.v1.Run', run));
        this._active.set(ctx.runId, ctx);
        this._scheduleHeartbeat(ctx, this.heartbeatMs);
        this._execute(ctx);
      }
    }
    await this._shutdown();
    if (fatal) {
      throw fatal;
    }
  }

  async _shutdown() {
    if (this._active.size > 0) {
      const idle = new Promise((resolve) => this._idleWaiters.push(resolve));
      let timer;
      await Promise.race([idle, new Promise((resolve) => {
        timer = setTimeout(resolve, this.graceMs);
      })]);
      clearTimeout(timer);
    }
    const held = [...this._active.values()].filter((ctx) => !ctx.leaseLost);
    await Promise.all(held.map(async (ctx) => {
      ctx.released = true;
      clearTimeout(ctx._timer);
      try {
        await this.client.heartbeatRun(ctx.runId, ctx.lease, LEASE_MS_MIN);
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
      await this.client.heartbeatRun(ctx.runId, ctx.lease, this.leaseMs);
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
      }
      outcome = await this._complete(ctx, resultJson, error);
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
  async _complete(ctx, resultJson, error) {
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
      } else {
        req.resultJson = resultJson;
      }
      try {
        await c._unary(c._runs, 'CompleteRun', req);
        return error === null ? 'completed' : 'failed';
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

module.exports = { Worker, RunContext };
