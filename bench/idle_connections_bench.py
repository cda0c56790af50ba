#!/usr/bin/python3
"""What an idle keep-alive connection costs: memory, descriptors, threads, CPU, and the latency
of the requests served while many are open.

  /usr/bin/python3 bench/idle_connections_bench.py [--connections 10000] [--silent 0]
                                                   [--requests 500] [--nginx] [--json results.json]

For each server (kiln; with --nginx also Debian's nginx answering `return 200` from its workers,
for reference): start it with limits that admit the connections, warm it up, then

  1. before: RSS, open descriptors, threads (/proc/<pid>/status, summed over nginx's master and
     workers), and the latency of --requests GET /_kiln/health (nginx: GET /) on one keep-alive
     connection and of --requests/10 on fresh connections;
  2. open --connections connections from 127.0.0.1, each after one answered request (so each is
     a keep-alive connection between requests, not a half-open one), plus --silent connections
     that never send a byte;
  3. after: the same figures with all of them open, the server's CPU time over 2 s of doing
     nothing else, and a check that every idle connection is still open (the server evicted or
     timed out none);
  4. close them all.

Columns: RSS before/after (MiB) and the difference divided by the connections (bytes per idle
connection; user-space memory only: kernel socket buffers are not in RSS); descriptors and
threads before/after; CPU ms over the 2 idle seconds; p50/p99 latency (ms) of keep-alive and of
new-connection requests before and during.

The server's own connection limits are raised to --connections + --silent + 1024, and its first
byte and idle timeouts to 600 s. The benchmark raises its own RLIMIT_NOFILE soft limit (up to the
hard limit; it stops with a message when the hard limit is too low); the kiln server inherits it.
$KILN_BIN selects the kiln binary (default build/src/cli/kiln), as for the other benchmarks.
"""

import argparse
import json
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
sys.path.insert(0, HERE)

from serving_bench import free_port, process_tree, stop, wait_port  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024


# ---- process figures ----

def status_fields(pid):
    out = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                name, _, value = line.partition(":")
                out[name] = value.split()
    except OSError:
        pass
    return out


