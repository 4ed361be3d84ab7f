"""An engine's configuration error at start-up, handed to the supervisor as the one line ``mmserve serve`` prints.

In one process a setting the machine cannot meet (``--dtype float16`` with no
CUDA, ``--runtime onnxruntime`` for the synthetic preset) ends ``mmserve
serve`` with one line naming the setting and exit status 2. With the process
split only the engine can find some of these out (it holds torch and the
model), so it writes the same line to ``<run directory>/engine-<i>.start-failure``
and exits ``EXIT_CONFIGURATION_ERROR``; the supervisor, seeing an engine exit
with that status before its model loaded, stops the server and raises the
line as a ``StartupError``, which the CLI prints as its last line, exit 2. It
is not started again: the same settings would fail the same way. An API
process started with the server does the same (``api-<pid>.start-failure``)
for what only it finds out: a ``--grpc-port`` taken after the supervisor
checked it.

    engine                                       supervisor
    CONFIGURATION_ERRORS while starting
      -> write engine-<i>.start-failure           engine <i> exited 2, never listened
      -> exit 2 (traceback only at debug)           -> read the line, stop everything
                                                    -> StartupError(line): "mmserve: <line>", exit 2
"""

from __future__ import annotations

from pathlib import Path

EXIT_CONFIGURATION_ERROR = 2  # what `mmserve serve` exits with for a setting the user must change


def engine_name(engine_index: int) -> str:
    return f"engine-{engine_index}"


def api_process_name(pid: int) -> str:
    return f"api-{pid}"


def _path(run_directory: str, process_name: str) -> Path:
    return Path(run_directory) / f"{process_name}.start-failure"


def write_start_failure(run_directory: str, process_name: str, reason: str) -> None:
    """Leave ``reason`` (one line naming the setting) for the supervisor; ``process_name``: ``engine_name``'s
    or ``api_process_name``'s."""
    _path(run_directory, process_name).write_text(" ".join(reason.split()), encoding="utf-8")


def read_start_failure(run_directory: str, process_name: str) -> str | None:
    """The line process ``process_name`` left, or ``None`` when it left none."""
    try:
        return _path(run_directory, process_name).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None
