"""One API process: HTTP, protocols, keys and limits, image decode, in front of the engine.

The app is the single process's (``server.app_routes.wire_routes``: the same routes,
guards, limits and error answers) on a state whose intake is the engine
client (``server.workers.engine_client``) and whose router is the engine's
state as polled. It serves on the listening socket the supervisor bound and
passed down (every API process accepts from the same socket), and drains
like the single process on SIGTERM (``server.runtime.lifecycle``).

``/v1/classify`` and ``/v1/rank`` tokenize their texts and decode their images
here too, and the engine scores them (``server.workers.zero_shot_client``).
Fault drills are the engine's (``/v1/admin/faults`` is answered there,
after this process's guards, ``server.workers.engine_routes``); this process holds a copy for the
``decode`` stage it runs (``server.workers.engine_client``). Tracing is set up
here as in one process (its own exporter, from the same ``OTEL_*``); the
batch spans are the engine's to export.

It loads no model: once the engine has loaded its own, it answers ``describe``
(``server.workers.engine_client.describe_engine``) with the model's facts
(``models.served_facts.ServedModelFacts``: configuration and preprocessing,
the ``model`` object of answers, fingerprint, the widths the protocols
check) and its tokenizer's files (``models.tokenizer_files``, saved by the
tokenizer's own library, built back here and checked to be the same). From
those it builds the tokenizer and joint-token budget it applies to every item
before the engine sees it (``router.item_text``; the engine checks the budget
again), its cache keys and its image decoder. So a restarted API process is
up as soon as the engine answers, and memory does not grow with a model copy
per process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from models.tokenizer_files import unpack_tokenizer
from monitoring.serving_metrics import ServingMetrics
from router.decode_pool import BoundedDecodePool
from router.faults import FaultInjector
from router.item_text import ItemTextFitter
from router.segments import SegmentCatalog
from server.app_routes import joint_token_budget, wire_routes
from server.grpc_api.server import serve_grpc
from server.http.rate_limit import RateLimit
from server.ingest.inputs import image_decoder
from server.runtime.garbage_collection import settle_collector_for_requests
from server.runtime.lifecycle import serve_until_stopped
from server.runtime.log_output import configure_logging
from server.runtime.ops_port import serve_ops_port
from server.runtime.tracing_setup import FASTAPI_TELEMETRY_OFF, TracedProcess, build_tracing
from server.settings import Settings
from server.state import ServerState
from server.workers.engine_routes import ForwardToEngine
from server.workers.engine_monitor import EngineMonitor
from server.workers.engine_client import EngineClient, describe_engine
from server.workers.engine_connection import EngineConnection
from server.workers.engine_router import EngineRouter
from server.workers.handoff import (
    RATE_BUCKETS_VARIABLE,
    RUN_DIRECTORY_VARIABLE,
    engine_sockets_from_environment,
    metrics_socket_from_environment,
    settings_from_environment,
    started_unix_s_from_environment,
    supervisor_pid,
)
from server.workers.pixel_slots import PixelSlots, block_prefix, pixel_slots_of, remove_blocks
from server.workers.readiness import ReadyMarks
from server.workers.metrics_snapshots import answer_snapshot_requests
from server.workers.metrics_view import merged_registry
from server.workers.orphan_guard import exit_when_orphaned
from server.workers.shared_rate_buckets import SharedTokenBuckets, remove_table
from server.workers.start_failure import EXIT_CONFIGURATION_ERROR, api_process_name, write_start_failure
from server.workers.zero_shot_client import ZeroShotClient

logger = logging.getLogger(__name__)

ENGINE_CONNECT_TIMEOUT_S = 600.0  # the engine loads and warms its model meanwhile
FIRST_STATUS_WAIT_S = 2.0  # an engine that listens answers its first status poll in milliseconds


async def wait_for_a_serving_engine(engines: Sequence[EngineConnection], timeout_s: float) -> None:
    """Until one engine's polled status says it serves, or ``timeout_s``.

    Once the lifespan ends, this process accepts from the socket every API
    process shares. Connected but not yet polled, an engine counts as not
    serving, so a request taken then was answered 503 ``engine_unavailable``
    although the engine served: at start-up, and on every restart of an API
    process. With no engine serving by ``timeout_s`` (each starting again)
    the process serves anyway and answers so, as before.
    """
    deadline = time.monotonic() + timeout_s
    while not any(engine.is_serving for engine in engines) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def create_api_app(settings: Settings, socket_paths: list[str], run_directory: str,
                   rate_buckets_path: str | None = None, metrics_socket: socket.socket | None = None) -> FastAPI:
    """``socket_paths``: every engine's, in engine order. ``rate_buckets_path``: the table of token buckets
    every API process shares (with a rate limit). ``metrics_socket``: the metrics port the supervisor bound,
    served here as the public port's ``/metrics`` and ``/health/*`` (``server.runtime.ops_port``)."""
    registry = CollectorRegistry()
    metrics = ServingMetrics(registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        facts, tokenizer_files = await describe_engine(socket_paths, ENGINE_CONNECT_TIMEOUT_S)
        tokenizer = await asyncio.to_thread(unpack_tokenizer, tokenizer_files)
        decode_pool = BoundedDecodePool(settings.decode_threads, settings.max_decode_queue,
                                        on_refused=metrics.decode_queue_refused.inc)
        preprocess = facts.config.preprocess
        slots = PixelSlots((preprocess.input_size, preprocess.input_size, 3), pixel_slots_of(settings),
                           on_full=metrics.pixel_slots_refused.inc, supervisor_pid=supervisor_pid())
        texts = ItemTextFitter(tokenizer, joint_token_budget(settings, facts), decode_pool)
        faults = FaultInjector() if settings.enable_fault_injection else None  # the engine's drills, copied
        keys = SegmentCatalog(None, facts.fingerprint, facts.preprocess_id)  # type: ignore[arg-type]  # keys only
        client = EngineClient(socket_paths, keys, preprocess, image_decoder(settings, preprocess), decode_pool,
                              slots, texts, faults, is_image_cache_on=settings.cache_image_bytes > 0,
                              inline_image_max_pixels=settings.inline_image_max_pixels,
                              is_text_cache_on=settings.cache_text_bytes > 0,
                              wait_bound_s=settings.engine_wait_bound_ms / 1e3, dispatch_mode=settings.engine_dispatch)
        await client.connect(ENGINE_CONNECT_TIMEOUT_S)
        await wait_for_a_serving_engine(client.engines, FIRST_STATUS_WAIT_S)
        tracing = build_tracing(settings, facts, process=TracedProcess("api", send_batches=client.send_batch_spans))
        marks = ReadyMarks(run_directory)
        router = EngineRouter(client, marks)
        # Started at the engine's priority, a restart's few tens of ms of CPU are not kept waiting behind busy
        # processes; serving from here on, at api_process_nice (every thread so far; later ones inherit it).
        yield_cores_to_the_engine(settings.api_process_nice)
        client.on_status = lambda: marks.mark(router.is_serving)  # marked without waiting for a probe
        view = merged_registry(registry, run_directory, socket_paths,  # /metrics: every process's
                               metrics.request_duration_seconds)
        state = ServerState(settings, facts, router, view, metrics, decode_pool,  # type: ignore[arg-type]
                            monitor=EngineMonitor(client), intake=client,  # type: ignore[arg-type]
                            tracer=tracing.request_tracer if tracing is not None else None,
                            zero_shot=ZeroShotClient(client, tokenizer, keys, decode_pool))
        app.state.mmserve = state
        num_frozen = settle_collector_for_requests(settings.gc_young_threshold)  # torch and the app live until exit
        logger.debug("froze %d start-up objects out of the garbage collector's way", num_frozen)
        snapshots = asyncio.create_task(answer_snapshot_requests(run_directory, registry,
                                                                 metrics.request_duration_seconds))
        try:
            async with serve_grpc(app, settings), serve_ops_port(app, settings, metrics_socket):
                yield
        finally:
            snapshots.cancel()
            marks.leave()
            await client.close()
            decode_pool.shutdown(wait=False, cancel_futures=True)
            slots.close()
            if rate_buckets is not None:
                rate_buckets.close()
            if tracing is not None:
                await asyncio.to_thread(tracing.shutdown)

    app = FastAPI(title="mmserve", version="0.1.0",
                  description="Online multimodal (image + text) inference server.", lifespan=lifespan,
                  telemetry=FASTAPI_TELEMETRY_OFF)
    rate_buckets = None
    if settings.rate_limit is not None and rate_buckets_path is not None:
        rate_buckets = SharedTokenBuckets(rate_buckets_path, RateLimit.parse(settings.rate_limit))
    # Added before the guards, so innermost: forwarded routes pass every guard first (server.workers.engine_routes).
    app.add_middleware(ForwardToEngine, forward=lambda *request: app.state.mmserve.intake.answer_in_engine(*request),
                       routes=app.router.routes)
    wire_routes(app, settings, metrics, registry, rate_buckets=rate_buckets)
    return app


def yield_cores_to_the_engine(nice: int) -> None:
    """Add ``nice`` to every thread this process has so far (Linux; threads started later inherit it).

    Called once start-up is done (the app built, the engine's facts and
    tokenizer in hand), before the process marks itself serving. Every
    request's batch passes the one engine, and the API processes are
    many: on a machine they keep busy, the engine getting the cores first
    keeps it from falling behind them (BENCHMARKS.md, history: on 2
    CPUs, ``--api-workers 2`` answered 1.54-1.75x one process's text requests
    in three runs at nice 5, 1.21-1.57x in two at 0). Threads an import
    started count too, hence every task of the process, not only this one.
    """
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    for thread in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(thread), os.getpriority(os.PRIO_PROCESS, int(thread)) + nice)
        except OSError as e:  # a thread that ended meanwhile, or a limit of the host
            logger.warning("could not lower the priority of thread %s: %s", thread, e)


