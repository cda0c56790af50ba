#!/usr/bin/python3
"""Training-job benchmarks: how long from CreateTrainingJob's answer to the user program's first
line, next to running the same program bare, and how fast a 1 GiB File-mode channel is staged,
next to `cp` of the same bytes.

  /usr/bin/python3 bench/training_bench.py [--jobs 20] [--channel-mib 1024] [--objects 8]
                                           [--dir /path/on/disk] [--skip-staging]

Starts `kiln server` ($KILN_BIN, default build/src/cli/kiln) with a temp data dir under --dir.

Job start: the program prints `first-line <time.time()>` as its first statement. For each of
--jobs jobs (one at a time, so each measures an idle node), the client records the wall time when
CreateTrainingJob returned, waits for the job to finish, and reads the printed time back through
the Logs API; the difference is the job-start latency. Two kinds of jobs are measured:
  script   a `pytorch-training` image in script mode (Kiln's Python toolkit launches train.py
           from a sourcedir.tar.gz in the object store, like estimator.fit())
  local    a `local:` image: Kiln runs `/path/prog train` directly (bring-your-own container)
The bare reference runs the same program with `python3 prog` from a subprocess spawn (best of the
same count). The job start includes Kiln's own work: scheduling, the /opt/ml tree and config
files, fetching and extracting the code, the sandbox (namespaces) and the shim, and for script
mode the toolkit's interpreter start.

Staging: uploads --channel-mib MiB as --objects objects under one prefix, runs a File-mode job on
that channel, and reads how long the Downloading phase took (SecondaryStatusTransitions: the
Downloading entry's StartTime to Training's StartTime, millisecond precision) next to `cp -r` of
the same bytes from one local directory to another (+ sync).
"""

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import kiln_harness as kh  # noqa: E402

PROGRAM = r'''#!/usr/bin/python3
import time
print("first-line %.6f" % time.time(), flush=True)
import sys
sys.exit(0)
'''

ROLE = "arn:aws:iam::000000000000:role/bench"
PYTORCH_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.1.0-cpu-py310"


