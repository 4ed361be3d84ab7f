"""The engine process: the model, lanes, batcher, segment cache, kernels and drift monitoring, behind a socket.

It builds exactly what a single ``mmserve serve`` process builds (``create_app``'s
start-up, without HTTP) and answers the API processes' calls over a Unix
socket (``server.workers.frames``):

    ("peek", id, keys)                     -> ("ok", id, [is the segment cached?])   before an API process decodes
    ("run", id, items, arrival_ns, block, slots) -> ("ok", id, outcomes) | ("error", id, row, error fields)
    ("cancel", id)                         the client went away: the call's task is cancelled (-> "cancelled")
    ("status", id)                         -> ("ok", id, (ready, alive, draining))
    ("clear_cache", id)                    -> ("ok", id, segments dropped)
    ("metrics", id)                        -> ("ok", id, (the engine registry's exposition, its digests,
                                               its exemplars, its pid))
    ("zero_shot", id, work, arrival_ns, block, slots) -> ("ok", id, ZeroShotScores) | ("error", id, None, fields)
                                           /v1/classify or /v1/rank, tokenized and decoded by the API process
                                           (server.workers.zero_shot_engine)
    ("http", id, method, path, headers, body, client) -> ("ok", id, (status, headers, body))
                                           an admin or monitoring route the API process has guarded
                                           (keys, rate limit, body), answered by the app's routes
                                           without its guards (server.workers.engine_routes)
    ("describe", id)                       -> ("ok", id, (ServedModelFacts, TokenizerFiles)): the model's
                                           facts and its tokenizer's files, all an API process loads
    ("record", id, route, stage_ns, batch_size, cache_hit, inputs code)   an answered request's latency record
                                           (server.workers.engine_monitor; no answer)
    ("batch_spans", id, [BatchTrace])      export these batches' spans (kept requests' batches; no answer)
    ("watch_faults", id)                   -> ("faults", None, [(FaultPlan, seconds left)]), ("ok", id, None),
                                           then the same "faults" frame, unasked, after every drill change

A ``run`` goes through the same ``RequestIntake`` as in one process (budget,
plan, submit, settle), with the items' token ids the API process computed
(``IntakeItem.tokens``: nothing is tokenized here, the budget is checked again)
and the pixels it decoded taken from its shared-memory slots; an image it did
not decode (the peek said cached, and the entry left the cache since) is
decoded here, so such an image keeps the bytes it was sent as. An image the
API process decoded into a slot arrives as its cache key, length and (encoded)
header only (``server.workers.raw_pixels_sent``), so every key and fact is the
one a single process derives and no file crosses twice. Deadlines count from
``arrival_ns``, the API process's ``perf_counter_ns`` at arrival: on Linux that
clock is CLOCK_MONOTONIC, one clock for every process of the machine.

Fault drills (``POST``/``DELETE /v1/admin/faults``) reach the engine as whole
HTTP requests (``server.workers.engine_routes``), so their answers and statuses
are the single process's; the API process has applied keys, rate limit and
body limits before forwarding them. The engine's injector holds them and
delays the compute stages it runs; each change is pushed to every API
process, whose copy delays ``decode`` where decoding runs
(``server.workers.engine_client``). The engine's intake therefore runs no
``decode`` drill of its own: a request is delayed once, as in one process.

Tracing: the items carry their request span's ids (``IntakeItem.trace``), so
each batch links to the requests it served; outcomes carry their batch
(``BatchTrace``) back, and the API process that keeps a request's trace sends
its batches back to be exported here, once (``server.http.tracing``).

When an API process's connection drops (it died), its calls are cancelled.
The engine exits non-zero when a compute thread dies or hangs
(``EXIT_COMPUTE_FAULT``), and drains its router on SIGTERM. A setting this
machine cannot meet ends its start with one line for the supervisor and exit
status 2 (``server.workers.start_failure``), not a traceback.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import signal
import sys
from collections.abc import Callable

import numpy as np
from fastapi import FastAPI
from prometheus_client import generate_latest

from models.tokenizer_packing import pack_tokenizer
from router.errors import IntakeItemError, ServerRefusalError
from router.intake import IntakeItem, IntakeTools, RequestIntake
from router.segments import SegmentKey
from server.app import create_app
from server.ingest.inputs import image_decoder
from server.runtime.device_decode import device_jpeg_decoder
from server.workers.orphan_guard import exit_when_orphaned
from server.runtime.lifecycle import EXIT_COMPUTE_FAULT
from server.runtime.log_output import configure_logging
from server.runtime.model_loading import plan_device
from server.runtime.startup_checks import CONFIGURATION_ERRORS, StartupError
from server.runtime.tracing_setup import TracedProcess
from server.settings import Settings
from server.state import ServerState
from server.workers.engine_answers import error_fields, portable_of_item
from server.workers.engine_monitor import RecordsIntoMonitor
from server.workers.engine_routes import EngineRoutes
from server.workers.frames import CorkedFrameWriter, read_messages
from server.workers.handoff import (
    ENGINE_SOCKET_VARIABLE,
    RUN_DIRECTORY_VARIABLE,
    engine_index_from_environment,
    settings_from_environment,
    supervisor_pid,
)
from server.workers.metrics_snapshots import exemplars_of
from server.workers.pixel_slots import AttachedSlots
from server.workers.start_failure import EXIT_CONFIGURATION_ERROR, engine_name, write_start_failure
from server.workers.zero_shot_engine import ZeroShotEngine

logger = logging.getLogger(__name__)


class Engine:
    """Answers one API process connection's calls with the engine's router and intake."""

    def __init__(self, state: ServerState, settings: Settings, app: FastAPI) -> None:
        self._state = state
        self._routes = EngineRoutes(app)  # forwarded requests, already guarded by the API process
        bundle = state.router.bundle
        self._input_shape = (bundle.config.preprocess.input_size,) * 2 + (3,)
        self._prepared: dict[int, np.ndarray] = {}  # id(ImageContent) -> pixels an API process decoded
        # No faults: the decode drill runs in the API processes (the module's docstring).
        self._intake = RequestIntake(state.router, IntakeTools.of(bundle, state.router.budget),
                                     image_decoder(settings, bundle.config.preprocess), state.decode_pool,
                                     device_decoder=device_jpeg_decoder(settings, bundle),
                                     prepared_pixels=lambda content: self._prepared.get(id(content)),
                                     inline_image_max_pixels=settings.inline_image_max_pixels)
        self._zero_shot = ZeroShotEngine(state, self._intake, self._prepared)
        self._records = RecordsIntoMonitor(state.monitor)  # API processes' answered requests, for the one monitor
        self._fault_watchers: set[Callable[..., None]] = set()  # the replies of connections that watch the drills
        # What an API process builds its side from (it loads no weights): packed once, sent on every describe.
        self._description = (state.served_model, pack_tokenizer(bundle.tokenizer))
        if state.faults is not None:
            state.faults.subscribe(self._push_faults)

    def _push_faults(self) -> None:
        """The drills as they are now, to every API process (the admin route just changed them)."""
        entries = self._state.faults.entries()  # type: ignore[union-attr]
        for reply in self._fault_watchers:
            reply("faults", None, entries)

    async def handle_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        attached: dict[str, AttachedSlots] = {}
        calls: dict[int, asyncio.Task] = {}

        corked = CorkedFrameWriter(writer)
        reply = corked.reply  # one bound method: the fault watchers' set adds and discards this very object

        try:
            while True:
                try:
                    messages = await read_messages(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                except asyncio.CancelledError:
                    return  # the engine is stopping (its loop cancels what is left): no error, finally closes
                for message in messages:  # one frame holds a turn of the API process's messages
                    kind, call_id = message[0], message[1]
                    if kind == "run":
                        items, arrival_ns, block, slots = message[2:]
                        # The pixels are copied out now, before the call's task: each slot is free again at once,
                        # even for a call cancelled before it starts (server.workers.pixel_slots).
                        prepared_ids = self._take_pixels(items, self._attached(attached, block), slots)
                        started = self._intake.start_one(items[0], arrival_ns) if len(items) == 1 else None
                        if started is not None:  # most calls: no task of their own (RequestIntake.start_one)
                            calls[call_id] = started
                            started.add_done_callback(functools.partial(
                                self._answer_started, call_id, items[0], prepared_ids, reply, calls))
                            continue
                        task = asyncio.ensure_future(self._run(call_id, items, arrival_ns, prepared_ids, reply))
                        calls[call_id] = task
                        task.add_done_callback(lambda _, call_id=call_id: calls.pop(call_id, None))
                    elif kind == "record":  # an API process's answered request (engine_monitor); next to run: one per request
                        self._records.record(*message[2:])
                    elif kind == "zero_shot":  # /v1/classify and /v1/rank (server.workers.zero_shot_engine)
                        work, arrival_ns, block, slots = message[2:]
                        prepared_ids = self._zero_shot.take_pixels(work, self._attached(attached, block), slots)
                        task = asyncio.ensure_future(self._zero_shot.answer(call_id, work, arrival_ns, prepared_ids,
                                                                            reply))
                        calls[call_id] = task
                        task.add_done_callback(lambda _, call_id=call_id: calls.pop(call_id, None))
                    elif kind == "http":
                        task = asyncio.ensure_future(self._http(call_id, message[2:], reply))
                        calls[call_id] = task
                        task.add_done_callback(lambda _, call_id=call_id: calls.pop(call_id, None))
                    elif kind == "cancel":
                        if (task := calls.get(call_id)) is not None:
                            task.cancel()
                    elif kind == "peek":
                        reply("ok", call_id, self._peek(message[2]))
                    elif kind == "status":
                        router = self._state.router
                        reply("ok", call_id, (router.is_ready, router.is_alive, router.is_draining,
                                              router.estimated_waits_s()))
                    elif kind == "describe":
                        reply("ok", call_id, self._description)
                    elif kind == "watch_faults":
                        self._fault_watchers.add(reply)
                        faults = self._state.faults
                        reply("faults", None, faults.entries() if faults is not None else ())
                        reply("ok", call_id, None)
                    elif kind == "batch_spans":
                        if self._state.tracer is not None:
                            self._state.tracer.emit_batches(message[2])
                    elif kind == "metrics":
                        reply("ok", call_id, (generate_latest(self._state.registry).decode(),
                                              self._state.monitor.digests_view(),
                                              exemplars_of(self._state.metrics.request_duration_seconds),
                                              os.getpid()))  # who counted them (server.workers.counter_carry)
                    elif kind == "clear_cache":
                        reply("ok", call_id, self._state.router.cache.clear())
        finally:
            self._fault_watchers.discard(reply)
            for task in list(calls.values()):
                task.cancel()  # the API process is gone: nobody reads these answers
            for block in attached.values():
                block.close()
            corked.close()

    async def _http(self, call_id: int, request: tuple, reply) -> None:  # noqa: ANN001
        try:
            reply("ok", call_id, await self._routes.answer(*request))
        except asyncio.CancelledError:
            reply("cancelled", call_id)
        except Exception as e:  # noqa: BLE001
            reply("error", call_id, None, error_fields(e, call_id))

    def _peek(self, keys: list[SegmentKey | None]) -> list[bool]:
        """Whether each image segment is cached now (no claim taken: the run plans for real)."""
        store = self._state.router.cache.store
        return [key is not None and store.get(key) is not None for key in keys]

    def _attached(self, attached: dict[str, AttachedSlots], block: str) -> AttachedSlots:
        """The connection's API process's block, attached at its first call that names it."""
        if block not in attached:
            attached[block] = AttachedSlots(block, self._input_shape)
        return attached[block]

    async def _run(self, call_id: int, items: list[IntakeItem], arrival_ns: int, prepared_ids: list[int],
                   reply) -> None:  # noqa: ANN001
        try:
            outcomes = await self._intake.run(items, arrival_ns)
            reply("ok", call_id, [portable_of_item(outcome, item) for outcome, item in zip(outcomes, items)])
        except asyncio.CancelledError:
            reply("cancelled", call_id)
        except IntakeItemError as e:
            reply("error", call_id, e.item_index, error_fields(e.error, call_id))
        except Exception as e:  # noqa: BLE001 - every failure goes back as an answer
            reply("error", call_id, None, error_fields(e, call_id))
        finally:
            for content_id in prepared_ids:
                self._prepared.pop(content_id, None)

    def _answer_started(self, call_id: int, item: IntakeItem, prepared_ids: list[int], reply,  # noqa: ANN001
                        calls: dict[int, asyncio.Future], outcome: asyncio.Future) -> None:
        """``_run``'s answer for a call the intake started without a task (``RequestIntake.start_one``)."""
        calls.pop(call_id, None)
        for content_id in prepared_ids:
            self._prepared.pop(content_id, None)
        if outcome.cancelled():
            reply("cancelled", call_id)
        elif (error := outcome.exception()) is None:
            reply("ok", call_id, [portable_of_item(outcome.result(), item)])
        elif isinstance(error, ServerRefusalError) or not isinstance(error, Exception):
            reply("error", call_id, None, error_fields(error, call_id))  # type: ignore[arg-type]
        else:
            reply("error", call_id, 0, error_fields(error, call_id))  # the item's error, as run's IntakeItemError

    def _take_pixels(self, items: list[IntakeItem], block: AttachedSlots, slots: list[list[int | None]]) -> list[int]:
        """The slots' pixels copied out for the intake, by image; each slot is the API process's again at once.

        An image's cache key and facts are a single process's (its bytes, or
        for raw pixels left behind their key and length); only its decoding is done.
        """
        prepared_ids: list[int] = []
        for item, item_slots in zip(items, slots):
            for content, slot in zip(item.images, item_slots):
                if slot is not None:
                    self._prepared[id(content)] = block.take_out(slot)
                    prepared_ids.append(id(content))
        return prepared_ids


