'use strict';
// keyflow.Worker against a real keyflowd: results and errors, N runs at once,
// heartbeats that outlive the lease, shutdown that finishes or releases,
// SIGTERM in a worker process, reconnecting after a keyflowd restart.
const test = require('node:test');
const assert = require('node:assert');
const { spawn } = require('child_process');
const path = require('path');
const kf = require('..');
const { Keyflowd, waitFor, unique, built, WAIT_MS } = require('./harness');

const ONE = { rule: kf.batch({ maxEvents: 1 }) };

function setup(t) {
  const ctx = { server: new Keyflowd(), workers: [] };
  t.after(async () => {
    await Promise.all(ctx.workers.map((w) => w.stop({ graceMs: 0 })));
    ctx.client.close();
    await ctx.server.cleanup();
  });
  return ctx;
}

async function start(t) {
  const ctx = setup(t);
  await ctx.server.start();
  ctx.client = new kf.Client({ addr: ctx.server.target });
  ctx.worker = (options) => {
    const w = new kf.Worker({ client: ctx.client, workerId: unique('w'), pollWaitMs: 1000,
      installSignalHandlers: false, ...options });
    ctx.workers.push(w);
    return w;
  };
  ctx.send = async (wf, key, input) => (await ctx.client.sendEvent(wf, key, input, ONE)).runId;
  ctx.waitStatus = (runId, status) => waitFor(async () => {
    const run = await ctx.client.getRun(runId);
    return run.status === status && run;
  }, `run ${runId} to be ${status}`);
  return ctx;
}

