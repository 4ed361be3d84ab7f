"""CPU benchmark of the image ingest path: uint8 to the model vs float32 normalised on the host.

For a batch of decoded 224x224 RGB images (uint8 HxWx3 arrays, as the server's
decoder produces them) it times, per batch:

  uint8    collate the uint8 arrays -> copy B*H*W*3 bytes to the model's input
           buffer (stands in for the host-to-device copy) -> normalise with
           ``kernels.preprocess_uint8`` (the torch path on CPU; the Triton kernel
           on a GPU)
  float32  normalise each image on the host to planar float32 (the classic
           ToTensor + Normalize transform) -> collate -> copy 4*B*3*H*W bytes

The two variants alternate within every repeat, so drift in machine speed hits
both alike. Times are medians of ``time.perf_counter_ns`` samples. On a CPU the
"copy" is a memcpy; on a GPU it is the PCIe transfer, where the 4x fewer bytes
matter most.

    python benchmarks/ingest_uint8.py --batch-sizes 1 8 32 --repeats 30
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from benchmarks.harness import abba_order
from kernels import preprocess_uint8

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
STAGES = ("collate", "copy", "normalise")


@dataclass(frozen=True)
class StageTimes:
    """One run of one variant, in nanoseconds per stage."""

    collate_ns: int
    copy_ns: int
    normalise_ns: int

    @property
    def total_ns(self) -> int:
        return self.collate_ns + self.copy_ns + self.normalise_ns


class Uint8Path:
    """Collate uint8, copy uint8, normalise where the model runs."""

    def __init__(self, num_images: int, size: int) -> None:
        self.input_buffer = torch.empty(num_images, size, size, 3, dtype=torch.uint8)  # (B, H, W, 3)
        self.copied_bytes = self.input_buffer.numel() * self.input_buffer.element_size()

    def run(self, images: list[np.ndarray]) -> tuple[StageTimes, torch.Tensor]:
        t0 = time.perf_counter_ns()
        batch = torch.from_numpy(np.stack(images))  # (B, H, W, 3) uint8
        t1 = time.perf_counter_ns()
        self.input_buffer.copy_(batch)
        t2 = time.perf_counter_ns()
        out = preprocess_uint8(self.input_buffer, IMAGENET_MEAN, IMAGENET_STD, torch.float32)  # (B, 3, H, W)
        t3 = time.perf_counter_ns()
        return StageTimes(t1 - t0, t2 - t1, t3 - t2), out


class Float32Path:
    """Normalise each image on the host, collate float32, copy float32."""

    def __init__(self, num_images: int, size: int) -> None:
        self.input_buffer = torch.empty(num_images, 3, size, size, dtype=torch.float32)  # (B, 3, H, W)
        self.copied_bytes = self.input_buffer.numel() * self.input_buffer.element_size()
        self.mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)  # (3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD).view(3, 1, 1)  # (3, 1, 1)

    def _normalise(self, image: np.ndarray) -> torch.Tensor:
        planar = torch.from_numpy(image).permute(2, 0, 1)  # (3, H, W) uint8 view
        return planar.to(torch.float32).div_(255.0).sub_(self.mean).div_(self.std)  # (3, H, W)

    def run(self, images: list[np.ndarray]) -> tuple[StageTimes, torch.Tensor]:
        t0 = time.perf_counter_ns()
        normalised = [self._normalise(image) for image in images]
        t1 = time.perf_counter_ns()
        batch = torch.stack(normalised)  # (B, 3, H, W)
        t2 = time.perf_counter_ns()
        self.input_buffer.copy_(batch)
        t3 = time.perf_counter_ns()
        # Normalising happened before the collate here; report it as its own stage.
        return StageTimes(collate_ns=t2 - t1, copy_ns=t3 - t2, normalise_ns=t1 - t0), self.input_buffer


def _median_ms(samples: list[StageTimes], field: Callable[[StageTimes], int]) -> float:
    return statistics.median(field(s) for s in samples) / 1e6


def measure(num_images: int, size: int, repeats: int, warmup: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(num_images)]
    uint8_path, float32_path = Uint8Path(num_images, size), Float32Path(num_images, size)
    paths: dict[str, Uint8Path | Float32Path] = {"uint8": uint8_path, "float32": float32_path}
    _, out_uint8 = uint8_path.run(images)
    _, out_float32 = float32_path.run(images)
    max_diff = (out_uint8 - out_float32).abs().max().item()
    if max_diff > 1e-5:
        raise SystemExit(f"the two paths disagree by {max_diff} at batch {num_images}")
    samples: dict[str, list[StageTimes]] = {"uint8": [], "float32": []}
    for i in range(warmup + repeats):
        # Alternate which variant goes first (A-B-B-A), so neither always runs on a warm cache.
        for name in abba_order(i, "uint8", "float32"):
            times, _ = paths[name].run(images)
            if i >= warmup:
                samples[name].append(times)
    rows = []
    totals = {name: _median_ms(s, lambda t: t.total_ns) for name, s in samples.items()}
    for name, path in (("uint8", uint8_path), ("float32", float32_path)):
        s = samples[name]
        rows.append(
            f"{num_images:>5}  {name:<8}"
            f"{_median_ms(s, lambda t: t.collate_ns):>11.3f}"
            f"{_median_ms(s, lambda t: t.copy_ns):>10.3f}"
            f"{_median_ms(s, lambda t: t.normalise_ns):>14.3f}"
            f"{totals[name]:>11.3f}"
            f"{path.copied_bytes / 1e6:>13.2f}"
            f"{totals['float32'] / totals[name]:>17.2f}"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--image-size", type=int, default=224, help="square input side in pixels (ViT-L/16: 224)")
    parser.add_argument("--repeats", type=int, default=30, help="timed runs per variant and batch size")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs per variant first")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if min(args.batch_sizes) < 1 or args.image_size < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("batch sizes, image size and repeats must be positive; warmup non-negative")
    torch.set_num_threads(args.threads)
    print(
        f"ingest {args.image_size}x{args.image_size} RGB, median of {args.repeats} interleaved runs "
        f"(after {args.warmup} warm-up), torch {torch.__version__}, {args.threads} thread(s), times in ms"
    )
    header = f"{'batch':>5}  {'variant':<8}{'collate':>11}{'copy':>10}{'normalise':>14}{'total':>11}"
    print(header + f"{'copied_MB':>13}{'float32/this':>17}")
    for num_images in args.batch_sizes:
        for row in measure(num_images, args.image_size, args.repeats, args.warmup, args.seed):
            print(row)


if __name__ == "__main__":
    main()
