#!/usr/bin/python3
"""Batch transform (issue 20; serving-contract.md §13): records per second of a transform job against
invoking the same model directly.

  /usr/bin/python3 bench/transform_bench.py [--records 200000] [--objects 4] [--single 3000]

Starts `kiln server` ($KILN_BIN, default build/src/cli/kiln) and uses the batch-transform test program
(tests/integration/endpoints/transform_app.py, a `local:` image that answers one CSV line per input
line). Workloads, each measured on the same model:

  transform-multi   --records CSV lines (~100 bytes) in --objects objects, one instance, SplitType Line,
                    MultiRecord, MaxPayloadInMB 1, MaxConcurrentTransforms 1 and 4: records / s from
                    CreateTransformJob to Completed (instance start, listing, reads, requests, joins
                    none, output writes), and from the first request to the last data-log line
                    (the transform proper).
  invoke-multi      the same lines as 1 MB InvokeEndpoint bodies (what the job sends) to a
                    one-instance endpoint, 1 and 4 client threads (boto3, one client per thread).
  transform-single  --single lines, SingleRecord (one record per request), MaxConcurrentTransforms 4.
  invoke-single     the same lines one InvokeEndpoint each, 4 threads.
"""

import argparse
import concurrent.futures
import datetime
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "integration")
sys.path.insert(0, TESTS)
import kiln_harness as kh  # noqa: E402

IMAGE = "local:" + os.path.abspath(os.path.join(TESTS, "endpoints", "transform_app.py"))
ROLE = "arn:aws:iam::000000000000:role/bench"
BUCKET = "transform-bench"


def wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit("timed out waiting for " + what)


PAD = "x" * 80  # a column the model skips: ~100-byte lines, several 1 MB requests per object


def lines_of(n):
    return ["%d,%d,%d,%d,%s" % (i, i % 97, i % 13, 7, PAD) for i in range(n)]


def put_objects(s3, prefix, lines, objects):
    per = (len(lines) + objects - 1) // objects
    for k in range(objects):
        chunk = lines[k * per:(k + 1) * per]
        s3.put_object(Bucket=BUCKET, Key="%s/part-%03d.csv" % (prefix, k), Body=("\n".join(chunk) + "\n").encode())


def run_job(sm, logs, name, prefix, strategy, concurrency):
    t0 = time.monotonic()
    sm.create_transform_job(
        TransformJobName=name, ModelName="bench-model", BatchStrategy=strategy, MaxPayloadInMB=1,
        MaxConcurrentTransforms=concurrency,
        TransformInput={"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix",
                                                        "S3Uri": "s3://%s/%s/" % (BUCKET, prefix)}},
                        "ContentType": "text/csv", "SplitType": "Line"},
        TransformOutput={"S3OutputPath": "s3://%s/out/%s" % (BUCKET, name), "AssembleWith": "Line"},
        TransformResources={"InstanceType": "ml.m5.large", "InstanceCount": 1})
    d = wait(lambda: (lambda d: d if d["TransformJobStatus"] in ("Completed", "Failed") else None)(
        sm.describe_transform_job(TransformJobName=name)), 600, name)
    total = time.monotonic() - t0
    if d["TransformJobStatus"] != "Completed":
        raise SystemExit("%s failed: %s" % (name, d.get("FailureReason")))
    # The transform proper: from the first request the container logged to the last data-log line.
    events = []
    kwargs = {"logGroupName": "/aws/sagemaker/TransformJobs", "logStreamNamePrefix": name + "/"}
    while True:
        page = logs.filter_log_events(**kwargs)
        events += page["events"]
        if not page.get("nextToken"):
            break
        kwargs["nextToken"] = page["nextToken"]
    first = min(e["timestamp"] for e in events if e["message"].startswith("request records="))
    last = max(e["timestamp"] for e in events if e["logStreamName"].endswith("/data-log"))
    return total, max(1, last - first) / 1000.0


def invoke_all(server, endpoint, bodies, threads):
    def worker(chunk):
        rt = server.client("sagemaker-runtime", read_timeout=70)
        for body in chunk:
            r = rt.invoke_endpoint(EndpointName=endpoint, Body=body, ContentType="text/csv")
            r["Body"].read()
    chunks = [bodies[i::threads] for i in range(threads)]
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(worker, chunks))
    return time.monotonic() - t0


def mb_bodies(lines, limit=1 << 20):
    bodies, current = [], b""
    for line in lines:
        piece = line.encode() + b"\n"
        if current and len(current) + len(piece) > limit:
            bodies.append(current)
            current = b""
        current += piece
    if current:
        bodies.append(current)
    return bodies


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200000)
    parser.add_argument("--objects", type=int, default=4)
    parser.add_argument("--single", type=int, default=3000)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln-transform-bench-")
    config = {"scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
              "endpoints": {"stop_grace_seconds": 5, "health_interval_seconds": 0.5}}
    server = kh.KilnServer(os.path.join(tmp, "data"), config=config)
    server.start()
    try:
        sm, s3, logs = server.client("sagemaker"), server.client("s3"), server.client("logs")
        s3.create_bucket(Bucket=BUCKET)
        sm.create_model(ModelName="bench-model", PrimaryContainer={"Image": IMAGE}, ExecutionRoleArn=ROLE)
        many, few = lines_of(args.records), lines_of(args.single)
        put_objects(s3, "multi", many, args.objects)
        put_objects(s3, "single", few, 1)
        sm.create_endpoint_config(EndpointConfigName="bench-cfg", ProductionVariants=[{
            "VariantName": "AllTraffic", "ModelName": "bench-model", "InitialInstanceCount": 1,
            "InstanceType": "ml.m5.large"}])
        sm.create_endpoint(EndpointName="bench-ep", EndpointConfigName="bench-cfg")
        wait(lambda: sm.describe_endpoint(EndpointName="bench-ep")["EndpointStatus"] == "InService", 60, "InService")
        print("%s  %d records in %d objects (MultiRecord, 1 MB), %d records SingleRecord" % (
            datetime.datetime.now().isoformat(timespec="seconds"), args.records, args.objects, args.single))
        rows = []
        for c in (1, 4):
            total, proper = run_job(sm, logs, "multi-c%d" % c, "multi", "MultiRecord", c)
            rows.append(("transform-multi c=%d" % c, args.records / total, args.records / proper))
        bodies = mb_bodies(many)
        for t in (1, 4):
            took = invoke_all(server, "bench-ep", bodies, t)
            rows.append(("invoke-multi t=%d (%d bodies)" % (t, len(bodies)), args.records / took, None))
        total, proper = run_job(sm, logs, "single-c4", "single", "SingleRecord", 4)
        rows.append(("transform-single c=4", args.single / total, args.single / proper))
        took = invoke_all(server, "bench-ep", [line.encode() + b"\n" for line in few], 4)
        rows.append(("invoke-single t=4", args.single / took, None))
        print("  %-34s %14s %16s" % ("workload", "records/s", "records/s proper"))
        for label, total_rate, proper_rate in rows:
            print("  %-34s %14.0f %16s" % (label, total_rate, "%.0f" % proper_rate if proper_rate else "-"))
    finally:
        try:
            sm = server.client("sagemaker")
            sm.delete_endpoint(EndpointName="bench-ep")
            wait(lambda: not sm.list_endpoints()["Endpoints"], 60, "the endpoint deleted")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
