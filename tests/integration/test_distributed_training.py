"""Issue 14, distributed training on per-instance networks (training-contract.md §6.4, §8, §12):
each host of a job in a network namespace of its own (eth0 in the configured range, every algo-N
resolving to its host's address) on a bridge of the job.

  * a real two-host PyTorch DDP job (Debian's torch, gloo, CPU) submitted by the SageMaker SDK
    with distribution={"torch_distributed": ...}: each host logs its rank in its own stream, DDP's
    gradient is the mean of the ranks' local ones, both hosts end with the same weights, one
    model.tar.gz holds both hosts' files;
  * an MPI job over two hosts x two processes (mpirun from algo-1 through Kiln's remote launch,
    no sshd): four ranks, two per host;
  * a pytorchddp job (mpirun from algo-1, one process per CPU host, gloo at algo-1:7777);
  * ShardedByS3Key over two hosts (disjoint shares, union = the channel, object i on host i mod 2),
    and the hosts reach each other by name on any port;
  * host 2 exiting 1 fails the job naming algo-2, stops host 1, and leaves no process, namespace,
    veth or bridge behind, also when the server is killed -9 during the job and restarted.

Root only (namespaces need CAP_NET_ADMIN). One module server (range 10.231.0.0/16) runs the jobs,
submitted up front, one after the other (each takes the 2-core machine); the kill -9 test has a
server of its own (10.233.0.0/16)."""

import ipaddress
import json
import os
import subprocess
import time

import pytest

import network_helpers as nh
import sdk_helpers
import training_helpers as th
from training_helpers import sm, s3, logs  # noqa: F401 (module-scoped client fixtures)

CIDR = "10.231.0.0/16"
KILL_CIDR = "10.233.0.0/16"
KILN_CONFIG = nh.network_config(CIDR)
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.1.0-cpu-py310"
SHARD_OBJECTS = 7


@pytest.fixture(scope="module", autouse=True)
def _root():
    nh.require_root()


@pytest.fixture(scope="module", autouse=True)
def _stop_jobs_at_the_end(_root, module_kiln, sm):
    """Whatever a failed test left running is stopped before the module's server is."""
    yield
    nh.stop_running_jobs(sm)


@pytest.fixture(scope="module")
def bucket(module_kiln, s3):
    name = th.unique_name("dist")
    s3.create_bucket(Bucket=name)
    return name


def two_hosts(req):
    req["ResourceConfig"]["InstanceCount"] = 2
    return req


