#!/usr/bin/env bash
# soak.sh - a steady mixed load for a long time, sampled every 10 s, then
# the restart-to-ready time after it (bench/README.md, "Soak"). Run by hand,
# not in CI; it reports and never asserts.
#
# Starts keyflowd over a fresh data directory with output and run retention
# on (--output-retention-ms, --run-retention-ms), runs bench/soak.py against it
# for SOAK_S seconds (events, runs polled and completed, pushes with
# event-time timers, output read and trimmed, coordinator and run reads),
# which prints a line per sample (RSS, descriptors, data directory size,
# per-operation count, p50 and p99) and at the end the slopes after the
# warm-up and the p99 of the first and last 5 minutes. Then it stops
# keyflowd with SIGTERM, starts it again over the same directory and
# reports the time from exec to the port file and to the first 200 from
# /readyz.
#
# With CRASH=1 it crashes keyflowd instead: it watches the WAL (the *.log
# files) during the soak, learns its peak from the first drop (the WAL-cap
# flush), and sends SIGKILL when the WAL next reaches 90% of that peak (or
# at the end, when it never dropped). Then, CRASH_REPEAT times, it copies
# the crashed directory and times a start over the copy, each against a
# start over an empty directory in the same run.
#
# Environment (all optional; lib.sh documents BUILD_DIR, KEYFLOWD_ARGS, ...):
#   SOAK_S               seconds of load (default 900)
#   WARMUP_S             samples before this are left out of the slopes (default 120)
#   EVENTS_PER_S         SendEvent rate (default 200); KEYS coordinators (default 5000)
#   PUSHES_PER_S         PushBatch rate (default 10), ROWS_PER_PUSH (default 50)
#   OUTPUT_RETENTION_MS  keyflowd's --output-retention-ms (default 120000)
#   RUN_RETENTION_MS     keyflowd's --run-retention-ms (default 300000: finished
#                        runs are deleted within the soak, so disk can level off)
#   CRASH                1: SIGKILL at the WAL's peak instead of SIGTERM (default 0)
#   CRASH_REPEAT         starts timed over copies of the crashed directory (default 3)
#   CRASH_KEYFLOWDS      binaries started over those copies, in turn (default:
#                        KEYFLOWD), to compare builds over the same crash
#   KEYFLOWD             the keyflowd binary (default: built from this tree)
set -euo pipefail

# Before lib.sh, whose defaults of WARMUP_S and KEYS are for the short
# benchmarks.
SOAK_S=${SOAK_S:-900}
WARMUP_S=${WARMUP_S:-120}
EVENTS_PER_S=${EVENTS_PER_S:-200}
KEYS=${KEYS:-5000}
PUSHES_PER_S=${PUSHES_PER_S:-10}
ROWS_PER_PUSH=${ROWS_PER_PUSH:-50}
OUTPUT_RETENTION_MS=${OUTPUT_RETENTION_MS:-120000}
RUN_RETENTION_MS=${RUN_RETENTION_MS:-300000}
CRASH=${CRASH:-0}
CRASH_REPEAT=${CRASH_REPEAT:-3}

s_lib="$(dirname "$0")/lib.sh"
# shellcheck source=bench/lib.sh
. "$s_lib"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)-soak

# timed_start BINARY DIR: starts BINARY over DIR, prints "port_ms ready_ms
# open_ms recover_ms", stops it with SIGTERM.
timed_start() {
    local lines
    lines=$(wc -l <"$SERVER_LOG")
    START_DATA=$2 restart_server "$1" "${flags[@]}"
    local open_ms recover_ms
    open_ms=$(tail -n +"$((lines + 1))" "$SERVER_LOG" | sed -n 's/.*store opened.* open_ms=\([0-9]*\).*/\1/p' | tail -n 1)
    recover_ms=$(tail -n +"$((lines + 1))" "$SERVER_LOG" | sed -n 's/.*store opened.* recover_ms=\([0-9]*\).*/\1/p' | tail -n 1)
    stop_server
    echo "${PORT_MS:--} ${READY_MS:--} ${open_ms:--} ${recover_ms:--}"
}

