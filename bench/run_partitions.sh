#!/usr/bin/env bash
# run_partitions.sh - SendEvent and PushBatch with 1, 2 and 8 partitions in
# one process, in the same run (bench/README.md, "Partitions";
# docs/scaling.md).
#
# One keyflowd per partition count starts over a fresh data directory, side
# by side (--partition-count 1, 2 and 8: 8 is a new data set's default);
# each round measures SendEvent
# (kf_load, debounce 60 s windows, uniform keys) and PushBatch (kf_fnload,
# running_sum, one batch outstanding per producer) against each in turn,
# so that the machine's other work weighs on all alike. Only one
# server is under load at a time (the idle one sleeps in its engine threads).
# It prints one line per measurement and a summary: the median rate of each
# side, and the server's CPU per event or row (server CPU-seconds / items),
# which is what a capacity model extrapolates from. It reports; it never
# asserts.
#
# Environment (all optional):
#   BUILD_DIR      build tree (default <repo>/build-bench)
#   COUNTS         the partition counts compared (default "1 2 8")
#   ROUNDS         rounds over every count (default 3)
#   DURATION_S     measured seconds per run (default 6)
#   WARMUP_S       warm-up seconds per run (default 1)
#   CONCURRENCY    SendEvent calls in flight and PushBatch producers (default 64)
#   ROWS           rows per PushBatch (default 64)
#   PLACEMENTS     function placements PushBatch is measured with (default
#                  "single split": docs/scaling.md, "Placement")
#   KEYS           key space (default 10000)
#   RESULTS_DIR    where the logs and JSON lines go (default <build>/bench-results)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build-bench}
COUNTS=${COUNTS:-1 2 8}
ROUNDS=${ROUNDS:-3}
DURATION_S=${DURATION_S:-6}
WARMUP_S=${WARMUP_S:-1}
CONCURRENCY=${CONCURRENCY:-64}
ROWS=${ROWS:-64}
KEYS=${KEYS:-10000}
PLACEMENTS=${PLACEMENTS:-single split}
RESULTS_DIR=${RESULTS_DIR:-$BUILD_DIR/bench-results}
STAMP=partitions-$(date -u +%Y%m%dT%H%M%SZ)

log() { printf '== %s\n' "$*" >&2; }

log "building keyflowd, kf_load, kf_fnload and the handlers in $BUILD_DIR"
cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target keyflowd kf_load kf_fnload kf_handler_running_sum \
    >/dev/null
KEYFLOWD=$BUILD_DIR/service/main/keyflowd
KF_LOAD=$BUILD_DIR/bench/load/kf_load
KF_FNLOAD=$BUILD_DIR/bench/functions/kf_fnload
HANDLERS=$BUILD_DIR/handlers
mkdir -p "$RESULTS_DIR"
RESULTS=$RESULTS_DIR/$STAMP.jsonl
: >"$RESULTS"
WORK=$(mktemp -d "$BUILD_DIR/$STAMP.XXXXXX")
# running_sum's descriptor once per placement.
for placement in $PLACEMENTS; do
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["placement"] = sys.argv[2]
json.dump(d, open(sys.argv[3], "w"))' "$HANDLERS/running_sum.descriptor.json" "$placement" \
        "$WORK/running_sum.$placement.json"
done

declare -A PID PORT
stop_all() {
    for p in "${!PID[@]}"; do
        kill -TERM "${PID[$p]}" 2>/dev/null || true
        wait "${PID[$p]}" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap stop_all EXIT
trap 'exit 130' INT TERM

for p in $COUNTS; do
    mkdir -p "$WORK/p$p"
    "$KEYFLOWD" --data "$WORK/p$p/data" --partition-count "$p" --plugin-dir "$HANDLERS" \
        --grpc 127.0.0.1:0 --http 127.0.0.1:0 --port-file "$WORK/p$p/ports" \
        --log-level warn >"$RESULTS_DIR/$STAMP.p$p.log" 2>&1 &
    PID[$p]=$!
done
for p in $COUNTS; do
    for _ in $(seq 1 200); do
        [ -s "$WORK/p$p/ports" ] && break
        kill -0 "${PID[$p]}" 2>/dev/null || { log "keyflowd ($p partitions) died"; exit 1; }
        sleep 0.1
    done
    PORT[$p]=$(sed -n 's/^grpc=//p' "$WORK/p$p/ports")
done

# One measurement: prints "<rate> <server cpu %>" from the tool's human line.
measure() {
    local what=$1 p=$2 round=$3 line placement=${what#push.}
    if [ "$what" = send ]; then
        line=$("$KF_LOAD" --target "127.0.0.1:${PORT[$p]}" --rpc send \
            --concurrency "$CONCURRENCY" --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" \
            --keys "$KEYS" --workflow "bench-$STAMP-r$round" --server-pid "${PID[$p]}" |
            tee -a "$RESULTS" | grep -v '^{')
        printf '%s\n' "$line" | sed -n 's/.* \([0-9.]*\) ok\/s.*server \([0-9.]*\)%.*/\1 \2/p'
    else
        line=$("$KF_FNLOAD" --mode push --target "127.0.0.1:${PORT[$p]}" \
            --descriptor "$WORK/running_sum.$placement.json" \
            --function-id "bench-$STAMP-$placement-r$round" --producers "$CONCURRENCY" --rows "$ROWS" \
            --keys "$KEYS" --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" \
            --server-pid "${PID[$p]}" | tee -a "$RESULTS" | grep -v '^{')
        printf '%s\n' "$line" | sed -n 's/.* \([0-9.]*\) rows\/s.*server \([0-9.]*\)%.*/\1 \2/p'
    fi
    printf '%s\n' "$line" >&2
}

declare -A RATES CPUS
for round in $(seq 1 "$ROUNDS"); do
    for what in send $(printf 'push.%s ' $PLACEMENTS); do
        for p in $COUNTS; do
            log "round $round: $what, $p partition(s), load average $(cut -d' ' -f1-3 /proc/loadavg)"
            read -r rate cpu < <(measure "$what" "$p" "$round")
            RATES[$what.$p]="${RATES[$what.$p]:-} $rate"
            CPUS[$what.$p]="${CPUS[$what.$p]:-} $cpu"
        done
    done
done

median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

printf '\n| %-9s | partitions | rate per round | median | server CPU %% (median) | server CPU us per item |\n' "call"
printf '|---|---|---|---|---|---|\n'
for what in send $(printf 'push.%s ' $PLACEMENTS); do
    for p in $COUNTS; do
        rate=$(echo "${RATES[$what.$p]}" | median)
        cpu=$(echo "${CPUS[$what.$p]}" | median)
        per=$(awk -v c="$cpu" -v r="$rate" 'BEGIN { printf "%.2f", (r > 0 ? c / 100 * 1e6 / r : 0) }')
        printf '| %-9s | %d | %s | %s | %s | %s |\n' "$what" "$p" "${RATES[$what.$p]# }" \
            "$rate" "$cpu" "$per"
    done
done
printf '\nload average at the end: %s; %s cores\n' "$(cut -d' ' -f1-3 /proc/loadavg)" "$(nproc)"
log "JSON lines in $RESULTS"
