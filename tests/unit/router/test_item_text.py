"""Fitting items' texts before the intake (an API process's step) gives what the intake itself would.

The tiny model's real tokenizer (one token per UTF-8 byte plus ``[CLS]`` and
``[SEP]``, 64 at most) and a budget of 60 joint tokens with 17 per image, so
one image leaves 43 tokens for a text.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor, ThreadPoolExecutor

import numpy as np
import pytest

from models.errors import TextTooLongError
from models.tokenizer import TokenizedText
from router.errors import JointTokensExceededError, TooManyImagesError
from router.intake import IntakeItem, IntakeTools, RequestIntake
from router.item_facts import ItemFacts
from router.item_text import INLINE_TEXT_MAX_CHARS, ItemTextFitter, fit_item_text
from router.joint_budget import JointTokenBudget
from router.segments import ImageContent

IMAGE = ImageContent(encoded=b"img")
BUDGET = JointTokenBudget(tokens_per_image=17, max_images_per_request=2, max_joint_tokens=60)


class CountingPool(Executor):
    """A real thread pool that counts what was sent to it."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(2)
        self.num_submitted = 0

    def submit(self, fn, /, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003 - Executor's signature
        self.num_submitted += 1
        return self._pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait, cancel_futures=cancel_futures)


class RefusingTokenizer:
    """Stands for a tokenizer that must not be called: the items bring their tokens."""

    def encode(self, text: str, *, truncate: bool) -> TokenizedText:
        raise AssertionError(f"tokenized {text!r} again")


@pytest.fixture
def counting_pool():
    pool = CountingPool()
    yield pool
    pool.shutdown()


def _fit_all(tiny_bundle, pool: Executor, items: list[IntakeItem]) -> list:
    return asyncio.run(ItemTextFitter(tiny_bundle.tokenizer, BUDGET, pool).fit_all(items))


def test_each_item_gets_the_tokens_the_intake_would_run_and_loses_its_text(tiny_bundle, counting_pool):
    items = [IntakeItem("short", text="a red bicycle"),
             IntakeItem("cut", text="x" * 100, images=(IMAGE,), truncate=True),
             IntakeItem("image only", images=(IMAGE, IMAGE))]
    fitted = _fit_all(tiny_bundle, counting_pool, items)
    for item, after in zip(items, fitted):
        expected, _ = fit_item_text(tiny_bundle.tokenizer, BUDGET, item)
        assert after.tokens == expected
        assert after.text is None and after.images == item.images and after.request_id == item.request_id
    assert len(fitted[0].tokens.token_ids) == len("a red bicycle") + 2
    cut = fitted[1].tokens
    assert len(cut.token_ids) == 60 - 17 and cut.is_truncated and cut.num_tokens_before_truncation == 102
    assert fitted[2].tokens is None


def test_every_item_answers_with_its_own_refusal_whatever_its_neighbours_do(tiny_bundle, counting_pool):
    items = [IntakeItem("fine", text="fine"),
             IntakeItem("too long", text="word " * 20),
             IntakeItem("over budget", text="x" * 50, images=(IMAGE,)),
             IntakeItem("too many images", text="x", images=(IMAGE,) * 3),
             IntakeItem("fits", text="x" * 41, images=(IMAGE,))]
    fitted = _fit_all(tiny_bundle, counting_pool, items)
    assert fitted[0].tokens is not None and fitted[4].tokens is not None
    assert isinstance(fitted[1], TextTooLongError)
    assert isinstance(fitted[2], JointTokensExceededError)
    assert (fitted[2].num_joint_tokens, fitted[2].max_joint_tokens) == (17 + 52, 60)
    assert isinstance(fitted[3], TooManyImagesError)


def test_short_texts_stay_on_the_event_loop_and_long_ones_go_to_the_pool(tiny_bundle, counting_pool):
    short, long = "y" * INLINE_TEXT_MAX_CHARS, "y" * (INLINE_TEXT_MAX_CHARS + 1)
    _fit_all(tiny_bundle, counting_pool, [IntakeItem("s", text=short, truncate=True), IntakeItem("i", images=(IMAGE,))])
    assert counting_pool.num_submitted == 0
    fitted = _fit_all(tiny_bundle, counting_pool, [IntakeItem("l", text=long, truncate=True)])
    assert counting_pool.num_submitted == 1
    assert fitted[0].tokens.num_tokens_before_truncation == INLINE_TEXT_MAX_CHARS + 3


