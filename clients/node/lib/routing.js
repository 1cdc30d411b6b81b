'use strict';
// A client of a data set served by several keyflowd processes
// (docs/scaling.md): new kf.Client({ addr: ['host-a:50051', 'host-b:50051'] })
// (or KEYFLOW_ADDR="host-a:50051,host-b:50051") makes a RoutingClient. The
// design is the Python SDK's (keyflow/routing.py):
//
// It asks every endpoint once for its placement (keyflow.v1.Partitions/
// GetPlacement: the partition count, which partitions it serves, how each
// RPC routes), then sends each call where its route says:
//   * a call about one key (a coordinator's workflow and key, a run ID, a
//     function key) to the endpoint serving that key's partition
//     (lib/partitions.js); a refusal naming another owner
//     (FAILED_PRECONDITION with keyflow-partition) asks the endpoints again
//     and retries once;
//   * every call about a SINGLE function (the default placement: every key
//     in the function's home partition, partitions.homeOfFunction) to the
//     endpoint serving its home, as it is: a batch whole (one atomic step),
//     output paged by afterSeq (one sequence), its description that
//     endpoint's. The placement comes with the descriptor, from the home
//     endpoint, once per function;
//   * for a SPLIT function, a batch split by the partitions of its rows'
//     keys, one batch per endpoint, each with the call's producer and
//     sequence (a watermark goes to every endpoint); output read behind one
//     cursor holding a position per partition; its description combined;
//   * registration and deletion to every endpoint; runs listed endpoint
//     after endpoint;
//   * a poll asks the endpoints in turn without waiting, then waits on all
//     of them at once; runs a second endpoint leased in the same instant
//     beyond maxRuns are released at once (no attempt counted).
// A kf.Worker given a RoutingClient polls every endpoint.
const grpc = require('@grpc/grpc-js');
const { Client, KeyflowError } = require('./client');
const partitions = require('./partitions');
const protos = require('./protos');
const rows = require('./rows');

function splitAddrs(addr) {
  const list = Array.isArray(addr) ? addr : String(addr || '').split(',');
  return list.map((a) => String(a).trim()).filter(Boolean);
}

function fieldAt(request, path) {
  let v = request;
  for (const name of path.split('.')) {
    v = v === null || v === undefined ? undefined : v[protos.camel(name)];
  }
  return v === undefined || v === null ? '' : String(v);
}

// An output cursor ("o1.<P>.<last>.<p>-<seq>...") as {last, pos: Map}.
function parseCursor(text, count) {
  const pos = new Map();
  if (!text) {
    return { last: 0, pos };
  }
  const parts = text.split('.');
  if (parts.length < 3 || parts[0] !== 'o1' || Number(parts[1]) !== count) {
    throw new TypeError(`cursor: ${JSON.stringify(text)} is not a cursor of a data set of ` +
      `${count} partitions`);
  }
  for (const item of parts.slice(3)) {
    const [p, seq] = item.split('-');
    pos.set(Number(p), BigInt(seq));
  }
  return { last: Number(parts[2]), pos };
}

function formatCursor(count, last, pos) {
  const items = [...pos.entries()].filter(([, s]) => s > 0n).sort((a, b) => a[0] - b[0]);
  return `o1.${count}.${last}` + items.map(([p, s]) => `.${p}-${s}`).join('');
}

// Per partition the furthest position any cursor holds.
function mergeCursors(count, ...cursors) {
  let last = 0;
  const pos = new Map();
  for (const c of cursors.filter(Boolean)) {
    const parsed = parseCursor(c, count);
    last = parsed.last;
    for (const [p, s] of parsed.pos) {
      if (!pos.has(p) || pos.get(p) < s) {
        pos.set(p, s);
      }
    }
  }
  return formatCursor(count, last, pos);
}

