"""The served model as the Open Inference Protocol v2 sees it.

    inputs   text             BYTES [N] or [N, 1]    UTF-8 texts
             image            BYTES [N] or [N, K]    encoded image files (in the JSON form: base64 strings);
                                                     [N, K]: up to K images per row, a row with fewer
                                                     padded at its end with empty elements
             image_uint8      UINT8 [N, H, W, 3]     raw RGB pixels, row-major
    outputs  image_embedding  FP32  [N, E_v]         needs a one-image input ([N] or [N, 1])
             image_embeddings FP32  [N, K, E_v]      needs an [N, K] image input; zeros where a row's
                                                     image is padding
             text_embedding   FP32  [N, E_t]         needs a text input
             fused_embedding  FP32  [N, E_t]         needs both
             score            FP32  [N]              needs both; only models with a calibrated score
                                                     (SigLIP: a probability, CLIP: a logit)
             match_score      FP32  [N]              needs both; only with a trained fusion head

Row ``i`` of every input is one item: text and image rows with the same index
are fused, the text attending over all of the row's images. Without an ``outputs`` list every output the inputs allow is sent.
One version, ``"1"``: a server serves one model, and a new model is a new
fingerprint rather than a new version.

Request ``parameters`` honoured (names as tritonclient sends them):

    priority  Triton's levels, 1 = highest: 1 -> high, 2 -> normal, >= 3 -> low,
              0 (or absent) -> normal; "high" / "normal" / "low" also accepted
    timeout   microseconds (Triton's unit), the deadline of every row
    truncate  bool: cut a too-long text to the model's limit instead of refusing it
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from models.served_facts import ServedModelFacts
from router.request import InferenceResult
from router.segments import ImageContent
from server.ingest.decoding import decode_base64
from server.errors import ApiError
from server.ingest.inputs import ParsedInput, image_content, parsed_input
from server.protocols.errors import RowFailedError
from server.protocols.kserve_v2_codec import BYTES, RequestedOutput, Tensor, V2InferRequest
from server.protocols.option_names import KSERVE_V2, in_terms_of
from server.settings import Settings

MODEL_VERSION = "1"
PLATFORM = "mmserve"
TEXT, IMAGE, IMAGE_UINT8 = "text", "image", "image_uint8"
IMAGE_EMBEDDING, TEXT_EMBEDDING, FUSED_EMBEDDING, SCORE, MATCH_SCORE = (
    "image_embedding", "text_embedding", "fused_embedding", "score", "match_score")
IMAGE_EMBEDDINGS = "image_embeddings"
_PAIR_OUTPUTS = (FUSED_EMBEDDING, SCORE, MATCH_SCORE)
MAX_TIMEOUT_US = 3_600_000_000
_PRIORITY_NAMES = ("high", "normal", "low")


@dataclass(frozen=True)
class TensorSpec:
    """A tensor of the model's signature; -1 marks a dimension the client chooses."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def metadata(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


INPUT_SPECS: tuple[TensorSpec, ...] = (
    TensorSpec(TEXT, BYTES, (-1,)),
    TensorSpec(IMAGE, BYTES, (-1, -1)),
    TensorSpec(IMAGE_UINT8, "UINT8", (-1, -1, -1, 3)),
)


def output_specs(model: ServedModelFacts) -> tuple[TensorSpec, ...]:
    """The outputs this model gives: ``score`` and ``match_score`` only where they mean something."""
    image_dim = model.image_embedding_dim
    text_dim = model.text_embedding_dim
    described = model.description
    specs = [
        TensorSpec(IMAGE_EMBEDDING, "FP32", (-1, image_dim)),
        TensorSpec(IMAGE_EMBEDDINGS, "FP32", (-1, -1, image_dim)),
        TensorSpec(TEXT_EMBEDDING, "FP32", (-1, text_dim)),
        TensorSpec(FUSED_EMBEDDING, "FP32", (-1, text_dim)),
    ]
    if described.score is not None:
        specs.append(TensorSpec(SCORE, "FP32", (-1,)))
    if described.fusion_head == "trained":
        specs.append(TensorSpec(MATCH_SCORE, "FP32", (-1,)))
    return tuple(specs)


def model_metadata(model: ServedModelFacts) -> dict:
    """The body of ``GET /v2/models/{name}``."""
    return {
        "name": model.name,
        "versions": [MODEL_VERSION],
        "platform": PLATFORM,
        "inputs": [spec.metadata() for spec in INPUT_SPECS],
        "outputs": [spec.metadata() for spec in output_specs(model)],
    }


