"""``ModelInfer`` as an endpoint of the one request layer (``server.request_layer.serve_call``).

The call's rows, outputs, checks and answer are the HTTP v2 route's
(``server.protocols.kserve_v2_model``); only the message form differs
(``server.protocols.kserve_v2_grpc``). It counts as ``route="v2_grpc"`` in
``mmserve_requests_total`` and the duration histogram, and its items as
protocol ``kserve_v2_grpc`` in drift attribution.

The call's deadline is the request's deadline (``timeout``), and a call that
ends before its answer (the client cancelled, or its deadline passed and
gRPC cancelled it) cancels its intake, which frees its queue slot as a
dropped HTTP connection does: counted 499, or 504 when the deadline passed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from server.errors import ApiError
from server.protocols.kserve_v2_codec import RequestedOutput, V2InferRequest, V2InferResponse
from server.protocols.kserve_v2_grpc import infer_request, infer_response
from server.protocols.kserve_v2_model import MODEL_VERSION, choose_outputs, output_tensors, rows_from_request
from server.protocols.option_names import KSERVE_V2_GRPC
from server.protocols.rows import Failure
from server.http.client_disconnect import ClientDisconnectedError
from server.request_layer import Answered, Endpoint, Parsed
from server.routes.v2 import check_model
from server.state import ServerState

METRICS_ROUTE = "v2_grpc"
# A call cancelled this close to its deadline was cancelled by it: the client's timer fires a moment before
# the server's (the server's deadline is the client's minus the time the call took to arrive), and its
# RST_STREAM reaches the server while a few milliseconds remain there.
DEADLINE_SLACK_S = 0.1
T = TypeVar("T")


@dataclass
class GrpcCall:
    """One request as it came: the undecoded message and the time left of the call's deadline.

    ``request_id``: the message's ``id``, once decoded (a stream's answer carries it, errors too).
    """

    message: bytes
    deadline_us: int | None
    request_id: str = ""
    _decoded: service_pb2.ModelInferRequest | None = None

    def decoded(self) -> service_pb2.ModelInferRequest:
        """The message, decoded once (a stream request's id is read before its rate-limit token is taken;
        ``parse`` reuses it); 400 ``invalid_message`` for bytes that are no ``ModelInferRequest``."""
        if self._decoded is None:
            try:
                self._decoded = service_pb2.ModelInferRequest.FromString(self.message)
            except DecodeError as e:
                raise ApiError(400, "invalid_message", f"not a ModelInferRequest: {e}", "message") from e
            self.request_id = self._decoded.id
        return self._decoded


@dataclass
class GrpcReply:
    """The answer ``serve_call`` closes: the message, or the failure to send as a status (``status_code``: HTTP)."""

    status_code: int
    message: service_pb2.ModelInferResponse | None = None
    failure: Failure | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Call:
    request: V2InferRequest
    chosen: tuple[RequestedOutput, ...] = ()


def deadline_us(context: grpc.aio.ServicerContext) -> int | None:
    remaining_s = context.time_remaining()
    return None if remaining_s is None else max(1, int(remaining_s * 1e6))


async def until_call_ends(context: grpc.aio.ServicerContext, work: Awaitable[T]) -> T:
    """``work``, unless gRPC cancels the call first (the client cancelled, or the deadline passed).

    gRPC cancels the handler's task; the task goes on to count the call (504
    when its deadline had come, within ``DEADLINE_SLACK_S``; else 499), which nobody reads any more.
    """
    try:
        return await work
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        remaining_s = context.time_remaining()
        if remaining_s is not None and remaining_s <= DEADLINE_SLACK_S:
            raise ApiError(504, "deadline_exceeded", "the call's gRPC deadline passed before its answer",
                           KSERVE_V2_GRPC.timeout_field) from None
        raise ClientDisconnectedError() from None


@dataclass(frozen=True)
class V2GrpcInfer(Endpoint[_Call]):
    """``inference.GRPCInferenceService/ModelInfer``: each row is an item; errors name ``row i``."""

    http_route = "/inference.GRPCInferenceService/ModelInfer"
    metrics_label = METRICS_ROUTE
    protocol = "kserve_v2_grpc"

    async def parse(self, request: GrpcCall, state: ServerState) -> Parsed[_Call]:
        message = request.decoded()
        check_model(state, message.model_name, message.model_version or None)
        v2_request = infer_request(message, deadline_us=request.deadline_us)
        return Parsed(rows_from_request(v2_request, state.settings), _Call(v2_request))

    def check(self, parsed: Parsed[_Call], state: ServerState) -> None:
        parsed.context.chosen = choose_outputs(parsed.context.request, state.served_model)

    def render(self, parsed: Parsed[_Call], answered: Answered, state: ServerState) -> GrpcReply:  # type: ignore[override]
        call = parsed.context
        return GrpcReply(200, infer_response(V2InferResponse(
            model_name=state.served_model.name, model_version=MODEL_VERSION,
            outputs=output_tensors(call.chosen, [outcome.result for outcome in answered.outcomes],
                                   call.request),
            request_id=call.request.request_id)))

    def render_error(self, failure: Failure, parsed: Parsed[_Call] | None) -> GrpcReply:  # type: ignore[override]
        return GrpcReply(failure.error.status, failure=failure)
