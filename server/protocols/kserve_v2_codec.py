"""Open Inference Protocol v2 (KServe, Triton) REST bodies <-> typed tensors.

A body is a JSON header, optionally followed by raw tensor bytes (the binary
tensor data extension). ``Inference-Header-Content-Length`` gives the header's
size; binary tensors follow in the header's order, each sized by its
``parameters.binary_data_size``:

    | JSON header (Inference-Header-Content-Length bytes) | tensor a bytes | tensor c bytes | ...
                 a: {"parameters": {"binary_data_size": 12}}  b: {"data": [...]}  c: {...}

Numbers travel little-endian, row-major. A BYTES tensor's binary form is each
element as a 4-byte little-endian length followed by that many bytes:

    | len0 (u32 LE) | element 0 | len1 (u32 LE) | element 1 | ...

In the JSON form BYTES elements are strings (UTF-8). Every malformation is a
400 that names the tensor: nothing is allocated from a size the body has not
proved (element counts and byte sizes are checked before any array is built).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from server.errors import ApiError
from server.ingest import json_body

HEADER_LENGTH = "Inference-Header-Content-Length"
BYTES = "BYTES"
NUMERIC_DTYPES: Mapping[str, np.dtype] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
}
_LENGTH_PREFIX = struct.Struct("<I")
_SHARED_MEMORY_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


@dataclass(frozen=True, eq=False)
class Tensor:
    """One named tensor; ``data`` has shape ``shape``.

    Numbers are in the datatype's numpy dtype; BYTES is an object array of
    ``bytes``. ``is_binary``: travels as binary data after the JSON header.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    is_binary: bool = False


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    is_binary: bool


@dataclass(frozen=True, eq=False)
class V2InferRequest:
    """A decoded inference request; ``outputs`` is ``None`` when the client named none (= all)."""

    inputs: tuple[Tensor, ...]
    outputs: tuple[RequestedOutput, ...] | None = None
    request_id: str | None = None
    parameters: Mapping[str, object] = field(default_factory=dict)
    is_binary_output_default: bool = False


@dataclass(frozen=True, eq=False)
class V2InferResponse:
    model_name: str
    model_version: str
    outputs: tuple[Tensor, ...]
    request_id: str | None = None


@dataclass(frozen=True)
class EncodedBody:
    """A body to send; ``header_length`` goes in ``Inference-Header-Content-Length`` (``None``: all JSON)."""

    body: bytes
    header_length: int | None


def _bad(code: str, message: str, field_name: str = "body") -> ApiError:
    return ApiError(400, code, message, field_name)


# -- BYTES elements ----------------------------------------------------------------


def serialize_bytes_elements(elements: Sequence[bytes]) -> bytes:
    """Elements -> ``| len (u32 LE) | bytes |`` repeated."""
    return b"".join(_LENGTH_PREFIX.pack(len(element)) + element for element in elements)


def deserialize_bytes_elements(data: bytes, num_elements: int, tensor_name: str) -> list[bytes]:
    """The inverse of ``serialize_bytes_elements``; exactly ``num_elements`` that fill ``data``."""
    if num_elements * _LENGTH_PREFIX.size > len(data):
        raise _bad("invalid_tensor_data", f"input {tensor_name}: {len(data)} bytes cannot hold {num_elements} "
                   "length-prefixed BYTES elements", tensor_name)
    elements: list[bytes] = []
    offset = 0
    view = memoryview(data)
    while offset < len(data):
        if len(elements) == num_elements:
            raise _bad("invalid_tensor_data", f"input {tensor_name}: {len(data) - offset} bytes follow its "
                       f"{num_elements} BYTES elements", tensor_name)
        if offset + _LENGTH_PREFIX.size > len(data):
            raise _bad("invalid_tensor_data", f"input {tensor_name}: the length prefix of element "
                       f"{len(elements)} is cut off at byte {offset}", tensor_name)
        (length,) = _LENGTH_PREFIX.unpack_from(data, offset)
        offset += _LENGTH_PREFIX.size
        if offset + length > len(data):
            raise _bad("invalid_tensor_data", f"input {tensor_name}: element {len(elements)} claims {length} "
                       f"bytes but only {len(data) - offset} remain", tensor_name)
        elements.append(bytes(view[offset:offset + length]))
        offset += length
    if len(elements) != num_elements:
        raise _bad("invalid_tensor_data", f"input {tensor_name}: shape needs {num_elements} BYTES elements, "
                   f"the data holds {len(elements)}", tensor_name)
    return elements


