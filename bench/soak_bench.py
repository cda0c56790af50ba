#!/usr/bin/python3
"""Soak: one endpoint at full load for a long time, the kiln server's RSS sampled throughout.

  KILN_BIN=build/src/cli/kiln /usr/bin/python3 bench/soak_bench.py [--minutes 30]
        [--warmup-minutes 5] [--sample-seconds 10] [--connections 8] [--csv rss.csv]

Question it answers: does the server's memory stay flat while an endpoint serves steady traffic
(every request goes through SigV4, the router, invocation metrics and the access log, and the
instance writes one log line per request into the log store), or does something grow with time
or traffic instead of with the number of live resources? Goal (issue 9): RSS growth after
warm-up under 1 %.

What it does: starts `kiln server` (tests/integration/kiln_harness.py, the same harness as the
integration tests and bench/serving_bench.py) with a fresh data dir, deploys one endpoint whose
image is the integration tests' serving program (`local:tests/integration/endpoints/serve_app.py`,
one instance, ml.m5.large under the `shrink` scheduler policy), and drives
`POST /endpoints/<name>/invocations` with wrk at --connections for --minutes. wrk replays one
SigV4-signed request (a signature is valid for 15 minutes), so the run is cut into segments of at
most --segment-seconds, each with freshly signed headers. Without wrk (or with --no-wrk) a bounded
Python client loop (http.client keep-alive, one thread per connection, each request signed) does
the same at a lower rate.

Every --sample-seconds a thread reads VmRSS (and VmHWM) from /proc/<server pid>/status. At the
end it prints the curve (one row per sample: elapsed time, RSS, requests so far), the RSS at the
end of the warm-up (the median of the samples in the minute before it, to smooth allocator noise),
the RSS at the end (the median of the last minute), the growth between them in % and in MiB per
hour, the requests served, and the bytes of log messages the endpoint's log group holds. --csv writes the
samples (seconds, rss_kib, hwm_kib, requests).

Not run by CI: it needs tens of minutes and the whole machine.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
sys.path.insert(0, HERE)

import serving_bench as sb  # noqa: E402 (signing, the wrk Lua script)

SERVE_APP = os.path.join(REPO, "tests", "integration", "endpoints", "serve_app.py")
ROLE = "arn:aws:iam::000000000000:role/soak"
BODY = b'{"instances": [[1.0, 2.0, 3.0, 4.0]]}'


def read_status(pid):
    """(VmRSS KiB, VmHWM KiB) of pid, or None once it is gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return None
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


class Sampler(threading.Thread):
    def __init__(self, pid, interval, requests_so_far):
        super().__init__(daemon=True)
        self.pid, self.interval, self.requests_so_far = pid, interval, requests_so_far
        self.samples = []  # (seconds, rss_kib, hwm_kib, requests)
        self.stop_event = threading.Event()
        self.t0 = time.monotonic()

    def sample(self):
        st = read_status(self.pid)
        if st:
            self.samples.append((time.monotonic() - self.t0, st[0], st[1], self.requests_so_far()))

    def run(self):
        while not self.stop_event.is_set():
            self.sample()
            self.stop_event.wait(self.interval)
        self.sample()


def deploy(server, name, timeout):
    sm = server.client("sagemaker")
    sm.create_model(ModelName=name, ExecutionRoleArn=ROLE, PrimaryContainer={"Image": "local:" + SERVE_APP})
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": name, "InstanceType": "ml.m5.large",
        "InitialInstanceCount": 1}])
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    sb.wait_in_service(sm, name, timeout)


class WrkLoad:
    """wrk in segments, each with freshly signed headers."""

    def __init__(self, server, path, connections, work):
        self.server, self.path, self.connections, self.work = server, path, connections, work
        self.done = 0  # requests of finished segments
        self.errors = 0
        self.segment_start = None

    def requests_so_far(self):
        return self.done  # wrk reports only at the end of a segment

    def run(self, seconds, segment_seconds):
        end = time.monotonic() + seconds
        n = 0
        while True:
            left = end - time.monotonic()
            if left < 1:
                break
            seg = int(min(left, segment_seconds))
            lua = os.path.join(self.work, "seg%d.lua" % n)
            sb.write_lua(lua, sb.signed_headers(self.server, self.path), BODY)
            threads = 1 if self.connections == 1 else 2
            out = subprocess.run(["wrk", "-t%d" % threads, "-c%d" % self.connections, "-d%ds" % seg, "-s", lua,
                                  self.server.endpoint + self.path], capture_output=True, text=True).stdout
            line = [l for l in out.splitlines() if l.startswith("WRKJSON ")]
            if not line:
                raise RuntimeError("wrk printed no summary:\n" + out)
            r = json.loads(line[0][len("WRKJSON "):])
            self.done += r["requests"]
            self.errors += r["socket_errors"] + r["non2xx"]
            n += 1


