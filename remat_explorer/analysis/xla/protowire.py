"""A reader of protobuf's wire format, enough for XLA's protos.

jaxlib ships no Python classes for the protos ``hlo.py`` reads (the
``HloModuleProto`` and the ``BufferAssignmentProto``), so they are read
here from their bytes. A message is read in place: a length-delimited
value (a string, a sub-message, packed ints) is given as its span
``(start, stop)`` in the buffer rather than copied out, and only the fields
a caller asks for are kept. What nobody reads, most of a module proto
(every instruction's shape, metadata, operand ids, ...), costs one skip.
"""

from __future__ import annotations

Span = tuple[int, int]
"""Where a value lies in the buffer: ``data[start:stop]``."""

EMPTY: Span = (0, 0)


def whole(data: bytes) -> Span:
  return (0, len(data))


def varint(data: bytes, i: int) -> tuple[int, int]:
  """The varint at `i`, and the position after it."""
  byte = data[i]
  if byte < 0x80:  # one byte: most keys, lengths and small numbers
    return byte, i + 1
  result, shift = byte & 0x7F, 7
  while True:
    i += 1
    byte = data[i]
    result |= (byte & 0x7F) << shift
    shift += 7
    if byte < 0x80:
      return result, i + 1


def fields(data: bytes, span: Span, numbers) -> list[tuple[int, int | Span]]:
  """The fields numbered in `numbers` of the message at `span`, in wire
  order: (number, value), the value an int for a varint and a span for
  the other wire types. Other fields are skipped without being read."""
  out = []
  i, stop = span
  while i < stop:
    key = data[i]
    if key < 0x80:  # a one-byte key (field numbers below 16), read inline
      i += 1
    else:
      key, i = varint(data, i)
    number, wire_type = key >> 3, key & 7
    if wire_type == 0:
      if number in numbers:
        value, i = varint(data, i)
        out.append((number, value))
      else:
        while data[i] >= 0x80:
          i += 1
        i += 1
      continue
    if wire_type == 2:
      size = data[i]
      if size < 0x80:
        i += 1
      else:
        size, i = varint(data, i)
    elif wire_type == 1 or wire_type == 5:
      size = 8 if wire_type == 1 else 4
    else:
      raise ValueError(f'unsupported protobuf wire type {wire_type}')
    if number in numbers:
      out.append((number, (i, i + size)))
    i += size
  return out


def message(data: bytes, span: Span, numbers) -> dict[int, list]:
  """``fields`` by number: each one's values, in wire order."""
  out: dict[int, list] = {}
  for number, value in fields(data, span, numbers):
    out.setdefault(number, []).append(value)
  return out


def scalar(message: dict[int, list], number: int) -> int:
  """A scalar field (its last value, as protobuf reads it); proto3 leaves
  zeros (and False) out."""
  return message.get(number, [0])[-1]


def text(data: bytes, message: dict[int, list], number: int) -> str:
  """A string field's first value; '' where absent."""
  start, stop = message.get(number, [EMPTY])[0]
  return data[start:stop].decode()


def packed(data: bytes, values: list) -> list[int]:
  """A repeated int field, packed (spans) or not (ints)."""
  out = []
  for value in values:
    if isinstance(value, int):
      out.append(value)
      continue
    i, stop = value
    while i < stop:
      v, i = varint(data, i)
      out.append(v)
  return out
