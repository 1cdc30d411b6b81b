#!/usr/bin/env bash
# Container smoke test: build docker/Dockerfile and run the image, the compose
# file and the Kubernetes manifest on this machine with podman + runc, host
# networking and 127.0.0.1 only (recipe: /work/shared/notes/containers.md).
#
#   sudo tests/container/smoke.sh           # as root, Debian 12; a few minutes
#
# Steps: packages (apt, only if missing) -> private podman config and storage
# -> debian:bookworm-slim base image from debootstrap -> image build ->
# image run (probes, healthcheck, an event and its receipt, CLI, a native
# handler, clean stop with exit 0, restart on the same volume) -> secrets
# (deploy/make-secrets.sh) -> compose via docker-compose 1.29 against
# `podman system service` and the StatefulSet via `podman kube play`, both
# over TLS with API keys (plaintext and keyless calls refused, keyed calls
# over HTTPS and gRPC answered) -> the partitioned StatefulSet
# (keyflow-partitions.yaml) as three pods behind deploy/proxy's HAProxy, one
# killed and restarted while events flow, every acknowledged event in exactly
# one run and no key's state split. Every step is timed; any failure exits
# non-zero; the whole run is bounded by KEYFLOW_SMOKE_TIMEOUT; everything it
# created is removed on exit.
#
# Environment:
#   KEYFLOW_SMOKE_TIMEOUT  overall limit in seconds (default 1800)
#   KEYFLOW_SMOKE_WORK     a directory to keep podman's storage and the base
#                          image in between runs (default: a fresh temporary
#                          directory, deleted on exit). With it, a second run
#                          skips debootstrap and reuses build layers.
#   KEYFLOW_DEBIAN_MIRROR  debootstrap mirror (default http://deb.debian.org/debian)
#   KEYFLOW_SMOKE_KEEP=1   keep the temporary directory (logs) even on success
#
# CI runs this only when KEYFLOW_CONTAINER_TESTS=1. See tests/container/README.md.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)

# Bounded run: re-exec under timeout(1). It signals the whole process group
# (podman, curl, ...) with TERM, and the EXIT trap below still cleans up.
if [ -z "${KF_SMOKE_BOUNDED:-}" ]; then
  export KF_SMOKE_BOUNDED=1
  exec timeout -k 120 "${KEYFLOW_SMOKE_TIMEOUT:-1800}" bash "$0" "$@"
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "smoke.sh: run as root (podman with runc, debootstrap, apt)" >&2
  exit 2
fi

IMAGE=localhost/keyflow:smoke
BASE=localhost/debian:bookworm-slim
MIRROR=${KEYFLOW_DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ -n "${KEYFLOW_SMOKE_WORK:-}" ]; then
  WORK=$KEYFLOW_SMOKE_WORK; KEEP_WORK=1
  mkdir -p "$WORK"
else
  WORK=$(mktemp -d -t keyflow-smoke.XXXXXX); KEEP_WORK=${KEYFLOW_SMOKE_KEEP:-0}
fi
WORK=$(cd "$WORK" && pwd)

# Names of everything created, for the cleanup (removed by name, never in bulk).
RUN_CTR=keyflow-smoke
RUN_VOL=keyflow-smoke-data
COMPOSE_PROJECT=keyflowsmoke
KUBE_POD=keyflow-0
KUBE_CTR=keyflow-0-keyflowd
KUBE_VOL=data-keyflow-0
# keyflow-partitions.yaml's StatefulSet: its pods, their containers and claims.
PART_PODS=(keyflow-0 keyflow-1 keyflow-2)
PART_CTRS=("${PART_PODS[@]/%/-keyflowd}")
PART_VOLS=("${PART_PODS[@]/#/data-}" keyflow-placement)  # (podman makes a volume of the ConfigMap)

