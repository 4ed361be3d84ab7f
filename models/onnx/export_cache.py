"""Exported graphs on disk: one directory per key, checked when read, written whole or not at all.

    <export_cache_dir>/
    ├── <key digest>/                one model's graphs for one runtime, exporter, ONNX Runtime, opset, quantization
    │   ├── manifest.json            the key it was written for; each file's size and BLAKE2b digest
    │   ├── vision.onnx  vision.onnx.data
    │   └── text.onnx    text.onnx.data
    ├── .tmp-<random>/               an export in progress (or one killed half-way: never read)
    └── .locks/<key digest>          locked by the process exporting that key (``exporting``)

An entry is written into a temporary directory beside its final place, its
manifest last, and moved there with one ``os.replace``: a reader sees a whole
entry or none. When two servers export the same key at once, the first move
wins and the second server drops its own copy and reads the winner's (processes
that hold the key's lock, ``exporting``, export it once between them). A read
checks the manifest's key and every file's size and digest; an entry that
fails (a disk error, a copy cut short, a key written by another version) is
moved aside and deleted, and the caller exports again. What the graph
computes is checked after this, against the torch forward
(``models.onnx.towers``).

An entry gets the modes any directory and file of the process get under its
umask (not ``mkdtemp``'s 0700), so a cache filled by one user (``mmserve
export`` as root while building an image) can be read by the server's user.
A cache this process cannot write, or an entry it cannot read or remove (a
directory of another user, a file where the directory should be), raises
``OnnxExportError`` naming the directory, the OS's reason and
``--export-cache-dir``: ``--runtime auto`` serves torch and logs it, ``--runtime
onnxruntime`` and ``mmserve export`` stop with it. An entry that cannot be
read for its permissions is left where it is: it is whole, only not this
user's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from models.errors import OnnxExportError

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
_LOCKS = ".locks"  # one empty file per key, locked while a process exports it
_ABANDONED_AFTER_S = 24 * 3600  # a temporary directory this old belongs to a start that died


@dataclass(frozen=True)
class ExportKey:
    """Everything that decides what an exported graph computes."""

    fingerprint: str  # the model's (models.loading.repository.fingerprint): weights, config, dtype, tokenizer
    runtime: str  # "onnxruntime"
    exporter: str  # "torch <version>"
    onnxruntime: str  # ONNX Runtime's version
    opset: int
    quantization: str  # "none" | "int8"

    def digest(self) -> str:
        return hashlib.blake2b(json.dumps(asdict(self), sort_keys=True).encode(), digest_size=32).hexdigest()


def cache_error(doing: str, path: Path, error: OSError) -> OnnxExportError:
    """One line for an export cache the OS refuses us: what, where, why, and the setting that moves it."""
    return OnnxExportError(f"the export cache cannot {doing} {path} ({error.strerror or error}): give "
                           "--export-cache-dir (MMSERVE_EXPORT_CACHE_DIR) a directory this user can read and write")


def _file_digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "blake2b").hexdigest()


@dataclass(frozen=True)
class CacheLookup:
    """A valid entry's directory, or None and why there is none."""

    directory: Path | None
    reason: str = ""  # "absent", or what was wrong with the entry found (it has been removed)


