"""The request path against the HTTP floor: server CPU per request and saturation throughput, under wrk.

    python -m benchmarks.frontend [--api-workers 1 2] [--seconds 10] [--rounds 2] [--kinds text image fusion]

One ``wrk`` (one thread, ``--connections`` 16: enough to keep both servers
busy without the deeper queues of 64, which make an engine request cheaper
than a server meets at 16) posts one body per kind:

    text    POST /v1/embeddings {"input": "<a 40-character text>"}
    image   POST /v1/embeddings {"input": "data:image/jpeg;base64,<a 224x224 photo-like JPEG, quality 90>"}
    fusion  POST /v1/infer {"text": ..., "image": {"b64": <the same JPEG>}}

to ``mmserve serve --preset synthetic --api-workers N`` (towers that sleep
``--vision-ms``/``--text-ms`` per batch, so they neither compute nor bound
throughput; segment cache off) and to the HTTP floor
(``benchmarks.frontend_floor_app``: bare FastAPI + uvicorn returning mmserve's
own answer byte for byte). One server runs at a time, the others paused,
A-B-B-A rotated (``frontend_measure.run_order``). The JPEG's base64-decode,
decode and resize (what an image request adds to the floor) is timed alone.

Tables (targets in ``benchmarks.frontend_measure``): each server's CPU per
answered request (every process of it, from /proc) against the floor's, and
answers/s; the CPU split by kind of process; and the engine as the serial
part: its CPU per request against the floor's, the requests one engine core
takes and the API-process cores that rate needs. ``--baseline-tree DIR``
alternates another source tree's servers (e.g. a ``git archive`` of the base
commit) in the same rounds. wrk: ``apt-get install wrk``.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import httpx

from benchmarks.frontend_measure import (
    FLOOR, RunResult, capacity_rows, headline_figures, pool, process_split_rows, run_order, table_rows, workers_speedup,
)
from benchmarks.harness import (
    CpuMeter, ServerCommand, ServerProcess, ServerStartError, WrkBodies, log, machine_line, mmserve_command,
    num_usable_cpus, resumed, run_wrk, start_paused, utc_now, wrk_path, write_bodies,
)
from benchmarks.harness.cpu_accounting import cpu_by_process_kind
from benchmarks.harness.figures import add_save_figures_argument, save_figures
from benchmarks.harness.server_process import free_port
from benchmarks.harness.table_layout import align
from benchmarks.harness.wrk_load import metrics_now
from benchmarks.photo_like import data_uri, photo_like_jpeg

TEXT = "a red bicycle leaning on a sunny wall by the sea"[:40]
IMAGE_SIDE = 224
PATHS = {"text": "/v1/embeddings", "image": "/v1/embeddings", "fusion": "/v1/infer"}


def request_bodies(jpeg: bytes) -> dict[str, bytes]:
    """The JSON body of each kind of request."""
    b64 = base64.b64encode(jpeg).decode("ascii")
    return {"text": json.dumps({"input": TEXT}).encode(),
            "image": json.dumps({"input": data_uri(jpeg)}).encode(),
            "fusion": json.dumps({"text": TEXT, "image": {"b64": b64}}).encode()}


def decode_alone_ms(jpeg: bytes, seconds: float) -> float:
    """CPU ms of the base64-decode, decode to RGB (EXIF-oriented) and resize to the synthetic preset's input."""
    import io

    from PIL import Image, ImageOps

    from models.families.presets import preset_config
    from models.preprocessing import resize_to_model_input
    from models.rgb import to_rgb

    preprocess = preset_config("synthetic").preprocess
    payload = base64.b64encode(jpeg)
    num_done, started_s, deadline_s = 0, time.process_time(), time.monotonic() + seconds
    while time.monotonic() < deadline_s or num_done < 20:
        image = Image.open(io.BytesIO(base64.b64decode(payload, validate=True)))
        image.load()
        resize_to_model_input(to_rgb(ImageOps.exif_transpose(image)), preprocess)
        num_done += 1
    return 1000.0 * (time.process_time() - started_s) / num_done


def mmserve_with_workers(num_workers: int | None, args: argparse.Namespace,
                         tree: Path | None = None) -> ServerCommand:
    """mmserve of this checkout, or (``tree``) of another source tree on ``PYTHONPATH``, named ``base wN``."""
    settings = {"CACHE_TEXT_BYTES": "0", "CACHE_IMAGE_BYTES": "0", "LOG_LEVEL": args.log_level,
                "SYNTHETIC_VISION_MS": str(args.vision_ms), "SYNTHETIC_TEXT_MS": str(args.text_ms)}
    command = mmserve_command("synthetic", settings)
    name = ("mmserve" if tree is None else "base") + ("" if num_workers is None else f" w{num_workers}")
    workers = () if num_workers is None else ("--api-workers", str(num_workers))
    env = dict(command.env) if tree is None else {**command.env, "PYTHONPATH": str(tree)}
    return dataclasses.replace(command, name=name, argv=command.argv + workers, env=env, cwd=tree)


