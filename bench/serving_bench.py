#!/usr/bin/python3
"""Real-time serving overhead: the same minimal backend reached three ways, driven by wrk.

  /usr/bin/python3 bench/serving_bench.py [--duration 10] [--connections 1,16,64,256]
                                          [--backend-threads N] [--nginx-workers auto]
                                          [--skip-nginx] [--skip-kiln] [--no-auth-pass]
                                          [--json results.json]

Paths (rows):
  direct      wrk -> backend
  nginx       wrk -> nginx (Debian's nginx-light, upstream keepalive 64, HTTP/1.1, no access log)
              -> backend: the reference reverse proxy
  kiln        wrk -> `kiln server` POST /endpoints/<name>/invocations (SigV4-signed) -> backend
              running as the endpoint's one instance (image `local:<serving_backend>`)
  kiln-noauth the same with the server's "auth": "off" (a second server): the cost of SigV4

The backend is bench/serving_backend.cc (`serving_backend serve`, port $SAGEMAKER_BIND_TO_PORT):
an epoll HTTP/1.1 keep-alive server answering POST /invocations with a fixed 11-byte body. It is
taken from $SERVING_BACKEND, <build>/bench/serving_backend (-DKILN_BUILD_BENCH=ON), or compiled
here with one c++ call into ~/.cache/kiln-bench (not /tmp: the endpoint sandbox has a private
/tmp).

wrk cannot sign each request, so one request is signed with botocore's SigV4Auth and its headers
are replayed by a generated Lua script (the signature stays valid for 15 minutes; Kiln does not
reject replays). Each path is measured at every --connections value (wrk threads: 1 for one
connection, 2 otherwise) for --duration seconds after a 1 s warm-up.

Columns: requests/s; p50 and p99 latency (wrk's histogram, microsecond resolution); proxy CPU
per request (utime+stime from /proc/<pid>/stat of the proxy's processes - nginx master and
workers, or the kiln server - before and after, divided by the requests; 10 ms tick resolution,
fine over many requests); backend CPU per request, same way; errors (socket errors + non-2xx).
Ratios per connection count: Kiln / nginx requests/s, added p50 latency (path p50 - direct p50)
of Kiln over nginx's, and proxy CPU per request of Kiln over nginx's.

$KILN_BIN selects the kiln binary (default build/src/cli/kiln), as for the other benchmarks.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))

BODY = b'{"instances": [[1.0, 2.0, 3.0, 4.0]]}'
CLK_TCK = os.sysconf("SC_CLK_TCK")
ROLE = "arn:aws:iam::000000000000:role/bench"

# Prints one machine-readable line at the end of a wrk run (latencies in microseconds).
LUA_DONE = r'''
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRKJSON {\"requests\":%d,\"duration_us\":%d,\"p50_us\":%d,\"p99_us\":%d," ..
    "\"socket_errors\":%d,\"non2xx\":%d}\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc=None, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("process exited with %s before listening on %d" % (proc.returncode, port))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("nothing listening on port %d after %.0fs" % (port, timeout))


def lua_string(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def write_lua(path, headers, body=BODY):
    lines = ['wrk.method = "POST"', "wrk.body = " + lua_string(body.decode())]
    for k, v in headers.items():
        lines.append("wrk.headers[%s] = %s" % (lua_string(k), lua_string(v)))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n" + LUA_DONE)


# ---- CPU accounting ----

def proc_stat(pid):
    """(ppid, utime+stime ticks) or None when the process is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[11]) + int(fields[12])


def all_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def pids_running(exe_path):
    """Processes whose argv[0] is exe_path (the backend, also inside Kiln's sandbox)."""
    out = []
    for pid in all_pids():
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                argv0 = f.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if argv0 == exe_path:
            out.append(pid)
    return out


def process_tree(root):
    """root and its descendants."""
    children = {}
    for pid in all_pids():
        st = proc_stat(pid)
        if st:
            children.setdefault(st[0], []).append(pid)
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_ticks(pids):
    total = 0
    for pid in pids:
        st = proc_stat(pid)
        if st:
            total += st[1]
    return total


# ---- wrk ----

def run_wrk(url, lua, connections, duration, proxy_pids, backend_pids):
    threads = 1 if connections == 1 else 2
    base = ["wrk", "-t%d" % threads, "-c%d" % connections, "-s", lua, url]
    subprocess.run(base[:1] + ["-d1s"] + base[1:], capture_output=True, check=True)  # warm-up
    p0, b0 = cpu_ticks(proxy_pids), cpu_ticks(backend_pids)
    out = subprocess.run(base[:1] + ["-d%ds" % duration] + base[1:], capture_output=True, text=True, check=True).stdout
    p1, b1 = cpu_ticks(proxy_pids), cpu_ticks(backend_pids)
    line = [l for l in out.splitlines() if l.startswith("WRKJSON ")]
    if not line:
        raise RuntimeError("wrk printed no summary:\n" + out)
    r = json.loads(line[0][len("WRKJSON "):])
    n = max(r["requests"], 1)
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    r["proxy_cpu_us"] = (p1 - p0) * 1e6 / CLK_TCK / n if proxy_pids else None
    r["backend_cpu_us"] = (b1 - b0) * 1e6 / CLK_TCK / n
    r["connections"] = connections
    return r


