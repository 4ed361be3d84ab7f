"""Which segments of a request are already known: the router's side of the cache.

A request is made of one segment per image and at most one text segment,
each cached on its own:

    image segments (pooled, K, V)   key: fingerprint + preprocessing + uploaded bytes   (one per image)
    text segment   (pooled, Q)      key: fingerprint + token ids

An image two requests share (a catalogue picture asked about again and
again) is therefore encoded once, whichever other images come with it.
``SegmentCatalog.plan`` derives every key and asks the cache once per
segment, before any image is decoded, so a hit skips decoding as well as the
encoder. Each slot of the resulting ``SegmentPlan`` is one of:

    hit        the value is known now
    coalesced  another request is computing it; await its future
    miss       this request computes it and publishes it (the claim)
    bypass     use_cache: false, or that modality's budget is 0

A plan must end in exactly one of ``publish`` (after compute), ``fail`` (the
computation raised) or ``abandon`` (the request never reached the model), so
waiters never hang; ``router.intake`` is the one caller that makes sure of it.
A plan never changes once made: ``resolved`` answers a new plan with the
coalesced values in hand (and a fresh claim where an owner gave up). Keys
carry the model fingerprint: a new model never sees an old entry.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TYPE_CHECKING, TypeVar

from cache import (
    CacheLookup,
    ClaimAbandonedError,
    ClaimAlreadyResolvedError,
    LookupKind,
    Modality,
    SegmentCache,
    SegmentKey,
    encoded_image_key,
    pixels_key,
    token_ids_key,
)
from cache.claim import Claim

if TYPE_CHECKING:
    from models.multimodal import ImageSegment, TextSegment

Segment = TypeVar("Segment", "ImageSegment", "TextSegment")

TEXT_PREPROCESS_ID = "token-ids"


class SlotStatus(str, Enum):
    HIT = "hit"
    MISS = "miss"
    COALESCED = "coalesced"
    BYPASS = "bypass"


@dataclass(frozen=True)
class SegmentSlot(Generic[Segment]):
    """One segment of one request and how it will be obtained.

    ``key`` is ``None`` for a segment the cache is not asked about at all
    (``use_cache: false``, or its modality's budget is 0): nothing is keyed,
    looked up or claimed for it, so a server with the cache off hashes nothing.
    """

    key: SegmentKey | None
    status: SlotStatus
    value: Segment | None = None
    claim: Claim | None = None  # miss or bypass: this request computes and publishes
    future: Future | None = None  # coalesced: the owner's result

    @property
    def needs_compute(self) -> bool:
        return self.value is None and self.status in (SlotStatus.MISS, SlotStatus.BYPASS)

    @property
    def is_settled(self) -> bool:
        """No claim of this slot is left for anyone to resolve."""
        return self.claim is None or self.claim.is_resolved


@dataclass(frozen=True)
class ImageContent:
    """An image as it arrived: encoded file bytes, or raw pixels with their shape.

    An image that another process has already turned into the model's input
    (an API process, into shared memory) need not travel again, whatever its
    size: ``left_behind`` keeps raw pixels' shape, the cache key their bytes
    give and their length, and ``encoded_left_behind`` an encoded image's key,
    length and what its header says (encoding, W x H), so keys and facts
    (``num_bytes``, ``router.image_header``) are the ones the bytes give.
    """

    encoded: bytes | None = None
    pixels: bytes | None = None
    shape: tuple[int, ...] | None = None
    pixels_key: SegmentKey | None = None  # left behind: the key of the bytes that did not travel
    pixels_length: int | None = None  # left behind: their length in bytes
    header_encoding: str | None = None  # an encoded image left behind: the encoding its header gave
    header_pixels: int | None = None  # an encoded image left behind: W x H from its header (None: unreadable)

    def left_behind(self, key: SegmentKey) -> ImageContent:
        """These raw pixels as sent on once decoded elsewhere: shape, key and length, no bytes."""
        return ImageContent(pixels=b"", shape=self.shape, pixels_key=key, pixels_length=len(self.pixels or b""))

    def encoded_left_behind(self, key: SegmentKey | None, encoding: str, size_px: int | None) -> ImageContent:
        """This encoded image as sent on once decoded elsewhere: key, length and header, no bytes.

        ``key`` is ``None`` where the receiver will not ask the cache (its image
        cache off, or the item's ``use_cache`` false): no digest for nothing.
        """
        return ImageContent(encoded=b"", pixels_key=key, pixels_length=len(self.encoded or b""),
                            header_encoding=encoding, header_pixels=size_px)

    @property
    def is_left_behind(self) -> bool:
        """Whether its bytes stayed where it was decoded (it can be keyed and counted, not decoded)."""
        return self.pixels_length is not None

    @property
    def num_bytes(self) -> int:
        """The bytes it arrived as (encoded, or raw pixels), left-behind pixels included."""
        if self.pixels_length is not None:
            return self.pixels_length
        return len(self.encoded or self.pixels or b"")


@dataclass(frozen=True)
class SegmentPlan:
    """The slots of a request (one per image, in order, and the text's) and the duty to resolve their claims.

    Immutable: ``resolved`` answers a new plan rather than filling this one in,
    so whoever holds a plan sees what was known when it was made.
    """

    images: tuple[SegmentSlot, ...]
    text: SegmentSlot | None
    lookup: Callable[[SegmentKey, bool], SegmentSlot] = dataclasses.field(repr=False)
    use_cache: bool = True

    def _slots(self) -> tuple[SegmentSlot, ...]:
        return self.images if self.text is None else (*self.images, self.text)

    @property
    def image_indices_to_compute(self) -> tuple[int, ...]:
        """Which images this request encodes itself (and so must decode)."""
        return tuple(index for index, slot in enumerate(self.images) if slot.needs_compute)

    @property
    def needs_image_pixels(self) -> bool:
        return any(slot.needs_compute for slot in self.images)

    @property
    def is_settled(self) -> bool:
        """Every claim this plan holds is resolved (published, failed or abandoned)."""
        return all(slot.is_settled for slot in self._slots())

    def image_statuses(self) -> tuple[str, ...]:
        return tuple(slot.status.value for slot in self.images)

    def statuses(self, *, images_as_list: bool = False) -> dict[str, str | list[str]]:
        """What the response's ``cache`` field says, per segment: ``image`` for one image, ``images`` (one
        status per image) for more, or for any number when the request sent a list."""
        statuses: dict[str, str | list[str]] = {}
        if len(self.images) == 1 and not images_as_list:
            statuses["image"] = self.images[0].status.value
        elif self.images:
            statuses["images"] = list(self.image_statuses())
        if self.text is not None:
            statuses["text"] = self.text.status.value
        return statuses

    @property
    def awaits_others(self) -> bool:
        """Whether a segment of it is being computed for another request, which ``resolved`` awaits."""
        return any(slot.status == SlotStatus.COALESCED and slot.value is None for slot in self._slots())

    async def _resolved_slot(self, slot: SegmentSlot | None) -> SegmentSlot | None:
        while slot is not None and slot.status == SlotStatus.COALESCED and slot.value is None:
            try:
                value = await asyncio.wrap_future(slot.future)
            except ClaimAbandonedError:
                # The owner never computed it: look again (we may own it now).
                assert slot.key is not None  # a coalesced slot was looked up by its key
                slot = self.lookup(slot.key, self.use_cache)
            else:
                slot = dataclasses.replace(slot, value=value)
        return slot

    async def resolved(self) -> SegmentPlan:
        """This plan with the segments other requests computed in hand.

        A slot whose owner abandoned it is looked up again, so the new plan may
        hold a claim this one did not (and then need that image's pixels). If
        this is cancelled in between, the claims it took are abandoned before
        the cancellation goes on: nobody else holds them yet.
        """
        if not self.awaits_others:
            return self  # nothing to await: the plan as it is
        old = self._slots()
        new: list[SegmentSlot] = []
        try:
            for slot in old:
                new.append(await self._resolved_slot(slot))
        except BaseException:
            for before, after in zip(old, new):
                if after is not before and after.claim is not None:
                    after.claim.abandon()
            raise
        num_images = len(self.images)
        return dataclasses.replace(self, images=tuple(new[:num_images]),
                                   text=new[num_images] if self.text is not None else None)

    @property
    def image_values(self) -> tuple[ImageSegment | None, ...]:
        return tuple(slot.value for slot in self.images)

    @property
    def text_value(self) -> TextSegment | None:
        return None if self.text is None else self.text.value

    def publish(self, images: Sequence[ImageSegment | None], text: TextSegment | None,
                wait_for_device: Callable[[], None] = lambda: None) -> None:
        """Hand computed segments to the cache (as compact copies) and to every waiter.

        ``images`` follows the plan's image slots. ``wait_for_device`` runs
        after the copies are queued and before anyone can see them: on a GPU
        another executor's stream may read them next.
        """
        if len(images) != len(self.images):
            raise ValueError(f"{len(images)} image segments for a plan of {len(self.images)} images")
        ready = []
        for slot, value in (*zip(self.images, images), (self.text, text)):
            if slot is not None and slot.claim is not None and value is not None:
                ready.append((slot, value.compact() if slot.status == SlotStatus.MISS else value))
        if ready:
            wait_for_device()
        for slot, value in ready:
            try:
                slot.claim.complete(value, value.size_bytes)
            except ClaimAlreadyResolvedError:
                pass  # abandoned meanwhile (the client left); waiters already retried

    def fail(self, error: BaseException) -> None:
        """Raise ``error`` in every waiter of this plan's open claims; nothing is cached."""
        for slot in self._slots():
            if slot.claim is not None:
                try:
                    slot.claim.fail(error)
                except ClaimAlreadyResolvedError:
                    pass

    def abandon(self) -> None:
        """Give up every claim still open (waiters look again); a no-op for resolved ones."""
        for slot in self._slots():
            if slot.claim is not None:
                slot.claim.abandon()


_UNASKED: SegmentSlot = SegmentSlot(None, SlotStatus.BYPASS)
"""A segment the cache is not asked about: computed by its request, published nowhere."""


class SegmentCatalog:
    """Derives segment keys for one model and looks them up in the cache."""

    def __init__(self, cache: SegmentCache, model_fingerprint: str, image_preprocess_id: str) -> None:
        self.cache = cache
        self.model_fingerprint = model_fingerprint
        self.image_preprocess_id = image_preprocess_id

    def image_key(self, content: ImageContent) -> SegmentKey:
        if content.pixels_key is not None:  # bytes left behind where they were decoded: their key came along
            return content.pixels_key
        if content.is_left_behind:
            raise ValueError("an image left behind without its key was asked of the cache")
        if content.encoded is not None:
            return encoded_image_key(self.model_fingerprint, self.image_preprocess_id, content.encoded)
        return pixels_key(self.model_fingerprint, self.image_preprocess_id, content.pixels, content.shape)

    def text_key(self, token_ids: Sequence[int]) -> SegmentKey:
        return token_ids_key(self.model_fingerprint, TEXT_PREPROCESS_ID, token_ids)

    def lookup(self, key: SegmentKey, use_cache: bool) -> SegmentSlot:
        return self._slot(key, self.cache.lookup(key) if use_cache else self.cache.bypass(key), use_cache)

    def plan_texts(self, keys: Sequence[SegmentKey], use_cache: bool) -> list[SegmentPlan]:
        """One text-only plan per key, in order, all looked up under one cache lock (thread-safe).

        For a call of many texts (zero-shot labels, ``router.zero_shot``); the
        keys must be distinct, as ``SegmentCache.lookup_many`` needs.
        """
        found = self.cache.lookup_many(keys) if use_cache else [self.cache.bypass(key) for key in keys]
        return [SegmentPlan((), self._slot(key, lookup, use_cache), self.lookup, use_cache)
                for key, lookup in zip(keys, found)]

    def _slot(self, key: SegmentKey, found: CacheLookup, use_cache: bool) -> SegmentSlot:
        if not use_cache or not self.cache.is_enabled(key.modality):
            return SegmentSlot(key, SlotStatus.BYPASS, claim=found.claim)
        if found.kind == LookupKind.HIT:
            return SegmentSlot(key, SlotStatus.HIT, value=found.value)
        if found.kind == LookupKind.PENDING:
            return SegmentSlot(key, SlotStatus.COALESCED, future=found.future)
        return SegmentSlot(key, SlotStatus.MISS, claim=found.claim)

    def _is_asked(self, modality: Modality, use_cache: bool) -> bool:
        """Whether a segment of ``modality`` is keyed and looked up at all (else: bypass, unkeyed)."""
        return use_cache and self.cache.is_enabled(modality)

    def plan(self, images: Sequence[ImageContent], token_ids: Sequence[int] | None, use_cache: bool) -> SegmentPlan:
        """Look every segment up (thread-safe; the intake calls it from the decode pool).

        The same image twice in one request is looked up once: its second
        slot would otherwise wait on the first's claim, which only this
        request can resolve. The repeat holds no claim (the first slot
        publishes); if it needs computing it is computed again, a rare waste
        that keeps every slot independent. A segment the cache is not asked
        about (``use_cache: false``, or its modality off) is a bypass slot
        without key or claim: its digest would be computed for nothing.
        """
        slots: list[SegmentSlot] = []
        by_key: dict[SegmentKey, SegmentSlot] = {}
        is_image_asked = self._is_asked(Modality.IMAGE, use_cache)
        try:
            for content in images:
                if not is_image_asked:
                    slots.append(_UNASKED)
                    continue
                key = self.image_key(content)
                if key not in by_key:
                    by_key[key] = self.lookup(key, use_cache)
                    slots.append(by_key[key])
                else:
                    slots.append(dataclasses.replace(by_key[key], claim=None))
            if token_ids is None:
                text_slot = None
            elif self._is_asked(Modality.TEXT, use_cache):
                text_slot = self.lookup(self.text_key(token_ids), use_cache)
            else:
                text_slot = _UNASKED
        except BaseException:
            for slot in slots:
                if slot.claim is not None:
                    slot.claim.abandon()  # no plan holds it yet
            raise
        return SegmentPlan(tuple(slots), text_slot, self.lookup, use_cache)


__all__ = ["ImageContent", "Modality", "SegmentCatalog", "SegmentPlan", "SegmentSlot", "SlotStatus"]
