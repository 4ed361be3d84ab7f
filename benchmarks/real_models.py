"""mmserve against Infinity on the image–text models users have: same weights, same protocol, one run.

Per family (SigLIP, CLIP, open_clip, timm ViT + BERT) a small random model
(``benchmarks.random_pretrained``: 4 layers, 256 wide, 224 px, patch 16) is
served by ``mmserve serve --model DIR`` (segment cache off) and by Infinity
0.0.78 from its own venv (``benchmarks.harness.peer_venv``), both on OpenAI
``POST /v1/embeddings`` with one input a request, batch cap 8, float32, CPU.

1. Embeddings against the family's own library (``reference_embeddings``):
   min cosine, target >= 0.99999; a family Infinity cannot serve says why.
2. Timing, text-only and image-only, A-B-B-A with the idle server paused:
   saturation from ``wrk`` (little CPU of its own) with the server's CPU per
   answer from ``/proc``, then open-loop p99 at 70 % of Infinity's saturation
   from the Python generator (which times from the intended send). Targets,
   mmserve / Infinity under ``--runtime auto`` (issue 43): text throughput
   >= 1.6x, CPU per answer <= 0.65x; images >= 2x and <= 0.5x; p99 text
   <= 0.5x, images <= 0.7x.
3. Unless ``--no-torch-baseline``: images again against mmserve under
   ``--runtime torch``; target CPU per answer <= 0.55x torch's.

Every table names the runtime each mmserve says it serves (``/v1/models``);
the script stops if that is not what it asked for. ``--no-peer`` times
mmserve alone; ``--previous-figures`` prints an earlier run's CPU ratios.

    python -m benchmarks.real_models --families clip --timing-families clip --seconds 5
"""

from __future__ import annotations

import argparse
import base64
import logging
import random
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.embedding_agreement import (
    AgreementRow, agreement_row, failure_reason, format_agreement_table, served_model_name,
)
from benchmarks.harness import (
    AlternationPlan, RunSpec, ServerProcess, ServerRuns, ServerStartError, Targets, WrkBodies, cpu_ratio,
    cpu_target_text, format_comparison, format_saturation, infinity_command, log, machine_line, num_usable_cpus,
    resumed, run_alternated, run_saturation, start_paused, utc_now, verdict_text, verdicts, wrk_path, wrk_saturation,
    write_bodies,
)
from benchmarks.harness.wrk_load import batching_detail
from benchmarks.harness.peer_venv import DEFAULT_INFINITY_VENV, PeerInstallError, ensure_venv, installed_version
from benchmarks.loadgen.config import BenchConfig
from benchmarks.loadgen.embeddings_payload import EMBEDDINGS_PATH, EmbeddingsDialect, data_uri, image_body, text_body
from benchmarks.loadgen.image_pool import ImageFormat, ImagePool, ImageSize
from benchmarks.loadgen.text_source import TextSource
from benchmarks.loadgen.workload import Mix, TextLengthRange, parse_mix
from benchmarks.random_pretrained import SENTENCES, TowerSize
from benchmarks.real_models_figures import (
    figures_document, lane_figures, load_figures, previous_cpu_ratio, save_figures,
)
from benchmarks.reference_embeddings import Family, ReferenceInputs, reference_embeddings, write_family
from benchmarks.served_runtime import MmserveRuntime, ServedRuntime, start_checked

MMSERVE = "mmserve"
INFINITY = "infinity"
BATCH_CAP = 8
QUEUE_DELAY_MS = 5.0
MMSERVE_SETTINGS = {"CACHE_IMAGE_BYTES": "0", "CACHE_TEXT_BYTES": "0", "MAX_BATCH_SIZE": str(BATCH_CAP),
                    "MAX_QUEUE_DELAY_MS": str(QUEUE_DELAY_MS)}
TIMING_SIZE = TowerSize(image_size=224, patch_size=16, hidden_size=256, num_layers=4, num_heads=4,
                        intermediate_size=1024, projection_dim=256)
