#!/usr/bin/python3
"""GetMetricData over 100k points, end to end (issue 10's measure), and PutMetricData ingest.

  /usr/bin/python3 bench/metric_store_bench.py [--points 100000] [--runs 20]

Starts `kiln server` on a free loopback port with a fresh data dir, then through CloudWatch's
AWS JSON 1.0 protocol (what botocore 1.43 speaks; raw signed requests, stdlib only):

  1. PutMetricData: --points points of one series `Flat` (one value a second, ending now), 1,000
     per request (AWS's limit), one client; and the same number of `Latency` points, each a second
     of 50 samples as Values+Counts over 20 distinct values (as a latency histogram would send).
  2. GetMetricData over each whole series at 60 s periods (one MetricStat query; ~1,667 periods):
     Average, and p99 (the percentile merges every point's distribution). --runs each; median,
     p90 and min latency of the whole HTTP exchange, and the answer's datapoint count.
  3. Reference: the same GetMetricData on a series of one point (the fixed cost of SigV4, the
     front door and JSON), so `- reference` is what the 100k points cost.

The store-level numbers (8 concurrent 1 kHz writers, Aggregate without HTTP) come from
src/observe/metric_store_benchmark.cc; see bench/README.md.
$KILN_BIN selects the binary (default build/src/cli/kiln).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))

import kiln_harness as kh  # noqa: E402

NS = "KilnBench/Metrics"
DIMS = [{"Name": "Host", "Value": "bench-1"}]
TARGET = "GraniteServiceVersion20100801."


def call(server, operation, payload):
    body = json.dumps(payload).encode()
    headers = {"X-Amz-Target": TARGET + operation, "Content-Type": "application/x-amz-json-1.0",
               "x-amzn-query-mode": "true"}
    hdrs, _, _ = kh.sign_request("POST", server.endpoint + "/", headers, server.creds(), "monitoring", body=body,
                                 signed_headers=["content-type", "host", "x-amz-date", "x-amz-target"])
    status, _, data = kh.http_request("POST", server.endpoint + "/", hdrs, body, timeout=300)
    if status != 200:
        raise RuntimeError("%s answered %d: %s" % (operation, status, data[:500]))
    return json.loads(data) if data else {}


def put_series(server, name, points, end, latency):
    start = time.monotonic()
    for base in range(0, points, 1000):
        data = []
        for i in range(base, min(points, base + 1000)):
            datum = {"MetricName": name, "Dimensions": DIMS, "Timestamp": end - points + i}
            if latency:
                values = [9000 * 1.0202 ** (b + i % 7) for b in range(20)]
                counts = [1 + (b * 13 + i) % 4 for b in range(20)]
                scale = 50 / sum(counts)
                datum.update({"Values": values, "Counts": [max(1, round(c * scale)) for c in counts],
                              "Unit": "Microseconds"})
            else:
                datum["Value"] = float((i * 7919) % 1000)
            data.append(datum)
        call(server, "PutMetricData", {"Namespace": NS, "MetricData": data})
    return time.monotonic() - start


def get_metric_data(server, name, start, end, stat, runs):
    query = {"MetricDataQueries": [{"Id": "m1", "MetricStat": {
        "Metric": {"Namespace": NS, "MetricName": name, "Dimensions": DIMS}, "Period": 60, "Stat": stat}}],
        "StartTime": start, "EndTime": end}
    times, count = [], 0
    for _ in range(runs):
        t0 = time.monotonic()
        answer = call(server, "GetMetricData", query)
        times.append((time.monotonic() - t0) * 1000)
        results = answer.get("MetricDataResults", [])
        count = sum(len(r.get("Values", [])) for r in results)
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))], times[0], count


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=100000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--dir", default=None, help="parent of the data dir (default $TMPDIR)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="kiln-metric-bench-", dir=args.dir)
    server = kh.KilnServer(os.path.join(work, "data"), log_level="warn")
    server.start()
    try:
        end = float(int(time.time()) // 60 * 60)
        start = end - args.points - 60
        print("kiln %s, %d CPUs, %d points per series" % (kh.kiln_bin(), os.cpu_count(), args.points))
        print()
        print("%-34s %10s %12s" % ("PutMetricData (1 client)", "seconds", "points/s"))
        for name, latency in (("Flat", False), ("Latency", True)):
            seconds = put_series(server, name, args.points, end, latency)
            label = name + (" (Values+Counts, 20 values)" if latency else " (Value)")
            print("%-34s %10.2f %12.0f" % (label, seconds, args.points / seconds))
        put_series(server, "One", 1, end, False)
        print()
        print("%-34s %9s %9s %9s %11s %12s" % ("GetMetricData, 60 s periods", "p50 ms", "p90 ms", "min ms",
                                            "datapoints", "- reference"))
        reference = get_metric_data(server, "One", start, end + 60, "Average", args.runs)
        rows = [("Flat", "Average"), ("Flat", "p99"), ("Latency", "Average"), ("Latency", "p99")]
        for name, stat in rows:
            p50, p90, low, count = get_metric_data(server, name, start, end + 60, stat, args.runs)
            print("%-34s %9.2f %9.2f %9.2f %11d %12.2f" % ("%s %s" % (name, stat), p50, p90, low, count,
                                                         p50 - reference[0]))
        print("%-34s %9.2f %9.2f %9.2f %11d %12s" % ("reference: 1 point, Average", reference[0], reference[1],
                                                     reference[2], reference[3], "-"))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