def main(listening_fd: int | None = None) -> int:
    """Serve on the listening socket ``listening_fd`` (default: the first argument), as the supervisor
    started this process: a new interpreter, or a fork of ``server.workers.api_forkserver``."""
    settings = settings_from_environment()
    configure_logging(settings.log_level, f"%(asctime)s %(levelname)s api-{os.getpid()} %(name)s: %(message)s")
    rate_buckets_path = os.environ.get(RATE_BUCKETS_VARIABLE)  # the supervisor's to remove, unless it was killed

    def remove_shared_memory() -> None:  # what a killed supervisor cannot remove: the rate table, its pixel slots
        remove_table(rate_buckets_path)
        remove_blocks(block_prefix(supervisor_pid() or os.getpid(), os.getpid()))

    exit_when_orphaned(parent_pid=supervisor_pid(), on_orphaned=remove_shared_memory)
    listening = socket.socket(fileno=int(sys.argv[1]) if listening_fd is None else listening_fd)
    app = create_api_app(settings, engine_sockets_from_environment(), os.environ[RUN_DIRECTORY_VARIABLE],
                         rate_buckets_path, metrics_socket_from_environment())
    started_unix_s = started_unix_s_from_environment()
    if started_unix_s is not None:  # OpenAI's model "created": the server's, not this (maybe restarted) process's
        app.state.created_unix_s = started_unix_s
    exit_code, start_up_error = serve_until_stopped(app, settings, listening, stopped_by_supervisor=True)
    if start_up_error is not None:  # a setting (--grpc-port taken): the supervisor prints the line and exits 2
        write_start_failure(os.environ[RUN_DIRECTORY_VARIABLE], api_process_name(os.getpid()), str(start_up_error))
        return EXIT_CONFIGURATION_ERROR
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
