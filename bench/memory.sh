#!/usr/bin/env bash
# memory.sh - RSS per open debounce window, and restart-to-ready with many
# windows open, against an empty store in the same run (bench/README.md,
# "Coordinator memory").
#
# Starts keyflowd over a fresh data directory, stops it and times a start of
# the empty store (exec to the first 200 from /readyz) and reads its RSS.
# Then, for each count in WINDOWS (ascending), opens that many debounce
# windows of one hour (kf_load --rpc send-events --cover 1: one pass, 500
# consecutive keys per call; the keyflow_open_windows gauge shows how many
# opened), waits SETTLE_S and reads the RSS. Finally it stops keyflowd with
# SIGTERM and times the restart with the last count open. It reports; it
# never asserts.
#
# Environment (all optional; lib.sh documents BUILD_DIR, KEYFLOWD_ARGS, ...):
#   WINDOWS      counts of open windows, ascending (default "100000 1000000")
#   INPUT_BYTES  event input size (default 0: {"n":I}, about 10 bytes)
#   SETTLE_S     seconds between the last event and the RSS reading (default 5)
#   KEYFLOWD     the keyflowd binary to measure (default: built from this tree)
set -euo pipefail

s_lib="$(dirname "$0")/lib.sh"
# shellcheck source=bench/lib.sh
. "$s_lib"

WINDOWS=${WINDOWS:-"100000 1000000"}
INPUT_BYTES=${INPUT_BYTES:-0}
SETTLE_S=${SETTLE_S:-5}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)-memory

build_targets kf_load keyflowd
KF_LOAD=$BUILD_DIR/bench/load/kf_load
KEYFLOWD=${KEYFLOWD:-$BUILD_DIR/service/main/keyflowd}
log "CPU idle before the run: $(idle_pct)%; load average $(cut -d' ' -f1-3 /proc/loadavg)"

start_server "$KEYFLOWD" bench-memory
stop_server
restart_server "$KEYFLOWD"
empty_ready_ms=$READY_MS
sleep "$SETTLE_S"
empty_rss=$(rss_bytes)
log "empty store: ready in ${empty_ready_ms:--} ms, RSS $(mib "$empty_rss") MiB"

rows=
for n in $WINDOWS; do
    begin=$(now_ms)
    # One pass: every key once, 500 per call; kf_load stops when done.
    "$KF_LOAD" --target "127.0.0.1:$GRPC_PORT" --rpc send-events --cover 1 --batch-events 500 \
        --concurrency 4 --keys "$n" --input-bytes "$INPUT_BYTES" --window-ms 3600000 \
        --duration-s 600 --warmup-s 0 --workflow memory --server-pid "$SERVER_PID" | collect
    load_s=$(awk -v ms=$(( $(now_ms) - begin )) 'BEGIN { printf "%.1f", ms / 1000 }')
    sleep "$SETTLE_S"
    open=$(metric keyflow_open_windows)
    rss=$(rss_bytes)
    estimate=$(metric keyflow_memory_used_bytes)
    per=$(( (rss - empty_rss) / (open > 0 ? open : 1) ))
    log "$open windows open after $load_s s: RSS $(mib "$rss") MiB, $per bytes per window"
    rows+="| $open | $load_s | $(mib "$rss") | $per | $(( estimate / (open > 0 ? open : 1) )) |"$'\n'
done

stop_server
wal=$(wal_bytes)
dir=$(dir_bytes)
restart_server "$KEYFLOWD"
full_ready_ms=$READY_MS
reopened=$(metric keyflow_open_windows)
full_rss=$(rss_bytes)
# "store opened open_ms=X recover_ms=Y"
open_ms=$(sed -n 's/.*store opened.* open_ms=\([0-9]*\).*/\1/p' "$SERVER_LOG" | tail -n 1)
recover_ms=$(sed -n 's/.*store opened.* recover_ms=\([0-9]*\).*/\1/p' "$SERVER_LOG" | tail -n 1)
ratio=$(awk -v a="${full_ready_ms:-0}" -v b="${empty_ready_ms:-1}" 'BEGIN { printf "%.1f", a / (b > 0 ? b : 1) }')
{
    printf 'empty store: ready in %s ms, RSS %s MiB\n\n' "${empty_ready_ms:--}" "$(mib "$empty_rss")"
    printf '| open windows | load s | RSS MiB | RSS bytes per window over the empty store | engine estimate bytes per window |\n'
    printf '|---:|---:|---:|---:|---:|\n'
    printf '%s\n' "$rows"
    printf '| windows after restart | WAL MiB | data dir MiB | store open ms | engine recovery ms | ready ms | empty-store ready ms | ratio | RSS after restart MiB |\n'
    printf '|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$reopened" "$(mib "$wal")" "$(mib "$dir")" \
        "${open_ms:--}" "${recover_ms:--}" "${full_ready_ms:--}" "${empty_ready_ms:--}" "$ratio" \
        "$(mib "$full_rss")"
} | tee -a "$TEXT"
printf '{"bench":"memory","windows":%s,"empty_ready_ms":%s,"ready_ms":%s,"empty_rss":%s,"rss_after_restart":%s}\n' \
    "$reopened" "${empty_ready_ms:-null}" "${full_ready_ms:-null}" "$empty_rss" "$full_rss" >>"$RESULTS"
