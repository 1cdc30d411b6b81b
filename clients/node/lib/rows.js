'use strict';
// Columnar row batches (keyflow.v1.RowBatch) from and to native rows.
//
// One Column per schema field, in schema order, each with rowCount values; a
// null entry holds a placeholder and its flag in `nulls`. Native values:
//   BOOL boolean | INT64, TIMESTAMP_US number (safe integer), bigint or
//   decimal string | FLOAT64 number | UTF8 string | BYTES Buffer/Uint8Array
//   | null (or undefined) for null.
// Read back, int64 values are numbers when safe, else BigInts.
// Conversion checks types and nullability and names the row and field at
// fault; the server still checks every limit.
const { toInt } = require('./protos');

const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;

const SLOTS = {
  FIELD_TYPE_BOOL: { slot: 'bools', placeholder: false },
  FIELD_TYPE_INT64: { slot: 'int64s', placeholder: '0' },
  FIELD_TYPE_TIMESTAMP_US: { slot: 'int64s', placeholder: '0' },
  FIELD_TYPE_FLOAT64: { slot: 'float64s', placeholder: 0 },
  FIELD_TYPE_UTF8: { slot: 'strings', placeholder: '' },
  FIELD_TYPE_BYTES: { slot: 'bytesValues', placeholder: Buffer.alloc(0) },
};

function typeName(field) {
  return field.type.replace(/^FIELD_TYPE_/, '');
}

function describe(v) {
  const text = typeof v === 'bigint' ? `${v}n` : JSON.stringify(v);
  return `${typeof v} ${text && text.length > 48 ? text.slice(0, 48) + '...' : text}`;
}

// The wire value of v for field, or a thrown TypeError naming `where`.
function wireValue(field, v, where) {
  const bad = () => new TypeError(`${where}: expected ${typeName(field)}, got ${describe(v)}`);
  switch (field.type) {
    case 'FIELD_TYPE_BOOL':
      if (typeof v !== 'boolean') throw bad();
      return v;
    case 'FIELD_TYPE_INT64':
    case 'FIELD_TYPE_TIMESTAMP_US': {
      let big;
      if (typeof v === 'number') {
        if (!Number.isSafeInteger(v)) {
          throw new TypeError(`${where}: ${v} is not a safe integer (pass a bigint or a string)`);
        }
        return v;
      } else if (typeof v === 'bigint') {
        big = v;
      } else if (typeof v === 'string' && /^-?[0-9]+$/.test(v)) {
        big = BigInt(v);
      } else {
        throw bad();
      }
      if (big < INT64_MIN || big > INT64_MAX) {
        throw new TypeError(`${where}: ${big} is outside int64`);
      }
      return big.toString();
    }
    case 'FIELD_TYPE_FLOAT64':
      if (typeof v !== 'number') throw bad();
      return v;
    case 'FIELD_TYPE_UTF8':
      if (typeof v !== 'string') throw bad();
      return v;
    case 'FIELD_TYPE_BYTES':
      if (!(v instanceof Uint8Array)) throw bad();
      return Buffer.isBuffer(v) ? v : Buffer.from(v.buffer, v.byteOffset, v.byteLength);
    default:
      throw new TypeError(`${where}: field type ${field.type} is not supported by this SDK`);
  }
}

function column(field, values, whereOf) {
  const spec = SLOTS[field.type];
  if (!spec) {
    throw new TypeError(`${whereOf(0)}: field type ${field.type} is not supported by this SDK`);
  }
  const out = new Array(values.length);
  let nulls = null;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v === null || v === undefined) {
      if (!field.nullable) {
        throw new TypeError(`${whereOf(i)}: null in non-nullable field`);
      }
      if (nulls === null) {
        nulls = new Array(values.length).fill(false);
      }
      nulls[i] = true;
      out[i] = spec.placeholder;
    } else {
      out[i] = wireValue(field, v, whereOf(i));
    }
  }
  return { nulls: nulls || [], [spec.slot]: { values: out } };
}

