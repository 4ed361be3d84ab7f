"""One closed-loop ``wrk`` run posting one body, and what its report says.

``wrk`` (C, one thread here) takes little of a small machine's cores, so
the server's CPU per request is not crowded out by the generator, as a
Python generator would. It is Debian's package (``apt-get install wrk``);
``.ci/run`` does not install it, and ``benchmarks/frontend.py`` says so when
it is missing. ``benchmarks/frontend_post.lua`` posts the body.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

LUA_SCRIPT = Path(__file__).with_name("frontend_post.lua")
_REQUESTS = re.compile(r"^\s*(\d+) requests in ([\d.]+)(us|ms|s|m),", re.MULTILINE)
_NON_2XX = re.compile(r"Non-2xx or 3xx responses:\s*(\d+)")
_SOCKET_ERRORS = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_SECONDS_PER_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


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


def run_wrk(url: str, body_file: Path, path: str, seconds: float, connections: int) -> WrkReport:
    """``wrk -t1 -c CONNECTIONS -d SECONDS`` posting ``body_file`` to ``url + path``."""
    wrk = wrk_path()
    if wrk is None:
        raise FileNotFoundError("wrk is not installed (Debian: apt-get install wrk)")
    argv = [wrk, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
            "-s", str(LUA_SCRIPT), url]
    env = {**os.environ, "BODY_FILE": str(body_file), "BODY_PATH": path}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"wrk exited with {done.returncode}: {done.stderr[-2000:]}")
    return parse_wrk_report(done.stdout)