@pytest.fixture(scope="module")
def jobs(module_kiln, sm, s3, bucket, tmp_path_factory):
    """Every job of the module, submitted now in the order they run (FIFO, one at a time): the
    shard/peer probe, the failing pair, the MPI job, and the SDK's DDP job (its process imports
    the SDK first, so it queues last)."""
    out = {}
    keys = ["data/train/part-%02d.bin" % i for i in range(SHARD_OBJECTS)]
    for i, key in enumerate(keys):
        s3.put_object(Bucket=bucket, Key=key, Body=("object %d " % i).encode() * (i + 1))
    out["shard_keys"] = keys
    out["shard"] = th.unique_name("shard")
    ch = th.s3_channel("train", "s3://%s/data/train/" % bucket)
    ch["DataSource"]["S3DataSource"]["S3DataDistributionType"] = "ShardedByS3Key"
    sm.create_training_job(**two_hosts(th.training_request(
        out["shard"], bucket, image=nh.net_probe_image(), channels=[ch],
        hyperparameters={"channel": "train", "listen_port": "7123", "peer_port": "7123", "sleep": "3"})))

    out["fail"] = th.unique_name("fail")
    sm.create_training_job(**two_hosts(th.training_request(
        out["fail"], bucket, image=nh.net_probe_image(),
        hyperparameters={"fail_host": "algo-2", "fail_after": "10", "sleep": "300"})))

    with open(os.path.join(nh.DIST_DIR, "mpi", "mpi_ranks.py"), "rb") as f:
        s3.put_object(Bucket=bucket, Key="code/mpi/sourcedir.tar.gz", Body=th.make_tar_gz({"mpi_ranks.py": f.read()}))
    out["mpi"] = th.unique_name("mpi")
    sm.create_training_job(**two_hosts(th.training_request(
        out["mpi"], bucket, image=IMAGE, hyperparameters={
            "sagemaker_program": json.dumps("mpi_ranks.py"),
            "sagemaker_submit_directory": json.dumps("s3://%s/code/mpi/sourcedir.tar.gz" % bucket),
            "sagemaker_mpi_enabled": "true",
            "sagemaker_mpi_num_of_processes_per_host": "2",
            "sagemaker_mpi_custom_mpi_options": json.dumps("-x KILN_TEST_MPI=1"),
            "sagemaker_region": json.dumps("us-east-1"),
        })))

    with open(os.path.join(nh.DIST_DIR, "ddp", "pytorchddp_ranks.py"), "rb") as f:
        s3.put_object(Bucket=bucket, Key="code/pddp/sourcedir.tar.gz",
                      Body=th.make_tar_gz({"pytorchddp_ranks.py": f.read()}))
    out["pytorchddp"] = th.unique_name("pddp")
    sm.create_training_job(**two_hosts(th.training_request(
        out["pytorchddp"], bucket, image=IMAGE, hyperparameters={
            "sagemaker_program": json.dumps("pytorchddp_ranks.py"),
            "sagemaker_submit_directory": json.dumps("s3://%s/code/pddp/sourcedir.tar.gz" % bucket),
            "sagemaker_pytorch_ddp_enabled": "true",
            "sagemaker_instance_type": json.dumps("ml.m5.large"),
            "sagemaker_region": json.dumps("us-east-1"),
        })))

    lib = sdk_helpers.sdk_lib_dir()
    out["sdk"] = None
    if lib is not None:
        workdir = str(tmp_path_factory.mktemp("sdk-ddp"))
        runner = sdk_helpers.ScenarioRunner(module_kiln, workdir, lib)
        args = os.path.join(workdir, "args.json")
        with open(args, "w") as f:
            json.dump({"bucket": bucket, "image_uri": IMAGE, "instance_type": "ml.m5.large"}, f)
        result = os.path.join(workdir, "result.json")
        output = open(os.path.join(workdir, "out.txt"), "wb")
        proc = subprocess.Popen([sdk_helpers.SDK_PYTHON, os.path.join(nh.DIST_DIR, "sdk_ddp.py"), result, args],
                                cwd=workdir, env=runner.env(), stdin=subprocess.DEVNULL, stdout=output,
                                stderr=subprocess.STDOUT)
        output.close()
        out["sdk"] = {"proc": proc, "result": result, "output": os.path.join(workdir, "out.txt")}
    yield out
    if out["sdk"] and out["sdk"]["proc"].poll() is None:
        out["sdk"]["proc"].kill()
        out["sdk"]["proc"].wait()


def completed(sm, logs, server, name, timeout=300):
    d = th.wait_for_status(sm, name, timeout=timeout, server=server)
    assert d["TrainingJobStatus"] == "Completed", (
        d.get("FailureReason"), th.job_log_lines(logs, name)[-40:], server.log_tail(30))
    return d


