'use strict';
// Remote process-function handlers: a REMOTE function's handler, written in
// JavaScript and served to keyflowd over the Workers stream.
//
//   const kf = require('keyflow');
//   function runningSum(act) {                // once per activation
//     const total = (act.state ?? 0) + act.get('amount');
//     act.setState(total);
//     act.emit({ key: act.keyText, ts: act.eventTimeUs, sum: total });
//   }
//   const worker = new kf.FunctionWorker({ functionId: 'sums', handler: runningSum,
//                                          sources: [__filename] });
//   await client.registerFunction(kf.remoteDescriptor(base, worker.digest));
//   await worker.run();                       // until SIGTERM / SIGINT / stop()
//
// What a handler sees is what a native handler sees (api/keyflow/handler.h):
// one call carries up to max_batch_rows activations, at most one per key,
// each with the key's state before it; the handler answers each with output
// rows, at most one state mutation and ordered timer operations. keyflowd
// validates the whole call's answer exactly as a native handler's and
// applies all of it or, with an error, none of it.
//
// The implementation digest is the SHA-256 of the bytes of the handler's
// source files concatenated in the order given (`cat FILES | sha256sum`);
// JavaScript cannot tell which file defines a function, so `sources` (or
// `digest`) is required.
//
// Messages are decoded and encoded with protobufjs directly (not through
// grpc-js's object conversion): int64 values become numbers when they are
// safe integers and BigInts otherwise, and nothing per row goes through a
// string.
const crypto = require('crypto');
const fs = require('fs');
const os = require('os');
const grpc = require('@grpc/grpc-js');
const protos = require('./protos');
const { Client, KeyflowError, backoff, sleep } = require('./client');

const CONCURRENCY_MAX = 64; // the server's bound on a worker's calls out
const ERROR_BYTES_MAX = 300; // keyflowd keeps this much of a handler's refusal
const SERVE_PATH = '/keyflow.v1.Workers/Serve';
// Refusals retrying cannot fix: run() rejects with them. NOT_FOUND (the
// function is not registered yet) and the transport's errors are retried.
const FATAL = new Set([grpc.status.FAILED_PRECONDITION, grpc.status.INVALID_ARGUMENT,
  grpc.status.PERMISSION_DENIED, grpc.status.UNAUTHENTICATED, grpc.status.UNIMPLEMENTED]);
const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;

// Enum numbers of workers.proto / functions.proto.
const ROW = 1;
const TIMER = 2;
const STATE_NAMES = { 1: 'absent', 2: 'null', 3: 'value' };
const STATE_VALUE = 3;
const MUT = { UNCHANGED: 0, SET: 1, SET_NULL: 2, CLEAR: 3 };
const TIMER_SET = 1;
const TIMER_CANCEL = 2;
const SLOTS = {
  1: { slot: 'bools', placeholder: false, js: 'boolean' }, // BOOL
  2: { slot: 'int64s', placeholder: 0 }, // INT64
  3: { slot: 'float64s', placeholder: 0, js: 'number' }, // FLOAT64
  4: { slot: 'strings', placeholder: '', js: 'string' }, // UTF8
  5: { slot: 'bytes_values', placeholder: Buffer.alloc(0), js: 'Uint8Array' }, // BYTES
  6: { slot: 'int64s', placeholder: 0 }, // TIMESTAMP_US
};

let types = null;
function messageTypes() {
  if (!types) {
    const root = protos.load().reflection;
    types = {
      server: root.lookupType('keyflow.v1.ServerMessage'),
      worker: root.lookupType('keyflow.v1.WorkerMessage'),
    };
  }
  return types;
}

// A protobufjs Long (or number) as a number when safe, else a BigInt.
function int64(v) {
  if (typeof v === 'number') {
    return v;
  }
  if (v.high === 0 || (v.high === -1 && v.low < 0)) {
    return v.toNumber(); // within 32 bits
  }
  const n = v.toNumber();
  return Number.isSafeInteger(n) ? n : BigInt(v.toString());
}

function int64List(list) {
  const out = new Array(list.length);
  for (let i = 0; i < list.length; i++) {
    out[i] = int64(list[i]);
  }
  return out;
}

// An int64 for protobufjs: a number when safe, else its decimal text.
function wireInt64(v, where) {
  if (typeof v === 'number') {
    if (!Number.isSafeInteger(v)) {
      throw new HandlerError(`${where}: ${v} is not a safe integer (use a BigInt)`);
    }
    return v;
  }
  if (typeof v === 'bigint') {
    if (v < INT64_MIN || v > INT64_MAX) {
      throw new HandlerError(`${where}: ${v} is outside int64`);
    }
    return v.toString();
  }
  throw new HandlerError(`${where}: expected an integer, got ${typeof v}`);
}

