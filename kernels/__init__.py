"""Fused Triton kernels, each beside the torch reference that defines it.

Every op has one dispatcher that checks its inputs and runs either the Triton
kernel (CUDA, or CPU under ``TRITON_INTERPRET=1``) or the torch reference (the
CPU serving path). Importing this package reads no environment and queries no
device; the backend is chosen per call.
"""

from kernels.backend import Backend
from kernels.errors import BackendUnavailableError, KernelError, KernelInputError
from kernels.lowrank_cross_attention import lowrank_cross_attention, lowrank_cross_attention_ref
from kernels.preprocess_uint8 import preprocess_uint8, preprocess_uint8_ref

__all__ = [
    "Backend",
    "BackendUnavailableError",
    "KernelError",
    "KernelInputError",
    "lowrank_cross_attention",
    "lowrank_cross_attention_ref",
    "preprocess_uint8",
    "preprocess_uint8_ref",
]
