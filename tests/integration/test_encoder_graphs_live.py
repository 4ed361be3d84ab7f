"""A server running its encoders as TorchScript graphs answers what an eager server answers (both --runtime torch)."""



from __future__ import annotations

import numpy as np

from encoded_images import encoded_image_b64
from models.loading.repository import build_preset


BODIES = [
    {"text": "a kite over the beach", "image": {"b64": encoded_image_b64(1, (64, 48), "JPEG")}},
    {"image": {"b64": encoded_image_b64(2, (64, 48), "JPEG")}},
    {"text": "short"},
    {"text": "a longer question about the picture, for a bigger bucket",
     "image": {"b64": encoded_image_b64(3, (64, 48), "JPEG")}},
]
EMBEDDINGS = ("image_embedding", "text_embedding", "fused_embedding")


def test_traced_and_eager_servers_give_the_same_answers(live_server_factory):
    eager_bundle = build_preset("tiny", seed=0)  # its own model: the setting changes the encoders' forward
    with live_server_factory(runtime="torch", torchscript_encoders=True) as traced_server, \
            live_server_factory(bundle=eager_bundle, runtime="torch", torchscript_encoders=False) as eager_server, \
            traced_server.client() as traced_client, eager_server.client() as eager_client:
        traced_model = traced_server.app.state.mmserve.router.bundle.model
        assert traced_model.vision.graph is not None and traced_model.text.graph is not None
        assert eager_bundle.model.vision.graph is None and eager_bundle.model.text.graph is None
        for body in BODIES:
            traced, eager = traced_client.post("/v1/infer", json=body), eager_client.post("/v1/infer", json=body)
            assert traced.status_code == eager.status_code == 200, (traced.text, eager.text)
            traced_answer, eager_answer = traced.json(), eager.json()
            assert traced_answer["route"] == eager_answer["route"]
            for key in EMBEDDINGS:
                assert (key in traced_answer) == (key in eager_answer)
                if eager_answer.get(key) is not None:
                    np.testing.assert_allclose(traced_answer[key], eager_answer[key], rtol=0, atol=1e-5)
