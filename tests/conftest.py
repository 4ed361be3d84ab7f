"""Fixtures shared by every test: a tiny model and a live server on 127.0.0.1.

The live server is real uvicorn on a socket bound to port 0 (a free port),
run in a thread; the fixture waits until it is started and ready.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

from models.loading.repository import ModelBundle, build_preset
from server.app import create_app
from server.runtime.lifecycle import uvicorn_config
from server.settings import Settings


EXPORT_CACHE_ENV = "MMSERVE_EXPORT_CACHE_DIR"


def _run_wide_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> str:
    """A directory every worker of this test run sees: beside the workers' own base directories under xdist
    (``.../pytest-N/popen-gw0`` and ``gw1`` share ``.../pytest-N``), else a fresh one of this process's."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return str(tmp_path_factory.mktemp(name))
    path = tmp_path_factory.getbasetemp().parent / name
    path.mkdir(exist_ok=True)
    return str(path)


@pytest.fixture(scope="session", autouse=True)
def shared_export_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One ONNX export cache for every server of the test run, in-process or not (``--runtime auto`` exports a
    model's towers once, then every later server of that model reads them); a test may point its own elsewhere.

    The run's workers (pytest-xdist, ``-n 2`` in pyproject's addopts) share it
    too: it lies beside their own temporary directories, and the cache's lock
    per export key lets the first worker export while the other waits.
    """
    previous = os.environ.get(EXPORT_CACHE_ENV)
    os.environ[EXPORT_CACHE_ENV] = os.environ.get("MMSERVE_TEST_EXPORT_CACHE_DIR") or str(
        _run_wide_dir(tmp_path_factory, "onnx-export-cache"))
    yield os.environ[EXPORT_CACHE_ENV]
    if previous is None:
        os.environ.pop(EXPORT_CACHE_ENV, None)
    else:
        os.environ[EXPORT_CACHE_ENV] = previous


@pytest.fixture(scope="session")
def tiny_bundle() -> ModelBundle:
    """The tiny preset, seed 0, on CPU, shared read-only by the whole session."""
    return build_preset("tiny", seed=0)


@dataclass
class LiveServer:
    url: str
    app: object
    server: uvicorn.Server

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60.0, **kwargs)


@contextmanager
def run_live_server(settings: Settings, bundle: ModelBundle | None = None,
                    ready_timeout_s: float = 300.0, *, span_exporter: object | None = None) -> Iterator[LiveServer]:
    """Serve ``create_app(settings, bundle)`` on a free loopback port until the block ends.

    ``span_exporter``: tracing on, spans exported there (e.g. the SDK's ``InMemorySpanExporter``).
    """
    app = create_app(settings, bundle, span_exporter=span_exporter)  # type: ignore[arg-type]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # The uvicorn settings ``mmserve serve`` uses (HTTP protocol, keep-alive), with uvicorn's own logs quiet.
    config = uvicorn_config(app, settings.model_copy(update={"log_level": "warning"}))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout_s
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server thread exited during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not start")
            time.sleep(0.02)
        with httpx.Client(base_url=url, timeout=5.0) as client:
            while client.get("/health/ready").status_code != 200:
                if time.monotonic() > deadline:
                    raise TimeoutError("the server did not become ready")
                time.sleep(0.05)
        yield LiveServer(url=url, app=app, server=server)
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()


@pytest.fixture
def live_server_factory(tiny_bundle: ModelBundle) -> Callable[..., object]:
    """``with live_server_factory(max_batch_size=4) as server: ...`` (tiny model by default)."""

    def factory(bundle: ModelBundle | None = None, **overrides: object):
        settings = Settings(preset="tiny", device="cpu", **overrides)
        return run_live_server(settings, tiny_bundle if bundle is None else bundle)

    return factory


@pytest.fixture
def live_server_runner() -> Callable[..., object]:
    """``with live_server_runner(settings) as server: ...`` for any settings (model loaded by the app)."""
    return run_live_server


@pytest.fixture(scope="module")
def tiny_server(tiny_bundle: ModelBundle) -> Iterator[LiveServer]:
    """One live tiny server shared by a test module (default settings)."""
    with run_live_server(Settings(preset="tiny", device="cpu"), tiny_bundle) as server:
        yield server


@pytest.fixture(scope="module")
def tiny_torch_server(tiny_bundle: ModelBundle) -> Iterator[LiveServer]:
    """One live tiny server on torch (``runtime=torch``: how a peer that runs the towers in torch computes)."""
    with run_live_server(Settings(preset="tiny", device="cpu", runtime="torch"), tiny_bundle) as server:
        yield server


_tiny_exported_into: set[str] = set()


def _export_tiny_ahead(args: list[str], env: dict[str, str]) -> None:
    """Export the tiny preset into the run's shared export cache in this process, once per run, before a serve
    process of it starts: its ready timeout then measures a start, not the run's one export on a busy machine.

    A test that points ``MMSERVE_EXPORT_CACHE_DIR`` elsewhere (to watch exports happen) is left alone.
    """
    cache_dir = env.get(EXPORT_CACHE_ENV, os.environ.get(EXPORT_CACHE_ENV))
    is_tiny = "--preset" in args and args[args.index("--preset") + 1] == "tiny" and "--seed" not in args
    is_torch = "--runtime" in args and args[args.index("--runtime") + 1] == "torch"
    if (not is_tiny or is_torch or cache_dir is None or cache_dir != os.environ.get(EXPORT_CACHE_ENV)
            or cache_dir in _tiny_exported_into):
        return
    from models.onnx.towers import OnnxPlan, serve_towers_from_onnx

    bundle = build_preset("tiny", seed=0)
    serve_towers_from_onnx(bundle.model, bundle.fingerprint, OnnxPlan(cache_dir=Path(cache_dir)))
    _tiny_exported_into.add(cache_dir)


@dataclass
class ServeProcess:
    process: subprocess.Popen
    url: str


ServeSpec = tuple[list[str], "dict[str, str] | None"]  # (mmserve serve ARGS, extra environment)


@contextmanager
def run_serve_process(args: list[str], env: dict[str, str] | None = None,
                      ready_timeout_s: float = 120.0, start_new_session: bool = False) -> Iterator[ServeProcess]:
    """``mmserve serve ARGS`` as its own process on a free port, once ready; killed at the end if alive.

    With ``--api-workers N`` ready means one API process serves, so this waits
    until all N do (``mmserve_api_workers_live``), and a test finds them all.
    Output (stdout and stderr together) stays readable from ``process.stdout``.
    ``start_new_session``: the server leads its own session and process group (its pid is the group's id),
    as a terminal's foreground job, which Ctrl+C signals as a whole (``os.killpg``).
    """
    with run_serve_processes([(args, env)], ready_timeout_s, start_new_session) as (served,):
        yield served


@contextmanager
def run_serve_processes(specs: list[ServeSpec], ready_timeout_s: float = 120.0,
                        start_new_session: bool = False) -> Iterator[list[ServeProcess]]:
    """Several ``mmserve serve`` processes started side by side, each once ready (see ``run_serve_process``).

    A test that compares two servers (``--api-workers 2`` against one process)
    starts both at once: a start is mostly one interpreter importing torch and
    loading a model, one core each, so two overlap on the suite's two cores
    instead of waiting for each other. Together they have the time to become
    ready that they had one after another: ``ready_timeout_s`` each.
    """
    started: list[tuple[list[str], subprocess.Popen, str]] = []
    try:
        for args, env in specs:
            _export_tiny_ahead(args, env or {})
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            process = subprocess.Popen(
                [sys.executable, "-m", "server.cli", "serve", *args, "--port", str(port)],
                env={**os.environ, "MMSERVE_LOG_LEVEL": "warning", **(env or {})},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=start_new_session,
            )
            started.append((args, process, f"http://127.0.0.1:{port}"))
        deadline = time.monotonic() + ready_timeout_s * len(started)  # what the starts had one after another
        for args, process, url in started:
            _wait_until_ready(process, url, args, deadline)
        yield [ServeProcess(process, url) for _, process, url in started]
    finally:
        for _, process, _ in started:
            if process.poll() is None:
                process.kill()
                process.wait()


def _wait_until_ready(process: subprocess.Popen, url: str, args: list[str], deadline: float) -> None:
    while True:
        assert process.poll() is None, process.stdout.read()
        try:
            if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200 and _every_api_process_serves(url, args):
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server never became ready"
        time.sleep(0.1)


def _every_api_process_serves(url: str, args: list[str]) -> bool:
    """``mmserve_api_workers_live`` has reached ``--api-workers`` (or there is one process)."""
    if "--api-workers" not in args or int(args[args.index("--api-workers") + 1]) == 1:
        return True
    answer = httpx.get(f"{url}/metrics", timeout=10)
    if answer.status_code != 200:  # /metrics behind a key: readiness is all this can see
        return True
    match = re.search(r"^mmserve_api_workers_live (\S+)$", answer.text, re.M)
    return match is not None and float(match.group(1)) >= int(args[args.index("--api-workers") + 1])


@pytest.fixture
def serve_process() -> Callable[..., object]:
    """``with serve_process(["--preset", "tiny"], env) as served: ...`` (see ``run_serve_process``)."""
    return run_serve_process


PROMETHEUS_INSTALL_HINT = "apt-get update && apt-get install -y prometheus"
REQUIRE_PROMETHEUS_ENV = "MMSERVE_REQUIRE_PROMETHEUS"


def find_prometheus_binary(name: str) -> str:
    """The path of Prometheus's ``name`` binary (``prometheus`` or ``promtool``).

    Missing, the calling test skips and says how to install it, so the README's
    ``python -m pytest`` passes on a fresh machine; with
    ``MMSERVE_REQUIRE_PROMETHEUS=1`` (``.ci/run`` sets it after installing them)
    a missing binary fails instead, so CI can never skip these tests silently.
    """
    path = shutil.which(name)
    if path is not None:
        return path
    message = f"{name} is not on PATH; install it with `{PROMETHEUS_INSTALL_HINT}`"
    if os.environ.get(REQUIRE_PROMETHEUS_ENV) == "1":
        pytest.fail(f"{message} ({REQUIRE_PROMETHEUS_ENV}=1 requires it)")
    pytest.skip(message)


WRK_INSTALL_HINT = "apt-get update && apt-get install -y wrk"
REQUIRE_WRK_ENV = "MMSERVE_REQUIRE_WRK"


def find_wrk_binary() -> str:
    """The path of ``wrk`` (the C load generator the benchmarks drive), or skip with the install hint.

    As with Prometheus: ``.ci/run`` installs it and sets ``MMSERVE_REQUIRE_WRK=1``,
    so in CI a missing ``wrk`` fails the test instead of skipping it.
    """
    path = shutil.which("wrk")
    if path is not None:
        return path
    message = f"wrk is not on PATH; install it with `{WRK_INSTALL_HINT}`"
    if os.environ.get(REQUIRE_WRK_ENV) == "1":
        pytest.fail(f"{message} ({REQUIRE_WRK_ENV}=1 requires it)")
    pytest.skip(message)


@pytest.fixture
def prometheus_binary() -> Callable[[str], str]:
    """``prometheus_binary("promtool")``: the binary's path, or skip (fail in CI) when it is missing."""
    return find_prometheus_binary


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules marked ``alone`` first, then those marked ``long``, the rest in their usual order.

    The run is spread over workers a module at a time (``--dist loadfile``, in
    collection order: ``--no-loadscope-reorder``). A module of minutes handed
    out last would leave the other workers idle while it ends the run; one
    that runs alone, first, has the other workers wait before their first
    module rather than in the middle of the run.
    """
    items.sort(key=lambda item: (item.get_closest_marker("alone") is None, item.get_closest_marker("long") is None))


@pytest.fixture(scope="module", autouse=True)
def _alone_or_beside_others(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Modules marked ``alone`` run first, one at a time, while the other workers wait; then every other module,
    side by side.

    The ``alone`` modules are handed out first (``pytest_collection_modifyitems``);
    each leaves a file when it ends, in a directory the run's workers share,
    and a module of any other kind starts once there are as many files as
    ``alone`` modules in the run. Module scope and autouse: the wait comes
    before the module's own fixtures start its servers. One process (no
    xdist) has no neighbour: nothing waits.
    """
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        yield
        return
    done = Path(_run_wide_dir(tmp_path_factory, "alone-modules-done"))
    if request.node.get_closest_marker("alone") is not None:
        # Alone among the alone modules too, which start together on their workers: one at a time.
        with (done.parent / "alone-module-running.lock").open("a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released when the file closes
            try:
                yield
            finally:
                (done / request.node.nodeid.replace("/", "_")).touch()
        return
    num_alone = len({item.module for item in request.session.items if item.get_closest_marker("alone") is not None})
    # Each worker's first module is one of the first handed out: with more alone modules than workers, one
    # would sit behind a module waiting for it.
    assert num_alone <= int(os.environ["PYTEST_XDIST_WORKER_COUNT"]), "more `alone` modules than workers"
    while sum(1 for _ in done.iterdir()) < num_alone:
        time.sleep(0.2)
    yield
