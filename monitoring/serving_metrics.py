"""The plain Prometheus series of mmserve (counters, gauges, histograms).

One ``ServingMetrics`` is built per app on that app's own ``CollectorRegistry``
(never the process-global one), so two servers in one process, as in tests,
never share a series. Names follow DESIGN.md: prefix ``mmserve_``, base units,
``_total`` for counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Request latency buckets: fine below 10 ms (the text lane lives there) and
# still resolving multi-second stalls. A histogram is mergeable across
# replicas; the exact tail comes from the digests, not from these buckets.
REQUEST_DURATION_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.010,
    0.015, 0.020, 0.030, 0.050, 0.075, 0.100, 0.150, 0.200, 0.300,
    0.500, 0.750, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0,
)

BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)
# Joint sequence lengths: a text alone (tens of tokens) up to several images of ViT-L/16 at 256 px (4 x 256 + 64).
JOINT_TOKENS_BUCKETS: tuple[float, ...] = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1280, 1536, 2048, 4096)

# ``mmserve_rejected_total``'s lane for refusals made before a request has a lane: the decode queue
# (``MMSERVE_MAX_DECODE_QUEUE``) and, with API processes, the pixel slots. One fixed value, so the
# label's values stay the three lanes and this one.
INTAKE_LANE = "intake"


class ServingMetrics:
    """Every plain series the server, router and cache update.

    Attributes are ``prometheus_client`` metric objects; callers label them
    (``metrics.requests_total.labels(route="fusion", code="200").inc()``).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._request_series: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        self.requests_total = Counter(
            "mmserve_requests_total",
            "Requests answered, by route and HTTP status code.",
            ("route", "code"),
            registry=registry,
        )
        self.request_duration_seconds = Histogram(
            "mmserve_request_duration_seconds",
            "End-to-end request latency as seen by the server.",
            ("route",),
            buckets=REQUEST_DURATION_BUCKETS_S,
            registry=registry,
        )
        self.batch_size = Histogram(
            "mmserve_batch_size",
            "Number of real (unpadded) requests in each executed batch, counted under the lane that led it "
            "(an image batch may also hold the other image lane's requests).",
            ("lane",),
            buckets=BATCH_SIZE_BUCKETS,
            registry=registry,
        )
        self.joint_tokens = Histogram(
            "mmserve_joint_tokens",
            "Joint token sequence of each answered request: images x tokens per image + text tokens "
            "(after any cut to the joint-token budget).",
            ("route",),
            buckets=JOINT_TOKENS_BUCKETS,
            registry=registry,
        )
        self.cold_compiles_total = Counter(
            "mmserve_cold_compiles_total",
            "Things compiled or run for the first time after the server said ready: a batch shape warm-up "
            "did not run (kind=shape) or a Triton kernel variant (kind=triton_kernel). Must stay 0.",
            ("kind",),
            registry=registry,
        )
        for kind in ("shape", "triton_kernel"):
            self.cold_compiles_total.labels(kind=kind)  # exported as 0 from the start
        self.model_info = Gauge(
            "mmserve_model_info",
            "1, labelled with what computes the served model: runtime (torch | onnxruntime) and dtype.",
            ("runtime", "dtype"),
            registry=registry,
        )
        self.queue_depth = Gauge(
            "mmserve_queue_depth",
            "Requests waiting in a lane's queue.",
            ("lane",),
            registry=registry,
        )
        self.rejected_total = Counter(
            "mmserve_rejected_total",
            "Requests refused as overload (503 overloaded), by lane and reason: a lane's admission control "
            "(queue_full, deadline), or before a lane, lane intake (decode_queue_full, pixel_slots_full).",
            ("lane", "reason"),
            registry=registry,
        )
        # Exported from the start (at 0), so a rate over them exists before the first refusal.
        self.decode_queue_refused = self.rejected_total.labels(lane=INTAKE_LANE, reason="decode_queue_full")
        self.pixel_slots_refused = self.rejected_total.labels(lane=INTAKE_LANE, reason="pixel_slots_full")
        self.cache_events_total = Counter(
            "mmserve_cache_events_total",
            "Segment cache events (hit, miss, coalesced, eviction, insert).",
            ("modality", "event"),
            registry=registry,
        )
        self.cache_bytes = Gauge(
            "mmserve_cache_bytes",
            "Bytes held by the segment cache.",
            ("modality",),
            registry=registry,
        )
        self.cache_entries = Gauge(
            "mmserve_cache_entries",
            "Entries held by the segment cache.",
            ("modality",),
            registry=registry,
        )

    def request_series(self, route: str, code: str) -> tuple[Counter, Histogram]:
        """``requests_total{route, code}`` and ``request_duration_seconds{route}``, labelled once per pair.

        ``labels()`` checks and sorts the label names and takes a lock on
        every call; the request layer updates both series for every request,
        over a handful of fixed routes and status codes.
        """
        series = self._request_series.get((route, code))
        if series is None:
            series = (self.requests_total.labels(route=route, code=code),
                      self.request_duration_seconds.labels(route=route))
            self._request_series[(route, code)] = series
        return series
