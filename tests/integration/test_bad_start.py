"""`mmserve serve` with each configuration error a user can make at start-up, as a user runs it.

Each must exit non-zero with one last line that names the setting, print no
traceback (unless the log level is debug), and, where the value can be
checked before the model loads, fail before it loads, and where it needs no
CUDA probe, no model library and no weights (``fails_before_torch``), before
any process of the server imports torch: checked with
``PYTHONPROFILEIMPORTTIME=1``, whose per-module lines every interpreter the
server starts writes. The device refusals (a dtype, a decode device or a
device the machine lacks) say what to use instead. The servers start in
parallel: most fail in a second, the rest import torch, and none loads a
model for long.

With the process split (``--api-workers 2``, ``--engines 2``, ``--devices``)
the settings only an engine can judge end the same way: the same last line,
exit status 2 as in one process, no traceback, no restart.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import pytest

pytestmark = pytest.mark.long  # minutes together: started first (tests/conftest.py)

MMSERVE = [sys.executable, "-m", "server.cli", "serve"]
MODEL_LOADED = "server.runtime.model_loading: model "  # the start-up line once weights are in memory
PARALLEL_STARTS = 4  # most fail before torch is imported; the rest import it, a few at a time on 2 cores
# With PYTHONPROFILEIMPORTTIME=1 every interpreter of the server (supervisor, engines, API processes) writes a line
# per module it imports to its standard error: "import time: <self us> | <cumulative us> | <module>".
IMPORT_TIME_LINE = "import time:"
MODEL_LIBRARY_IMPORTED = re.compile(r"^import time:.*\|\s*(torch|transformers|timm|open_clip)$", re.MULTILINE)


@dataclass(frozen=True)
class BadStart:
    name: str
    args: tuple[str, ...]
    names_in_last_line: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    fails_before_loading: bool = True
    fails_before_torch: bool = False  # no process of the server imports torch or a model library


def _bad_starts(tmp_path: Path, taken_port: int) -> list[BadStart]:
    empty = tmp_path / "empty-model"
    empty.mkdir()
    unwritable = _unwritable_cache_dir(tmp_path)
    misspelt = tmp_path / "misspelt.yaml"
    misspelt.write_text("preset: tiny\nmax_batch_sise: 4\n")
    cases = [
        BadStart("config file missing", ("--config", "/nonexistent/mmserve.yaml"),
                 ("--config /nonexistent/mmserve.yaml",)),
        BadStart("config key misspelt", ("--config", str(misspelt)), (f"max_batch_sise in {misspelt}", "max_batch_size")),
        BadStart("model path missing", ("--model", "/nonexistent/dir"), ("--model", "/nonexistent/dir")),
        BadStart("model directory not loadable", ("--model", str(empty)), (str(empty), "neither model.yaml"),
                 fails_before_torch=True),
        BadStart("model repository not a directory", ("--model-repo", str(tmp_path / "none")), ("--model-repo",)),
        BadStart("model repository not loadable", ("--model-repo", str(empty)), (str(empty), "has no model.yaml"),
                 fails_before_torch=True),
        BadStart("hub id not cached offline", ("--model", "someorg/not-cached"), ("someorg/not-cached", "HF_HUB_OFFLINE"),
                 env=(("HF_HUB_OFFLINE", "1"), ("HF_HOME", str(tmp_path / "hf")))),
        BadStart("dtype the CPU lacks", ("--preset", "tiny", "--device", "cpu", "--dtype", "float16"),
                 ("--dtype float16", "needs a CUDA device", "--dtype float32"), fails_before_torch=True),
        BadStart("decode device the CPU lacks", ("--preset", "tiny", "--device", "cpu", "--decode-device", "cuda"),
                 ("--decode-device cuda", "--decode-device cpu"), fails_before_torch=True),
        BadStart("port out of range", ("--preset", "tiny", "--port", "99999"), ("--port", "65535")),
        BadStart("port taken", ("--preset", "tiny", "--port", str(taken_port)), ("--port", str(taken_port))),
        # bound in the lifespan once the model had loaded: grpcio's traceback, exit 3
        BadStart("gRPC port taken", ("--preset", "tiny", "--grpc-port", str(taken_port)),
                 ("--grpc-port", str(taken_port), "MMSERVE_GRPC_PORT")),
        BadStart("host not an address", ("--preset", "tiny", "--host", "999.0.0.1", "--port", "0"), ("--host",)),
        BadStart("key file unreadable", ("--preset", "tiny", "--port", "0"), ("MMSERVE_API_KEY_FILE",),
                 env=(("MMSERVE_API_KEY_FILE", str(tmp_path / "no-such-keys")),)),
        BadStart("no engines", ("--preset", "tiny", "--engines", "0"), ("--engines (MMSERVE_ENGINES)", "between 1 and 64")),
        BadStart("no API processes", ("--preset", "tiny", "--api-workers", "0"), ("--api-workers (MMSERVE_API_WORKERS)",)),
        BadStart("export cache directory not writable",
                 ("--preset", "tiny", "--runtime", "onnxruntime", "--export-cache-dir", str(unwritable)),
                 ("--export-cache-dir", str(unwritable.parent), "Not a directory"), fails_before_torch=True),
        BadStart("runtime onnxruntime in bfloat16", ("--preset", "tiny", "--runtime", "onnxruntime", "--dtype", "bfloat16"),
                 ("--runtime onnxruntime", "--dtype is bfloat16", "--dtype float32")),
        BadStart("runtime onnxruntime with the synthetic preset", ("--preset", "synthetic", "--runtime", "onnxruntime"),
                 ("--runtime onnxruntime", "--preset synthetic", "--runtime torch")),
        BadStart("int8 with the synthetic preset", ("--preset", "synthetic", "--quantize", "int8"),
                 ("--quantize int8", "--preset synthetic", "leave --quantize out")),
        BadStart("conflicting flags", ("--preset", "tiny", "--model", "someorg/x"), ("--model", "--preset")),
        BadStart("engines and devices disagree", ("--preset", "tiny", "--engines", "3", "--devices", "cpu"),
                 ("--engines 3", "--devices cpu", "leave --engines out")),
    ]
    if not torch.cuda.is_available():  # the no-CUDA message needs a machine without CUDA
        cases.append(BadStart("no CUDA", ("--preset", "tiny", "--device", "cuda"),
                              ("--device cuda", "no CUDA device is visible")))
        # One listed device: one process, which used to serve on --device (the CPU here) without a word.
        cases.append(BadStart("the one device of --devices is missing", ("--preset", "tiny", "--devices", "cuda:0"),
                              ("--devices cuda:0 (MMSERVE_DEVICES)", "no CUDA device is visible")))
    return cases


def _unwritable_cache_dir(tmp_path: Path) -> Path:
    """An ``--export-cache-dir`` under a regular file: refused with ENOTDIR, to root too (unlike a chmod)."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    return blocker / "onnx"


