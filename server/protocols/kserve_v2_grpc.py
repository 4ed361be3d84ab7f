"""Open Inference Protocol v2 over gRPC: protobuf messages <-> the typed tensors of the HTTP v2 route.

The messages are the ones ``tritonclient[grpc]`` ships, generated from
Triton's ``grpc_service.proto`` and ``model_config.proto``
(``tritonclient.grpc.service_pb2``, ``model_config_pb2``): the same bytes the
clients Triton's users run build, and no generated code of our own to keep in
step with theirs. Importing them loads ``tritonclient.grpc`` (grpcio, numpy,
rapidjson, ml_dtypes: about 0.5 s of CPU, no model library), which is why only
the gRPC server (``server.grpc``) imports this module, when ``grpc_port`` is set.
``tritonclient[grpc]`` pins protobuf below 7, and the generated code wants the
runtime it was built against, so the project resolves protobuf 6.x (pyproject's
``grpc`` extra says so); nothing else of ours needs 7.

What a request means is the HTTP route's, described once in
``server.protocols.kserve_v2_model`` (inputs, outputs, shapes, datatypes,
``parameters``): this module only moves tensors between the messages and
``V2InferRequest`` / ``V2InferResponse``.

    request   inputs[i] with raw_input_contents[i]   (tritonclient's form: every input raw, or none)
              inputs[i].contents.<typed>_contents    (bytes_contents, uint_contents, ...)
              parameters: priority, timeout (µs), truncate, as InferParameter
              outputs[i].parameters: the REST form's rule (``requested_output``): classification and
              shared memory refused, 400 unsupported_parameter
    response  outputs[i] with raw_output_contents[i] (the only place tritonclient.grpc reads numbers from)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2

from models.served_facts import ServedModelFacts
from server.errors import ApiError
from server.protocols.kserve_v2_codec import (
    BYTES,
    NUMERIC_DTYPES,
    RequestedOutput,
    Tensor,
    V2InferRequest,
    V2InferResponse,
    requested_output,
    serialize_bytes_elements,
    tensor_data_from_bytes,
)
from server.protocols.kserve_v2_model import (
    INPUT_SPECS,
    MAX_TIMEOUT_US,
    MODEL_VERSION,
    PLATFORM,
    TensorSpec,
    is_timeout_us,
    output_specs,
)
from server.protocols.kserve_v2_model import model_config as config_description

# The typed field of InferTensorContents that holds each datatype (grpc_service.proto).
_CONTENTS_FIELD: Mapping[str, str] = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", BYTES: "bytes_contents",
}
_PARAMETER_CHOICE = "parameter_choice"


def _bad(code: str, message: str, field_name: str) -> ApiError:
    return ApiError(400, code, message, field_name)


def _parameters(parameters: Mapping[str, service_pb2.InferParameter], where: str) -> dict[str, object]:
    """InferParameter values as the JSON form's (bool, int, str, float)."""
    values: dict[str, object] = {}
    for name, parameter in parameters.items():
        choice = parameter.WhichOneof(_PARAMETER_CHOICE)
        if choice is None:
            raise _bad("invalid_parameter", f"{where} parameter {name!r} holds no value", name)
        values[name] = getattr(parameter, choice)
    return values


