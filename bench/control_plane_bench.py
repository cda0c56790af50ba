#!/usr/bin/python3
"""Control-plane queries at scale (issue 11's measure): DescribeTrainingJob and one
ListTrainingJobs page with N training jobs in the store.

  KILN_BIN=build/src/cli/kiln /usr/bin/python3 bench/control_plane_bench.py [--jobs 100000] [--requests 400]

How the store is filled (fast path, documented in bench/README.md): `kiln server` starts on a
fresh data dir and runs one real job (the integration tests' probe image, `local:`) to
completion through the API; the server stops and the bench copies that job's row --jobs times
straight into kiln.db with sqlite3 (one transaction), changing only the name, ARN, the request's
TrainingJobName, the times and the status (Completed/Failed/Stopped in turn, so StatusEquals
matches a third). Every row is thus one the server itself wrote; the server then starts again on
that database (applying any newer migration, as an upgrade would) and serves the queries.

Measured per operation, at 1 and 8 concurrent clients (processes, each with its own HTTP
connection per request, requests signed before the clock starts):
  - client latency p50/p99 of the whole HTTP exchange on loopback (ms);
  - server CPU per request: the server's utime+stime (/proc/<pid>/stat) over the run / requests
    (ms); on a 2-core machine latency at 8 clients is mostly queueing behind the other 7.
Operations: DescribeTrainingJob (a random job), ListTrainingJobs MaxResults=100 first page
(SortBy CreationTime, Descending, the SDK's default listing), the same with StatusEquals=Failed,
and the same as the 10th page (through NextToken).
$KILN_BIN selects the binary (default build/src/cli/kiln).
"""

import argparse
import json
import multiprocessing
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))

import kiln_harness as kh  # noqa: E402

TARGET = "SageMaker."
STATUSES = ["Completed", "Failed", "Stopped"]


def signed(server, operation, payload):
    body = json.dumps(payload).encode()
    headers = {"X-Amz-Target": TARGET + operation, "Content-Type": "application/x-amz-json-1.1"}
    hdrs, _, _ = kh.sign_request("POST", server["endpoint"] + "/", headers, kh.Creds(*server["creds"]), "sagemaker",
                                 body=body, signed_headers=["content-type", "host", "x-amz-date", "x-amz-target"])
    return hdrs, body


def call(server, operation, payload):
    hdrs, body = signed(server, operation, payload)
    status, _, data = kh.http_request("POST", server["endpoint"] + "/", hdrs, body, timeout=300)
    if status != 200:
        raise RuntimeError("%s answered %d: %s" % (operation, status, data[:500]))
    return json.loads(data) if data else {}


def server_info(server):
    return {"endpoint": server.endpoint, "creds": (server.access_key, server.secret_key)}


def one_real_job(server, name):
    s3 = server.client("s3")
    s3.create_bucket(Bucket="bench")
    info = server_info(server)
    call(info, "CreateTrainingJob", {
        "TrainingJobName": name,
        "AlgorithmSpecification": {"TrainingImage": "local:" + os.path.join(REPO, "tests", "integration", "jobs",
                                                                            "probe.py"),
                                   "TrainingInputMode": "File"},
        "RoleArn": "arn:aws:iam::123456789012:role/bench",
        "OutputDataConfig": {"S3OutputPath": "s3://bench/output"},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600}})
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        status = call(info, "DescribeTrainingJob", {"TrainingJobName": name})["TrainingJobStatus"]
        if status not in ("InProgress", "Stopping"):
            return status
        time.sleep(0.2)
    raise RuntimeError("the seed job did not finish")


