"""Start-up time: from spawning ``mmserve serve`` to ``/health/ready``, by model, runtime and export cache.

    python -m benchmarks.startup [--presets tiny] [--rounds 2] [--save-figures PATH]
    python -m benchmarks.startup --presets vit-l16 --siglip-l --ways cold warm --keep-cache DIR --log-lines
    python -m benchmarks.startup --presets vit-l16 --ways warm --keep-cache DIR --baseline-tree OLD_CHECKOUT

Up to three ways per model, in turn each round: ``torch``; ``cold``, ONNX
Runtime (``--runtime auto``, checked with the server) with an empty export
cache, so the towers are exported and checked on the way; ``warm``, the
same with the cache that start filled, as every later start finds it.
``--keep-cache DIR`` keeps each model's graphs in DIR/MODEL (a cold start
that finds them says "ORT, cache already filled").

Time is to ``/health/ready`` answering 200 (after warm-up), with the
server's CPU seconds by then, which a shared machine stretches less.
Models: any preset (``vit-l16`` is ``mmserve serve``'s default) and
``--siglip-l``, a random SigLIP at ``google/siglip-large-patch16-384``'s
sizes. ``--log-lines`` prints the servers' own lines on where the time went.
``--baseline-tree DIR`` also starts each model from another source tree (on
``PYTHONPATH``, reading the same export cache), in turn with this one in
each round: a change's effect measured in one run, at one load.

Target (issue 43): the ViT-L/16 preset ready <= 45 s from the cache on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import (
    Figure, ServerProcess, add_save_figures_argument, machine_line, mmserve_command, mmserve_model_command, ruled,
    save_figures, utc_now,
)
from benchmarks.harness.server_process import ServerCommand
from benchmarks.random_pretrained import TowerSize, write_siglip
from benchmarks.served_runtime import check_served, served_runtime

READY_TIMEOUT_S = 3600.0  # an export of SigLIP-L or ViT-L on 2 busy cores takes many minutes
TARGET_CACHED_S = 45.0
WAYS = {"torch": "torch", "cold": "ORT, cold export cache", "warm": "ORT, warm export cache"}
SIGLIP_L = TowerSize(image_size=384, patch_size=16, hidden_size=1024, num_layers=24, num_heads=16,
                     intermediate_size=4096, projection_dim=1024)
SIGLIP_L_TEXT_TOKENS = 64
BASELINE = ", baseline tree"  # a model's name from --baseline-tree: its rows, not the headline's
_PHASE_MARKS = ("the towers run in ONNX Runtime", "warm-up ran", "exporting the towers")


@dataclass(frozen=True)
class Start:
    """One start: seconds to ready, the CPU seconds the server's processes had spent by then, its log lines."""

    wall_s: float
    cpu_s: float
    phases: tuple[str, ...]


def _phases(log_tail: str) -> tuple[str, ...]:
    """The server's log lines on the ONNX step and the warm-up, the logger's prefix cut off."""
    return tuple(line.split(" - ")[-1].strip() for line in log_tail.splitlines()
                 if any(mark in line for mark in _PHASE_MARKS))


def timed_start(command: ServerCommand, runtime: str) -> Start:
    """Spawn, wait for ready, check the server computes under ``runtime``, stop."""
    started_s = time.monotonic()
    server = ServerProcess(command)
    try:
        server.wait_ready(READY_TIMEOUT_S)
        wall_s, cpu_s = time.monotonic() - started_s, server.cpu_s()
        served = served_runtime(server.url)
        phases = _phases(server.stderr_tail(max_chars=1_000_000))
    finally:
        server.stop()
    check_served(served, runtime, "cpu", None)
    return Start(wall_s, cpu_s, phases)


def _row_label(way: str, *, is_filled: bool) -> str:
    """What a start is, by the cache it finds: an ONNX Runtime start with an empty cache exports, whatever it was asked."""
    if way == "torch":
        return WAYS["torch"]
    if not is_filled:
        return WAYS["cold"]
    return WAYS["warm"] if way == "warm" else "ORT, cache already filled"


def measure(commands: dict[str, Callable[[dict[str, str]], ServerCommand]], ways: list[str], num_rounds: int,
            cache_root: Path, is_kept: bool) -> dict[tuple[str, str], list[Start]]:
    """Each (model, way row label)'s starts; a round's cold start gets an export cache of its own unless kept."""
    runs: dict[tuple[str, str], list[Start]] = {}
    for round_index in range(num_rounds):
        for model, command_for in commands.items():
            name = model.removesuffix(BASELINE)  # a baseline tree reads and fills the same model's cache
            cache = cache_root / name if is_kept else cache_root / f"{name}-{round_index}"
            for way in ways:
                label = _row_label(way, is_filled=cache.exists() and any(cache.iterdir()))
                settings = ({"RUNTIME": "torch"} if way == "torch"
                            else {"RUNTIME": "auto", "EXPORT_CACHE_DIR": str(cache)})
                runs.setdefault((model, label), []).append(
                    timed_start(command_for(settings), settings["RUNTIME"]))
    return runs