# ---- backend ----

def backend_binary():
    env = os.environ.get("SERVING_BACKEND")
    if env:
        return os.path.abspath(env)
    src = os.path.join(HERE, "serving_backend.cc")
    build = os.environ.get("KILN_BUILD_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(os.environ.get("KILN_BIN", os.path.join(REPO, "build", "src", "cli", "kiln"))))))
    built = os.path.join(build, "bench", "serving_backend")
    if os.access(built, os.X_OK) and os.path.getmtime(built) >= os.path.getmtime(src):
        return built
    cache = os.path.join(os.path.expanduser("~"), ".cache", "kiln-bench")
    os.makedirs(cache, exist_ok=True)
    out = os.path.join(cache, "serving_backend")
    if not os.access(out, os.X_OK) or os.path.getmtime(out) < os.path.getmtime(src):
        cxx = os.environ.get("CXX", "c++")
        subprocess.run([cxx, "-O2", "-std=c++20", "-pthread", "-o", out + ".tmp", src], check=True)
        os.replace(out + ".tmp", out)
    return out


def start_backend(exe, port, threads, log_path):
    env = dict(os.environ, SAGEMAKER_BIND_TO_PORT=str(port), BACKEND_THREADS=str(threads))
    log = open(log_path, "wb")
    proc = subprocess.Popen([exe, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    wait_port(port, proc)
    return proc


def stop(proc):
    if proc and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- nginx ----

NGINX_CONF = """
worker_processes {workers};
daemon off;
master_process on;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/client_body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  upstream backend {{
    server 127.0.0.1:{backend_port};
    keepalive 64;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
"""


def start_nginx(work, backend_port, workers):
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    d = os.path.join(work, "nginx")
    os.makedirs(d, exist_ok=True)
    port = free_port()
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(workers=workers, dir=d, backend_port=backend_port, port=port))
    log = open(os.path.join(d, "stdout.log"), "wb")
    proc = subprocess.Popen([exe, "-e", os.path.join(d, "error.log"), "-p", d, "-c", conf],
                            stdout=log, stderr=subprocess.STDOUT)
    log.close()
    wait_port(port, proc)
    return proc, port


# ---- Kiln ----

def signed_headers(server, path):
    """One SigV4-signed POST (botocore) as a header dict for wrk."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    url = server.endpoint + path
    host = url.split("://", 1)[1].split("/", 1)[0]
    req = AWSRequest(method="POST", url=url, data=BODY,
                     headers={"Content-Type": "application/json", "Accept": "application/json"})
    SigV4Auth(Credentials(server.access_key, server.secret_key), "sagemaker", "us-east-1").add_auth(req)
    headers = {k: v for k, v in req.headers.items()}
    headers["Host"] = host
    return headers


def wait_in_service(sm, name, timeout):
    """Waits until endpoint `name` is InService; RuntimeError when it fails or the time runs out."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        d = sm.describe_endpoint(EndpointName=name)
        if d["EndpointStatus"] == "InService":
            return
        if d["EndpointStatus"] == "Failed":
            raise RuntimeError("endpoint Failed: %s" % d.get("FailureReason"))
        time.sleep(0.5)
    raise RuntimeError("endpoint not InService after %.0fs" % timeout)


def start_endpoint(server, backend, backend_threads, name, timeout):
    sm = server.client("sagemaker")
    sm.create_model(ModelName=name, ExecutionRoleArn=ROLE,
                    PrimaryContainer={"Image": "local:" + backend,
                                      "Environment": {"BACKEND_THREADS": str(backend_threads)}})
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": name, "InstanceType": "ml.m5.large",
        "InitialInstanceCount": 1}])
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    wait_in_service(sm, name, timeout)


def measure_kiln(args, work, backend, auth):
    import kiln_harness as kh
    label = "kiln" if auth else "kiln-noauth"
    # wrk's connections all come from 127.0.0.1: the connection limits must admit the largest
    # --connections value (plus the probes), whatever the server's defaults are.
    room = max(args.connections) + 64
    config = {"scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
              "http": {"max_connections": max(room, 16384), "max_connections_per_address": max(room, 4096)}}
    if not auth:
        config["auth"] = "off"
    os.makedirs(os.path.join(work, label), exist_ok=True)
    server = kh.KilnServer(os.path.join(work, label, "data"), config=config,
                           log_path=os.path.join(work, label, "server.log"), log_level="info")
    server.start()
    rows = []
    try:
        name = "bench-" + label
        start_endpoint(server, backend, args.backend_threads, name, args.endpoint_timeout)
        path = "/endpoints/%s/invocations" % name
        headers = signed_headers(server, path) if auth else {"Content-Type": "application/json",
                                                             "Accept": "application/json"}
        lua = os.path.join(work, label + ".lua")
        write_lua(lua, headers)
        # Sanity: one request through the same headers must succeed.
        probe = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
                                "--data-binary", BODY.decode()] +
                               sum([["-H", "%s: %s" % (k, v)] for k, v in headers.items()], []) +
                               [server.endpoint + path], capture_output=True, text=True)
        if probe.stdout != "200":
            raise RuntimeError("a signed invocation answered %s; server log:\n%s" % (probe.stdout, server.log_tail()))
        bpids = pids_running(backend)
        for c in args.connections:
            r = run_wrk(server.endpoint + path, lua, c, args.duration, [server.proc.pid], bpids)
            r["path"] = label
            rows.append(r)
        try:
            server.client("sagemaker").delete_endpoint(EndpointName=name)
        except Exception:  # noqa: BLE001 (best effort before stopping the server)
            pass
    finally:
        server.stop()
    return rows


