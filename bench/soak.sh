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
# Environment (all optional; lib.sh documents BUILD_DIR, KEYFLOWD_ARGS, ...):
#   SOAK_S               seconds of load (default 900)
#   WARMUP_S             samples before this are left out of the slopes (default 120)
#   EVENTS_PER_S         SendEvent rate (default 200); KEYS coordinators (default 5000)
#   PUSHES_PER_S         PushBatch rate (default 10), ROWS_PER_PUSH (default 50)
#   OUTPUT_RETENTION_MS  keyflowd's --output-retention-ms (default 120000)
#   RUN_RETENTION_MS     keyflowd's --run-retention-ms (default 300000: finished
#                        runs are deleted within the soak, so disk can level off)
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

s_lib="$(dirname "$0")/lib.sh"
# shellcheck source=bench/lib.sh
. "$s_lib"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)-soak

build_targets keyflowd kf_handler_session_counter
KEYFLOWD=${KEYFLOWD:-$BUILD_DIR/service/main/keyflowd}
log "CPU idle before the run: $(idle_pct)%"

flags=(--plugin-dir "$BUILD_DIR/handlers" --output-retention-ms "$OUTPUT_RETENTION_MS"
       --run-retention-ms "$RUN_RETENTION_MS")
start_server "$KEYFLOWD" bench-soak "${flags[@]}"
PYENV_VERSION=system KEYFLOW_BUILD_DIR=$BUILD_DIR python3 "$ROOT/bench/soak.py" \
    --grpc "127.0.0.1:$GRPC_PORT" --pid "$SERVER_PID" --data "$WORK/data" \
    --handlers "$BUILD_DIR/handlers" --out "$RESULTS_DIR/$STAMP.samples.jsonl" \
    --duration-s "$SOAK_S" --warmup-s "$WARMUP_S" --events-per-s "$EVENTS_PER_S" --keys "$KEYS" \
    --pushes-per-s "$PUSHES_PER_S" --rows-per-push "$ROWS_PER_PUSH" | tee -a "$TEXT"

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
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