function implementationDigest(...paths) {
  if (paths.length === 0) {
    throw new TypeError('implementationDigest: name at least one source file');
  }
  const h = crypto.createHash('sha256');
  for (const p of paths) {
    h.update(fs.readFileSync(p));
  }
  return h.digest('hex');
}

// A copy of a descriptor (an object in proto3 JSON form, or a path to one)
// as a REMOTE function with this implementation digest.
function remoteDescriptor(descriptor, digest, { callTimeoutMs, placement } = {}) {
  let d = JSON.parse(JSON.stringify(typeof descriptor === 'string'
    ? JSON.parse(fs.readFileSync(descriptor, 'utf8')) : descriptor));
  delete d.implementation_digest;
  d.implementationDigest = digest;
  d.runtime = 'RUNTIME_REMOTE';
  if (callTimeoutMs !== undefined) {
    d.limits = { ...(d.limits || {}), callTimeoutMs };
  }
  if (placement !== undefined && placement !== null) {
    d = withPlacement(d, placement);
  }
  return d;
}

// A copy of a descriptor (an object in proto3 JSON form or a path to one)
// with its placement (docs/scaling.md, "Placement"): 'single' (every key in
// the function's home partition: one atomic step per batch, one output
// sequence, limits for the whole function; what a descriptor without one
// gets) or 'split' (keys spread over the partitions, for a function that
// needs more than one core).
function withPlacement(descriptor, placement) {
  let name = protos.enumValue('keyflow.v1.FunctionPlacement', placement, 'placement');
  if (typeof name === 'number') {
    name = { 1: 'PLACEMENT_SINGLE', 2: 'PLACEMENT_SPLIT' }[name];
  }
  if (name !== 'PLACEMENT_SINGLE' && name !== 'PLACEMENT_SPLIT') {
    throw new TypeError(`placement: unknown value ${JSON.stringify(placement)} (one of single, ` +
      'split)');
  }
  const d = JSON.parse(JSON.stringify(typeof descriptor === 'string'
    ? JSON.parse(fs.readFileSync(descriptor, 'utf8')) : descriptor));
  delete d.placement;
  d.placement = name;
  return d;
}

// Thrown by act.fail(): the call is refused with this message and nothing of
// it is applied (the batch fails FAILED_PRECONDITION).
class HandlerError extends Error {}

// One HandlerCall being answered: its columns as arrays, and the answer.
class Call {
  constructor(msg, inputNames) {
    this.ids = int64List(msg.activation_ids);
    this.keys = msg.keys;
    this.texts = msg.key_texts;
    this.times = int64List(msg.event_times_us);
    this.callbacks = msg.callbacks;
    this.timerNames = msg.timer_names;
    this.states = msg.states;
    this.stateValues = msg.state_values;
    this.n = this.ids.length;
    this.watermarkUs = msg.watermark_present === 'watermark_us' ? int64(msg.watermark_us) : null;
    this.inputNames = inputNames;
    this.columns = msg.rows ? columnsOf(msg.rows) : [];
    this.byName = new Map(inputNames.map((name, i) => [name, this.columns[i]]));
    this.mutations = null;
    this.values = null;
    this.tActs = [];
    this.tOps = [];
    this.tNames = [];
    this.tAt = [];
    this.outActs = [];
    this.outRows = [];
  }

  mutate(i, kind, value) {
    if (this.mutations === null) {
      this.mutations = new Array(this.n).fill(MUT.UNCHANGED);
      this.values = new Array(this.n).fill(0);
    }
    if (this.mutations[i] !== MUT.UNCHANGED) {
      throw new HandlerError(`activation ${this.ids[i]} already has a state mutation (one per activation)`);
    }
    this.mutations[i] = kind;
    if (kind === MUT.SET) {
      this.values[i] = wireInt64(value, 'setState');
    }
  }
}

// A RowBatch's columns as arrays, null where null; int64 as number or BigInt.
function columnsOf(batch) {
  const n = int64(batch.row_count);
  return batch.columns.map((col) => {
    let values;
    if (col.int64s) {
      values = int64List(col.int64s.values);
    } else if (col.strings) {
      values = col.strings.values;
    } else if (col.bools) {
      values = col.bools.values;
    } else if (col.float64s) {
      values = col.float64s.values;
    } else if (col.bytes_values) {
      values = col.bytes_values.values;
    } else {
      values = new Array(n).fill(null);
    }
    if (col.nulls && col.nulls.length) {
      values = values.map((v, i) => (col.nulls[i] ? null : v));
    }
    return values;
  });
}

