"""An OTLP/HTTP trace receiver that accepts and discards, in a process of its own: the far end of a benchmark.

    python -m benchmarks.otlp_sink --port 4318      # POST /v1/traces -> 200; GET /stats -> counts

With tracing on, a benchmark points the server's exporter here, so the
export cost the server pays (serialising, a loopback POST per batch of
spans) is real, while the receiving end does as little as a collector's
front door: it reads the body and answers with an empty
``ExportTraceServiceResponse`` (zero bytes of protobuf). It runs apart from
the load generator so that it does not compete with it for one interpreter.
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    serve(parser.parse_args().port)


if __name__ == "__main__":
    main()
