#!/usr/bin/python3
"""The container runtime (issue 15): what running a job or an endpoint instance as a container costs
next to the process runtime and next to `podman run` by hand.

  /usr/bin/python3 bench/container_bench.py [--runs 10] [--invokes 2000] [--skip-start] [--skip-invoke]

Images come from tests/integration/container_images.py (built locally from the host's files, reused
when present): a start image, FROM the test base, whose ENTRYPOINT prints `started <time.time()>` as
its first statement, and the BYO serving image of the tests. Two servers ($KILN_BIN, default
build/src/cli/kiln), each with a temp data dir, scheduler shrink, network mode auto (namespaces as
root, ranges 10.243.0.0/16 and 10.244.0.0/16): `process` (no engine: the same program as a `local:`
image) and `podman` (container_engine on Podman's socket, images localhost/kiln-test-*).

Job start: per job the time from CreateTrainingJob's answer to the time the program printed (read
back through the Logs API), --runs jobs one at a time with --pause s between them; median/min/max.
By hand: `podman run --rm --network none IMAGE train` and `podman run --rm IMAGE train` (its default
network), from the spawn of `podman` to the printed time (and to podman's exit); `bare`: the program
spawned directly on the host.

Invoke: an endpoint of one instance of the BYO serving program (container image, or the same
program as a `local:` image) on each server; --invokes sequential InvokeEndpoint calls (boto3, one
keep-alive connection) after 50 warm-ups; p50/p99/mean.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "integration")
sys.path.insert(0, TESTS)
import container_images as ci  # noqa: E402
import kiln_harness as kh  # noqa: E402

ROLE = "arn:aws:iam::000000000000:role/bench"
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
CIDRS = {"process": "10.243.0.0/16", "podman": "10.244.0.0/16"}

START_PROGRAM = r'''#!/usr/bin/python3
import time
print("started %.6f" % time.time(), flush=True)
'''


def start_image():
    return ci._build("localhost/kiln-test-bench-start", ci.base_image(),
                     "FROM base\nCOPY entry /opt/program/entry\nENTRYPOINT [\"/opt/program/entry\"]\n",
                     {"entry": (START_PROGRAM, 0o755)})


def write_program(work, name, text):
    path = os.path.join(work, name)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


class Server:
    def __init__(self, work, runtime):
        config = {"scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
                  "training": {"stop_grace_seconds": 5},
                  "endpoints": {"health_interval_seconds": 0.5},
                  "network": {"mode": "auto", "cidr": CIDRS[runtime]}}
        if runtime == "podman":
            config["container_engine"] = {"socket": ci.socket_uri(), "images": [ci.IMAGE_GLOB]}
        self.runtime = runtime
        self.srv = kh.KilnServer(os.path.join(work, runtime, "data"), log_path=os.path.join(work, runtime + ".log"),
                                 log_level="info", config=config)

    def __enter__(self):
        self.srv.start()
        self.sm = self.srv.client("sagemaker")
        self.logs = self.srv.client("logs")
        self.s3 = self.srv.client("s3")
        self.rt = self.srv.client("sagemaker-runtime")
        self.bucket = "bench"
        self.s3.create_bucket(Bucket=self.bucket)
        return self

    def __exit__(self, *exc):
        self.srv.stop(timeout=60)


def job_request(name, image, bucket):
    return {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {"TrainingImage": image, "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://%s/output" % bucket},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
    }


def wait_done(sm, name, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        d = sm.describe_training_job(TrainingJobName=name)
        if d["TrainingJobStatus"] in ("Completed", "Failed", "Stopped"):
            return d
        time.sleep(0.05)
    raise RuntimeError("job %s did not finish" % name)


def printed_start(logs, name):
    streams = logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=name + "/")["logStreams"]
    for s in streams:
        for e in logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=s["logStreamName"],
                                     startFromHead=True)["events"]:
            if e["message"].startswith("started "):
                return float(e["message"].split()[1])
    return None


def measure_jobs(server, image, runs, pause):
    """[seconds from CreateTrainingJob's answer to the program's first line] or an error text."""
    samples = []
    for i in range(runs):
        time.sleep(pause)
        name = "start-%s-%d-%d" % (server.runtime[:2], int(time.time()), i)
        server.sm.create_training_job(**job_request(name, image, server.bucket))
        answered = time.time()
        d = wait_done(server.sm, name)
        if d["TrainingJobStatus"] != "Completed":
            return "%s: %s" % (d["TrainingJobStatus"], d.get("FailureReason"))
        started = printed_start(server.logs, name)
        if started is None:
            return "no start line in the job's log"
        samples.append(started - answered)
    return samples


def measure_by_hand(cmd, runs, pause):
    """[(seconds from the spawn to the printed time, to the command's exit)] or an error text."""
    samples = []
    for _ in range(runs):
        time.sleep(pause)
        t0 = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        t1 = time.time()
        if p.returncode != 0:
            return "%s exited %d: %s" % (" ".join(cmd), p.returncode, p.stderr[-300:])
        line = [x for x in p.stdout.splitlines() if x.startswith("started ")]
        if not line:
            return "no start line from %s" % " ".join(cmd)
        samples.append((float(line[0].split()[1]) - t0, t1 - t0))
    return samples


def measure_invoke(server, image, invokes):
    sm, name = server.sm, "bench-inv-%s-%d" % (server.runtime[:2], int(time.time()))
    sm.create_model(ModelName=name, PrimaryContainer={"Image": image}, ExecutionRoleArn=ROLE)
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
        "VariantName": "v", "ModelName": name, "InitialInstanceCount": 1, "InstanceType": "ml.m5.large",
        "InitialVariantWeight": 1.0}])
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    deadline = time.time() + 180
    while True:
        d = sm.describe_endpoint(EndpointName=name)
        if d["EndpointStatus"] == "InService":
            break
        if time.time() > deadline or d["EndpointStatus"] == "Failed":
            return "endpoint not InService: %s" % d.get("FailureReason")
        time.sleep(0.2)
    body = b'{"x": 1}'
    try:
        for _ in range(50):
            server.rt.invoke_endpoint(EndpointName=name, Body=body, ContentType="application/json")["Body"].read()
        samples = []
        for _ in range(invokes):
            t0 = time.perf_counter()
            server.rt.invoke_endpoint(EndpointName=name, Body=body, ContentType="application/json")["Body"].read()
            samples.append(time.perf_counter() - t0)
    finally:
        sm.delete_endpoint(EndpointName=name)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                sm.describe_endpoint(EndpointName=name)
                time.sleep(0.2)
            except sm.exceptions.ClientError:
                break
    return samples


