"""--jpeg-draft through a live server: a large JPEG's embedding is the draft decode's, a small one's is exact."""

from __future__ import annotations

import base64

import numpy as np
from PIL import Image

from encoded_images import encode

from models.preprocessing import resize_to_model_input
from server.ingest.decoding import decode_image


def photo_like(width: int, height: int) -> bytes:
    rng = np.random.default_rng(width + height)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    pixels = np.stack([x / width * 200, y / height * 180, 40 + 25 * np.sin(x / 9.0) * np.cos(y / 13.0)], -1)
    return encode(Image.fromarray(np.clip(pixels + rng.normal(0, 6, pixels.shape), 0, 255).astype(np.uint8)),
                  "JPEG", quality=90)


def image_embedding(client, jpeg: bytes) -> np.ndarray:
    answer = client.post("/v1/infer", json={"image": {"b64": base64.b64encode(jpeg).decode()}, "use_cache": False})
    assert answer.status_code == 200, answer.text
    return np.asarray(answer.json()["image_embedding"], dtype=np.float64)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_the_flag_reaches_the_served_decoder(live_server_factory, tiny_bundle):
    large, small = photo_like(1024, 768), photo_like(40, 30)
    with live_server_factory() as exact_server, exact_server.client() as client:
        exact_large, exact_small = image_embedding(client, large), image_embedding(client, small)
    with live_server_factory(jpeg_draft=True) as draft_server, draft_server.client() as client:
        draft_large, draft_small = image_embedding(client, large), image_embedding(client, small)
    # The tiny preset's input is small, so the 1024x768 JPEG decodes at 1/8: other pixels, the same picture.
    preprocess = tiny_bundle.config.preprocess
    side = max(preprocess.resize_size, preprocess.input_size)
    assert decode_image(large, 10**8, draft_side=side).size == (128, 96)
    exact_pixels = resize_to_model_input(decode_image(large, 10**8), preprocess)
    draft_pixels = resize_to_model_input(decode_image(large, 10**8, draft_side=side), preprocess)
    assert not np.array_equal(exact_pixels, draft_pixels)
    assert not np.array_equal(draft_large, exact_large)
    assert cosine(draft_large, exact_large) > 0.99
    np.testing.assert_array_equal(draft_small, exact_small)  # too small to reduce: decoded exactly
