"""Roles, hashed key files, rate limits and the audit log against a live server on 127.0.0.1.

The matrix: every route x {no key, wrong key, inference key, admin key}. The
non-loopback rule is decided on the resolved bind address
(tests/unit/server/test_access_policy.py); here it is shown live on
127.0.0.1, and with ``host=0.0.0.0`` in the settings the app is built from
(the test still binds its socket to 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest

from otlp_receiver import otlp_receiver
from server.settings import Settings

INFERENCE_KEY = "inference-key-Q7v2xw9M"
ADMIN_KEY = "admin-key-Lp4s0Zk8"
WRONG_KEY = "wrong-key-Hh3r8Nn1"
FAULT = {"stage": "decode", "delay_ms": 0, "fraction": 0.0, "duration_s": 1}

INFERENCE_ROUTES = (
    ("POST", "/v1/infer", {"text": "a red bicycle"}),
    ("POST", "/v1/embeddings", {"model": "tiny", "input": ["a red bicycle"]}),
    ("GET", "/v1/models", None),
    ("GET", "/v2/models/tiny", None),
    ("GET", "/v1/monitoring/drift", None),
    ("GET", "/openapi.json", None),
)
ADMIN_ROUTES = (
    ("DELETE", "/v1/cache", None),
    ("POST", "/v1/admin/faults", FAULT),
    ("DELETE", "/v1/admin/faults", None),
    ("POST", "/v1/monitoring/baseline", None),
)


def _bearer(key: str | None) -> dict[str, str]:
    return {} if key is None else {"Authorization": f"Bearer {key}"}


def _key_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def _call(client: httpx.Client, route: tuple, key: str | None) -> httpx.Response:
    method, path, body = route
    return client.request(method, path, json=body, headers=_bearer(key))


def _error_code(answer: httpx.Response) -> str:
    """The refusal's code in its path's protocol shape: Triton's "<code>: <message>" string under /v2."""
    error = answer.json()["error"]
    return error.split(":")[0] if isinstance(error, str) else error["code"]


def test_the_matrix_of_routes_and_keys(live_server_factory):
    with live_server_factory(api_keys=INFERENCE_KEY, admin_api_keys=ADMIN_KEY,
                             enable_fault_injection=True) as server, server.client() as client:
        for route in INFERENCE_ROUTES + ADMIN_ROUTES:
            is_admin = route in ADMIN_ROUTES
            got = {name: _call(client, route, key) for name, key in
                   (("none", None), ("wrong", WRONG_KEY), ("inference", INFERENCE_KEY), ("admin", ADMIN_KEY))}
            statuses = {name: answer.status_code for name, answer in got.items()}
            assert statuses == {"none": 401, "wrong": 401, "inference": 403 if is_admin else 200, "admin": 200}, \
                (route[:2], statuses)
            assert _error_code(got["none"]) == "missing_api_key"
            assert _error_code(got["wrong"]) == "invalid_api_key"
            assert got["none"].headers["WWW-Authenticate"].startswith("Bearer")
            if is_admin:
                refused = got["inference"].json()["error"]
                assert refused["code"] == "forbidden" and "admin role" in refused["message"]
                assert refused["field"] == "authorization"
        # Probes and scrapers still need no key; refusals are counted with their status.
        assert client.get("/health/ready").status_code == 200
        metrics = client.get("/metrics").text
        assert re.search(r'mmserve_requests_total\{code="403",route="other"\} 4\.0', metrics)


def test_unkeyed_on_loopback_everything_stays_open(live_server_factory):
    with live_server_factory(enable_fault_injection=True) as server, server.client() as client:
        for route in INFERENCE_ROUTES + ADMIN_ROUTES:
            assert _call(client, route, None).status_code == 200, route[:2]


def test_unkeyed_off_loopback_admin_routes_answer_403_until_opened(live_server_factory, caplog):
    with caplog.at_level(logging.WARNING, logger="server.http.auth"), \
            live_server_factory(host="0.0.0.0", enable_fault_injection=True) as server, server.client() as client:
        for route in INFERENCE_ROUTES:
            assert _call(client, route, None).status_code == 200, route[:2]
        for route in ADMIN_ROUTES:
            refused = _call(client, route, None)
            assert refused.status_code == 403, route[:2]
            error = refused.json()["error"]
            assert error["code"] == "forbidden" and "MMSERVE_ADMIN_API_KEYS" in error["message"]
            assert "--allow-open-admin" in error["message"]
    warnings = [record.getMessage() for record in caplog.records]
    assert any("0.0.0.0" in line and "MMSERVE_API_KEYS" in line for line in warnings), warnings
    with live_server_factory(host="0.0.0.0", allow_open_admin=True, enable_fault_injection=True) as server, \
            server.client() as client:
        for route in ADMIN_ROUTES:
            assert _call(client, route, None).status_code == 200, route[:2]


