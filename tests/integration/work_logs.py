"""A server started with the work-logging test hooks (``api_workers_hooks``), and what its processes logged.

Every process of the server appends its process id to one file per kind of
work: each text it tokenizes, each image it decodes, each raw array it turns
into the model's input. So a test sees which process did the work, and that
a cache hit does none in any.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ServeProcess, run_serve_processes

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
    with serve_logged_side_by_side([(log_directory, args, env)]) as (logged,):
        yield logged


@contextmanager
def serve_logged_side_by_side(runs: list[tuple[Path, list[str], Mapping[str, str]]]) -> Iterator[list[Logged]]:
    """Several ``serve_logged`` servers, (log directory, ARGS, env) each, started at once (``run_serve_processes``)."""
    specs, logs = [], []
    for log_directory, args, env in runs:
        tokenize_log, decode_log, pixels_log = (log_directory / f"{name}.log"
                                                for name in ("tokenize", "decode", "pixels"))
        for log in (tokenize_log, decode_log, pixels_log):
            log.write_text("")
        hooked = {"PYTHONPATH": os.pathsep.join([HOOKS, os.environ.get("PYTHONPATH", "")]),
                  "MMSERVE_TEST_TOKENIZE_LOG": str(tokenize_log), "MMSERVE_TEST_DECODE_LOG": str(decode_log),
                  "MMSERVE_TEST_PIXELS_LOG": str(pixels_log), **env}
        specs.append((args, hooked))
        logs.append((tokenize_log, decode_log, pixels_log))
    with run_serve_processes(specs) as served:
        yield [Logged(process, *paths) for process, paths in zip(served, logs)]


def send_until_both_api_processes_worked(send: Callable[[int], object], log: Path, *, at_least: int,
                                          at_most: int = 96) -> int:
    """Call ``send(0)``, ``send(1)``, … until ``log`` names two processes (at least ``at_least`` calls); how many.

    Each request goes on a new connection, which either API process may accept:
    both wait on the one listening socket, the kernel wakes both, and the one
    that calls accept() first takes it. Which one wins is the scheduler's
    choice, and on a quiet machine one process can win sixteen in a row (CI saw
    it; a long-running server drifts towards one winner). A test that needs
    both processes to have done some of the work sends more until they have,
    up to ``at_most``, and asserts on the log afterwards.
    """
    sent = 0
    while sent < at_least or (len(set(log.read_text().split())) < 2 and sent < at_most):
        send(sent)
        sent += 1
    return sent
