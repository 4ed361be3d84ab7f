"""The encoders as TorchScript graphs: a whole forward for one hold of the GIL.

Eager PyTorch gives the GIL back around every operator and must take it again
after. In the server the event loop and the decode threads hold it in
between, so an eager forward waits for the GIL once per operator: with one
torch thread, a tiny-preset vision batch of 8 took 0.9 ms traced and 1.1 ms
eager on an idle interpreter, but 53 ms traced and 204 ms eager beside one
busy Python thread (BENCHMARKS.md, history: ``encoder_graphs.py``). A traced module runs
its whole graph in C++ after a single release.

A trace is kept only if it agrees with the eager module on probe inputs that
differ from the traced example (other batch sizes; texts with and without
padding, since transformers skips an all-ones attention mask in Python and a
trace records one branch). A module that does not trace, or whose trace
disagrees, stays eager and ``TraceOutcome`` says why.

The graph executor's optimiser is off for these calls: it would profile the
first runs of each new input shape and re-specialise the graph, which is a
compilation on the hot path. Interpreted, the graph runs the same operators
the eager module runs, so the answers are the same.

TorchScript is deprecated in PyTorch 2.x but still ships in every version
pyproject allows; ``torch.export`` would not do the same job: an exported
program runs operator by operator from Python again.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

Tensors = tuple[torch.Tensor, ...]

# How far a trace may differ from eager; the same operators run, so only
# kernel selection on a GPU can make them differ at all.
_TOLERANCE = {
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (3e-2, 1e-2),
}


class EncoderGraph:
    """A traced forward, called with the graph optimiser off (see the module docstring).

    Not an ``nn.Module``: the trace shares the eager module's parameters, and
    registering it as a submodule would list every weight twice in the
    state dict (and in the model's fingerprint).
    """

    def __init__(self, module: torch.jit.ScriptModule) -> None:
        self._module = module

    def __call__(self, *inputs: torch.Tensor) -> Tensors:
        with torch.jit.optimized_execution(False):
            return self._module(*inputs)


@dataclass(frozen=True)
class TraceOutcome:
    """One encoder's trace: the graph to run, or why it runs eager."""

    encoder: str
    graph: EncoderGraph | None
    reason: str = ""  # why there is no graph

    @property
    def is_traced(self) -> bool:
        return self.graph is not None


class _Forward(nn.Module):
    """Wraps a function of tensors returning a tuple of tensors, the shape ``torch.jit.trace`` takes."""

    def __init__(self, owner: nn.Module, forward: Callable[..., Tensors]) -> None:
        super().__init__()
        self.owner = owner
        self._forward = forward

    def forward(self, *inputs: torch.Tensor) -> Tensors:
        return self._forward(*inputs)


def _max_error(expected: Tensors, actual: Tensors, dtype: torch.dtype) -> str | None:
    """A description of the first output outside tolerance, or ``None`` if all agree."""
    rtol, atol = _TOLERANCE.get(dtype, _TOLERANCE[torch.float32])
    for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
        if want.shape != got.shape:
            return f"output {index} has shape {tuple(got.shape)}, eager {tuple(want.shape)}"
        if not torch.allclose(want.float(), got.float(), rtol=rtol, atol=atol):
            error = (want.float() - got.float()).abs().max().item()
            return f"output {index} differs from eager by up to {error:.3g}"
    return None


def trace(encoder: str, owner: nn.Module, forward: Callable[..., Tensors], example: Tensors,
          probes: Sequence[Tensors], dtype: torch.dtype) -> TraceOutcome:
    """Trace ``forward`` (a method of ``owner``) on ``example``; keep it if it matches eager on ``probes``."""
    wrapper = _Forward(owner, forward).eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # Deprecation and "a tensor converted to a Python value" warnings: the probes decide.
            warnings.simplefilter("ignore")
            module = torch.jit.trace(wrapper, example, check_trace=False)
    except Exception as e:  # noqa: BLE001 - any model may fail to trace; it then runs eager
        return TraceOutcome(encoder, None, f"tracing failed: {type(e).__name__}: {e}")
    graph = EncoderGraph(module)
    with torch.inference_mode():
        for probe in probes:
            mismatch = _max_error(forward(*probe), graph(*probe), dtype)
            if mismatch is not None:
                shapes = ", ".join(str(tuple(t.shape)) for t in probe)
                return TraceOutcome(encoder, None, f"the trace disagrees with eager on inputs {shapes}: {mismatch}")
    return TraceOutcome(encoder, graph)
