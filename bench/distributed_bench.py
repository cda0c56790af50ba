#!/usr/bin/python3
"""Per-instance networks and distributed training (issue 14): what a namespace per host costs.

  /usr/bin/python3 bench/distributed_bench.py [--hosts 1,2,4] [--runs 5] [--mib 64] [--iters 10]
                                              [--invokes 500] [--skip-start] [--skip-allreduce]
                                              [--skip-invoke]

Starts two `kiln server`s ($KILN_BIN, default build/src/cli/kiln), each with a temp data dir:
`namespaces` (network mode namespaces, range 10.234.0.0/16: every host its own namespace, veth and
address on a bridge of the job) and `host` (network mode host: every host on the node's network,
algo-N = 127.0.0.1, as before issue 14). Needs root (the namespaces server refuses to start
otherwise). Scheduler shrink, so N hosts share the machine's CPUs (each gets CPUs/N, at least 1:
--hosts larger than the CPU count are reported as not runnable).

Start: a `local:` program prints `started <time.time()>` as its first statement on every host. For
each host count, --runs jobs one after the other (each on an idle node); per job the time from
CreateTrainingJob's answer to the LAST host's printed time (all hosts running the user program),
and to the first. Median/min/max over the runs. --pause seconds pass between a job's end and the
next job (default 1: the previous job's network is removed by then; with 0 the next job's start
overlaps that removal).

All-reduce: a 2-host `local:` job, rendezvous at algo-1 (torch.distributed, gloo, CPU), --iters
all_reduce(SUM) of a --mib MiB float32 tensor after 2 warm-ups; rank 0 reports the mean time and
the algorithm bandwidth (bytes / time; for 2 ranks equal to the bus bandwidth). Against the same
program as two bare processes over 127.0.0.1 (each pinned to one CPU, as the hosts are). Rows:
bare loopback, Kiln host mode (hosts on the node's loopback, in their sandboxes), Kiln namespaces
(veth - bridge - veth).

Invoke: an endpoint of one instance (image `local:tests/integration/endpoints/serve_app.py`) on
each server; --invokes sequential InvokeEndpoint calls (boto3, one keep-alive connection) after 20
warm-ups; p50/p99/mean. Through the namespace the server reaches the instance at its address on
the bridge; in host mode at 127.0.0.1:<port>.
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

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "integration")
sys.path.insert(0, TESTS)
import kiln_harness as kh  # noqa: E402

ROLE = "arn:aws:iam::000000000000:role/bench"
SERVE_APP = os.path.abspath(os.path.join(TESTS, "endpoints", "serve_app.py"))
LOG_GROUP = "/aws/sagemaker/TrainingJobs"

START_PROGRAM = r'''#!/usr/bin/python3
import time
print("started %.6f" % time.time(), flush=True)
import socket
print("address %s" % socket.gethostbyname(socket.gethostname()), flush=True)  # algo-N in /etc/hosts
'''

ALLREDUCE_PROGRAM = r'''#!/usr/bin/python3
# Kiln job (`prog train`): rank = index of the host; bare: BENCH_RANK/BENCH_WORLD/MASTER_ADDR set.
import json, os, sys, time
import torch
import torch.distributed as dist
if os.environ.get("BENCH_RANK") is not None:
    rank, world = int(os.environ["BENCH_RANK"]), int(os.environ["BENCH_WORLD"])
    hps = {"mib": os.environ["BENCH_MIB"], "iters": os.environ["BENCH_ITERS"]}
else:
    rc = json.load(open("/opt/ml/input/config/resourceconfig.json"))
    hps = json.load(open("/opt/ml/input/config/hyperparameters.json"))
    rank, world = rc["hosts"].index(rc["current_host"]), len(rc["hosts"])
    os.environ["MASTER_ADDR"] = rc["hosts"][0]
    os.environ.setdefault("MASTER_PORT", "29555")
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=rank, world_size=world)
n = int(float(hps["mib"]) * 1024 * 1024 / 4)
t = torch.ones(n, dtype=torch.float32)
for _ in range(2):
    dist.all_reduce(t)
dist.barrier()
iters = int(hps["iters"])
t0 = time.perf_counter()
for _ in range(iters):
    dist.all_reduce(t)
dist.barrier()
dt = (time.perf_counter() - t0) / iters
if rank == 0:
    print("ALLREDUCE %s" % json.dumps({"bytes": n * 4, "seconds": dt}), flush=True)
dist.destroy_process_group()
'''


def write_program(work, name, text):
    path = os.path.join(work, name)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


def job_request(name, image, bucket, hosts, hyperparameters=None):
    req = {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {"TrainingImage": image, "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://%s/output" % bucket},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": hosts, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
    }
    if hyperparameters:
        req["HyperParameters"] = hyperparameters
    return req


def wait_done(sm, name, timeout=600):
    deadline = time.time() + timeout
    while time.time() < deadline:
        d = sm.describe_training_job(TrainingJobName=name)
        if d["TrainingJobStatus"] in ("Completed", "Failed", "Stopped"):
            return d
        time.sleep(0.05)
    raise RuntimeError("job %s did not finish" % name)


def host_lines(logs, name):
    """{stream name: [messages]} of the job's streams."""
    out = {}
    streams = logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=name + "/")["logStreams"]
    for s in streams:
        events = logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=s["logStreamName"],
                                     startFromHead=True)["events"]
        out[s["logStreamName"]] = [e["message"] for e in events]
    return out


