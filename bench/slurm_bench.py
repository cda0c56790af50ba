#!/usr/bin/python3
"""Kiln on Slurm (issue 21): how long a training job takes to start through Slurm next to the
process runtime, and how fast 500 queued jobs are submitted and drained.

  /usr/bin/python3 bench/slurm_bench.py [--jobs 5] [--queue 500] [--skip-queue] [--queue-process]

Root only. Brings the single-host test cluster up (scripts/slurm-setup.sh: slurmctld + slurmd kn1,
kn2 in namespaces, each node claiming 64 CPUs) and starts two `kiln server`s ($KILN_BIN, default
build/src/cli/kiln): one with the process runtime on 127.0.0.1, one with "runtime": "slurm" on
10.77.0.1.

Job start: the program (a `local:` shell script) prints `first-line <date +%s.%N>` first. For each
of --jobs jobs, one at a time, the client records when CreateTrainingJob returned, polls Describe
every 50 ms until Completed, and reads the printed time back through the Logs API:
  first line   CreateTrainingJob -> the program's first line (Slurm: sbatch, the scheduler's
               placement, srun, `kiln node` fetching the spec and /opt/ml, the local sandbox)
  completed    CreateTrainingJob -> Describe says Completed (Slurm: + the output and files pushed
               back, the exit report, stage-out)
Medians and best are printed for both runtimes.

Queue: --queue jobs (ml.m5.large: 2 CPUs each, so 32 at a time per node, 64 on the cluster) are
submitted as fast as one client can, then the client waits until all are Completed: submission
rate, drain time and jobs/s; the largest squeue length seen. --queue-process runs the same queue
on the process runtime (the 2-core build host runs them a few at a time).
"""

import argparse
import fcntl
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import kiln_harness as kh  # noqa: E402

SETUP = os.path.join(kh.REPO_ROOT, "scripts", "slurm-setup.sh")
CTL_ADDR = "10.77.0.1"
ROLE = "arn:aws:iam::000000000000:role/bench"
PROGRAM = "#!/bin/sh\necho \"first-line $(date +%s.%N)\"\nexit 0\n"


class SlurmServer(kh.KilnServer):
    @property
    def endpoint(self):
        return "http://%s:%d" % (CTL_ADDR, self.port)


def request(name, bucket, image):
    return {
        "TrainingJobName": name,
        "AlgorithmSpecification": {"TrainingImage": image, "TrainingInputMode": "File"},
        "RoleArn": ROLE,
        "OutputDataConfig": {"S3OutputPath": "s3://%s/output" % bucket},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
    }


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


def job_start(server, image, jobs, label):
    sm, s3, logs = server.client("sagemaker"), server.client("s3"), server.client("logs")
    bucket = "bench-%s-%d" % (label, int(time.time()))
    s3.create_bucket(Bucket=bucket)
    firsts, dones = [], []
    for i in range(jobs):
        name = "start-%s-%d-%d" % (label, i, int(time.time()))
        sm.create_training_job(**request(name, bucket, image))
        created = time.time()
        while True:
            d = sm.describe_training_job(TrainingJobName=name)
            if d["TrainingJobStatus"] in ("Completed", "Failed", "Stopped"):
                break
            time.sleep(0.05)
        done = time.time()
        if d["TrainingJobStatus"] != "Completed":
            raise RuntimeError("%s: %s %s" % (name, d["TrainingJobStatus"], d.get("FailureReason")))
        firsts.append(first_line_time(logs, name) - created)
        dones.append(done - created)
    print("%-8s job start over %d jobs: first line median %.2f s (best %.2f), completed median %.2f s (best %.2f)"
          % (label, jobs, statistics.median(firsts), min(firsts), statistics.median(dones), min(dones)), flush=True)
    return firsts, dones


def squeue_len():
    p = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
    return len(p.stdout.split())


def queue(server, image, count, label, watch_squeue):
    sm, s3 = server.client("sagemaker"), server.client("s3")
    bucket = "bench-q-%s-%d" % (label, int(time.time()))
    s3.create_bucket(Bucket=bucket)
    names = ["q-%s-%d-%d" % (label, int(time.time()), i) for i in range(count)]
    peak = [0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], squeue_len())
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    if watch_squeue:
        watcher.start()
    t0 = time.time()
    for name in names:
        sm.create_training_job(**request(name, bucket, image))
    submitted = time.time() - t0
    left = set(names)
    failed = {}
    while left:
        for page in sm.get_paginator("list_training_jobs").paginate(MaxResults=100):
            for s in page["TrainingJobSummaries"]:
                if s["TrainingJobName"] in left and s["TrainingJobStatus"] in ("Completed", "Failed", "Stopped"):
                    left.discard(s["TrainingJobName"])
                    if s["TrainingJobStatus"] != "Completed":
                        failed[s["TrainingJobName"]] = s["TrainingJobStatus"]
        if left:
            time.sleep(1)
        if time.time() - t0 > 3600:
            raise RuntimeError("%d jobs not done after an hour" % len(left))
    drained = time.time() - t0
    stop.set()
    print("%-8s queue of %d: submitted in %.1f s (%.0f/s), all done %.1f s after the first submit (%.1f jobs/s)%s%s"
          % (label, count, submitted, count / submitted, drained, count / drained,
             ", largest squeue %d" % peak[0] if watch_squeue else "",
             ", %d not Completed: %s" % (len(failed), sorted(set(failed.values()))) if failed else ""), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=5)
    ap.add_argument("--queue", type=int, default=500)
    ap.add_argument("--skip-queue", action="store_true")
    ap.add_argument("--queue-process", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("slurm_bench: needs root (the test cluster's namespaces)")
    # One user of the cluster at a time (tests/integration/test_slurm.py takes the same lock).
    lock = open("/run/lock/kiln-slurm-cluster.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    p = subprocess.run([SETUP, "up"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("slurm_bench: the cluster cannot start: " + (p.stdout + p.stderr).strip().splitlines()[-1])

    # Not under /tmp: the nodes have a /tmp of their own, and the program must exist there too.
    work = tempfile.mkdtemp(prefix="kiln-slurm-bench-", dir="/var/tmp")
    prog = os.path.join(work, "first_line.sh")
    with open(prog, "w") as f:
        f.write(PROGRAM)
    os.chmod(prog, 0o755)
    image = "local:" + prog

    port = kh.free_port()
    slurm = SlurmServer(os.path.join(work, "slurm"), port=port, listen_host=CTL_ADDR, log_level="info", config={
        "runtime": "slurm",
        "credentials": [{"access_key_id": "AKIASLURMBENCH000001", "secret_access_key": "kiln-slurm-bench-secret-01"}],
        "slurm": {"server_url": "http://%s:%d" % (CTL_ADDR, port), "node_command": [kh.kiln_bin()],
                  "scratch_dir": "/tmp"},
    })
    local = kh.KilnServer(os.path.join(work, "process"), log_level="info",
                          config={"scheduler": {"policy": "shrink", "allow_cpu_fallback": True}})
    slurm.start()
    local.start()
    try:
        job_start(local, image, args.jobs, "process")
        job_start(slurm, image, args.jobs, "slurm")
        if not args.skip_queue:
            queue(slurm, image, args.queue, "slurm", watch_squeue=True)
            if args.queue_process:
                queue(local, image, args.queue, "process", watch_squeue=False)
    finally:
        slurm.stop(timeout=60)
        local.stop(timeout=60)


if __name__ == "__main__":
    main()
