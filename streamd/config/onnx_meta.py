"""``metadata_props`` of an ONNX file without importing onnx (which costs about half a second).

An ONNX file is one protobuf ``ModelProto``; ``metadata_props`` is its repeated field 14 of
``StringStringEntryProto`` (``key`` = 1, ``value`` = 2). The top-level fields are walked in the wire format
and every other one is skipped by seeking, so the graph (field 7, the weights) is never read.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

METADATA_PROPS = 14
_MAX_VARINT_BYTES = 10


def read_metadata_props(path: Path) -> dict[str, str]:
    """``{key: value}`` of the model's ``metadata_props`` (a later duplicate key wins, as in onnx).

    Raises OSError when the file cannot be read and ValueError when it is not a protobuf message."""
    props: dict[str, str] = {}
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        while f.tell() < size:
            field, wire = _key(f)
            if wire == 0:
                _varint(f)
            elif wire in (1, 5):  # fixed 64 / 32 bit
                _skip(f, 8 if wire == 1 else 4, size)
            elif wire == 2:
                length = _varint(f)
                if field == METADATA_PROPS:
                    key, value = _entry(_read(f, length, size))
                    props[key] = value
                else:
                    _skip(f, length, size)
            else:
                raise ValueError(f"protobuf wire type {wire} at offset {f.tell()}: not an ONNX model")
    return props


def _entry(data: bytes) -> tuple[str, str]:
    """A ``StringStringEntryProto``: (key, value)."""
    out = {1: "", 2: ""}
    pos = 0
    while pos < len(data):
        key, pos = _varint_at(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 2:
            length, pos = _varint_at(data, pos)
            if pos + length > len(data):
                raise ValueError("truncated metadata entry")
            if field in out:
                out[field] = data[pos : pos + length].decode("utf-8")
            pos += length
        elif wire == 0:
            _, pos = _varint_at(data, pos)
        else:
            raise ValueError(f"protobuf wire type {wire} in a metadata entry")
    return out[1], out[2]


def _key(f: BinaryIO) -> tuple[int, int]:
    key = _varint(f)
    if key >> 3 == 0:
        raise ValueError("protobuf field number 0: not an ONNX model")
    return key >> 3, key & 7


def _varint(f: BinaryIO) -> int:
    value = 0
    for shift in range(0, 7 * _MAX_VARINT_BYTES, 7):
        byte = f.read(1)
        if not byte:
            raise ValueError("truncated protobuf varint")
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
    raise ValueError("protobuf varint longer than 10 bytes")


def _varint_at(data: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for shift in range(0, 7 * _MAX_VARINT_BYTES, 7):
        if pos >= len(data):
            raise ValueError("truncated protobuf varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
    raise ValueError("protobuf varint longer than 10 bytes")


def _skip(f: BinaryIO, length: int, size: int) -> None:
    if f.tell() + length > size:
        raise ValueError("truncated protobuf field")
    f.seek(length, 1)


def _read(f: BinaryIO, length: int, size: int) -> bytes:
    if f.tell() + length > size:
        raise ValueError("truncated protobuf field")
    return f.read(length)
