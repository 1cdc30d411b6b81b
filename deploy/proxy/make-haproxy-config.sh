#!/usr/bin/env bash
# make-haproxy-config.sh - an HAProxy configuration (Debian's haproxy, built
# with Lua) that routes keyflow's HTTP API by key to the keyflowd process
# serving each key's partition, from the placement file (docs/scaling.md):
#
#   deploy/proxy/make-haproxy-config.sh [--server-ca CA] PLACEMENT [BIND] > haproxy.cfg
#   haproxy -f haproxy.cfg
#
# BIND is where the proxy listens (default 127.0.0.1:8080; "unix@/path"
# works too), for HTTP/1.1 and gRPC alike (HTTP/2 without TLS, told apart
# by its preface). Each `node` line's HTTP address becomes a backend
# kf_<node> and its gRPC address a backend kf_grpc_<node> (HTTP/2 to the
# node); keyflow-route.lua (next to this script) picks the backend of each
# request by its key: in the path for HTTP, in the `keyflow-key` (and, for
# a coordinator, `keyflow-workflow`) metadata for gRPC. Requests without a
# key go to any node, and /nodes/NAME/... reaches node NAME with the prefix
# stripped (register a function on every node that way).
#
# Plain HTTP to the nodes, unless --server-ca CA is given: then TLS to every
# node (the nodes serve TLS, KEYFLOW_SERVER_TLS_CERT), their certificates
# verified against CA, HTTP/2 for gRPC by ALPN. The proxy's own listener is
# plain either way: put TLS on the bind line (`ssl crt FILE alpn
# h2,http/1.1`) to serve it. API keys (`authorization`) pass through.
set -euo pipefail

SERVER_TLS=
if [ "${1:-}" = --server-ca ]; then
    [ $# -ge 2 ] && [ -r "$2" ] || { echo "$0: --server-ca needs a readable CA file" >&2; exit 2; }
    SERVER_TLS=" ssl verify required ca-file $(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
    shift 2
fi
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 [--server-ca CA] PLACEMENT [BIND]" >&2
    exit 2
fi
# gRPC to a TLS node: HTTP/2 is negotiated by ALPN.
GRPC_TLS=${SERVER_TLS:+$SERVER_TLS alpn h2}
PLACEMENT=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
BIND=${2:-127.0.0.1:8080}
HERE=$(cd "$(dirname "$0")" && pwd)
[ -r "$PLACEMENT" ] || { echo "$0: cannot read $PLACEMENT" >&2; exit 2; }

# node NAME SET GRPC [HTTP]: name, HTTP and gRPC addresses of each node.
mapfile -t NODES < <(sed 's/#.*//' "$PLACEMENT" | awk '$1 == "node" { print $2, $5, $4 }')
[ ${#NODES[@]} -gt 0 ] || { echo "$0: no node lines in $PLACEMENT" >&2; exit 2; }
for n in "${NODES[@]}"; do
    set -- $n
    [ $# -eq 3 ] || { echo "$0: node $1 has no HTTP address in $PLACEMENT" >&2; exit 2; }
done

cat <<CFG
# Written by deploy/proxy/make-haproxy-config.sh from $PLACEMENT.
global
    setenv KEYFLOW_PLACEMENT $PLACEMENT
    lua-load $HERE/keyflow-route.lua

defaults
    mode http
    timeout connect 5s
    timeout client 90s
    # Long polls (PollRuns, GetRun, ReadOutput) wait up to 60 s.
    timeout server 90s

frontend keyflow
    bind $BIND
    http-request set-var(txn.kf_backend) lua.keyflow_backend
    http-request set-path %[path,regsub(^/nodes/[^/]+/,/)] if { path_beg /nodes/ }
    use_backend %[var(txn.kf_backend)]
    default_backend kf_any

CFG
for n in "${NODES[@]}"; do
    set -- $n
    cat <<CFG
backend kf_$1
    option httpchk GET /healthz
    server $1 $2$SERVER_TLS check

backend kf_grpc_$1
    server $1 $3 proto h2$GRPC_TLS check

CFG
done
echo "backend kf_grpc_any"
echo "    balance roundrobin"
for n in "${NODES[@]}"; do
    set -- $n
    echo "    server $1 $3 proto h2$GRPC_TLS check"
done
echo
echo "backend kf_any"
echo "    balance roundrobin"
echo "    option httpchk GET /healthz"
for n in "${NODES[@]}"; do
    set -- $n
    echo "    server $1 $2$SERVER_TLS check"
done
