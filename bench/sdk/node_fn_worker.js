'use strict';
// bench/sdk/node_fn_worker.js ADDR FUNCTION_ID DESCRIPTOR_OUT [CONCURRENCY]
//
// The Node SDK's remote running_sum (clients/node/examples/running_sum.js)
// for bench/run_remote_functions.sh: writes the REMOTE descriptor with its
// digest to DESCRIPTOR_OUT (from the native one the build makes), serves
// FUNCTION_ID until SIGTERM, then prints one JSON line: calls, activations
// and the CPU seconds the worker process used.
const fs = require('fs');
const path = require('path');
const ROOT = path.resolve(__dirname, '..', '..');
const kf = require(path.join(ROOT, 'clients', 'node'));
const { runningSum } = require(path.join(ROOT, 'clients', 'node', 'examples', 'running_sum'));

async function main() {
  const [addr, functionId, out, conc] = process.argv.slice(2);
  const concurrency = Number(conc || 8);
  const native = path.join(process.env.BUILD_DIR || path.join(ROOT, 'build'), 'handlers',
    'running_sum.descriptor.json');
  const worker = new kf.FunctionWorker({
    client: new kf.Client({ addr }), functionId, handler: runningSum, concurrency,
    sources: [path.join(ROOT, 'clients', 'node', 'examples', 'running_sum.js')], name: 'bench-node',
  });
  fs.writeFileSync(`${out}.tmp`, JSON.stringify(kf.remoteDescriptor(native, worker.digest)));
  fs.renameSync(`${out}.tmp`, out);
  const t0 = process.hrtime.bigint();
  await worker.run();
  const cpu = process.cpuUsage();
  console.log(JSON.stringify({
    kind: 'fn_worker', sdk: 'node', function_id: functionId, concurrency, calls: worker.calls,
    activations: worker.activations, refused: worker.refused, connects: worker.connects,
    wall_s: Number(process.hrtime.bigint() - t0) / 1e9, cpu_user_s: cpu.user / 1e6,
    cpu_sys_s: cpu.system / 1e6,
  }));
  worker.client.close();
}

main().catch((e) => {
  process.stderr.write(`${e.stack || e}\n`);
  process.exit(1);
});
