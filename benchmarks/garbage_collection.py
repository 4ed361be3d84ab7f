"""Python's young-generation threshold under load: collections, their CPU, and the server's CPU per request.

    python -m benchmarks.garbage_collection [--thresholds 700 10000] [--seconds 10] [--rounds 2]

One ``mmserve serve --preset synthetic --api-workers 1`` per threshold
(``gc_young_threshold``; 700 is Python's own default, 10,000 mmserve's),
started through ``benchmarks.gc_counting_serve``, which counts every
collection by generation with the CPU it took on the thread that ran it.
Each is driven by ``wrk`` (C, one thread, 64 connections, closed loop)
posting a 40-character text to ``/v1/embeddings``, the towers sleeping
instead of computing and the segment cache off, as ``benchmarks.frontend``
does; the servers run one at a time (the other paused), A-B-B-A, each
warmed up first. It prints, per threshold: answers per second, the server's
CPU per answered request, collections per second by generation, their CPU
per answered request and the longest one in the runs (a collection holds
the GIL: the event loop and the compute threads wait it out).

``wrk`` is Debian's package: ``apt-get install wrk``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from benchmarks.harness import (
    CpuMeter, ServerProcess, log, machine_line, mmserve_command, resumed, run_wrk, saturation_order, start_paused,
    utc_now, wrk_path, write_bodies,
)
from benchmarks.harness.table_layout import align
from benchmarks.frontend import TEXT

SETTLE_S = 0.3  # the counting server writes its totals ten times a second


@dataclasses.dataclass
class Run:
    threshold: int
    answered: int
    seconds: float
    server_cpu_s: float
    collections: list[int]
    collection_cpu_s: float
    longest_cpu_s: float


def start_server(threshold: int, stats_file: Path) -> ServerProcess:
    command = mmserve_command("synthetic", {"CACHE_TEXT_BYTES": "0", "CACHE_IMAGE_BYTES": "0",
                                            "SYNTHETIC_VISION_MS": "2", "SYNTHETIC_TEXT_MS": "1",
                                            "LOG_LEVEL": "info", "GC_YOUNG_THRESHOLD": str(threshold)})
    argv = list(command.argv)
    argv[argv.index("server.cli")] = "benchmarks.gc_counting_serve"
    return start_paused(dataclasses.replace(command, name=f"threshold {threshold}",
                                            argv=(*argv, "--api-workers", "1"),
                                            env={**command.env, "GC_STATS_FILE": str(stats_file)}))


def totals(stats_file: Path) -> dict:
    time.sleep(SETTLE_S)
    return json.loads(stats_file.read_text())


def measure_once(threshold: int, server: ServerProcess, servers: Sequence[ServerProcess], stats_file: Path,
                 bodies, args: argparse.Namespace) -> Run:
    with resumed(server):
        stats_file.with_name(stats_file.name + ".reset").touch()  # the longest collection of this run alone
        before = totals(stats_file)
        meter = CpuMeter(server, servers)
        report = run_wrk(server.url, bodies, args.seconds, args.connections)
        spent = meter.stop()
        after = totals(stats_file)
    if after["threshold"][0] != threshold:
        raise RuntimeError(f"the server collected at {after['threshold']}, not at a young threshold of {threshold}")
    collections = [a - b for a, b in zip(after["collections"], before["collections"])]
    collection_cpu_s = sum(after["cpu_s"]) - sum(before["cpu_s"])
    return Run(threshold, report.num_ok, spent.wall_s, spent.server_s, collections, collection_cpu_s,
               after["longest_cpu_s"])


def table(runs: Sequence[Run], thresholds: Sequence[int]) -> list[str]:
    rows = [["young threshold", "answered/s", "CPU ms/req", "young/s", "middle/s", "full/s", "GC CPU ms/req",
             "GC share", "longest GC ms"]]
    for threshold in thresholds:
        own = [r for r in runs if r.threshold == threshold]
        answered, seconds = sum(r.answered for r in own), sum(r.seconds for r in own)
        server_cpu_s, gc_cpu_s = sum(r.server_cpu_s for r in own), sum(r.collection_cpu_s for r in own)
        per_generation = [sum(r.collections[g] for r in own) / seconds for g in range(3)]
        rows.append([str(threshold), f"{answered / seconds:.0f}", f"{1000 * server_cpu_s / answered:.3f}",
                     *(f"{rate:.1f}" for rate in per_generation), f"{1000 * gc_cpu_s / answered:.4f}",
                     f"{100 * gc_cpu_s / server_cpu_s:.1f} %", f"{1000 * max(r.longest_cpu_s for r in own):.2f}"])
    return align(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--thresholds", type=int, nargs=2, default=[700, 10_000], metavar="N",
                        help="the two young thresholds compared (default 700 10000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="each measured run (default 10)")
    parser.add_argument("--warmup-s", type=float, default=3.0, help="each server's warm-up (default 3)")
    parser.add_argument("--rounds", type=int, default=2, help="A-B-B-A rounds (default 2)")
    parser.add_argument("--connections", type=int, default=64, help="wrk connections (default 64)")
    args = parser.parse_args(argv)
    if wrk_path() is None:
        print("benchmarks/garbage_collection.py needs wrk: apt-get install wrk (Debian's package)", file=sys.stderr)
        return 2
    print(f"garbage collection under load, {utc_now()}, {machine_line()}", flush=True)
    print(f"wrk -t1 -c{args.connections}, {args.rounds} A-B-B-A rounds of {args.seconds:g} s; synthetic preset "
          "(vision 2 ms, text 1 ms slept per batch), --api-workers 1, segment cache off, log level info; "
          f"POST /v1/embeddings {{\"input\": <{len(TEXT)} characters>}}", flush=True)
    runs: list[Run] = []
    with ExitStack() as stack, tempfile.TemporaryDirectory() as scratch:
        bodies = write_bodies(Path(scratch) / "text", "text", "/v1/embeddings",
                              [json.dumps({"input": TEXT}).encode()])
        servers, stats_files = {}, {}
        for threshold in args.thresholds:
            stats_files[threshold] = Path(scratch) / f"gc-{threshold}.json"
            servers[threshold] = start_server(threshold, stats_files[threshold])
            stack.callback(servers[threshold].stop)
        for threshold, server in servers.items():  # warm-up, not measured
            with resumed(server):
                run_wrk(server.url, bodies, args.warmup_s, args.connections)
        for round_index in range(args.rounds):
            for threshold in saturation_order(args.thresholds, round_index):
                run = measure_once(threshold, servers[threshold], list(servers.values()), stats_files[threshold],
                                   bodies, args)
                runs.append(run)
                log(f"threshold {threshold}: {run.answered / run.seconds:.0f} answered/s, "
                    f"{1000 * run.server_cpu_s / max(run.answered, 1):.3f} CPU ms/req, collections "
                    f"{run.collections} taking {1000 * run.collection_cpu_s:.1f} CPU ms")
    print("\n".join(table(runs, args.thresholds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
