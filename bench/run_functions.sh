#!/usr/bin/env bash
# run_functions.sh - benchmarks keyflowd's process functions on this machine
# (bench/README.md, section "Process functions"). bench/run.sh calls it after
# the coordinator benchmark; it also runs on its own.
#
# Builds kf_fnload, kf_load (for its fdatasync probe), keyflowd and the two
# example handlers, starts keyflowd on 127.0.0.1 (ports chosen by the kernel)
# with --plugin-dir <build>/handlers over a fresh data directory on the work
# tree's disk, then runs:
#   1. the fdatasync probe next to the data directory (append layout);
#   2. PushBatch of 4096-row batches (running_sum, uniform keys) from 1, 4
#      and 16 producers, each with a warm-up, a distinct function per run;
#   3. fill: 10 million rows into one more function (4 producers), then read:
#      ReadOutput pages of 65536 rows through all 10 million output rows;
#   4. timers: 1 million distinct-key rows into session_counter (one idle
#      timer each), then one watermark-only batch that makes all of them due
#      (its step fires the first max_timer_callbacks_per_step, the server's
#      follow-on steps the rest), timed until GetFunction shows none left;
# and prints a markdown table, input rows/s against the 500,000 rows/s target
# at 4 producers. It reports; it never asserts (exit 0 unless the setup
# itself fails). keyflowd is stopped with SIGTERM on every exit path.
#
# Environment (all optional):
#   BUILD_DIR        build tree (default <repo>/build-bench)
#   DURATION_S       measured seconds per push run (default 10)
#   WARMUP_S         warm-up seconds per push run (default 2)
#   PRODUCERS        producer counts for the push runs (default "1 4 16")
#   ROWS             rows per batch (default 4096)
#   KEYS             key space of the push runs (default 10000)
#   CHANNELS         gRPC channels = connections, capped at the producers (default 1)
#   READ_ROWS        rows pushed for the read test (default 10000000; 0 skips fill + read)
#   FILL_PRODUCERS   producers of the fill (default 4)
#   TIMERS           timers for the timer test (default 1000000; 0 skips it)
#   TIMER_CALLBACKS  the timer function's max_timer_callbacks_per_step (default:
#                    absent, so the server's default of 256)
#   FSYNC_COUNT      fdatasync probe records (default 2000)
#   KEYFLOWD_ARGS    extra keyflowd flags, e.g. "--grpc-threads 2"
#   RESULTS_DIR      where the logs and JSON lines go (default <build>/bench-results)
#   KEEP_DATA=1      keep the RocksDB directory afterwards
#   PERF_RECORD=1    perf record -g keyflowd during the 4-producer push run
#                    (written to RESULTS_DIR/<stamp>.perf.data)
set -euo pipefail

s_lib="$(dirname "$0")/lib.sh"
# shellcheck source=bench/lib.sh
. "$s_lib"

# Knobs of this script only (lib.sh sets the shared ones).
PRODUCERS=${PRODUCERS:-"1 4 16"}
ROWS=${ROWS:-4096}
READ_ROWS=${READ_ROWS:-10000000}
FILL_PRODUCERS=${FILL_PRODUCERS:-4}
TIMERS=${TIMERS:-1000000}
TIMER_CALLBACKS=${TIMER_CALLBACKS:-}
PERF_RECORD=${PERF_RECORD:-0}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)-functions

# ---- build ------------------------------------------------------------------
log "building kf_fnload, kf_load, keyflowd and the example handlers in $BUILD_DIR"
build_log=$(mktemp)
if ! { cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_BUILD_TESTS=OFF &&
       cmake --build "$BUILD_DIR" -j"$(nproc)" --target kf_fnload kf_load keyflowd \
           kf_handler_running_sum kf_handler_session_counter; } >"$build_log" 2>&1
then
    tail -n 40 "$build_log" >&2
    rm -f "$build_log"
    log "build failed"
    exit 1
fi
rm -f "$build_log"
KF_FNLOAD=$BUILD_DIR/bench/functions/kf_fnload
KF_LOAD=$BUILD_DIR/bench/load/kf_load
KEYFLOWD=$BUILD_DIR/service/main/keyflowd
HANDLERS=$BUILD_DIR/handlers
IDLE_BEFORE=$(idle_pct)
log "CPU idle before the run: $IDLE_BEFORE%"
command -v curl >/dev/null || { log "curl is not installed"; exit 1; }