# ---- report ----

def fmt_us(v):
    return "-" if v is None else ("%.0f" % v if v >= 100 else "%.1f" % v)


def print_table(rows, duration):
    print("cpus: %d   %d s per row   (latency in ms; CPU in microseconds per request)" % (os.cpu_count(), duration))
    print("%-12s %5s %10s %9s %9s %11s %13s %7s" % ("path", "conns", "req/s", "p50 ms", "p99 ms",
                                                   "proxy CPU", "backend CPU", "errors"))
    for r in rows:
        print("%-12s %5d %10.0f %9.3f %9.3f %11s %13s %7d" % (
            r["path"], r["connections"], r["rps"], r["p50_us"] / 1000, r["p99_us"] / 1000,
            fmt_us(r["proxy_cpu_us"]), fmt_us(r["backend_cpu_us"]), r["socket_errors"] + r["non2xx"]))


def print_ratios(rows, connections):
    by = {(r["path"], r["connections"]): r for r in rows}
    lines = []
    for c in connections:
        direct, nginx = by.get(("direct", c)), by.get(("nginx", c))
        if not direct or not nginx:
            continue
        nginx_added = nginx["p50_us"] - direct["p50_us"]
        lines.append("c=%d: nginx adds %.0f us at p50 (%.0f%% of direct's req/s)" % (
            c, nginx_added, 100.0 * nginx["rps"] / direct["rps"]))
        for k in ("kiln", "kiln-noauth"):
            kr = by.get((k, c))
            if not kr:
                continue
            added = kr["p50_us"] - direct["p50_us"]
            lines.append("c=%d: %-11s req/s %.2fx nginx; adds %.0f us at p50 = %.2fx nginx's added latency; "
                         "proxy CPU/request %.2fx nginx" % (
                             c, k, kr["rps"] / nginx["rps"], added,
                             added / nginx_added if nginx_added > 0 else float("nan"),
                             kr["proxy_cpu_us"] / nginx["proxy_cpu_us"] if nginx["proxy_cpu_us"] else float("nan")))
    if lines:
        print()
        print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=int, default=10, help="seconds per measurement (default 10)")
    ap.add_argument("--connections", default="1,16,64,256", help="comma-separated wrk connection counts "
                    "(default 1,16,64,256)")
    ap.add_argument("--backend-threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--nginx-workers", default="auto")
    ap.add_argument("--skip-nginx", action="store_true")
    ap.add_argument("--skip-kiln", action="store_true")
    ap.add_argument("--no-auth-pass", action="store_true", help="skip the second Kiln pass with auth off")
    ap.add_argument("--endpoint-timeout", type=float, default=300)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    args.connections = [int(x) for x in args.connections.split(",") if x]
    if not shutil.which("wrk"):
        sys.exit("wrk not found (apt-get install wrk)")

    backend = backend_binary()
    work = tempfile.mkdtemp(prefix="kiln-serving-bench-", dir=args.dir)
    rows, notes = [], []
    bport = free_port()
    bproc = start_backend(backend, bport, args.backend_threads, os.path.join(work, "backend.log"))
    try:
        lua = os.path.join(work, "plain.lua")
        write_lua(lua, {"Content-Type": "application/json", "Accept": "application/json"})
        for c in args.connections:
            r = run_wrk("http://127.0.0.1:%d/invocations" % bport, lua, c, args.duration, [], [bproc.pid])
            r["path"] = "direct"
            rows.append(r)
        if not args.skip_nginx:
            nproc, nport = start_nginx(work, bport, args.nginx_workers)
            try:
                npids = process_tree(nproc.pid)
                for c in args.connections:
                    r = run_wrk("http://127.0.0.1:%d/invocations" % nport, lua, c, args.duration, npids, [bproc.pid])
                    r["path"] = "nginx"
                    rows.append(r)
            finally:
                stop(nproc)
    finally:
        stop(bproc)
    if not args.skip_kiln:
        for auth in ([True] if args.no_auth_pass else [True, False]):
            try:
                rows.extend(measure_kiln(args, work, backend, auth))
            except Exception as e:  # noqa: BLE001 (report the other rows anyway)
                notes.append("%s: not measured: %s" % ("kiln" if auth else "kiln-noauth", e))
    print_table(rows, args.duration)
    print_ratios(rows, args.connections)
    for n in notes:
        print(n)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "notes": notes, "cpus": os.cpu_count(), "duration": args.duration}, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
