'use strict';
// keyflow.Client against a real keyflowd: events, coordinators, runs,
// functions (register, push, output, tail, key state) and a producer's retry
// of one sequence across a keyflowd restart.
const test = require('node:test');
const assert = require('node:assert');
const kf = require('..');
const { Keyflowd, waitFor, unique, runningSumDescriptor, built } = require('./harness');

const T0 = 1700000000000000;
const ONE_RUN = { rule: kf.batch({ maxEvents: 1 }) };

test('client', { skip: !built && 'keyflowd is not built' }, async (t) => {
  // One partition: these tests check afterSeq paging, output seqs in acks
  // and trimming before a sequence, what one partition has
  // (partitions.test.js reads with cursors over several).
  const server = await new Keyflowd(['--partition-count', '1']).start();
  const client = new kf.Client({ addr: server.target });
  t.after(async () => {
    client.close();
    await server.cleanup();
  });

  await t.test('sendEvent takes native input and returns the receipt', async () => {
    const wf = unique('wf');
    const rule = kf.batch({ maxEvents: 2, maxWaitMs: 60000 });
    const r1 = await client.sendEvent(wf, 'k1', { item: 1, tags: ['a'] }, { rule, id: 'e-1' });
    assert.match(r1.runId, /^k1@/);
    assert.ok(r1.dueMs > 0);
    assert.strictEqual(r1.duplicate, false);
    const again = await client.sendEvent(wf, 'k1', { item: 1, tags: ['a'] }, { rule, id: 'e-1' });
    assert.strictEqual(again.duplicate, true);
    assert.strictEqual(again.runId, r1.runId);
    const d = await client.describe('batch', wf, 'k1');
    assert.strictEqual(d.exists, true);
    assert.strictEqual(d.window.eventCount, 1);
    assert.strictEqual(d.window.rule.kind, 'batch');
    assert.strictEqual(d.journal[0].what, 'event_accepted');
    const r2 = await client.sendEvent(wf, 'k1', 'second', { rule });
    assert.strictEqual(r2.runStarted, true);
    const run = await client.getRun(r1.runId);
    assert.deepStrictEqual(run.input, [{ item: 1, tags: ['a'] }, 'second']);
    assert.strictEqual(run.status, 'pending');
  });

  await t.test('receipts, edges, maxBytes, flush and sendEvents', async () => {
    const wf = unique('wf');
    const lead = kf.debounce(60000, { edge: 'leading' });
    const first = await client.sendEvent(wf, 'l', 1, { rule: lead, id: 'e-1' });
    assert.deepStrictEqual([first.disposition, first.runStarted], ['closed', true]);
    assert.ok(first.commitSeq > 0);
    const absorbed = await client.sendEvent(wf, 'l', 2, { rule: lead });
    assert.deepStrictEqual([absorbed.disposition, absorbed.runId], ['joined', first.runId]);
    assert.ok(absorbed.commitSeq > first.commitSeq);
    const again = await client.sendEvent(wf, 'l', 1, { rule: lead, id: 'e-1' });
    assert.deepStrictEqual([again.disposition, again.commitSeq], ['duplicate', first.commitSeq]);
    await assert.rejects(client.sendEvent(wf, 'l', 1, { rule: kf.debounce(60000, { edge: 'sideways' }) }),
      /rule\.edge/);

    const small = kf.batch({ maxEvents: 100, maxWaitMs: 60000, maxBytes: 10 });
    const opened = await client.sendEvent(wf, 'b', 'abc', { rule: small }); // ["abc"]: 7 bytes
    const next = await client.sendEvent(wf, 'b', 'd', { rule: small }); // ["abc","d"] is 11
    assert.deepStrictEqual([opened.disposition, next.disposition], ['opened', 'opened']);
    assert.notStrictEqual(next.runId, opened.runId);
    const flushed = await client.sendEvent(wf, 'b', 'e', { rule: small, flush: true });
    assert.deepStrictEqual([flushed.disposition, flushed.runId], ['closed', next.runId]);
    assert.deepStrictEqual((await client.getRun(next.runId)).input, ['d', 'e']);

    const two = kf.batch({ maxEvents: 2, maxWaitMs: 60000 });
    const answers = await client.sendEvents([
      { workflow: wf, key: 's', input: { n: 1 }, rule: two, id: 'x' },
      { workflow: '', key: 's', rule: two },
      { workflow: wf, key: 's', input: { n: 2 }, rule: two, id: 'x' },
      { workflow: wf, key: 's', input: { n: 3 }, rule: two },
    ]);
    assert.deepStrictEqual(answers.map((a) => (a instanceof kf.KeyflowError ? a.codeName : a.disposition)),
      ['opened', 'INVALID_ARGUMENT', 'ALREADY_EXISTS', 'closed']);
    assert.match(answers[1].message, /workflow/);
    assert.strictEqual(answers[0].commitSeq, answers[3].commitSeq);
    assert.deepStrictEqual((await client.getRun(answers[0].runId)).input, [{ n: 1 }, { n: 3 }]);
    assert.deepStrictEqual(await client.sendEvents([]), []);
  });

  await t.test('flush, cancel and listRuns pages', async () => {
    const wf = unique('wf');
    for (const key of ['a', 'b', 'c']) {
      await client.sendEvent(wf, key, { k: key }, { rule: kf.debounce(60000) });
    }
    assert.strictEqual((await client.flush('debounce', wf, 'a')).flushed, true);
    const c = await client.cancel('debounce', wf, 'b');
    assert.strictEqual(c.cancelled, true);
    assert.strictEqual(c.eventsDropped, 1);
    await client.flush('debounce', wf, 'c');
    const keys = [];
    for await (const run of client.listRuns({ workflow: wf, status: 'pending', pageSize: 1 })) {
      keys.push(run.input.k);
    }
    assert.deepStrictEqual(keys.sort(), ['a', 'c']);
  });

  await t.test('poll and complete with a native result', async () => {
    const wf = unique('wf');
    const receipt = await client.sendEvent(wf, 'k', 7, { rule: kf.batch({ maxEvents: 1 }) });
    const runs = await client.pollRuns({ workflows: [wf], workerId: 'w', waitMs: 5000 });
    assert.deepStrictEqual(runs.map((r) => r.runId), [receipt.runId]);
    const out = await client.completeRun(runs[0].runId, runs[0].lease, { ok: true });
    assert.strictEqual(out.run.status, 'completed');
    assert.deepStrictEqual((await client.getRun(receipt.runId)).result, { ok: true });
  });

  await t.test('run options, cancel, release, retryable completion and a key filter', async () => {
    const wf = unique('wf');
    const rule = kf.batch({
      maxEvents: 1, keyConcurrency: 1, retry: kf.retry({ maxAttempts: 3, initialBackoffMs: 0 }),
    });
    const first = (await client.sendEvent(wf, 'k', 1, { rule, id: 'e-1' })).runId;
    const second = (await client.sendEvent(wf, 'k', 2, { rule })).runId;
    const leased = await client.pollRuns({ workflows: [wf], workerId: 'w', maxRuns: 10 });
    assert.deepStrictEqual(leased.map((r) => r.runId), [first], 'one lease per key');
    assert.deepStrictEqual([leased[0].maxAttempts, leased[0].eventIds], [3, ['e-1']]);
    const done = await client.completeRun(first, leased[0].lease, undefined,
      { error: 'busy', retryable: true });
    assert.deepStrictEqual([done.run.status, done.run.lastError], ['pending', 'busy']);
    const back = (await client.pollRuns({ workflows: [wf], workerId: 'w' }))[0];
    assert.deepStrictEqual([back.runId, back.attempts], [first, 2]);
    const released = await client.releaseRun(first, back.lease);
    assert.deepStrictEqual([released.status, released.attempts], ['pending', 1]);
    assert.strictEqual((await client.cancelRun(first)).status, 'cancelled');
    const listed = [];
    for await (const run of client.listRuns({ workflow: wf, key: 'k' })) {
      listed.push(run.runId);
    }
    assert.deepStrictEqual(listed, [first, second]);
    await assert.rejects(client.releaseRun(first, back.lease),
      (e) => e.codeName === 'FAILED_PRECONDITION');
    await assert.rejects(client.sendEvent(wf, 'k', 1, { rule: kf.batch({ retry: { tries: 2 } }) }),
      /rule.retry.tries/);
  });

  await t.test('waitRun from a receipt', async () => {
    const wf = unique('wf');
    const r = await client.sendEvent(wf, 'k', { x: 1 },
      { rule: kf.batch({ maxEvents: 2, maxWaitMs: 60000 }) });
    assert.strictEqual((await client.getRun(r.runId)).status, 'window_open');
    assert.strictEqual((await client.getRun(r.runId, { waitMs: 100 })).status, 'window_open');
    const waiting = client.waitRun(r.runId);
    await client.flush('batch', wf, 'k');
    const run = (await client.pollRuns({ workflows: [wf], workerId: 'w', waitMs: 5000 }))[0];
    await client.completeRun(run.runId, run.lease, { ok: true });
    const got = await waiting;
    assert.deepStrictEqual([got.status, got.result], ['completed', { ok: true }]);
    const pending = (await client.sendEvent(wf, 'p', 1, ONE_RUN)).runId;
    assert.strictEqual((await client.waitRun(pending, { timeoutMs: 200 })).status, 'pending');
  });

  await t.test('errors name the field', async () => {
    await assert.rejects(client.sendEvent(unique('wf'), 'k', 1, { rule: kf.batch({ maxEvents: 0 }) }),
      (e) => e instanceof kf.KeyflowError && e.codeName === 'INVALID_ARGUMENT' &&
        /max_events/.test(e.details));
    await assert.rejects(client.sendEvent('wf', 'k', 1n, { rule: kf.debounce(5) }), /input: not JSON/);
    await assert.rejects(client.sendEvent('wf', 'k', 1, { rule: { kind: 'batch', window: 5 } }),
      /rule.window: unknown field/);
    await assert.rejects(client.registerFunction({ ...runningSumDescriptor(), runtme: 1 }),
      /descriptor.runtme: unknown field/);
  });

  await t.test('functions: register, push rows and columns, output, key state', async () => {
    const d = runningSumDescriptor();
    const reg = await client.registerFunction(d);
    assert.strictEqual(reg.alreadyRegistered, false);
    assert.strictEqual(reg.function.descriptor.runtime, 'native');
    assert.strictEqual((await client.registerFunction(d)).alreadyRegistered, true);
    const ids = [];
    for await (const fn of client.listFunctions({ pageSize: 1 })) {
      ids.push(fn.descriptor.functionId);
    }
    assert.ok(ids.includes(d.functionId));

    const p = client.producer(d.functionId, { producerId: 'p1', nextSequence: 1 });
    const ack = await p.push([{ user: 'ann', ts: T0, amount: 5 }, { user: 'ann', ts: T0 + 1, amount: 7 },
      { user: 'bob', ts: T0 + 2, amount: null }], { watermarkUs: T0 });
    assert.deepStrictEqual([ack.rowsAccepted, ack.firstOutputSeq, ack.lastOutputSeq, ack.sequence],
      [3, 1, 3, 1]);
    const ack2 = await p.push(null, { columns: { user: ['ann', 'bob'], ts: [T0 + 3, T0 + 4], amount: [1n, '2'] } });
    assert.strictEqual(ack2.sequence, 2);

    const page = await client.readOutput(d.functionId, { afterSeq: 0, limit: 2 });
    assert.deepStrictEqual(page.rows, [
      { _seq: 1, key: 'ann', ts: T0, sum: 5, previous: 'absent' },
      { _seq: 2, key: 'ann', ts: T0 + 1, sum: 12, previous: 'value' }]);
    const rest = await client.readOutput(d.functionId, { afterSeq: page.nextAfterSeq });
    assert.deepStrictEqual(rest.rows.map((r) => [r._seq, r.key, r.sum, r.previous]),
      [[3, 'bob', null, 'absent'], [4, 'ann', 13, 'value'], [5, 'bob', 2, 'null']]);
    assert.strictEqual(rest.highWaterSeq, 5);

    const ann = await client.keyState(d.functionId, 'ann');
    assert.deepStrictEqual([ann.state, ann.value, ann.valueStateName], ['value', 13, 'sum']);
    assert.strictEqual((await client.keyState(d.functionId, ['nobody'])).state, 'absent');

    // The same batch again is a duplicate with the original ack; other
    // content under the same sequence is a conflict.
    const dup = await client.pushBatch(d.functionId, 'p1', 2,
      { rows: [{ user: 'ann', ts: T0 + 3, amount: 1 }, { user: 'bob', ts: T0 + 4, amount: 2 }] });
    assert.strictEqual(dup.duplicate, true);
    assert.strictEqual(dup.lastOutputSeq, ack2.lastOutputSeq);
    await assert.rejects(client.pushBatch(d.functionId, 'p1', 2, { rows: [{ user: 'x', ts: T0 }] }),
      /ALREADY_EXISTS: sequence: 2 of producer p1/);
  });

  await t.test('trimOutput drops rows; reads below them are OUT_OF_RANGE', async () => {
    const d = runningSumDescriptor();
    await client.registerFunction(d);
    await client.pushBatch(d.functionId, 'p', 1,
      { rows: [0, 1, 2, 3].map((i) => ({ user: 'u', ts: T0 + i, amount: i })) });
    const out = await client.trimOutput(d.functionId, 3);
    assert.deepStrictEqual([out.firstRetainedSeq, out.outputSeq], [3, 4]);
    assert.strictEqual((await client.trimOutput(d.functionId, 2)).firstRetainedSeq, 3);
    await assert.rejects(client.readOutput(d.functionId, { afterSeq: 0 }),
      (e) => e.codeName === 'OUT_OF_RANGE' && /first retained sequence is 3/.test(e.message));
    const page = await client.readOutput(d.functionId, { afterSeq: 2 });
    assert.deepStrictEqual([page.rows.map((r) => r._seq), page.firstRetainedSeq], [[3, 4], 3]);
    assert.strictEqual((await client.getFunction(d.functionId)).firstRetainedSeq, 3);
  });

  await t.test('deleteFunction and deleteProducer', async () => {
    const d = runningSumDescriptor();
    await client.registerFunction(d);
    await client.pushBatch(d.functionId, 'p', 7, { rows: [{ user: 'u', ts: T0, amount: 1 }] });
    const gone = await client.deleteProducer(d.functionId, 'p');
    assert.deepStrictEqual([gone.deleted, gone.lastSequence], [true, 7]);
    assert.strictEqual((await client.deleteProducer(d.functionId, 'p', { allowMissing: true })).deleted,
      false);
    const again = await client.pushBatch(d.functionId, 'p', 1, { rows: [{ user: 'u', ts: T0, amount: 2 }] });
    assert.strictEqual(again.duplicate, false);
    const out = await client.deleteFunction(d.functionId);
    assert.deepStrictEqual([out.deleted, out.keys, out.outputRows, out.producers], [true, 1, 2, 1]);
    await assert.rejects(client.getFunction(d.functionId), (e) => e.codeName === 'NOT_FOUND');
    assert.strictEqual((await client.deleteFunction(d.functionId, { allowMissing: true })).deleted, false);
    const v2 = { ...d, pipelineStateId: d.pipelineStateId + '.v2' };
    assert.strictEqual((await client.registerFunction(v2)).alreadyRegistered, false);
    assert.strictEqual((await client.keyState(d.functionId, 'u')).state, 'absent');
  });

  await t.test('bad rows name the row and field and send nothing', async () => {
    const d = runningSumDescriptor();
    await client.registerFunction(d);
    const p = client.producer(d.functionId, { producerId: 'p', nextSequence: 1 });
    const cases = [
      [[{ user: 'u', ts: T0, amount: 'five' }], /rows\[0\]\.amount: expected INT64/],
      [[{ user: 'u', ts: T0 }, { user: null, ts: T0 }], /rows\[1\]\.user: null/],
      [[{ user: 'u', ts: 1.5 }], /rows\[0\]\.ts: 1.5 is not a safe integer/],
      [[{ user: 'u', ts: T0, amt: 1 }], /rows\[0\]: "amt" is not a field/],
      [[{ user: 'u', ts: 2n ** 63n }], /outside int64/],
    ];
    for (const [rowList, message] of cases) {
      await assert.rejects(p.push(rowList), message);
    }
    assert.strictEqual((await client.getFunction(d.functionId)).outputSeq, 0);
    assert.strictEqual((await p.push([{ user: 'u', ts: T0, amount: 1 }])).sequence, 1);
    // Clock-based sequences increase.
    const q = client.producer(d.functionId);
    const a = await q.push([{ user: 'u', ts: T0 }]);
    const b = await q.push([{ user: 'u', ts: T0 }]);
    assert.ok(b.sequence > a.sequence);
  });

  await t.test('tailOutput follows new rows', async () => {
    const d = runningSumDescriptor();
    await client.registerFunction(d);
    const p = client.producer(d.functionId, { producerId: 'p', nextSequence: 1 });
    await p.push([{ user: 'a', ts: T0, amount: 1 }]);
    const got = [];
    const tail = client.tailOutput(d.functionId, { afterSeq: 0 });
    const consumed = (async () => {
      for await (const row of tail) {
        got.push(row);
      }
    })();
    await waitFor(() => got.length >= 1, 'the row pushed before the tail');
    await p.push([{ user: 'a', ts: T0 + 1, amount: 2 }, { user: 'b', ts: T0 + 1, amount: 3 }]);
    await waitFor(() => got.length >= 3, 'rows pushed after the tail started');
    tail.cancel();
    await consumed;
    assert.deepStrictEqual(got.map((r) => [r._seq, r.key, r.sum]), [[1, 'a', 1], [2, 'a', 3], [3, 'b', 3]]);
  });
});

