"""The key a command-line client sends: the first key of an API key file, read as the server reads the file.

``mmserve quantiles`` and ``mmserve bench`` both take ``--api-key-file FILE``
and send its first key as ``Authorization: Bearer <key>``; one reader, so the
two agree on comments (``#``) and blank lines.
"""

from __future__ import annotations

from pathlib import Path


class ApiKeyFileError(Exception):
    """The key file cannot be read or holds no key a client can send; the message names the file."""


def read_api_key(path: Path) -> str:
    """The first key in ``path`` (one per line, ``#`` starts a comment). Raises ``ApiKeyFileError``."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ApiKeyFileError(f"cannot read the API key file {path}: {e}") from e
    keys = [line.split("#", 1)[0].strip() for line in lines]
    key = next((key for key in keys if key), None)
    if key is None:
        raise ApiKeyFileError(f"the API key file {path} holds no key")
    return key