def test_sharded_by_s3_key_and_hosts_reach_each_other(module_kiln, sm, s3, logs, jobs):
    name = jobs["shard"]
    d = completed(sm, logs, module_kiln, name, timeout=180)
    addresses = nh.check_namespaced(nh.netinfo(logs, name), CIDR)
    assert sorted(addresses) == ["algo-1", "algo-2"]

    streams = nh.host_streams(logs, name)
    shares = {}
    for host, lines in streams.items():
        shard = [json.loads(s) for s in nh.tagged(lines, "SHARD")]
        assert len(shard) == 1 and shard[0]["host"] == host, lines
        shares[host] = shard[0]["files"]
        # Each host reached the other by name at its port, and was reached from its address.
        other = "algo-2" if host == "algo-1" else "algo-1"
        assert "PEER %s ok" % other in lines, lines
        assert "ACCEPTED %s" % addresses[other] in lines, (host, lines, addresses)
    keys = sorted(k[len("data/train/"):] for k in jobs["shard_keys"])
    assert set(shares["algo-1"]).isdisjoint(shares["algo-2"]), shares
    assert sorted(list(shares["algo-1"]) + list(shares["algo-2"])) == keys, shares
    # Contract §6.4: sorted keys, object i on host i mod N.
    assert sorted(shares["algo-1"]) == keys[0::2] and sorted(shares["algo-2"]) == keys[1::2], shares
    for host, files in shares.items():
        for rel, digest in files.items():
            i = int(rel[len("part-"):len("part-") + 2])
            assert digest == th.sha256(("object %d " % i).encode() * (i + 1)), (host, rel)
    # Both hosts' model dirs are in the one model.tar.gz.
    files = th.model_files(s3, d)
    assert {"algo-1-net.json", "algo-2-net.json"} <= set(files), sorted(files)


def test_failing_host_fails_the_job_and_cleans_up(module_kiln, sm, logs, jobs):
    name = jobs["fail"]
    nh.wait_netinfo(logs, name, 2, timeout=240)
    footprint = nh.Footprint(module_kiln.data_dir, name)
    d = sm.describe_training_job(TrainingJobName=name)
    if d["TrainingJobStatus"] == "InProgress":
        # Taken while it runs: one bridge with a port per host, processes in 2 namespaces.
        assert len(footprint.bridges) == 1, footprint.describe()
        assert len(footprint.veths) == 2, footprint.describe()
        assert len(footprint.netns) >= 2, footprint.describe()
        assert sorted(nh.program_hosts(name)) == ["algo-1", "algo-2"], nh.program_hosts(name)
    check_failed_and_gone(sm, logs, module_kiln, name, footprint)


def check_failed_and_gone(sm, logs, server, name, footprint):
    d = th.wait_for_status(sm, name, timeout=120, server=server)
    assert d["TrainingJobStatus"] == "Failed", (d["TrainingJobStatus"], d.get("FailureReason"))
    assert "algo-2" in d["FailureReason"], d["FailureReason"]
    assert "failing on purpose" in d["FailureReason"] or "exit code: 1" in d["FailureReason"], d["FailureReason"]
    # Host 1 (sleeping 300 s) was stopped, not waited for.
    run = (d["TrainingEndTime"] - d["TrainingStartTime"]).total_seconds()
    assert run < 120, (run, d["SecondaryStatusTransitions"])
    streams = nh.host_streams(logs, name)
    assert "DONE algo-1" not in streams.get("algo-1", []), streams
    deadline = time.monotonic() + 30
    while footprint.left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert footprint.left() == {}, "left behind by the job (it had %s)" % footprint.describe()


def test_mpi_two_hosts_two_processes_each(module_kiln, sm, s3, logs, jobs):
    name = jobs["mpi"]
    d = completed(sm, logs, module_kiln, name, timeout=300)
    files = th.model_files(s3, d)
    ranks = {}
    for r in range(4):
        key = "mpi-rank-%d.json" % r
        assert key in files, sorted(files)
        ranks[r] = json.loads(files[key])
    assert all(v["size"] == 4 for v in ranks.values()), ranks
    # custom_mpi_options ("-x KILN_TEST_MPI=1") reached every rank, on both hosts.
    assert all(v["custom_option_env"] == "1" for v in ranks.values()), ranks
    by_host = {}
    for r, v in ranks.items():
        by_host.setdefault(v["host"], []).append(r)
    # -map-by slot with --host algo-1:2,algo-2:2: ranks 0, 1 on algo-1, 2, 3 on algo-2.
    assert by_host == {"algo-1": [0, 1], "algo-2": [2, 3]}, by_host
    assert ranks[0]["sum"] == 10 and sorted((g["rank"], g["host"]) for g in ranks[0]["gathered"]) == [
        (0, "algo-1"), (1, "algo-1"), (2, "algo-2"), (3, "algo-2")]
    net = ipaddress.ip_network(CIDR)
    addr = {h: {ranks[r]["address"] for r in rs} for h, rs in by_host.items()}
    assert all(len(a) == 1 for a in addr.values()) and addr["algo-1"] != addr["algo-2"], addr
    assert all(ipaddress.ip_address(next(iter(a))) in net for a in addr.values()), addr
    # The ranks' lines, printed on both hosts, come out of mpirun on algo-1 (--tag-output).
    lines = th.job_log_lines(logs, name)
    for r, v in ranks.items():
        assert any("mpi rank=%d size=4 host=%s" % (r, v["host"]) in line for line in lines), lines[-40:]


