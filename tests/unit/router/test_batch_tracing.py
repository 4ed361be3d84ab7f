"""The batch record the compute thread makes while tracing is on: shapes, stage order, links."""

from __future__ import annotations

import random

import numpy as np

from router.lanes import LaneSettings
from router.request import InferenceRequest, Route
from router.tracing import BatchTracer, SpanIds, new_span_ids

IMAGE = np.zeros((32, 32, 3), dtype=np.uint8)


def test_new_ids_are_non_zero_and_keep_the_trace():
    ids = new_span_ids(rng=random.Random(1))
    assert ids.trace_id > 0 and ids.span_id > 0 and ids.trace_id < 2**128 and ids.span_id < 2**64
    assert new_span_ids(ids.trace_id).trace_id == ids.trace_id


def test_a_fusion_batch_records_shapes_stages_and_each_request_once():
    first, second = SpanIds(1, 11), SpanIds(2, 22)
    requests = [InferenceRequest(f"r{i}", (1, 2, 3), images=(IMAGE, IMAGE), trace=ids)
                for i, ids in enumerate((first, second, first))]  # two rows of one request: one link
    settings = LaneSettings(max_batch_size=8)
    stage_ns = [{"vision": 5, "text": 3, "fusion": 2}] * 3
    batch = BatchTracer("cpu", 32, random.Random(0)).record(
        Route.FUSION, settings, "image", requests, stage_ns, num_work_items=6, padded_size=8,
        text_width=8, batch_rows=lambda encoder, n: settings.padded_size(n) if encoder == "vision" else n,
        started_ns=1000, elapsed_ns=20, num_failed=0)
    assert batch.links == (first, second)
    # the rows the runner says: 6 images -> 8 (the warmed size), 3 texts as 3
    assert batch.image_shape == (8, 32, 32, 3) and batch.text_shape == (3, 8)
    assert batch.stage_ns == (("vision", 5), ("text", 3), ("fusion", 2))
    assert [batch.stage_started_ns(stage) for stage in ("vision", "text", "fusion", "queue")] == [1000, 1005, 1008, None]


def test_a_text_batch_has_no_image_shape():
    requests = [InferenceRequest("t", (1, 2), trace=None)]
    batch = BatchTracer("cuda:0", 32).record(
        Route.TEXT, LaneSettings(max_batch_size=4), "text", requests, [{"text": 7}], num_work_items=1,
        padded_size=1, text_width=16, batch_rows=lambda encoder, n: n, started_ns=0, elapsed_ns=7, num_failed=0)
    assert batch.image_shape == () and batch.text_shape == (1, 16) and batch.links == ()
    assert batch.device == "cuda:0" and batch.stage_ns == (("text", 7),)
