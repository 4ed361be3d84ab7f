"""Slow and hostile clients, on raw sockets: they hold neither a batch slot nor the event loop."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import uvicorn

from server.app import create_app
from server.runtime.lifecycle import uvicorn_config
from server.settings import Settings


def _connect(url: str, receive_buffer_bytes: int | None = None) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    if receive_buffer_bytes is not None:  # before connect, so the advertised window stays small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
    sock.connect((host, int(port)))
    return sock


def _timed_requests(url: str, num_requests: int) -> list[tuple[int, float]]:
    """Status and latency of requests sent meanwhile by well-behaved clients, in parallel."""
    def one(i: int) -> tuple[int, float]:
        started = time.monotonic()
        status = httpx.post(f"{url}/v1/infer", json={"text": f"a polite client {i}"}, timeout=30).status_code
        return status, time.monotonic() - started

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, range(num_requests)))


def _requests_total(url: str, code: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(float(v) for v in re.findall(rf'^mmserve_requests_total\{{[^}}]*code="{code}"[^}}]*\}} (\S+)$',
                                            text, re.M))


def test_a_trickling_body_gets_408_while_others_are_served(live_server_factory, read_until_closed):
    with live_server_factory(body_timeout_s=1.0) as server:
        router = server.app.state.mmserve.router
        sock = _connect(server.url)
        sock.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: mmserve\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 4096\r\n\r\n{\"text\": \"")
        stop = threading.Event()

        def trickle() -> None:
            try:
                while not stop.wait(0.1):
                    sock.sendall(b"a")
            except OSError:
                pass  # the server closed the connection: the point of the test

        trickler = threading.Thread(target=trickle, daemon=True)
        started = time.monotonic()
        trickler.start()
        try:
            served = _timed_requests(server.url, 8)
            in_flight_meanwhile = router.num_in_flight
            answer, closed_at = read_until_closed(sock, timeout_s=10)
        finally:
            stop.set()
            trickler.join(timeout=5)
            sock.close()
        assert [status for status, _ in served] == [200] * 8
        assert max(latency for _, latency in served) < 1.0
        assert in_flight_meanwhile == 0  # the trickler never reached the batcher
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"code":"body_timeout"' in answer.replace(b" ", b"")
        assert 0.9 < closed_at - started < 5.0
        assert _requests_total(server.url, "408") == 1
        assert httpx.post(f"{server.url}/v1/infer", json={"text": "after"}, timeout=30).status_code == 200


def test_a_client_that_never_reads_its_answers_blocks_no_one(live_server_factory):
    with live_server_factory() as server:
        router = server.app.state.mmserve.router
        spec_size_bytes = len(httpx.get(f"{server.url}/openapi.json").content)
        num_pipelined = 2 + 64 * 1024 * 1024 // spec_size_bytes  # far more than any socket buffer holds
        sock = _connect(server.url, receive_buffer_bytes=4096)
        try:
            # Answers with a result first (they go through the batcher), then a flood of large ones, unread.
            body = b'{"text": "never read"}'
            infer = (b"POST /v1/infer HTTP/1.1\r\nHost: mmserve\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            spec = b"GET /openapi.json HTTP/1.1\r\nHost: mmserve\r\n\r\n"
            sock.sendall(infer * 2 + spec * num_pipelined)
            time.sleep(0.5)
            served = _timed_requests(server.url, 8)
            assert [status for status, _ in served] == [200] * 8
            assert max(latency for _, latency in served) < 2.0
            assert router.num_in_flight == 0 and router.total_depth() == 0
            # The connection is stuck on its own writes: a small read finds answers still waiting.
            sock.settimeout(5)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        finally:
            sock.close()
        assert httpx.get(f"{server.url}/health/ready").status_code == 200


@contextmanager
def _served_like_mmserve_serve(settings: Settings, bundle: object) -> Iterator[str]:
    """The app under the uvicorn settings ``mmserve serve`` uses (keep-alive included)."""
    app = create_app(settings, bundle)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn_config(app, settings))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not become ready"
            try:
                if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()


def test_an_idle_keep_alive_connection_is_closed_after_the_setting(tiny_bundle, read_until_closed):
    settings = Settings(preset="tiny", device="cpu", keep_alive_timeout_s=0.5, log_level="warning")
    with _served_like_mmserve_serve(settings, tiny_bundle) as url:
        sock = _connect(url)
        try:
            sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: mmserve\r\n\r\n")
            answered_at = time.monotonic()
            answer, closed_at = read_until_closed(sock, timeout_s=10)
        finally:
            sock.close()
        assert answer.startswith(b"HTTP/1.1 200")
        assert 0.4 < closed_at - answered_at < 3.0


def test_a_client_that_hangs_up_mid_body_is_counted_as_its_own_doing(tiny_server):
    before_499, before_500 = _requests_total(tiny_server.url, "499"), _requests_total(tiny_server.url, "500")
    for path in ("/v1/infer", "/v1/embeddings", "/v2/models/tiny/infer"):
        sock = _connect(tiny_server.url)
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: mmserve\r\nContent-Type: application/json\r\n"
                     "Content-Length: 1000\r\n\r\n{\"text\": \"half".encode())
        time.sleep(0.2)
        sock.close()
    deadline = time.monotonic() + 5
    while _requests_total(tiny_server.url, "499") < before_499 + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _requests_total(tiny_server.url, "499") == before_499 + 3
    assert _requests_total(tiny_server.url, "500") == before_500


def test_a_flood_beyond_the_decode_queue_is_refused_before_decoding(live_server_factory):
    with live_server_factory(decode_threads=1, max_decode_queue=2, enable_fault_injection=True,
                             cache_text_bytes=0) as server, server.client() as client:
        # Each request now holds the only decode thread for 300 ms.
        client.post("/v1/admin/faults", json={"stage": "decode", "delay_ms": 300, "duration_s": 60})
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: client.post("/v1/infer", json={"text": f"flood {i}"}), range(8)))
        refused = [answer for answer in answers if answer.status_code == 503]
        assert sum(answer.status_code == 200 for answer in answers) >= 3  # one running and two waiting
        assert len(refused) >= 3
        for answer in refused:
            assert answer.json()["error"]["code"] == "overloaded" and int(answer.headers["Retry-After"]) >= 1
            assert answer.elapsed.total_seconds() < 0.3  # refused at once, not after a decode
        assert server.app.state.mmserve.decode_pool.num_waiting == 0
        # Load shedding on /metrics as a full lane's is: each refusal once, under the intake's own reason.
        text = client.get("/metrics").text
        assert re.findall(r'^mmserve_rejected_total\{lane="intake",reason="decode_queue_full"\} (\S+)$', text,
                          re.M) == [f"{float(len(refused))}"]
