"""The InferenceSession a compute thread calls, in the encoders' ``graph`` seam.

An encoder runs ``(self.graph or self.features)(pixels)`` (vision) or
``(self.graph or self.encode)(input_ids, attention_mask)`` (text);
``OnnxForward`` is such a graph: torch tensors in, a tuple of torch tensors
out, so lanes, batching, the cache and the fusion head see no difference.
On the CPU the conversions share memory both ways (``Tensor.numpy`` and
``torch.from_numpy``); ONNX Runtime allocates each call's outputs.

Threads: ``intra_op_threads`` (the ``compute_threads`` setting; None: ONNX
Runtime's default, one per physical core) and no spinning. A spinning pool
keeps its cores busy between batches, which only shortens the next batch's
start; it costs CPU per request, and it would spin on the same cores as
torch's pool (which runs normalisation and the fusion head) and the other
tower's session. Sessions are built at start-up; every bucket shape is run
during warm-up, so the hot path creates nothing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

GRAPH_OPTIMIZATION = ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def session_options(intra_op_threads: int | None) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = GRAPH_OPTIMIZATION
    options.intra_op_num_threads = intra_op_threads or 0  # 0: ONNX Runtime's default
    options.inter_op_num_threads = 1  # one graph at a time per session: its nodes run in order
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: its warnings name graph rewrites, not faults
    return options


class OnnxForward:
    """An ONNX graph called as a tower's method: torch tensors in, ``(tokens, pooled)`` out.

    ``key_digest`` names the export cache key it came from: a model shared
    between apps (tests) keeps graphs of the same key instead of loading again.
    ``runs_outside_torch``: torch's threads only normalise pixels and run the
    fusion head around it (``MultimodalModel.max_intra_op_threads``).
    """

    runs_outside_torch = True

    def __init__(self, tower: str, path: Path, intra_op_threads: int | None, key_digest: str) -> None:
        self.tower = tower
        self.path = path
        self.key_digest = key_digest
        self.intra_op_threads = intra_op_threads
        self._session = ort.InferenceSession(str(path), session_options(intra_op_threads),
                                             providers=["CPUExecutionProvider"])
        self._input_names = [i.name for i in self._session.get_inputs()]

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feeds = {name: _as_numpy(tensor) for name, tensor in zip(self._input_names, inputs, strict=True)}
        return tuple(torch.from_numpy(out) for out in self._session.run(None, feeds))


def _as_numpy(tensor: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.detach().cpu().numpy())
