"""The run report: one JSON document, and the table printed from it.

The table is rendered from the JSON report, not from the samples, so what a
person reads at the terminal and what a script reads from ``--output`` can
never disagree. Top-level keys::

    sent, ok, errors, errors_by_status, achieved_rate_rps, throughput_rps,
    target_rate_rps, send_window_s, elapsed_s, last_answer_s (null: none answered),
    p50_ms, p90_ms, p99_ms, p999_ms, p9999_ms, mean_ms, max_ms,
    generator_lag_ms {p50, p99, max, threshold_p99}, generator_bottleneck, warnings,
    routes {<route>: {sent, ok, errors, errors_by_status, achieved_rate_rps, throughput_rps, p50_ms, ...}},
    server {scraped, errors, batch_size, queue_wait, queue_depth, cache},
    timeline {bin_s, start_s, sent_rps, ok_rps, p99_ms}, config {...}

(``bench.run_bench`` adds ``images`` {num_distinct, mean_encoded_size_bytes}
and ``client`` {peak_connections}.)
"""

from __future__ import annotations

from typing import Any

from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.runner import RunResult
from benchmarks.loadgen.stats import (
    PERCENTILES,
    GroupStats,
    group_stats,
    is_generator_bottleneck,
    run_windows,
    stats_by_route,
    summarize_lag,
    timeline,
)

_TABLE_PERCENTILE_TITLES = {
    "p50_ms": "p50",
    "p90_ms": "p90",
    "p99_ms": "p99",
    "p999_ms": "p99.9",
    "p9999_ms": "p99.99",
}


def _group_json(stats: GroupStats) -> dict[str, Any]:
    section: dict[str, Any] = {
        "sent": stats.sent,
        "ok": stats.ok,
        "errors": stats.sent - stats.ok,
        "errors_by_status": stats.errors_by_status,
        "achieved_rate_rps": stats.achieved_rate_rps,
        "throughput_rps": stats.throughput_rps,
    }
    section.update(dict(stats.latency.percentiles_ms))
    section["mean_ms"] = stats.latency.mean_ms
    section["max_ms"] = stats.latency.max_ms
    return section


MOSTLY_ERRORS_SHARE = 0.5  # more failed answers than this share of the requests sent: the run measured errors


def mostly_errors_warning(sent: int, ok: int, errors_by_status: dict[str, int]) -> str | None:
    """The warning of a run whose requests mostly failed (over ``MOSTLY_ERRORS_SHARE``), with what to change for
    the usual causes; ``None`` for a run that measured answers. Its latencies are the errors', not inference's."""
    num_failed = sent - ok
    if sent == 0 or num_failed <= sent * MOSTLY_ERRORS_SHARE:
        return None
    hints = []
    if any(outcome.startswith(("401", "403")) for outcome in errors_by_status):
        hints.append("401/403: the server wants an API key (--api-key-file FILE)")
    if any(outcome.startswith("422") for outcome in errors_by_status):
        hints.append("422: the server refused the bodies, e.g. texts over the model's token limit (a shorter "
                     "--text-chars MIN:MAX, or --truncate)")
    return (f"{num_failed} of {sent} requests failed ({_errors_text(errors_by_status)}): the latencies are the "
            f"errors', not inference's" + (f"; {'; '.join(hints)}" if hints else ""))


