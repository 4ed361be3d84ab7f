"""What one run of ``benchmarks.real_models`` keeps for the next: per family and lane, CPU per answer and answers/s.

``--save-figures FILE`` there writes it, ``--previous-figures FILE`` reads
it back, to show an earlier run's mmserve/Infinity CPU ratio beside this
one's (a ratio, as it holds across machines' drift). JSON::

    {"saved": "2026-12-03 12:30 UTC",
     "families": {"clip": {"image": {"cpu_ratio": 0.81,
                                     "servers": {"infinity": {"cpu_ms_per_request": 21.0, "ok_rps": 38.4},
                                                 "mmserve": {"cpu_ms_per_request": 17.0, "ok_rps": 56.2}}}}}}

It is also a headline result file (``benchmarks.harness.figures``):
``headline_figures`` adds each timed lane's ratios to Infinity as the verdict
lines print them. Pure arithmetic and JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.harness import ServerRuns, Targets, cpu_ratio
from benchmarks.harness.figures import Figure, result_document


def lane_figures(runs: Mapping[str, ServerRuns], peer: str | None, ours: str) -> dict[str, Any]:
    """One lane's figures: each server's pooled CPU per answer and mean answers/s, and ours over the peer's CPU."""
    servers = {name: {"cpu_ms_per_request": round(server.cpu_ms_per_request, 4),
                      "ok_rps": round(server.throughput_rps, 2)}
               for name, server in runs.items() if server.has_cpu}
    if peer is None or peer not in runs:
        return {"cpu_ratio": None, "servers": servers}
    ratio = cpu_ratio(runs[peer], runs[ours])
    p99_ratio = runs[ours].open_percentile_ms("p99_ms") / runs[peer].open_percentile_ms("p99_ms")
    # Six decimals: the headline rounds these again to two, which from four could differ from the printed
    # table (0.46498 printed 0.46, kept as 0.465, then headlined 0.47).
    return {"cpu_ratio": None if ratio is None else round(ratio, 6), "servers": servers,
            "throughput_ratio": round(runs[ours].throughput_rps / runs[peer].throughput_rps, 6),
            "p99_ratio": round(p99_ratio, 6)}


def figures_document(by_family: Mapping[str, Mapping[str, Any]], saved: str, *,
                     targets: Mapping[str, Targets] | None = None, torch_target: float | None = None,
                     is_quantized: bool = False) -> dict[str, Any]:
    """The file's content: ``by_family[family][lane]`` is a ``lane_figures`` (and ``[family]["served"]`` what
    mmserve served, e.g. ``onnxruntime float32``); the headline's keys beside it, judged by ``targets``."""
    families = {family: dict(lanes) for family, lanes in by_family.items()}
    figures = headline_figures(families, targets or {}, torch_target, is_quantized)
    return {"saved": saved, "families": families} | result_document(figures)


HEADLINE_ROWS = {"text": "infinity_text", "image": "infinity_image"}  # the CLIP lanes: the family Infinity serves
QUANTIZED_ROW = "infinity_int8"  # both lanes of a --quantize run, apart from the fp32 rows


def headline_figures(families: Mapping[str, Mapping[str, Any]], targets: Mapping[str, Targets],
                     torch_target: float | None = None, is_quantized: bool = False) -> list[Figure]:
    """CLIP's lanes timed against Infinity, as headline figures, rounded and judged as the verdict lines print them.

    The first figure of a lane names what mmserve served; a quantized run's
    lanes share one row, each figure named by its lane.
    """
    clip = families.get("clip", {})
    served = clip.get("served")
    figures = []
    for lane, row in HEADLINE_ROWS.items():
        figures_of_lane = clip.get(lane, {})
        target = targets.get(lane)
        judged = (("throughput_ratio", "saturation ok/s over Infinity's",
                   None if target is None else target.min_throughput_ratio, True),
                  ("cpu_ratio", "server CPU per answer over Infinity's", None if target is None else target.max_cpu_ratio,
                   False),
                  ("p99_ratio", "open-loop p99 over Infinity's", None if target is None else target.max_p99_ratio, False),
                  ("torch_cpu_ratio", "CPU per answer over mmserve's on torch", torch_target, False))
        lane_prefix = ("text, " if lane == "text" else "images, ") if is_quantized else ""
        served_prefix = f"{served}, " if served is not None else ""
        for key, name, bound, is_lower_bound in judged:
            value = figures_of_lane.get(key)
            if value is None:
                continue
            figures.append(Figure(QUANTIZED_ROW if is_quantized else row,
                                  lane_prefix + served_prefix + name + _judgement(value, bound, is_lower_bound),
                                  round(value, 2), "x"))
            served_prefix = ""  # said once per lane
    return figures


def _judgement(value: float, bound: float | None, is_lower_bound: bool) -> str:
    """`` (target >= 1.60, met)`` as the verdict lines judge it (the unrounded ratio), or nothing without a bound."""
    if bound is None:
        return ""
    is_met = value >= bound if is_lower_bound else value <= bound
    return f" (target {'>=' if is_lower_bound else '<='} {bound:.2f}, {'met' if is_met else 'NOT met'})"


def previous_cpu_ratio(document: Mapping[str, Any] | None, family: str, lane: str) -> float | None:
    """The CPU ratio a previous run saved for ``family``'s ``lane``; ``None`` where it has none."""
    if document is None:
        return None
    ratio = document.get("families", {}).get(family, {}).get(lane, {}).get("cpu_ratio")
    return float(ratio) if ratio is not None else None


def load_figures(path: Path | None) -> dict[str, Any] | None:
    """A file ``save_figures`` wrote; ``None`` for no path. A path that cannot be read is an error, not 'none'."""
    if path is None:
        return None
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return document


def save_figures(path: Path, document: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
