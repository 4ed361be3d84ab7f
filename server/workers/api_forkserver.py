"""The API processes' fork server: one process that has imported what every API process imports, and forks them.

    python -m server.workers.api_forkserver CONTROL_FD LISTENING_FD      (the supervisor starts it)

A new interpreter (``python -m server.workers.api_process``) spends 1.0-1.7 s
of CPU importing fastapi, pydantic, numpy, uvicorn and the API-side modules
before it answers (2 s and more on a busy machine), and one started again
after a crash pays that while the server runs a process short. This process
pays it once, when the server starts, while the engine loads its model; every
API process, the first N and each one started again, is then a fork of it: it
starts with those modules imported (their pages shared until written), builds
its app, asks the engine for the model's facts and tokenizer, and serves
(BENCHMARKS.md, "API processes: memory and restart").
``api_process_start: spawn`` starts new interpreters instead.

What is imported here (``PRELOADED``) is what an API process has imported once
it has served: its entry point and all it reaches, and what uvicorn, Pillow
and the tokenizer readers import only when first used. A module missing from
the list is imported by each API process, which costs time, nothing else.

Forking is safe because this process has nothing a fork would break: one
thread (counted in ``/proc/self/task`` before each fork; the supervisor gives
it ``OPENBLAS_NUM_THREADS=1`` so numpy starts no pool), no event loop, no
engine connection, no logging handler of its own, and no socket but the
listening one (it never accepts) and its control socket (closed in the child).

The control socket (a Unix stream socket; the supervisor holds the other end):

    supervisor  -> "fork\\n"
    this        -> "<pid>\\n"           the new API process, already the supervisor's child
                   "error <why>\\n"     none (the supervisor starts a new interpreter instead)
    end of file -> this process exits: the supervisor stopped, or was killed

An API process is the supervisor's child, not this process's, so that the
supervisor waits for it, reads its exit status and signals it as it did one it
started itself, and its orphan guard (``server.workers.orphan_guard``) watches
the same parent:

    supervisor (a child subreaper: PR_SET_CHILD_SUBREAPER, server.workers.forked_process)
     └─ fork server ─ fork ─> intermediate ─ fork ─> API process
                              exits at once, so its child is re-parented to the nearest
                              subreaper, the supervisor, before this process reaps it and answers

The API process names itself ``<python> -m server.workers.api_process FD`` (its
``/proc/PID/cmdline``, what ``ps`` shows), as one started the other way is named.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import importlib
import logging
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

logger = logging.getLogger(__name__)

# What a served API process has imported (its sys.modules, read with the test hooks' SIGUSR2) and its entry
# point does not import by itself: uvicorn's loop, HTTP parser, websockets and lifespan (chosen at start),
# the tokenizer readers and their libraries (chosen by the engine's files).
PRELOADED = (
    "server.workers.api_process",
    "models.torch_free.json_tokenizer", "models.torch_free.siglip_sentencepiece", "models.torch_free.clip_bpe",
    "tokenizers", "sentencepiece",
    "uvicorn.loops.auto", "uvicorn.loops.asyncio", "uvicorn.lifespan.on", "uvicorn.protocols.http.auto",
    "uvicorn.protocols.websockets.auto", "uvloop", "uvicorn.loops.uvloop", "httptools",
    "uvicorn.protocols.http.httptools_impl", "encodings.idna",
)
API_PROCESS_MODULE = "server.workers.api_process"


class ForkRefused(Exception):
    """No API process was forked; the message says why."""


def preload() -> list[str]:
    """Import ``PRELOADED`` and Pillow's common image plugins; the names that could not be imported."""
    missing = []
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional speed-up (uvloop, httptools) not installed: uvicorn does without
            missing.append(name)
    from PIL import Image

    Image.preinit()  # BMP, GIF, JPEG, PPM, PNG: imported by the first decode otherwise
    return missing