def model_config(model: ServedModelFacts, max_batch_size: int) -> dict:
    """Triton's model configuration (``model_config.proto``) in the JSON form of its HTTP ``/config`` route.

    The one description both answers come from: HTTP sends this dict, gRPC's
    ``ModelConfig`` reads it into Triton's message. Triton's conventions:
    with ``max_batch_size`` > 0 (here the most rows one request may carry,
    ``server.protocols.rows.max_rows_per_request``) the batch dimension is
    left out of ``dims``; a per-row scalar input (``text``, sent as [N] or
    [N, 1]) is ``dims: [1]`` with ``reshape: {shape: []}``; ``image`` [N, K]
    is ``dims: [-1]`` ([N] is K = 1). Every input is ``optional`` (a request
    sends text, an image input or both; ``image`` and ``image_uint8``
    exclude each other). Outputs keep their metadata shapes past the batch
    dimension (``score``: [N], so ``dims: []``).
    """
    inputs = []
    for spec in INPUT_SPECS:
        tensor: dict = {"name": spec.name, "data_type": _config_data_type(spec.datatype), "optional": True}
        if len(spec.shape) == 1:  # one value per row: [N, 1] as Triton's tools send it, [N] as the route reads it
            tensor.update(dims=[1], reshape={"shape": []})
        else:
            tensor["dims"] = list(spec.shape[1:])
        inputs.append(tensor)
    outputs = [{"name": spec.name, "data_type": _config_data_type(spec.datatype), "dims": list(spec.shape[1:])}
               for spec in output_specs(model)]
    return {"name": model.name, "platform": PLATFORM, "backend": PLATFORM, "max_batch_size": max_batch_size,
            "input": inputs, "output": outputs}


def _config_data_type(datatype: str) -> str:
    """The v2 datatype as model_config.proto's ``DataType`` name (BYTES is TYPE_STRING there)."""
    return "TYPE_STRING" if datatype == BYTES else f"TYPE_{datatype}"


def error_body(error: ApiError, row_index: int | None = None) -> dict:
    """Triton's error shape, ``{"error": "<code>: <message>"}``: tritonclient reads ``error`` as a string (an
    object there breaks its exception's text). A row's failure names its row; hints name v2's own parameters
    (``parameters.truncate``, ``parameters.timeout``: ``server.protocols.option_names``)."""
    error = in_terms_of(error, KSERVE_V2)
    where = f"row {row_index}: " if row_index is not None else ""
    return {"error": f"{error.code}: {where}{error.message}"}


def _bad(code: str, message: str, field: str) -> ApiError:
    return ApiError(400, code, message, field)


# -- request parameters --------------------------------------------------------------


@dataclass(frozen=True)
class RowOptions:
    priority: str = "normal"
    timeout_ms: int | None = None
    truncate: bool = False


def _priority(value: object) -> str:
    if isinstance(value, str) and value in _PRIORITY_NAMES:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return {0: "normal", 1: "high", 2: "normal"}.get(value, "low")
    raise _bad("invalid_parameter", f"parameters.priority must be an integer >= 0 (1 = highest) or one of "
               f"{list(_PRIORITY_NAMES)}, got {value!r}", "parameters.priority")


def is_timeout_us(value: object) -> bool:
    """Whether ``value`` is a ``timeout`` parameter the route takes: whole microseconds, 1..``MAX_TIMEOUT_US``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_TIMEOUT_US


def _timeout_ms(timeout_us: object) -> int | None:
    """Triton's ``timeout`` (µs) -> whole milliseconds, rounded up."""
    if timeout_us is None:
        return None
    if not is_timeout_us(timeout_us):
        raise _bad("invalid_parameter", f"parameters.timeout is in microseconds, 1..{MAX_TIMEOUT_US}; got "
                   f"{timeout_us!r}", KSERVE_V2.timeout_field)
    return max(1, math.ceil(timeout_us / 1000))


def row_options(parameters: Mapping[str, object]) -> RowOptions:
    """``priority``, ``timeout`` (µs) and ``truncate`` from the request's parameters; an error's field names
    the parameter as v2 spells it (``parameters.timeout``), as a 504 does."""
    truncate = parameters.get("truncate", False)
    if not isinstance(truncate, bool):
        raise _bad("invalid_parameter", f"parameters.truncate must be a boolean, got {truncate!r}",
                   "parameters.truncate")
    return RowOptions(_priority(parameters.get("priority", 0)), _timeout_ms(parameters.get("timeout")), truncate)