# Both servers compute the same tokens: Infinity cuts every text at 20 tokens (a transformers 4 generation
# default), and the random CLIP's tokenizer (BPE without merges) spends a token per character plus two, so
# 18 characters at most. Longer texts had mmserve computing up to three times Infinity's tokens per answer.
INFINITY_TEXT_TOKENS = 20
TEXT_CHARS = TextLengthRange(8, INFINITY_TEXT_TOKENS - 2)
AGREEMENT_IMAGE_SIZES = (ImageSize(224, 224), ImageSize(64, 40), ImageSize(300, 180))
AGREEMENT_TEXTS = (SENTENCES[0], SENTENCES[3], SENTENCES[9], "a  photo, of  A CAT!")
READY_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 60.0
# What wrk posts in turn at saturation: the same inputs to both servers, each in its own dialect.
NUM_WRK_TEXTS = 64
NUM_WRK_IMAGES = 100
WRK_IMAGE_SIZE = ImageSize(224, 224)
WRK_BODY_SEED = 7
WRK_GENERATOR = "wrk -t1"
MMSERVE_TORCH = "mmserve-torch"  # the same directory under --runtime torch: what the runtime saves, same run
TORCH_CPU_TARGET = 0.55  # mmserve's CPU per image answer, at most this share of its own under --runtime torch


@dataclass(frozen=True)
class Lane:
    """One timing comparison: a modality and what mmserve should reach on it."""

    name: str  # "text" or "image"
    mix: Mix
    targets: Targets


# Issue 43's targets for mmserve on ONNX Runtime (fp32) against Infinity's torch engine; p99 from the issue before.
LANES = (Lane("text", parse_mix("text:1"), Targets(1.6, 0.5, max_cpu_ratio=0.65)),
         Lane("image", parse_mix("vision:1"), Targets(2.0, 0.7, max_cpu_ratio=0.5)))


class WrkInputs:
    """The texts and JPEGs wrk posts at saturation, made once, the same for every server and family."""

    def __init__(self) -> None:
        rng = random.Random(WRK_BODY_SEED)
        source = TextSource(WRK_BODY_SEED)
        self.texts = [source.make(rng.randint(TEXT_CHARS.min_chars, TEXT_CHARS.max_chars))
                      for _ in range(NUM_WRK_TEXTS)]
        pool = ImagePool(WRK_BODY_SEED, WRK_IMAGE_SIZE, ImageFormat.JPEG)
        pool.prepare(range(NUM_WRK_IMAGES))
        self.image_uris = [data_uri(pool.b64(key), ImageFormat.JPEG) for key in range(NUM_WRK_IMAGES)]

    def bodies(self, lane: str, dialect: EmbeddingsDialect) -> list[bytes]:
        """One-input ``/v1/embeddings`` bodies of ``lane`` ("text" or "image") in ``dialect``."""
        if lane == "text":
            return [text_body(dialect, text) for text in self.texts]
        return [image_body(dialect, uri) for uri in self.image_uris]


def wrk_bodies_for(inputs: WrkInputs, lane: Lane, dialects: dict[str, EmbeddingsDialect],
                   directory: Path) -> Callable[[RunSpec], WrkBodies]:
    """Each server's bodies for ``lane`` written under ``directory``, looked up by server name."""
    written = {name: write_bodies(directory / lane.name / name, lane.name, EMBEDDINGS_PATH,
                                  inputs.bodies(lane.name, dialect))
               for name, dialect in dialects.items()}
    return lambda run: written[run.name]


def agreement_inputs() -> ReferenceInputs:
    """PNGs of several sizes (each server resizes them itself) and texts, CJK and odd spacing among them."""
    images = []
    for index, size in enumerate(AGREEMENT_IMAGE_SIZES):
        pool = ImagePool(11 + index, size, ImageFormat.PNG)
        pool.prepare([0])
        images.append(base64.b64decode(pool.b64(0)))
    return ReferenceInputs(tuple(images), AGREEMENT_TEXTS)


def _dialect(server: ServerProcess, is_image_modality_marked: bool) -> EmbeddingsDialect:
    with httpx.Client(base_url=server.url, timeout=30.0, trust_env=False) as client:
        return EmbeddingsDialect(served_model_name(client), is_image_modality_marked)


def _start_peer(venv: Path | None, directory: Path, family: Family) -> tuple[ServerProcess | None, str | None]:
    """Infinity serving ``directory``, paused; or None and what it said when it could not start."""
    if venv is None:
        return None, "not installed (see above)"
    command = infinity_command(venv, directory, served_model_name=family.value, batch_size=BATCH_CAP)
    try:
        return start_paused(command, READY_TIMEOUT_S), None
    except ServerStartError as e:
        return None, f"did not start: {failure_reason(e.stderr_tail)}"


def _agreement(family: Family, servers: dict[str, ServerProcess], dialects: dict[str, EmbeddingsDialect],
               directory: Path, inputs: ReferenceInputs) -> list[AgreementRow]:
    want = reference_embeddings(family, directory, inputs)
    rows = []
    for name, server in servers.items():
        with resumed(server):
            rows.append(agreement_row(family.value, name, server.url, dialects[name], inputs, want, ImageFormat.PNG))
    return rows