// One activation as the handler sees it; the object is reused for the next
// activation of the call: read what you need during the handler call.
class Activation {
  constructor(call) {
    this._call = call;
    this._i = 0;
    this._row = -1;
  }

  get id() { return this._call.ids[this._i]; }
  get key() { return this._call.keys[this._i]; } // canonical bytes (Buffer)
  get keyText() { return this._call.texts[this._i]; }
  get eventTimeUs() { return this._call.times[this._i]; }
  get isTimer() { return this._call.callbacks[this._i] === TIMER; }
  get timerName() { return this._call.timerNames[this._i] || null; }
  get stateKind() { return STATE_NAMES[this._call.states[this._i]] || 'unknown'; }
  get state() {
    const c = this._call;
    return c.states[this._i] === STATE_VALUE ? int64(c.stateValues[this._i]) : null;
  }
  get watermarkUs() { return this._call.watermarkUs; }
  get row() {
    if (this._row < 0) {
      return null;
    }
    const out = {};
    const c = this._call;
    for (let k = 0; k < c.inputNames.length; k++) {
      out[c.inputNames[k]] = c.columns[k][this._row];
    }
    return out;
  }

  // Whether the input schema has a field `name`.
  has(name) {
    return this._call.byName.has(name);
  }

  // One input value of a row activation (undefined for a timer).
  get(name) {
    const col = this._call.byName.get(name);
    if (col === undefined) {
      throw new HandlerError(`'${name}' is not an input field (fields: ${this._call.inputNames.join(', ')})`);
    }
    return this._row < 0 ? undefined : col[this._row];
  }

  // SET the key's value (a number or BigInt), or SET_NULL with null.
  setState(value) {
    this._call.mutate(this._i, value === null || value === undefined ? MUT.SET_NULL : MUT.SET, value);
  }
  setStateNull() { this._call.mutate(this._i, MUT.SET_NULL, null); }
  clearState() { this._call.mutate(this._i, MUT.CLEAR, null); }

  setTimer(name, atUs) {
    const c = this._call;
    const at = wireInt64(atUs, 'setTimer');
    c.tActs.push(this._i);
    c.tOps.push(TIMER_SET);
    c.tNames.push(timerName(name, 'setTimer'));
    c.tAt.push(at);
  }

  cancelTimer(name) {
    const c = this._call;
    timerName(name, 'cancelTimer');
    c.tActs.push(this._i);
    c.tOps.push(TIMER_CANCEL);
    c.tNames.push(name);
    c.tAt.push(0);
  }

  // An output row for this activation, by output field name; fields left
  // out are null.
  emit(row) {
    this._call.outActs.push(this._i);
    this._call.outRows.push(row);
  }

  fail(message) {
    throw new HandlerError(message);
  }
}

// A name protobufjs could not encode would throw when the result is written
// to the stream, outside the handler's call: the worker process would die
// instead of refusing the call.
function timerName(name, where) {
  if (typeof name !== 'string') {
    throw new HandlerError(`${where}: the timer name must be a string, got ${typeof name}`);
  }
  return name;
}

function outputBatch(fields, rows) {
  const known = new Set(fields.map((f) => f.name));
  for (const r of rows) {
    for (const k of Object.keys(r)) {
      if (!known.has(k)) {
        throw new HandlerError(`output row: '${k}' is not an output field (fields: ${[...known].join(', ')})`);
      }
    }
  }
  const columns = fields.map((f) => {
    const spec = SLOTS[f.type];
    const values = new Array(rows.length);
    let nulls = null;
    for (let i = 0; i < rows.length; i++) {
      let v = rows[i][f.name];
      if (v === null || v === undefined) {
        if (nulls === null) {
          nulls = new Array(rows.length).fill(false);
        }
        nulls[i] = true;
        v = spec.placeholder;
      } else if (spec.slot === 'int64s') {
        v = wireInt64(v, `output field ${f.name}`);
      } else if (typeof v !== spec.js && !(spec.js === 'Uint8Array' && v instanceof Uint8Array)) {
        // protobufjs would coerce it ('yes' to true, 'abc' to NaN, 5 to no
        // bytes) and the output would hold what the handler never meant.
        throw new HandlerError(`output field ${f.name}: expected ${spec.js === 'Uint8Array'
          ? 'a Buffer or Uint8Array' : `a ${spec.js}`}, got ${typeof v}`);
      }
      values[i] = v;
    }
    return { nulls: nulls || [], [spec.slot]: { values } };
  });
  return { row_count: rows.length, columns };
}

