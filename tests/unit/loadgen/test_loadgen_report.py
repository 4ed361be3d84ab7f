"""``mmserve bench`` end to end against the stand-in: table, JSON report, server view and PNG."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from benchmarks.loadgen.cli import main

PERCENTILE_KEYS = ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "p9999_ms")
GROUP_KEYS = ("sent", "ok", "errors", "errors_by_status", "achieved_rate_rps", "throughput_rps", *PERCENTILE_KEYS)
TOP_LEVEL_KEYS = (
    *GROUP_KEYS,
    "mode",
    "target_rate_rps",
    "send_window_s",
    "elapsed_s",
    "generator_lag_ms",
    "generator_bottleneck",
    "warnings",
    "routes",
    "server",
    "timeline",
    "config",
    "images",
    "client",
)
RATE_RPS = 40.0
DURATION_S = 1.5


@pytest.fixture(scope="module")
def cli_run(start_standin: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    server = start_standin()
    out_dir = tmp_path_factory.mktemp("bench")
    report_path, plot_path = out_dir / "report.json", out_dir / "latency.png"
    argv = [
        server.url, "--rate", str(RATE_RPS), "--duration", str(DURATION_S),
        "--mix", "text:1,vision:1,fusion:2", "--images", "6", "--zipf", "1.2", "--image-size", "40x30",
        "--seed", "3", "--output", str(report_path), "--plot", str(plot_path), "--no-progress",
    ]  # fmt: skip
    stdout = io.StringIO()  # a module-scoped fixture cannot use capsys
    with contextlib.redirect_stdout(stdout):
        code = main(argv)
    return {
        "code": code,
        "stdout": stdout.getvalue(),
        "report": json.loads(report_path.read_text()),
        "plot_path": plot_path,
        "state": server.state,
    }


def test_the_report_has_every_promised_key(cli_run: dict[str, Any]) -> None:
    assert cli_run["code"] == 0
    report = cli_run["report"]
    assert set(TOP_LEVEL_KEYS) <= set(report)
    assert set(report["generator_lag_ms"]) >= {"p50", "p99", "max"}
    assert isinstance(report["generator_bottleneck"], bool)
    assert set(report["routes"]) == {"text", "vision", "fusion"}
    for section in report["routes"].values():
        assert set(GROUP_KEYS) <= set(section)
    assert set(report["server"]) >= {"batch_size", "queue_wait", "cache"}
    assert set(report["timeline"]) >= {"bin_s", "start_s", "sent_rps", "ok_rps", "p99_ms"}


def test_the_report_agrees_with_what_the_server_saw(cli_run: dict[str, Any]) -> None:
    report, state = cli_run["report"], cli_run["state"]
    assert report["sent"] == report["ok"] == len(state.received)
    assert report["errors"] == 0 and report["errors_by_status"] == {}
    assert sum(section["sent"] for section in report["routes"].values()) == report["sent"]
    for route, section in report["routes"].items():
        assert section["sent"] == sum(1 for request in state.received if request.route == route)
    percentiles = [report[key] for key in PERCENTILE_KEYS]
    assert percentiles == sorted(percentiles) and percentiles[0] > 0
    assert report["target_rate_rps"] == RATE_RPS
    assert report["achieved_rate_rps"] == pytest.approx(report["sent"] / report["send_window_s"])


def test_the_server_section_is_the_runs_share_of_the_stand_in_metrics(cli_run: dict[str, Any]) -> None:
    server, state = cli_run["report"]["server"], cli_run["state"]
    assert server["scraped"] is True
    for lane, sizes in state.batch_sizes_by_lane.items():
        assert server["batch_size"][lane]["num_batches"] == len(sizes)
        assert server["batch_size"][lane]["mean"] == pytest.approx(sum(sizes) / len(sizes))
    for route, waits_s in state.queue_waits_s_by_route.items():
        assert server["queue_wait"][route]["mean_ms"] == pytest.approx(sum(waits_s) / len(waits_s) * 1000.0)
    hits, misses = state.cache_events[("image", "hit")], state.cache_events[("image", "miss")]
    assert misses <= 6  # a pool of 6 images: at most one miss each
    assert server["cache"]["by_modality"]["image"]["hit_ratio"] == pytest.approx(hits / (hits + misses))
    assert server["cache"]["by_modality"]["text"]["hit_ratio"] == 0.0  # texts are fresh per request


def test_the_table_shows_counts_and_percentiles_per_route(cli_run: dict[str, Any]) -> None:
    lines = cli_run["stdout"].splitlines()
    header = next(line for line in lines if line.startswith("route"))
    for title in ("sent", "ok", "errors", "rate_rps", "p50_ms", "p90_ms", "p99_ms", "p99.9_ms", "p99.99_ms"):
        assert title in header.split()
    report = cli_run["report"]
    for name, section in [("all", report), *report["routes"].items()]:
        row = next(line.split() for line in lines if line.split()[:1] == [name])
        assert row[1] == str(section["sent"]) and row[2] == str(section["ok"])
        assert row[-1] == f"{section['p9999_ms']:.1f}"
    assert any(line.startswith("generator lag ms:") for line in lines)
    assert any(line.startswith("server cache hit ratio:") for line in lines)


def test_the_plot_is_a_valid_png(cli_run: dict[str, Any]) -> None:
    path: Path = cli_run["plot_path"]
    assert path.stat().st_size > 10_000
    with Image.open(path) as image:
        assert image.format == "PNG"
        image.verify()
    with Image.open(path) as image:
        width_px, height_px = image.size
        assert width_px >= 800 and height_px >= 800
        # Not a blank canvas: the curves put many distinct colours on it.
        assert len(image.convert("RGB").getcolors(maxcolors=1_000_000) or []) > 16


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["http://127.0.0.1:9", "--duration", "1"], 2),  # no pacing flag
        (["http://127.0.0.1:9", "--rate", "5"], 2),  # open loop without --duration
        (["http://127.0.0.1:9", "--rate", "5", "--concurrency", "2", "--duration", "1"], 2),  # exclusive
        (["http://127.0.0.1:9", "--rate", "5", "--duration", "1", "--mix", "audio:1"], 2),
        (["http://127.0.0.1:9", "--rate", "5", "--duration", "1", "--image-size", "224"], 2),
        (["127.0.0.1:9", "--rate", "5", "--duration", "1"], 2),  # not a URL
    ],
)
def test_unusable_flags_exit_nonzero_with_a_message(
    argv: list[str], code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--no-progress"]) == code
    assert capsys.readouterr().err.strip()
