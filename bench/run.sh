#!/usr/bin/env bash
# run.sh - one command that benchmarks keyflowd on this machine (bench/README.md).
#
# Builds kf_load and keyflowd, starts keyflowd on 127.0.0.1 (ports chosen by
# the kernel) over a fresh data directory on the work tree's disk, then runs:
#   1. the fdatasync probe next to the data directory (three file layouts);
#   2. for each concurrency: Health/Check (the no-op gRPC baseline), then
#      SendEvent (debounce, 60 s window, uniform keys), each with a warm-up;
#   3. the HTTP gateway under wrk at 64 connections: POST events, GET /healthz;
#   4. SendEvents: BATCH_EVENTS-event calls at BATCH_CONCURRENCY in flight,
#      against single-event SendEvent at the same concurrency (suite "events");
# and prints a markdown table with the ratios the performance targets ask
# for. It reports; it never asserts (exit 0 unless the setup itself fails).
# keyflowd is stopped with SIGTERM on every exit path. Then, unless SUITES
# says otherwise, it runs bench/run_functions.sh (process functions: its own
# keyflowd, its own table; its knobs are documented in that script).
#
# Environment (all optional):
#   BUILD_DIR      build tree (default <repo>/build-bench)
#   DURATION_S     measured seconds per run (default 10)
#   WARMUP_S       warm-up seconds per run (default 2)
#   CONCURRENCIES  gRPC concurrencies (default "1 16 64 256")
#   KEYS           key space (default 10000)
#   CHANNELS       gRPC channels = connections, capped at the concurrency (default 1)
#   THREADS        kf_load client threads (default 1)
#   HTTP_CONNECTIONS / WRK_THREADS   wrk settings (default 64 / 1)
#   FSYNC_COUNT    fdatasync probe records (default 2000)
#   KEYFLOWD_ARGS  extra keyflowd flags, e.g. "--grpc-threads 2"
#   RESULTS_DIR    where the logs and JSON lines go (default <build>/bench-results)
#   KEEP_DATA=1    keep the RocksDB directory afterwards
#   SUITES         what to run: "coordinators" (steps 1-3), "events" (step 4),
#                  "functions" (default all three)
#   BATCH_EVENTS / BATCH_CONCURRENCY   step 4's events per call and calls in
#                  flight (default 100 / 16)
set -euo pipefail

s_lib="$(dirname "$0")/lib.sh"
# shellcheck source=bench/lib.sh
. "$s_lib"

# Knobs of this script only (lib.sh sets the shared ones).
CONCURRENCIES=${CONCURRENCIES:-"1 16 64 256"}
THREADS=${THREADS:-1}
HTTP_CONNECTIONS=${HTTP_CONNECTIONS:-64}
WRK_THREADS=${WRK_THREADS:-1}
FSYNC_GAP_US=${FSYNC_GAP_US:-300}
SUITES=${SUITES:-"coordinators events functions"}
BATCH_EVENTS=${BATCH_EVENTS:-100}
BATCH_CONCURRENCY=${BATCH_CONCURRENCY:-16}
has_suite() { case " $SUITES " in *" $1 "*) return 0 ;; esac; return 1; }

STAMP=$(date -u +%Y%m%dT%H%M%SZ)

# ---- build ------------------------------------------------------------------
log "building kf_load and keyflowd in $BUILD_DIR"
build_log=$(mktemp)
# Tests are not built: the benchmark needs two targets, and a test file
# someone is still writing must not stop it.
if ! { cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_BUILD_TESTS=OFF &&
       cmake --build "$BUILD_DIR" -j"$(nproc)" --target kf_load keyflowd; } >"$build_log" 2>&1
then
    tail -n 40 "$build_log" >&2
    rm -f "$build_log"
    log "build failed"
    exit 1
fi
rm -f "$build_log"
KF_LOAD=$BUILD_DIR/bench/load/kf_load
KEYFLOWD=$BUILD_DIR/service/main/keyflowd
IDLE_BEFORE=$(idle_pct)
log "CPU idle before the run: $IDLE_BEFORE%"
if has_suite coordinators; then
    command -v wrk >/dev/null || { log "wrk is not installed (apt-get install wrk)"; exit 1; }
fi
command -v curl >/dev/null || { log "curl is not installed"; exit 1; }

