"""Configuration a user can get wrong at start-up: checked before the model loads, reported in one line.

A user who mistypes a path, asks for CUDA on a machine without it or picks a
port that is taken should learn it at once, in one line that names the
setting and what to do, not after the model has loaded and warmed for a
minute, and not inside a 25-line traceback from Starlette's lifespan:

    check                                  when                  error names
    --config (readable, a mapping, keys)   before anything       --config and the path, or the key and the path
    settings' own validation (pydantic)    before anything       the flag and its variable
    --runtime/--quantize vs what ONNX      before anything       both settings (server.runtime_settings)
      Runtime serves (dtype, synthetic)
    --device cpu with --dtype float16 or   before torch          the setting and what to use instead
      --decode-device cuda (no probe)
    --device / --dtype / --decode-device   before any weight     the setting and what to use instead
      that need a CUDA probe
    --model (a directory or a cached id    before torch          the path or id and how to get it, or the
      holding a config file)                                     files it lacks
    --model-repo (model.yaml parses, its   before torch          the file and the key, or the folder
      tokenizer's folder exists)
    --export-cache-dir (created, written)  before torch, under   --export-cache-dir, the path, the OS's reason
                                           --runtime onnxruntime
    key files, keys                        before any weight     the variable and the file
    --host / --port                        bound before loading  the address and what to change
    --grpc-port / metrics_port             free before loading   the setting, the port and what to change
    metrics_port (API processes)           bound before loading  the same (the supervisor binds it for them)
    ... taken since (ListenerPortError)    as its listener binds the same, from the lifespan (one process,
                                                                 API process or engine)

What can only fail while the model loads (a malformed repository, a config
the family's library refuses) fails inside the app's lifespan; ``OneLineStartupFailure``
keeps Starlette's traceback out of the log for those errors and hands the
error back, so ``mmserve serve`` prints it as its last line and exits 2. With
``--log-level debug`` the traceback is logged as before.

The checks here import no torch (the supervisor of ``--api-workers N`` runs
them too); the device checks that need the machine's answer are
``server.runtime.model_loading.plan_device``, which ``mmserve serve`` runs
before loading in one process and the engine process as it starts. What is
judged here before torch is judged there again, in the same words.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection
from pathlib import Path

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from models.errors import ModelError, ModelRepositoryError
from models.onnx.export_cache import ExportCache
from models.torch_free.device_refusals import refuse_on_cpu
from models.torch_free.model_files import read_repository_config, require_model_files, text_folder
from server.http.auth import ApiKeyConfigError, access_policy
from server.settings import ConfigFileError, Settings
from server.workers.default_count import DeviceProbeError

class ListenerPortError(Exception):
    """A listener the lifespan starts (``--grpc-port``, ``metrics_port``) cannot bind its port: the message names
    the setting. ``check_other_ports`` finds a taken port before the model loads; this is the port taken since."""


# Errors a user fixes by changing a setting: printed as one line, without a traceback.
CONFIGURATION_ERRORS: tuple[type[Exception], ...] = (ModelError, ApiKeyConfigError, DeviceProbeError,
                                                     ConfigFileError, ListenerPortError)


class StartupError(Exception):
    """A start-up failure already phrased for the user: one line naming the setting and what to do."""


def settings_error(error: ValidationError, flags: Collection[str] = ()) -> StartupError:
    """Pydantic's report on ``Settings`` as one line: per field ``--port (MMSERVE_PORT): ... (got 99999)``.

    ``flags``: the settings the command has a flag for (its ``argparse`` destinations); any other is named as
    ``max_batch_size (MMSERVE_MAX_BATCH_SIZE)``, the name its config file and variable take, not a flag the
    command would refuse.

    A validator's own message is given as it was raised (not pydantic's "Value error, ..."), with the value
    only where it does not already say it; a check across settings (no field) is its message alone, which
    names the settings itself, instead of a made-up ``--settings`` and every value the server was given.
    """
    problems = []
    for detail in error.errors():
        message = str(detail["ctx"]["error"]) if detail["type"] == "value_error" else detail["msg"]
        name = ".".join(str(part) for part in detail["loc"])
        if not name:
            problems.append(message)
            continue
        flag = f"{'--' + name.replace('_', '-') if name in flags else name} (MMSERVE_{name.upper()})"
        value = repr(detail.get("input"))
        problems.append(f"{flag}: {message}" + ("" if value in message else f" (got {value})"))
    return StartupError("; ".join(problems))


def check_without_torch(settings: Settings) -> None:
    """The checks that import no model library: keys, the model's files, ``--device cpu``'s refusals and the
    export cache's directory. Each is judged again where it is used (the loaders, ``plan_device``, the export):
    the same refusal, in the same words, from there too."""
    access_policy(settings)  # reads every key file: ApiKeyConfigError names the variable and the file
    if settings.fusion_head is not None:  # a path of the wrong kind, named before the model's files are read
        _check_fusion_head_path(Path(settings.fusion_head))
    if settings.model is not None:
        from models.loading.hub import resolve_model_directory

        # a directory, or a Hub id found in the local cache; holding a config some family is read from
        require_model_files(resolve_model_directory(settings.model))
    elif settings.model_repo is not None:
        if not Path(settings.model_repo).is_dir():
            raise ModelRepositoryError(f"--model-repo {settings.model_repo} (MMSERVE_MODEL_REPO) is not a "
                                       "directory: write one with `mmserve init-model-repo DIR --preset NAME`")
        repository = Path(settings.model_repo)
        text_folder(repository, read_repository_config(repository)[1])  # model.yaml parsed, the tokenizer's folder
    if settings.devices is None:  # --devices: each engine's device is judged with the entry it runs on named
        refuse_on_cpu(device=settings.device, dtype=settings.dtype, decode_device=settings.decode_device)
    if settings.runtime == "onnxruntime":  # auto never refuses for the cache: it serves torch and logs why
        ExportCache(export_cache_dir(settings)).check_writable()


def export_cache_dir(settings: Settings) -> Path:
    """``export_cache_dir``, else ``$XDG_CACHE_HOME/mmserve/onnx`` (``~/.cache/mmserve/onnx``); read at start-up."""
    if settings.export_cache_dir is not None:
        return settings.export_cache_dir
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "mmserve" / "onnx"


def _check_fusion_head_path(path: Path) -> None:
    """``--fusion-head`` names a file: the one ``mmserve train-fusion --out DIR`` wrote, DIR/fusion_head.safetensors."""
    flag = f"--fusion-head {path} (MMSERVE_FUSION_HEAD)"
    if path.is_dir():
        inside = path / "fusion_head.safetensors"
        raise ModelRepositoryError(f"{flag} is a directory, not a safetensors file"
                                   + (f": give the file in it, {inside}" if inside.is_file() else ""))
    if not path.exists():
        raise ModelRepositoryError(f"{flag} does not exist")


def bind_listening_socket(host: str, port: int) -> socket.socket:
    """``host:port`` bound and listening, before the model loads, so a bad address fails in a second."""
    sock = None
    try:
        sock = _bound_socket(host, port)
        sock.listen(2048)
    except OSError as e:  # socket.gaierror included: a host name that does not resolve
        if sock is not None:
            sock.close()
        raise StartupError(f"--host {host} --port {port} (MMSERVE_HOST, MMSERVE_PORT): cannot listen there "
                           f"({e.strerror or e}); choose a free port or an address of this machine") from e
    sock.set_inheritable(True)
    return sock


def _bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` as the server's listeners bind (``SO_REUSEADDR``); ``OSError`` if not."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def check_other_ports(settings: Settings) -> None:
    """``grpc_port`` and ``metrics_port`` free at ``host``, before the model loads (after the HTTP port is bound).

    Their listeners start inside the app's lifespan, once the model has loaded
    (with ``--api-workers N`` in every API process): a port in use ended the
    start there, a minute later, with grpcio's traceback and exit 3. Each is
    bound and closed here, as the listener will bind it (``SO_REUSEADDR``), so
    a port held by another listener, or the HTTP port itself, fails in a second.
    """
    for port, setting in ((settings.grpc_port, "--grpc-port {} (MMSERVE_GRPC_PORT)"),
                          (settings.metrics_port, METRICS_PORT_SETTING)):
        if port is None:
            continue
        try:
            _bound_socket(settings.host, port).close()
        except OSError as e:
            raise StartupError(_port_refusal(setting.format(port), settings.host, port, e)) from e


METRICS_PORT_SETTING = "metrics_port {} (MMSERVE_METRICS_PORT)"  # no flag of its own


def listen_on_metrics_port(settings: Settings) -> socket.socket:
    """``metrics_port`` at ``host`` bound and listening (inheritable: the supervisor hands it to its API
    processes); ``ListenerPortError`` in one line naming the setting if it cannot be."""
    port = settings.metrics_port
    assert port is not None
    sock = None
    try:
        sock = _bound_socket(settings.host, port)
        sock.listen(2048)
    except OSError as e:
        if sock is not None:
            sock.close()
        raise ListenerPortError(_port_refusal(METRICS_PORT_SETTING.format(port), settings.host, port, e)) from e
    sock.set_inheritable(True)
    return sock


def _port_refusal(setting: str, host: str, port: int, error: OSError) -> str:
    """One line: the setting, the address and the system's reason alone (``strerror``, not ``str(error)``)."""
    return f"{setting}: cannot listen on {host}:{port} ({error.strerror or error}); choose a free port"


class OneLineStartupFailure:
    """ASGI wrapper: a configuration error in the lifespan's start-up is kept, not logged as a traceback.

    Starlette reports a failed start-up to the server with the formatted
    traceback as the message, then re-raises. The report is held back until
    the error arrives here: for a ``CONFIGURATION_ERRORS`` error (and unless
    ``is_debug``) it goes on with an empty message, which uvicorn does not
    log, and the error is kept in ``error`` for the caller to print.
    """

    def __init__(self, app: ASGIApp, *, is_debug: bool) -> None:
        self.app = app
        self._is_debug = is_debug
        self.error: Exception | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        held: list[Message] = []

        async def send_holding_failure(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                held.append(message)
                return
            await send(message)

        try:
            await self.app(scope, receive, send_holding_failure)
        except CONFIGURATION_ERRORS as e:
            if held:
                self.error = None if self._is_debug else e
                await send(held[0] if self._is_debug else {**held[0], "message": ""})
            raise
        except BaseException:
            if held:
                await send(held[0])
            raise
        if held:  # failed without raising here (not Starlette's way, but keep the report)
            await send(held[0])
