"""Preparing one intake item: tokenized, planned against the cache, and the images its plan needs decoded.

    prepare(item, ...)     on the event loop when it is cheaper than a pool hop (``is_inline``),
                           else in the decode pool:
                             "decode" fault drill -> tokenize + joint-token budget
                             (router.item_text) -> plan the segments (router.plan_segments)
                             -> decode + resize only the images the plan needs
                           with a device round (--decode-device cuda): the plan's JPEGs
                           wait for the call's device batch; what it leaves, CPU

The intake (``router.intake``) owns the call around it: the gate that holds
every item until all are prepared, resolving the plan, submitting and
settling. This module owns what one item costs before that, and the one rule
of a plan made for nobody: a pool thread that lands a plan for a caller that
was cancelled meanwhile abandons it (``_abandon_landed_plan``), and a plan
whose images fail to decode is abandoned before the error leaves.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from models.loading.config import PreprocessConfig
from models.preprocessing import pixels_to_model_input, resize_to_model_input
from models.torch_free.text_ids import LimitedTokenizer, TokenizedText
from router.device_decode_round import DeviceDecodeRound
from router.errors import ImageItemError
from router.faults import FaultInjector
from router.item_text import fit_item_text
from router.joint_budget import JointTokenBudget, JointTokens
from router.segments import ImageContent, SegmentPlan

if TYPE_CHECKING:
    from models.jpeg_decode import DeviceJpegDecoder
    from router.intake import ImageDecoder, IntakeItem
    from router.router import Router


@dataclass(frozen=True)
class PreparedItem:
    """One item ready to resolve and submit: its text as it runs, its joint tokens, its plan, its pixels."""

    text: TokenizedText | None
    joint: JointTokens
    plan: SegmentPlan
    images: tuple[np.ndarray | None, ...]  # each (S, S, 3) uint8; None where the plan did not need the pixels
    on_device: tuple[int, ...] = ()  # images the plan needs that wait for the device decoder (still None)


def _abandon_landed_plan(future: Future) -> None:
    """Done-callback for a prepare whose caller was cancelled: nobody will submit its plan."""
    if not future.cancelled() and future.exception() is None:
        future.result().plan.abandon()


class ItemPreparer:
    """Tokenize, plan and decode one item, on the loop or in the pool (``RequestIntake``'s arguments)."""

    def __init__(self, router: Router, tokenizer: LimitedTokenizer, budget: JointTokenBudget,
                 preprocess: PreprocessConfig, decode_image: ImageDecoder, executor: Executor, *,
                 faults: FaultInjector | None, inline_text_max_chars: int,
                 device_decoder: DeviceJpegDecoder | None,
                 prepared_pixels: Callable[[ImageContent], np.ndarray | None] | None) -> None:
        self._router = router
        self._tokenizer = tokenizer
        self._budget = budget
        self._preprocess = preprocess
        self._decode_image = decode_image
        self._executor = executor
        self._faults = faults
        self._device_decoder = device_decoder
        self._inline_text_max_chars = inline_text_max_chars
        self._prepared_pixels = prepared_pixels

    def is_prepared(self, content: ImageContent) -> bool:
        """Whether another process already decoded this image (``prepared_pixels``: the engine behind API processes)."""
        return self._prepared_pixels is not None and self._prepared_pixels(content) is not None

    def is_inline(self, item: IntakeItem, images_inline: bool) -> bool:
        """Whether preparing ``item`` costs less than a hop to the pool: its text short (or tokenized, or
        absent) and its images none, or small with the rest of its call's (``images_inline``). With drills
        every item takes the pool, which a "decode" drill delays."""
        if self._faults is not None:
            return False
        if item.text is not None and item.tokens is None and len(item.text) > self._inline_text_max_chars:
            return False
        return not item.images or images_inline

    async def prepare(self, item: IntakeItem, image_encoding: str | None,
                      device_round: DeviceDecodeRound | None, images_inline: bool) -> PreparedItem:
        """Tokenized, planned and every image the plan needs decoded (on the device too, with a round)."""
        try:
            prepared = await self._prepare_on_host(item, image_encoding, device_round is not None, images_inline)
        except BaseException:
            if device_round is not None:
                device_round.leave()
            raise
        if device_round is None:
            return prepared
        try:
            return await self._decode_on_device(item, prepared, device_round)
        except BaseException:
            prepared.plan.abandon()
            raise

    async def model_input_off_loop(self, item: IntakeItem, index: int) -> np.ndarray:
        """Image ``index`` of ``item`` decoded in the pool (a claim that became ours after preparing)."""
        return await asyncio.wrap_future(self._executor.submit(self._model_input, item, index))

    async def _prepare_on_host(self, item: IntakeItem, image_encoding: str | None,
                               is_device_decoding: bool, images_inline: bool) -> PreparedItem:
        if self.is_inline(item, images_inline):
            return self.prepare_now(item, image_encoding)
        future = self._executor.submit(self.prepare_now, item, image_encoding, is_device_decoding)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            # The thread may be planning right now for nobody: settle the plan when it lands.
            future.add_done_callback(_abandon_landed_plan)
            raise

    async def _decode_on_device(self, item: IntakeItem, prepared: PreparedItem,
                                device_round: DeviceDecodeRound) -> PreparedItem:
        """The images left for the device decoded in the call's batch; those it leaves, on the CPU one by one."""
        decoded = await device_round.decode([item.images[index].encoded for index in prepared.on_device])
        images = list(prepared.images)
        for index, pixels in zip(prepared.on_device, decoded, strict=True):
            images[index] = pixels if pixels is not None else await self.model_input_off_loop(item, index)
        return dataclasses.replace(prepared, images=tuple(images), on_device=())

    def prepare_now(self, item: IntakeItem, image_encoding: str | None,
                     is_device_decoding: bool = False) -> PreparedItem:
        """Tokenize, plan, decode if the plan needs the pixels (a pool thread, or the loop: ``is_inline``).

        ``is_device_decoding``: the JPEGs the plan needs are left undecoded
        (``on_device``) for the call's device batch.
        """
        if self._faults is not None:
            self._faults.after_stage("decode", (image_encoding,))
        tokens, joint = fit_item_text(self._tokenizer, self._budget, item)
        plan = self._router.plan_segments(item.images, tokens.token_ids if tokens is not None else None,
                                          item.use_cache)
        try:
            needed = set(plan.image_indices_to_compute)
            on_device = tuple(index for index in sorted(needed) if is_device_decoding
                              and self._is_for_device(item.images[index]))
            images = tuple(self._model_input(item, index) if index in needed and index not in on_device else None
                           for index in range(len(item.images)))
        except BaseException:
            plan.abandon()
            raise
        return PreparedItem(tokens, joint, plan, images, on_device)

    def _is_for_device(self, content: ImageContent) -> bool:
        return (self._device_decoder is not None and content.encoded is not None
                and self._device_decoder.accepts(content.encoded))

    def _model_input(self, item: IntakeItem, index: int) -> np.ndarray:
        """Image ``index`` of ``item`` as the model's (S, S, 3) uint8 input; decoding runs here (a pool thread,
        or the loop for small images: ``is_inline``).

        For an item that sent a list, a decoder's error is wrapped in
        ``ImageItemError`` so the answer can name the bad image.
        """
        try:
            return self._pixels(item.images[index])
        except Exception as e:
            if item.images_as_list:
                raise ImageItemError(index, e) from e
            raise

    def _pixels(self, content: ImageContent) -> np.ndarray:
        if self._prepared_pixels is not None and (prepared := self._prepared_pixels(content)) is not None:
            return prepared
        preprocess = self._preprocess
        if content.pixels is not None:
            pixels = np.frombuffer(content.pixels, dtype=np.uint8).reshape(content.shape)  # (H, W, 3)
            return pixels_to_model_input(pixels, preprocess)
        decoded = self._decode_image(content.encoded)
        if isinstance(decoded, np.ndarray):
            return pixels_to_model_input(decoded, preprocess)  # (H, W, 3) -> (S, S, 3)
        return resize_to_model_input(decoded, preprocess)  # (S, S, 3)
