"""A real HTTP server in a process of its own that answers every POST with 200: what the harness's tests drive.

    python tests/http_sink.py --port 4318      # POST anything -> 200 (empty body); GET /stats -> counts

It starts in a fraction of a second, so the tests of ``benchmarks.harness``
run real process groups, pauses, A-B-B-A runs and ``wrk`` against it
(``sink_command``). Standard library only: it runs as a script.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class _Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.num_requests = 0
        self.num_bytes = 0


def serve(port: int) -> None:
    counts = _Counts()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a collector offers it

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            size = int(self.headers.get("Content-Length", "0"))
            self.rfile.read(size)
            with counts.lock:
                counts.num_requests += 1
                counts.num_bytes += size
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802
            with counts.lock:
                body = json.dumps({"requests": counts.num_requests, "bytes": counts.num_bytes}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def sink_command():
    """The sink as a ``benchmarks.harness`` server command on a free loopback port, ready at ``/stats``."""
    from benchmarks.harness.server_process import ServerCommand, free_port

    port = free_port()
    return ServerCommand("sink", (sys.executable, str(Path(__file__).resolve()), "--port", str(port)), port, "/stats")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    serve(parser.parse_args().port)


if __name__ == "__main__":
    main()
