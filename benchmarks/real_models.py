"""mmserve against Infinity on the image–text models users have: same weights, same protocol, one run.

For each family (SigLIP, CLIP, open_clip, timm ViT + BERT) the script writes
a small random model with the family's own library
(``benchmarks.random_pretrained``), 4 layers, 256 wide, 224 px, patch 16,
and serves that one directory with ``mmserve serve --model DIR`` (segment
cache off, so every request is computed) and with Infinity (``infinity_emb
v2 --model-id DIR``, 0.0.78, from a venv of its own:
``benchmarks.harness.peer_venv``).
Both take the same OpenAI ``POST /v1/embeddings`` bodies, one input each,
images as ``data:`` URIs (Infinity's dialect adds ``"modality": "image"``).
Both batch at most 8 (mmserve waits up to 5 ms for a batch to fill; Infinity
has no such knob) and run float32 on the CPU.

1. Embeddings: a few images (PNG, several sizes) and texts (CJK among them),
   each server's answer against the library computed here
   (``benchmarks.reference_embeddings``); min cosine, target >= 0.99999.
   Where Infinity cannot serve a family the row says what it answered.
2. Timing, for the families both serve, text-only and image-only: closed-loop
   saturation (C clients) and open-loop p99 at 70 % of Infinity's saturation,
   A-B-B-A alternated, the idle server paused, other processes' CPU recorded
   (``benchmarks.harness.alternation``). Targets: text throughput >= 2x Infinity's
   and p99 <= 0.5x; images >= 1.15x and p99 <= 0.7x.

    python -m benchmarks.real_models
    python -m benchmarks.real_models --families clip --timing-families clip --seconds 5

The load generator shares the CPUs with the servers; where it fell behind its
schedule the table says so (generator lag).
"""

from __future__ import annotations

import argparse
import base64
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.embedding_agreement import (
    AgreementRow, agreement_row, failure_reason, format_agreement_table, served_model_name,
)
from benchmarks.harness import (
    AlternationPlan, RunSpec, ServerProcess, ServerRuns, ServerStartError, Targets, format_comparison,
    infinity_command, log, machine_line, mmserve_model_command, num_usable_cpus, resumed, run_alternated, running,
    start_paused, utc_now, verdict_text, verdicts,
)
from benchmarks.harness.peer_venv import DEFAULT_INFINITY_VENV, PeerInstallError, ensure_venv, installed_version
from benchmarks.loadgen.config import BenchConfig
from benchmarks.loadgen.embeddings_payload import EmbeddingsDialect
from benchmarks.loadgen.image_pool import ImageFormat, ImagePool, ImageSize
from benchmarks.loadgen.workload import Mix, TextLengthRange, parse_mix
from benchmarks.random_pretrained import SENTENCES, TowerSize
from benchmarks.reference_embeddings import Family, ReferenceInputs, reference_embeddings, write_family

MMSERVE = "mmserve"
INFINITY = "infinity"
BATCH_CAP = 8
QUEUE_DELAY_MS = 5.0
MMSERVE_SETTINGS = {"CACHE_IMAGE_BYTES": "0", "CACHE_TEXT_BYTES": "0", "MAX_BATCH_SIZE": str(BATCH_CAP),
                    "MAX_QUEUE_DELAY_MS": str(QUEUE_DELAY_MS)}
TIMING_SIZE = TowerSize(image_size=224, patch_size=16, hidden_size=256, num_layers=4, num_heads=4,
                        intermediate_size=1024, projection_dim=256)
# Texts fit every family's token limit but SigLIP's 16 (which both servers cut, as its pipeline does).
TEXT_CHARS = TextLengthRange(16, 60)
AGREEMENT_IMAGE_SIZES = (ImageSize(224, 224), ImageSize(64, 40), ImageSize(300, 180))
AGREEMENT_TEXTS = (SENTENCES[0], SENTENCES[3], SENTENCES[9], "a  photo, of  A CAT!")
READY_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Lane:
    """One timing comparison: a modality and what mmserve should reach on it."""

    name: str  # "text" or "image"
    mix: Mix
    targets: Targets


