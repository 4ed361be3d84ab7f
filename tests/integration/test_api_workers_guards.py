"""Every guarded route is guarded before its body is read, whatever ``--api-workers N``.

The routes are the app's own (``server.app.wire_routes`` on a bare FastAPI app,
as every process wires them), never a list typed here; each route whose access
class (``server.http.access_policy``) is inference or admin is asked, with its
path parameters filled in, on a server with keys, a rate limit,
``MMSERVE_BODY_TIMEOUT_S=2`` and ``--enable-fault-injection`` (so the routes
forwarded to the engine, ``/v1/admin/faults`` and ``/v1/monitoring/*``, are
there):

    keyless, Content-Length: 100 and no body       401 within 1 s (the body deadline is 2 s: nothing waited on it)
    keyed, 10 of the 100 bytes, then nothing       408 at the body deadline, where the route reads a body;
                                                   its answer at once where it reads none, as with N = 1
    keyed, promising one byte over the body limit  413 within 1 s
    keyed, headers never finished                  408 at the header deadline (uvicorn's protocol, in the API process)
    keyed past the rate limit, no body             429 + Retry-After within 1 s (but the docs, never limited)

With N = 2 each refusal is sent on new connections until both API processes
have answered it: the access log names the process of every line
(``api-<pid>``), so the test shows that each process refused each route.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.routing import Route

from monitoring.serving_metrics import ServingMetrics
from server.app import wire_routes
from server.http.access_policy import RouteClass, is_never_rate_limited
from server.http.auth import access_policy
from server.settings import Settings
from server.workers.engine_routes import ENGINE_PATHS
from tests.conftest import ServeProcess, run_serve_processes

KEY = "inference-key-Gd7q2Lm9"
ADMIN_KEY = "admin-key-Hx4v8Np3"
LIMITED_KEY = "inference-key-limited-Qw5e1Rt6"
LIMITED_ADMIN_KEY = "admin-key-limited-Zc9b3Vn2"
BODY_TIMEOUT_S = 2.0
HEADER_TIMEOUT_S = 2.0
MAX_BODY_BYTES = 1_000_000
PROMPT_S = 1.0  # a refusal made before the body is read comes well before the body deadline
BURST = 120  # more than the keyed requests one key sends before its bucket is emptied on purpose
RATE_LIMIT = f"0.001/s,burst={BURST}"
PROMISED_BYTES = 100
# It re-learns; it kills the engine its query names (none here: 422 at once, or 409 in one process).
ROUTES_THAT_READ_NO_BODY = frozenset({("POST", "/v1/monitoring/baseline"), ("POST", "/v1/admin/faults/kill")})
MAX_CONNECTIONS_PER_ROUTE = 48  # until both API processes answered (which accepts a connection is the kernel's)
ACCESS_LINE = re.compile(r" api-(\d+) server\.http\.access_log: request \S+ (\S+) (\S+) -> (\d+) ")


@dataclass(frozen=True)
class GuardedRoute:
    method: str
    path: str  # path parameters filled in
    route_class: RouteClass

    @property
    def key(self) -> str:
        return KEY if self.route_class is RouteClass.INFERENCE else ADMIN_KEY

    @property
    def limited_key(self) -> str:
        return LIMITED_KEY if self.route_class is RouteClass.INFERENCE else LIMITED_ADMIN_KEY


def served_settings() -> Settings:
    return Settings(preset="tiny", device="cpu", api_keys=f"{KEY},{LIMITED_KEY}",
                    admin_api_keys=f"{ADMIN_KEY},{LIMITED_ADMIN_KEY}", enable_fault_injection=True,
                    rate_limit=RATE_LIMIT, body_timeout_s=BODY_TIMEOUT_S, header_timeout_s=HEADER_TIMEOUT_S,
                    max_body_bytes=MAX_BODY_BYTES)


def guarded_routes(path_values: dict[str, str]) -> list[GuardedRoute]:
    """Every (method, route) of the app whose access class is inference or admin, parameters filled in."""
    settings = served_settings()
    app, registry = FastAPI(), CollectorRegistry()
    wire_routes(app, settings, ServingMetrics(registry), registry)
    policy = access_policy(settings)
    routes = []
    for route in app.routes:
        if not isinstance(route, Route):  # APIRoute is one; mounts and websockets would not be
            continue
        path = re.sub(r"\{(\w+)(?::\w+)?\}", lambda match: path_values[match.group(1)], route.path)
        for method in sorted(route.methods or ()):
            route_class = policy.route_class(method, path)
            if route_class is not RouteClass.OPEN:
                routes.append(GuardedRoute(method, path, route_class))
    return routes


@dataclass
class ServerUnderTest:
    served: ServeProcess
    num_api_workers: int
    lines: list[str] = field(default_factory=list)  # what the server has printed so far

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.served.url)
        return parts.hostname, parts.port  # type: ignore[return-value]

    def answered_by(self, method: str, path: str, status: int) -> Counter:
        """How many answers of ``status`` to ``method path`` each API process's access log holds."""
        matches = (ACCESS_LINE.search(line) for line in list(self.lines))
        return Counter(int(match.group(1)) for match in matches
                       if match is not None and match.group(2, 3, 4) == (method, path, str(status)))


