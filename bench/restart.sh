#!/usr/bin/env bash
# restart.sh - restart-to-ready time of keyflowd after a load that leaves
# many coordinators and a large write-ahead log behind (bench/README.md,
# "Restart after load").
#
# Starts keyflowd over a fresh data directory, runs SendEvent at concurrency
# 64 over COORDINATORS keys with debounce windows of 60 s (every key keeps an open
# window, so every coordinator must be in memory after the restart) for
# LOAD_S seconds, stops it with SIGTERM, and restarts it over the same
# directory. Reports the WAL (the *.log files RocksDB must replay) and the
# data directory before the restart, and the time from exec to the port file
# (keyflowd writes it once it serves) and to the first 200 from /readyz.
# It reports; it never asserts.
#
# Environment (all optional; lib.sh documents BUILD_DIR, KEYFLOWD_ARGS, ...):
#   COORDINATORS keys with an open window (default 65000)
#   INPUT_BYTES  event input size (default 1024)
#   LOAD_S       seconds of load (default 20)
#   KEYFLOWD     the keyflowd binary to measure (default: built from this tree);
#                point it at another build to compare two versions
set -euo pipefail

s_lib="$(dirname "$0")/lib.sh"
# shellcheck source=bench/lib.sh
. "$s_lib"

COORDINATORS=${COORDINATORS:-65000}
INPUT_BYTES=${INPUT_BYTES:-1024}
LOAD_S=${LOAD_S:-20}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)

build_targets kf_load keyflowd
KF_LOAD=$BUILD_DIR/bench/load/kf_load
KEYFLOWD=${KEYFLOWD:-$BUILD_DIR/service/main/keyflowd}
log "CPU idle before the run: $(idle_pct)%"

start_server "$KEYFLOWD" bench-restart
"$KF_LOAD" --target "127.0.0.1:$GRPC_PORT" --rpc send --concurrency 64 --keys "$COORDINATORS" \
    --input-bytes "$INPUT_BYTES" --duration-s "$LOAD_S" --warmup-s 0 --workflow restart \
    --server-pid "$SERVER_PID" | collect


stop_begin=$(now_ms)
stop_server
stop_ms=$(( $(now_ms) - stop_begin ))
wal=$(wal_bytes)
dir=$(dir_bytes)
log "after the load: WAL $(mib "$wal") MiB, data directory $(mib "$dir") MiB; SIGTERM took $stop_ms ms"

restart_server "$KEYFLOWD"
port_ms=$PORT_MS
ready_ms=$READY_MS
rss_kib=$(awk '/^VmRSS/ { print $2 }' "/proc/$SERVER_PID/status")
after=$(wal_bytes)
# "store opened open_ms=X recover_ms=Y" (older builds: -)
open_ms=$(sed -n 's/.*store opened.* open_ms=\([0-9]*\).*/\1/p' "$SERVER_LOG" | tail -n 1)
recover_ms=$(sed -n 's/.*store opened.* recover_ms=\([0-9]*\).*/\1/p' "$SERVER_LOG" | tail -n 1)
{
    printf '| coordinators | input bytes | load s | WAL before restart MiB | data dir MiB | store open ms | engine recovery ms | port file ms | ready ms | WAL after restart MiB | RSS after restart MiB |\n'
    printf '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$COORDINATORS" "$INPUT_BYTES" \
        "$LOAD_S" "$(mib "$wal")" "$(mib "$dir")" "${open_ms:--}" "${recover_ms:--}" "${port_ms:--}" \
        "${ready_ms:--}" "$(mib "$after")" "$(mib $((rss_kib * 1024)))"
} | tee -a "$TEXT"
printf '{"bench":"restart","coordinators":%s,"input_bytes":%s,"load_s":%s,"wal_bytes":%s,"dir_bytes":%s,"port_file_ms":%s,"ready_ms":%s}\n' \
    "$COORDINATORS" "$INPUT_BYTES" "$LOAD_S" "$wal" "$dir" "${port_ms:-null}" "${ready_ms:-null}" >>"$RESULTS"
