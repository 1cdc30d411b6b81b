#!/usr/bin/env bash
# bench/run_remote_functions.sh - PushBatch through REMOTE running_sum
# handlers served by the Python and Node SDKs' FunctionWorker, against the
# native running_sum.so in the same run and keyflowd (bench/README.md,
# "Remote handlers"). Each run: kf_fnload push, PRODUCERS producers, ROWS
# rows per batch, KEYS uniform keys, a fresh function; for the remote ones a
# worker process serves it (CONCURRENCY calls out) and reports its own CPU.
# It reports; it never asserts.
#
#   bench/run_remote_functions.sh                  # about a minute after the build
#   DURATION_S=5 KINDS="native python" bench/run_remote_functions.sh
#   BUILD_DIR=build bench/run_remote_functions.sh  # reuse a build tree
#
# Knobs: KINDS ("native python node"), PRODUCERS (4), ROWS (4096),
# CONCURRENCY (8), PERF_RECORD=1 (perf record -g keyflowd and the worker
# during each measured window), and lib.sh's BUILD_DIR, DURATION_S (10),
# WARMUP_S (2), KEYS (10000), KEYFLOWD_ARGS, RESULTS_DIR, KEEP_DATA.
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
KINDS=${KINDS:-native python node}
PRODUCERS=${PRODUCERS:-4}
ROWS=${ROWS:-4096}
CONCURRENCY=${CONCURRENCY:-8}
PERF_RECORD=${PERF_RECORD:-0}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)-remote

log "building keyflowd, kf_fnload, running_sum.so and the Python stubs in $BUILD_DIR"
[ -f "$BUILD_DIR/CMakeCache.txt" ] ||
    cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target keyflowd kf_fnload kf_handler_running_sum \
    kf_python_stubs >/dev/null
[ -d "$ROOT/clients/node/node_modules" ] || (cd "$ROOT/clients/node" && npm ci --no-audit --no-fund)
export BUILD_DIR
KF_FNLOAD=$BUILD_DIR/bench/functions/kf_fnload
IDLE_BEFORE=$(idle_pct)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
log "CPU idle before the run: $IDLE_BEFORE%, load average $LOAD_BEFORE"

start_server "$BUILD_DIR/service/main/keyflowd" bench-remote --plugin-dir "$BUILD_DIR/handlers"
ADDR=127.0.0.1:$GRPC_PORT
WORKER_PID=

stop_worker() {
    if [ -n "$WORKER_PID" ] && kill -0 "$WORKER_PID" 2>/dev/null; then
        kill -TERM "$WORKER_PID" 2>/dev/null || true
        wait "$WORKER_PID" 2>/dev/null || true
    fi
    WORKER_PID=
}
trap 'stop_worker; cleanup' EXIT

perf_window() {  # pid label: perf record -g over the measured window
    [ "$PERF_RECORD" = 1 ] && command -v perf >/dev/null || return 0
    ( sleep "$WARMUP_S"; exec perf record -g -q -p "$1" -o "$RESULTS_DIR/$STAMP.$2.perf.data" \
          -- sleep "$DURATION_S" ) >/dev/null 2>&1 &
}

for kind in $KINDS; do
    fid="rsbench-$kind-$STAMP"
    descriptor=$BUILD_DIR/handlers/running_sum.descriptor.json
    case $kind in
        native) ;;
        python)
            descriptor=$WORK/$kind.descriptor.json
            PYENV_VERSION=system PYTHONPATH="$ROOT/clients/python" /usr/bin/python3 \
                "$ROOT/bench/sdk/py_fn_worker.py" "$ADDR" "$fid" "$descriptor" "$CONCURRENCY" \
                > >(collect) 2>"$WORK/$kind.worker.log" &
            WORKER_PID=$! ;;
        node)
            descriptor=$WORK/$kind.descriptor.json
            node "$ROOT/bench/sdk/node_fn_worker.js" "$ADDR" "$fid" "$descriptor" "$CONCURRENCY" \
                > >(collect) 2>"$WORK/$kind.worker.log" &
            WORKER_PID=$! ;;
        *) log "unknown kind $kind"; exit 2 ;;
    esac
    for _ in $(seq 1 100); do
        [ -s "$descriptor" ] && break
        sleep 0.1
    done
    log "PushBatch through $kind running_sum: $PRODUCERS producers, $ROWS rows per batch, $KEYS keys"
    perf_window "$SERVER_PID" "$kind-keyflowd"
    [ -n "$WORKER_PID" ] && perf_window "$WORKER_PID" "$kind-worker"
    "$KF_FNLOAD" --mode push --target "$ADDR" --descriptor "$descriptor" --function-id "$fid" \
        --producers "$PRODUCERS" --rows "$ROWS" --keys "$KEYS" --duration-s "$DURATION_S" \
        --warmup-s "$WARMUP_S" --wait-available-s 30 --server-pid "$SERVER_PID" |
        sed "s/^{\"kind\":\"fn_push\"/{\"kind\":\"fn_push\",\"handler\":\"$kind\"/" | collect ||
        log "kf_fnload push failed (status $?)"
    wait_perf=$(jobs -p | grep -vx "${WORKER_PID:-none}" || true)
    stop_worker
    for p in $wait_perf; do [ "$p" = "$SERVER_PID" ] || wait "$p" 2>/dev/null || true; done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
stop_server

{
    printf '\n## Remote handlers, %s\n\n' "$(date -u '+%Y-%m-%d %H:%M UTC')"
    printf '%s cores; %s producers, %s rows per batch, %s keys, %s s after %s s warm-up; ' \
        "$(nproc)" "$PRODUCERS" "$ROWS" "$KEYS" "$DURATION_S" "$WARMUP_S"
    printf 'worker concurrency %s. Idle before: %s%%; load average before %s, after %s.\n\n' \
        "$CONCURRENCY" "$IDLE_BEFORE" "$LOAD_BEFORE" "$LOAD_AFTER"
    printf '| handler | input rows/s | p50 ms | p99 ms | handler calls | keyflowd CPU | worker CPU |\n'
    printf '|---|---:|---:|---:|---:|---:|---:|\n'
    awk '
function field(line, key,    s) {
    if (!match(line, "\"" key "\":[^,}]*")) return ""
    s = substr(line, RSTART + length(key) + 3, RLENGTH - length(key) - 3)
    gsub(/"/, "", s)
    return s
}
/"kind":"fn_worker"/ { w[field($0, "sdk")] = sprintf("%.0f%%", 100 * (field($0, "cpu_user_s") + field($0, "cpu_sys_s")) / (field($0, "wall_s") > 0 ? field($0, "wall_s") : 1)) }
/"kind":"fn_push"/ {
    k = field($0, "handler"); order[++n] = k
    line[k] = sprintf("| %s | %\047.0f | %.1f | %.1f | %s | %s%% |", k, field($0, "rows_per_s"),
        field($0, "p50_us") / 1000, field($0, "p99_us") / 1000, field($0, "handler_calls"),
        field($0, "server_cpu_pct"))
}
END { for (i = 1; i <= n; i++) printf "%s %s |\n", line[order[i]], (order[i] in w) ? w[order[i]] : "-" }
' "$RESULTS"
} | tee -a "$TEXT"
log "results: $RESULTS"
