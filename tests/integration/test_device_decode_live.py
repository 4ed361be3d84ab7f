"""``decode_device="cuda"`` through a live server: the intake's JPEGs reach the device decoder, answers stay.

The device decoder runs on the model's device, here the tiny model's CPU
(torchvision's ``decode_jpeg`` with libjpeg stands in for nvJPEG; start-up
only refuses ``--decode-device cuda`` when it loads the model itself, and
this app is handed a loaded one). So what is checked is the wiring a GPU
server runs: which images go to the device decoder, the counts on
``/metrics``, errors and answers against a ``decode_device="cpu"`` server.
The nvJPEG equality (cosine 0.9999) is checked by ``benchmarks/gpu/real_model.py``.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest
from PIL import Image

from encoded_images import encode, gradient_image

from server.settings import Settings
from tests.conftest import run_live_server

MIN_COSINE = 0.999  # libjpeg vs Pillow IDCT rounding and torch vs Pillow resampling, tiny random model


def _picture(shift: int) -> Image.Image:
    return gradient_image((96, 64), shift)


def _encoded(image: Image.Image, fmt: str) -> bytes:
    return encode(image, fmt, **({"quality": 95} if fmt == "JPEG" else {}))


def _data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _embeddings(server, inputs: list[str]) -> list[np.ndarray]:
    with server.client() as client:
        response = client.post("/v1/embeddings", json={"model": "tiny", "input": inputs})
    assert response.status_code == 200, response.text
    return [np.asarray(item["embedding"]) for item in response.json()["data"]]


def _decode_counts(server) -> dict[str, float]:
    with server.client() as client:
        text = client.get("/metrics").text
    counts = {}
    for line in text.splitlines():
        if line.startswith("mmserve_device_decode_images_total{"):
            outcome = line.split('outcome="')[1].split('"')[0]
            counts[outcome] = float(line.rsplit(" ", 1)[1])
    return counts


@pytest.fixture(scope="module")
def servers(tiny_bundle):
    with run_live_server(Settings(preset="tiny", device="cpu", decode_device="cuda"), tiny_bundle) as device, \
            run_live_server(Settings(preset="tiny", device="cpu"), tiny_bundle) as cpu:
        yield device, cpu


def test_an_openai_batch_decodes_its_jpegs_on_the_device_and_answers_as_the_cpu_path(servers):
    device, cpu = servers
    jpegs = [_encoded(_picture(shift), "JPEG") for shift in (0, 60)]
    png = _encoded(_picture(120), "PNG")
    inputs = [_data_uri(jpegs[0], "image/jpeg"), _data_uri(png, "image/png"), _data_uri(jpegs[1], "image/jpeg")]
    before = _decode_counts(device)
    ours, theirs = _embeddings(device, inputs), _embeddings(cpu, inputs)
    after = _decode_counts(device)
    assert after["decoded"] - before.get("decoded", 0) == 2  # both JPEGs; the PNG never went to it
    assert after["left_to_cpu"] == before.get("left_to_cpu", 0)
    for index in (0, 2):
        cosine = float(np.dot(ours[index], theirs[index]) / np.linalg.norm(ours[index]) / np.linalg.norm(theirs[index]))
        assert cosine >= MIN_COSINE
        assert not np.array_equal(ours[index], theirs[index])  # decoded another way: not the CPU path's bytes
    np.testing.assert_allclose(ours[1], theirs[1], rtol=0, atol=1e-6)  # Pillow on both
    assert _decode_counts(cpu) == {}  # decode_device cpu: the series is absent


def test_a_truncated_jpeg_is_the_cpu_decoders_400_and_its_neighbour_is_answered(servers):
    device, _ = servers
    good = _encoded(_picture(30), "JPEG")
    truncated = _encoded(_picture(90), "JPEG")[:300]
    before = _decode_counts(device)
    with device.client() as client:
        bad = client.post("/v1/infer", json={"images": [{"b64": base64.b64encode(good).decode()},
                                                        {"b64": base64.b64encode(truncated).decode()}]})
        assert bad.status_code == 400, bad.text
        error = bad.json()["error"]
        assert error["code"] == "corrupt_image" and "images[1]" in error.get("field", "")
        alone = client.post("/v1/infer", json={"image": {"b64": base64.b64encode(good).decode()}})
    assert alone.status_code == 200 and len(alone.json()["image_embedding"]) > 0
    after = _decode_counts(device)
    assert after["left_to_cpu"] - before.get("left_to_cpu", 0) == 1  # the truncated one, refused, then Pillow's 400
