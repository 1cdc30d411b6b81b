"""Which partition a key belongs to (docs/scaling.md), the same way
keyflowd computes it: kf-hash-1, pinned by tests/partition/vectors.json.

    partition = kf_hash(input) % partition_count
    input: a coordinator (workflow, key) -> canonical_key([workflow, key])
           a key of a SPLIT function     -> canonical_key(key columns)
           a function's home             -> canonical_key([function_id])
                                            (every key of a SINGLE function)

No dependencies: the SDK's routing client and tests import it alike.
"""

import struct

_M = 0xFFFFFFFF

HASH_NAME = "kf-hash-1"


def kf_hash(data: bytes) -> int:
    """kf-hash-1: FNV-1a (32 bits) finished with MurmurHash3's fmix32."""
    h = 2166136261
    for b in data:
        h = ((h ^ b) * 16777619) & _M
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M
    h ^= h >> 16
    return h


def canonical_key(columns) -> bytes:
    """Per column: its UTF-8 bytes after their length (u32 big-endian)."""
    out = bytearray()
    for c in columns:
        raw = c.encode("utf-8") if isinstance(c, str) else bytes(c)
        out += struct.pack(">I", len(raw)) + raw
    return bytes(out)


def of_coordinator(workflow: str, key: str, count: int) -> int:
    return kf_hash(canonical_key([workflow, key])) % count


def of_key(columns, count: int) -> int:
    return kf_hash(canonical_key(columns)) % count


def home_of_function(function_id: str, count: int) -> int:
    """The home partition of a function: where a SINGLE function (the
    default placement) keeps every key, so every call about it goes there."""
    return kf_hash(canonical_key([function_id])) % count


def of_run_id(run_id: str, count: int) -> int:
    """The partition a run ID names (its UUIDv7's rand_a), or -1."""
    if count == 1:
        return 0
    _, at, uuid = run_id.rpartition("@")
    if not at or len(uuid) != 36 or uuid[14] != "7":
        return -1
    try:
        p = int(uuid[15:18], 16)
    except ValueError:
        return -1
    return p if p < count else -1
