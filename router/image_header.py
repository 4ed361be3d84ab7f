"""What an image's first bytes say without decoding it: its encoding (magic bytes) and its size (header fields).

    format   magic bytes                   size read from
    ------   -----------                   --------------
    png      89 50 4E 47 0D 0A 1A 0A       IHDR width, height (big-endian u32 at 16, 20)
    jpeg     FF D8 FF                      the first SOFn segment (markers walked by length)
    webp     "RIFF" .... "WEBP"            the VP8 / VP8L / VP8X chunk header
    gif      "GIF87a" / "GIF89a"           logical screen width, height (little-endian u16 at 6, 8)
    raw_uint8 (pixels sent with a shape)   the shape
    other    anything else (BMP, TIFF, ...; the decoder may still accept it)   unknown

This is the one place that reads magic bytes, and its labels are the one
vocabulary for an image's encoding: span attributes, drift attribution
(``image_encoding``: these plus ``none`` for no image), fault drills
(``only_encoding``) and ``/v1/monitoring/drift`` all use them. A request's
images together are labelled ``mixed`` when their encodings differ.

Microseconds per image and no Pillow, so it runs on the event loop, for
every request, cache hits included (a hit is never decoded): the intake
computes an item's facts with it once (``router.item_facts``), and the
fault drill can stall PNGs only.
It trusts the header, as Pillow's own size check does before decoding; a
header it cannot read gives ``None`` (the monitor's ``unknown``), never an
error: refusing bad images is the decoder's job.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Sequence

from router.segments import ImageContent

RAW_UINT8 = "raw_uint8"
MIXED = "mixed"
OTHER = "other"
ENCODINGS: tuple[str, ...] = ("jpeg", "png", "webp", "gif", RAW_UINT8, MIXED, OTHER)
"""Every label ``images_encoding`` gives a request with images."""

_PNG = b"\x89PNG\r\n\x1a\n"
# SOF0..SOF15 carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but do not.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RST0..7: no length field
# A JPEG's frame header sits after its tables (EXIF, ICC, quantisation, Huffman): a few dozen
# segments at most. Walking more than this is not a JPEG worth labelling.
_MAX_JPEG_SEGMENTS = 256
_MAX_JPEG_FILL_BYTES = 64  # 0xFF padding before one marker; a run longer than this is not a header


def encoding_of_bytes(data: bytes) -> str:
    """``png``, ``jpeg``, ``webp``, ``gif`` or ``other`` from the first bytes."""
    if data.startswith(_PNG):
        return "png"
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    return OTHER


def image_encoding(content: ImageContent) -> str:
    """The encoding of one image as it arrived (``raw_uint8`` for pixels sent with their shape)."""
    if content.pixels is not None:
        return RAW_UINT8
    if content.header_encoding is not None:  # left behind where it was decoded: its header came along
        return content.header_encoding
    return encoding_of_bytes(content.encoded or b"")


def images_encoding(images: Sequence[ImageContent]) -> str | None:
    """The encoding of a request's images: theirs when they agree, ``mixed`` when not, ``None`` without images."""
    return combined_encoding([image_encoding(image) for image in images])


def combined_encoding(encodings: Collection[str]) -> str | None:
    """One label for several images' encodings: theirs when they agree, ``mixed`` when not, ``None`` for none."""
    distinct = set(encodings)
    if not distinct:
        return None
    return distinct.pop() if len(distinct) == 1 else MIXED


def image_pixels(content: ImageContent) -> int | None:
    """W x H of one image from its shape or header; ``None`` when the header cannot be read."""
    if content.pixels is not None:
        shape = content.shape or ()
        return int(shape[0]) * int(shape[1]) if len(shape) >= 2 else None
    if content.header_encoding is not None:  # left behind where it was decoded: its header came along
        return content.header_pixels
    size = image_size_px(content.encoded or b"")
    return None if size is None else size[0] * size[1]


def largest_image_pixels(images: Sequence[ImageContent]) -> int | None:
    """The largest W x H among a request's images; ``None`` without images or when one cannot be read."""
    return largest_of([image_pixels(image) for image in images])


def largest_of(sizes: Collection[int | None]) -> int | None:
    """The largest of several images' W x H; ``None`` for none, or when one is unknown."""
    if not sizes or any(size is None for size in sizes):
        return None
    return max(sizes)  # type: ignore[type-var]  # no None left


def image_size_px(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from the header of a PNG, JPEG, WebP or GIF; ``None`` otherwise."""
    try:
        encoding = encoding_of_bytes(data)
        if encoding == "png" and data[12:16] == b"IHDR":
            return struct.unpack(">II", data[16:24])
        if encoding == "gif":
            return struct.unpack("<HH", data[6:10])
        if encoding == "webp":
            return _webp_size(data)
        if encoding == "jpeg":
            return _jpeg_size(data)
    except (struct.error, IndexError):  # cut short inside the header
        return None
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":  # lossy: key-frame start code, then 14-bit sizes
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and data[20:21] == b"\x2f":  # lossless: 14-bit (width - 1), (height - 1)
        (bits,) = struct.unpack("<I", data[21:25])
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:  # extended: 24-bit (canvas width - 1), (canvas height - 1)
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    offset = 2
    for _ in range(_MAX_JPEG_SEGMENTS):
        if data[offset:offset + 1] != b"\xff":
            return None
        for _ in range(_MAX_JPEG_FILL_BYTES):
            if data[offset + 1:offset + 2] != b"\xff":
                break
            offset += 1  # a fill byte before the marker
        else:
            return None
        if offset + 2 > len(data):
            return None
        marker = data[offset + 1]
        if marker in _JPEG_STANDALONE:
            offset += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, start of scan: no frame header came first
            return None
        (length,) = struct.unpack(">H", data[offset + 2:offset + 4])
        if marker in _JPEG_SOF:
            height, width = struct.unpack(">HH", data[offset + 5:offset + 9])
            return width, height
        if length < 2:
            return None
        offset += 2 + length
    return None