// One SPLIT function as several partitions (endpoints) describe it.
function combineInfos(infos) {
  const out = { ...infos[0] };
  for (const k of ['keys', 'timers', 'stateBytes', 'outputSeq', 'dueTimers']) {
    out[k] = infos.reduce((sum, i) => sum + (i[k] || 0), 0);
  }
  out.partitions = infos.flatMap((i) => i.partitions || [])
    .sort((a, b) => a.partition - b.partition);
  out.watermarkUs = Math.min(...infos.map((i) => i.watermarkUs || 0));
  out.available = infos.every((i) => i.available);
  for (const i of infos) {
    if (i.descriptorSha256 !== out.descriptorSha256) {
      throw new KeyflowError(grpc.status.INTERNAL,
        `function ${out.descriptor.functionId}: the endpoints hold different descriptors`);
    }
    if (!i.available) {
      out.unavailableReason = i.unavailableReason;
    }
  }
  return out;
}

const STUBS = { Coordinators: '_coord', Runs: '_runs', Functions: '_fns' };

class RoutingClient extends Client {
  constructor(options = {}) {
    const addrs = splitAddrs(options.addr !== undefined && options.addr !== null ? options.addr
      : process.env.KEYFLOW_ADDR);
    if (addrs.length === 0) {
      throw new TypeError('addr: no endpoint given');
    }
    // This object's own stubs are never called (every call goes to an
    // endpoint's Client), so its channel never connects.
    super({ ...options, addr: addrs[0] });
    this.addrs = addrs;
    this.addr = addrs.join(',');
    this._clients = addrs.map((addr) => new Client({ ...options, addr }));
    this._count = null;
    this._owner = new Map(); // partition -> endpoint index
    this._routes = new Map(); // RPC path -> {kind, fields, plan}
    this._placements = new Map(); // functionId -> 'single' | 'split', with _descriptors
    this._rotation = 0;
  }

  close() {
    super.close();
    for (const c of this._clients) {
      c.close();
    }
  }

  // One single-endpoint Client per endpoint (a Worker polls each).
  endpointClients() {
    return [...this._clients];
  }

  // --- placement ----------------------------------------------------------

  // Asks every endpoint for its placement; endpoints that do not answer keep
  // what an earlier answer said.
  async _discover() {
    let count = this._count;
    const owner = new Map(this._owner);
    let routes = this._routes;
    const problems = [];
    const answers = await Promise.all(this._clients.map((c) => c.placement().catch((e) => e)));
    answers.forEach((p, i) => {
      if (p instanceof Error) {
        problems.push(`${this._clients[i].addr}: ${p.codeName || p.message}`);
        return;
      }
      if (count !== null && count !== p.partitionCount) {
        throw new TypeError(`endpoints: ${this._clients[i].addr} serves a data set of ` +
          `${p.partitionCount} partitions, another one of ${count}`);
      }
      count = p.partitionCount;
      if (p.routes.length) {
        routes = new Map(p.routes.map((r) => [r.method, r]));
      }
      for (const h of p.partitions) {
        const other = owner.get(h.partition);
        if (other !== undefined && other !== i) {
          throw new TypeError(`endpoints: partition ${h.partition} is served by both ` +
            `${this.addrs[other]} and ${this._clients[i].addr} (two copies of it: docs/scaling.md)`);
        }
        owner.set(h.partition, i);
      }
    });
    if (count === null) {
      throw new KeyflowError(grpc.status.UNAVAILABLE,
        `no endpoint told its placement: ${problems.join('; ')}`);
    }
    this._count = count;
    this._owner = owner;
    this._routes = routes;
  }

  async partitionCount() {
    if (this._count === null) {
      await this._discover();
    }
    return this._count;
  }

  async _clientOf(partition) {
    await this.partitionCount();
    if (!this._owner.has(partition)) {
      await this._discover(); // a partition no endpoint named: ask again
    }
    return this._clients[this._owner.get(partition) || 0]; // its refusal names the owner
  }

