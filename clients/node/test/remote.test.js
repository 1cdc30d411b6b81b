'use strict';
// keyflow.FunctionWorker against a real keyflowd: the Node port of
// handlers/running_sum.c (examples/running_sum.js) gives byte for byte the
// native handler's output on the same rows; a refusal, a wrong digest, and
// no worker at all.
const crypto = require('crypto');
const fs = require('fs');
const test = require('node:test');
const assert = require('node:assert');
const grpc = require('@grpc/grpc-js');
const kf = require('..');
const { runningSum } = require('../examples/running_sum');
const { Keyflowd, unique, runningSumDescriptor, built } = require('./harness');

const T0 = 1700000000000000;
const PORT_FILE = require.resolve('../examples/running_sum');

// Deterministic rows over `keys` keys: amounts, nulls, repeated keys (the
// same generator as clients/python/tests/test_remote.py).
function rowsFor(n, keys, seed = 7) {
  const out = [];
  let x = seed;
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) % 2 ** 31;
    const amount = x % 17 === 0 ? null : (x % 2001) - 1000;
    out.push({ user: `u${String(x % keys).padStart(4, '0')}`, ts: T0 + i, amount });
  }
  return out;
}

// Every ReadOutput page of a function, as the bytes keyflowd sent.
async function readAllRaw(client, raw, functionId) {
  const { reflection } = require('../lib/protos').load();
  const Req = reflection.lookupType('keyflow.v1.ReadOutputRequest');
  const Resp = reflection.lookupType('keyflow.v1.ReadOutputResponse');
  // With cursors, as a user of the default 8 partitions reads: the same
  // rows give the same pages in turn. Each function is SINGLE, its pages
  // all from its own home partition (which differs between the functions
  // compared): partition and cursor are left out of the bytes compared.
  const pages = [];
  let cursor = '';
  for (;;) {
    const buf = await new Promise((resolve, reject) => raw.makeUnaryRequest(
      '/keyflow.v1.Functions/ReadOutput', (b) => b, (b) => b,
      Buffer.from(Req.encode({ function_id: functionId, cursor, limit: 1000 }).finish()),
      client.metadata, {}, (err, b) => (err ? reject(err) : resolve(b))));
    const resp = Resp.decode(buf);
    if (Number(resp.first_seq) === 0) {
      return pages;
    }
    cursor = resp.next_cursor;
    resp.partition = 0;
    resp.next_cursor = '';
    pages.push(Buffer.from(Resp.encode(resp).finish()));
  }
}

