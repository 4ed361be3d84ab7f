"""What a running mmserve says computes its towers: runtime, dtype, quantization (one ``POST /v1/infer``).

Benchmarks that compare runtimes ask the server rather than trust the flag
they passed (``--runtime auto`` picks per model and machine, and falls back
to torch with a log line where ONNX Runtime cannot serve), print what it
said in their tables, and stop when it is not what they set out to measure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.harness import ServerProcess, mmserve_model_command, resumed, start_paused

_PROBE_TEXT = "a photo of a cat"


@dataclass(frozen=True)
class ServedRuntime:
    """The answer's ``model`` object, the parts that say what computes."""

    runtime: str  # "torch" | "onnxruntime"
    dtype: str
    quantization: str  # "none" | "int8"
    int8_cosine: float | None

    def label(self) -> str:
        """``onnxruntime float32``, ``onnxruntime int8 (cosine 0.9987)``: a table's runtime cell."""
        if self.quantization == "none":
            return f"{self.runtime} {self.dtype}"
        cosine = "" if self.int8_cosine is None else f" (cosine {self.int8_cosine:.4f})"
        return f"{self.runtime} {self.quantization}{cosine}"


class RuntimeMismatchError(RuntimeError):
    """The server serves under another runtime or quantization than the benchmark asked for."""


def served_runtime(url: str, timeout_s: float = 60.0) -> ServedRuntime:
    """Ask the mmserve at ``url`` (one text request, cache off) what runs its towers."""
    with httpx.Client(base_url=url, timeout=timeout_s, trust_env=False) as client:
        response = client.post("/v1/infer", json={"text": _PROBE_TEXT, "use_cache": False})
        model = response.raise_for_status().json()["model"]
    return ServedRuntime(model["runtime"], model["dtype"], model.get("quantization", "none"),
                         model.get("int8_cosine"))


def expected_runtime(asked: str, device: str) -> str:
    """The runtime ``--runtime asked`` should serve on ``device``: ``auto`` is ONNX Runtime on the CPU."""
    if asked != "auto":
        return asked
    return "onnxruntime" if device == "cpu" else "torch"


def check_served(served: ServedRuntime, asked: str, device: str, quantize: str | None) -> None:
    """Raise ``RuntimeMismatchError`` unless ``served`` is what ``--runtime asked [--quantize]`` should give."""
    want_runtime = expected_runtime(asked, device)
    want_quantization = quantize or "none"
    if served.runtime != want_runtime or served.quantization != want_quantization:
        raise RuntimeMismatchError(
            f"asked --runtime {asked}{'' if quantize is None else ' --quantize ' + quantize} on {device}, "
            f"expected {want_runtime}/{want_quantization}; the server says {served.runtime}/{served.quantization} "
            "(see its log for why)")


@dataclass(frozen=True)
class MmserveRuntime:
    """What mmserve is asked to run its towers with (``--runtime``, ``--quantize``), on which device."""

    runtime: str
    quantize: str | None
    device: str

    def settings(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` (``MMSERVE_*`` names without the prefix) with this runtime and quantization."""
        quantize = {} if self.quantize is None else {"QUANTIZE": self.quantize}
        return {**base, "RUNTIME": self.runtime, **quantize}


def start_checked(directory: Path, asked: MmserveRuntime, settings: Mapping[str, str],
                  ready_timeout_s: float) -> tuple[ServerProcess, ServedRuntime]:
    """``mmserve serve --model directory`` as ``asked``, checked to serve under that runtime, left paused."""
    command = mmserve_model_command(directory, asked.settings(settings), device=asked.device)
    server = start_paused(command, ready_timeout_s)
    try:
        with resumed(server):
            served = served_runtime(server.url)
        check_served(served, asked.runtime, asked.device, asked.quantize)
    except BaseException:
        server.stop()
        raise
    return server, served
