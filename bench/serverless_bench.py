#!/usr/bin/python3
"""Serverless variants (issue 19; serving-contract.md §12): a cold start against a warm invocation.

  /usr/bin/python3 bench/serverless_bench.py [--rounds 5] [--idle 1]

Starts `kiln server` ($KILN_BIN, default build/src/cli/kiln) with `serverless.idle_seconds` = --idle,
deploys the test serving program (tests/integration/endpoints/serve_app.py, a `local:` image) as a
serverless endpoint (MemorySizeInMB 1024, MaxConcurrency 2, no ProvisionedConcurrency: 0 instances when
idle), then --rounds times: waits until the scaler has taken the pool back to 0 and the instance is gone,
and measures

  cold   InvokeEndpoint with no instance: the scaler raises the pool, the controller starts an instance
         (process start, model data, /ping), the request waits for it in the router
  warm   the next InvokeEndpoint, on the instance the cold one started

and prints the medians, with the ModelSetupTime statistics CloudWatch GetMetricStatistics reports (the
router's wait of each cold start).
"""

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "integration")
sys.path.insert(0, TESTS)
import kiln_harness as kh  # noqa: E402

SERVE_IMAGE = "local:" + os.path.abspath(os.path.join(TESTS, "endpoints", "serve_app.py"))
ROLE = "arn:aws:iam::000000000000:role/bench"


def wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit("timed out waiting for " + what)


def pool_size(server, endpoint):
    size = None
    for line in server.log_text().splitlines():
        if "serverless: pool size" in line and endpoint in line:
            for word in line.split():
                if word.startswith("size="):
                    size = int(word[5:].strip('"'))
    return size


def timed_invoke(rt, name):
    t0 = time.monotonic()
    r = rt.invoke_endpoint(EndpointName=name, Body=b"{}", ContentType="application/json")
    r["Body"].read()
    return time.monotonic() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--idle", type=int, default=1, help="serverless.idle_seconds")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln-serverless-bench-")
    config = {"scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
              "endpoints": {"stop_grace_seconds": 5, "health_interval_seconds": 0.5},
              "serverless": {"idle_seconds": args.idle}}
    server = kh.KilnServer(os.path.join(tmp, "data"), config=config)
    server.start()
    try:
        sm, rt, cw = server.client("sagemaker"), server.client("sagemaker-runtime", read_timeout=70), \
            server.client("cloudwatch")
        name = "serverless-bench"
        sm.create_model(ModelName=name, PrimaryContainer={"Image": SERVE_IMAGE}, ExecutionRoleArn=ROLE)
        sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
            "VariantName": "AllTraffic", "ModelName": name,
            "ServerlessConfig": {"MemorySizeInMB": 1024, "MaxConcurrency": 2}}])
        sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
        wait(lambda: sm.describe_endpoint(EndpointName=name)["EndpointStatus"] == "InService", 60, "InService")
        colds, warms = [], []
        for i in range(args.rounds):
            if i > 0:
                wait(lambda: pool_size(server, name) == 0, args.idle + 30, "the pool back to 0")
                time.sleep(1.0)  # the drained instance stopped
            colds.append(timed_invoke(rt, name))
            warms.append(min(timed_invoke(rt, name) for _ in range(3)))
        print("%d rounds, idle_seconds %d" % (args.rounds, args.idle))
        for label, values in (("cold", colds), ("warm", warms)):
            print("  %-5s median %7.1f ms  min %7.1f ms  max %7.1f ms" % (
                label, 1000 * statistics.median(values), 1000 * min(values), 1000 * max(values)))
        now = datetime.datetime.now(datetime.timezone.utc)
        time.sleep(1.5)
        points = cw.get_metric_statistics(
            Namespace="AWS/SageMaker", MetricName="ModelSetupTime",
            Dimensions=[{"Name": "EndpointName", "Value": name}, {"Name": "VariantName", "Value": "AllTraffic"}],
            StartTime=now - datetime.timedelta(hours=1), EndTime=now + datetime.timedelta(minutes=1),
            Period=7200, Statistics=["SampleCount", "Average", "Minimum", "Maximum"])["Datapoints"]
        for p in points:
            print("  ModelSetupTime: %d samples, average %.1f ms, min %.1f ms, max %.1f ms" % (
                p["SampleCount"], p["Average"] / 1000, p["Minimum"] / 1000, p["Maximum"] / 1000))
    finally:
        try:
            sm = server.client("sagemaker")
            for e in sm.list_endpoints()["Endpoints"]:
                sm.delete_endpoint(EndpointName=e["EndpointName"])
            wait(lambda: not sm.list_endpoints()["Endpoints"], 60, "the endpoint deleted")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
