#!/usr/bin/python3
"""Asynchronous inference (issue 19; serving-contract.md §11): throughput and end-to-end latency.

  /usr/bin/python3 bench/async_bench.py [--requests 2000] [--clients 8] [--instances 1] [--concurrency 4]
                                        [--sleep 0]

Starts `kiln server` ($KILN_BIN, default build/src/cli/kiln) on a fresh data dir, deploys the test
serving program (tests/integration/endpoints/serve_app.py, a `local:` image) as an async endpoint
(--instances instances, MaxConcurrentInvocationsPerInstance --concurrency), puts one small input
object, then --clients threads send --requests InvokeEndpointAsync calls as fast as they are
answered (each body asks the container to sleep --sleep seconds) and the script watches the output
objects appear. It reports

  accept     InvokeEndpointAsync round trip (202: header checks, HeadObject, journal fsync shared by
             concurrent requests): p50/p99, and accepted requests per second
  e2e        202 → output object listed (the dispatcher's queueing, input read, container call,
             output write): p50/p99/max; polled every 50 ms, so ±50 ms
  throughput outputs per second from the first 202 to the last output

The endpoint and server are removed at the end.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "integration")
sys.path.insert(0, TESTS)
import kiln_harness as kh  # noqa: E402

SERVE_IMAGE = "local:" + os.path.abspath(os.path.join(TESTS, "endpoints", "serve_app.py"))
ROLE = "arn:aws:iam::000000000000:role/bench"
BUCKET = "async-bench"


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100.0 * (len(values) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--instances", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--sleep", type=float, default=0.0)
    args = ap.parse_args()
    os.environ.setdefault("KILN_BIN", os.path.join(HERE, "..", "build", "src", "cli", "kiln"))
    root = tempfile.mkdtemp(prefix="kiln-async-bench-")
    srv = kh.KilnServer(os.path.join(root, "data"), log_level="warn", config={
        "scheduler": {"policy": "shrink", "allow_cpu_fallback": True}})
    srv.start()
    try:
        sm, s3 = srv.client("sagemaker"), srv.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        name = "async-bench"
        sm.create_model(ModelName=name, PrimaryContainer={"Image": SERVE_IMAGE}, ExecutionRoleArn=ROLE)
        status, _, body = kh.json_request(srv, "SageMaker.CreateEndpointConfig", {
            "EndpointConfigName": name,
            "ProductionVariants": [{"VariantName": "AllTraffic", "ModelName": name,
                                    "InitialInstanceCount": args.instances, "InstanceType": "ml.m5.large"}],
            "AsyncInferenceConfig": {"ClientConfig": {"MaxConcurrentInvocationsPerInstance": args.concurrency},
                                     "OutputConfig": {"S3OutputPath": "s3://%s/out/" % BUCKET}}})
        assert status == 200, body
        sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
        deadline = time.monotonic() + 120
        while sm.describe_endpoint(EndpointName=name)["EndpointStatus"] != "InService":
            if time.monotonic() > deadline:
                raise SystemExit("endpoint not InService")
            time.sleep(0.2)
        payload = json.dumps({"sleep": args.sleep}).encode() if args.sleep else b'{"x": 1}'
        s3.put_object(Bucket=BUCKET, Key="in/payload.json", Body=payload, ContentType="application/json")
        source = "s3://%s/in/payload.json" % BUCKET

        accepted = {}  # inference id -> 202 time
        accept_ms = []
        lock = threading.Lock()
        local = threading.local()

        def send(i):
            if not hasattr(local, "rt"):
                local.rt = srv.client("sagemaker-runtime")
            inference_id = "b-%06d-%s" % (i, uuid.uuid4().hex[:6])
            t0 = time.monotonic()
            local.rt.invoke_endpoint_async(EndpointName=name, InputLocation=source, InferenceId=inference_id)
            t1 = time.monotonic()
            with lock:
                accepted[inference_id] = t1
                accept_ms.append((t1 - t0) * 1000)

        done = {}
        stop = threading.Event()

        def watch():
            s3w = srv.client("s3")
            while not stop.is_set():
                now = time.monotonic()
                for page in s3w.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="out/"):
                    for o in page.get("Contents", []):
                        key = o["Key"][len("out/"):-len(".out")]
                        if key not in done:
                            done[key] = now
                if len(done) >= args.requests:
                    return
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        start = time.monotonic()
        watcher.start()
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(send, range(args.requests)))
        accepted_at = time.monotonic()
        watcher.join(timeout=600)
        stop.set()
        end = max(done.values()) if done else time.monotonic()
        e2e = [(done[k] - accepted[k]) * 1000 for k in accepted if k in done]
        print("requests=%d clients=%d instances=%d concurrency=%d sleep=%.3fs" % (
            args.requests, args.clients, args.instances, args.concurrency, args.sleep))
        print("accept     p50 %.1f ms  p99 %.1f ms  %.0f req/s" % (
            statistics.median(accept_ms), pct(accept_ms, 99), args.requests / (accepted_at - start)))
        print("e2e        p50 %.0f ms  p99 %.0f ms  max %.0f ms  (%d/%d outputs)" % (
            statistics.median(e2e), pct(e2e, 99), max(e2e), len(e2e), args.requests))
        print("throughput %.0f outputs/s" % (len(done) / (end - start)))
        sm.delete_endpoint(EndpointName=name)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                sm.describe_endpoint(EndpointName=name)
                time.sleep(0.2)
            except Exception:  # noqa: BLE001 (gone)
                break
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
