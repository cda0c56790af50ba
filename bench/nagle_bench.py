#!/usr/bin/python3
"""The delayed-ACK stall of a naive container, and what TCP_QUICKACK does about it.

  /usr/bin/python3 bench/nagle_bench.py [--requests 200] [--body-bytes 100] [--runs 3]

A serving container built on Python's http.server (BaseHTTPRequestHandler; Flask's development
server is the same) answers POST /invocations and GET /ping with Nagle's algorithm on (its
default: no TCP_NODELAY), writing the head and the body in two send() calls. The second segment is
small and the first is not yet acknowledged, so Nagle holds it until the client's ACK; the client
is in Linux's request/response ("pingpong") mode and delays that ACK by up to 40 ms. Each request
then costs ~40 ms however fast the handler is.

This measures N sequential keep-alive POSTs (then N GET /ping) over one connection straight to that
server with a raw-socket client, two ways:
  plain     recv until the response is complete, nothing else
  quickack  setsockopt(IPPROTO_TCP, TCP_QUICKACK, 1) after each recv that leaves the response
            incomplete (Linux clears the flag again by itself, so it is re-armed every time; it also
            sends the ACK being delayed), as net/http_response_reader.cc does before each wait
Rows give mean, p50 and p99 per request in ms and the ratio plain/quickack.

With --kiln, a third row: the same server as an endpoint's container (image `local:` this file,
which serves as the container when run as `nagle_bench.py serve` on $SAGEMAKER_BIND_TO_PORT),
reached through a `kiln server` with auth off: POST /endpoints/<name>/invocations, so the router's
upstream client is the one that must not stall (its TCP_QUICKACK, net/async_http_client.cc).
$KILN_BIN selects the binary (default build/src/cli/kiln).

Loopback only; the direct server runs in a thread of this process (ThreadingHTTPServer, HTTP/1.1).
"""

import argparse
import http.server
import os
import socket
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", 12)  # Linux


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a serving container's framework would
    body = b"x" * 100

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        if self.path != "/invocations":
            self.send_error(404)
            return
        self._answer()

    def do_GET(self):
        if self.path != "/ping" and not self.path.startswith("/ping?"):
            self.send_error(404)
            return
        self._answer()

    def _answer(self):
        # send_response/end_headers write the head in one send (wfile is unbuffered); the body
        # is the second send: the two-segment pattern.
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def read_response(sock, quickack):
    """Reads one Content-Length response; returns its body."""
    data = b""
    while True:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            head = data[:end].decode("latin-1").lower()
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip() == "content-length":
                    length = int(value)
            if len(data) >= end + 4 + length:
                return data[end + 4:end + 4 + length]
        if quickack and data:
            # Part of the response is here and we are about to wait for the rest.
            sock.setsockopt(socket.IPPROTO_TCP, TCP_QUICKACK, 1)
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        data += chunk


