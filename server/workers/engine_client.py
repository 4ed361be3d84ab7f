"""The API process's way to the engine: the intake's ``run`` and the router's state, over one connection.

``EngineClient.run(items, arrival_ns)`` stands where the single-process
server calls ``RequestIntake.run``, and answers the same way (outcomes in
order, or the error the intake would raise), so the request layer and every
protocol above it are unchanged:

    tokenize    every item's text, fit to the joint-token budget (router.item_text),
                here: the engine tokenizes nothing
    peek        ask the engine which images' segments it holds (no claim)
    decode      only the others, in this process's decode pool, to the model's
                (S, S, 3) uint8 input (the drill, peek and decode: server.workers.missing_images)
    run         the decoded images written into shared-memory slots, and the items
                (token ids, slot numbers; an image decoded here goes as its cache key,
                length and header, one the engine holds as its bytes) -> the engine's intake
    settle      the engine frees each slot as it copies the pixels out, when the
                call arrives (``server.workers.pixel_slots``); a cancelled call
                (the client went away) is cancelled in the engine too

The ``decode`` stage of an answer (``timings_ms``, its span, the monitor's
record) is this process's preparing (the drill, the peek, the decode) plus the
engine's (tokenize, plan, the pixels taken from their slots), and starts here.

Fault drills: the engine holds them (the admin routes are answered there) and
runs the compute stages they delay; this process keeps a copy (``faults``,
pushed by the engine at every change) because ``decode`` runs here: a
``decode`` drill delays each item here, in the decode pool before its images
are decoded, as one process delays an item's preparing, and the engine's
intake runs none, so no request is delayed twice.

Tracing: the items carry their request span's ids to the engine's batches;
each outcome brings its batch (``BatchTrace``) back, and a kept request's
batches go back to the engine (``send_batch_spans``), which exports them once.

Before any of this, ``describe_engine`` asks the engine (on a connection of
its own) for what the API process builds its side from: the model's facts
and its tokenizer's files. An API process loads no model.

``EngineRouter`` (``server.workers.engine_router``) is what the routes and the
drain read from ``state.router``: ready, alive, draining, in flight, a fault
(the engine is gone: the API process exits, and the supervisor with it).

``/v1/classify`` and ``/v1/rank`` prepare their own call
(``server.workers.zero_shot_client``) with the same two steps: images into
pixels (``decode_pixels``: the drill, the peek, the decode), then slots and one
call (``put_pixels``, ``call_with_slots``), both inside a ``CallInFlight``.

Refusals are the single process's, item for item: that intake prepares every
item at once and answers with the first refused one by index, each item's
text checked before its images are decoded. So an item over a limit is
refused here, with no round trip when it is the first item; only the images
of the items before it are still peeked and decoded, since one of those could
be refused first. What an outcome says of preparing counts this process's
part too: ``decode_ns`` (the ``decode`` stage of ``/metrics`` and
``timings_ms``) is the time spent here (tokenize, peek, decode) plus the
engine's planning, as one process counts its tokenize, plan and decode.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING

import numpy as np

from monitoring.inputs import RequestInputs
from models.loading.config import PreprocessConfig
from models.served_facts import ServedModelFacts
from models.tokenizer_files import TokenizerFiles
from router.errors import IntakeItemError, ShuttingDownError
from router.faults import FaultInjector
from router.inline_decode import INLINE_IMAGE_MAX_PIXELS
from router.intake import ImageDecoder, IntakeItem, IntakeOutcome
from router.item_facts import ItemFacts
from router.item_text import ItemTextFitter
from router.joint_budget import JointTokens
from router.segments import SegmentCatalog, SegmentKey
from router.tracing import BatchTrace
from server.errors import ApiError
from server.workers.engine_connection import EngineConnection, clear_engine_cache
from server.workers.engine_connection import describe_engine as describe_connection
from server.workers.engine_dispatch import EngineDispatch, NoEngineServing
from server.workers.engine_routes import FAULTS_PATH, forwarded_targets, is_fault_list, merged_fault_lists
from server.workers.missing_images import MissingImages
from server.workers.pixel_slots import PixelSlots
from server.workers.raw_pixels_sent import raw_pixels_left_behind

if TYPE_CHECKING:
    from models.tokenizer import TokenizedText

logger = logging.getLogger(__name__)

async def describe_engine(socket_paths: Sequence[str] | str,
                          timeout_s: float) -> tuple[ServedModelFacts, TokenizerFiles]:
    """The engines' model as an API process needs it: its facts and its tokenizer's files (one short connection).

    Everything an API process knows of the model comes from here: it loads no
    weights, so its answers' ``model`` object, its cache keys' fingerprint and
    preprocessing, its protocols' shapes and its tokenizer are the engine's.
    Every engine loads the same model, so the first that answers is asked: an
    API process started again while one engine is away is not kept waiting.
    """
    paths = [socket_paths] if isinstance(socket_paths, str) else list(socket_paths)
    deadline = time.monotonic() + timeout_s
    while True:
        for path in paths:
            try:
                kind, _, *fields = await describe_connection(path, 0.0)
                break
            except (OSError, asyncio.IncompleteReadError):
                continue  # not listening yet (loading, or starting again)
        else:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no engine answered within {timeout_s:g} s ({', '.join(paths)})")
            await asyncio.sleep(0.05)
            continue
        break
    answer = fields[0] if kind == "ok" and len(fields) == 1 else None
    if not (type(answer) is tuple and len(answer) == 2 and isinstance(answer[0], ServedModelFacts)
            and isinstance(answer[1], TokenizerFiles)):
        raise RuntimeError(f"the engine answered describe with {kind!r}, not the model's facts and tokenizer")
    return answer


class EngineClient:
    """This API process's way to the engines: one connection each, every request sent whole to one of them.

    Engine 0 also holds the one monitor (records go there) and exports the
    batch spans of kept traces (each batch once, whichever engine ran it:
    its ids are its own). The drills this process copies are engine 0's
    (a drill change through the admin route is made on every engine).
    """

    def __init__(self, socket_paths: Sequence[str], catalog: SegmentCatalog, preprocess: PreprocessConfig,
                 decode_image: ImageDecoder, executor: Executor, slots: PixelSlots, texts: ItemTextFitter,
                 faults: FaultInjector | None = None, is_image_cache_on: bool = True,
                 inline_image_max_pixels: int = INLINE_IMAGE_MAX_PIXELS, is_text_cache_on: bool = True,
                 wait_bound_s: float = 0.05, dispatch_mode: str = "affinity") -> None:
        if isinstance(socket_paths, str):
            socket_paths = [socket_paths]
        self._texts = texts
        self._faults = faults  # a copy of the engine's drills, kept by the engine's pushes
        self._catalog = catalog  # keys only: the cache is the engine's
        self._images = MissingImages(catalog, preprocess, decode_image, executor, faults, is_image_cache_on,
                                     inline_image_max_pixels)
        self._is_text_cache_on = is_text_cache_on
        self._slots = slots
        self.engines = [EngineConnection(index, path, faults.adopt if faults is not None and index == 0 else None)
                        for index, path in enumerate(socket_paths)]
        self._dispatch = EngineDispatch(self.engines, wait_bound_s, dispatch_mode)
        self.is_draining = False
        self.num_in_flight = 0
        self._connecting: set[asyncio.Future] = set()

    @property
    def engine_status(self) -> tuple[bool, bool, bool]:
        """ready (at least one engine serves), alive (always: a dead engine is started again), draining."""
        return any(engine.is_serving for engine in self.engines), True, False

    @property
    def fault(self) -> None:
        """Never set: an engine that dies is started again (``server.workers.supervisor``)."""
        return None

    @property
    def on_status(self) -> Callable[[], None] | None:
        return self.engines[0].on_status

    @on_status.setter
    def on_status(self, callback: Callable[[], None] | None) -> None:
        for engine in self.engines:
            engine.on_status = callback

    async def connect(self, timeout_s: float) -> None:
        """Connect to every engine; return once one is connected (each may still be loading its model), the
        others connecting as they come (``EngineConnection.connect``), so one engine away holds nothing up."""
        pending = {asyncio.ensure_future(engine.connect(timeout_s)) for engine in self.engines}
        while pending and not any(engine.is_connected for engine in self.engines):
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        self._connecting = pending  # held until done: the loop keeps only weak references to tasks

    async def close(self) -> None:
        for task in self._connecting:
            task.cancel()
        for engine in self.engines:
            await engine.close()

    def choose(self, key: bytes | None, lane: str) -> EngineConnection:
        """The engine for a request whose first cacheable segment is ``key`` (``server.workers.engine_dispatch``)."""
        try:
            return self._dispatch.choose(key, lane)  # type: ignore[return-value]
        except NoEngineServing:
            raise ApiError(503, "engine_unavailable", "no engine is serving (each one is starting again)",
                           retry_after_s=1.0) from None

    def send_batch_spans(self, batches: Sequence[BatchTrace]) -> None:
        """Ask engine 0 to export these batches' spans (each once, whichever process asks first); no answer."""
        self.engines[0].write("batch_spans", list(batches))

    def send_record(self, route: str, stage_ns: Mapping[str, int], batch_size: int | None, cache_hit: bool | None,
                    inputs: RequestInputs | None) -> None:
        """One answered request's latency record, for the monitor in engine 0 (``server.workers.engine_monitor``);
        its inputs go as their code (``monitoring.inputs.inputs_of_code``), the serving engine among them."""
        self.engines[0].write("record", route, dict(stage_ns), batch_size, cache_hit,
                              None if inputs is None else inputs.code)

    async def answer_in_engine(self, method: str, path: str, headers: list, body: bytes,
                               client: tuple) -> tuple[int, list, bytes]:
        """A whole HTTP request answered by the engines' app (``server.workers.engine_routes``): the monitor's
        routes by engine 0, a drill change by every engine (or the one ``?engine=N`` names), engine 0's answer;
        an answer listing the drills in force lists every engine's (``merged_fault_lists``)."""
        targets = forwarded_targets(method, path, len(self.engines))
        gone = [index for index in targets if self.engines[index].fault is not None]
        if gone and not (method == "GET" and is_fault_list(path) and len(gone) < len(targets)):  # a list: those up
            raise ApiError(503, "engine_unavailable", f"engine {gone[0]} is not serving (it is starting again)",
                           retry_after_s=1.0)  # a change must reach each engine; the monitor is engine 0's
        targets = [index for index in targets if index not in gone]  # one starting again holds no drills
        answers = await asyncio.gather(*(self.engines[index].send("http", method, path, headers, body, client)[1]
                                         for index in targets))
        if is_fault_list(path):  # the drills of every engine, not only of those this request went to
            others = [index for index, engine in enumerate(self.engines)
                      if index not in targets and engine.fault is None]  # one starting again holds no drills
            answers += await asyncio.gather(*(self.engines[index].send("http", "GET", FAULTS_PATH, [], b"",
                                                                       client)[1] for index in others))
        for kind, fields in answers:
            if kind != "ok":
                _, (status, code, message, field, retry_after_s) = fields
                raise ApiError(status, code, message, field, retry_after_s)
        if is_fault_list(path):
            return merged_fault_lists([fields[0] for _, fields in answers])
        return answers[0][1][0]

    def clear_caches(self) -> int:
        """``DELETE /v1/cache``: every engine's cache emptied; the entries removed, summed."""
        return sum(clear_engine_cache(engine.socket_path) for engine in self.engines if engine.fault is None)

    # -- the intake's run --------------------------------------------------------

    async def run(self, items: Sequence[IntakeItem], arrival_ns: int) -> list:
        """What ``RequestIntake.run`` answers, computed by the engine; raises what it would raise."""
        with CallInFlight(self) as call:
            await self._images.drill(items)
            fitted = await self._texts.fit_all(items)
            refused = next((index for index, item in enumerate(fitted) if isinstance(item, Exception)), None)
            to_decode = items if refused is None else items[:refused]
            keys = self._images.keys(to_decode)
            engine = self.choose(self._dispatch_key(items, fitted, keys), _lane_of(items[0]))
            pixels = await self._images.decode(to_decode, functools.partial(self._peek, engine), keys)
            if refused is not None:  # no earlier item's image was refused first
                raise IntakeItemError(refused, fitted[refused]) from fitted[refused]  # type: ignore[arg-type]
            # What was decoded here goes as its key, length and header (server.workers.raw_pixels_sent).
            fitted = raw_pixels_left_behind(fitted, pixels, self._catalog, keys)  # type: ignore[arg-type]
            slots = self.put_pixels(pixels)
            kind, fields = await call.send(engine, slots, "run", fitted, arrival_ns, self._slots.name, slots)
        if kind == "ok":  # the ids this process sent, the joint count and the facts are not sent back
            return [call.counted(outcome, fit.tokens, *self._derived(outcome, item, fit))  # (portable_of_item)
                    for outcome, item, fit in zip(fields[0], items, fitted)]
        row, (status, code, message, field, retry_after_s) = fields
        error = ApiError(status, code, message, field, retry_after_s)
        raise IntakeItemError(row, error) if row is not None else error

    def _dispatch_key(self, items: Sequence[IntakeItem], fitted: Sequence[object],
                      keys: Sequence[Sequence[SegmentKey | None]]) -> bytes | None:
        """The first cacheable segment's key: the first image's, else (text only) the first text's; ``None``
        when the request asks no cache (``server.workers.engine_dispatch``)."""
        for item_keys in keys:
            for key in item_keys:
                if key is not None:
                    return key.digest
        first = fitted[0] if fitted else None
        if (isinstance(first, IntakeItem) and first.tokens is not None and first.use_cache and not first.images
                and self._is_text_cache_on):
            return self._catalog.text_key(first.tokens.token_ids).digest
        return None

    def _derived(self, outcome: IntakeOutcome, item: IntakeItem,
                 fitted: IntakeItem) -> tuple[JointTokens, ItemFacts] | tuple[()]:
        """The joint count and facts the engine left out of ``outcome`` (none if it sent them), derived here as the
        engine's intake derives them: the facts of the item the client sent, with the text as it ran."""
        if outcome.facts is not None:
            return ()
        joint = self._texts.joint_of(fitted)
        return joint, ItemFacts.sent(item).with_text(fitted.tokens, joint)

    @property
    def slots_name(self) -> str:
        """The shared-memory block of this process's pixel slots (the engine attaches it by name)."""
        return self._slots.name

    async def decode_pixels(self, items: Sequence[IntakeItem],
                            engine: EngineConnection) -> list[list[np.ndarray | None]]:
        """A ``decode`` drill's delay, then every image the engine does not hold decoded to the model's input.

        Per item and image: the pixels, or ``None`` (the engine holds the
        image). Nothing is in a pixel slot yet: ``put_pixels`` writes them when
        the call is sent, so a call that ends before holds no slot.
        """
        await self._images.drill(items)
        return await self._images.decode(items, functools.partial(self._peek, engine))

    @staticmethod
    async def _peek(engine: EngineConnection, keys: list) -> object:
        return await engine.call("peek", keys)

    def put_pixels(self, pixels: Sequence[Sequence[np.ndarray | None]]) -> list[list[int | None]]:
        """Each decoded image written into a pixel slot, held until the engine copies it out; the slot numbers.

        Call it right before the call that names the slots (``call_with_slots``),
        on the loop's thread with no await between. 503 ``overloaded`` when too
        few slots are free (``server.workers.pixel_slots``).
        """
        images = [image for item_pixels in pixels for image in item_pixels if image is not None]
        numbers = iter(self._slots.put(images) if images else ())
        return [[next(numbers) if image is not None else None for image in item_pixels] for item_pixels in pixels]

    async def call_with_slots(self, engine: EngineConnection, slots: Sequence[Sequence[int | None]],
                              *message: object) -> tuple[str, list]:
        """Send ``message``, which names ``slots`` (``put_pixels``), and await the engine's ``ok`` or ``error``.

        The engine frees the slots as it copies the pixels out, when the call
        arrives, whatever happens to the call after; a call that cannot be sent
        gives them back here, and so does a call whose engine died before
        copying them (still in its socket). A caller cancelled meanwhile (its
        client went away) cancels the call in the engine.
        """
        taken = [slot for item_slots in slots for slot in item_slots if slot is not None]
        try:
            call_id, future = engine.send(*message)
        except BaseException:
            self._slots.give_back(taken)
            raise
        engine.num_in_flight += 1
        try:
            kind, fields = await asyncio.shield(future)
        except asyncio.CancelledError:
            engine.cancel(call_id)  # the engine answers "cancelled" to the call itself
            raise
        except ApiError:  # the engine died with the call unanswered (EngineConnection._gone)
            self._slots.give_back_uncopied(taken)
            raise
        finally:
            engine.num_in_flight -= 1
        if kind == "cancelled":
            raise asyncio.CancelledError()
        return kind, fields