def _timing(family: Family, servers: dict[str, ServerProcess], dialects: dict[str, EmbeddingsDialect],
            plan: AlternationPlan, inputs: WrkInputs, scratch: Path) -> list[tuple[Lane, dict[str, ServerRuns]]]:
    """Each lane: wrk saturation then the Python generator's fixed rate, A-B-B-A; mmserve alone without a peer."""
    results = []
    for lane in LANES:
        def config_for(run: RunSpec, lane: Lane = lane) -> BenchConfig:
            """One input per ``POST /v1/embeddings`` in the server's dialect, the lane's modality only."""
            return run.config(mix=lane.mix, text_length=TEXT_CHARS, timeout_s=REQUEST_TIMEOUT_S,
                              embeddings=dialects[run.name])

        saturate = wrk_saturation(wrk_bodies_for(inputs, lane, dialects, scratch), REQUEST_TIMEOUT_S, batching_detail)
        label = f"{family.value} {lane.name}"
        if INFINITY in servers:
            runs = run_alternated(servers, INFINITY, MMSERVE, plan, config_for, label, saturate)
        else:
            runs = run_saturation(servers, [n for n in servers if n != MMSERVE_TORCH], plan, saturate, label)
        if lane.name == "image" and MMSERVE_TORCH in servers:
            against_torch = run_saturation(servers, (MMSERVE_TORCH, MMSERVE), plan, saturate, f"{label} vs torch")
            runs[f"{MMSERVE} (vs torch)"] = against_torch[MMSERVE]
            runs[MMSERVE_TORCH] = against_torch[MMSERVE_TORCH]
        results.append((lane, runs))
    return results


def _torch_lines(family: Family, runs: dict[str, ServerRuns], plan: AlternationPlan,
                 runtimes: dict[str, ServedRuntime]) -> tuple[str, str, float | None]:
    """The table of mmserve against itself under --runtime torch (images), its verdict line and CPU ratio."""
    pair = {f"{MMSERVE} ({runtimes[MMSERVE].label()})": runs[f"{MMSERVE} (vs torch)"],
            f"{MMSERVE} ({runtimes[MMSERVE_TORCH].label()})": runs[MMSERVE_TORCH]}
    table = format_saturation(f"{family.value}, image only, mmserve against itself under --runtime torch, "
                              "A-B-B-A", pair, plan, WRK_GENERATOR)
    ratio = cpu_ratio(runs[MMSERVE_TORCH], runs[f"{MMSERVE} (vs torch)"])
    is_met = None if ratio is None else ratio <= TORCH_CPU_TARGET
    ratio_text = "not measured" if ratio is None else f"{ratio:.2f}x"
    verdict = (f"  {family.value} image, {runtimes[MMSERVE].label()} against torch: server CPU per answer "
               f"{ratio_text} (target <= {TORCH_CPU_TARGET:.2f}) {verdict_text(is_met)}")
    return table, verdict, ratio


def _verdict_line(family: Family, lane: Lane, targets: Targets, runs: dict[str, ServerRuns]) -> str:
    judged = verdicts(runs[INFINITY], runs[MMSERVE], targets)
    cpu = "" if judged.cpu_ratio is None else (
        f"; server CPU per answer {judged.cpu_ratio:.2f}x (target {cpu_target_text(targets)}) "
        f"{verdict_text(judged.is_cpu_met)}")
    return (f"  {family.value} {lane.name}: throughput {judged.throughput_ratio:.2f}x Infinity's "
            f"(target >= {targets.min_throughput_ratio:.2f}) {verdict_text(judged.is_throughput_met)}; "
            f"p99 {judged.p99_ratio:.2f}x (target <= {targets.max_p99_ratio:.2f}) "
            f"{verdict_text(judged.is_p99_met)}{cpu}")


@dataclass
class FamilyResult:
    """What one family gave: agreement rows, one verdict line per timed lane, the figures a next run compares with."""

    rows: list[AgreementRow]
    verdict_lines: list[str]
    figures: dict[str, Any]  # lane -> lane_figures, and "served": what mmserve served


@dataclass(frozen=True)
class TimingSetup:
    """How to time a family: the plan, the bodies wrk posts, the previous run's figures (or none), mmserve alone."""

    plan: AlternationPlan
    inputs: WrkInputs
    previous: dict[str, Any] | None
    is_alone_timed: bool  # --no-peer: saturation of mmserve alone, for want of Infinity
    is_torch_baseline: bool  # also time mmserve under --runtime torch on images