def _object_array(elements: Sequence[bytes], shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(elements), dtype=object)
    array[:] = list(elements)
    return array.reshape(shape)


# -- request decoding --------------------------------------------------------------


def _shape(value: object, tensor_name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise _bad("invalid_tensor_shape", f"input {tensor_name}: shape must be a list of integers, got "
                   f"{value!r}", tensor_name)
    if any(d < 0 for d in value):
        raise _bad("invalid_tensor_shape", f"input {tensor_name}: shape {value} has a negative dimension",
                   tensor_name)
    return tuple(value)


def tensor_data_from_bytes(chunk: bytes, datatype: str, shape: tuple[int, ...], tensor_name: str, *,
                           carried_in: str = "parameters.binary_data_size") -> np.ndarray:
    """A tensor's binary form (this body's, or gRPC's ``raw_input_contents``) -> its array; 400 if it does not fit.

    ``carried_in``: where the client's message sent the chunk, as the error names it
    (``raw_input_contents[1]`` over gRPC, which has no ``binary_data_size``).
    """
    num_elements = math.prod(shape)
    if datatype == BYTES:
        return _object_array(deserialize_bytes_elements(chunk, num_elements, tensor_name), shape)
    dtype = NUMERIC_DTYPES[datatype]
    if len(chunk) != num_elements * dtype.itemsize:
        raise _bad("invalid_tensor_data", f"input {tensor_name}: {datatype} shape {list(shape)} needs "
                   f"{num_elements * dtype.itemsize} bytes; {carried_in} holds {len(chunk)} bytes", tensor_name)
    return np.frombuffer(chunk, dtype=dtype).reshape(shape)  # shape


def _from_json(data: object, datatype: str, shape: tuple[int, ...], tensor_name: str) -> np.ndarray:
    """JSON ``data`` (flat or nested, row-major) -> an array, checking every element's type."""
    flat = np.array(data, dtype=object).ravel()  # (num_elements,)
    num_elements = math.prod(shape)
    if flat.size != num_elements:
        raise _bad("invalid_tensor_data", f"input {tensor_name}: shape {list(shape)} needs {num_elements} "
                   f"elements, data holds {flat.size}", tensor_name)
    kinds = {type(value) for value in flat}
    if datatype == BYTES:
        if not kinds <= {str}:
            raise _bad("invalid_tensor_data", f"input {tensor_name}: BYTES elements in JSON must be strings",
                       tensor_name)
        try:
            return _object_array([value.encode() for value in flat], shape)
        except UnicodeEncodeError as e:  # a lone surrogate escaped in the JSON ("\ud800")
            raise _bad("invalid_text_encoding", f"input {tensor_name}: an element holds a lone surrogate; "
                       "send valid Unicode", tensor_name) from e
    dtype = NUMERIC_DTYPES[datatype]
    allowed = {"b": {bool}, "u": {int}, "i": {int}, "f": {int, float}}[dtype.kind]
    if not kinds <= allowed:
        names = sorted(kind.__name__ for kind in kinds - allowed)
        raise _bad("invalid_tensor_data", f"input {tensor_name}: {datatype} data holds {', '.join(names)} "
                   "values", tensor_name)
    if dtype.kind in "iu" and flat.size:
        limits = np.iinfo(dtype)
        low, high = min(flat), max(flat)
        if low < limits.min or high > limits.max:
            raise _bad("invalid_tensor_data", f"input {tensor_name}: values {low}..{high} do not fit "
                       f"{datatype}", tensor_name)
    return np.array(flat.tolist(), dtype=dtype).reshape(shape)  # shape


def _parameters(value: object, where: str) -> dict[str, object]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad("invalid_request", f"{where}: parameters must be an object")
    return value


def _decode_input(item: object, binary: memoryview, offset: int) -> tuple[Tensor, int]:
    """One entry of ``inputs`` -> (tensor, binary bytes it used)."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        raise _bad("invalid_request", f"each input needs a non-empty string name, got {item!r:.80}", "inputs")
    name: str = item["name"]
    datatype = item.get("datatype")
    if datatype != BYTES and datatype not in NUMERIC_DTYPES:
        raise _bad("unsupported_datatype", f"input {name}: datatype {datatype!r} is not one of "
                   f"{[BYTES, *NUMERIC_DTYPES]}", name)
    shape = _shape(item.get("shape"), name)
    parameters = _parameters(item.get("parameters"), f"input {name}")
    if any(key in parameters for key in _SHARED_MEMORY_KEYS):
        raise _bad("unsupported_parameter", f"input {name}: shared memory is not supported; send the data "
                   "in the body", name)
    if "binary_data_size" not in parameters:
        if "data" not in item:
            raise _bad("invalid_request", f"input {name} has neither data nor parameters.binary_data_size", name)
        return Tensor(name, datatype, shape, _from_json(item["data"], datatype, shape, name)), 0
    size = parameters["binary_data_size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise _bad("invalid_request", f"input {name}: binary_data_size must be a non-negative integer", name)
    if "data" in item:
        raise _bad("invalid_request", f"input {name} has both data and binary_data_size", name)
    if offset + size > len(binary):
        raise _bad("invalid_tensor_data", f"input {name}: binary_data_size {size} runs past the end of the "
                   f"body ({len(binary) - offset} bytes left)", name)
    chunk = bytes(binary[offset:offset + size])
    return Tensor(name, datatype, shape, tensor_data_from_bytes(chunk, datatype, shape, name), is_binary=True), size


def _split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    if header_length is None:
        return body, memoryview(b"")
    text = header_length.strip()
    if not text.isdigit() or not text.isascii():
        raise _bad("invalid_header_length", f"{HEADER_LENGTH} must be a non-negative integer, got "
                   f"{header_length!r:.40}", HEADER_LENGTH)
    length = int(text)
    if length > len(body):
        raise _bad("invalid_header_length", f"{HEADER_LENGTH} is {length} but the body has {len(body)} bytes",
                   HEADER_LENGTH)
    return body[:length], memoryview(body)[length:]


def requested_output(name: str, parameters: Mapping[str, object], is_binary_default: bool) -> RequestedOutput:
    """One requested output and its parameters, by the rule both the REST and the gRPC form follow: only
    ``binary_data`` is honoured; ``classification`` (tritonclient's ``class_count``) and shared memory are
    refused rather than silently dropped (the answer would not be what the client asked for)."""
    if "classification" in parameters or any(key in parameters for key in _SHARED_MEMORY_KEYS):
        raise _bad("unsupported_parameter", f"output {name}: only binary_data is supported among output parameters",
                   name)
    is_binary = parameters.get("binary_data", is_binary_default)
    if not isinstance(is_binary, bool):
        raise _bad("invalid_request", f"output {name}: binary_data must be a boolean", name)
    return RequestedOutput(name, is_binary)


def _requested_outputs(value: object, is_binary_default: bool) -> tuple[RequestedOutput, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _bad("invalid_request", "outputs must be a list", "outputs")
    requested = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise _bad("invalid_request", f"each output needs a string name, got {item!r:.80}", "outputs")
        parameters = _parameters(item.get("parameters"), f"output {item['name']}")
        requested.append(requested_output(item["name"], parameters, is_binary_default))
    names = [output.name for output in requested]
    if len(set(names)) != len(names):
        raise _bad("invalid_request", f"outputs name a tensor twice: {names}", "outputs")
    return tuple(requested)


def decode_infer_request(body: bytes, header_length: str | None) -> V2InferRequest:
    """A request body (JSON, or JSON + binary tensors) -> a ``V2InferRequest``; 400 ``ApiError`` if malformed."""
    header, binary = _split_body(body, header_length)
    try:
        document = json_body.loads(header)  # a header nested too deep is refused here too, not a RecursionError
    except (json_body.JSONDecodeError, UnicodeDecodeError) as e:
        raise _bad("invalid_json", f"the JSON header is not valid JSON: {e}") from e
    if not isinstance(document, dict):
        raise _bad("invalid_request", "the JSON header must be an object")
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise _bad("invalid_request", "id must be a string", "id")
    parameters = _parameters(document.get("parameters"), "request")
    is_binary_default = parameters.get("binary_data_output", False)
    if not isinstance(is_binary_default, bool):
        raise _bad("invalid_request", "parameters.binary_data_output must be a boolean", "binary_data_output")
    entries = document.get("inputs")
    if not isinstance(entries, list) or not entries:
        raise _bad("invalid_request", "inputs must be a non-empty list", "inputs")
    inputs: list[Tensor] = []
    offset = 0
    for entry in entries:
        tensor, used_bytes = _decode_input(entry, binary, offset)
        inputs.append(tensor)
        offset += used_bytes
    if offset != len(binary):
        raise _bad("invalid_tensor_data", f"{len(binary) - offset} bytes after the JSON header belong to no "
                   "input")
    names = [tensor.name for tensor in inputs]
    if len(set(names)) != len(names):
        raise _bad("invalid_request", f"inputs name a tensor twice: {names}", "inputs")
    return V2InferRequest(tuple(inputs), _requested_outputs(document.get("outputs"), is_binary_default),
                          request_id, parameters, is_binary_default)


# -- encoding ----------------------------------------------------------------------


def _tensor_bytes(tensor: Tensor) -> bytes:
    if tensor.datatype == BYTES:
        return serialize_bytes_elements(list(tensor.data.ravel()))
    return np.ascontiguousarray(tensor.data, dtype=NUMERIC_DTYPES[tensor.datatype]).tobytes()


def _tensor_json(tensor: Tensor) -> list:
    if tensor.datatype == BYTES:
        return [element.decode() for element in tensor.data.ravel()]
    return tensor.data.ravel().tolist()


def _encode_tensors(tensors: Sequence[Tensor]) -> tuple[list[dict], list[bytes]]:
    """Header entries and, for binary tensors, their bytes in header order."""
    entries, chunks = [], []
    for tensor in tensors:
        entry: dict = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        if tensor.is_binary:
            chunk = _tensor_bytes(tensor)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        else:
            entry["data"] = _tensor_json(tensor)
        entries.append(entry)
    return entries, chunks


def _finish(header: dict, chunks: list[bytes]) -> EncodedBody:
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    if not chunks:
        return EncodedBody(header_bytes, None)
    return EncodedBody(header_bytes + b"".join(chunks), len(header_bytes))


def encode_infer_response(response: V2InferResponse) -> EncodedBody:
    """Outputs with ``is_binary`` go after the JSON header; the rest go in it."""
    header: dict = {"model_name": response.model_name, "model_version": response.model_version}
    if response.request_id is not None:
        header["id"] = response.request_id
    header["outputs"], chunks = _encode_tensors(response.outputs)
    return _finish(header, chunks)


def encode_infer_request(request: V2InferRequest) -> EncodedBody:
    """The client side of ``decode_infer_request`` (load generators, tests)."""
    header: dict = {}
    if request.request_id is not None:
        header["id"] = request.request_id
    parameters = dict(request.parameters)
    if request.is_binary_output_default:
        parameters["binary_data_output"] = True
    if parameters:
        header["parameters"] = parameters
    if request.outputs is not None:
        header["outputs"] = [{"name": output.name, "parameters": {"binary_data": output.is_binary}}
                             for output in request.outputs]
    header["inputs"], chunks = _encode_tensors(request.inputs)
    return _finish(header, chunks)
