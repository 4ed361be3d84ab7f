"""Which floating-point type the served model computes in (``--dtype``).

    setting    cuda (bf16 supported)   cuda (no bf16)   cpu
    auto       bfloat16                float16          float32
    float32    float32                 float32          float32
    bfloat16   bfloat16                refused          bfloat16
    float16    float16                 float16          refused

Half precision is what accelerators are built for: an H100/H200 does about
fifteen times the dense bf16 matrix work of its plain fp32 units, and every
server users compare us with serves these encoders in bf16/fp16 by default.
On a CPU float32 is the default: float16 matrix work has no fast path on
most x86 CPUs, so asking for it there is refused rather than served slowly;
bfloat16 is allowed (AVX-512 BF16 and AMX run it; elsewhere it is correct but
slow).

Whatever the compute dtype, the embeddings the server answers with are float32
numbers, the calibrated scores are computed in float32 from them, and the
fusion head's matrix products accumulate in float32 (``models.fusion``,
``kernels``). The dtype is part of the model's fingerprint, so answers
computed in one dtype never come out of the segment cache for another.

The device is asked when ``resolve_dtype`` is called, at start-up, never at
import.
"""

from __future__ import annotations

import torch

from models.errors import DeviceSettingError, ModelRepositoryError
from models.torch_free.device_refusals import float16_on_cpu

DTYPE_SETTINGS: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
SERVED_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``; names one of ``SERVED_DTYPES``."""
    try:
        return _TORCH_DTYPES[name]
    except KeyError as e:
        raise ModelRepositoryError(f"dtype {name!r} is not one of {SERVED_DTYPES}") from e


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return next(name for name, value in _TORCH_DTYPES.items() if value == dtype)


def is_bf16_supported(device: torch.device) -> bool:
    """Whether ``device`` runs bfloat16 natively (CUDA compute capability 8.0 and newer); True on CPU."""
    if device.type != "cuda":
        return True
    return torch.cuda.is_bf16_supported(including_emulation=False)


def resolve_dtype(setting: str, device: str | torch.device) -> str:
    """The dtype to serve for ``setting`` on ``device`` (the module docstring's table); refuses what cannot run.

    Raises ``DeviceSettingError`` with the reason and what to use instead.
    """
    device = torch.device(device)
    if setting not in DTYPE_SETTINGS:
        raise DeviceSettingError(f"dtype {setting!r} is not one of {DTYPE_SETTINGS}")
    is_cuda = device.type == "cuda"
    if setting == "auto":
        if not is_cuda:
            return "float32"
        return "bfloat16" if is_bf16_supported(device) else "float16"
    if setting == "float16" and not is_cuda:
        raise float16_on_cpu()
    if setting == "bfloat16" and is_cuda and not is_bf16_supported(device):
        raise DeviceSettingError(
            f"--dtype bfloat16 (MMSERVE_DTYPE) needs a GPU of compute capability 8.0 or newer; "
            f"{torch.cuda.get_device_name(device)} has none. Use --dtype float16 (what auto picks there)")
    return setting
