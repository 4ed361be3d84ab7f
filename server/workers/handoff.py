"""How the supervisor hands its settings and paths to the processes it starts (environment variables).

Settings travel as JSON of every field, secrets included (the children are
this server's own processes, started with its environment), so an API process
or the engine runs with exactly the settings ``mmserve serve`` resolved from
flags, environment and file.
"""

from __future__ import annotations

import json
import os
import socket

from pydantic import SecretStr

from server.settings import Settings

SETTINGS_VARIABLE = "MMSERVE_WORKER_SETTINGS_JSON"
ENGINE_SOCKET_VARIABLE = "MMSERVE_WORKER_ENGINE_SOCKET"  # an engine's own socket
ENGINE_SOCKETS_VARIABLE = "MMSERVE_WORKER_ENGINE_SOCKETS"  # every engine's, in engine order (os.pathsep-joined)
ENGINE_INDEX_VARIABLE = "MMSERVE_WORKER_ENGINE_INDEX"  # an engine's number (0: the one holding the monitor)
RUN_DIRECTORY_VARIABLE = "MMSERVE_WORKER_RUN_DIR"
RATE_BUCKETS_VARIABLE = "MMSERVE_WORKER_RATE_BUCKETS"  # the shared bucket table's path, only with a rate limit
METRICS_FD_VARIABLE = "MMSERVE_WORKER_METRICS_FD"  # the metrics port's listening socket, only with metrics_port
SUPERVISOR_PID_VARIABLE = "MMSERVE_WORKER_SUPERVISOR_PID"  # the parent a child must have (server.workers.orphan_guard)
STARTED_UNIX_S_VARIABLE = "MMSERVE_WORKER_STARTED_UNIX_S"  # when the supervisor started: OpenAI's model "created"


def settings_json(settings: Settings) -> str:
    values = settings.model_dump(mode="json")
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if isinstance(value, SecretStr):
            values[name] = value.get_secret_value()
    return json.dumps(values)


def settings_from_environment() -> Settings:
    return Settings(**json.loads(os.environ[SETTINGS_VARIABLE]))


def supervisor_pid() -> int | None:
    """The supervisor's pid as it handed it down (``None`` outside a supervised process)."""
    value = os.environ.get(SUPERVISOR_PID_VARIABLE)
    return int(value) if value else None


def started_unix_s_from_environment() -> int | None:
    """When the supervisor started (Unix seconds), one value for every API process, a restarted one's too."""
    value = os.environ.get(STARTED_UNIX_S_VARIABLE)
    return int(value) if value else None


def engine_sockets_from_environment() -> list[str]:
    """Every engine's socket, in engine order, as an API process was handed them."""
    return os.environ[ENGINE_SOCKETS_VARIABLE].split(os.pathsep)


def metrics_socket_from_environment() -> socket.socket | None:
    """The metrics port's listening socket the supervisor bound and handed down (``None`` without one)."""
    value = os.environ.get(METRICS_FD_VARIABLE)
    return socket.socket(fileno=int(value)) if value else None


def engine_index_from_environment() -> int:
    """This engine's number (0 outside a supervised engine)."""
    return int(os.environ.get(ENGINE_INDEX_VARIABLE, "0"))
