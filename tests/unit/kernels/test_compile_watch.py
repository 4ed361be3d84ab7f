"""CompileWatch counts compiles of our kernels through Triton's post-compile hook and chains the previous hook."""

from __future__ import annotations

from types import SimpleNamespace

import triton

from kernels.compile_watch import CompileWatch


def _call(watch: CompileWatch, module: str) -> object:
    return triton.knobs.runtime.jit_post_compile_hook(
        key=("k",), repr=f"{module}.kernel[num_warps=4]", fn=SimpleNamespace(module=module, name="kernel"),
        compile={}, is_manual_warmup=False, already_compiled=False)


def test_counts_only_our_kernels_and_chains_the_hook_that_was_there():
    seen_by_previous: list[str] = []
    before = triton.knobs.runtime.jit_post_compile_hook

    def previous(**kwargs: object) -> None:
        seen_by_previous.append(str(kwargs["repr"]))

    triton.knobs.runtime.jit_post_compile_hook = previous
    described: list[str] = []
    watch = CompileWatch(described.append)
    try:
        assert watch.install()
        _call(watch, "kernels.lowrank_cross_attention")
        _call(watch, "somebody_else.kernels")
        assert watch.num_compiles == 1
        assert described == ["kernels.lowrank_cross_attention.kernel[num_warps=4]"]
        assert len(seen_by_previous) == 2  # the previous hook still sees every compile
        watch.uninstall()
        assert triton.knobs.runtime.jit_post_compile_hook is previous
    finally:
        triton.knobs.runtime.jit_post_compile_hook = before
