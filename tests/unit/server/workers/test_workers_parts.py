"""The API-process parts that need no server: frames, pixel slots, the merged /metrics, settings hand-off."""

from __future__ import annotations

import asyncio
import socket
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from PIL import Image
from pydantic import SecretStr

from monitoring import Monitor
from monitoring.serving_metrics import ServingMetrics
from router.intake import IntakeItem
from router.item_facts import ItemFacts
from cache import SegmentCache
from router.segments import ImageContent, SegmentCatalog
from server.errors import ApiError
from server.settings import Settings
from server.workers import handoff
from encoded_images import encode
from server.workers.raw_pixels_sent import raw_pixels_left_behind
from server.workers.frames import encode_frame, read_frame, read_frame_blocking
from server.workers.metrics_snapshots import exemplars_of
from server.workers.metrics_view import merge_expositions
from server.workers.pixel_slots import AttachedSlots, PixelSlots, pixel_slots_of


def test_a_frame_carries_an_item_both_ways():
    item = IntakeItem("id-1", text="a red bicycle", images=(ImageContent(encoded=b"\xff\xd8jpeg"),))
    left, right = socket.socketpair()
    with left, right:
        left.sendall(encode_frame(("run", 7, [item], 123)))
        assert read_frame_blocking(right) == ("run", 7, [item], 123)

        async def read_async() -> tuple:
            reader = asyncio.StreamReader()
            reader.feed_data(encode_frame(("ok", 8, [1.5])))
            reader.feed_eof()
            return await read_frame(reader)

        assert asyncio.run(read_async()) == ("ok", 8, [1.5])


def test_raw_pixels_decoded_into_a_slot_do_not_travel_to_the_engine():
    """Only raw pixels with a slot stay behind (as key and length); the engine may still decode the others.
    Without the peek's keys an encoded image keeps its bytes."""
    catalog = SegmentCatalog(SegmentCache(image_budget_bytes=1 << 20, text_budget_bytes=1 << 20), "fp", "size=32")
    raw = ImageContent(pixels=bytes(300 * 400 * 3), shape=(300, 400, 3))
    jpeg = ImageContent(encoded=b"\xff\xd8jpeg")
    items = [IntakeItem("decoded", images=(raw, jpeg), images_as_list=True), IntakeItem("held", images=(raw,))]
    sent = raw_pixels_left_behind(items, [[0, 1], [None]], catalog)
    assert sent[0].images == (raw.left_behind(catalog.image_key(raw)), jpeg)
    assert sent[0].images_as_list and sent[0].request_id == "decoded"
    assert sent[1] is items[1], "no slot: the engine may decode it, so its bytes go"
    assert len(encode_frame(("run", 1, sent[:1]))) < 1000 < raw.num_bytes
    assert raw_pixels_left_behind(items[1:], [[None]], catalog) == items[1:]


def test_pixel_slots_are_free_once_the_engine_copied_them_out_and_run_out_with_a_paced_503():
    slots = PixelSlots((4, 4, 3), num_slots=2)
    attached = AttachedSlots(slots.name, (4, 4, 3))
    try:
        pixels = [np.arange(48, dtype=np.uint8).reshape(4, 4, 3), np.full((4, 4, 3), 7, np.uint8)]
        first, second = slots.put(pixels)
        assert (first, second) == (0, 1) and slots.num_held == 2
        with pytest.raises(ApiError) as full:
            slots.put(pixels[:1])
        assert (full.value.status, full.value.code) == (503, "overloaded")
        assert full.value.retry_after_s == pytest.approx(slots.mean_hold_s / 2)  # one slot short, at the pace
        np.testing.assert_array_equal(attached.take_out(second), pixels[1])
        assert slots.num_held == 1, "copied out: the slot is free again, with no answer from the engine"
        assert slots.put(pixels[:1]) == [second]
        time.sleep(0.05)  # both now wait 50 ms or more for their copy
        np.testing.assert_array_equal(attached.take_out(first), pixels[0])
        np.testing.assert_array_equal(attached.take_out(second), pixels[0])
        assert slots.put(pixels) == [0, 1], "lowest first: pages are touched only as deep as the peak in transit"
        assert slots.mean_hold_s > 0.004, "the 50 ms the slots waited for their copy moved the pace"
        slots.give_back([0, 1])  # never sent
        assert slots.num_held == 0
        with pytest.raises(ValueError, match="slot holds"):
            slots.put([np.zeros((5, 4, 3), np.uint8)])
    finally:
        attached.close()
        slots.close()


def test_pixel_slots_follow_the_image_lanes_queue_bounds_unless_set():
    assert pixel_slots_of(Settings()) == 4 * 256
    assert pixel_slots_of(Settings(max_images_per_request=2, vision_max_queue_size=8, fusion_max_queue_size=3)) == 16
    assert pixel_slots_of(Settings(pixel_slots=4)) == 4
    with pytest.raises(ValueError, match="max_images_per_request"):
        Settings(pixel_slots=3)


def _exposition(requests: int, depth: float, latencies_s: list[float]) -> tuple[str, dict]:
    registry = CollectorRegistry()
    Counter("mmserve_requests_total", "r", ["route", "code"], registry=registry).labels("text", "200").inc(requests)
    Gauge("mmserve_queue_depth", "d", ["lane"], registry=registry).labels("text").set(depth)
    monitor = Monitor()
    monitor.register(registry)
    for latency_s in latencies_s:
        monitor.record("text", {"total": int(latency_s * 1e9)})
    monitor.tick()
    return generate_latest(registry).decode(), monitor.digests_view()


