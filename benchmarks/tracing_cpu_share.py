"""Tracing's share of a saturated server's time, from its sampled stacks: off, 0 %, 1 % and 100 % sampling.

Throughput cannot show a 2 % cost on a shared 2-core guest: two starts of the
same server differ by up to 10 % in req/s (BENCHMARKS.md, "Tracing
overhead"). A profile can, because it is a share within one process at one
time, whatever the machine's speed then. For each configuration a fresh
server (``benchmarks.tracing_setup``, as ``benchmarks.tracing_overhead``
starts it: cache off, OTLP/HTTP to a discarding sink in its own process,
slow rule off) is saturated by a closed
loop while ``py-spy`` samples its Python threads (``--nonblocking``, so the
sampler does not stop the server); a sample is tracing's when any frame on
its stack is:

    mmserve's tracing modules   server/http/{tracing,traced_answer,tail_sampling,trace_attributes}.py,
                                router/tracing.py
    the batch record step       router/worker.py ``_with_batch_trace`` (the record and the copy of each result)
    OpenTelemetry               every ``opentelemetry`` frame: span processor, the exporter's thread,
                                protobuf encoding, the OTLP/HTTP client it calls

The table gives each configuration's share of samples that are tracing's, and
the tracing frames that took most. With ``--gil`` only the thread holding
the GIL is sampled: the share of the interpreter's time, which is what a
server whose event loop saturates first (tiny) loses in throughput. The
``100%`` row checks that against ``tracing_overhead`` (BENCHMARKS.md: 19 %
of the interpreter's time against a 17 % throughput cost). ``off`` is not
zero: FastAPI asks OpenTelemetry's API for its global providers on every
request (its own built-in telemetry), in every configuration alike.

What the share does not see: time outside Python threads (torch's OpenMP
workers are not sampled), and costs that sit in no tracing frame: garbage
collection run elsewhere for objects tracing made, or GIL hand-offs.

    python -m benchmarks.tracing_cpu_share --presets tiny --gil

    python -m benchmarks.tracing_cpu_share --presets tiny
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.loadgen.config import RunMode
from benchmarks.harness import run_report, utc_now
from benchmarks.tracing_setup import PLANS, PresetPlan, bench_config, otlp_sink, start_server
from models.loading.repository import build_preset

CONFIGS = ("off", "0%", "1%", "100%")
TRACING_FILES = ("server/http/tracing.py", "server/http/traced_answer.py", "server/http/tail_sampling.py",
                 "server/http/trace_attributes.py", "router/tracing.py")
TRACING_FUNCTIONS = (("router/worker.py", "_with_batch_trace"),)
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
_CHECKOUT = Path(__file__).resolve().parents[1].as_posix() + "/"
_LOAD_LEAD_S = 1.0  # the closed loop runs this long before sampling starts, and after it ends


@dataclass(frozen=True)
class Frame:
    function: str
    file: str

    @property
    def is_tracing(self) -> bool:
        path = self.file.replace("\\", "/")
        return ("opentelemetry/" in path or path.endswith(TRACING_FILES)
                or any(path.endswith(file) and self.function == function for file, function in TRACING_FUNCTIONS))

    def __str__(self) -> str:
        """The function and its file, relative to the checkout or to site-packages."""
        path = self.file.replace("\\", "/").split("site-packages/", 1)[-1]
        return f"{self.function} ({path.removeprefix(_CHECKOUT)})"


def parse_raw(lines: Iterable[str]) -> list[tuple[tuple[Frame, ...], int]]:
    """py-spy's ``--format raw`` (collapsed stacks): ``frame;frame;... count``, root first."""
    stacks = []
    for line in lines:
        line = line.rstrip("\n")
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        frames = []
        for text in stack.split(";"):
            match = _FRAME.match(text)
            frames.append(Frame(match["function"], match["file"]) if match else Frame(text, ""))
        stacks.append((tuple(frames), int(count)))
    return stacks


