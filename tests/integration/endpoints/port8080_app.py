#!/usr/bin/python3
"""A serving container that listens ONLY on 0.0.0.0:8080, whatever SAGEMAKER_BIND_TO_PORT says:
the port serving-contract.md §2 names for single-container models. Kiln runs it as
`<this file> serve` (image `local:<this file>`). With per-instance networks (issue 14) every
instance has its own namespace and address, so two of them serve side by side on 8080; in host
mode the second one cannot bind (that is the point of the test using it).

GET /ping answers 200. POST /invocations with a JSON object body answers a JSON object:
  always      {"instance": $HOSTNAME or the host name, "address": the instance's address (its
               hostname resolved through /etc/hosts), "bind_to_port": $SAGEMAKER_BIND_TO_PORT,
               "safe_port_range": $SAGEMAKER_SAFE_PORT_RANGE}
  {"connect": [host, port]}   also "connect": "ok" or "fail <error>" (TCP connect, 1 s timeout)
  {"kiln": true}              also "kiln": "<HTTP status>" or "fail <error>" for
                              GET $AWS_ENDPOINT_URL/_kiln/health (1 s timeout)
Standard library only.
"""
import json
import os
import signal
import socket
import sys
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = 8080


def log(message):
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def hostname():
    return os.environ.get("HOSTNAME") or socket.gethostname()


def try_connect(host, port):
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return "ok"
    except OSError as e:
        return "fail %s" % e


def try_kiln():
    url = (os.environ.get("AWS_ENDPOINT_URL") or "").rstrip("/") + "/_kiln/health"
    try:
        with urllib.request.urlopen(url, timeout=1.0) as r:
            return str(r.status)
    except Exception as e:  # noqa: BLE001 (any failure is the answer)
        return "fail %s" % e


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/ping":
            self.answer(200, {})
        else:
            self.answer(404, {"error": "no such path"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path != "/invocations":
            self.answer(404, {"error": "no such path"})
            return
        try:
            request = json.loads(raw or b"{}")
        except ValueError:
            request = {}
        try:
            address = socket.gethostbyname(hostname())
        except OSError as e:
            address = "unknown (%s)" % e
        out = {"instance": hostname(), "address": address,
               "bind_to_port": os.environ.get("SAGEMAKER_BIND_TO_PORT"),
               "safe_port_range": os.environ.get("SAGEMAKER_SAFE_PORT_RANGE")}
        if isinstance(request, dict):
            if isinstance(request.get("connect"), list) and len(request["connect"]) == 2:
                out["connect"] = try_connect(*request["connect"])
            if request.get("kiln"):
                out["kiln"] = try_kiln()
        self.answer(200, out)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    if len(sys.argv) > 1 and sys.argv[1] != "serve":
        sys.stderr.write("usage: %s serve\n" % sys.argv[0])
        return 2
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))
    server = Server(("0.0.0.0", PORT), Handler)
    log("port8080_app ready on port %d (SAGEMAKER_BIND_TO_PORT=%s)" % (PORT, os.environ.get("SAGEMAKER_BIND_TO_PORT")))
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
