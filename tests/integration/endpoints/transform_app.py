#!/usr/bin/python3
"""A bring-your-own-container serving program for the batch transform tests (test_transform.py).

Kiln runs it as `<this file> serve` (image `local:<this file>`). Standard library only; listens on
0.0.0.0:$SAGEMAKER_BIND_TO_PORT (default 8080). At start it prints one line
"transform_app env: {...}" with every SAGEMAKER_* variable it was given.

GET /ping: 200.
GET /execution-parameters: $TRANSFORM_EXECUTION_PARAMETERS (JSON) with 200 when set, else 404.
POST /invocations:
  text/csv: one output line per input line: the sum of the integer fields of the line (fields
    that are not integers, such as an id column, are skipped), "\\n"-terminated. A line "fail"
    answers 500 instead.
  anything else: "<body length>\\n" (one record per request under SingleRecord).
  $TRANSFORM_SLEEP_SECONDS: sleep that long before answering each request.
Each request logs "request records=N bytes=B inflight=I" (I: requests in flight at its start).
SIGTERM exits 0 at once (the program is PID 1 of its instance, which has no default handler).
"""
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
STATE = {"inflight": 0}


def log(line):
    with LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def int_or_none(text):
    try:
        return int(text)
    except ValueError:
        return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body, content_type="text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/ping":
            self.answer(200, b"")
        elif self.path == "/execution-parameters" and os.environ.get("TRANSFORM_EXECUTION_PARAMETERS"):
            self.answer(200, os.environ["TRANSFORM_EXECUTION_PARAMETERS"].encode(), "application/json")
        else:
            self.answer(404, b"not found")

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        with LOCK:
            STATE["inflight"] += 1
            inflight = STATE["inflight"]
        try:
            sleep = float(os.environ.get("TRANSFORM_SLEEP_SECONDS", "0"))
            if sleep:
                time.sleep(sleep)
            content_type = self.headers.get("Content-Type", "")
            if content_type.startswith("text/csv"):
                lines = body.decode().split("\n")
                if lines and lines[-1] == "":
                    lines.pop()
                log("request records=%d bytes=%d inflight=%d" % (len(lines), len(body), inflight))
                if "fail" in lines:
                    self.answer(500, b"a line said fail")
                    return
                out = []
                for line in lines:
                    values = [int_or_none(f) for f in line.rstrip("\r").split(",")]
                    out.append(str(sum(v for v in values if v is not None)))
                self.answer(200, ("\n".join(out) + "\n").encode(), "text/csv")
            else:
                log("request records=1 bytes=%d inflight=%d" % (len(body), inflight))
                self.answer(200, b"%d\n" % len(body), "text/plain")
        finally:
            with LOCK:
                STATE["inflight"] -= 1


def main():
    if len(sys.argv) < 2 or sys.argv[1] != "serve":
        sys.exit("usage: transform_app.py serve")
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    log("transform_app env: " + json.dumps({k: v for k, v in sorted(os.environ.items())
                                             if k.startswith("SAGEMAKER_")}))
    port = int(os.environ.get("SAGEMAKER_BIND_TO_PORT", "8080"))
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
