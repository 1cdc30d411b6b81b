'use strict';
// keyflow.Client: every keyflowd operation as an async method taking and
// returning native values (lib/protos.js says how responses look).
//
// One Client is one channel, shared by every call; methods reject with a
// KeyflowError for a refused call and throw a TypeError for an argument the
// SDK can tell is wrong before sending it.
const fs = require('fs');
const crypto = require('crypto');
const grpc = require('@grpc/grpc-js');
const protos = require('./protos');
const rows = require('./rows');

const DEFAULT_ADDR = '127.0.0.1:50051';
const DEFAULT_TIMEOUT_MS = 30000;
// The server's largest message is about 20 MiB: never trip grpc-js's 4 MiB.
const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
// Reconnect soon after a keyflowd restart (gRPC's default grows to 2 min).
const RECONNECT_BACKOFF_MIN_MS = 100;
const RECONNECT_BACKOFF_MAX_MS = 2000;
// Retries of one PushBatch sequence: about 10 s of backoff in all.
const PUSH_ATTEMPTS = 10;
const RETRYABLE = new Set([grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED]);
const RULE_FIELDS = ['windowMs', 'maxWaitMs', 'maxEvents', 'dedupMs', 'edge', 'maxBytes',
  'keyConcurrency', 'retry', 'startAfterMs'];
const EVENT_FIELDS = ['workflow', 'key', 'input', 'rule', 'id', 'flush'];
const RETRY_FIELDS = ['maxAttempts', 'initialBackoffMs', 'maxBackoffMs', 'multiplier'];
// The run statuses after which nothing changes (waitRun resolves on them).
const FINISHED = new Set(['completed', 'failed', 'cancelled']);
const GET_RUN_WAIT_MS_MAX = 60000; // the server's bound on one GetRun wait

class KeyflowError extends Error {
  // code: the gRPC status number; codeName: "INVALID_ARGUMENT"; message: the
  // server's text naming the field and the limit.
  constructor(code, message) {
    const codeName = Object.keys(grpc.status).find((k) => grpc.status[k] === code) || 'UNKNOWN';
    super(`${codeName}: ${message}`);
    this.name = 'KeyflowError';
    this.code = code;
    this.codeName = codeName;
    this.details = message;
  }

  static from(err) {
    const out = new KeyflowError(err.code, err.details || err.message);
    // A call for a partition another process serves (docs/scaling.md):
    // which partition, and its owner when the server's placement knows it.
    const meta = err.metadata && typeof err.metadata.get === 'function' ? err.metadata : null;
    if (meta && meta.get('keyflow-partition').length) {
      out.partition = Number(meta.get('keyflow-partition')[0]);
      out.owner = {
        node: String(meta.get('keyflow-owner-node')[0] || ''),
        grpc: String(meta.get('keyflow-owner-grpc')[0] || ''),
        http: String(meta.get('keyflow-owner-http')[0] || ''),
      };
    }
    return out;
  }
}

// Run options (both kinds): keyConcurrency, retry (retry({...})), startAfterMs.
// edge (debounce): 'trailing' (default), 'leading' or 'both'; maxBytes
// (batch): bytes of the run's input array, at most 4 MiB.
function debounce(windowMs, { maxWaitMs, dedupMs, edge, keyConcurrency, retry, startAfterMs } = {}) {
  return { kind: 'debounce', windowMs, maxWaitMs, dedupMs, edge, keyConcurrency, retry, startAfterMs };
}

function batch({ maxEvents, maxWaitMs, dedupMs, maxBytes, keyConcurrency, retry, startAfterMs } = {}) {
  return { kind: 'batch', maxEvents, maxWaitMs, dedupMs, maxBytes, keyConcurrency, retry, startAfterMs };
}

// A run's retry policy (a rule's `retry`): after a failed attempt (a handler
// that threw RetryableError, or a lost lease) the run waits
// min(initialBackoffMs * multiplier^(attempt-1), maxBackoffMs), until
// maxAttempts attempts were made. Absent fields take the server's defaults.
function retry({ maxAttempts, initialBackoffMs, maxBackoffMs, multiplier } = {}) {
  return { maxAttempts, initialBackoffMs, maxBackoffMs, multiplier };
}