# ---- server -----------------------------------------------------------------
start_server "$KEYFLOWD" bench-run

metric() {  # prints one counter from the server's /metrics, or 0
    curl -s --max-time 5 "http://127.0.0.1:$HTTP_PORT/metrics" |
        awk -v name="$1" '$1 == name { print $2; found = 1 } END { if (!found) print 0 }'
}

# Appends the commit-group counters' change across one run, so the table can
# show how many events each fdatasync carried.
server_delta() {  # label groups_before events_before
    local groups events
    groups=$(metric keyflow_commit_groups_total)
    events=$(metric keyflow_events_accepted_total)
    printf '{"kind":"server_delta","label":"%s","groups":%s,"events":%s}\n' "$1" \
        "$(awk -v a="$groups" -v b="$2" 'BEGIN { printf "%d", a - b }')" \
        "$(awk -v a="$events" -v b="$3" 'BEGIN { printf "%d", a - b }')" >>"$RESULTS"
}

cpu_ticks() {  # user + system clock ticks of a process (fields 14, 15 of its stat)
    sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'
}
machine_ticks() {  # busy clock ticks of all CPUs: user nice system irq softirq steal
    awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat
}

if has_suite coordinators; then
# ---- 1. fdatasync probe -------------------------------------------------------
# "append" is the reference the c=1 target is measured against; the other two
# layouts show what RocksDB's WAL options could buy (kf_load.c explains them).
for mode in append fallocate overwrite; do
    log "fdatasync probe, $mode ($FSYNC_COUNT records) in $WORK"
    "$KF_LOAD" --fsync-probe "$WORK" --count "$FSYNC_COUNT" --fsync-mode "$mode" | collect ||
        log "fsync probe failed"
done
# Context for c=1, not the reference: a c=1 client leaves the disk idle
# between syncs (the reply's and the next request's trip), and an fdatasync
# after an idle gap is slower on this VM's disk than back to back.
log "fdatasync probe, append with ${FSYNC_GAP_US} us idle before each record"
"$KF_LOAD" --fsync-probe "$WORK" --count "$FSYNC_COUNT" --fsync-mode append \
    --gap-us "$FSYNC_GAP_US" | collect || log "fsync probe failed"

# ---- 2. gRPC ------------------------------------------------------------------
for c in $CONCURRENCIES; do
    ch=$(( CHANNELS < c ? CHANNELS : c ))
    for rpc in health send; do
        log "gRPC $rpc concurrency $c (channels $ch, threads $THREADS)"
        g0=$(metric keyflow_commit_groups_total)
        e0=$(metric keyflow_events_accepted_total)
        "$KF_LOAD" --target "127.0.0.1:$GRPC_PORT" --rpc "$rpc" --concurrency "$c" \
            --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" --keys "$KEYS" \
            --channels "$ch" --threads "$THREADS" --workflow "bench-$STAMP-$rpc-c$c" \
            --server-pid "$SERVER_PID" | collect || log "kf_load failed (status $?)"
        server_delta "grpc-$rpc-c$c" "$g0" "$e0"
    done
done

