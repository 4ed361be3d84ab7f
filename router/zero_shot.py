"""Zero-shot classification and ranking: many texts against a few images, each text a cached segment.

    texts  ──pool──> tokenize, plan each distinct token sequence against the cache
              hit        the embedding is known: nothing runs
              coalesced  another request computes it: await it
              miss       a text-only request in the text lane (batched with whatever else is in flight),
                         at most ``window`` of this call's queued at once, published to the cache
    images ──intake.run──> one vision item each (the image cache and decode pool as for /v1/infer)
    scores ──pool──> one matrix product (``models.zero_shot``)

``tokenize_texts`` is the first step on its own, for a process in front of
the one with the model (``server.workers``): it tokenizes and keys the texts
where they arrive, and ``encode_tokenized`` takes it from there.

So a label set that many requests share is encoded once, and a request
whose labels are all cached costs its image encode and one matrix product.
Every plan this module makes is settled here (``finally``: abandon what is
still open), as ``router.intake`` does for its own: a refused label, a
passed deadline or a client that left never strands a waiter.

A text that appears twice in one call (the same token ids) is planned once:
its second slot would otherwise wait on the first's claim, which only this
call can resolve. Errors are typed: ``IntakeItemError`` names the failed text
or image by its index in the call; the router's errors (full lane, deadline)
come through as they are for the whole call.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, TYPE_CHECKING, TypeVar

import numpy as np

from cache import SegmentKey
from models.torch_free.text_ids import LimitedTokenizer, TokenizedText
from router.errors import IntakeItemError, ServerRefusalError
from router.intake import IntakeItem, IntakeOutcome, RequestIntake
from router.request import InferenceRequest, Priority, Route
from router.segments import ImageContent, SegmentCatalog, SegmentPlan, SlotStatus
from router.tracing import SpanIds

if TYPE_CHECKING:
    from models.multimodal import ImageSegment, TextSegment
    from router.router import Router

T = TypeVar("T")

# Texts whose tokens are remembered: ten label sets of the largest size by default, a few MiB.
MAX_MEMOIZED_TEXTS = 16_384


@dataclass(frozen=True)
class ZeroShotOptions:
    """What every item of one call shares: its id, priority, deadline, cache use and trace."""

    request_id: str
    priority: Priority = Priority.NORMAL
    timeout_ms: int | None = None  # None: each lane's default, counted from arrival
    truncate: bool = False
    use_cache: bool = True
    trace: SpanIds | None = None

    def deadline_ns(self, arrival_ns: int) -> int | None:
        return None if self.timeout_ms is None else arrival_ns + self.timeout_ms * 1_000_000


@dataclass(frozen=True)
class EncodedTexts:
    """Every text's segment (on the model's device) and tokens, in the call's order, and what the cache did."""

    segments: tuple[TextSegment, ...]
    tokens: tuple[TokenizedText, ...]
    statuses: tuple[SlotStatus, ...]  # per distinct text, as first planned
    prepare_ns: int  # tokenize + plan, pool queue included
    text_ns: int  # from submitting the first miss to the last one's answer; 0 when none was encoded

    def status_counts(self) -> dict[str, int]:
        """How many distinct texts were cache hits, misses, coalesced or bypassed."""
        counts = {status.value: 0 for status in SlotStatus}
        for status in self.statuses:
            counts[status.value] += 1
        return counts


@dataclass(frozen=True)
class EncodedImages:
    """Every image's segment (on the model's device), in the call's order, with its intake outcome."""

    segments: tuple[ImageSegment, ...]
    outcomes: tuple[IntakeOutcome, ...]


@dataclass
class _PlannedTexts:
    tokens: tuple[TokenizedText, ...]
    distinct_of: tuple[int, ...]  # text i -> its distinct token sequence
    plans: list[SegmentPlan]  # one per distinct token sequence
    first_text: tuple[int, ...]  # distinct j -> the first text with its tokens (errors name it)
    newer_plans: list[SegmentPlan] = field(default_factory=list)  # resolved plans, settled with the rest

    def abandon(self) -> None:
        for plan in (*self.plans, *self.newer_plans):
            plan.abandon()


