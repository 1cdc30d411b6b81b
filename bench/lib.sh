# lib.sh - shared by bench/run.sh and bench/run_functions.sh (sourced, not
# run): logging, the idle-CPU reading, and one keyflowd on 127.0.0.1 port 0
# that is always stopped with SIGTERM when the script exits.
#
# The knobs both scripts take get their defaults here (each script's header
# documents them); the caller sets STAMP before calling start_server.
# shellcheck shell=bash

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build-bench}
DURATION_S=${DURATION_S:-10}
WARMUP_S=${WARMUP_S:-2}
KEYS=${KEYS:-10000}
CHANNELS=${CHANNELS:-1}
FSYNC_COUNT=${FSYNC_COUNT:-2000}
KEYFLOWD_ARGS=${KEYFLOWD_ARGS:-}
RESULTS_DIR=${RESULTS_DIR:-$BUILD_DIR/bench-results}
KEEP_DATA=${KEEP_DATA:-0}

log() { printf '== %s\n' "$*" >&2; }

# Percent of CPU time idle over two seconds, from /proc/stat. Other work on
# the machine skews every number, so the reports print this.
idle_pct() {
    local cpu u n s i w q sq st t1 i1 t2 i2
    read -r cpu u n s i w q sq st _ </proc/stat
    t1=$((u + n + s + i + w + q + sq + st)); i1=$((i + w))
    sleep 2
    read -r cpu u n s i w q sq st _ </proc/stat
    t2=$((u + n + s + i + w + q + sq + st)); i2=$((i + w))
    echo $(( 100 * (i2 - i1) / (t2 - t1 > 0 ? t2 - t1 : 1) ))
}

SERVER_PID=
STOP_WAIT_S=${STOP_WAIT_S:-30}

stop_server() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 $((STOP_WAIT_S * 10))); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$SERVER_PID" 2>/dev/null; then
            log "keyflowd did not stop within $STOP_WAIT_S s of SIGTERM; sending SIGKILL"
            kill -KILL "$SERVER_PID" 2>/dev/null || true
        fi
        local rc=0
        wait "$SERVER_PID" 2>/dev/null || rc=$?
        log "keyflowd exited with status $rc"
    fi
    SERVER_PID=
}

cleanup() {
    stop_server
    if [ "$KEEP_DATA" = 1 ]; then
        log "data kept in $WORK"
    else
        rm -rf "$WORK"
    fi
}

# start_server KEYFLOWD WORK_PREFIX [extra keyflowd flags...]
# Sets WORK, RESULTS, TEXT, SERVER_LOG, SERVER_PID, GRPC_PORT, HTTP_PORT.
# The data directory lives in the build tree: the same disk as the work tree,
# which is the disk whose fdatasync the probe measures.
start_server() {
    local keyflowd=$1 prefix=$2
    shift 2
    mkdir -p "$RESULTS_DIR"
    WORK=$(mktemp -d "$BUILD_DIR/$prefix.XXXXXX")
    RESULTS=$RESULTS_DIR/$STAMP.jsonl
    TEXT=$RESULTS_DIR/$STAMP.txt
    SERVER_LOG=$RESULTS_DIR/$STAMP.keyflowd.log
    : >"$RESULTS"
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    log "starting keyflowd (data $WORK/data, log $SERVER_LOG)"
    # shellcheck disable=SC2086  # KEYFLOWD_ARGS is a list of flags
    "$keyflowd" --data "$WORK/data" --grpc 127.0.0.1:0 --http 127.0.0.1:0 "$@" \
        --port-file "$WORK/ports" --log-level warn $KEYFLOWD_ARGS >"$SERVER_LOG" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 200); do
        [ -s "$WORK/ports" ] && break
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$SERVER_LOG" >&2; log "keyflowd died"; exit 1; }
        sleep 0.1
    done
    [ -s "$WORK/ports" ] || { log "keyflowd wrote no port file within 20 s"; exit 1; }
    GRPC_PORT=$(sed -n 's/^grpc=//p' "$WORK/ports")
    HTTP_PORT=$(sed -n 's/^http=//p' "$WORK/ports")
    log "keyflowd pid $SERVER_PID, grpc 127.0.0.1:$GRPC_PORT, http 127.0.0.1:$HTTP_PORT"
}

