"""KServe v2 over gRPC against the HTTP v2 route (binary tensors), on one server, alternated in one run.

    python -m benchmarks.grpc_vs_http [--seconds 10] [--rounds 2] [--processes 4] [--threads 4] [--save-figures PATH]

One ``mmserve serve --grpc-port`` per model (the synthetic preset, a tiny
random CLIP), segment cache off. Each workload (one text, or one 224-px JPEG,
per request) is sent by ``tritonclient.grpc`` and ``tritonclient.http``,
A-B-B-A, at C = processes x threads (closed loop). The Python generator's own
CPU is reported apart from the server's (its process group's, from /proc).
Targets (issue 44): gRPC's server CPU per request <= 0.8x HTTP's, requests/s
>= HTTP's.
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

import numpy as np

from benchmarks.harness import Figure, add_save_figures_argument, machine_line, save_figures, utc_now
from benchmarks.harness.cpu_accounting import CpuMeter
from benchmarks.harness.server_commands import mmserve_command, mmserve_model_command
from benchmarks.harness.server_process import ServerProcess, free_port, running
from benchmarks.photo_like import noise_image

SETTINGS = {"CACHE_TEXT_BYTES": "0", "CACHE_IMAGE_BYTES": "0", "API_WORKERS": "1"}
TEXTS = tuple(f"a photo of thing number {index} on a table" for index in range(64))
IMAGE_SIDE_PX = 224
PROTOCOLS = ("grpc", "http")


def _one_call(protocol: str, client: object, model: str, workload: str, index: int, image: bytes) -> None:
    module = importlib.import_module(f"tritonclient.{protocol}")
    name, value = ("text", TEXTS[index % len(TEXTS)].encode()) if workload == "text" else ("image", image)
    tensor = module.InferInput(name, [1], "BYTES")
    tensor.set_data_from_numpy(np.array([value], dtype=object))
    output = "text_embedding" if workload == "text" else "image_embedding"
    if protocol == "grpc":
        answer = client.infer(model, [tensor], outputs=[module.InferRequestedOutput(output)])  # type: ignore[attr-defined]
    else:
        answer = client.infer(model, [tensor],  # type: ignore[attr-defined]
                              outputs=[module.InferRequestedOutput(output, binary_data=True)])
    assert answer.as_numpy(output).shape[0] == 1


def _worker(protocol: str, address: str, model: str, workload: str, num_threads: int, seconds: float,
            barrier: multiprocessing.synchronize.Barrier, results: multiprocessing.Queue) -> None:
    """One generator process: ``num_threads`` closed-loop clients; reports (answered, failed, own CPU s).

    Each thread makes its own client (tritonclient.http's is gevent's, bound to the thread that made it)
    and sends one request before the clock starts.
    """
    import threading

    module = importlib.import_module(f"tritonclient.{protocol}")
    image = noise_image(IMAGE_SIDE_PX, IMAGE_SIDE_PX, seed=7)
    counts = [[0, 0] for _ in range(num_threads)]
    warm = threading.Barrier(num_threads + 1)
    go = threading.Event()
    window: list[float] = []

    def loop(slot: int) -> None:
        client = (module.InferenceServerClient(address) if protocol == "grpc"
                  else module.InferenceServerClient(address, network_timeout=120))
        _one_call(protocol, client, model, workload, slot, image)
        warm.wait()
        go.wait()
        index = slot
        while time.monotonic() < window[0]:
            try:
                _one_call(protocol, client, model, workload, index, image)
                counts[slot][0] += 1
            except Exception:  # noqa: BLE001 - counted: a failed answer is not an answered request
                counts[slot][1] += 1
            index += num_threads

    threads = [threading.Thread(target=loop, args=(slot,)) for slot in range(num_threads)]
    for thread in threads:
        thread.start()
    warm.wait()
    barrier.wait()
    started_cpu_s = time.process_time()
    window.append(time.monotonic() + seconds)
    go.set()
    for thread in threads:
        thread.join()
    results.put((sum(c[0] for c in counts), sum(c[1] for c in counts), time.process_time() - started_cpu_s))


@dataclass(frozen=True)
class Run:
    protocol: str
    num_ok: int
    num_failed: int
    wall_s: float
    server_cpu_s: float
    generator_cpu_s: float
    other_cpus: float

    @property
    def rps(self) -> float:
        return self.num_ok / self.wall_s

    @property
    def server_ms(self) -> float:
        return 1000 * self.server_cpu_s / max(self.num_ok, 1)

    @property
    def generator_ms(self) -> float:
        return 1000 * self.generator_cpu_s / max(self.num_ok, 1)


def measure(server: ServerProcess, protocol: str, grpc_port: int, model: str, workload: str,
            args: argparse.Namespace) -> Run:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(args.processes + 1)
    results: multiprocessing.Queue = context.Queue()
    address = f"127.0.0.1:{grpc_port}" if protocol == "grpc" else server.url.removeprefix("http://")
    workers = [context.Process(target=_worker, args=(protocol, address, model, workload, args.threads, args.seconds,
                                                     barrier, results)) for _ in range(args.processes)]
    for worker in workers:
        worker.start()
    barrier.wait(timeout=300)
    meter = CpuMeter(server)
    started_s = time.perf_counter()
    reports = [results.get(timeout=args.seconds + 300) for _ in workers]
    wall_s = time.perf_counter() - started_s
    spent = meter.stop()
    for worker in workers:
        worker.join()
    return Run(protocol, sum(r[0] for r in reports), sum(r[1] for r in reports), wall_s, spent.server_s,
               sum(r[2] for r in reports), spent.other_cpus)


def _table(title: str, runs: list[Run]) -> tuple[str, float, float]:
    """The runs' table, and gRPC over HTTP in answered/s and in server CPU per request."""
    lines = [f"{title}", f"  {'protocol':<8} {'runs':>4} {'answered/s':>11} {'server CPU ms/req':>18} "
             f"{'generator CPU ms/req':>21} {'failed':>6} {'other CPUs':>10}"]
    by_protocol = {protocol: [run for run in runs if run.protocol == protocol] for protocol in PROTOCOLS}
    for protocol, chosen in by_protocol.items():
        lines.append(f"  {protocol:<8} {len(chosen):>4} {mean(r.rps for r in chosen):>11.1f} "
                     f"{mean(r.server_ms for r in chosen):>18.2f} {mean(r.generator_ms for r in chosen):>21.2f} "
                     f"{sum(r.num_failed for r in chosen):>6} {mean(r.other_cpus for r in chosen):>10.2f}")
    rps_ratio = mean(r.rps for r in by_protocol["grpc"]) / mean(r.rps for r in by_protocol["http"])
    cpu_ratio = mean(r.server_ms for r in by_protocol["grpc"]) / mean(r.server_ms for r in by_protocol["http"])
    lines.append(f"  grpc/http: answered/s {rps_ratio:.2f}x (target >= 1.00: {'met' if rps_ratio >= 1 else 'MISSED'}), "
                 f"server CPU per request {cpu_ratio:.2f}x (target <= 0.80: {'met' if cpu_ratio <= 0.8 else 'MISSED'})")
    return "\n".join(lines), rps_ratio, cpu_ratio


