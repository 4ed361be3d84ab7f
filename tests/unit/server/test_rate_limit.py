"""Token buckets on a fake clock, the setting's grammar, and the ASGI layer refusing before the body is read."""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client import CollectorRegistry

from server.http.audit import audit_line
from server.http.keys import SCOPE_KEY_ID
from server.http.rate_limit import (
    ADDRESS_KEY_ID,
    InProcessTokenBuckets,
    RateLimit,
    RateLimitMiddleware,
    RateLimiter,
    retry_after_s,
)

S = 1_000_000_000  # ns per second


@pytest.mark.parametrize(("text", "per_s", "burst"), [
    ("100/s", 100.0, 100), ("5/s,burst=12", 5.0, 12), (" 2.5 / s , burst = 1 ", 2.5, 1), ("0.5/s", 0.5, 1)])
def test_the_setting_grammar(text, per_s, burst):
    assert RateLimit.parse(text) == RateLimit(per_s, burst)


@pytest.mark.parametrize("text", ["100", "100/min", "0/s", "5/s,burst=0", "5/s;burst=2", "-1/s"])
def test_a_malformed_or_empty_limit_is_refused_naming_the_setting(text):
    with pytest.raises(ValueError, match="MMSERVE_RATE_LIMIT"):
        RateLimit.parse(text)


def test_a_bucket_gives_its_burst_then_one_token_per_interval():
    buckets = InProcessTokenBuckets(RateLimit(per_s=4.0, burst=3))  # a token each 250 ms
    assert [buckets.take("k", 0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("k", 0) == pytest.approx(0.25)  # empty: the next token in 250 ms
    assert buckets.take("k", S // 10) == pytest.approx(0.15)  # refused takes nothing
    assert buckets.take("k", S // 4) == 0.0
    assert buckets.take("other", S // 4) == 0.0  # each caller has its own bucket
    # Idle for long: refilled to the burst, never beyond.
    assert [buckets.take("k", 100 * S) for _ in range(4)][-1] == pytest.approx(0.25)


def test_the_store_forgets_the_caller_seen_longest_ago_past_its_bound():
    buckets = InProcessTokenBuckets(RateLimit(per_s=1.0, burst=1), max_buckets=2)
    buckets.take("a", 0)
    buckets.take("b", 0)
    buckets.take("a", 1)  # a seen again: b is now the oldest
    buckets.take("c", 2)
    assert len(buckets) == 2
    assert buckets.take("a", 3) > 0  # a's empty bucket was kept
    assert buckets.take("b", 3) == 0.0  # b was forgotten and starts full


@pytest.mark.parametrize(("wait_s", "seconds"), [(0.001, 1), (0.25, 1), (1.0, 1), (1.0001, 2), (2.5, 3)])
def test_retry_after_is_the_wait_rounded_up(wait_s, seconds):
    assert retry_after_s(wait_s) == seconds


class _Receiver:
    def __init__(self) -> None:
        self.num_calls = 0

    async def __call__(self):
        self.num_calls += 1
        return {"type": "http.request", "body": b"{}", "more_body": False}


def _run(middleware: RateLimitMiddleware, path: str, key_id: str | None = None, client: str = "192.0.2.1"):
    sent: list[dict] = []
    receive = _Receiver()
    scope = {"type": "http", "method": "POST", "path": path, "headers": [], "client": (client, 5000),
             "state": {} if key_id is None else {SCOPE_KEY_ID: key_id}}

    async def send(message):
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    return sent, receive.num_calls


async def _reading_app(scope, receive, send):
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _middleware(registry: CollectorRegistry, clock: list[int]) -> RateLimitMiddleware:
    limiter = RateLimiter(InProcessTokenBuckets(RateLimit(2.0, 1)), registry, clock_ns=lambda: clock[0],
                          limit_text="2/s,burst=1")
    return RateLimitMiddleware(_reading_app, limiter)


def test_over_the_limit_is_429_with_retry_after_and_the_body_is_never_read():
    registry, clock = CollectorRegistry(), [0]
    middleware = _middleware(registry, clock)
    sent, num_reads = _run(middleware, "/v1/infer", key_id="3f1c9a0b2e7d")
    assert sent[0]["status"] == 200 and num_reads == 1
    sent, num_reads = _run(middleware, "/v1/infer", key_id="3f1c9a0b2e7d")
    assert num_reads == 0 and sent[0]["status"] == 429
    headers = dict(sent[0]["headers"])
    assert headers[b"retry-after"] == b"1"  # 0.5 s to the next token, rounded up
    body = json.loads(sent[1]["body"])
    assert body["error"]["code"] == "rate_limited" and "2/s,burst=1" in body["error"]["message"]
    assert registry.get_sample_value("mmserve_rate_limited_total", {"key_id": "3f1c9a0b2e7d"}) == 1
    clock[0] = S // 2
    assert _run(middleware, "/v1/infer", key_id="3f1c9a0b2e7d")[0][0]["status"] == 200


def test_without_a_key_the_limit_is_per_address_under_one_label():
    registry, clock = CollectorRegistry(), [0]
    middleware = _middleware(registry, clock)
    assert _run(middleware, "/v1/infer", client="192.0.2.1")[0][0]["status"] == 200
    assert _run(middleware, "/v1/infer", client="192.0.2.2")[0][0]["status"] == 200
    assert _run(middleware, "/v1/infer", client="192.0.2.1")[0][0]["status"] == 429
    assert registry.get_sample_value("mmserve_rate_limited_total", {"key_id": ADDRESS_KEY_ID}) == 1


@pytest.mark.parametrize("path", ["/health/live", "/health/ready", "/v2/health/ready", "/metrics", "/docs",
                                  "/openapi.json"])
def test_health_metrics_and_docs_are_never_limited(path):
    middleware = _middleware(CollectorRegistry(), [0])
    assert [_run(middleware, path, key_id="k")[0][0]["status"] for _ in range(5)] == [200] * 5


def test_the_audit_line_carries_key_id_route_outcome_and_utc_time():
    from datetime import datetime, timedelta, timezone

    at = datetime(2026, 12, 3, 9, 41, 7, 512000, tzinfo=timezone(timedelta(hours=2)))
    assert audit_line("3f1c9a0b2e7d", "DELETE", "/v1/cache", 200, "10.0.0.7", at) == (
        "audit key_id=3f1c9a0b2e7d route=DELETE /v1/cache outcome=200 time=2026-12-03T07:41:07.512Z client=10.0.0.7")
