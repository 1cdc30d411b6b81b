#!/usr/bin/env bash
# make-secrets.sh - the files the deployments in deploy/ read: a private CA,
# a server certificate signed by it, and the first admin API key. Made here,
# with openssl, never committed.
#
#   deploy/make-secrets.sh [DIR] [--names NAME,...] [--owner UID] [--group GROUP]
#
# DIR (default deploy/secrets, which .gitignore keeps out of git) gets:
#   keyflow-tls/tls.crt       the server's certificate (EC P-256, 1 year)
#   keyflow-tls/tls.key       its private key
#   keyflow-tls/ca.crt        the CA that signed it: what clients verify with
#   keyflow-ca/ca.key         the CA's key: keep it offline; it signs new
#                             server (and, for mTLS, client) certificates
#   keyflow-admin-key/admin.key  the admin API key (kf_<id>_<secret>)
# The folder names are the Kubernetes Secret names the manifest mounts;
# compose mounts the same files. Certificate names: localhost, 127.0.0.1,
# keyflow, keyflow-0.keyflow-headless and their .<namespace>.svc forms for
# the namespace "default", plus --names (comma-separated DNS names).
# Files already there are kept (rerun after deleting what should change).
# --owner UID: chown the key files to UID (default 10001, the image's
# keyflow user) when run as root, so that a container reads them from a
# bind mount ('' keeps them root's); otherwise they stay the caller's, mode
# 0600. --group GROUP: make the server's key and the certificates readable
# by GROUP (0640), for the systemd unit (deploy/systemd/keyflowd.service).
#
# Kubernetes: kubectl create secret generic keyflow-tls --from-file=DIR/keyflow-tls
#             kubectl create secret generic keyflow-admin-key --from-file=DIR/keyflow-admin-key
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$HERE/secrets
NAMES=
OWNER=10001
GROUP=
while [ $# -gt 0 ]; do
    case $1 in
        --names) NAMES=$2; shift 2 ;;
        --owner) OWNER=$2; shift 2 ;;
        --group) GROUP=$2; shift 2 ;;
        -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
        -*) echo "make-secrets.sh: unknown option $1" >&2; exit 2 ;;
        *) DIR=$1; shift ;;
    esac
done
command -v openssl >/dev/null || { echo "make-secrets.sh: openssl is needed" >&2; exit 1; }
umask 077
mkdir -p "$DIR/keyflow-tls" "$DIR/keyflow-ca" "$DIR/keyflow-admin-key"
tls=$DIR/keyflow-tls ca=$DIR/keyflow-ca
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ ! -f "$ca/ca.key" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$ca/ca.key" \
        -out "$tls/ca.crt" -days 3650 -subj "/CN=keyflow CA" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
        2>/dev/null
    rm -f "$tls/tls.crt" # a new CA needs a new certificate
fi
if [ ! -f "$tls/tls.crt" ]; then
    san="DNS:localhost,IP:127.0.0.1,IP:::1,DNS:keyflow,DNS:keyflow.default.svc"
    san="$san,DNS:keyflow-0.keyflow-headless,DNS:keyflow-0.keyflow-headless.default.svc"
    for n in ${NAMES//,/ }; do san="$san,DNS:$n"; done
    printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=%s\n' "$san" \
        >"$tmp/ext"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$tls/tls.key" \
        -out "$tmp/tls.csr" -subj /CN=keyflow 2>/dev/null
    openssl x509 -req -in "$tmp/tls.csr" -CA "$tls/ca.crt" -CAkey "$ca/ca.key" -CAcreateserial \
        -CAserial "$tmp/ca.srl" -days 365 -extfile "$tmp/ext" -out "$tls/tls.crt" 2>/dev/null
fi
if [ ! -f "$DIR/keyflow-admin-key/admin.key" ]; then
    printf 'kf_%s_%s\n' "$(openssl rand -hex 8)" "$(openssl rand -hex 32)" \
        >"$DIR/keyflow-admin-key/admin.key"
fi
chmod 0644 "$tls/tls.crt" "$tls/ca.crt"
chmod 0600 "$tls/tls.key" "$ca/ca.key" "$DIR/keyflow-admin-key/admin.key"
chmod 0755 "$DIR" "$tls" "$DIR/keyflow-admin-key"
if [ "$(id -u)" = 0 ] && [ -n "$OWNER" ]; then
    chown "$OWNER" "$tls/tls.key" "$DIR/keyflow-admin-key/admin.key"
fi
if [ -n "$GROUP" ]; then
    chgrp "$GROUP" "$tls" "$tls/tls.key" "$tls/tls.crt" "$tls/ca.crt"
    chmod 0640 "$tls/tls.key"
    chmod 0750 "$tls"
fi
echo "secrets in $DIR (server certificate $(openssl x509 -in "$tls/tls.crt" -noout -enddate))"