crash_after_soak() {
    soak >>"$TEXT" 2>&1 &
    local soak_pid=$! wal peak=0 first_peak=0 end=$(( $(now_ms) + SOAK_S * 1000 ))
    while [ "$(now_ms)" -lt "$end" ] && kill -0 "$soak_pid" 2>/dev/null; do
        wal=$(wal_bytes)
        if [ "$first_peak" = 0 ]; then
            [ "$wal" -gt "$peak" ] && peak=$wal
            # A drop by half: the WAL-cap flush let the oldest files go.
            [ "$peak" -gt 0 ] && [ $((wal * 2)) -lt "$peak" ] && first_peak=$peak &&
                log "first WAL peak $(mib "$peak") MiB"
        elif [ $((wal * 10)) -ge $((first_peak * 9)) ]; then
            break
        fi
        sleep 0.2
    done
    wal=$(wal_bytes)
    kill -KILL "$SERVER_PID"
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
    kill "$soak_pid" 2>/dev/null || true
    wait "$soak_pid" 2>/dev/null || true
    log "SIGKILL with WAL $(mib "$wal") MiB (first peak $(mib "$first_peak") MiB)"
    mv "$WORK/data" "$WORK/crashed"
    local dir i crash empty
    dir=$(du -sb "$WORK/crashed" | cut -f1)
    {
        printf '| start | binary | WAL MiB | port file ms | ready ms | store open ms | engine recovery ms |\n'
        printf '|---|---|---:|---:|---:|---:|---:|\n'
    } | tee -a "$TEXT"
    local bin name
    for i in $(seq 1 "$CRASH_REPEAT"); do
        for bin in ${CRASH_KEYFLOWDS:-$KEYFLOWD}; do
            name=$(basename "$bin")
            rm -rf "$WORK/empty" "$WORK/copy"
            mkdir "$WORK/empty"
            read -r -a empty <<<"$(timed_start "$bin" "$WORK/empty")"
            cp -a "$WORK/crashed" "$WORK/copy"
            read -r -a crash <<<"$(timed_start "$bin" "$WORK/copy")"
            printf '| empty store %s | %s | 0 | %s | %s | %s | %s |\n' "$i" "$name" "${empty[@]}" |
                tee -a "$TEXT"
            printf '| after SIGKILL %s | %s | %s | %s | %s | %s | %s |\n' "$i" "$name" "$(mib "$wal")" \
                "${crash[@]}" | tee -a "$TEXT"
            printf '{"bench":"soak-crash","binary":"%s","soak_s":%s,"wal_bytes":%s,"dir_bytes":%s,"empty_ready_ms":%s,"ready_ms":%s}\n' \
                "$name" "$SOAK_S" "$wal" "$dir" "${empty[1]/-/null}" "${crash[1]/-/null}" >>"$RESULTS"
        done
    done
    log "load average: $(cut -d' ' -f1-3 /proc/loadavg); report in $TEXT"
}

build_targets keyflowd kf_handler_session_counter
KEYFLOWD=${KEYFLOWD:-$BUILD_DIR/service/main/keyflowd}
log "CPU idle before the run: $(idle_pct)%"

flags=(--plugin-dir "$BUILD_DIR/handlers" --output-retention-ms "$OUTPUT_RETENTION_MS"
       --run-retention-ms "$RUN_RETENTION_MS")
start_server "$KEYFLOWD" bench-soak "${flags[@]}"
soak() {
    exec env PYENV_VERSION=system KEYFLOW_BUILD_DIR="$BUILD_DIR" python3 "$ROOT/bench/soak.py" \
        --grpc "127.0.0.1:$GRPC_PORT" --pid "$SERVER_PID" --data "$WORK/data" \
        --handlers "$BUILD_DIR/handlers" --out "$RESULTS_DIR/$STAMP.samples.jsonl" \
        --duration-s "$SOAK_S" --warmup-s "$WARMUP_S" --events-per-s "$EVENTS_PER_S" \
        --keys "$KEYS" --pushes-per-s "$PUSHES_PER_S" --rows-per-push "$ROWS_PER_PUSH"
}

if [ "$CRASH" = 1 ]; then
    crash_after_soak
    exit 0
fi
soak | tee -a "$TEXT"

dir=$(du -sb "$WORK/data" | cut -f1)
stop_server
restart_server "$KEYFLOWD" "${flags[@]}"
rss_kib=$(awk '/^VmRSS/ { print $2 }' "/proc/$SERVER_PID/status")
open_ms=$(sed -n 's/.*store opened.* open_ms=\([0-9]*\).*/\1/p' "$SERVER_LOG" | tail -n 1)
recover_ms=$(sed -n 's/.*store opened.* recover_ms=\([0-9]*\).*/\1/p' "$SERVER_LOG" | tail -n 1)
printf 'restart after the soak: data directory %s MiB; port file %s ms, ready %s ms (store open %s ms, engine recovery %s ms); RSS after %s MiB\n' \
    "$(mib "$dir")" "${PORT_MS:--}" "${READY_MS:--}" "${open_ms:--}" "${recover_ms:--}" \
    "$(mib $((rss_kib * 1024)))" | tee -a "$TEXT"
printf '{"bench":"soak-restart","soak_s":%s,"dir_bytes":%s,"port_file_ms":%s,"ready_ms":%s}\n' \
    "$SOAK_S" "$dir" "${PORT_MS:-null}" "${READY_MS:-null}" >>"$RESULTS"
log "samples in $RESULTS_DIR/$STAMP.samples.jsonl, report in $TEXT"
