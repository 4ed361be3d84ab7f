"""How to start each server a benchmark drives: mmserve and its peers (LitServe, Infinity), on free loopback ports.

mmserve is configured by its ``MMSERVE_*`` variables, as an operator does; a
peer gets the same batch cap and delay through its own flags.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from benchmarks.harness.server_process import ServerCommand, free_port


def _mmserve_serve(source: tuple[str, str], settings: Mapping[str, str], device: str,
                   port: int | None) -> ServerCommand:
    port = free_port() if port is None else port
    env = {"MMSERVE_LOG_LEVEL": "warning", **{f"MMSERVE_{name.upper()}": value for name, value in settings.items()}}
    argv = (sys.executable, "-m", "server.cli", "serve", *source, "--port", str(port), "--device", device)
    return ServerCommand("mmserve", argv, port, "/health/ready", env)


def mmserve_command(preset: str, settings: Mapping[str, str], *, device: str = "cpu",
                    port: int | None = None) -> ServerCommand:
    """``mmserve serve --preset PRESET``; ``settings`` are ``MMSERVE_*`` names without the prefix (any case)."""
    return _mmserve_serve(("--preset", preset), settings, device, port)


def mmserve_model_command(model: Path, settings: Mapping[str, str], *, device: str = "cpu",
                          port: int | None = None) -> ServerCommand:
    """``mmserve serve --model DIR`` (a Hugging Face, open_clip or mmserve directory); settings as above."""
    return _mmserve_serve(("--model", str(model)), settings, device, port)


def infinity_command(venv: Path, model: Path, *, served_model_name: str, batch_size: int, device: str = "cpu",
                     port: int | None = None) -> ServerCommand:
    """Infinity (``infinity_emb v2``) serving the Hugging Face directory ``model``, from its own venv.

    ``venv`` is the peer's own virtual environment (``benchmarks.harness.peer_venv``).
    Routes go under ``/v1``, so its embeddings path is mmserve's
    (``/v1/embeddings``); ``/health`` stays where it is. Bound to loopback
    (its default is every interface), usage statistics off. It inherits
    no ``PYTHONPATH``: a worktree's top-level packages (``kernels``,
    ``models``) would shadow names its libraries look for.
    """
    port = free_port() if port is None else port
    argv = (str(venv / "bin" / "infinity_emb"), "v2", "--model-id", str(model),
            "--served-model-name", served_model_name, "--batch-size", str(batch_size), "--device", device,
            "--engine", "torch", "--host", "127.0.0.1", "--port", str(port), "--url-prefix", "/v1",
            "--log-level", "warning")
    env = {"INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    return ServerCommand("infinity", argv, port, "/health", env, unset_env=("PYTHONPATH", "VIRTUAL_ENV"))


def litserve_command(preset: str, *, max_batch_size: int, max_queue_delay_ms: float, device: str = "cpu",
                     is_fast_queue: bool = False, is_traced: bool = False, port: int | None = None) -> ServerCommand:
    """The same preset under LitServe (``benchmarks.peer_litserve_app``), same batch cap and delay.

    ``is_fast_queue`` turns on LitServe's ZeroMQ transport (``fast_queue``);
    ``is_traced`` runs the encoders as TorchScript graphs, as mmserve does by default.
    """
    port = free_port() if port is None else port
    argv = (sys.executable, "-m", "benchmarks.peer_litserve_app", "--preset", preset, "--port", str(port),
            "--device", device, "--max-batch-size", str(max_batch_size),
            "--max-queue-delay-ms", repr(max_queue_delay_ms))
    if is_fast_queue:
        argv += ("--fast-queue",)
    if is_traced:
        argv += ("--torchscript-encoders",)
    return ServerCommand("litserve", argv, port, "/health")
