"""The HTTP guards applied to a gRPC call, before its message is decoded: keys and roles, then the rate limit.

They are the app's own (``server.http.middleware.RequestGuards``: the same
``AccessPolicy`` and ``RateLimiter`` object, so one bucket per key whichever
protocol it spends on, and with ``--api-workers N`` the shared table). The
key comes from the ``authorization: Bearer <key>`` metadata, as HTTP reads
the header. Each RPC has the access class of its HTTP counterpart:

    open        grpc.health.v1.Health/*, ServerLive, ServerReady   (like /health/*, /v2/health/*)
    admin       RepositoryModelLoad/Unload, *SharedMemoryRegister/Unregister, TraceSetting, LogSettings
    inference   every other RPC

``ModelStreamInfer`` checks the key and role when the stream opens and takes
one token per request as each arrives (``take_token``): a stream of N
requests costs N tokens, like N HTTP requests.

A refusal is counted in ``mmserve_requests_total{route="v2_grpc"}`` with its
HTTP status, as HTTP counts its early refusals under the route's label. The
admission carries the caller's key id (``none``/``invalid`` as the audit log
writes them) so an admin call's audit line names who made it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from server.errors import ApiError
from server.http.access_policy import Decision, RouteClass
from server.http.audit import INVALID_KEY_ID, NO_KEY_ID
from server.http.auth import bearer_token, refusal
from server.http.middleware import RequestGuards

ADMIN_METHODS = frozenset({
    "RepositoryModelLoad", "RepositoryModelUnload", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
    "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister", "TraceSetting", "LogSettings",
})
PROBE_METHODS = frozenset({"ServerLive", "ServerReady", "Check", "Watch"})
_PROBE_PATH = "/v2/health/ready"  # what the policy decides for the probes (open unless open_health_and_metrics=false)


def client_address(peer: str) -> str:
    """``ipv4:127.0.0.1:5000`` / ``ipv6:[::1]:5000`` -> the address alone (the rate limit's caller without a key)."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer or "unknown"
    host = rest.rsplit(":", 1)[0]
    return host.strip("[]")


@dataclass(frozen=True)
class Admission:
    """``error``: ``None`` to go on, else the error to answer (counted); ``key_id``: who called.

    ``rate_key_id``: whose bucket a token comes from (``None``: the caller's address), for the tokens a
    stream's requests take after the stream was admitted.
    """

    key_id: str
    error: ApiError | None
    rate_key_id: str | None = None


class CallGuards:
    """``admit(method, metadata, peer)``: the caller's key id and, for a refused call, the error to answer;
    ``take_token`` for each request of an admitted stream."""

    def __init__(self, guards: RequestGuards, count_refusal: Callable[[int], None]) -> None:
        self._policy = guards.policy
        self._limiter = guards.limiter
        self._has_keys = guards.policy.keys.has_inference_keys or guards.policy.keys.has_admin_keys
        self._count_refusal = count_refusal

    def route_class(self, method: str) -> RouteClass:
        if method in ADMIN_METHODS:
            return RouteClass.ADMIN
        if method in PROBE_METHODS:
            return self._policy.route_class("GET", _PROBE_PATH)
        return RouteClass.INFERENCE

    def admit(self, method: str, metadata: Sequence[tuple[str, str | bytes]] | None, peer: str, *,
              takes_token: bool = True) -> Admission:
        """``takes_token=False``: the key and role only, as a stream opens (each of its requests takes its own
        token, ``take_token``: a stream of N requests costs N tokens, like N HTTP requests)."""
        route_class = self.route_class(method)
        if route_class is RouteClass.OPEN:
            return Admission(NO_KEY_ID, None)
        presented = None
        if self._has_keys:
            for name, value in metadata or ():
                if name == "authorization":
                    presented = bearer_token(value.encode() if isinstance(value, str) else value)
                    break
        match = self._policy.keys.match(presented) if presented else None
        decision = self._policy.decide(route_class, presented, match.role if match is not None else None)
        error = None if decision is Decision.ALLOW else refusal(decision)
        rate_key_id = match.key_id if match is not None else None
        if error is None and takes_token and self._limiter is not None:
            error = self._limiter.refusal(rate_key_id, client_address(peer))
        if error is not None:
            self._count_refusal(error.status)
        key_id = NO_KEY_ID if presented is None else INVALID_KEY_ID if match is None else match.key_id
        return Admission(key_id, error, rate_key_id)

    def take_token(self, admission: Admission, peer: str) -> ApiError | None:
        """A token for one request of an admitted stream, from the bucket ``admit`` found; else the 429 (counted)."""
        if self._limiter is None:
            return None
        error = self._limiter.refusal(admission.rate_key_id, client_address(peer))
        if error is not None:
            self._count_refusal(error.status)
        return error
