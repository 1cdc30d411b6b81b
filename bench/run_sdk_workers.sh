#!/usr/bin/env bash
# bench/run_sdk_workers.sh - run-worker throughput of the Python and Node
# SDKs against one keyflowd: each creates RUNS runs (batch rule, max_events
# 1), then completes them with its Worker at CONCURRENCY runs in flight
# (handler: the input back). Numbers go in bench/README.md ("SDK run
# workers"). It reports; it never asserts.
#
#   bench/run_sdk_workers.sh                    # about 30 s after the build
#   RUNS=50000 CONCURRENCY=128 bench/run_sdk_workers.sh
#   BUILD_DIR=build bench/run_sdk_workers.sh    # reuse a build tree
#
# Knobs: RUNS (20000), CONCURRENCY (64), SDKS ("python node"), and lib.sh's
# BUILD_DIR, KEYFLOWD_ARGS, RESULTS_DIR, KEEP_DATA.
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
RUNS=${RUNS:-20000}
CONCURRENCY=${CONCURRENCY:-64}
SDKS=${SDKS:-python node}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)-sdk-workers

log "building keyflowd and the Python stubs in $BUILD_DIR"
# An existing build tree is used as configured (BUILD_DIR=build keeps its tests).
[ -f "$BUILD_DIR/CMakeCache.txt" ] ||
    cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target keyflowd kf_python_stubs >/dev/null
[ -d "$ROOT/clients/node/node_modules" ] || (cd "$ROOT/clients/node" && npm ci --no-audit --no-fund)

log "CPU idle before the run: $(idle_pct)%"
start_server "$BUILD_DIR/service/main/keyflowd" sdk-bench
ADDR=127.0.0.1:$GRPC_PORT
for sdk in $SDKS; do
    case $sdk in
        python)
            PYENV_VERSION=system PYTHONPATH="$ROOT/clients/python" /usr/bin/python3 \
                "$ROOT/bench/sdk/py_worker_bench.py" "$ADDR" "$RUNS" "$CONCURRENCY" | collect ;;
        node)
            node "$ROOT/bench/sdk/node_worker_bench.js" "$ADDR" "$RUNS" "$CONCURRENCY" | collect ;;
        *) log "unknown SDK $sdk"; exit 2 ;;
    esac
done
log "results: $RESULTS"
