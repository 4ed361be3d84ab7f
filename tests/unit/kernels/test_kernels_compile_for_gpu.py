"""Both kernels compile for the GPU (sm_90, sm_80) with the launchers' own tile choices.

The interpreter runs kernels in numpy and so accepts code the compiler would
reject (dot shapes, layouts, shared memory). Triton compiles ahead of time for
a named target without a GPU, so the compiled path is checked here too.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.backend import launch_config
from kernels.lowrank_cross_attention import (
    AttentionShape,
    _launch_meta,
    _lowrank_cross_attention_kernel,
    _table_key,
)
from kernels.preprocess_uint8 import _preprocess_uint8_kernel

# Below the 99 KB an sm_86 block may use, the smallest of the targets we serve on.
MAX_SHARED_BYTES = 99 * 1024
_TORCH_TO_TRITON = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _signature(fn: object, pointers: dict[str, str], floats: set[str], constexprs: dict[str, object]) -> dict[str, str]:
    signature = {}
    for name in inspect.signature(fn).parameters:  # type: ignore[arg-type]
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = pointers[name]
        else:
            signature[name] = "fp32" if name in floats else "i32"
    return signature


def _compile(fn: object, signature: dict[str, str], constexprs: dict[str, object], arch: int, num_warps: int) -> int:
    jitted = triton.runtime.JITFunction(fn)
    source = ASTSource(jitted, signature, constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
    return int(compiled.metadata.shared)


@pytest.fixture(autouse=True)
def compiler_mode(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "triton-cache"))


@pytest.mark.parametrize(
    ("dtype", "rank", "arch"),
    [(torch.bfloat16, 16, 90), (torch.float16, 8, 80), (torch.float32, 64, 90)],
    ids=["bf16-r16-sm90", "fp16-r8-sm80", "fp32-r64-sm90"],
)
def test_attention_kernel_compiles_at_serving_shape(dtype: torch.dtype, rank: int, arch: int) -> None:
    # Ragged keys (0 to 4 images of 197 tokens): no key length reaches the constexprs.
    shape = AttentionShape(rank=rank, value_dim=1024, seqlens_q=(77, 5, 9), seqlens_k=(197, 0, 4 * 197))
    config = launch_config(_table_key(dtype), f"sm{arch}")
    meta = _launch_meta(dtype, shape, False, config)
    assert meta["DOT_DTYPE"] == getattr(tl, str(dtype).removeprefix("torch."))
    ty = _TORCH_TO_TRITON[dtype]
    pointers = {"Q": f"*{ty}", "K": f"*{ty}", "V": f"*{ty}", "Out": f"*{ty}", "CuSeqlensQ": "*i32",
                "CuSeqlensK": "*i32"}
    signature = _signature(_lowrank_cross_attention_kernel, pointers, {"scale_log2"}, meta)
    assert _compile(_lowrank_cross_attention_kernel, signature, meta, arch, config.num_warps) <= MAX_SHARED_BYTES


def test_preprocess_kernel_compiles() -> None:
    config = launch_config("preprocess_uint8", "sm90")
    constexprs = dict(config.tiles)
    floats = {f"{name}_{c}" for name in ("scale", "shift") for c in range(3)}
    signature = _signature(_preprocess_uint8_kernel, {"Images": "*u8", "Out": "*bf16"}, floats, constexprs)
    assert _compile(_preprocess_uint8_kernel, signature, constexprs, 90, config.num_warps) <= MAX_SHARED_BYTES
