"""bench/sdk/py_fn_worker.py ADDR FUNCTION_ID DESCRIPTOR_OUT [CONCURRENCY]

The Python SDK's remote running_sum (clients/python/examples/running_sum.py)
for bench/run_remote_functions.sh: writes the REMOTE descriptor with its
digest to DESCRIPTOR_OUT (from the native one the build makes), serves
FUNCTION_ID until SIGTERM, then prints one JSON line: calls, activations and
the CPU seconds the worker process used."""

import json
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "examples"))
import keyflow  # noqa: E402
import running_sum  # noqa: E402


def main():
    addr, function_id, out = sys.argv[1:4]
    concurrency = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    native = os.path.join(os.environ.get("BUILD_DIR", os.path.join(ROOT, "build")),
                          "handlers", "running_sum.descriptor.json")
    worker = keyflow.FunctionWorker(function_id, running_sum.running_sum,
                                    keyflow.Client(addr), concurrency=concurrency,
                                    name="bench-python")
    with open(out + ".tmp", "w") as f:
        json.dump(keyflow.remote_descriptor(native, worker.digest), f)
    os.rename(out + ".tmp", out)
    t0 = time.monotonic()
    worker.run()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"kind": "fn_worker", "sdk": "python", "function_id": function_id,
                      "concurrency": concurrency, "calls": worker.calls,
                      "activations": worker.activations, "refused": worker.refused,
                      "connects": worker.connects, "wall_s": round(time.monotonic() - t0, 3),
                      "cpu_user_s": ru.ru_utime, "cpu_sys_s": ru.ru_stime}, separators=(",", ":")),
          flush=True)


if __name__ == "__main__":
    main()
