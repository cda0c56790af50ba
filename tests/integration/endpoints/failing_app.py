#!/usr/bin/python3
"""A serving program whose every invocation fails (test_data_capture.py's failing shadow variant).

Kiln runs it as `<this file> serve` (image `local:<this file>`). Standard library only. Listens on
0.0.0.0:$SAGEMAKER_BIND_TO_PORT (default 8080); GET /ping → 200; POST /invocations → 500 text/plain
"shadow model failure"; prints one line per request. SIGTERM exits 0."""
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import os


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # noqa: N802 (stdlib name)
        sys.stdout.write("failing_app %s\n" % (fmt % args))
        sys.stdout.flush()

    def answer(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        self.answer(200 if self.path == "/ping" else 404, b"")

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.answer(500, b"shadow model failure")


def main():
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    server = ThreadingHTTPServer(("0.0.0.0", int(os.environ.get("SAGEMAKER_BIND_TO_PORT") or 8080)), Handler)
    server.daemon_threads = True
    print("failing_app ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
