"""A model repository a user broke by hand, served as a user serves it: `mmserve serve --model-repo DIR`.

Each break passed the load check once and then killed the server with a
traceback (or later, its compute thread with exit 3). Each must now end
start-up with exit 2 and one last line ``mmserve: ...`` naming the file and
the key, no traceback. A break that a look at the repository's files decides
(``model.yaml``'s keys and values, a missing folder: ``fails_before_torch``)
is refused before any process imports torch, checked with
``PYTHONPROFILEIMPORTTIME=1``; the others need the model's libraries (timm
builds the tower, the weights are read against the built model, transformers
reads the tokenizer, safetensors the fusion head). The servers start in
parallel, a few at a time.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

from benchmarks.random_pretrained import write_timm_bert_repository

MMSERVE = [sys.executable, "-m", "server.cli"]
PARALLEL_STARTS = 4
START_TIMEOUT_S = 120  # a start that fails takes seconds; one that succeeds would serve on
IMPORT_TIME_LINE = "import time:"  # PYTHONPROFILEIMPORTTIME=1: "import time: <self us> | <cumulative us> | <module>"
MODEL_LIBRARY_IMPORTED = re.compile(r"^import time:.*\|\s*(torch|transformers|timm|open_clip)$", re.MULTILINE)


@dataclass(frozen=True)
class BrokenRepository:
    name: str
    breaks: Callable[[Path], None]
    names_in_last_line: tuple[str, ...]
    base: str = "tiny"  # or "vit-bert": a timm ViT (vision.timm_dir) and a BERT (text.hf_dir)
    fails_before_torch: bool = False  # refused from a look at the files, before torch or a model library loads


def _edit_yaml(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def breaks(repo: Path) -> None:
        data = yaml.safe_load((repo / "model.yaml").read_text())
        edit(data)
        (repo / "model.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return breaks


def _truncate_weights(repo: Path) -> None:
    weights = repo / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])


def _remove_bert_tokenizer(repo: Path) -> None:
    """``text.hf_dir``'s folder with the model's config and weights but not its tokenizer (a half-copied folder)."""
    (repo / "bert" / "tokenizer.json").unlink()
    (repo / "bert" / "tokenizer_config.json").unlink()


def _empty(folder: Path) -> None:
    shutil.rmtree(folder)
    folder.mkdir()


CASES = [
    BrokenRepository("std zero", _edit_yaml(lambda d: d["preprocess"].update(std=[0, 0, 0])),
                     ("model.yaml", "preprocess.std"), fails_before_torch=True),
    BrokenRepository("mean of two values", _edit_yaml(lambda d: d["preprocess"].update(mean=[0.5, 0.5])),
                     ("model.yaml", "preprocess.mean", "3"), fails_before_torch=True),
    BrokenRepository("input size not a number", _edit_yaml(lambda d: d["preprocess"].update(input_size="abc")),
                     ("model.yaml", "preprocess.input_size", "positive integer"), fails_before_torch=True),
    BrokenRepository("timm heads not dividing the width",
                     _edit_yaml(lambda d: d["vision"]["timm_kwargs"].update(num_heads=3)),
                     ("model.yaml", "vision", "num_heads")),
    BrokenRepository("top-level key misspelt", _edit_yaml(lambda d: d.update(dtpye="bfloat16")),
                     ("model.yaml", "'dtpye'", "dtype"), fails_before_torch=True),
    BrokenRepository("weights truncated", _truncate_weights, ("weights.safetensors",)),
    BrokenRepository("tokenizer folder missing", lambda repo: shutil.rmtree(repo / "tokenizer"),
                     ("tokenizer", "does not exist"), fails_before_torch=True),
    BrokenRepository("text.hf_dir missing", _edit_yaml(lambda d: d["text"].update(hf_dir="no-such-bert")),
                     ("model.yaml", "text.hf_dir", "no-such-bert", "does not exist"), fails_before_torch=True),
    # transformers built a BertTokenizer of the 5 special tokens from config.json, and every text served as [UNK]
    BrokenRepository("text.hf_dir without tokenizer files", _remove_bert_tokenizer,
                     ("vit-bert/bert", "no vocabulary", "save_pretrained"), base="vit-bert"),
    # safetensors' own error escaped the load: a traceback and exit 3
    BrokenRepository("fusion head not safetensors", lambda repo: (repo / "fusion_head.safetensors").write_text("x"),
                     ("fusion_head.safetensors", "cannot read the fusion head")),
    # transformers' message spans lines: the last line was its tail, not the "mmserve: " line
    BrokenRepository("tokenizer folder empty", lambda repo: _empty(repo / "tokenizer"), ("tokenizer",)),
]


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repos") / "tiny"
    done = subprocess.run([*MMSERVE, "init-model-repo", str(repo), "--preset", "tiny"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return repo


@pytest.fixture(scope="module")
def vit_bert_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_timm_bert_repository(tmp_path_factory.mktemp("repos") / "vit-bert")


def _problems(case: BrokenRepository, output: str, returncode: int) -> list[str]:
    lines = [line for line in output.splitlines() if line.strip() and not line.startswith(IMPORT_TIME_LINE)]
    last = lines[-1] if lines else ""
    problems = [] if returncode == 2 else [f"exited {returncode}, not 2"]
    if "Traceback" in output:
        problems.append("printed a traceback")
    if not last.startswith("mmserve: "):
        problems.append("last line does not start with 'mmserve: '")
    problems += [f"last line does not name {name!r}" for name in case.names_in_last_line if name not in last]
    if case.fails_before_torch and (imported := MODEL_LIBRARY_IMPORTED.search(output)):
        problems.append(f"imported {imported.group(1)} before failing")
    return problems


def _shown(output: str) -> str:
    """The output's tail as a user sees it: without the import-time lines."""
    return "\n".join(line for line in output.splitlines() if not line.startswith(IMPORT_TIME_LINE))[-1500:]


