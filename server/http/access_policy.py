"""Which role each route needs, and what an unkeyed server allows, decided once from the settings.

    route class   routes                                                   needs
    open          /health/*, /v2/health/*, /metrics (open_health_and_metrics)   nothing
    admin         DELETE /v1/cache, /v1/admin/* (any method),              an admin key
                  POST /v1/monitoring/baseline (every monitoring write)
    inference     every other route: /v1/infer, /v1/embeddings,            an inference or admin key
                  /v1/models, /v2/*, GET /v1/monitoring/*, /docs, /openapi.json

With no keys at all the server is open on a loopback address, as it always
was; bound to any other address its admin routes answer 403 until admin keys
are set or ``allow_open_admin`` is given, so a container published on
0.0.0.0 cannot be made to drop its cache or start fault drills by whoever
reaches the port. With inference keys but no admin keys, no key has the
admin role, so the admin routes answer 403 to every valid key (unless
``allow_open_admin``, which then lets any valid key in). With admin keys but
no inference keys the inference routes are open (a key sent there, even a
dummy one an OpenAI client must send, is not refused).

Whether the bind address is loopback is decided on the *resolved* address:
``localhost`` resolves to 127.0.0.1 and is loopback; 0.0.0.0 and :: mean
every interface and are not; a name that resolves to nothing, or to any
non-loopback address, is not.
"""

from __future__ import annotations

import enum
import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from server.http.keys import KeyRing, Role

ADMIN_PATH_PREFIX = "/v1/admin/"
ADMIN_ROUTES = frozenset({("DELETE", "/v1/cache"), ("POST", "/v1/monitoring/baseline")})
OPEN_PREFIXES = ("/health/", "/v2/health/")
OPEN_PATHS = frozenset({"/metrics"})
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})


class RouteClass(enum.Enum):
    OPEN = "open"
    INFERENCE = "inference"
    ADMIN = "admin"


def is_admin_route(method: str, path: str) -> bool:
    return (method, path) in ADMIN_ROUTES or path.startswith(ADMIN_PATH_PREFIX) or path == ADMIN_PATH_PREFIX[:-1]


def is_probe_or_scrape_path(path: str) -> bool:
    """Health and metrics: what probes and scrapers reach (never an admin route)."""
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def is_never_rate_limited(path: str) -> bool:
    """Health, metrics and docs: probes, scrapers and browsers reading the API's description."""
    return is_probe_or_scrape_path(path) or path in DOCS_PATHS


def resolved_addresses(host: str) -> list[str]:
    """Every address ``host`` names, as the server would bind it; empty when it resolves to none."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return [str(info[4][0]).split("%", 1)[0] for info in infos]


def is_loopback_bind(host: str, resolve: Callable[[str], Sequence[str]] = resolved_addresses) -> bool:
    """True when every address ``host`` resolves to is loopback (127.0.0.0/8, ::1, ::ffff:127.x)."""
    addresses = resolve(host)
    if not addresses:
        return False
    for text in addresses:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if not address.is_loopback:
            return False
    return True


class Decision(enum.Enum):
    """What to do with one request, before its body is read."""

    ALLOW = "allow"
    MISSING_KEY = "missing_key"  # 401
    INVALID_KEY = "invalid_key"  # 401
    NEEDS_ADMIN = "needs_admin"  # 403: a valid key, but not of the admin role, on an admin route
    ADMIN_CLOSED = "admin_closed"  # 403: no keys at all, bound off loopback, admin not opened


@dataclass(frozen=True)
class AccessPolicy:
    """The rules of one server: its keys, whether health is open, where it is bound, whether admin is opened.

    The decision table (I: inference keys configured, A: admin keys configured):

        inference route   I: a valid key of either role, else 401; not I: open (a key is still recognised)
        admin route       A: an admin key (401 without a valid key, 403 with an inference key)
                          not A, not I: open on loopback or with allow_open_admin, else 403
                          not A, I: a valid key with allow_open_admin, else 401 / 403 (no key has the role)
    """

    keys: KeyRing
    open_health_and_metrics: bool = True
    is_loopback: bool = True
    allow_open_admin: bool = False

    @classmethod
    def for_bind(cls, keys: KeyRing, *, host: str, open_health_and_metrics: bool = True,
                 allow_open_admin: bool = False,
                 resolve: Callable[[str], Sequence[str]] = resolved_addresses) -> AccessPolicy:
        return cls(keys, open_health_and_metrics, is_loopback_bind(host, resolve), allow_open_admin)

    @property
    def is_inference_open(self) -> bool:
        return not self.keys.has_inference_keys

    @property
    def is_admin_open(self) -> bool:
        """Admin routes answer without any key (no keys at all, and loopback or allow_open_admin)."""
        return (not self.keys.has_admin_keys and not self.keys.has_inference_keys
                and (self.is_loopback or self.allow_open_admin))

    def route_class(self, method: str, path: str) -> RouteClass:
        if is_admin_route(method, path):
            return RouteClass.ADMIN
        if self.open_health_and_metrics and is_probe_or_scrape_path(path):
            return RouteClass.OPEN
        return RouteClass.INFERENCE

    def decide(self, route_class: RouteClass, presented: bytes | None, role: Role | None) -> Decision:
        """``presented``: the bearer token (None: no Authorization header); ``role``: its role if it is a key."""
        if route_class is RouteClass.OPEN:
            return Decision.ALLOW
        if route_class is RouteClass.INFERENCE:
            return Decision.ALLOW if self.is_inference_open else _keyed(presented, role)
        if self.keys.has_admin_keys:
            checked = _keyed(presented, role)
            return Decision.NEEDS_ADMIN if checked is Decision.ALLOW and role is not Role.ADMIN else checked
        if not self.keys.has_inference_keys:
            return Decision.ALLOW if self.is_admin_open else Decision.ADMIN_CLOSED
        checked = _keyed(presented, role)
        return Decision.NEEDS_ADMIN if checked is Decision.ALLOW and not self.allow_open_admin else checked


def _keyed(presented: bytes | None, role: Role | None) -> Decision:
    if presented is None:
        return Decision.MISSING_KEY
    return Decision.ALLOW if role is not None else Decision.INVALID_KEY