# ---------------------------------------------------------------- reporting
T0=${EPOCHREALTIME/./}
STEP= STEP_T=
declare -a TIMINGS=()
PASSED=0
ms_since() { echo $(( (${EPOCHREALTIME/./} - $1) / 1000 )); }
fmt_s() { printf '%d.%01d' $(( $1 / 1000 )) $(( $1 % 1000 / 100 )); }
end_step() {
  [ -n "$STEP" ] || return 0
  local ms; ms=$(ms_since "$STEP_T")
  TIMINGS+=("$(printf '%8s s  %s' "$(fmt_s "$ms")" "$STEP")")
  printf '      (%s s)\n' "$(fmt_s "$ms")"
  STEP=
}
step() {
  end_step
  STEP=$*; STEP_T=${EPOCHREALTIME/./}
  printf '[%6s s] %s\n' "$(fmt_s "$(ms_since "$T0")")" "$STEP"
}
ok() { PASSED=$((PASSED + 1)); printf '      ok  %s\n' "$*"; }
fail() { printf '      FAIL  %s\n' "$*" >&2; exit 1; }
# check DESCRIPTION COMMAND...: run it, count it, stop everything on failure.
check() {
  local what=$1; shift
  if "$@"; then ok "$what"; else fail "$what"; fi
}

# ---------------------------------------------------------------- helpers
# TLS=(--cacert FILE) while a deployment serves TLS: every curl below adds it.
TLS=()
wait_http() { # wait_http URL [TRIES]: 200 within TRIES x 0.2 s
  local i
  for ((i = 0; i < ${2:-150}; i++)); do
    curl -fsS "${TLS[@]}" -o /dev/null --max-time 2 "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  echo "no 200 from $1 after $(( ${2:-150} / 5 )) s" >&2
  return 1
}
free_ports() { # free_ports N: N distinct free TCP ports on 127.0.0.1
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}
exit_code() { podman inspect -f '{{.State.ExitCode}}' "$1"; }
# send_event BASE_URL KEY ID [CURL ARGS...]: POST a batch event, print the response.
send_event() {
  local base=$1 key=$2 id=$3
  shift 3
  curl -fsS "${TLS[@]}" "$@" --max-time 10 -XPOST "$base/v1/workflows/smoke/keys/$key/events" \
    -H 'content-type: application/json' \
    -d "{\"id\": \"$id\", \"rule\": {\"kind\": \"batch\", \"maxEvents\": 10, \"maxWaitMs\": 600000}, \"input\": {\"n\": 1}}"
}
# http_code CURL ARGS...: the status of one request (000: no HTTP answer).
http_code() { curl -sS -o /dev/null --max-time 10 -w '%{http_code}' "$@" 2>/dev/null || true; }
has_receipt() { # has_receipt JSON KEY: a receipt whose runId is KEY@...
  python3 -c 'import json,sys; r=json.loads(sys.argv[1])["receipt"]; assert r["runId"].startswith(sys.argv[2]+"@"), r' "$1" "$2"
}
is_duplicate() { python3 -c 'import json,sys; assert json.loads(sys.argv[1]).get("duplicate") is True' "$1"; }
# probe_service NAME HTTP GRPC CONTAINER: the checks every deployment form gets.
probe_service() {
  local name=$1 http=$2 grpc=$3 ctr=$4 out
  check "$name: GET /healthz" wait_http "http://127.0.0.1:$http/healthz"
  check "$name: GET /readyz" wait_http "http://127.0.0.1:$http/readyz"
  out=$(send_event "http://127.0.0.1:$http" "$name-key" e-1) || fail "$name: POST event"
  echo "      receipt: $out"
  check "$name: event receipt" has_receipt "$out" "$name-key"
  out=$(send_event "http://127.0.0.1:$http" "$name-key" e-1) || fail "$name: POST event again"
  check "$name: same event id again is a duplicate" is_duplicate "$out"
  check "$name: grpc.health.v1 SERVING (the image's keyflow CLI)" cli_health "$ctr" "$grpc"
}
# probe_secure NAME HTTP GRPC CONTAINER: a deployment of deploy/ as shipped:
# TLS on both ports (the CA of $SECRETS), API keys (its admin key).
probe_secure() {
  local name=$1 http=$2 grpc=$3 ctr=$4 out key
  local base="https://127.0.0.1:$http"
  key=$(cat "$SECRETS/keyflow-admin-key/admin.key")
  TLS=(--cacert "$SECRETS/keyflow-tls/ca.crt")
  check "$name: GET /readyz over TLS (no key needed)" wait_http "$base/readyz"
  check "$name: plaintext HTTP on the TLS port is refused" \
    test "$(http_code "http://127.0.0.1:$http/healthz")" = 000
  check "$name: an unknown CA is refused" test "$(http_code "$base/healthz")" = 000
  check "$name: POST event without a key -> 401" \
    test "$(http_code "${TLS[@]}" -XPOST "$base/v1/workflows/smoke/keys/k/events" -d '{}')" = 401
  check "$name: GET /metrics without a key -> 401" test "$(http_code "${TLS[@]}" "$base/metrics")" = 401
  out=$(send_event "$base" "$name-key" e-1 -H "Authorization: Bearer $key") \
    || fail "$name: POST event over TLS with the admin key"
  echo "      receipt: $out"
  check "$name: event receipt (TLS + key)" has_receipt "$out" "$name-key"
  out=$(send_event "$base" "$name-key" e-1 -H "Authorization: Bearer $key") || fail "$name: POST event again"
  check "$name: same event id again is a duplicate" is_duplicate "$out"
  # The CLI in the container reads KEYFLOW_TLS_CA and KEYFLOW_API_KEY_FILE from the deployment.
  check "$name: grpc.health.v1 SERVING over TLS (the image's keyflow CLI)" cli_health "$ctr" "$grpc"
  out=$(podman exec "$ctr" keyflow --addr "127.0.0.1:$grpc" --timeout-ms 5000 send --workflow smoke \
    --key "$name-cli" --batch --max-events 5 --input '{"n": 3}') || fail "$name: keyflow send over TLS with the key"
  check "$name: keyflow send over gRPC + TLS + key returns a receipt" has_receipt "$out" "$name-cli"
  out=$(podman exec -e KEYFLOW_API_KEY_FILE= "$ctr" keyflow --addr "127.0.0.1:$grpc" --timeout-ms 5000 \
    describe --kind batch --workflow smoke --key k 2>&1) && fail "$name: a call without a key succeeded"
  check "$name: keyflow describe without a key is UNAUTHENTICATED" grep -q UNAUTHENTICATED <<<"$out"
  TLS=()
}
cli_health() { # cli_health CONTAINER GRPC_PORT
  local out
  out=$(podman exec "$1" keyflow --addr "127.0.0.1:$2" --timeout-ms 5000 health) || return 1
  grep -q SERVING <<<"$out" || { echo "$out" >&2; return 1; }
}
podman_healthcheck() { # the image's HEALTHCHECK, run by hand (podman's timers need systemd)
  local status
  status=$(podman healthcheck run "$1" 2>&1) || { echo "$status" >&2; return 1; }
}
stopped_cleanly() { # stopped_cleanly CONTAINER: exited 0 and logged its clean stop
  local code logs
  code=$(exit_code "$1")
  logs=$(podman logs "$1" 2>&1) || true
  if [ "$code" != 0 ] || ! grep -q 'main: stopped' <<<"$logs"; then
    echo "exit code $code; last log lines:" >&2; tail -20 <<<"$logs" >&2
    return 1
  fi
}

