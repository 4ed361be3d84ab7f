"""HTTP connections for the generator: one single-connection client per request in flight.

Why not one ``httpx.AsyncClient`` with an unbounded pool: httpcore's pool
re-scans every connection for every queued request whenever any request starts
or finishes (quadratic in the connections open). With ~100 requests piled up
behind a stalled server, the burst of answers when the stall ends kept the
event loop busy for hundreds of ms, and the generator, not the server, became
the queue. Here each slot is a client limited to one connection, so httpcore's
bookkeeping is O(1) per request, and the slots themselves are a LIFO free
list: an idle slot (a warm keep-alive connection) is reused, a new one is made
only when every slot is busy. There is no upper bound: an open loop needs one
connection per request in flight, whatever the server does.

All slots share one TLS context (building one per client costs ~30 ms).
"""

from __future__ import annotations

import ssl

import httpx


class ConnectionSlots:
    """A free list of single-connection ``httpx.AsyncClient``s to one base URL."""

    def __init__(self, base_url: str, timeout_s: float, headers: dict[str, str] | None = None) -> None:
        self._base_url = base_url
        self._headers = headers or {}  # on every request (the API key's Authorization)
        self._timeout = httpx.Timeout(timeout_s)
        self._ssl_context = ssl.create_default_context()
        self._idle: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []

    def acquire(self) -> httpx.AsyncClient:
        """An idle slot (most recently used first) or a new one; give it back with ``release``."""
        if self._idle:
            return self._idle.pop()
        client = httpx.AsyncClient(
            base_url=self._base_url,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            timeout=self._timeout,
            headers=self._headers,
            verify=self._ssl_context,
            trust_env=False,
        )
        self._all.append(client)
        return client

    def release(self, client: httpx.AsyncClient) -> None:
        self._idle.append(client)

    @property
    def num_slots(self) -> int:
        """Slots ever opened: the peak number of requests in flight at once."""
        return len(self._all)

    async def aclose(self) -> None:
        for client in self._all:
            await client.aclose()
        self._all.clear()
        self._idle.clear()
