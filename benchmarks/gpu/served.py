"""Images/s served end to end at saturation: ``mmserve serve --model`` driven by wrk with KServe v2 binary bodies.

One ``image_uint8`` input [N, S, S, 3] per request, already at the model's
input size (no decode, no resize), ``image_embedding`` asked back as binary:
the serving path with the least per-image Python. The segment cache is off
and every row is a different image, so every image is computed. wrk keeps
``connections`` requests in flight; images/s = requests x rows / duration.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WRK_SCRIPT = """
wrk.method = "POST"
local f = assert(io.open(os.getenv("MMSERVE_BODY_FILE"), "rb"))
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = os.getenv("MMSERVE_HEADER_LENGTH")
done = function(summary, latency, requests)
  io.write(string.format("MMSERVE_WRK requests=%d non2xx=%d socket_errors=%d duration_us=%d p50_us=%d p99_us=%d\\n",
    summary.requests, summary.errors.status, summary.errors.connect + summary.errors.read + summary.errors.write
    + summary.errors.timeout, summary.duration, latency:percentile(50), latency:percentile(99)))
end
"""
_WRK_LINE = re.compile(r"MMSERVE_WRK requests=(\d+) non2xx=(\d+) socket_errors=(\d+) duration_us=(\d+) "
                       r"p50_us=(\d+) p99_us=(\d+)")


def served_arguments(description: str, budget_s: float) -> argparse.ArgumentParser:
    """The options of every served measurement: batch, rows per request, wrk's load, the time budget, the model."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--batch-size", type=int, default=32, help="the vision batch (and real_model's raw forward's)")
    parser.add_argument("--rows-per-request", type=int, default=8, help="images per KServe request")
    parser.add_argument("--connections", type=int, default=64, help="requests in flight (engines.py: per engine)")
    parser.add_argument("--duration-s", type=int, default=10, help="each served measurement (after 2 s warm-up)")
    parser.add_argument("--budget-s", type=float, default=budget_s, help="skip what would not fit")
    parser.add_argument("--model-dir", type=Path, help="reuse a model written before (default: write one)")
    return parser


@dataclass(frozen=True)
class BinaryBody:
    body: bytes
    header_length: int


def kserve_uint8_body(images: np.ndarray) -> BinaryBody:
    """A KServe v2 binary request: ``image_uint8`` [N, H, W, 3] as raw bytes, ``image_embedding`` back as binary."""
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[3] != 3:
        raise ValueError(f"expected (N, H, W, 3) uint8, got {images.dtype} {images.shape}")
    data = np.ascontiguousarray(images).tobytes()
    header = json.dumps({
        "inputs": [{"name": "image_uint8", "datatype": "UINT8", "shape": list(images.shape),
                    "parameters": {"binary_data_size": len(data)}}],
        "outputs": [{"name": "image_embedding", "parameters": {"binary_data": True}}],
    }, separators=(",", ":")).encode()
    return BinaryBody(header + data, len(header))


@dataclass(frozen=True)
class WrkResult:
    num_requests: int
    num_non_2xx: int
    num_socket_errors: int
    duration_s: float
    p50_ms: float
    p99_ms: float

    def images_per_s(self, rows_per_request: int) -> float:
        return self.num_requests * rows_per_request / self.duration_s if self.duration_s > 0 else 0.0


def parse_wrk(output: str) -> WrkResult:
    """The summary line ``WRK_SCRIPT`` prints."""
    match = _WRK_LINE.search(output)
    if match is None:
        raise ValueError(f"no wrk summary in its output: {output[-400:]!r}")
    requests, non_2xx, socket_errors, duration_us, p50_us, p99_us = (int(g) for g in match.groups())
    return WrkResult(requests, non_2xx, socket_errors, duration_us / 1e6, p50_us / 1e3, p99_us / 1e3)


def find_wrk() -> str | None:
    """wrk on PATH, or unpacked from the carried .deb (``WRK`` names it explicitly)."""
    return os.environ.get("WRK") or shutil.which("wrk")


@dataclass
class Server:
    process: subprocess.Popen
    url: str
    log_path: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_server(model_dir: Path, env: dict[str, str], ready_timeout_s: float, device: str = "cuda",
                 extra_args: Sequence[str] = ()) -> Server:
    """``mmserve serve --model DIR [extra_args]`` on a free port, once ``/health/ready`` answers 200."""
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log_path = Path(tempfile.mkstemp(prefix="mmserve-gpu-", suffix=".log")[1])
    command = [sys.executable, "-m", "server.cli", "serve", "--model", str(model_dir), "--device", device,
               "--port", str(port), *extra_args]
    process = subprocess.Popen(command, env={**os.environ, "MMSERVE_LOG_LEVEL": "warning",
                                             "MMSERVE_CACHE_IMAGE_BYTES": "0", **env},
                               stdout=log_path.open("w"), stderr=subprocess.STDOUT)
    server = Server(process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited during start-up: {log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"{server.url}/health/ready", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    server.stop()
    raise TimeoutError(f"not ready after {ready_timeout_s:.0f}s: {log_path.read_text()[-2000:]}")


def run_wrk(wrk: str, url: str, model_name: str, body: BinaryBody, connections: int, duration_s: int,
            threads: int = 4) -> WrkResult:
    """POST ``body`` to the model's v2 infer endpoint with ``connections`` in flight for ``duration_s``."""
    from urllib.parse import quote

    workdir = Path(tempfile.mkdtemp(prefix="mmserve-wrk-"))
    (workdir / "body.bin").write_bytes(body.body)
    (workdir / "post.lua").write_text(WRK_SCRIPT)
    env = {**os.environ, "MMSERVE_BODY_FILE": str(workdir / "body.bin"),
           "MMSERVE_HEADER_LENGTH": str(body.header_length)}
    target = f"{url}/v2/models/{quote(model_name, safe='')}/infer"
    done = subprocess.run([wrk, "-t", str(threads), "-c", str(connections), "-d", f"{duration_s}s", "--timeout", "30s",
                           "-s", str(workdir / "post.lua"), target], env=env, capture_output=True, text=True,
                          timeout=duration_s + 60)
    return parse_wrk(done.stdout + done.stderr)


def scrape(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/metrics", timeout=10).text


def post_image_embeddings(url: str, model_name: str, encoded: list[bytes]) -> np.ndarray:
    """(N, E) float32: one OpenAI ``/v1/embeddings`` call with the images as ``data:`` URIs, one intake call.

    The server decodes them (on the device with ``--decode-device cuda``, as one batch); the embeddings
    come back in input order.
    """
    import base64

    import httpx

    inputs = [f"data:image/jpeg;base64,{base64.b64encode(data).decode()}" for data in encoded]
    response = httpx.post(f"{url}/v1/embeddings", json={"model": model_name, "input": inputs}, timeout=120)
    response.raise_for_status()
    data = sorted(response.json()["data"], key=lambda item: item["index"])
    return np.asarray([item["embedding"] for item in data], dtype=np.float32)  # (N, E)


def metric_value(exposition: str, series: str) -> float | None:
    """One series' value, named with its labels as the exposition writes them (``name{label="v"}``); None if absent."""
    for line in exposition.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def metric_sum(exposition: str, name: str) -> float | None:
    """The sum of every sample of ``name`` (all label sets); None when the series is absent."""
    values = [float(line.rsplit(" ", 1)[1]) for line in exposition.splitlines()
              if line.startswith(name) and (line[len(name)] in " {") and not line.startswith("#")]
    return sum(values) if values else None