class ExportCache:
    """The export cache under ``root`` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def entry_dir(self, key: ExportKey) -> Path:
        return self.root / key.digest()

    def lookup(self, key: ExportKey) -> CacheLookup:
        """The entry for ``key`` if it is whole and was written for ``key``; a broken one is removed."""
        directory = self.entry_dir(key)
        try:
            if not directory.exists():
                return CacheLookup(None, "absent")
            problem = self._problem(directory, key)
        except PermissionError as e:  # whole, perhaps, but another user's: not ours to judge or remove
            raise cache_error("read", directory, e) from e
        if problem is None:
            return CacheLookup(directory)
        logger.warning("the cached ONNX graphs in %s are unusable (%s): removing them and exporting again",
                       directory, problem)
        self.remove(key)
        return CacheLookup(None, problem)

    def _problem(self, directory: Path, key: ExportKey) -> str | None:
        try:
            manifest = json.loads((directory / MANIFEST_FILE).read_text())
        except PermissionError:
            raise
        except (OSError, ValueError) as e:
            return f"no readable {MANIFEST_FILE}: {e}"
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) or not all(
                isinstance(facts, dict) and {"size_bytes", "blake2b"} <= facts.keys()
                for facts in manifest["files"].values()):
            return f"{MANIFEST_FILE} is not a manifest (a key and each file's size_bytes and blake2b)"
        if manifest.get("key") != asdict(key):
            return f"{MANIFEST_FILE} was written for another key: {manifest.get('key')}"
        for name, facts in manifest["files"].items():
            path = directory / name
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != facts["size_bytes"]:
                return f"{name} has {path.stat().st_size} bytes, the manifest says {facts['size_bytes']}"
            if _file_digest(path) != facts["blake2b"]:
                return f"{name} does not have the digest the manifest names"
        return None

    @contextlib.contextmanager
    def exporting(self, key: ExportKey) -> Iterator[float]:
        """Hold ``key``'s lock (an ``flock`` on ``.locks/<digest>``) while looking it up and exporting, so processes
        of this machine that start together export it once; where the root is not writable, no lock.

        Yields the seconds spent waiting for another holder (one exporting the key), 0.0 when the lock was free:
        a start that waited says so, not that reading the cache took that long."""
        try:
            (self.root / _LOCKS).mkdir(parents=True, exist_ok=True)
            lock = (self.root / _LOCKS / key.digest()).open("a")
        except OSError:
            yield 0.0
            return
        with lock:  # the flock is released when the file closes, or the process dies
            waited_s = 0.0
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another process holds it: exporting this key
                started = time.perf_counter()
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                waited_s = time.perf_counter() - started
            yield waited_s

    def check_writable(self) -> None:
        """Create the cache and an export's temporary directory in it as ``store`` does, and remove that again:
        ``OnnxExportError`` (``cache_error``) now, before any model is loaded, if the OS refuses. ``store``
        still reports a refusal that comes later (a permission changed meanwhile)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._new_tmp().rmdir()
        except OSError as e:
            raise cache_error("write into", self.root, e) from e

    def store(self, key: ExportKey, write: Callable[[Path], None]) -> Path:
        """Run ``write(tmp_dir)`` and publish what it wrote as ``key``'s entry; returns the entry's directory.

        If another process published the key meanwhile, its entry is kept and
        this one dropped (both hold the same graphs). Raises ``OnnxExportError``
        (``cache_error``) when the OS refuses the cache directory.
        """
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._remove_abandoned()
            tmp = self._new_tmp()
        except OSError as e:
            raise cache_error("write into", self.root, e) from e
        try:
            write(tmp)
            return self._publish(key, tmp)
        except OSError as e:
            raise cache_error("write into", self.root, e) from e
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def _new_tmp(self) -> Path:
        """An empty directory for an export in progress, made as ``mkdir`` makes one (the umask's mode, not 0700)."""
        tmp = self.root / f"{_TMP_PREFIX}{secrets.token_hex(8)}"
        tmp.mkdir()
        return tmp

    def _publish(self, key: ExportKey, tmp: Path) -> Path:
        """Write ``tmp``'s manifest, give its files the umask's mode and move it to ``key``'s entry."""
        file_mode = tmp.stat().st_mode & 0o666  # what open() gives a new file here: 0o666 less the umask
        files = {path.name: {"size_bytes": path.stat().st_size, "blake2b": _file_digest(path)}
                 for path in sorted(tmp.iterdir()) if path.is_file()}
        manifest = tmp / MANIFEST_FILE
        manifest.write_text(json.dumps({"key": asdict(key), "files": files}, indent=1, sort_keys=True))
        for name in [*files, MANIFEST_FILE]:  # on disk before the move that makes the entry visible
            (tmp / name).chmod(file_mode)  # a writer's mkstemp (the int8 graphs) made it 0600
            with (tmp / name).open("rb") as f:
                os.fsync(f.fileno())
        final = self.entry_dir(key)
        try:
            os.replace(tmp, final)
        except OSError:  # another process published it first: the same key, the same graphs
            if not final.is_dir():
                raise
            logger.info("another process exported %s first; using its copy", final)
        return final

    def remove(self, key: ExportKey) -> None:
        """Delete ``key``'s entry: moved aside first, so no reader sees it half-deleted.

        Raises ``OnnxExportError`` (``cache_error``) when the OS refuses: an
        unusable entry this user cannot remove would be found again at every start.
        """
        directory = self.entry_dir(key)
        trash = self.root / f"{_TRASH_PREFIX}{directory.name}-{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.replace(directory, trash)
        except FileNotFoundError:
            return
        except OSError as e:
            raise cache_error("remove the unusable entry", directory, e) from e
        shutil.rmtree(trash, ignore_errors=True)

    def _remove_abandoned(self) -> None:
        now_s = time.time()
        for path in self.root.iterdir():
            if path.name.startswith((_TMP_PREFIX, _TRASH_PREFIX)):
                try:
                    if now_s - path.stat().st_mtime > _ABANDONED_AFTER_S:
                        shutil.rmtree(path, ignore_errors=True)
                except FileNotFoundError:
                    pass
