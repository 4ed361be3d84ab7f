"""Several engines behind one API tier: cache affinity, and CPU engines against one engine with more threads.

    python -m benchmarks.engines [--parts affinity cpu] [--seconds 10] [--rounds 2] [--save-figures PATH]

A tiny random CLIP (``random_pretrained.write_clip``: 32-px towers, so a
request costs its decode as much as its forward), ``--api-workers 1``,
``wrk -t1 -c16`` posting ``/v1/embeddings`` bodies of one 224-px JPEG. Each
table's servers are started once and paused, resumed for their own runs, in
an order mirrored every other round (``harness.run_saturation``); server CPU
is every process of its group over wrk's answers.

affinity  Zipf(1.1) over 1,024 images, drawn by ``engines_workload``'s wrk
          script with the round's seed (every server gets the same sequence).
          Each engine caches a quarter of them (an entry's bytes measured
          first): ``--engines 1`` with the two caches' sum, ``--engines 2``
          by affinity, and in round robin. Hit rate from ``/metrics``.
          Targets (issue 45): affinity's hit rate within 2 points of the one
          engine's, its answered/s >= the one engine's.
cpu       Caches off, one photo-like JPEG per request: ``--engines 2
          --compute-threads 1`` against ``--engines 1 --compute-threads 2``
          for each of ``--runtimes``. Which wins sets the CPU default.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean

import httpx

from benchmarks.engines_workload import (
    EMBEDDINGS_PATH, CacheCount, bytes_per_image_entry, cache_bytes_for, image_bodies, image_cache_count,
    write_zipf_bodies,
)
from benchmarks.harness import (
    AlternationPlan, Figure, RunSpec, ServerCommand, ServerProcess, ServerRuns, add_save_figures_argument, align, log,
    machine_line, mmserve_model_command, num_usable_cpus, paused_servers, resumed, run_saturation, running,
    save_figures, utc_now, wrk_path, wrk_saturation, write_bodies,
)
from benchmarks.harness.alternation import WARMUP_SEED
from benchmarks.harness.wrk_load import MetricsDetail, batching_detail, metrics_now
from benchmarks.loadgen.image_pool import ImageSize
from benchmarks.loadgen.server_metrics import BATCH_COUNT, MetricsSnapshot
from benchmarks.photo_like import data_uri, photo_like_jpeg
from benchmarks.served_runtime import MmserveRuntime, start_checked

IMAGE_SIDE_PX = 224
ZIPF_EXPONENT = 1.1
ENGINE_HEADER = "x-mmserve-engine"
MAX_HIT_RATE_GAP_POINTS = 2.0
NUM_PROBE_IMAGES = 32
MIN_LOOKUPS_PER_ANSWER = 0.9  # each request carries one image: one lookup, give or take the runs' edges
ONE_ENGINE, AFFINITY, ROUND_ROBIN = "1 engine", "2 engines, affinity", "2 engines, round robin"
BASE_SETTINGS = {"API_WORKERS": "1"}


@dataclass
class CacheRuns:
    """The image cache's lookups over each server's measured runs (the warm-up left out)."""

    counts: dict[str, CacheCount] = field(default_factory=dict)

    def add(self, name: str, count: CacheCount) -> None:
        self.counts[name] = self.counts.get(name, CacheCount()) + count

    def lookups_per_answer(self, name: str, num_answers: int) -> float:
        """Image cache lookups /metrics counted per answered request: 1 when it counts every engine's cache."""
        return self.counts.get(name, CacheCount()).num_lookups / max(num_answers, 1)

    def hit_rate_pct(self, name: str) -> float:
        rate = self.counts.get(name, CacheCount()).hit_rate
        if rate is None:
            raise RuntimeError(f"{name} made no image cache lookup in its measured runs: is its cache on?")
        return 100.0 * rate


def cache_detail(cache: CacheRuns) -> MetricsDetail:
    """The image cache's hit rate for each run's log line; each measured run's lookups kept in ``cache``.

    The warm-up (``WARMUP_SEED``) fills the caches and is left out of ``cache``.
    """

    def detail(run: RunSpec, before: MetricsSnapshot, after: MetricsSnapshot) -> str:
        count = image_cache_count(before, after)
        if run.seed != WARMUP_SEED:
            cache.add(run.name, count)
        return f"; image cache hit rate {100 * (count.hit_rate or 0):.1f} %"

    return detail


