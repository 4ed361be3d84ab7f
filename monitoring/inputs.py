"""What a request carried, in fixed buckets: the input dimensions drift is split by.

The server knows what each request sent (how large its images were, how
they were encoded, how many text tokens, ...); the monitor knows which stage
slowed down. ``RequestInputs`` carries the first to the second as labels of
a fixed set of values per dimension, so that attribution can say "the slow
ones were the 4K PNGs" while memory stays bounded by construction::

    dimension        values (in this order)
    ---------        ------------------------------------------------------------
    image_pixels     none  0-0.25MP  0.25-1MP  1-4MP  4-16MP  16MP+  unknown
    image_encoding   none  jpeg  png  webp  gif  raw_uint8  mixed  other
    text_tokens      none  0  1-16  17-64  65-256  257+
    images           0  1  2  3  4+
    priority         high  normal  low  other
    protocol         native  kserve_v2  kserve_v2_grpc  openai  other
    engine           0  1  2  3  4  5  6  7  other

``none`` means the request carried no image (or no text). A request's
pixel bucket is its *largest* image's W x H (the one that costs most to
decode and resize). A label outside the table (a new encoding, a new
protocol) becomes ``other`` (``unknown`` for pixels) when the inputs are
built, never a new value: 44 values in all, whatever the clients send.

Bucketing happens when the server builds the inputs, once per request;
each distinct combination (at most 7 * 8 * 6 * 5 * 4 * 5 * 9 = 302 400) is one
interned object with a precomputed ``code``, so the folder reads one int per
record and never hashes labels.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

IMAGE_PIXELS = "image_pixels"
IMAGE_ENCODING = "image_encoding"
TEXT_TOKENS = "text_tokens"
IMAGES = "images"
PRIORITY = "priority"
PROTOCOL = "protocol"
ENGINE = "engine"

NONE = "none"
OTHER = "other"
UNKNOWN = "unknown"

# (upper edge in pixels, label); above the last edge: "16MP+".
_PIXEL_BUCKETS: tuple[tuple[int, str], ...] = (
    (250_000, "0-0.25MP"), (1_000_000, "0.25-1MP"), (4_000_000, "1-4MP"), (16_000_000, "4-16MP"),
)
_TOKEN_BUCKETS: tuple[tuple[int, str], ...] = ((0, "0"), (16, "1-16"), (64, "17-64"), (256, "65-256"))
_MAX_COUNTED_IMAGES = 4
_NAMED_ENGINES = 8  # engines 0-7 by their number (a box's GPUs), the rest as "other"

DIMENSIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (IMAGE_PIXELS, (NONE, *(label for _, label in _PIXEL_BUCKETS), "16MP+", UNKNOWN)),
    (IMAGE_ENCODING, (NONE, "jpeg", "png", "webp", "gif", "raw_uint8", "mixed", OTHER)),
    (TEXT_TOKENS, (NONE, *(label for _, label in _TOKEN_BUCKETS), "257+")),
    (IMAGES, ("0", "1", "2", "3", "4+")),
    (PRIORITY, ("high", "normal", "low", OTHER)),
    (PROTOCOL, ("native", "kserve_v2", "kserve_v2_grpc", "openai", OTHER)),
    (ENGINE, (*(str(engine) for engine in range(_NAMED_ENGINES)), OTHER)),
)
"""Every dimension and its fixed values, in the order of ``VALUES``."""

VALUES: tuple[tuple[str, str], ...] = tuple((name, value) for name, values in DIMENSIONS for value in values)
"""Every ``(dimension, value)``; a histogram row per entry (``monitoring.input_histograms``)."""

NUM_VALUES = len(VALUES)


def _dimension_slices() -> dict[str, slice]:
    slices, start = {}, 0
    for name, values in DIMENSIONS:
        slices[name] = slice(start, start + len(values))
        start += len(values)
    return slices


DIMENSION_SLICES: dict[str, slice] = _dimension_slices()
"""Rows of ``VALUES`` that belong to each dimension."""

_RADICES = np.array([len(values) for _, values in DIMENSIONS], dtype=np.int64)
_STRIDES = np.concatenate(([1], np.cumprod(_RADICES[:-1])))
NUM_COMBINATIONS = int(np.prod(_RADICES))
"""Distinct ``RequestInputs`` there can be (302 400); codes are ``0 .. NUM_COMBINATIONS - 1``."""
_OFFSETS = np.array([s.start for s in DIMENSION_SLICES.values()], dtype=np.int64)
_INDEX = [{value: i for i, value in enumerate(values)} for _, values in DIMENSIONS]
_FALLBACK = [len(values) - 1 if values[-1] in (OTHER, UNKNOWN) else None for _, values in DIMENSIONS]


def pixels_bucket(num_pixels: int | None, has_image: bool = True) -> str:
    """The ``image_pixels`` label of an image of ``num_pixels`` (``None``: its size is unknown)."""
    if not has_image:
        return NONE
    if num_pixels is None or num_pixels < 0:
        return UNKNOWN
    for upper, label in _PIXEL_BUCKETS:
        if num_pixels <= upper:
            return label
    return "16MP+"


def tokens_bucket(num_tokens: int | None) -> str:
    """The ``text_tokens`` label of a text of ``num_tokens`` tokens (``None``: no text)."""
    if num_tokens is None:
        return NONE
    for upper, label in _TOKEN_BUCKETS:
        if num_tokens <= upper:
            return label
    return "257+"


def images_bucket(num_images: int) -> str:
    """The ``images`` label: ``"0"`` ... ``"3"``, then ``"4+"``."""
    return f"{_MAX_COUNTED_IMAGES}+" if num_images >= _MAX_COUNTED_IMAGES else str(max(num_images, 0))


@dataclass(frozen=True, slots=True)
class RequestInputs:
    """One request's value in every input dimension; build it with ``RequestInputs.of``.

    Attributes:
        image_pixels ... engine: The labels, each one of ``DIMENSIONS``' values.
        code: The combination's number (mixed radix over the dimensions), what
            the folder reads; not part of equality.
    """

    image_pixels: str
    image_encoding: str
    text_tokens: str
    images: str
    priority: str
    protocol: str
    engine: str
    code: int = field(compare=False, repr=False)

    @classmethod
    def of(
        cls,
        *,
        largest_image_pixels: int | None,
        image_encoding: str | None,
        num_text_tokens: int | None,
        num_images: int,
        priority: str,
        protocol: str,
        engine: int = 0,
    ) -> RequestInputs:
        """Bucket one request's plain facts; any label outside the fixed values becomes ``other``/``unknown``.

        Args:
            largest_image_pixels: W x H of the request's largest image (``None``: unknown or no image).
            image_encoding: ``jpeg``, ``png``, ``webp``, ``gif``, ``raw_uint8``, ``mixed``, ... (``None``: no image).
            num_text_tokens: Tokens of its text after tokenization (``None``: no text).
            num_images: Images it carried.
            priority: ``high``, ``normal`` or ``low``.
            protocol: ``native``, ``kserve_v2``, ``kserve_v2_grpc`` or ``openai``.
            engine: The engine that computed it (0 with one engine), so a stall on one engine is named.
        """
        has_image = num_images > 0
        return _interned((
            pixels_bucket(largest_image_pixels, has_image),
            (image_encoding or OTHER) if has_image else NONE,
            tokens_bucket(num_text_tokens),
            images_bucket(num_images),
            priority,
            protocol,
            str(engine),
        ))

    def labels(self) -> dict[str, str]:
        """``{dimension: value}``."""
        return dict(zip((name for name, _ in DIMENSIONS), self._values()))

    def _values(self) -> tuple[str, ...]:
        return (self.image_pixels, self.image_encoding, self.text_tokens, self.images, self.priority, self.protocol,
                self.engine)


@functools.lru_cache(maxsize=4096)  # labels as the caller gave them: bounded, since they need not be ours
def _interned(labels: tuple[str, ...]) -> RequestInputs:
    return _interned_checked(tuple(_checked(d, label) for d, label in enumerate(labels)))


@functools.lru_cache(maxsize=None)  # keyed by checked labels only: as bounded as the table
def _interned_checked(labels: tuple[str, ...]) -> RequestInputs:
    code = sum(_INDEX[d][label] * int(_STRIDES[d]) for d, label in enumerate(labels))
    return RequestInputs(*labels, code=code)


@functools.lru_cache(maxsize=None, typed=True)  # at most NUM_COMBINATIONS entries (typed: 1.0 and True are no code)
def inputs_of_code(code: int) -> RequestInputs:
    """The ``RequestInputs`` whose ``code`` this is (interned, as ``RequestInputs.of`` gives it).

    A record that crosses between processes carries the one int instead of the
    labels (``server.workers.engine_monitor``): its receiver, the engine every
    request passes, looks the inputs up rather than building them per record.
    Raises ``ValueError`` for a number that is no combination's.
    """
    if type(code) is not int or not 0 <= code < NUM_COMBINATIONS:
        raise ValueError(f"{code!r} is no RequestInputs code (0 .. {NUM_COMBINATIONS - 1})")
    return _interned_checked(tuple(values[(code // int(stride)) % len(values)]
                                   for (_, values), stride in zip(DIMENSIONS, _STRIDES)))


def _checked(dimension: int, label: str) -> str:
    if label in _INDEX[dimension]:
        return label
    fallback = _FALLBACK[dimension]
    if fallback is None:
        raise ValueError(f"{DIMENSIONS[dimension][0]} has no value {label!r}")  # a bucket function's bug
    return DIMENSIONS[dimension][1][fallback]


def value_rows(codes: np.ndarray) -> np.ndarray:
    """Rows of ``VALUES`` of each code: ``(len(codes), num dimensions)`` int64, one value per dimension."""
    return (codes[:, None] // _STRIDES) % _RADICES + _OFFSETS  # (num_codes, num_dimensions)
