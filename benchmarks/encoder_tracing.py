"""Trace a benchmark's model or stop: a run that says "traced" must not quietly run eager.

``MultimodalModel.trace_encoders`` leaves an encoder eager when its trace
fails or disagrees (the server logs a warning and serves on). A benchmark
that compares traced compute paths has to fail instead.
"""

from __future__ import annotations

from models.multimodal import MultimodalModel


class EncoderNotTracedError(RuntimeError):
    """An encoder stayed eager; the message says which and why."""


def trace_all_encoders(model: MultimodalModel) -> None:
    """Run both encoders as TorchScript graphs, or raise ``EncoderNotTracedError``."""
    failures = [f"the {outcome.encoder} encoder did not trace: {outcome.reason}"
                for outcome in model.trace_encoders() if not outcome.is_traced]
    if failures:
        raise EncoderNotTracedError("; ".join(failures))
