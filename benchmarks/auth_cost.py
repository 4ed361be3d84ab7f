"""What API keys and the rate limiter cost per request: server CPU per request, keyed against unkeyed.

    python benchmarks/auth_cost.py [--seconds 10] [--rounds 4] [--connections 16]

Two ``mmserve serve`` processes on loopback, started and paused by ``benchmarks.harness``,
both the synthetic preset with
zero stage times (so the request path, not a model, takes the CPU):

    A  no keys, no rate limit
    B  inference and admin keys (the inference key from a sha256: key file),
       MMSERVE_RATE_LIMIT high enough never to refuse, so every request pays
       the key check and a token bucket but is answered 200

wrk (a C load generator; a Lua script posts the JSON bodies and, for B, the
bearer key) drives one server at a time while the other is paused (SIGSTOP),
in A-B-B-A order so drift of the machine's speed falls on both alike. Each
run's CPU is the server's process group's utime + stime from /proc over the run,
divided by the requests wrk completed. The cost is the mean over rounds of
B's CPU per request minus A's; the target is at most 30 us.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness.server_commands import mmserve_command
from benchmarks.harness.server_process import ServerCommand
from benchmarks.harness.server_process import paused_servers, resumed

TARGET_US = 30.0
KEY = "auth-cost-inference-key-7f3e"
ADMIN_KEY = "auth-cost-admin-key-19c4"
_LUA = """\
local texts = {"a red bicycle", "a cat on a sofa", "two dogs in the snow", "a bowl of soup"}
local key = os.getenv("AUTH_COST_KEY")
local n = 0
request = function()
  n = n + 1
  local headers = {["Content-Type"] = "application/json"}
  if key ~= nil and key ~= "" then headers["Authorization"] = "Bearer " .. key end
  return wrk.format("POST", "/v1/infer", headers, '{"text": "' .. texts[(n % #texts) + 1] .. '"}')
end
"""
_REQUESTS = re.compile(r"^\s*(\d+) requests in ", re.M)
_NON_2XX = re.compile(r"Non-2xx or 3xx responses:\s*(\d+)")


@dataclass(frozen=True)
class Run:
    """One wrk run against one server."""

    name: str
    num_requests: int
    num_failed: int
    cpu_s: float

    @property
    def cpu_us_per_request(self) -> float:
        return self.cpu_s / self.num_requests * 1e6


def parse_wrk(stdout: str) -> tuple[int, int]:
    """(requests completed, non-2xx answers) from wrk's summary."""
    completed = _REQUESTS.search(stdout)
    if completed is None:
        raise ValueError(f"no request count in wrk's output: {stdout[-300:]!r}")
    failed = _NON_2XX.search(stdout)
    return int(completed.group(1)), int(failed.group(1)) if failed else 0


def alternated_order(num_rounds: int) -> list[tuple[str, str]]:
    """A-B, B-A, A-B, ...: each pair of rounds mirrors its order."""
    return [("A", "B") if index % 2 == 0 else ("B", "A") for index in range(num_rounds)]


def cost_us(runs: Sequence[Run]) -> tuple[float, float]:
    """Mean and sample standard deviation over rounds of B's minus A's CPU per request (runs in round order)."""
    by_round: list[dict[str, float]] = []
    for run in runs:
        if not by_round or run.name in by_round[-1]:
            by_round.append({})
        by_round[-1][run.name] = run.cpu_us_per_request
    differences = [pair["B"] - pair["A"] for pair in by_round if {"A", "B"} <= pair.keys()]
    spread = statistics.stdev(differences) if len(differences) > 1 else float("nan")
    return statistics.fmean(differences), spread


def run_wrk(url: str, script: Path, key: str, seconds: float, connections: int) -> tuple[int, int]:
    done = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s", str(script), url],
                          capture_output=True, text=True, env={**os.environ, "AUTH_COST_KEY": key},
                          timeout=seconds + 60)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed: {done.stderr}")
    return parse_wrk(done.stdout)


KEYS = {"A": "", "B": KEY}  # the bearer key each server's requests carry


def server_commands(directory: Path) -> dict[str, ServerCommand]:
    """A (no keys, no limit) and B (keys from a ``sha256:`` file, a limit that never refuses); files in ``directory``."""
    key_file = directory / "keys"
    key_file.write_text(f"sha256:{hashlib.sha256(KEY.encode()).hexdigest()}\n")
    zero_stage_times = {"SYNTHETIC_TEXT_MS": "0", "SYNTHETIC_VISION_MS": "0"}
    return {
        "A": mmserve_command("synthetic", zero_stage_times),
        "B": mmserve_command("synthetic", {**zero_stage_times, "API_KEY_FILE": str(key_file),
                                           "ADMIN_API_KEYS": ADMIN_KEY, "RATE_LIMIT": "1000000/s"}),
    }


def wrk_script(directory: Path) -> Path:
    """The Lua script that posts the bodies (and B's bearer key, from ``AUTH_COST_KEY``)."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    script = directory / "post.lua"
    script.write_text(_LUA)
    return script


def measure(seconds: float, num_rounds: int, connections: int) -> list[Run]:
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        script = wrk_script(Path(tmp))
        servers = stack.enter_context(paused_servers(server_commands(Path(tmp))))
        for name, server in servers.items():  # warm both up once, unmeasured
            with resumed(server):
                run_wrk(server.url, script, KEYS[name], 1, connections)
        for order in alternated_order(num_rounds):
            for name in order:
                with resumed(servers[name]) as server:  # the other stays paused (SIGSTOP)
                    cpu_before = server.cpu_s()
                    num_requests, num_failed = run_wrk(server.url, script, KEYS[name], seconds, connections)
                    runs.append(Run(name, num_requests, num_failed, server.cpu_s() - cpu_before))
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each wrk run (default 10)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of one A and one B run (default 4)")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections (default 16)")
    args = parser.parse_args(argv)
    runs = measure(args.seconds, args.rounds, args.connections)
    for run in runs:
        print(f"{run.name}: {run.num_requests} requests ({run.num_failed} not 2xx), "
              f"{run.cpu_us_per_request:.1f} us CPU per request")
    mean_us, spread_us = cost_us(runs)
    print(json.dumps({"auth_cost_us_per_request": round(mean_us, 2), "stdev_over_rounds_us": round(spread_us, 2),
                      "target_us": TARGET_US, "rounds": args.rounds, "seconds_per_run": args.seconds}))
    if any(run.num_failed for run in runs):
        print("some answers were not 2xx: the figures are not of the path they claim", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
