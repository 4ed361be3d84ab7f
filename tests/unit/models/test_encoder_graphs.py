"""TorchScript graphs of the encoders: same answers as eager, or no graph at all."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models.graphs import trace
from models.loading.repository import build_preset


@pytest.fixture
def tiny_model():
    """A fresh tiny model per test: tracing changes which forward the encoders run."""
    return build_preset("tiny", seed=0).model


def _images(batch_size: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch_size, 32, 32, 3), dtype=torch.uint8, generator=generator)


def test_both_encoders_of_the_tiny_model_trace(tiny_model):
    outcomes = tiny_model.trace_encoders()
    assert [(o.encoder, o.is_traced, o.reason) for o in outcomes] == [("vision", True, ""), ("text", True, "")]
    assert tiny_model.vision.graph is outcomes[0].graph and tiny_model.text.graph is outcomes[1].graph


@pytest.mark.parametrize("batch_size", [1, 2, 5, 8])
def test_traced_vision_answers_equal_eager_at_every_batch_size(tiny_model, batch_size):
    images = _images(batch_size, seed=batch_size)
    eager = tiny_model.encode_images(images)
    tiny_model.trace_encoders()
    traced = tiny_model.encode_images(images)
    for want, got in zip(eager, traced, strict=True):
        torch.testing.assert_close(got.pooled, want.pooled, rtol=0, atol=1e-6)
        torch.testing.assert_close(got.k, want.k, rtol=0, atol=1e-6)
        torch.testing.assert_close(got.v, want.v, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("texts", "pad_to"), [
    ([[5, 6, 7]], 8),  # padded
    ([[5, 6, 7, 8, 9, 10, 11, 12]], 8),  # unpadded: transformers drops the all-ones mask in eager
    ([[9] * 30, [4, 5], list(range(3, 40))], 64),  # mixed lengths in a longer bucket
])
def test_traced_text_answers_equal_eager_with_and_without_padding(tiny_model, texts, pad_to):
    eager = tiny_model.encode_texts(texts, pad_to=pad_to)
    tiny_model.trace_encoders()
    traced = tiny_model.encode_texts(texts, pad_to=pad_to)
    for want, got in zip(eager, traced, strict=True):
        torch.testing.assert_close(got.pooled, want.pooled, rtol=0, atol=1e-6)
        torch.testing.assert_close(got.q, want.q, rtol=0, atol=1e-6)


def test_tracing_adds_no_weights_to_the_state_dict(tiny_model):
    """The trace shares the eager weights: the fingerprint and a saved repository see no new tensors."""
    before = {name: tensor.data_ptr() for name, tensor in tiny_model.state_dict().items()}
    tiny_model.trace_encoders()
    assert {name: tensor.data_ptr() for name, tensor in tiny_model.state_dict().items()} == before


def test_tracing_twice_keeps_the_first_graphs_and_dropping_them_runs_eager(tiny_model):
    first = [outcome.graph for outcome in tiny_model.trace_encoders()]
    assert [outcome.graph for outcome in tiny_model.trace_encoders()] == first
    tiny_model.drop_encoder_graphs()
    assert tiny_model.vision.graph is None and tiny_model.text.graph is None


class _SignDependent(nn.Module):
    """A forward whose Python branch depends on the data: a trace records only one branch."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (x * 2,) if bool(x.sum() > 0) else (x * 3,)


class _ReturnsText(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[str]:
        return ("not a tensor",)


def test_a_trace_that_disagrees_with_eager_is_not_used():
    module = _SignDependent()
    outcome = trace("toy", module, module.forward, (torch.ones(2),), [(-torch.ones(3),)], torch.float32)
    assert outcome.graph is None
    assert not outcome.is_traced
    assert "disagrees with eager on inputs (3,)" in outcome.reason


def test_a_module_that_cannot_be_traced_is_reported():
    module = _ReturnsText()
    outcome = trace("toy", module, module.forward, (torch.ones(2),), [], torch.float32)
    assert outcome.graph is None
    assert outcome.reason.startswith("tracing failed: ")


def test_a_trace_that_agrees_on_every_probe_is_used():
    module = _SignDependent()
    outcome = trace("toy", module, module.forward, (torch.ones(2),), [(torch.ones(4),), (torch.rand(3) + 1,)],
                    torch.float32)
    assert outcome.is_traced
    (doubled,) = outcome.graph(torch.full((5,), 2.0))
    torch.testing.assert_close(doubled, torch.full((5,), 4.0))