// schema: a native Schema ({fields: [{name, type: "utf8" | ..., nullable}]}) or
// the grpc-js one; rows: an array of objects keyed by field name (a missing
// key is null; a key that is not a field is an error).
function batchFromRows(schema, rows) {
  const fields = wireFields(schema);
  const known = new Set(fields.map((f) => f.name));
  rows.forEach((row, i) => {
    if (row === null || typeof row !== 'object' || Array.isArray(row)) {
      throw new TypeError(`rows[${i}]: expected an object, got ${describe(row)}`);
    }
    for (const k of Object.keys(row)) {
      if (!known.has(k)) {
        throw new TypeError(`rows[${i}]: ${JSON.stringify(k)} is not a field of the input ` +
          `schema (fields: ${[...known].join(', ')})`);
      }
    }
  });
  return {
    rowCount: rows.length,
    columns: fields.map((f) => column(f, rows.map((r) => r[f.name]), (i) => `rows[${i}].${f.name}`)),
  };
}

// columns: an object of field name -> array, all of one length; a field
// left out is all null.
function batchFromColumns(schema, columns) {
  const fields = wireFields(schema);
  const known = new Set(fields.map((f) => f.name));
  for (const k of Object.keys(columns)) {
    if (!known.has(k)) {
      throw new TypeError(`columns: ${JSON.stringify(k)} is not a field of the input schema ` +
        `(fields: ${[...known].join(', ')})`);
    }
  }
  const lengths = Object.entries(columns).map(([k, v]) => [k, v.length]);
  if (new Set(lengths.map(([, n]) => n)).size > 1) {
    throw new TypeError(`columns: lengths differ (${lengths.map(([k, n]) => `${k}=${n}`).join(', ')})`);
  }
  const count = lengths.length ? lengths[0][1] : 0;
  return {
    rowCount: count,
    columns: fields.map((f) => column(f, columns[f.name] || new Array(count).fill(null),
      (i) => `columns.${f.name}[${i}]`)),
  };
}

// Rows of a (grpc-js decoded) RowBatch as objects in schema order, with
// "_seq" from firstSeq when firstSeq > 0.
function rowsFromBatch(schema, batch, firstSeq) {
  const fields = wireFields(schema);
  const n = Number(batch.rowCount);
  if (batch.columns.length !== fields.length) {
    throw new Error(`batch has ${batch.columns.length} columns, the schema ${fields.length}`);
  }
  const cols = fields.map((f, c) => {
    const col = batch.columns[c];
    const values = col.values ? col[col.values].values : new Array(n).fill(null);
    const isInt = SLOTS[f.type] && SLOTS[f.type].slot === 'int64s';
    return values.map((v, i) => (col.nulls.length && col.nulls[i] ? null : isInt ? toInt(v) : v));
  });
  const out = new Array(n);
  for (let i = 0; i < n; i++) {
    const row = firstSeq > 0 ? { _seq: firstSeq + i } : {};
    fields.forEach((f, c) => {
      row[f.name] = cols[c][i];
    });
    out[i] = row;
  }
  return out;
}

// Fields with wire type names (FIELD_TYPE_*) from a native or wire schema.
function wireFields(schema) {
  return schema.fields.map((f) => ({
    name: f.name,
    nullable: !!f.nullable,
    type: f.type.startsWith('FIELD_TYPE_') ? f.type : 'FIELD_TYPE_' + f.type.toUpperCase(),
  }));
}

// Rows `which` (indexes, in order) of a wire batch, as a batch of its own (a
// batch split by partition: lib/routing.js).
function sliceBatch(batch, which) {
  return {
    rowCount: which.length,
    columns: batch.columns.map((col) => {
      const out = { nulls: col.nulls && col.nulls.length ? which.map((i) => col.nulls[i]) : [] };
      for (const { slot } of Object.values(SLOTS)) {
        if (col[slot] && col[slot].values) {
          out[slot] = { values: which.map((i) => col[slot].values[i]) };
        }
      }
      return out;
    }),
  };
}

module.exports = { batchFromRows, batchFromColumns, rowsFromBatch, sliceBatch };
