"""Does a server embed as the family's library does? Cosine against the reference, over OpenAI embeddings.

Each input goes alone in its own ``POST /v1/embeddings``, so nothing is
padded against anything else; a row keeps the smallest cosine over images
and over texts and the range of the vectors' L2 norms. A server that cannot
serve a family gets a row saying what it answered.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import numpy as np

from benchmarks.harness.table_layout import align
from benchmarks.loadgen.embeddings_payload import (
    EMBEDDINGS_PATH, EmbeddingsDialect, data_uri, image_body, text_body,
)
from benchmarks.loadgen.image_pool import ImageFormat
from benchmarks.reference_embeddings import ReferenceEmbeddings, ReferenceInputs, min_cosine

MIN_COSINE = 0.99999
MODELS_PATH = "/v1/models"
_EXCEPTION_LINE = re.compile(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception|Exit)\b:?.*$")
_MAX_REASON_CHARS = 160


class RefusedError(RuntimeError):
    """The server answered a request with an error status; the message is that status and body."""


@dataclass(frozen=True)
class AgreementRow:
    """One server on one family: the worst cosines, the norms it returned, or why it could not."""

    family: str
    server: str
    image_min_cosine: float | None = None
    text_min_cosine: float | None = None
    norm_range: tuple[float, float] | None = None
    failure: str | None = None

    @property
    def is_met(self) -> bool:
        return (self.failure is None and self.image_min_cosine is not None and self.text_min_cosine is not None
                and min(self.image_min_cosine, self.text_min_cosine) >= MIN_COSINE)


def failure_reason(stderr_tail: str) -> str:
    """The last line of a start-up's stderr that names an exception (else its last line), shortened.

    An exception whose message starts on the next line (``ImportError:`` then
    the text, as transformers raises them) gets that next line joined on.
    """
    lines = [line.strip() for line in stderr_tail.splitlines() if line.strip()]
    named = [index for index, line in enumerate(lines) if _EXCEPTION_LINE.match(line)]
    if not named:
        reason = (lines or ["(no output)"])[-1]
    else:
        index = named[-1]
        reason = lines[index]
        if reason.endswith(":") and index + 1 < len(lines):
            reason = f"{reason} {lines[index + 1]}"
    return reason if len(reason) <= _MAX_REASON_CHARS else reason[: _MAX_REASON_CHARS - 3] + "..."


def served_model_name(client: httpx.Client) -> str:
    """The first model ``GET /v1/models`` lists (both servers answer OpenAI's model list)."""
    return str(client.get(MODELS_PATH).raise_for_status().json()["data"][0]["id"])


def _embedding(client: httpx.Client, body: bytes) -> np.ndarray:
    response = client.post(EMBEDDINGS_PATH, content=body, headers={"content-type": "application/json"})
    if response.status_code != 200:
        raise RefusedError(f"{response.status_code} {response.text[:_MAX_REASON_CHARS]}")
    embedding = response.json()["data"][0]["embedding"]
    if isinstance(embedding, str):  # base64 little-endian float32, should a server send it unasked
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4")
    return np.asarray(embedding, dtype=np.float32)  # (D,)


def agreement_row(family: str, server: str, url: str, dialect: EmbeddingsDialect, inputs: ReferenceInputs,
                  want: ReferenceEmbeddings, image_format: ImageFormat) -> AgreementRow:
    """Every input embedded by the server at ``url``, compared with the reference."""
    with httpx.Client(base_url=url, timeout=60.0, trust_env=False) as client:
        try:
            images = [_embedding(client, image_body(dialect, data_uri(base64.b64encode(data), image_format)))
                      for data in inputs.images]
            texts = [_embedding(client, text_body(dialect, text)) for text in inputs.texts]
        except RefusedError as e:
            return AgreementRow(family, server, failure=f"answered {e}")
    norms = [float(np.linalg.norm(vector)) for vector in (*images, *texts)]
    return AgreementRow(family, server, min_cosine(images, want.images), min_cosine(texts, want.texts),
                        (min(norms), max(norms)))


def _cosine_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.6f}"


def format_agreement_table(rows: Sequence[AgreementRow], num_images: int, num_texts: int) -> str:
    header = ("family", "server", "image min cos", "text min cos", "L2 norms", f"target >= {MIN_COSINE}")
    table = [header]
    for row in rows:
        if row.failure is not None:
            table.append((row.family, row.server, "-", "-", "-", "cannot serve"))
            continue
        assert row.norm_range is not None
        low, high = row.norm_range
        table.append((row.family, row.server, _cosine_text(row.image_min_cosine), _cosine_text(row.text_min_cosine),
                      f"{low:.3f}" if f"{low:.3f}" == f"{high:.3f}" else f"{low:.3f}-{high:.3f}",
                      "met" if row.is_met else "NOT met"))
    lines = [f"embeddings against the family's library, min over {num_images} images and {num_texts} texts, "
             "one input per request"]
    lines += align(table)
    lines += [f"  {row.server} on {row.family}: {row.failure}" for row in rows if row.failure is not None]
    return "\n".join(lines)
