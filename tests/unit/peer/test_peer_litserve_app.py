"""The LitServe peer serves the same model: same fingerprint, same outputs, same refusals as mmserve.

A comparison between two servers means something only if they compute the
same thing; these tests hold ``benchmarks.peer_litserve_app`` to mmserve's
answers for the same request, through a real LitServe process and through
the API's batch path directly.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from fastapi import HTTPException

from benchmarks.peer_litserve_app import MultimodalLitAPI, PeerOutput
from benchmarks.peer_request import PeerLimits
from benchmarks.harness import ServerProcess, litserve_command, running
from encoded_images import encoded_image_b64
from server.settings import Settings

EMBEDDING_KEYS = ("image_embedding", "text_embedding", "fused_embedding")
JPEG = {"size_px": (96, 64), "fmt": "JPEG", "quality": 90}  # the photos both servers get


@pytest.fixture(scope="module")
def tiny_server(tiny_torch_server) -> object:
    """mmserve on torch, as the peer app runs the towers: the same fingerprint is then a claim these tests hold
    (under ``--runtime auto`` mmserve runs them in ONNX Runtime, another fingerprint by design)."""
    return tiny_torch_server


@pytest.fixture(scope="module")
def litserve_server() -> Iterator[ServerProcess]:
    with running(litserve_command("tiny", max_batch_size=8, max_queue_delay_ms=5.0, is_fast_queue=True),
                 ready_timeout_s=120.0) as server:
        yield server


def test_litserve_app_answers_the_embeddings_mmserve_answers(tiny_server, litserve_server: ServerProcess):
    body = {"text": "a red boat on a quiet lake", "image": {"b64": encoded_image_b64(1, **JPEG)}}
    mmserve = httpx.post(f"{tiny_server.url}/v1/infer", json=body, timeout=60.0)
    litserve = httpx.post(f"{litserve_server.url}/v1/infer", json=body, timeout=60.0, trust_env=False)
    assert mmserve.status_code == 200, mmserve.text
    assert litserve.status_code == 200, litserve.text
    expected, got = mmserve.json(), litserve.json()
    assert got["route"] == expected["route"] == "fusion"
    assert got["model"] == expected["model"]  # same preset, same seed: same fingerprint
    assert got["text"] == expected["text"]
    for key in EMBEDDING_KEYS:
        assert len(got[key]) == len(expected[key])
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-4, atol=1e-5, err_msg=key)
    assert "score" not in got and "score" not in expected  # the preset has no calibrated score


def test_a_truncated_image_is_refused_with_mmserves_status_and_code(tiny_server, litserve_server: ServerProcess):
    data = base64.b64decode(encoded_image_b64(2, **JPEG))
    body = {"text": "cut short", "image": {"b64": base64.b64encode(data[: len(data) // 2]).decode("ascii")}}
    mmserve = httpx.post(f"{tiny_server.url}/v1/infer", json=body, timeout=60.0)
    litserve = httpx.post(f"{litserve_server.url}/v1/infer", json=body, timeout=60.0, trust_env=False)
    assert mmserve.status_code == 400
    assert litserve.status_code == mmserve.status_code
    assert litserve.json()["detail"]["code"] == mmserve.json()["error"]["code"] == "corrupt_image"


def _host(output: PeerOutput) -> dict[str, np.ndarray | float | None]:
    return {"image_embedding": output.image_embedding, "text_embedding": output.text_embedding,
            "fused_embedding": output.fused_embedding, "score": output.score}


def test_a_batch_mixing_routes_gives_each_item_what_it_gets_alone():
    api = MultimodalLitAPI("tiny", 0, PeerLimits(), max_batch_size=8, batch_timeout_s=0.005)
    api.setup("cpu")
    requests = [
        {"text": "only words here"},
        {"image": {"b64": encoded_image_b64(3, **JPEG)}},
        {"text": "a longer text that pads the others in its batch", "image": {"b64": encoded_image_b64(4, **JPEG)}},
    ]
    items = [api.decode_request(request) for request in requests]
    batched = api.unbatch(api.predict(api.batch(items)))
    assert [output.item.route for output in batched] == ["text", "vision", "fusion"]
    assert [output.batch_size for output in batched] == [3, 3, 3]
    for item, in_batch in zip(items, batched):
        alone = _host(api.predict(item))
        for key, value in _host(in_batch).items():
            assert (value is None) == (alone[key] is None), key
            if value is not None:
                np.testing.assert_allclose(value, alone[key], rtol=1e-4, atol=1e-5, err_msg=key)


def test_the_peers_limits_are_mmserves_defaults_and_environment():
    settings = Settings()
    defaults = PeerLimits()
    for field in dataclasses.fields(PeerLimits):
        assert getattr(defaults, field.name) == getattr(settings, field.name), field.name
    environ = {"MMSERVE_MAX_TEXT_CHARS": "12", "MMSERVE_MAX_IMAGE_PIXELS": "34", "MMSERVE_MAX_BATCH_SIZE": "3",
               "MMSERVE_MAX_QUEUE_DELAY_MS": "2.5", "MMSERVE_DEFAULT_TIMEOUT_MS": "700"}
    assert PeerLimits.from_environment(environ) == PeerLimits(12, 34, 3, 2.5, 700)


_RAW_2x2 = base64.b64encode(bytes(2 * 2 * 3)).decode("ascii")


@pytest.mark.parametrize("body", [
    {"text": "x", "image": {"b64": "not base64!"}},
    {"text": "   "},
    {"text": "x" * 100_001},
    {"text": "x", "colour": "red"},
    {},
    {"image": {"uint8": {"shape": [2, 2, 4], "b64": _RAW_2x2}}},
    {"image": {"uint8": {"shape": [2, 3, 3], "b64": _RAW_2x2}}},
    {"image": {"b64": base64.b64encode(b"not an image at all").decode("ascii")}},
], ids=["base64", "empty-text", "long-text", "extra-key", "empty", "raw-shape", "raw-length", "unknown-format"])
def test_the_peer_refuses_what_mmserve_refuses_with_the_same_status_and_code(tiny_server, body):
    api = MultimodalLitAPI("tiny", 0, PeerLimits(), max_batch_size=8, batch_timeout_s=0.005)
    api.setup("cpu")
    mmserve = httpx.post(f"{tiny_server.url}/v1/infer", json=body, timeout=60.0)
    assert 400 <= mmserve.status_code < 500, mmserve.text
    with pytest.raises(HTTPException) as refused:
        api.decode_request(body)
    assert refused.value.status_code == mmserve.status_code
    assert refused.value.detail["code"] == mmserve.json()["error"]["code"]
    assert refused.value.detail["field"] == mmserve.json()["error"]["field"]