def floor_command(answers_file: Path) -> ServerCommand:
    port = free_port()
    argv = (sys.executable, "-m", "benchmarks.frontend_floor_app", "--port", str(port),
            "--answers", str(answers_file))
    return ServerCommand(FLOOR, argv, port, "/health")


def start_mmserve(num_workers: int, args: argparse.Namespace, stack: ExitStack,
                  tree: Path | None = None) -> ServerProcess | None:
    """A ready, paused mmserve with ``--api-workers N``; ``None`` (said on stdout) if it refuses the flag."""
    try:
        server = start_paused(mmserve_with_workers(num_workers, args, tree))
    except ServerStartError as e:
        if "--api-workers" not in e.stderr_tail:
            raise
        print(f"mmserve refused --api-workers {num_workers}: this build has no API processes", flush=True)
        if num_workers != 1:
            return None
        server = start_paused(mmserve_with_workers(None, args))  # today's single process is --api-workers 1
        server.command = dataclasses.replace(server.command, name="mmserve w1")
    stack.callback(server.stop)
    return server


def record_answers(server: ServerProcess, bodies: dict[str, bytes]) -> dict[str, str]:
    """mmserve's answer to each body (the floor returns them), checked to be 200."""
    answers = {}
    with resumed(server), httpx.Client(base_url=server.url, timeout=30.0, trust_env=False) as client:
        for kind, body in bodies.items():
            answer = client.post(PATHS[kind], content=body, headers={"content-type": "application/json"})
            if answer.status_code != 200:
                raise RuntimeError(f"{server.command.name} answered {kind} with {answer.status_code}: {answer.text}")
            answers[kind] = answer.text
    return answers


def answer_codes(server: ServerProcess) -> dict[str, float] | None:
    """``mmserve_requests_total`` summed by ``code`` (``None``: the floor has no /metrics); wrk says only "non-2xx"."""
    snapshot = metrics_now(server.url)
    if snapshot is None:
        return None
    codes: dict[str, float] = {}
    for labels, value in snapshot.select("mmserve_requests_total"):
        codes[labels.get("code", "?")] = codes.get(labels.get("code", "?"), 0.0) + value
    return codes


def non_200_growth(before: dict[str, float], after: dict[str, float]) -> str:
    """``"503 x40, 499 x64"``: each non-200 code's growth over a run (499: connections wrk closed at its end)."""
    grown = {code: after[code] - before.get(code, 0.0) for code in sorted(after) if code != "200"}
    return ", ".join(f"{code} x{count:.0f}" for code, count in grown.items() if count) or "none"