def _print_timing(family: Family, timed: list[tuple[Lane, dict[str, ServerRuns]]], setup: TimingSetup,
                  runtimes: dict[str, ServedRuntime], result: FamilyResult) -> None:
    result.figures["served"] = runtimes[MMSERVE].label()
    for lane, all_runs in timed:
        runs = {name: all_runs[name] for name in (INFINITY, MMSERVE) if name in all_runs}
        title = f"{family.value}, {lane.name} only, mmserve on {runtimes[MMSERVE].label()}"
        if INFINITY not in runs:
            print(format_saturation(f"{title}, mmserve alone", runs, setup.plan, WRK_GENERATOR), flush=True)
            result.figures[lane.name] = lane_figures(runs, None, MMSERVE)
        else:
            print(format_comparison(title, runs, INFINITY, MMSERVE, setup.plan, lane.targets, num_usable_cpus(),
                                    "mm/inf", WRK_GENERATOR), flush=True)
            before = previous_cpu_ratio(setup.previous, family.value, lane.name)
            if before is not None:
                print(f"(the previous run's server CPU ratio mm/inf, from --previous-figures: {before:.2f})",
                      flush=True)
            result.verdict_lines.append(_verdict_line(family, lane, lane.targets, runs))
            result.figures[lane.name] = lane_figures(runs, INFINITY, MMSERVE)
        if MMSERVE_TORCH in all_runs:
            table, verdict, ratio = _torch_lines(family, all_runs, setup.plan, runtimes)
            print(table, flush=True)
            result.verdict_lines.append(verdict)
            if ratio is not None:
                result.figures[lane.name]["torch_cpu_ratio"] = round(ratio, 6)


def run_family(family: Family, root: Path, venv: Path | None, inputs: ReferenceInputs, setup: TimingSetup | None,
               asked: MmserveRuntime) -> FamilyResult:
    """One family end to end: write, serve on both, compare embeddings, then time (when ``setup`` is given).

    Prints each timing table as it is done; returns the agreement rows, one
    verdict line per lane timed against Infinity (and against torch), and the lanes' figures.
    """
    directory = write_family(family, root / family.value, TIMING_SIZE)
    result = FamilyResult([], [], {})
    # Started one after the other and paused, so no start-up competes with another's.
    mmserve, served = start_checked(directory, asked, MMSERVE_SETTINGS, READY_TIMEOUT_S)
    started = {MMSERVE: mmserve}
    runtimes = {MMSERVE: served}
    peer = None
    try:
        if setup is not None and setup.is_torch_baseline:
            torch_asked = MmserveRuntime("torch", None, asked.device)
            started[MMSERVE_TORCH], runtimes[MMSERVE_TORCH] = start_checked(directory, torch_asked, MMSERVE_SETTINGS,
                                                                            READY_TIMEOUT_S)
        print(f"{family.value}: " + ", ".join(f"{name} serves on {runtimes[name].label()}" for name in runtimes),
              flush=True)
        peer, peer_failure = _start_peer(venv, directory, family)
        servers = started if peer is None else {INFINITY: peer, **started}
        dialects = {}
        for name, server in servers.items():
            with resumed(server):
                dialects[name] = _dialect(server, is_image_modality_marked=name == INFINITY)
        result.rows += _agreement(family, servers, dialects, directory, inputs)
        if peer_failure is not None:
            result.rows.append(AgreementRow(family.value, INFINITY, failure=peer_failure))
        if setup is not None and (peer is not None or setup.is_alone_timed):
            timed = _timing(family, servers, dialects, setup.plan, setup.inputs, root / f"{family.value}-wrk")
            _print_timing(family, timed, setup, runtimes, result)
    finally:
        for server in ([] if peer is None else [peer]) + list(started.values()):
            server.stop()
    return result


