"""Attribution by input value on a manual clock: a shift of PNGs only is named png, an even one names nothing."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitoring import ManualClock, Monitor, MonitorConfig, RequestInputs
from monitoring.input_histograms import NUM_BINS, InputHistograms, bin_edges_s, bin_of_ns, count_inputs, first_slow_bin
from monitoring.inputs import (
    NUM_COMBINATIONS, NUM_VALUES, VALUES, images_bucket, inputs_of_code, pixels_bucket, tokens_bucket,
)
from monitoring_traffic import lognormal_ns

ENCODINGS = ("jpeg", "png", "raw_uint8")
STALL_NS = 172_000_000
RATE = 400


def inputs_of(encoding: str, pixels: int = 640 * 480, protocol: str = "native") -> RequestInputs:
    return RequestInputs.of(largest_image_pixels=pixels, image_encoding=encoding, num_text_tokens=None,
                            num_images=1, priority="normal", protocol=protocol)


INPUTS = tuple(inputs_of(e) for e in ENCODINGS)

Slowdown = Callable[[np.random.Generator, np.ndarray, np.ndarray], np.ndarray]
"""``slowdown(rng, encoding_index, vision_ns) -> vision_ns`` after the shift."""


def play(monitor: Monitor, clock: ManualClock, rng: np.random.Generator, seconds: int,
         slowdown: Slowdown | None = None) -> None:
    """``seconds`` of vision traffic, a third of each encoding, recorded with their inputs."""
    for _ in range(seconds):
        which = rng.integers(0, len(ENCODINGS), RATE)
        decode = lognormal_ns(rng, 0.0005, 0.1, RATE)
        queue = lognormal_ns(rng, 0.002, 0.5, RATE)
        vision = lognormal_ns(rng, 0.020, 0.3, RATE)
        if slowdown is not None:
            vision = slowdown(rng, which, vision)
        total = decode + queue + vision
        for d, q, v, t, w in zip(decode.tolist(), queue.tolist(), vision.tolist(), total.tolist(), which.tolist()):
            monitor.record("vision", {"decode": d, "queue": q, "vision": v, "total": t}, inputs=INPUTS[w])
        clock.advance(1.0)
        monitor.tick()


@pytest.fixture
def frozen(clock: ManualClock, small_config: MonitorConfig) -> tuple[Monitor, ManualClock, np.random.Generator]:
    monitor = Monitor(small_config, clock=clock)
    rng = np.random.default_rng(21)
    play(monitor, clock, rng, 5)
    monitor.mark_ready()
    play(monitor, clock, rng, int(small_config.baseline_s))
    assert monitor.baseline_phase.value == "frozen"
    return monitor, clock, rng


def only_pngs_stall(rng: np.random.Generator, which: np.ndarray, vision: np.ndarray) -> np.ndarray:
    return vision + (which == ENCODINGS.index("png")) * STALL_NS


def everything_slower(rng: np.random.Generator, which: np.ndarray, vision: np.ndarray) -> np.ndarray:
    return vision * 3


def test_a_stall_of_pngs_only_names_image_encoding_png(frozen) -> None:
    monitor, clock, rng = frozen
    play(monitor, clock, rng, 40, only_pngs_stall)

    status = monitor.drift_status()["vision"]
    assert status.is_active
    attribution = status.attribution
    assert attribution is not None and attribution.top_stage == "vision"
    inputs = attribution.inputs
    assert inputs is not None and inputs.stage == "vision"
    named = inputs.named
    assert named is not None and (named.dimension, named.value) == ("image_encoding", "png")
    # A third of the baseline's slow tail was PNG; now every PNG is slow, and they are most of the tail.
    assert named.tail_share_baseline == pytest.approx(1 / 3, abs=0.05)
    assert named.tail_share_window > 0.8
    assert named.share_growth == pytest.approx(named.tail_share_window - named.tail_share_baseline)
    assert named.share_growth > 0.45 and named.z > monitor.config.input_min_z
    assert named.tail_rate_window == pytest.approx(1.0, abs=0.01)  # PNGs got slower ...
    assert named.traffic_share_window == pytest.approx(1 / 3, abs=0.03)  # ... there are not more of them
    by_value = {(s.dimension, s.value): s for s in inputs.shares}
    assert by_value[("image_encoding", "jpeg")].share_growth < 0
    # Dimensions with one value seen cannot move: every request of this route is one native image.
    assert by_value[("protocol", "native")].share_growth == pytest.approx(0.0, abs=1e-9)

    view = monitor.drift_view()["routes"]["vision"]
    assert view["attributed_input"] == {"stage": "vision", "dimension": "image_encoding", "value": "png",
                                        "share_growth": pytest.approx(named.share_growth)}
    assert view["attribution"]["inputs"]["named"]["value"] == "png"


def test_the_named_input_value_is_exported_beside_the_stage(frozen) -> None:
    monitor, clock, rng = frozen
    registry = CollectorRegistry()
    monitor.register(registry)
    play(monitor, clock, rng, 40, only_pngs_stall)

    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    attributed = [s.labels for s in families["mmserve_drift_attributed"].samples]
    assert attributed == [{"route": "vision", "stage": "vision"},
                          {"route": "vision", "stage": "vision", "dimension": "image_encoding", "value": "png"}]
    growth = {(s.labels["dimension"], s.labels["value"]): s.value
              for s in families["mmserve_drift_tail_share_growth"].samples}
    assert max(growth, key=growth.get) == ("image_encoding", "png")
    assert set(growth) <= set(VALUES)


def test_a_slowdown_of_every_request_names_no_input_value(frozen) -> None:
    monitor, clock, rng = frozen
    play(monitor, clock, rng, 40, everything_slower)

    status = monitor.drift_status()["vision"]
    assert status.is_active and status.attribution is not None and status.attribution.top_stage == "vision"
    inputs = status.attribution.inputs
    assert inputs is not None and inputs.named is None
    assert max(abs(s.share_growth) for s in inputs.shares) < 0.05
    # Every value's own tail rate rose alike: that is what "spread evenly" looks like.
    rates = [s.tail_rate_window for s in inputs.shares if s.dimension == "image_encoding"]
    assert min(rates) > 0.8 and max(rates) - min(rates) < 0.03
    assert monitor.drift_view()["routes"]["vision"]["attributed_input"] is None


def test_stationary_traffic_names_no_input_value(frozen) -> None:
    monitor, clock, rng = frozen
    named = []
    for _ in range(10):
        play(monitor, clock, rng, 10)
        attribution = monitor.drift_status()["vision"].attribution
        assert attribution is not None and attribution.inputs is not None
        named.append(attribution.inputs.named)
    assert named == [None] * 10


def test_memory_does_not_grow_with_the_values_clients_send(clock: ManualClock, small_config: MonitorConfig) -> None:
    monitor = Monitor(small_config, clock=clock)
    seen = set()
    for i in range(2000):
        inputs = RequestInputs.of(largest_image_pixels=i * 9973, image_encoding=f"format-{i}", num_text_tokens=i,
                                  num_images=i % 7, priority=f"p{i}", protocol=f"proto{i}")
        seen.add(inputs.code)
        monitor.record("vision", {"vision": 1_000_000 + i, "total": 2_000_000 + i}, inputs=inputs)
    clock.advance(1.0)
    monitor.tick()
    assert all(0 <= code < NUM_COMBINATIONS for code in seen)
    assert {RequestInputs.of(largest_image_pixels=1, image_encoding="x", num_text_tokens=None, num_images=1,
                             priority="urgent", protocol="grpc").labels()[d] for d in ("image_encoding", "priority",
                                                                                        "protocol")} == {"other"}
    assert monitor.num_input_histograms == 2  # (vision, vision) and (vision, total), whatever the values


def test_records_without_inputs_keep_no_histograms(clock: ManualClock, small_config: MonitorConfig) -> None:
    monitor = Monitor(small_config, clock=clock)
    monitor.record("text", {"text": 1_000_000, "total": 2_000_000})
    monitor.record("text", {"text": 1_000_000, "total": 2_000_000}, inputs="not inputs")  # type: ignore[arg-type]
    clock.advance(1.0)
    monitor.tick()
    assert monitor.num_input_histograms == 0


@pytest.mark.parametrize(("pixels", "label"), [(None, "unknown"), (1, "0-0.25MP"), (250_000, "0-0.25MP"),
                                               (250_001, "0.25-1MP"), (1920 * 1080, "1-4MP"),
                                               (3840 * 2160, "4-16MP"), (7680 * 4320, "16MP+")])
def test_pixel_buckets(pixels: int | None, label: str) -> None:
    assert pixels_bucket(pixels) == label
    assert pixels_bucket(pixels, has_image=False) == "none"


def test_token_and_image_buckets() -> None:
    assert [tokens_bucket(n) for n in (None, 0, 1, 16, 17, 64, 65, 256, 257)] == [
        "none", "0", "1-16", "1-16", "17-64", "17-64", "65-256", "65-256", "257+"]
    assert [images_bucket(n) for n in range(7)] == ["0", "1", "2", "3", "4+", "4+", "4+"]


def test_a_request_without_image_has_no_encoding_or_size() -> None:
    inputs = RequestInputs.of(largest_image_pixels=None, image_encoding=None, num_text_tokens=12, num_images=0,
                              priority="high", protocol="openai")
    assert inputs.labels() == {"image_pixels": "none", "image_encoding": "none", "text_tokens": "1-16",
                               "images": "0", "priority": "high", "protocol": "openai", "engine": "0"}
    assert inputs is RequestInputs.of(largest_image_pixels=None, image_encoding=None, num_text_tokens=9, num_images=0,
                                      priority="high", protocol="openai")  # interned: one object per combination


def test_bins_are_log_spaced_from_10_us_to_100_s() -> None:
    edges_s = bin_edges_s()
    assert edges_s.size == NUM_BINS and edges_s[0] == 0 and edges_s[1] == pytest.approx(1e-5)
    assert edges_s[-1] == pytest.approx(100.0)
    inside_ns = np.rint(np.sqrt(edges_s[1:-1] * edges_s[2:]) * 1e9)  # the middle of each bounded bin
    assert bin_of_ns(inside_ns).tolist() == list(range(1, NUM_BINS - 1))
    assert bin_of_ns(np.array([0, 9_999, 10**12])).tolist() == [0, 0, NUM_BINS - 1]
    # The slow tail starts at the edge nearest the threshold, never more than 10^(1/16) away.
    for threshold_s in (2e-6, 1e-4, 0.02, 0.0237, 0.172, 3.0, 500.0):
        edge_s = edges_s[first_slow_bin(threshold_s)]
        assert 10 ** (-1 / 16) - 1e-9 <= edge_s / min(max(threshold_s, 1e-5), 100.0) <= 10 ** (1 / 16) + 1e-9


def test_counts_match_a_per_sample_count_and_slide_with_the_window() -> None:
    rng = np.random.default_rng(3)
    codes = rng.choice([inputs.code for inputs in INPUTS] + [-1], 5000)
    values_ns = lognormal_ns(rng, 0.01, 1.0, 10_000).reshape(5000, 2)  # (R, S)
    counts = count_inputs(codes, values_ns)
    assert counts.shape == (2, NUM_VALUES, NUM_BINS)
    png = VALUES.index(("image_encoding", "png"))
    is_png = codes == INPUTS[1].code
    expected = np.bincount(bin_of_ns(values_ns[is_png, 1]), minlength=NUM_BINS)
    assert counts[1, png].tolist() == expected.tolist()
    # Each dimension counts every sample with inputs once.
    assert counts[0, VALUES.index(("images", "1"))].sum() == (codes >= 0).sum()

    histograms = InputHistograms(num_sub_windows=3)
    histograms.add(counts[0])
    histograms.rotate(1, into_baseline=True)
    histograms.add(counts[1])
    assert histograms.window().sum() == counts.sum() and histograms.baseline.sum() == counts[0].sum()
    histograms.rotate(3, into_baseline=False)  # both sub-windows leave the window
    assert histograms.window().sum() == 0 and histograms.baseline.sum() == counts[0].sum()


def test_every_code_looks_up_the_interned_inputs_it_numbers():
    """A record crossing between processes carries its inputs' code; the receiver's lookup is the sender's object."""
    sent = RequestInputs.of(largest_image_pixels=224 * 224, image_encoding="jpeg", num_text_tokens=9, num_images=1,
                            priority="high", protocol="openai")
    assert inputs_of_code(sent.code) is sent
    seen = {inputs_of_code(code) for code in range(NUM_COMBINATIONS)}
    assert len(seen) == NUM_COMBINATIONS and {inputs.code for inputs in seen} == set(range(NUM_COMBINATIONS))
    for bad in (-1, NUM_COMBINATIONS, 1.0, "3", True):
        with pytest.raises(ValueError, match="no RequestInputs code"):
            inputs_of_code(bad)  # type: ignore[arg-type]


def test_the_engine_is_a_dimension_named_by_its_number_up_to_eight_then_other() -> None:
    """Several engines (server.workers.engine_dispatch): a stall on one engine is attributed to it."""
    def of_engine(engine: int) -> RequestInputs:
        return RequestInputs.of(largest_image_pixels=None, image_encoding=None, num_text_tokens=3, num_images=0,
                                priority="normal", protocol="native", engine=engine)

    assert [of_engine(engine).labels()["engine"] for engine in (0, 1, 7, 8, 63)] == ["0", "1", "7", "other", "other"]
    assert inputs_of_code(of_engine(5).code) is of_engine(5)
    assert of_engine(0) != of_engine(1)
