"""``inference.GRPCInferenceService`` (KServe v2 / Triton) and ``grpc.health.v1.Health`` on ``grpc.aio``.

Every RPC is registered with no request deserializer: the handler gets the
message's bytes, applies the guards (``server.grpc_api.guards``: key, role,
rate limit) and only then decodes it, so a refused caller costs no parsing.
A stream's key is checked as it opens; each of its requests is decoded and
then takes its rate-limit token, so a refused one is answered with its id.

    ServerLive / ServerReady   the router's liveness and readiness (no key)
    Health.Check / Watch       for ``""`` and ``inference.GRPCInferenceService``: readiness (NOT_SERVING
                               while draining, like /health/ready); any other service: Check NOT_FOUND,
                               Watch SERVICE_UNKNOWN and the call left open, as the health-checking spec says
    ServerMetadata, ModelMetadata, ModelConfig   the HTTP v2 route's facts
    ModelReady        ready=false (status OK) for an unknown model or version, as Triton answers
    ModelInfer        one call through the request layer (``server.grpc_api.infer_endpoint``)
    ModelStreamInfer  the key checked when the stream opens; each request of the stream is its own call
                      (decoded, then its rate-limit token taken), answered in order of completion with its
                      id; an error (a 429 too) is that answer's ``error_message`` and the stream goes on
    every other RPC   UNIMPLEMENTED, naming what mmserve serves instead; an admin one (RepositoryModelLoad,
                      ...) writes its audit line (``server.http.audit``) as an HTTP admin route does
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health_pb2
from tritonclient.grpc import service_pb2

from server.errors import ApiError
from server.grpc_api.guards import ADMIN_METHODS, Admission, CallGuards, client_address
from server.grpc_api.infer_endpoint import GrpcCall, GrpcReply, V2GrpcInfer, deadline_us, until_call_ends
from server.grpc_api.status_table import error_text, grpc_status, trailing_metadata
from server.http.audit import log_admin_call
from server.protocols.kserve_v2_grpc import model_config, model_metadata
from server.protocols.kserve_v2_model import MODEL_VERSION
from server.protocols.rows import max_rows_per_request
from server.request_layer import serve_call
from server.routes.v2 import EXTENSIONS, SERVER_NAME, check_model
from server.state import ServerState

SERVICE = "inference.GRPCInferenceService"
HEALTH_SERVICE = "grpc.health.v1.Health"
HEALTH_SERVICES = ("", SERVICE)  # "": the server as a whole
_WATCH_POLL_S = 0.25
_UNIMPLEMENTED = ("ModelStatistics", "RepositoryIndex", "SystemSharedMemoryStatus", "CudaSharedMemoryStatus",
                  *sorted(ADMIN_METHODS))
_ENDPOINT = V2GrpcInfer()


class InferenceService:
    """The handlers, over one app's state (read at each call: the lifespan builds it) and its guards."""

    def __init__(self, state_of: Callable[[], ServerState], guards: CallGuards, version: str) -> None:
        self._state_of = state_of
        self._guards = guards
        self._version = version

    # -- plumbing ----------------------------------------------------------------------

    async def _admit(self, method: str, context: grpc.aio.ServicerContext, *, takes_token: bool = True) -> Admission:
        admission = self._guards.admit(method, context.invocation_metadata(), context.peer(), takes_token=takes_token)
        if admission.error is not None:
            await _abort(context, admission.error)
        return admission

    def _unary(self, method: str, request_type: type[Message], answer: Callable[..., Any]) -> grpc.RpcMethodHandler:
        async def handle(raw: bytes, context: grpc.aio.ServicerContext) -> Message:
            await self._admit(method, context)
            try:
                request = request_type.FromString(raw)
            except DecodeError as e:
                await _abort(context, ApiError(400, "invalid_message", f"not a {request_type.__name__}: {e}",
                                               "message"))
            try:
                return await answer(request, context)
            except ApiError as e:
                await _abort(context, e)
        return grpc.unary_unary_rpc_method_handler(handle, response_serializer=_serialize)

    def _unimplemented(self, method: str) -> grpc.RpcMethodHandler:
        async def handle(raw: bytes, context: grpc.aio.ServicerContext) -> None:
            admission = self._guards.admit(method, context.invocation_metadata(), context.peer())
            if method in ADMIN_METHODS:
                log_admin_call(admission.key_id, "gRPC", f"{SERVICE}/{method}",
                               501 if admission.error is None else admission.error.status,
                               client_address(context.peer()))
            if admission.error is not None:
                await _abort(context, admission.error)
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                f"mmserve does not implement {SERVICE}/{method}: it serves one model, loaded at "
                                "start-up, with tensors sent in the message (ModelInfer, ModelStreamInfer)")
        return grpc.unary_unary_rpc_method_handler(handle, response_serializer=_serialize)

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        methods = {
            "ServerLive": self._unary("ServerLive", service_pb2.ServerLiveRequest, self.server_live),
            "ServerReady": self._unary("ServerReady", service_pb2.ServerReadyRequest, self.server_ready),
            "ModelReady": self._unary("ModelReady", service_pb2.ModelReadyRequest, self.model_ready),
            "ServerMetadata": self._unary("ServerMetadata", service_pb2.ServerMetadataRequest,
                                          self.server_metadata),
            "ModelMetadata": self._unary("ModelMetadata", service_pb2.ModelMetadataRequest, self.model_metadata),
            "ModelConfig": self._unary("ModelConfig", service_pb2.ModelConfigRequest, self.model_config),
            "ModelInfer": grpc.unary_unary_rpc_method_handler(self.model_infer, response_serializer=_serialize),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(self.model_stream_infer,
                                                                      response_serializer=_serialize),
            **{method: self._unimplemented(method) for method in _UNIMPLEMENTED},
        }
        health = {
            "Check": self._unary("Check", health_pb2.HealthCheckRequest, self.health_check),
            "Watch": grpc.unary_stream_rpc_method_handler(self.health_watch, response_serializer=_serialize),
        }
        return [grpc.method_handlers_generic_handler(SERVICE, methods),
                grpc.method_handlers_generic_handler(HEALTH_SERVICE, health)]

    # -- health and metadata -----------------------------------------------------------

    async def server_live(self, request: Message, context: grpc.aio.ServicerContext) -> Message:
        return service_pb2.ServerLiveResponse(live=self._state_of().router.is_alive)

    async def server_ready(self, request: Message, context: grpc.aio.ServicerContext) -> Message:
        return service_pb2.ServerReadyResponse(ready=self._state_of().router.is_ready)

    def _health(self) -> int:
        serving = self._state_of().router.is_ready
        return health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING

    async def health_check(self, request: Any, context: grpc.aio.ServicerContext) -> Message:
        if request.service not in HEALTH_SERVICES:
            raise ApiError(404, "unknown_service", f"no health status for service {request.service!r}; this "
                           f"server reports {list(HEALTH_SERVICES)} ('' is the server as a whole)", "service")
        return health_pb2.HealthCheckResponse(status=self._health())

    async def health_watch(self, raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Message]:
        """The status now and at each change; for an unknown service SERVICE_UNKNOWN, then the call stays open
        (the spec's Watch follows a service that may become known; none does here) until cancelled or drained."""
        await self._admit("Watch", context)
        try:
            request = health_pb2.HealthCheckRequest.FromString(raw)
        except DecodeError as e:
            await _abort(context, ApiError(400, "invalid_message", f"not a HealthCheckRequest: {e}", "message"))
        if request.service not in HEALTH_SERVICES:
            yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            await asyncio.Event().wait()  # never set: open until the client cancels or the server stops
        last = None
        while True:
            status = self._health()
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            await asyncio.sleep(_WATCH_POLL_S)

    async def server_metadata(self, request: Message, context: grpc.aio.ServicerContext) -> Message:
        return service_pb2.ServerMetadataResponse(name=SERVER_NAME, version=self._version, extensions=EXTENSIONS)

    async def model_metadata(self, request: Any, context: grpc.aio.ServicerContext) -> Message:
        state = self._state_of()
        check_model(state, request.name, request.version or None)
        return model_metadata(state.served_model)

    async def model_config(self, request: Any, context: grpc.aio.ServicerContext) -> Message:
        state = self._state_of()
        check_model(state, request.name, request.version or None)
        return model_config(state.served_model, max_rows_per_request(state.settings))

    async def model_ready(self, request: Any, context: grpc.aio.ServicerContext) -> Message:
        """Triton answers an unknown model or version with ready=false, not an error (tritonclient.http reads
        the HTTP route's 404 as False the same way)."""
        state = self._state_of()
        try:
            check_model(state, request.name, request.version or None)
        except ApiError:
            return service_pb2.ModelReadyResponse(ready=False)
        return service_pb2.ModelReadyResponse(ready=state.router.is_ready)

    # -- inference ---------------------------------------------------------------------

    async def _infer(self, call: GrpcCall, context: grpc.aio.ServicerContext) -> GrpcReply:
        metadata = {name: value for name, value in context.invocation_metadata() or ()
                    if name in ("traceparent", "tracestate") and isinstance(value, str)}
        return await serve_call(self._state_of(), _ENDPOINT, call, metadata,
                                lambda work: until_call_ends(context, work))

    async def model_infer(self, raw: bytes, context: grpc.aio.ServicerContext) -> Message:
        await self._admit("ModelInfer", context)
        reply = await self._infer(GrpcCall(raw, deadline_us(context)), context)
        if reply.failure is not None:
            await _abort(context, reply.failure.error, reply.failure.row_index)
        # x-request-id and x-mmserve-engine, as HTTP sends them in its headers
        context.set_trailing_metadata(tuple((name.lower(), value) for name, value in reply.headers.items()))
        return reply.message

    async def model_stream_infer(self, requests: AsyncIterator[bytes],
                                 context: grpc.aio.ServicerContext) -> AsyncIterator[Message]:
        """Each request runs as it arrives; answers are sent as they complete, errors in ``error_message``.

        Opening the stream checks the key (no token); each request takes its
        token once decoded, so a refused one is answered with its id.
        """
        admission = await self._admit("ModelStreamInfer", context, takes_token=False)
        answers: asyncio.Queue[Message | None] = asyncio.Queue()
        running: set[asyncio.Task] = set()

        async def answer(raw: bytes) -> None:
            call = GrpcCall(raw, deadline_us(context))
            with contextlib.suppress(ApiError):  # bytes that are no message: parse answers them, without an id
                call.decoded()
            error = self._guards.take_token(admission, context.peer())
            if error is not None:
                answers.put_nowait(service_pb2.ModelStreamInferResponse(
                    error_message=error_text(error), infer_response=service_pb2.ModelInferResponse(id=call.request_id)))
                return
            reply = await self._infer(call, context)
            if reply.failure is None:
                answers.put_nowait(service_pb2.ModelStreamInferResponse(infer_response=reply.message))
                return
            answers.put_nowait(service_pb2.ModelStreamInferResponse(
                error_message=error_text(reply.failure.error, reply.failure.row_index),
                infer_response=service_pb2.ModelInferResponse(id=call.request_id)))

        async def read() -> None:
            async for raw in requests:
                task = asyncio.create_task(answer(raw))
                running.add(task)
                task.add_done_callback(running.discard)
            await asyncio.gather(*running)
            answers.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (message := await answers.get()) is not None:
                yield message
            await reader
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


async def _abort(context: grpc.aio.ServicerContext, error: ApiError, row_index: int | None = None) -> None:
    await context.abort(grpc_status(error.status), error_text(error, row_index), trailing_metadata(error))

