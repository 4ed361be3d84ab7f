"""The server's answers do not depend on which backend runs the cross-attention.

The Triton kernel runs on the CPU under ``TRITON_INTERPRET=1`` (set here, at
launch time, which is when the kernels package decides).
"""



from __future__ import annotations

import numpy as np

from encoded_images import encoded_image_b64
from models.loading.repository import build_preset


def test_triton_and_torch_backends_give_the_same_answers(monkeypatch, live_server_factory, tiny_server):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    triton_bundle = build_preset("tiny", seed=0, backend="triton")
    assert triton_bundle.model.fusion.backend == "triton"
    texts = ["a kite over the beach", "x", "a longer question about what the picture shows"]
    bodies = [{"text": text, "image": {"b64": encoded_image_b64(seed, (30, 40))}}
              for seed, text in enumerate(texts, start=1)]
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
