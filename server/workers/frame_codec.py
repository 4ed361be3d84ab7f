"""The payload of a control frame: msgpack, with extension types for exactly the values that travel.

The engine and the API processes exchange plain values (ints, floats,
strings, bytes, lists, str-keyed dicts, None) plus a closed set of others,
each tagged with an msgpack ExtType:

    [TUPLE, *items]             a tuple (msgpack has only arrays; lists stay lists)
    [DATACLASS(name), {fields}] one of ``MESSAGE_DATACLASSES``, its init fields by name
    [ENUM(name), value]         one of ``MESSAGE_ENUMS``, by its value
    NDARRAY                     a numeric numpy array: dtype, shape, raw bytes (decoded without a copy, read-only)
    NUMPY_SCALAR                a numeric numpy scalar (np.float32 ...): the same, shape ()
    BIG_INT                     an int beyond 64 bits (a W3C trace id has 128), as signed big-endian bytes

A container is an array led by its tag, so one packer and one unpacker do the
whole message in one pass (``list_hook`` builds each container from its
array), with no packer per container; a tag anywhere but at the head of an
array is refused.

Decoding builds only what ``REGISTRY`` names: a class name read from the wire
is looked up there, never imported, so a frame can make nothing but these
values, whatever its bytes. A dataclass must arrive with exactly the init
fields the receiver's class has: a field added on one side only fails loudly
(``FrameDecodeError``) instead of filling in a default. Encoding refuses
every other type (``TypeError``), torch tensors included: outcomes leave the
engine as numpy (``server.workers.engine_answers.portable``). Packing is
strict about types, so a str-valued enum or an int subclass never passes as
its base type.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import struct
from typing import Any, TypeVar

import msgpack
import numpy as np

from cache.keys import Modality, SegmentKey
from monitoring.inputs import RequestInputs
from models.loading.config import FusionConfig, ModelConfig, PreprocessConfig, TextConfig, VisionConfig
from models.torch_free.description import ModelDescription
from models.served_facts import ServedModelFacts
from models.torch_free.text_ids import TokenizedText
from models.tokenizer_files import TokenizerFiles
from router.faults import FaultPlan
from router.intake import IntakeItem, IntakeOutcome
from router.item_facts import ItemFacts
from router.joint_budget import JointTokens
from router.request import InferenceResult, Priority, Route
from router.segments import ImageContent
from router.tracing import BatchTrace, SpanIds
from router.zero_shot import TokenizedTexts, ZeroShotOptions
from server.protocols.zero_shot_run import Pairing, ZeroShotScores, ZeroShotWork

T = TypeVar("T")

TUPLE, DATACLASS, ENUM, NDARRAY, NUMPY_SCALAR, BIG_INT = 1, 2, 3, 4, 5, 6
NUMERIC_KINDS = frozenset("biufc")  # bool, signed, unsigned, float, complex: raw bytes say all of them

MESSAGE_DATACLASSES: tuple[type, ...] = (
    IntakeItem, ImageContent, SpanIds,  # the API process's items
    IntakeOutcome, InferenceResult, TokenizedText, ItemFacts, JointTokens,  # the engine's outcomes
    BatchTrace,  # an outcome's batch, and the batch spans an API process asks the engine to export
    SegmentKey,  # a peek's keys
    FaultPlan,  # the engine's fault drills, copied to every API process
    ServedModelFacts, ModelConfig, VisionConfig, TextConfig, FusionConfig, PreprocessConfig,  # a describe's
    ModelDescription, TokenizerFiles,  # answer: all an API process knows of the model (it loads none)
    RequestInputs,  # a request's latency record, for the engine's one monitor
    ZeroShotWork, ZeroShotOptions, TokenizedTexts, ZeroShotScores,  # a classify or rank call, and its scores
)
MESSAGE_ENUMS: tuple[type[enum.Enum], ...] = (Priority, Route, Modality, Pairing)


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


REGISTRY: dict[str, type] = {_name(cls): cls for cls in (*MESSAGE_DATACLASSES, *MESSAGE_ENUMS)}
_INIT_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(field.name for field in dataclasses.fields(cls) if field.init) for cls in MESSAGE_DATACLASSES}
_INIT_FIELD_SETS: dict[type, frozenset[str]] = {cls: frozenset(names) for cls, names in _INIT_FIELDS.items()}
_TAGS: dict[type, msgpack.ExtType] = {
    cls: msgpack.ExtType(DATACLASS if cls in _INIT_FIELDS else ENUM, name.encode()) for name, cls in REGISTRY.items()}
_TUPLE_TAG = msgpack.ExtType(TUPLE, b"")
_SHAPE_DIM = struct.Struct(">Q")
# Dataclasses whose instance ``__dict__`` is their init fields and nothing else, when it has that many
# entries: packed as that dict itself, not a copy built field by field (no slots, every field an init field).
_DICT_SIZES: dict[type, int] = {
    cls: len(names) for cls, names in _INIT_FIELDS.items()
    if "__slots__" not in vars(cls) and len(names) == len(dataclasses.fields(cls))}



def stores_fields_only(cls: type) -> bool:
    """Whether ``cls`` is a dataclass whose generated ``__init__`` only stores its arguments in ``__dict__``.

    No slots, no ``__post_init__``, every field an init field: an instance is
    then exactly its fields, and ``from_fields`` may build one without
    ``__init__``, which for a frozen dataclass stores each field through
    ``object.__setattr__`` (an outcome's classes have a dozen fields each).
    """
    return (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.init  # type: ignore[attr-defined]
            and "__slots__" not in vars(cls) and not hasattr(cls, "__post_init__")
            and all(field.init for field in dataclasses.fields(cls)))


def from_fields(cls: type[T], fields: dict[str, object]) -> T:
    """An instance of a ``stores_fields_only`` class holding ``fields`` (every field, by name), built without ``__init__``."""
    instance = object.__new__(cls)
    instance.__dict__.update(fields)
    return instance


def copy_with(instance: T, **changes: object) -> T:
    """``dataclasses.replace`` for a ``stores_fields_only`` class, without looking up its fields or running ``__init__``."""
    return from_fields(type(instance), {**instance.__dict__, **changes})


_BUILT_FROM_FIELDS: frozenset[type] = frozenset(cls for cls in MESSAGE_DATACLASSES if stores_fields_only(cls))


class FrameDecodeError(ValueError):
    """A frame's payload names a type or an extension this codec does not build, or is malformed."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Tag:
    """A container's tag as read, until ``_build`` sees the array it leads."""

    code: int
    cls: type | None = None


# Every tag that may lead a container, by its bytes on the wire: read with one lookup (no name decoded,
# no tag made per container). Anything else takes ``_from_extension``'s checks and their errors.
_TUPLE_READ_TAG = _Tag(TUPLE)
_READ_TAGS: dict[tuple[int, bytes], _Tag] = {
    (TUPLE, _TUPLE_TAG.data): _TUPLE_READ_TAG,
    **{(ext.code, ext.data): _Tag(ext.code, cls) for cls, ext in _TAGS.items()},
}


def encode(message: object) -> bytes:
    """``message`` as msgpack; ``TypeError`` for a value of a type no frame carries."""
    return msgpack.packb(message, default=_to_packable, use_bin_type=True, strict_types=True)


def packer() -> msgpack.Packer:
    """``encode`` as a packer kept for repeated use on one thread (``CorkedFrameWriter``: its loop's).

    ``packb`` builds a packer and its buffer on every call; a writer that
    encodes each answer of the engine, the one process every request passes,
    keeps one instead (about 2 us an answer on the development machine). A
    value no frame carries still raises ``TypeError`` and leaves the packer
    empty for the next message.
    """
    return msgpack.Packer(default=_to_packable, use_bin_type=True, strict_types=True)


def decode(payload: bytes) -> Any:  # noqa: ANN401 - a message is any of the values above
    """The message ``encode`` made; ``FrameDecodeError`` for anything else."""
    tags = [0, 0]  # read, built: a tag not at the head of an array is read and never built
    read_tag = _READ_TAGS.get

    # The hooks run once per extension and once per array of the message (an outcome has a dozen), so the
    # common cases, a known tag and a tuple, are taken here before any further call.
    def from_extension(code: int, data: bytes) -> object:
        value = read_tag((code, data))
        if value is None:
            value = _from_extension(code, data)
        if type(value) is _Tag:
            tags[0] += 1
        return value

    def build(array: list) -> object:
        if array and type(head := array[0]) is _Tag:
            tags[1] += 1
            if head is _TUPLE_READ_TAG:
                return tuple(array[1:])
            return _build(head, array[1:])
        return array

    try:
        message = msgpack.unpackb(payload, ext_hook=from_extension, list_hook=build, raw=False, strict_map_key=True)
    except FrameDecodeError:
        raise
    except (ValueError, TypeError, struct.error, msgpack.UnpackException) as e:
        raise FrameDecodeError(f"malformed frame: {e}") from e
    if tags[0] != tags[1]:
        raise FrameDecodeError("a tag that does not lead an array")
    return message


def _to_packable(value: object) -> object:
    cls = type(value)
    if cls is tuple:
        return [_TUPLE_TAG, *value]  # type: ignore[misc]
    if cls is int:  # beyond 64 bits: msgpack packs the others itself
        return msgpack.ExtType(BIG_INT, value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True))  # type: ignore[attr-defined]
    if isinstance(value, np.ndarray):
        return msgpack.ExtType(NDARRAY, _array_bytes(value))
    if isinstance(value, np.generic):
        return msgpack.ExtType(NUMPY_SCALAR, _array_bytes(np.asarray(value)))
    tag = _TAGS.get(cls)
    if tag is None:
        raise TypeError(f"a control frame carries no {_name(cls)} (server.workers.frame_codec.REGISTRY)")
    if tag.code == ENUM:
        return [tag, value.value]  # type: ignore[attr-defined]
    fields = getattr(value, "__dict__", None)
    if fields is not None and len(fields) == _DICT_SIZES.get(cls, -1):
        return [tag, fields]
    return [tag, {name: getattr(value, name) for name in _INIT_FIELDS[cls]}]


