#!/usr/bin/env bash
# keyflow developer entry point.
#
#   ./dev.sh start [keyflowd flags]   install missing packages, build, run keyflowd
#                                     (a data set of 8 partitions under ./data unless
#                                     --partition-count says otherwise, gRPC
#                                     127.0.0.1:50051, HTTP 127.0.0.1:8070, example
#                                     handlers loaded)
#   ./dev.sh test                     install, build, and run every test: unit,
#                                     end-to-end and crash suites, then the whole
#                                     suite again under AddressSanitizer + UBSan;
#                                     with KEYFLOW_CONTAINER_TESTS=1 also the
#                                     container image and deploy/ smoke test
#   ./dev.sh build                    install and build only (build/)
#
# Debian 12. Packages come from Debian's repositories only.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")" && pwd)
cd "$ROOT"
JOBS=$(nproc)

PACKAGES=(build-essential cmake pkg-config
  libgrpc-dev protobuf-compiler protobuf-compiler-grpc protobuf-c-compiler libprotobuf-c-dev
  libprotobuf-dev
  libh2o-evloop-dev libssl-dev librocksdb-dev libmbedtls-dev libjansson-dev libcriterion-dev libsystemd-dev
  python3 python3-grpcio python3-protobuf python3-setuptools curl clang-format git
  nodejs npm openssl haproxy chromium)
# A package that is there as a command is not installed again: another
# nodejs build may bring its own npm (and conflict with Debian's).
declare -A PACKAGE_COMMANDS=([nodejs]=node [npm]=npm)

T0=$(date +%s)
log() { printf '\033[1m== [%4ss] %s\033[0m\n' "$(( $(date +%s) - T0 ))" "$*" >&2; }

install_deps() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    [ -n "${PACKAGE_COMMANDS[$p]:-}" ] && command -v "${PACKAGE_COMMANDS[$p]}" >/dev/null && continue
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return
  fi
  log "installing: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -q \
    --no-install-recommends "${missing[@]}"
}

# npm packages, exactly as each package-lock.json pins them: the Node SDK's,
# and the independent clients the end-to-end tests use (tests/e2e/node: a
# gRPC reflection client and an OpenAPI validator).
node_deps() {
  local dir
  for dir in clients/node tests/e2e/node; do
    if [ ! -d "$ROOT/$dir/node_modules" ]; then
      log "npm ci ($dir)"
      (cd "$ROOT/$dir" && npm ci --no-audit --no-fund)
    fi
  done
}

build() { # build DIR TYPE [cmake args...]
  local dir=$1 type=$2
  shift 2
  node_deps
  log "building $dir ($type $*)"
  cmake -S "$ROOT" -B "$ROOT/$dir" -DCMAKE_BUILD_TYPE="$type" "$@" >/dev/null
  cmake --build "$ROOT/$dir" -j"$JOBS"
}

run_suite() { # run_suite DIR
  log "testing $1"
  (cd "$ROOT/$1" && ctest --output-on-failure -j"$JOBS" --timeout 900)
}

cmd=${1:-start}
[ $# -gt 0 ] && shift
case "$cmd" in
  start)
    install_deps
    build build RelWithDebInfo
    mkdir -p "$ROOT/data"
    log "starting keyflowd (Ctrl-C stops it)"
    exec "$ROOT/build/service/main/keyflowd" --data "$ROOT/data" \
      --plugin-dir "$ROOT/build/handlers" "$@"
    ;;
  build)
    install_deps
    build build RelWithDebInfo
    ;;
  test)
    install_deps
    start=$(date +%s)
    build build RelWithDebInfo
    run_suite build
    build build-asan Debug -DKF_SANITIZE=ON
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
      LSAN_OPTIONS=suppressions="$ROOT/tests/lsan.supp":print_suppressions=0 \
      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      run_suite build-asan
    if [ "${KEYFLOW_CONTAINER_TESTS:-0}" = 1 ]; then
      # The image and the deploy/ manifests under podman (about 3 minutes;
      # needs root and Debian's mirror for debootstrap).
      log "container smoke test"
      "$ROOT/tests/container/smoke.sh"
    fi
    log "all tests passed in $(( $(date +%s) - start )) s"
    ;;
  *)
    echo "usage: $0 start [keyflowd flags] | test | build" >&2
    exit 2
    ;;
esac
