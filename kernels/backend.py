"""Which implementation runs an op (the Triton kernel or its torch reference), and how a kernel launches.

The choice is made on every call, from the tensors' device and the process
environment at that moment, never at import. ``triton.jit`` decides between the
compiler and the interpreter (``TRITON_INTERPRET=1``) when it wraps a function,
so kernels are wrapped lazily, on first launch, once per mode: a process that
imported ``kernels`` before a test switched the interpreter on still gets the
interpreter when it launches.

This module is the one place that imports Triton (``triton`` and ``tl`` are
None where it is not installed) and the one table of launch parameters
(``LAUNCH_TABLE``), so no kernel copies either.
"""

import enum
import functools
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kernels.errors import BackendUnavailableError, KernelInputError

try:  # Triton ships for Linux x86_64 only; elsewhere every op runs its torch reference.
    import triton
    import triton.language as tl

    # Reductions inside kernels use ``tl.reduce`` with Triton's own combine
    # functions, the one private Triton API here (pyproject pins ``triton`` below
    # the next minor version; tests/unit/kernels/test_kernels_backend.py fails on
    # a version without them). The public ways do not work in both modes:
    # ``tl.max`` / ``tl.sum`` are ``@triton.jit`` functions fixed to compiler or
    # interpreter mode when ``triton.language`` is first imported (often by timm,
    # long before a test sets TRITON_INTERPRET=1) and raise "Cannot call
    # @triton.jit'd outside of the scope of a kernel" in the other; a combine of
    # our own passed as a constexpr is not unwrapped by ``tl.reduce`` when
    # compiled (triton 3.8), and interpreted it takes a per-element Python path
    # (~0.4 s per 64x64 reduce) where these two run in numpy. ``tl.reduce``
    # itself is a builtin both modes patch at launch.
    row_max_combine = tl.standard._elementwise_max
    row_sum_combine = tl.standard._sum_combine
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None
    row_max_combine = row_sum_combine = None


class Backend(enum.StrEnum):
    """``AUTO`` is Triton on CUDA tensors and torch everywhere else."""

    AUTO = "auto"
    TRITON = "triton"
    TORCH = "torch"


def parse_backend(value: Backend | str) -> Backend:
    """A ``Backend`` from its name; an unknown name is a ``KernelInputError``."""
    try:
        return Backend(value)
    except ValueError as e:
        names = ", ".join(repr(b.value) for b in Backend)
        raise KernelInputError(f"backend must be one of {names}, got {value!r}") from e


def is_triton_installed() -> bool:
    """Triton ships for Linux x86_64 only; elsewhere every op runs its torch reference."""
    return importlib.util.find_spec("triton") is not None


def is_interpreter_enabled() -> bool:
    """Whether a kernel wrapped now would run under the Triton interpreter (read now, not cached)."""
    import triton

    return bool(triton.knobs.runtime.interpret)


def resolve_backend(backend: Backend | str, device: torch.device) -> Backend:
    """The concrete backend (``TRITON`` or ``TORCH``) that runs an op on ``device``.

    ``"triton"`` on CPU tensors is accepted only under the interpreter, which is
    how tests show the kernel and the reference agree without a GPU.
    """
    choice = parse_backend(backend)
    if choice is Backend.AUTO:
        is_cuda = device.type == "cuda"
        return Backend.TRITON if is_cuda and is_triton_installed() else Backend.TORCH
    if choice is Backend.TORCH:
        return choice
    if not is_triton_installed():
        raise BackendUnavailableError("backend='triton' needs the triton package, which is not installed")
    if device.type == "cuda":
        return choice
    if device.type == "cpu":
        if not is_interpreter_enabled():
            raise BackendUnavailableError(
                "backend='triton' on CPU tensors runs only under the Triton interpreter: "
                "set TRITON_INTERPRET=1 before launching, or use backend='torch'"
            )
        return choice
    raise BackendUnavailableError(f"backend='triton' supports cuda and cpu tensors, got device {device}")


def jit_kernel(fn: Callable[..., None]) -> Any:
    """``triton.jit(fn)`` for the mode in force now, built once per (function, mode)."""
    return _jit_kernel_for_mode(fn, is_interpreter_enabled())


@functools.cache
def _jit_kernel_for_mode(fn: Callable[..., None], is_interpret: bool) -> Any:
    # ``is_interpret`` is part of the cache key only: triton.jit reads the same
    # setting itself while it wraps ``fn``.
    import triton

    return triton.jit(fn)


@dataclass(frozen=True)
class LaunchConfig:
    """One kernel's launch parameters on one architecture: tile sizes (constexprs, upper bounds) and warps."""

    tiles: Mapping[str, int]
    num_warps: int


INTERPRETER_ARCH = "interpreter"

# Launch parameters per kernel and architecture. Fixed, not autotuned: a fixed
# table compiles exactly one variant per bucket shape, which the server's
# warm-up (every bucket shape, before ready) compiles, so nothing tunes or
# compiles after ready. A device takes the entry of the highest architecture
# at or below its own (sm_86 and sm_89 take sm80's). The interpreter runs the
# GPU tiles, so the CPU tests cover the tiles the GPU runs.
#
#   lowrank_cross_attention/*: BLOCK_M query rows x BLOCK_N keys x BLOCK_D value
#     columns, capped further by each call's shape. fp32 dots run on FMA units
#     ("ieee") and stage operands through shared memory; the smaller fp32 tiles
#     keep that under ~100 KB (the 99 KB of sm_86, the smallest we serve on).
#   preprocess_uint8: BLOCK pixels per program; a pure streaming kernel, bound
#     by memory, where 1024 pixels x 4 warps saturates sm_80 and sm_90 alike.
_HALF_ATTENTION = LaunchConfig({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_D": 128}, num_warps=4)
_FP32_ATTENTION = LaunchConfig({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_D": 64}, num_warps=4)
_PREPROCESS = LaunchConfig({"BLOCK": 1024}, num_warps=4)
LAUNCH_TABLE: Mapping[str, Mapping[str, LaunchConfig]] = {
    "lowrank_cross_attention/half": dict.fromkeys((INTERPRETER_ARCH, "sm80", "sm90"), _HALF_ATTENTION),
    "lowrank_cross_attention/fp32": dict.fromkeys((INTERPRETER_ARCH, "sm80", "sm90"), _FP32_ATTENTION),
    "preprocess_uint8": dict.fromkeys((INTERPRETER_ARCH, "sm80", "sm90"), _PREPROCESS),
}


def device_arch(device: torch.device) -> str:
    """``"interpreter"`` for CPU tensors (Triton runs there only interpreted), else ``"sm<major><minor>"``."""
    if device.type != "cuda":
        return INTERPRETER_ARCH
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm{major}{minor}"


def launch_config(kernel: str, arch: str) -> LaunchConfig:
    """``kernel``'s entry for ``arch``: its own, else the highest listed architecture below it, else the lowest."""
    by_arch = LAUNCH_TABLE[kernel]
    if arch in by_arch:
        return by_arch[arch]
    listed = sorted((int(name.removeprefix("sm")), name) for name in by_arch if name.startswith("sm"))
    number = int(arch.removeprefix("sm"))
    below = [name for value, name in listed if value <= number]
    return by_arch[below[-1] if below else listed[0][1]]
