"""Start ``mmserve serve`` as its own process for a benchmark, and stop it cleanly.

A benchmark measures the server as users run it: a separate process, on
loopback, started with settings from the environment, ready only when
``/health/ready`` says so.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def mmserve_process(preset: str, settings: Mapping[str, str] | None = None,
                    ready_timeout_s: float = 600.0) -> Iterator[str]:
    """Yield the base URL of a ready ``mmserve serve --preset PRESET`` on a free port.

    ``settings`` are ``MMSERVE_*`` environment variables without the prefix
    (``{"MAX_BATCH_SIZE": "8"}``).
    """
    port = free_port()
    env = {**os.environ, "MMSERVE_LOG_LEVEL": "warning"}
    env.update({f"MMSERVE_{name}": value for name, value in (settings or {}).items()})
    process = subprocess.Popen(
        [sys.executable, "-m", "server.cli", "serve", "--preset", preset, "--port", str(port), "--device", "cpu"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"mmserve exited during start-up: {process.stderr.read()[-2000:]}")
            try:
                if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"mmserve --preset {preset} was not ready after {ready_timeout_s} s")
            time.sleep(0.2)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
