"""POST /v1/infer against a live server: routes, outputs equal a direct model call, errors."""

from __future__ import annotations

import io
import socket

import numpy as np
import pytest
import torch
from PIL import Image

from encoded_images import b64, encoded_image
from models.preprocessing import pixels_to_model_input, resize_to_model_input
from models.loading.repository import ModelBundle, with_runtime

TOLERANCE = 1e-5


def direct_image_input(bundle: ModelBundle, encoded: bytes) -> torch.Tensor:
    image = Image.open(io.BytesIO(encoded)).convert("RGB")
    return torch.from_numpy(resize_to_model_input(image, bundle.config.preprocess)).unsqueeze(0)


def direct_outputs(bundle: ModelBundle, text: str | None, image: torch.Tensor | None) -> dict:
    """What the model itself says for one item, with no server in between."""
    model = bundle.model
    out: dict = {}
    images = texts = None
    if image is not None:
        images = model.encode_images(image)
        out["image_embedding"] = images[0].pooled.numpy()
    if text is not None:
        token_ids = bundle.tokenizer.encode(text, truncate=False).token_ids
        texts = model.encode_texts([token_ids])
        out["text_embedding"] = texts[0].pooled.numpy()
    if images is not None and texts is not None:
        fused = model.fuse(images, texts)[0]
        out["fused_embedding"] = fused.fused.numpy()
    return out


def assert_matches_direct(answer: dict, expected: dict) -> None:
    for key, value in expected.items():
        assert key in answer, f"{key} missing from the answer"
        np.testing.assert_allclose(np.asarray(answer[key]), value, rtol=0, atol=TOLERANCE, err_msg=key)


def test_text_only_is_routed_text_and_equals_the_model(tiny_server, tiny_bundle):
    with tiny_server.client() as client:
        answer = client.post("/v1/infer", json={"text": "a red bicycle"}).json()
    assert answer["route"] == "text"
    assert set(answer) >= {"id", "model", "text_embedding", "timings_ms", "cache"}
    assert "image_embedding" not in answer and "fused_embedding" not in answer
    # --runtime auto on the CPU: ONNX Runtime runs the towers, and the fingerprint says so
    assert answer["model"] == {"name": "tiny", "fingerprint": with_runtime(tiny_bundle, "onnxruntime").fingerprint,
                               "family": "mmserve", "score": None, "normalized_embeddings": False,
                               "fusion_head": "untrained", "dtype": "float32", "runtime": "onnxruntime",
                               "quantization": "none", "int8_cosine": None,
                               "engine": 0}  # which engine computed it: the one process's
    assert_matches_direct(answer, direct_outputs(tiny_bundle, "a red bicycle", None))


def test_image_only_is_routed_vision_and_equals_the_model(tiny_server, tiny_bundle):
    encoded = encoded_image(1)
    with tiny_server.client() as client:
        answer = client.post("/v1/infer", json={"image": {"b64": b64(encoded)}}).json()
    assert answer["route"] == "vision"
    assert "text_embedding" not in answer
    assert_matches_direct(answer, direct_outputs(tiny_bundle, None, direct_image_input(tiny_bundle, encoded)))


def test_image_and_text_are_fused_and_equal_the_model(tiny_server, tiny_bundle):
    encoded = encoded_image(2)
    with tiny_server.client() as client:
        answer = client.post("/v1/infer", json={"text": "what is this?", "image": {"b64": b64(encoded)}}).json()
    assert answer["route"] == "fusion"
    expected = direct_outputs(tiny_bundle, "what is this?", direct_image_input(tiny_bundle, encoded))
    assert_matches_direct(answer, expected)
    # The preset has no calibrated score and an untrained head: neither number is sent.
    assert "score" not in answer and "match_score" not in answer
    assert answer["model"]["score"] is None and answer["model"]["fusion_head"] == "untrained"
    assert {"decode", "queue", "vision", "text", "fusion", "respond", "total"} <= set(answer["timings_ms"])