  // The endpoints that serve at least one partition.
  async _servedClients() {
    await this.partitionCount();
    const served = [...new Set(this._owner.values())].sort((a, b) => a - b);
    return served.length ? served.map((i) => this._clients[i]) : this._clients;
  }

  async _partitionOf(route, request) {
    const count = this._count;
    switch (route.kind) {
      case 'by_coordinator':
        return partitions.ofCoordinator(fieldAt(request, route.fields[0]),
          fieldAt(request, route.fields[1]), count);
      case 'by_run_id': {
        const p = partitions.ofRunId(fieldAt(request, route.fields[0]), count);
        return p >= 0 ? p : null;
      }
      case 'by_function_key': {
        const functionId = fieldAt(request, route.fields[0]);
        if (await this._single(functionId)) {
          return partitions.homeOfFunction(functionId, count);
        }
        const d = await this._descriptor(functionId);
        const key = fieldAt(request, route.fields[1]);
        return partitions.ofKey(d.keyColumns.length === 1 ? [key] : JSON.parse(key), count);
      }
      default:
        return null;
    }
  }

  // Every unary call of Client's methods comes here: routed by its key.
  async _unary(stub, method, request, timeoutMs) {
    const service = Object.keys(STUBS).find((s) => this[STUBS[s]] === stub);
    await this.partitionCount();
    const route = this._routes.get(`/keyflow.v1.${service}/${method}`);
    for (let attempt = 1; ; attempt++) {
      const p = route ? await this._partitionOf(route, request) : null;
      const target = p === null ? this._clients[0] : await this._clientOf(p);
      try {
        return await target._unary(target[STUBS[service]], method, request, timeoutMs);
      } catch (e) {
        if (attempt === 1 && e.partition !== undefined) {
          await this._discover(); // the partition moved: ask again, once
          this._forget(request.functionId);
          continue;
        }
        throw e;
      }
    }
  }

  // --- a function's placement ---------------------------------------------

  // Drops what is known of a function (deleted, or registered again with
  // another placement).
  _forget(functionId) {
    if (functionId) {
      this._descriptors.delete(functionId);
      this._placements.delete(functionId);
    }
  }

  async _homeClient(functionId) {
    return this._clientOf(partitions.homeOfFunction(functionId, await this.partitionCount()));
  }

  // GetFunction of the endpoint serving the function's home (which answers
  // for a SINGLE function and a SPLIT one alike); a refusal naming another
  // owner asks the endpoints again, once. Remembers the descriptor and the
  // placement. Resolves to {info, client}.
  async _homeInfo(functionId) {
    for (let attempt = 1; ; attempt++) {
      const c = await this._homeClient(functionId);
      let info;
      try {
        info = await Client.prototype.getFunction.call(c, functionId);
      } catch (e) {
        if (attempt === 1 && e.partition !== undefined) {
          await this._discover();
          continue;
        }
        throw e;
      }
      // In force: single or split. 'unspecified' comes from a keyflowd from
      // before placement, whose functions are all split.
      this._descriptors.set(functionId, info.descriptor);
      this._placements.set(functionId, info.placement === 'single' ? 'single' : 'split');
      return { info, client: c };
    }
  }

  async _descriptor(functionId) {
    return this._descriptors.get(functionId) || (await this._homeInfo(functionId)).info.descriptor;
  }

  // Whether the function is SINGLE (asked once, of its home's endpoint).
  async _single(functionId) {
    if (!this._placements.has(functionId)) {
      await this._homeInfo(functionId);
    }
    return this._placements.get(functionId) === 'single';
  }

  // One function as the endpoints `clients` describe it (`infos`, in the
  // same order): a SINGLE function's is its home's endpoint's, a SPLIT one's
  // combined.
  async _oneInfo(functionId, infos, clients) {
    if (infos.some((i) => i.placement === 'single')) {
      const home = await this._homeClient(functionId);
      const at = clients.indexOf(home);
      if (at >= 0) {
        return infos[at];
      }
    }
    return combineInfos(infos);
  }