class Server:
    def __init__(self, work, mode):
        net = {"mode": mode}
        if mode == "namespaces":
            net["cidr"] = "10.234.0.0/16"
        self.mode = mode
        self.srv = kh.KilnServer(os.path.join(work, mode, "data"), log_path=os.path.join(work, mode + ".log"),
                                 log_level="info",
                                 config={"scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
                                         "training": {"stop_grace_seconds": 5},
                                         "endpoints": {"health_interval_seconds": 0.5},
                                         "network": net})

    def __enter__(self):
        self.srv.start()
        self.sm = self.srv.client("sagemaker")
        self.logs = self.srv.client("logs")
        self.s3 = self.srv.client("s3")
        self.rt = self.srv.client("sagemaker-runtime")
        self.bucket = "bench"
        self.addresses = set()
        self.s3.create_bucket(Bucket=self.bucket)
        return self

    def __exit__(self, *exc):
        self.srv.stop(timeout=60)


def measure_start(server, program, hosts, runs, pause):
    """[(seconds to the last host's first line, to the first host's)] or an error text."""
    samples = []
    for i in range(runs):
        time.sleep(pause)  # the previous job's cleanup (its network's removal) is over
        name = "start-%s-%d-%d-%d" % (server.mode[:2], hosts, int(time.time()), i)
        try:
            server.sm.create_training_job(**job_request(name, "local:" + program, server.bucket, hosts))
        except server.sm.exceptions.ClientError as e:
            return e.response["Error"]["Message"]
        answered = time.time()
        d = wait_done(server.sm, name)
        if d["TrainingJobStatus"] != "Completed":
            return "%s: %s" % (d["TrainingJobStatus"], d.get("FailureReason"))
        starts = []
        for lines in host_lines(server.logs, name).values():
            starts += [float(line.split()[1]) for line in lines if line.startswith("started ")]
        if len(starts) != hosts:
            return "%d of %d hosts printed their start" % (len(starts), hosts)
        samples.append((max(starts) - answered, min(starts) - answered))
        for lines in host_lines(server.logs, name).values():
            server.addresses.update(line.split()[1] for line in lines if line.startswith("address "))
    return samples


def measure_allreduce_job(server, program, mib, iters):
    name = "allreduce-%s-%d" % (server.mode[:2], int(time.time()))
    server.sm.create_training_job(**job_request(name, "local:" + program, server.bucket, 2,
                                                {"mib": str(mib), "iters": str(iters)}))
    d = wait_done(server.sm, name)
    lines = [line for ls in host_lines(server.logs, name).values() for line in ls]
    if d["TrainingJobStatus"] != "Completed":
        return "%s: %s" % (d["TrainingJobStatus"], d.get("FailureReason"))
    found = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("ALLREDUCE ")]
    return found[0] if found else "no result in the logs"