function retryMessage(policy) {
  if (!policy || typeof policy !== 'object') {
    throw new TypeError('rule.retry: expected retry({...}) or an object');
  }
  const out = {};
  for (const k of Object.keys(policy)) {
    if (!RETRY_FIELDS.includes(k)) {
      throw new TypeError(`rule.retry.${k}: unknown field (fields: ${RETRY_FIELDS.join(', ')})`);
    }
    if (policy[k] !== undefined && policy[k] !== null) {
      out[k] = policy[k];
    }
  }
  return out;
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// Endless exponential backoff with jitter: minMs, 2 minMs, ... up to maxMs,
// each scaled by a random factor in [0.5, 1].
function* backoff(minMs = 50, maxMs = 2000) {
  let delay = minMs;
  for (;;) {
    yield delay * (0.5 + Math.random() / 2);
    delay = Math.min(delay * 2, maxMs);
  }
}

function option(value, env) {
  return value !== undefined && value !== null ? value : process.env[env] || undefined;
}

function readPem(file, what) {
  try {
    return fs.readFileSync(file);
  } catch (e) {
    throw new TypeError(`${what}: cannot read ${file}: ${e.message}`);
  }
}

function ruleMessage(rule) {
  if (!rule || typeof rule !== 'object' || !rule.kind) {
    throw new TypeError('rule: expected debounce(...), batch(...) or an object with a kind');
  }
  const out = { kind: protos.enumValue('keyflow.v1.RuleKind', rule.kind, 'rule.kind') };
  for (const k of Object.keys(rule)) {
    if (k !== 'kind' && !RULE_FIELDS.includes(k)) {
      throw new TypeError(`rule.${k}: unknown field (fields: ${RULE_FIELDS.join(', ')})`);
    }
    if (k === 'retry' && rule[k] !== undefined && rule[k] !== null) {
      out[k] = retryMessage(rule[k]);
    } else if (k === 'edge' && rule[k] !== undefined && rule[k] !== null) {
      out[k] = protos.enumValue('keyflow.v1.Edge', rule[k], 'rule.edge');
    } else if (k !== 'kind' && rule[k] !== undefined && rule[k] !== null) {
      out[k] = rule[k]; // a oneof member: present only when given
    }
  }
  return out;
}

function eventRequest(workflow, key, input, rule, id, flush) {
  return {
    workflow, key,
    event: { id: id || '', rule: ruleMessage(rule), inputJson: protos.encodeJson(input, 'input'),
      flush: Boolean(flush) },
  };
}

// A SendEventResponse as one flat object.
function receipt(resp) {
  const { disposition } = protos.toNative('keyflow.v1.SendEventResponse', resp);
  return {
    runId: resp.receipt.runId, dueMs: protos.toInt(resp.receipt.dueMs),
    commitSeq: protos.toInt(resp.receipt.commitSeq), disposition: disposition || 'unspecified',
    duplicate: resp.duplicate, runStarted: resp.runStarted,
  };
}

function coordinatorRef(kind, workflow, key) {
  return { kind: protos.enumValue('keyflow.v1.RuleKind', kind, 'kind'), workflow, key };
}

function int64(v) {
  return typeof v === 'bigint' ? v.toString() : v;
}

class Client {
  // options: addr, tlsCa, tlsCert, tlsKey, tlsServerName, tls (gRPC's default
  // roots), apiKey, apiKeyFile, timeoutMs; each also from KEYFLOW_* (README.md).
  // Several endpoints (an array, or "a:1,b:2" here or in KEYFLOW_ADDR): a data
  // set served by several processes, routed by key (lib/routing.js).
  constructor(options = {}) {
    if (typeof options === 'string' || Array.isArray(options)) {
      options = { addr: options };
    }
    const addr = option(options.addr, 'KEYFLOW_ADDR');
    if (new.target === Client && (Array.isArray(addr) ? addr : String(addr || '').split(','))
      .filter((a) => String(a).trim()).length > 1) {
      const { RoutingClient } = require('./routing');
      return new RoutingClient(options);
    }
    this.addr = option(options.addr, 'KEYFLOW_ADDR') || DEFAULT_ADDR;
    this.timeoutMs = options.timeoutMs || DEFAULT_TIMEOUT_MS;
    const tlsCa = option(options.tlsCa, 'KEYFLOW_TLS_CA');
    const tlsCert = option(options.tlsCert, 'KEYFLOW_TLS_CERT');
    const tlsKey = option(options.tlsKey, 'KEYFLOW_TLS_KEY');
    const serverName = option(options.tlsServerName, 'KEYFLOW_TLS_SERVER_NAME');
    const apiKeyFile = option(options.apiKeyFile, 'KEYFLOW_API_KEY_FILE');
    const apiKey = apiKeyFile ? readPem(apiKeyFile, 'apiKeyFile').toString('utf8').replace(/[\r\n]+$/, '')
      : option(options.apiKey, 'KEYFLOW_API_KEY');
    const tlsEnv = process.env.KEYFLOW_TLS;
    const tls = options.tls !== undefined ? options.tls : !!tlsEnv && tlsEnv !== '0';
    if (!tlsCert !== !tlsKey) {
      throw new TypeError('tlsCert and tlsKey: give both for a client certificate, or neither');
    }
    const channelOptions = {
      'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
      'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
      'grpc.initial_reconnect_backoff_ms': RECONNECT_BACKOFF_MIN_MS,
      'grpc.max_reconnect_backoff_ms': RECONNECT_BACKOFF_MAX_MS,
    };
    this.secure = !!(tls || tlsCa || tlsCert);
    let creds = grpc.credentials.createInsecure();
    if (this.secure) {
      creds = grpc.credentials.createSsl(tlsCa ? readPem(tlsCa, 'tlsCa') : null,
        tlsKey ? readPem(tlsKey, 'tlsKey') : null, tlsCert ? readPem(tlsCert, 'tlsCert') : null);
      if (serverName) {
        channelOptions['grpc.ssl_target_name_override'] = serverName;
        channelOptions['grpc.default_authority'] = serverName;
      }
    }
    this.metadata = new grpc.Metadata();
    if (apiKey) {
      this.metadata.set('authorization', `Bearer ${apiKey}`);
    }
    const v1 = grpc.loadPackageDefinition(protos.load().definition).keyflow.v1;
    this._coord = new v1.Coordinators(this.addr, creds, channelOptions);
    const channelOverride = this._coord.getChannel();
    this._runs = new v1.Runs(this.addr, creds, { ...channelOptions, channelOverride });
    this._fns = new v1.Functions(this.addr, creds, { ...channelOptions, channelOverride });
    this._parts = new v1.Partitions(this.addr, creds, { ...channelOptions, channelOverride });
    this._descriptors = new Map();
    this.pushRetries = 0; // PushBatch attempts retried (UNAVAILABLE, DEADLINE_EXCEEDED)
  }

  close() {
    this._coord.close();
  }

  // The raw unary call: resolves with the grpc-js response object.
  _unary(stub, method, request, timeoutMs) {
    return new Promise((resolve, reject) => {
      stub[method](request, this.metadata, { deadline: Date.now() + (timeoutMs || this.timeoutMs) },
        (err, resp) => (err ? reject(KeyflowError.from(err)) : resolve(resp)));
    });
  }

  // keyflow.v1.Partitions/GetPlacement: {partitionCount, hash, node, served,
  // partitions: [{partition, id, ready, reason}], nodes, routes}
  // (docs/scaling.md).
  async placement() {
    return protos.toNative('keyflow.v1.Placement',
      await this._unary(this._parts, 'GetPlacement', {}));
  }

  // --- coordinators -------------------------------------------------------

  // Delivers one event (update-with-start); resolves with the receipt
  // {runId, dueMs, duplicate, runStarted}. input: any JSON value.
  async sendEvent(workflow, key, input, { rule, id, flush } = {}) {
    const req = eventRequest(workflow, key, input, rule, id, flush);
    return receipt(await this._unary(this._coord, 'SendEvent', req));
  }

  // Up to 1000 events in one call, durable in one write: each
  // { workflow, key, rule, input?, id?, flush? }. Resolves with one entry per
  // event, in order: its receipt, or the KeyflowError that refused it (not
  // thrown: the other events went on).
  async sendEvents(events) {
    const reqs = events.map((ev, i) => {
      for (const k of Object.keys(ev)) {
        if (!EVENT_FIELDS.includes(k)) {
          throw new TypeError(`events[${i}].${k}: unknown field (fields: ${EVENT_FIELDS.join(', ')})`);
        }
      }
      return eventRequest(ev.workflow || '', ev.key || '', ev.input, ev.rule, ev.id, ev.flush);
    });
    const resp = await this._unary(this._coord, 'SendEvents', { events: reqs });
    return resp.results.map((r) => (r.response ? receipt(r.response)
      : new KeyflowError(r.error.code, r.error.message)));
  }

  async describe(kind, workflow, key) {
    const resp = await this._unary(this._coord, 'DescribeCoordinator',
      { coordinator: coordinatorRef(kind, workflow, key) });
    return protos.toNative('keyflow.v1.DescribeCoordinatorResponse', resp);
  }

  async flush(kind, workflow, key) {
    const resp = await this._unary(this._coord, 'FlushWindow',
      { coordinator: coordinatorRef(kind, workflow, key) });
    return protos.toNative('keyflow.v1.FlushWindowResponse', resp);
  }

  async cancel(kind, workflow, key) {
    const resp = await this._unary(this._coord, 'CancelWindow',
      { coordinator: coordinatorRef(kind, workflow, key) });
    return protos.toNative('keyflow.v1.CancelWindowResponse', resp);
  }

  // --- runs -----------------------------------------------------------------

  // The run (a receipt's run ID works before its window closes: status
  // 'window_open'). With waitMs (at most 60000) waits that long for it to
  // finish (completed, failed or cancelled), then resolves with it as it is.
  async getRun(runId, { waitMs = 0 } = {}) {
    return protos.toNative('keyflow.v1.Run',
      await this._unary(this._runs, 'GetRun', { runId, waitMs }, this.timeoutMs + waitMs));
  }

  // Resolves when the run is completed, failed or cancelled (like Temporal's
  // GetResult): GetRun long polls that ride out a keyflowd restart. With
  // timeoutMs, resolves with the run as it is then (check its status).
  async waitRun(runId, { timeoutMs } = {}) {
    const deadline = timeoutMs === undefined ? null : Date.now() + timeoutMs;
    let delays = null;
    let run = null;
    for (;;) {
      const left = deadline === null ? GET_RUN_WAIT_MS_MAX : deadline - Date.now();
      if (left <= 0 && run !== null) {
        return run;
      }
      try {
        run = await this.getRun(runId, { waitMs: Math.max(0, Math.min(left, GET_RUN_WAIT_MS_MAX)) });
        delays = null;
      } catch (e) {
        if (!RETRYABLE.has(e.code) || (deadline !== null && Date.now() >= deadline)) {
          throw e;
        }
        delays = delays || backoff();
        await sleep(delays.next().value);
        continue;
      }
      if (FINISHED.has(run.status)) {
        return run;
      }
    }
  }

  // Cancels a run: a pending or delayed one at once, a leased one when its
  // worker reports (it sees run.cancelRequested). Resolves with the run.
  async cancelRun(runId) {
    const resp = await this._unary(this._runs, 'CancelRun', { runId });
    return protos.toNative('keyflow.v1.CancelRunResponse', resp).run;
  }

  // Gives a leased run back: pending again at once; the attempt does not count.
  async releaseRun(runId, lease) {
    const resp = await this._unary(this._runs, 'ReleaseRun', { runId, lease });
    return protos.toNative('keyflow.v1.ReleaseRunResponse', resp).run;
  }

  // Every matching run, a page at a time as the iteration goes:
  //   for await (const run of client.listRuns({workflow, key, status})) ...
  async* listRuns({ workflow = '', key = '', status, pageSize = 0 } = {}) {
    const req = {
      workflow, key, pageSize, pageToken: '',
      status: protos.enumValue('keyflow.v1.RunStatus', status, 'status'),
    };
    for (;;) {
      const resp = await this._unary(this._runs, 'ListRuns', req);
      for (const run of resp.runs) {
        yield protos.toNative('keyflow.v1.Run', run);
      }
      if (!resp.nextPageToken) {
        return;
      }
      req.pageToken = resp.nextPageToken;
    }
  }

  // Leases up to maxRuns runs; most code wants Worker instead.
  async pollRuns({ workflows = [], workerId = '', leaseMs = 0, maxRuns = 1, waitMs = 0 } = {}) {
    const resp = await this._unary(this._runs, 'PollRuns',
      { workflows, workerId, leaseMs, maxRuns, waitMs }, this.timeoutMs + waitMs);
    return resp.runs.map((r) => protos.toNative('keyflow.v1.Run', r));
  }

  // Extends a lease; resolves with its new expiry (Unix ms).
  async heartbeatRun(runId, lease, leaseMs = 0) {
    const resp = await this._unary(this._runs, 'HeartbeatRun', { runId, lease, leaseMs });
    return protos.toInt(resp.leaseExpiresMs);
  }

  // Completes a leased run with a JSON result, or fails it with {error};
  // {retryable: true} retries it under its rule's retry policy while
  // attempts remain.
  async completeRun(runId, lease, result, { error, retryable = false } = {}) {
    const req = { runId, lease };
    if (error !== undefined && error !== null) {
      req.error = String(error);
      req.retryable = Boolean(retryable);
    } else {
      req.resultJson = protos.encodeJson(result, 'result');
    }
    return protos.toNative('keyflow.v1.CompleteRunResponse',
      await this._unary(this._runs, 'CompleteRun', req));
  }

  // --- process functions -----------------------------------------------------

  // descriptor: an object in proto3 JSON form (as the build's
  // *.descriptor.json, camelCase, enums by name) or a path to such a file.
  async registerFunction(descriptor) {
    if (typeof descriptor === 'string') {
      descriptor = JSON.parse(fs.readFileSync(descriptor, 'utf8'));
    }
    const wire = camelKeys(descriptor);
    checkKeys(protos.messageType('keyflow.v1.FunctionDescriptor'), wire, 'descriptor');
    const resp = await this._unary(this._fns, 'RegisterFunction', { descriptor: wire });
    return protos.toNative('keyflow.v1.RegisterFunctionResponse', resp);
  }

  async getFunction(functionId) {
    return protos.toNative('keyflow.v1.FunctionInfo',
      await this._unary(this._fns, 'GetFunction', { functionId }));
  }

  async* listFunctions({ pageSize = 0 } = {}) {
    const req = { pageSize, pageToken: '' };
    for (;;) {
      const resp = await this._unary(this._fns, 'ListFunctions', req);
      for (const fn of resp.functions) {
        yield protos.toNative('keyflow.v1.FunctionInfo', fn);
      }
      if (!resp.nextPageToken) {
        return;
      }
      req.pageToken = resp.nextPageToken;
    }
  }

  // The function's descriptor, fetched once: descriptors are immutable.
  async _descriptor(functionId) {
    let d = this._descriptors.get(functionId);
    if (!d) {
      d = (await this.getFunction(functionId)).descriptor;
      this._descriptors.set(functionId, d);
    }
    return d;
  }

  // A columnar RowBatch for the function's input schema from rows (an array
  // of objects) or columns (an object of arrays).
  async makeBatch(functionId, { rows: rowList, columns } = {}) {
    if (!rowList === !columns) {
      throw new TypeError('give rows or columns (exactly one)');
    }
    const schema = (await this._descriptor(functionId)).inputSchema;
    return rowList ? rows.batchFromRows(schema, rowList) : rows.batchFromColumns(schema, columns);
  }

  // PushBatch of one sequence, retried with the same sequence and content on
  // UNAVAILABLE and DEADLINE_EXCEEDED (a retry of a batch the server had
  // accepted answers with the original ack, duplicate: true).
  async pushBatch(functionId, producerId, sequence, { rows: rowList, columns, batch: rowBatch,
    watermarkUs, attempts = PUSH_ATTEMPTS } = {}) {
    if (!rowBatch) {
      rowBatch = await this.makeBatch(functionId, { rows: rowList, columns });
    }
    const req = { functionId, producerId, sequence: int64(sequence), batch: rowBatch };
    if (watermarkUs !== undefined && watermarkUs !== null) {
      req.watermarkUs = int64(watermarkUs);
    }
    const delays = backoff();
    for (let attempt = 1; ; attempt++) {
      try {
        return protos.toNative('keyflow.v1.PushBatchResponse',
          await this._unary(this._fns, 'PushBatch', req));
      } catch (e) {
        if (!(e instanceof KeyflowError) || !RETRYABLE.has(e.code) || attempt >= attempts) {
          throw e;
        }
      }
      this.pushRetries++;
      await sleep(delays.next().value);
    }
  }

  producer(functionId, { producerId, nextSequence } = {}) {
    return new Producer(this, functionId, producerId, nextSequence);
  }

  // One page of output rows with seq > afterSeq: {rows, firstSeq, lastSeq,
  // nextAfterSeq, highWaterSeq, firstRetainedSeq}; each row has "_seq" and the
  // output fields. Below the retained rows (output retention, trimOutput) it
  // rejects with a KeyflowError OUT_OF_RANGE naming the first retained one.
  // With several partitions (docs/scaling.md) pass `cursor` instead of
  // afterSeq: the page's nextCursor (its rows are all of partition
  // `partition`, with that partition's sequences). With one partition
  // nextCursor is '' and nextAfterSeq is the position.
  async readOutput(functionId, { afterSeq = 0, limit = 0, waitMs = 0, cursor = '' } = {}) {
    const resp = await this._unary(this._fns, 'ReadOutput', {
      functionId, afterSeq: int64(afterSeq), limit, waitMs, format: 'ROW_FORMAT_COLUMNAR', cursor,
    }, this.timeoutMs + waitMs);
    return this._page(functionId, resp, afterSeq);
  }

  async _page(functionId, resp, afterSeq) {
    const schema = (await this._descriptor(functionId)).outputSchema;
    const firstSeq = protos.toInt(resp.firstSeq);
    const lastSeq = protos.toInt(resp.lastSeq);
    const rowList = firstSeq ? rows.rowsFromBatch(schema, resp.batch, firstSeq) : [];
    return {
      rows: rowList, firstSeq, lastSeq,
      nextAfterSeq: rowList.length ? lastSeq : afterSeq,
      highWaterSeq: protos.toInt(resp.highWaterSeq),
      firstRetainedSeq: protos.toInt(resp.firstRetainedSeq),
      partition: resp.partition || 0,
      nextCursor: resp.nextCursor || '',
    };
  }

  // Drops the function's output rows before beforeSeq (a consumer committed
  // its position there: the last row it read + 1), or with several
  // partitions each partition's rows up to its position in beforeCursor (a
  // readOutput cursor). Idempotent. Resolves to {firstRetainedSeq, outputSeq}.
  async trimOutput(functionId, beforeSeq = 0, { beforeCursor = '' } = {}) {
    return protos.toNative('keyflow.v1.TrimOutputResponse',
      await this._unary(this._fns, 'TrimOutput',
        { functionId, beforeSeq: int64(beforeSeq), beforeCursor }));
  }

  // Deletes the function and everything of it (state, timers, output,
  // producers, descriptor); its id can then be registered again with any
  // descriptor. allowMissing: a function that does not exist is not an error.
  // Resolves to {deleted, keys, timers, outputRows, producers}.
  async deleteFunction(functionId, { allowMissing = false } = {}) {
    this._descriptors.delete(functionId); // a new one may have another schema
    return protos.toNative('keyflow.v1.DeleteFunctionResponse',
      await this._unary(this._fns, 'DeleteFunction', { functionId, allowMissing }));
  }

  // Forgets a producer (its last sequence and kept acks): the next batch under
  // producerId starts a new producer. Resolves to {deleted, lastSequence}.
  async deleteProducer(functionId, producerId, { allowMissing = false } = {}) {
    return protos.toNative('keyflow.v1.DeleteProducerResponse',
      await this._unary(this._fns, 'DeleteProducer', { functionId, producerId, allowMissing }));
  }

  // Output rows with seq > afterSeq (or after `cursor`, with several
  // partitions) as an async iterator that follows new rows until it is
  // returned from (break) or tail.cancel() is called.
  tailOutput(functionId, { afterSeq = 0, maxRowsPerMessage = 0, cursor = '' } = {}) {
    return new OutputTail(this, functionId, afterSeq, maxRowsPerMessage, cursor);
  }

  // {keyText, state: "absent" | "null" | "value", value, timers, valueStateName};
  // key: the value, or an array of values for several key columns.
  async keyState(functionId, key) {
    if (Array.isArray(key)) {
      key = JSON.stringify(key);
    }
    const out = protos.toNative('keyflow.v1.GetKeyStateResponse',
      await this._unary(this._fns, 'GetKeyState', { functionId, key }));
    if (out.state !== 'value') {
      out.value = null;
    }
    return out;
  }
}

// grpc-js (proto-loader's keepCase false) wants lowerCamelCase names; a
// descriptor may come in either form.
function camelKeys(v) {
  if (Array.isArray(v)) {
    return v.map(camelKeys);
  }
  if (v && typeof v === 'object' && !Buffer.isBuffer(v)) {
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [protos.camel(k), camelKeys(x)]));
  }
  return v;
}

