"""The access log: one INFO line per API request; probes and scrapes only at DEBUG; nothing when off."""

from __future__ import annotations

import asyncio
import logging

import pytest

from server.http.access_log import AccessLog, is_probe

LOGGER = "server.http.access_log"


async def answer(scope, receive, send) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-request-id", b"r-1")]})
    await send({"type": "http.response.body", "body": b"ok!"})


def call(path: str) -> list[dict]:
    sent: list[dict] = []
    body = iter([{"type": "http.request", "body": b"hello", "more_body": False}])

    async def receive():
        return next(body)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST" if path.startswith("/v1") else "GET", "path": path}
    asyncio.run(AccessLog(answer)(scope, receive, send))
    return sent


@pytest.mark.parametrize(("path", "is_probe_path"), [
    ("/health/live", True), ("/health/ready", True), ("/metrics", True),
    ("/v1/infer", False), ("/v1/embeddings", False), ("/healthz", False), ("/metrics/extra", False),
])
def test_probe_paths(path, is_probe_path):
    assert is_probe(path) is is_probe_path


def test_api_requests_at_info_probes_only_at_debug(caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        call("/v1/infer")
        call("/health/ready")
        call("/metrics")
    lines = [(record.levelno, record.getMessage()) for record in caplog.records if record.name == LOGGER]
    assert len(lines) == 1
    level, message = lines[0]
    assert level == logging.INFO
    assert message.startswith("request r-1 POST /v1/infer -> 200") and "body 5 B blake2b-128" in message
    assert message.endswith("answer 3 B")

    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        call("/health/ready")
    lines = [(record.levelno, record.getMessage()) for record in caplog.records if record.name == LOGGER]
    assert [level for level, _ in lines] == [logging.DEBUG]
    assert lines[0][1].startswith("request r-1 GET /health/ready -> 200")


def test_the_answer_passes_unchanged_whether_or_not_a_line_is_written(caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        quiet = call("/v1/infer")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        logged = call("/v1/infer")
    assert quiet == logged
    assert [message["type"] for message in quiet] == ["http.response.start", "http.response.body"]
    assert not [record for record in caplog.records if record.name == LOGGER and record.levelno < logging.INFO]