def fill(db_path, seed_name, jobs):
    db = sqlite3.connect(db_path)
    cols = [r[1] for r in db.execute("PRAGMA table_info(training_jobs)")]
    row = dict(zip(cols, db.execute("SELECT * FROM training_jobs WHERE name = ?", (seed_name,)).fetchone()))
    request = json.loads(row["request_json"])
    base = row["creation_millis"] - jobs * 1000
    insert_cols = [c for c in cols if c != "seq"]
    sql = "INSERT INTO training_jobs(%s) VALUES (%s)" % (", ".join(insert_cols), ", ".join("?" * len(insert_cols)))
    arn_prefix = row["arn"][: row["arn"].rindex("/") + 1]

    def rows():
        for i in range(jobs):
            name = "bench-%06d" % i
            r = dict(row)
            request["TrainingJobName"] = name
            r.update(name=name, arn=arn_prefix + name, request_json=json.dumps(request),
                     status=STATUSES[i % 3], creation_millis=base + i * 1000,
                     last_modified_millis=base + i * 1000 + 500, training_end_millis=base + i * 1000 + 400)
            yield tuple(r[c] for c in insert_cols)

    with db:
        db.executemany(sql, rows())
    db.close()


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker(args):
    server, payloads, n = args
    times = []
    for i in range(n):
        operation, payload = payloads[i % len(payloads)]
        hdrs, body = signed(server, operation, payload)
        t0 = time.perf_counter()
        status, _, data = kh.http_request("POST", server["endpoint"] + "/", hdrs, body, timeout=300)
        times.append(time.perf_counter() - t0)
        if status != 200:
            raise RuntimeError("%s answered %d: %s" % (operation, status, data[:300]))
    return times


def measure(server, pid, payloads, clients, requests):
    per = max(1, requests // clients)
    with multiprocessing.Pool(clients) as pool:
        pool.map(worker, [(server, payloads, 2)] * clients)  # warm-up
        cpu0 = cpu_seconds(pid)
        t0 = time.monotonic()
        results = pool.map(worker, [(server, payloads[c::clients] or payloads, per) for c in range(clients)])
        wall = time.monotonic() - t0
        cpu = cpu_seconds(pid) - cpu0
    times = sorted(t for r in results for t in r)
    n = len(times)
    return {"p50": statistics.median(times) * 1000, "p99": times[min(n - 1, int(n * 0.99))] * 1000,
            "cpu": cpu / n * 1000, "rps": n / wall}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=100000)
    ap.add_argument("--requests", type=int, default=400, help="requests per (operation, clients) cell")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kiln-cp-bench-", dir=args.dir)
    data = os.path.join(work, "data")
    seed = "bench-seed"
    server = kh.KilnServer(data, log_level="warn")
    server.start()
    try:
        print("seed job:", one_real_job(server, seed))
    finally:
        server.stop()
    t0 = time.monotonic()
    fill(os.path.join(data, "kiln.db"), seed, args.jobs)
    print("inserted %d rows in %.1f s" % (args.jobs, time.monotonic() - t0))
    server = kh.KilnServer(data, log_level="warn")
    server.start(timeout=300)
    try:
        info = server_info(server)
        pid = server.proc.pid
        rng = random.Random(1)
        describe = [("DescribeTrainingJob", {"TrainingJobName": "bench-%06d" % rng.randrange(args.jobs)})
                    for _ in range(200)]
        page = {"MaxResults": 100, "SortBy": "CreationTime", "SortOrder": "Descending"}
        failed = dict(page, StatusEquals="Failed")
        token = None
        for _ in range(9):
            answer = call(info, "ListTrainingJobs", dict(page, **({"NextToken": token} if token else {})))
            token = answer["NextToken"]
        tenth = dict(page, NextToken=token)
        cells = [("DescribeTrainingJob", describe), ("ListTrainingJobs 100", [("ListTrainingJobs", page)]),
                 ("ListTrainingJobs 100 StatusEquals", [("ListTrainingJobs", failed)]),
                 ("ListTrainingJobs 100, 10th page", [("ListTrainingJobs", tenth)])]
        print("kiln %s, %d CPUs, %d training jobs" % (kh.kiln_bin(), os.cpu_count(), args.jobs))
        print("%-36s %7s %9s %9s %12s %8s" % ("operation", "clients", "p50 ms", "p99 ms", "server CPU ms", "req/s"))
        for label, payloads in cells:
            for clients in (1, 8):
                requests = args.requests if "Describe" in label else max(8, args.requests // 4)
                m = measure(info, pid, payloads, clients, requests)
                print("%-36s %7d %9.2f %9.2f %12.2f %8.0f" % (label, clients, m["p50"], m["p99"], m["cpu"], m["rps"]))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
