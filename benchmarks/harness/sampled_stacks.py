"""A live server's sampled stacks (py-spy) and the share of them a piece of code holds.

Throughput cannot show a cost of a few percent on a shared 2-core guest; a
profile can, because a share is taken within one process at one time,
whatever the machine's speed then. ``record_stacks`` samples a process with
``py-spy record --format raw --nonblocking`` (the sampler does not stop the
server); ``share_of`` counts the samples any of whose frames a predicate
picks, filed under the outermost such frame:

    stacks = record_stacks(server.pid, seconds=10, rate_hz=250)
    share = share_of(stacks, lambda frame: frame.path.endswith("router/tracing.py"))
    share.fraction, share.top_frames

That suits code that is called (a span recorder); code that *wraps* the
request (an ASGI middleware awaits the rest of the app inside its
``__call__``) is on the stack of nearly every sample, so ``share_held``
counts a sample for the code only when the innermost frame on its stack
that is not the standard library's (this checkout's or an installed
package's) is the code's: what it runs itself and the standard-library
calls it makes (hashing, comparing), not the app it awaits (the framework's
routing and the routes under it).

Without ``is_gil_only`` every Python thread that is not idle is sampled, so
a share times the server's CPU per request (``cpu_accounting``) is that
code's CPU per request; with it, only the thread holding the GIL: the share
of the interpreter's time. Time outside Python threads (torch's OpenMP
workers, wrk) is not sampled.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
_CHECKOUT = Path(__file__).resolve().parents[2].as_posix() + "/"

Stacks = list[tuple[tuple["Frame", ...], int]]


@dataclass(frozen=True)
class Frame:
    function: str
    file: str

    @property
    def path(self) -> str:
        """The file with forward slashes (``endswith`` a checkout-relative path picks our modules)."""
        return self.file.replace("\\", "/")

    def __str__(self) -> str:
        """The function and its file, relative to the checkout or to site-packages."""
        path = self.path.split("site-packages/", 1)[-1]
        return f"{self.function} ({path.removeprefix(_CHECKOUT)})"


def parse_raw(lines: Iterable[str]) -> Stacks:
    """py-spy's ``--format raw`` (collapsed stacks): ``frame;frame;... count``, root first."""
    stacks = []
    for line in lines:
        line = line.rstrip("\n")
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        frames = []
        for text in stack.split(";"):
            match = _FRAME.match(text)
            frames.append(Frame(match["function"], match["file"]) if match else Frame(text, ""))
        stacks.append((tuple(frames), int(count)))
    return stacks


@dataclass(frozen=True)
class Share:
    """How many samples were taken, how many the code held, and under which of its frames."""

    num_samples: int
    num_matching: int
    top_frames: tuple[tuple[str, int], ...]  # the outermost matching frame of each matching sample, most first

    @property
    def fraction(self) -> float:
        return self.num_matching / self.num_samples if self.num_samples else float("nan")


def _share(stacks: Sequence[tuple[tuple[Frame, ...], int]],
           filed_under: Callable[[tuple[Frame, ...]], Frame | None], num_top: int) -> Share:
    """Samples counted where ``filed_under`` names a frame of their stack, by that frame."""
    num_samples = num_matching = 0
    by_frame: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        num_samples += count
        frame = filed_under(frames)
        if frame is not None:
            num_matching += count
            by_frame[str(frame)] += count
    return Share(num_samples, num_matching, tuple(by_frame.most_common(num_top)))


def share_of(stacks: Sequence[tuple[tuple[Frame, ...], int]], is_counted: Callable[[Frame], bool],
             num_top: int = 4) -> Share:
    """A sample counts if any frame does; it is filed under its outermost counted frame."""
    return _share(stacks, lambda frames: next((frame for frame in frames if is_counted(frame)), None), num_top)


def innermost_app_frame(frames: Sequence[Frame]) -> Frame | None:
    """The frame nearest the leaf whose file is this checkout's or an installed package's (not the stdlib's)."""
    return next((frame for frame in reversed(frames)
                 if frame.path.startswith(_CHECKOUT) or "site-packages/" in frame.path), None)


def share_held(stacks: Sequence[tuple[tuple[Frame, ...], int]], is_counted: Callable[[Frame], bool],
               num_top: int = 4) -> Share:
    """A sample counts if the innermost frame that is not the standard library's does; filed under it."""

    def held_by(frames: tuple[Frame, ...]) -> Frame | None:
        frame = innermost_app_frame(frames)
        return frame if frame is not None and is_counted(frame) else None

    return _share(stacks, held_by, num_top)


def py_spy() -> str:
    """py-spy on PATH, or beside this interpreter (a venv's bin that is not on PATH)."""
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit("py-spy is not installed: pip install 'mmserve[bench]'")
    return found


def record_stacks(pid: int, seconds: float, rate_hz: int, is_gil_only: bool = False,
                  with_children: bool = False) -> Stacks:
    """``pid``'s stacks sampled for ``seconds`` at ``rate_hz`` (``with_children``: its child processes' too)."""
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as raw:
        sampled = subprocess.run(
            [py_spy(), "record", "--pid", str(pid), "--rate", str(rate_hz), "--duration", str(int(seconds)),
             "--format", "raw", "--full-filenames", "--nonblocking", "--output", raw.name,
             *(["--gil"] if is_gil_only else []), *(["--subprocesses"] if with_children else [])],
            capture_output=True, text=True)
        if sampled.returncode != 0:
            raise RuntimeError(f"py-spy failed ({sampled.returncode}); it needs ptrace rights over the "
                               f"server (root, or kernel.yama.ptrace_scope=0):\n{sampled.stderr[-2000:]}")
        return parse_raw(raw)