# ---------------------------------------------------------------- cleanup
PODMAN_SVC_PID=
HAPROXY_PID=
cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  if [ "$rc" -ne 0 ]; then
    echo "smoke.sh: FAILED (exit $rc) in step: ${STEP:-?}; logs in $WORK" >&2
    KEEP_LOGS=1
    step "cleanup after failure"
  fi
  if [ -n "${CONTAINERS_CONF:-}" ]; then  # only once our private config is in force
    if [ -f "$WORK/compose.yml" ] && [ -n "$PODMAN_SVC_PID" ]; then
      timeout 60 docker-compose -p "$COMPOSE_PROJECT" -f "$WORK/compose.yml" down -v -t 5 >/dev/null 2>&1
    fi
    [ -f "$WORK/kube.yaml" ] && timeout 60 podman kube down "$WORK/kube.yaml" >/dev/null 2>&1
    [ -f "$WORK/kube-partitions.yaml" ] && timeout 60 podman kube down "$WORK/kube-partitions.yaml" >/dev/null 2>&1
    timeout 60 podman pod rm -f -t 5 "$KUBE_POD" "${PART_PODS[@]}" >/dev/null 2>&1
    timeout 60 podman rm -f -t 5 "$RUN_CTR" "${COMPOSE_PROJECT}_keyflowd_1" "$KUBE_CTR" \
      "${PART_CTRS[@]}" >/dev/null 2>&1
    timeout 60 podman volume rm -f "$RUN_VOL" "${COMPOSE_PROJECT}_keyflow-data" "$KUBE_VOL" \
      "${PART_VOLS[@]}" >/dev/null 2>&1
  fi
  if [ -n "$PODMAN_SVC_PID" ]; then
    kill "$PODMAN_SVC_PID" 2>/dev/null; wait "$PODMAN_SVC_PID" 2>/dev/null
  fi
  if [ -n "$HAPROXY_PID" ]; then
    kill "$HAPROXY_PID" 2>/dev/null; wait "$HAPROXY_PID" 2>/dev/null
  fi
  if [ "$KEEP_WORK" != 1 ] && [ "${KEEP_LOGS:-0}" != 1 ]; then
    # podman may leave its storage mounted (overlay, shm): unmount, then delete.
    findmnt -rn -o TARGET | grep -F "$WORK/" | sort -r | while read -r m; do umount -l "$m"; done
    rm -rf "$WORK"
  elif [ "$KEEP_WORK" != 1 ]; then
    findmnt -rn -o TARGET | grep -F "$WORK/" | sort -r | while read -r m; do umount -l "$m"; done
    rm -rf "$WORK/storage" "$WORK/run" "$WORK/rootfs" "$WORK/tmp"  # keep only the logs
  fi
  end_step
  echo
  echo "timings:"
  printf '%s\n' "${TIMINGS[@]}"
  printf '%8s s  total\n' "$(fmt_s "$(ms_since "$T0")")"
  if [ "$rc" -eq 0 ]; then
    echo "container smoke: $PASSED passed, 0 failed"
  else
    echo "container smoke: $PASSED passed, 1 failed"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