# ---- 3. HTTP gateway ----------------------------------------------------------
for mode in healthz send; do
    log "HTTP $mode: wrk $HTTP_CONNECTIONS connections, $WRK_THREADS thread(s)"
    # wrk has no warm-up: a short unrecorded run opens the connections first.
    if awk -v s="$WARMUP_S" 'BEGIN { exit !(s >= 1) }'; then
        KF_HTTP_MODE=$mode KF_WORKFLOW="bench-$STAMP-http-warmup" KF_KEYS=$KEYS \
            KF_CONNECTIONS=$HTTP_CONNECTIONS wrk -t"$WRK_THREADS" -c"$HTTP_CONNECTIONS" \
            -d"${WARMUP_S}s" -s "$ROOT/bench/http_load.lua" "http://127.0.0.1:$HTTP_PORT" \
            >/dev/null || log "wrk warm-up failed"
    fi
    g0=$(metric keyflow_commit_groups_total)
    e0=$(metric keyflow_events_accepted_total)
    # kf_load measures CPU itself; for wrk the script samples the server,
    # the machine and wrk's own user + system time around the run.
    t0=$(date +%s%N)
    c0=$(cpu_ticks "$SERVER_PID")
    m0=$(machine_ticks)
    TIMEFORMAT='%U %S'
    { time KF_HTTP_MODE=$mode KF_WORKFLOW="bench-$STAMP-http-$mode" KF_KEYS=$KEYS \
        KF_CONNECTIONS=$HTTP_CONNECTIONS wrk -t"$WRK_THREADS" -c"$HTTP_CONNECTIONS" \
        -d"${DURATION_S}s" --timeout 10s -s "$ROOT/bench/http_load.lua" \
        "http://127.0.0.1:$HTTP_PORT" >"$WORK/wrk.out"; } 2>"$WORK/wrk.time" ||
        log "wrk failed: $(head -c 500 "$WORK/wrk.time")"
    m1=$(machine_ticks)
    c1=$(cpu_ticks "$SERVER_PID")
    t1=$(date +%s%N)
    collect <"$WORK/wrk.out"
    tail -n 1 "$WORK/wrk.time" | awk -v a="$c0" -v b="$c1" -v m0="$m0" -v m1="$m1" \
        -v t0="$t0" -v t1="$t1" -v hz="$(getconf CLK_TCK)" -v label="http-$mode" '{
            s = (t1 - t0) / 1e9; server = 100 * (b - a) / hz / s; client = 100 * ($1 + $2) / s
            other = 100 * (m1 - m0) / hz / s - server - client
            printf "{\"kind\":\"server_cpu\",\"label\":\"%s\",\"server_cpu_pct\":%.1f," \
                   "\"client_cpu_pct\":%.1f,\"other_cpu_pct\":%.1f}\n", label, server, client, \
                   (other < 0 ? 0 : other)
        }' >>"$RESULTS"
    server_delta "http-$mode" "$g0" "$e0"
done
fi

# ---- 4. SendEvents: many events per call --------------------------------------
# The same server and the same key space: single-event SendEvent, then
# SendEvents of BATCH_EVENTS events (each on its own uniform key, debounce
# windows that stay open), both at BATCH_CONCURRENCY calls in flight.
if has_suite events; then
    for rpc in send send-events; do
        log "gRPC $rpc concurrency $BATCH_CONCURRENCY ($BATCH_EVENTS events per SendEvents call)"
        g0=$(metric keyflow_commit_groups_total)
        e0=$(metric keyflow_events_accepted_total)
        "$KF_LOAD" --target "127.0.0.1:$GRPC_PORT" --rpc "$rpc" --concurrency "$BATCH_CONCURRENCY" \
            --batch-events "$BATCH_EVENTS" --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" \
            --keys "$KEYS" --channels 1 --threads "$THREADS" \
            --workflow "bench-$STAMP-batch-$rpc" --server-pid "$SERVER_PID" | collect ||
            log "kf_load failed (status $?)"
        server_delta "batch-$rpc" "$g0" "$e0"
    done
fi
curl -s --max-time 5 "http://127.0.0.1:$HTTP_PORT/metrics" >"$RESULTS_DIR/$STAMP.metrics.txt" ||
    true
stop_server