class TokenMemo:
    """The tokens and segment key of recently seen texts, least recently used first out; thread-safe.

    A label set is sent again and again, and tokenizing and hashing a
    thousand labels costs more than encoding one image, so a warm request
    looks its labels up here instead. Keyed by the text and whether it may
    be cut; one memo serves one model (the key carries its fingerprint).
    """

    def __init__(self, max_entries: int) -> None:
        self._max_entries = max_entries
        self._entries: OrderedDict[tuple[str, bool], tuple[TokenizedText, SegmentKey]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, text: str, truncate: bool) -> tuple[TokenizedText, SegmentKey] | None:
        with self._lock:
            found = self._entries.get((text, truncate))
            if found is not None:
                self._entries.move_to_end((text, truncate))
            return found

    def put(self, text: str, truncate: bool, tokens: tuple[TokenizedText, SegmentKey]) -> None:
        with self._lock:
            self._entries[(text, truncate)] = tokens
            self._entries.move_to_end((text, truncate))
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)


@dataclass(frozen=True)
class TokenizedTexts:
    """A call's texts as token ids and their segment keys, in the call's order (``tokenize_texts``)."""

    tokens: tuple[TokenizedText, ...]
    keys: tuple[SegmentKey, ...]


def tokenize_texts(tokenizer: LimitedTokenizer, catalog: SegmentCatalog, memo: TokenMemo, texts: Sequence[str],
                   truncate: bool) -> TokenizedTexts:
    """Every text's tokens and key, remembered in ``memo``; ``IntakeItemError`` names a text that is refused.

    Runs where the texts arrive: in the process with the model, or in an API
    process (``server.workers``), whose catalog makes keys only.
    """
    tokens, keys = [], []
    for index, text in enumerate(texts):
        memoized = memo.get(text, truncate)
        if memoized is None:
            try:
                tokenized = tokenizer.encode(text, truncate=truncate)
            except Exception as e:
                raise IntakeItemError(index, e) from e
            memoized = (tokenized, catalog.text_key(tokenized.token_ids))
            memo.put(text, truncate, memoized)
        tokens.append(memoized[0])
        keys.append(memoized[1])
    return TokenizedTexts(tuple(tokens), tuple(keys))


def _abandon_landed_plans(future: Future) -> None:
    """Done-callback for a planning job whose caller was cancelled: nobody will submit its plans."""
    if not future.cancelled() and future.exception() is None:
        future.result().abandon()


