"""Columnar row batches (keyflow.v1.RowBatch) from and to native rows.

A batch has one Column per schema field, in schema order, each with
row_count values; a null entry holds a placeholder and its flag in `nulls`.
Native values per field type:

    BOOL bool | INT64, TIMESTAMP_US int | FLOAT64 float (int accepted)
    UTF8 str  | BYTES bytes (bytearray, memoryview accepted) | null None

Conversion checks types and nullability and names the row and the field at
fault; the server still checks every limit.
"""

from .v1 import functions_pb2 as fpb

FT = fpb.FieldType
_SLOT = {
    FT.Value("FIELD_TYPE_BOOL"): ("bools", False, (bool,)),
    FT.Value("FIELD_TYPE_INT64"): ("int64s", 0, (int,)),
    FT.Value("FIELD_TYPE_TIMESTAMP_US"): ("int64s", 0, (int,)),
    FT.Value("FIELD_TYPE_FLOAT64"): ("float64s", 0.0, (float, int)),
    FT.Value("FIELD_TYPE_UTF8"): ("strings", "", (str,)),
    FT.Value("FIELD_TYPE_BYTES"): ("bytes_values", b"", (bytes, bytearray, memoryview)),
}


def _type_name(field):
    return FT.Name(field.type)[len("FIELD_TYPE_"):]


def _check(field, value, where):
    """Raises ValueError unless value suits the field (None already handled)."""
    slot = _SLOT.get(field.type)
    if slot is None:
        raise ValueError("%s: field type %s is not supported by this SDK"
                         % (where, FT.Name(field.type)))
    ok = isinstance(value, slot[2])
    if ok and field.type != FT.Value("FIELD_TYPE_BOOL") and isinstance(value, bool):
        ok = False  # True is an int in Python, never an INT64 value
    if ok and slot[0] == "int64s" and not -(2 ** 63) <= value < 2 ** 63:
        raise ValueError("%s: %d is outside int64" % (where, value))
    if not ok:
        raise ValueError("%s: expected %s, got %s %r"
                         % (where, _type_name(field), type(value).__name__, value))


def _fill_column(col, field, values, where_of):
    slot, placeholder, _ = _SLOT.get(field.type, (None, None, None))
    nulls = None
    for i, v in enumerate(values):
        if v is None:
            if not field.nullable:
                raise ValueError("%s: null in non-nullable field" % where_of(i))
            if nulls is None:
                nulls = [False] * len(values)
            nulls[i] = True
        else:
            _check(field, v, where_of(i))
    if nulls is not None:
        values = [placeholder if v is None else v for v in values]
        col.nulls.extend(nulls)
    if slot == "bytes_values":
        values = [bytes(v) for v in values]
    elif slot == "float64s":
        values = [float(v) for v in values]
    getattr(col, slot).values.extend(values)


def batch_from_rows(schema, rows):
    """A RowBatch from a sequence of dicts keyed by field name. A missing
    key is null; a key that is not a field is an error."""
    rows = list(rows)
    names = [f.name for f in schema.fields]
    known = set(names)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError("rows[%d]: expected a dict, got %s" % (i, type(row).__name__))
        if len(row) > len(known) or not known.issuperset(row):
            extra = sorted(set(row) - known)
            if extra:
                raise ValueError("rows[%d]: %r is not a field of the input schema (fields: %s)"
                                 % (i, extra[0], ", ".join(names)))
    batch = fpb.RowBatch(row_count=len(rows))
    for field in schema.fields:
        name = field.name
        _fill_column(batch.columns.add(), field, [row.get(name) for row in rows],
                     lambda i, name=name: "rows[%d].%s" % (i, name))
    return batch


def batch_from_columns(schema, columns):
    """A RowBatch from a dict of field name -> sequence of values, all of one
    length. A field left out is all null."""
    names = [f.name for f in schema.fields]
    extra = sorted(set(columns) - set(names))
    if extra:
        raise ValueError("columns: %r is not a field of the input schema (fields: %s)"
                         % (extra[0], ", ".join(names)))
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError("columns: lengths differ (%s)"
                         % ", ".join("%s=%d" % kv for kv in sorted(lengths.items())))
    count = next(iter(lengths.values()), 0)
    batch = fpb.RowBatch(row_count=count)
    for field in schema.fields:
        name = field.name
        values = list(columns[name]) if name in columns else [None] * count
        _fill_column(batch.columns.add(), field, values,
                     lambda i, name=name: "columns.%s[%d]" % (name, i))
    return batch


def rows_from_batch(schema, batch, first_seq=0):
    """The rows of a RowBatch as dicts in schema order; with first_seq > 0
    each row also gets "_seq" (first_seq, first_seq + 1, ...)."""
    n = batch.row_count
    fields = list(schema.fields)
    if len(batch.columns) != len(fields):
        raise ValueError("batch has %d columns, the schema %d" % (len(batch.columns), len(fields)))
    cols = []
    for field, col in zip(fields, batch.columns):
        which = col.WhichOneof("values")
        values = list(getattr(col, which).values) if which else [None] * n
        if len(values) != n:
            raise ValueError("column %s has %d values for %d rows" % (field.name, len(values), n))
        if len(col.nulls):
            values = [None if null else v for v, null in zip(values, col.nulls)]
        cols.append(values)
    names = [f.name for f in fields]
    out = []
    for i in range(n):
        row = {"_seq": first_seq + i} if first_seq > 0 else {}
        for name, values in zip(names, cols):
            row[name] = values[i]
        out.append(row)
    return out


def slice_batch(batch, which):
    """Rows `which` (indexes, in order) of a batch, as a batch of its own (a
    batch split by partition: keyflow.routing)."""
    out = fpb.RowBatch(row_count=len(which))
    for col in batch.columns:
        part = out.columns.add()
        part.name = col.name
        if col.nulls:
            part.nulls.extend(col.nulls[i] for i in which)
        kind = col.WhichOneof("values")
        if kind is not None:
            values = getattr(col, kind).values
            getattr(part, kind).values.extend(values[i] for i in which)
    return out
