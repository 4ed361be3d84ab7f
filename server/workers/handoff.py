"""How the supervisor hands its settings and paths to the processes it starts (environment variables).

Settings travel as JSON of every field, secrets included (the children are
this server's own processes, started with its environment), so an API process
or the engine runs with exactly the settings ``mmserve serve`` resolved from
flags, environment and file.
"""

from __future__ import annotations

import json
import os

from pydantic import SecretStr

from server.settings import Settings

SETTINGS_VARIABLE = "MMSERVE_WORKER_SETTINGS_JSON"
ENGINE_SOCKET_VARIABLE = "MMSERVE_WORKER_ENGINE_SOCKET"
RUN_DIRECTORY_VARIABLE = "MMSERVE_WORKER_RUN_DIR"
RATE_BUCKETS_VARIABLE = "MMSERVE_WORKER_RATE_BUCKETS"  # the shared bucket table's path, only with a rate limit
SUPERVISOR_PID_VARIABLE = "MMSERVE_WORKER_SUPERVISOR_PID"  # the parent a child must have (server.workers.orphan_guard)


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
