"""The encoders on CUDA as captured CUDA graphs: one graph per input shape, captured during warm-up.

    first call of a shape (warm-up)         later calls of that shape
    ──────────────────────────────          ───────────────────────────────────────────
    static inputs  <- synthetic example     static inputs  <- copy_(inputs)     (on device)
    warm the forward twice (side stream)    graph.replay()                      (one launch)
    capture forward into a graph            outputs        <- clone(static outputs)
    replay on the real inputs, compare
    with eager: keep the graph, or run
    this shape eager (``reason``)

Why CUDA graphs and not ``torch.compile``: a ViT-L batch at the sizes the
batcher runs is hundreds of kernels of a few microseconds each, so launch
overhead and the Python between launches (the GIL, shared with the event
loop and the decode threads) are what eager loses to the device; a graph
replays all of them with one launch and no Python. Capture takes milliseconds
per shape, so every (batch bucket x sequence bucket) shape is captured during
warm-up, before ``/health/ready``, while ``torch.compile(mode="max-autotune",
dynamic=False)`` compiles for tens of seconds per shape (minutes of start-up
for a few dozen buckets) and may recompile on a guard it did not foresee --
a compile on the hot path. A graph replays exactly the kernels eager runs,
so its answers are eager's. ``benchmarks/gpu/run.sh`` measures captured
against eager per model; that measurement, not this paragraph, is the
evidence.

A shape is captured on the first call that meets it. The batch runner's
warm-up (``router.runner.BatchRunner.warm_up``) runs every bucket shape before
the server is ready, so every capture happens then; a shape first met after
ready is already a cold shape the runner counts in
``mmserve_cold_compiles_total{kind="shape"}``. ``seal`` stops captures: after
it an unknown shape runs eager.

The capture uses synthetic inputs of the call's shape (``ExampleInputs``),
not the first real call's: a text encoder captured on an all-ones attention
mask would record the branch transformers takes when nothing is padded. The
replay is then checked against the eager forward on the real call; a graph
that disagrees (or a forward that cannot be captured, e.g. one that reads a
value back to the host) leaves that shape eager, and ``reasons`` says why.

Two compute threads may run one encoder (the text encoder serves the text
lane and the fusion lane): a lock orders the copy-in, replay and copy-out of
each call, and on CUDA each call's stream waits for the previous call's
copy-out before it overwrites the static inputs. The graphs of one encoder
share one memory pool (their replays never overlap); each encoder has its own.

The bookkeeping (which shapes, when captured, copy into static buffers,
replay, clone out, sealing, the eager check) does not depend on CUDA:
``RerunBackend`` replays by running the forward again on the static buffers,
which is how the tests exercise it on the CPU.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

logger = logging.getLogger(__name__)

Tensors = tuple[torch.Tensor, ...]
ShapeKey = tuple[tuple[tuple[int, ...], torch.dtype], ...]
ExampleInputs = Callable[[Tensors], Tensors]
"""Synthetic inputs with the shapes, dtypes and devices of the given ones (what the graph is captured on)."""

_TOLERANCE = {torch.float32: (1e-4, 1e-5), torch.float16: (1e-2, 1e-3), torch.bfloat16: (3e-2, 1e-2)}
_NUM_WARM_RUNS = 2  # before capture: cuBLAS handles, workspaces and lazy inits happen outside the graph


def shape_key(inputs: Tensors) -> ShapeKey:
    """What selects a graph: every input's shape and dtype."""
    return tuple((tuple(t.shape), t.dtype) for t in inputs)


@dataclass(frozen=True)
class CapturedGraph:
    """A captured forward: refill ``static_inputs``, call ``replay``, read ``static_outputs``."""

    static_inputs: Tensors
    static_outputs: Tensors
    replay: Callable[[], None]


class GraphBackend(Protocol):
    def capture(self, forward: Callable[..., Tensors], static_inputs: Tensors) -> CapturedGraph: ...

    def ordered(self) -> contextlib.AbstractContextManager[None]:
        """Held around one call's copy-in, replay and copy-out (with the owner's lock)."""
        ...


