"""A message's AMQP properties encoded as pamqp encodes them, byte for
byte, at a fraction of its instructions.

pamqp marshals a content header property by property through a chain of
checked calls (the type's name looked up, `by_type`, then for a header
table two or three more calls per entry, through `encode_table_value`'s
`isinstance` tests): an event's properties, its header table with the
provider's headers nested, took about 185,000 instructions to marshal
(about 80,000 here), an eighth of an ingress request (docs/performance.md). `Properties`
marshals the same properties here: the header table's strings, small
integers, unix milliseconds and nested tables directly, any other value (a
float, a bool, a list) and a name longer than AMQP's 128 bytes (which
pamqp cuts) by pamqp itself, and the other properties by pamqp's own
encoder of their type. The bytes are the same
(tests/unit/shared/event/test_amqp_table.py checks them against pamqp's), so the
message format does not change: a worker of any release reads them.
"""

import struct
from collections.abc import Callable

from pamqp import encode
from pamqp.commands import Basic
from pamqp.common import FieldTable

_LENGTH = struct.Struct(">I")
_SMALL_INT = struct.Struct(">b")
_LONG_LONG = struct.Struct(">q")
_FLAGS = struct.Struct(">H")
_NAME_LIMIT = 128  # bytes; pamqp cuts a longer name (and logs it)
_EMPTY = _LENGTH.pack(0)
# Names seen, with their length byte: our own dozen and the providers'
# usual headers; bounded, since a provider's header names are its own.
_NAMES: dict[str, bytes] = {}
_MAX_NAMES = 512


def field_table(table: FieldTable) -> bytes:
    """pamqp's `encode.field_table(table)`: the same bytes."""
    if not table:
        return _EMPTY
    data = bytearray(4)  # its length, written last
    for name in sorted(table):
        encoded_name = _NAMES.get(name)
        if encoded_name is None:
            if (encoded_name := _short_string(name)) is None:
                return encode.field_table(table)
            if len(_NAMES) < _MAX_NAMES:
                _NAMES[name] = encoded_name
        data += encoded_name
        value = table[name]
        kind = type(value)
        if kind is str:
            encoded = value.encode()  # type: ignore[union-attr]
            data += b"S"
            data += _LENGTH.pack(len(encoded))
            data += encoded
        elif kind is int and -128 <= value <= 127:  # type: ignore[operator]
            data += b"b"
            data += _SMALL_INT.pack(value)
        elif kind is int and 4294967295 < value <= 9223372036854775807:  # type: ignore[operator]
            data += b"l"  # pamqp's type past 32 bits (unix milliseconds, 63-bit ids)
            data += _LONG_LONG.pack(value)
        elif kind is dict:
            data += b"F"
            data += field_table(value)  # type: ignore[arg-type]
        else:
            data += encode.encode_table_value(value)
    _LENGTH.pack_into(data, 0, len(data) - 4)
    return bytes(data)


def _short_string(name: str) -> bytes | None:
    """The name with its length byte; None past AMQP's limit (pamqp's to cut)."""
    encoded = name.encode()
    return bytes((len(encoded),)) + encoded if len(encoded) <= _NAME_LIMIT else None


def _encoder(name: str) -> Callable[..., bytes]:
    return field_table if name == "headers" else encode.METHODS[getattr(Basic.Properties, f"_{name}")]


# Each property in the content header's order: its flag bit and its encoder.
_PROPERTIES = [(name, Basic.Properties.flags[name], _encoder(name)) for name in Basic.Properties.__slots__]
assert all(flag & 0xFFFE == flag for _, flag, _ in _PROPERTIES)  # one flag word, as pamqp writes it


class Properties(Basic.Properties):
    """pamqp's Basic.Properties, marshalled here. (No `__slots__` of its
    own: pamqp walks `self.__slots__`, which would then be this class's.)"""

    def marshal(self) -> bytes:
        flags = 0
        parts = [b""]  # the flags, once known
        for name, flag, encoder in _PROPERTIES:
            value = getattr(self, name)
            if value is not None and value != "":
                flags |= flag
                parts.append(encoder(value))
        parts[0] = _FLAGS.pack(flags)
        return b"".join(parts)