def _quiet_libraries() -> None:
    """No progress bars or load warnings from the libraries writing and reading models here: the output is the table."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    logging.getLogger().setLevel(logging.ERROR)  # open_clip warns on the root logger that it loaded no weights


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    families = [family.value for family in Family]
    parser.add_argument("--families", nargs="+", default=families, choices=families)
    parser.add_argument("--timing-families", nargs="*", default=[Family.SIGLIP.value, Family.CLIP.value],
                        choices=families, help="families timed against Infinity (those it serves)")
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="seconds per measured run (wrk counts whole seconds)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per measurement (one run per server each)")
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=16, help="wrk's connections at saturation")
    parser.add_argument("--peer-venv", type=Path, default=DEFAULT_INFINITY_VENV,
                        help=f"Infinity's own venv, made if missing (default {DEFAULT_INFINITY_VENV})")
    parser.add_argument("--no-peer", action="store_true",
                        help="mmserve against the references only; timing: mmserve's saturation alone")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--runtime", choices=("auto", "torch", "onnxruntime"), default="auto",
                        help="mmserve's --runtime (auto: ONNX Runtime on the CPU); checked against what it serves")
    parser.add_argument("--quantize", choices=("int8",), help="mmserve's --quantize (ONNX Runtime only)")
    parser.add_argument("--no-torch-baseline", dest="is_torch_baseline", action="store_false",
                        help="skip timing the same directory under --runtime torch (images)")
    parser.add_argument("--save-figures", type=Path, help="write this run's CPU and throughput figures (JSON) here")
    parser.add_argument("--previous-figures", type=Path,
                        help="a file an earlier run saved: the image CPU target is its mm/inf ratio")
    args = parser.parse_args(argv)
    timed_families = [name for name in args.families if name in args.timing_families]
    if timed_families and wrk_path() is None:
        print("benchmarks/real_models.py times saturation with wrk: apt-get install wrk (Debian's package), "
              "or pass --timing-families with no family", file=sys.stderr)
        return 2
    plan = AlternationPlan(args.seconds, args.rounds, args.warmup_s, args.concurrency)
    previous = load_figures(args.previous_figures)
    _quiet_libraries()

    print(f"mmserve vs Infinity on real model families, {utc_now()}, {machine_line()}", flush=True)
    venv: Path | None = None
    if not args.no_peer:
        try:
            venv = ensure_venv(args.peer_venv)
            print(f"Infinity {installed_version(venv, 'infinity-emb')} (transformers "
                  f"{installed_version(venv, 'transformers')}, torch {installed_version(venv, 'torch')}) "
                  f"from {venv}", flush=True)
        except PeerInstallError as e:
            print(f"Infinity could not be installed: {e}", flush=True)
    print(f"models: random, {TIMING_SIZE.num_layers} layers, {TIMING_SIZE.hidden_size} wide, "
          f"{TIMING_SIZE.image_size} px, patch {TIMING_SIZE.patch_size}; device {args.device}, float32; mmserve "
          f"--runtime {args.runtime}{'' if args.quantize is None else ' --quantize ' + args.quantize}; batch cap "
          f"{BATCH_CAP} on both, mmserve batch delay {QUEUE_DELAY_MS:g} ms and segment cache off; OpenAI "
          f"/v1/embeddings, one input per request; timing: texts of {TEXT_CHARS.min_chars}-{TEXT_CHARS.max_chars} "
          f"chars, images JPEGs {WRK_IMAGE_SIZE}; saturation: {WRK_GENERATOR} -c{args.concurrency} posting "
          f"{NUM_WRK_TEXTS} texts or {NUM_WRK_IMAGES} images in turn, server CPU per answer from /proc; fixed rate "
          f"{plan.fixed_rate_share:.0%} of Infinity's saturation from the Python generator (100 images); "
          "the idle server paused during the other's runs", flush=True)
    if previous is not None:
        print(f"previous figures: {args.previous_figures}, saved {previous.get('saved', '?')}", flush=True)
    inputs = agreement_inputs()
    setup = (TimingSetup(plan, WrkInputs(), previous, args.no_peer, args.is_torch_baseline and args.runtime != "torch")
             if timed_families else None)
    asked = MmserveRuntime(args.runtime, args.quantize, args.device)
    rows: list[AgreementRow] = []
    verdict_lines: list[str] = []
    figures: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mmserve-real-models-") as root:
        for name in args.families:
            family = Family(name)
            log(f"{name}: writing the model, starting the servers")
            result = run_family(family, Path(root), venv, inputs, setup if name in timed_families else None,
                                asked)
            rows += result.rows
            verdict_lines += result.verdict_lines
            if result.figures:
                figures[name] = result.figures
    print(format_agreement_table(rows, len(inputs.images), len(inputs.texts)))
    if verdict_lines:
        print("timing verdicts (mmserve against Infinity, same weights, alternated in this run):")
        print("\n".join(verdict_lines), flush=True)
    if args.save_figures is not None:
        save_figures(args.save_figures, figures_document(
            figures, utc_now(), targets={lane.name: lane.targets for lane in LANES}, torch_target=TORCH_CPU_TARGET,
            is_quantized=args.quantize is not None))
        print(f"figures saved to {args.save_figures}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
