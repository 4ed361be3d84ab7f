"""``RequestIntake.start_one``: a call with no task of its own answers as ``run_one`` does and settles its plan.

The engine behind API processes starts most calls this way (their texts come
tokenized, their images decoded). A real router on the tiny model; its text
tower can be held on an event so a call stays queued behind a running batch.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from models.errors import TextTooLongError
from router.errors import ShuttingDownError
from router.faults import FaultInjector
from router.intake import INLINE_TEXT_MAX_CHARS, IntakeItem, IntakeTools, RequestIntake
from router.router import Router
from router.segments import SlotStatus

WAIT_S = 10.0


class NoPool:
    """An executor that must not be used: ``start_one`` prepares on the event loop."""

    def submit(self, fn, /, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        raise AssertionError("a started item went to the pool")


def _intake(router: Router, **options: object) -> RequestIntake:
    tools = IntakeTools.of(router.bundle, router.budget)
    return RequestIntake(router, tools, lambda data: None, NoPool(), **options)  # type: ignore[arg-type]


def _text(name: str, text: str, **options: object) -> IntakeItem:
    return IntakeItem(request_id=name, text=text, **options)


def _now() -> int:
    return time.perf_counter_ns()


class HeldTextTower:
    """Wraps the model's ``encode_texts``: the first batch waits for ``release`` (the others run at once)."""

    def __init__(self, encode_texts) -> None:  # noqa: ANN001
        self._encode_texts = encode_texts
        self.entered = threading.Event()
        self._released = threading.Event()
        self.num_batches = 0

    def release(self) -> None:
        self._released.set()

    def __call__(self, *args: object, **kwargs: object):  # noqa: ANN204
        self.num_batches += 1
        self.entered.set()
        assert self._released.wait(WAIT_S), "the test never released the text tower"
        return self._encode_texts(*args, **kwargs)


@pytest.fixture
def held_text(make_router, tiny_bundle, monkeypatch) -> tuple[Router, HeldTextTower, RequestIntake]:
    """A started router whose text tower holds its first batch until released, and an intake on it."""
    router = make_router()
    held = HeldTextTower(tiny_bundle.model.encode_texts)
    monkeypatch.setattr(tiny_bundle.model, "encode_texts", held)
    return router, held, _intake(router)


def test_a_started_text_answers_as_run_one_does_without_a_task(make_router):
    router = make_router()
    intake = _intake(router)

    async def both():
        started = intake.start_one(_text("a", "a red square", use_cache=False), _now())
        assert started is not None and not isinstance(started, asyncio.Task)
        return await started, await intake.run_one(_text("b", "a red square", use_cache=False), _now())

    started, awaited = asyncio.run(both())
    assert started.text.token_ids == awaited.text.token_ids
    np.testing.assert_array_equal(started.result.text_embedding, awaited.result.text_embedding)
    assert started.facts == awaited.facts and started.cache == awaited.cache
    assert started.plan.is_settled
    assert router.num_computed_items == 2
    assert router.num_in_flight == 0


def test_a_started_call_cancelled_while_queued_never_reaches_the_model(held_text):
    router, held, intake = held_text

    async def cancel_queued():
        running = intake.start_one(_text("running", "the first text"), _now())
        await asyncio.to_thread(held.entered.wait, WAIT_S)  # its batch is on the tower now
        queued = intake.start_one(_text("queued", "the second text"), _now())
        assert router.cache.num_in_flight == 2  # both hold their text's claim
        queued.cancel()
        await asyncio.sleep(0)  # the cancellation reaches the router's future
        held.release()
        outcome = await asyncio.wait_for(running, WAIT_S)
        return outcome, queued

    outcome, queued = asyncio.run(cancel_queued())
    assert outcome.result.text_embedding is not None
    assert queued.cancelled()
    assert router.num_computed_items == 1, "a cancelled call must not reach the model"
    assert held.num_batches == 1
    assert router.cache.num_in_flight == 0 and router.num_in_flight == 0


def test_a_started_call_on_a_text_another_computes_waits_for_it_in_a_task(held_text):
    router, held, intake = held_text

    async def owner_and_waiter():
        owner = intake.start_one(_text("owner", "one shared text"), _now())
        await asyncio.to_thread(held.entered.wait, WAIT_S)
        waiter = intake.start_one(_text("waiter", "one shared text"), _now())
        assert isinstance(waiter, asyncio.Task), "a plan that awaits another request's segment needs a task"
        held.release()
        return await asyncio.wait_for(asyncio.gather(owner, waiter), WAIT_S)

    owner, waiter = asyncio.run(owner_and_waiter())
    assert owner.plan.text.status == SlotStatus.MISS and waiter.plan.text.status == SlotStatus.COALESCED
    np.testing.assert_array_equal(owner.result.text_embedding, waiter.result.text_embedding)
    assert held.num_batches == 1, "the waiter takes the owner's segment instead of computing again"
    assert router.cache.num_in_flight == 0


def test_a_started_call_refused_ends_in_run_ones_error_with_its_plan_settled(make_router):
    router = make_router()
    intake = _intake(router)

    async def refused(item: IntakeItem) -> BaseException | None:
        started = intake.start_one(item, _now())
        assert started is not None
        try:
            await started
        except Exception as e:  # noqa: BLE001
            return e
        return None

    assert isinstance(asyncio.run(refused(_text("long", "w " * 120))), TextTooLongError)
    router.begin_drain()
    error = asyncio.run(refused(_text("late", "too late")))
    assert isinstance(error, ShuttingDownError)
    assert router.cache.num_in_flight == 0 and router.num_in_flight == 0
    assert router.num_computed_items == 0


def test_an_item_for_the_pool_or_a_drill_is_not_started(make_router):
    """``None``: the caller runs it as before (``run_one``), so the pool, a "decode" drill or a device round
    keeps its place."""
    router = make_router()

    async def start(intake: RequestIntake, item: IntakeItem):  # noqa: ANN202
        return intake.start_one(item, _now())

    long_text = _text("long", "x" * (INLINE_TEXT_MAX_CHARS + 1), truncate=True)
    assert asyncio.run(start(_intake(router), long_text)) is None
    assert asyncio.run(start(_intake(router, faults=FaultInjector()), _text("short", "short"))) is None
    assert router.cache.num_in_flight == 0 and router.num_computed_items == 0