// Unknown fields would be dropped silently by the encoder: refuse them,
// naming the path (descriptor.inputSchema.fields[2].nulable).
function checkKeys(type, obj, where) {
  if (!obj || typeof obj !== 'object' || Array.isArray(obj)) {
    throw new TypeError(`${where}: expected an object`);
  }
  const fields = new Map(type.fieldsArray.map((f) => [protos.camel(f.name), f]));
  for (const [k, v] of Object.entries(obj)) {
    const f = fields.get(k);
    if (!f) {
      throw new TypeError(`${where}.${k}: unknown field`);
    }
    if (f.resolvedType && f.resolvedType.fieldsArray && v !== null && v !== undefined) {
      if (f.repeated) {
        v.forEach((x, i) => checkKeys(f.resolvedType, x, `${where}.${k}[${i}]`));
      } else {
        checkKeys(f.resolvedType, v, `${where}.${k}`);
      }
    }
  }
}

class OutputTail {
  constructor(client, functionId, afterSeq, maxRowsPerMessage, cursor = '') {
    this._client = client;
    this._functionId = functionId;
    this._req = {
      functionId, afterSeq: int64(afterSeq), maxRowsPerMessage, format: 'ROW_FORMAT_COLUMNAR',
      cursor,
    };
    this._call = null;
  }