def test_pytorchddp_runs_one_process_per_host_through_mpirun(module_kiln, sm, s3, logs, jobs):
    """distribution={"pytorchddp": ...} as SageMaker launches it: mpirun from algo-1 over both hosts
    (the SMDataParallel runner; workers wait for it), one process per CPU host, the rendezvous
    variables of the PyTorch toolkit and SMDATAPARALLEL_* for a multi-host job."""
    name = jobs["pytorchddp"]
    d = completed(sm, logs, module_kiln, name, timeout=300)
    files = th.model_files(s3, d)
    ranks = {r: json.loads(files["pddp-rank-%d.json" % r]) for r in range(2) if "pddp-rank-%d.json" % r in files}
    assert sorted(ranks) == [0, 1], sorted(files)
    assert {r: (v["host"], v["world"], v["sum"]) for r, v in ranks.items()} == {
        0: ("algo-1", 2, 3.0), 1: ("algo-2", 2, 3.0)}, ranks
    assert all(v["master"] == "algo-1:7777" for v in ranks.values()), ranks
    assert ranks[0]["smdataparallel"] == {"SMDATAPARALLEL_USE_HOMOGENEOUS": "1", "SMDATAPARALLEL_SERVER_ADDR": "algo-1",
                                          "SMDATAPARALLEL_SERVER_PORT": "7592"}, ranks[0]
    lines = th.job_log_lines(logs, name)
    for r, v in ranks.items():
        assert any("pytorchddp rank=%d world=2 host=%s" % (r, v["host"]) in line for line in lines), lines[-40:]