def test_an_item_with_tokens_is_not_tokenized_again(tiny_bundle):
    tokens = TokenizedText((2, 77, 78, 3), False, 4)
    item = IntakeItem("t", tokens=tokens, images=(IMAGE,))
    assert fit_item_text(RefusingTokenizer(), BUDGET, item)[0] == tokens  # type: ignore[arg-type]
    over = IntakeItem("o", tokens=TokenizedText(tuple(range(50)), False, 50), images=(IMAGE,))
    with pytest.raises(JointTokensExceededError):  # the budget still holds for tokens brought along
        fit_item_text(RefusingTokenizer(), BUDGET, over)  # type: ignore[arg-type]


def test_the_intake_runs_tokens_brought_along_as_its_own_tokenizing_would(make_router, pool):
    """The engine's side: an item fitted elsewhere computes what the same item sent as text computes."""
    router = make_router()

    def decoder(data: bytes) -> np.ndarray:
        return np.full((24, 20, 3), 7, dtype=np.uint8)  # (H, W, 3)

    plain = RequestIntake(router, IntakeTools.of(router.bundle, router.budget), decoder, pool)
    as_text = IntakeItem("a", text="a red square", images=(IMAGE,), use_cache=False)
    fitted = asyncio.run(ItemTextFitter(router.bundle.tokenizer, router.budget, pool).fit_all([as_text]))[0]
    tools = IntakeTools(RefusingTokenizer(), router.budget, router.bundle.config.preprocess)  # type: ignore[arg-type]
    engine = RequestIntake(router, tools, decoder, pool)

    reference = asyncio.run(plain.run_one(as_text, time.perf_counter_ns()))
    ours = asyncio.run(engine.run_one(fitted, time.perf_counter_ns()))
    assert ours.text == reference.text and ours.joint == reference.joint
    assert ours.facts == reference.facts
    np.testing.assert_allclose(ours.result.fused_embedding, reference.result.fused_embedding, rtol=1e-6, atol=1e-6)
    text_reference = asyncio.run(plain.run_one(IntakeItem("b", text="a red square", use_cache=False),
                                               time.perf_counter_ns()))
    text_ours = asyncio.run(engine.run_one(IntakeItem("c", tokens=reference.text, use_cache=False),
                                           time.perf_counter_ns()))
    np.testing.assert_allclose(text_ours.result.text_embedding, text_reference.result.text_embedding,
                               rtol=1e-6, atol=1e-6)
    assert router.cache.num_in_flight == 0


def test_the_joint_count_and_facts_derived_from_a_fitted_item_are_the_intakes(make_router, pool):
    """An API process derives an answer's joint count and facts itself (the engine leaves them out): from the
    item the client sent and the item ``fit_all`` made, they are what one process's intake computes."""
    router = make_router()

    def decoder(data: bytes) -> np.ndarray:
        return np.full((24, 20, 3), 7, dtype=np.uint8)  # (H, W, 3)

    plain = RequestIntake(router, IntakeTools.of(router.bundle, router.budget), decoder, pool)
    fitter = ItemTextFitter(router.bundle.tokenizer, router.budget, pool)
    raw = ImageContent(pixels=bytes(range(6 * 4 * 3)), shape=(6, 4, 3))
    sent = [IntakeItem("t", text="a red square", use_cache=False, protocol="openai"),
            IntakeItem("l", text="word " * 200, truncate=True, use_cache=False),
            IntakeItem("f", text="a red square", images=(IMAGE,), use_cache=False),
            IntakeItem("i", images=(IMAGE, raw), use_cache=False, images_as_list=True)]
    fitted = asyncio.run(fitter.fit_all(sent))
    for item, fit in zip(sent, fitted):
        reference = asyncio.run(plain.run_one(item, time.perf_counter_ns()))
        joint = fitter.joint_of(fit)
        assert joint == reference.joint, item.request_id
        assert ItemFacts.sent(item).with_text(fit.tokens, joint) == reference.facts, item.request_id
    assert reference.facts.num_images == 2 and reference.facts.raw_shapes == ((6, 4, 3),)