  cancel() {
    if (this._call) {
      this._call.cancel();
    }
    this._cancelled = true;
  }

  async* [Symbol.asyncIterator]() {
    await this._client._descriptor(this._functionId); // an unknown function fails here
    if (this._cancelled) {
      return;
    }
    this._call = this._client._fns.TailOutput(this._req, this._client.metadata);
    try {
      for await (const resp of this._call) {
        const page = await this._client._page(this._functionId, resp, 0);
        for (const row of page.rows) {
          yield row;
        }
      }
    } catch (e) {
      if (e.code === grpc.status.CANCELLED && this._cancelled) {
        return;
      }
      throw KeyflowError.from(e);
    } finally {
      this.cancel();
    }
  }
}

// Pushes batches to one function under one producer ID with strictly
// increasing sequences (see pushBatch for retries). Without nextSequence the
// first sequence is the clock in microseconds and each later one
// max(previous + 1, clock), so a producer restarted under the same ID keeps
// increasing. Pushes are serialized: concurrent pushes of one producer would
// reach the server out of order. A push that rejected keeps its sequence
// for the next push(): pushing the same rows again is the retry.
class Producer {
  constructor(client, functionId, producerId, nextSequence) {
    this.client = client;
    this.functionId = functionId;
    this.producerId = producerId || `node-${crypto.randomBytes(16).toString('hex')}`;
    this._next = nextSequence === undefined ? null : BigInt(nextSequence);
    this._retrySequence = null;
    this.lastSequence = null;
    this._queue = Promise.resolve();
  }

  push(rowList, { columns, watermarkUs } = {}) {
    const result = this._queue.then(() => this._push(rowList, columns, watermarkUs));
    this._queue = result.catch(() => {});
    return result;
  }

  async _push(rowList, columns, watermarkUs) {
    const rowBatch = await this.client.makeBatch(this.functionId,
      columns ? { columns } : { rows: rowList });
    let seq = this._retrySequence;
    if (seq === null) {
      seq = this._next !== null ? this._next : BigInt(Date.now()) * 1000n;
      if (this.lastSequence !== null && seq <= this.lastSequence) {
        seq = this.lastSequence + 1n;
      }
    }
    let ack;
    try {
      ack = await this.client.pushBatch(this.functionId, this.producerId, seq,
        { batch: rowBatch, watermarkUs });
    } catch (e) {
      this._retrySequence = seq;
      throw e;
    }
    this._retrySequence = null;
    this.lastSequence = seq;
    if (this._next !== null) {
      this._next = seq + 1n;
    }
    return ack;
  }
}

module.exports = {
  Client, KeyflowError, Producer, OutputTail, debounce, batch, retry, backoff, sleep,
};