def _split_bad_starts(tmp_path: Path, taken_port: int) -> list[BadStart]:
    """Settings only the engine can judge (it holds torch and the model), with the process split."""
    unwritable = _unwritable_cache_dir(tmp_path)
    cases = [
        # each API process bound it after the engine's model had loaded: a traceback each, exit 5
        BadStart("gRPC port taken, two API processes",
                 ("--preset", "tiny", "--grpc-port", str(taken_port), "--api-workers", "2"),
                 ("--grpc-port", str(taken_port), "MMSERVE_GRPC_PORT")),
        BadStart("export cache directory not writable, two engines",
                 ("--preset", "tiny", "--runtime", "onnxruntime", "--export-cache-dir", str(unwritable),
                  "--engines", "2"),
                 ("--export-cache-dir", str(unwritable.parent), "Not a directory"), fails_before_torch=True),
        BadStart("dtype the CPU lacks, two API processes",
                 ("--preset", "tiny", "--device", "cpu", "--dtype", "float16", "--api-workers", "2"),
                 ("--dtype float16", "needs a CUDA device", "--dtype float32"), fails_before_torch=True),
        BadStart("decode device the CPU lacks, two engines",
                 ("--preset", "tiny", "--device", "cpu", "--decode-device", "cuda", "--engines", "2"),
                 ("--decode-device cuda", "--decode-device cpu"), fails_before_torch=True),
        BadStart("runtime the synthetic preset cannot run on, two API processes",
                 ("--preset", "synthetic", "--runtime", "onnxruntime", "--api-workers", "2"),
                 ("--runtime onnxruntime", "--preset synthetic", "--runtime torch")),
    ]
    if not torch.cuda.is_available():
        cases += [BadStart("no CUDA, two API processes", ("--preset", "tiny", "--device", "cuda", "--api-workers", "2"),
                           ("--device cuda", "no CUDA device is visible")),
                  BadStart("devices this machine lacks", ("--preset", "tiny", "--devices", "cuda:0,cuda:1"),
                           ("--devices cuda:0,cuda:1", "engine ", "no CUDA device is visible"))]  # either may be first
    return cases


