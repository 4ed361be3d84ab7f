"""A new endpoint plugs into the request layer with a parse and a render, and gets everything else.

A toy protocol (``POST /test/texts``: a JSON list of texts -> their text
embeddings' lengths) is added to a live tiny server: it writes no id, clock,
trace or metric of its own, yet its answers carry ``X-Request-ID``, count in
``mmserve_requests_total`` and ``mmserve_request_duration_seconds`` under its
label, and each answered text is a latency record of the monitor; its errors
take its own shape and the same headers and counters. A second toy
(``POST /test/longest``) brings its own run step with a stage of its own: the
layer records the request once, under its label, with that stage and ``total``.
"""

from __future__ import annotations

import asyncio
import json
import re

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from server.errors import ApiError
from server.ingest.inputs import parsed_input
from server.protocols.rows import Failure
from server.request_layer import Answered, Arrival, Endpoint, Parsed, Ran, RequestRecord, serve
from server.state import ServerState


class Texts(Endpoint[None]):
    http_route, metrics_label, protocol = "/test/texts", "test_texts", "test"

    async def parse(self, request: Request, state: ServerState) -> Parsed[None]:
        texts = json.loads(await request.body())
        if not isinstance(texts, list) or not texts:
            raise ApiError(422, "invalid_request", "send a non-empty list of texts", "body")
        return Parsed([parsed_input(text, (), state.settings) for text in texts], None)

    def render(self, parsed: Parsed[None], answered: Answered, state: ServerState) -> Response:
        return JSONResponse({"dims": [len(outcome.result.text_embedding) for outcome in answered.outcomes]})

    def render_error(self, failure: Failure, parsed: Parsed[None] | None) -> Response:
        return JSONResponse({"problem": failure.error.code, "row": failure.row_index}, status_code=failure.error.status)


layer_routes = APIRouter()


@layer_routes.post("/test/texts")
async def texts(request: Request) -> Response:
    return await serve(request, Texts())


def _sample(metrics: str, name: str, labels: str) -> float:
    match = re.search(rf"^{name}{{{labels}}} (\S+)$", metrics, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_a_new_endpoint_gets_ids_metrics_and_monitoring_from_the_layer(live_server_factory):
    with live_server_factory() as live, live.client() as client:
        live.app.include_router(layer_routes)
        monitor = live.app.state.mmserve.monitor
        answer = client.post("/test/texts", content=json.dumps(["a red square", "a blue circle", "a cat"]))
        refused = client.post("/test/texts", content=b"[]")
        bad_row = client.post("/test/texts", content=json.dumps(["fine", "word " * 200]))  # too long: row 1
        monitor.tick()
        metrics = client.get("/metrics").text
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["dims"]) == 3 and min(answer.json()["dims"]) > 0
    for response in (answer, refused, bad_row):
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers["X-Request-ID"])
    assert refused.status_code == 422 and refused.json() == {"problem": "invalid_request", "row": None}
    assert bad_row.status_code == 422 and bad_row.json() == {"problem": "text_too_long", "row": 1}
    assert _sample(metrics, "mmserve_requests_total", 'code="200",route="test_texts"') == 1
    assert _sample(metrics, "mmserve_requests_total", 'code="422",route="test_texts"') == 2
    assert _sample(metrics, "mmserve_request_duration_seconds_count", 'route="test_texts"') == 3
    # Each answered text is one record of the text lane: its queue and compute stages, no decode or total.
    assert _sample(metrics, "mmserve_stage_latency_seconds_count", 'route="text",stage="text"') == 3
    assert _sample(metrics, "mmserve_stage_latency_seconds_count", 'route="text",stage="total"') == 0


class Longest(Texts):
    """An endpoint with its own run step: the texts through the intake, then a stage of its own (``pick``)."""

    http_route, metrics_label = "/test/longest", "test_longest"

    async def run(self, parsed: Parsed[None], state: ServerState, arrival: Arrival) -> Ran:
        ran = await super().run(parsed, state, arrival)  # the default: one intake call
        lengths = [len(text) for text in (row.text for row in parsed.items)]
        longest, pick_ns = await arrival.timed(asyncio.sleep(0.02, result=lengths.index(max(lengths))))
        return Ran(ran.outcomes, longest, RequestRecord({"pick": pick_ns}, batch_size=None, cache_hit=None,
                                                        inputs=None))

    def render(self, parsed: Parsed[None], answered: Answered, state: ServerState) -> Response:
        return JSONResponse({"longest": answered.value, "timings_ns": answered.stage_ns()})


@layer_routes.post("/test/longest")
async def longest(request: Request) -> Response:
    return await serve(request, Longest())


def test_an_endpoint_with_its_own_run_is_one_record_with_its_stages(live_server_factory):
    with live_server_factory() as live, live.client() as client:
        live.app.include_router(layer_routes)
        monitor = live.app.state.mmserve.monitor
        answer = client.post("/test/longest", content=json.dumps(["a cat", "a red square on a table", "a dog"]))
        refused = client.post("/test/longest", content=b"[]")
        monitor.tick()
        metrics = client.get("/metrics").text
    assert answer.status_code == 200, answer.text
    assert answer.json()["longest"] == 1
    timings = answer.json()["timings_ns"]
    # The 20 ms sleep is in "pick", give or take uvloop's timer: libuv counts in whole milliseconds from a
    # clock it reads once per loop turn, so a sleep can end up to 1 ms early by perf_counter (19.55 ms seen).
    assert set(timings) == {"pick", "total"} and 19e6 <= timings["pick"] <= timings["total"]
    for response in (answer, refused):
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers["X-Request-ID"])
    assert refused.status_code == 422
    assert _sample(metrics, "mmserve_requests_total", 'code="200",route="test_longest"') == 1
    assert _sample(metrics, "mmserve_requests_total", 'code="422",route="test_longest"') == 1
    # The request is one record under its own label, with its run's stages and the layer's total ...
    assert _sample(metrics, "mmserve_stage_latency_seconds_count", 'route="test_longest",stage="pick"') == 1
    assert _sample(metrics, "mmserve_stage_latency_seconds_count", 'route="test_longest",stage="total"') == 1
    # ... and not one record per item of the text lane.
    assert _sample(metrics, "mmserve_stage_latency_seconds_count", 'route="text",stage="text"') == 0