def build_report(config: BenchConfig, result: RunResult, server: dict[str, Any]) -> dict[str, Any]:
    """Everything the run measured, as a JSON-ready dict (keys listed in the module docstring)."""
    windows = run_windows(result)
    lag = summarize_lag(result.samples)
    is_bottleneck = is_generator_bottleneck(lag, config.max_lag_p99_ms)
    warnings: list[str] = []
    if is_bottleneck:
        warnings.append(
            f"generator fell behind its schedule (p99 lag {lag.p99_ms:.1f} ms > {config.max_lag_p99_ms:.1f} ms): "
            "the load was not offered as scheduled, so the generator, not the server, limited this run; "
            "lower the rate, give the generator its own CPU, or split the load over several generators"
        )
    if not result.samples:
        warnings.append("no request was sent")
    elif lag.num_measured == 0:
        warnings.append("no request reached the server (all failed before sending); lag is unknown")
    for error in server.get("errors", []):
        warnings.append(f"server metrics: {error}")
    overall = group_stats(result.samples, windows)
    mostly_errors = mostly_errors_warning(overall.sent, overall.ok, overall.errors_by_status)
    if mostly_errors is not None:
        warnings.append(mostly_errors)

    report: dict[str, Any] = {"mode": config.mode.value}
    report.update(_group_json(overall))
    report.update(
        {
            "target_rate_rps": config.rate_rps if config.mode is RunMode.OPEN else None,
            "send_window_s": windows.send_window_s,
            "elapsed_s": windows.elapsed_s,
            "last_answer_s": windows.last_answer_s,
            "generator_lag_ms": {
                "p50": lag.p50_ms,
                "p99": lag.p99_ms,
                "max": lag.max_ms,
                "threshold_p99": config.max_lag_p99_ms,
            },
            "generator_bottleneck": is_bottleneck,
            "mostly_errors": mostly_errors is not None,
            "warnings": warnings,
            "routes": {route: _group_json(stats) for route, stats in stats_by_route(result.samples, windows).items()},
            "server": server,
        }
    )
    series = timeline(result.samples, windows)
    report["timeline"] = {
        "bin_s": series.bin_s,
        "start_s": list(series.start_s),
        "sent_rps": list(series.sent_rps),
        "ok_rps": list(series.ok_rps),
        "p99_ms": list(series.p99_ms),
    }
    report["config"] = config.to_json()
    return report


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _errors_text(errors_by_status: dict[str, int]) -> str:
    return " ".join(f"{status}={count}" for status, count in errors_by_status.items()) or "-"


def format_table(report: dict[str, Any]) -> str:
    """The end-of-run table: counts, rates and percentiles overall and per route."""
    percentile_keys = [name for name, _ in PERCENTILES]
    header = ["route", "sent", "ok", "errors", "rate_rps", "ok_rps"] + [
        f"{_TABLE_PERCENTILE_TITLES[key]}_ms" for key in percentile_keys
    ]
    rows: list[list[str]] = []
    sections = [("all", report), *list(report["routes"].items())]
    for name, section in sections:
        rows.append(
            [
                name,
                str(section["sent"]),
                str(section["ok"]),
                _errors_text(section["errors_by_status"]),
                f"{section['achieved_rate_rps']:.1f}",
                f"{section['throughput_rps']:.1f}",
            ]
            + [_ms(section[key]) for key in percentile_keys]
        )
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row))
        for row in [header, *rows]
    ]

    target = report.get("target_rate_rps")
    title = f"mode {report['mode']}"
    if target is not None:
        title += f", target {target:.1f} req/s"
    last_answer_s = report.get("last_answer_s")
    last_answer = "none answered" if last_answer_s is None else f"last answer at {last_answer_s:.2f} s"
    title += f", sent over {report['send_window_s']:.2f} s, {last_answer}"
    lag = report["generator_lag_ms"]
    lines = [title, *lines]
    lines.append(f"generator lag ms: p50 {_ms(lag['p50'])}  p99 {_ms(lag['p99'])}  max {_ms(lag['max'])}")
    lines.extend(_server_lines(report.get("server") or {}))
    lines.extend(f"WARNING: {warning}" for warning in report["warnings"])
    return "\n".join(lines)


def _server_lines(server: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    batch_size = server.get("batch_size")
    if batch_size:
        means = ", ".join(f"{lane} {_ms(entry['mean'])}" for lane, entry in batch_size.items())
        lines.append(f"server batch size mean: {means}")
    queue_wait = server.get("queue_wait")
    if queue_wait:
        waits = ", ".join(f"{route} {_ms(entry['mean_ms'])}" for route, entry in queue_wait.items())
        lines.append(f"server queue wait mean ms: {waits}")
    cache = server.get("cache")
    if cache:
        ratios = ", ".join(
            f"{modality} {_ratio(entry['hit_ratio'])}" for modality, entry in cache["by_modality"].items()
        )
        lines.append(f"server cache hit ratio: {_ratio(cache['hit_ratio'])} ({ratios})")
    return lines


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
