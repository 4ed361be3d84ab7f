"""``--api-workers 2`` API processes stay light: no torch, transformers, timm or open_clip, even after serving.

A live server (the tiny preset) answers text, image and fused requests
until both API processes have tokenized and decoded; then each API process
is asked (SIGUSR2, the test hooks' ``MMSERVE_TEST_MODULES_DIR``) for the
modules it has imported, and its memory map is read for libtorch. The
engine is checked the same way and must hold them: the checks can fail.

A random SigLIP (a SentencePiece tokenizer, lowercasing and punctuation
stripped by its Python side, cut at 64 tokens) served at N = 2 answers every
text as one process does: the API processes tokenize it with
``sentencepiece`` alone (``models.torch_free.siglip_sentencepiece``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.random_pretrained import write_siglip
from encoded_images import b64, encoded_image
from tests.conftest import run_serve_processes
from tests.integration.same_answers import assert_same
from tests.integration.work_logs import Logged, send_until_both_api_processes_worked, serve_logged

MODEL_LIBRARIES = ("torch", "transformers", "timm", "open_clip")
ANSWER_FIELDS = ("route", "model", "image_embedding", "text_embedding", "fused_embedding", "score", "text")


@pytest.fixture(scope="module")
def workers(tmp_path_factory) -> Iterator[tuple[Logged, Path]]:
    modules_dir = tmp_path_factory.mktemp("modules")
    env = {"MMSERVE_TEST_MODULES_DIR": str(modules_dir)}
    with serve_logged(tmp_path_factory.mktemp("work"), ["--preset", "tiny", "--device", "cpu", "--api-workers", "2"],
                      env) as served:
        yield served, modules_dir


def _post(url: str, body: dict) -> httpx.Response:
    answer = httpx.post(f"{url}/v1/infer", json=body, headers={"Connection": "close"}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer


def _imported(process_id: int, modules_dir: Path) -> set[str]:
    path = modules_dir / str(process_id)
    path.unlink(missing_ok=True)
    os.kill(process_id, signal.SIGUSR2)
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline, f"process {process_id} wrote no module list"
        time.sleep(0.05)
    return set(path.read_text().split())


def _model_libraries(modules: set[str]) -> set[str]:
    return {name for name in modules if name.split(".")[0] in MODEL_LIBRARIES}


def _maps_libtorch(process_id: int) -> bool:
    return "libtorch" in Path(f"/proc/{process_id}/maps").read_text()


def test_api_processes_import_no_model_library_after_serving(workers):
    served, modules_dir = workers
    image = {"b64": b64(encoded_image(1, (48, 40), "JPEG"))}
    bodies = ({"text": "A photo of a CAT!"}, {"image": image}, {"image": image, "text": "两只狗 🐕", "use_cache": False})
    send_until_both_api_processes_worked(lambda i: _post(served.url, bodies[i % 3]), served.tokenize_log, at_least=9)
    send_until_both_api_processes_worked(
        lambda i: _post(served.url, {"image": {"b64": b64(encoded_image(10 + i, (40, 48), "PNG"))}}),
        served.decode_log, at_least=2)
    api_processes = served.children("api_process")
    assert len(api_processes) == 2
    assert set(served.counts()["tokenize"]) == set(served.counts()["decode"]) == api_processes  # both served
    for process_id in api_processes:
        modules = _imported(process_id, modules_dir)
        assert "server.workers.engine_client" in modules and "models.torch_free.json_tokenizer" in modules
        assert _model_libraries(modules) == set(), process_id
        assert not _maps_libtorch(process_id), process_id
    (fork_server,) = served.children("api_forkserver")  # what every API process is forked from
    assert "server.workers.api_process" in (fork_server_modules := _imported(fork_server, modules_dir))
    assert _model_libraries(fork_server_modules) == set() and not _maps_libtorch(fork_server)
    (engine,) = served.children("engine_process")
    assert {"torch", "transformers"} <= _model_libraries(_imported(engine, modules_dir))
    assert _maps_libtorch(engine)


SIGLIP_TEXTS = ("a photo of a cat", "A PHOTO OF A CAT!!!", "two dogs, playing; on (the) grass...",
                "東京タワーの夜景 🗼", "</s> written in the text", "word " * 100)


@pytest.fixture(scope="module")
def siglip_dir(tmp_path_factory) -> Path:
    return write_siglip(tmp_path_factory.mktemp("models") / "tiny-siglip", max_text_tokens=64)


def _answer(url: str, body: dict) -> dict:
    answer = _post(url, body).json()
    return {name: answer[name] for name in ANSWER_FIELDS if name in answer}


def test_siglip_texts_answer_at_two_api_processes_as_in_one(siglip_dir):
    image = {"b64": b64(encoded_image(3, (48, 40), "JPEG"))}
    args = ["--model", str(siglip_dir), "--device", "cpu"]
    with run_serve_processes([([*args, "--api-workers", "2"], None), (args, None)]) as (workers, single):
        for text in SIGLIP_TEXTS:
            theirs = _answer(single.url, {"text": text})
            fused = _answer(single.url, {"text": text, "image": image})
            for _ in range(2):  # new connections: either API process answers
                assert_same(_answer(workers.url, {"text": text}), theirs)
                assert_same(_answer(workers.url, {"text": text, "image": image}), fused)
        assert theirs["text"]["truncated"] is True  # the long text was cut at 64, as SigLIP cuts
