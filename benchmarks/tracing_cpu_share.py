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
import dataclasses
import platform
import threading
import time
from collections.abc import Sequence

from benchmarks.harness import run_report, utc_now
from benchmarks.harness.sampled_stacks import Frame, Share, record_stacks, share_of
from benchmarks.loadgen.config import RunMode
from benchmarks.tracing_setup import PLANS, PresetPlan, bench_config, otlp_sink, start_server
from models.loading.repository import build_preset

CONFIGS = ("off", "0%", "1%", "100%")
TRACING_FILES = ("server/http/tracing.py", "server/http/traced_answer.py", "server/http/tail_sampling.py",
                 "server/http/trace_attributes.py", "router/tracing.py")
TRACING_FUNCTIONS = (("router/worker.py", "_with_batch_trace"),)
_LOAD_LEAD_S = 1.0  # the closed loop runs this long before sampling starts, and after it ends


def is_tracing(frame: Frame) -> bool:
    """mmserve's tracing modules, the batch record step, or any OpenTelemetry frame."""
    path = frame.path
    return ("opentelemetry/" in path or path.endswith(TRACING_FILES)
            or any(path.endswith(file) and frame.function == function for file, function in TRACING_FUNCTIONS))


def tracing_share(stacks: Sequence[tuple[tuple[Frame, ...], int]], num_top: int = 4) -> Share:
    """A sample is tracing's if any frame is; it is filed under its outermost tracing frame."""
    return share_of(stacks, is_tracing, num_top)


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
        stacks = record_stacks(server.pid, seconds, rate_hz, is_gil_only)
        load.join()
        return tracing_share(stacks)
    finally:
        server.stop()


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
                print(f"{name:>10} {config:>8} {share.num_samples:>9} {share.num_matching:>9} {share.fraction:>8.2%}  "
                      f"{frames or '-'}", flush=True)


if __name__ == "__main__":
    main()