def format_report(runs: dict[tuple[str, str], list[Start]]) -> tuple[str, list[Figure]]:
    """The table (one row per model and way), the log lines, and the headline's figures."""
    rows = [("model", "way", "median s to ready", "median CPU s", "runs s to ready",
             f"target (vit-l16 from the cache <= {TARGET_CACHED_S:g} s)")]
    figures, notes = [], []
    for (model, label), starts in runs.items():
        wall = statistics.median(start.wall_s for start in starts)
        cpu = statistics.median(start.cpu_s for start in starts)
        target = "-"
        if model == "vit-l16" and label != WAYS["torch"] and "cold" not in label:
            target = "met" if wall <= TARGET_CACHED_S else "NOT met"
        rows.append((model, label, f"{wall:.1f}", f"{cpu:.1f}", " ".join(f"{s.wall_s:.1f}" for s in starts), target))
        if not model.endswith(BASELINE):  # a baseline tree's rows compare; the headline holds this checkout's
            figures += _figures(model, label, wall, cpu, target)
        notes += [f"{model}, {label}, round {index}: {phase}" for index, start in enumerate(starts)
                  for phase in start.phases]
    report = ruled(rows)
    return report + ("\n\nthe servers' log lines:\n" + "\n".join(notes) if notes else ""), figures


def _from_tree(command_for: Callable[[dict[str, str]], ServerCommand],
               tree: Path) -> Callable[[dict[str, str]], ServerCommand]:
    """``command_for``'s server, run from the source tree ``tree`` (its working directory, first on sys.path)."""
    def command(settings: dict[str, str]) -> ServerCommand:
        base = command_for(settings)
        return dataclasses.replace(base, env={**base.env, "PYTHONPATH": str(tree)}, cwd=tree)
    return command


def _figures(model: str, label: str, wall_s: float, cpu_s: float, target: str) -> list[Figure]:
    """One row's headline figures: the default model has its own row, with the target and the CPU."""
    if model != "vit-l16":
        return [Figure("startup_time", f"{model}, {label}", round(wall_s, 1), "s")]
    name = f"{label} (target <= {TARGET_CACHED_S:g} s, {target})" if target != "-" else label
    return [Figure("startup_vit_l16", name, round(wall_s, 1), "s"),
            Figure("startup_vit_l16", f"CPU s to ready, {label}", round(cpu_s, 1), "s")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="*", default=["tiny"], help="mmserve presets (vit-l16: the default model)")
    parser.add_argument("--siglip-l", action="store_true", help="also a random SigLIP-L/16 384 px directory")
    parser.add_argument("--ways", nargs="+", choices=tuple(WAYS), default=list(WAYS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keep-cache", type=Path, help="export into DIR (kept) instead of a temporary directory")
    parser.add_argument("--log-lines", action="store_true",
                        help="run the servers at log level info and print their lines on the ONNX step and warm-up")
    parser.add_argument("--baseline-tree", type=Path, metavar="DIR",
                        help="also start each model from this source tree, in turn with this checkout")
    add_save_figures_argument(parser)
    args = parser.parse_args(argv)
    print(f"start-up to ready, {utc_now()}, {machine_line()}; {args.rounds} rounds, ways in turn", flush=True)
    extra = {"LOG_LEVEL": "info"} if args.log_lines else {}
    with tempfile.TemporaryDirectory(prefix="mmserve-startup-") as directory:
        scratch = Path(directory)
        commands = {preset: (lambda settings, preset=preset: mmserve_command(preset, {**settings, **extra}))
                    for preset in args.presets}
        if args.siglip_l:
            siglip = write_siglip(scratch / "siglip-l", SIGLIP_L, max_text_tokens=SIGLIP_L_TEXT_TOKENS)
            commands["siglip-l"] = lambda settings: mmserve_model_command(siglip, {**settings, **extra})
        if args.baseline_tree is not None:
            commands.update({f"{model}{BASELINE}": _from_tree(command_for, args.baseline_tree.resolve())
                             for model, command_for in list(commands.items())})
        cache_root = args.keep_cache or scratch / "export-cache"
        report, figures = format_report(measure(commands, args.ways, args.rounds, cache_root,
                                                args.keep_cache is not None))
    print(report, flush=True)
    save_figures(args.save_figures, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