# ---- report -------------------------------------------------------------------
disk=$(df -P "$ROOT" | awk 'NR == 2 { print $1 }')
cache=$(cat "/sys/block/$(basename "$disk")/queue/write_cache" 2>/dev/null || echo unknown)
{
    printf '\n## keyflowd benchmark, %s\n\n' "$(date -u '+%Y-%m-%d %H:%M UTC')"
    printf 'Machine: %s cores (nproc), kernel %s, disk %s (%s, write cache: %s). ' "$(nproc)" \
        "$(uname -r)" "$disk" "$(findmnt -no FSTYPE -T "$ROOT" 2>/dev/null || echo '?')" "$cache"
    printf 'Runs: %s s after %s s warm-up; %s keys; gRPC channels %s, client threads %s. ' \
        "$DURATION_S" "$WARMUP_S" "$KEYS" "$CHANNELS" "$THREADS"
    printf 'CPU idle in the 2 s before keyflowd started: %s%% (below ~95%% means other ' \
        "$IDLE_BEFORE"
    printf 'work was running).\n\n'
    awk -f - "$RESULTS" <<'AWK'
function field(line, key,    s) {
    if (!match(line, "\"" key "\":[^,}]*")) return ""
    s = substr(line, RSTART + length(key) + 3, RLENGTH - length(key) - 3)
    gsub(/"/, "", s)
    return s
}
function num(x) { return x == "" ? 0 : x + 0 }
function fmt_int(x,    s, r) {  # 12345.6 -> 12,346
    s = sprintf("%.0f", x); r = ""
    while (length(s) > 3) { r = "," substr(s, length(s) - 2) r; s = substr(s, 1, length(s) - 3) }
    return s r
}
/"kind":"fsync_probe"/ {
    m = field($0, "mode"); gap = num(field($0, "gap_us"))
    if (gap > 0) {
        m = sprintf("%s with %d us idle before each record", m, gap)
        fsgap50 = num(field($0, "fdatasync_p50_us")); fsgap = gap
    }
    fs_text = fs_text sprintf("%s%s p50 %.1f us, p99 %.1f us, %s ops/s", \
                              fs_text == "" ? "" : "; ", m, num(field($0, "fdatasync_p50_us")), \
                              num(field($0, "fdatasync_p99_us")), fmt_int(field($0, "ops_per_s")))
    if (m == "append") {
        fs50 = num(field($0, "fdatasync_p50_us")); have_fs = 1
    }
}
/"kind":"grpc_load"/ {
    rpc = field($0, "rpc")
    batch = field($0, "workflow") ~ /-batch-/
    key = (batch ? "batch " : "grpc ") rpc " " field($0, "concurrency")
    order[++n] = key
    label[key] = "gRPC | " (rpc == "send" ? "SendEvent" : rpc == "send-events" ? \
                 "SendEvents (" field($0, "batch_events") " events)" : "Health/Check") " | " \
                 field($0, "concurrency")
    events_rate[key] = num(field($0, "events_per_s")); bev[key] = field($0, "batch_events")
    event_errors[key] = num(field($0, "event_errors"))
    rate[key] = num(field($0, "throughput_per_s")); p50[key] = num(field($0, "p50_us"))
    p99[key] = num(field($0, "p99_us")); p999[key] = num(field($0, "p999_us"))
    mx[key] = num(field($0, "max_us")); err[key] = num(field($0, "errors"))
    scpu[key] = field($0, "server_cpu_pct") "%"; ccpu[key] = field($0, "client_cpu_pct") "%"
    ocpu[key] = field($0, "other_cpu_pct") "%"
    delta_of[(batch ? "batch-" rpc : "grpc-" rpc "-c" field($0, "concurrency"))] = key
}
/"kind":"http_load"/ {
    key = "http " field($0, "mode")
    order[++n] = key
    label[key] = "HTTP | " (field($0, "mode") == "send" ? "POST events" : "GET /healthz") " | " \
                 field($0, "connections") " conns"
    rate[key] = num(field($0, "throughput_per_s")); p50[key] = num(field($0, "p50_us"))
    p99[key] = num(field($0, "p99_us")); p999[key] = num(field($0, "p999_us"))
    mx[key] = num(field($0, "max_us")); err[key] = num(field($0, "error_total"))
    scpu[key] = "-"; ccpu[key] = "-"; ocpu[key] = "-"
    delta_of["http-" field($0, "mode")] = key
}
/"kind":"server_cpu"/ {
    k = delta_of[field($0, "label")]
    if (k != "") {
        scpu[k] = field($0, "server_cpu_pct") "%"; ccpu[k] = field($0, "client_cpu_pct") "%"
        ocpu[k] = field($0, "other_cpu_pct") "%"
    }
}
/"kind":"server_delta"/ {
    k = delta_of[field($0, "label")]
    if (k != "" && num(field($0, "groups")) > 0 && num(field($0, "events")) > 0) {
        per_group[k] = sprintf("%.1f", num(field($0, "events")) / num(field($0, "groups")))
    }
}
END {
    if (fs_text != "") {
        printf "fdatasync probe (pwrite 100 B + fdatasync; file layout: result): %s\n\n", fs_text
    }
    print "| transport | call | concurrency | ok/s | p50 us | p99 us | p999 us | max us " \
          "| errors | events per commit group | server CPU | client CPU | other CPU |"
    print "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= n; i++) {
        k = order[i]
        printf "| %s | %s | %.1f | %.1f | %.1f | %.1f | %d | %s | %s | %s | %s |\n", label[k], \
               fmt_int(rate[k]), p50[k], p99[k], p999[k], mx[k], err[k], \
               (k in per_group ? per_group[k] : "-"), scpu[k], ccpu[k], ocpu[k]
    }
    print ""
    print "CPU is in percent of one core, as top shows it; \"other\" is" \
          " everything else that ran on the machine during the window."
    worst = 0
    for (k in ocpu) {
        if (ocpu[k] + 0 > worst) { worst = ocpu[k] + 0; worst_k = label[k] }
    }
    if (worst > 20) {
        printf "\n**Noisy run:** other work used up to %.0f%% of a core (%s); the numbers " \
               "below are not trustworthy. Rerun on a quiet machine.\n", worst, worst_k
    }
    print ""
    print "| target | measured | goal | result |"
    print "|---|---|---|---|"
    k = "grpc send 1"
    if ((k in p50) && have_fs) {
        d = p50[k] - fs50
        printf "| c=1: SendEvent p50 minus fdatasync p50 | %.1f - %.1f = %.1f us " \
               "| < 100 us | %s |\n", p50[k], fs50, d, \
               (d < 100 ? "met" : sprintf("missed by %.1f us", d - 100))
    }
    h = "grpc health 1"
    if ((k in p50) && (h in p50) && have_fs) {
        # Context for the line above: the no-op round trip is part of the 100 us.
        printf "| c=1: of which no-op RPC (Health/Check p50) | %.1f us | (context) | - |\n", p50[h]
        printf "| c=1: of which the rest (SendEvent - Health - fdatasync) | %.1f us " \
               "| (context) | - |\n", p50[k] - p50[h] - fs50
    }
    if ((k in p50) && fsgap > 0) {
        printf "| c=1: fdatasync p50 after %d us idle (as c=1 traffic leaves the disk) " \
               "| %.1f us | (context) | - |\n", fsgap, fsgap50
    }
    k = "grpc send 64"
    if (k in rate) {
        printf "| c=64: durable events/s | %s | >= 25,000 | %s |\n", fmt_int(rate[k]), \
               (rate[k] >= 25000 ? "met" : sprintf("missed by %s/s (%.0f%% of goal)", \
               fmt_int(25000 - rate[k]), 100 * rate[k] / 25000))
    }
    h = "grpc health 64"
    if ((k in rate) && (h in rate) && rate[h] > 0) {
        r = 100 * rate[k] / rate[h]
        printf "| c=64: SendEvent / Health throughput | %s / %s = %.1f%% | >= 80%% | %s |\n", \
               fmt_int(rate[k]), fmt_int(rate[h]), r, \
               (r >= 80 ? "met" : sprintf("missed by %.1f points", 80 - r))
    }
    for (k in events_rate) {
        if (k ~ /^batch send-events/) { kb = k; cb = substr(k, length("batch send-events ") + 1) }
    }
    if (kb != "") {
        k1 = "batch send " cb
        printf "| c=%s: durable events/s with SendEvents of %s events (refused: %d) | %s " \
               "| >= 200,000 | %s |\n", cb, bev[kb], event_errors[kb], \
               fmt_int(events_rate[kb]), (events_rate[kb] >= 200000 ? "met" : \
               sprintf("missed (%.0f%% of goal)", 100 * events_rate[kb] / 200000))
        if (k1 in rate && rate[k1] > 0) {
            printf "| c=%s: the same with single-event SendEvent | %s (SendEvents: %.1fx) " \
                   "| (context) | - |\n", cb, fmt_int(rate[k1]), events_rate[kb] / rate[k1]
        }
    }
    k = "http send"; h = "http healthz"
    if ((k in rate) && (h in rate) && rate[h] > 0) {
        printf "| HTTP, 64 conns: POST events/s (vs GET /healthz) | %s (%.1f%% of %s) " \
               "| reported | - |\n", fmt_int(rate[k]), 100 * rate[k] / rate[h], fmt_int(rate[h])
    }
}
AWK
    printf '\nRaw JSON lines: %s\n' "$RESULTS"
} | tee -a "$TEXT"

case " $SUITES " in
    *" functions "*)
        run_functions || log "bench/run_functions.sh failed (status $?)" ;;
esac