def wait_done(sm, name, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        d = sm.describe_training_job(TrainingJobName=name)
        if d["TrainingJobStatus"] in ("Completed", "Failed", "Stopped"):
            return d
        time.sleep(0.05)
    raise RuntimeError("job %s did not finish" % name)


def first_line_time(logs, name):
    streams = logs.describe_log_streams(logGroupName="/aws/sagemaker/TrainingJobs",
                                        logStreamNamePrefix=name + "/")["logStreams"]
    for s in streams:
        events = logs.get_log_events(logGroupName="/aws/sagemaker/TrainingJobs",
                                     logStreamName=s["logStreamName"], startFromHead=True)["events"]
        for e in events:
            if e["message"].startswith("first-line "):
                return float(e["message"].split()[1])
    raise RuntimeError("no first line in the logs of %s" % name)


def bare_start(program_path, runs):
    samples = []
    for _ in range(runs):
        t0 = time.time()
        out = subprocess.run(["/usr/bin/python3", program_path], capture_output=True, text=True, check=True).stdout
        samples.append(float(out.split()[1]) - t0)
    return samples


def job_request(name, image, bucket, hyperparameters=None, channels=None):
    req = {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {"TrainingImage": image, "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://%s/output" % bucket},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
    }
    if hyperparameters:
        req["HyperParameters"] = hyperparameters
    if channels:
        req["InputDataConfig"] = channels
    return req


def measure_job_start(sm, logs, s3, bucket, work, runs):
    program_path = os.path.join(work, "prog.py")
    with open(program_path, "w") as f:
        f.write(PROGRAM)
    os.chmod(program_path, 0o755)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(program_path, arcname="train.py")
    s3.put_object(Bucket=bucket, Key="code/sourcedir.tar.gz", Body=buf.getvalue())

    results = {}
    kinds = {
        "script": lambda n: job_request(n, PYTORCH_IMAGE, bucket, {
            "sagemaker_program": json.dumps("train.py"),
            "sagemaker_submit_directory": json.dumps("s3://%s/code/sourcedir.tar.gz" % bucket)}),
        "local": lambda n: job_request(n, "local:" + program_path, bucket),
    }
    for kind, make in kinds.items():
        samples = []
        for i in range(runs):
            name = "bench-%s-%d-%d" % (kind, int(time.time()), i)
            sm.create_training_job(**make(name))
            answered = time.time()
            d = wait_done(sm, name)
            if d["TrainingJobStatus"] != "Completed":
                raise RuntimeError("%s: %s" % (name, d.get("FailureReason")))
            samples.append(first_line_time(logs, name) - answered)
        results[kind] = samples
    results["bare"] = bare_start(program_path, runs)
    return results


def measure_staging(sm, s3, bucket, work, channel_mib, objects):
    src = os.path.join(work, "channel-src")
    os.makedirs(src)
    size = channel_mib * 1024 * 1024 // objects
    block = os.urandom(1024 * 1024)
    for i in range(objects):
        path = os.path.join(src, "part-%03d" % i)
        with open(path, "wb") as f:
            for _ in range(size // len(block)):
                f.write(block)
        s3.upload_file(path, bucket, "channel/part-%03d" % i)
    # References: cp of the same bytes on the same disk, without and with sync (staging does not
    # fsync the channel files: the job reads them from the page cache, and a crash restarts the
    # staging anyway).
    dst = os.path.join(work, "channel-dst")
    subprocess.run(["sync"], check=True)
    t0 = time.perf_counter()
    subprocess.run(["cp", "-r", src, dst], check=True)
    cp_seconds = time.perf_counter() - t0
    subprocess.run(["sync"], check=True)
    cp_sync_seconds = time.perf_counter() - t0
    shutil.rmtree(dst)
    subprocess.run(["sync"], check=True)

    name = "bench-staging-%d" % int(time.time())
    program = os.path.join(work, "noop.sh")
    with open(program, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(program, 0o755)
    sm.create_training_job(**job_request(name, "local:" + program, bucket, channels=[{
        "ChannelName": "train",
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://%s/channel/" % bucket}}}]))
    d = wait_done(sm, name, timeout=1800)
    if d["TrainingJobStatus"] != "Completed":
        raise RuntimeError("%s: %s" % (name, d.get("FailureReason")))
    transitions = {t["Status"]: t for t in d["SecondaryStatusTransitions"]}
    staged = (transitions["Training"]["StartTime"] - transitions["Downloading"]["StartTime"]).total_seconds()
    return channel_mib * 1024 * 1024, staged, cp_seconds, cp_sync_seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--channel-mib", type=int, default=1024)
    ap.add_argument("--objects", type=int, default=8)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--skip-staging", action="store_true")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="kiln-training-bench-", dir=args.dir)
    server = kh.KilnServer(os.path.join(work, "data"),
                           config={"scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
                                   "training": {"stop_grace_seconds": 5}},
                           log_path=os.path.join(work, "server.log"))
    server.start()
    try:
        sm = server.client("sagemaker")
        logs = server.client("logs")
        s3 = server.client("s3")
        bucket = "bench"
        s3.create_bucket(Bucket=bucket)
        results = measure_job_start(sm, logs, s3, bucket, work, args.jobs)
        print("cpus: %d   jobs per kind: %d" % (os.cpu_count(), args.jobs))
        print("%-34s %10s %10s %10s" % ("job start (answer -> first line)", "median ms", "min ms", "max ms"))
        for kind in ("bare", "local", "script"):
            s = results[kind]
            print("%-34s %10.1f %10.1f %10.1f" % (kind, statistics.median(s) * 1e3, min(s) * 1e3, max(s) * 1e3))
        bare = statistics.median(results["bare"])
        for kind in ("local", "script"):
            print("%-34s %10.1f ms over bare" % (kind + " - bare", (statistics.median(results[kind]) - bare) * 1e3))
        if not args.skip_staging:
            size, staged, cp_seconds, cp_sync_seconds = measure_staging(sm, s3, bucket, work, args.channel_mib,
                                                                        args.objects)
            print("%-34s %8.2f s %9.0f MB/s" % ("staging %d MiB (File mode)" % (size >> 20), staged, size / staged / 1e6))
            print("%-34s %8.2f s %9.0f MB/s" % ("cp -r (reference)", cp_seconds, size / cp_seconds / 1e6))
            print("%-34s %8.2f s %9.0f MB/s" % ("cp -r + sync", cp_sync_seconds, size / cp_sync_seconds / 1e6))
            print("%-34s %8.2f / %.2f" % ("cp time / staging time (no sync/sync)", cp_seconds / staged,
                                          cp_sync_seconds / staged))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
