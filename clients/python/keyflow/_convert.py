"""Conversions between protobuf messages and native Python values.

Responses become Record dicts walked from the message descriptor, so fields
added to the protos appear without a change here:
  * names stay snake_case; int64 stays int; bytes stay bytes;
  * a string field named `<x>_json` becomes `<x>` holding the decoded JSON
    value (an empty string, which the server never stores, is None);
  * enums become their short lowercase name (RUN_STATUS_COMPLETED ->
    "completed", STATE_KIND_VALUE -> "value");
  * a member of a oneof appears only when it is the one set; an unset
    message field is None.
Requests go the other way in encode_json / enum_value.
"""

import json

from google.protobuf.descriptor import FieldDescriptor

JSON_SUFFIX = "_json"


class Record(dict):
    """A dict whose keys can also be read as attributes (run.input)."""

    __slots__ = ()

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _enum_short_name(field, number):
    value = field.enum_type.values_by_number.get(number)
    if value is None:
        return number  # a value newer than these stubs
    prefix = _enum_prefix(field.enum_type)
    name = value.name
    if name.startswith(prefix):
        name = name[len(prefix):]
    return name.lower()


def _enum_prefix(enum_type):
    # RunStatus -> "RUN_STATUS_"; an enum whose values do not all start with
    # its name's prefix loses their common one instead (FunctionPlacement's
    # PLACEMENT_SINGLE -> "single").
    out = []
    for i, ch in enumerate(enum_type.name):
        if ch.isupper() and i > 0:
            out.append("_")
        out.append(ch.upper())
    prefix = "".join(out) + "_"
    names = [v.name for v in enum_type.values]
    if all(n.startswith(prefix) for n in names):
        return prefix
    common = names[0].split("_")[:-1]
    for n in names[1:]:
        words = n.split("_")
        k = 0
        while k < len(common) and k < len(words) - 1 and common[k] == words[k]:
            k += 1
        common = common[:k]
    return "".join(w + "_" for w in common)


def enum_value(enum_type, value, what):
    """"completed", "COMPLETED", "RUN_STATUS_COMPLETED" or a number -> the
    enum number; anything else is a ValueError naming `what`."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    text = str(value).upper()
    prefix = _enum_prefix(enum_type)
    for name in (text, prefix + text):
        v = enum_type.values_by_name.get(name)
        if v is not None:
            return v.number
    names = ", ".join(v.name[len(prefix):].lower() for v in enum_type.values if v.number != 0)
    raise ValueError("%s: unknown value %r (one of %s)" % (what, value, names))


def decode_json(text):
    return None if text == "" else json.loads(text)


def encode_json(value, what):
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError("%s: not JSON-serializable: %s" % (what, e)) from None


def _value(field, v):
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return to_native(v)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return _enum_short_name(field, v)
    return v


def to_native(msg):
    """A protobuf message as a Record (see the module comment)."""
    out = Record()
    for field in msg.DESCRIPTOR.fields:
        name = field.name
        if field.containing_oneof is not None and msg.WhichOneof(field.containing_oneof.name) != name:
            continue
        if field.label == FieldDescriptor.LABEL_REPEATED:
            value = [_value(field, v) for v in getattr(msg, name)]
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not msg.HasField(name):
            value = None
        else:
            value = _value(field, getattr(msg, name))
        if name.endswith(JSON_SUFFIX) and field.type == FieldDescriptor.TYPE_STRING:
            name = name[:-len(JSON_SUFFIX)]
            value = [decode_json(v) for v in value] if isinstance(value, list) else decode_json(value)
        out[name] = value
    return out
