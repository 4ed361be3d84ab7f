"""The intake: one call from a parsed request to its result, whatever protocol it came by.

    intake.run(items, arrival_ns)              (intake.run_one(item, ...) for one; start_one(item, ...)
                                                starts one without a task where preparing it is a lookup:
                                                the engine behind API processes)

    per item, all at once:
      prepare      decode pool; on the event loop an item whose text is short or tokenized
                   (or absent) and whose images are small (router.inline_decode)
                   "decode" fault drill -> tokenize (unless the item brings
                   its tokens) -> joint-token budget (router.item_text,
                   router.joint_budget) -> plan the segments against the cache
                   -> decode + resize only the images the plan needs
                   (--decode-device cuda: its JPEGs wait, then go to the device
                   with every other item's in one batch; what that leaves, CPU)
      ── every item prepared? ── one refused: none is submitted, all give their claims back
      resolve      await segments other requests compute; one whose owner gave
                   up is looked up again (and its image decoded, if it is now ours)
      submit       the router queues, batches, computes and publishes
      settle       finally: ``plan.abandon()``, a no-op for what was published or failed

The plan is made here and settled here, so the rule "every plan ends in
publish, fail or abandon" has one keeper: a bad image, a passed deadline, a
client that went away (the task is cancelled), a draining server or a model
that raised all leave through the same ``finally``. A plan made in a pool
thread for a caller that was cancelled meanwhile is abandoned when the thread
hands it over. Preparing one item (tokenize, plan, decode; on the loop or in
the pool; the device round) is ``router.item_prepare``'s; the call around it
(the gate, ``router.intake_gate``; resolve, submit, settle) is this module's.

The intake is handed its tools when it is built (``IntakeTools``: the
model's tokenizer, the joint-token budget, the preprocessing settings) and
reaches through nothing for them; the router it holds plans against the cache
and runs the requests. Each item's facts (``router.item_facts``: image
encodings and sizes from the headers, counts, tokens, protocol, priority) are
computed here once and come back with its outcome, for spans and drift
attribution alike.

The server passes in what belongs to it: the image decoder (bytes -> an RGB
Pillow image or an (H, W, 3) uint8 array; whatever it raises for a bad image
reaches the caller unchanged) and the thread pool decoding runs in, sized by
its settings (``router.decode_pool``; whatever ``submit`` raises reaches the
caller too, e.g. ``DecodeQueueFullError``). With ``--decode-device cuda`` it
passes a device JPEG decoder too (``models.jpeg_decode``): then the JPEGs a
plan needs skip the CPU decoder and go, for all items of the call together,
to the device in one batch (``router.device_decode_round``); what that
decoder leaves (other formats, rotated or refused JPEGs) is decoded on the
CPU as before, per image. Everything else the intake
raises is typed: a model's ``TextTooLongError``, the router's errors
(``TooManyImagesError``, ``JointTokensExceededError``), ``ImageItemError``
naming the bad image of a request that sent a list of images, and
``IntakeItemError`` naming the failed item of a many-item call.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from models.loading.config import PreprocessConfig
from models.torch_free.text_ids import LimitedTokenizer, TokenizedText
from router.device_decode_round import DeviceDecodeRound
from router.errors import IntakeItemError, ServerRefusalError
from router.intake_gate import AllPrepared, NeighbourRefusedError
from router.faults import FaultInjector
from router.inline_decode import INLINE_IMAGE_MAX_PIXELS, decodes_inline
from router.item_facts import ItemFacts
from router.item_prepare import ItemPreparer, PreparedItem
from router.item_text import INLINE_TEXT_MAX_CHARS
from router.joint_budget import JointTokenBudget, JointTokens
from router.request import InferenceRequest, InferenceResult, Priority
from router.segments import ImageContent, SegmentPlan
from router.tracing import SpanIds

if TYPE_CHECKING:
    from models.jpeg_decode import DeviceJpegDecoder
    from models.loading.repository import ModelBundle
    from router.router import Router

ImageDecoder = Callable[[bytes], "Image.Image | np.ndarray"]
"""Encoded image bytes -> an RGB Pillow image or (H, W, 3) uint8 pixels; raises on a bad image."""


@dataclass(frozen=True)
class IntakeItem:
    """One item as the client sent it, checked for shape and size by the server, not yet decoded.

    Raw pixels in ``image`` must already match their shape (the server checks
    that while it parses, with the pixel limit). ``tokens`` is set where the
    text was already tokenized and fit to the joint-token budget (an API
    process did it: ``router.item_text``); the text may then be left out, and
    the intake tokenizes nothing.
    """

    request_id: str
    text: str | None = None
    images: tuple[ImageContent, ...] = ()
    priority: Priority = Priority.NORMAL
    timeout_ms: int | None = None  # None: the lane's default, counted from arrival
    truncate: bool = False
    use_cache: bool = True
    images_as_list: bool = False  # sent as a list: a bad image's error names its index
    trace: SpanIds | None = None  # the server span it belongs to, while tracing is on (router.tracing)
    protocol: str = "native"  # what it came by: a label of its facts (drift attribution)
    tokens: TokenizedText | None = None  # the text as it will run, when tokenized before the intake


@dataclass(frozen=True)
class IntakeTools:
    """What preparing an item needs besides the router, handed to the intake when it is built.

    Attributes:
        tokenizer: The served model's tokenizer.
        budget: Images per request and joint tokens (the router's batches are sized by the same one).
        preprocess: How an image becomes the model's (S, S, 3) uint8 input.
    """

    tokenizer: LimitedTokenizer
    budget: JointTokenBudget
    preprocess: PreprocessConfig

    @classmethod
    def of(cls, bundle: ModelBundle, budget: JointTokenBudget) -> IntakeTools:
        """The tools of a loaded model, with the budget its router was built with."""
        return cls(bundle.tokenizer, budget, bundle.config.preprocess)


@dataclass(frozen=True)
class IntakeOutcome:
    """One item's result, its tokens, its joint-token count, its settled plan and how long preparing it took.

    ``facts`` and ``cache`` are plain values: whoever reads them after the
    answer (spans, the monitor, the answer's ``cache`` field) calls nothing
    back in the router.
    """

    result: InferenceResult
    text: TokenizedText | None
    plan: SegmentPlan
    decode_ns: int  # tokenize + plan + decode, pool queue included
    joint: JointTokens | None = None
    decode_started_ns: int = 0  # when preparing began (the clock's value): where the decode stage starts
    facts: ItemFacts | None = None  # what is known about the item (router.item_facts)
    cache: dict[str, str | list[str]] | None = None  # per-segment cache status, as the answer shows it
    engine: int = 0  # which engine computed it (several engines: server.workers.engine_dispatch)


def _failed(loop: asyncio.AbstractEventLoop, error: BaseException) -> asyncio.Future:
    future = loop.create_future()
    future.set_exception(error)
    return future


def _cancel_with(result: asyncio.Future, outcome: asyncio.Future) -> None:
    """``start_one``'s outcome cancelled by its caller: the queued item is cancelled too."""
    if outcome.cancelled():
        result.cancel()


class RequestIntake:
    """Tokenize, plan, decode the misses, submit, settle: the router's one entry for requests.

    Args:
        router: Plans against its cache and runs the requests.
        tools: The tokenizer, the joint-token budget and the preprocessing settings.
        decode_image: The server's image decoder; runs in ``executor``.
        executor: Where preparing runs (the server's bounded decode pool).
        faults: Fault drills; with one, every item goes through ``executor`` so
            a "decode" drill delays it.
        device_decoder: With one (``--decode-device cuda``), the JPEGs the
            plans of one call need are decoded on the device in one batch;
            what it leaves goes to ``decode_image``.
        inline_text_max_chars: A text this short is tokenized on the event
            loop: a pool hop costs more than tokenizing it.
        inline_image_max_pixels: Images this small (an item's, together) are
            decoded on the event loop, for the same reason
            (``router.inline_decode``); 0: every image goes to the pool.
        prepared_pixels: An image's (S, S, 3) model input when another process
            already decoded it (``server.workers``: an API process), else ``None``.
    """

    def __init__(self, router: Router, tools: IntakeTools, decode_image: ImageDecoder, executor: Executor, *,
                 faults: FaultInjector | None = None, inline_text_max_chars: int = INLINE_TEXT_MAX_CHARS,
                 inline_image_max_pixels: int = INLINE_IMAGE_MAX_PIXELS,
                 clock_ns: Callable[[], int] = time.perf_counter_ns,
                 device_decoder: DeviceJpegDecoder | None = None,
                 prepared_pixels: Callable[[ImageContent], np.ndarray | None] | None = None) -> None:
        self._router = router
        self._faults = faults
        self._device_decoder = device_decoder
        self._executor = executor
        self._inline_image_max_pixels = inline_image_max_pixels
        self._clock_ns = clock_ns
        self._preparer = ItemPreparer(router, tools.tokenizer, tools.budget, tools.preprocess, decode_image, executor,
                                      faults=faults, inline_text_max_chars=inline_text_max_chars,
                                      device_decoder=device_decoder, prepared_pixels=prepared_pixels)

    async def run_one(self, item: IntakeItem, arrival_ns: int) -> IntakeOutcome:
        """One item's result; raises what the item raised (no ``IntakeItemError`` wrapping)."""
        sent = ItemFacts.sent(item)
        return await self._run_item(item, sent, arrival_ns, AllPrepared(1), self._device_round(1),
                                    self._images_decode_inline((item,), (sent,)))

    async def run(self, items: Sequence[IntakeItem], arrival_ns: int,
                  all_prepared: asyncio.Event | None = None) -> list[IntakeOutcome]:
        """Every item's result, in order; all items share ``arrival_ns`` (and so their deadline).

        Every item is prepared before any is submitted, so one bad item costs
        its neighbours no compute, and then all are submitted at once, so the
        batcher can batch them. Raises ``IntakeItemError`` for the first
        failed item (by index). ``all_prepared`` is set once every item is
        prepared, for work beside the call that must not compute for a call
        one of whose items is refused.
        """
        gate = AllPrepared(len(items), all_prepared)
        device_round = self._device_round(len(items))
        sents = [ItemFacts.sent(item) for item in items]
        images_inline = self._images_decode_inline(items, sents)
        if len(items) == 1:  # most requests: awaited in the caller's task, no task of its own to start
            try:
                return [await self._run_item(items[0], sents[0], arrival_ns, gate, device_round, images_inline)]
            except ServerRefusalError:
                raise
            except Exception as e:
                raise IntakeItemError(0, e) from e
        outcomes = await asyncio.gather(*(self._run_item(item, sent, arrival_ns, gate, device_round, images_inline)
                                          for item, sent in zip(items, sents)), return_exceptions=True)
        for item_index, outcome in enumerate(outcomes):
            if isinstance(outcome, NeighbourRefusedError):
                continue
            if isinstance(outcome, ServerRefusalError):
                raise outcome
            if isinstance(outcome, Exception):
                raise IntakeItemError(item_index, outcome) from outcome
            if isinstance(outcome, BaseException):
                raise outcome
        return outcomes  # type: ignore[return-value]  # every one is an IntakeOutcome here

    def _images_decode_inline(self, items: Sequence[IntakeItem], sents: Sequence[ItemFacts]) -> bool:
        """Whether the call's images, all of its items' together, are small enough to decode on the event loop
        (``router.inline_decode``); never with drills (a "decode" drill delays the pool) or a device decoder
        (its JPEGs wait for the call's device batch).

        Images another process already decoded (``prepared_pixels``: the engine behind API processes) count
        for nothing whatever their size: picking them up is a lookup, which a hop to the pool would only
        make dearer, on the one process every request passes. Sizes come from ``sents``, the items' facts
        (their headers, read once).
        """
        if self._faults is not None or self._device_decoder is not None:
            return False
        to_decode = [pixels for item, sent in zip(items, sents)
                     for content, pixels in zip(item.images, sent.image_pixels) if not self._preparer.is_prepared(content)]
        return not to_decode or decodes_inline(to_decode, self._inline_image_max_pixels)

    def _device_round(self, num_items: int) -> DeviceDecodeRound | None:
        if self._device_decoder is None:
            return None
        return DeviceDecodeRound(num_items, self._device_decoder, self._executor)

    def start_one(self, item: IntakeItem, arrival_ns: int) -> asyncio.Future[IntakeOutcome] | None:
        """``run_one`` started without a task of its own, where preparing the item is a lookup: the future
        of its outcome, or of the error ``run_one`` raises (cancel it to cancel the call). ``None``: the item
        needs the pool, a drill or a device round; ``run_one`` it.

        The engine behind API processes (``server.workers.engine_process``)
        gets items whose text is tokenized and whose images are decoded: the
        item is prepared and queued here at once and its outcome is built
        when the router answers, with no task to start and no coroutine to
        step through, on the one process every request passes. A plan that
        waits for segments another request computes goes on in a task, as in
        ``run_one``.
        """
        if self._faults is not None or self._device_decoder is not None:
            return None
        sent = ItemFacts.sent(item)
        if not self._preparer.is_inline(item, self._images_decode_inline((item,), (sent,))):
            return None
        loop = asyncio.get_running_loop()
        started_ns = self._clock_ns()
        try:
            prepared = self._preparer.prepare_now(item, sent.image_encoding)
        except Exception as e:  # noqa: BLE001 - the call's answer, as run_one raises it
            return _failed(loop, e)
        decode_ns = self._clock_ns() - started_ns
        plan = prepared.plan
        if plan.awaits_others:
            task = asyncio.ensure_future(self._finish(item, sent, prepared, arrival_ns, started_ns, decode_ns,
                                                      AllPrepared(1)))
            task.add_done_callback(lambda _: plan.abandon())  # cancelled before its first step: never settled
            return task
        try:
            request = self._request(item, prepared, prepared.images, plan, arrival_ns, sent.image_encoding)
            result = self._router.enqueue(request, plan)
        except Exception as e:  # noqa: BLE001
            plan.abandon()
            return _failed(loop, e)
        outcome = loop.create_future()
        result.add_done_callback(functools.partial(self._settle_started, outcome, item, sent, prepared, decode_ns,
                                                   started_ns))
        outcome.add_done_callback(functools.partial(_cancel_with, result))
        return outcome

    def _settle_started(self, outcome: asyncio.Future, item: IntakeItem, sent: ItemFacts, prepared: PreparedItem,
                        decode_ns: int, started_ns: int, result: asyncio.Future) -> None:
        """``start_one``'s call answered by the router: its plan settled, its outcome built (``_finish``'s end)."""
        plan = prepared.plan
        plan.abandon()
        if outcome.done():
            return  # cancelled by its caller
        if result.cancelled():
            outcome.cancel()
        elif (error := result.exception()) is not None:
            outcome.set_exception(error)
        else:
            outcome.set_result(self._outcome(item, sent, prepared, plan, result.result(), decode_ns, started_ns))

    async def _run_item(self, item: IntakeItem, sent: ItemFacts, arrival_ns: int, gate: AllPrepared,
                        device_round: DeviceDecodeRound | None, images_inline: bool) -> IntakeOutcome:
        started_ns = self._clock_ns()
        try:
            prepared = await self._preparer.prepare(item, sent.image_encoding, device_round, images_inline)
        except BaseException:
            gate.refuse()
            raise
        return await self._finish(item, sent, prepared, arrival_ns, started_ns, self._clock_ns() - started_ns, gate)

    async def _finish(self, item: IntakeItem, sent: ItemFacts, prepared: PreparedItem, arrival_ns: int,
                      started_ns: int, decode_ns: int, gate: AllPrepared) -> IntakeOutcome:
        """A prepared item: wait for its neighbours, resolve its plan, submit, settle."""
        plan = prepared.plan
        try:
            await gate.prepared()
            plan = await prepared.plan.resolved()
            images = list(prepared.images)
            for index in plan.image_indices_to_compute:
                if images[index] is None:  # an owner gave up and the claim is ours now
                    images[index] = await self._preparer.model_input_off_loop(item, index)
            request = self._request(item, prepared, tuple(images), plan, arrival_ns, sent.image_encoding)
            result = await self._router.submit(request, plan)
        finally:
            plan.abandon()  # settles whatever is still open; publish and fail already settled the rest
        return self._outcome(item, sent, prepared, plan, result, decode_ns, started_ns)

    @staticmethod
    def _outcome(item: IntakeItem, sent: ItemFacts, prepared: PreparedItem, plan: SegmentPlan,
                 result: InferenceResult, decode_ns: int, started_ns: int) -> IntakeOutcome:
        return IntakeOutcome(result, prepared.text, plan, decode_ns, prepared.joint, started_ns,
                             facts=sent.with_text(prepared.text, prepared.joint),
                             cache=plan.statuses(images_as_list=item.images_as_list))

    @staticmethod
    def _request(item: IntakeItem, prepared: PreparedItem, images: tuple[np.ndarray | None, ...],
                 plan: SegmentPlan, arrival_ns: int, image_encoding: str | None) -> InferenceRequest:
        tokens = prepared.text
        return InferenceRequest(
            request_id=item.request_id,
            token_ids=tokens.token_ids if tokens is not None else None,
            images=images,
            deadline_ns=None if item.timeout_ms is None else arrival_ns + item.timeout_ms * 1_000_000,
            arrival_ns=arrival_ns,
            priority=item.priority,
            image_segments=plan.image_values,
            text_segment=plan.text_value,
            trace=item.trace,
            image_encoding=image_encoding,
        )
