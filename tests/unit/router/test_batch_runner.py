"""A failing batch is split down to the failing item; the others still get answers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.device import DeviceWork

from router.errors import ItemFailedError
from router.lanes import LaneSettings
from router.request import InferenceRequest, Route
from router.runner import BatchRunner, text_length_buckets

POISON = 250  # a token id that makes the wrapped model raise


class PoisonableModel:
    """Wraps the real model; raises when a batch contains the poison token."""

    def __init__(self, model):
        self._model = model
        self.num_text_calls = 0

    def __getattr__(self, name):
        return getattr(self._model, name)

    def encode_texts(self, token_ids, **kwargs):
        self.num_text_calls += 1
        if any(POISON in ids for ids in token_ids):
            raise RuntimeError("poisoned row")
        return self._model.encode_texts(token_ids, **kwargs)


def _request(i: int, poisoned: bool = False) -> InferenceRequest:
    ids = (2, 50 + i, POISON if poisoned else 60, 3)
    return InferenceRequest(request_id=f"r{i}", token_ids=ids, deadline_ns=10**18)


@pytest.fixture
def runner(tiny_bundle):
    lanes = {route: LaneSettings(max_batch_size=8) for route in Route}
    runner = BatchRunner(tiny_bundle, lanes)
    runner.model = PoisonableModel(tiny_bundle.model)
    return runner


def test_one_poisoned_item_fails_alone(runner, tiny_bundle):
    requests = [_request(i, poisoned=(i == 5)) for i in range(8)]
    outcomes = runner.run(Route.TEXT, requests)
    assert [isinstance(o, ItemFailedError) for o in outcomes] == [i == 5 for i in range(8)]
    healthy = [o for o in outcomes if not isinstance(o, Exception)]
    alone = runner.run(Route.TEXT, [requests[0]])[0]
    np.testing.assert_allclose(healthy[0].text_embedding, alone.text_embedding, atol=1e-5)
    # 8 -> 4+4 -> 2+2 -> 1+1: the split is logarithmic, not one call per item.
    assert runner.model.num_text_calls <= 1 + 2 + 2 + 2 + 1


def test_padding_to_a_warmed_shape_does_not_change_answers(runner):
    three = runner.run(Route.TEXT, [_request(i) for i in range(3)])  # padded to 4
    for i, outcome in enumerate(three):
        alone = runner.run(Route.TEXT, [_request(i)])[0]
        np.testing.assert_allclose(outcome.text_embedding, alone.text_embedding, atol=1e-5)
        assert outcome.batch_size == 3


def test_length_buckets_cover_the_limit():
    assert text_length_buckets(64) == (8, 16, 32, 64)
    assert text_length_buckets(100) == (8, 16, 32, 64, 100)


def test_a_failing_request_with_several_images_fails_alone_and_the_others_keep_their_images(runner, tiny_bundle):
    size = tiny_bundle.config.preprocess.input_size

    def fusion(i: int, num_images: int, poisoned: bool = False) -> InferenceRequest:
        images = tuple(np.full((size, size, 3), 20 * i + k, np.uint8) for k in range(num_images))
        return InferenceRequest(request_id=f"f{i}", token_ids=_request(i, poisoned).token_ids, images=images,
                                deadline_ns=10**18)

    batch = [fusion(0, 3), fusion(1, 2, poisoned=True), fusion(2, 1), fusion(3, 2)]
    outcomes = runner.run(Route.FUSION, batch)
    assert [isinstance(o, ItemFailedError) for o in outcomes] == [False, True, False, False]
    for request, outcome in zip(batch, outcomes):
        if isinstance(outcome, Exception):
            continue
        alone = runner.run(Route.FUSION, [request])[0]
        assert len(outcome.image_embeddings) == request.num_images
        np.testing.assert_allclose(outcome.fused_embedding, alone.fused_embedding, atol=1e-5)
        for got, want in zip(outcome.image_embeddings, alone.image_embeddings, strict=True):
            np.testing.assert_allclose(got, want, atol=1e-5)


class CountingDeviceWork(DeviceWork):
    """The real DeviceWork, counting its device-to-host copies."""

    def __init__(self, device) -> None:
        super().__init__(device)
        self.num_copies_back = 0

    def to_host(self, tensors):
        self.num_copies_back += 1
        return super().to_host(tensors)


def test_a_mixed_batch_comes_back_in_one_copy_with_the_models_own_answers(tiny_bundle):
    """Fusion rows with 1 and 2 images: every embedding and score equals the model's, from one to_host call."""
    lanes = {route: LaneSettings(max_batch_size=8) for route in Route}
    runner = BatchRunner(tiny_bundle, lanes)
    runner.device_work = CountingDeviceWork(tiny_bundle.model.device)
    size = tiny_bundle.config.preprocess.input_size
    batch = [InferenceRequest(request_id=f"m{i}", token_ids=_request(i).token_ids, deadline_ns=10**18,
                              images=tuple(np.full((size, size, 3), 40 * i + k, np.uint8) for k in range(i + 1)))
             for i in range(2)]
    results = runner.run_batch(Route.FUSION, batch)
    assert runner.device_work.num_copies_back == 1
    model = tiny_bundle.model
    for request, result in zip(batch, results, strict=True):
        with torch.no_grad():
            images = model.encode_images(torch.from_numpy(np.stack(request.images)))
            text = model.encode_texts([request.token_ids], pad_to=runner.length_bucket(len(request.token_ids)),
                                      pad_token_id=runner.pad_token_id)
            fused = model.fuse_multi([images], text)[0]
        for got, segment in zip(result.image_embeddings, images, strict=True):
            assert got.dtype == np.float32 and got.shape == tuple(segment.pooled.shape)
            np.testing.assert_allclose(got, segment.pooled.float().numpy(), atol=1e-5)
        np.testing.assert_allclose(result.text_embedding, text[0].pooled.float().numpy(), atol=1e-5)
        np.testing.assert_allclose(result.fused_embedding, fused.fused.float().numpy(), atol=1e-5)
        if fused.score is None:
            assert result.score is None
        else:
            assert result.score == pytest.approx(float(fused.score), abs=1e-5)