def every_engine_serving(server: ServerProcess, bodies: Sequence[bytes], num_engines: int,
                         timeout_s: float = 300.0) -> dict[str, int]:
    """Which engines answered ``bodies``, sent all at once, round after round until ``num_engines`` have.

    ``/health/ready`` is 200 once one engine serves, while the others may still
    warm up; dispatch sends nothing to an engine that does not serve, so an
    engine seen in the ``x-mmserve-engine`` header ("-" where there is none)
    serves. Concurrent, so that least-loaded dispatch (caches off) spreads them.
    """
    seen: dict[str, int] = {}
    deadline_s = time.monotonic() + timeout_s
    with resumed(server), httpx.Client(base_url=server.url, timeout=120.0, trust_env=False) as client, \
            ThreadPoolExecutor(len(bodies)) as pool:
        def post(body: bytes) -> str:
            answer = client.post(EMBEDDINGS_PATH, content=body, headers={"content-type": "application/json"})
            if answer.status_code != 200:
                raise RuntimeError(f"{server.command.name} answered {answer.status_code}: {answer.text[:300]}")
            return answer.headers.get(ENGINE_HEADER, "-")

        while len(set(seen) - {"-"}) < num_engines:
            if time.monotonic() > deadline_s:
                raise RuntimeError(f"{server.command.name}: after {timeout_s:.0f} s only engines {seen} answered, "
                                   f"not {num_engines}: does this build run several engines?")
            for engine in pool.map(post, bodies):
                seen[engine] = seen.get(engine, 0) + 1
    return dict(sorted(seen.items()))


def batches_by_engine(snapshot: MetricsSnapshot | None) -> dict[str, float]:
    """``mmserve_batch_size_count`` summed over lanes by its ``engine`` label ("-" for series without one)."""
    counts: dict[str, float] = {}
    for labels, value in ([] if snapshot is None else snapshot.select(BATCH_COUNT)):
        engine = labels.get("engine", "-")
        counts[engine] = counts.get(engine, 0.0) + value
    return dict(sorted(counts.items()))


def pss_bytes(pid: int) -> int:
    """Proportional set size (shared pages divided among the processes that map them), from ``smaps_rollup``."""
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/smaps_rollup has no Pss")


def memory_by_process(root_pid: int) -> str:
    """``engine_process x2: 310, 305 MiB RSS (120, 118 PSS); ...``: each process of a server's tree, by what it runs.

    RSS counts the libraries every process maps in full; PSS splits them among
    the processes, so PSS summed over the tree is what the server holds.
    """
    from benchmarks.harness.process_resources import child_pids, process_label, rss_bytes

    tree, by_label = [root_pid], {}
    for pid in tree:
        tree.extend(child_pids(pid))
    for pid in tree:
        label = process_label(pid)
        try:
            if label:  # not a process yet to run its program
                by_label.setdefault(label, []).append((rss_bytes(pid), pss_bytes(pid)))
        except (OSError, RuntimeError):
            continue  # gone meanwhile
    mib = 1024 * 1024
    parts = [f"{label} x{len(sizes)}: {', '.join(f'{rss / mib:.0f}' for rss, _ in sizes)} MiB RSS "
             f"({', '.join(f'{pss / mib:.0f}' for _, pss in sizes)} PSS)" for label, sizes in sorted(by_label.items())]
    total_pss = sum(pss for sizes in by_label.values() for _, pss in sizes)
    return "; ".join(parts) + f"; PSS of the whole server {total_pss / mib:.0f} MiB"


def measure_entry_bytes(clip_dir: Path, bodies: Sequence[bytes]) -> float:
    """Bytes of one image entry in the cache: a one-engine server with the default cache, sent distinct images."""
    with running(mmserve_model_command(clip_dir, dict(BASE_SETTINGS))) as server, \
            httpx.Client(base_url=server.url, timeout=120.0, trust_env=False) as client:
        for body in bodies:
            client.post(EMBEDDINGS_PATH, content=body, headers={"content-type": "application/json"}).raise_for_status()
        snapshot = metrics_now(server.url)
    entry_bytes = None if snapshot is None else bytes_per_image_entry(snapshot)
    if entry_bytes is None:
        raise RuntimeError("the calibration server's /metrics shows no image cache entry")
    return entry_bytes