def test_multipart_equals_json(tiny_server):
    encoded = encoded_image(3)
    with tiny_server.client() as client:
        as_json = client.post("/v1/infer", json={"text": "a dog", "image": {"b64": b64(encoded)}}).json()
        as_form = client.post("/v1/infer", files={"image": ("dog.png", encoded, "image/png")},
                              data={"text": "a dog"}).json()
    assert as_form["route"] == "fusion"
    for key in ("image_embedding", "text_embedding", "fused_embedding"):
        np.testing.assert_allclose(as_form[key], as_json[key], atol=TOLERANCE)


def test_raw_uint8_pixels_equal_the_model(tiny_server, tiny_bundle):
    rng = np.random.default_rng(4)
    pixels = rng.integers(0, 256, size=(20, 50, 3), dtype=np.uint8)
    body = {"image": {"uint8": {"shape": [20, 50, 3], "b64": b64(pixels.tobytes())}}}
    with tiny_server.client() as client:
        answer = client.post("/v1/infer", json=body).json()
    model_input = torch.from_numpy(pixels_to_model_input(pixels, tiny_bundle.config.preprocess)).unsqueeze(0)
    assert_matches_direct(answer, direct_outputs(tiny_bundle, None, model_input))


def test_the_same_input_twice_gives_the_same_output(tiny_server):
    body = {"text": "same again", "image": {"b64": b64(encoded_image(5))}}
    with tiny_server.client() as client:
        first, second = (client.post("/v1/infer", json=body).json() for _ in range(2))
    assert first["id"] != second["id"]
    for key in ("image_embedding", "text_embedding", "fused_embedding"):
        assert first[key] == second[key]


def test_concurrent_requests_each_get_their_own_answer(tiny_server, tiny_bundle):
    """Items batched together must not leak into each other."""
    import concurrent.futures

    texts = [f"item number {i} " * (i % 4 + 1) for i in range(12)]
    with tiny_server.client() as client, concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda t: client.post("/v1/infer", json={"text": t}).json(), texts))
    for text, answer in zip(texts, answers):
        assert_matches_direct(answer, direct_outputs(tiny_bundle, text, None))


def test_too_long_text_is_422_naming_the_limit_unless_truncated(tiny_server, tiny_bundle):
    limit = tiny_bundle.tokenizer.max_tokens
    text = "x" * (limit + 10)
    with tiny_server.client() as client:
        refused = client.post("/v1/infer", json={"text": text})
        truncated = client.post("/v1/infer", json={"text": text, "truncate": True})
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["code"] == "text_too_long" and error["field"] == "text"
    assert str(limit) in error["message"]
    assert truncated.status_code == 200
    info = truncated.json()["text"]
    assert info == {"num_tokens": limit, "truncated": True, "num_tokens_before_truncation": limit + 12}


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({}, 422, "empty_request", "body"),
        ({"text": "   "}, 422, "empty_text", "text"),
        ({"text": 5}, 422, "invalid_request", "text"),
        ({"text": "hi", "extra": 1}, 422, "invalid_request", "extra"),
        ({"image": {"b64": "not base64!"}}, 400, "invalid_base64", "image.b64"),
        ({"image": {"b64": b64(b"")}}, 422, "invalid_request", "image"),
        ({"image": {"b64": b64(b"plain text, not an image")}}, 415, "unsupported_image_format", "image"),
        ({"image": {"b64": b64(encoded_image(0)[:60])}}, 400, "corrupt_image", "image"),
        ({"image": {"uint8": {"shape": [2, 2], "b64": b64(bytes(12))}}}, 422, "invalid_request", "image"),
        ({"image": {"uint8": {"shape": [2, 2, 4], "b64": b64(bytes(16))}}}, 422, "invalid_tensor_shape",
         "image.uint8.shape"),
        ({"image": {"uint8": {"shape": [2, 2, 3], "b64": b64(bytes(11))}}}, 422, "invalid_tensor_length",
         "image.uint8.b64"),
        ({"text": "hi", "timeout_ms": 0}, 422, "invalid_request", "timeout_ms"),
        ({"text": "hi", "priority": "urgent"}, 422, "invalid_request", "priority"),
    ],
)
def test_bad_json_input_gets_a_named_error_and_the_server_stays_up(tiny_server, body, status, code, field):
    with tiny_server.client() as client:
        response = client.post("/v1/infer", json=body)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["code"] == code
        assert error["field"].startswith(field)
        assert client.post("/v1/infer", json={"text": "still fine"}).status_code == 200


