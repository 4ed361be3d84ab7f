"""``--api-workers 2`` API processes load no model: the engine's facts and tokenizer are all they hold.

A random CLIP written with transformers' ``save_pretrained`` (its own
byte-level BPE tokenizer, 77 tokens, not a preset's) is served with
``--model DIR``. Answers at N=2 equal the single process's on every protocol,
the text-too-long refusal included (its token count is the CLIP tokenizer's,
which an API process only has from the engine). Then the weights file is
taken away and an API process is killed: the one the supervisor starts in
its place becomes ready and answers, which it could not if it read weights.
The API processes also run below the engine's CPU priority (``api_process_nice``).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton_http

from benchmarks.random_pretrained import write_clip, write_open_clip
from encoded_images import b64, encoded_image
from tests.conftest import ServeProcess, run_serve_process, run_serve_processes
from tests.integration.same_answers import assert_same

pytestmark = pytest.mark.long  # minutes together: started first (tests/conftest.py)

WEIGHTS_FILE = "model.safetensors"  # what CLIPModel.save_pretrained writes
ANSWER_FIELDS = ("route", "model", "image_embedding", "text_embedding", "fused_embedding", "score", "text")
TOO_LONG = "一只猫坐在窗台上" * 4  # 32 characters, 96 tokens in CLIP's byte-level BPE: over its 77


def _children(process_id: int) -> set[int]:
    return {int(pid) for pid in Path(f"/proc/{process_id}/task/{process_id}/children").read_text().split()}


def _api_processes(served: ServeProcess) -> set[int]:
    return {pid for pid in _children(served.process.pid)
            if b"api_process" in Path(f"/proc/{pid}/cmdline").read_bytes()}


def _maps_torch(process_id: int) -> bool:
    return "libtorch" in Path(f"/proc/{process_id}/maps").read_text()


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory) -> Path:
    return write_clip(tmp_path_factory.mktemp("models") / "tiny-clip")


@pytest.fixture(scope="module")
def servers(clip_dir) -> Iterator[list[ServeProcess]]:
    """The ``--api-workers 2`` server and the one-process server, started side by side."""
    args = ["--model", str(clip_dir), "--device", "cpu"]
    with run_serve_processes([([*args, "--api-workers", "2"], None), (args, None)]) as both:
        yield both


@pytest.fixture(scope="module")
def workers(servers) -> ServeProcess:
    return servers[0]


@pytest.fixture(scope="module")
def single(servers) -> ServeProcess:
    return servers[1]


def test_the_supervisor_holds_no_torch_only_the_engine_does(workers):
    """The supervisor starts processes and watches them: torch (about 500 MiB resident) is the engine's alone."""
    supervisor = workers.process.pid
    engine = {pid for pid in _children(supervisor) if b"engine_process" in Path(f"/proc/{pid}/cmdline").read_bytes()}
    assert len(engine) == 1 and _maps_torch(engine.pop())
    assert not _maps_torch(supervisor)


def _nice_of_threads(process_id: int) -> set[int]:
    return {os.getpriority(os.PRIO_PROCESS, int(thread)) for thread in os.listdir(f"/proc/{process_id}/task")}


def test_api_processes_yield_the_cores_to_the_engine(workers):
    """Every thread of an API process, those its imports started too, runs at ``api_process_nice`` (5) above
    the supervisor; the engine's main thread, which every request's batch passes, does not."""
    supervisor = workers.process.pid
    base = os.getpriority(os.PRIO_PROCESS, supervisor)
    engine = next(pid for pid in _children(supervisor)
                  if b"engine_process" in Path(f"/proc/{pid}/cmdline").read_bytes())
    assert os.getpriority(os.PRIO_PROCESS, engine) == base
    for api_process in _api_processes(workers):
        assert _nice_of_threads(api_process) == {min(base + 5, 19)}, api_process


def _infer(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/infer", json=body, headers={"Connection": "close"}, timeout=60)


def _answer_fields(answer: httpx.Response) -> dict:
    assert answer.status_code == 200, answer.text
    body = answer.json()
    return {name: body[name] for name in ANSWER_FIELDS if name in body}


@pytest.mark.parametrize("body", [
    {"text": "a photo of a cat"},
    {"text": "夜晚的城市天际线"},
    {"image": {"b64": b64(encoded_image(1, (48, 40), "JPEG"))}},
    {"image": {"b64": b64(encoded_image(2, (40, 64), "PNG"))}, "text": "two dogs playing on the grass"},
    {"text": TOO_LONG, "truncate": True},
])
def test_native_answers_equal_the_single_process(workers, single, body):
    for _ in range(3):  # new connections: either API process answers
        assert_same(_answer_fields(_infer(workers.url, body)), _answer_fields(_infer(single.url, body)))


def test_a_text_too_long_for_the_clip_tokenizer_is_refused_as_one_process_refuses_it(workers, single):
    theirs = _infer(single.url, {"text": TOO_LONG})
    assert theirs.status_code == 422 and theirs.json()["error"]["code"] == "text_too_long"
    assert "77" in theirs.json()["error"]["message"]  # CLIP's limit, not a preset's
    for _ in range(4):
        ours = _infer(workers.url, {"text": TOO_LONG})
        assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json())


