#!/usr/bin/python3
"""Server memory under concurrent maximum-size API requests (the hardening issue's measure).

  /usr/bin/python3 bench/request_memory_bench.py [--concurrency 16] [--rounds 3] [--mib 16]

Starts `kiln server` on a free loopback port with a fresh data dir, then for each request shape
sends --rounds rounds of --concurrency concurrent signed requests whose bodies are --mib MiB (the
front door's JSON-protocol limit is 16 MiB), and prints the server's RSS before, its peak
(VmHWM, reset between shapes through /proc/<pid>/clear_refs) and its RSS after each shape:

  one-string    CreateTrainingJob whose TrainingJobName is one huge string: the validation error
                used to quote it whole, twice (a 42 MB answer for 10 MB)
  many-values   ListTrainingJobs with an unknown member holding [0,0,0,...]: the DOM used to be
                ~20x the text; now refused after 200,000 values
  deep          nested objects: refused at depth 64 (used to crash the server)
  log-events    a legal PutLogEvents-like body of 10,000 events of ~1.6 KB (1 MiB batches are the
                AWS limit; the body is padded with an unknown member up to --mib)

Every answer's status is checked (400 for the refused shapes, a few expected codes otherwise).
$KILN_BIN selects the binary (default build/src/cli/kiln).
"""

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))

import kiln_harness as kh  # noqa: E402


def status_kib(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak(pid):
    try:
        with open("/proc/%d/clear_refs" % pid, "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass


def bodies(mib):
    size = mib * 1024 * 1024 - 4096
    yield "one-string", "SageMaker.CreateTrainingJob", "sagemaker", json.dumps({
        "TrainingJobName": "n" * size, "RoleArn": "arn:aws:iam::000000000000:role/x",
        "AlgorithmSpecification": {"TrainingImage": "x", "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://b/o"},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 60}}).encode(), (400,)
    n = size // 2
    yield "many-values", "SageMaker.ListTrainingJobs", "sagemaker", \
        ('{"Unknown": [' + ",".join(["0"] * n) + "]}").encode(), (400,)
    depth = size // 6
    yield "deep", "SageMaker.ListTrainingJobs", "sagemaker", \
        ('{"Unknown": ' + '{"a":' * depth + "1" + "}" * depth + "}").encode(), (400,)
    events = [{"timestamp": int(time.time() * 1000), "message": "m" * 1600} for _ in range(10000)]
    body = {"logGroupName": "bench", "logStreamName": "s", "logEvents": events}
    text = json.dumps(body)
    body["Padding"] = "p" * max(0, size - len(text))
    yield "log-events", "Logs_20140328.PutLogEvents", "logs", json.dumps(body).encode(), (200, 400)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=16)
    args = parser.parse_args()

    data = tempfile.mkdtemp(prefix="kiln-reqmem-")
    server = kh.KilnServer(os.path.join(data, "data"))
    server.start()
    pid = server.proc.pid
    logs = server.client("logs")
    logs.create_log_group(logGroupName="bench")
    logs.create_log_stream(logGroupName="bench", logStreamName="s")
    print("%-12s %10s %10s %10s %10s %8s" % ("shape", "body MiB", "RSS before", "peak", "RSS after", "seconds"))
    try:
        for name, target, service, body, expected in bodies(args.mib):
            time.sleep(1)
            before = status_kib(pid, "VmRSS")
            reset_peak(pid)
            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                for _ in range(args.rounds):
                    futures = [pool.submit(kh.json_request, server, target, None, service, None, None, body)
                               for _ in range(args.concurrency)]
                    for f in futures:
                        status, _, answer = f.result()
                        if status not in expected:
                            raise SystemExit("%s: unexpected %s %s" % (name, status, answer[:200]))
            elapsed = time.monotonic() - started
            time.sleep(2)
            print("%-12s %10.1f %8.0f MB %8.0f MB %8.0f MB %8.1f" % (
                name, len(body) / 1048576, before / 1024, status_kib(pid, "VmHWM") / 1024,
                status_kib(pid, "VmRSS") / 1024, elapsed))
            sys.stdout.flush()
        print("server alive: %s" % server.healthy())
    finally:
        server.stop()


if __name__ == "__main__":
    main()