class CudaGraphBackend:
    """``torch.cuda.CUDAGraph`` capture, one memory pool per backend (per encoder)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pool = torch.cuda.graph_pool_handle()
        self._last_call_done: torch.cuda.Event | None = None

    def capture(self, forward: Callable[..., Tensors], static_inputs: Tensors) -> CapturedGraph:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(_NUM_WARM_RUNS):
                forward(*static_inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the other compute thread's work on its own stream is not part of this capture.
        with torch.inference_mode(), torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            static_outputs = tuple(forward(*static_inputs))
        return CapturedGraph(static_inputs, static_outputs, graph.replay)

    @contextlib.contextmanager
    def ordered(self) -> Iterator[None]:
        stream = torch.cuda.current_stream(self.device)
        if self._last_call_done is not None:
            stream.wait_event(self._last_call_done)  # the previous caller's copy-out, maybe on another stream
        yield
        done = torch.cuda.Event()
        done.record(stream)
        self._last_call_done = done


class RerunBackend:
    """Replays by running the forward again on the static buffers: the graphs' bookkeeping on the CPU.

    No speed-up (nothing is captured); what it keeps is the contract a CUDA
    graph has: inputs must be copied into the buffers it was captured with,
    and its outputs are overwritten by the next replay.
    """

    def __init__(self) -> None:
        self.num_captures = 0

    def capture(self, forward: Callable[..., Tensors], static_inputs: Tensors) -> CapturedGraph:
        self.num_captures += 1
        with torch.inference_mode():
            static_outputs = tuple(t.clone() for t in forward(*static_inputs))

        def replay() -> None:
            with torch.inference_mode():
                for buffer, value in zip(static_outputs, forward(*static_inputs), strict=True):
                    buffer.copy_(value)

        return CapturedGraph(static_inputs, static_outputs, replay)

    def ordered(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def _mismatch(expected: Tensors, actual: Tensors) -> str | None:
    for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
        rtol, atol = _TOLERANCE.get(want.dtype, _TOLERANCE[torch.float32])
        if want.shape != got.shape or not torch.allclose(want.float(), got.float(), rtol=rtol, atol=atol):
            error = (want.float() - got.float()).abs().max().item() if want.shape == got.shape else "shape"
            return f"output {index} differs from eager by up to {error}"
    return None


class CapturedForward:
    """``forward`` replayed from a graph per input shape (see the module docstring)."""

    def __init__(self, name: str, forward: Callable[..., Tensors], example_inputs: ExampleInputs,
                 backend: GraphBackend) -> None:
        self.name = name
        self._forward = forward
        self._example_inputs = example_inputs
        self._backend = backend
        self._graphs: dict[ShapeKey, CapturedGraph | None] = {}  # None: this shape runs eager
        self.reasons: dict[ShapeKey, str] = {}  # why a shape runs eager
        self.is_sealed = False
        self.num_eager_calls_after_seal = 0
        self._lock = threading.Lock()

    @property
    def captured_shapes(self) -> list[ShapeKey]:
        return [key for key, graph in self._graphs.items() if graph is not None]

    def seal(self) -> None:
        """No capture from now on: a shape not captured yet runs eager (and is counted)."""
        self.is_sealed = True

    def __call__(self, *inputs: torch.Tensor) -> Tensors:
        key = shape_key(inputs)
        with self._lock:
            if key not in self._graphs:
                if self.is_sealed:
                    self.num_eager_calls_after_seal += 1
                    return tuple(self._forward(*inputs))
                self._graphs[key] = self._capture(key, inputs)
            graph = self._graphs[key]
            if graph is None:
                return tuple(self._forward(*inputs))
            with self._backend.ordered():
                return self._replay(graph, inputs)

    @staticmethod
    def _replay(graph: CapturedGraph, inputs: Tensors) -> Tensors:
        for buffer, value in zip(graph.static_inputs, inputs, strict=True):
            buffer.copy_(value, non_blocking=True)
        graph.replay()
        return tuple(t.clone() for t in graph.static_outputs)  # the next replay overwrites the static outputs

    def _capture(self, key: ShapeKey, inputs: Tensors) -> CapturedGraph | None:
        """Capture this shape on synthetic inputs, then check the replay on ``inputs`` against eager."""
        try:
            graph = self._backend.capture(self._forward, tuple(self._example_inputs(inputs)))
        except Exception as e:  # noqa: BLE001 - a forward that cannot be captured runs eager
            return self._eager(key, f"capture failed: {type(e).__name__}: {e}")
        with self._backend.ordered():
            replayed = self._replay(graph, inputs)
        with torch.inference_mode():
            eager = tuple(self._forward(*inputs))
        mismatch = _mismatch(eager, replayed)
        if mismatch is not None:
            return self._eager(key, f"the replay disagrees with eager: {mismatch}")
        logger.debug("captured the %s encoder for inputs %s", self.name, key)
        return graph

    def _eager(self, key: ShapeKey, reason: str) -> None:
        self.reasons[key] = reason
        logger.warning("the %s encoder runs eager for inputs %s: %s", self.name,
                       [shape for shape, _ in key], reason)
        return None
