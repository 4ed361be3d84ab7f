"""Segment cache: content keys, a byte-bounded store per modality, single-flight.

Public API::

    key = encoded_image_key(fingerprint, preprocess_id, encoded_bytes)
    key = pixels_key(fingerprint, preprocess_id, pixel_bytes, shape)
    key = token_ids_key(fingerprint, preprocess_id, token_ids)

    cache = SegmentCache(image_budget_bytes, text_budget_bytes, on_event)
    found = cache.lookup(key)            # CacheLookup: hit | pending | miss
    found = cache.bypass(key)            # use_cache: false
    found.claim.complete(value, size_bytes) / .fail(exc) / .abandon()

Imports nothing of mmserve's and needs no torch: sizes and values come from
the caller.
"""

from cache.claim import Claim
from cache.errors import (
    CacheError,
    ClaimAbandonedError,
    ClaimAlreadyResolvedError,
    InvalidKeyInputError,
    InvalidSizeError,
)
from cache.events import CacheEvent, EventCallback
from cache.keys import (
    ContentKind,
    Modality,
    SegmentKey,
    encoded_image_key,
    pixels_key,
    token_ids_key,
)
from cache.lookup import CacheLookup, LookupKind
from cache.segment_cache import SegmentCache
from cache.store import CacheStats, ModalityStats, SegmentStore

__all__ = [
    "CacheError",
    "CacheEvent",
    "CacheLookup",
    "CacheStats",
    "Claim",
    "ClaimAbandonedError",
    "ClaimAlreadyResolvedError",
    "ContentKind",
    "EventCallback",
    "InvalidKeyInputError",
    "InvalidSizeError",
    "LookupKind",
    "Modality",
    "ModalityStats",
    "SegmentCache",
    "SegmentKey",
    "SegmentStore",
    "encoded_image_key",
    "pixels_key",
    "token_ids_key",
]
