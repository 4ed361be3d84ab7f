"""The synthetic preset: seeded draws of each distribution, towers that sleep them, answers that are deterministic."""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest
import torch

from models.loading.repository import build_preset
from models.families.synthetic import ServiceTime, ServiceTimeSampler, SyntheticServiceTimes


@pytest.mark.parametrize("distribution, spread", [("constant", 0.0), ("lognormal", 0.5), ("uniform", 0.5)])
def test_draws_are_seeded_and_centred_on_the_median(distribution, spread):
    sampler, twin = (ServiceTimeSampler(ServiceTime(20.0, distribution, spread), seed=3) for _ in range(2))
    draws = [sampler.draw_ms() for _ in range(4000)]
    assert draws == [twin.draw_ms() for _ in range(4000)]
    assert statistics.median(draws) == pytest.approx(20.0, rel=0.05)
    if distribution == "uniform":
        assert 10.0 <= min(draws) and max(draws) <= 30.0
    if distribution == "constant":
        assert set(draws) == {20.0}


def test_bad_service_times_are_refused():
    with pytest.raises(ValueError, match="distribution"):
        ServiceTime(10.0, "gamma")
    with pytest.raises(ValueError, match="negative"):
        ServiceTime(10.0, "uniform", 1.5)


def test_the_towers_sleep_their_draws_and_answer_deterministically():
    times = SyntheticServiceTimes(vision=ServiceTime(30.0, "constant", 0.0), text=ServiceTime(5.0, "constant", 0.0))
    bundle = build_preset("synthetic", service_times=times)
    twin = build_preset("synthetic", service_times=times)
    size = bundle.config.preprocess.input_size
    images = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (2, size, size, 3), dtype=np.uint8))
    started = time.perf_counter()
    segments = bundle.model.encode_images(images)
    assert time.perf_counter() - started >= 0.030  # one draw per batch, slept
    torch.testing.assert_close(segments[0].pooled, twin.model.encode_images(images[:1])[0].pooled)
    assert bundle.fingerprint == twin.fingerprint and bundle.has_random_weights
    with pytest.raises(ValueError, match="only 'synthetic'"):
        build_preset("tiny", service_times=times)


def test_the_vision_tower_pools_before_normalising_and_gives_what_normalising_every_pixel_gives():
    """The shortcut (normalise the pooled means) against the encoder's own path (normalise, then ``features``)."""
    from models.vision import UInt8VisionEncoder

    times = SyntheticServiceTimes(vision=ServiceTime(0.0, "constant", 0.0), text=ServiceTime(0.0, "constant", 0.0))
    vision = build_preset("synthetic", service_times=times).model.vision
    size = vision.input_size
    images = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (3, size, size, 3), dtype=np.uint8))
    with torch.inference_mode():
        shortcut = vision(images)
        general = UInt8VisionEncoder.forward(vision, images)
    assert shortcut.tokens.shape == general.tokens.shape == (3, vision.num_tokens, vision.embed_dim)
    torch.testing.assert_close(shortcut.tokens, general.tokens, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shortcut.pooled, general.pooled, rtol=1e-5, atol=1e-6)
    assert not torch.equal(shortcut.tokens[0], shortcut.tokens[1])  # the images differ, and so do their tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_text_tower_gives_the_masked_mean_of_its_table_rows(dtype):
    """float32 on the CPU computes in numpy, other dtypes in torch: both are the embedding rows and their masked mean."""
    times = SyntheticServiceTimes(vision=ServiceTime(0.0, "constant", 0.0), text=ServiceTime(0.0, "constant", 0.0))
    text = build_preset("synthetic", service_times=times).model.text.to(dtype)
    input_ids = torch.tensor([[5, 9, 11, 0], [7, 3, 0, 0]])  # right-padded
    attention_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    with torch.inference_mode():
        tokens, pooled = text.encode(input_ids, attention_mask)
        table = text.model.weight
    assert tokens.dtype == pooled.dtype == dtype
    torch.testing.assert_close(tokens, table[input_ids])
    expected = torch.stack([table[[5, 9, 11]].float().mean(dim=0), table[[7, 3]].float().mean(dim=0)]).to(dtype)
    torch.testing.assert_close(pooled, expected)
