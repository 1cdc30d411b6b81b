'use strict';
// Loads keyflow's protos at run time (so fields added to api/ flow in without
// regenerating anything) and converts between messages and native values.
//
// Where the protos come from, first found wins:
//   KEYFLOW_PROTO_DIR            a directory holding keyflow/v1/*.proto
//   <this package>/../../api     the source tree (clients/node inside the repo)
//   <this package>/proto         the copy `npm pack` makes (lib/copy_protos.js)
//
// Responses become plain objects walked from the message descriptors:
//   * names are lowerCamelCase (the proto3 JSON names);
//   * int64 is a number when it is a safe integer, else a BigInt;
//   * a `<x>_json` string field becomes `<x>` holding the decoded JSON value
//     (an empty string, which the server never stores, is null);
//   * enums are short lowercase names (RUN_STATUS_COMPLETED -> "completed");
//   * a member of a oneof appears only when it is the one set; an unset
//     message field is null; bytes are Buffers.
const fs = require('fs');
const path = require('path');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

const PKG = path.dirname(__dirname);

function protoRoot() {
  const candidates = [process.env.KEYFLOW_PROTO_DIR, path.join(PKG, '..', '..', 'api'),
    path.join(PKG, 'proto')].filter(Boolean);
  for (const dir of candidates) {
    if (fs.existsSync(path.join(dir, 'keyflow', 'v1'))) {
      return dir;
    }
  }
  throw new Error(`keyflow: no protos found (looked in ${candidates.join(', ')}); ` +
    'set KEYFLOW_PROTO_DIR to a directory holding keyflow/v1/*.proto');
}

let loaded = null;

// { dir, definition (grpc-js services), reflection (protobufjs Root) }, once.
function load() {
  if (loaded) {
    return loaded;
  }
  const dir = protoRoot();
  const files = fs.readdirSync(path.join(dir, 'keyflow', 'v1')).filter((f) => f.endsWith('.proto'))
    .sort().map((f) => path.join('keyflow', 'v1', f));
  const definition = protoLoader.loadSync(files, {
    includeDirs: [dir],
    keepCase: false,
    longs: String,
    enums: String,
    bytes: Buffer,
    defaults: true,
    oneofs: true,
  });
  const reflection = new protobuf.Root();
  reflection.resolvePath = (origin, target) => path.join(dir, target);
  reflection.loadSync(files, { keepCase: true });
  reflection.resolveAll();
  loaded = { dir, definition, reflection };
  return loaded;
}

function camel(name) {
  return name.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());
}

// RunStatus -> "RUN_STATUS_"; an enum whose values do not all start with its
// name's prefix loses their common one instead (FunctionPlacement's
// PLACEMENT_SINGLE -> "single").
function enumPrefix(enumType) {
  const prefix = enumType.name.replace(/([a-z0-9])([A-Z])/g, '$1_$2').toUpperCase() + '_';
  const names = Object.keys(enumType.values);
  if (names.every((n) => n.startsWith(prefix))) {
    return prefix;
  }
  let common = names[0].split('_').slice(0, -1);
  for (const n of names.slice(1)) {
    const words = n.split('_');
    let k = 0;
    while (k < common.length && k < words.length - 1 && common[k] === words[k]) {
      k++;
    }
    common = common.slice(0, k);
  }
  return common.map((w) => `${w}_`).join('');
}

function toInt(v) {
  if (typeof v === 'number' || typeof v === 'bigint') {
    return v;
  }
  if (v === undefined || v === null || v === '') {
    return 0;
  }
  const n = Number(v);
  return Number.isSafeInteger(n) ? n : BigInt(v);
}

function decodeJson(text) {
  return text === '' || text === undefined || text === null ? null : JSON.parse(text);
}

function enumName(enumType, value) {
  if (typeof value !== 'string') {
    return value;
  }
  const prefix = enumPrefix(enumType);
  return (value.startsWith(prefix) ? value.slice(prefix.length) : value).toLowerCase();
}

function fieldValue(field, v) {
  const t = field.resolvedType;
  if (t instanceof protobuf.Type) {
    return v === null || v === undefined ? null : convert(t, v);
  }
  if (t instanceof protobuf.Enum) {
    return enumName(t, v);
  }
  if (field.long) {
    return toInt(v);
  }
  return v;
}

function convert(type, msg) {
  const out = {};
  for (const field of type.fieldsArray) {
    const key = camel(field.name);
    if (field.partOf && msg[camel(field.partOf.name)] !== key) {
      continue; // a oneof member that is not the one set
    }
    let value = msg[key];
    value = field.repeated ? (value || []).map((v) => fieldValue(field, v)) : fieldValue(field, value);
    if (field.name.endsWith('_json') && field.type === 'string') {
      out[camel(field.name.slice(0, -5))] = Array.isArray(value) ? value.map(decodeJson)
        : decodeJson(value);
    } else {
      out[key] = value;
    }
  }
  return out;
}

function messageType(name) {
  return load().reflection.lookupType(name);
}

// A decoded message (the grpc-js object of type `typeName`) as native values.
function toNative(typeName, msg) {
  return convert(messageType(typeName), msg);
}

// "completed", "COMPLETED", "RUN_STATUS_COMPLETED" or a number -> the enum's
// full name as grpc-js takes it; anything else throws naming `what`.
function enumValue(typeName, value, what) {
  if (value === undefined || value === null) {
    return 0;
  }
  if (typeof value === 'number') {
    return value;
  }
  const enumType = load().reflection.lookupEnum(typeName);
  const prefix = enumPrefix(enumType);
  const upper = String(value).toUpperCase();
  for (const candidate of [upper, prefix + upper]) {
    if (candidate in enumType.values) {
      return candidate;
    }
  }
  const known = Object.keys(enumType.values).filter((n) => enumType.values[n] !== 0)
    .map((n) => n.slice(prefix.length).toLowerCase());
  throw new TypeError(`${what}: unknown value ${JSON.stringify(value)} (one of ${known.join(', ')})`);
}

function encodeJson(value, what) {
  let text;
  try {
    text = JSON.stringify(value === undefined ? null : value, (k, v) => {
      if (typeof v === 'bigint') {
        throw new TypeError('a BigInt has no JSON form');
      }
      if (typeof v === 'number' && !Number.isFinite(v)) {
        throw new TypeError(`${v} has no JSON form`);
      }
      return v;
    });
  } catch (e) {
    throw new TypeError(`${what}: not JSON-serializable: ${e.message}`);
  }
  if (text === undefined) {
    throw new TypeError(`${what}: not JSON-serializable: ${typeof value}`);
  }
  return text;
}

module.exports = { load, messageType, toNative, toInt, enumValue, encodeJson, camel };
