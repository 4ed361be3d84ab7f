"""A peer server's own virtual environment, made by the benchmark that needs it.

Infinity 0.0.78 pins transformers < 5 and numpy < 2, which mmserve's
environment cannot hold, so it gets a venv of its own (``python -m venv`` +
pip, reused while its marker file lists the same requirements). The extras
are the smallest that serve CLIP and SigLIP text and images; its ``vision``
extra (colpali-engine, whose pins drag torch releases along) is left out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

INFINITY_REQUIREMENTS = ("infinity-emb[server,torch]==0.0.78", "pillow", "aiohttp", "sentencepiece", "protobuf")
DEFAULT_INFINITY_VENV = Path("~/.cache/mmserve-bench/infinity-venv").expanduser()
_MARKER = "mmserve-bench-requirements.txt"
_INSTALL_TIMEOUT_S = 1800.0


class PeerInstallError(RuntimeError):
    """The venv could not be made or pip could not install into it; the message carries pip's tail."""


def _base_python() -> str:
    """An interpreter to make the venv from: this one's base (not a venv's), so the new venv stands alone."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return str(base) if base.exists() else sys.executable


def ensure_venv(venv: Path, requirements: tuple[str, ...] = INFINITY_REQUIREMENTS) -> Path:
    """``venv`` with ``requirements`` installed (made if missing, reused if its marker lists the same); returns it."""
    venv = Path(venv).expanduser()
    marker = venv / _MARKER
    wanted = "\n".join(requirements) + "\n"
    if marker.exists() and marker.read_text() == wanted:
        return venv
    python = venv / "bin" / "python"
    steps = [[str(python), "-m", "pip", "install", "--quiet", *requirements]]
    if not python.exists():
        if venv.exists():
            shutil.rmtree(venv)  # a half-made venv: start again
        venv.parent.mkdir(parents=True, exist_ok=True)
        steps.insert(0, [_base_python(), "-m", "venv", str(venv)])
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "VIRTUAL_ENV")}
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=_INSTALL_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise PeerInstallError(f"{' '.join(argv)} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    marker.write_text(wanted)
    return venv


def installed_version(venv: Path, distribution: str) -> str:
    """The version pip installed of ``distribution`` in ``venv`` (for the header of the printout)."""
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"