def test_invalid_json_and_wrong_content_type(tiny_server):
    with tiny_server.client() as client:
        broken = client.post("/v1/infer", content=b"{not json", headers={"content-type": "application/json"})
        wrong_type = client.post("/v1/infer", content=b"text=hi", headers={"content-type": "text/plain"})
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"
    assert wrong_type.status_code == 415 and wrong_type.json()["error"]["code"] == "unsupported_media_type"


def test_zero_byte_and_non_image_multipart_parts(tiny_server):
    with tiny_server.client() as client:
        empty = client.post("/v1/infer", files={"image": ("x.png", b"", "image/png")})
        not_image = client.post("/v1/infer", files={"image": ("x.png", b"GIF? no", "image/png")})
    assert empty.status_code == 400 and empty.json()["error"]["code"] == "empty_image"
    assert not_image.status_code == 415


def test_header_only_huge_image_is_refused_from_its_header(live_server_factory):
    # A PNG whose header claims 20000 x 20000 pixels but carries no pixel data.
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header_only = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
    )
    assert len(header_only) < 200
    with live_server_factory(max_image_pixels=1_000_000) as server, server.client() as client:
        response = client.post("/v1/infer", json={"image": {"b64": b64(header_only)}})
        assert response.status_code == 413
        error = response.json()["error"]
        assert error["code"] == "image_too_large" and "1000000" in error["message"]
        assert client.post("/v1/infer", json={"image": {"b64": b64(encoded_image(0))}}).status_code == 200


def test_body_over_the_limit_is_413_without_reading_it(live_server_factory):
    with live_server_factory(max_body_bytes=10_000) as server, server.client() as client:
        declared = client.post("/v1/infer", content=b"x" * 20_000, headers={"content-type": "application/json"})

        def chunked():
            for _ in range(20):
                yield b" " * 1000

        streamed = client.post("/v1/infer", content=chunked(), headers={"content-type": "application/json"})
        assert declared.status_code == 413 and declared.json()["error"]["code"] == "body_too_large"
        assert streamed.status_code == 413 and streamed.json()["error"]["code"] == "body_too_large"
        assert client.post("/v1/infer", json={"text": "fine"}).status_code == 200


def test_a_413_closes_the_connection_so_the_unread_body_cannot_trickle_on(live_server_factory, read_until_closed):
    with live_server_factory(max_body_bytes=10_000) as server:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 20000\r\n\r\n" + b" " * 100)
            answer, _ = read_until_closed(sock, timeout_s=5)
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 413") and b"connection: close" in head, head


def test_health_docs_and_metrics(tiny_server):
    with tiny_server.client() as client:
        assert client.get("/health/live").json() == {"status": "live"}
        assert client.get("/health/ready").json() == {"status": "ready"}
        assert client.get("/docs").status_code == 200
        spec = client.get("/openapi.json").json()
        content = spec["paths"]["/v1/infer"]["post"]["requestBody"]["content"]
        assert {"application/json", "multipart/form-data"} <= set(content)
        assert "InferRequest" in spec["components"]["schemas"]
        client.post("/v1/infer", json={"text": "count me"})
        metrics = client.get("/metrics").text
    assert 'mmserve_requests_total{code="200",route="text"}' in metrics
    assert "mmserve_request_duration_seconds_bucket" in metrics
