"""The CLI as a user runs it: init-model-repo, then serve --model-repo in a real process."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from encoded_images import encoded_image_b64

MMSERVE = [sys.executable, "-m", "server.cli"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _init_repo(directory: Path) -> None:
    done = subprocess.run([*MMSERVE, "init-model-repo", str(directory), "--preset", "tiny", "--seed", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "mmserve serve --model-repo" in done.stdout


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory) -> Path:
    """``mmserve init-model-repo DIR --preset tiny --seed 0`` run once for the module; a test that changes the
    repository changes its own copy."""
    repo = tmp_path_factory.mktemp("cli-model-repo") / "tiny-repo"
    _init_repo(repo)
    return repo


def test_init_then_serve_gives_the_in_memory_models_outputs(tiny_repo: Path, tiny_server, serve_process):
    """Served as ``--model DIR``, the repository answers under the directory's name (README: the served name
    defaults to the directory name of --model), with the preset's fingerprint and outputs."""
    repo = tiny_repo
    with serve_process(["--model", str(repo), "--device", "cpu"]) as served:
        body = {"text": "a lighthouse at dusk", "image": {"b64": encoded_image_b64(9, (36, 24))}}
        from_repo = httpx.post(f"{served.url}/v1/infer", json=body, timeout=30).json()
        in_memory = httpx.post(f"{tiny_server.url}/v1/infer", json=body, timeout=30).json()
        listed = httpx.get(f"{served.url}/v1/models", timeout=30).json()
    assert from_repo["model"]["name"] == "tiny-repo" and [model["id"] for model in listed["data"]] == ["tiny-repo"]
    assert {**from_repo["model"], "name": "tiny"} == in_memory["model"]
    for key in ("image_embedding", "text_embedding", "fused_embedding"):
        np.testing.assert_allclose(from_repo[key], in_memory[key], rtol=0, atol=1e-5)


def test_serving_a_repository_with_a_wrong_shape_fails_naming_it(tmp_path: Path, tiny_repo: Path):
    repo = tmp_path / "broken"
    shutil.copytree(tiny_repo, repo)
    weights = load_file(str(repo / "weights.safetensors"))
    weights["vision.backbone.cls_token"] = torch.zeros(1, 1, 65)
    save_file(weights, str(repo / "weights.safetensors"))
    done = subprocess.run([*MMSERVE, "serve", "--model-repo", str(repo), "--port", str(_free_port())],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "vision.backbone.cls_token has shape (1, 1, 65)" in done.stdout + done.stderr


def test_help_names_every_command():
    done = subprocess.run([*MMSERVE, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for word in ("serve", "init-model-repo", "bench", "MMSERVE_"):
        assert word in done.stdout
    serve_help = subprocess.run([*MMSERVE, "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    for flag in ("--preset", "--model-repo", "--host", "--port", "--device", "--config"):
        assert flag in serve_help


@pytest.mark.parametrize("bad", [["init-model-repo", "x", "--preset", "huge"], ["serve", "--device", "tpu"]])
def test_bad_arguments_exit_with_usage(bad):
    done = subprocess.run([*MMSERVE, *bad], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "invalid choice" in done.stderr


@pytest.mark.parametrize("command", ["serve", "export"])
def test_a_missing_config_file_is_refused_naming_config_and_the_path(command: str):
    """Not served (or exported) on defaults as if the file were empty; refused before torch is imported, in a
    second rather than after the model libraries' import (PYTHONPROFILEIMPORTTIME: a line per imported module)."""
    done = subprocess.run([*MMSERVE, command, "--preset", "tiny", "--config", "/nonexistent/mmserve.yaml",
                           *(("--port", str(_free_port())) if command == "serve" else ())],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    shown = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("import time:")]
    assert done.returncode == 2
    assert shown[-1].startswith("mmserve: --config /nonexistent/mmserve.yaml: cannot read")
    assert "Traceback" not in done.stderr
    assert not re.search(r"^import time:.*\|\s*(torch|transformers|timm|open_clip)$", done.stderr, re.MULTILINE)