def _array_bytes(array: np.ndarray) -> bytes:
    if array.dtype.kind not in NUMERIC_KINDS:
        raise TypeError(f"a control frame carries numeric arrays only, not dtype {array.dtype}")
    dtype = array.dtype.str.encode()
    header = bytes((len(dtype),)) + dtype + bytes((array.ndim,)) + b"".join(_SHAPE_DIM.pack(n) for n in array.shape)
    return header + np.ascontiguousarray(array).tobytes()


def _from_extension(code: int, data: bytes) -> object:
    tag = _READ_TAGS.get((code, data))
    if tag is not None:
        return tag
    if code == TUPLE:
        return _Tag(TUPLE)
    if code == BIG_INT:
        return int.from_bytes(data, "big", signed=True)
    if code in (NDARRAY, NUMPY_SCALAR):
        array = _array_from(data)
        return array if code == NDARRAY else array[()]
    if code not in (DATACLASS, ENUM):
        raise FrameDecodeError(f"unknown extension type {code}")
    name = data.decode("utf-8", "replace")
    cls = REGISTRY.get(name)
    if cls is None:
        raise FrameDecodeError(f"unknown type {name!r}: not in server.workers.frame_codec.REGISTRY")
    if (code == DATACLASS) != (cls in _INIT_FIELDS):
        raise FrameDecodeError(f"{name} is not {'a dataclass' if code == DATACLASS else 'an enum'}")
    return _Tag(code, cls)


