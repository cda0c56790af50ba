#!/usr/bin/python3
"""Warm pools (issue 18; training-contract.md §19): how much sooner a job starts on a kept pool.

  /usr/bin/python3 bench/warm_pool_bench.py [--pairs 3] [--channel-mib 256] [--objects 64]
                                            [--image script|local]

Starts `kiln server` ($KILN_BIN, default build/src/cli/kiln) with a temp data dir, uploads one
training channel (--channel-mib in --objects objects), then --pairs times:

  cold   a job with KeepAlivePeriodInSeconds 300 and no pool to take (the previous pair's pool was
         ended with UpdateTrainingJob KeepAlivePeriodInSeconds 0): it downloads the channel
  warm   the same job again right after: it takes the cold job's pool (grant, staged input files,
         persistent cache) — then its own pool is ended

and reports, from the server's Describe, each job's start (CreationTime → the Training
transition's StartTime: queueing, Starting, Downloading, the program launched) and its Downloading
time. --image script: the PyTorch image in script mode (tests/integration/jobs/warm_pool/train.py
on the host's interpreter, sourcedir.tar.gz fetched at start); --image local: a `local:` program
(tests/integration/jobs/probe.py, bring-your-own-container style).
"""

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "integration")
sys.path.insert(0, TESTS)
import kiln_harness as kh  # noqa: E402

ROLE = "arn:aws:iam::000000000000:role/bench"
TRAIN = os.path.abspath(os.path.join(TESTS, "jobs", "warm_pool", "train.py"))
PROBE = os.path.abspath(os.path.join(TESTS, "jobs", "probe.py"))
SCRIPT_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.1-cpu-py310"
CONFIG = {"scheduler": {"policy": "shrink", "allow_cpu_fallback": True}, "training": {"stop_grace_seconds": 5}}


def tar_gz(name, data):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def request(name, bucket, image_mode):
    req = {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "OutputDataConfig": {"S3OutputPath": "s3://%s/output" % bucket},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1,
                           "KeepAlivePeriodInSeconds": 300},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        "InputDataConfig": [{"ChannelName": "train", "DataSource": {"S3DataSource": {
            "S3DataType": "S3Prefix", "S3Uri": "s3://%s/data/" % bucket,
            "S3DataDistributionType": "FullyReplicated"}}}],
    }
    if image_mode == "script":
        req["AlgorithmSpecification"] = {"TrainingImage": SCRIPT_IMAGE, "TrainingInputMode": "File"}
        req["HyperParameters"] = {"sagemaker_program": json.dumps("train.py"),
                                  "sagemaker_submit_directory": json.dumps("s3://%s/code/sourcedir.tar.gz" % bucket)}
    else:
        req["AlgorithmSpecification"] = {"TrainingImage": "local:" + PROBE, "TrainingInputMode": "File"}
    return req


def wait_done(sm, name, timeout=600):
    deadline = time.monotonic() + timeout
    while True:
        d = sm.describe_training_job(TrainingJobName=name)
        if d["TrainingJobStatus"] in ("Completed", "Failed", "Stopped"):
            if d["TrainingJobStatus"] != "Completed":
                raise RuntimeError("%s ended %s: %s" % (name, d["TrainingJobStatus"], d.get("FailureReason")))
            return d
        if time.monotonic() > deadline:
            raise RuntimeError("%s did not end in %s s" % (name, timeout))
        time.sleep(0.1)


def timings(d):
    """(create → Training start, Downloading seconds) from the server's own times."""
    tr = d["SecondaryStatusTransitions"]
    training = [t for t in tr if t["Status"] == "Training"][0]["StartTime"]
    downloading = [t for t in tr if t["Status"] == "Downloading"]
    down = (downloading[0]["EndTime"] - downloading[0]["StartTime"]).total_seconds() if downloading else 0.0
    return (training - d["CreationTime"]).total_seconds(), down


def summary(values):
    return "median %7.3f s   min %7.3f s   max %7.3f s" % (statistics.median(values), min(values), max(values))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--channel-mib", type=int, default=256)
    ap.add_argument("--objects", type=int, default=64)
    ap.add_argument("--image", choices=("script", "local"), default="script")
    ap.add_argument("--keep", action="store_true", help="keep the data dir")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="kiln-warm-bench-")
    server = kh.KilnServer(os.path.join(work, "data"), config=CONFIG, log_level="info")
    server.start()
    try:
        sm, s3 = server.client("sagemaker"), server.client("s3")
        bucket = "warm-bench-" + uuid.uuid4().hex[:8]
        s3.create_bucket(Bucket=bucket)
        size = args.channel_mib * 1024 * 1024 // args.objects
        block = os.urandom(size)
        for i in range(args.objects):
            s3.put_object(Bucket=bucket, Key="data/part-%04d.bin" % i, Body=block[i:] + block[:i])
        with open(TRAIN, "rb") as f:
            s3.put_object(Bucket=bucket, Key="code/sourcedir.tar.gz", Body=tar_gz("train.py", f.read()))
        print("channel: %d MiB in %d objects; image: %s" % (args.channel_mib, args.objects, args.image))
        cold, warm, cold_down, warm_down = [], [], [], []
        for i in range(args.pairs):
            names = ["warm-bench-%d-%s-%s" % (i, kind, uuid.uuid4().hex[:6]) for kind in ("cold", "warm")]
            for name, starts, downs in zip(names, (cold, warm), (cold_down, warm_down)):
                sm.create_training_job(**request(name, bucket, args.image))
                d = wait_done(sm, name)
                start, down = timings(d)
                starts.append(start)
                downs.append(down)
            pool = sm.describe_training_job(TrainingJobName=names[0]).get("WarmPoolStatus", {})
            if pool.get("Status") != "Reused" or pool.get("ReusedByJob") != names[1]:
                raise RuntimeError("the warm job did not take the cold job's pool: %s" % pool)
            # The next cold job must not find a pool.
            sm.update_training_job(TrainingJobName=names[1], ResourceConfig={"KeepAlivePeriodInSeconds": 0})
            print("pair %d: cold start %6.3f s (downloading %6.3f s)   warm start %6.3f s (downloading %6.3f s)"
                  % (i + 1, cold[-1], cold_down[-1], warm[-1], warm_down[-1]))
        print()
        print("cold start (create -> Training): %s" % summary(cold))
        print("warm start (create -> Training): %s" % summary(warm))
        print("cold Downloading:                %s" % summary(cold_down))
        print("warm Downloading:                %s" % summary(warm_down))
        print("warm/cold start ratio (medians): %.2f" % (statistics.median(warm) / statistics.median(cold)))
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
