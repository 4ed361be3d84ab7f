"""The run as a picture: latency CDF per route, throughput and p99 over time.

Drawn with matplotlib's Agg canvas on a standalone ``Figure`` (no pyplot, no
global backend switch, no display needed). matplotlib is imported only when a
plot is asked for: it is slow to import and a run without ``--plot`` does not
need it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from benchmarks.loadgen.runner import RunResult, Sample
from benchmarks.loadgen.stats import run_windows, timeline

_FIGURE_SIZE_IN = (10.0, 10.0)
_DPI = 100


def _cdf_points(samples: Sequence[Sample]) -> tuple[list[float], list[float]]:
    latencies_ms = sorted(max(sample.latency_s * 1000.0, 1e-3) for sample in samples)
    count = len(latencies_ms)
    return latencies_ms, [(rank + 1) / count for rank in range(count)]


def write_plot(result: RunResult, path: Path, title: str) -> None:
    """Write a PNG with three panels to ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=_FIGURE_SIZE_IN, dpi=_DPI)
    FigureCanvasAgg(figure)
    cdf_axes, throughput_axes, p99_axes = figure.subplots(3, 1)
    figure.suptitle(title)

    routes: dict[str, list[Sample]] = {}
    for sample in result.samples:
        routes.setdefault(sample.route, []).append(sample)
    for name, samples in [("all", list(result.samples)), *sorted(routes.items())]:
        if samples:
            latencies_ms, fractions = _cdf_points(samples)
            cdf_axes.step(latencies_ms, fractions, where="post", label=f"{name} (n={len(samples)})")
    cdf_axes.set_xscale("log")
    cdf_axes.set_xlabel("latency from intended send (ms)")
    cdf_axes.set_ylabel("fraction of requests")
    cdf_axes.set_title("latency CDF by route")
    cdf_axes.grid(True, which="both", alpha=0.3)
    if result.samples:
        cdf_axes.legend(loc="lower right")

    series = timeline(result.samples, run_windows(result))
    centers_s = [start_s + series.bin_s / 2 for start_s in series.start_s]
    throughput_axes.plot(centers_s, series.sent_rps, label="sent")
    throughput_axes.plot(centers_s, series.ok_rps, label="ok answers")
    throughput_axes.set_xlabel("time since start (s)")
    throughput_axes.set_ylabel("requests / s")
    throughput_axes.set_title(f"throughput ({series.bin_s:g} s bins)")
    throughput_axes.grid(True, alpha=0.3)
    throughput_axes.legend(loc="upper right")

    p99_points = [
        (center_s, p99_ms) for center_s, p99_ms in zip(centers_s, series.p99_ms, strict=True) if p99_ms is not None
    ]
    p99_axes.plot([point[0] for point in p99_points], [point[1] for point in p99_points], marker=".")
    p99_axes.set_xlabel("intended send time (s)")
    p99_axes.set_ylabel("p99 latency (ms)")
    p99_axes.set_title("p99 latency over time")
    p99_axes.grid(True, alpha=0.3)

    figure.tight_layout()
    figure.savefig(path, format="png")
