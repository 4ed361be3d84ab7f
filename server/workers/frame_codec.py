"""The payload of a control frame: msgpack, with extension types for exactly the values that travel.

The engine and the API processes exchange plain values (ints, floats,
strings, bytes, lists, str-keyed dicts, None) plus a closed set of others,
each an msgpack ExtType:

    TUPLE       a tuple (msgpack has only arrays; lists stay lists)
    DATACLASS   one of ``MESSAGE_DATACLASSES``, by name, with its init fields by name
    ENUM        one of ``MESSAGE_ENUMS``, by name, with its value
    NDARRAY     a numeric numpy array: dtype, shape, raw bytes (decoded without a copy, read-only)
    NUMPY_SCALAR  a numeric numpy scalar (np.float32 ...): dtype, raw bytes
    BIG_INT     an int beyond 64 bits (a W3C trace id has 128), as signed big-endian bytes

Decoding builds only what ``REGISTRY`` names: a class name read from the wire
is looked up there, never imported, so a frame can make nothing but these
values, whatever its bytes. A dataclass must arrive with exactly the init
fields the receiver's class has: a field added on one side only fails loudly
(``FrameDecodeError``) instead of filling in a default. Encoding refuses
every other type (``TypeError``), torch tensors included: outcomes leave the
engine as numpy (``server.workers.engine_process.portable``). Packing is
strict about types, so a str-valued enum or an int subclass never passes as
its base type.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from typing import Any

import msgpack
import numpy as np

from cache.keys import Modality, SegmentKey
from models.tokenizer import TokenizedText
from router.intake import IntakeItem, IntakeOutcome
from router.item_facts import ItemFacts
from router.joint_budget import JointTokens
from router.request import InferenceResult, Priority, Route
from router.segments import ImageContent
from router.tracing import SpanIds

TUPLE, DATACLASS, ENUM, NDARRAY, NUMPY_SCALAR, BIG_INT = 1, 2, 3, 4, 5, 6
NUMERIC_KINDS = frozenset("biufc")  # bool, signed, unsigned, float, complex: raw bytes say all of them

MESSAGE_DATACLASSES: tuple[type, ...] = (
    IntakeItem, ImageContent, SpanIds,  # the API process's items
    IntakeOutcome, InferenceResult, TokenizedText, ItemFacts, JointTokens,  # the engine's outcomes
    SegmentKey,  # a peek's keys
)
MESSAGE_ENUMS: tuple[type[enum.Enum], ...] = (Priority, Route, Modality)


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


REGISTRY: dict[str, type] = {_name(cls): cls for cls in (*MESSAGE_DATACLASSES, *MESSAGE_ENUMS)}
_HEADER_LENGTH = struct.Struct(">H")


class FrameDecodeError(ValueError):
    """A frame's payload names a type or an extension this codec does not build, or is malformed."""


def encode(message: object) -> bytes:
    """``message`` as msgpack; ``TypeError`` for a value of a type no frame carries."""
    return msgpack.packb(message, default=_to_extension, use_bin_type=True, strict_types=True)


def decode(payload: bytes) -> Any:  # noqa: ANN401 - a message is any of the values above
    """The message ``encode`` made; ``FrameDecodeError`` for anything else."""
    try:
        return msgpack.unpackb(payload, ext_hook=_from_extension, raw=False, strict_map_key=True)
    except FrameDecodeError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise FrameDecodeError(f"malformed frame: {e}") from e


def _to_extension(value: object) -> msgpack.ExtType:
    cls = type(value)
    if cls is tuple:
        return msgpack.ExtType(TUPLE, encode(list(value)))  # type: ignore[arg-type]
    if cls is int:  # msgpack packs the others itself
        return msgpack.ExtType(BIG_INT, value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True))
    if isinstance(value, np.ndarray):
        return msgpack.ExtType(NDARRAY, _array_bytes(value))
    if isinstance(value, np.generic):
        return msgpack.ExtType(NUMPY_SCALAR, _array_bytes(np.asarray(value)))
    name = _name(cls)
    if REGISTRY.get(name) is not cls:
        raise TypeError(f"a control frame carries no {name} (server.workers.frame_codec.REGISTRY)")
    if isinstance(value, enum.Enum):
        return msgpack.ExtType(ENUM, encode([name, value.value]))
    fields = {field.name: getattr(value, field.name) for field in dataclasses.fields(value) if field.init}  # type: ignore[arg-type]
    return msgpack.ExtType(DATACLASS, encode([name, fields]))


def _array_bytes(array: np.ndarray) -> bytes:
    if array.dtype.kind not in NUMERIC_KINDS:
        raise TypeError(f"a control frame carries numeric arrays only, not dtype {array.dtype}")
    header = msgpack.packb([array.dtype.str, list(array.shape)])
    return _HEADER_LENGTH.pack(len(header)) + header + np.ascontiguousarray(array).tobytes()


def _from_extension(code: int, data: bytes) -> object:
    if code == TUPLE:
        return tuple(decode(data))
    if code == BIG_INT:
        return int.from_bytes(data, "big", signed=True)
    if code in (NDARRAY, NUMPY_SCALAR):
        array = _array_from(data)
        return array if code == NDARRAY else array[()]
    if code not in (DATACLASS, ENUM):
        raise FrameDecodeError(f"unknown extension type {code}")
    name, content = decode(data)
    cls = REGISTRY.get(name)
    if cls is None:
        raise FrameDecodeError(f"unknown type {name!r}: not in server.workers.frame_codec.REGISTRY")
    if code == ENUM:
        if not issubclass(cls, enum.Enum):
            raise FrameDecodeError(f"{name} is not an enum")
        return cls(content)
    if not dataclasses.is_dataclass(cls) or not isinstance(content, dict):
        raise FrameDecodeError(f"{name} is not a dataclass")
    expected = {field.name for field in dataclasses.fields(cls) if field.init}
    if set(content) != expected:
        raise FrameDecodeError(f"{name} arrived with fields {sorted(content)}; this side has {sorted(expected)}")
    return cls(**content)


def _array_from(data: bytes) -> np.ndarray:
    (header_length,) = _HEADER_LENGTH.unpack_from(data)
    dtype_str, shape = msgpack.unpackb(data[_HEADER_LENGTH.size:_HEADER_LENGTH.size + header_length])
    dtype = np.dtype(dtype_str)
    if dtype.kind not in NUMERIC_KINDS:
        raise FrameDecodeError(f"an array of dtype {dtype} in a frame")
    offset = _HEADER_LENGTH.size + header_length
    count = int(np.prod(shape, dtype=np.int64))
    if (len(data) - offset) != count * dtype.itemsize:
        raise FrameDecodeError(f"an array of shape {shape} and dtype {dtype} with {len(data) - offset} bytes")
    return np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
