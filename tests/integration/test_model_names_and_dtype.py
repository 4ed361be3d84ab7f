"""The model as the user named it, on every protocol, and the dtype it computes in, on a live server.

A tiny random CLIP is served from a directory with ``--dtype bfloat16``: the
native answer's ``model`` and ``/v1/models`` say ``bfloat16`` (and the
embeddings are float32 numbers within cosine 0.999 of the float32 server's),
and the OpenAI ``model`` field, ``/v1/models/{id}`` and the KServe v2 model
name accept the exact string given to ``--model`` (the path) as well as the
short name, while another name is 404. ``--served-model-name`` renames it in
every answer. ``/metrics`` has no device series on the CPU. These run on any
machine, a CUDA one too (the servers are asked for ``device="cpu"``); the
start-up refusals of ``--dtype float16``, ``--decode-device cuda`` and
``--device cuda`` on the CPU are in test_bad_start's table.
"""

from __future__ import annotations

import base64
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton_http
from openai import NotFoundError, OpenAI

from benchmarks.random_pretrained import write_clip
from server.settings import Settings
from tests.encoded_images import encoded_image

@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory) -> Path:
    return write_clip(tmp_path_factory.mktemp("names") / "my-clip")


def _image_b64() -> str:
    return base64.b64encode(encoded_image(2, (40, 30))).decode()


def _data_uri() -> str:
    return "data:image/png;base64," + _image_b64()


def _cosine(a: list[float], b: list[float]) -> float:
    a_, b_ = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a_ @ b_ / np.linalg.norm(a_) / np.linalg.norm(b_))


def _kserve_infer(url: str, model_name: str, text: str) -> np.ndarray:
    client = triton_http.InferenceServerClient(url.removeprefix("http://"))
    text_input = triton_http.InferInput("text", [1], "BYTES")
    text_input.set_data_from_numpy(np.array([text.encode()], dtype=object))
    return client.infer(model_name, [text_input]).as_numpy("text_embedding")


def test_bfloat16_is_reported_and_answers_are_float32_close_to_float32(clip_dir, live_server_runner):
    body = {"text": "a red bicycle", "image": {"b64": _image_b64()}}
    with live_server_runner(Settings(model=str(clip_dir), device="cpu")) as server, server.client() as client:
        float32 = client.post("/v1/infer", json=body).json()
        assert client.get("/v1/models").json()["data"][0]["mmserve"]["dtype"] == "float32"
    with live_server_runner(Settings(model=str(clip_dir), device="cpu", dtype="bfloat16")) as server, \
            server.client() as client:
        bfloat16 = client.post("/v1/infer", json=body).json()
        card = client.get("/v1/models").json()["data"][0]
        exposition = client.get("/metrics").text
    # On the CPU the device series are absent, not zero (the rest of /metrics is there).
    assert "mmserve_requests_total" in exposition and "mmserve_device_" not in exposition
    assert float32["model"]["dtype"] == "float32" and bfloat16["model"]["dtype"] == "bfloat16"
    assert card["mmserve"]["dtype"] == "bfloat16"
    assert bfloat16["model"]["fingerprint"] != float32["model"]["fingerprint"]  # the cache keys differ with it
    for name in ("image_embedding", "text_embedding"):
        assert _cosine(bfloat16[name], float32[name]) >= 0.999
        assert bfloat16[name] != float32[name]  # computed in bf16, not fp32


def test_the_model_as_given_and_its_short_name_are_accepted_on_every_protocol(clip_dir, live_server_runner):
    given = str(clip_dir)
    with live_server_runner(Settings(model=given, device="cpu")) as server, server.client() as client:
        openai = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        by_path = openai.embeddings.create(model=given, input=["a cat", _data_uri()])
        by_short = openai.embeddings.create(model="my-clip", input=["a cat"])
        assert by_path.model == by_short.model == "my-clip"  # answers carry the served name
        np.testing.assert_allclose(by_path.data[0].embedding, by_short.data[0].embedding, rtol=0, atol=1e-6)
        with pytest.raises(NotFoundError):
            openai.embeddings.create(model="someone-else", input=["a cat"])
        assert client.get(f"/v1/models/{given}").json()["id"] == given
        assert client.get("/v1/models/someone-else").status_code == 404

        for name in (given, "my-clip"):
            quoted = urllib.parse.quote(name, safe="")
            assert client.get(f"/v2/models/{quoted}/ready").status_code == 200
            assert client.get(f"/v2/models/{quoted}").json()["name"] == "my-clip"
        embedding_by_path = _kserve_infer(server.url, given, "a cat")  # tritonclient quotes it
        embedding_by_short = _kserve_infer(server.url, "my-clip", "a cat")
        np.testing.assert_allclose(embedding_by_path, embedding_by_short, rtol=0, atol=1e-6)
        np.testing.assert_allclose(embedding_by_short[0], by_short.data[0].embedding, rtol=0, atol=1e-6)
        refused = client.post("/v2/models/someone-else/infer", json={"inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a cat"]}]})
        assert refused.status_code == 404 and "my-clip" in refused.text


def test_served_model_name_renames_it_everywhere_and_the_path_still_works(clip_dir, live_server_runner):
    settings = Settings(model=str(clip_dir), device="cpu", served_model_name="team/clip-prod")
    with live_server_runner(settings) as server, server.client() as client:
        assert client.get("/v1/models").json()["data"][0]["id"] == "team/clip-prod"
        assert client.post("/v1/infer", json={"text": "a cat"}).json()["model"]["name"] == "team/clip-prod"
        assert client.get("/v2/models/team/clip-prod").json()["name"] == "team/clip-prod"
        answer = client.post("/v1/embeddings", json={"model": str(clip_dir), "input": "a cat"})
        assert answer.status_code == 200 and answer.json()["model"] == "team/clip-prod"
        assert client.post("/v1/embeddings", json={"model": "my-clip-2", "input": "a cat"}).status_code == 404
