#!/usr/bin/python3
"""What each container of an inference pipeline adds to an invocation (serving-contract.md §8.2), driven by wrk.

  /usr/bin/python3 bench/pipeline_bench.py [--duration 6] [--connections 1,16] [--rounds 2] [--containers 1,2,3]
                                           [--json results.json]

One `kiln server` (SigV4 on) runs one endpoint per --containers value over bench/serving_backend
(serving_bench.py's backend, image `local:<serving_backend>`, a fixed 11-byte answer): `c1` a single-container
model (PrimaryContainer, the ordinary path), `c2`, `c3`... Serial pipelines of that many copies of the backend
(Containers, InferenceExecutionConfig Serial): Kiln calls each in turn on the instance, each answer the next
one's request (worker threads, Router::InvokePipeline). Each round runs wrk against every endpoint at every
--connections value (alternating, so drift hits all alike). Columns: requests/s, p50/p99 latency, server CPU per
request (utime+stime of the kiln process). The summary gives, per connection count, the median over rounds of the
p50 latency and CPU per request of each endpoint, and the cost per extra hop: (last - first) / (containers
difference). Note that `c1` is served on the event loop, the pipelines on worker threads: the first extra hop
includes that switch. With --direct, a Direct endpoint `d2` of two copies (TargetContainerHostname names the
second, added to the signed request's headers) is measured as well: one call, on the event loop, like `c1`.

$KILN_BIN selects the kiln binary (default build/src/cli/kiln)."""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "integration"))

import serving_bench as sb  # noqa: E402 (wrk, the backend, CPU accounting)


def start_endpoint(server, backend, name, containers, direct=False):
    sm = server.client("sagemaker")
    definition = {"Image": "local:" + backend, "Environment": {"BACKEND_THREADS": "2"}}
    if containers == 1:
        sm.create_model(ModelName=name, ExecutionRoleArn=sb.ROLE, PrimaryContainer=definition)
    elif direct:
        sm.create_model(ModelName=name, ExecutionRoleArn=sb.ROLE,
                        Containers=[dict(definition, ContainerHostname="b%d" % (i + 1)) for i in range(containers)],
                        InferenceExecutionConfig={"Mode": "Direct"})
    else:
        sm.create_model(ModelName=name, ExecutionRoleArn=sb.ROLE, Containers=[definition] * containers,
                        InferenceExecutionConfig={"Mode": "Serial"})
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": name, "InstanceType": "ml.m5.large", "InitialInstanceCount": 1}])
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    sb.wait_in_service(sm, name, 60)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=6)
    parser.add_argument("--connections", default="1,16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--containers", default="1,2,3")
    parser.add_argument("--direct", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    connections = [int(c) for c in args.connections.split(",")]
    counts = [int(c) for c in args.containers.split(",")]
    import kiln_harness as kh

    work = tempfile.mkdtemp(prefix="kiln-pipeline-bench-")
    backend = sb.backend_binary()
    config = {"scheduler": {"policy": "shrink", "allow_cpu_fallback": True}}
    server = kh.KilnServer(os.path.join(work, "data"), config=config, log_path=os.path.join(work, "server.log"),
                           log_level="info")
    server.start()
    rows = []
    names = {n: "bench-c%d" % n for n in counts}
    labels = list(counts)
    if args.direct:
        names["d2"] = "bench-d2"
        labels.append("d2")
    try:
        for n in counts:
            start_endpoint(server, backend, names[n], n)
        if args.direct:
            start_endpoint(server, backend, names["d2"], 2, direct=True)
        luas = {}
        for n in labels:
            path = "/endpoints/%s/invocations" % names[n]
            luas[n] = (server.endpoint + path, os.path.join(work, "%s.lua" % n))
            headers = sb.signed_headers(server, path)
            if n == "d2":
                headers["X-Amzn-SageMaker-Target-Container-Hostname"] = "b2"  # not signed: allowed
            sb.write_lua(luas[n][1], headers, sb.BODY)
        bpids = sb.pids_running(backend)
        for round_index in range(args.rounds):
            for c in connections:
                for n in labels:
                    url, lua = luas[n]
                    r = sb.run_wrk(url, lua, c, args.duration, [server.proc.pid], bpids)
                    r.update(containers=n, round=round_index)
                    rows.append(r)
                    print("round %d  containers %s c=%-3d %8.0f req/s  p50 %6d us  p99 %6d us  cpu %5.1f us/req" % (
                        round_index, n, c, r["rps"], r["p50_us"], r["p99_us"], r["proxy_cpu_us"]), flush=True)
    finally:
        # Endpoint instances outlive a stopped server by design: delete them first.
        sm = server.client("sagemaker")
        for name in names.values():
            try:
                sm.delete_endpoint(EndpointName=name)
            except Exception:  # noqa: BLE001 (best effort: it may not exist)
                pass
        deadline = time.time() + 30
        while sm.list_endpoints()["Endpoints"] and time.time() < deadline:
            time.sleep(0.2)
        server.stop()
    print("\nmedian over %d rounds:" % args.rounds)
    summary = {}
    for c in connections:
        def med(n, key):
            return statistics.median(r[key] for r in rows if r["containers"] == n and r["connections"] == c)
        per = {n: {"p50_us": med(n, "p50_us"), "cpu_us": med(n, "proxy_cpu_us"), "rps": med(n, "rps")}
               for n in labels}
        first, last = counts[0], counts[-1]
        hops = max(1, last - first)
        summary[c] = {"by_containers": per,
                      "p50_per_hop_us": (per[last]["p50_us"] - per[first]["p50_us"]) / hops,
                      "cpu_per_hop_us": (per[last]["cpu_us"] - per[first]["cpu_us"]) / hops}
        if len(counts) >= 3:
            # From the second container on: both ends on worker threads.
            summary[c]["p50_per_later_hop_us"] = (per[last]["p50_us"] - per[counts[1]]["p50_us"]) / max(
                1, last - counts[1])
        print("  c=%-3d %s   per hop: p50 %+5.0f us, cpu %+5.1f us/req%s" % (
            c, "  ".join("%s: p50 %d us %.0f req/s" % (n, per[n]["p50_us"], per[n]["rps"]) for n in labels),
            summary[c]["p50_per_hop_us"], summary[c]["cpu_per_hop_us"],
            ("  (after the 2nd: p50 %+.0f us)" % summary[c]["p50_per_later_hop_us"])
            if "p50_per_later_hop_us" in summary[c] else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
