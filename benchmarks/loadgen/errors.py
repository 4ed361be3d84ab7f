"""Typed errors of the load generator.

Each one is a user-facing problem (bad flag, bad trace) that the CLI turns
into a one-line message and a non-zero exit code, never a traceback: a
``ConfigError`` is a usage error (exit 2, as argparse's own), the others mean
the run could not start (exit 1).
"""

from __future__ import annotations


class LoadgenError(Exception):
    """Base of every error the load generator raises on purpose."""


class ConfigError(LoadgenError):
    """A flag or flag combination that cannot describe a run (a usage error)."""


class RunNotStartedError(LoadgenError):
    """Flags that describe a run the world does not allow: an unreadable key file, a missing output
    directory, a server no request reached."""


class TraceFormatError(LoadgenError):
    """A trace record that cannot be replayed.

    ``location`` names where the problem is (``"line 7"`` in a JSONL trace,
    ``"resourceSpans[0].scopeSpans[1].spans[3]"`` in a span document) so the
    user can fix the trace without guessing.
    """

    def __init__(self, source: str, location: str, problem: str) -> None:
        super().__init__(f"{source}: {location}: {problem}")
        self.source = source
        self.location = location
        self.problem = problem
