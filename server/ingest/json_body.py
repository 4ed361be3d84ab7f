"""JSON in and out of the hot path, with orjson.

An answer carries up to three embeddings: 3 x 768 floats for vit-b16, 3 x
1024 for vit-l16. The standard library renders them from Python lists at
about 1.3 ms per vit-b16 answer, on the event loop; on a GPU serving
hundreds of answers a second that alone fills a core. orjson writes numpy
arrays directly (no ``tolist``), about ten times faster, and parses request
bodies faster too. Floats are written in their shortest form that reads
back to the same float32, so no precision is lost.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

JSONDecodeError = json.JSONDecodeError  # orjson's is a subclass
MAX_DEPTH = 1024  # orjson's fixed nesting limit: arrays and objects inside each other


def dumps(document: Any) -> bytes:
    """``document`` as UTF-8 JSON; numpy arrays and scalars become numbers, NaN/inf become null."""
    return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)


def loads(body: bytes | str) -> Any:
    """Parse a request body; raises ``JSONDecodeError`` (or ``UnicodeDecodeError``) for what is not JSON.

    A body orjson refuses is read again by the standard library, which
    accepts what the API accepted before orjson: a lone surrogate escape
    (``"\\ud800"``) parses, and the text check then names the field it is in,
    rather than the whole body failing as invalid JSON. Valid bodies, nearly
    all of them, take only the fast path.

    A body nested deeper than ``MAX_DEPTH`` is refused as not JSON, with the
    limit in the message: the standard library would only recurse until
    Python's own limit and raise ``RecursionError`` (a 500), so it never sees
    such a body, and one it cannot nest as deep as orjson is refused the same way.
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        if e.msg == "depth limit exceeded":
            raise _too_deep(e.doc, e.pos) from e
        try:
            return json.loads(body)
        except RecursionError as recursion:
            raise _too_deep(e.doc, e.pos) from recursion


def _too_deep(document: str, position: int) -> JSONDecodeError:
    return JSONDecodeError(f"arrays and objects nest deeper than the limit of {MAX_DEPTH} levels", document, position)
