"""Which images are decoded on the event loop rather than in the decode pool: the small ones.

A hop to the decode pool and back costs a process more than decoding a small
image does: the pool thread is woken, the interpreter lock changes hands each
time libjpeg or the resize lets it go and wants it back, and the loop is woken
with the result. One process under ``wrk`` posting 224 x 224 JPEGs spent about
15 voluntary context switches per request that way, and 3 with the decode on
the loop (BENCHMARKS.md, history, 2026-12-04 ``frontend.py`` runs).

A large image still goes to the pool: decoding it would hold the loop, and
every other request on it, for milliseconds (a 1024 x 768 JPEG takes about
12 ms here), and the pool decodes several at once where the cores allow. The
limit counts a call's images together, by their sizes from their headers
(``router.image_header.image_pixels``, no decode):

    every image's W x H readable, and their sum <= inline_image_max_pixels   the loop
    otherwise (or 0 as the limit)                                            the pool

Both the intake (one process, or the engine) and an API process in front of
an engine (``server.workers.engine_client``) decide by ``decodes_inline``. The
engine counts only the images it must decode itself: those an API process
decoded are picked up on its loop whatever their size (``RequestIntake``).
"""

from __future__ import annotations

from collections.abc import Sequence

# 256 x 256: the input size of most image towers, decoded and resized in well under a millisecond.
INLINE_IMAGE_MAX_PIXELS = 65_536


def decodes_inline(image_pixels: Sequence[int | None], max_pixels: int) -> bool:
    """Whether images of these W x H (``None``: a header that could not be read) are decoded on the event
    loop: each size known, their sum within ``max_pixels``."""
    return bool(image_pixels) and None not in image_pixels and sum(image_pixels) <= max_pixels  # type: ignore[arg-type]