# ---- server -----------------------------------------------------------------
start_server "$KEYFLOWD" bench-fn --plugin-dir "$HANDLERS"
TARGET=127.0.0.1:$GRPC_PORT

# The commit counters of the server's /metrics, as "name value" lines.
commit_metrics() {
    curl -s --max-time 5 "http://127.0.0.1:$HTTP_PORT/metrics" | awk '
        $1 ~ /^keyflow_commit_(sync_seconds|group_bytes|group_commands)_(sum|count)$/ ||
        $1 == "keyflow_function_input_rows_total" { print $1, $2 }'
}

# Appends the change of the commit counters across one run: how many
# batches shared an fdatasync, how long a synced write took, how many bytes
# it carried.
server_delta() {  # label before_file
    commit_metrics | awk -v label="$1" '
        FNR == NR { before[$1] = $2; next }
        { d[$1] = $2 - before[$1] }
        END {
            printf "{\"kind\":\"fn_server_delta\",\"label\":\"%s\",\"syncs\":%d,\"sync_s\":%.6f," \
                   "\"bytes\":%.0f,\"commands\":%d,\"groups\":%d,\"input_rows\":%d}\n", label, \
                   d["keyflow_commit_sync_seconds_count"], d["keyflow_commit_sync_seconds_sum"], \
                   d["keyflow_commit_group_bytes_sum"], d["keyflow_commit_group_commands_sum"], \
                   d["keyflow_commit_group_commands_count"], d["keyflow_function_input_rows_total"]
        }' "$2" - >>"$RESULTS"
}

# ---- 1. fdatasync probe -------------------------------------------------------
log "fdatasync probe, append ($FSYNC_COUNT records) in $WORK"
"$KF_LOAD" --fsync-probe "$WORK" --count "$FSYNC_COUNT" --fsync-mode append | collect ||
    log "fsync probe failed"

# ---- 2. push ------------------------------------------------------------------
for p in $PRODUCERS; do
    ch=$(( CHANNELS < p ? CHANNELS : p ))
    log "PushBatch, $p producer(s), $ROWS rows per batch, $KEYS keys (channels $ch)"
    commit_metrics >"$WORK/metrics.before"
    perf_pid=
    if [ "$PERF_RECORD" = 1 ] && [ "$p" = 4 ] && command -v perf >/dev/null; then
        # Samples the measured window only (after the warm-up).
        ( sleep "$WARMUP_S"; exec perf record -g -q -p "$SERVER_PID" \
              -o "$RESULTS_DIR/$STAMP.perf.data" -- sleep "$DURATION_S" ) >/dev/null 2>&1 &
        perf_pid=$!
    fi
    "$KF_FNLOAD" --mode push --target "$TARGET" --descriptor "$HANDLERS/running_sum.descriptor.json" \
        --function-id "fnbench-$STAMP-push-p$p" --producers "$p" --rows "$ROWS" --keys "$KEYS" \
        --channels "$ch" --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" \
        --server-pid "$SERVER_PID" | collect || log "kf_fnload push failed (status $?)"
    [ -n "$perf_pid" ] && { wait "$perf_pid" || log "perf record failed"; }
    server_delta "push-p$p" "$WORK/metrics.before"
done

# ---- 3. fill + read -----------------------------------------------------------
if [ "$READ_ROWS" -gt 0 ]; then
    log "fill: $READ_ROWS rows, $FILL_PRODUCERS producers"
    commit_metrics >"$WORK/metrics.before"
    "$KF_FNLOAD" --mode fill --target "$TARGET" --descriptor "$HANDLERS/running_sum.descriptor.json" \
        --function-id "fnbench-$STAMP-read" --producers "$FILL_PRODUCERS" --rows "$ROWS" \
        --keys "$KEYS" --rows-total "$READ_ROWS" --server-pid "$SERVER_PID" | collect ||
        log "kf_fnload fill failed (status $?)"
    server_delta fill "$WORK/metrics.before"
    log "read: ReadOutput pages of 65536 rows from after_seq 0"
    "$KF_FNLOAD" --mode read --target "$TARGET" --function-id "fnbench-$STAMP-read" --limit 65536 \
        --server-pid "$SERVER_PID" | collect || log "kf_fnload read failed (status $?)"
