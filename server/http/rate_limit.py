"""Per-key request rate limits: token buckets, checked before a byte of the body is read.

``MMSERVE_RATE_LIMIT=N/s[,burst=M]`` gives each caller a bucket of M tokens
(default N: one second's worth) refilled at N per second; a request takes one.
The caller is the API key (by its ``key_id``, which ``ApiKeyAuth`` puts on the
ASGI scope), or, for a request that carries no configured key, the client's
address. An empty bucket answers 429 ``rate_limited`` with ``Retry-After``:
the seconds until the bucket holds a token again, rounded up.

    AccessLog -> CORS -> ApiKeyAuth (sets key_id) -> RateLimit -> ... -> body read

Health, metrics and docs are never limited. Refusals are counted in
``mmserve_rate_limited_total{key_id}``; for address-limited callers the label
is the constant ``client-address``, never the address, so the series stay few
and hold no personal data (each 429 also has its access-log line, with the key id if any).

The buckets live behind ``TokenBucketStore``. ``InProcessTokenBuckets`` holds
them in this process's memory; with several API processes in front of one
engine the limit must hold for the server as a whole, which
``server.workers.shared_rate_buckets.SharedTokenBuckets`` gives by implementing
the same ``take`` (one atomic refill-and-take per call) over a table in shared
memory every API process maps.
"""

from __future__ import annotations

import math
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter
from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import ApiError
from server.http.access_policy import is_never_rate_limited
from server.http.error_shapes import error_response
from server.http.keys import KEY_ID_HEX_DIGITS, SCOPE_KEY_ID

ADDRESS_KEY_ID = "client-address"
DEFAULT_MAX_BUCKETS = 65_536
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*s\s*(?:,\s*burst\s*=\s*(\d+)\s*)?$")


@dataclass(frozen=True)
class RateLimit:
    """``per_s`` tokens a second into a bucket of ``burst`` tokens."""

    per_s: float
    burst: int

    @classmethod
    def parse(cls, text: str) -> RateLimit:
        """``"100/s"`` or ``"100/s,burst=20"``; ValueError naming MMSERVE_RATE_LIMIT otherwise."""
        match = _RATE.match(text)
        if match is None:
            raise ValueError(f"MMSERVE_RATE_LIMIT {text!r}: expected N/s or N/s,burst=M")
        per_s = float(match.group(1))
        burst = int(match.group(2)) if match.group(2) is not None else math.ceil(per_s)
        if per_s <= 0 or burst < 1:
            raise ValueError(f"MMSERVE_RATE_LIMIT {text!r}: the rate must be > 0 and the burst >= 1")
        return cls(per_s, burst)

    def __str__(self) -> str:
        return f"{self.per_s:g}/s,burst={self.burst}"


class TokenBucketStore(Protocol):
    """Where buckets live. ``take`` refills the caller's bucket, takes a token if there is one, atomically."""

    def take(self, caller: str, now_ns: int) -> float:
        """0.0 when a token was taken, else the seconds until the bucket holds one."""
        ...


class InProcessTokenBuckets:
    """Buckets in this process's memory (one event loop: no lock needed between await points).

    At most ``max_buckets`` callers are held; past that the one seen longest
    ago is forgotten (it starts full again when it returns), which bounds the
    memory a flood of client addresses can take.
    """

    def __init__(self, limit: RateLimit, max_buckets: int = DEFAULT_MAX_BUCKETS) -> None:
        self.limit = limit
        self.max_buckets = max_buckets
        self._ns_per_token = 1e9 / limit.per_s
        self._buckets: OrderedDict[str, tuple[float, int]] = OrderedDict()  # caller -> (tokens, updated_ns)

    def take(self, caller: str, now_ns: int) -> float:
        burst = self.limit.burst
        tokens, updated_ns = self._buckets.pop(caller, (float(burst), now_ns))
        tokens = min(float(burst), tokens + max(0, now_ns - updated_ns) / self._ns_per_token)
        wait_s = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait_s = (1.0 - tokens) * self._ns_per_token / 1e9
        self._buckets[caller] = (tokens, now_ns)  # most recently seen last
        if len(self._buckets) > self.max_buckets:
            self._buckets.popitem(last=False)
        return wait_s

    def __len__(self) -> int:
        return len(self._buckets)


def retry_after_s(wait_s: float) -> int:
    """Whole seconds a client should wait: ``wait_s`` rounded up (a token is there by then)."""
    return max(1, math.ceil(wait_s - 1e-9))


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return client[0] if client else "unknown"


class RateLimiter:
    """Takes a token for one caller or gives the 429 to answer; one per app, shared by HTTP and gRPC.

    The caller is ``key:<key_id>`` for a recognised key, else ``addr:<address>``.
    """

    def __init__(self, store: TokenBucketStore, registry: CollectorRegistry | None = None,
                 clock_ns: Callable[[], int] = time.monotonic_ns, limit_text: str = "") -> None:
        self.store = store
        self.clock_ns = clock_ns
        self.limit_text = limit_text
        self.rate_limited_total = Counter(
            "mmserve_rate_limited_total", "Requests refused with 429 by MMSERVE_RATE_LIMIT, by key id "
            f"(a {KEY_ID_HEX_DIGITS}-hex-digit SHA-256 prefix; '{ADDRESS_KEY_ID}' for callers limited by address).",
            ["key_id"], registry=registry)

    def refusal(self, key_id: str | None, address: str) -> ApiError | None:
        """``None`` when a token was taken; else the 429 (``retry_after_s`` set) and the refusal counted."""
        caller = f"key:{key_id}" if key_id is not None else f"addr:{address}"
        wait_s = self.store.take(caller, self.clock_ns())
        if wait_s <= 0:
            return None
        self.rate_limited_total.labels(key_id=key_id if key_id is not None else ADDRESS_KEY_ID).inc()
        who = "this key" if key_id is not None else "this client address"
        seconds = retry_after_s(wait_s)
        return ApiError(429, "rate_limited", f"over the rate limit of {self.limit_text} for {who} "
                        f"(MMSERVE_RATE_LIMIT); retry in {seconds} s", retry_after_s=seconds)


class RateLimitMiddleware:
    """Pure ASGI: takes a token for the caller or answers 429 without reading the body."""

    def __init__(self, app: ASGIApp, limiter: RateLimiter, on_reject: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.limiter = limiter
        self._on_reject = on_reject  # called with the path of each refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_never_rate_limited(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        key_id = (scope.get("state") or {}).get(SCOPE_KEY_ID)
        error = self.limiter.refusal(key_id, client_address(scope))
        if error is None:
            await self.app(scope, receive, send)
            return
        if self._on_reject is not None:
            self._on_reject(scope.get("path", ""))
        await error_response(error, scope.get("path", ""))(scope, receive, send)
