"""An open loop must show a server stall; a closed loop on the same server hides it.

The stand-in freezes for 1.5 s from its first request: everything that arrives
during the freeze waits until it ends. At 50 req/s the open loop keeps sending
through the freeze, so ~half of a 3 s run queues behind it and p90 is far above
0.4 s. A closed loop has its few workers stuck in the freeze, sends nothing
meanwhile, then floods fast requests: its percentiles barely notice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from benchmarks.loadgen.bench import run_bench
from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.image_pool import ImageSize
from benchmarks.loadgen.workload import TextLengthRange, parse_mix

STALL_S = 1.5
DURATION_S = 3.0
RATE_RPS = 50.0


def _config(url: str, mode: RunMode, **pacing: Any) -> BenchConfig:
    return BenchConfig(
        url=url,
        mode=mode,
        duration_s=DURATION_S,
        mix=parse_mix("text:0.3,vision:0.3,fusion:0.4"),
        num_images=4,
        image_size=ImageSize(32, 32),
        text_length=TextLengthRange(16, 48),
        seed=7,
        timeout_s=10.0,
        show_progress=False,
        **pacing,
    )


@pytest.fixture(scope="module")
def reports(start_standin: Callable[..., Any]) -> dict[str, Any]:
    open_server = start_standin(stall_s=STALL_S)
    open_report = asyncio.run(run_bench(_config(open_server.url, RunMode.OPEN, rate_rps=RATE_RPS))).report
    closed_server = start_standin(stall_s=STALL_S)
    closed_report = asyncio.run(run_bench(_config(closed_server.url, RunMode.CLOSED, concurrency=4))).report
    return {
        "open": open_report,
        "closed": closed_report,
        "open_stalled": open_server.state.num_stalled,
        "closed_stalled": closed_server.state.num_stalled,
    }


def test_open_loop_reports_the_stall(reports: dict[str, Any]) -> None:
    report = reports["open"]
    assert report["ok"] == report["sent"] > 0
    assert reports["open_stalled"] > 0.25 * report["sent"]  # the stall really held many requests
    assert report["p90_ms"] > 400.0
    assert report["max_ms"] >= STALL_S * 1000.0 * 0.9
    # The stall did not hold the sender back: it kept its schedule while the server was frozen
    # (a sender that waited for answers would lag by up to the whole stall).
    assert report["achieved_rate_rps"] == pytest.approx(RATE_RPS, rel=0.35)
    assert report["generator_lag_ms"]["p50"] < 10.0
    assert report["generator_lag_ms"]["max"] < STALL_S * 1000.0 / 3
    # One connection per request in flight: the client never queued them itself.
    assert report["client"]["peak_connections"] >= reports["open_stalled"]


def test_closed_loop_on_the_same_stall_reports_a_much_lower_p90(reports: dict[str, Any]) -> None:
    open_report, closed_report = reports["open"], reports["closed"]
    # The closed loop's workers were stuck in the very same stall...
    assert reports["closed_stalled"] >= 1
    assert closed_report["max_ms"] >= STALL_S * 1000.0 * 0.9
    # ...yet its percentiles hide it: the requests it did not send during the stall are never measured.
    assert closed_report["p90_ms"] < 100.0
    assert closed_report["p90_ms"] * 5 < open_report["p90_ms"]
