"""The key a command-line client sends: the first key of an API key file, read as the server reads the file.

``mmserve quantiles`` and ``mmserve bench`` both take ``--api-key-file FILE``
and send its first key as ``Authorization: Bearer <key>``; one reader, so the
two agree on comments (``#``) and blank lines. A ``sha256:`` line (the
server's own key-file format, from ``mmserve hash-key``) is a digest the
server checks keys against, not a key: sent, it would be refused with 401.
"""

from __future__ import annotations

from pathlib import Path

HASHED_PREFIX = "sha256:"  # server.http.keys.HASHED_PREFIX: a digest line, not a key


class ApiKeyFileError(Exception):
    """The key file cannot be read or holds no key a client can send; the message names the file."""


def read_api_key(path: Path) -> str:
    """The first key in ``path`` (one per line, ``#`` starts a comment). Raises ``ApiKeyFileError``, also when
    that first entry is a ``sha256:`` digest."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ApiKeyFileError(f"cannot read the API key file {path}: {e}") from e
    keys = [line.split("#", 1)[0].strip() for line in lines]
    key = next((key for key in keys if key), None)
    if key is None:
        raise ApiKeyFileError(f"the API key file {path} holds no key")
    if key.lower().startswith(HASHED_PREFIX):  # the line itself is not echoed
        raise ApiKeyFileError(
            f"the API key file {path} holds a sha256: digest (the server's key-file format, from mmserve hash-key), "
            "which the server checks keys against, not a key a client can send: give a file with the key itself"
        )
    return key
