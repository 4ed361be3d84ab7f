"""``state.router`` and ``state.router.cache`` in an API process: the engine's state as polled, over its socket.

The routes and the drain read ready, alive, draining, in flight and a fault
from ``state.router``; in an API process those are the engine's as the
client last polled them (``server.workers.engine_client``) and this
process's own. ``DELETE /v1/cache`` empties the engine's cache.
"""

from __future__ import annotations

from server.workers.engine_client import EngineClient, EngineGone
from server.workers.frames import encode_frame, read_frame_blocking
from server.workers.readiness import ReadyMarks


class EngineRouter:
    """What ``state.router`` answers in an API process: the engine's state as last polled, and this process's.

    Ready: this process serves (the engine ready, its connection up, not
    draining), whatever the other API processes do: one starting again leaves
    the server ready, with less capacity (``server.workers.readiness``).
    """

    def __init__(self, client: EngineClient, socket_path: str, marks: ReadyMarks) -> None:
        self._client = client
        self._marks = marks
        self.cache = EngineCache(socket_path)

    @property
    def is_serving(self) -> bool:
        ready, alive, draining = self._client.engine_status
        return ready and alive and not draining and self.fault is None and not self._client.is_draining

    @property
    def is_ready(self) -> bool:
        is_serving = self.is_serving
        self._marks.mark(is_serving)
        return is_serving

    @property
    def is_alive(self) -> bool:
        return self._client.engine_status[1] and self.fault is None

    @property
    def is_draining(self) -> bool:
        return self._client.is_draining

    @property
    def fault(self) -> EngineGone | None:
        return self._client.fault

    @property
    def num_in_flight(self) -> int:
        return self._client.num_in_flight

    def begin_drain(self) -> None:
        self._client.is_draining = True
        self._marks.mark(False)


class EngineCache:
    """``state.router.cache`` in an API process: ``clear()`` empties the engine's cache (``DELETE /v1/cache``).

    A blocking round trip on its own short connection: an operator's call,
    rare, and well under a millisecond, so the admin route stays as it is.
    """

    def __init__(self, socket_path: str) -> None:
        self._socket_path = socket_path

    def clear(self) -> int:
        import socket

        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(10.0)
            connection.connect(self._socket_path)
            connection.sendall(encode_frame(("clear_cache", 0)))
            return read_frame_blocking(connection)[2]
