#!/usr/bin/python3
"""Multi-model endpoints (serving-contract.md §7): model load time and LRU swap time.

  /usr/bin/python3 bench/mme_bench.py [--models 6] [--rounds 3] [--ballast-mb 100] [--limit-mb 400]

Starts `kiln server` ($KILN_BIN, default build/src/cli/kiln), deploys a multi-model endpoint of the
sagemaker-scikit-learn image (Kiln's model server, one Python worker per loaded model) whose container
memory limit (KILN_MODEL_SERVER_MEMORY_LIMIT_MB = --limit-mb) fits about two models of --ballast-mb each,
uploads --models archives (numpy weights + tests/integration/sdk/mme_src/mme_inference.py under code/),
and measures InvokeEndpoint with TargetModel:

  cold   the first request for a model: download + unpack into /opt/ml/models/<name>/model, POST /models
         (a worker process starts and runs model_fn), 507 → LRU unload when memory is full, the invocation
  warm   the same model again (loaded: the invocation only)
  swap   round-robin over three models that do not all fit: every request unloads the least recently
         used model (DELETE /models) and loads its own from disk again (no download)

and prints the medians with the ModelDownloadingTime / ModelLoadingTime / ModelUnloadingTime /
ModelLoadingWaitTime statistics of CloudWatch GetMetricStatistics.
"""

import argparse
import datetime
import io
import json
import os
import statistics
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "integration")
sys.path.insert(0, TESTS)
import kiln_harness as kh  # noqa: E402

IMAGE = "683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3"
CODE = os.path.join(TESTS, "sdk", "mme_src", "mme_inference.py")
ROLE = "arn:aws:iam::000000000000:role/bench"
ROWS = [[1.0, 2.0]]


def archive(name, ballast_mb):
    import numpy as np
    buf = io.BytesIO()
    np.save(buf, np.array([1.0, 2.0]))
    with open(CODE, "rb") as f:
        code = f.read()
    files = {"weights.npy": buf.getvalue(), "info.json": json.dumps({"name": name, "ballast_mb": ballast_mb}).encode(),
             "code/mme_inference.py": code}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for member, content in files.items():
            ti = tarfile.TarInfo(member)
            ti.size = len(content)
            tar.addfile(ti, io.BytesIO(content))
    return out.getvalue()


def timed(rt, endpoint, target):
    t0 = time.monotonic()
    r = rt.invoke_endpoint(EndpointName=endpoint, Body=json.dumps(ROWS).encode(), ContentType="application/json",
                           TargetModel=target)
    r["Body"].read()
    return (time.monotonic() - t0) * 1000


def stats(cw, endpoint, metric):
    now = datetime.datetime.now(datetime.timezone.utc)
    out = cw.get_metric_statistics(
        Namespace="AWS/SageMaker", MetricName=metric,
        Dimensions=[{"Name": "EndpointName", "Value": endpoint}, {"Name": "VariantName", "Value": "AllTraffic"}],
        StartTime=now - datetime.timedelta(hours=1), EndTime=now + datetime.timedelta(minutes=1), Period=7200,
        Statistics=["SampleCount", "Average", "Maximum"])
    points = out["Datapoints"]
    if not points:
        return "none"
    p = points[0]
    return "n=%d avg=%.1f ms max=%.1f ms" % (p["SampleCount"], p["Average"] / 1000, p["Maximum"] / 1000)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3, help="swap rounds over three models")
    parser.add_argument("--ballast-mb", type=int, default=100)
    parser.add_argument("--limit-mb", type=int, default=400)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln-mme-bench-")
    config = {"scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
              "endpoints": {"stop_grace_seconds": 5, "health_interval_seconds": 0.5}}
    server = kh.KilnServer(os.path.join(tmp, "data"), config=config)
    server.start()
    try:
        sm, rt, s3, cw = (server.client("sagemaker"), server.client("sagemaker-runtime", read_timeout=70),
                          server.client("s3"), server.client("cloudwatch"))
        s3.create_bucket(Bucket="mme-bench")
        for i in range(args.models):
            s3.put_object(Bucket="mme-bench", Key="models/m%d.tar.gz" % i, Body=archive("m%d" % i, args.ballast_mb))
        name = "mme-bench"
        sm.create_model(ModelName=name, ExecutionRoleArn=ROLE, PrimaryContainer={
            "Image": IMAGE, "Mode": "MultiModel", "ModelDataUrl": "s3://mme-bench/models/",
            "Environment": {"SAGEMAKER_PROGRAM": "mme_inference.py",
                            "KILN_MODEL_SERVER_MEMORY_LIMIT_MB": str(args.limit_mb)}})
        sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
            "VariantName": "AllTraffic", "ModelName": name, "InstanceType": "ml.m5.large",
            "InitialInstanceCount": 1}])
        sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
        deadline = time.monotonic() + 120
        while sm.describe_endpoint(EndpointName=name)["EndpointStatus"] != "InService":
            if time.monotonic() > deadline:
                raise SystemExit("endpoint not InService:\n" + server.log_tail(40))
            time.sleep(0.2)
        cold, warm = [], []
        for i in range(args.models):
            cold.append(timed(rt, name, "m%d.tar.gz" % i))
            warm.extend(timed(rt, name, "m%d.tar.gz" % i) for _ in range(3))
        swap = []
        for _ in range(args.rounds):
            for i in range(3):
                swap.append(timed(rt, name, "m%d.tar.gz" % i))
        time.sleep(2)  # the metrics flush once a second
        print("multi-model endpoint, %d models of %d MB, container memory limit %d MB (2 vCPU VM)" %
              (args.models, args.ballast_mb, args.limit_mb))
        print("  cold (download + load + invoke): median %.1f ms  (min %.1f, max %.1f)" %
              (statistics.median(cold), min(cold), max(cold)))
        print("  warm (loaded):                   median %.1f ms  (min %.1f, max %.1f)" %
              (statistics.median(warm), min(warm), max(warm)))
        print("  LRU swap (unload + load + invoke): median %.1f ms  (min %.1f, max %.1f)" %
              (statistics.median(swap), min(swap), max(swap)))
        for metric in ("ModelDownloadingTime", "ModelLoadingTime", "ModelUnloadingTime", "ModelLoadingWaitTime"):
            print("  %-22s %s" % (metric, stats(cw, name, metric)))
        sm.delete_endpoint(EndpointName=name)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                sm.describe_endpoint(EndpointName=name)
                time.sleep(0.2)
            except Exception:  # noqa: BLE001
                break
    finally:
        server.stop()


if __name__ == "__main__":
    main()
