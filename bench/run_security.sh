#!/usr/bin/env bash
# run_security.sh - what API keys and TLS cost SendEvent (bench/README.md,
# "Security").
#
# Starts three keyflowd on 127.0.0.1, each over its own fresh data directory:
#   off    plaintext, no API keys (the loopback default)
#   auth   plaintext, --auth; kf_load sends a key holding only events:send
#   tls    --auth and TLS (a test CA and an EC P-256 certificate made here
#          with openssl); kf_load verifies the server with --tls-ca
# and runs kf_load --rpc send at one concurrency against them in turn,
# ROUNDS times (off, auth, tls, off, auth, tls, ...), so that the machine's
# other load falls on all three alike. Prints each run, then a table with the
# per-round ratios auth/off and tls/off and their medians. It reports; it
# never asserts.
#
# Environment (all optional; lib.sh has the shared ones: BUILD_DIR, KEYS,
# CHANNELS, RESULTS_DIR, KEEP_DATA):
#   DURATION_S    measured seconds per run (default 5)
#   WARMUP_S      warm-up seconds per run (default 1)
#   CONCURRENCY   calls kept outstanding (default 64)
#   ROUNDS        rounds of the three runs (default 3)
set -euo pipefail

# Shorter than run.sh's defaults: nine runs share a shared machine.
DURATION_S=${DURATION_S:-5}
WARMUP_S=${WARMUP_S:-1}
s_lib="$(dirname "$0")/lib.sh"
# shellcheck source=bench/lib.sh
. "$s_lib"

CONCURRENCY=${CONCURRENCY:-64}
ROUNDS=${ROUNDS:-3}
STAMP=security-$(date -u +%Y%m%dT%H%M%SZ)
MODES="off auth tls"

log "building kf_load, keyflowd and keyflow in $BUILD_DIR"
build_log=$(mktemp)
if ! { cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_BUILD_TESTS=OFF &&
       cmake --build "$BUILD_DIR" -j"$(nproc)" --target kf_load keyflowd keyflow kf_authbench; } \
       >"$build_log" 2>&1
then
    tail -n 40 "$build_log" >&2
    rm -f "$build_log"
    log "build failed"
    exit 1
fi
rm -f "$build_log"
KF_LOAD=$BUILD_DIR/bench/load/kf_load
KEYFLOWD=$BUILD_DIR/service/main/keyflowd
CLI=$BUILD_DIR/clients/cli/keyflow

mkdir -p "$RESULTS_DIR"
RESULTS=$RESULTS_DIR/$STAMP.jsonl
TEXT=$RESULTS_DIR/$STAMP.txt
: >"$RESULTS"
WORK=$(mktemp -d "$BUILD_DIR/bench-security.XXXXXX")
declare -A PID GRPC KEY
stop_all() {
    local mode
    for mode in $MODES; do
        SERVER_PID=${PID[$mode]:-}
        stop_server
    done
    if [ "$KEEP_DATA" = 1 ]; then log "data kept in $WORK"; else rm -rf "$WORK"; fi
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# A CA and a server certificate for 127.0.0.1, made now: no key is committed.
tls_files() {
    local d=$WORK/tls
    mkdir -p "$d"
    (cd "$d" &&
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
            -out ca.pem -days 1 -subj /CN=bench-ca &&
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key \
            -out server.csr -subj /CN=127.0.0.1 &&
        printf 'subjectAltName=IP:127.0.0.1\n' >ext &&
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
            -extfile ext -out server.pem) >/dev/null 2>&1
}

start() { # start MODE [flags...]
    local mode=$1 dir=$WORK/$1
    shift
    mkdir -p "$dir"
    "$KEYFLOWD" --data "$dir/data" --grpc 127.0.0.1:0 --http 127.0.0.1:0 "$@" \
        --port-file "$dir/ports" --log-level warn $KEYFLOWD_ARGS >"$dir/keyflowd.log" 2>&1 &
    PID[$mode]=$!
    for _ in $(seq 1 200); do
        [ -s "$dir/ports" ] && break
        kill -0 "${PID[$mode]}" 2>/dev/null || { cat "$dir/keyflowd.log" >&2; exit 1; }
        sleep 0.1
    done
    GRPC[$mode]=$(sed -n 's/^grpc=//p' "$dir/ports")
    log "$mode: keyflowd pid ${PID[$mode]}, grpc 127.0.0.1:${GRPC[$mode]}"
}

# A key holding only events:send, made with the bootstrap admin key.
send_key() { # send_key MODE [CLI TLS flags...]
    local mode=$1
    shift
    "$CLI" --addr "127.0.0.1:${GRPC[$mode]}" "$@" \
        --api-key-file "$WORK/$mode/data/bootstrap-admin.key" \
        keys create --name bench --scope events:send 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["apiKey"])'
}

# The check alone, without a server: ns per call.
"$BUILD_DIR/bench/auth/kf_authbench" | tee -a "$TEXT" >&2

tls_files
start off
start auth --auth
start tls --auth --tls-cert "$WORK/tls/server.pem" --tls-key "$WORK/tls/server.key"
KEY[auth]=$(send_key auth)
KEY[tls]=$(send_key tls --tls-ca "$WORK/tls/ca.pem")
IDLE_BEFORE=$(idle_pct)
log "CPU idle before the runs: $IDLE_BEFORE%"

run() { # run MODE ROUND
    local mode=$1 round=$2
    local -a extra=()
    [ "$mode" = off ] || extra+=(--api-key "${KEY[$mode]}")
    [ "$mode" = tls ] && extra+=(--tls-ca "$WORK/tls/ca.pem")
    printf 'round %d %s: ' "$round" "$mode" | tee -a "$TEXT" >&2
    "$KF_LOAD" --target "127.0.0.1:${GRPC[$mode]}" --rpc send --concurrency "$CONCURRENCY" \
        --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" --keys "$KEYS" \
        --channels "$CHANNELS" --workflow "bench-$mode-$round" --server-pid "${PID[$mode]}" \
        "${extra[@]}" | sed "s/^{/{\"mode\":\"$mode\",\"round\":$round,/" | collect
}

for round in $(seq 1 "$ROUNDS"); do
    for mode in $MODES; do
        run "$mode" "$round"
    done
done

python3 - "$RESULTS" "$CONCURRENCY" "$IDLE_BEFORE" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    by.setdefault(r["round"], {})[r["mode"]] = r
print("\nSendEvent, c=%s, CPU idle before %s%%\n" % (sys.argv[2], sys.argv[3]))
print("| round | off ok/s | auth ok/s | tls ok/s | auth/off | tls/off | p99 us off / auth / tls | errors |")
print("|---|---|---|---|---|---|---|---|")
ra, rt = [], []
for rnd in sorted(by):
    m = by[rnd]
    if not all(k in m for k in ("off", "auth", "tls")):
        continue
    a = m["auth"]["throughput_per_s"] / m["off"]["throughput_per_s"]
    t = m["tls"]["throughput_per_s"] / m["off"]["throughput_per_s"]
    ra.append(a)
    rt.append(t)
    print("| %d | %.0f | %.0f | %.0f | %.2f | %.2f | %.0f / %.0f / %.0f | %d |" % (
        rnd, m["off"]["throughput_per_s"], m["auth"]["throughput_per_s"],
        m["tls"]["throughput_per_s"], a, t, m["off"]["p99_us"], m["auth"]["p99_us"],
        m["tls"]["p99_us"], sum(m[k]["errors"] for k in m)))
if ra:
    print("\nmedian auth/off %.2f, median tls/off %.2f" % (statistics.median(ra),
                                                           statistics.median(rt)))
PY
