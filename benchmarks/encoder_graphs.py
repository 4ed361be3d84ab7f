"""Eager encoders against their TorchScript graphs, alone and beside a busy Python thread.

In the server the compute thread shares the GIL with the event loop and the
decode threads. Eager PyTorch gives the GIL back around every operator and
takes it again after; a TorchScript graph (``models.graphs``) takes it once
per forward. This script times one batch of each encoder both ways, on an
idle interpreter and while another thread runs pure Python (a stand-in for
request handling), and prints the ratios. Eager and traced calls alternate
within each repeat, so drift in the machine's speed hits both alike; times
are medians.

How much the busy thread slows eager compute depends on the intra-op
thread count (``--threads``): with one torch thread every operator waits for
the GIL behind the busy thread, with two the waits mostly overlap.

    python -m benchmarks.encoder_graphs --presets tiny vit-b16 [--threads 1]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from benchmarks.encoder_tracing import trace_all_encoders
from benchmarks.harness import utc_now
from models.loading.repository import build_preset

BATCH_SIZE = 8
TEXT_TOKENS = 16


@dataclass(frozen=True)
class Timing:
    preset: str
    encoder: str
    background: str  # "idle" | "busy Python thread"
    eager_ms: float
    traced_ms: float

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.traced_ms


@contextmanager
def busy_python_thread() -> Iterator[None]:
    """A thread looping in pure Python for the block's duration (it holds the GIL whenever it can)."""
    stop = threading.Event()

    def spin() -> None:
        total = 0
        while not stop.is_set():
            for i in range(1000):
                total += i

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _median_ms(samples_ns: list[int]) -> float:
    return statistics.median(samples_ns) / 1e6


def time_alternating(eager: Callable[[], object], traced: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median ms of ``eager`` and ``traced``, called in turn ``repeats`` times each after one warm call."""
    eager(), traced()
    eager_ns, traced_ns = [], []
    for _ in range(repeats):
        for call, samples in ((eager, eager_ns), (traced, traced_ns)):
            started = time.perf_counter_ns()
            call()
            samples.append(time.perf_counter_ns() - started)
    return _median_ms(eager_ns), _median_ms(traced_ns)


def measure(preset: str, repeats: int) -> list[Timing]:
    model = build_preset(preset, seed=0).model
    size = model.vision.input_size
    images = torch.randint(0, 256, (BATCH_SIZE, size, size, 3), dtype=torch.uint8)
    token_ids = [list(range(3, 3 + TEXT_TOKENS - (row % 5))) for row in range(BATCH_SIZE)]
    eager = {"vision": lambda: model.encode_images(images),
             "text": lambda: model.encode_texts(token_ids, pad_to=TEXT_TOKENS)}
    trace_all_encoders(model)
    graphs = (model.vision.graph, model.text.graph)
    model.drop_encoder_graphs()

    def traced(name: str) -> Callable[[], object]:
        """``eager[name]`` with the graphs swapped in for the call (the eager variant runs without them)."""
        def call() -> object:
            model.vision.graph, model.text.graph = graphs
            try:
                return eager[name]()
            finally:
                model.drop_encoder_graphs()
        return call

    timings = []
    for name in ("vision", "text"):
        eager_ms, traced_ms = time_alternating(eager[name], traced(name), repeats)
        timings.append(Timing(preset, name, "idle", eager_ms, traced_ms))
        with busy_python_thread():
            eager_ms, traced_ms = time_alternating(eager[name], traced(name), repeats)
        timings.append(Timing(preset, name, "busy Python thread", eager_ms, traced_ms))
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "vit-b16"])
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed calls per variant (default: 50 for tiny, 5 otherwise)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(f"encoder graphs, {utc_now()}, {platform.machine()} {platform.processor() or ''}, "
          f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, python {platform.python_version()}")
    print(f"one batch of {BATCH_SIZE} (text: {TEXT_TOKENS}-token bucket), float32, CPU; medians, eager and traced "
          "alternating")
    header = f"{'preset':>8} {'encoder':>7} {'beside':>19} {'eager_ms':>9} {'traced_ms':>9} {'eager/traced':>12}"
    print(header)
    for preset in args.presets:
        repeats = args.repeats or (50 if preset == "tiny" else 5)
        for t in measure(preset, repeats):
            print(f"{t.preset:>8} {t.encoder:>7} {t.background:>19} {t.eager_ms:9.2f} {t.traced_ms:9.2f} "
                  f"{t.speedup:12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
