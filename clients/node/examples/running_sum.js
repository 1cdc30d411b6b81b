'use strict';
// running_sum.js - the Node port of handlers/running_sum.c, served to
// keyflowd as a REMOTE function. Given the same rows it produces byte for
// byte the output of the native handler (test/remote.test.js checks it).
//
// Per row activation, in this order of precedence (as running_sum.c):
//   1. `reset` exists and is true  -> CLEAR the state,     emit sum = null
//   2. `amount` is null            -> SET_NULL the state,  emit sum = null
//   3. otherwise                   -> SET (prior value, or 0 when the state is
//                                     absent or null) + amount, emit the sum;
//                                     int64 overflow refuses the whole call
// Every row activation emits one row whose `previous` names the state kind
// it saw ("absent", "null" or "value"). Timer activations change nothing.
//
// Run it against a keyflowd on 127.0.0.1:50051 (KEYFLOW_ADDR):
//
//     node clients/node/examples/running_sum.js [FUNCTION_ID]
//
// It registers FUNCTION_ID (default running_sum_js) as a REMOTE function with
// running_sum's schemas and this file's digest, then serves it until Ctrl-C.
// Once keyflowd has welcomed its stream (batches pushed from then on are
// handled) it prints "serving FUNCTION_ID" on stdout.
const kf = require('..');

const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;

// base + amount, exactly: a number while it is a safe integer, else a BigInt.
function add(base, amount) {
  if (typeof base === 'number' && typeof amount === 'number') {
    const sum = base + amount;
    if (Number.isSafeInteger(sum)) {
      return sum;
    }
  }
  const big = BigInt(base) + BigInt(amount);
  return Number.isSafeInteger(Number(big)) ? Number(big) : big;
}

// At most 64 bytes of UTF-8, cut before a continuation byte (as
// running_sum.c's key_prefix_len).
function cut(text, limit = 64) {
  const buf = Buffer.from(text, 'utf8');
  if (buf.length <= limit) {
    return text;
  }
  let n = limit;
  while (n > 0 && (buf[n] & 0xc0) === 0x80) {
    n--;
  }
  return buf.subarray(0, n).toString('utf8');
}

function runningSum(act) {
  if (act.isTimer) {
    return; // the function declares no timers: nothing to do
  }
  const previous = act.stateKind;
  let total = null;
  const reset = act.has('reset') ? act.get('reset') : null; // optional, as in C
  if (reset) {
    act.clearState();
  } else {
    const amount = act.get('amount');
    if (amount === null) {
      act.setStateNull();
    } else {
      const base = previous === 'value' ? act.state : 0;
      total = add(base, amount);
      if (typeof total === 'bigint' && (total < INT64_MIN || total > INT64_MAX)) {
        act.fail(`running_sum: int64 overflow adding amount ${amount} to sum ${base} of key ` +
          `'${cut(act.keyText)}' (activation ${act.id})`);
      }
      act.setState(total);
    }
  }
  act.emit({ key: act.keyText, ts: act.eventTimeUs, sum: total, previous });
}

const DESCRIPTOR = {
  version: 1,
  determinism: 'DETERMINISM_REPLAY_SAFE',
  inputSchema: { fields: [
    { name: 'user', type: 'FIELD_TYPE_UTF8' },
    { name: 'ts', type: 'FIELD_TYPE_TIMESTAMP_US' },
    { name: 'amount', type: 'FIELD_TYPE_INT64', nullable: true }] },
  outputSchema: { fields: [
    { name: 'key', type: 'FIELD_TYPE_UTF8' },
    { name: 'ts', type: 'FIELD_TYPE_TIMESTAMP_US' },
    { name: 'sum', type: 'FIELD_TYPE_INT64', nullable: true },
    { name: 'previous', type: 'FIELD_TYPE_UTF8' }] },
  keyColumns: ['user'],
  eventTimeColumn: 'ts',
  outputEventTimeColumn: 'ts',
  valueStateName: 'sum',
  timerNames: [],
};

async function main() {
  const functionId = process.argv[2] || 'running_sum_js';
  const worker = new kf.FunctionWorker({ functionId, handler: runningSum, sources: [__filename],
    concurrency: 8 });
  const base = { ...DESCRIPTOR, functionId, pipelineStateId: `${functionId}.v1` };
  const reply = await worker.client.registerFunction(worker.descriptorFor(base));
  process.stderr.write(`registered ${functionId} (digest ${worker.digest})` +
    `${reply.alreadyRegistered ? ', already' : ''}\n`);
  // Once a stream is welcomed, pushed batches are handled: say so on
  // stdout, for a script that started this in the background.
  worker.welcomed().then(() => process.stdout.write(`serving ${functionId}\n`));
  await worker.run();
}

module.exports = { runningSum, DESCRIPTOR };

if (require.main === module) {
  main().catch((e) => {
    process.stderr.write(`${e.stack || e}\n`);
    process.exit(1);
  });
}
