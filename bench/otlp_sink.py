"""An OTLP/HTTP trace sink for the tracing-overhead benchmark: it answers POST /v1/traces
as a collector would and counts what came (requests, bytes, spans), so imroute's
processes pay the whole cost of exporting while the sink's own work stays out of their
CPU figures. Stop it with SIGTERM or Ctrl-C; it prints its counts as one JSON line.

    .venv/bin/python -m bench.otlp_sink --port 4318 &
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 .venv/bin/python -m bench.p2p ...
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

COUNTS = {"requests": 0, "bytes": 0, "spans": 0}
_lock = threading.Lock()


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a collector: one connection per exporter

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        request = ExportTraceServiceRequest.FromString(body)
        spans = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with _lock:
            COUNTS["requests"] += 1
            COUNTS["bytes"] += len(body)
            COUNTS["spans"] += spans
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--port", type=int, default=4318)
    args = p.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Sink)

    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"otlp sink on http://127.0.0.1:{server.server_address[1]}", file=sys.stderr, flush=True)
    server.serve_forever()
    print(json.dumps(COUNTS), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