def _figures(label: str, workload: str, rps_ratio: float, cpu_ratio: float) -> list[Figure]:
    """The headline's figures of one workload, named as the table judges them."""
    rps_verdict = "met" if rps_ratio >= 1 else "MISSED"
    cpu_verdict = "met" if cpu_ratio <= 0.8 else "MISSED"
    return [Figure("grpc_vs_http", f"{label} {workload}, answered/s gRPC over HTTP (target >= 1.00, {rps_verdict})",
                   round(rps_ratio, 2), "x"),
            Figure("grpc_vs_http", f"{label} {workload}, server CPU per request (target <= 0.80, {cpu_verdict})",
                   round(cpu_ratio, 2), "x")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=1, help="A-B-B-A rounds per workload (4 runs each)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4, help="per process; C = processes x threads")
    add_save_figures_argument(parser)
    args = parser.parse_args()
    figures: list[Figure] = []
    from benchmarks.random_pretrained import write_clip

    print(f"KServe v2: tritonclient.grpc vs tritonclient.http (binary), {utc_now()}, {machine_line()}")
    print(f"C = {args.processes * args.threads} ({args.processes} generator processes x {args.threads} threads), "
          f"{args.seconds:g} s a run, {args.rounds} A-B-B-A rounds, segment cache off, --api-workers 1")
    with tempfile.TemporaryDirectory() as scratch:
        clip_dir = write_clip(Path(scratch) / "tiny-clip")
        models = {"synthetic": lambda settings: mmserve_command("synthetic", settings),
                  "tiny CLIP": lambda settings: mmserve_model_command(clip_dir, settings)}
        for label, command_of in models.items():
            grpc_port = free_port()
            with running(command_of({**SETTINGS, "GRPC_PORT": str(grpc_port)})) as server:
                model = __import__("httpx").get(f"{server.url}/v1/models").json()["data"][0]["id"]
                for workload in ("text", "image"):
                    runs = []
                    for round_index in range(args.rounds):
                        order = PROTOCOLS if round_index % 2 == 0 else PROTOCOLS[::-1]
                        for protocol in (*order, *order[::-1]):
                            runs.append(measure(server, protocol, grpc_port, model, workload, args))
                    what = "one text" if workload == "text" else f"one {IMAGE_SIDE_PX}-px JPEG"
                    table, rps_ratio, cpu_ratio = _table(f"{label} ({model}), {what} per request", runs)
                    print(table, flush=True)
                    if label == "tiny CLIP":  # the headline's model: real towers, not the synthetic preset's sleeps
                        figures += _figures(label, workload, rps_ratio, cpu_ratio)
    save_figures(args.save_figures, figures)


if __name__ == "__main__":
    main()
