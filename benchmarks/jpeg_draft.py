"""--jpeg-draft: the decode CPU it saves, and how close its embeddings stay to the exact path's.

    python -m benchmarks.jpeg_draft [--preset vit-b16] [--sizes 640x480 1024x768 2048x1536 4000x3000]

For each size, a photo-like JPEG (``benchmarks.photo_like``: gradients,
texture and noise at quality 90, synthesised here since no photograph can
be downloaded; several seeds per size) is decoded two ways, as
``server.ingest.decoding`` does: exactly, and with Pillow's ``Image.draft``
at the largest DCT reduction (1/2, 1/4, 1/8) that leaves both sides at
least max(resize_size, input_size) of the preset. Each is then resized to
the model's input (``models.preprocessing``). The script prints the CPU
per image (process time, decode alone and decode + resize, exact and
draft) and the cosine between the preset model's image embeddings of the
two (in this process, random weights of the named preset: what the
embedding does with the pixel difference, not a trained model's semantics).
The issue's bar: a cosine >= 0.999 to be worth offering.
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from benchmarks.harness.table_layout import align
from benchmarks.photo_like import photo_like_jpeg

WORTH_OFFERING_COSINE = 0.999


def parse_size(text: str) -> tuple[int, int]:
    """``1024x768`` -> (1024, 768)."""
    width, _, height = text.lower().partition("x")
    return int(width), int(height)


def draft_scale(width: int, height: int, draft_side: int) -> int:
    """The reduction Pillow's ``draft`` picks for (draft_side, draft_side): the largest keeping both sides."""
    fits = min(width // draft_side, height // draft_side)
    return next((scale for scale in (8, 4, 2) if fits >= scale), 1)


def decode(jpeg: bytes, draft_side: int | None) -> Image.Image:
    """The server's decode: open, optionally draft, load, EXIF-orient, RGB."""
    from models.rgb import to_rgb

    image = Image.open(io.BytesIO(jpeg))
    if draft_side is not None and draft_scale(image.width, image.height, draft_side) > 1:
        image.draft(None, (draft_side, draft_side))
    image.load()
    return to_rgb(ImageOps.exif_transpose(image))


def cpu_ms_per_call(call: Callable[[], object], min_seconds: float, min_calls: int = 3) -> float:
    """Process CPU milliseconds per call of ``call``, over at least ``min_seconds`` and ``min_calls``."""
    call()  # warm
    num_calls, started_s, deadline_s = 0, time.process_time(), time.monotonic() + min_seconds
    while num_calls < min_calls or time.monotonic() < deadline_s:
        call()
        num_calls += 1
    return 1000.0 * (time.process_time() - started_s) / num_calls


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))


@dataclass(frozen=True)
class SizeResult:
    size: tuple[int, int]
    scale: int
    decode_exact_ms: float
    decode_draft_ms: float
    total_exact_ms: float  # decode + resize
    total_draft_ms: float
    min_cosine: float
    mean_abs_level: float  # mean |exact - draft| of the model-input pixels, in levels of 255

    @property
    def saved_fraction(self) -> float:
        return 1.0 - self.total_draft_ms / self.total_exact_ms if self.total_exact_ms > 0 else 0.0


def measure_size(size: tuple[int, int], seeds: Sequence[int], preprocess, embed: Callable[[np.ndarray], np.ndarray],
                 min_seconds: float) -> SizeResult:
    from models.preprocessing import resize_to_model_input

    draft_side = max(preprocess.resize_size, preprocess.input_size)
    jpegs = [photo_like_jpeg(*size, seed=seed) for seed in seeds]
    cosines, levels = [], []
    for jpeg in jpegs:
        exact = resize_to_model_input(decode(jpeg, None), preprocess)  # (S, S, 3)
        draft = resize_to_model_input(decode(jpeg, draft_side), preprocess)  # (S, S, 3)
        levels.append(float(np.abs(exact.astype(np.int16) - draft.astype(np.int16)).mean()))
        cosines.append(cosine(embed(exact), embed(draft)))
    first = jpegs[0]
    return SizeResult(
        size, draft_scale(*size, draft_side),
        cpu_ms_per_call(lambda: decode(first, None), min_seconds),
        cpu_ms_per_call(lambda: decode(first, draft_side), min_seconds),
        cpu_ms_per_call(lambda: resize_to_model_input(decode(first, None), preprocess), min_seconds),
        cpu_ms_per_call(lambda: resize_to_model_input(decode(first, draft_side), preprocess), min_seconds),
        min(cosines), sum(levels) / len(levels))


def table_rows(results: Sequence[SizeResult]) -> list[list[str]]:
    rows = [["size", "scale", "decode exact ms", "decode draft ms", "+resize exact", "+resize draft", "saved",
             "min cosine", "mean |diff| levels", f">= {WORTH_OFFERING_COSINE}"]]
    for r in results:
        rows.append([f"{r.size[0]}x{r.size[1]}", f"1/{r.scale}", f"{r.decode_exact_ms:.2f}", f"{r.decode_draft_ms:.2f}",
                     f"{r.total_exact_ms:.2f}", f"{r.total_draft_ms:.2f}", f"{100 * r.saved_fraction:.0f}%",
                     f"{r.min_cosine:.6f}", f"{r.mean_abs_level:.2f}",
                     "yes" if r.min_cosine >= WORTH_OFFERING_COSINE else "no"])
    return rows


def image_embedder(preset: str) -> tuple[object, Callable[[np.ndarray], np.ndarray]]:
    """The preset's preprocessing and a function: (S, S, 3) uint8 -> its served image embedding (float32)."""
    import torch

    from models.loading.repository import build_preset

    bundle = build_preset(preset, seed=0)

    def embed(pixels: np.ndarray) -> np.ndarray:
        segment = bundle.model.encode_images(torch.from_numpy(np.ascontiguousarray(pixels))[None])[0]  # (1,S,S,3)
        return segment.pooled.float().cpu().numpy()

    return bundle.config.preprocess, embed


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.harness import machine_line, utc_now

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="vit-b16", help="the model whose input size and embeddings count")
    parser.add_argument("--sizes", nargs="+", type=parse_size,
                        default=[(640, 480), (1024, 768), (2048, 1536), (4000, 3000)])
    parser.add_argument("--seeds", type=int, default=3, help="photo-like images per size (default 3)")
    parser.add_argument("--seconds", type=float, default=2.0, help="least CPU timing per figure (default 2)")
    args = parser.parse_args(argv)
    preprocess, embed = image_embedder(args.preset)
    print(f"--jpeg-draft, {args.preset} (random weights, input {preprocess.input_size}, resize "
          f"{preprocess.resize_size}), {utc_now()}, {machine_line()}")
    print(f"photo-like JPEGs synthesised here (gradients + texture + noise, quality 90; not photographs), "
          f"{args.seeds} per size; CPU per image in this process")
    results = [measure_size(size, range(args.seeds), preprocess, embed, args.seconds) for size in args.sizes]
    print("\n".join(align(table_rows(results))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