def pct(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def row(label, samples, scale=1e3):
    if isinstance(samples, str):
        return "%-46s %s" % (label, samples[:300])
    v = [x * scale for x in samples]
    return "%-46s %8.0f %8.0f %8.0f" % (label, statistics.median(v), min(v), max(v))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--invokes", type=int, default=2000)
    ap.add_argument("--pause", type=float, default=0.5, help="seconds between start measurements")
    ap.add_argument("--skip-start", action="store_true")
    ap.add_argument("--skip-invoke", action="store_true")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    try:
        ci.check_podman()
    except ci.Unavailable as e:
        sys.exit("container_bench.py needs Podman: %s" % e)

    t0 = time.monotonic()
    images = ci.all_images()
    start_ref = start_image()
    build_s = time.monotonic() - t0
    work = tempfile.mkdtemp(prefix="kiln-container-bench-", dir=args.dir)
    start_prog = write_program(work, "start.py", START_PROGRAM)
    serve_local = ci.host_program(os.path.join(work, "serve"))
    res = {}
    try:
        if not args.skip_start:
            res["bare"] = measure_by_hand(["/usr/bin/python3", start_prog], args.runs, args.pause)
            res["run-none"] = measure_by_hand(["podman", "run", "--rm", "--network", "none", start_ref, "train"],
                                              args.runs, args.pause)
            res["run-default"] = measure_by_hand(["podman", "run", "--rm", start_ref, "train"], args.runs, args.pause)
        for runtime in ("process", "podman"):
            with Server(work, runtime) as server:
                if not args.skip_start:
                    image = start_ref if runtime == "podman" else "local:" + start_prog
                    res["job", runtime] = measure_jobs(server, image, args.runs, args.pause)
                if not args.skip_invoke:
                    res["invoke", runtime] = measure_invoke(
                        server, images["byo"] if runtime == "podman" else serve_local, args.invokes)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print("cpus: %d   runs per row: %d   images ready in %.2f s (built or found)"
          % (os.cpu_count(), args.runs, build_s))
    if not args.skip_start:
        print("\n%-46s %8s %8s %8s" % ("start: spawn/answer -> program's first line", "median", "min",
                                        "max"))
        bare = res["bare"]
        print(row("bare (python3 prog)", bare if isinstance(bare, str) else [s[0] for s in bare]))
        print(row("Kiln process runtime (local:)", res["job", "process"]))
        print(row("Kiln container runtime (Podman)", res["job", "podman"]))
        for key, label in (("run-none", "podman run --rm --network none"), ("run-default", "podman run --rm")):
            s = res[key]
            if isinstance(s, str):
                print(row(label, s))
            else:
                print(row(label + " (first line)", [x[0] for x in s]))
                print(row(label + " (exit)", [x[1] for x in s]))
        print("\nin run order, ms:")
        for key, label in ((("job", "process"), "process runtime"), (("job", "podman"), "container runtime")):
            if not isinstance(res[key], str):
                print("  %-20s %s" % (label, " ".join("%.0f" % (x * 1e3) for x in res[key])))
    if not args.skip_invoke:
        print("\nInvokeEndpoint, %d sequential calls (boto3)       p50 ms   p99 ms   mean ms" % args.invokes)
        for runtime, label in (("process", "process instance (local:)"), ("podman", "container instance (Podman)")):
            s = res["invoke", runtime]
            if isinstance(s, str):
                print("%-46s %s" % (label, s))
            else:
                print("%-46s %8.2f %8.2f %8.2f" % (label, pct(s, 50) * 1e3, pct(s, 99) * 1e3, statistics.mean(s) * 1e3))


if __name__ == "__main__":
    main()
