"""``mmserve quantiles URL [URL ...]``: fleet-wide latency quantiles from every replica's digests.

    replica A  GET /v1/monitoring/digests ─┐
    replica B  GET /v1/monitoring/digests ─┼─> monitoring.fleet: merge per (route, stage) ─> table (ms)
    ...                                    ─┘

A Prometheus summary's quantiles cannot be combined across replicas (the mean
of two P99s is no one's P99); the t-digests behind them can, so the merged
digest's P99.99 is the fleet's. Every replica must answer: a fleet table that
silently left one out would understate the tail, so an unreachable replica
fails the command with its URL. So does a command line that cannot name a
fleet: a URL that is not one (``http[s]://HOST[:PORT]``, or ``HOST:PORT``
without a scheme), the same replica twice (its digests would count twice) or
a timeout that is not a positive number of seconds; all exit 2, in one line.
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from clients.api_key_file import ApiKeyFileError, read_api_key
from monitoring.errors import DigestFormatError
from monitoring.fleet import DigestSource, fleet_quantiles, format_table

DIGESTS_PATH = "/v1/monitoring/digests"
DEFAULT_TIMEOUT_S = 10.0


class _ReplicaError(Exception):
    """Replicas (or the key file) could not be read; one line each, naming it and why."""


class _UsageError(Exception):
    """The command line names no fleet (a bad URL, a replica twice, a bad timeout); one line."""


def digests_url(url: str) -> str:
    """``http://host:port[/prefix]`` (scheme optional) -> that replica's digests URL."""
    base = url if "://" in url else f"http://{url}"
    base = base.rstrip("/")
    return base if base.endswith(DIGESTS_PATH) else base + DIGESTS_PATH


def _check_replica_urls(urls: Sequence[str]) -> None:
    """Raise ``_UsageError`` for a URL that names no replica, or for one replica given twice."""
    first_given: dict[str, str] = {}
    for url in urls:
        target = digests_url(url)
        try:
            parts = urlsplit(target)
            port = parts.port
        except ValueError as e:
            raise _UsageError(f"{url!r} is not a replica URL: {e}") from e
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _UsageError(f"{url!r} is not a replica URL (http://HOST:PORT)")
        if "://" not in url and port is None:
            raise _UsageError(f"{url!r} is not a replica URL: without http:// it needs HOST:PORT")
        if target in first_given:
            raise _UsageError(f"{url!r} names the same replica as {first_given[target]!r}: give each replica once, "
                              "or its digests count twice")
        first_given[target] = url


def _check_timeout(timeout_s: float) -> None:
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise _UsageError(f"--timeout-s must be a positive number of seconds, got {timeout_s:g}")


async def _fetch_one(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    target = digests_url(url)
    try:
        response = await client.get(target)
    except httpx.HTTPError as e:
        raise _ReplicaError(f"cannot reach {target}: {e.__class__.__name__}: {e}") from e
    if response.status_code != 200:
        raise _ReplicaError(f"{target} answered HTTP {response.status_code}: {response.text[:200]}")
    try:
        document = response.json()
    except ValueError as e:
        raise _ReplicaError(f"{target} did not answer JSON: {e}") from e
    if not isinstance(document, dict):
        raise _ReplicaError(f"{target} did not answer a digests document")
    return document


async def _fetch_documents(urls: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S,
                          api_key: str | None = None) -> list[dict[str, Any]]:
    """Every replica's digests document, fetched concurrently, in the order of ``urls``.

    Raises:
        _ReplicaError: replicas were unreachable or answered something else than a
            document (one line per replica).
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with httpx.AsyncClient(timeout=timeout_s, headers=headers) as client:
        outcomes = await asyncio.gather(*(_fetch_one(client, url) for url in urls), return_exceptions=True)
    failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    for failure in failures:
        if not isinstance(failure, _ReplicaError):
            raise failure
    if failures:
        raise _ReplicaError("\n".join(str(failure) for failure in failures))
    return outcomes  # type: ignore[return-value]


def run_quantiles(urls: Sequence[str], *, source: str = DigestSource.WINDOW.value,
                  timeout_s: float = DEFAULT_TIMEOUT_S, api_key_file: Path | None = None) -> int:
    """Print the fleet table for ``urls``; 0 on success, 2 for a usage error or when a replica fails (messages on
    stderr)."""
    try:
        _check_timeout(timeout_s)
        _check_replica_urls(urls)
    except _UsageError as e:
        print(f"mmserve quantiles: error: {e}", file=sys.stderr)
        return 2
    try:
        api_key = read_api_key(api_key_file) if api_key_file is not None else None
        documents = asyncio.run(_fetch_documents(urls, timeout_s, api_key))
        rows = fleet_quantiles(documents, source=DigestSource(source))
    except (_ReplicaError, ApiKeyFileError) as e:
        for line in str(e).splitlines():
            print(f"mmserve quantiles: {line}", file=sys.stderr)
        return 2
    except DigestFormatError as e:
        print(f"mmserve quantiles: bad digests document: {e}", file=sys.stderr)
        return 2
    print(format_table(rows))
    if not rows:
        print(f"mmserve quantiles: no latency recorded yet on {len(urls)} replica(s)", file=sys.stderr)
    return 0
