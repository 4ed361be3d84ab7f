"""The server's answers do not depend on which backend runs the cross-attention.

The Triton kernel runs on the CPU under ``TRITON_INTERPRET=1`` (set here, at
launch time, which is when the kernels package decides).
"""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

from models.repository import build_preset


def _png(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (40, 30, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_triton_and_torch_backends_give_the_same_answers(monkeypatch, live_server_factory, tiny_server):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    triton_bundle = build_preset("tiny", seed=0, backend="triton")
    assert triton_bundle.model.fusion.backend == "triton"
    bodies = [{"text": "a kite over the beach", "image": {"b64": _png(1)}},
              {"text": "x", "image": {"b64": _png(2)}},
              {"text": "a longer question about what the picture shows", "image": {"b64": _png(3)}}]
    with live_server_factory(bundle=triton_bundle) as triton_server, triton_server.client() as triton_client, \
            tiny_server.client() as torch_client:
        for body in bodies:
            answer = triton_client.post("/v1/infer", json=body)
            assert answer.status_code == 200, answer.text
            with_triton = answer.json()
            with_torch = torch_client.post("/v1/infer", json=body).json()
            assert with_triton["model"]["fingerprint"] == with_torch["model"]["fingerprint"]
            np.testing.assert_allclose(with_triton["fused_embedding"], with_torch["fused_embedding"],
                                       rtol=0, atol=1e-5)
            assert abs(with_triton["score"] - with_torch["score"]) <= 1e-5