fi

# ---- 4. timers ------------------------------------------------------------------
if [ "$TIMERS" -gt 0 ]; then
    log "timers: $TIMERS distinct keys into session_counter, then one watermark past all"
    "$KF_FNLOAD" --mode timers --target "$TARGET" \
        --descriptor "$HANDLERS/session_counter.descriptor.json" \
        --function-id "fnbench-$STAMP-timers" --timers "$TIMERS" --producers "$FILL_PRODUCERS" \
        --rows "$ROWS" --server-pid "$SERVER_PID" --metrics "127.0.0.1:$HTTP_PORT" \
        ${TIMER_CALLBACKS:+--max-timer-callbacks "$TIMER_CALLBACKS"} | collect ||
        log "kf_fnload timers failed (status $?)"
fi
SERVER_PEAK_RSS_KB=$(awk '$1 == "VmHWM:" { print $2 }' "/proc/$SERVER_PID/status" 2>/dev/null || echo 0)
curl -s --max-time 5 "http://127.0.0.1:$HTTP_PORT/metrics" >"$RESULTS_DIR/$STAMP.metrics.txt" ||
    true
stop_server

# ---- report -------------------------------------------------------------------
disk=$(df -P "$ROOT" | awk 'NR == 2 { print $1 }')
cache=$(cat "/sys/block/$(basename "$disk")/queue/write_cache" 2>/dev/null || echo unknown)
{
    printf '\n## keyflowd process functions benchmark, %s\n\n' "$(date -u '+%Y-%m-%d %H:%M UTC')"
    printf 'Machine: %s cores (nproc), kernel %s, disk %s (%s, write cache: %s). ' "$(nproc)" \
        "$(uname -r)" "$disk" "$(findmnt -no FSTYPE -T "$ROOT" 2>/dev/null || echo '?')" "$cache"
    printf 'Push runs: %s s after %s s warm-up; %s rows per batch; %s keys; gRPC channels %s. ' \
        "$DURATION_S" "$WARMUP_S" "$ROWS" "$KEYS" "$CHANNELS"
    printf 'CPU idle in the 2 s before keyflowd started: %s%% (below ~95%% means other ' \
        "$IDLE_BEFORE"
    printf 'work was running). keyflowd peak RSS over the whole run: %s MB.\n\n' \
        "$(( ${SERVER_PEAK_RSS_KB:-0} / 1024 ))"
    awk -f - "$RESULTS" <<'AWK'
function field(line, key,    s) {
    if (!match(line, "\"" key "\":[^,}]*")) return ""
    s = substr(line, RSTART + length(key) + 3, RLENGTH - length(key) - 3)
    gsub(/"/, "", s)
    return s
}
function num(x) { return x == "" ? 0 : x + 0 }
# Remembers a step during which other work used more than 20% of a core.
function noisy(pct, what) {
    if (pct + 0 > 20) noisy_text = noisy_text sprintf("%s%s (%.0f%%)", noisy_text == "" ? "" : ", ", what, pct)
}
function fmt_int(x,    s, r, neg) {  # 12345.6 -> 12,346
    s = sprintf("%.0f", x); r = ""; neg = ""
    if (substr(s, 1, 1) == "-") { neg = "-"; s = substr(s, 2) }
    while (length(s) > 3) { r = "," substr(s, length(s) - 2) r; s = substr(s, 1, length(s) - 3) }
    return neg s r
}
# The busiest server thread, from "server_threads_cpu_pct":{"name":pct,...}.
function busiest(line,    body, n, parts, i, kv, best, best_name) {
    if (!match(line, /"server_threads_cpu_pct":\{[^}]*\}/)) return "-"
    body = substr(line, RSTART + 26, RLENGTH - 27)
    n = split(body, parts, ",")
    best = -1
    for (i = 1; i <= n; i++) {
        split(parts[i], kv, ":"); gsub(/"/, "", kv[1])
        if (kv[2] + 0 > best) { best = kv[2] + 0; best_name = kv[1] }
    }
    return best < 0 ? "-" : sprintf("%s %.0f%%", best_name, best)
}
/"kind":"fsync_probe"/ {
    fs50 = num(field($0, "fdatasync_p50_us")); fs99 = num(field($0, "fdatasync_p99_us"))
    fsops = num(field($0, "ops_per_s")); have_fs = 1
}
/"kind":"fn_push"/ {
    p = field($0, "producers"); order[++n] = p
    rows_s[p] = num(field($0, "rows_per_s")); batches_s[p] = num(field($0, "batches_per_s"))
    p50[p] = num(field($0, "p50_us")) / 1000; p99[p] = num(field($0, "p99_us")) / 1000
    err[p] = num(field($0, "errors")); scpu[p] = field($0, "server_cpu_pct")
    ccpu[p] = field($0, "client_cpu_pct"); ocpu[p] = field($0, "other_cpu_pct")
    top[p] = busiest($0)
    noisy(ocpu[p], "push, " p " producers")
}
/"kind":"fn_server_delta"/ {
    l = field($0, "label"); syncs = num(field($0, "syncs"))
    if (syncs > 0) {
        per_sync[l] = sprintf("%.1f", num(field($0, "commands")) / syncs)
        sync_ms[l] = sprintf("%.1f", 1000 * num(field($0, "sync_s")) / syncs)
        sync_mb[l] = sprintf("%.1f", num(field($0, "bytes")) / syncs / 1e6)
    }
}
/"kind":"fn_fill"/ {
    fill = sprintf("%s rows in %.1f s = %s rows/s (%s producers), errors %d", \
                   fmt_int(field($0, "rows_acked")), num(field($0, "window_s")), \
                   fmt_int(field($0, "rows_per_s")), field($0, "producers"), num(field($0, "errors")))
    noisy(field($0, "other_cpu_pct"), "fill")
}
/"kind":"fn_read"/ {
    read_line = sprintf("| ReadOutput, %s rows per page | %s rows in %s pages, %.1f s | %s rows/s " \
                        "| page p50 %.1f ms, p99 %.1f ms | %d%s | %s%% / %s%% / %s%% |", \
                        field($0, "limit"), fmt_int(field($0, "rows")), field($0, "pages"), \
                        num(field($0, "elapsed_s")), fmt_int(field($0, "rows_per_s")), \
                        num(field($0, "page_p50_us")) / 1000, num(field($0, "page_p99_us")) / 1000, \
                        num(field($0, "errors")), \
                        (field($0, "complete") == "true" && field($0, "check_ok") == "true") ? "" \
                            : " (INCOMPLETE or check failed)", \
                        field($0, "server_cpu_pct"), field($0, "client_cpu_pct"), \
                        field($0, "other_cpu_pct"))
    noisy(field($0, "other_cpu_pct"), "read")
}
/"kind":"fn_timers_load"/ {
    tload = sprintf("%s rows in %.1f s = %s rows/s", fmt_int(field($0, "rows_acked")), \
                    num(field($0, "window_s")), fmt_int(field($0, "rows_per_s")))
}
/"kind":"fn_timers"/ {
    t = field($0, "timers"); tps = num(field($0, "timers_per_s"))
    over50 = num(field($0, "steps_over_50ms")); steps = num(field($0, "steps"))
    rss_growth_mb = (num(field($0, "server_peak_rss_kb_after")) - \
                     num(field($0, "server_peak_rss_kb_before"))) / 1024
    have_timers = 1
    timers_line = sprintf("| fire %s due timers (one watermark-only PushBatch, then the server's " \
                          "follow-on steps) | %s: ack %.3f s (its step fired %s); all fired%s " \
                          "after %.2f s in %s steps (mean %.2f ms, %s over 50 ms), %s synced " \
                          "writes (%.2f s, %.0f MB); slowest GetFunction meanwhile %.1f ms " \
                          "| %s timers/s | peak RSS %s -> %s MB (+%.0f MB) | %s | %s%% / %s%% / %s%% |", \
                          fmt_int(t), field($0, "status"), num(field($0, "ack_s")), \
                          fmt_int(field($0, "step_timer_callbacks")), \
                          field($0, "fired_as_expected") == "true" ? "" : " (**not** as expected)", \
                          num(field($0, "total_s")), fmt_int(steps), \
                          num(field($0, "step_mean_ms")), fmt_int(over50), \
                          fmt_int(field($0, "synced_writes")), num(field($0, "write_s")), \
                          num(field($0, "write_mb")), num(field($0, "poll_max_ms")), \
                          fmt_int(tps), \
                          fmt_int(num(field($0, "server_peak_rss_kb_before")) / 1024), \
                          fmt_int(num(field($0, "server_peak_rss_kb_after")) / 1024), \
                          rss_growth_mb, \
                          field($0, "status") == "OK" ? "0" : field($0, "status_details"), \
                          field($0, "server_cpu_pct"), field($0, "client_cpu_pct"), \
                          field($0, "other_cpu_pct"))
    noisy(field($0, "other_cpu_pct"), "timers")
}
END {
    if (have_fs) {
        printf "fdatasync probe (pwrite 100 B + fdatasync, append): p50 %.1f us, p99 %.1f us, " \
               "%s ops/s.\n\n", fs50, fs99, fmt_int(fsops)
    }
    print "| producers | batches/s | input rows/s | ack p50 ms | ack p99 ms | errors " \
          "| batches per fdatasync | synced write ms (mean) | MB per synced write " \
          "| server CPU | client CPU | other CPU | busiest server thread |"
    print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    for (i = 1; i <= n; i++) {
        p = order[i]; l = "push-p" p
        printf "| %s | %.1f | %s | %.1f | %.1f | %d | %s | %s | %s | %s%% | %s%% | %s%% | %s |\n", \
               p, batches_s[p], fmt_int(rows_s[p]), p50[p], p99[p], err[p], \
               (l in per_sync ? per_sync[l] : "-"), (l in sync_ms ? sync_ms[l] : "-"), \
               (l in sync_mb ? sync_mb[l] : "-"), scpu[p], ccpu[p], ocpu[p], top[p]
    }
    print ""
    print "CPU is in percent of one core, as top shows it; \"other\" is everything else that" \
          " ran on the machine during the window."
    if (read_line != "" || timers_line != "") {
        print ""
        print "| step | result | rate | latency / memory | errors | server / client / other CPU |"
        print "|---|---|---:|---|---|---|"
        if (fill != "") printf "| fill (setup for the read) | %s | - | - | - | - |\n", fill
        if (read_line != "") print read_line
        if (tload != "") printf "| arm timers (setup) | %s | - | - | - | - |\n", tload
        if (timers_line != "") print timers_line
    }
    if (noisy_text != "") {
        printf "\n**Noisy:** other work used more than 20%% of a core during: %s. Those numbers " \
               "are not trustworthy; rerun on a quiet machine.\n", noisy_text
    }
    print ""
    print "| target | measured | goal | result |"
    print "|---|---|---|---|"
    if ("4" in rows_s) {
        r = rows_s["4"]
        printf "| 4 producers: durable input rows/s | %s | >= 500,000 | %s |\n", fmt_int(r), \
               (r >= 500000 ? sprintf("met (%.0f%% of target)", 100 * r / 500000) \
                            : sprintf("**missed by %s rows/s (%.0f%% of target)**", \
                                      fmt_int(500000 - r), 100 * r / 500000))
    }
    if (have_timers) {
        printf "| 1M due timers: timers/s overall | %s | >= 1,000,000 | %s |\n", fmt_int(tps), \
               (tps >= 1000000 ? "met" : sprintf("**missed** (%.0f%% of target)", tps / 10000))
        printf "| 1M due timers: steps longer than 50 ms | %s of %s | 0 | %s |\n", \
               fmt_int(over50), fmt_int(steps), (over50 == 0 ? "met" : "**missed**")
        printf "| 1M due timers: peak RSS growth | %.0f MB | < 200 MB | %s |\n", rss_growth_mb, \
               (rss_growth_mb < 200 ? "met" : "**missed**")
    }
    if (("4" in p50) && have_fs) {
        printf "| 4 producers: ack p50 vs fdatasync p50 | %.1f ms vs %.3f ms | reported | - |\n", \
               p50["4"], fs50 / 1000
    }
}
AWK
    printf '\nRaw JSON lines: %s\n' "$RESULTS"
} | tee -a "$TEXT"
