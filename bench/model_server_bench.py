#!/usr/bin/python3
"""Kiln's model server against gunicorn + Flask, TorchScript against Python, batching on against off.

  /usr/bin/python3 bench/model_server_bench.py [--workers 2] [--duration 10] [--extra-duration 4]
                                               [--connections 1,64] [--only gunicorn,handler,torch,batching]
                                               [--json results.json]

Sections (all on loopback, each server in a temp dir, driven by wrk with a Lua script that POSTs
one body; --latency; wrk threads: 1 for one connection, 2 otherwise; a --warmup run first):

  handler   the same trivial handler (bench/model_server/echo/inference.py: input_fn json.loads,
            predict_fn identity, output_fn json.dumps) served by
              kiln             `kiln-model-server serve`, SAGEMAKER_MODEL_SERVER_WORKERS=W
              gunicorn+nginx   SageMaker's bring-your-own layout (bench/model_server/byo: `serve`
                               starts nginx on the port proxying to gunicorn on a Unix socket,
                               gunicorn -k sync -w W wsgi:app, Flask app predictor.py)
              gunicorn         the same gunicorn bound to the TCP port itself, no nginx
            at every --connections value for --duration seconds. Ratios: Kiln/gunicorn requests/s
            and Kiln p99 / gunicorn p99, against the goal (>= 3x throughput, <= 0.5x p99).
  torch     a TorchScript Linear(16, 4) (model.pt, no inference.py; KILN_MODEL_SERVER_FRAMEWORK=
            pytorch) served by the Python workers' default handlers and by the native backend
            (KILN_MODEL_SERVER_BACKEND=torchscript), JSON and NPY bodies, --extra-duration seconds.
            The two paths' answers are compared.
  batching  bench/model_server/fixed_cost/inference.py (predict_fn costs 1 ms of CPU per call
            whatever the rows) at the largest --connections value, SAGEMAKER_TS_BATCH_SIZE=8 and
            SAGEMAKER_TS_MAX_BATCH_DELAY=5 against batching off.
  gunicorn  (--only gunicorn) the handler section without Kiln: checks the reference alone.

Columns: requests/s; p50, p99 (wrk's histogram); CPU per request of the serving side (utime+stime
of the server's process tree from /proc, before and after: kiln-model-server and its workers, or
serve + nginx + gunicorn and its workers); errors (socket errors + non-2xx). Each server is probed
with one request whose answer is checked before it is measured.

$KILN_MODEL_SERVER selects the binary (default <build>/src/modelserver/kiln-model-server, <build>
from $KILN_BIN as for the other benchmarks, else build/). Every process is started in its own
session and its process group is killed at the end, also on error or Ctrl-C.
"""

import argparse
import http.client
import io
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FILES = os.path.join(HERE, "model_server")
PYTHON = "/usr/bin/python3"
CLK_TCK = os.sysconf("SC_CLK_TCK")
LIVE = []  # every Server started; main() stops them all at the end, whatever happened

ECHO_BODY = b'{"instances": [[1.0, 2.0, 3.0, 4.0]], "id": "bench"}'
ROW16 = [round(0.1 * i - 0.7, 2) for i in range(16)]
JSON16 = json.dumps([ROW16]).encode()
GOAL_RPS, GOAL_P99 = 3.0, 0.5

# Prints one machine-readable line at the end of a wrk run (latencies in microseconds).
LUA_DONE = r'''
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRKJSON {\"requests\":%d,\"duration_us\":%d,\"p50_us\":%d,\"p99_us\":%d," ..
    "\"socket_errors\":%d,\"non2xx\":%d}\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
'''