echo "keyflow container smoke: repo $ROOT, work dir $WORK"

# ================================================================ 1. packages
step "1. packages (apt-get, only what is missing)"
PKGS=(podman runc buildah debootstrap catatonit uidmap docker-compose python3-yaml curl
  haproxy python3-grpcio python3-protobuf protobuf-compiler protobuf-compiler-grpc)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "      installing: ${missing[*]}"
  timeout 600 apt-get -o DPkg::Lock::Timeout=300 update -q >"$WORK/apt.log" 2>&1 \
    || { tail -20 "$WORK/apt.log"; fail "apt-get update"; }
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get -o DPkg::Lock::Timeout=300 install -y -q \
    --no-install-recommends "${missing[@]}" >>"$WORK/apt.log" 2>&1 \
    || { tail -20 "$WORK/apt.log"; fail "apt-get install"; }
fi
ok "$(podman --version), runc $(runc --version | awk 'NR==1{print $3}'), $(docker-compose version --short 2>/dev/null | sed 's/^/docker-compose /')"

# ================================================================ 2. podman config
step "2. private podman configuration and storage"
mkdir -p "$WORK/storage" "$WORK/run" "$WORK/tmp"
# runc: crun refuses this machine's hybrid cgroup layout. host netns: no
# bridge, no iptables. ulimits: root cannot raise nofile/nproc here.
cat >"$WORK/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "host"
log_driver = "k8s-file"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$WORK/tmp"
CONF
cat >"$WORK/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$WORK/storage"
runroot = "$WORK/run"
CONF
export CONTAINERS_CONF="$WORK/containers.conf" CONTAINERS_STORAGE_CONF="$WORK/storage.conf"
unset DOCKER_HOST CONTAINER_HOST
check "podman uses runc, host network and $WORK/storage" \
  test "$(podman info -f '{{.Host.OCIRuntime.Name}} {{.Store.GraphRoot}}')" = "runc $WORK/storage"

# ================================================================ 3. base image
step "3. base image $BASE (debootstrap --variant=minbase bookworm)"
if podman image exists "$BASE"; then
  ok "$BASE already in $WORK/storage (reused)"