def test_torch_distributed_ddp_through_the_sdk(module_kiln, sm, s3, logs, jobs):
    if jobs["sdk"] is None:
        pytest.skip("SageMaker Python SDK bundle not found (../shared/clients/sagemaker-python-sdk/lib "
                    "or KILN_SAGEMAKER_SDK_LIB)")
    proc = jobs["sdk"]["proc"]
    try:
        proc.wait(600)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    with open(jobs["sdk"]["output"], "rb") as f:
        output = f.read().decode("utf-8", "replace")
    assert proc.returncode == 0 and os.path.exists(jobs["sdk"]["result"]), (
        "the SDK's fit() failed (%s); its output (tail):\n%s\n--- server:\n%s"
        % (proc.returncode, "\n".join(output.splitlines()[-60:]), sdk_helpers.server_events(module_kiln)))
    with open(jobs["sdk"]["result"]) as f:
        result = json.load(f)
    name = result["job_name"]
    assert result["hyperparameters"].get("sagemaker_torch_distributed_enabled") in ("true", True), result
    d = sm.describe_training_job(TrainingJobName=name)
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    assert d["ResourceConfig"]["InstanceCount"] == 2
    assert d["ModelArtifacts"]["S3ModelArtifacts"] == result["model_data"]

    # Each host logged its rank in its own stream; torchrun's node rank is the host's index.
    streams = nh.host_streams(logs, name)
    assert sorted(streams) == ["algo-1", "algo-2"], sorted(streams)
    for host, rank in (("algo-1", 0), ("algo-2", 1)):
        assert any(("ddp rank=%d world=2 host=%s hostname=%s" % (rank, host, host)) in line
                   for line in streams[host]), (host, streams[host][-30:])
        assert not any("ddp rank=%d " % (1 - rank) in line for line in streams[host]), streams[host][-30:]

    # One model.tar.gz with both hosts' files.
    files = th.model_files(s3, d)
    assert {"algo-1.json", "algo-2.json"} <= set(files), sorted(files)
    w = {h: json.loads(files["%s.json" % h]) for h in ("algo-1", "algo-2")}
    assert (w["algo-1"]["rank"], w["algo-2"]["rank"]) == (0, 1) and w["algo-1"]["world"] == 2, w
    net = ipaddress.ip_network(CIDR)
    assert w["algo-1"]["address"] != w["algo-2"]["address"], w
    assert all(ipaddress.ip_address(v["address"]) in net for v in w.values()), w
    # All-reduced: at every step both ranks hold the mean of the two local gradients, which differ.
    for step in range(len(w["algo-1"]["steps"])):
        a, b = w["algo-1"]["steps"][step], w["algo-2"]["steps"][step]
        la, lb = flat(a["local_grad"]), flat(b["local_grad"])
        assert max(abs(x - y) for x, y in zip(la, lb)) > 1e-3, (step, la, lb)
        mean = [(x + y) / 2 for x, y in zip(la, lb)]
        for got in (flat(a["ddp_grad"]), flat(b["ddp_grad"])):
            assert max(abs(x - y) for x, y in zip(got, mean)) < 1e-4, (step, got, mean)
    # Identical weights at the end.
    assert w["algo-1"]["weights"] == w["algo-2"]["weights"], w
    assert w["algo-1"]["sha256"] == w["algo-2"]["sha256"]
    # fit(logs="All") streamed both hosts' lines.
    assert "ddp rank=0 done" in output and "ddp rank=1 done" in output, output[-3000:]


def flat(grads):
    return [x for part in grads for x in part]


def test_failure_cleanup_survives_kill_9_of_the_server(kiln_factory):
    """The server is killed -9 while both hosts run; host 2 fails while no server runs; after a
    restart on the same data dir the job is Failed naming algo-2, host 1 is stopped and nothing of
    the job is left on the node."""
    srv = kiln_factory("dist-kill9", config=nh.network_config(KILL_CIDR))
    sm, s3, logs = srv.client("sagemaker"), srv.client("s3"), srv.client("logs")
    bucket = th.unique_name("kill9")
    s3.create_bucket(Bucket=bucket)
    name = th.unique_name("kill9")
    sm.create_training_job(**two_hosts(th.training_request(
        name, bucket, image=nh.net_probe_image(),
        hyperparameters={"fail_host": "algo-2", "fail_after": "6", "sleep": "300"})))
    try:
        nh.check_namespaced(nh.wait_netinfo(logs, name, 2, timeout=120), KILL_CIDR)
        footprint = nh.Footprint(srv.data_dir, name)
        assert len(footprint.bridges) == 1 and len(footprint.veths) == 2, footprint.describe()
        assert sorted(nh.program_hosts(name)) == ["algo-1", "algo-2"], nh.program_hosts(name)
        srv.kill()
        # Host 2 exits while no server runs; host 1 sleeps on.
        th.wait_until(lambda: "algo-2" not in nh.program_hosts(name) or None, timeout=30,
                      what="host 2 to exit while the server is down")
        assert "algo-1" in nh.program_hosts(name)
        time.sleep(1)
        srv.start()
        sm, logs = srv.client("sagemaker"), srv.client("logs")
        check_failed_and_gone(sm, logs, srv, name, footprint)
        assert srv.healthy()
    finally:
        if not srv.alive():
            srv.start()
        nh.stop_running_jobs(srv.client("sagemaker"))
