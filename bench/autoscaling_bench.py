#!/usr/bin/python3
"""Application Auto Scaling (issue 19; serving-contract.md §10): how fast a target-tracking policy reacts.

  /usr/bin/python3 bench/autoscaling_bench.py [--rounds 3] [--period 1] [--rate 40] [--target 5]

Starts `kiln server` ($KILN_BIN, default build/src/cli/kiln) with `autoscaling.period_seconds` = --period,
deploys the test serving program (tests/integration/endpoints/serve_app.py, a `local:` image) on one
instance, registers it (MinCapacity 1, MaxCapacity 2) with a SageMakerVariantInvocationsPerInstance
policy (TargetValue --target, ScaleOutCooldown 0), then --rounds times: starts --rate invocations a
second and measures

  decide     load start → the scaling activity's StartTime (AlarmHigh: 3 periods above target, plus
             the time for a period's points to settle, ~1.5 s, and the scaler's half-period tick)
  inservice  the activity → DescribeEndpoint InService with 2 instances (the new one routed)
  serve      the activity → the first answer from the new instance (its boot_id differs; --threads
             callers, so the router's least-busy choice reaches it)
  total      load start → the new instance serving

then stops the load, deregisters the target, sets the variant back to 1 instance and waits InService.
With --period 60 (AWS's minute) `decide` is ~3 minutes; the instance start (`serve`) does not depend
on the period.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "integration")
sys.path.insert(0, TESTS)
import kiln_harness as kh  # noqa: E402

SERVE_IMAGE = "local:" + os.path.abspath(os.path.join(TESTS, "endpoints", "serve_app.py"))
ROLE = "arn:aws:iam::000000000000:role/bench"
KEY = {"ServiceNamespace": "sagemaker", "ScalableDimension": "sagemaker:variant:DesiredInstanceCount"}


def wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit("timed out waiting for " + what)


def in_service_with(sm, name, count):
    d = sm.describe_endpoint(EndpointName=name)
    v = d.get("ProductionVariants", [{}])[0]
    return d["EndpointStatus"] == "InService" and v.get("CurrentInstanceCount") == count


def one_round(sm, aas, rt, name, args):
    resource = "endpoint/%s/variant/AllTraffic" % name
    # The previous round's load must age out of the periods AlarmHigh looks at.
    time.sleep(3 * args.period + 2)
    aas.register_scalable_target(ResourceId=resource, MinCapacity=1, MaxCapacity=2, **KEY)
    aas.put_scaling_policy(PolicyName="bench", PolicyType="TargetTrackingScaling", ResourceId=resource,
                           TargetTrackingScalingPolicyConfiguration={
                               "TargetValue": args.target, "ScaleOutCooldown": 0, "ScaleInCooldown": 600,
                               "PredefinedMetricSpecification": {
                                   "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}}, **KEY)
    first_boot = json.loads(rt.invoke_endpoint(EndpointName=name, Body=b"{}", ContentType="application/json")
                           ["Body"].read())["boot_id"]
    stop = threading.Event()
    new_pid_at = []

    def load():
        interval = args.threads / args.rate
        while not stop.is_set():
            started = time.monotonic()
            try:
                r = rt.invoke_endpoint(EndpointName=name, Body=b"{}", ContentType="application/json")
                if json.loads(r["Body"].read())["boot_id"] != first_boot and not new_pid_at:
                    new_pid_at.append(time.time())
            except Exception:  # noqa: BLE001 (a refused invocation only slows the load)
                pass
            time.sleep(max(0.0, interval - (time.monotonic() - started)))

    t0 = time.time()
    workers = [threading.Thread(target=load, daemon=True) for _ in range(args.threads)]
    for w in workers:
        w.start()
    try:
        in_service = wait(lambda: in_service_with(sm, name, 2) and time.time(), 300 + 4 * args.period,
                          "InService with 2 instances")
        # The router prefers the least busy instance: with several callers the new one answers soon.
        deadline = time.time() + 10
        while not new_pid_at and time.time() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=10)
    activities = aas.describe_scaling_activities(ServiceNamespace="sagemaker", ResourceId=resource)[
        "ScalingActivities"]
    decided = min(a["StartTime"].timestamp() for a in activities if a["StartTime"].timestamp() >= t0)
    answered = new_pid_at[0] if new_pid_at else float("nan")
    aas.deregister_scalable_target(ResourceId=resource, **KEY)
    wait(lambda: in_service_with(sm, name, 2), 120, "InService with 2 instances")
    sm.update_endpoint_weights_and_capacities(EndpointName=name, DesiredWeightsAndCapacities=[
        {"VariantName": "AllTraffic", "DesiredInstanceCount": 1}])
    wait(lambda: in_service_with(sm, name, 1), 120, "back to 1 instance")
    return decided - t0, in_service - decided, answered - decided, answered - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--period", type=int, default=1)
    parser.add_argument("--rate", type=float, default=40.0, help="invocations per second")
    parser.add_argument("--target", type=float, default=5.0, help="invocations per instance per period")
    parser.add_argument("--threads", type=int, default=4, help="callers sharing --rate")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln-autoscaling-bench-")
    config = {"scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
              "endpoints": {"stop_grace_seconds": 5, "health_interval_seconds": 0.5},
              "autoscaling": {"period_seconds": args.period}}
    server = kh.KilnServer(os.path.join(tmp, "data"), config=config)
    server.start()
    try:
        sm, aas, rt = server.client("sagemaker"), server.client("application-autoscaling"), \
            server.client("sagemaker-runtime")
        name = "autoscaling-bench"
        sm.create_model(ModelName=name, PrimaryContainer={"Image": SERVE_IMAGE}, ExecutionRoleArn=ROLE)
        sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
            "VariantName": "AllTraffic", "ModelName": name, "InitialInstanceCount": 1,
            "InstanceType": "ml.m5.large"}])
        sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
        wait(lambda: in_service_with(sm, name, 1), 120, "the endpoint InService")
        rows = [one_round(sm, aas, rt, name, args) for _ in range(args.rounds)]
        print("period %d s, %.0f invocations/s, target %.1f per instance per period, %d rounds" % (
            args.period, args.rate, args.target, args.rounds))
        for label, i in (("decide", 0), ("inservice", 1), ("serve", 2), ("total", 3)):
            values = [r[i] for r in rows if r[i] == r[i]]
            if not values:
                print("  %-9s (the new instance never answered a caller)" % label)
                continue
            print("  %-9s median %6.2f s  min %6.2f s  max %6.2f s" % (
                label, statistics.median(values), min(values), max(values)))
    finally:
        # Endpoint instances outlive a stopped server by design: delete them first.
        try:
            sm = server.client("sagemaker")
            for e in sm.list_endpoints()["Endpoints"]:
                sm.delete_endpoint(EndpointName=e["EndpointName"])
            wait(lambda: not sm.list_endpoints()["Endpoints"], 60, "the endpoint deleted")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
