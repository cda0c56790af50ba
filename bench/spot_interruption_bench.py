#!/usr/bin/python3
"""Managed spot training (issue 18): how much time one interruption costs a job.

  /usr/bin/python3 bench/spot_interruption_bench.py [--interruptions 5] [--restart-delay 0]

Starts `kiln server` ($KILN_BIN, default build/src/cli/kiln) with a temp data dir and runs one
managed spot job: tests/integration/jobs/spot_checkpoint/train.py in script mode (the PyTorch
image on the host's interpreter; a small torch model, checkpointed into /opt/ml/checkpoints after
every epoch and on SIGTERM, resumed from there at start). Then, --interruptions times: once the
current attempt has printed an epoch line, `kiln interrupt <job>` (the reclaim; t0 = just before
the CLI starts) and, measured from t0:

  program saved    the timestamp of the program's "SIGTERM, checkpoint saved" line (it finishes the
                   step in progress, then writes the checkpoint; exits right after)
  Interrupted      the `Interrupted` transition's StartTime (recorded once the program exited and
                   the final checkpoint sync is done)
  Training again   the next `Training` transition's StartTime (restart delay, queueing, Starting,
                   Downloading with the checkpoint restored, the program started)
  first line       the timestamp of the program's first log event after the resume
                   ("spot_checkpoint: process started", printed before torch is imported)
  resumed          the timestamp of "spot_checkpoint: resumed from ..." (torch imported and the
                   checkpoint loaded: training goes on from here)

Timestamps are the server's (Describe's transitions, the log events'), t0 the client's clock on
the same machine. Printed per interruption and as median / min / max; the job is stopped at the
end. `--restart-delay` sets spot.restart_delay_seconds (default 0: what the platform itself adds).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "integration")
sys.path.insert(0, TESTS)
import kiln_harness as kh  # noqa: E402

ROLE = "arn:aws:iam::000000000000:role/bench"
TRAIN = os.path.abspath(os.path.join(TESTS, "jobs", "spot_checkpoint", "train.py"))
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.1-cpu-py310"
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
FIRST_LINE = "spot_checkpoint: process started"
RESUMED = "spot_checkpoint: resumed from"
SAVED = "spot_checkpoint: SIGTERM, checkpoint saved"


def config(restart_delay):
    return {"scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
            "training": {"stop_grace_seconds": 10},
            "spot": {"restart_delay_seconds": restart_delay}}


def tar_gz(name, data):
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def request(name, bucket, epochs):
    return {
        "TrainingJobName": name,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "RoleArn": ROLE,
        "HyperParameters": {"epochs": str(epochs), "seed": "7", "step-seconds": "0.06",
                            "sagemaker_program": json.dumps("train.py"),
                            "sagemaker_submit_directory": json.dumps("s3://%s/code/sourcedir.tar.gz" % bucket)},
        "OutputDataConfig": {"S3OutputPath": "s3://%s/output" % bucket},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200},
        "EnableManagedSpotTraining": True,
        "CheckpointConfig": {"S3Uri": "s3://%s/checkpoints/%s" % (bucket, name)},
    }


def events(logs, job):
    """(timestamp seconds, message) of every event of the job's streams, in stream-name order."""
    from botocore.exceptions import ClientError
    out, names, token = [], [], None
    while True:
        kwargs = dict(logGroupName=LOG_GROUP, logStreamNamePrefix=job + "/")
        if token:
            kwargs["nextToken"] = token
        try:
            page = logs.describe_log_streams(**kwargs)
        except ClientError as e:
            if e.response["Error"]["Code"] == "ResourceNotFoundException":
                return []  # no line written yet
            raise
        names += [x["logStreamName"] for x in page["logStreams"]]
        token = page.get("nextToken")
        if not token:
            break
    for s in sorted(names):
        token = None
        while True:
            kwargs = dict(logGroupName=LOG_GROUP, logStreamName=s, startFromHead=True)
            if token:
                kwargs["nextToken"] = token
            r = logs.get_log_events(**kwargs)
            if not r["events"]:
                break
            out += [(e["timestamp"] / 1000.0, e["message"]) for e in r["events"]]
            token = r["nextForwardToken"]
    return out


