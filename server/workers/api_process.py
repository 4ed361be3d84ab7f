"""One API process: HTTP, protocols, keys and limits, image decode, in front of the engine.

The app is the single process's (``server.app.wire_routes``: the same routes,
guards, limits and error answers) on a state whose intake is the engine
client (``server.workers.engine_client``) and whose router is the engine's
state as polled. It serves on the listening socket the supervisor bound and
passed down (every API process accepts from the same socket), and drains
like the single process on SIGTERM (``server.runtime.lifecycle``).

Fault drills are the engine's (``/v1/admin/faults`` is answered there,
``server.workers.engine_routes``); this process holds a copy for the
``decode`` stage it runs (``server.workers.engine_client``). Tracing is set up
here as in one process (its own exporter, from the same ``OTEL_*``); the
batch spans are the engine's to export.

It loads the model bundle on the CPU for what the HTTP side describes (the
model's name and configuration) and for the tokenizer and joint-token budget
it applies to every item before the engine sees it (``router.item_text``:
the same configuration gives the engine's tokenizer and limits, and the
engine checks the budget again); the model object of answers, its
fingerprint and the cache keys' preprocessing come from the engine, so they
are the engine's whatever this copy is.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from monitoring.serving_metrics import ServingMetrics
from router.decode_pool import BoundedDecodePool
from router.faults import FaultInjector
from router.item_text import ItemTextFitter
from router.segments import SegmentCatalog
from server.app import joint_token_budget, wire_routes
from server.http.rate_limit import RateLimit
from server.ingest.inputs import image_decoder
from server.runtime.lifecycle import DrainingServer, uvicorn_config
from server.runtime.log_output import TurnBufferedStreamHandler
from server.runtime.model_loading import load_model
from server.runtime.monitoring_setup import build_monitor, mark_ready_when_ready
from server.runtime.tracing_setup import TracedProcess, build_tracing
from server.settings import Settings
from server.state import ServerState
from server.workers.engine_routes import ForwardToEngine
from server.workers.engine_client import EngineClient, EngineRouter
from server.workers.handoff import (
    ENGINE_SOCKET_VARIABLE,
    RATE_BUCKETS_VARIABLE,
    RUN_DIRECTORY_VARIABLE,
    settings_from_environment,
    supervisor_pid,
)
from server.workers.pixel_slots import PixelSlots
from server.workers.readiness import ReadyMarks
from server.workers.metrics_snapshots import answer_snapshot_requests
from server.workers.metrics_view import merged_registry
from server.workers.orphan_guard import exit_when_orphaned
from server.workers.shared_rate_buckets import SharedTokenBuckets

logger = logging.getLogger(__name__)

ENGINE_CONNECT_TIMEOUT_S = 600.0  # the engine loads and warms its model meanwhile


def create_api_app(settings: Settings, socket_path: str, run_directory: str,
                   rate_buckets_path: str | None = None) -> FastAPI:
    """``rate_buckets_path``: the table of token buckets every API process shares (with a rate limit)."""
    registry = CollectorRegistry()
    metrics = ServingMetrics(registry)
    monitor = build_monitor(settings, registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        bundle = await asyncio.to_thread(load_model, settings.model_copy(update={"device": "cpu", "dtype": "auto"}))
        decode_pool = BoundedDecodePool(settings.decode_threads, settings.max_decode_queue)
        input_size = bundle.config.preprocess.input_size
        slots = PixelSlots((input_size, input_size, 3))
        texts = ItemTextFitter(bundle.tokenizer, joint_token_budget(settings, bundle), decode_pool)
        faults = FaultInjector() if settings.enable_fault_injection else None  # the engine's drills, copied
        client = EngineClient(socket_path, SegmentCatalog(None, bundle.fingerprint, ""),  # type: ignore[arg-type]
                              bundle.config.preprocess, image_decoder(settings, bundle.config.preprocess), decode_pool,
                              slots, texts, faults, is_image_cache_on=settings.cache_image_bytes > 0)
        await client.connect(ENGINE_CONNECT_TIMEOUT_S)
        description, fingerprint, preprocess_id = await client.describe()
        client.use_keys_of(SegmentCatalog(None, fingerprint, preprocess_id))  # type: ignore[arg-type]
        tracing = build_tracing(settings, bundle, process=TracedProcess("api", fingerprint, client.send_batch_spans))
        marks = ReadyMarks(run_directory, settings.api_workers)
        router = EngineRouter(client, socket_path, marks)
        client.on_status = lambda: marks.mark(router.is_serving)  # marked without waiting for a probe
        view = merged_registry(registry, monitor, run_directory, socket_path,  # /metrics: every process's
                               metrics.request_duration_seconds)
        state = ServerState(settings, bundle, router, view, metrics, decode_pool,  # type: ignore[arg-type]
                            monitor=monitor, intake=client,  # type: ignore[arg-type]
                            tracer=tracing.request_tracer if tracing is not None else None)
        state.__dict__["model_description"] = description  # the engine's, not this CPU copy's
        app.state.mmserve = state
        monitor.start()
        baseline_start = asyncio.create_task(mark_ready_when_ready(monitor, lambda: router.is_ready))
        snapshots = asyncio.create_task(answer_snapshot_requests(run_directory, registry, monitor,
                                                                 metrics.request_duration_seconds))
        try:
            yield
        finally:
            baseline_start.cancel()
            snapshots.cancel()
            marks.mark(False)
            await client.close()
            decode_pool.shutdown(wait=False, cancel_futures=True)
            slots.close()
            if rate_buckets is not None:
                rate_buckets.close()
            await asyncio.to_thread(monitor.stop)
            if tracing is not None:
                await asyncio.to_thread(tracing.shutdown)

    app = FastAPI(title="mmserve", version="0.1.0",
                  description="Online multimodal (image + text) inference server.", lifespan=lifespan)
    rate_buckets = None
    if settings.rate_limit is not None and rate_buckets_path is not None:
        rate_buckets = SharedTokenBuckets(rate_buckets_path, RateLimit.parse(settings.rate_limit))
    wire_routes(app, settings, metrics, registry, rate_buckets=rate_buckets)
    app.add_middleware(ForwardToEngine, forward=lambda *request: app.state.mmserve.intake.answer_in_engine(*request),
                       max_body_bytes=settings.max_body_bytes)
    return app


def main() -> int:
    settings = settings_from_environment()
    logging.basicConfig(level=settings.log_level.upper(), handlers=[TurnBufferedStreamHandler()],  # as one process
                        format=f"%(asctime)s %(levelname)s api-{os.getpid()} %(name)s: %(message)s")
    exit_when_orphaned(parent_pid=supervisor_pid())
    listening = socket.socket(fileno=int(sys.argv[1]))
    app = create_api_app(settings, os.environ[ENGINE_SOCKET_VARIABLE], os.environ[RUN_DIRECTORY_VARIABLE],
                         os.environ.get(RATE_BUCKETS_VARIABLE))
    server = DrainingServer(uvicorn_config(app, settings), app, settings.drain_timeout_s)
    server.run(sockets=[listening])
    return server.exit_code if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