def _finish(process: subprocess.Popen) -> tuple[str, int]:
    """Its output and exit status; one that served the broken repository instead is stopped, not left behind."""
    try:
        return process.communicate(timeout=START_TIMEOUT_S)[0], process.returncode
    except subprocess.TimeoutExpired:
        process.kill()
        return process.communicate()[0] + f"\n(still serving after {START_TIMEOUT_S} s)", -9


def test_every_broken_repository_ends_start_up_in_one_line_naming_the_file(tiny_repo: Path, vit_bert_repo: Path,
                                                                          tmp_path: Path):
    bases = {"tiny": tiny_repo, "vit-bert": vit_bert_repo}
    outputs = []
    for first in range(0, len(CASES), PARALLEL_STARTS):
        running = []
        for case in CASES[first:first + PARALLEL_STARTS]:
            repo = tmp_path / case.name.replace(" ", "-") / case.base
            shutil.copytree(bases[case.base], repo)
            case.breaks(repo)
            env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"} if case.fails_before_torch else None
            running.append((case, subprocess.Popen([*MMSERVE, "serve", "--model-repo", str(repo), "--port", "0"],
                                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                                   env=env)))
        outputs += [(case, *_finish(process)) for case, process in running]
    failures = [f"{case.name}: {', '.join(problems)}\n{_shown(output)}"
                for case, output, returncode in outputs if (problems := _problems(case, output, returncode))]
    assert not failures, "\n\n".join(failures)


def test_init_refuses_the_synthetic_preset_in_one_line(tmp_path: Path):
    """Its towers sleep instead of computing: a repository of it could never be served."""
    repo = tmp_path / "synthetic"
    done = subprocess.run([*MMSERVE, "init-model-repo", str(repo), "--preset", "synthetic"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("mmserve: ") and "synthetic" in last and "sleep" in last
    assert not repo.exists() or not any(repo.iterdir())