def figures(pids):
    """RSS bytes, open descriptors, threads and CPU ticks summed over `pids`."""
    rss = fds = threads = ticks = 0
    for pid in pids:
        st = status_fields(pid)
        if not st:
            continue
        rss += int(st["VmRSS"][0]) * 1024
        threads += int(st["Threads"][0])
        try:
            fds += len(os.listdir("/proc/%d/fd" % pid))
            with open("/proc/%d/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return {"rss": rss, "fds": fds, "threads": threads, "ticks": ticks}


# ---- HTTP on raw sockets ----

def read_response(s):
    """One response with a Content-Length body; returns the status."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed before a response: %r" % data[:200])
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed inside a response body")
        body += chunk
    return int(head.split(b" ", 2)[1])


def connect(port):
    return socket.create_connection(("127.0.0.1", port), timeout=60)


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100.0 * (len(values) - 1))))]


def latencies(port, request, keepalive_n, fresh_n):
    """p50/p99 in ms of `keepalive_n` requests on one connection and `fresh_n` on new ones."""
    kept = []
    s = connect(port)
    try:
        for _ in range(keepalive_n):
            t = time.perf_counter()
            s.sendall(request)
            assert read_response(s) == 200
            kept.append((time.perf_counter() - t) * 1000)
    finally:
        s.close()
    fresh = []
    for _ in range(fresh_n):
        t = time.perf_counter()
        s = connect(port)
        try:
            s.sendall(request)
            assert read_response(s) == 200
        finally:
            s.close()
        fresh.append((time.perf_counter() - t) * 1000)
    return {"keepalive_p50_ms": percentile(kept, 50), "keepalive_p99_ms": percentile(kept, 99),
            "fresh_p50_ms": percentile(fresh, 50), "fresh_p99_ms": percentile(fresh, 99)}


def open_idle(port, request, count, silent, batch=500):
    socks = []
    for start in range(0, count, batch):
        group = []
        for _ in range(min(batch, count - start)):
            s = connect(port)
            s.sendall(request)
            group.append(s)
        for s in group:
            if read_response(s) != 200:
                raise RuntimeError("a request on an idle-to-be connection failed")
        socks.extend(group)
    for _ in range(silent):
        socks.append(connect(port))
    return socks


def still_open(socks):
    n = 0
    for s in socks:
        s.setblocking(False)
        try:
            if s.recv(1, socket.MSG_PEEK) != b"":
                n += 1  # bytes waiting: an unexpected answer, but the connection is open
        except BlockingIOError:
            n += 1
        except OSError:
            pass
    return n


def measure(label, port, pids_of, request, args):
    latencies(port, request, 200, 20)  # warm-up: threads, allocator arenas, caches
    before = figures(pids_of())
    lat_before = latencies(port, request, args.requests, max(1, args.requests // 10))
    socks = []
    try:
        t = time.monotonic()
        socks = open_idle(port, request, args.connections, args.silent)
        open_s = time.monotonic() - t
        time.sleep(1)
        after = figures(pids_of())
        time.sleep(2)
        idle_ticks = figures(pids_of())["ticks"] - after["ticks"]
        lat_during = latencies(port, request, args.requests, max(1, args.requests // 10))
        alive = still_open(socks)
    finally:
        for s in socks:
            # A reset, not a FIN: no client port left in TIME_WAIT for the next run or server.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
    n = args.connections + args.silent
    return {"server": label, "connections": n, "open_seconds": open_s, "still_open": alive,
            "rss_before": before["rss"], "rss_after": after["rss"],
            "bytes_per_connection": (after["rss"] - before["rss"]) / n if n else 0.0,
            "fds_before": before["fds"], "fds_after": after["fds"],
            "threads_before": before["threads"], "threads_after": after["threads"],
            "idle_cpu_ms": idle_ticks * 1000.0 / CLK_TCK, "before": lat_before, "during": lat_during}


# ---- servers ----

def measure_kiln(args, work):
    import kiln_harness as kh
    room = args.connections + args.silent + 1024
    config = {"http": {"max_connections": room, "max_connections_per_address": room,
                       "first_byte_timeout_seconds": 600, "idle_timeout_seconds": 600}}
    server = kh.KilnServer(os.path.join(work, "kiln", "data"), config=config,
                           log_path=os.path.join(work, "kiln", "server.log"), log_level="info")
    server.start()
    try:
        request = b"GET /_kiln/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        return measure("kiln", server.port, lambda: [server.proc.pid], request, args)
    finally:
        rc = server.stop()
        if rc != 0:
            print("kiln exited %s on SIGTERM" % rc, file=sys.stderr)


NGINX_CONF = """
worker_processes {workers};
worker_rlimit_nofile {nofile};
daemon off;
master_process on;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections {worker_connections}; }}
http {{
  access_log off;
  keepalive_timeout 600s;
  keepalive_requests 1000000;
  client_body_temp_path {dir}/client_body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{ return 200 "ok"; }}
  }}
}}
"""


def measure_nginx(args, work):
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    d = os.path.join(work, "nginx")
    os.makedirs(d, exist_ok=True)
    port = free_port()
    room = args.connections + args.silent + 1024
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        # Every connection may land on one worker: each worker must admit them all.
        f.write(NGINX_CONF.format(workers=args.nginx_workers, dir=d, port=port, nofile=room,
                                  worker_connections=room))
    log = open(os.path.join(d, "stdout.log"), "wb")
    proc = subprocess.Popen([exe, "-e", os.path.join(d, "error.log"), "-p", d, "-c", conf],
                            stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        wait_port(port, proc)
        request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        return measure("nginx", port, lambda: process_tree(proc.pid), request, args)
    finally:
        stop(proc)


# ---- report ----

def print_table(rows):
    print("%-6s %6s %8s %8s %10s %13s %11s %8s %19s %19s %19s %19s %7s" % (
        "server", "conns", "RSS MiB", "after", "bytes/conn", "fds", "threads", "idle CPU",
        "keep-alive p50 ms", "keep-alive p99 ms", "new-conn p50 ms", "new-conn p99 ms", "open"))
    for r in rows:
        b, d = r["before"], r["during"]
        print("%-6s %6d %8.1f %8.1f %10.0f %13s %11s %6.0fms %19s %19s %19s %19s %7d" % (
            r["server"], r["connections"], r["rss_before"] / MIB, r["rss_after"] / MIB, r["bytes_per_connection"],
            "%d->%d" % (r["fds_before"], r["fds_after"]), "%d->%d" % (r["threads_before"], r["threads_after"]),
            r["idle_cpu_ms"],
            "%.3f -> %.3f" % (b["keepalive_p50_ms"], d["keepalive_p50_ms"]),
            "%.3f -> %.3f" % (b["keepalive_p99_ms"], d["keepalive_p99_ms"]),
            "%.3f -> %.3f" % (b["fresh_p50_ms"], d["fresh_p50_ms"]),
            "%.3f -> %.3f" % (b["fresh_p99_ms"], d["fresh_p99_ms"]), r["still_open"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connections", type=int, default=10000,
                    help="idle keep-alive connections, each after one request (default 10000)")
    ap.add_argument("--silent", type=int, default=0, help="more connections that never send a byte")
    ap.add_argument("--requests", type=int, default=500,
                    help="keep-alive requests timed before and during (a tenth as many on new connections)")
    ap.add_argument("--nginx", action="store_true", help="also measure nginx (return 200) for reference")
    ap.add_argument("--nginx-workers", default="auto")
    ap.add_argument("--skip-kiln", action="store_true")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()

    need = args.connections + args.silent + 2048
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            sys.exit("RLIMIT_NOFILE hard limit %d is below the %d descriptors needed; lower --connections" % (hard, need))
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))

    work = tempfile.mkdtemp(prefix="kiln-idle-bench-", dir=args.dir)
    rows = []
    try:
        if not args.skip_kiln:
            rows.append(measure_kiln(args, work))
        if args.nginx:
            rows.append(measure_nginx(args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("cpus: %d   %d idle connections (+%d silent)" % (os.cpu_count(), args.connections, args.silent))
    print_table(rows)
    for r in rows:
        if r["still_open"] != r["connections"]:
            print("%s: %d of %d idle connections were closed by the server" % (
                r["server"], r["connections"] - r["still_open"], r["connections"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "cpus": os.cpu_count()}, f, indent=1)


if __name__ == "__main__":
    main()