class CallInFlight:
    """One call to the engine, from its first preparing step to its answer (a ``with`` block): refused while
    draining, counted in flight, and its preparing here timed (this process's part of ``decode``)."""

    __slots__ = ("_client", "started_ns", "prepare_ns", "engine")

    def __init__(self, client: EngineClient) -> None:
        self._client = client
        self.started_ns = 0
        self.prepare_ns = 0
        self.engine = 0  # the engine the call went to

    def __enter__(self) -> CallInFlight:
        if self._client.is_draining:
            raise ShuttingDownError("the server is shutting down")
        self._client.num_in_flight += 1
        self.started_ns = time.perf_counter_ns()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._client.num_in_flight -= 1

    async def send(self, engine: EngineConnection, slots: Sequence[Sequence[int | None]],
                   *message: object) -> tuple[str, list]:
        """The call, once everything is prepared: the engine's ``ok`` or ``error`` (``call_with_slots``)."""
        self.prepare_ns = time.perf_counter_ns() - self.started_ns
        self.engine = engine.index
        return await self._client.call_with_slots(engine, slots, *message)

    def counted(self, outcome: IntakeOutcome, sent_tokens: TokenizedText | None = None,
                joint: JointTokens | None = None, facts: ItemFacts | None = None) -> IntakeOutcome:
        """The engine's outcome with this process's preparing counted in, from its start (one process's ``decode``),
        and what the engine leaves out put back: the token ids this process sent for its item, and the joint
        count and facts derived here (``EngineClient._derived``)."""
        text = sent_tokens if outcome.text is None else outcome.text
        facts = outcome.facts if facts is None else facts
        return dataclasses.replace(outcome, decode_ns=self.prepare_ns + outcome.decode_ns,
                                   decode_started_ns=self.started_ns, text=text,
                                   joint=outcome.joint if joint is None else joint, engine=self.engine,
                                   facts=facts if facts is None else dataclasses.replace(facts, engine=self.engine))


def _lane_of(item: IntakeItem) -> str:
    """The lane whose wait dispatch compares (``router.Router.estimated_waits_s``), by what the item carries."""
    if not item.images:
        return "text"
    return "vision" if item.text is None and item.tokens is None else "fusion"