else
  rm -rf "$WORK/rootfs"
  timeout 900 debootstrap --variant=minbase bookworm "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log"; fail "debootstrap"; }
  # apt in the image sees the same suites as a real debian:bookworm-slim
  # (updates and security), or the host's when the host is bookworm.
  if grep -qs '^Suites:.*bookworm' /etc/apt/sources.list.d/debian.sources; then
    cp /etc/apt/sources.list.d/debian.sources "$WORK/rootfs/etc/apt/sources.list.d/"
  else
    cat >"$WORK/rootfs/etc/apt/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  fi
  rm -f "$WORK/rootfs/etc/apt/sources.list"
  rm -rf "$WORK"/rootfs/var/cache/apt/archives/*.deb "$WORK"/rootfs/var/lib/apt/lists/*
  tar --numeric-owner -C "$WORK/rootfs" -c . \
    | podman import -q --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
  rm -rf "$WORK/rootfs"
  check "$BASE imported" podman image exists "$BASE"
fi

# ================================================================ 4. build
step "4. podman build docker/Dockerfile -> $IMAGE"
VERSION=$(sed -n 's/^project(keyflow VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")
COMMIT=$(git -C "$ROOT" describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
timeout 1200 podman build --pull=never --network=host --format docker \
  --build-arg KEYFLOW_VERSION="$VERSION" --build-arg KEYFLOW_COMMIT="$COMMIT" \
  --build-arg KEYFLOW_CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  -f "$ROOT/docker/Dockerfile" -t "$IMAGE" "$ROOT" >"$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log"; fail "podman build (log: $WORK/build.log)"; }
ok "built, $(podman image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"
check "image runs as the non-root user keyflow" \
  test "$(podman run --rm --no-healthcheck --network=host --entrypoint id "$IMAGE" -un)" = keyflow
check "image has a HEALTHCHECK (docker format)" \
  test "$(podman image inspect -f '{{if .HealthCheck}}yes{{end}}' "$IMAGE")" = yes
libs=$(podman run --rm --no-healthcheck --network=host --entrypoint sh "$IMAGE" -c \
  'ldd /usr/bin/keyflowd /usr/bin/keyflow /usr/lib/keyflow/handlers/*.so') || fail "ldd in the image"
check "every shared library resolves in the runtime image" \
  sh -c '! printf "%s\n" "$1" | grep "not found" >&2' _ "$libs"
check "keyflowd --help runs" podman run --rm --no-healthcheck --network=host "$IMAGE" --help >/dev/null
label() { podman image inspect -f "{{index .Labels \"org.opencontainers.image.$1\"}}" "$IMAGE"; }
check "OCI labels: title, version $VERSION, revision $COMMIT" \
  test "$(label title) $(label version) $(label revision)" = "keyflow $VERSION $COMMIT"
check "keyflowd --version in the image matches its labels" test \
  "$(podman run --rm --no-healthcheck --network=host "$IMAGE" --version)" = \
  "keyflowd $VERSION (commit $COMMIT)"

read -r G1 H1 P1 G2 H2 P2 G3 H3 P3 < <(free_ports 9)
# The deployments' secrets: a CA, a certificate for 127.0.0.1, an admin key.
SECRETS=$WORK/secrets
"$ROOT/deploy/make-secrets.sh" "$SECRETS" >"$WORK/secrets.log" 2>&1 \
  || { cat "$WORK/secrets.log"; fail "deploy/make-secrets.sh"; }
ok "deploy/make-secrets.sh: CA, server certificate and admin key in $SECRETS"

# ================================================================ 5. image
step "5. podman run the image (127.0.0.1:$G1 gRPC, :$H1 HTTP), read-only rootfs, named volume"
podman volume create "$RUN_VOL" >/dev/null
run_image() {
  podman run -d --name "$RUN_CTR" --network=host --read-only \
    -e KEYFLOW_GRPC_ADDRESS="127.0.0.1:$G1" -e KEYFLOW_HTTP_ADDRESS="127.0.0.1:$H1" \
    -e KEYFLOW_PROBE_ADDRESS="127.0.0.1:$P1" \
    -v "$RUN_VOL:/var/lib/keyflow" "$IMAGE" >/dev/null 2>"$WORK/run.err" \
    || { cat "$WORK/run.err" >&2; return 1; }
  # (podman prints that it cannot schedule the healthcheck without systemd: harmless)
}
check "image: podman run -d" run_image
probe_service image "$H1" "$G1" "$RUN_CTR"
check "image: GET /readyz on the probe listener" wait_http "http://127.0.0.1:$P1/readyz"
check "image: HEALTHCHECK passes (podman healthcheck run)" podman_healthcheck "$RUN_CTR"
out=$(podman exec "$RUN_CTR" keyflow --addr "127.0.0.1:$G1" send --workflow smoke --key cli-key \
  --id c-1 --batch --max-events 5 --input '{"n": 2}') || fail "image: keyflow send"
check "image: keyflow send over gRPC returns a receipt" has_receipt "$out" cli-key
out=$(podman exec "$RUN_CTR" curl -fsS --max-time 10 -XPOST "http://127.0.0.1:$H1/v1/functions" \
  --data-binary @/usr/lib/keyflow/handlers/running_sum.descriptor.json) \
  || fail "image: registering the running_sum handler (plugin dir, digest): $out"
ok "image: registered the shipped running_sum handler from /usr/lib/keyflow/handlers"
out=$(curl -fsS --max-time 10 -XPOST "http://127.0.0.1:$H1/v1/functions/running_sum/batches" -d \
  '{"producerId": "p", "sequence": 1, "rows": [{"user": "ann", "ts": 1, "amount": 5}, {"user": "ann", "ts": 2, "amount": 7}]}') \
  || fail "image: pushing a batch to running_sum"
out=$(curl -fsS --max-time 10 "http://127.0.0.1:$H1/v1/functions/running_sum/output?after=0&limit=10&format=ROW_FORMAT_JSON") \
  || fail "image: reading running_sum's output"
check "image: running_sum output rows are 5 then 12" python3 -c \
  'import json,sys; assert [r["sum"] for r in json.loads(sys.argv[1])["rows"]] == ["5", "12"], sys.argv[1]' "$out"
t=${EPOCHREALTIME/./}
podman stop -t 30 "$RUN_CTR" >/dev/null 2>>"$WORK/podman.log"
check "image: podman stop -> exit code 0 in $(fmt_s "$(ms_since "$t")") s" stopped_cleanly "$RUN_CTR"
podman rm "$RUN_CTR" >/dev/null 2>>"$WORK/podman.log"
check "image: podman run -d again, same volume" run_image
check "image: restarted on the same volume" wait_http "http://127.0.0.1:$H1/readyz"
out=$(send_event "http://127.0.0.1:$H1" image-key e-1) || fail "image: POST event after restart"
check "image: the event survived the restart (duplicate)" is_duplicate "$out"
out=$(curl -fsS --max-time 10 "http://127.0.0.1:$H1/v1/functions/running_sum/keys/ann") \
  || fail "image: reading running_sum's state after the restart"
check "image: running_sum reloaded after the restart, state ann = 12" python3 -c \
  'import json,sys; assert json.loads(sys.argv[1])["value"] == "12", sys.argv[1]' "$out"
podman stop -t 30 "$RUN_CTR" >/dev/null 2>>"$WORK/podman.log"
check "image: second stop -> exit code 0" stopped_cleanly "$RUN_CTR"
podman rm "$RUN_CTR" >/dev/null 2>>"$WORK/podman.log"
podman volume rm "$RUN_VOL" >/dev/null

# ================================================================ 6. compose
step "6. deploy/docker-compose.yml via docker-compose against podman system service (:$H2)"
podman system service --time=0 "unix://$WORK/podman.sock" >"$WORK/podman-service.log" 2>&1 &
PODMAN_SVC_PID=$!
export DOCKER_HOST="unix://$WORK/podman.sock"
for _ in $(seq 1 100); do
  curl -fsS --max-time 1 --unix-socket "$WORK/podman.sock" http://d/_ping >/dev/null 2>&1 && break
  sleep 0.1
done
check "podman API socket answers" curl -fsS --max-time 2 --unix-socket "$WORK/podman.sock" -o /dev/null http://d/_ping
python3 "$HERE/compose_hostnet.py" "$ROOT/deploy/docker-compose.yml" --image "$IMAGE" \
  --env KEYFLOW_GRPC_ADDRESS="127.0.0.1:$G2" --env KEYFLOW_HTTP_ADDRESS="127.0.0.1:$H2" \
  --env KEYFLOW_PROBE_ADDRESS="127.0.0.1:$P2" --secret-dir "$SECRETS" >"$WORK/compose.yml"
DC=(timeout 300 docker-compose -p "$COMPOSE_PROJECT" -f "$WORK/compose.yml")
"${DC[@]}" up -d --no-build >"$WORK/compose.log" 2>&1 || { cat "$WORK/compose.log"; fail "docker-compose up"; }
ok "docker-compose up -d"
CCTR=${COMPOSE_PROJECT}_keyflowd_1
probe_secure compose "$H2" "$G2" "$CCTR"
check "compose: GET /readyz on the probe listener (TLS)" \
  curl -fsS --cacert "$SECRETS/keyflow-tls/ca.crt" -o /dev/null --max-time 5 "https://127.0.0.1:$P2/readyz"
check "compose: healthcheck passes (podman healthcheck run)" podman_healthcheck "$CCTR"
check "compose: data on the named volume" \
  test "$(podman volume inspect -f '{{.Name}}' "${COMPOSE_PROJECT}_keyflow-data")" = "${COMPOSE_PROJECT}_keyflow-data"
"${DC[@]}" stop -t 30 >>"$WORK/compose.log" 2>&1 || { cat "$WORK/compose.log"; fail "docker-compose stop"; }
check "compose: docker-compose stop -> exit code 0" stopped_cleanly "$CCTR"
"${DC[@]}" down -v -t 10 >>"$WORK/compose.log" 2>&1 || { cat "$WORK/compose.log"; fail "docker-compose down"; }
ok "docker-compose down -v"
rm -f "$WORK/compose.yml"
kill "$PODMAN_SVC_PID"; wait "$PODMAN_SVC_PID" 2>/dev/null || true; PODMAN_SVC_PID=
unset DOCKER_HOST

# ================================================================ 7. kube
step "7. deploy/kubernetes/keyflow.yaml via podman kube play (hostNetwork, :$H3)"
python3 "$HERE/kube_hostnet.py" "$ROOT/deploy/kubernetes/keyflow.yaml" --image "$IMAGE" \
  --env KEYFLOW_GRPC_ADDRESS="127.0.0.1:$G3" --env KEYFLOW_HTTP_ADDRESS="127.0.0.1:$H3" \
  --env KEYFLOW_PROBE_ADDRESS="127.0.0.1:$P3" \
  --port grpc="$G3" --port http="$H3" --port probe="$P3" --secret-dir "$SECRETS" >"$WORK/kube.yaml" 2>"$WORK/kube-rewrite.log"
timeout 300 podman kube play "$WORK/kube.yaml" >"$WORK/kube.log" 2>&1 \
  || { cat "$WORK/kube.log"; fail "podman kube play"; }
ok "podman kube play (StatefulSet -> pod $KUBE_POD + PVC $KUBE_VOL)"
probe_secure kube "$H3" "$G3" "$KUBE_CTR"
check "kube: GET /readyz on the probe listener (TLS)" \
  curl -fsS --cacert "$SECRETS/keyflow-tls/ca.crt" -o /dev/null --max-time 5 "https://127.0.0.1:$P3/readyz"
check "kube: runs as uid 10001" test "$(podman exec "$KUBE_CTR" id -u)" = 10001
check "kube: livenessProbe (as podman healthcheck) passes" podman_healthcheck "$KUBE_CTR"
podman pod stop -t 30 "$KUBE_POD" >/dev/null 2>>"$WORK/podman.log"
check "kube: pod stop -> exit code 0" stopped_cleanly "$KUBE_CTR"
check "kube: SIGTERM drained for the manifest's 10 s grace before stopping" sh -c \
  'podman logs "$1" 2>&1 | grep -q "draining signal=15 grace_ms=10000"' _ "$KUBE_CTR"
timeout 120 podman kube down "$WORK/kube.yaml" >>"$WORK/kube.log" 2>&1 \
  || { cat "$WORK/kube.log"; fail "podman kube down"; }
podman volume rm -f "$KUBE_VOL" >/dev/null 2>&1 || true
rm -f "$WORK/kube.yaml"
ok "podman kube down"

# ================================================================ 8. partitions
# deploy/kubernetes/keyflow-partitions.yaml: its StatefulSet becomes its three
# pods (kube_partitions.py: free ports, the ConfigMap's placement with those
# addresses), as shipped otherwise (TLS, API keys). Traffic through the
# routing Python client and through deploy/proxy's HAProxy on the host; one
# pod killed hard while sending and started again on its volume; then
# partition_ledger.py's checks (clients/python/tests, shared with the
# loopback test of three processes).
step "8. deploy/kubernetes/keyflow-partitions.yaml: 3 pods via podman kube play, client + HAProxy, a pod killed"
PART=$WORK/partitions
mkdir -p "$PART"
python3 "$HERE/kube_partitions.py" "$ROOT/deploy/kubernetes/keyflow-partitions.yaml" --image "$IMAGE" \
  --secret-dir "$SECRETS" --placement-out "$PART/placement" --ports-out "$PART/ports" \
  >"$WORK/kube-partitions.yaml" 2>"$PART/rewrite.log" || { cat "$PART/rewrite.log"; fail "kube_partitions.py"; }
mapfile -t PART_PODS < <(awk '{print $1}' "$PART/ports")
PART_CTRS=("${PART_PODS[@]/%/-keyflowd}") PART_VOLS=("${PART_PODS[@]/#/data-}" keyflow-placement)
# A ConfigMap volume left by an earlier run would keep its old ports.
podman volume rm -f "${PART_VOLS[@]}" >/dev/null 2>&1 || true
timeout 300 podman kube play "$WORK/kube-partitions.yaml" >"$PART/kube.log" 2>&1 \
  || { cat "$PART/kube.log"; fail "podman kube play (partitions)"; }
ok "podman kube play: pods ${PART_PODS[*]}, a PVC each, the placement ConfigMap with their 127.0.0.1 ports"
TLS=(--cacert "$SECRETS/keyflow-tls/ca.crt")
while read -r pod grpc http probe; do
  check "partitions: $pod ready (GET /readyz over TLS)" wait_http "https://127.0.0.1:$probe/readyz"
done <"$PART/ports"
TLS=()
ADDRS=$(awk '{printf "%s127.0.0.1:%s", (NR > 1 ? "," : ""), $2}' "$PART/ports")
podman exec "${PART_PODS[0]}-keyflowd" keyflow --addr "$ADDRS" --timeout-ms 5000 partitions \
  >"$PART/partitions.json" 2>&1 || { cat "$PART/partitions.json" >&2; fail "partitions: keyflow partitions"; }
ok "partitions: keyflow partitions over the three pods: every partition served once, all ready"
# The proxy on the host, TLS to the pods (deploy/proxy, --server-ca).
read -r PROXY_PORT < <(free_ports 1)
"$ROOT/deploy/proxy/make-haproxy-config.sh" --server-ca "$SECRETS/keyflow-tls/ca.crt" \
  "$PART/placement" "127.0.0.1:$PROXY_PORT" >"$PART/haproxy.cfg" || fail "make-haproxy-config.sh"
haproxy -db -f "$PART/haproxy.cfg" >"$PART/haproxy.log" 2>&1 &
HAPROXY_PID=$!
check "partitions: HAProxy routes /nodes/NAME/ to each pod (TLS to the pods)" wait_http \
  "http://127.0.0.1:$PROXY_PORT/nodes/${PART_PODS[2]}/readyz"
# The routing Python client: its gRPC stubs come from the build (dev.sh builds first).
[ -d "$ROOT/clients/python/keyflow/v1" ] || PYENV_VERSION=system python3 \
  "$ROOT/clients/python/keyflow_build.py" --api "$ROOT/api" >"$PART/stubs.log" 2>&1 \
  || { cat "$PART/stubs.log"; fail "generating the Python SDK's stubs"; }
VICTIM=${PART_PODS[1]}
rc=0
PYENV_VERSION=system PYTHONDONTWRITEBYTECODE=1 \
  PYTHONPATH="$ROOT/clients/python:$ROOT/clients/python/tests" \
  timeout 400 python3 "$HERE/partitions_traffic.py" --placement "$PART/placement" \
  --proxy "127.0.0.1:$PROXY_PORT" --tls-ca "$SECRETS/keyflow-tls/ca.crt" \
  --api-key-file "$SECRETS/keyflow-admin-key/admin.key" \
  --victim "$VICTIM" --kill "podman pod kill $VICTIM" --restart "podman pod start $VICTIM" \
  2>&1 | tee "$PART/traffic.log" || rc=$?
[ "$rc" = 0 ] || fail "partitions: traffic and checks (log: $PART/traffic.log)"
PASSED=$((PASSED + $(grep -c '^      ok  ' "$PART/traffic.log")))
check "partitions: $VICTIM's keyflowd started twice (killed, then restarted on its volume)" sh -c \
  'podman logs "$1" 2>&1 | grep -c "main: serving" | grep -qx 2' _ "$VICTIM-keyflowd"
kill "$HAPROXY_PID"; wait "$HAPROXY_PID" 2>/dev/null || true; HAPROXY_PID=
# Together: each drains for the manifest's 10 s before it stops.
podman pod stop -t 30 "${PART_PODS[@]}" >/dev/null 2>>"$WORK/podman.log"
for pod in "${PART_PODS[@]}"; do
  check "partitions: $pod stop -> exit code 0" stopped_cleanly "$pod-keyflowd"
done
timeout 120 podman kube down "$WORK/kube-partitions.yaml" >>"$PART/kube.log" 2>&1 \
  || { cat "$PART/kube.log"; fail "podman kube down (partitions)"; }
podman volume rm -f "${PART_VOLS[@]}" >/dev/null 2>&1 || true
rm -f "$WORK/kube-partitions.yaml"
ok "podman kube down, volumes removed"

step "9. cleanup"
# (the EXIT trap does it)
