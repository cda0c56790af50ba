#!/usr/bin/python3
"""What data capture adds to the invoke path: the same endpoint backend with and without capture, driven by wrk.

  /usr/bin/python3 bench/data_capture_bench.py [--duration 8] [--connections 1,16] [--rounds 2]
                                               [--body-bytes 1024] [--json results.json]

One `kiln server` (SigV4 on, `data_capture.flush_interval_seconds` 1) runs two endpoints over bench/serving_backend
(serving_bench.py's backend, image `local:<serving_backend>`, a fixed 11-byte answer):
  off   no DataCaptureConfig
  on    DataCaptureConfig: InitialSamplingPercentage 100, InputAndOutput, JSON content types (every request's
        body and answer copied, written as JSON lines to the embedded object store once a second)
Each round runs wrk against `off`, then `on`, at every --connections value (alternating, so drift hits both
alike). Columns: requests/s, p50/p99 latency, server CPU per request (utime+stime of the kiln process), and
for `on` the records found in the capture files against the requests wrk counted (the capture is
best-effort: a record dropped because the buffer was full would show here). The summary gives, per
connection count, the median over rounds of the p50 latency and CPU per request added by capture.

$KILN_BIN selects the kiln binary (default build/src/cli/kiln)."""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "integration"))

import serving_bench as sb  # noqa: E402 (wrk, the backend, CPU accounting)

BUCKET = "bench-capture"


def capture_config():
    return {"EnableCapture": True, "InitialSamplingPercentage": 100,
            "DestinationS3Uri": "s3://%s/capture" % BUCKET,
            "CaptureOptions": [{"CaptureMode": "InputAndOutput"}],
            "CaptureContentTypeHeader": {"JsonContentTypes": ["application/json"]}}


def start_endpoint(server, backend, name, capture):
    sm = server.client("sagemaker")
    sm.create_model(ModelName=name, ExecutionRoleArn=sb.ROLE, PrimaryContainer={"Image": "local:" + backend})
    config = {"ProductionVariants": [{"VariantName": "AllTraffic", "ModelName": name,
                                      "InstanceType": "ml.m5.large", "InitialInstanceCount": 1}]}
    if capture:
        config["DataCaptureConfig"] = capture_config()
    sm.create_endpoint_config(EndpointConfigName=name, **config)
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    sb.wait_in_service(sm, name, 60)


def captured_records(s3):
    n = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="capture/"):
        for obj in page.get("Contents", []):
            n += s3.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read().count(b"\n")
    return n


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=8)
    parser.add_argument("--connections", default="1,16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--json")
    args = parser.parse_args()
    connections = [int(c) for c in args.connections.split(",")]
    import kiln_harness as kh

    body = json.dumps({"instances": "x" * max(0, args.body_bytes - 17)}).encode()
    sb.BODY = body  # signed_headers and write_lua read it
    work = tempfile.mkdtemp(prefix="kiln-capture-bench-")
    backend = sb.backend_binary()
    config = {"scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
              "data_capture": {"flush_interval_seconds": 1}}
    server = kh.KilnServer(os.path.join(work, "data"), config=config, log_path=os.path.join(work, "server.log"),
                           log_level="info")
    server.start()
    rows = []
    try:
        s3 = server.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        start_endpoint(server, backend, "bench-off", capture=False)
        start_endpoint(server, backend, "bench-on", capture=True)
        luas = {}
        for label in ("off", "on"):
            path = "/endpoints/bench-%s/invocations" % label
            luas[label] = (server.endpoint + path, os.path.join(work, label + ".lua"))
            sb.write_lua(luas[label][1], sb.signed_headers(server, path), body)
        bpids = sb.pids_running(backend)
        for round_index in range(args.rounds):
            for c in connections:
                for label in ("off", "on"):
                    before = captured_records(s3) if label == "on" else 0
                    url, lua = luas[label]
                    # run_wrk's warm-up second also sends requests: count records over both runs.
                    r = sb.run_wrk(url, lua, c, args.duration, [server.proc.pid], bpids)
                    r.update(path=label, round=round_index)
                    if label == "on":
                        time.sleep(2.5)  # two flush intervals: every record of the run is in a file
                        r["captured"] = captured_records(s3) - before
                    rows.append(r)
                    print("round %d  %-3s c=%-3d %8.0f req/s  p50 %6d us  p99 %6d us  cpu %5.1f us/req%s" % (
                        round_index, label, c, r["rps"], r["p50_us"], r["p99_us"], r["proxy_cpu_us"],
                        ("  captured %d (wrk counted %d + warm-up)" % (r["captured"], r["requests"]))
                        if label == "on" else ""), flush=True)
    finally:
        # Endpoint instances outlive a stopped server by design: delete them first.
        sm = server.client("sagemaker")
        for name in ("bench-off", "bench-on"):
            try:
                sm.delete_endpoint(EndpointName=name)
            except Exception:  # noqa: BLE001 (best effort: it may not exist)
                pass
        deadline = time.time() + 30
        while sm.list_endpoints()["Endpoints"] and time.time() < deadline:
            time.sleep(0.2)
        server.stop()
    print("\nadded by capture (median over %d rounds; body %d bytes):" % (args.rounds, len(body)))
    summary = {}
    for c in connections:
        def med(label, key):
            return statistics.median(r[key] for r in rows if r["path"] == label and r["connections"] == c)
        summary[c] = {"p50_added_us": med("on", "p50_us") - med("off", "p50_us"),
                      "cpu_added_us": med("on", "proxy_cpu_us") - med("off", "proxy_cpu_us"),
                      "rps_ratio": med("on", "rps") / med("off", "rps")}
        print("  c=%-3d p50 %+5.0f us   cpu %+5.1f us/req   req/s on/off %.3f" % (
            c, summary[c]["p50_added_us"], summary[c]["cpu_added_us"], summary[c]["rps_ratio"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