def _problems(case: BadStart, output: str, returncode: int, expected_returncode: int | None = None) -> list[str]:
    lines = [line for line in output.splitlines() if line.strip() and not line.startswith(IMPORT_TIME_LINE)]
    last = lines[-1] if lines else ""
    problems = []
    if returncode == 0:
        problems.append("exited 0")
    if expected_returncode is not None and returncode != expected_returncode:
        problems.append(f"exited {returncode}, not {expected_returncode}")
    if "Traceback" in output:
        problems.append("printed a traceback")
    problems += [f"last line does not name {name!r}" for name in case.names_in_last_line if name not in last]
    if case.fails_before_loading and MODEL_LOADED in output:
        problems.append("loaded the model before failing")
    if case.fails_before_torch and (imported := MODEL_LIBRARY_IMPORTED.search(output)):
        problems.append(f"imported {imported.group(1)} before failing")
    return problems


def _shown(output: str) -> str:
    """The output's tail as a user sees it: without the import-time lines."""
    return "\n".join(line for line in output.splitlines() if not line.startswith(IMPORT_TIME_LINE))[-1500:]


def _start(case: BadStart, extra_env: dict[str, str]) -> subprocess.Popen:
    env = {**os.environ, "MMSERVE_LOG_LEVEL": "info", **dict(case.env), **extra_env}
    if case.fails_before_torch:
        env["PYTHONPROFILEIMPORTTIME"] = "1"  # inherited by every process the server starts
    port = () if "--port" in case.args else ("--port", "0")  # cases run side by side: never the default 8000
    return subprocess.Popen([*MMSERVE, *case.args, *port], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_every_bad_configuration_ends_in_one_line_naming_its_setting(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cases = _bad_starts(tmp_path, taken.getsockname()[1])
        outputs = []
        for first in range(0, len(cases), PARALLEL_STARTS):
            running = [(case, _start(case, {})) for case in cases[first:first + PARALLEL_STARTS]]
            outputs += [(case, *process.communicate(timeout=300), process.returncode) for case, process in running]
    failures = []
    for case, output, _, returncode in outputs:
        if problems := _problems(case, output, returncode):
            failures.append(f"{case.name}: {', '.join(problems)}\n{_shown(output)}")
    assert not failures, "\n\n".join(failures)


def test_settings_only_an_engine_can_judge_end_as_in_one_process(tmp_path: Path):
    """Exit 2 with the single process's line, however many engines refused; no engine is started again."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cases = _split_bad_starts(tmp_path, taken.getsockname()[1])
        outputs = []
        for first in range(0, len(cases), PARALLEL_STARTS // 2):  # each starts an engine or two and API processes
            running = [(case, _start(case, {})) for case in cases[first:first + PARALLEL_STARTS // 2]]
            outputs += [(case, *process.communicate(timeout=300), process.returncode) for case, process in running]
    failures = []
    for case, output, _, returncode in outputs:
        problems = _problems(case, output, returncode, expected_returncode=2)
        if "started engine" in output:
            problems.append("started an engine again")
        if problems:
            failures.append(f"{case.name}: {', '.join(problems)}\n{_shown(output)}")
    assert not failures, "\n\n".join(failures)


def test_debug_log_level_keeps_the_traceback(tmp_path: Path):
    empty = tmp_path / "empty-model"
    empty.mkdir()
    case = BadStart("debug", ("--model-repo", str(empty), "--port", "0"), (str(empty),))
    output, _ = _start(case, {"MMSERVE_LOG_LEVEL": "debug"}).communicate(timeout=300)
    assert "Traceback" in output
    assert str(empty) in output
