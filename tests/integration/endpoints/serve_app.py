#!/usr/bin/python3
"""A bring-your-own-container style serving program for the endpoint integration tests.

Kiln runs it as `<this file> serve` (image `local:<this file>`), exactly as `docker run IMAGE
serve`. Standard library only. It listens on 0.0.0.0:$SAGEMAKER_BIND_TO_PORT (default 8080),
HTTP/1.1 with keep-alive, and prints "serve_app ready on port N" once listening, then one line per
request. SIGTERM exits 0 at once.

Start-up:
  STARTUP_DELAY_SECONDS=S   sleep S seconds before listening (health-gate tests)
  /opt/ml/model/version.txt read once; reported as "version" ("none" when absent)
  SERVE_APP_MODEL_DIR       overrides /opt/ml/model (for running it outside a sandbox)

GET /ping: 200 with an empty body, or 500 while the file <model dir>/ping-fail exists, env
PING_FAIL=1, or a {"ping": "fail"} command was received (until {"ping": "ok"}).

POST /invocations: by default 200 application/json
  {"version", "variant_env" ($VARIANT_TAG or null), "instance" ($HOSTNAME, else the host name:
   Kiln gives each instance its own UTS namespace), "pid" (1 inside Kiln's PID namespace),
   "boot_id" (random per process start: tells instances and restarts apart), "echo_len" (request
   body length), "headers" {lower-cased name: value}}
A request body that is a JSON object may carry commands (applied in this order):
  {"sleep": S}              sleep S seconds first
  {"ping": "fail"|"ok"}     make later pings fail / pass again
  {"hang": true}            never answer (sleeps an hour)
  {"reset": true}           close the connection with a TCP RST (SO_LINGER 0), no answer
  {"garbage": true}         write "NOT HTTP\\r\\n\\r\\n" and close
  {"status": N, "message": T}  answer status N with text/plain body T
  {"size": N}               answer N bytes of application/octet-stream instead of the JSON
  {"stream": N, "interval": S}  answer chunked: N chunks "chunk i\\n", S seconds apart (default 0.1)
  {"content_type": T}       Content-Type of the default/size answer
  {"exit": CODE}            answer normally, then os._exit(CODE) (kills this instance)
Any other body (non-JSON, or JSON that is not an object) is only measured (echo_len).
X-Amzn-SageMaker-Custom-Attributes is echoed back on every /invocations answer.
"""
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL_DIR = os.environ.get("SERVE_APP_MODEL_DIR", "/opt/ml/model")
PID = os.getpid()
BOOT_ID = uuid.uuid4().hex
STATE = {"ping_fail": False, "version": "none"}
LOG_LOCK = threading.Lock()


def log(line):
    with LOG_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def read_version():
    try:
        with open(os.path.join(MODEL_DIR, "version.txt")) as f:
            return f.read().strip()
    except OSError:
        return "none"


def ping_ok():
    if STATE["ping_fail"] or os.environ.get("PING_FAIL") == "1":
        return False
    return not os.path.exists(os.path.join(MODEL_DIR, "ping-fail"))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "serve_app/1"

    def setup(self):
        super().setup()
        # http.server writes the head and the body separately: without TCP_NODELAY, Nagle holds
        # the body until the peer's delayed ACK (~40 ms a request).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):  # noqa: N802 (stdlib name)
        log("serve_app %s %s" % (self.address_string(), fmt % args))

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size_line = self.rfile.readline()
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def answer(self, status, body, content_type="application/json", extra=None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def do_GET(self):  # noqa: N802
        if self.path == "/ping":
            self.answer(200 if ping_ok() else 500, b"", "text/plain")
        else:
            self.answer(404, b"not found", "text/plain")

    def do_POST(self):  # noqa: N802
        body = self.read_body()
        if self.path != "/invocations":
            self.answer(404, b"not found", "text/plain")
            return
        cmd = {}
        if body[:1] == b"{":
            try:
                parsed = json.loads(body)
                if isinstance(parsed, dict):
                    cmd = parsed
            except ValueError:
                pass
        extra = {}
        attrs = self.headers.get("X-Amzn-SageMaker-Custom-Attributes")
        if attrs is not None:
            extra["X-Amzn-SageMaker-Custom-Attributes"] = attrs
        if cmd.get("sleep"):
            time.sleep(float(cmd["sleep"]))
        if cmd.get("ping") in ("fail", "ok"):
            STATE["ping_fail"] = cmd["ping"] == "fail"
        if cmd.get("hang"):
            log("serve_app hanging")
            time.sleep(3600)
            return
        if cmd.get("reset"):
            self.log_message("POST /invocations reset")
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # The buffered files hold references to the socket; drop them so close() is real.
            self.rfile.close()
            self.wfile.close()
            self.connection.close()
            self.close_connection = True
            return
        if cmd.get("garbage"):
            self.log_message("POST /invocations garbage")
            self.wfile.write(b"NOT HTTP\r\n\r\n")
            self.wfile.flush()
            self.close_connection = True
            return
        content_type = cmd.get("content_type")
        if "status" in cmd:
            self.answer(int(cmd["status"]), str(cmd.get("message", "")).encode(),
                        content_type or "text/plain", extra)
        elif "stream" in cmd:
            self.stream(int(cmd["stream"]), float(cmd.get("interval", 0.1)), content_type, extra)
        elif "size" in cmd:
            self.answer(200, b"x" * int(cmd["size"]), content_type or "application/octet-stream", extra)
        else:
            doc = {
                "version": STATE["version"],
                "variant_env": os.environ.get("VARIANT_TAG"),
                "instance": os.environ.get("HOSTNAME") or socket.gethostname() or str(PID),
                "pid": PID,
                "boot_id": BOOT_ID,
                "echo_len": len(body),
                "headers": {k.lower(): v for k, v in self.headers.items()},
            }
            self.answer(200, json.dumps(doc).encode(), content_type or "application/json", extra)
        if "exit" in cmd:
            log("serve_app exiting %s on request" % cmd["exit"])
            os._exit(int(cmd["exit"]))

    def stream(self, chunks, interval, content_type, extra):
        self.send_response(200)
        self.send_header("Content-Type", content_type or "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        for name, value in extra.items():
            self.send_header(name, value)
        self.end_headers()
        for i in range(chunks):
            data = ("chunk %d\n" % i).encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            if i + 1 < chunks:
                time.sleep(interval)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def on_sigterm(signum, frame):
    log("serve_app caught SIGTERM, exiting")
    os._exit(0)


def main():
    if len(sys.argv) > 1 and sys.argv[1] != "serve":
        sys.stderr.write("usage: %s serve\n" % sys.argv[0])
        return 2
    signal.signal(signal.SIGTERM, on_sigterm)
    delay = float(os.environ.get("STARTUP_DELAY_SECONDS") or 0)
    if delay > 0:
        log("serve_app sleeping %s s before listening" % delay)
        time.sleep(delay)
    STATE["version"] = read_version()
    port = int(os.environ.get("SAGEMAKER_BIND_TO_PORT") or 8080)
    server = Server(("0.0.0.0", port), Handler)
    log("serve_app ready on port %d (version %s, pid %d)" % (port, STATE["version"], PID))
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
