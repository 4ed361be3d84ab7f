"""Counting the Triton kernel variants this package compiles, so a server can show none compiles after ready.

A Triton kernel compiles once per specialisation (constexpr tile sizes,
dtypes, pointer alignment) on first launch; on a GPU that is hundreds of
milliseconds inside a request. The server's warm-up launches every variant
its bucket shapes select, and from then on any compile is a cold path that
a user pays for. ``CompileWatch`` hangs on Triton's public
``knobs.runtime.jit_post_compile_hook`` (called after each JIT compile),
chains whatever hook was there before, and counts the compiles of kernels
defined in this package; the server turns compiles after ready into
``mmserve_cold_compiles_total{kind="triton_kernel"}``.

Under the interpreter (``TRITON_INTERPRET=1``) nothing compiles, so nothing
is counted; where Triton is not installed ``install`` does nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kernels.backend import triton

_OUR_MODULE_PREFIX = "kernels."


class CompileWatch:
    """Counts compiles of ``kernels.*`` Triton kernels and calls ``on_compile(description)`` for each."""

    def __init__(self, on_compile: Callable[[str], None] | None = None) -> None:
        self._on_compile = on_compile
        self._lock = threading.Lock()
        self._previous_hook: Callable[..., object] | None = None
        self._is_installed = False
        self.num_compiles = 0

    def install(self) -> bool:
        """Start counting; False where Triton is not installed."""
        if triton is None or self._is_installed:
            return self._is_installed
        self._previous_hook = triton.knobs.runtime.jit_post_compile_hook
        triton.knobs.runtime.jit_post_compile_hook = self.hook
        self._is_installed = True
        return True

    def uninstall(self) -> None:
        """Put back the hook that was there before (only if ours is still the one installed)."""
        if self._is_installed and triton.knobs.runtime.jit_post_compile_hook == self.hook:
            triton.knobs.runtime.jit_post_compile_hook = self._previous_hook
        self._is_installed = False

    def hook(self, *, key: object, repr: str, fn: object, compile: object, is_manual_warmup: bool,
             already_compiled: bool) -> bool | None:
        """Triton's ``JITHook``: called after each compile, with the kernel's function info in ``fn``."""
        if str(getattr(fn, "module", "")).startswith(_OUR_MODULE_PREFIX):
            with self._lock:
                self.num_compiles += 1
            if self._on_compile is not None:
                self._on_compile(repr)
        if self._previous_hook is not None:
            return self._previous_hook(key=key, repr=repr, fn=fn, compile=compile,
                                       is_manual_warmup=is_manual_warmup, already_compiled=already_compiled)
        return None