  // The events split by their coordinators' endpoints, one SendEvents call
  // each; the answers in the events' order. Each endpoint's events are
  // durable in one write of their own.
  async sendEvents(events) {
    const count = await this.partitionCount();
    const groups = new Map(); // Client -> positions
    for (let i = 0; i < events.length; i++) {
      const ev = events[i] || {};
      const c = await this._clientOf(partitions.ofCoordinator(ev.workflow || '', ev.key || '',
        count));
      groups.set(c, [...(groups.get(c) || []), i]);
    }
    const out = new Array(events.length);
    await Promise.all([...groups].map(async ([c, positions]) => {
      const answers = await c.sendEvents(positions.map((i) => events[i]));
      positions.forEach((i, k) => {
        out[i] = answers[k];
      });
    }));
    return out;
  }

  async _each(fn) {
    return Promise.all((await this._servedClients()).map(fn));
  }

  // --- functions ------------------------------------------------------------

  async registerFunction(descriptor) {
    const clients = await this._servedClients();
    const answers = await Promise.all(clients.map((c) => c.registerFunction(descriptor)));
    const functionId = answers[0].function.descriptor.functionId;
    this._forget(functionId); // registered again: maybe with another placement
    return {
      ...answers[0],
      alreadyRegistered: answers.every((a) => a.alreadyRegistered),
      function: await this._oneInfo(functionId, answers.map((a) => a.function), clients),
    };
  }

  async getFunction(functionId) {
    const { info, client: home } = await this._homeInfo(functionId);
    if (info.placement === 'single') {
      return info;
    }
    return combineInfos(await this._each((c) => (c === home ? info : c.getFunction(functionId))));
  }

  async* listFunctions({ pageSize = 0 } = {}) {
    const byId = new Map();
    for (const c of await this._servedClients()) {
      for await (const fn of c.listFunctions({ pageSize })) {
        const id = fn.descriptor.functionId;
        byId.set(id, [...(byId.get(id) || []), [c, fn]]);
      }
    }
    for (const [id, seen] of byId) {
      yield await this._oneInfo(id, seen.map(([, fn]) => fn), seen.map(([c]) => c));
    }
  }

  async deleteFunction(functionId, { allowMissing = false } = {}) {
    this._forget(functionId);
    const answers = await this._each((c) => c.deleteFunction(functionId, { allowMissing: true }));
    const out = { ...answers[0], deleted: answers.some((a) => a.deleted) };
    for (const k of ['keys', 'timers', 'outputRows', 'producers']) {
      out[k] = answers.reduce((sum, a) => sum + (a[k] || 0), 0);
    }
    if (!out.deleted && !allowMissing) {
      throw new KeyflowError(grpc.status.NOT_FOUND, `function ${functionId}: no such function`);
    }
    return out;
  }

  async deleteProducer(functionId, producerId, { allowMissing = false } = {}) {
    const answers = await this._each((c) => c.deleteProducer(functionId, producerId,
      { allowMissing: true }));
    const out = {
      ...answers[0],
      deleted: answers.some((a) => a.deleted),
      lastSequence: answers.map((a) => a.lastSequence || 0).reduce((a, b) => (b > a ? b : a)),
    };
    if (!out.deleted && !allowMissing) {
      throw new KeyflowError(grpc.status.NOT_FOUND, `producer ${producerId}: no such producer`);
    }
    return out;
  }