function truncate(text) {
  const buf = Buffer.from(text, 'utf8');
  return buf.length <= ERROR_BYTES_MAX ? text
    : buf.subarray(0, ERROR_BYTES_MAX).toString('utf8').replace(/\uFFFD$/, '');
}

// The CallResult (a plain object for protobufjs) of handler for one decoded
// HandlerCall of the function `descriptor`. A throw refuses the call with
// "<ErrorName>: <message>" (act.fail: the message).
function answer(handler, descriptor, msg) {
  const call = new Call(msg, descriptor.input_schema.fields.map((f) => f.name));
  const callId = msg.call_id;
  const act = new Activation(call);
  const result = { call_id: callId };
  try {
    let row = 0;
    for (let i = 0; i < call.n; i++) {
      act._i = i;
      act._row = call.callbacks[i] === ROW ? row++ : -1;
      const ret = handler(act);
      if (ret !== null && ret !== undefined && typeof ret.then === 'function') {
        // What it does after its first await would be lost, and a later
        // throw would be an unhandled rejection, which ends the process.
        ret.then(() => {}, () => {});
        throw new HandlerError('the handler returned a Promise: handlers are synchronous ' +
          '(the answer is what they did by the time they return)');
      }
    }
    if (call.outRows.length) {
      result.output = outputBatch(descriptor.output_schema.fields, call.outRows);
      result.output_activations = call.outActs;
    }
  } catch (e) {
    const text = e instanceof HandlerError ? e.message : `${e && e.name ? e.name : 'Error'}: ${e && e.message}`;
    return { call_id: callId, error: truncate(text || 'refused') };
  }
  if (call.mutations !== null) {
    result.mutations = call.mutations;
    result.state_values = call.values;
  }
  if (call.tOps.length) {
    result.timer_activations = call.tActs;
    result.timer_ops = call.tOps;
    result.timer_names = call.tNames;
    result.timer_at_us = call.tAt;
  }
  return result;
}

// Serves one REMOTE function's handler: handler(act) once per activation.
// options: functionId, handler, client (or the Client options), concurrency
// (1..64, default 8), sources (files whose bytes make the digest) or digest,
// name (in keyflowd's logs).
class FunctionWorker {
  constructor(options = {}) {
    const { functionId, handler, concurrency = 8, sources, digest, name } = options;
    if (typeof handler !== 'function') {
      throw new TypeError('handler: not a function');
    }
    if (handler.constructor && handler.constructor.name === 'AsyncFunction') {
      throw new TypeError('handler: an async function; handlers are synchronous (the answer is ' +
        'what they did by the time they return)');
    }
    if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > CONCURRENCY_MAX) {
      throw new TypeError(`concurrency: ${concurrency} is not in 1..${CONCURRENCY_MAX}`);
    }
    if (!digest && !(Array.isArray(sources) && sources.length)) {
      throw new TypeError('sources: name the handler\'s source files (e.g. [__filename]), or give digest');
    }
    const ownsClient = !options.client;
    const client = options.client || new Client(options);
    if (new.target === FunctionWorker && client.endpointClients &&
        client.endpointClients().length > 1) {
      // A client of several endpoints (lib/routing.js): each process calls
      // the handler only for its own partitions' keys, over a stream to it,
      // so the function needs one stream per process.
      return new FunctionWorkers({ ...options, client }, ownsClient);
    }
    this.functionId = functionId;
    this.handler = handler;
    this.concurrency = concurrency;
    this.digest = digest || implementationDigest(...sources);
    this.name = name || `${os.hostname()}-${process.pid}`;
    this._ownsClient = ownsClient;
    this.client = client;
    this._raw = new grpc.Client(this.client.addr, null,
      { channelOverride: this.client._coord.getChannel() });
    this.calls = 0;
    this.activations = 0;
    this.refused = 0;
    this.connects = 0;
    this.descriptor = null;
    this.workerId = null;
    this._stopping = false;
    this._stream = null;
    this._welcomed = null;
    this._welcome = new Promise((resolve) => { this._welcomed = resolve; });
    this._running = null;
  }

  descriptorFor(base, opts) {
    return remoteDescriptor(base, this.digest, opts);
  }

  // Resolves once keyflowd welcomed a stream (calls can come).
  welcomed() {
    return this._welcome;
  }

  // Serves until stop() (or SIGTERM/SIGINT with signals: true); rejects with
  // what stopped it for good.
  run({ signals = true } = {}) {
    if (this._running) {
      return this._running;
    }
    const onSignal = () => this.stop();
    if (signals) {
      process.on('SIGTERM', onSignal);
      process.on('SIGINT', onSignal);
    }
    this._running = this._serve().finally(() => {
      if (signals) {
        process.off('SIGTERM', onSignal);
        process.off('SIGINT', onSignal);
      }
    });
    return this._running;
  }

  // Ends the stream (keyflowd fails the calls still out on it; their batches
  // are retried by their producers) and resolves when serving stopped.
  async stop() {
    this._stopping = true;
    if (this._stream) {
      this._stream.cancel();
    }
    if (this._running) {
      await this._running.catch(() => {});
    }
    if (this._ownsClient) {
      this.client.close();
    }
  }

  async _serve() {
    let delays = backoff(100, 5000);
    while (!this._stopping) {
      let err = null;
      let served = false;
      try {
        served = await this._serveOnce();
      } catch (e) {
        err = e;
      }
      if (this._stopping) {
        break;
      }
      if (err && FATAL.has(err.code)) {
        throw KeyflowError.from(err);
      }
      if (served) {
        delays = backoff(100, 5000); // it served: this is a new outage
      }
      await sleep(delays.next().value);
    }
  }

  // One stream; resolves (true if it was welcomed) when it ends cleanly,
  // rejects with the gRPC error otherwise.
  _serveOnce() {
    const { server, worker } = messageTypes();
    return new Promise((resolve, reject) => {
      let welcomed = false;
      const stream = this._raw.makeBidiStreamRequest(SERVE_PATH, (b) => b, (b) => b,
        this.client.metadata, {});
      this._stream = stream;
      const send = (msg) => stream.write(Buffer.from(worker.encode(msg).finish()));
      send({ hello: { function_id: this.functionId, implementation_digest: this.digest,
        max_concurrent_calls: this.concurrency, worker_name: this.name } });
      stream.on('data', (buf) => {
        const msg = server.decode(buf);
        if (msg.welcome) {
          this.descriptor = msg.welcome.descriptor;
          this.workerId = msg.welcome.worker_id;
          this.connects++;
          welcomed = true;
          this._welcomed();
        } else if (msg.call) {
          const result = answer(this.handler, this.descriptor, msg.call);
          this.calls++;
          this.activations += msg.call.activation_ids.length;
          if (result.error) {
            this.refused++;
          }
          send({ result });
        }
      });
      stream.on('error', (e) => {
        this._stream = null;
        if (e.code === grpc.status.CANCELLED && this._stopping) {
          resolve(welcomed);
        } else {
          e.welcomed = welcomed;
          reject(e);
        }
      });
      stream.on('end', () => {
        this._stream = null;
        resolve(welcomed);
      });
    });
  }
}