def test_merged_metrics_sum_counters_keep_the_largest_gauge_and_merge_digests():
    text_a, digests_a = _exposition(3, 0, [0.001] * 300)
    text_b, digests_b = _exposition(5, 7, [0.100] * 100)
    families = {family.name: family for family in merge_expositions([text_a, text_b], [digests_a, digests_b])}
    value = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
             for family in families.values() for sample in family.samples}
    assert value[("mmserve_requests_total", (("code", "200"), ("route", "text")))] == 8
    assert value[("mmserve_queue_depth", (("lane", "text"),))] == 7
    stage = (("route", "text"), ("stage", "total"))
    assert value[("mmserve_stage_latency_seconds_count", stage)] == 400
    # 300 fast and 100 slow samples: the merged median is fast, the merged P99 slow (neither process's alone).
    assert value[("mmserve_stage_latency_seconds", (("quantile", "0.5"), *stage))] == pytest.approx(0.001, rel=0.05)
    assert value[("mmserve_stage_latency_seconds", (("quantile", "0.99"), *stage))] == pytest.approx(0.1, rel=0.05)


class _Families:
    def __init__(self, families: list) -> None:
        self._families = families

    def collect(self) -> list:
        return self._families


def test_merged_metrics_keep_each_buckets_latest_exemplar_for_openmetrics_only():
    processes, monitors = [ServingMetrics(CollectorRegistry()) for _ in range(2)], [Monitor(), Monitor()]
    for metrics, monitor, route in zip(processes, monitors, ("text", "vision")):
        monitor.register(metrics.registry)
        monitor.record(route, {"total": 2_000_000, "decode": 1_000_000})
        monitor.tick()
        metrics.requests_total.labels(route=route, code="200").inc()
    first, second = (metrics.request_duration_seconds.labels(route="text") for metrics in processes)
    first.observe(0.031, {"trace_id": "a" * 32})  # both in the 0.05 bucket: the second is the later
    first.observe(0.9, {"trace_id": "c" * 32})  # only the first process has one in a slow bucket
    second.observe(0.032, {"trace_id": "b" * 32})
    texts = [generate_latest(metrics.registry).decode() for metrics in processes]
    rows = [row for metrics in processes for row in exemplars_of(metrics.request_duration_seconds)]
    assert len(rows) == 3
    view = CollectorRegistry(auto_describe=False)
    view.register(_Families(merge_expositions(texts, [monitor.digests_view() for monitor in monitors], rows)))
    plain = generate_latest(view).decode()
    assert "trace_id" not in plain and 'mmserve_request_duration_seconds_count{route="text"} 3.0' in plain
    assert "# TYPE mmserve_requests_created gauge" in plain  # the classic format as one process writes it
    # The strict OpenMetrics parser takes the whole merged view: series grouped, _created in their families.
    parsed = {family.name: family for family in parse_openmetrics(generate_openmetrics(view).decode())}
    assert {"mmserve_requests", "mmserve_stage_latency_seconds"} <= parsed.keys()
    assert "mmserve_requests_created" not in parsed
    family = parsed["mmserve_request_duration_seconds"]
    exemplars = {sample.labels["le"]: sample.exemplar.labels["trace_id"] for sample in family.samples
                 if sample.name.endswith("_bucket") and sample.exemplar is not None}
    assert exemplars == {"0.05": "b" * 32, "1.0": "c" * 32}
    buckets = {sample.labels["le"]: sample.value for sample in family.samples if sample.name.endswith("_bucket")}
    assert buckets["0.05"] == 2 and buckets["+Inf"] == 3


def test_settings_travel_to_the_children_whole_secrets_included(monkeypatch):
    settings = Settings(preset="tiny", api_workers=2, api_keys=SecretStr("k1,k2"), max_batch_size=3)
    monkeypatch.setenv(handoff.SETTINGS_VARIABLE, handoff.settings_json(settings))
    received = handoff.settings_from_environment()
    assert received == settings
    assert received.api_keys.get_secret_value() == "k1,k2"


def test_an_encoded_image_decoded_into_a_slot_goes_as_its_key_length_and_header():
    """With the peek's keys, a decoded JPEG's file stays here: the engine keys and counts it as its bytes do, and
    where it will not ask the cache (key ``None``) nothing is hashed; one without a slot keeps its bytes."""
    catalog = SegmentCatalog(SegmentCache(image_budget_bytes=1 << 20, text_budget_bytes=1 << 20), "fp", "size=32")
    jpeg = ImageContent(encoded=encode(Image.new("RGB", (40, 30), (200, 10, 10)), "JPEG") + bytes(5000))  # a file of some size
    held = ImageContent(encoded=b"\x89PNG\r\n\x1a\n" + bytes(40))
    items = [IntakeItem("keyed", images=(jpeg, held), protocol="kserve_v2"), IntakeItem("unasked", images=(jpeg,))]
    keys = [[catalog.image_key(jpeg), catalog.image_key(held)], [None]]
    sent = raw_pixels_left_behind(items, [[0, None], [1]], catalog, keys)
    keyed, unasked = sent[0].images[0], sent[1].images[0]
    assert sent[0].images[1] is held, "no slot: the engine may decode it, so its bytes go"
    assert keyed.encoded == b"" and catalog.image_key(keyed) == catalog.image_key(jpeg)
    assert unasked.pixels_key is None
    with pytest.raises(ValueError, match="without its key"):
        catalog.image_key(unasked)
    for item, behind in zip(items, sent):
        assert ItemFacts.sent(behind) == ItemFacts.sent(item)
    assert ItemFacts.sent(sent[1]).largest_image_pixels == 40 * 30 and keyed.num_bytes == jpeg.num_bytes
    assert len(encode_frame(("run", 1, sent))) < 1000 < 2 * jpeg.num_bytes
