#!/bin/sh
# make_descriptor.sh TEMPLATE SHARED_OBJECT OUTPUT
#
# Writes OUTPUT: the descriptor TEMPLATE with every @DIGEST@ replaced by the
# lowercase hex SHA-256 of SHARED_OBJECT. keyflowd loads a native handler only
# when the SHA-256 of its .so equals the descriptor's implementationDigest, so
# the build runs this after every link of the handler (CMake POST_BUILD).
#
# OUTPUT is replaced atomically (written beside it, then renamed): a reader
# never sees half a descriptor, and a failed run leaves the old one alone.
# POSIX sh; needs sha256sum (GNU coreutils or busybox), sed, grep.
set -eu

if [ "$#" -ne 3 ]; then
    echo "usage: $0 TEMPLATE SHARED_OBJECT OUTPUT" >&2
    exit 2
fi
template=$1
shared_object=$2
output=$3

if [ ! -f "$template" ]; then
    echo "$0: template '$template' not found" >&2
    exit 1
fi
if [ ! -f "$shared_object" ]; then
    echo "$0: shared object '$shared_object' not found" >&2
    exit 1
fi
if ! grep -q '@DIGEST@' "$template"; then
    echo "$0: template '$template' has no @DIGEST@ placeholder" >&2
    exit 1
fi

# Hash standard input so the output line never carries (or escapes) a name.
digest=$(sha256sum < "$shared_object")
digest=${digest%% *}
case $digest in
    *[!0-9a-f]*)
        echo "$0: sha256sum printed '$digest', not lowercase hex" >&2
        exit 1
        ;;
esac
if [ "${#digest}" -ne 64 ]; then
    echo "$0: sha256sum printed '$digest', not 64 hex digits" >&2
    exit 1
fi

tmp=$output.tmp.$$
trap 'rm -f "$tmp"' EXIT
sed "s/@DIGEST@/$digest/g" "$template" > "$tmp"
mv -f "$tmp" "$output"
trap - EXIT