def _hash_key(stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "server.cli", "hash-key"], input=stdin, capture_output=True,
                          timeout=120)


def test_hash_key_prints_the_sha256_line_stripping_one_newline_only():
    for stdin, key in ((b"s3cret\n", b"s3cret"), (b"s3cret", b"s3cret"), (b"s3cret\n\n", b"s3cret\n"),
                       (b" s3cret\r\n", b" s3cret\r"), ("kl\u00e9\n".encode(), "kl\u00e9".encode())):
        done = _hash_key(stdin)
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"sha256:{hashlib.sha256(key).hexdigest()}\n".encode(), stdin
    empty = _hash_key(b"\n")
    assert empty.returncode == 2 and b"no key" in empty.stderr and empty.stdout == b""


def test_a_hashed_key_file_admits_the_key_it_stands_for(live_server_factory, tmp_path):
    line = _hash_key(ADMIN_KEY.encode() + b"\n").stdout.decode().strip()
    key_file = tmp_path / "admin-keys"
    key_file.write_text(f"# written by mmserve hash-key\n{line}\n")
    assert ADMIN_KEY not in key_file.read_text()
    inference_file = tmp_path / "inference-keys"
    inference_file.write_text(_hash_key(INFERENCE_KEY.encode()).stdout.decode())
    with live_server_factory(admin_api_key_file=key_file, api_key_file=inference_file) as server, \
            server.client() as client:
        assert client.delete("/v1/cache", headers=_bearer(ADMIN_KEY)).status_code == 200
        assert client.delete("/v1/cache", headers=_bearer(INFERENCE_KEY)).status_code == 403
        assert client.post("/v1/infer", json={"text": "a"}, headers=_bearer(INFERENCE_KEY)).status_code == 200
        # The line is what the file holds, not a key: presenting it is refused.
        assert client.delete("/v1/cache", headers=_bearer(line)).status_code == 401


async def _storm(url: str, num_clients: int, requests_per_client: int, key: str) -> tuple[list[httpx.Response], float]:
    clients = [httpx.AsyncClient(base_url=url, timeout=60, headers=_bearer(key)) for _ in range(num_clients)]
    try:
        for client in clients:  # connect first, so the storm is the requests, not the handshakes
            await client.get("/health/live")
        started = time.monotonic()

        async def one_client(client: httpx.AsyncClient) -> list[httpx.Response]:
            return [await client.post("/v1/infer", json={"text": f"request {i}"}) for i in range(requests_per_client)]

        answers = await asyncio.gather(*(one_client(client) for client in clients))
        return [answer for per_client in answers for answer in per_client], time.monotonic() - started
    finally:
        for client in clients:
            await client.aclose()


def test_the_rate_limit_under_32_concurrent_clients(live_server_factory):
    per_s, burst = 5.0, 8
    with live_server_factory(api_keys=INFERENCE_KEY, admin_api_keys=ADMIN_KEY,
                             rate_limit=f"{per_s:g}/s,burst={burst}") as server, server.client() as client:
        answers, elapsed_s = asyncio.run(_storm(server.url, 32, 2, INFERENCE_KEY))
        statuses = [answer.status_code for answer in answers]
        assert set(statuses) <= {200, 429}, statuses
        num_ok, num_limited = statuses.count(200), statuses.count(429)
        # The burst goes at once, then one request per 1/per_s s: no more, and (all asking at once) no fewer.
        assert burst <= num_ok <= burst + math.floor(per_s * elapsed_s) + 1, (num_ok, elapsed_s)
        assert num_limited == 64 - num_ok and num_limited > 0
        for answer in answers:
            if answer.status_code == 429:
                assert answer.json()["error"]["code"] == "rate_limited"
                assert 1 <= int(answer.headers["Retry-After"]) <= math.ceil(1 / per_s)
        # The admin key has its own bucket; the limited key gets a token once Retry-After has passed.
        assert client.post("/v1/infer", json={"text": "x"}, headers=_bearer(ADMIN_KEY)).status_code == 200
        assert client.get("/health/ready").status_code == 200 and client.get("/metrics").status_code == 200
        time.sleep(1.0)
        assert client.post("/v1/infer", json={"text": "x"}, headers=_bearer(INFERENCE_KEY)).status_code == 200
        metrics = client.get("/metrics").text
        counted = re.search(rf'^mmserve_rate_limited_total\{{key_id="{_key_id(INFERENCE_KEY)}"\}} (\S+)$', metrics,
                            re.M)
        assert counted is not None and float(counted.group(1)) == num_limited