def serve_as_container():
    """`nagle_bench.py serve`: the endpoint's container (Nagle on, two sends per answer)."""
    port = int(os.environ.get("SAGEMAKER_BIND_TO_PORT", "8080"))
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def start_kiln_endpoint(work):
    """A kiln server (auth off) with this file as an endpoint's container; returns (server, path)."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "integration"))
    import kiln_harness as kh
    config = {"auth": "off", "scheduler": {"policy": "shrink", "allow_cpu_fallback": True}}
    server = kh.KilnServer(os.path.join(work, "data"), config=config, log_path=os.path.join(work, "server.log"))
    server.start()
    sm = server.client("sagemaker")
    name = "nagle"
    sm.create_model(ModelName=name, ExecutionRoleArn="arn:aws:iam::000000000000:role/bench",
                    PrimaryContainer={"Image": "local:" + os.path.abspath(__file__)})
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": name, "InstanceType": "ml.m5.large", "InitialInstanceCount": 1}])
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    deadline = time.time() + 120
    while sm.describe_endpoint(EndpointName=name)["EndpointStatus"] != "InService":
        if time.time() > deadline:
            raise RuntimeError("endpoint not InService; server log:\n" + server.log_tail())
        time.sleep(0.3)
    return server, "/endpoints/%s/invocations" % name


def run(port, method, path, body, requests, quickack):
    """Per-request latencies (seconds) of `requests` sequential requests on one connection."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
    if method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    request = head.encode() + b"\r\n" + (body if method == "POST" else b"")
    times = []
    try:
        for _ in range(requests):
            start = time.perf_counter()
            sock.sendall(request)
            got = read_response(sock, quickack)
            times.append(time.perf_counter() - start)
            assert len(got) == len(Handler.body), len(got)
    finally:
        sock.close()
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200, help="sequential requests per measurement")
    parser.add_argument("--body-bytes", type=int, default=100, help="response body size")
    parser.add_argument("--runs", type=int, default=3, help="alternating rounds of plain and quickack")
    parser.add_argument("--kiln", action="store_true", help="also measure the path through a kiln endpoint")
    args = parser.parse_args()
    Handler.body = b"x" * args.body_bytes

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    payload = b'{"instances": [[1.0, 2.0, 3.0]]}'
    try:
        run(port, "POST", "/invocations", payload, 5, True)  # warm-up
        print(f"Python http.server (Nagle on, head and body in two sends), {args.requests} sequential "
              f"requests x {args.runs} runs, {args.body_bytes} B responses")
        print(f"{'request':<20} {'client':<9} {'mean ms':>8} {'p50 ms':>8} {'p99 ms':>8}")
        for method, path in (("POST", "/invocations"), ("GET", "/ping")):
            results = {False: [], True: []}
            for _ in range(args.runs):
                for quickack in (False, True):
                    results[quickack] += run(port, method, path, payload, args.requests, quickack)
            means = {}
            for quickack in (False, True):
                t = sorted(results[quickack])
                means[quickack] = statistics.mean(t)
                p50 = t[len(t) // 2]
                p99 = t[min(len(t) - 1, int(len(t) * 0.99))]
                name = "quickack" if quickack else "plain"
                print(f"{method + ' ' + path:<20} {name:<9} {means[quickack] * 1e3:8.3f} {p50 * 1e3:8.3f} "
                      f"{p99 * 1e3:8.3f}")
            print(f"{'':<20} plain/quickack mean: {means[False] / means[True]:.1f}x")
        if args.kiln:
            with tempfile.TemporaryDirectory(prefix="nagle-bench-") as work:
                kiln, path = start_kiln_endpoint(work)
                try:
                    port = int(kiln.endpoint.rsplit(":", 1)[1])
                    run(port, "POST", path, payload, 5, False)  # warm-up
                    t = sorted(sum((run(port, "POST", path, payload, args.requests, False)
                                    for _ in range(args.runs)), []))
                    p50 = t[len(t) // 2]
                    p99 = t[min(len(t) - 1, int(len(t) * 0.99))]
                    print(f"{'POST via kiln':<20} {'plain':<9} {statistics.mean(t) * 1e3:8.3f} {p50 * 1e3:8.3f} "
                          f"{p99 * 1e3:8.3f}   (client -> kiln -> the same Nagle-on server)")
                finally:
                    # Endpoint instances outlive a server stop (they are adopted on restart):
                    # delete it first, or its container keeps running.
                    sm = kiln.client("sagemaker")
                    sm.delete_endpoint(EndpointName="nagle")
                    deadline = time.time() + 60
                    while time.time() < deadline:
                        try:
                            sm.describe_endpoint(EndpointName="nagle")
                        except Exception:  # noqa: BLE001 (gone: ValidationException)
                            break
                        time.sleep(0.3)
                    kiln.stop()
    finally:
        server.shutdown()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve_as_container()
    else:
        main()
