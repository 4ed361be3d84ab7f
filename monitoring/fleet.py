"""Fleet-wide quantiles: merge the digests documents of several replicas.

Quantiles do not average (the mean of two replicas' P99 is no one's P99),
but t-digests merge: merging every replica's window digest of a (route, stage)
gives the fleet's distribution, and its quantiles are the fleet's quantiles.

The functions take already-fetched documents (``Monitor.digests_view()`` of
each replica, parsed from JSON), so the caller decides how to fetch them;
``main`` is a small command line over JSON files::

    python -m monitoring.fleet replica-a.json replica-b.json [--source lifetime]
"""

from __future__ import annotations

import argparse
import enum
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastdigest import TDigest

from monitoring.collector import SUMMARY_QUANTILES
from monitoring.digest import digest_from_json, quantiles_of
from monitoring.errors import DigestFormatError
from monitoring.views import DIGESTS_FORMAT


class DigestSource(str, enum.Enum):
    """Which digest of each series to merge."""

    WINDOW = "window"
    LIFETIME = "lifetime"


@dataclass(frozen=True)
class FleetQuantiles:
    """Merged quantiles of one (route, stage) across replicas.

    Attributes:
        route: Route name.
        stage: Stage name.
        num_replicas: Documents that held this series.
        count: Samples in the merged digest.
        quantiles_s: ``{q: seconds}``; NaN when the merged digest is empty.
    """

    route: str
    stage: str
    num_replicas: int
    count: int
    quantiles_s: Mapping[float, float]


def parse_document(document: Mapping[str, Any], source: DigestSource) -> dict[tuple[str, str], TDigest]:
    """The ``source`` digest of every series in one replica's digests document.

    Raises:
        DigestFormatError: not a digests document, or a series is malformed.
    """
    if not isinstance(document, Mapping) or document.get("format") != DIGESTS_FORMAT:
        raise DigestFormatError(f"not a digests document (expected format {DIGESTS_FORMAT!r})")
    series = document.get("series")
    if not isinstance(series, list):
        raise DigestFormatError("a digests document needs a 'series' list")
    digests: dict[tuple[str, str], TDigest] = {}
    for entry in series:
        if not isinstance(entry, Mapping):
            raise DigestFormatError(f"a series entry is an object, got {type(entry).__name__}")
        route, stage = entry.get("route"), entry.get("stage")
        if not isinstance(route, str) or not isinstance(stage, str):
            raise DigestFormatError("a series entry needs string 'route' and 'stage'")
        if source.value not in entry:
            raise DigestFormatError(f"series {route}/{stage} lacks its {source.value!r} digest")
        try:
            digests[(route, stage)] = digest_from_json(entry[source.value])
        except DigestFormatError as e:
            raise DigestFormatError(f"series {route}/{stage}: {e}") from e
    return digests


def merge_documents(
    documents: Sequence[Mapping[str, Any]], source: DigestSource = DigestSource.WINDOW
) -> dict[tuple[str, str], tuple[TDigest, int]]:
    """``{(route, stage): (merged digest, number of replicas holding it)}`` over ``documents``."""
    merged: dict[tuple[str, str], tuple[TDigest, int]] = {}
    for document in documents:
        for key, digest in parse_document(document, source).items():
            if key not in merged:
                merged[key] = (digest, 1)
                continue
            into, num_replicas = merged[key]
            if into.max_centroids < digest.max_centroids:
                into, digest = digest, into
            if not digest.is_empty():
                into.merge_inplace(digest)
            merged[key] = (into, num_replicas + 1)
    return merged


def fleet_quantiles(
    documents: Sequence[Mapping[str, Any]],
    *,
    source: DigestSource = DigestSource.WINDOW,
    quantiles: Sequence[float] = SUMMARY_QUANTILES,
) -> list[FleetQuantiles]:
    """Fleet-wide quantiles per (route, stage), sorted by route then stage."""
    rows = []
    for (route, stage), (digest, num_replicas) in sorted(merge_documents(documents, source).items()):
        values = quantiles_of(digest, list(quantiles))
        rows.append(
            FleetQuantiles(
                route=route,
                stage=stage,
                num_replicas=num_replicas,
                count=int(digest.n_values),
                quantiles_s=dict(zip(quantiles, values)),
            )
        )
    return rows


def format_table(rows: Sequence[FleetQuantiles], quantiles: Sequence[float] = SUMMARY_QUANTILES) -> str:
    """A fixed-width text table of ``rows`` in milliseconds."""
    headers = ["route", "stage", "replicas", "count", *(f"p{q * 100:g} ms" for q in quantiles)]
    body = [
        [
            row.route,
            row.stage,
            str(row.num_replicas),
            str(row.count),
            *("-" if math.isnan(row.quantiles_s[q]) else f"{row.quantiles_s[q] * 1e3:.3f}" for q in quantiles),
        ]
        for row in rows
    ]
    widths = [max(len(line[i]) for line in [headers, *body]) for i in range(len(headers))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in [headers, *body])


def main(argv: Sequence[str] | None = None) -> int:
    """Print fleet quantiles of the digests documents in the given JSON files (``-`` reads stdin)."""
    parser = argparse.ArgumentParser(prog="python -m monitoring.fleet", description=main.__doc__)
    parser.add_argument("documents", nargs="+", help="digests documents (GET /v1/monitoring/digests), as files")
    parser.add_argument("--source", choices=[s.value for s in DigestSource], default=DigestSource.WINDOW.value)
    args = parser.parse_args(argv)
    documents = []
    for path in args.documents:
        try:
            if path == "-":
                documents.append(json.load(sys.stdin))
            else:
                with open(path, encoding="utf-8") as f:
                    documents.append(json.load(f))
        except (OSError, json.JSONDecodeError) as e:
            print(f"cannot read {path}: {e}", file=sys.stderr)
            return 2
    try:
        rows = fleet_quantiles(documents, source=DigestSource(args.source))
    except DigestFormatError as e:
        print(f"bad digests document: {e}", file=sys.stderr)
        return 2
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
