"""The server stops CUDA-graph captures once warm-up is over (``server.runtime.model_loading``)."""

from __future__ import annotations

import asyncio

from models.cuda_graphs import RerunBackend
from models.loading.repository import build_preset
from server.runtime.model_loading import seal_graphs_when_ready


def test_the_server_seals_the_graphs_once_warm_up_is_over():
    bundle = build_preset("tiny")
    vision, text = bundle.model.capture_encoder_graphs(RerunBackend)
    is_ready = iter([False, False, True])
    asyncio.run(seal_graphs_when_ready(bundle, lambda: next(is_ready), poll_interval_s=0.001))
    assert vision.is_sealed and text.is_sealed
    bundle.model.drop_encoder_graphs()