@dataclass(frozen=True)
class Share:
    """How many samples were taken, how many were tracing's, and which tracing frames held them."""

    num_samples: int
    num_tracing: int
    top_frames: tuple[tuple[str, int], ...]  # the outermost tracing frame of each tracing sample, most first

    @property
    def fraction(self) -> float:
        return self.num_tracing / self.num_samples if self.num_samples else float("nan")


def tracing_share(stacks: Sequence[tuple[tuple[Frame, ...], int]], num_top: int = 4) -> Share:
    """A sample is tracing's if any frame is; it is filed under its outermost tracing frame."""
    num_samples = num_tracing = 0
    by_frame: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        num_samples += count
        outermost = next((frame for frame in frames if frame.is_tracing), None)
        if outermost is not None:
            num_tracing += count
            by_frame[str(outermost)] += count
    return Share(num_samples, num_tracing, tuple(by_frame.most_common(num_top)))


def profile_once(config: str, plan: PresetPlan, image_px: int, sink_url: str, seconds: float, rate_hz: int,
                 is_gil_only: bool = False) -> Share:
    """A fresh server of ``config``, saturated, sampled for ``seconds`` (``is_gil_only``: samples holding the GIL)."""
    server = start_server(config, plan, sink_url, None)
    try:
        server.resume()
        load_config = dataclasses.replace(bench_config(server.url, plan, image_px, RunMode.CLOSED, seed=0),
                                          duration_s=seconds + 2 * _LOAD_LEAD_S)
        load = threading.Thread(target=lambda: run_report(load_config), daemon=True)
        load.start()
        time.sleep(_LOAD_LEAD_S)
        with tempfile.NamedTemporaryFile("r", suffix=".txt") as raw:
            sampled = subprocess.run(
                [py_spy(), "record", "--pid", str(server.pid), "--rate", str(rate_hz), "--duration",
                 str(int(seconds)), "--format", "raw", "--full-filenames", "--nonblocking", "--output", raw.name,
                 *(["--gil"] if is_gil_only else [])],
                capture_output=True, text=True)
            if sampled.returncode != 0:
                raise RuntimeError(f"py-spy failed ({sampled.returncode}); it needs ptrace rights over the "
                                   f"server (root, or kernel.yama.ptrace_scope=0):\n{sampled.stderr[-2000:]}")
            stacks = parse_raw(raw)
        load.join()
        return tracing_share(stacks)
    finally:
        server.stop()


def py_spy() -> str:
    """py-spy on PATH, or beside this interpreter (a venv's bin that is not on PATH)."""
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit("py-spy is not installed: pip install 'mmserve[bench]'")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny"], choices=sorted(PLANS))
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each server is sampled")
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--gil", action="store_true",
                        help="only samples of threads holding the GIL: the share of the interpreter's time")
    args = parser.parse_args()
    print(f"tracing CPU share, {utc_now()}, {platform.machine()}, "
          f"python {platform.python_version()}, py-spy --rate {args.rate} --nonblocking{' --gil' if args.gil else ''}, "
          f"{args.seconds:g} s per configuration, a fresh server each, cache off, OTLP/HTTP to a discarding sink, "
          "slow rule off")
    print(f"{'preset':>10} {'tracing':>8} {'samples':>9} {'tracing':>9} {'share':>8}  tracing frames that held most")
    for name in args.presets:
        plan = PLANS[name]
        image_px = build_preset(plan.preset).config.preprocess.input_size
        with otlp_sink() as sink_url:
            for config in args.configs:
                share = profile_once(config, plan, image_px, sink_url, args.seconds, args.rate, args.gil)
                frames = ", ".join(f"{frame} {count / share.num_samples:.1%}" for frame, count in share.top_frames)
                print(f"{name:>10} {config:>8} {share.num_samples:>9} {share.num_tracing:>9} {share.fraction:>8.2%}  "
                      f"{frames or '-'}", flush=True)


if __name__ == "__main__":
    main()
