#!/usr/bin/python3
"""A serving program for the multi-container tests (test_multi_container.py; serving-contract.md §2, §8).

Kiln runs it as `<this file> serve` (image `local:<this file>`). Standard library only. It listens on
0.0.0.0:$SAGEMAKER_BIND_TO_PORT (8080 when unset) and prints one start line with its port, safe port range
and host name, then one line per request. What it does is chosen by the environment variable ROLE:

  pre    a preprocessing container: a CSV body "1,2,3" → 200 application/json
         {"features": [1, 2, 3], "pre": {"host", "port", "content_type", "accept", "custom_attributes"}}
         (what it saw); a body line "fail-pre" → 500 "preprocessing failed".
  model  the model: a JSON body {"features": [...], "pre": {...}} → the sum times the scale in
         /opt/ml/model/scale.txt (its own model data; 1 when absent); answers text/csv "<value>"
         unless the request's Accept is application/json, then
         {"value", "pre", "model": {"host", "port", "content_type", "accept", "custom_attributes"}};
         features containing 13 → 500 "model failed on 13" (a failing pipeline container).
  echo   a Direct container: any body → 200 application/json {"container": $CONTAINER_TAG, "host",
         "port", "scale" (as model), "boot" (random per process start), "echo": body as text}.

Every answer echoes X-Amzn-SageMaker-Custom-Attributes back with ";<ROLE>" appended. GET /ping: 200.
The start line also lists SAGEMAKER_SAFE_PORT_RANGE and whether the port range's second port can be
bound (the range is the container's own: no other container of the instance uses it).
"""
import json
import os
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROLE = os.environ.get("ROLE", "echo")
BOOT = os.urandom(8).hex()
PORT = int(os.environ.get("SAGEMAKER_BIND_TO_PORT", "8080"))
LOCK = threading.Lock()


def log(line):
    with LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def scale():
    try:
        with open("/opt/ml/model/scale.txt") as f:
            return float(f.read().strip())
    except OSError:
        return 1.0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):  # noqa: N802 (stdlib name)
        log("pipeline_app %s %s" % (ROLE, fmt % args))

    def answer(self, status, body, content_type):
        if isinstance(body, str):
            body = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        attrs = self.headers.get("X-Amzn-SageMaker-Custom-Attributes")
        if attrs is not None:
            self.send_header("X-Amzn-SageMaker-Custom-Attributes", attrs + ";" + ROLE)
        self.end_headers()
        self.wfile.write(body)

    def seen(self):
        return {"host": socket.gethostname(), "port": PORT, "content_type": self.headers.get("Content-Type"),
                "accept": self.headers.get("Accept"),
                "custom_attributes": self.headers.get("X-Amzn-SageMaker-Custom-Attributes")}

    def do_GET(self):  # noqa: N802
        self.answer(200 if self.path == "/ping" else 404, b"", "text/plain")

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/invocations":
            self.answer(404, "not found", "text/plain")
        elif ROLE == "pre":
            text = body.decode(errors="replace").strip()
            if text == "fail-pre":
                self.answer(500, "preprocessing failed", "text/plain")
                return
            features = [float(x) for x in text.split(",") if x.strip()]
            self.answer(200, json.dumps({"features": features, "pre": self.seen()}), "application/json")
        elif ROLE == "model":
            doc = json.loads(body)
            features = doc["features"]
            if 13 in features:
                self.answer(500, "model failed on 13", "text/plain")
                return
            value = sum(features) * scale()
            if self.headers.get("Accept") == "application/json":
                self.answer(200, json.dumps({"value": value, "pre": doc.get("pre"), "model": self.seen()}),
                            "application/json")
            else:
                self.answer(200, "%g" % value, "text/csv")
        else:
            self.answer(200, json.dumps({"container": os.environ.get("CONTAINER_TAG"), "host": socket.gethostname(),
                                         "port": PORT, "scale": scale(), "boot": BOOT,
                                         "echo": body.decode(errors="replace")}),
                        "application/json")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    if len(sys.argv) < 2 or sys.argv[1] != "serve":
        sys.exit("usage: pipeline_app.py serve")
    server = Server(("0.0.0.0", PORT), Handler)
    safe = os.environ.get("SAGEMAKER_SAFE_PORT_RANGE", "")
    aux = "none"
    if safe:
        # The first port of its safe range is its own to bind (a management port, say).
        s = socket.socket()
        try:
            s.bind(("0.0.0.0", int(safe.split("-")[0])))
            aux = "bound"
        except OSError as e:
            aux = "refused (%s)" % e
        finally:
            s.close()
    log("pipeline_app %s ready on port %d safe %s aux %s host %s" % (ROLE, PORT, safe, aux, socket.gethostname()))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    import signal
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    main()