test('remote handler', { skip: !built && 'keyflowd is not built' }, async (t) => {
  const server = await new Keyflowd().start();
  const client = new kf.Client({ addr: server.target });
  const raw = new grpc.Client(server.target, null, { channelOverride: client._coord.getChannel() });
  const workers = [];
  t.after(async () => {
    for (const w of workers) {
      await w.stop();
    }
    client.close();
    await server.cleanup();
  });

  async function serve(functionId, handler, options = {}) {
    const w = new kf.FunctionWorker({ client, functionId, handler, sources: [PORT_FILE],
      ...options });
    workers.push(w);
    w.run({ signals: false }).catch(() => {});
    await w.welcomed();
    return w;
  }

  async function registerRemote(digest, options) {
    const fid = unique('rs-js');
    await client.registerFunction(kf.remoteDescriptor(runningSumDescriptor(fid), digest, options));
    return fid;
  }

  const digest = kf.implementationDigest(PORT_FILE);

  await t.test('the digest is the SHA-256 of the source files', () => {
    const bytes = fs.readFileSync(PORT_FILE);
    assert.strictEqual(digest, crypto.createHash('sha256').update(bytes).digest('hex'));
    assert.strictEqual(kf.implementationDigest(PORT_FILE, PORT_FILE),
      crypto.createHash('sha256').update(Buffer.concat([bytes, bytes])).digest('hex'));
    assert.throws(() => new kf.FunctionWorker({ client, functionId: 'x', handler: runningSum }),
      /sources/);
  });

  await t.test('the Node port matches native running_sum byte for byte', async () => {
    const native = unique('rs-native');
    await client.registerFunction(runningSumDescriptor(native));
    const remote = await registerRemote(digest);
    const w = await serve(remote, runningSum, { concurrency: 4 });
    const rows = rowsFor(3000, 200);
    const pn = client.producer(native, { producerId: 'p', nextSequence: 1 });
    const pr = client.producer(remote, { producerId: 'p', nextSequence: 1 });
    for (let start = 0; start < rows.length; start += 1000) {
      const chunk = rows.slice(start, start + 1000);
      const a = await pn.push(chunk, { watermarkUs: T0 + start });
      const b = await pr.push(chunk, { watermarkUs: T0 + start });
      assert.deepStrictEqual([a.rowsAccepted, a.activations, a.firstOutputSeq, a.lastOutputSeq],
        [b.rowsAccepted, b.activations, b.firstOutputSeq, b.lastOutputSeq]);
    }
    const [nativePages, remotePages] = [await readAllRaw(client, raw, native),
      await readAllRaw(client, raw, remote)];
    assert.ok(nativePages.length > 0);
    assert.deepStrictEqual(remotePages, nativePages);
    assert.ok(w.calls > 0);
    assert.deepStrictEqual(await client.keyState(remote, 'u0001'), await client.keyState(native, 'u0001'));
  });

  await t.test('int64 overflow refuses the batch like native', async () => {
    const native = unique('rs-native');
    await client.registerFunction(runningSumDescriptor(native));
    const remote = await registerRemote(digest);
    await serve(remote, runningSum);
    const rows = [{ user: 'big', ts: T0, amount: 2n ** 63n - 1n }, { user: 'big', ts: T0 + 1, amount: 1 }];
    const errors = [];
    for (const fid of [native, remote]) {
      await assert.rejects(client.pushBatch(fid, 'p', 1, { rows }), (e) => {
        errors.push(e);
        return e.codeName === 'FAILED_PRECONDITION';
      });
      assert.strictEqual((await client.keyState(fid, 'big')).state, 'absent');
    }
    assert.match(errors[1].message, /int64 overflow adding amount 1 to sum 9223372036854775807/);
    assert.strictEqual(errors[1].details, errors[0].details);
  });

  await t.test('a throw refuses the call; no worker is UNAVAILABLE', async () => {
    const broken = (act) => {
      throw new RangeError(`boom on ${act.keyText}`);
    };
    const remote = await registerRemote(digest);
    await assert.rejects(client.pushBatch(remote, 'p', 1, { rows: [{ user: 'k', ts: T0, amount: 1 }],
      attempts: 1 }), (e) => e.codeName === 'UNAVAILABLE');
    await serve(remote, broken);
    await assert.rejects(client.pushBatch(remote, 'p', 1, { rows: [{ user: 'k', ts: T0, amount: 1 }] }),
      (e) => e.codeName === 'FAILED_PRECONDITION' && /RangeError: boom on k/.test(e.message));
  });

  await t.test('bad timer arguments and mistyped output refuse the call; the worker serves on',
    async () => {
      // Each of these once got past the handler: a timer name protobufjs
      // cannot encode threw at the stream write and ended the process, and
      // mistyped output was coerced ('yes' stored as true).
      const mistakes = {
        1: [(act) => act.setTimer(5, T0 + 10), /setTimer: the timer name must be a string, got number/],
        2: [(act) => act.cancelTimer({}), /cancelTimer: the timer name must be a string, got object/],
        3: [(act) => act.emit({ key: 'k', ts: T0, b: 'yes' }), /output field b: expected a boolean, got string/],
        4: [(act) => act.emit({ key: 'k', ts: T0, f: 'abc' }), /output field f: expected a number, got string/],
        5: [(act) => act.emit({ key: 'k', ts: T0, y: 5 }), /output field y: expected a Buffer or Uint8Array, got number/],
      };
      const handler = (act) => {
        const mistake = mistakes[act.get('amount')];
        if (mistake) {
          mistake[0](act);
        } else {
          act.emit({ key: act.keyText, ts: act.eventTimeUs, b: false, f: 2.5, y: Buffer.from('ok') });
        }
      };
      const fid = unique('typed-js');
      const d = runningSumDescriptor(fid);
      d.outputSchema = { fields: [{ name: 'key', type: 'FIELD_TYPE_UTF8' },
        { name: 'ts', type: 'FIELD_TYPE_TIMESTAMP_US' },
        { name: 'b', type: 'FIELD_TYPE_BOOL', nullable: true },
        { name: 'f', type: 'FIELD_TYPE_FLOAT64', nullable: true },
        { name: 'y', type: 'FIELD_TYPE_BYTES', nullable: true }] };
      d.timerNames = ['t'];
      await client.registerFunction(kf.remoteDescriptor(d, digest));
      const w = await serve(fid, handler);
      for (const [amount, [, expected]] of Object.entries(mistakes)) {
        await assert.rejects(client.pushBatch(fid, 'p', Number(amount),
          { rows: [{ user: 'k', ts: T0, amount: Number(amount) }] }),
        (e) => e.codeName === 'FAILED_PRECONDITION' && expected.test(e.message));
      }
      assert.strictEqual((await client.readOutput(fid, { afterSeq: 0 })).rows.length, 0);
      await client.pushBatch(fid, 'p', 6, { rows: [{ user: 'k', ts: T0, amount: 6 }] });
      const { rows } = await client.readOutput(fid, { afterSeq: 0 });
      assert.deepStrictEqual(rows.map((r) => [r.b, r.f, r.y.toString()]), [[false, 2.5, 'ok']]);
      assert.strictEqual(w.connects, 1, 'the worker kept its stream');
    });

  await t.test('async handlers are refused', async () => {
    // Their answer was what they did before the first await (the batch
    // acknowledged, the rest lost), and a throw after it ended the process.
    const late = async (act) => {
      act.setState(1);
      await null;
      throw new Error('after the await');
    };
    assert.throws(() => new kf.FunctionWorker({ client, functionId: 'x', handler: late,
      digest: '0'.repeat(64) }), /handlers are synchronous/);
    const sneaky = (act) => late(act);
    const fid = await registerRemote(digest);
    await serve(fid, sneaky);
    await assert.rejects(client.pushBatch(fid, 'p', 1, { rows: [{ user: 'k', ts: T0, amount: 1 }] }),
      (e) => e.codeName === 'FAILED_PRECONDITION' && /the handler returned a Promise/.test(e.message));
    assert.strictEqual((await client.keyState(fid, 'k')).state, 'absent');
    // The worker (and this process) outlived the late throw: the next call is refused alike.
    await assert.rejects(client.pushBatch(fid, 'p', 2, { rows: [{ user: 'k', ts: T0, amount: 2 }] }),
      (e) => e.codeName === 'FAILED_PRECONDITION');
  });

  await t.test('the example says when it serves, and a push right after is handled', async () => {
    // As the README runs it: in the background, pushing once it printed
    // "serving ID" (before that there may be no function, or no worker).
    const { spawn } = require('child_process');
    const fid = unique('rs-js-example');
    const child = spawn(process.execPath, [PORT_FILE, fid],
      { env: { ...process.env, KEYFLOW_ADDR: server.target }, stdio: ['ignore', 'pipe', 'pipe'] });
    const stopped = new Promise((resolve) => child.on('exit', resolve));
    try {
      const first = await new Promise((resolve, reject) => {
        let out = '';
        child.stdout.on('data', (b) => {
          out += b;
          if (out.includes('\n')) resolve(out.slice(0, out.indexOf('\n') + 1));
        });
        child.on('exit', (code) => reject(new Error(`the example exited (${code}) first`)));
      });
      assert.strictEqual(first, `serving ${fid}\n`);
      const ack = await client.pushBatch(fid, 'p-example', 1,
        { rows: [{ user: 'ann', ts: T0, amount: 5 }], attempts: 1 });
      assert.strictEqual(Number(ack.rowsAccepted), 1);
      assert.strictEqual(Number((await client.keyState(fid, 'ann')).value), 5);
    } finally {
      child.kill('SIGTERM');
      await stopped;
    }
  });

  await t.test('a wrong digest is refused for good', async () => {
    const remote = await registerRemote(digest);
    const w = new kf.FunctionWorker({ client, functionId: remote, handler: runningSum,
      digest: '0'.repeat(64) });
    await assert.rejects(w.run({ signals: false }),
      (e) => e.codeName === 'FAILED_PRECONDITION' && /implementation_digest/.test(e.message));
  });
});