test('a push retries its sequence across a keyflowd restart', { skip: !built && 'keyflowd is not built' },
  async (t) => {
    const server = await new Keyflowd().start();
    const client = new kf.Client({ addr: server.target });
    t.after(async () => {
      client.close();
      await server.cleanup();
    });
    const d = runningSumDescriptor();
    await client.registerFunction(d);
    const p = client.producer(d.functionId, { producerId: 'p', nextSequence: 1 });
    await p.push([{ user: 'a', ts: T0, amount: 1 }]);
    const port = server.grpcPort;
    assert.strictEqual(await server.stop(), 0);
    const pushed = p.push([{ user: 'a', ts: T0, amount: 2 }]);
    await waitFor(() => client.pushRetries >= 1, 'a retried push');
    server.args.push('--grpc', `127.0.0.1:${port}`);
    await server.start();
    const ack = await pushed;
    assert.deepStrictEqual([ack.sequence, ack.duplicate], [2, false]);
    const again = await client.pushBatch(d.functionId, 'p', 2, { rows: [{ user: 'a', ts: T0, amount: 2 }] });
    assert.strictEqual(again.duplicate, true);
    assert.strictEqual((await client.keyState(d.functionId, 'a')).value, 3);
  });

// Test certificates made with openssl at test time (EC P-256: quick).
function makePki() {
  const { execFileSync } = require('child_process');
  const fs = require('fs');
  const os = require('os');
  const path = require('path');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kf-node-pki-'));
  const run = (...args) => execFileSync('openssl', args, { cwd: dir, stdio: 'ignore' });
  const key = (name) => {
    run('genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256', '-out', `${name}.key`);
    return path.join(dir, `${name}.key`);
  };
  const caKey = key('ca');
  run('req', '-x509', '-new', '-key', caKey, '-out', 'ca.pem', '-days', '2', '-subj', '/CN=sdk-ca',
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign');
  const leaf = (name, usage) => {
    const k = key(name);
    fs.writeFileSync(path.join(dir, `${name}.ext`), 'basicConstraints=CA:FALSE\n' +
      `extendedKeyUsage=${usage}\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n`);
    run('req', '-new', '-key', k, '-out', `${name}.csr`, '-subj', `/CN=${name}`);
    run('x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.pem', '-CAkey', caKey, '-CAcreateserial',
      '-days', '2', '-extfile', `${name}.ext`, '-out', `${name}.pem`);
    return [path.join(dir, `${name}.pem`), k];
  };
  return { dir, ca: path.join(dir, 'ca.pem'), server: leaf('server', 'serverAuth'),
    client: leaf('client', 'clientAuth') };
}

test('mTLS: the client certificate and CA options reach the channel', { skip: !built && 'keyflowd is not built' },
  async (t) => {
    const pki = makePki();
    const server = await new Keyflowd(['--tls-cert', pki.server[0], '--tls-key', pki.server[1],
      '--tls-client-ca', pki.ca]).start();
    t.after(async () => {
      await server.cleanup();
      require('fs').rmSync(pki.dir, { recursive: true, force: true });
    });
    const good = new kf.Client({ addr: server.target, tlsCa: pki.ca, tlsCert: pki.client[0],
      tlsKey: pki.client[1], timeoutMs: 10000 });
    const wf = unique('tls');
    assert.strictEqual((await good.sendEvent(wf, 'k', 1, ONE_RUN)).runStarted, true);
    good.close();
    for (const options of [{}, { tlsCa: pki.ca }]) { // plaintext; TLS without a client certificate
      const bad = new kf.Client({ addr: server.target, timeoutMs: 5000, ...options });
      await assert.rejects(bad.sendEvent(wf, 'k', 1, ONE_RUN), (e) => e.codeName === 'UNAVAILABLE');
      bad.close();
    }
    assert.throws(() => new kf.Client({ addr: server.target, tlsCert: pki.client[0] }),
      /tlsCert and tlsKey/);
  });
