"""Turns a ``RequestSpec`` into an OpenAI ``POST /v1/embeddings`` body, in the dialect of the server it goes to.

    text    {"model": M, "input": ["#12 a photo of ..."]}
    vision  {"model": M, "input": ["data:image/jpeg;base64,..."]}                      mmserve
            {"model": M, "input": ["data:image/jpeg;base64,..."], "modality": "image"}  Infinity

Both servers speak OpenAI's embeddings API and take images as ``data:`` URIs;
they differ in how an image is told from a text. mmserve reads it off the URI
(and refuses unknown fields), Infinity reads every input as text unless the
body says ``"modality": "image"`` (its extension of OpenAI's body). One spec
holds one input, so a request is one embedding on either server and the two
batchers see the same stream. A fusion spec has no OpenAI form and is refused
when the run is configured (``BenchConfig``).

As in ``BodyBuilder``, the image part is pre-encoded base64 and the body is
concatenated, so building it costs the sender next to nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from benchmarks.loadgen.image_pool import ImageFormat, ImagePool
from benchmarks.loadgen.payload import BodyBuilder
from benchmarks.loadgen.request_spec import RequestSpec
from benchmarks.loadgen.text_source import TextSource

EMBEDDINGS_PATH = "/v1/embeddings"
_MEDIA_TYPES = {ImageFormat.JPEG: "image/jpeg", ImageFormat.PNG: "image/png"}


@dataclass(frozen=True)
class EmbeddingsDialect:
    """How one server wants its embeddings bodies: the model name, and whether images carry ``modality``."""

    model: str | None = None  # None leaves "model" out
    is_image_modality_marked: bool = False  # Infinity: True; mmserve: False (it refuses the extra field)

    def head(self) -> dict[str, str]:
        return {} if self.model is None else {"model": self.model}


def data_uri(b64: bytes, image_format: ImageFormat) -> bytes:
    """``data:image/...;base64,<b64>`` as ASCII bytes."""
    return b"data:" + _MEDIA_TYPES[image_format].encode("ascii") + b";base64," + b64


def text_body(dialect: EmbeddingsDialect, text: str) -> bytes:
    return json.dumps({**dialect.head(), "input": [text]}).encode("utf-8")


def image_body(dialect: EmbeddingsDialect, uri: bytes) -> bytes:
    """One image input; ``uri`` is a data URI (ASCII base64: never needs JSON escaping)."""
    head = json.dumps(dialect.head()).encode("utf-8")[1:-1]  # the head's fields without their braces
    modality = b',"modality":"image"' if dialect.is_image_modality_marked else b""
    return b"{" + head + (b"," if head else b"") + b'"input":["' + uri + b'"]' + modality + b"}"


class EmbeddingsBodyBuilder(BodyBuilder):
    """Builds one-input OpenAI embeddings bodies from specs, in one server's dialect."""

    path = EMBEDDINGS_PATH

    def __init__(self, image_pool: ImagePool, text_source: TextSource, dialect: EmbeddingsDialect,
                 image_format: ImageFormat) -> None:
        super().__init__(image_pool, text_source)
        self._dialect = dialect
        self._image_format = image_format

    def build(self, spec: RequestSpec) -> bytes:
        if spec.modality.has_image and spec.modality.has_text:
            raise ValueError("an OpenAI embeddings body holds a text or an image, not both (fusion)")
        if spec.modality.has_text:
            return text_body(self._dialect, self._text_source.make(spec.num_text_chars))
        assert spec.image_key is not None
        return image_body(self._dialect, data_uri(self._image_pool.b64(spec.image_key), self._image_format))