  async pushBatch(functionId, producerId, sequence, { rows: rowList, columns, batch: rowBatch,
    watermarkUs, attempts } = {}) {
    const count = await this.partitionCount();
    if (!rowBatch) {
      rowBatch = await this.makeBatch(functionId, { rows: rowList, columns });
    }
    if (await this._single(functionId)) {
      // Every key is in the home partition: the batch goes there whole, one
      // atomic step, its ack as the home's process answers.
      return (await this._homeClient(functionId)).pushBatch(functionId, producerId, sequence,
        { batch: rowBatch, watermarkUs, attempts });
    }
    const d = await this._descriptor(functionId);
    const names = d.inputSchema.fields.map((f) => f.name);
    const keyCols = d.keyColumns.map((k) => rowBatch.columns[names.indexOf(k)]);
    const byClient = new Map(); // Client -> row indexes
    for (let row = 0; row < Number(rowBatch.rowCount); row++) {
      const key = keyCols.map((col) => col.strings.values[row]);
      const c = await this._clientOf(partitions.ofKey(key, count));
      byClient.set(c, [...(byClient.get(c) || []), row]);
    }
    if (watermarkUs !== undefined && watermarkUs !== null) {
      for (const c of await this._servedClients()) {
        if (!byClient.has(c)) {
          byClient.set(c, []);
        }
      }
    }
    const acks = await Promise.all([...byClient].map(([c, which]) => c.pushBatch(functionId,
      producerId, sequence, { batch: rows.sliceBatch(rowBatch, which), watermarkUs, attempts })));
    if (acks.length === 1) {
      return acks[0];
    }
    const out = { ...acks[0] };
    for (const k of ['rowsAccepted', 'activations', 'timerCallbacks', 'handlerCalls', 'dueTimers']) {
      out[k] = acks.reduce((sum, a) => sum + (a[k] || 0), 0);
    }
    out.duplicate = acks.every((a) => a.duplicate);
    out.watermarkUs = Math.min(...acks.map((a) => a.watermarkUs || 0));
    out.outputRanges = acks.flatMap((a) => a.outputRanges || []);
    const one = out.outputRanges.length === 1;
    out.firstOutputSeq = one ? out.outputRanges[0].firstSeq : 0;
    out.lastOutputSeq = one ? out.outputRanges[0].lastSeq : 0;
    return out;
  }

  // A SINGLE function's: one page of its one output sequence after afterSeq,
  // from its home's endpoint (Client.readOutput). A SPLIT function's: one
  // page of one partition's output after `cursor`; nextCursor goes on from
  // every endpoint's position.
  async readOutput(functionId, { afterSeq = 0, limit = 0, waitMs = 0, cursor = '' } = {}) {
    if (await this._single(functionId)) {
      return (await this._homeClient(functionId)).readOutput(functionId,
        { afterSeq, limit, waitMs, cursor });
    }
    const clients = await this._servedClients();
    if (clients.length === 1) {
      return clients[0].readOutput(functionId, { afterSeq, limit, waitMs, cursor });
    }
    const count = this._count;
    const { last } = parseCursor(cursor, count);
    const start = (clients.indexOf(await this._clientOf(last)) + 1) % clients.length;
    for (let k = 0; k < clients.length; k++) {
      const c = clients[(start + k) % clients.length];
      const page = await c.readOutput(functionId, { limit, cursor });
      cursor = mergeCursors(count, cursor, page.nextCursor);
      if (page.rows.length) {
        return { ...page, nextCursor: cursor };
      }
    }
    if (waitMs > 0) {
      // Every endpoint long-polls; the first page with rows answers (reads
      // take nothing: the others' rows stay unread).
      const page = await new Promise((resolve, reject) => {
        let left = clients.length;
        for (const c of clients) {
          c.readOutput(functionId, { limit, waitMs, cursor }).then((p) => {
            if (p.rows.length) {
              resolve(p);
            } else if (--left === 0) {
              resolve(null);
            }
          }, reject);
        }
      });
      if (page) {
        return { ...page, nextCursor: mergeCursors(count, cursor, page.nextCursor) };
      }
    }
    return {
      rows: [], firstSeq: 0, lastSeq: 0, nextAfterSeq: 0, highWaterSeq: 0, firstRetainedSeq: 0,
      partition: 0, nextCursor: cursor,
    };
  }

