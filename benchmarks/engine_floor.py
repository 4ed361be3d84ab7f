"""The engine's CPU per text against the HTTP floor and against a bare batcher, in one run (issue #42).

    python -m benchmarks.engine_floor [--seconds 10] [--rounds 2] [--rate 1700] [--tick-ms 1 4] [--text-ms 0.5]
        [--save-figures FILE]

Issue #42 asks that with ``--api-workers 2`` the engine process (the one every
request passes) spend at most 0.6x the CPU per text of the HTTP floor. Three
things are measured here, so that target can be judged against what any
Python engine costs:

    HTTP floor      ``benchmarks.frontend_floor_app`` under ``wrk -t1 -c16`` (as ``benchmarks.frontend``),
                    answering a text answer of mmserve's shape (32 floats); its CPU per answered request
    mmserve engine  ``python -m server.workers.engine_process``, started as the supervisor starts one
                    (synthetic preset, ``--text-ms`` slept per text batch, segment cache off)
    bare batcher    ``benchmarks.engine_floor_batcher``: frames in, one lane, the same text tower, answers
                    per batch, nothing else

Each engine is loaded by two client processes (``benchmarks.engine_floor_client``,
like two API processes) at ``--rate``/2 texts per second each, open loop, the
calls due every ``--tick-ms`` in one frame; against mmserve's engine they are
an API process's own calls (``run`` with the text's token ids, then its
``record``, ``status`` polled). Per tick and round the two engines run A-B-B-A
(only the one under test is loaded; both stay up). An engine's CPU is its
process's (every thread, /proc) over the run, divided by the calls it answered.
wrk: ``apt-get install wrk``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from benchmarks.engine_floor_processes import (
    EngineUnderTest, call, start_batcher, start_mmserve_engine, text_batches, wait_ready,
)
from benchmarks.engine_floor_table import (
    BATCHER, FLOOR, MMSERVE, Run, headline_figures, pooled, pooled_by_key, table_rows, target_line,
)
from benchmarks.harness import CpuMeter, log, machine_line, resumed, run_wrk, start_paused, utc_now, wrk_path
from benchmarks.harness.cpu_accounting import process_cpu_s
from benchmarks.harness.figures import add_save_figures_argument, save_figures
from benchmarks.harness.table_layout import align
from benchmarks.harness.wrk_load import write_bodies

TEXT = "a red bicycle leaning on a sunny wall by the sea"[:40]  # benchmarks.frontend's text
NUM_CLIENTS = 2  # --api-workers 2
CLIENT_READY_TIMEOUT_S = 60.0
START_LEAD_S = 0.3  # from the start time's sending to the clients' first calls


def text_answer(embedding: Sequence[float], num_tokens: int) -> str:
    """A ``/v1/embeddings`` text answer of mmserve's shape (``server.protocols.openai_embeddings``)."""
    return json.dumps({"object": "list", "data": [{"object": "embedding", "index": 0,
                                                   "embedding": [float(value) for value in embedding]}],
                       "model": "synthetic", "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}})


def token_ids_of(engine: EngineUnderTest, text: str) -> tuple[int, ...]:
    """``text``'s token ids by mmserve's engine's tokenizer (its ``describe`` answer, as an API process)."""
    from models.tokenizer_files import unpack_tokenizer

    _, _, (_, files) = call(engine.socket_path, "describe")
    return unpack_tokenizer(files).encode(text, truncate=False).token_ids


def measure_floor(answers_file: Path, scratch: Path, args: argparse.Namespace) -> list[Run]:
    """One wrk run per round against the floor app (after a warm-up), its CPU per answered request."""
    from benchmarks.frontend import floor_command

    bodies = write_bodies(scratch / "floor-bodies", "text", "/v1/embeddings", [json.dumps({"input": TEXT}).encode()])
    floor = start_paused(floor_command(answers_file))
    runs = []
    try:
        with resumed(floor):
            run_wrk(floor.url, bodies, args.warmup_s, args.connections)
            for _ in range(args.rounds):
                meter = CpuMeter(floor, [floor])
                report = run_wrk(floor.url, bodies, args.seconds, args.connections)
                spent = meter.stop()
                runs.append(Run(FLOOR, None, spent.server_s, spent.wall_s, report.num_ok,
                                report.num_non_2xx + report.num_socket_errors))
                errors = ", ".join(f"{count} {what}" for what, count in report.errors_by_kind().items())
                log(f"floor: {report.ok_rps:.0f} answered/s, {runs[-1].cpu_ms_per_request:.3f} CPU ms/req"
                    + (f"; failed: {errors}" if errors else ""))
    finally:
        floor.stop()
    return runs


def run_clients(engine: EngineUnderTest, describe_socket: str, tick_ms: float, seconds: float,
                args: argparse.Namespace) -> Run:
    """``NUM_CLIENTS`` clients against ``engine`` for ``seconds``: its CPU, answers, failures and batches."""
    argv = [sys.executable, "-m", "benchmarks.engine_floor_client", "--socket", engine.socket_path,
            "--engine", "batcher" if engine.name == BATCHER else "mmserve", "--rate", str(args.rate / NUM_CLIENTS),
            "--seconds", str(seconds), "--tick-ms", str(tick_ms), "--text", TEXT, "--describe-socket", describe_socket]
    environment = {**os.environ, "MMSERVE_WORKER_SUPERVISOR_PID": str(os.getpid())}  # their pixel slots' prefix
    clients = [subprocess.Popen(argv, env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for _ in range(NUM_CLIENTS)]
    try:
        for client in clients:
            line = client.stdout.readline()  # type: ignore[union-attr]
            if line.strip() != "ready":
                raise RuntimeError(f"a load client did not get ready (exit status {client.wait()})")
        batches_before = text_batches(engine)
        start_unix_s = time.time() + START_LEAD_S
        for client in clients:
            client.stdin.write(f"{start_unix_s}\n")  # type: ignore[union-attr]
            client.stdin.flush()  # type: ignore[union-attr]
        time.sleep(max(0.0, start_unix_s - time.time()))
        cpu_before_s, started_s = process_cpu_s(engine.pid), time.perf_counter()
        reports = [json.loads(client.communicate(timeout=seconds + 30.0)[0].strip().splitlines()[-1])
                   for client in clients]
        cpu_s, wall_s = process_cpu_s(engine.pid) - cpu_before_s, time.perf_counter() - started_s
    finally:
        for client in clients:
            if client.poll() is None:
                client.kill()
                client.wait()
    batches_after = text_batches(engine)
    num_failed = sum(report["failed"] + report["unanswered"] for report in reports)
    for report in reports:
        for error in report["errors"]:
            log(f"{engine.name}: a call failed: {error}")
    return Run(engine.name, tick_ms, cpu_s, min(wall_s, seconds), sum(report["answered"] for report in reports),
               num_failed, batches_after[0] - batches_before[0], batches_after[1] - batches_before[1])


def measure_engines(engines: dict[str, EngineUnderTest], args: argparse.Namespace) -> list[Run]:
    """Per tick, a warm-up of each engine, then per round the engines A-B-B-A."""
    from benchmarks.frontend_measure import run_order

    describe_socket = engines[MMSERVE].socket_path
    runs: list[Run] = []
    for tick_ms in args.tick_ms:
        for engine in engines.values():
            run_clients(engine, describe_socket, tick_ms, args.warmup_s, args)
        for round_index in range(args.rounds):
            for name in run_order(list(engines), round_index):
                run = run_clients(engines[name], describe_socket, tick_ms, args.seconds, args)
                runs.append(run)
                log(f"{name}, tick {tick_ms:g} ms: {run.answered_per_s:.0f} answered/s, "
                    f"{run.cpu_ms_per_request:.3f} CPU ms/req, mean batch {run.mean_batch or 0:.2f}, "
                    f"failed {run.num_failed}")
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="each measured run (default 10)")
    parser.add_argument("--rounds", type=int, default=2, help="A-B-B-A rounds (default 2)")
    parser.add_argument("--rate", type=float, default=1700.0, help="texts per second, both clients (default 1700)")
    parser.add_argument("--tick-ms", type=float, nargs="+", default=[1.0, 4.0],
                        help="the clients' calls due every TICK ms go in one frame (default 1 4)")
    parser.add_argument("--text-ms", type=float, default=0.5, help="synthetic text tower sleep per batch (0.5)")
    parser.add_argument("--vision-ms", type=float, default=1.0, help="synthetic vision tower sleep per batch (1)")
    parser.add_argument("--warmup-s", type=float, default=2.0, help="each server's warm-up (default 2)")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections for the floor (default 16)")
    add_save_figures_argument(parser)
    args = parser.parse_args(argv)
    if wrk_path() is None:
        print("benchmarks/engine_floor.py needs wrk: apt-get install wrk (Debian's package)", file=sys.stderr)
        return 2
    print(f"engine CPU per text vs the HTTP floor and a bare batcher, {utc_now()}, {machine_line()}", flush=True)
    print(f"{NUM_CLIENTS} load clients at {args.rate:g} texts/s together, open loop, {args.rounds} A-B-B-A rounds "
          f"of {args.seconds:g} s per tick; synthetic preset (text {args.text_ms:g} ms slept per batch), segment "
          f"cache off; floor: wrk -t1 -c{args.connections}", flush=True)
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="engine-floor-") as scratch_name:
        scratch = Path(scratch_name)
        engines: dict[str, EngineUnderTest] = {}
        for start in (start_mmserve_engine, start_batcher):
            engine = start(scratch, args.text_ms, args.vision_ms)
            stack.callback(engine.stop)
            engines[engine.name] = engine
        for engine in engines.values():
            wait_ready(engine)
        token_ids = token_ids_of(engines[MMSERVE], TEXT)
        kind, _, embedding = call(engines[BATCHER].socket_path, "text", token_ids)
        if kind != "ok":
            raise RuntimeError(f"the bare batcher answered {kind}: {embedding!r}")
        answers_file = scratch / "answers.json"
        answers_file.write_text(json.dumps({"text": text_answer(embedding, len(token_ids))}))
        floor = pooled(measure_floor(answers_file, scratch, args))
        engine_runs = pooled_by_key(measure_engines(engines, args))
    engine_runs.sort(key=lambda run: (run.name != MMSERVE, run.tick_ms))
    print("\n".join(align(table_rows(floor, engine_runs))))
    print(target_line(floor))
    save_figures(args.save_figures, headline_figures(floor, engine_runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