def test_model_descriptions_equal_the_single_process(workers, single):
    name = httpx.get(f"{single.url}/v1/models").json()["data"][0]["id"]
    for path in ("/v1/models", f"/v2/models/{name}"):
        ours, theirs = httpx.get(f"{workers.url}{path}"), httpx.get(f"{single.url}{path}")
        assert ours.status_code == theirs.status_code == 200
        ours_json, theirs_json = ours.json(), theirs.json()
        for card in (ours_json, theirs_json):
            for entry in card.get("data", ()):
                entry.pop("created", None)  # the answer's own clock
        assert ours_json == theirs_json


def test_openai_embeddings_and_their_dimensions_check_equal_the_single_process(workers, single):
    name = httpx.get(f"{single.url}/v1/models").json()["data"][0]["id"]
    inputs = ["a red bicycle", "data:image/png;base64," + b64(encoded_image(3, (36, 36), "PNG"))]
    answers = []
    for served in (workers, single):
        with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0) as client:
            answers.append(client.embeddings.create(model=name, input=inputs))
    for mine, reference in zip(answers[0].data, answers[1].data):
        np.testing.assert_allclose(mine.embedding, reference.embedding, rtol=1e-5, atol=1e-6)
    refusals = [httpx.post(f"{served.url}/v1/embeddings", timeout=60,
                           json={"model": name, "input": inputs, "dimensions": 3}) for served in (workers, single)]
    assert refusals[0].status_code == refusals[1].status_code == 422
    assert refusals[0].json() == refusals[1].json()


def test_kserve_v2_through_tritonclient_equals_the_single_process(workers, single):
    name = httpx.get(f"{single.url}/v1/models").json()["data"][0]["id"]
    outputs = []
    for served in (workers, single):
        client = triton_http.InferenceServerClient(served.url.removeprefix("http://"))
        tensor = triton_http.InferInput("text", [2], "BYTES")
        texts = np.array(["a photo of a cat".encode(), "桌子上有一碗水果".encode()], dtype=object)
        tensor.set_data_from_numpy(texts, binary_data=True)
        outputs.append(client.infer(name, [tensor]).as_numpy("text_embedding"))
        client.close()
    assert outputs[0].shape[0] == 2
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-6)


def test_an_open_clip_model_tokenizes_in_the_api_processes_as_in_one(tmp_path):
    directory = write_open_clip(tmp_path / "tiny-open-clip")  # open_clip's own SimpleTokenizer, sent as its BPE
    bodies = ({"text": "a photo of a cat"}, {"text": "a red bicycle " * 60},  # cut to its context, as open_clip cuts
              {"image": {"b64": b64(encoded_image(5, (48, 40), "JPEG"))}, "text": "snow on the mountains"})
    args = ["--model", str(directory), "--device", "cpu"]
    with run_serve_processes([([*args, "--api-workers", "2"], None), (args, None)]) as (workers, single):
        for body in bodies:
            theirs = _answer_fields(_infer(single.url, body))
            for _ in range(3):
                assert_same(_answer_fields(_infer(workers.url, body)), theirs)
        assert _infer(single.url, bodies[1]).json()["text"]["truncated"] is True


def test_a_restarted_api_process_reads_no_weights(clip_dir, tmp_path):
    directory = shutil.copytree(clip_dir, tmp_path / "tiny-clip")
    with run_serve_process(["--model", str(directory), "--device", "cpu", "--api-workers", "2"]) as served:
        body = {"image": {"b64": b64(encoded_image(4, (48, 40), "JPEG"))}, "text": "a photo of a cat"}
        before = _answer_fields(_infer(served.url, body))
        (directory / WEIGHTS_FILE).unlink()  # from now on, loading the model fails
        killed, survivor = sorted(_api_processes(served))
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not (_api_processes(served) - {killed, survivor}):
            assert time.monotonic() < deadline, "the supervisor started no API process in the killed one's place"
            time.sleep(0.1)
        (restarted,) = _api_processes(served) - {killed, survivor}
        os.kill(survivor, signal.SIGSTOP)  # only the restarted process accepts connections now
        try:
            deadline = time.monotonic() + 120
            while True:
                assert served.process.poll() is None, served.process.stdout.read()
                assert Path(f"/proc/{restarted}").exists(), "the restarted API process exited"
                try:
                    if httpx.get(f"{served.url}/health/ready", headers={"Connection": "close"},
                                 timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "the restarted API process never became ready"
                time.sleep(0.2)
            assert_same(_answer_fields(_infer(served.url, body)), before)
            refused = _infer(served.url, {"text": TOO_LONG})
            assert refused.status_code == 422 and refused.json()["error"]["code"] == "text_too_long"
        finally:
            os.kill(survivor, signal.SIGCONT)
        assert not (directory / WEIGHTS_FILE).exists()