def measure_allreduce_bare(program, mib, iters):
    port = kh.free_port()
    cpus = sorted(os.sched_getaffinity(0))
    procs = []
    for rank in range(2):
        env = dict(os.environ, BENCH_RANK=str(rank), BENCH_WORLD="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), BENCH_MIB=str(mib), BENCH_ITERS=str(iters))
        cmd = ["/usr/bin/python3", program]
        if len(cpus) >= 2:
            cmd = ["taskset", "-c", str(cpus[rank])] + cmd
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for line in outs[0].splitlines():
        if line.startswith("ALLREDUCE "):
            return json.loads(line.split(" ", 1)[1])
    return "no result (exit %s)" % [p.returncode for p in procs]


def measure_invoke(server, invokes):
    sm, name = server.sm, "bench-inv-%s-%d" % (server.mode[:2], int(time.time()))
    sm.create_model(ModelName=name, PrimaryContainer={"Image": "local:" + SERVE_APP}, ExecutionRoleArn=ROLE)
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
        "VariantName": "v", "ModelName": name, "InitialInstanceCount": 1, "InstanceType": "ml.m5.large",
        "InitialVariantWeight": 1.0}])
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    deadline = time.time() + 120
    while sm.describe_endpoint(EndpointName=name)["EndpointStatus"] != "InService":
        if time.time() > deadline or sm.describe_endpoint(EndpointName=name)["EndpointStatus"] == "Failed":
            return "endpoint not InService: %s" % sm.describe_endpoint(EndpointName=name).get("FailureReason")
        time.sleep(0.2)
    body = b'{"x": 1}'
    try:
        for _ in range(20):
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="1,2,4")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mib", type=float, default=64)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--invokes", type=int, default=500)
    ap.add_argument("--pause", type=float, default=1.0,
                    help="seconds between start-latency jobs (0: back to back, the previous job's cleanup overlaps)")
    ap.add_argument("--skip-start", action="store_true")
    ap.add_argument("--skip-allreduce", action="store_true")
    ap.add_argument("--skip-invoke", action="store_true")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("distributed_bench.py needs root: the namespaces server creates bridges, veths and namespaces")

    work = tempfile.mkdtemp(prefix="kiln-distributed-bench-", dir=args.dir)
    start_prog = write_program(work, "start.py", START_PROGRAM)
    ar_prog = write_program(work, "allreduce.py", ALLREDUCE_PROGRAM)
    results = {}
    try:
        for mode in ("host", "namespaces"):
            with Server(work, mode) as server:
                r = results[mode] = {}
                if not args.skip_start:
                    for n in [int(x) for x in args.hosts.split(",")]:
                        r["start", n] = measure_start(server, start_prog, n, args.runs, args.pause)
                if not args.skip_allreduce:
                    r["allreduce"] = measure_allreduce_job(server, ar_prog, args.mib, args.iters)
                if not args.skip_invoke:
                    r["invoke"] = measure_invoke(server, args.invokes)
                r["addresses"] = sorted(server.addresses)
        if not args.skip_allreduce:
            results["bare"] = {"allreduce": measure_allreduce_bare(ar_prog, args.mib, args.iters)}
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print("cpus: %d   runs per row: %d   pause between jobs: %g s" % (os.cpu_count(), args.runs, args.pause))
    for mode in ("host", "namespaces"):
        if results[mode]["addresses"]:
            print("%s: the hosts' addresses (algo-N) were %s" % (mode, ", ".join(results[mode]["addresses"][:6])))
    if not args.skip_start:
        print("\n%-40s %24s %24s" % ("job start (answer -> user program)", "host mode", "namespaces"))
        print("%-40s %24s %24s" % ("", "median / min / max ms", "median / min / max ms"))
        for n in [int(x) for x in args.hosts.split(",")]:
            for which, idx in (("all hosts running", 0), ("first host running", 1)):
                cells = []
                for mode in ("host", "namespaces"):
                    s = results[mode]["start", n]
                    if isinstance(s, str):
                        cells.append("n/a")
                        note = s
                    else:
                        v = [x[idx] * 1e3 for x in s]
                        cells.append("%.0f / %.0f / %.0f" % (statistics.median(v), min(v), max(v)))
                print("%-40s %24s %24s" % ("%d host%s: %s" % (n, "s" if n > 1 else "", which), *cells))
                if "n/a" in cells:
                    print("    (%s)" % note[:200])
                    break
    if not args.skip_allreduce:
        print("\nall_reduce of %g MiB float32, 2 ranks (gloo, 1 CPU each), mean of %d" % (args.mib, args.iters))
        for label, key in (("bare processes over 127.0.0.1", "bare"), ("Kiln host mode (loopback)", "host"),
                           ("Kiln namespaces (veth-bridge-veth)", "namespaces")):
            a = results[key]["allreduce"]
            if isinstance(a, str):
                print("%-40s %s" % (label, a))
            else:
                print("%-40s %8.1f ms %10.0f MB/s" % (label, a["seconds"] * 1e3, a["bytes"] / a["seconds"] / 1e6))
    if not args.skip_invoke:
        print("\nInvokeEndpoint, %d sequential calls (boto3)   p50 ms   p99 ms   mean ms" % args.invokes)
        for mode in ("host", "namespaces"):
            s = results[mode]["invoke"]
            if isinstance(s, str):
                print("%-44s %s" % (mode, s))
            else:
                print("%-44s %8.2f %8.2f %8.2f" % (mode, pct(s, 50) * 1e3, pct(s, 99) * 1e3, statistics.mean(s) * 1e3))


if __name__ == "__main__":
    main()