# build_targets TARGET...: configures $BUILD_DIR (RelWithDebInfo, tests
# not built: a benchmark needs a few targets, and a test file someone is
# still writing must not stop it) and builds the targets; on failure prints
# the end of the build log and exits.
build_targets() {
    local build_log
    log "building $* in $BUILD_DIR"
    build_log=$(mktemp)
    if ! { cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_BUILD_TESTS=OFF &&
           cmake --build "$BUILD_DIR" -j"$(nproc)" --target "$@"; } >"$build_log" 2>&1
    then
        tail -n 40 "$build_log" >&2
        rm -f "$build_log"
        log "build failed"
        exit 1
    fi
    rm -f "$build_log"
}

now_ms() { date +%s%3N; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
# The WAL a restart must replay (RocksDB's *.log files, in every partition's
# directory) and the whole store.
wal_bytes() { find "$WORK/data" -name '*.log' -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }'; }
dir_bytes() { du -sb "$WORK/data" | cut -f1; }
rss_bytes() { awk '/^VmRSS/ { print $2 * 1024 }' "/proc/$SERVER_PID/status"; }
# metric NAME: a gauge summed over partitions, from GET /metrics.
metric() {
    curl -s --max-time 5 "http://127.0.0.1:$HTTP_PORT/metrics" |
        awk -v n="$1" '$1 == n || index($1, n "{") == 1 { s += $2 } END { printf "%d\n", s }'
}

# restart_server KEYFLOWD [extra keyflowd flags...]: after stop_server,
# starts keyflowd again over $WORK/data (or $START_DATA when set; log
# level info: it logs "store opened in X ms, engine recovered in Y ms") and
# waits up to a minute for /readyz to answer 200. Sets SERVER_PID, GRPC_PORT, HTTP_PORT, and PORT_MS
# and READY_MS: from the exec to the port file and to the first 200.
restart_server() {
    local keyflowd=$1 begin
    shift
    rm -f "$WORK/ports"
    begin=$(now_ms)
    # shellcheck disable=SC2086  # KEYFLOWD_ARGS is a list of flags
    "$keyflowd" --data "${START_DATA:-$WORK/data}" --grpc 127.0.0.1:0 --http 127.0.0.1:0 "$@" \
        --port-file "$WORK/ports" --log-level info $KEYFLOWD_ARGS >>"$SERVER_LOG" 2>&1 &
    SERVER_PID=$!
    PORT_MS=
    READY_MS=
    for _ in $(seq 1 6000); do
        if [ -z "$PORT_MS" ] && [ -s "$WORK/ports" ]; then
            PORT_MS=$(( $(now_ms) - begin ))
            GRPC_PORT=$(sed -n 's/^grpc=//p' "$WORK/ports")
            HTTP_PORT=$(sed -n 's/^http=//p' "$WORK/ports")
        fi
        if [ -n "$PORT_MS" ] &&
           [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://127.0.0.1:$HTTP_PORT/readyz")" = 200 ]; then
            READY_MS=$(( $(now_ms) - begin ))
            return
        fi
        kill -0 "$SERVER_PID" 2>/dev/null || { tail -n 20 "$SERVER_LOG" >&2; log "keyflowd died"; exit 1; }
        sleep 0.01
    done
}

# Records JSON lines (starting with "{") and keeps the human lines.
collect() {
    local line
    while IFS= read -r line; do
        case $line in
            '{'*) printf '%s\n' "$line" >>"$RESULTS" ;;
            *) printf '%s\n' "$line" | tee -a "$TEXT" >&2 ;;
        esac
    done
}
