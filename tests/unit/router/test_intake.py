"""The router intake settles every plan it makes, whichever way a request leaves it.

A real router on the tiny model, a fake image decoder (bytes -> pixels, or an
error for b"bad"; it can be held on an event to keep a claim in flight) and a
plain thread pool. After every exit the cache's in-flight table is empty: no
claim is left for a waiter to hang on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor

import numpy as np
import pytest

from models.errors import TextTooLongError
from router.errors import DeadlineExceededError, IntakeItemError, ItemFailedError, ShuttingDownError
from router.faults import FaultInjector
from router.intake import INLINE_TEXT_MAX_CHARS, IntakeItem, IntakeTools, RequestIntake
from router.request import Route
from router.router import Router
from router.segments import ImageContent, SlotStatus

WAIT_S = 10.0


class BadImageError(Exception):
    """What the fake decoder raises for b"bad" (the server's decoder raises its ApiError)."""


class FakeDecoder:
    """bytes -> (H, W, 3) uint8 pixels seeded by the bytes; optionally held until ``release``."""

    def __init__(self, *, is_held: bool = False) -> None:
        self.num_calls = 0
        self.entered = threading.Event()
        self._released = threading.Event()
        if not is_held:
            self._released.set()

    def release(self) -> None:
        self._released.set()

    def __call__(self, data: bytes) -> np.ndarray:
        self.num_calls += 1
        self.entered.set()
        assert self._released.wait(WAIT_S), "the test never released the decoder"
        if data == b"bad":
            raise BadImageError("not an image")
        seed = int.from_bytes(data[:4].ljust(4, b"\0"), "little")
        return np.random.default_rng(seed).integers(0, 256, (24, 20, 3), dtype=np.uint8)  # (H, W, 3)


class NoPool(Executor):
    """An executor that must not be used: short texts and small images are prepared on the event loop."""

    def submit(self, fn, /, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003 - Executor's signature
        raise AssertionError("an item meant for the event loop went to the pool")


def _item(name: str, *, text: str | None = None, image: bytes | None = None, **options: object) -> IntakeItem:
    return IntakeItem(request_id=name, text=text, images=() if image is None else (ImageContent(encoded=image),),
                      **options)


def _intake(router: Router, decoder: Callable[[bytes], np.ndarray], executor: Executor,
            **options: object) -> RequestIntake:
    """An intake handed the router's model tools, as the server builds it."""
    tools = IntakeTools.of(router.bundle, router.budget)
    return RequestIntake(router, tools, decoder, executor, **options)  # type: ignore[arg-type]


def _now() -> int:
    return time.perf_counter_ns()


async def _until(predicate: Callable[[], bool]) -> None:
    for _ in range(int(WAIT_S / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


def test_an_image_and_text_is_computed_once_then_hits_without_decoding(make_router, pool):
    router, decoder = make_router(), FakeDecoder()
    intake = _intake(router, decoder, pool)

    async def twice():
        first = await intake.run_one(_item("a", text="a red square", image=b"img-1"), _now())
        second = await intake.run_one(_item("b", text="a red square", image=b"img-1"), _now())
        return first, second

    first, second = asyncio.run(twice())
    assert first.plan.statuses() == {"image": "miss", "text": "miss"}
    assert second.plan.statuses() == {"image": "hit", "text": "hit"}
    assert decoder.num_calls == 1, "a hit must skip decoding"
    assert first.text.token_ids == second.text.token_ids
    np.testing.assert_array_equal(first.result.fused_embedding, second.result.fused_embedding)
    assert first.plan.is_settled and second.plan.is_settled
    assert router.cache.num_in_flight == 0


def test_a_bad_image_reraises_the_decoders_error_and_settles_the_plan(make_router, pool):
    router = make_router()
    intake = _intake(router, FakeDecoder(), pool)
    with pytest.raises(BadImageError):
        asyncio.run(intake.run_one(_item("a", text="caption", image=b"bad"), _now()))
    assert router.cache.num_in_flight == 0
    assert router.num_computed_items == 0


def test_a_text_over_the_token_limit_raises_the_models_error_before_any_claim(make_router, pool):
    router = make_router()
    intake = _intake(router, FakeDecoder(), pool)
    with pytest.raises(TextTooLongError):
        asyncio.run(intake.run_one(_item("a", text="word " * 200, image=b"unused"), _now()))
    assert router.cache.num_in_flight == 0


def test_one_bad_item_fails_the_call_by_index_and_none_is_computed(make_router, pool):
    router = make_router()
    intake = _intake(router, FakeDecoder(), pool)
    items = [_item("r-0", image=b"good-0"), _item("r-1", image=b"bad"), _item("r-2", text="a long enough text " * 20)]
    with pytest.raises(IntakeItemError) as raised:
        asyncio.run(intake.run(items, _now()))
    assert raised.value.item_index == 1 and isinstance(raised.value.error, BadImageError)
    assert router.num_computed_items == 0, "a refused item's neighbours must not be computed"
    assert router.cache.num_in_flight == 0


def test_many_items_are_answered_in_order(make_router, pool):
    router = make_router()
    intake = _intake(router, FakeDecoder(), pool)
    items = [_item("r-0", image=b"many-0"), _item("r-1", text="hello"), _item("r-2", text="hi", image=b"many-0")]
    outcomes = asyncio.run(intake.run(items, _now()))
    assert [outcome.result.route for outcome in outcomes] == [Route.VISION, Route.TEXT, Route.FUSION]
    assert all(outcome.plan.is_settled for outcome in outcomes)
    assert router.cache.num_in_flight == 0


def test_a_passed_deadline_settles_the_plan(make_router, pool):
    router = make_router()
    intake = _intake(router, FakeDecoder(), pool)
    with pytest.raises(DeadlineExceededError):
        # Arrived long ago with a 1 ms budget: past its deadline before it reaches the queue.
        asyncio.run(intake.run_one(_item("a", image=b"late", timeout_ms=1), arrival_ns=_now() - 10**9))
    assert router.cache.num_in_flight == 0


def test_a_draining_router_refuses_and_the_plan_is_settled(make_router, pool):
    router = make_router()
    router.begin_drain()
    intake = _intake(router, FakeDecoder(), pool)
    with pytest.raises(ShuttingDownError):
        asyncio.run(intake.run_one(_item("a", text="too late", image=b"drain"), _now()))
    assert router.cache.num_in_flight == 0


@pytest.mark.parametrize("num_items", [1, 3])
def test_a_draining_router_refuses_a_call_for_the_server_not_for_its_first_item(make_router, pool, num_items):
    """Not ``IntakeItemError(0, ...)``: an answer would say "row 0: the server is shutting down", blaming a row,
    where API processes in front of an engine refuse the call before looking at any item."""
    router = make_router()
    router.begin_drain()
    intake = _intake(router, FakeDecoder(), pool)
    items = [_item(f"r-{index}", text=f"too late {index}") for index in range(num_items)]
    with pytest.raises(ShuttingDownError) as raised:
        asyncio.run(intake.run(items, _now()))
    assert str(raised.value) == "the server is shutting down"
    assert router.cache.num_in_flight == 0


def test_a_model_error_reaches_the_owner_and_its_waiter(make_router, pool, tiny_bundle, monkeypatch):
    router, decoder = make_router(), FakeDecoder(is_held=True)
    intake = _intake(router, decoder, pool)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the vision encoder broke")

    monkeypatch.setattr(tiny_bundle.model, "encode_images", broken)

    async def owner_and_waiter():
        owner = asyncio.ensure_future(intake.run_one(_item("owner", image=b"model-error"), _now()))
        await asyncio.to_thread(decoder.entered.wait, WAIT_S)  # the owner holds the claim now
        waiter = asyncio.ensure_future(intake.run_one(_item("waiter", image=b"model-error"), _now()))
        await asyncio.sleep(0.1)  # the waiter has planned: it is coalesced on the owner
        decoder.release()
        return await asyncio.wait_for(asyncio.gather(owner, waiter, return_exceptions=True), WAIT_S)

    owner, waiter = asyncio.run(owner_and_waiter())
    assert isinstance(owner, ItemFailedError) and isinstance(waiter, ItemFailedError)
    assert decoder.num_calls == 1, "the waiter shares the owner's failure instead of computing again"
    assert router.cache.num_in_flight == 0


def test_a_caller_cancelled_while_its_image_decodes_gives_the_claim_back(make_router, pool):
    router, decoder = make_router(), FakeDecoder(is_held=True)
    intake = _intake(router, decoder, pool)

    async def cancel_mid_decode():
        task = asyncio.ensure_future(intake.run_one(_item("gone", image=b"cancelled"), _now()))
        await asyncio.to_thread(decoder.entered.wait, WAIT_S)
        assert router.cache.num_in_flight == 1  # planned in the pool thread, decoding now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        decoder.release()  # the thread hands its plan over to nobody
        await _until(lambda: router.cache.num_in_flight == 0)

    asyncio.run(cancel_mid_decode())
    assert router.num_computed_items == 0


def test_a_waiter_whose_owner_went_away_takes_the_claim_and_decodes_the_image(make_router, pool):
    router, decoder = make_router(), FakeDecoder(is_held=True)
    intake = _intake(router, decoder, pool)

    async def owner_leaves():
        owner = asyncio.ensure_future(intake.run_one(_item("owner", text="q", image=b"handover"), _now()))
        await asyncio.to_thread(decoder.entered.wait, WAIT_S)
        waiter = asyncio.ensure_future(intake.run_one(_item("waiter", text="q", image=b"handover"), _now()))
        await asyncio.sleep(0.1)  # the waiter planned without pixels: the image was someone else's
        owner.cancel()
        decoder.release()
        return await asyncio.wait_for(waiter, WAIT_S)

    outcome = asyncio.run(owner_leaves())
    assert outcome.plan.images[0].status == SlotStatus.MISS  # looked up again and owned
    assert outcome.result.image_embedding is not None and outcome.result.route == Route.FUSION
    assert decoder.num_calls == 2
    assert router.cache.num_in_flight == 0


def test_short_texts_stay_on_the_loop_and_everything_else_goes_to_the_pool(make_router, pool):
    router = make_router()
    short = _item("s", text="x" * INLINE_TEXT_MAX_CHARS, truncate=True)
    outcome = asyncio.run(_intake(router, FakeDecoder(), NoPool()).run_one(short, _now()))
    assert outcome.result.text_embedding is not None
    with pytest.raises(AssertionError, match="went to the pool"):
        asyncio.run(_intake(router, FakeDecoder(), NoPool()).run_one(
            _item("l", text="x" * (INLINE_TEXT_MAX_CHARS + 1), truncate=True), _now()))
    with pytest.raises(AssertionError, match="went to the pool"):  # a decode drill must delay every item
        asyncio.run(_intake(router, FakeDecoder(), NoPool(), faults=FaultInjector()).run_one(short, _now()))
    assert router.cache.num_in_flight == 0


def test_small_images_are_decoded_on_the_loop_and_a_call_over_the_limit_in_the_pool(make_router, pool):
    """The limit counts a call's images together, from their headers (router.inline_decode)."""
    from encoded_images import encoded_image

    router = make_router()
    small = encoded_image(1, (40, 30), "PNG")  # 1,200 pixels
    decoder = FakeDecoder()
    outcome = asyncio.run(_intake(router, decoder, NoPool(), inline_image_max_pixels=1_200).run_one(
        _item("s", image=small), _now()))
    assert outcome.result.image_embedding is not None and decoder.num_calls == 1
    pair = [_item("a", image=small), _item("b", image=encoded_image(2, (40, 30), "PNG"))]
    outcomes = asyncio.run(_intake(router, FakeDecoder(), NoPool(), inline_image_max_pixels=2_400).run(pair, _now()))
    assert all(outcome.result.image_embedding is not None for outcome in outcomes)
    refused = [  # each on the pool's side: one pixel over, two over together, a drill, a long text beside it
        (dict(inline_image_max_pixels=1_199), [_item("s2", image=small)]),
        (dict(inline_image_max_pixels=2_399), pair),
        (dict(inline_image_max_pixels=1_200, faults=FaultInjector()), [_item("s3", image=small)]),
        (dict(inline_image_max_pixels=1_200),
         [_item("t", text="x" * (INLINE_TEXT_MAX_CHARS + 1), image=small, truncate=True)]),
    ]
    for options, items in refused:
        with pytest.raises((AssertionError, IntakeItemError), match="went to the pool"):
            asyncio.run(_intake(router, FakeDecoder(), NoPool(), **options).run(items, _now()))
    outcomes = asyncio.run(_intake(router, FakeDecoder(), pool, inline_image_max_pixels=2_399).run(pair, _now()))
    assert all(outcome.result.image_embedding is not None for outcome in outcomes)  # the pool's path answers too
    assert router.cache.num_in_flight == 0


def test_images_another_process_decoded_are_picked_up_on_the_loop_whatever_their_size(make_router):
    """The engine behind API processes: its images arrive decoded, and a lookup is no reason for a hop."""
    from encoded_images import encoded_image

    router = make_router()
    size = router.bundle.config.preprocess.input_size
    large, other = encoded_image(3, (640, 480), "JPEG"), encoded_image(4, (640, 480), "JPEG")  # 307,200 px each
    prepared = {large: np.full((size, size, 3), 7, np.uint8)}  # what an API process decoded into its slot

    def intake(executor: Executor) -> RequestIntake:
        return _intake(router, FakeDecoder(), executor, inline_image_max_pixels=1_200,
                       prepared_pixels=lambda content: prepared.get(content.encoded))

    outcome = asyncio.run(intake(NoPool()).run_one(_item("p", image=large), _now()))
    assert outcome.result.image_embedding is not None
    with pytest.raises((AssertionError, IntakeItemError), match="went to the pool"):  # one to decode here: too large
        asyncio.run(intake(NoPool()).run([_item("p2", image=large), _item("o", image=other)], _now()))
    assert router.cache.num_in_flight == 0


def test_a_segment_plan_never_changes_once_made(make_router):
    router = make_router()
    plan = router.plan_segments((ImageContent(encoded=b"frozen"),), (2, 5, 3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.images = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.images[0].status = SlotStatus.HIT  # type: ignore[misc]
    resolved = asyncio.run(plan.resolved())
    assert resolved is plan  # nothing was coalesced, so nothing new to know: the same immutable plan
    plan.abandon()
    assert plan.is_settled and router.cache.num_in_flight == 0


def test_an_outcome_carries_the_items_facts_computed_once(make_router, pool, monkeypatch):
    """Encoding and size from the header, tokens as the encoder runs them, count, priority, protocol."""
    import router.item_facts as item_facts
    from encoded_images import encoded_image
    from router.request import Priority

    sniffed: list[int] = []
    real_sent = item_facts.ItemFacts.sent.__func__
    monkeypatch.setattr(item_facts.ItemFacts, "sent",
                        classmethod(lambda cls, item: sniffed.append(1) or real_sent(cls, item)))
    router = make_router()
    png = encoded_image(3, (40, 30), "PNG")
    raw = ImageContent(pixels=bytes(6 * 5 * 3), shape=(6, 5, 3))
    item = IntakeItem(request_id="facts", text="word " * 400, images=(ImageContent(encoded=png), raw),
                      priority=Priority.HIGH, truncate=True, images_as_list=True, protocol="kserve_v2")
    outcome = asyncio.run(_intake(router, FakeDecoder(), pool).run_one(item, _now()))
    facts = outcome.facts
    assert sniffed == [1], "an item's facts are computed once, by the intake"
    assert (facts.protocol, facts.priority, facts.num_images) == ("kserve_v2", "high", 2)
    assert facts.image_encodings == ("png", "raw_uint8") and facts.image_encoding == "mixed"
    assert facts.image_pixels == (1_200, 30) and facts.largest_image_pixels == 1_200
    assert facts.raw_shapes == ((6, 5, 3),) and facts.image_bytes == (len(png), 90)
    assert facts.num_text_tokens == len(outcome.text.token_ids) and facts.is_text_truncated is True
    assert facts.num_joint_tokens == outcome.joint.total
    assert outcome.cache == {"images": ["miss", "miss"], "text": "miss"}


def test_the_intake_prepares_with_the_tools_it_was_handed_not_the_routers(make_router, pool):
    from router.errors import TooManyImagesError
    from router.joint_budget import JointTokenBudget

    router = make_router()
    assert router.budget.max_images_per_request >= 2
    one_image = JointTokenBudget(router.budget.tokens_per_image, 1, router.budget.max_joint_tokens)
    tools = dataclasses.replace(IntakeTools.of(router.bundle, router.budget), budget=one_image)
    intake = RequestIntake(router, tools, FakeDecoder(), pool)
    two = IntakeItem(request_id="two", images=(ImageContent(encoded=b"img-a"), ImageContent(encoded=b"img-b")))
    with pytest.raises(TooManyImagesError):
        asyncio.run(intake.run_one(two, _now()))
    assert router.cache.num_in_flight == 0