async def serve_engine(settings: Settings, socket_path: str) -> int:
    """Start the engine, answer calls until SIGTERM (then drain) or a compute fault (then exit non-zero)."""
    app = create_app(settings, traced_process=TracedProcess("engine"))
    app.state.engine_index = engine_index_from_environment()  # POST /v1/admin/faults/kill names it
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)  # the supervisor's, once the API processes have drained
    # Ctrl+C in a terminal signals the whole foreground process group: the supervisor gets it too and stops the
    # API processes before this engine, whose answers they wait for.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_code = 0
    async with app.router.lifespan_context(app):
        state: ServerState = app.state.mmserve
        engine = Engine(state, settings, app)
        server = await asyncio.start_unix_server(engine.handle_connection, path=socket_path)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 0.1)
            except asyncio.TimeoutError:
                pass
            if state.router.check_compute() is not None:
                logger.critical("engine exiting with status %d: %s", EXIT_COMPUTE_FAULT, state.router.fault.message)
                exit_code = EXIT_COMPUTE_FAULT
                break
        server.close()
    return exit_code


def main() -> int:
    """Serve until stopped; a setting this machine cannot meet ends the engine with one line for the supervisor
    (``server.workers.start_failure``): ``plan_device`` before any weight is read, the rest (``--runtime``)
    while the model loads."""
    import os

    settings = settings_from_environment()
    index = engine_index_from_environment()
    configure_logging(settings.log_level, f"%(asctime)s %(levelname)s engine-{index} %(name)s: %(message)s",
                      turn_buffered=False)
    run_directory = os.environ[RUN_DIRECTORY_VARIABLE]  # the supervisor's to remove, unless it was killed
    exit_when_orphaned(parent_pid=supervisor_pid(),
                       on_orphaned=lambda: shutil.rmtree(run_directory, ignore_errors=True))
    try:
        plan_device(settings)  # --device, --dtype, --decode-device against this machine, as one process checks them
        # The loop an API process's uvicorn runs (uvloop where installed): its socket reads and writes are the
        # engine's per-request work besides the batch.
        with asyncio.Runner(loop_factory=_event_loop_factory()) as runner:
            return runner.run(serve_engine(settings, os.environ[ENGINE_SOCKET_VARIABLE]))
    except (*CONFIGURATION_ERRORS, StartupError) as e:
        if settings.log_level == "debug":
            logger.exception("engine %d: a setting this machine cannot meet", index)
        write_start_failure(run_directory, engine_name(index), str(e))
        return EXIT_CONFIGURATION_ERROR


def _event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


if __name__ == "__main__":
    sys.exit(main())