  async trimOutput(functionId, beforeSeq = 0, { beforeCursor = '' } = {}) {
    if (await this._single(functionId)) {
      return (await this._homeClient(functionId)).trimOutput(functionId, beforeSeq,
        { beforeCursor });
    }
    const answers = await this._each((c) => c.trimOutput(functionId, beforeSeq, { beforeCursor }));
    return answers.length === 1 ? answers[0] : { firstRetainedSeq: 0, outputSeq: 0 };
  }

  // A SINGLE function's: its home endpoint's TailOutput stream after
  // afterSeq. A SPLIT function's: rows as they come, from every endpoint,
  // until the iteration stops or cancel() (a loop of readOutput long polls
  // after `cursor`).
  tailOutput(functionId, { afterSeq = 0, cursor = '', maxRowsPerMessage = 0 } = {}) {
    const client = this;
    return {
      cursor,
      _cancelled: false,
      _stream: null,
      cancel() {
        this._cancelled = true;
        if (this._stream) {
          this._stream.cancel();
        }
      },
      async* [Symbol.asyncIterator]() {
        if (await client._single(functionId)) {
          this._stream = (await client._homeClient(functionId)).tailOutput(functionId,
            { afterSeq, maxRowsPerMessage, cursor });
          if (this._cancelled) {
            this._stream.cancel();
          }
          yield* this._stream;
          return;
        }
        while (!this._cancelled) {
          const page = await client.readOutput(functionId,
            { limit: maxRowsPerMessage, waitMs: 10000, cursor: this.cursor });
          this.cursor = page.nextCursor;
          yield* page.rows;
        }
      },
    };
  }

  // --- runs -------------------------------------------------------------------

  async* listRuns(options = {}) {
    for (const c of await this._servedClients()) {
      yield* c.listRuns(options);
    }
  }

  async pollRuns({ workflows = [], workerId = '', leaseMs = 0, maxRuns = 1, waitMs = 0 } = {}) {
    const clients = await this._servedClients();
    const start = this._rotation++ % clients.length;
    const got = [];
    for (let k = 0; k < clients.length && got.length < maxRuns; k++) {
      const c = clients[(start + k) % clients.length];
      got.push(...await c.pollRuns({ workflows, workerId, leaseMs, maxRuns: maxRuns - got.length }));
    }
    if (got.length || waitMs <= 0) {
      return got;
    }
    // Wait on every endpoint; the first with runs answers, the others'
    // polls are cancelled, and runs they leased meanwhile go back.
    const req = { workflows, workerId, leaseMs, maxRuns, waitMs };
    const results = new Array(clients.length).fill(null);
    let first;
    const firstWithRuns = new Promise((resolve) => {
      first = resolve;
    });
    const calls = clients.map((c, i) => new Promise((done) => {
      const call = c._runs.PollRuns(req, c.metadata,
        { deadline: Date.now() + c.timeoutMs + waitMs }, (err, resp) => {
          results[i] = err ? KeyflowError.from(err) : resp.runs;
          if (!err && resp.runs.length) {
            first();
          }
          done();
        });
      firstWithRuns.then(() => call.cancel());
    }));
    await Promise.race([firstWithRuns, Promise.all(calls)]);
    first();
    await Promise.all(calls); // a poll that leased runs as it was cancelled says so
    let error = null;
    await Promise.all(results.map(async (r, i) => {
      if (r instanceof Error) {
        error = error || (r.code !== grpc.status.CANCELLED ? r : null);
        return;
      }
      for (const run of (r || []).map((x) => protos.toNative('keyflow.v1.Run', x))) {
        if (got.length < maxRuns) {
          got.push(run);
        } else {
          await clients[i].releaseRun(run.runId, run.lease);
        }
      }
    }));
    if (!got.length && error) {
      throw error;
    }
    return got;
  }
}

module.exports = { RoutingClient, splitAddrs, parseCursor, mergeCursors };