// A FunctionWorker per endpoint of a client of several endpoints (what new
// FunctionWorker({ client }) makes for one), run and stopped together; the
// counters are their sums.
class FunctionWorkers {
  constructor(options, ownsClient) {
    this.client = options.client;
    this._ownsClient = ownsClient;
    this.workers = this.client.endpointClients().map((c) =>
      new FunctionWorker({ ...options, client: c }));
    const first = this.workers[0];
    this.functionId = first.functionId;
    this.handler = first.handler;
    this.concurrency = first.concurrency;
    this.digest = first.digest;
    this.name = first.name;
    this._running = null;
  }

  get calls() { return this.workers.reduce((n, w) => n + w.calls, 0); }
  get activations() { return this.workers.reduce((n, w) => n + w.activations, 0); }
  get refused() { return this.workers.reduce((n, w) => n + w.refused, 0); }
  get connects() { return this.workers.reduce((n, w) => n + w.connects, 0); }
  get descriptor() { return this.workers[0].descriptor; }
  get workerId() { return this.workers[0].workerId; }

  descriptorFor(base, opts) {
    return this.workers[0].descriptorFor(base, opts);
  }

  // Resolves once every endpoint welcomed its stream.
  async welcomed() {
    await Promise.all(this.workers.map((w) => w.welcomed()));
  }

  run({ signals = true } = {}) {
    if (this._running) {
      return this._running;
    }
    const onSignal = () => this.stop();
    if (signals) {
      process.on('SIGTERM', onSignal);
      process.on('SIGINT', onSignal);
    }
    this._running = Promise.all(this.workers.map((w) => w.run({ signals: false })))
      .then(() => undefined).finally(() => {
        if (signals) {
          process.off('SIGTERM', onSignal);
          process.off('SIGINT', onSignal);
        }
      });
    return this._running;
  }

  async stop() {
    await Promise.all(this.workers.map((w) => w.stop()));
    if (this._ownsClient) {
      this.client.close();
    }
  }
}

module.exports = {
  FunctionWorker, FunctionWorkers, Activation, HandlerError, implementationDigest, remoteDescriptor,
  withPlacement, answer,
};
