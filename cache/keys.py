"""Content-addressed segment keys.

A key names one segment's result (an image's encoder output and K/V, or a
text's Q) by an exact BLAKE2b-256 digest over everything that decides it:

    +-------------+----------+--------------+-------------------+---------+
    | fingerprint | modality | content kind | preprocessing id  | content |
    +-------------+----------+--------------+-------------------+---------+
      model          image/     encoded/       resize, mean/std,   bytes,
      weights id     text       pixels/tokens  tokenizer, ...      shape, ids

Each field is framed as ``len (8 bytes, big-endian) || bytes``, so no two
different field tuples hash the same byte stream (``("ab", "c")`` and
``("a", "bc")`` differ in their length prefixes). The digest is never
truncated and has no time or random part: equal inputs give equal keys in
every process, and a new model fingerprint never meets an old entry.
"""

from __future__ import annotations

import enum
import hashlib
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from cache.errors import InvalidKeyInputError

DIGEST_SIZE_BYTES = 32
"""BLAKE2b output length; 256 bits makes an accidental collision a non-event."""

MIN_DIGEST_SIZE_BYTES = 16

_PERSON = b"mmserve.seg.v1"  # BLAKE2b personalisation: separates our digests from any other use
_LENGTH_PREFIX_BYTES = 8


class Modality(str, enum.Enum):
    """Which store partition (and which byte budget) a segment belongs to."""

    IMAGE = "image"
    TEXT = "text"


class ContentKind(str, enum.Enum):
    """How the content bytes were given; the same bytes as a different kind is different content."""

    ENCODED_IMAGE = "encoded_image"  # the file as uploaded (PNG, JPEG, ...): a hit skips decoding
    PIXELS_UINT8 = "pixels_uint8"  # raw HxWxC uint8 pixels, keyed with their shape
    TOKEN_IDS = "token_ids"  # token ids as little-endian int64


@dataclass(frozen=True, slots=True)
class SegmentKey:
    """Hashable identity of one cached segment.

    Build it with :func:`encoded_image_key`, :func:`pixels_key` or
    :func:`token_ids_key`; the constructor only checks the digest length.
    """

    modality: Modality
    digest: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.modality, Modality):
            raise InvalidKeyInputError(f"modality must be a Modality, got {self.modality!r}")
        if not isinstance(self.digest, bytes) or len(self.digest) < MIN_DIGEST_SIZE_BYTES:
            raise InvalidKeyInputError(
                f"digest must be at least {MIN_DIGEST_SIZE_BYTES} bytes, got {self.digest!r}"
            )

    @property
    def hex(self) -> str:
        """The full digest in hex, e.g. for logs and debug endpoints."""
        return self.digest.hex()

    def __repr__(self) -> str:
        return f"SegmentKey({self.modality.value}, {self.digest.hex()[:16]}...)"


def _framed_digest(fields: Sequence[bytes | memoryview]) -> bytes:
    """BLAKE2b-256 over ``len || bytes`` for each field, in order."""
    hasher = hashlib.blake2b(digest_size=DIGEST_SIZE_BYTES, person=_PERSON)
    for field in fields:
        hasher.update(len(field).to_bytes(_LENGTH_PREFIX_BYTES, "big"))
        hasher.update(field)
    return hasher.digest()


def _byte_view(content: bytes | bytearray | memoryview, what: str) -> memoryview:
    """A flat byte view of a C-contiguous buffer, without copying it."""
    view = memoryview(content)
    if not view.c_contiguous:
        raise InvalidKeyInputError(f"{what} must be a C-contiguous buffer")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _segment_key(
    model_fingerprint: str,
    modality: Modality,
    kind: ContentKind,
    preprocess_id: str,
    content_fields: Sequence[bytes | memoryview],
) -> SegmentKey:
    if not model_fingerprint:
        raise InvalidKeyInputError("model_fingerprint must be a non-empty string")
    header = (
        model_fingerprint.encode("utf-8"),
        modality.value.encode("ascii"),
        kind.value.encode("ascii"),
        preprocess_id.encode("utf-8"),
    )
    return SegmentKey(modality, _framed_digest((*header, *content_fields)))


def encoded_image_key(
    model_fingerprint: str, preprocess_id: str, encoded: bytes | bytearray | memoryview
) -> SegmentKey:
    """Key for an image as uploaded (the encoded file bytes), so a hit skips decoding."""
    view = _byte_view(encoded, "encoded image")
    return _segment_key(
        model_fingerprint, Modality.IMAGE, ContentKind.ENCODED_IMAGE, preprocess_id, (view,)
    )


def pixels_key(
    model_fingerprint: str,
    preprocess_id: str,
    pixels: bytes | bytearray | memoryview,
    shape: Sequence[int],
) -> SegmentKey:
    """Key for raw uint8 pixels; the shape is part of the content (2x6 is not 3x4)."""
    if not shape or any(not isinstance(dim, int) or dim < 0 for dim in shape):
        raise InvalidKeyInputError(f"shape must be non-negative ints, got {tuple(shape)!r}")
    view = _byte_view(pixels, "pixels")
    num_bytes_expected = math.prod(shape)  # uint8: one byte per element
    if view.nbytes != num_bytes_expected:
        raise InvalidKeyInputError(
            f"pixels hold {view.nbytes} bytes but shape {tuple(shape)} needs {num_bytes_expected}"
        )
    packed_shape = struct.pack(f">{len(shape)}Q", *shape)
    return _segment_key(
        model_fingerprint, Modality.IMAGE, ContentKind.PIXELS_UINT8, preprocess_id, (packed_shape, view)
    )


def token_ids_key(model_fingerprint: str, preprocess_id: str, token_ids: Sequence[int]) -> SegmentKey:
    """Key for a text by its token ids (after truncation, if the request allowed it)."""
    try:
        packed = struct.pack(f"<{len(token_ids)}q", *token_ids)
    except struct.error as e:
        raise InvalidKeyInputError(f"token ids must be int64: {e}") from e
    return _segment_key(
        model_fingerprint, Modality.TEXT, ContentKind.TOKEN_IDS, preprocess_id, (packed,)
    )