# ---- processes ----

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_stat(pid):
    """(ppid, utime+stime ticks) or None when the process is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[11]) + int(fields[12])


def process_tree(root):
    """root and its descendants."""
    children = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            st = proc_stat(int(p))
            if st:
                children.setdefault(st[0], []).append(int(p))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_ticks(pids):
    return sum(st[1] for st in map(proc_stat, pids) if st)


class Server:
    """One server under test: a process started in its own session (so its process group holds
    everything it forks that does not leave it); stop() ends the group and any descendant that
    left it. Safe to call stop() more than once."""

    def __init__(self, label, argv, env, work, port):
        self.label, self.port, self.work = label, port, work
        os.makedirs(work, exist_ok=True)
        self.log_path = os.path.join(work, "server.log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=work)
        self.known = {self.proc.pid}
        LIVE.append(self)

    def log_tail(self, n=30):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def pids(self):
        tree = process_tree(self.proc.pid)
        self.known.update(tree)
        return tree

    def wait_ready(self, timeout):
        """Waits for GET /ping to answer 200; RuntimeError with the log when the server exits or
        the time runs out."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited with %s before it was ready:\n%s" % (
                    self.label, self.proc.returncode, self.log_tail()))
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/ping")
                if c.getresponse().status == 200:
                    c.close()
                    self.pids()
                    return
                c.close()
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("%s: /ping not 200 after %.0fs:\n%s" % (self.label, timeout, self.log_tail()))

    def stop(self):
        if self.proc.poll() is None:
            self.pids()
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except OSError:
                pass
            deadline = time.time() + wait
            while time.time() < deadline and self.proc.poll() is None:
                time.sleep(0.05)
            if self.proc.poll() is not None:
                break
        self.proc.poll()
        # Children that left the group (their own session) and outlived the server.
        for pid in self.known - {self.proc.pid}:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def kiln_binary():
    env = os.environ.get("KILN_MODEL_SERVER")
    if env:
        return os.path.abspath(env)
    build = os.environ.get("KILN_BUILD_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(os.environ.get("KILN_BIN", os.path.join(REPO, "build", "src", "cli", "kiln"))))))
    return os.path.join(build, "src", "modelserver", "kiln-model-server")


def model_dir(work, name, handler=None, files=None):
    """<work>/<name>/ml/model with code/inference.py copied from `handler` and `files` written."""
    base = os.path.join(work, name, "ml")
    model = os.path.join(base, "model")
    os.makedirs(os.path.join(model, "code"), exist_ok=True)
    if handler:
        shutil.copy(handler, os.path.join(model, "code", "inference.py"))
    for fname, data in (files or {}).items():
        with open(os.path.join(model, fname), "wb") as f:
            f.write(data)
    return base


def start_kiln(args, work, label, base, extra_env=None):
    port = free_port()
    env = dict(os.environ,
               SAGEMAKER_BIND_TO_PORT=str(port),
               SAGEMAKER_BASE_DIR=base,
               SAGEMAKER_MODEL_SERVER_WORKERS=str(args.workers),
               SAGEMAKER_PROGRAM="inference.py",
               KILN_MODEL_SERVER_PYTHON=PYTHON,
               KILN_MODEL_SERVER_WORKER=os.path.join(REPO, "python", "kiln_toolkit", "serve_worker.py"))
    env.update(extra_env or {})
    s = Server(label, [args.kiln, "serve"], env, os.path.join(work, label), port)
    try:
        s.wait_ready(args.ready_timeout)
    except BaseException:
        s.stop()
        raise
    return s


def start_gunicorn(args, work, label, base, nginx):
    port = free_port()
    d = os.path.join(work, label)
    env = dict(os.environ, MODEL_SERVER_WORKERS=str(args.workers), BENCH_PORT=str(port), BENCH_DIR=d,
               BENCH_NGINX="1" if nginx else "0", BENCH_WORKER_CLASS=args.worker_class,
               BENCH_ML_PREFIX=base + "/", PYTHONDONTWRITEBYTECODE="1")
    s = Server(label, [PYTHON, os.path.join(FILES, "byo", "serve")], env, d, port)
    try:
        s.wait_ready(args.ready_timeout)
    except BaseException:
        s.stop()
        raise
    return s


# ---- requests ----

def post(port, body, content_type, accept):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("POST", "/invocations", body=body, headers={"Content-Type": content_type, "Accept": accept})
        r = c.getresponse()
        return r.status, r.getheader("Content-Type"), r.read()
    finally:
        c.close()


def lua_string(data):
    """A Lua string literal for arbitrary bytes (\\ddd escapes for anything not plain ASCII)."""
    out = []
    for b in data:
        ch = chr(b)
        out.append(ch if 32 <= b < 127 and ch not in '"\\' else "\\%03d" % b)
    return '"' + "".join(out) + '"'


def write_lua(path, body, content_type, accept):
    with open(path, "w") as f:
        f.write('wrk.method = "POST"\nwrk.body = %s\n' % lua_string(body))
        f.write('wrk.headers["Content-Type"] = %s\n' % lua_string(content_type.encode()))
        f.write('wrk.headers["Accept"] = %s\n' % lua_string(accept.encode()))
        f.write(LUA_DONE)


def run_wrk(server, lua, connections, duration, warmup, drain):
    """drain(): one request that returns once what the warm-up left queued is answered."""
    url = "http://127.0.0.1:%d/invocations" % server.port
    base = ["wrk", "-t%d" % (1 if connections == 1 else 2), "-c%d" % connections, "--latency", "-s", lua, url]
    if warmup > 0:
        subprocess.run(base[:1] + ["-d%ds" % warmup] + base[1:], capture_output=True, check=True)
        # wrk leaves its last requests behind when it closes its connections; a server keeps them
        # queued, and with the next run's they could pass the queue bound (Kiln: 100) and answer 503.
        drain()
    pids = server.pids()
    t0 = cpu_ticks(pids)
    out = subprocess.run(base[:1] + ["-d%ds" % duration] + base[1:], capture_output=True, text=True,
                         check=True).stdout
    t1 = cpu_ticks(pids)
    line = [l for l in out.splitlines() if l.startswith("WRKJSON ")]
    if not line:
        raise RuntimeError("wrk printed no summary:\n" + out)
    r = json.loads(line[0][len("WRKJSON "):])
    n = max(r["requests"], 1)
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    r["cpu_us"] = (t1 - t0) * 1e6 / CLK_TCK / n
    r["connections"] = connections
    r["errors"] = r["socket_errors"] + r["non2xx"]
    if server.proc.poll() is not None:
        raise RuntimeError("%s exited during the run:\n%s" % (server.label, server.log_tail()))
    return r


def measure(server, rows, section, label, body, content_type, accept, check, connections, duration, args):
    """Probes `server` once (check(status, content_type, body) raises when wrong), then runs wrk at
    each connection count; appends the rows and returns the probe's answer body."""
    status, ctype, answer = post(server.port, body, content_type, accept)
    if status != 200:
        raise RuntimeError("%s: the probe answered %d: %r\n%s" % (label, status, answer[:300], server.log_tail()))
    check(ctype, answer)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", dir=server.work, delete=False) as f:
        lua = f.name
    write_lua(lua, body, content_type, accept)
    for c in connections:
        r = run_wrk(server, lua, c, duration, args.warmup, lambda: post(server.port, body, content_type, accept))
        r.update(section=section, path=label)
        rows.append(r)
        print("  %-28s c=%-3d %9.0f req/s  p50 %7.3f ms  p99 %8.3f ms  errors %d" % (
            label, c, r["rps"], r["p50_us"] / 1e3, r["p99_us"] / 1e3, r["errors"]), flush=True)
    return answer


# ---- sections ----

def check_echo(ctype, answer):
    if json.loads(answer) != json.loads(ECHO_BODY):
        raise RuntimeError("the echo handler answered %r" % answer[:300])


def section_handler(args, work, rows, notes, with_kiln):
    print("handler: echo, %d workers, %d s per row" % (args.workers, args.duration), flush=True)
    base = model_dir(work, "echo", os.path.join(FILES, "echo", "inference.py"))
    starts = [("gunicorn+nginx", lambda: start_gunicorn(args, work, "gunicorn+nginx", base, True)),
              ("gunicorn", lambda: start_gunicorn(args, work, "gunicorn", base, False))]
    if with_kiln:
        starts.insert(0, ("kiln", lambda: start_kiln(args, work, "kiln", base)))
    for label, start in starts:
        try:
            s = start()
        except Exception as e:  # noqa: BLE001 (report the other rows anyway)
            notes.append("%s: not measured: %s" % (label, e))
            print("  " + notes[-1], flush=True)
            continue
        try:
            measure(s, rows, "handler", label, ECHO_BODY, "application/json", "application/json", check_echo,
                    args.connections, args.duration, args)
        except Exception as e:  # noqa: BLE001
            notes.append("%s: failed: %s" % (label, e))
            print("  " + notes[-1], flush=True)
        finally:
            s.stop()


def torch_files(work):
    """model.pt of a TorchScript Linear(16, 4) (fixed seed) and the NPY body of one 16-row."""
    import numpy as np
    import torch
    torch.manual_seed(0)
    m = torch.jit.script(torch.nn.Linear(16, 4).eval())
    buf = io.BytesIO()
    torch.jit.save(m, buf)
    npy = io.BytesIO()
    np.save(npy, np.asarray([ROW16], dtype=np.float32))
    with torch.no_grad():
        expected = m(torch.tensor([ROW16], dtype=torch.float32)).numpy()
    return buf.getvalue(), npy.getvalue(), expected


def decode_answer(ctype, answer):
    import numpy as np
    if ctype and "npy" in ctype:
        return np.load(io.BytesIO(answer), allow_pickle=False)
    return np.asarray(json.loads(answer), dtype=np.float32)


def section_torch(args, work, rows, notes):
    import numpy as np
    print("torch: TorchScript Linear(16, 4), %d workers, %d s per row" % (args.workers, args.extra_duration),
          flush=True)
    model_pt, npy_body, expected = torch_files(work)
    base = model_dir(work, "linear", files={"model.pt": model_pt})
    formats = [("json", JSON16, "application/json"), ("npy", npy_body, "application/x-npy")]
    answers = {}

    def check(fmt, label):
        def f(ctype, answer):
            got = decode_answer(ctype, answer)
            if got.shape != expected.shape or not np.allclose(got, expected, atol=1e-5):
                raise RuntimeError("%s %s answered %r (%s), expected %r" % (label, fmt, got, ctype, expected))
            answers[(label, fmt)] = got
        return f

    for label, backend in (("kiln python", "python"), ("kiln torchscript", "torchscript")):
        try:
            s = start_kiln(args, work, label.replace(" ", "-"), base,
                           {"KILN_MODEL_SERVER_FRAMEWORK": "pytorch", "KILN_MODEL_SERVER_BACKEND": backend})
        except Exception as e:  # noqa: BLE001
            notes.append("%s: not measured: %s" % (label, e))
            print("  " + notes[-1], flush=True)
            continue
        try:
            for fmt, body, ctype in formats:
                try:
                    measure(s, rows, "torch", "%s %s" % (label, fmt), body, ctype, ctype, check(fmt, label),
                            args.connections, args.extra_duration, args)
                except Exception as e:  # noqa: BLE001
                    notes.append("%s %s: failed: %s" % (label, fmt, e))
                    print("  " + notes[-1], flush=True)
        finally:
            s.stop()
    for fmt, _, _ in formats:
        a, b = answers.get(("kiln python", fmt)), answers.get(("kiln torchscript", fmt))
        if a is not None and b is not None:
            notes.append("torch %s: the TorchScript backend's answer %s the Python path's (max |diff| %.2g)" % (
                fmt, "equals" if np.allclose(a, b, atol=1e-6) else "DIFFERS FROM", float(np.max(np.abs(a - b)))))


def section_batching(args, work, rows, notes):
    c = max(args.connections)
    print("batching: fixed 1 ms per predict_fn call, %d workers, c=%d, %d s per row" % (
        args.workers, c, args.extra_duration), flush=True)
    base = model_dir(work, "fixed", os.path.join(FILES, "fixed_cost", "inference.py"))
    import numpy as np
    weights = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)  # fixed_cost's model_fn
    expected = np.asarray([ROW16], dtype=np.float32) @ weights

    def check(ctype, answer):
        if not np.allclose(np.asarray(json.loads(answer)), expected, atol=1e-4):
            raise RuntimeError("the fixed-cost handler answered %r" % answer[:300])

    for label, env in (("batching off", {}),
                       ("batching on (%d, %d ms)" % (args.batch_size, args.batch_delay),
                        {"SAGEMAKER_TS_BATCH_SIZE": str(args.batch_size),
                         "SAGEMAKER_TS_MAX_BATCH_DELAY": str(args.batch_delay)})):
        try:
            s = start_kiln(args, work, "kiln-" + label.split(" (")[0].replace(" ", "-"), base, env)
        except Exception as e:  # noqa: BLE001
            notes.append("%s: not measured: %s" % (label, e))
            print("  " + notes[-1], flush=True)
            continue
        try:
            measure(s, rows, "batching", "kiln " + label, JSON16, "application/json", "application/json", check,
                    [c], args.extra_duration, args)
        except Exception as e:  # noqa: BLE001
            notes.append("%s: failed: %s" % (label, e))
            print("  " + notes[-1], flush=True)
        finally:
            s.stop()


