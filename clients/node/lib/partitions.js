'use strict';
// Which partition a key belongs to (docs/scaling.md), the way keyflowd
// computes it: kf-hash-1, pinned by tests/partition/vectors.json.
//
//   partition = kfHash(input) % partitionCount
//   input: a coordinator (workflow, key) -> canonicalKey([workflow, key])
//          a key of a SPLIT function     -> canonicalKey(key columns)
//          a function's home             -> canonicalKey([functionId])
//                                           (every key of a SINGLE function)

const HASH_NAME = 'kf-hash-1';

// kf-hash-1: FNV-1a (32 bits) finished with MurmurHash3's fmix32.
function kfHash(bytes) {
  let h = 2166136261;
  for (const b of bytes) {
    h = Math.imul(h ^ b, 16777619) >>> 0;
  }
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b) >>> 0;
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35) >>> 0;
  h ^= h >>> 16;
  return h >>> 0;
}

// Per column: its UTF-8 bytes after their length (u32 big-endian).
function canonicalKey(columns) {
  const parts = [];
  for (const c of columns) {
    const raw = Buffer.isBuffer(c) ? c : Buffer.from(String(c), 'utf8');
    const len = Buffer.alloc(4);
    len.writeUInt32BE(raw.length);
    parts.push(len, raw);
  }
  return Buffer.concat(parts);
}

function ofCoordinator(workflow, key, count) {
  return kfHash(canonicalKey([workflow, key])) % count;
}

function ofKey(columns, count) {
  return kfHash(canonicalKey(columns)) % count;
}

// The home partition of a function: where a SINGLE function (the default
// placement) keeps every key, so every call about it goes there.
function homeOfFunction(functionId, count) {
  return kfHash(canonicalKey([functionId])) % count;
}

// The partition a run ID names (its UUIDv7's rand_a bits), or -1.
function ofRunId(runId, count) {
  if (count === 1) {
    return 0;
  }
  const at = runId.lastIndexOf('@');
  const uuid = at < 0 ? '' : runId.slice(at + 1);
  if (uuid.length !== 36 || uuid[14] !== '7' || !/^[0-9a-fA-F]{3}$/.test(uuid.slice(15, 18))) {
    return -1;
  }
  const p = parseInt(uuid.slice(15, 18), 16);
  return p < count ? p : -1;
}

module.exports = {
  HASH_NAME, kfHash, canonicalKey, ofCoordinator, ofKey, homeOfFunction, ofRunId,
};
