#!/usr/bin/python3
"""Hyperparameter tuning (issue 17): what the tuning controller adds around its trials.

  /usr/bin/python3 bench/tuning_overhead_bench.py [--trials 10] [--small-trials 6] [--small-parallel 2]

Starts `kiln server` ($KILN_BIN, default build/src/cli/kiln) with a temp data dir, ml.m5.large
declared 1 vCPU (two trials at once on a 2-core host). Every trial runs
tests/integration/data/tuning/src/objective.py as a `local:` image (Branin, printed per epoch).

Gap: a Random tuning job with MaxParallelTrainingJobs 1 and --trials trials of one 0-second epoch.
With one trial at a time, the next trial is created only once the controller has seen the previous
one end, so per consecutive pair the gap is the next trial's CreationTime minus the previous one's
TrainingEndTime (both from DescribeTrainingJob, millisecond precision): the time from a trial's
program ending to the controller's noticing it (its reconcile pass: woken by the training job's
end, else at most its tick apart), reading the metric, asking the strategy and creating the next
training job. Printed: median, min, max; next to it the trials' own CreationTime →
TrainingEndTime (what a trial costs by itself).

Small job: a Random tuning job of --small-trials trials (3 epochs of 0.1 s), --small-parallel at a
time: wall time from CreateHyperParameterTuningJob's answer until Describe says Completed (polled
every 50 ms), HyperParameterTuningEndTime − CreationTime, and the sum of the trials' own times
divided by the parallelism (the floor a controller with no overhead would reach).
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "integration")
sys.path.insert(0, TESTS)
import kiln_harness as kh  # noqa: E402

ROLE = "arn:aws:iam::000000000000:role/bench"
OBJECTIVE = os.path.abspath(os.path.join(TESTS, "data", "tuning", "src", "objective.py"))
CONFIG = {
    "scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
    "instance_types": [{"type": "ml.m5.large", "vcpus": 1}],
}


def request(name, bucket, trials, parallel, epochs, epoch_seconds):
    return {
        "HyperParameterTuningJobName": name,
        "HyperParameterTuningJobConfig": {
            "Strategy": "Random",
            "HyperParameterTuningJobObjective": {"Type": "Minimize", "MetricName": "objective"},
            "ResourceLimits": {"MaxNumberOfTrainingJobs": trials, "MaxParallelTrainingJobs": parallel},
            "ParameterRanges": {"ContinuousParameterRanges": [
                {"Name": "x1", "MinValue": "-5", "MaxValue": "10"},
                {"Name": "x2", "MinValue": "0", "MaxValue": "15"}]},
        },
        "TrainingJobDefinition": {
            "AlgorithmSpecification": {"TrainingImage": "local:" + OBJECTIVE, "TrainingInputMode": "File",
                                       "MetricDefinitions": [{"Name": "objective",
                                                              "Regex": "objective=([0-9.]+)"}]},
            "RoleArn": ROLE,
            "OutputDataConfig": {"S3OutputPath": "s3://%s/output" % bucket},
            "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
            "StoppingCondition": {"MaxRuntimeInSeconds": 300},
            "StaticHyperParameters": {"epochs": str(epochs), "epoch_seconds": str(epoch_seconds)},
        },
    }


def run_job(sm, req, timeout=600):
    """Creates the job, polls until it ends; returns (wall seconds, Describe, trials' Describes by
    sequence)."""
    name = req["HyperParameterTuningJobName"]
    t0 = time.monotonic()
    sm.create_hyper_parameter_tuning_job(**req)
    deadline = t0 + timeout
    while True:
        d = sm.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
        if d["HyperParameterTuningJobStatus"] in ("Completed", "Failed", "Stopped"):
            wall = time.monotonic() - t0
            break
        if time.monotonic() > deadline:
            raise RuntimeError("tuning job %s still %s after %ss" % (name, d["HyperParameterTuningJobStatus"], timeout))
        time.sleep(0.05)
    if d["HyperParameterTuningJobStatus"] != "Completed":
        raise RuntimeError("tuning job %s ended %s: %s" % (name, d["HyperParameterTuningJobStatus"],
                                                         d.get("FailureReason")))
    names, token = [], None
    while True:
        args = {"HyperParameterTuningJobName": name, "MaxResults": 100}
        if token:
            args["NextToken"] = token
        page = sm.list_training_jobs_for_hyper_parameter_tuning_job(**args)
        names += [t["TrainingJobName"] for t in page["TrainingJobSummaries"]]
        token = page.get("NextToken")
        if not token:
            break
    jobs = [sm.describe_training_job(TrainingJobName=n) for n in sorted(names)]
    return wall, d, jobs


def seconds(a, b):
    return (b - a).total_seconds()


def summary(values):
    return "median %7.3f s   min %7.3f s   max %7.3f s   (n=%d)" % (
        statistics.median(values), min(values), max(values), len(values))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10, help="trials of the MaxParallel 1 job")
    ap.add_argument("--small-trials", type=int, default=6)
    ap.add_argument("--small-parallel", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the data dir")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="kiln-tuning-bench-")
    server = kh.KilnServer(os.path.join(work, "data"), config=CONFIG, log_level="info")
    server.start()
    try:
        sm = server.client("sagemaker")
        s3 = server.client("s3")
        bucket = "tuning-bench-" + uuid.uuid4().hex[:8]
        s3.create_bucket(Bucket=bucket)

        name = "gap-" + uuid.uuid4().hex[:8]
        wall, d, jobs = run_job(sm, request(name, bucket, args.trials, 1, epochs=1, epoch_seconds=0))
        gaps = [seconds(prev["TrainingEndTime"], nxt["CreationTime"]) for prev, nxt in zip(jobs, jobs[1:])]
        own = [seconds(j["CreationTime"], j["TrainingEndTime"]) for j in jobs]
        print("Gap between trials, MaxParallelTrainingJobs 1, %d trials of one 0 s epoch (%s):" % (len(jobs), name))
        print("  previous TrainingEndTime -> next CreationTime  %s" % summary(gaps))
        print("  a trial's CreationTime -> TrainingEndTime      %s" % summary(own))
        print("  tuning job wall time %.2f s" % wall)

        name = "small-" + uuid.uuid4().hex[:8]
        wall, d, jobs = run_job(sm, request(name, bucket, args.small_trials, args.small_parallel,
                                            epochs=3, epoch_seconds=0.1))
        own = [seconds(j["CreationTime"], j["TrainingEndTime"]) for j in jobs]
        floor = sum(own) / args.small_parallel
        print("Small tuning job: %d trials, %d at a time, 3 epochs of 0.1 s (%s):" % (
            len(jobs), args.small_parallel, name))
        print("  wall time (create -> Describe says Completed)     %.2f s" % wall)
        print("  HyperParameterTuningEndTime - CreationTime        %.2f s" % seconds(
            d["CreationTime"], d["HyperParameterTuningEndTime"]))
        print("  sum of trials' own times / parallelism (floor)    %.2f s" % floor)
        print("  a trial's CreationTime -> TrainingEndTime          %s" % summary(own))
    finally:
        rc = server.stop(timeout=60)
        if rc != 0:
            print("kiln server exited %s; log tail:\n%s" % (rc, server.log_tail()))
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("data dir kept: %s" % work)


if __name__ == "__main__":
    main()
