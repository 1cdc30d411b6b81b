#!/usr/bin/env python3
"""Writes tests/partition/vectors.json: kf-hash-1 test vectors that the C
unit test, the Python and Node SDKs and the proxy's Lua script all check
(docs/scaling.md). This is an independent implementation of the hash: the
C code is checked against it, not the other way round.

Run it only to add vectors; the expected values of existing ones never
change (they are the data format)."""
import json
import os
import struct

M = 0xFFFFFFFF


def kf_hash(data: bytes) -> int:
    h = 2166136261
    for b in data:
        h = ((h ^ b) * 16777619) & M
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M
    h ^= h >> 16
    return h


def canonical(columns):
    out = b""
    for c in columns:
        raw = c.encode("utf-8")
        out += struct.pack(">I", len(raw)) + raw
    return out


def main():
    hashes = []
    for text in ["", "a", "b", "ab", "order-7", "keyflow", "\u00e9t\u00e9", "x" * 300]:
        raw = text.encode("utf-8")
        hashes.append({"hex": raw.hex(), "hash": kf_hash(raw)})
    hashes.append({"hex": "00ff7f80", "hash": kf_hash(bytes([0, 255, 127, 128]))})
    coordinators = []
    pairs = [("ship", "order-7"), ("ship", "order-8"), ("notify", "user-1"), ("", ""),
             ("w", "k"), ("a/b", "c"), ("a", "b/c"), ("caf\u00e9", "cl\u00e9 \u00e0 vis"),
             ("wf", "k" * 256)]
    for wf, key in pairs:
        for count in (1, 2, 3, 8, 256):
            coordinators.append({"workflow": wf, "key": key, "count": count,
                                 "hash": kf_hash(canonical([wf, key])),
                                 "partition": kf_hash(canonical([wf, key])) % count})
    keys = []
    for cols in (["ann"], ["bob"], [""], ["ann", "bob"], ["a", "b", "c"], ["\u00fcber"]):
        for count in (1, 3, 8):
            keys.append({"columns": cols, "canonical_hex": canonical(cols).hex(), "count": count,
                         "partition": kf_hash(canonical(cols)) % count})
    homes = []
    for fid in ("running_sum", "session_counter", "f", "", "caf\u00e9", "fn/" + "z" * 200):
        for count in (1, 2, 3, 8, 256):
            homes.append({"function_id": fid, "count": count,
                          "partition": kf_hash(canonical([fid])) % count})
    run_ids = [
        {"run_id": "order-7@0190f7a2-5b3c-7005-8a4e-1c2d3e4f5a6b", "count": 8, "partition": 5},
        {"run_id": "a@b@0190f7a2-5b3c-7000-8a4e-1c2d3e4f5a6b", "count": 8, "partition": 0},
        {"run_id": "k@0190f7a2-5b3c-70ff-8a4e-1c2d3e4f5a6b", "count": 256, "partition": 255},
        {"run_id": "k@0190f7a2-5b3c-7100-8a4e-1c2d3e4f5a6b", "count": 256, "partition": -1},
        {"run_id": "k@0190f7a2-5b3c-7abc-8a4e-1c2d3e4f5a6b", "count": 1, "partition": 0},
        {"run_id": "no-uuid", "count": 8, "partition": -1},
        {"run_id": "k@0190f7a2-5b3c-4005-8a4e-1c2d3e4f5a6b", "count": 8, "partition": -1},
    ]
    doc = {
        "hash": "kf-hash-1",
        "about": "docs/scaling.md: partition = kf-hash-1(input) mod count; a SINGLE function's "
                 "keys are all in its home, kf-hash-1(u32be(len(function_id)) function_id) mod count",
        "hashes": hashes,
        "coordinators": coordinators,
        "keys": keys,
        "function_homes": homes,
        "run_ids": run_ids,
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