class ZeroShotEncoder:
    """Texts and images of a zero-shot call to segments, through the cache and the lanes.

    Args:
        router: Plans against its cache and runs the text requests.
        intake: Encodes the images (decode, image cache, vision lane).
        executor: Where tokenizing, planning and scoring run (the server's decode pool).
        window: Most of one call's texts queued in the text lane at once, so a
            thousand new labels do not fill the lane's queue on their own.
    """

    def __init__(self, router: Router, intake: RequestIntake, executor: Executor, *, window: int | None = None,
                 max_memoized_texts: int = MAX_MEMOIZED_TEXTS,
                 clock_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        self._router = router
        self.token_memo = TokenMemo(max_memoized_texts)
        self._intake = intake
        self._executor = executor
        text_lane = router.lanes[Route.TEXT].settings
        self._window = window if window is not None else max(1, min(text_lane.max_queue_size // 2,
                                                                    4 * text_lane.max_batch_size))
        self._clock_ns = clock_ns

    async def off_loop(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` in the executor (torch and tokenizing never run on the event loop)."""
        return await asyncio.wrap_future(self._executor.submit(work, *args))

    async def timed(self, work: Awaitable[T]) -> tuple[T, int]:
        """``work``'s result and how long it took (ns), on the clock of this call's other stages (the ``score``
        stage: wherever the call runs, one process or the engine, its stages are timed here)."""
        started_ns = self._clock_ns()
        value = await work
        return value, self._clock_ns() - started_ns

    # -- texts ------------------------------------------------------------------

    async def encode_texts(self, texts: Sequence[str], options: ZeroShotOptions, arrival_ns: int,
                           after: asyncio.Event | None = None) -> EncodedTexts:
        """Every text's segment: from the cache, from another request, or computed in the text lane.

        ``after``: computed only once it is set (the call's images all prepared, ``encode_images``), so a call
        refused for an image computes no text, as API processes, which decode first, never send one."""
        return await self._encode_planned(self._plan_texts, tuple(texts), options, arrival_ns, after)

    async def encode_tokenized(self, tokenized: TokenizedTexts, options: ZeroShotOptions,
                               arrival_ns: int, after: asyncio.Event | None = None) -> EncodedTexts:
        """``encode_texts`` for texts tokenized and keyed already (``tokenize_texts`` in an API process)."""
        return await self._encode_planned(self._plan_tokenized, tokenized, options, arrival_ns, after)

    async def _encode_planned(self, plan: Callable[[Any, ZeroShotOptions], _PlannedTexts], texts: Any,
                              options: ZeroShotOptions, arrival_ns: int,
                              after: asyncio.Event | None = None) -> EncodedTexts:
        started_ns = self._clock_ns()
        future = self._executor.submit(plan, texts, options)
        try:
            planned = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.add_done_callback(_abandon_landed_plans)
            raise
        prepare_ns = self._clock_ns() - started_ns
        statuses = tuple(plan.text.status for plan in planned.plans)
        distinct: list[TextSegment | None] = [plan.text_value for plan in planned.plans]  # hits now, the rest below
        first_submit_ns: list[int] = []
        try:
            window = asyncio.Semaphore(self._window)
            pending = [j for j, value in enumerate(distinct) if value is None]  # a warm call has none: no task
            if pending and after is not None:
                await after.wait()
            tasks = [asyncio.ensure_future(self._segment(planned, j, options, arrival_ns, window, first_submit_ns))
                     for j in pending]
            try:
                for j, segment in zip(pending, await asyncio.gather(*tasks)):
                    distinct[j] = segment
            except BaseException:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
        finally:
            planned.abandon()  # a no-op for what was published or failed
        text_ns = self._clock_ns() - first_submit_ns[0] if first_submit_ns else 0
        segments = tuple(distinct[j] for j in planned.distinct_of)  # type: ignore[misc]  # every one is set
        return EncodedTexts(segments, planned.tokens, statuses, prepare_ns, text_ns)

    def _plan_texts(self, texts: tuple[str, ...], options: ZeroShotOptions) -> _PlannedTexts:
        """Tokenize every text (or remember its tokens) and plan each distinct one once (a pool thread)."""
        tokenized = tokenize_texts(self._router.bundle.tokenizer, self._router.segments, self.token_memo, texts,
                                   options.truncate)
        return self._plan_tokenized(tokenized, options)

    def _plan_tokenized(self, tokenized: TokenizedTexts, options: ZeroShotOptions) -> _PlannedTexts:
        """Plan each distinct token sequence once, against the cache (a pool thread)."""
        keys = tokenized.keys
        distinct: dict[SegmentKey, int] = {}
        distinct_of, first_text = [], []
        for index, key in enumerate(keys):
            if key not in distinct:
                distinct[key] = len(first_text)
                first_text.append(index)
            distinct_of.append(distinct[key])
        plans = self._router.segments.plan_texts([keys[index] for index in first_text], options.use_cache)
        return _PlannedTexts(tokenized.tokens, tuple(distinct_of), plans, tuple(first_text))

    async def _segment(self, planned: _PlannedTexts, j: int, options: ZeroShotOptions, arrival_ns: int,
                       window: asyncio.Semaphore, first_submit_ns: list[int]) -> TextSegment:
        """Distinct text ``j``'s segment; a failure is an ``IntakeItemError`` naming the first text that has it."""
        index = planned.first_text[j]
        try:
            plan = await planned.plans[j].resolved()
            if plan is not planned.plans[j]:
                planned.newer_plans.append(plan)
            if plan.text_value is not None:
                return plan.text_value
            async with window:
                if not first_submit_ns:
                    first_submit_ns.append(self._clock_ns())
                request = InferenceRequest(
                    request_id=f"{options.request_id}-text-{index}",
                    token_ids=planned.tokens[index].token_ids,
                    deadline_ns=options.deadline_ns(arrival_ns),
                    arrival_ns=arrival_ns,
                    priority=options.priority,
                    trace=options.trace,
                )
                result = await self._router.submit(request, plan)
            assert result.text_segment is not None  # a text request always returns its segment
            return result.text_segment
        except (asyncio.CancelledError, ServerRefusalError):
            raise
        except Exception as e:
            raise IntakeItemError(index, e) from e

    # -- images -----------------------------------------------------------------

    async def encode_images(self, images: Sequence[ImageContent], options: ZeroShotOptions,
                            arrival_ns: int, all_prepared: asyncio.Event | None = None) -> EncodedImages:
        """Every image as its own vision item, all prepared before any is submitted (``RequestIntake.run``);
        ``all_prepared`` is set then.

        Raises ``IntakeItemError`` naming the failed image.
        """
        items = [IntakeItem(request_id=f"{options.request_id}-image-{index}", images=(content,),
                            priority=options.priority, timeout_ms=options.timeout_ms, use_cache=options.use_cache,
                            trace=options.trace)
                 for index, content in enumerate(images)]
        outcomes = await self._intake.run(items, arrival_ns, all_prepared)
        return EncodedImages(tuple(outcome.result.image_segments[0] for outcome in outcomes), tuple(outcomes))

    # -- a model whose only image-text score is its trained fusion head ----------------

    async def head_scores(self, images: Sequence[ImageContent], texts: Sequence[str | TokenizedText],
                          options: ZeroShotOptions, arrival_ns: int) -> np.ndarray:
        """(N, L) float64: the trained fusion head's ``match_score`` of image i with text j, every pair fused.

        Call it after ``encode_images`` and ``encode_texts``: every pair's
        segments are then cached, so each pair costs only its fusion (in the
        text lane). Pairs go in windows, so a thousand do not fill the lane's
        queue on their own.
        """
        pairs = [(i, j) for i in range(len(images)) for j in range(len(texts))]
        scores = np.empty((len(images), len(texts)), dtype=np.float64)  # (N, L)
        for start in range(0, len(pairs), self._window):
            chunk = pairs[start:start + self._window]
            items = [IntakeItem(request_id=f"{options.request_id}-pair-{i}-{j}", images=(images[i],),
                                **_text_fields(texts[j]),
                                priority=options.priority, timeout_ms=options.timeout_ms, truncate=options.truncate,
                                use_cache=options.use_cache, trace=options.trace)
                     for i, j in chunk]
            try:
                outcomes = await self._intake.run(items, arrival_ns)
            except IntakeItemError as e:
                raise e.error from e  # every text and image was checked already: what is left is the call's
            for (i, j), outcome in zip(chunk, outcomes):
                if outcome.result.match_score is None:
                    raise RuntimeError("the fusion head served no match_score: it is not trained")
                scores[i, j] = outcome.result.match_score
        return scores


def _text_fields(text: str | TokenizedText) -> dict[str, Any]:
    """An item's text as sent, or as an API process tokenized it (``IntakeItem.tokens``)."""
    return {"text": text} if isinstance(text, str) else {"tokens": text}