NUM_API_WORKERS = (2, 1)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[int, ServerUnderTest]]:
    """The ``--api-workers 2`` and the one-process server, started side by side once for the module (a start is
    mostly one interpreter importing torch and loading the model: two overlap instead of waiting for each other);
    the tests ask the first, then the second (``server``)."""
    settings = served_settings()
    env = {"MMSERVE_API_KEYS": settings.api_keys.get_secret_value(),  # type: ignore[union-attr]
           "MMSERVE_ADMIN_API_KEYS": settings.admin_api_keys.get_secret_value(),  # type: ignore[union-attr]
           "MMSERVE_RATE_LIMIT": RATE_LIMIT, "MMSERVE_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
           "MMSERVE_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S), "MMSERVE_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
           "MMSERVE_LOG_LEVEL": "info"}
    specs = [(["--preset", "tiny", "--device", "cpu", "--api-workers", str(num), "--enable-fault-injection"], env)
             for num in NUM_API_WORKERS]
    with run_serve_processes(specs, ready_timeout_s=300) as started:  # three processes start on a busy machine
        under_test = {num: ServerUnderTest(served, num) for num, served in zip(NUM_API_WORKERS, started)}
        for each in under_test.values():
            reader = threading.Thread(target=lambda each=each: each.lines.extend(
                iter(each.served.process.stdout.readline, "")), daemon=True)  # keeps the pipe from filling too
            reader.start()
        yield under_test


@pytest.fixture(scope="module", params=NUM_API_WORKERS, ids=[f"api-workers-{num}" for num in NUM_API_WORKERS])
def server(request: pytest.FixtureRequest, servers: dict[int, ServerUnderTest]) -> ServerUnderTest:
    return servers[request.param]


@pytest.fixture(scope="module")
def routes(server: ServerUnderTest) -> list[GuardedRoute]:
    with httpx.Client(base_url=server.served.url, headers={"Authorization": f"Bearer {KEY}"}) as client:
        name = client.get("/v1/models").json()["data"][0]["id"]
    found = guarded_routes({"model_name": name, "model_id": name, "model_version": "1"})
    assert {route.path for route in found} >= ENGINE_PATHS  # the forwarded routes are among them
    assert ROUTES_THAT_READ_NO_BODY <= {(route.method, route.path) for route in found}
    return found


def ask(address: tuple[str, int], route: GuardedRoute, key: str | None, body: bytes = b"",
        timeout_s: float = 10.0, promised_bytes: int = PROMISED_BYTES,
        is_head_complete: bool = True) -> tuple[int, dict[str, str], float]:
    """One request on a new connection promising ``promised_bytes`` of body and sending ``body``.

    ``is_head_complete=False``: the header block is left unfinished (no blank line), and nothing more is sent.

    Its status, headers and how long after the request was sent the answer's first byte came (the connection
    is read until the server closes it).
    """
    headers = [f"{route.method} {route.path} HTTP/1.1", f"Host: {address[0]}:{address[1]}",
               "Content-Type: application/json", f"Content-Length: {promised_bytes}", "Connection: close"]
    if key is not None:
        headers.append(f"Authorization: Bearer {key}")
    with socket.create_connection(address) as sock:
        request_head = "\r\n".join(headers) + ("\r\n\r\n" if is_head_complete else "\r\n")
        sock.sendall(request_head.encode() + body)
        sent_at = time.monotonic()
        answer, answered_at = b"", None
        sock.settimeout(timeout_s)
        try:
            while chunk := sock.recv(65536):
                answer += chunk
                answered_at = answered_at or time.monotonic()
        except TimeoutError as e:
            raise AssertionError(f"{route}: no answer within {timeout_s} s, after {answer[:100]!r}") from e
    assert answered_at is not None, f"{route}: the connection closed without an answer"
    elapsed_s = answered_at - sent_at
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    answer_headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in head[1:])}
    return status, answer_headers, elapsed_s


