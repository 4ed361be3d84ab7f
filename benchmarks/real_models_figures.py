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

from benchmarks.harness import ServerRuns, cpu_ratio
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
    return {"cpu_ratio": None if ratio is None else round(ratio, 4), "servers": servers,
            "throughput_ratio": round(runs[ours].throughput_rps / runs[peer].throughput_rps, 4),
            "p99_ratio": round(p99_ratio, 4)}


def figures_document(by_family: Mapping[str, Mapping[str, Mapping[str, Any]]], saved: str) -> dict[str, Any]:
    """The file's content: ``by_family[family][lane]`` is a ``lane_figures``; the headline's keys beside it."""
    families = {family: dict(lanes) for family, lanes in by_family.items()}
    return {"saved": saved, "families": families} | result_document(headline_figures(families))


HEADLINE_ROWS = {"text": "infinity_text", "image": "infinity_image"}  # the CLIP lanes: the family Infinity serves


def headline_figures(families: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[Figure]:
    """CLIP's lanes timed against Infinity, as headline figures, rounded as the verdict lines print them."""
    figures = []
    for lane, row in HEADLINE_ROWS.items():
        lane_figures_ = families.get("clip", {}).get(lane, {})
        for key, name in (("throughput_ratio", "saturation ok/s over Infinity's"),
                          ("cpu_ratio", "server CPU per answer over Infinity's"),
                          ("p99_ratio", "open-loop p99 over Infinity's")):
            if lane_figures_.get(key) is not None:
                figures.append(Figure(row, name, round(lane_figures_[key], 2), "x"))
    return figures


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
