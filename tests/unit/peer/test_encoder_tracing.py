"""Benchmarks that compare traced compute paths stop when an encoder stays eager."""

from __future__ import annotations

import pytest

from benchmarks.encoder_tracing import EncoderNotTracedError, trace_all_encoders
from models.graphs import TraceOutcome
from models.loading.repository import build_preset


def test_both_encoders_of_the_tiny_model_are_traced():
    model = build_preset("tiny", seed=0).model
    trace_all_encoders(model)
    assert model.vision.graph is not None and model.text.graph is not None


def test_an_encoder_that_stays_eager_stops_the_benchmark(monkeypatch):
    model = build_preset("tiny", seed=0).model
    monkeypatch.setattr(model.text, "trace_graph", lambda: TraceOutcome("text", None, "the trace disagrees"))
    with pytest.raises(EncoderNotTracedError, match="the text encoder did not trace: the trace disagrees"):
        trace_all_encoders(model)
