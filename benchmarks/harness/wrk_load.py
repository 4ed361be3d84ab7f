"""Closed-loop saturation with ``wrk`` (C, one thread): post a set of bodies in turn, read its report.

wrk takes little of a small machine's cores, so the server's CPU per request
is not crowded out by the generator. Debian's package (``apt-get install
wrk``); ``wrk_path`` is ``None`` where it is missing. The Lua script
(``POST_SCRIPT``) reads the body files once and hands out prepared requests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.harness.alternation import RunSpec, Saturate, SaturationRun, mean_batch_text
from benchmarks.loadgen.server_metrics import METRICS_PATH, MetricsSnapshot, batch_size_view, parse_metrics_text

POSTING = """\
local names = {}
for name in string.gmatch(os.getenv("BODY_FILES") or "", "[^\\n]+") do
  names[#names + 1] = name
end
assert(#names > 0, "BODY_FILES names no body")
wrk.method = "POST"
wrk.path = os.getenv("BODY_PATH") or "/v1/embeddings"
wrk.headers["Content-Type"] = "application/json"
"""  # every script's start: the body files named in BODY_FILES (one a line), posted as JSON to BODY_PATH
POST_SCRIPT = """\
-- Posts the bodies named in BODY_FILES, in turn.
""" + POSTING + """\
local bodies = {}
for index, name in ipairs(names) do
  local file = assert(io.open(name, "rb"))
  bodies[index] = file:read("*a")
  file:close()
end
if #bodies == 1 then
  wrk.body = bodies[1]
else
  local requests, next_index = {}, 0
  init = function(args)
    for index, body in ipairs(bodies) do
      requests[index] = wrk.format(nil, nil, nil, body)
    end
  end
  request = function()
    next_index = next_index % #requests + 1
    return requests[next_index]
  end
end
"""
SCRIPT_NAME = "wrk_post.lua"
_REQUESTS = re.compile(r"^\s*(\d+) requests in ([\d.]+)(us|ms|s|m|h),", re.MULTILINE)
_NON_2XX = re.compile(r"Non-2xx or 3xx responses:\s*(\d+)")
_SOCKET_ERRORS = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_SECONDS_PER_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class WrkReport:
    """What one run answered: every response wrk read, the non-2xx among them, socket errors, its wall time."""

    num_responses: int
    num_non_2xx: int
    num_socket_errors: int
    duration_s: float

    @property
    def num_ok(self) -> int:
        return self.num_responses - self.num_non_2xx

    @property
    def ok_rps(self) -> float:
        return self.num_ok / self.duration_s if self.duration_s > 0 else 0.0

    def errors_by_kind(self) -> dict[str, int]:
        """The failures as a run's error counts (``"non-2xx"``, ``"socket"``), zeros left out."""
        counts = {"non-2xx": self.num_non_2xx, "socket": self.num_socket_errors}
        return {kind: count for kind, count in counts.items() if count}


def parse_wrk_report(text: str) -> WrkReport:
    """wrk's text report -> ``WrkReport``; ``ValueError`` when it has no request count (wrk failed)."""
    requests = _REQUESTS.search(text)
    if requests is None:
        raise ValueError(f"wrk printed no request count:\n{text[-2000:]}")
    non_2xx = _NON_2XX.search(text)
    errors = _SOCKET_ERRORS.search(text)
    return WrkReport(
        num_responses=int(requests.group(1)),
        num_non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
        num_socket_errors=sum(int(count) for count in errors.groups()) if errors else 0,
        duration_s=float(requests.group(2)) * _SECONDS_PER_UNIT[requests.group(3)],
    )


def wrk_path() -> str | None:
    return shutil.which("wrk")


def wrk_seconds(seconds: float) -> int:
    """wrk's ``-d`` counts whole seconds: the nearest, at least one."""
    return max(1, round(seconds))


@dataclass(frozen=True)
class WrkBodies:
    """Bodies on disk for one wrk run: where they go, their files (sent in this order, round and round), the script."""

    path: str
    files: tuple[Path, ...]
    script: Path


def write_bodies(directory: Path, name: str, path: str, bodies: Sequence[bytes]) -> WrkBodies:
    """``bodies`` as ``directory/name-N.json`` and the Lua script that posts them to ``path``."""
    if not bodies:
        raise ValueError("wrk needs at least one body to post")
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for index, body in enumerate(bodies):
        files.append(directory / f"{name}-{index}.json")
        files[-1].write_bytes(body)
    script = directory / SCRIPT_NAME
    script.write_text(POST_SCRIPT, encoding="utf-8")
    return WrkBodies(path, tuple(files), script)


def wrk_argv(wrk: str, url: str, bodies: WrkBodies, seconds: float, connections: int, timeout_s: float) -> list[str]:
    """``wrk -t1 -cCONNECTIONS -dSECONDS`` posting ``bodies`` to ``url`` (one thread: the generator stays small)."""
    return [wrk, "-t1", f"-c{connections}", f"-d{wrk_seconds(seconds)}s", "--timeout", f"{max(1, round(timeout_s))}s",
            "-s", str(bodies.script), url]


def run_wrk(url: str, bodies: WrkBodies, seconds: float, connections: int, timeout_s: float = 10.0) -> WrkReport:
    """One closed-loop wrk run of ``connections`` against ``url``; ``RuntimeError`` if wrk fails."""
    wrk = wrk_path()
    if wrk is None:
        raise FileNotFoundError("wrk is not installed (Debian: apt-get install wrk)")
    env = {**os.environ, "BODY_FILES": "\n".join(str(file) for file in bodies.files), "BODY_PATH": bodies.path}
    done = subprocess.run(wrk_argv(wrk, url, bodies, seconds, connections, timeout_s), env=env, capture_output=True,
                          text=True, timeout=seconds + timeout_s + 60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"wrk exited with {done.returncode}: {done.stderr[-2000:]}")
    return parse_wrk_report(done.stdout)


def metrics_now(url: str) -> MetricsSnapshot | None:
    """The server's ``/metrics`` now; ``None`` where it has none or it could not be read (never raised)."""
    try:
        answer = httpx.get(url + METRICS_PATH, timeout=10.0, trust_env=False)
        return parse_metrics_text(answer.text) if answer.status_code == 200 else None
    except (httpx.HTTPError, OSError, ValueError):
        return None


MetricsDetail = Callable[[RunSpec, MetricsSnapshot, MetricsSnapshot], str]


def batching_detail(run: RunSpec, before: MetricsSnapshot, after: MetricsSnapshot) -> str:
    """mmserve's mean batch per lane over the run, for its log line."""
    return mean_batch_text(batch_size_view(before, after))


def wrk_saturation(bodies_for: Callable[[RunSpec], WrkBodies], timeout_s: float = 10.0,
                   detail: MetricsDetail | None = None) -> Saturate:
    """Saturation runs for ``run_alternated``: wrk, the run's concurrency as connections, ``bodies_for(run)``.

    ``detail``: what the run's log line adds from ``/metrics`` read before and
    after wrk (e.g. ``batching_detail``; two reads of a few milliseconds,
    inside the measured server CPU of a run of seconds).
    """

    def saturate(run: RunSpec) -> SaturationRun:
        if run.concurrency is None:
            raise ValueError("a saturation run needs its concurrency (wrk's connections)")
        before = metrics_now(run.url) if detail is not None else None
        report = run_wrk(run.url, bodies_for(run), run.seconds, run.concurrency, timeout_s)
        after = metrics_now(run.url) if before is not None else None
        note = detail(run, before, after) if detail is not None and before is not None and after is not None else ""
        return SaturationRun(report.num_ok, report.ok_rps, report.errors_by_kind(), note)

    return saturate