def _ready_runner(bundle, cold: list[tuple]) -> BatchRunner:
    """A runner with batches of up to 4, warmed up and ready: a shape warm-up did not run lands in ``cold``."""
    runner = BatchRunner(bundle, {route: LaneSettings(max_batch_size=4) for route in Route},
                         on_cold_shape=cold.append)
    runner.warm_up()
    runner.mark_ready()
    return runner


def test_on_the_cpu_a_text_batch_runs_at_its_longest_text_and_answers_as_at_its_bucket(tiny_bundle):
    cold: list[tuple] = []
    runner = _ready_runner(tiny_bundle, cold)
    widths: list[int] = []
    hook = tiny_bundle.model.text.register_forward_pre_hook(lambda module, args: widths.append(args[0].shape[1]))
    try:
        requests = [InferenceRequest(f"r{n}", token_ids=(2, *range(10, 10 + n), 3), deadline_ns=10**18)
                    for n in (9, 3)]  # 11 and 5 tokens: bucket 16
        outcomes = runner.run(Route.TEXT, requests)
        assert widths == [11]  # not 16
        assert runner.length_bucket(11) == 16 and cold == []  # the warmed bucket's shape, not a cold one
        at_bucket = tiny_bundle.model.encode_texts([r.token_ids for r in requests], pad_to=16,
                                                    pad_token_id=runner.pad_token_id)
    finally:
        hook.remove()
    for outcome, segment in zip(outcomes, at_bucket):
        np.testing.assert_allclose(outcome.text_embedding, segment.pooled.float().numpy(), atol=1e-5)


def test_on_the_cpu_a_batch_runs_as_the_rows_it_has_and_answers_as_when_padded(tiny_bundle):
    """3 texts and 3 images run as 3 rows, not the warmed 4: no cold shape, the answers of a padded batch."""
    cold: list[tuple] = []
    runner = _ready_runner(tiny_bundle, cold)
    size = tiny_bundle.config.preprocess.input_size
    requests = [InferenceRequest(f"f{i}", token_ids=_request(i).token_ids, deadline_ns=10**18,
                                 images=(np.full((size, size, 3), 30 * i, np.uint8),)) for i in range(3)]
    rows: dict[str, list[int]] = {"vision": [], "text": []}
    hooks = [tiny_bundle.model.vision.register_forward_pre_hook(lambda m, args: rows["vision"].append(len(args[0]))),
             tiny_bundle.model.text.register_forward_pre_hook(lambda m, args: rows["text"].append(len(args[0])))]
    try:
        outcomes = runner.run(Route.FUSION, requests)
    finally:
        for hook in hooks:
            hook.remove()
    assert rows == {"vision": [3], "text": [3]} and cold == []
    assert runner.batch_rows("text", 3, runner.lane_settings[Route.TEXT]) == 3
    padded = runner.run(Route.FUSION, requests + [requests[-1]])[:3]  # the 4 rows the batch was padded to before
    for got, want in zip(outcomes, padded, strict=True):
        np.testing.assert_allclose(got.text_embedding, want.text_embedding, atol=1e-5)
        np.testing.assert_allclose(got.image_embeddings[0], want.image_embeddings[0], atol=1e-5)
        np.testing.assert_allclose(got.fused_embedding, want.fused_embedding, atol=1e-5)


def test_an_encoder_replaying_captured_shapes_still_gets_warmed_batch_sizes(tiny_bundle, monkeypatch):
    lanes = {route: LaneSettings(max_batch_size=8) for route in Route}
    runner = BatchRunner(tiny_bundle, lanes)
    monkeypatch.setattr(type(tiny_bundle.model.text), "runs_captured_shapes", property(lambda self: True))
    assert runner.batch_rows("text", 5, lanes[Route.TEXT]) == 8
    assert runner.batch_rows("vision", 5, lanes[Route.VISION]) == 5  # the vision tower replays none
    monkeypatch.setattr(type(tiny_bundle.model.vision), "runs_captured_shapes", property(lambda self: True))
    assert runner.batch_rows("vision", 3, lanes[Route.VISION]) == 4
