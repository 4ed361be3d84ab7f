"""One benchmark run, end to end: prepare, scrape, send, drain, scrape, report.

Everything expensive (rendering and encoding images, parsing the trace) happens
before the clock starts, so the sender only concatenates bytes and writes them.
Connections are unbounded (``ConnectionSlots``): with a stalled server, an open
loop needs one connection per request in flight, and a capped pool would turn
the client into the queue and hide the server's.

A server no request reaches (refused, no such host) is no run: it raises
``RunNotStartedError`` rather than report a table of transport errors. The
scrape after the run waits for the server's fold (its stage times reach
``/metrics`` once a second), so the queue waits cover the last answers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.connection_slots import ConnectionSlots
from benchmarks.loadgen.embeddings_payload import EmbeddingsBodyBuilder
from benchmarks.loadgen.errors import RunNotStartedError
from benchmarks.loadgen.image_pool import ImagePool
from benchmarks.loadgen.payload import BodyBuilder
from benchmarks.loadgen.progress import RunProgress
from benchmarks.loadgen.report import build_report
from benchmarks.loadgen.request_spec import Arrival
from benchmarks.loadgen.runner import RunResult, run_closed_loop, run_open_loop
from benchmarks.loadgen.server_metrics import ScrapeResult, num_queue_waits, scrape, server_view
from benchmarks.loadgen.text_source import TextSource
from benchmarks.loadgen.trace import load_trace, trace_arrivals
from benchmarks.loadgen.workload import SyntheticWorkload, synthetic_arrivals

_SCRAPE_TIMEOUT_S = 10.0
# The server folds stage times into /metrics every fold_interval_s (1 s by default): after the last answer,
# scrape again until the queue waits cover the answers, stand still longer than a fold, or this bound passes.
_FOLD_WAIT_S = 2.5
_FOLD_STILL_S = 1.2
_FOLD_POLL_S = 0.2


@dataclass(frozen=True)
class BenchOutcome:
    """The JSON report and the raw samples it was computed from (for plots)."""

    report: dict[str, Any]
    result: RunResult


async def run_bench(config: BenchConfig) -> BenchOutcome:
    """Run the benchmark ``config`` describes against its URL and build the report."""
    image_pool = ImagePool(config.seed, config.image_size, config.image_format)
    builder: BodyBuilder
    if config.embeddings is None:
        builder = BodyBuilder(image_pool, TextSource(config.seed), config.is_truncating)
    else:
        builder = EmbeddingsBodyBuilder(image_pool, TextSource(config.seed), config.embeddings, config.image_format)
    workload: SyntheticWorkload | None = None
    replay: list[Arrival] | None = None
    if config.mode is RunMode.TRACE:
        assert config.trace_path is not None  # guaranteed by BenchConfig
        replay = trace_arrivals(load_trace(config.trace_path), config.speed, config.duration_s)
        image_pool.prepare({a.spec.image_key for a in replay if a.spec.image_key is not None})
        window_s = max((a.intended_offset_s for a in replay), default=0.0)  # the schedule's span
    else:
        workload = SyntheticWorkload(
            config.mix, config.num_images, config.zipf_exponent, config.text_length, config.seed
        )
        if any(modality.has_image for modality, _ in config.mix.shares):
            image_pool.prepare(workload.image_keys)
        assert config.duration_s is not None  # guaranteed by BenchConfig
        window_s = config.duration_s

    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key is not None else None
    slots = ConnectionSlots(config.url, config.timeout_s, headers)
    try:
        before = await _scrape(slots)
        if before.is_unreachable:
            raise RunNotStartedError(f"no request reached the server at {config.url}: {before.error}")
        progress = RunProgress(window_s, config.show_progress)
        ticker = asyncio.create_task(progress.tick_until_cancelled())
        try:
            if config.mode is RunMode.CLOSED:
                assert workload is not None and config.concurrency is not None
                result = await run_closed_loop(
                    slots, workload, builder, config.concurrency, window_s, config.timeout_s, progress.on_sample
                )
            else:
                arrivals: Iterator[Arrival]
                if replay is not None:
                    arrivals = iter(replay)
                else:
                    assert workload is not None and config.rate_rps is not None
                    arrivals = synthetic_arrivals(workload, config.rate_rps, window_s, config.seed)
                result = await run_open_loop(slots, arrivals, builder, window_s, config.timeout_s, progress.on_sample)
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            progress.close()
        if result.samples and all(sample.sent_s is None for sample in result.samples):
            raise RunNotStartedError(
                f"no request reached the server at {config.url}: {result.samples[0].detail or result.samples[0].outcome}"
            )
        after = await _scrape_after_fold(slots, before, sum(1 for sample in result.samples if sample.is_ok))
        num_connections = slots.num_slots
    finally:
        await slots.aclose()

    report = build_report(config, result, server_view(before, after))
    report["images"] = {
        "num_distinct": len(image_pool),
        "mean_encoded_size_bytes": image_pool.mean_encoded_size_bytes,
    }
    report["client"] = {"peak_connections": num_connections}
    return BenchOutcome(report, result)


async def _scrape(slots: ConnectionSlots) -> ScrapeResult:
    client = slots.acquire()
    try:
        return await scrape(client, _SCRAPE_TIMEOUT_S)
    finally:
        slots.release(client)


async def _scrape_after_fold(slots: ConnectionSlots, before: ScrapeResult, num_answered: int) -> ScrapeResult:
    """The scrape after the run, once the server's queue waits cover the ``num_answered`` answers, or have not
    changed for longer than one fold (cache hits wait in no queue), or ``_FOLD_WAIT_S`` has passed."""
    loop = asyncio.get_running_loop()
    started_s = loop.time()
    after = await _scrape(slots)
    last_count: float | None = None
    last_change_s = started_s
    while before.snapshot is not None and after.snapshot is not None and num_answered > 0:
        count = num_queue_waits(before.snapshot, after.snapshot)
        now_s = loop.time()
        if count != last_count:
            last_count, last_change_s = count, now_s
        if count >= num_answered or now_s - last_change_s >= _FOLD_STILL_S or now_s - started_s >= _FOLD_WAIT_S:
            break
        await asyncio.sleep(_FOLD_POLL_S)
        after = await _scrape(slots)
    return after