# -- inputs -> rows --------------------------------------------------------------------


def _check_inputs(by_name: Mapping[str, Tensor]) -> int:
    """Names, datatypes and shapes against ``INPUT_SPECS``; the number of rows."""
    specs = {spec.name: spec for spec in INPUT_SPECS}
    for name, tensor in by_name.items():
        if name not in specs:
            raise _bad("unknown_input", f"unknown input {name!r}; the model takes {list(specs)}", name)
        if tensor.datatype != specs[name].datatype:
            raise _bad("invalid_datatype", f"input {name} must be {specs[name].datatype}, got {tensor.datatype}",
                       name)
    if IMAGE in by_name and IMAGE_UINT8 in by_name:
        raise _bad("invalid_request", "send image or image_uint8, not both", IMAGE_UINT8)
    text_shape = by_name[TEXT].shape if TEXT in by_name else (0,)
    if not (len(text_shape) == 1 or (len(text_shape) == 2 and text_shape[1] == 1)):
        raise _bad("invalid_tensor_shape", f"input {TEXT} must have shape [N] or [N, 1], got {list(text_shape)}",
                   TEXT)
    image_shape = by_name[IMAGE].shape if IMAGE in by_name else (0,)
    if not (len(image_shape) == 1 or (len(image_shape) == 2 and image_shape[1] >= 1)):
        raise _bad("invalid_tensor_shape", f"input {IMAGE} must have shape [N] or [N, K], got {list(image_shape)}",
                   IMAGE)
    if IMAGE_UINT8 in by_name:
        shape = by_name[IMAGE_UINT8].shape
        if len(shape) != 4 or shape[3] != 3:
            raise _bad("invalid_tensor_shape", f"input {IMAGE_UINT8} must have shape [N, H, W, 3], got "
                       f"{list(shape)}", IMAGE_UINT8)
    num_rows = {name: tensor.shape[0] for name, tensor in by_name.items()}
    if len(set(num_rows.values())) != 1:
        raise _bad("invalid_tensor_shape", f"inputs disagree on the number of rows: {num_rows}", "inputs")
    (count,) = set(num_rows.values())
    if count == 0:
        raise _bad("empty_request", "the inputs hold zero rows", "inputs")
    return count


def _text(element: bytes, row_index: int) -> str:
    try:
        return element.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RowFailedError(row_index, _bad("invalid_text_encoding", f"text is not UTF-8: {e}", TEXT)) from e


def images_per_row(tensor: Tensor) -> int:
    """K of an [N, K] image input; 1 for [N]."""
    return tensor.shape[1] if len(tensor.shape) == 2 else 1


def _encoded_images(tensor: Tensor, row_index: int) -> list[bytes]:
    """Row ``row_index``'s images in order: its elements up to the first empty one (the padding)."""
    num_per_row = images_per_row(tensor)
    elements = tensor.data.reshape(tensor.shape[0], num_per_row)[row_index]  # (K,)
    images: list[bytes] = []
    for index, element in enumerate(elements):
        if not element and num_per_row == 1:  # [N] or [N, 1]: an empty element is a bad image, not padding
            raise RowFailedError(row_index, _bad("empty_image", f"{IMAGE} row {row_index} is empty", IMAGE))
        if not element:
            if any(elements[index:]):
                raise RowFailedError(row_index, _bad(
                    "invalid_tensor_shape", f"{IMAGE} row {row_index}: an empty element (padding) before image "
                    f"{index + 1}; pad only at the end of a row", IMAGE))
            break
        if tensor.is_binary:
            images.append(element)
            continue
        try:
            images.append(decode_base64(element.decode("latin-1"), IMAGE))
        except ApiError as e:
            raise RowFailedError(row_index, e) from e
    return images