def affinity_commands(clip_dir: Path, per_engine_bytes: int) -> dict[str, ServerCommand]:
    two = {**BASE_SETTINGS, "ENGINES": "2", "CACHE_IMAGE_BYTES": str(per_engine_bytes)}
    return {ONE_ENGINE: mmserve_model_command(clip_dir, {**BASE_SETTINGS, "ENGINES": "1",
                                                         "CACHE_IMAGE_BYTES": str(2 * per_engine_bytes)}),
            AFFINITY: mmserve_model_command(clip_dir, {**two, "ENGINE_DISPATCH": "affinity"}),
            ROUND_ROBIN: mmserve_model_command(clip_dir, {**two, "ENGINE_DISPATCH": "round_robin"})}


def affinity_rows(runs: Mapping[str, ServerRuns], cache: CacheRuns,
                  images_per_engine: Mapping[str, int]) -> list[list[str]]:
    rows = [["server", "cache per engine", "image hit rate", "lookups/answer", "answered/s", "per free CPU",
             "CPU ms/answer", "runs", "other CPUs"]]
    for name, server_runs in runs.items():
        rows.append([name, f"{images_per_engine[name]} images", f"{cache.hit_rate_pct(name):.1f} %",
                     f"{cache.lookups_per_answer(name, sum(server_runs.saturation_num_ok)):.2f}",
                     f"{server_runs.throughput_rps:.1f}", f"{per_free_cpu(server_runs):.1f}",
                     f"{server_runs.cpu_ms_per_request:.2f}", str(len(server_runs.throughputs_rps)),
                     f"{fmean(server_runs.other_cpus):.2f}"])
    return rows


def per_free_cpu(server_runs: ServerRuns) -> float:
    """Answers/s per CPU the other processes left free (``ServerRuns.throughput_per_free_cpu_rps``)."""
    return server_runs.throughput_per_free_cpu_rps(num_usable_cpus())


def partial_metrics_notes(runs: Mapping[str, ServerRuns], cache: CacheRuns) -> list[str]:
    """A note for each server whose /metrics counted well under one image lookup per answer (one image each)."""
    notes = []
    for name, server_runs in runs.items():
        per_answer = cache.lookups_per_answer(name, sum(server_runs.saturation_num_ok))
        if per_answer < MIN_LOOKUPS_PER_ANSWER:
            notes.append(f"NOTE: {name}'s /metrics counted {per_answer:.2f} image cache lookups per answer: it does "
                         "not show every engine's cache, so its hit rate is that of the engines it shows")
    return notes


def affinity_verdict(runs: Mapping[str, ServerRuns], cache: CacheRuns) -> tuple[list[str], list[Figure]]:
    """The target lines under the table, and the figures for the result file (rounded as printed)."""
    gap = round(cache.hit_rate_pct(AFFINITY) - cache.hit_rate_pct(ONE_ENGINE), 1) + 0.0  # judged as printed; no -0.0
    rps_ratio = runs[AFFINITY].throughput_rps / runs[ONE_ENGINE].throughput_rps
    saved = cache.hit_rate_pct(AFFINITY) - cache.hit_rate_pct(ROUND_ROBIN)
    rr_ratio = runs[ROUND_ROBIN].throughput_rps / runs[AFFINITY].throughput_rps
    lines = [f"affinity vs 1 engine: hit rate {gap:+.1f} points (target within {MAX_HIT_RATE_GAP_POINTS:g}: "
             f"{'met' if abs(gap) <= MAX_HIT_RATE_GAP_POINTS else 'MISSED'}), answered/s {rps_ratio:.2f}x "
             f"(target >= 1.00: {'met' if rps_ratio >= 1.0 else 'MISSED'})",
             f"round robin vs affinity: hit rate {-saved:+.1f} points, answered/s {rr_ratio:.2f}x "
             "(what affinity saves)"]
    figures = [Figure("engine_affinity", "image hit rate, 2 engines (affinity) minus 1 engine", round(gap, 1),
                      "points"),
               Figure("engine_affinity", "answered/s, 2 engines (affinity) over 1 engine", round(rps_ratio, 2), "x"),
               Figure("engine_affinity", "image hit rate, affinity minus round robin", round(saved, 1), "points")]
    return lines, figures


