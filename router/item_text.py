"""An item's text as the encoder runs it: tokenized, then fit to the joint-token budget.

    fit_item_text(tokenizer, budget, item)   tokenize (unless the item brings its tokens), then
                                             ``budget.fit``: (the text as it will run, the joint count)
    ItemTextFitter.fit_all(items)            the same for every item of a call, before anything is
                                             sent on: short texts on the event loop, longer ones in
                                             the decode pool; per item, the item carrying its tokens,
                                             or the error it raised

The intake (``router.intake``) calls ``fit_item_text`` while it prepares an
item, in the process that runs the model. An API process in front of an
engine (``server.workers``) calls ``fit_all`` before it sends a call on, so an
item over a limit is refused where it arrived and the engine tokenizes
nothing: the item reaches it with ``tokens`` set and its text dropped, and
the intake's ``fit_item_text`` only checks the budget again, arithmetic on a
few integers that keeps the engine's limits the ones that hold. Both sides run
the same tokenizer wrapper (``models.tokenizer``), the same budget
(``router.joint_budget``) and so raise the same typed errors
(``TextTooLongError``, ``TooManyImagesError``, ``JointTokensExceededError``):
a refusal reads the same wherever it was made.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING

from models.torch_free.text_ids import LimitedTokenizer, TokenizedText
from router.joint_budget import JointTokenBudget, JointTokens

if TYPE_CHECKING:
    from router.intake import IntakeItem

# Tokenizing this many characters takes under 100 us: less than a hop to the pool and back.
INLINE_TEXT_MAX_CHARS = 256


def fit_item_text(tokenizer: LimitedTokenizer, budget: JointTokenBudget,
                  item: IntakeItem) -> tuple[TokenizedText | None, JointTokens]:
    """The item's text as it will run (cut to fit when it asked to ``truncate``) and its joint count.

    An item that already carries ``tokens`` is not tokenized again. Raises
    the tokenizer's ``TextTooLongError`` or the budget's errors.
    """
    tokens = item.tokens
    if tokens is None and item.text is not None:
        tokens = tokenizer.encode(item.text, truncate=item.truncate)
    return budget.fit(len(item.images), tokens, truncate=item.truncate)


class ItemTextFitter:
    """Fits every item of a call to the tokenizer's and the budget's limits, off the event loop when it is long.

    Args:
        tokenizer: The served model's tokenizer (a CPU copy's is the same tokenizer).
        budget: The joint-token budget the engine's router was built with (the same settings).
        executor: Where a long text is tokenized (the server's bounded decode pool; a full
            queue's ``DecodeQueueFullError`` becomes that item's error).
        inline_text_max_chars: A text this short is tokenized on the event loop.
    """

    def __init__(self, tokenizer: LimitedTokenizer, budget: JointTokenBudget, executor: Executor, *,
                 inline_text_max_chars: int = INLINE_TEXT_MAX_CHARS) -> None:
        self._tokenizer = tokenizer
        self._budget = budget
        self._executor = executor
        self._inline_text_max_chars = inline_text_max_chars

    async def fit_all(self, items: Sequence[IntakeItem]) -> list[IntakeItem | Exception]:
        """Per item, in order: the item with ``tokens`` set (text dropped), or the error that refuses it.

        Every item is fitted, whatever its neighbours raise, so the caller can
        pick the first refusal by index as the intake does.
        """
        fitted = await asyncio.gather(*(self._fit(item) for item in items), return_exceptions=True)
        for outcome in fitted:
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # cancelled: not an answer about the item
        return fitted  # type: ignore[return-value]  # items or Exceptions here

    def joint_of(self, fitted: IntakeItem) -> JointTokens:
        """The joint count of an item ``fit_all`` returned, as the engine's intake counts it again for the item
        (its budget check on the same ids: they fit, so nothing is cut or raised); arithmetic on a few integers."""
        return self._budget.fit(len(fitted.images), fitted.tokens, truncate=fitted.truncate)[1]

    async def _fit(self, item: IntakeItem) -> IntakeItem:
        if item.text is None or len(item.text) <= self._inline_text_max_chars:
            tokens, _ = fit_item_text(self._tokenizer, self._budget, item)
        else:
            future = self._executor.submit(fit_item_text, self._tokenizer, self._budget, item)
            tokens, _ = await asyncio.wrap_future(future)
        return dataclasses.replace(item, text=None, tokens=tokens)
