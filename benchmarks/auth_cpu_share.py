"""What API keys and the rate limiter cost per request, from the server's sampled stacks.

    python -m benchmarks.auth_cpu_share [--seconds 15] [--rounds 2] [--rate 400]

``benchmarks/auth_cost.py`` subtracts two servers' CPU per request; on a
shared 2-core guest two runs of one server differ by more than the 30 us
target, so the difference did not settle (BENCHMARKS.md). This script asks
the question within one process at one time instead, as
``benchmarks.tracing_cpu_share`` did for tracing: the same two servers
(A: no keys, no limit; B: inference + admin keys from a ``sha256:`` file and
a rate limit that never refuses), saturated by wrk in turn (A-B, B-A, ...,
the other paused), while ``py-spy`` samples the server's Python threads.
A sample is the access layer's when the innermost frame on its stack that
is not the standard library's is in

    server/http/keys.py, access_policy.py, rate_limit.py, audit.py, auth.py

(with the library calls those frames make, hashing and comparing a key among
them; the key check and the rate limiter are ASGI middlewares, whose
``__call__`` is on the stack of everything they await, which is not theirs:
``benchmarks.harness.sampled_stacks.share_held``)
and that code's CPU per request is its share of the samples times the
server's CPU per answered request over the same wrk run (``/proc``), so the
machine's speed at that moment scales both alike. A's row is what the layer
costs when nothing is configured (the key check's middleware stays
installed and passes each request through); the cost is B's minus A's, against the 30 us target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from benchmarks.auth_cost import KEYS, TARGET_US, alternated_order, run_wrk, server_commands, wrk_script
from benchmarks.harness import machine_line, utc_now
from benchmarks.harness.sampled_stacks import Frame, Share, record_stacks, share_held
from benchmarks.harness.server_process import paused_servers, resumed
from benchmarks.harness.table_layout import align

ACCESS_FILES = ("server/http/keys.py", "server/http/access_policy.py", "server/http/rate_limit.py",
                "server/http/audit.py", "server/http/auth.py")
_LEAD_S = 1.0  # wrk runs this long before sampling starts, and after it ends


def is_access_layer(frame: Frame) -> bool:
    return frame.path.endswith(ACCESS_FILES)


@dataclass(frozen=True)
class SampledRun:
    """One server saturated by wrk while sampled."""

    name: str
    num_requests: int
    num_failed: int
    cpu_s: float
    share: Share

    @property
    def cpu_us_per_request(self) -> float:
        return self.cpu_s / self.num_requests * 1e6

    @property
    def access_us_per_request(self) -> float:
        return self.share.fraction * self.cpu_us_per_request


def access_cost_us(runs: list[SampledRun]) -> tuple[float, float]:
    """Mean of B's access-layer µs per request minus A's, and B's spread over its runs."""
    by_name = {name: [run.access_us_per_request for run in runs if run.name == name] for name in ("A", "B")}
    spread = statistics.stdev(by_name["B"]) if len(by_name["B"]) > 1 else float("nan")
    return statistics.fmean(by_name["B"]) - statistics.fmean(by_name["A"]), spread


def sample_once(server, name: str, script: Path, seconds: float, connections: int, rate_hz: int) -> SampledRun:  # noqa: ANN001
    done: dict[str, tuple[int, int]] = {}
    cpu_before = server.cpu_s()
    load = threading.Thread(target=lambda: done.setdefault(
        "wrk", run_wrk(server.url, script, KEYS[name], seconds + 2 * _LEAD_S, connections)))
    load.start()
    threading.Event().wait(_LEAD_S)
    stacks = record_stacks(server.pid, seconds, rate_hz)
    load.join()
    num_requests, num_failed = done["wrk"]
    return SampledRun(name, num_requests, num_failed, server.cpu_s() - cpu_before, share_held(stacks, is_access_layer))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="how long each server is sampled (default 15)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of one A and one B run (default 2)")
    parser.add_argument("--rate", type=int, default=400, help="py-spy samples per second (default 400)")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections (default 16)")
    args = parser.parse_args(argv)
    runs: list[SampledRun] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        script = wrk_script(Path(tmp))
        servers = stack.enter_context(paused_servers(server_commands(Path(tmp))))
        for name, server in servers.items():  # warm both up once, unmeasured
            with resumed(server):
                run_wrk(server.url, script, KEYS[name], 1, args.connections)
        for order in alternated_order(args.rounds):
            for name in order:
                with resumed(servers[name]) as server:
                    runs.append(sample_once(server, name, script, args.seconds, args.connections, args.rate))
    print(f"keys + rate limiter, CPU share of the access layer, {utc_now()}, {machine_line()}, "
          f"py-spy --rate {args.rate} --nonblocking, {args.seconds:g} s sampled per run, wrk -c{args.connections}")
    rows = [("server", "requests", "not 2xx", "CPU us/req", "samples", "access", "share", "access us/req",
             "access frames that held most")]
    for run in runs:
        frames = ", ".join(f"{frame} {count}" for frame, count in run.share.top_frames[:3])
        rows.append((run.name, str(run.num_requests), str(run.num_failed), f"{run.cpu_us_per_request:.0f}",
                     str(run.share.num_samples), str(run.share.num_matching), f"{run.share.fraction:.2%}",
                     f"{run.access_us_per_request:.1f}", frames or "-"))
    print("\n".join(align(rows)))
    cost, spread = access_cost_us(runs)
    verdict = "met" if cost <= TARGET_US else "missed"
    print(f"access layer with keys and a rate limit: {cost:.1f} us CPU per request over no keys "
          f"(B's runs spread {spread:.1f} us); target <= {TARGET_US:g} us: {verdict}")
    if any(run.num_failed for run in runs):
        print("some answers were not 2xx: the figures are not of the path they claim", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
