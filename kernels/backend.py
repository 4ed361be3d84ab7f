"""Which implementation runs an op: the Triton kernel or its torch reference.

The choice is made on every call, from the tensors' device and the process
environment at that moment, never at import. ``triton.jit`` decides between the
compiler and the interpreter (``TRITON_INTERPRET=1``) when it wraps a function,
so kernels are wrapped lazily, on first launch, once per mode: a process that
imported ``kernels`` before a test switched the interpreter on still gets the
interpreter when it launches.
"""

import enum
import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import torch

from kernels.errors import BackendUnavailableError, KernelInputError


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
