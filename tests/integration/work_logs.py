"""A server started with the work-logging test hooks (``api_workers_hooks``), and what its processes logged.

Every process of the server appends its process id to one file per kind of
work: each text it tokenizes, each image it decodes, each raw array it turns
into the model's input. So a test sees which process did the work, and that
a cache hit does none in any.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ServeProcess, run_serve_process

HOOKS = str(Path(__file__).parent / "api_workers_hooks")


@dataclass
class Logged:
    """A running server and the files its processes log their work to (one process id a line)."""

    served: ServeProcess
    tokenize_log: Path
    decode_log: Path
    pixels_log: Path

    @property
    def url(self) -> str:
        return self.served.url

    def children(self, kind: str) -> set[int]:
        """The supervisor's children whose command line names ``kind`` (``api_process``, ``engine_process``)."""
        pid = self.served.process.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return {int(child) for child in children
                if kind in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace")}

    def counts(self) -> dict[str, Counter]:
        """Per log, how many lines each process id wrote so far."""
        return {name: Counter(int(line) for line in path.read_text().split())
                for name, path in (("tokenize", self.tokenize_log), ("decode", self.decode_log),
                                   ("pixels", self.pixels_log))}


@contextmanager
def serve_logged(log_directory: Path, args: list[str], env: Mapping[str, str] = {}) -> Iterator[Logged]:
    """``mmserve serve ARGS`` with the hooks on the path and its logs in ``log_directory`` (``env`` added)."""
    tokenize_log, decode_log, pixels_log = (log_directory / f"{name}.log" for name in ("tokenize", "decode", "pixels"))
    for log in (tokenize_log, decode_log, pixels_log):
        log.write_text("")
    hooked = {"PYTHONPATH": os.pathsep.join([HOOKS, os.environ.get("PYTHONPATH", "")]),
              "MMSERVE_TEST_TOKENIZE_LOG": str(tokenize_log), "MMSERVE_TEST_DECODE_LOG": str(decode_log),
              "MMSERVE_TEST_PIXELS_LOG": str(pixels_log), **env}
    with run_serve_process(args, hooked) as served:
        yield Logged(served, tokenize_log, decode_log, pixels_log)
