"""The server's side of latency monitoring: a ``Monitor`` built from ``Settings``, tied to the app's life.

    Settings.drift_*  ->  MonitorConfig  ->  Monitor  ->  registered on the app's own registry
    lifespan start:       monitor.start()  (folder thread)
                          mark_ready_when_ready(...)  (baseline learning starts once warm-up is over)
    lifespan end:         monitor.stop()   (folds what is still buffered)

The baseline is learned from traffic after readiness only: requests answered
during warm-up (there are none on ``/v1/infer``, but a cold process is slower
anyway) would make a baseline no steady-state window could match.

Each answered request is recorded with what it carried (``request_inputs``
of the facts the intake computed once, ``router.item_facts``), so drift can
be attributed to input values ("the slow ones were the 4K PNGs"). Image
sizes come from the headers (``router.image_header``), for cache hits too,
which are never decoded; a header that cannot be read (BMP, TIFF, a
cut-short file) is ``unknown``, and BMP and TIFF are encoding ``other``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry

from monitoring import Monitor, MonitorConfig, RequestInputs
from router.item_facts import ItemFacts
from server.settings import Settings

# The folder thread folds the record buffer at least this often; a shorter
# sub-window (small test windows) folds once per sub-window instead, which is
# the finest a sample's sub-window can matter.
MAX_FOLD_INTERVAL_S = 1.0

# How often the readiness watcher looks at the router while it warms up.
READY_POLL_INTERVAL_S = 0.05


def monitor_config(settings: Settings) -> MonitorConfig:
    """The ``MonitorConfig`` of ``settings`` (``MMSERVE_DRIFT_*``).

    Raises:
        monitoring.InvalidMonitorConfigError: the drift settings contradict each
            other (e.g. a baseline shorter than one sub-window of the window).
    """
    num_sub_windows = MonitorConfig.num_sub_windows  # the package's default, 12
    return MonitorConfig(
        window_s=settings.drift_window_s,
        num_sub_windows=num_sub_windows,
        baseline_s=settings.drift_baseline_s,
        period_s=settings.drift_period_s,
        threshold=settings.drift_threshold,
        consecutive=settings.drift_consecutive,
        min_samples=settings.drift_min_samples,
        tail_ratio=settings.drift_tail_ratio,
        fold_interval_s=min(MAX_FOLD_INTERVAL_S, settings.drift_window_s / num_sub_windows),
    )


def build_monitor(settings: Settings, registry: CollectorRegistry) -> Monitor:
    """A ``Monitor`` for ``settings``, exporting on ``registry`` (the app's own)."""
    monitor = Monitor(monitor_config(settings))
    monitor.register(registry)
    return monitor


async def mark_ready_when_ready(monitor: Monitor, is_ready: Callable[[], bool],
                                poll_interval_s: float = READY_POLL_INTERVAL_S) -> None:
    """Call ``monitor.mark_ready()`` once ``is_ready()`` holds (the router finished warm-up).

    Runs as a task of the lifespan, which cancels it at shutdown if warm-up
    never finished.
    """
    while not is_ready():
        await asyncio.sleep(poll_interval_s)
    monitor.mark_ready()


def cache_hit_of(statuses: Mapping[str, str | list[str]]) -> bool | None:
    """One request's cache outcome for attribution, from its per-segment ``cache`` statuses.

    ``True`` when every segment came from the cache (``hit``); ``False`` when
    at least one was computed for it or by another request it waited for
    (``miss``, ``coalesced``); ``None`` when the cache was not asked
    (``bypass`` everywhere, or no segment). A list (``images``) counts each entry.
    """
    flat = [status for value in statuses.values() for status in ([value] if isinstance(value, str) else value)]
    used = [status for status in flat if status != "bypass"]
    if not used:
        return None
    return all(status == "hit" for status in used)


def request_inputs(facts: ItemFacts | None) -> RequestInputs | None:
    """What one answered request (or protocol row) carried, in the monitor's buckets.

    ``facts`` are the item's as the intake computed them (``router.item_facts``):
    image sizes and encoding from the headers, the text's tokens after
    truncation (what the encoder ran), the count, priority and protocol.
    """
    if facts is None:
        return None
    return RequestInputs.of(
        largest_image_pixels=facts.largest_image_pixels,
        image_encoding=facts.image_encoding,
        num_text_tokens=facts.num_text_tokens,
        num_images=facts.num_images,
        priority=facts.priority,
        protocol=facts.protocol,
        engine=facts.engine,
    )
