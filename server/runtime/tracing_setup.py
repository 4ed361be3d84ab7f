"""Tracing's set-up at app start: on or off, the OTLP exporter from ``OTEL_*``, the span processor, the sampler.

    tracing=off                         off
    tracing=on                          on (OTLP to OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, else the SDK's default)
    tracing=auto (default)              on when OTEL_EXPORTER_OTLP_ENDPOINT or ..._TRACES_ENDPOINT is set,
                                        or OTEL_TRACES_EXPORTER names otlp; off when OTEL_SDK_DISABLED=true
                                        or OTEL_TRACES_EXPORTER=none

The exporter is the SDK's, so it reads the standard variables itself
(``OTEL_EXPORTER_OTLP_[TRACES_]{ENDPOINT,HEADERS,TIMEOUT,COMPRESSION,CERTIFICATE}``);
the protocol comes from ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`` (``http/protobuf``,
the OpenTelemetry default, or ``grpc``). ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` name the service (``mmserve`` when unset);
``OTEL_BSP_*`` tune the batch span processor. Which traces are kept is ours
(``trace_sample_ratio``, ``trace_slow_ms``: ``server.http.tail_sampling``).

With ``--api-workers N`` every process sets up its own tracing from the same
variables (one exporter each, to the same endpoint) and names itself on its
resource: ``mmserve.process`` (``engine`` or ``api``) and ``process.pid``
(``TracedProcess``); the engine exports the batch spans, the API processes the
requests' (``server.http.tracing``).

The OpenTelemetry SDK is imported here, inside ``build_tracing``, and only
when tracing is on: with tracing off (the default) no part of it is loaded,
and ``mmserve[otel]`` need not be installed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.request import Route
from router.tracing import BatchTrace, BatchTracer
from server.http.tail_sampling import TailSampler
from server.settings import Settings

# FastAPI's own OpenTelemetry instrumentation (fastapi >= 0.165), off in every app mmserve builds. On, it
# would put a second server span per request into whatever global tracer provider the process has (set by
# ``opentelemetry-instrument`` or a host's SDK set-up), outside mmserve's trace, sampling and exporter,
# and it asks for the global providers on every request even when none is set. mmserve's own spans,
# metrics and logs are above.
FASTAPI_TELEMETRY_OFF = {"tracing": False, "metrics": False, "logs": False}

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExporter

    from models.served_facts import ServedModelFacts
    from server.http.tracing import RequestTracer

logger = logging.getLogger(__name__)

_ON_VALUES = ("otlp",)


class TracingSetupError(RuntimeError):
    """Tracing is asked for but cannot be set up (the extra is missing, or an OTEL_* value is wrong)."""


@dataclass(frozen=True)
class Tracing:
    """What tracing hands the rest of the server: the request tracer (routes) and the batch tracer (router)."""

    request_tracer: RequestTracer
    batch_tracer: BatchTracer
    processor: SpanProcessor

    def shutdown(self) -> None:
        """Export what is queued and stop the processor's thread (the app's lifespan end)."""
        self.processor.shutdown()


@dataclass(frozen=True)
class TracedProcess:
    """One process of several (``--api-workers N``), as its spans' resource names it.

    Attributes:
        role: ``engine`` or ``api`` (the resource's ``mmserve.process``).
        send_batches: Where kept requests' batches go (an API process: to the engine, which exports them).
    """

    role: str
    send_batches: Callable[[Sequence[BatchTrace]], None] | None = None


def is_tracing_on(settings: Settings, environ: Mapping[str, str]) -> bool:
    """The table above."""
    if settings.tracing != "auto":
        return settings.tracing == "on"
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if name.strip()}
    if "none" in exporters:
        return False
    return bool(exporters & set(_ON_VALUES) or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _otlp_exporter(environ: Mapping[str, str]) -> SpanExporter:
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        elif protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
        else:
            raise TracingSetupError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: mmserve exports traces over "
                                    "'http/protobuf' or 'grpc'")
    except ImportError as e:
        raise TracingSetupError(f"tracing is on but the OTLP exporter for {protocol} is not installed: "
                                "pip install 'mmserve[otel]'") from e
    return OTLPSpanExporter()


def build_tracing(settings: Settings, model: ServedModelFacts, environ: Mapping[str, str] | None = None, *,
                  span_exporter: SpanExporter | None = None, process: TracedProcess | None = None) -> Tracing | None:
    """Tracing for one app, or ``None`` when it is off.

    ``environ`` (default ``os.environ``) decides on/off and the protocol; the
    SDK's exporter and resource read ``os.environ`` themselves, at this call.

    ``span_exporter`` (tests): export there, span by span, instead of OTLP; turns tracing on.
    ``process``: this process's part under ``--api-workers N`` (``None``: the one process).
    """
    environ = os.environ if environ is None else environ
    if span_exporter is None and not is_tracing_on(settings, environ):
        return None
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        from server.http.tracing import RequestTracer
    except ImportError as e:
        raise TracingSetupError("tracing is on but the OpenTelemetry SDK is not installed: "
                                "pip install 'mmserve[otel]'") from e
    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES (the SDK reads os.environ)
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "mmserve"}))
    if process is not None:
        resource = resource.merge(Resource({"mmserve.process": process.role, "process.pid": os.getpid()}))
    if span_exporter is not None:
        processor: SpanProcessor = SimpleSpanProcessor(span_exporter)
    else:
        processor = BatchSpanProcessor(_otlp_exporter(environ))
    sampler = TailSampler(settings.trace_sample_ratio, int(settings.trace_slow_ms * 1_000_000))
    default_timeout_ms = {route.value: int(settings.lane_value(route.value, "default_timeout_ms"))
                          for route in Route}
    request_tracer = RequestTracer(processor, resource, sampler, model_name=model.name,
                                   model_fingerprint=model.fingerprint,
                                   default_timeout_ms=default_timeout_ms,
                                   send_batches=process.send_batches if process is not None else None)
    batch_tracer = BatchTracer(model.device, model.config.preprocess.input_size)
    logger.info("tracing on: sample ratio %g, always kept: 5xx%s", settings.trace_sample_ratio,
                f" and requests over {settings.trace_slow_ms:g} ms" if settings.trace_slow_ms > 0 else "")
    return Tracing(request_tracer, batch_tracer, processor)