# ---- report ----

def version(argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        return (p.stdout + p.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "?"


def print_environment(args):
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = version(["git", "-C", REPO, "log", "-1", "--format=%h %cd", "--date=iso"])
    print("machine: %d CPUs online, %d in this process's affinity mask (%s); load average %s" % (
        os.cpu_count(), len(os.sched_getaffinity(0)), cpu, " ".join("%.2f" % x for x in os.getloadavg())))
    print("kernel %s; Python %s (%s); repo at %s" % (platform.release(), platform.python_version(), PYTHON, commit))
    print("versions: %s; %s; flask %s; %s; %s; torch %s; numpy %s" % (
        version(["gunicorn", "--version"]),
        version(["nginx", "-v"]),
        version([PYTHON, "-c", "import importlib.metadata as m; print(m.version('flask'))"]),
        version(["wrk", "--version"]).split(" Copyright")[0],
        "gevent: " + ("yes" if subprocess.run([PYTHON, "-c", "import gevent"], capture_output=True).returncode == 0
                      else "not installed"),
        version([PYTHON, "-c", "import torch; print(torch.__version__)"]),
        version([PYTHON, "-c", "import numpy; print(numpy.__version__)"])))
    print("kiln-model-server: %s" % args.kiln)
    print("gunicorn worker class: %s (the example uses gevent where it is installed)" % args.worker_class)
    print("Nothing is pinned: wrk, the servers and other agents' work share the same cores, so on a small\n"
          "machine the absolute numbers mostly measure contention; compare the ratios. The default run\n"
          "takes about 3 minutes.")
    print(flush=True)


def print_table(rows):
    print("%-9s %-28s %5s %10s %9s %9s %10s %7s" % ("section", "path", "conns", "req/s", "p50 ms", "p99 ms",
                                                    "CPU us/req", "errors"))
    for r in rows:
        print("%-9s %-28s %5d %10.0f %9.3f %9.3f %10.0f %7d" % (
            r["section"], r["path"], r["connections"], r["rps"], r["p50_us"] / 1e3, r["p99_us"] / 1e3,
            r["cpu_us"], r["errors"]))


def print_ratios(rows, connections):
    by = {(r["path"], r["connections"]): r for r in rows}
    lines = []
    for c in connections:
        k = by.get(("kiln", c))
        for ref in ("gunicorn+nginx", "gunicorn"):
            g = by.get((ref, c))
            if not k or not g:
                continue
            tput, p99 = k["rps"] / g["rps"], k["p99_us"] / max(g["p99_us"], 1)
            met = tput >= GOAL_RPS and p99 <= GOAL_P99
            lines.append("c=%-3d kiln / %-15s throughput %6.2fx  p99 %5.2fx  goal (>= %.0fx, <= %.1fx): %-7s "
                         "(CPU/req %.2fx)" % (c, ref, tput, p99, GOAL_RPS, GOAL_P99, "met" if met else "NOT met",
                                              k["cpu_us"] / g["cpu_us"] if g["cpu_us"] else float("nan")))
    for c in connections:
        for fmt in ("json", "npy"):
            py, ts = by.get(("kiln python " + fmt, c)), by.get(("kiln torchscript " + fmt, c))
            if py and ts:
                lines.append("c=%-3d torchscript / python (%s): throughput %.2fx  p50 %.2fx  p99 %.2fx  "
                             "CPU/req %.2fx" % (
                    c, fmt, ts["rps"] / py["rps"], ts["p50_us"] / max(py["p50_us"], 1),
                    ts["p99_us"] / max(py["p99_us"], 1), ts["cpu_us"] / py["cpu_us"] if py["cpu_us"] else float("nan")))
    off = [r for r in rows if r["path"] == "kiln batching off"]
    on = [r for r in rows if r["path"].startswith("kiln batching on")]
    if off and on:
        lines.append("c=%-3d batching on / off: throughput %.2fx  p50 %.2fx  p99 %.2fx" % (
            off[0]["connections"], on[0]["rps"] / off[0]["rps"], on[0]["p50_us"] / max(off[0]["p50_us"], 1),
            on[0]["p99_us"] / max(off[0]["p99_us"], 1)))
    if lines:
        print()
        print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="workers of every server (default 2)")
    ap.add_argument("--duration", type=int, default=10, help="seconds per handler row (default 10)")
    ap.add_argument("--extra-duration", type=int, default=4, help="seconds per torch and batching row (default 4)")
    ap.add_argument("--warmup", type=int, default=1, help="seconds of wrk before each row (default 1)")
    ap.add_argument("--connections", default="1,64", help="comma-separated wrk connection counts (default 1,64)")
    ap.add_argument("--only", default="handler,torch,batching",
                    help="sections to run: handler, torch, batching; or gunicorn (the handler section "
                         "without Kiln)")
    ap.add_argument("--worker-class", default="sync", help="gunicorn -k (default sync)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--batch-delay", type=int, default=5, help="SAGEMAKER_TS_MAX_BATCH_DELAY in ms (default 5)")
    ap.add_argument("--ready-timeout", type=float, default=90)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    args.connections = [int(x) for x in args.connections.split(",") if x]
    only = set(x.strip() for x in args.only.split(",") if x.strip())
    args.kiln = kiln_binary()
    for tool in ("wrk", "gunicorn", "nginx"):
        if not shutil.which(tool) and not os.path.exists("/usr/sbin/" + tool):
            sys.exit("%s not found (apt-get install wrk gunicorn python3-flask nginx-light)" % tool)
    needs_kiln = bool(only & {"handler", "torch", "batching"})
    if needs_kiln and not os.access(args.kiln, os.X_OK):
        sys.exit("%s not found: build it (kbuild kiln-model-server) or set KILN_MODEL_SERVER; "
                 "--only gunicorn measures the reference alone" % args.kiln)

    # SIGTERM ends the run like Ctrl-C: through the finally below that stops the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print_environment(args)
    work = tempfile.mkdtemp(prefix="kiln-model-server-bench-", dir=args.dir)
    # nginx's workers run as nobody when the bench runs as root: they must reach gunicorn's socket.
    os.chmod(work, 0o755)
    rows, notes = [], []
    started = time.time()
    try:
        if "handler" in only or "gunicorn" in only:
            section_handler(args, work, rows, notes, with_kiln="handler" in only)
        if "torch" in only:
            section_torch(args, work, rows, notes)
        if "batching" in only:
            section_batching(args, work, rows, notes)
    finally:
        for s in LIVE:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)
    print()
    print_table(rows)
    print_ratios(rows, args.connections)
    for n in notes:
        print(n)
    print("total %.0f s; load average at the end %s" % (time.time() - started,
                                                        " ".join("%.2f" % x for x in os.getloadavg())))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "notes": notes, "workers": args.workers, "cpus": os.cpu_count()}, f, indent=1)


if __name__ == "__main__":
    main()