def measure_affinity(args: argparse.Namespace, clip_dir: Path, scratch: Path, plan: AlternationPlan) -> list[Figure]:
    size = ImageSize(IMAGE_SIDE_PX, IMAGE_SIDE_PX)
    bodies = image_bodies(args.num_images, size)
    entry_bytes = args.image_entry_bytes or measure_entry_bytes(clip_dir, bodies[:NUM_PROBE_IMAGES])
    per_engine_images = args.num_images // 4
    per_engine_bytes = cache_bytes_for(per_engine_images, entry_bytes)
    seeds = [WARMUP_SEED, *range(args.rounds)]
    scripts = {seed: write_zipf_bodies(scratch / "zipf", "image", EMBEDDINGS_PATH, bodies, ZIPF_EXPONENT, seed)
               for seed in seeds}
    print(f"\ncache affinity: Zipf({ZIPF_EXPONENT}) over {args.num_images} distinct {IMAGE_SIDE_PX}-px JPEGs, "
          f"wrk -t1 -c{args.concurrency}, {args.rounds} rounds of {args.seconds:g} s after a {plan.warmup_s:g} s "
          f"warm-up; an image entry is {entry_bytes:.0f} B, so each engine's cache_image_bytes = "
          f"{per_engine_bytes} ({per_engine_images} images), the one engine's twice that; --api-workers 1, so "
          "1 engine is one process and 2 engines an API process and two engines", flush=True)
    cache = CacheRuns()
    with paused_servers(affinity_commands(clip_dir, per_engine_bytes)) as servers:
        for name, server in servers.items():
            seen = every_engine_serving(server, bodies[-NUM_PROBE_IMAGES:], 1 if name == ONE_ENGINE else 2)
            log(f"{name}: engines that answered rounds of {NUM_PROBE_IMAGES} distinct images at once: {seen}")
        saturate = wrk_saturation(lambda run: scripts[run.seed], 30.0, cache_detail(cache))
        runs = run_saturation(servers, list(servers), plan, saturate, "affinity")
    images = {ONE_ENGINE: 2 * per_engine_images, AFFINITY: per_engine_images, ROUND_ROBIN: per_engine_images}
    print("\n".join(align(affinity_rows(runs, cache, images))))
    lines, figures = affinity_verdict(runs, cache)
    print("\n".join(lines + partial_metrics_notes(runs, cache)), flush=True)
    return figures


def cpu_settings(num_engines: int, num_threads: int) -> dict[str, str]:
    return {**BASE_SETTINGS, "ENGINES": str(num_engines), "COMPUTE_THREADS": str(num_threads),
            "CACHE_IMAGE_BYTES": "0", "CACHE_TEXT_BYTES": "0"}


CPU_SHAPES = {"--engines 1 --compute-threads 2": cpu_settings(1, 2),
              "--engines 2 --compute-threads 1": cpu_settings(2, 1)}


def cpu_rows(runtime: str, runs: Mapping[str, ServerRuns]) -> list[list[str]]:
    return [[f"{runtime}, {name}", f"{server_runs.throughput_rps:.1f}", f"{per_free_cpu(server_runs):.1f}",
             f"{server_runs.cpu_ms_per_request:.2f}",
             f"{server_runs.server_cores:.2f}", str(len(server_runs.throughputs_rps)),
             f"{fmean(server_runs.other_cpus):.2f}", str(dict(server_runs.errors) or "-")]
            for name, server_runs in runs.items()]


def cpu_verdict(runtime: str, runs: Mapping[str, ServerRuns]) -> tuple[str, list[Figure]]:
    one, two = (runs[name] for name in CPU_SHAPES)
    rps_ratio, cpu_ratio = two.throughput_rps / one.throughput_rps, two.cpu_ms_per_request / one.cpu_ms_per_request
    free_ratio = per_free_cpu(two) / per_free_cpu(one)
    if rps_ratio > 1.0 and free_ratio > 1.0:
        winner = "--engines 2 answers more"
    elif rps_ratio < 1.0 and free_ratio < 1.0:
        winner = "--engines 1 answers more"
    else:
        winner = "no clear winner: answered/s and answered/s per free CPU disagree (the neighbours' load)"
    line = (f"{runtime}: --engines 2 over --engines 1: answered/s {rps_ratio:.2f}x, per free CPU {free_ratio:.2f}x, "
            f"CPU per answer {cpu_ratio:.2f}x -> {winner}")
    return line, [Figure("cpu_engines", f"{runtime}: answered/s, --engines 2 (1 thread each) over --engines 1 "
                                        "(2 threads)", round(rps_ratio, 2), "x"),
                  Figure("cpu_engines", f"{runtime}: answered/s per free CPU, --engines 2 over --engines 1",
                         round(free_ratio, 2), "x"),
                  Figure("cpu_engines", f"{runtime}: CPU per answer, --engines 2 over --engines 1",
                         round(cpu_ratio, 2), "x")]


