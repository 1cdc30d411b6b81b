// An independent gRPC reflection client (npm's grpc-js-reflection-client on
// @grpc/grpc-js), run by tests/e2e/test_reflection.py against keyflowd:
//
//   node reflection_client.js HOST:PORT v1|v1alpha WORKFLOW KEY
//
// It knows nothing of keyflow's .proto files: it lists the services, asks
// for the file defining keyflow.v1.Coordinators, builds the service and its
// messages from what came back, and calls SendEvent with them. It prints one
// JSON object: {"services": [...], "methods": [...], "receipt": {...}}.
'use strict';

const grpc = require('@grpc/grpc-js');
const { GrpcReflection } = require('grpc-js-reflection-client');

async function main() {
  const [target, version, workflow, key] = process.argv.slice(2);
  const reflection = new GrpcReflection(target, grpc.credentials.createInsecure(), {}, version);
  const services = await reflection.listServices();
  const methods = (await reflection.listMethods('keyflow.v1.Coordinators')).map((m) => m.name);
  const descriptor = await reflection.getDescriptorBySymbol('keyflow.v1.Coordinators');
  const pkg = descriptor.getPackageObject({ keepCase: true, longs: String, enums: String, defaults: false });
  const client = new pkg.keyflow.v1.Coordinators(target, grpc.credentials.createInsecure());
  const request = {
    workflow,
    key,
    event: { id: 'e-1', rule: { kind: 'RULE_KIND_DEBOUNCE', window_ms: '60000' }, input_json: '{"via":"reflection"}' },
  };
  const response = await new Promise((resolve, reject) => {
    client.SendEvent(request, { deadline: Date.now() + 10000 }, (err, res) => (err ? reject(err) : resolve(res)));
  });
  client.close();
  process.stdout.write(JSON.stringify({ services, methods, receipt: response.receipt }) + '\n');
}

main().catch((err) => {
  process.stderr.write(`reflection client failed: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
