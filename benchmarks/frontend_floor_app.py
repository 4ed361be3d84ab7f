"""The HTTP floor: a bare FastAPI + uvicorn endpoint that parses the body and returns a fixed answer.

    python -m benchmarks.frontend_floor_app --port P --answers FILE

``FILE`` is JSON ``{"text": ..., "image": ..., "fusion": ...}``: mmserve's
answers, returned byte for byte. ``POST /v1/infer`` is fusion; an embeddings
input starting with ``data:`` is an image, any other a text. No validation,
model or middleware; the same uvicorn settings as ``mmserve serve``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request, Response

MEDIA_TYPE = "application/json"


def answer_kind(path: str, parsed: object) -> str:
    """Which recorded answer a parsed request body gets: ``fusion``, ``image`` or ``text``."""
    if path == "/v1/infer":
        return "fusion"
    first = parsed.get("input") if isinstance(parsed, dict) else None
    if isinstance(first, list):
        first = first[0] if first else None
    return "image" if isinstance(first, str) and first.startswith("data:") else "text"


def floor_app(answers: dict[str, bytes]) -> FastAPI:
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None,
                  telemetry={"tracing": False, "metrics": False, "logs": False})

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        parsed = json.loads(await request.body())
        return Response(answers[answer_kind("/v1/embeddings", parsed)], media_type=MEDIA_TYPE)

    @app.post("/v1/infer")
    async def infer(request: Request) -> Response:
        json.loads(await request.body())
        return Response(answers["fusion"], media_type=MEDIA_TYPE)

    @app.get("/health")
    async def health() -> Response:
        return Response(b'{"status":"ok"}', media_type=MEDIA_TYPE)

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--answers", type=Path, required=True)
    args = parser.parse_args()
    answers = {kind: text.encode("utf-8") for kind, text in json.loads(args.answers.read_text()).items()}
    uvicorn.run(floor_app(answers), host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
                http="httptools")


if __name__ == "__main__":
    main()
