"""Turns a ``RequestSpec`` into the JSON body of ``POST /v1/infer``.

The image part is pre-encoded base64 (ASCII, never needs JSON escaping), so the
body is assembled by concatenation instead of re-serialising a 10-100 kB string
per request: the sender's own cost is part of what the generator-lag figure
would otherwise absorb.
"""

from __future__ import annotations

import json

from benchmarks.loadgen.image_pool import ImagePool
from benchmarks.loadgen.request_spec import RequestSpec
from benchmarks.loadgen.text_source import TextSource

JSON_HEADERS = {"content-type": "application/json"}
INFER_PATH = "/v1/infer"


class BodyBuilder:
    """Builds request bodies from specs; owns the run's text source. ``path`` is where they are posted."""

    path = INFER_PATH

    def __init__(self, image_pool: ImagePool, text_source: TextSource, is_truncating: bool = False) -> None:
        self._image_pool = image_pool
        self._text_source = text_source
        self._is_truncating = is_truncating

    def build(self, spec: RequestSpec) -> bytes:
        fields: dict[str, object] = {}
        if spec.modality.has_text:
            fields["text"] = self._text_source.make(spec.num_text_chars)
        if spec.priority is not None:
            fields["priority"] = spec.priority.value
        if spec.timeout_ms is not None:
            fields["timeout_ms"] = spec.timeout_ms
        if self._is_truncating and spec.modality.has_text:
            fields["truncate"] = True
        if not spec.modality.has_image or spec.image_key is None:
            return json.dumps(fields).encode("utf-8")
        rest = json.dumps(fields).encode("utf-8")[1:-1]  # the fields without their braces
        separator = b"," if rest else b""
        return b'{"image":{"b64":"' + self._image_pool.b64(spec.image_key) + b'"}' + separator + rest + b"}"