def _build(tag: _Tag, rest: list) -> object:
    """The container ``tag`` names, from the rest of the array it leads."""
    if tag.code == TUPLE:
        return tuple(rest)
    if len(rest) != 1:
        raise FrameDecodeError(f"{_name(tag.cls)} with {len(rest)} parts")  # type: ignore[arg-type]
    if tag.code == ENUM:
        return tag.cls(rest[0])  # type: ignore[misc]
    fields = rest[0]
    expected = _INIT_FIELD_SETS[tag.cls]  # type: ignore[index]
    if type(fields) is not dict or fields.keys() != expected:
        got = sorted(fields) if type(fields) is dict else type(fields).__name__
        raise FrameDecodeError(f"{_name(tag.cls)} arrived with fields {got}; "  # type: ignore[arg-type]
                               f"this side has {sorted(expected)}")
    if tag.cls in _BUILT_FROM_FIELDS:
        return from_fields(tag.cls, fields)  # type: ignore[arg-type]
    return tag.cls(**fields)  # type: ignore[misc]


_NUMERIC_DTYPES: dict[bytes, np.dtype] = {}  # the dtypes read so far, by their bytes on the wire


def _array_from(data: bytes) -> np.ndarray:
    dtype_length = data[0]
    dtype_bytes = data[1:1 + dtype_length]
    dtype = _NUMERIC_DTYPES.get(dtype_bytes)
    if dtype is None:
        dtype = np.dtype(dtype_bytes.decode("ascii"))
        if dtype.kind not in NUMERIC_KINDS:
            raise FrameDecodeError(f"an array of dtype {dtype} in a frame")
        _NUMERIC_DTYPES[dtype_bytes] = dtype
    ndim = data[1 + dtype_length]
    offset = 2 + dtype_length
    shape = struct.unpack_from(f">{ndim}Q", data, offset)
    offset += 8 * ndim
    count = math.prod(shape)
    if len(data) - offset != count * dtype.itemsize:
        raise FrameDecodeError(f"an array of shape {shape} and dtype {dtype} with {len(data) - offset} bytes")
    return np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