def rows_from_request(request: V2InferRequest, settings: Settings) -> list[ParsedInput]:
    """One ``ParsedInput`` per row, checked like ``/v1/infer`` items; ``RowFailedError`` names a bad row."""
    by_name = {tensor.name: tensor for tensor in request.inputs}
    num_rows = _check_inputs(by_name)
    options = row_options(request.parameters)
    texts = by_name[TEXT].data.ravel() if TEXT in by_name else None  # (N,)
    pixels = by_name[IMAGE_UINT8].data if IMAGE_UINT8 in by_name else None  # (N, H, W, 3)
    rows = []
    for row_index in range(num_rows):
        text = _text(texts[row_index], row_index) if texts is not None else None
        raw = (list(pixels.shape[1:]), pixels[row_index].tobytes()) if pixels is not None else None
        images = image_content(None, raw)
        as_list = IMAGE in by_name and len(by_name[IMAGE].shape) == 2 and by_name[IMAGE].shape[1] > 1
        if IMAGE in by_name:
            images = tuple(ImageContent(encoded=data) for data in _encoded_images(by_name[IMAGE], row_index))
        if text is None and not images:  # an [N, K] row of padding only: named as v2 names a row, not "body"
            raise RowFailedError(row_index, ApiError(
                422, "empty_request", f"{IMAGE} row {row_index} is only padding and there is no {TEXT} input; "
                "send a text, an image or both", IMAGE))
        try:
            rows.append(parsed_input(text, images, settings, priority=options.priority,
                                     timeout_ms=options.timeout_ms, truncate=options.truncate,
                                     images_as_list=as_list))
        except ApiError as e:
            raise RowFailedError(row_index, e) from e
    return rows


# -- results -> outputs ----------------------------------------------------------------


def applicable_outputs(has_text: bool, has_image: bool, served: Sequence[str], *,
                       has_image_list: bool = False) -> tuple[str, ...]:
    """Of the ``served`` outputs (``output_specs``), those these inputs give (``image_embeddings`` for an
    [N, K] image input with K > 1, else ``image_embedding``)."""
    names = [IMAGE_EMBEDDINGS if has_image_list else IMAGE_EMBEDDING] if has_image else []
    if has_text:
        names.append(TEXT_EMBEDDING)
    if has_text and has_image:
        names += list(_PAIR_OUTPUTS)
    return tuple(name for name in names if name in served)


def choose_outputs(request: V2InferRequest, model: ServedModelFacts) -> tuple[RequestedOutput, ...]:
    """The outputs to send, checked before any compute: all applicable ones when none are named."""
    names = {tensor.name for tensor in request.inputs}
    known = tuple(spec.name for spec in output_specs(model))
    has_image_list = any(tensor.name == IMAGE and len(tensor.shape) == 2 and tensor.shape[1] > 1
                         for tensor in request.inputs)
    available = applicable_outputs(TEXT in names, IMAGE in names or IMAGE_UINT8 in names, known,
                                   has_image_list=has_image_list)
    if request.outputs is None:
        return tuple(RequestedOutput(name, request.is_binary_output_default) for name in available)
    for output in request.outputs:
        if output.name not in known:
            raise _bad("unknown_output", f"unknown output {output.name!r}; the model gives {list(known)}",
                       output.name)
        if output.name not in available:
            raise _bad("output_not_available", f"output {output.name} needs "
                       f"{'a text and an image' if output.name in _PAIR_OUTPUTS else 'its modality'}"
                       f" input; these inputs give {list(available)}", output.name)
    return request.outputs


def _padded_image_embeddings(results: Sequence[InferenceResult], num_images: int) -> np.ndarray:
    """(N, K, E_v): each row's image embeddings, zeros after its last image; K is the input's, even when
    every row is padded (a client reshapes by the K it sent)."""
    num_images = max(num_images, *(len(result.image_embeddings) for result in results))
    width = next(result.image_embeddings[0].shape[-1] for result in results if result.image_embeddings)
    data = np.zeros((len(results), num_images, width), dtype=np.float32)  # (N, K, E_v)
    for row, result in enumerate(results):
        if result.image_embeddings:
            data[row, : len(result.image_embeddings)] = np.stack(result.image_embeddings)  # (K_row, E_v)
    return data


def output_tensors(chosen: Sequence[RequestedOutput], results: Sequence[InferenceResult],
                   request: V2InferRequest) -> tuple[Tensor, ...]:
    """Stack the rows' results into one FP32 tensor per chosen output."""
    tensors = []
    for output in chosen:
        if output.name in (SCORE, MATCH_SCORE):
            data = np.array([getattr(result, output.name) for result in results], dtype=np.float32)  # (N,)
        elif output.name == IMAGE_EMBEDDINGS:
            image = next(tensor for tensor in request.inputs if tensor.name == IMAGE)
            data = _padded_image_embeddings(results, images_per_row(image))  # (N, K, E_v)
        else:
            # The embedding outputs are named after ``InferenceResult``'s fields.
            data = np.stack([getattr(result, output.name) for result in results]).astype(np.float32)  # (N, D)
        tensors.append(Tensor(output.name, "FP32", data.shape, data, is_binary=output.is_binary))
    return tuple(tensors)
