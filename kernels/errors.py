"""Typed errors of the kernels package.

Both derive from the builtin a caller would expect (``ValueError`` for bad
arguments, ``RuntimeError`` for a backend that cannot run here), so code that
only knows the builtins still catches them.
"""


class KernelError(Exception):
    """Base class of everything the kernels package raises on purpose."""


class KernelInputError(KernelError, ValueError):
    """An argument has the wrong shape, dtype, stride, device or value."""


class BackendUnavailableError(KernelError, RuntimeError):
    """The requested backend cannot run on these tensors in this process."""
