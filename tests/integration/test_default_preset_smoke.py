"""The default preset (ViT-L/16 + 6-layer text encoder) loads and answers once.

Slow on CPU by nature; it runs once, with a batch cap of 1 so warm-up runs
each shape only once.
"""

from __future__ import annotations

import numpy as np

from encoded_images import encoded_image_b64
from server.settings import Settings


def test_vit_l16_default_answers_a_fusion_request(live_server_runner):
    # --runtime torch: exporting ViT-L/16 to ONNX takes minutes on the suite's 2 shared cores; the same timm ViT
    # code runs on ONNX Runtime in the tiny preset's tests, and `mmserve export --preset vit-l16` exercises it.
    settings = Settings(device="cpu", max_batch_size=1, max_queue_delay_ms=0, runtime="torch")
    assert settings.preset == "vit-l16"
    body = {"text": "a photo of a harbour", "image": {"b64": encoded_image_b64(0, (400, 300), "JPEG")}}
    with live_server_runner(settings) as server, server.client() as client:
        answer = client.post("/v1/infer", json=body)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["route"] == "fusion" and result["model"]["name"] == "vit-l16"
    assert len(result["image_embedding"]) == 1024  # ViT-L width
    assert len(result["text_embedding"]) == len(result["fused_embedding"]) == 384
    assert np.isfinite(result["image_embedding"]).all() and np.isfinite(result["fused_embedding"]).all()
    assert "score" not in result  # random preset towers have no calibrated image-text score