LANES = (Lane("text", parse_mix("text:1"), Targets(2.0, 0.5)), Lane("image", parse_mix("vision:1"), Targets(1.15, 0.7)))


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
            plan: AlternationPlan) -> list[tuple[Lane, dict[str, ServerRuns]]]:
    results = []
    for lane in LANES:
        def config_for(run: RunSpec, lane: Lane = lane) -> BenchConfig:
            """One input per ``POST /v1/embeddings`` in the server's dialect, the lane's modality only."""
            return run.config(mix=lane.mix, text_length=TEXT_CHARS, timeout_s=60.0, embeddings=dialects[run.name])

        runs = run_alternated(servers, INFINITY, MMSERVE, plan, config_for, f"{family.value} {lane.name}")
        results.append((lane, runs))
    return results


def _verdict_line(family: Family, lane: Lane, runs: dict[str, ServerRuns]) -> str:
    judged = verdicts(runs[INFINITY], runs[MMSERVE], lane.targets)
    return (f"  {family.value} {lane.name}: throughput {judged.throughput_ratio:.2f}x Infinity's "
            f"(target >= {lane.targets.min_throughput_ratio:.2f}) {verdict_text(judged.is_throughput_met)}; "
            f"p99 {judged.p99_ratio:.2f}x (target <= {lane.targets.max_p99_ratio:.2f}) "
            f"{verdict_text(judged.is_p99_met)}")


def run_family(family: Family, root: Path, venv: Path | None, inputs: ReferenceInputs, plan: AlternationPlan | None,
               device: str) -> tuple[list[AgreementRow], list[str]]:
    """One family end to end: write, serve on both, compare embeddings, then time (when ``plan`` is given).

    Prints each timing table as it is done; returns the agreement rows and one verdict line per timed lane.
    """
    directory = write_family(family, root / family.value, TIMING_SIZE)
    verdict_lines: list[str] = []
    with running(mmserve_model_command(directory, MMSERVE_SETTINGS, device=device), READY_TIMEOUT_S) as mmserve:
        mmserve.pause()  # started one after the other, so neither start-up competes with the other's
        peer, peer_failure = _start_peer(venv, directory, family)
        try:
            servers = {MMSERVE: mmserve} if peer is None else {INFINITY: peer, MMSERVE: mmserve}
            dialects = {}
            for name, server in servers.items():
                with resumed(server):
                    dialects[name] = _dialect(server, is_image_modality_marked=name == INFINITY)
            rows = _agreement(family, servers, dialects, directory, inputs)
            if peer_failure is not None:
                rows.append(AgreementRow(family.value, INFINITY, failure=peer_failure))
            if plan is not None and peer is not None:
                for lane, runs in _timing(family, servers, dialects, plan):
                    print(format_comparison(f"{family.value}, {lane.name} only", runs, INFINITY, MMSERVE, plan,
                                            lane.targets, num_usable_cpus(), "mm/inf"), flush=True)
                    verdict_lines.append(_verdict_line(family, lane, runs))
        finally:
            if peer is not None:
                peer.stop()
    return rows, verdict_lines


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
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per measured run")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per measurement (one run per server each)")
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop clients")
    parser.add_argument("--peer-venv", type=Path, default=DEFAULT_INFINITY_VENV,
                        help=f"Infinity's own venv, made if missing (default {DEFAULT_INFINITY_VENV})")
    parser.add_argument("--no-peer", action="store_true", help="mmserve against the references only")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    plan = AlternationPlan(args.seconds, args.rounds, args.warmup_s, args.concurrency)
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
          f"{TIMING_SIZE.image_size} px, patch {TIMING_SIZE.patch_size}; device {args.device}, float32; batch cap "
          f"{BATCH_CAP} on both, mmserve batch delay {QUEUE_DELAY_MS:g} ms and segment cache off; OpenAI "
          f"/v1/embeddings, one input per request; timing: texts of {TEXT_CHARS.min_chars}-{TEXT_CHARS.max_chars} "
          f"chars, images 100 JPEGs 224x224; C={args.concurrency}, fixed rate {plan.fixed_rate_share:.0%} of "
          "Infinity's saturation; the idle server paused during the other's runs", flush=True)
    inputs = agreement_inputs()
    rows: list[AgreementRow] = []
    verdict_lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="mmserve-real-models-") as root:
        for name in args.families:
            family = Family(name)
            timed = plan if name in args.timing_families else None
            log(f"{name}: writing the model, starting the servers")
            family_rows, family_verdicts = run_family(family, Path(root), venv, inputs, timed, args.device)
            rows += family_rows
            verdict_lines += family_verdicts
    print(format_agreement_table(rows, len(inputs.images), len(inputs.texts)))
    if verdict_lines:
        print("timing verdicts (mmserve against Infinity, same weights, alternated in this run):")
        print("\n".join(verdict_lines), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
