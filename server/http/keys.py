"""The configured API keys, held as SHA-256 digests, in two roles: inference and admin.

Keys come from the settings (comma-separated) and from key files (one per
line, ``#`` starts a comment). Either may give a key as ``sha256:<64 hex>``,
the digest ``mmserve hash-key`` prints, so that the file a server reads does
not hold the secret itself. Plain keys are digested when loaded, so every
key is held the same way:

    presented token --sha256--> 32 bytes --hmac.compare_digest--> every configured digest

Every digest is compared, a match does not stop the loop, and digests all
have the same length: neither the time taken nor an early exit says how many
keys there are or which one nearly matched. A key is named in logs and
metrics only by its ``key_id``, the first 12 hex digits of its SHA-256
(48 bits: enough to tell an operator's keys apart, far too few to help
recover a key or stand in for its full hash).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

HASHED_PREFIX = "sha256:"
KEY_ID_HEX_DIGITS = 12
SCOPE_KEY_ID = "mmserve_key_id"  # scope["state"] entry ApiKeyAuth sets: request.state.mmserve_key_id
_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}")


class ApiKeyConfigError(ValueError):
    """The configured keys cannot be used (an unreadable or empty key file, a malformed sha256 line)."""


class Role(enum.Enum):
    """What a key may do. An admin key may also do everything an inference key may."""

    INFERENCE = "inference"
    ADMIN = "admin"


def key_digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def hashed_key_line(key: bytes) -> str:
    """The key-file line standing for ``key``: ``sha256:`` and the lowercase hex SHA-256 of its bytes."""
    return HASHED_PREFIX + hashlib.sha256(key).hexdigest()


def key_id_of_digest(digest: bytes) -> str:
    """The non-secret name of a key in logs and metrics: a 12-hex-digit prefix of its SHA-256."""
    return digest.hex()[:KEY_ID_HEX_DIGITS]


@dataclass(frozen=True)
class KeyMatch:
    """A presented key that is configured: its role and its non-secret id."""

    role: Role
    key_id: str


def _digest_of_entry(entry: str, origin: str) -> bytes:
    """A key as written in a setting or file (plain or ``sha256:<hex>``) -> its SHA-256 digest."""
    if entry.lower().startswith(HASHED_PREFIX):
        hex_digest = entry[len(HASHED_PREFIX):]
        if not _HEX_DIGEST.fullmatch(hex_digest):  # the entry itself is not echoed: it may be a secret
            raise ApiKeyConfigError(f"{origin}: a sha256: entry needs exactly 64 hex digits (mmserve hash-key)")
        return bytes.fromhex(hex_digest)
    return key_digest(entry.encode("utf-8"))


def _entries_of_setting(value: SecretStr | None, setting: str) -> list[bytes]:
    if value is None:
        return []
    entries = [entry.strip() for entry in value.get_secret_value().split(",")]
    return [_digest_of_entry(entry, setting) for entry in entries if entry]


def _entries_of_file(path: Path | None, setting: str) -> list[bytes]:
    if path is None:
        return []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ApiKeyConfigError(f"{setting} {path}: cannot be read: {e}") from e
    digests = []
    for number, line in enumerate(lines, 1):
        entry = line.split("#", 1)[0].strip()
        if entry:
            digests.append(_digest_of_entry(entry, f"{setting} {path} line {number}"))
    if not digests:
        raise ApiKeyConfigError(f"{setting} {path} holds no key")
    return digests


@dataclass(frozen=True)
class KeyRing:
    """Every configured key digest with its role; empty rings mean that role has no keys."""

    inference_digests: tuple[bytes, ...] = ()
    admin_digests: tuple[bytes, ...] = ()

    @classmethod
    def from_sources(cls, *, api_keys: SecretStr | None = None, api_key_file: Path | None = None,
                     admin_api_keys: SecretStr | None = None, admin_api_key_file: Path | None = None) -> KeyRing:
        inference = (_entries_of_setting(api_keys, "MMSERVE_API_KEYS")
                     + _entries_of_file(api_key_file, "MMSERVE_API_KEY_FILE"))
        admin = (_entries_of_setting(admin_api_keys, "MMSERVE_ADMIN_API_KEYS")
                 + _entries_of_file(admin_api_key_file, "MMSERVE_ADMIN_API_KEY_FILE"))
        return cls(tuple(inference), tuple(admin))

    @property
    def has_inference_keys(self) -> bool:
        return bool(self.inference_digests)

    @property
    def has_admin_keys(self) -> bool:
        return bool(self.admin_digests)

    def match(self, presented: bytes) -> KeyMatch | None:
        """The role and id of ``presented``, or None; constant time in which key (if any) matched."""
        digest = key_digest(presented)
        is_inference = _matches_any(digest, self.inference_digests)
        is_admin = _matches_any(digest, self.admin_digests)
        if is_admin:
            return KeyMatch(Role.ADMIN, key_id_of_digest(digest))
        if is_inference:
            return KeyMatch(Role.INFERENCE, key_id_of_digest(digest))
        return None


def _matches_any(digest: bytes, digests: Iterable[bytes]) -> bool:
    """Compares with every digest (no early exit on a match)."""
    is_match = False
    for configured in digests:
        is_match |= hmac.compare_digest(digest, configured)
    return is_match