def measure_cpu(args: argparse.Namespace, clip_dir: Path, scratch: Path, plan: AlternationPlan) -> list[Figure]:
    jpegs = [photo_like_jpeg(IMAGE_SIDE_PX, IMAGE_SIDE_PX, seed) for seed in range(8)]
    probe_bodies = [json.dumps({"input": data_uri(jpeg)}).encode() for jpeg in jpegs]
    bodies = write_bodies(scratch / "cpu", "image", EMBEDDINGS_PATH, probe_bodies)
    print(f"\nCPU engines: caches off, one photo-like {IMAGE_SIDE_PX}-px JPEG per request (8 in turn, "
          f"{fmean(map(len, jpegs)) / 1024:.1f} KiB), wrk -t1 -c{args.concurrency}, {args.rounds} rounds of "
          f"{args.seconds:g} s after a {args.warmup_s:g} s warm-up; --api-workers 1, so --engines 1 is one process "
          "and --engines 2 an API process and two engines", flush=True)
    rows = [["runtime, server", "answered/s", "per free CPU", "CPU ms/answer", "server cores", "runs", "other CPUs",
             "failed"]]
    lines: list[str] = []
    figures: list[Figure] = []
    for runtime in args.runtimes:
        asked = MmserveRuntime(runtime, None, "cpu")
        export_dir = scratch / f"export-{runtime}"
        with ExitStack() as stack:
            servers: dict[str, ServerProcess] = {}
            for name, settings in CPU_SHAPES.items():
                server, served = start_checked(clip_dir, asked, {**settings, "EXPORT_CACHE_DIR": str(export_dir)},
                                               args.ready_timeout_s)
                stack.callback(server.stop)
                servers[name] = server
                seen = every_engine_serving(server, [*probe_bodies, *probe_bodies], int(settings["ENGINES"]))
                log(f"{runtime}, {name}: serves {served.label()}; engines that answered rounds of "
                    f"{2 * len(probe_bodies)} requests at once: {seen}")
            runs = run_saturation(servers, list(servers), plan, wrk_saturation(lambda _: bodies, 30.0, batching_detail),
                                  f"cpu {runtime}")
            for name, server in servers.items():
                with resumed(server):
                    log(f"{runtime}, {name}: batches computed by each engine since start: "
                        f"{batches_by_engine(metrics_now(server.url))}; memory after the runs: "
                        f"{memory_by_process(server.pid)}")
        rows += cpu_rows(runtime, runs)
        line, runtime_figures = cpu_verdict(runtime, runs)
        lines.append(line)
        figures += runtime_figures
    print("\n".join(align(rows)))
    print("\n".join(lines), flush=True)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", nargs="+", choices=("affinity", "cpu"), default=["affinity", "cpu"])
    parser.add_argument("--seconds", type=float, default=10.0, help="each measured run (default 10)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the order mirrored every other (default 2)")
    parser.add_argument("--warmup-s", type=float, default=5.0, help="each server's unmeasured first run (default 5)")
    parser.add_argument("--affinity-warmup-s", type=float, default=20.0,
                        help="the affinity servers' warm-up, which fills their caches (default 20)")
    parser.add_argument("--concurrency", type=int, default=16, help="wrk connections (default 16)")
    parser.add_argument("--num-images", type=int, default=1024, help="distinct images of the Zipf workload")
    parser.add_argument("--image-entry-bytes", type=float, default=None,
                        help="bytes of one image cache entry (default: measured on a one-engine server)")
    parser.add_argument("--runtimes", nargs="+", choices=("torch", "onnxruntime"), default=["torch", "onnxruntime"])
    parser.add_argument("--ready-timeout-s", type=float, default=600.0)
    add_save_figures_argument(parser)
    args = parser.parse_args(argv)
    if wrk_path() is None:
        print("benchmarks/engines.py needs wrk: apt-get install wrk (Debian's package)", file=sys.stderr)
        return 2
    from benchmarks.random_pretrained import write_clip

    print(f"several engines behind one API tier, {utc_now()}, {machine_line()}")
    print("tiny random CLIP (transformers CLIPModel, 32-px towers), POST /v1/embeddings, --api-workers 1", flush=True)
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        clip_dir = write_clip(scratch / "tiny-clip")
        plan = AlternationPlan(args.seconds, args.rounds, args.warmup_s, args.concurrency)
        if "affinity" in args.parts:
            affinity_plan = AlternationPlan(args.seconds, args.rounds, args.affinity_warmup_s, args.concurrency)
            figures += measure_affinity(args, clip_dir, scratch, affinity_plan)
        if "cpu" in args.parts:
            figures += measure_cpu(args, clip_dir, scratch, plan)
    save_figures(args.save_figures, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
