'use strict';
// Node SDK run worker throughput: RUNS runs are created first (batch rule,
// maxEvents 1: each event starts a run at once), then one keyflow Worker
// with CONCURRENCY runs in flight completes them all with the handler's
// value (the input back). Prints one human line and one JSON line.
//
//   node node_worker_bench.js ADDR RUNS CONCURRENCY
const path = require('path');
const crypto = require('crypto');
const kf = require(path.join(__dirname, '..', '..', 'clients', 'node'));

async function fill(client, workflow, runs, inFlight = 64) {
  let next = 0;
  const rule = kf.batch({ maxEvents: 1 });
  const lane = async () => {
    while (next < runs) {
      const i = next++;
      await client.sendEvent(workflow, `k${i}`, { n: i }, { rule });
    }
  };
  await Promise.all(Array.from({ length: inFlight }, lane));
}

async function main() {
  const [addr, runsText, concurrencyText] = process.argv.slice(2);
  const runs = Number(runsText);
  const concurrency = Number(concurrencyText);
  const client = new kf.Client({ addr });
  const workflow = `bench-node-${crypto.randomBytes(4).toString('hex')}`;
  let t0 = process.hrtime.bigint();
  await fill(client, workflow, runs);
  const fillS = Number(process.hrtime.bigint() - t0) / 1e9;

  const worker = new kf.Worker({
    client, concurrency, pollWaitMs: 1000, installSignalHandlers: false,
    pollers: Number(process.env.POLLERS || 2),
  });
  worker.handle(workflow, (input) => input);
  const cpu0 = process.cpuUsage();
  t0 = process.hrtime.bigint();
  const done = worker.run();
  while (worker.completed + worker.failed < runs) {
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  const elapsed = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  await worker.stop();
  await done;
  const out = {
    sdk: 'node', runs, concurrency, seconds: Number(elapsed.toFixed(3)),
    runs_per_s: Math.round(runs / elapsed), failed: worker.failed,
    worker_cpu_pct: Math.round((100 * (cpu.user + cpu.system)) / 1e6 / elapsed),
    fill_runs_per_s: Math.round(runs / fillS),
  };
  console.log(`node worker: ${runs} runs at ${concurrency} in flight in ${elapsed.toFixed(2)} s: ` +
    `${out.runs_per_s} runs/s (worker CPU ${out.worker_cpu_pct}%, failed ${worker.failed})`);
  console.log(JSON.stringify(out));
  client.close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
