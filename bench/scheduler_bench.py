#!/usr/bin/python3
"""Scheduler bench: how fast does Kiln drain a long queue of training jobs that exit at once, and
does the rate stay flat as the queue shrinks (it must not depend on the queue's length)?

  KILN_BIN=build/src/cli/kiln /usr/bin/python3 bench/scheduler_bench.py [--jobs 2000] [--slots 2]
                                                                         [--max-drain-seconds 900]

Starts `kiln server` ($KILN_BIN, default build/src/cli/kiln) with a temp data dir under --dir and a
scheduler sized for --slots jobs at once (strict shapes; ml.m5.large redefined as 1 vCPU / 1 GiB;
the host's CPUs bound --slots, since CPUs are granted by index).

1. A blocker job (ml.m5.xlarge, redefined as all --slots vCPUs) runs `sleep`, so nothing else fits.
2. --jobs CreateTrainingJob calls, one client, each a `local:/bin/true` job (`/bin/true train`
   exits 0 at once): all of them queue behind the blocker. Their latency (p50/p99/max) is
   CreateTrainingJob's with a queue growing from 0 to --jobs.
3. StopTrainingJob on the blocker: the queue drains. The client waits for the last job (FIFO: it
   ends last), then reads every job's TrainingEndTime and reports jobs/s over the whole drain
   and for each tenth of it, in completion order (flat = independent of the queue's length).
   With --max-drain-seconds the drain is cut short and what completed is reported.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import kiln_harness as kh  # noqa: E402

ROLE = "arn:aws:iam::000000000000:role/bench"
TERMINAL = ("Completed", "Failed", "Stopped")


def job_request(name, image, bucket, instance_type="ml.m5.large"):
    return {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {"TrainingImage": image, "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://%s/output" % bucket},
        "ResourceConfig": {"InstanceType": instance_type, "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }


def pct(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def wait_status(sm, name, statuses, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        d = sm.describe_training_job(TrainingJobName=name)
        if d["TrainingJobStatus"] in statuses or d["SecondaryStatus"] in statuses:
            return d
        time.sleep(0.2)
    raise RuntimeError("%s did not reach %s in %ds" % (name, statuses, timeout))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--slots", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--max-drain-seconds", type=float, default=1800)
    ap.add_argument("--dir", default=None, help="where the data dir goes (default $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep the data dir")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="kiln-sched-bench-", dir=args.dir)
    blocker_prog = os.path.join(work, "blocker.sh")
    with open(blocker_prog, "w") as f:
        f.write("#!/bin/sh\nexec sleep 100000\n")
    os.chmod(blocker_prog, 0o755)
    config = {
        "scheduler": {"policy": "strict", "allow_cpu_fallback": True, "cpus": args.slots,
                      "memory_gib": args.slots, "reserved_cpus": 0, "reserved_memory_gib": 0},
        "instance_types": {"instance_types": [
            {"type": "ml.m5.large", "vcpus": 1, "memory_gib": 1},
            {"type": "ml.m5.xlarge", "vcpus": args.slots, "memory_gib": args.slots}]},
        "training": {"stop_grace_seconds": 5},
    }
    server = kh.KilnServer(os.path.join(work, "data"), config=config, log_level="warn")
    server.start()
    try:
        sm = server.client("sagemaker")
        s3 = server.client("s3")
        bucket = "sched-bench"
        s3.create_bucket(Bucket=bucket)

        blocker = "sched-blocker"
        sm.create_training_job(**job_request(blocker, "local:" + blocker_prog, bucket, "ml.m5.xlarge"))
        wait_status(sm, blocker, ["Training"], 60)

        names = ["sched-%06d" % i for i in range(args.jobs)]
        create_ms = []
        t_create = time.time()
        for name in names:
            t0 = time.perf_counter()
            sm.create_training_job(**job_request(name, "local:/bin/true", bucket))
            create_ms.append((time.perf_counter() - t0) * 1000.0)
        create_s = time.time() - t_create
        pending = sm.describe_training_job(TrainingJobName=names[-1])
        print("created %d jobs in %.1f s; CreateTrainingJob ms p50 %.1f  p99 %.1f  max %.1f"
              % (args.jobs, create_s, pct(create_ms, 50), pct(create_ms, 99), max(create_ms)))
        print("last job: %s / %s: %r" % (pending["TrainingJobStatus"], pending["SecondaryStatus"],
                                          pending["SecondaryStatusTransitions"][-1].get("StatusMessage")))

        sm.stop_training_job(TrainingJobName=blocker)
        d = wait_status(sm, blocker, TERMINAL, 60)
        drain_start = d["TrainingEndTime"].timestamp()
        deadline = time.time() + args.max_drain_seconds
        cut = False
        while True:
            d = sm.describe_training_job(TrainingJobName=names[-1])
            if d["TrainingJobStatus"] in TERMINAL:
                break
            if time.time() > deadline:
                cut = True
                break
            time.sleep(0.5)

        ends, statuses = [], {}
        for name in names:
            d = sm.describe_training_job(TrainingJobName=name)
            statuses[d["TrainingJobStatus"]] = statuses.get(d["TrainingJobStatus"], 0) + 1
            if d["TrainingJobStatus"] in TERMINAL and d.get("TrainingEndTime"):
                ends.append(d["TrainingEndTime"].timestamp())
        ends.sort()
        print("statuses: %s%s" % (statuses, "  (drain cut at --max-drain-seconds)" if cut else ""))
        if not ends:
            print("nothing completed")
            return 1
        total = ends[-1] - drain_start
        print("drained %d jobs in %.1f s: %.2f jobs/s (slots %d, %d CPUs)"
              % (len(ends), total, len(ends) / total if total > 0 else float("inf"), args.slots, os.cpu_count()))
        tenth = max(1, args.jobs // 10)
        prev_t, rates = drain_start, []
        print("per %d completions (queue length at the start of each slice -> jobs/s):" % tenth)
        for i in range(tenth, len(ends) + 1, tenth):
            t = ends[i - 1]
            rate = tenth / (t - prev_t) if t > prev_t else float("inf")
            rates.append(rate)
            print("  queue %6d  %.2f jobs/s" % (args.jobs - i + tenth, rate))
            prev_t = t
        if len(rates) >= 2:
            print("first/last slice rate ratio: %.2f (1.00 = flat); median slice %.2f jobs/s"
                  % (rates[0] / rates[-1], statistics.median(rates)))
        return 0
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