def test_without_keys_the_limit_is_per_address_and_refuses_before_the_body(live_server_factory):
    with live_server_factory(rate_limit="1/s,burst=2") as server, server.client() as client:
        statuses = [client.post("/v1/infer", json={"text": "x"}).status_code for _ in range(3)]
        assert statuses == [200, 200, 429]
        # Headers promising a 1 MB body, and no body: the 429 comes without waiting for it.
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000000\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 429")
        metrics = client.get("/metrics").text
        assert re.search(r'^mmserve_rate_limited_total\{key_id="client-address"\} 2\.0$', metrics, re.M)


def test_audit_lines_and_no_secret_in_logs_metrics_error_bodies_or_spans(live_server_runner, tiny_bundle, caplog,
                                                                        monkeypatch):
    settings = Settings(preset="tiny", device="cpu", api_keys=INFERENCE_KEY, admin_api_keys=ADMIN_KEY,
                        rate_limit="1/s,burst=3", trace_sample_ratio=1.0, trace_slow_ms=0)
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.traces_url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        with caplog.at_level(logging.DEBUG), live_server_runner(settings, tiny_bundle) as server, \
                server.client() as client:
            answers = [client.delete("/v1/cache", headers=_bearer(key)) for key in
                       (ADMIN_KEY, INFERENCE_KEY, None, WRONG_KEY)]
            answers += [client.post("/v1/infer", json={"text": "a"}, headers=_bearer(key))
                        for key in (INFERENCE_KEY, ADMIN_KEY, WRONG_KEY, None)]
            answers += [client.post("/v1/embeddings", json={"model": "tiny", "input": ["a"]},
                                    headers=_bearer(INFERENCE_KEY)) for _ in range(4)]  # the 4th is over the burst
            metrics = client.get("/metrics").text
            spans = receiver.wait_for_spans(lambda spans: any(span.name == "POST /v1/infer" for span in spans))
    assert [answer.status_code for answer in answers] == [200, 403, 401, 401, 200, 200, 401, 401, 200, 200, 429, 429]
    audit = [record.getMessage() for record in caplog.records if record.name == "mmserve.audit"]
    assert len(audit) == 4, audit
    stamp = r"time=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    for line, key_id, outcome in zip(audit, (_key_id(ADMIN_KEY), _key_id(INFERENCE_KEY), "none", "invalid"),
                                     (200, 403, 401, 401), strict=True):
        assert re.fullmatch(rf"audit key_id={key_id} route=DELETE /v1/cache outcome={outcome} {stamp} "
                            r"client=127\.0\.0\.1", line), line
    access = [record.getMessage() for record in caplog.records if record.name == "server.http.access_log"]
    assert any("POST /v1/embeddings -> 429" in line and line.endswith(f"key_id {_key_id(INFERENCE_KEY)}")
               for line in access), access
    logged = "\n".join(record.getMessage() + (record.exc_text or "") for record in caplog.records)
    wire = json.dumps([{"name": span.name, **span.attributes,
                        "events": [[event.name, str(event.attributes)] for event in span.span.events]}
                       for span in spans])
    bodies = "\n".join(answer.text + str(answer.headers) for answer in answers)
    assert _key_id(INFERENCE_KEY) in metrics  # the id is there, the key and its full hash are not
    for secret in (INFERENCE_KEY, ADMIN_KEY, WRONG_KEY):
        full_hash = hashlib.sha256(secret.encode()).hexdigest()
        for where, text in (("logs", logged), ("metrics", metrics), ("spans", wire), ("error bodies", bodies)):
            assert secret not in text and full_hash not in text, (secret, where)