def refused_by_every_process(server: ServerUnderTest, routes: list[GuardedRoute], status: int,
                             key_of: Callable[[GuardedRoute], str | None]) -> None:
    """Each route, bodiless, answered ``status`` within PROMPT_S; with N = 2, by both API processes."""
    for route in routes:
        sent = 0
        while True:
            answered, answer_headers, elapsed_s = ask(server.address, route, key_of(route))
            sent += 1
            assert answered == status, (route, answered)
            assert elapsed_s < PROMPT_S, (route, elapsed_s)
            if status == 429:
                assert int(answer_headers["retry-after"]) >= 1
            if server.num_api_workers == 1 or sent >= MAX_CONNECTIONS_PER_ROUTE:
                break
            if sent >= 2 and len(logged_until(server, route, status, sent)) >= 2:
                break
    if server.num_api_workers > 1:
        for route in routes:
            assert len(server.answered_by(route.method, route.path, status)) == 2, (route, status)


def logged_until(server: ServerUnderTest, route: GuardedRoute, status: int, num_lines: int) -> Counter:
    """The processes that logged ``status`` for ``route``, once its ``num_lines`` lines are all printed."""
    deadline = time.monotonic() + 5.0
    while sum((answered := server.answered_by(route.method, route.path, status)).values()) < num_lines:
        assert time.monotonic() < deadline, (route, answered, num_lines)
        time.sleep(0.01)
    return answered


def test_a_keyless_request_gets_401_before_its_body(server: ServerUnderTest, routes: list[GuardedRoute]):
    refused_by_every_process(server, routes, 401, key_of=lambda route: None)


def test_a_keyed_slow_body_gets_408_at_the_body_deadline(server: ServerUnderTest, routes: list[GuardedRoute]):
    with ThreadPoolExecutor(len(routes)) as pool:  # at once: each waits out the deadline
        answers = list(pool.map(lambda route: ask(server.address, route, route.key, b'{"text": "sl'), routes))
    for route, (status, _, elapsed_s) in zip(routes, answers):
        if route.method == "POST" and (route.method, route.path) not in ROUTES_THAT_READ_NO_BODY:
            assert status == 408, route
            assert BODY_TIMEOUT_S - 0.1 <= elapsed_s < BODY_TIMEOUT_S + 1.5, (route, elapsed_s)
        else:  # the route answers without its body, as with one process
            assert status != 408 and elapsed_s < PROMPT_S, (route, status, elapsed_s)


def test_a_keyed_body_over_the_limit_gets_413_before_it_is_read(server: ServerUnderTest,
                                                                routes: list[GuardedRoute]):
    with ThreadPoolExecutor(len(routes)) as pool:
        answers = list(pool.map(lambda route: ask(server.address, route, route.key,
                                                  promised_bytes=MAX_BODY_BYTES + 1), routes))
    for route, (status, _, elapsed_s) in zip(routes, answers):
        assert status == 413 and elapsed_s < PROMPT_S, (route, status, elapsed_s)


def test_headers_that_never_end_get_408_at_the_header_deadline(server: ServerUnderTest,
                                                              routes: list[GuardedRoute]):
    with ThreadPoolExecutor(len(routes)) as pool:
        answers = list(pool.map(lambda route: ask(server.address, route, route.key, is_head_complete=False), routes))
    for route, (status, _, elapsed_s) in zip(routes, answers):
        assert status == 408, (route, status)
        assert HEADER_TIMEOUT_S - 0.1 <= elapsed_s < HEADER_TIMEOUT_S + 1.5, (route, elapsed_s)


def test_over_the_rate_limit_gets_429_before_its_body(server: ServerUnderTest, routes: list[GuardedRoute]):
    with httpx.Client(base_url=server.served.url) as client:
        for key in (LIMITED_KEY, LIMITED_ADMIN_KEY):  # one table for the server: BURST takes empty it
            statuses = Counter(client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code
                               for _ in range(BURST + 1))
            assert statuses[429] >= 1, statuses
    limited = [route for route in routes if not is_never_rate_limited(route.path)]  # docs are not limited
    assert {route.path for route in limited} >= ENGINE_PATHS
    refused_by_every_process(server, limited, 429, key_of=lambda route: route.limited_key)


def test_the_forwarded_routes_answer_a_keyed_request_as_one_process(server: ServerUnderTest):
    """The guards let a keyed request through to the engine's routes, and the engine charges no token of its own."""
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=server.served.url, timeout=30) as client:
        added = client.post("/v1/admin/faults", json={"stage": "text", "delay_ms": 1, "duration_s": 5}, headers=admin)
        assert added.status_code == 200 and added.json()["active"][0]["stage"] == "text"
        assert client.get("/v1/monitoring/drift", headers=admin).status_code == 200
        assert client.post("/v1/admin/faults", json={"stage": "nope", "delay_ms": 1},
                           headers=admin).status_code == 422
        assert client.delete("/v1/admin/faults", headers=admin).json() == {"active": []}
        assert client.get("/v1/monitoring/drift",
                          headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert client.post("/v1/admin/faults", json={"stage": "text", "delay_ms": 1},
                           headers={"Authorization": f"Bearer {KEY}"}).status_code == 403
