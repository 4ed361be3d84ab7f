"""``state.router`` and ``state.router.cache`` in an API process: the engine's state as polled, over its socket.

The routes and the drain read ready, alive, draining, in flight and a fault
from ``state.router``; in an API process those are the engines' as the
client last polled them (``server.workers.engine_connection``) and this
process's own. ``DELETE /v1/cache`` empties every engine's cache.
"""

from __future__ import annotations

from server.workers.engine_client import EngineClient
from server.workers.readiness import ReadyMarks


class EngineRouter:
    """What ``state.router`` answers in an API process: the engines' state as last polled, and this process's.

    Ready: this process serves (at least one engine ready and connected, not
    draining), whatever the other API processes and engines do: one starting
    again leaves the server ready, with less capacity
    (``server.workers.readiness``). Alive always: an engine that dies is
    started again by the supervisor, and its requests meanwhile go to the
    others (or get 503 ``engine_unavailable`` when none serves).
    """

    def __init__(self, client: EngineClient, marks: ReadyMarks) -> None:
        self._client = client
        self._marks = marks
        self.cache = EngineCaches(client)

    @property
    def is_serving(self) -> bool:
        return self._client.engine_status[0] and not self._client.is_draining

    @property
    def is_ready(self) -> bool:
        is_serving = self.is_serving
        self._marks.mark(is_serving)
        return is_serving

    @property
    def is_alive(self) -> bool:
        return True

    @property
    def is_draining(self) -> bool:
        return self._client.is_draining

    @property
    def fault(self) -> None:
        return None

    @property
    def num_in_flight(self) -> int:
        return self._client.num_in_flight

    def engine_states(self) -> list[dict]:
        """``/v1/models``' ``engines``: each engine, whether it serves, and its waits per lane as last polled."""
        return [{"engine": engine.index, "serving": engine.is_serving,
                 "wait_ms": {lane: round(wait_s * 1e3, 3) for lane, wait_s in engine.waits_s.items()}}
                for engine in self._client.engines]

    def begin_drain(self) -> None:
        self._client.is_draining = True
        self._marks.leave()


class EngineCaches:
    """``state.router.cache`` in an API process: ``clear()`` empties every engine's cache (``DELETE /v1/cache``)."""

    def __init__(self, client: EngineClient) -> None:
        self._client = client

    def clear(self) -> int:
        return self._client.clear_caches()
