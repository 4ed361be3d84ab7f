"""What one run of ``benchmarks.real_models`` keeps for the next: per family and lane, CPU per answer and answers/s.

The image target of that benchmark is "no worse than the previous run":
this run's server CPU per answered image request, mmserve's over
Infinity's (a ratio, because the machines drift and a ratio taken within
one alternated run does not), at most the ratio a previous run saved
(``--save-figures FILE`` there, ``--previous-figures FILE`` here). Without
a previous file the target is shown and not judged.

The file is JSON::

    {"saved": "2026-12-03 12:30 UTC",
     "families": {"clip": {"image": {"cpu_ratio": 0.81,
                                     "servers": {"infinity": {"cpu_ms_per_request": 21.0, "ok_rps": 38.4},
                                                 "mmserve": {"cpu_ms_per_request": 17.0, "ok_rps": 56.2}}}}}}

Pure arithmetic and JSON; nothing here starts a server.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.harness import ServerRuns, cpu_ratio


def lane_figures(runs: Mapping[str, ServerRuns], peer: str | None, ours: str) -> dict[str, Any]:
    """One lane's figures: each server's pooled CPU per answer and mean answers/s, and ours over the peer's CPU."""
    servers = {name: {"cpu_ms_per_request": round(server.cpu_ms_per_request, 4),
                      "ok_rps": round(server.throughput_rps, 2)}
               for name, server in runs.items() if server.has_cpu}
    ratio = cpu_ratio(runs[peer], runs[ours]) if peer is not None and peer in runs else None
    return {"cpu_ratio": None if ratio is None else round(ratio, 4), "servers": servers}


def figures_document(by_family: Mapping[str, Mapping[str, Mapping[str, Any]]], saved: str) -> dict[str, Any]:
    """The file's content: ``by_family[family][lane]`` is a ``lane_figures``."""
    return {"saved": saved, "families": {family: dict(lanes) for family, lanes in by_family.items()}}


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
