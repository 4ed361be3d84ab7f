"""An OTLP/HTTP trace receiver on 127.0.0.1 for tests: decodes what the exporter sent, off the wire.

    with otlp_receiver() as receiver:          # POST http://127.0.0.1:<port>/v1/traces
        ... OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.traces_url ...
        spans = receiver.wait_for_spans(lambda spans: ...)
    with otlp_grpc_receiver() as receiver:     # the gRPC TraceService on http://127.0.0.1:<port>

It parses each body as ``ExportTraceServiceRequest`` (opentelemetry-proto),
the way a collector does, and answers with an empty
``ExportTraceServiceResponse``, so a test checks the real exporter's wire
format, not the SDK's in-memory objects. Imported by tests as
``otlp_receiver`` (``tests/`` is on the path, as for ``encoded_images``).
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def any_value(value: AnyValue) -> object:
    """An OTLP attribute value as Python (arrays as tuples)."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(any_value(v) for v in value.array_value.values)
    return getattr(value, kind) if kind is not None else None


@dataclass(frozen=True)
class ReceivedSpan:
    """One span off the wire, with its resource's attributes."""

    span: Span
    resource: dict[str, object]

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def attributes(self) -> dict[str, object]:
        return {kv.key: any_value(kv.value) for kv in self.span.attributes}


@dataclass
class OtlpReceiver:
    port: int
    requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    content_types: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    path: str = "/v1/traces"  # "" for gRPC: the exporter takes the bare address

    @property
    def traces_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def add(self, request: ExportTraceServiceRequest, content_type: str) -> None:
        with self.lock:
            self.requests.append(request)
            self.content_types.append(content_type)

    def spans(self) -> list[ReceivedSpan]:
        with self.lock:
            requests = list(self.requests)
        return [ReceivedSpan(span, {kv.key: any_value(kv.value) for kv in resource_spans.resource.attributes})
                for request in requests for resource_spans in request.resource_spans
                for scope_spans in resource_spans.scope_spans for span in scope_spans.spans]

    def wait_for_spans(self, is_enough: Callable[[list[ReceivedSpan]], bool],
                       timeout_s: float = 30.0) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if is_enough(spans):
                return spans
            assert time.monotonic() < deadline, f"the receiver got only {[s.name for s in spans]}"
            time.sleep(0.05)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A receiver on a free loopback port for the block's duration."""
    receiver: OtlpReceiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            receiver.add(ExportTraceServiceRequest.FromString(body), self.headers.get("Content-Type", ""))
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = OtlpReceiver(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def otlp_grpc_receiver() -> Iterator[OtlpReceiver]:
    """The same, as the OTLP gRPC ``TraceService`` (insecure, on a free loopback port)."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: ExportTraceServiceRequest, context: object) -> ExportTraceServiceResponse:  # noqa: N802
            receiver.add(request, "application/grpc")
            return ExportTraceServiceResponse()

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    receiver = OtlpReceiver(port, path="")
    server.start()
    try:
        yield receiver
    finally:
        server.stop(grace=None)
