"""running_sum.py - the Python port of handlers/running_sum.c, served to
keyflowd as a REMOTE function. Given the same rows it produces byte for
byte the output of the native handler (clients/python/tests/test_remote.py
checks it).

Per row activation, in this order of precedence (as running_sum.c):
  1. `reset` exists and is true  -> CLEAR the state,     emit sum = null
  2. `amount` is null            -> SET_NULL the state,  emit sum = null
  3. otherwise                   -> SET (prior value, or 0 when the state is
                                    absent or null) + amount, emit the sum;
                                    int64 overflow refuses the whole call
Every row activation emits one row whose `previous` names the state kind it
saw ("absent", "null" or "value"). Timer activations change nothing.

Run it against a keyflowd on 127.0.0.1:50051 (KEYFLOW_ADDR):

    PYENV_VERSION=system PYTHONPATH=clients/python \\
        python3 clients/python/examples/running_sum.py [FUNCTION_ID]

It registers FUNCTION_ID (default running_sum_py) as a REMOTE function with
running_sum's schemas and this file's digest, then serves it until Ctrl-C.
Once keyflowd has welcomed its stream (batches pushed from then on are
handled) it prints "serving FUNCTION_ID" on stdout, which a script started
in the background can wait for before pushing.
"""

import os
import sys
import threading

import keyflow

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def running_sum(act):
    if act.is_timer:
        return  # the function declares no timers: nothing to do
    previous = act.state_kind
    reset = act.get("reset")
    if reset:
        act.clear_state()
        total = None
    else:
        amount = act["amount"]
        if amount is None:
            act.set_state_null()
            total = None
        else:
            base = act.state if previous == "value" else 0
            total = base + amount
            if not INT64_MIN <= total <= INT64_MAX:
                act.fail("running_sum: int64 overflow adding amount %d to sum %d of key '%s' "
                         "(activation %d)" % (amount, base, _cut(act.key_text), act.id))
            act.set_state(total)
    act.emit(key=act.key_text, ts=act.event_time_us, sum=total, previous=previous)


def _cut(text, limit=64):
    """At most `limit` bytes of UTF-8, cut before a continuation byte (as
    running_sum.c's key_prefix_len)."""
    data = text.encode()
    if len(data) <= limit:
        return text
    n = limit
    while n > 0 and (data[n] & 0xC0) == 0x80:
        n -= 1
    return data[:n].decode()


DESCRIPTOR = {
    "version": 1,
    "pipelineStateId": "",
    "determinism": "DETERMINISM_REPLAY_SAFE",
    "inputSchema": {"fields": [
        {"name": "user", "type": "FIELD_TYPE_UTF8"},
        {"name": "ts", "type": "FIELD_TYPE_TIMESTAMP_US"},
        {"name": "amount", "type": "FIELD_TYPE_INT64", "nullable": True}]},
    "outputSchema": {"fields": [
        {"name": "key", "type": "FIELD_TYPE_UTF8"},
        {"name": "ts", "type": "FIELD_TYPE_TIMESTAMP_US"},
        {"name": "sum", "type": "FIELD_TYPE_INT64", "nullable": True},
        {"name": "previous", "type": "FIELD_TYPE_UTF8"}]},
    "keyColumns": ["user"],
    "eventTimeColumn": "ts",
    "outputEventTimeColumn": "ts",
    "valueStateName": "sum",
    "timerNames": [],
}


def main():
    function_id = sys.argv[1] if len(sys.argv) > 1 else "running_sum_py"
    worker = keyflow.FunctionWorker(function_id, running_sum, concurrency=8)
    base = dict(DESCRIPTOR, functionId=function_id, pipelineStateId=function_id + ".v1")
    reply = worker.client.register_function(worker.descriptor_for(base))
    print("registered %s (digest %s)%s" % (function_id, worker.digest,
          ", already" if reply.already_registered else ""), file=sys.stderr)

    def announce():
        if worker.wait_welcomed():
            print("serving %s" % function_id, flush=True)

    threading.Thread(target=announce, daemon=True).start()
    worker.run()


if __name__ == "__main__":
    main()