function deferred() {
  let resolve;
  const promise = new Promise((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

const opts = { skip: !built && 'keyflowd is not built' };

test('results, errors and N runs at once', opts, async (t) => {
  const c = await start(t);
  const wfOk = unique('ok');
  const wfFail = unique('fail');
  const wfBad = unique('bad');
  const w = c.worker({ concurrency: 4 });
  // Every handler waits until all 4 are running at once.
  let running = 0;
  const allIn = deferred();
  w.handle(wfOk, async (input, run) => {
    if (++running === 4) allIn.resolve();
    await allIn.promise;
    return { got: input, key: run.key, attempts: run.attempts };
  });
  w.handle(wfFail, () => {
    throw new RangeError('bad thing');
  });
  w.handle(wfBad, async () => 10n);
  const ids = [];
  for (let i = 0; i < 4; i++) ids.push(await c.send(wfOk, `k${i}`, { i }));
  const done = w.run();
  for (let i = 0; i < 4; i++) {
    const run = await c.waitStatus(ids[i], 'completed');
    assert.deepStrictEqual(run.result, { got: [{ i }], key: `k${i}`, attempts: 1 });
  }
  const failed = await c.waitStatus(await c.send(wfFail, 'f'), 'failed');
  assert.strictEqual(failed.error, 'RangeError: bad thing');
  const bad = await c.waitStatus(await c.send(wfBad, 'b'), 'failed');
  assert.match(bad.error, /result: not JSON-serializable/);
  await w.stop();
  await done;
  assert.deepStrictEqual([w.completed, w.failed, w.lost, w.released], [4, 2, 0, 0]);
});

test('heartbeats keep a run past its lease', opts, async (t) => {
  const c = await start(t);
  const wf = unique('hb');
  // A heartbeat every 200 ms: the lease survives one that a loaded machine
  // delays by up to 1.8 s.
  const w = c.worker({ concurrency: 1, leaseMs: 2000, heartbeatFraction: 0.1 });
  const release = deferred();
  w.handle(wf, async () => {
    await release.promise;
    return 'done';
  });
  const runId = await c.send(wf, 'k');
  w.run();
  const first = (await c.waitStatus(runId, 'leased')).leaseExpiresMs;
  // A lease extended from its first expiry on: without heartbeats the run
  // would have gone back to pending for a second attempt by then.
  await waitFor(async () => (await c.client.getRun(runId)).leaseExpiresMs >= first + 2000,
    'heartbeats to keep the lease past its first expiry');
  release.resolve();
  const run = await c.waitStatus(runId, 'completed');
  assert.deepStrictEqual([run.result, run.attempts], ['done', 1]);
});

test('stop finishes cooperative runs and releases the rest', opts, async (t) => {
  const c = await start(t);
  const wfCoop = unique('coop');
  const wfStuck = unique('stuck');
  const w = c.worker({ concurrency: 2 });
  let started = 0;
  const never = deferred();
  t.after(() => never.resolve());
  w.handle(wfCoop, async (input, run) => {
    started++;
    await new Promise((resolve) => run.signal.addEventListener('abort', resolve));
    return 'finished';
  });
  w.handle(wfStuck, async () => {
    started++;
    await never.promise;
    return 'too late';
  });
  const coopId = await c.send(wfCoop, 'c');
  const stuckId = await c.send(wfStuck, 's');
  const done = w.run();
  await waitFor(() => started === 2, 'both handlers to start');
  // A grace no machine outlasts for the cooperative run; once it has
  // finished, a second stop() ends the grace for the stuck one. (A short
  // grace that runs out instead raced the cooperative run's completion on a
  // loaded machine.)
  const stopped = w.stop({ graceMs: 2 * WAIT_MS });
  await waitFor(() => w.completed === 1, 'the cooperative run to finish during the grace');
  await w.stop({ graceMs: 0 });
  await stopped;
  await done;
  assert.strictEqual((await c.client.getRun(coopId)).result, 'finished');
  assert.deepStrictEqual([w.completed, w.released], [1, 1]);
  // Released: pending again at once, and the attempt does not count.
  const run = await c.client.getRun(stuckId);
  assert.deepStrictEqual([run.status, run.attempts], ['pending', 0]);
  const again = await c.client.pollRuns({ workflows: [wfStuck], workerId: 'other', waitMs: 5000 });
  assert.deepStrictEqual(again.map((r) => r.runId), [stuckId]);
});

test('retryable errors are retried and a cancel reaches the handler', opts, async (t) => {
  const c = await start(t);
  const wfFlaky = unique('flaky');
  const wfLong = unique('long');
  // Cancels reach the handler with heartbeats (every 300 ms); the lease
  // outlives one that a loaded machine delays by up to 2.7 s.
  const w = c.worker({ concurrency: 2, leaseMs: 3000, heartbeatFraction: 0.1 });
  const tries = [];
  w.handle(wfFlaky, (input, run) => {
    tries.push(run.attempts);
    if (run.attempts < 3) {
      throw new kf.RetryableError('not yet');
    }
    return 'third time';
  });
  w.handle(wfLong, async (input, run) => {
    await waitFor(() => run.cancelRequested, 'the cancel to reach the handler');
    return 'stopped early';
  });
  const retryNow = kf.batch({ maxEvents: 1, retry: kf.retry({ maxAttempts: 3, initialBackoffMs: 0 }) });
  const flakyId = (await c.client.sendEvent(wfFlaky, 'k', 1, { rule: retryNow })).runId;
  const longId = await c.send(wfLong, 'k');
  const done = w.run();
  assert.strictEqual((await c.waitStatus(flakyId, 'completed')).result, 'third time');
  assert.deepStrictEqual(tries, [1, 2, 3]);
  await c.waitStatus(longId, 'leased');
  await c.client.cancelRun(longId);
  assert.strictEqual((await c.waitStatus(longId, 'cancelled')).result, 'stopped early');
  await w.stop();
  await done;
  assert.deepStrictEqual([w.completed, w.retried, w.cancelled, w.failed], [1, 2, 1, 0]);
});

test('SIGTERM finishes the held run and exits', opts, async (t) => {
  const c = await start(t);
  const wf = unique('term');
  const script = `
    const kf = require(${JSON.stringify(path.resolve(__dirname, '..'))});
    const w = new kf.Worker({ addr: process.argv[1], concurrency: 2, pollWaitMs: 1000 });
    w.handle(process.argv[2], async (input, run) => {
      console.log('started'); // the test's cue for SIGTERM
      await new Promise((resolve) => run.signal.addEventListener('abort', resolve));
      return { stoppedCleanly: input };
    });
    w.run().then(() => console.log('completed=' + w.completed + ' released=' + w.released));
  `;
  const runId = await c.send(wf, 'k', 'x');
  const child = spawn(process.execPath, ['-e', script, c.server.target, wf]);
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => { out += d; });
  child.stderr.on('data', (d) => { err += d; });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  t.after(() => child.exitCode === null && child.kill('SIGKILL'));
  // SIGTERM once the handler runs: the server shows the run leased before
  // the worker has it, and a stop then cancels the poll.
  await waitFor(() => out.includes('started\n'), 'the handler to start');
  child.kill('SIGTERM');
  assert.strictEqual(await exited, 0, err);
  assert.strictEqual(out.trim(), 'started\ncompleted=1 released=0');
  assert.deepStrictEqual((await c.client.getRun(runId)).result, { stoppedCleanly: ['x'] });
});

test('reconnects after keyflowd restarts', opts, async (t) => {
  const c = await start(t);
  const wf = unique('re');
  const w = c.worker({ concurrency: 2 });
  w.handle(wf, (input) => input);
  const done = w.run();
  assert.deepStrictEqual((await c.waitStatus(await c.send(wf, 'a', 1), 'completed')).result, [1]);
  await c.server.restartSamePort();
  // Calls fail fast (UNAVAILABLE) until the channel has reconnected.
  const runId = await waitFor(() => c.send(wf, 'b', 2).catch((e) => {
    if (e.codeName !== 'UNAVAILABLE') throw e;
    return null;
  }), 'keyflowd to answer again');
  assert.deepStrictEqual((await c.waitStatus(runId, 'completed')).result, [2]);
  await w.stop();
  await done;
  assert.strictEqual(w.completed, 2);
});