def num_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def fork_api_process(control: socket.socket, listening_fd: int) -> int:
    """Fork an API process that is the supervisor's child once this returns; its pid. ``ForkRefused``."""
    if (threads := num_threads()) != 1:
        raise ForkRefused(f"this process has {threads} threads; forking it could copy a held lock")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # or what it holds would be written by the fork too
    read_fd, write_fd = os.pipe()
    intermediate = os.fork()
    if intermediate == 0:
        os.close(read_fd)
        try:
            intermediate = os.getpid()
            pid = os.fork()
            if pid == 0:
                os.close(write_fd)
                serve_api_process(control, listening_fd, intermediate)
            os.write(write_fd, str(pid).encode())
        except OSError as e:
            os.write(write_fd, f"error {e}".encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        answer = pipe.read().decode()
    os.waitpid(intermediate, 0)  # it has exited: its child is the supervisor's now
    if not answer.isdigit():
        raise ForkRefused(answer or "the intermediate process died")
    return int(answer)


def serve_api_process(control: socket.socket, listening_fd: int, intermediate: int) -> NoReturn:
    """In the forked child of ``intermediate``: become an API process started the usual way, serve, and exit
    with its status."""
    os.close(control.detach())
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a new interpreter, until uvicorn sets its own
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    name_process(["-m", API_PROCESS_MODULE, str(listening_fd)])
    api_process = importlib.import_module(API_PROCESS_MODULE)
    sys.argv = [api_process.__file__ or API_PROCESS_MODULE, str(listening_fd)]  # as ``python -m`` sets them
    adopted_by = time.monotonic() + 5
    while os.getppid() == intermediate and time.monotonic() < adopted_by:
        time.sleep(0.0005)  # the orphan guard starts in main() and compares the parent with the supervisor
    gc.enable()
    status = 1
    try:
        status = api_process.main(listening_fd)
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught one, then exit 1
        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()  # noqa: SLF001 - what interpreter exit runs (logging's flush, the orphan guard's)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(status)


def name_process(arguments: list[str]) -> None:
    """Write ``arguments`` after argv[0] over this process's own argument strings (``/proc/self/cmdline``).

    The kernel reads the command line from the memory the process's arguments
    were placed in (``arg_start``..``arg_end`` in ``/proc/self/stat``), which
    the interpreter has copied and no longer reads; what does not fit is left
    as it is. The rest of that memory is zeroed, so nothing of the old line shows.
    """
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    arg_start, arg_end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5), counted from 3
    program = Path("/proc/self/cmdline").read_bytes().split(b"\0", 1)[0]
    line = b"\0".join([program, *map(os.fsencode, arguments)]) + b"\0"
    if arg_start == 0 or len(line) > arg_end - arg_start:
        logger.warning("could not name process %d %s", os.getpid(), " ".join(arguments))
        return
    ctypes.memmove(arg_start, line.ljust(arg_end - arg_start, b"\0"), arg_end - arg_start)


def _read_request(control: socket.socket) -> bytes:
    """One request line, without its newline; b"" at end of file."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = control.recv(1)
        if not chunk:
            return b""
        line += chunk
    return line[:-1]


def main() -> int:
    control = socket.socket(fileno=int(sys.argv[1]))
    listening_fd = int(sys.argv[2])
    # Ctrl-C reaches the whole process group; the supervisor stops this process (end of file), not the terminal.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.disable()  # no collection leaves holes in the pages the forks share (gc module docs, ``freeze``)
    missing = preload()
    gc.freeze()  # nor touches the objects imported here from an API process (it enables the collector again)
    if missing:
        print(f"api forkserver {os.getpid()}: not installed, imported by none: {', '.join(missing)}", file=sys.stderr)
    while request := _read_request(control):
        try:
            if request != b"fork":
                raise ForkRefused(f"unknown request {request[:40]!r}")
            answer = str(fork_api_process(control, listening_fd))
        except (ForkRefused, OSError) as e:
            answer = f"error {e}"
        control.sendall(answer.encode() + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