def _typed_contents(tensor: service_pb2.ModelInferRequest.InferInputTensor, shape: tuple[int, ...]) -> np.ndarray:
    """An input sent in ``contents``: its datatype's field, checked against the shape before any array."""
    name, datatype = tensor.name, tensor.datatype
    field_name = _CONTENTS_FIELD.get(datatype)
    if field_name is None:  # FP16 and BF16 have no typed field: raw only
        raise _bad("unsupported_datatype", f"input {name}: {datatype} travels in raw_input_contents only", name)
    for other in _CONTENTS_FIELD.values():
        if other != field_name and len(getattr(tensor.contents, other)):
            raise _bad("invalid_tensor_data", f"input {name}: a {datatype} tensor holds contents.{other}", name)
    values = getattr(tensor.contents, field_name)
    num_elements = math.prod(shape)
    if len(values) != num_elements:
        raise _bad("invalid_tensor_data", f"input {name}: shape {list(shape)} needs {num_elements} elements, "
                   f"contents.{field_name} holds {len(values)}", name)
    if datatype == BYTES:
        array = np.empty(num_elements, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    dtype = NUMERIC_DTYPES[datatype]
    wide = np.array(values, dtype=np.float64 if dtype.kind == "f" else np.int64 if dtype.kind == "i" else
                    np.uint64 if dtype.kind == "u" else bool)  # (num_elements,)
    if dtype.kind in "iu" and wide.size and (wide.min() < np.iinfo(dtype).min or wide.max() > np.iinfo(dtype).max):
        raise _bad("invalid_tensor_data", f"input {name}: values {wide.min()}..{wide.max()} do not fit {datatype}",
                   name)
    return wide.astype(dtype).reshape(shape)  # shape


def _requested_output(output: service_pb2.ModelInferRequest.InferRequestedOutputTensor) -> RequestedOutput:
    """The REST form's rule for output parameters (``requested_output``); every output travels raw here."""
    checked = requested_output(output.name, _parameters(output.parameters, f"output {output.name}"), True)
    return RequestedOutput(checked.name, True)


def infer_request(message: service_pb2.ModelInferRequest, *, deadline_us: int | None = None) -> V2InferRequest:
    """A ``ModelInferRequest`` as the HTTP route's ``V2InferRequest``; 400 ``ApiError`` naming what is wrong.

    ``deadline_us``: what is left of the call's gRPC deadline; it becomes the
    ``timeout`` parameter, or shortens one the client sent.
    """
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise _bad("invalid_tensor_data", f"raw_input_contents holds {len(raw)} tensors for {len(message.inputs)} "
                   "inputs: send every input raw, or none", "raw_input_contents")
    if not message.inputs:
        raise _bad("invalid_request", "inputs must be a non-empty list", "inputs")
    inputs = []
    for index, tensor in enumerate(message.inputs):
        if not tensor.name:
            raise _bad("invalid_request", f"input {index} has no name", "inputs")
        if tensor.datatype != BYTES and tensor.datatype not in NUMERIC_DTYPES:
            raise _bad("unsupported_datatype", f"input {tensor.name}: datatype {tensor.datatype!r} is not one of "
                       f"{[BYTES, *NUMERIC_DTYPES]}", tensor.name)
        shape = tuple(tensor.shape)
        if any(d < 0 for d in shape):
            raise _bad("invalid_tensor_shape", f"input {tensor.name}: shape {list(shape)} has a negative dimension",
                       tensor.name)
        if any(key.startswith("shared_memory") for key in tensor.parameters):
            raise _bad("unsupported_parameter", f"input {tensor.name}: shared memory is not supported; send the "
                       "data in the message", tensor.name)
        data = (tensor_data_from_bytes(raw[index], tensor.datatype, shape, tensor.name,
                                       carried_in=f"raw_input_contents[{index}]") if raw
                else _typed_contents(tensor, shape))
        inputs.append(Tensor(tensor.name, tensor.datatype, shape, data, is_binary=True))
    names = [tensor.name for tensor in inputs]
    if len(set(names)) != len(names):
        raise _bad("invalid_request", f"inputs name a tensor twice: {names}", "inputs")
    outputs = tuple(_requested_output(output) for output in message.outputs) or None
    if outputs is not None and len({output.name for output in outputs}) != len(outputs):
        raise _bad("invalid_request", f"outputs name a tensor twice: {[o.name for o in outputs]}", "outputs")
    parameters = _parameters(message.parameters, "request")
    if deadline_us is not None:
        parameters["timeout"] = _timeout_within_deadline(parameters.get("timeout"), deadline_us)
    return V2InferRequest(tuple(inputs), outputs, message.id or None, parameters, is_binary_output_default=True)


def _timeout_within_deadline(sent: object, deadline_us: int) -> object:
    """The request's ``timeout``: the sooner of the one sent and the call's deadline.

    A sent value the HTTP route refuses (0, a string, over an hour) stays, so the
    route's check refuses it by name whether or not the call has a deadline; a
    deadline over an hour counts as the longest timeout, since the client sent no
    parameter to be told about (Triton takes any deadline).
    """
    left_us = max(1, min(deadline_us, MAX_TIMEOUT_US))
    if sent is None:
        return left_us
    return min(sent, left_us) if is_timeout_us(sent) else sent  # type: ignore[type-var]


def infer_response(response: V2InferResponse) -> service_pb2.ModelInferResponse:
    """Every output's bytes in ``raw_output_contents``, in the order of ``outputs``."""
    message = service_pb2.ModelInferResponse(model_name=response.model_name, model_version=response.model_version,
                                             id=response.request_id or "")
    for tensor in response.outputs:
        message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        if tensor.datatype == BYTES:
            message.raw_output_contents.append(serialize_bytes_elements(list(tensor.data.ravel())))
        else:
            data = np.ascontiguousarray(tensor.data, dtype=NUMERIC_DTYPES[tensor.datatype])
            message.raw_output_contents.append(data.tobytes())
    return message


def _tensor_metadata(spec: TensorSpec) -> service_pb2.ModelMetadataResponse.TensorMetadata:
    return service_pb2.ModelMetadataResponse.TensorMetadata(name=spec.name, datatype=spec.datatype,
                                                            shape=list(spec.shape))


def model_metadata(model: ServedModelFacts) -> service_pb2.ModelMetadataResponse:
    """``GET /v2/models/{name}``'s answer as a message: the same specs."""
    return service_pb2.ModelMetadataResponse(
        name=model.name, versions=[MODEL_VERSION], platform=PLATFORM,
        inputs=[_tensor_metadata(spec) for spec in INPUT_SPECS],
        outputs=[_tensor_metadata(spec) for spec in output_specs(model)])


def model_config(model: ServedModelFacts, max_batch_size: int) -> service_pb2.ModelConfigResponse:
    """The HTTP ``/config`` route's description (``kserve_v2_model.model_config``) as Triton's message."""
    config = json_format.ParseDict(config_description(model, max_batch_size), model_config_pb2.ModelConfig())
    return service_pb2.ModelConfigResponse(config=config)