class PythonLoad:
    """A bounded client loop: --connections threads, each a keep-alive connection, every request
    signed (slower than wrk; for machines without it)."""

    def __init__(self, server, path, connections):
        self.server, self.path, self.connections = server, path, connections
        self.count = 0
        self.errors = 0
        self.lock = threading.Lock()

    def requests_so_far(self):
        return self.count

    def worker(self, end):
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        while time.monotonic() < end:
            headers = sb.signed_headers(self.server, self.path)
            headers.pop("Host", None)
            try:
                conn.request("POST", self.path, body=BODY, headers=headers)
                resp = conn.getresponse()
                resp.read()
                ok = resp.status == 200
            except OSError:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
                ok = False
            with self.lock:
                self.count += 1
                self.errors += 0 if ok else 1
        conn.close()

    def run(self, seconds, _segment_seconds):
        end = time.monotonic() + seconds
        threads = [threading.Thread(target=self.worker, args=(end,)) for _ in range(self.connections)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def window_median(samples, t_end, width):
    vals = [s[1] for s in samples if t_end - width <= s[0] <= t_end]
    return statistics.median(vals) if vals else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30, help="load duration (default 30)")
    ap.add_argument("--warmup-minutes", type=float, default=None,
                    help="growth is measured from the end of this (default: 5, or a sixth of --minutes if shorter)")
    ap.add_argument("--sample-seconds", type=float, default=10, help="RSS sampling interval (default 10)")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--segment-seconds", type=int, default=120, help="wrk segment length (signature lifetime 15 min)")
    ap.add_argument("--no-wrk", action="store_true", help="use the Python client loop even if wrk is installed")
    ap.add_argument("--endpoint-timeout", type=float, default=120)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--csv", help="write the samples to this file")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (data dir, server log)")
    args = ap.parse_args()
    if args.warmup_minutes is None:
        args.warmup_minutes = min(5.0, args.minutes / 6)
    if args.warmup_minutes >= args.minutes:
        sys.exit("--warmup-minutes must be shorter than --minutes")
    use_wrk = not args.no_wrk and shutil.which("wrk")

    import kiln_harness as kh
    work = tempfile.mkdtemp(prefix="kiln-soak-", dir=args.dir)
    config = {"scheduler": {"policy": "shrink", "allow_cpu_fallback": True}}
    server = kh.KilnServer(os.path.join(work, "data"), config=config,
                           log_path=os.path.join(work, "server.log"), log_level="info")
    server.start()
    name = "soak"
    try:
        deploy(server, name, args.endpoint_timeout)
        path = "/endpoints/%s/invocations" % name
        load = WrkLoad(server, path, args.connections, work) if use_wrk else PythonLoad(server, path, args.connections)
        sampler = Sampler(server.proc.pid, args.sample_seconds, load.requests_so_far)
        sampler.start()
        load.run(args.minutes * 60, args.segment_seconds)
        sampler.stop_event.set()
        sampler.join()
        logs = server.client("logs")
        groups = logs.describe_log_groups(logGroupNamePrefix="/aws/sagemaker/Endpoints/" + name)["logGroups"]
        stored = sum(g.get("storedBytes", 0) for g in groups)
        try:
            server.client("sagemaker").delete_endpoint(EndpointName=name)
        except Exception:  # noqa: BLE001 (best effort before stopping the server)
            pass
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    s = sampler.samples
    print("load: %s, %d connections, %.1f min; server RSS every %.0f s" % (
        "wrk" if use_wrk else "python loop", args.connections, args.minutes, args.sample_seconds))
    print("%9s %10s %10s %12s" % ("seconds", "RSS MiB", "HWM MiB", "requests"))
    for t, rss, hwm, req in s:
        print("%9.0f %10.1f %10.1f %12d" % (t, rss / 1024, hwm / 1024, req))
    warm_t = args.warmup_minutes * 60
    width = min(60.0, warm_t)
    warm = window_median(s, warm_t, width)
    end_t = s[-1][0]
    end = window_median(s, end_t, width)
    total = load.requests_so_far()
    print()
    print("requests: %d (%.0f/s), errors %d; the endpoint's log group holds %.1f MiB of messages" % (
        total, total / (args.minutes * 60), load.errors, stored / 1048576))
    if warm and end:
        hours = (end_t - warm_t) / 3600
        print("RSS after warm-up (%.1f min): %.1f MiB; at end (%.1f min): %.1f MiB; growth %+.2f %% "
              "(%+.1f MiB/h); peak %.1f MiB" % (
                  args.warmup_minutes, warm / 1024, end_t / 60, end / 1024, 100.0 * (end - warm) / warm,
                  (end - warm) / 1024 / hours if hours > 0 else 0.0, max(x[2] for x in s) / 1024))
        print("goal: growth under 1 %% after warm-up: %s" % ("met" if end - warm < 0.01 * warm else "NOT met"))
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("seconds,rss_kib,hwm_kib,requests\n")
            for row in s:
                f.write("%.1f,%d,%d,%d\n" % row)


if __name__ == "__main__":
    main()