def measure(servers: dict[str, ServerProcess], kinds: Sequence[str], body_files: dict[str, WrkBodies],
            args: argparse.Namespace) -> list[RunResult]:
    results: list[RunResult] = []
    names = list(servers)
    for kind in kinds:
        for name in names:  # warm-up, not measured
            with resumed(servers[name]):
                run_wrk(servers[name].url, body_files[kind], args.warmup_s, args.connections)
        for round_index in range(args.rounds):
            for name in run_order(names, round_index):
                server = servers[name]
                with resumed(server):
                    codes_before = answer_codes(server)
                    split_before = cpu_by_process_kind(server.pid)
                    meter = CpuMeter(server, list(servers.values()))
                    report = run_wrk(server.url, body_files[kind], args.seconds, args.connections)
                    spent = meter.stop()
                    split = cpu_by_process_kind(server.pid)
                    codes = answer_codes(server)
                by_process = tuple((process, cpu_s - split_before.get(process, 0.0)) for process, cpu_s in split.items())
                results.append(RunResult(name, kind, spent.server_s, spent.wall_s, report.num_ok,
                                         report.num_non_2xx + report.num_socket_errors, by_process))
                errors = ", ".join(f"{count} {what}" for what, count in report.errors_by_kind().items())
                if errors and codes is not None and codes_before is not None:
                    errors += f" (the server's own count of its non-200 answers: {non_200_growth(codes_before, codes)})"
                log(f"{kind} {name}: {report.ok_rps:.0f} answered/s, "
                    f"{1000 * spent.server_s / max(report.num_ok, 1):.3f} CPU ms/req, "
                    f"other CPUs (wrk not included) {spent.other_cpus:.2f}" + (f"; failed: {errors}" if errors else ""))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--api-workers", type=int, nargs="+", default=[1, 2], metavar="N",
                        help="mmserve serve --api-workers N for each N (default 1 2)")
    parser.add_argument("--kinds", nargs="+", choices=tuple(PATHS), default=list(PATHS))
    parser.add_argument("--seconds", type=float, default=10.0, help="each measured run (default 10)")
    parser.add_argument("--warmup-s", type=float, default=3.0, help="each server's warm-up per kind (default 3)")
    parser.add_argument("--rounds", type=int, default=2, help="A-B-B-A rounds (default 2)")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections (default 16)")
    parser.add_argument("--vision-ms", type=float, default=1.0, help="synthetic vision tower sleep per batch (1)")
    parser.add_argument("--text-ms", type=float, default=0.5, help="synthetic text tower sleep per batch (0.5)")
    parser.add_argument("--log-level", default="info", help="mmserve's log level (default info, its default)")
    parser.add_argument("--baseline-tree", type=Path, default=None, metavar="DIR",
                        help="also run mmserve from this source tree (e.g. `git archive BASE | tar -x -C DIR`), "
                             "named 'base wN', alternated with this checkout's in the same rounds")
    parser.add_argument("--baseline-workers", type=int, nargs="+", default=[2], metavar="N",
                        help="--api-workers of the baseline tree's servers (default 2)")
    add_save_figures_argument(parser)
    args = parser.parse_args(argv)
    if wrk_path() is None:
        print("benchmarks/frontend.py needs wrk: apt-get install wrk (Debian's package)", file=sys.stderr)
        return 2
    jpeg = photo_like_jpeg(IMAGE_SIDE, IMAGE_SIDE)
    bodies = request_bodies(jpeg)
    print(f"request path vs the HTTP floor, {utc_now()}, {machine_line()}", flush=True)
    print(f"wrk -t1 -c{args.connections}, {args.rounds} A-B-B-A rounds of {args.seconds:g} s; synthetic preset "
          f"(vision {args.vision_ms:g} ms, text {args.text_ms:g} ms slept per batch), segment cache off, "
          f"log level {args.log_level}; a {IMAGE_SIDE}x{IMAGE_SIDE} photo-like JPEG of {len(jpeg)} B "
          "(synthesised, not a photograph)", flush=True)
    with ExitStack() as stack, tempfile.TemporaryDirectory() as scratch:
        body_files = {kind: write_bodies(Path(scratch) / kind, kind, PATHS[kind], [body])
                      for kind, body in bodies.items()}
        servers: dict[str, ServerProcess] = {}
        for num_workers in args.api_workers:
            server = start_mmserve(num_workers, args, stack)
            if server is not None:
                servers[server.command.name] = server
        if args.baseline_tree is not None:
            for num_workers in args.baseline_workers:
                server = start_mmserve(num_workers, args, stack, args.baseline_tree.resolve())
                if server is not None:
                    servers[server.command.name] = server
        answers_file = Path(scratch) / "answers.json"
        answers_file.write_text(json.dumps(record_answers(next(iter(servers.values())), bodies)))
        floor = start_paused(floor_command(answers_file))
        stack.callback(floor.stop)
        servers = {FLOOR: floor, **servers}
        decode_ms = decode_alone_ms(jpeg, min(args.seconds, 5.0)) if "image" in args.kinds else None
        results = measure(servers, args.kinds, body_files, args)
    pooled = [pool([r for r in results if r.server == name and r.kind == kind])
              for kind in args.kinds for name in servers]
    if decode_ms is not None:
        print(f"the JPEG's base64-decode + decode + resize alone: {decode_ms:.3f} CPU ms")
    table = table_rows(pooled, decode_ms)
    print("\n".join(align(table)))
    split_rows = process_split_rows(results)
    if len(split_rows) > 1:
        print("where each server's CPU goes, by kind of process (CPU ms per answered request, cores used):")
        print("\n".join(align(split_rows)))
    floor_ms = {p.kind: p.cpu_ms_per_request for p in pooled if p.server == FLOOR}
    capacity = capacity_rows(results, floor_ms)
    if len(capacity) > 1:
        print("the engine as the serial part: its CPU per request against the floor's, the requests one engine "
              "takes at 100 % of one core, and the API-process cores that rate needs:")
        print("\n".join(align(capacity)))
    speedup = workers_speedup(pooled, "mmserve w1", "mmserve w2")
    if speedup is not None:
        print(f"text answers/s, --api-workers 2 over 1: {speedup:.2f} (reported, no target) on {num_usable_cpus()} "
              "CPUs")
    save_figures(args.save_figures, headline_figures(table, capacity))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