def wait_for(what, predicate, timeout=120, poll=0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError("timed out after %ss waiting for %s" % (timeout, what))
        time.sleep(poll)


def summary(values):
    return "median %7.3f s   min %7.3f s   max %7.3f s" % (statistics.median(values), min(values), max(values))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interruptions", type=int, default=5)
    ap.add_argument("--restart-delay", type=float, default=0, help="spot.restart_delay_seconds")
    ap.add_argument("--keep", action="store_true", help="keep the data dir")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="kiln-spot-bench-")
    server = kh.KilnServer(os.path.join(work, "data"), config=config(args.restart_delay), log_level="info")
    server.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"HOME": work, "AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key,
                "AWS_DEFAULT_REGION": "us-east-1"})
    name = None
    try:
        sm, s3, logs = server.client("sagemaker"), server.client("s3"), server.client("logs")
        bucket = "spot-bench-" + uuid.uuid4().hex[:8]
        s3.create_bucket(Bucket=bucket)
        with open(TRAIN, "rb") as f:
            s3.put_object(Bucket=bucket, Key="code/sourcedir.tar.gz", Body=tar_gz("train.py", f.read()))
        name = "spot-bench-" + uuid.uuid4().hex[:8]
        sm.create_training_job(**request(name, bucket, epochs=100 + 20 * args.interruptions))

        def describe():
            return sm.describe_training_job(TrainingJobName=name)

        def count(d, status):
            return sum(1 for t in d["SecondaryStatusTransitions"] if t["Status"] == status)

        rows = []
        for i in range(args.interruptions):
            # Mid-training: this attempt (the i-th resume, or the first start) printed an epoch line.
            def trained():
                lines = [m for _, m in events(logs, name)]
                starts = [k for k, m in enumerate(lines) if m.startswith(FIRST_LINE)]
                return len(starts) == i + 1 and any(m.startswith("epoch=") for m in lines[starts[-1]:])
            wait_for("an epoch line of attempt %d" % i, trained, poll=0.2)
            d = describe()
            if d["TrainingJobStatus"] != "InProgress" or d["SecondaryStatus"] != "Training":
                raise RuntimeError("job %s is %s/%s" % (name, d["TrainingJobStatus"], d["SecondaryStatus"]))
            t0 = time.time()
            p = subprocess.run([kh.kiln_bin(), "interrupt", "--endpoint-url", server.endpoint, name], env=env,
                               capture_output=True, text=True, timeout=60)
            cli = time.time() - t0
            if p.returncode != 0:
                raise RuntimeError("kiln interrupt exited %d: %s" % (p.returncode, p.stderr.strip()))

            def back_in_training():
                d = describe()
                if d["TrainingJobStatus"] != "InProgress":
                    raise RuntimeError("job %s ended %s: %s" % (name, d["TrainingJobStatus"], d.get("FailureReason")))
                return d if count(d, "Interrupted") == i + 1 and d["SecondaryStatus"] == "Training" else None
            d = wait_for("Training after interruption %d" % (i + 1), back_in_training)
            tr = d["SecondaryStatusTransitions"]
            interrupted = [t for t in tr if t["Status"] == "Interrupted"][-1]["StartTime"].timestamp()
            training = [t for t in tr if t["Status"] == "Training"][-1]["StartTime"].timestamp()

            def resumed_events():
                evs = events(logs, name)
                saves = [ts for ts, m in evs if m.startswith(SAVED)]
                firsts = [ts for ts, m in evs if m.startswith(FIRST_LINE)]
                resumes = [ts for ts, m in evs if m.startswith(RESUMED)]
                if len(saves) >= i + 1 and len(firsts) >= i + 2 and len(resumes) >= i + 1:
                    return saves[i], firsts[i + 1], resumes[i]
                return None
            saved, first, resumed = wait_for("the resume's log lines", resumed_events, poll=0.1)
            row = {"cli": cli, "saved": saved - t0, "interrupted": interrupted - t0, "training": training - t0,
                   "first_line": first - t0, "resumed": resumed - t0}
            rows.append(row)
            print("interruption %d: kiln interrupt %.3f s, program saved +%.3f s, Interrupted +%.3f s, Training +%.3f s, "
                  "first line +%.3f s, resumed +%.3f s" % (i + 1, row["cli"], row["saved"], row["interrupted"],
                                                          row["training"], row["first_line"], row["resumed"]),
                  flush=True)

        print("\nTime lost per interruption, %d interruptions of one spot job (%s), spot.restart_delay_seconds %g, "
              "from the reclaim (`kiln interrupt` called):" % (len(rows), name, args.restart_delay))
        for key, label in (("cli", "`kiln interrupt` returns       "),
                           ("saved", "-> program's SIGTERM save line "),
                           ("interrupted", "-> Interrupted                 "),
                           ("training", "-> Training again              "),
                           ("first_line", "-> program's first line        "),
                           ("resumed", "-> \"resumed from\" (torch, ckpt)")):
            print("  %s %s" % (label, summary([r[key] for r in rows])))
    finally:
        if name:
            try:
                sm = server.client("sagemaker")
                sm.stop_training_job(TrainingJobName=name)
                d = wait_for("the job to stop", lambda: (lambda d: d if d["TrainingJobStatus"] in (
                    "Stopped", "Completed", "Failed") else None)(sm.describe_training_job(TrainingJobName=name)),
                    timeout=60)
                print("  stopped: BillableTimeInSeconds %s, TrainingTimeInSeconds %s" % (
                    d.get("BillableTimeInSeconds"), d.get("TrainingTimeInSeconds")))
            except Exception as e:  # noqa: BLE001 (report and go on to stop the server)
                print("stopping %s: %s" % (name, e))
        rc = server.stop(timeout=60)
        if rc != 0:
            print("kiln server exited %s; log tail:\n%s" % (rc, server.log_tail()))
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("data dir kept: %s" % work)


if __name__ == "__main__":
    main()
