"""Backend choice per call, and the interpreter chosen at launch rather than at import."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from kernels import Backend, BackendUnavailableError, KernelInputError, lowrank_cross_attention, preprocess_uint8
from kernels.backend import LAUNCH_TABLE, device_arch, launch_config, resolve_backend


@pytest.mark.parametrize(
    ("requested", "device", "expected"),
    [
        ("auto", "cpu", Backend.TORCH),
        ("auto", "cuda", Backend.TRITON),
        ("torch", "cuda", Backend.TORCH),
        ("triton", "cuda", Backend.TRITON),
        ("triton", "cpu", Backend.TRITON),  # the fixture has the interpreter on
        (Backend.TORCH, "cpu", Backend.TORCH),
    ],
)
def test_resolve_backend(requested: str | Backend, device: str, expected: Backend) -> None:
    assert resolve_backend(requested, torch.device(device)) is expected


def test_unknown_backend_name_is_an_input_error() -> None:
    with pytest.raises(KernelInputError, match="'auto', 'triton', 'torch'"):
        resolve_backend("cuda", torch.device("cpu"))


def test_triton_on_cpu_without_interpreter_says_how_to_fix_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")
    q, cu = torch.randn(2, 16), torch.tensor([0, 2], dtype=torch.int32)
    k, v = torch.randn(1, 17, 16), torch.randn(1, 17, 8)
    with pytest.raises(BackendUnavailableError, match="TRITON_INTERPRET=1"):
        lowrank_cross_attention(q, cu, k, v, backend="triton")
    images = torch.zeros(1, 2, 2, 3, dtype=torch.uint8)
    with pytest.raises(BackendUnavailableError, match="TRITON_INTERPRET=1"):
        preprocess_uint8(images, (0.5,) * 3, (0.5,) * 3, torch.float32, backend="triton")
    assert lowrank_cross_attention(q, cu, k, v).shape == (2, 8)  # auto still serves on CPU


_IMPORT_FIRST_SCRIPT = textwrap.dedent(
    """
    import os
    import torch
    import triton.language  # compiler mode, as timm's import causes
    import kernels

    q, cu = torch.randn(5, 16), torch.tensor([0, 1, 5], dtype=torch.int32)
    k, v = torch.randn(2, 17, 16), torch.randn(2, 17, 8)
    try:
        kernels.lowrank_cross_attention(q, cu, k, v, backend="triton")
    except kernels.BackendUnavailableError:
        print("refused-before")
    os.environ["TRITON_INTERPRET"] = "1"
    out = kernels.lowrank_cross_attention(q, cu, k, v, backend="triton")
    ref = kernels.lowrank_cross_attention_ref(q.double(), cu, k.double(), v.double())
    print("max-error", (out.double() - ref).abs().max().item())
    """
)


def test_interpreter_mode_is_decided_at_first_launch_not_at_import() -> None:
    """``kernels`` and ``triton.language`` imported with the interpreter off; switched on later; it runs."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_FIRST_SCRIPT],
        env=env,
        cwd=Path(__file__).resolve().parents[3],  # the repository root, so `kernels` is this checkout's
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    assert lines[0] == "refused-before"
    assert lines[1] == "max-error"
    assert float(lines[2]) <= 1e-5


def test_the_private_triton_combines_exist_and_the_interpreter_runs_them_in_numpy() -> None:
    """The one private Triton API the kernels use: a Triton without it fails here, not in serving."""
    import triton.language as tl
    from triton.runtime import interpreter

    from kernels.backend import row_max_combine, row_sum_combine

    assert row_max_combine is tl.standard._elementwise_max
    assert row_sum_combine is tl.standard._sum_combine
    fast_paths = inspect.getsource(interpreter.ReduceOps.apply_impl)
    assert "tl.standard._elementwise_max" in fast_paths and "tl.standard._sum_combine" in fast_paths


def test_triton_is_pinned_below_the_next_untested_minor_version() -> None:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    (requirement,) = [dep for dep in pyproject["project"]["dependencies"] if dep.startswith("triton")]
    upper = requirement.split(";")[0].split("<")[1]  # "3.9"
    major, minor = (int(part) for part in version("triton").split(".")[:2])
    assert (major, minor) < tuple(int(part) for part in upper.split("."))


def test_every_kernel_has_an_interpreter_and_a_gpu_launch_entry() -> None:
    for kernel, by_arch in LAUNCH_TABLE.items():
        assert {"interpreter", "sm80", "sm90"} <= set(by_arch), kernel
        for config in by_arch.values():
            assert config.num_warps in (1, 2, 4, 8, 16)
            assert all(size & (size - 1) == 0 for size in config.tiles.values()), (kernel, config)


def test_a_device_takes_the_highest_listed_architecture_at_or_below_its_own() -> None:
    table = LAUNCH_TABLE["preprocess_uint8"]
    assert launch_config("preprocess_uint8", "sm86") is table["sm80"]
    assert launch_config("preprocess_uint8", "sm90") is table["sm90"]
    assert launch_config("preprocess_uint8", "sm100") is table["sm90"]
    assert launch_config("preprocess_uint8", "sm75") is table["sm80"]
    assert device_arch(torch.device("cpu")) == "interpreter"
