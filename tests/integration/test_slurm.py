"""Issue 21, Kiln on a Slurm cluster: one Kiln server ("runtime": "slurm") in front of a real Slurm
cluster on this host (scripts/slurm-setup.sh: slurmctld on 10.77.0.1, slurmd kn1/kn2 at
10.77.0.11/.12, each node in its own network, UTS and mount namespace). Every instance is a Slurm
allocation; `kiln node` (started by srun) runs it on the node and mirrors /opt/ml, output and the
exit back to the server, which listens on 10.77.0.1 (the nodes' way in).

  * a training job (boto3): it ran on a Slurm node (eth0 10.77.0.1x), logs, model.tar.gz and
    checkpoints came back, nothing is left in squeue;
  * a two-host job: algo-1/algo-2 resolve to the two nodes and reach each other over TCP;
  * StopTrainingJob: Stopped, the model written in the SIGTERM handler uploaded;
  * `scontrol update nodename=... state=down` mid-job: Failed naming the node, squeue empty;
  * kill -9 of the server mid-job and a restart: adopted, Completed, the log complete;
  * an endpoint served from an allocation: invoke works, DeleteEndpoint leaves nothing in squeue;
  * a processing job: its EndOfJob output, written under /opt/ml/processing on the node, in S3;
  * a partition that does not exist: Failed with Slurm's words;
  * a pending job (partition kdown is DOWN): its status message names Slurm's reason.

Root only. One cluster and one server for the module (the tests run one after the other and
share them); skipped, saying why, when the cluster cannot start (no root, no slurm-wlm, no
network namespaces)."""

import fcntl
import os
import subprocess
import time

import pytest

import endpoint_helpers as eh
import kiln_harness as kh
import network_helpers as nh
import sdk_helpers
import training_helpers as th

HERE = os.path.dirname(os.path.abspath(__file__))
SETUP = os.path.join(kh.REPO_ROOT, "scripts", "slurm-setup.sh")
CTL_ADDR = "10.77.0.1"
NODE_ADDRS = {"kn1": "10.77.0.11", "kn2": "10.77.0.12"}
CLUSTER_LOCK = "/run/lock/kiln-slurm-cluster.lock"


def slurm_config(port):
    return {
        "runtime": "slurm",
        # Listening off loopback (the nodes' way in) needs configured credentials.
        "credentials": [{"access_key_id": "AKIASLURMTEST0000001", "secret_access_key": "kiln-slurm-test-secret-0001"}],
        "slurm": {"server_url": "http://%s:%d" % (CTL_ADDR, port), "node_command": [kh.kiln_bin()],
                  "scratch_dir": "/tmp", "poll_seconds": 1},
        "training": {"stop_grace_seconds": 10},
        # Processing images run as host programs under this interpreter (as in test_processing.py).
        "environments": [{"name": "kiln-proc", "images": ["*kiln-processing-python*"], "interpreter": "/usr/bin/python3"}],
        "endpoints": {"invocation_timeout_seconds": 5, "stop_grace_seconds": 5, "health_interval_seconds": 0.5},
    }


class SlurmKilnServer(kh.KilnServer):
    """The module's server: listens on the cluster bridge's address, which the tests use too."""

    @property
    def endpoint(self):
        return "http://%s:%d" % (CTL_ADDR, self.port)


def run(*cmd, check=True, timeout=60):
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError("%s failed (%d): %s %s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    return p


def squeue():
    """{job id: (name, state, reason, nodes)} of every job Slurm still lists."""
    out = {}
    for line in run("squeue", "-h", "-o", "%i|%j|%T|%r|%N").stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 5:
            out[parts[0]] = tuple(parts[1:])
    return out


def slurm_jobs_named(name):
    return {i: j for i, j in squeue().items() if j[0] == "kiln-" + name}


def wait_slurm_gone(name, timeout=40):
    """Until Slurm lists no job of `name` (a completing one included)."""
    return th.wait_until(lambda: not slurm_jobs_named(name), timeout=timeout,
                         what="Slurm to forget the jobs of %s (%s)" % (name, slurm_jobs_named(name)))


def nodes_ready():
    states = dict(line.split() for line in run("sinfo", "-N", "-h", "-p", "debug", "-o", "%N %T").stdout.splitlines())
    return all(states.get(n) in ("idle", "mixed", "allocated") for n in NODE_ADDRS)


@pytest.fixture(scope="module")
def cluster():
    if os.geteuid() != 0:
        pytest.skip("the Slurm test cluster needs root (network namespaces, a bridge, slurmd)")
    try:
        p = subprocess.run([SETUP, "up"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip("scripts/slurm-setup.sh could not run: %s" % e)
    if p.returncode != 0:
        lines = (p.stdout + p.stderr).strip().splitlines()
        pytest.skip("the Slurm test cluster cannot start: %s" % (lines[-1] if lines else "rc %d" % p.returncode))
    # One user of the cluster at a time (this module, bench/slurm_bench.py): the tests take nodes
    # down and count Slurm's jobs.
    lock = open(CLUSTER_LOCK, "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    yield
    lock.close()
    # Left up for the next run (setup is idempotent); `scripts/slurm-setup.sh down` removes it.


@pytest.fixture(scope="module")
def server(cluster, kiln_binary, tmp_path_factory):
    base = tmp_path_factory.mktemp("kiln-slurm")
    port = kh.free_port()
    srv = SlurmKilnServer(str(base / "data"), port=port, config=slurm_config(port), listen_host=CTL_ADDR)
    srv.start()
    yield srv
    if srv.alive():
        try:
            nh.stop_running_jobs(srv.client("sagemaker"))
            eh.delete_all_endpoints(srv.client("sagemaker"))
        finally:
            rc = srv.stop(timeout=60)
        assert rc == 0, "kiln server exited %s on SIGTERM; log tail:\n%s" % (rc, srv.log_tail())


@pytest.fixture(scope="module")
def sm(server):
    return server.client("sagemaker")


@pytest.fixture(scope="module")
def s3(server):
    return server.client("s3")


@pytest.fixture(scope="module")
def logs(server):
    return server.client("logs")


@pytest.fixture(scope="module")
def bucket(s3):
    name = th.unique_name("slurm")
    s3.create_bucket(Bucket=name)
    return name


def completed(sm, server, name, timeout=120):
    d = th.wait_for_status(sm, name, timeout=timeout, server=server)
    assert d["TrainingJobStatus"] == "Completed", (d.get("FailureReason"), server.log_tail(30))
    return d


def wait_log(logs, name, text, timeout=60):
    return th.wait_for_log_line(logs, name, lambda line: text in line, timeout=timeout)


def test_training_job_runs_on_a_slurm_node(server, sm, s3, logs, bucket):
    name = th.unique_name("slurm-train")
    sm.create_training_job(**th.training_request(
        name, bucket, image=nh.net_probe_image(), hyperparameters={"s3_put": "s3://%s/put/%s" % (bucket, name)}))
    d = completed(sm, server, name)
    info = nh.netinfo(logs, name)
    assert list(info) == ["algo-1"], info
    # It ran on a node: the node's eth0, not this machine's.
    assert info["algo-1"]["interface"]["address"] in NODE_ADDRS.values(), info
    # The instance reached the server (S3) through the endpoint URL it was given.
    assert s3.get_object(Bucket=bucket, Key="put/" + name)["Body"].read().decode().strip() == "algo-1"
    # The model written on the node came back before the exit was seen.
    assert "algo-1-net.json" in th.model_files(s3, d)
    wait_slurm_gone(name)


def test_checkpoints_and_model_come_back(server, sm, s3, logs, bucket):
    name = th.unique_name("slurm-ckpt")
    req = th.training_request(name, bucket, hyperparameters={"write_model": "from-the-node", "checkpoint": "ck-1",
                                                             "lines": "3"})
    req["CheckpointConfig"] = {"S3Uri": "s3://%s/ckpt/%s" % (bucket, name)}
    sm.create_training_job(**req)
    d = completed(sm, server, name)
    files = th.model_files(s3, d)
    assert files["partial.txt"] == b"from-the-node", sorted(files)
    ck = s3.get_object(Bucket=bucket, Key="ckpt/%s/ckpt-new.txt" % name)["Body"].read()
    assert ck == b"ck-1"
    lines = th.job_log_lines(logs, name)
    assert [line for line in lines if line.startswith("line ")] == ["line 0", "line 1", "line 2"], lines


def test_sagemaker_sdk_estimator(server, sm, bucket, tmp_path):
    lib = sdk_helpers.sdk_lib_dir()
    if lib is None:
        pytest.skip("SageMaker Python SDK bundle not found (../shared/clients/sagemaker-python-sdk/lib)")
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").write_text("x,y\n1,2\n")
    runner = sdk_helpers.ScenarioRunner(server, str(tmp_path / "sdk"), lib)
    result = runner.start("local_image_fit", {"bucket": bucket, "data_dir": str(data)}, timeout=180).result(server)
    d = result["describe"]
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    # fit(logs=True) streamed the program's lines from the node.
    assert "line 2" in result["output"], result["output"][-2000:]
    assert result["model_data"].endswith("model.tar.gz")


def test_two_hosts_on_two_nodes(server, sm, s3, logs, bucket):
    name = th.unique_name("slurm-two")
    req = th.training_request(name, bucket, image=nh.net_probe_image(),
                              hyperparameters={"listen_port": "7123", "peer_port": "7123", "sleep": "2"})
    req["ResourceConfig"]["InstanceCount"] = 2
    sm.create_training_job(**req)
    running = th.wait_until(lambda: slurm_jobs_named(name), timeout=60, what="the Slurm job of " + name)
    # One Slurm job for the two hosts.
    assert len(running) == 1, running
    d = completed(sm, server, name)
    info = nh.netinfo(logs, name)
    assert sorted(info) == ["algo-1", "algo-2"], info
    addrs = {h: i["interface"]["address"] for h, i in info.items()}
    assert sorted(addrs.values()) == sorted(NODE_ADDRS.values()), addrs
    for host, i in info.items():
        # Every algo-N resolves to its own node, on both hosts.
        assert i["resolves"] == addrs, (host, i["resolves"], addrs)
    streams = nh.host_streams(logs, name)
    assert "PEER algo-2 ok" in streams["algo-1"], streams["algo-1"]
    assert "PEER algo-1 ok" in streams["algo-2"], streams["algo-2"]
    assert {"algo-1-net.json", "algo-2-net.json"} <= set(th.model_files(s3, d))
    wait_slurm_gone(name)


def test_stop_training_job(server, sm, s3, logs, bucket):
    name = th.unique_name("slurm-stop")
    sm.create_training_job(**th.training_request(name, bucket, hyperparameters={"sigterm": "1", "ticks": "120"}))
    wait_log(logs, name, "tick 1")
    sm.stop_training_job(TrainingJobName=name)
    d = th.wait_for_status(sm, name, timeout=60, server=server)
    assert d["TrainingJobStatus"] == "Stopped", (d["TrainingJobStatus"], d.get("FailureReason"))
    files = th.model_files(s3, d)
    assert "sigterm.txt" in files, sorted(files)
    assert "caught SIGTERM" in th.job_log_lines(logs, name)
    wait_slurm_gone(name)


def test_scancel_by_someone_else(server, sm, logs, bucket):
    """scancel SIGTERMs every process of the step: `kiln node` stops the program itself (its TERM
    handler runs), still delivers the output and the exit, and the job fails saying Slurm ended it."""
    name = th.unique_name("slurm-scancel")
    sm.create_training_job(**th.training_request(name, bucket, hyperparameters={"sigterm": "1", "ticks": "120",
                                                                                "sigterm_exit": "3"}))
    wait_log(logs, name, "tick 1")
    jobs = slurm_jobs_named(name)
    assert len(jobs) == 1, jobs
    run("scancel", list(jobs)[0])
    d = th.wait_for_status(sm, name, timeout=60, server=server)
    assert d["TrainingJobStatus"] == "Failed", (d["TrainingJobStatus"], d.get("FailureReason"))
    assert "caught SIGTERM" in th.job_log_lines(logs, name)
    wait_slurm_gone(name)


def test_node_down_fails_the_job(server, sm, logs, bucket):
    name = th.unique_name("slurm-down")
    sm.create_training_job(**th.training_request(name, bucket, hyperparameters={"ticks": "120"}))
    wait_log(logs, name, "tick 1")
    jobs = slurm_jobs_named(name)
    assert len(jobs) == 1, jobs
    node = list(jobs.values())[0][3]
    assert node in NODE_ADDRS, jobs
    try:
        run("scontrol", "update", "nodename=" + node, "state=down", "reason=kiln-test")
        d = th.wait_for_status(sm, name, timeout=60, server=server)
        assert d["TrainingJobStatus"] == "Failed", (d["TrainingJobStatus"], d.get("FailureReason"))
        assert node in d["FailureReason"], d["FailureReason"]
        wait_slurm_gone(name)
    finally:
        run("scontrol", "update", "nodename=" + node, "state=resume", check=False)
        th.wait_until(nodes_ready, timeout=60, what="the nodes to be back")


def test_server_kill9_and_restart_adopts_the_job(server, sm, logs, bucket):
    name = th.unique_name("slurm-kill")
    sm.create_training_job(**th.training_request(name, bucket, hyperparameters={"ticks": "8"}))
    wait_log(logs, name, "tick 1")
    server.kill()
    time.sleep(2)  # the node keeps running and retrying meanwhile
    server.start()
    sm2 = server.client("sagemaker")
    logs2 = server.client("logs")
    completed(sm2, server, name, timeout=90)
    ticks = [line for line in th.job_log_lines(logs2, name) if line.startswith("tick ")]
    assert ticks == ["tick %d" % i for i in range(8)], ticks
    wait_slurm_gone(name)


def test_endpoint_from_an_allocation(server, sm, bucket):
    rt = server.client("sagemaker-runtime")
    name = eh.unique_name("slurm-ep")
    eh.create_model(sm, name + "-m")
    eh.deploy(sm, name, [("v1", name + "-m", 1, 1.0)], server=server, timeout=120)
    body, _ = eh.invoke(rt, name, b'{"x": 1}')
    assert isinstance(body, dict), body
    # The endpoint instance is a Slurm job of its own, named after the endpoint.
    def mine():
        return [j for j in squeue().values() if j[0].startswith("kiln-") and name in j[0]]

    assert [j for j in mine() if j[1] == "RUNNING"], squeue()
    sm.delete_endpoint(EndpointName=name)
    th.wait_until(lambda: eh.endpoint_gone(sm, name), timeout=60, what="endpoint deleted")
    th.wait_until(lambda: not mine(), timeout=40, what="Slurm to forget the endpoint's job (%s)" % squeue())


def test_processing_job_output_comes_back(server, sm, s3, bucket):
    name = th.unique_name("slurm-proc")
    code = ("import os, socket; os.makedirs('/opt/ml/processing/out/sub', exist_ok=True); "
            "open('/opt/ml/processing/out/sub/r.txt', 'w').write('from ' + socket.gethostname())")
    sm.create_processing_job(
        ProcessingJobName=name, RoleArn=th.ROLE_ARN, StoppingCondition={"MaxRuntimeInSeconds": 300},
        AppSpecification={"ImageUri": "kiln.test/kiln-processing-python:3.11",
                          "ContainerEntrypoint": ["python3", "-c", code]},
        ProcessingResources={"ClusterConfig": {"InstanceCount": 1, "InstanceType": "ml.m5.large",
                                               "VolumeSizeInGB": 1}},
        ProcessingOutputConfig={"Outputs": [{"OutputName": "out", "S3Output": {
            "S3Uri": "s3://%s/proc/%s" % (bucket, name), "LocalPath": "/opt/ml/processing/out",
            "S3UploadMode": "EndOfJob"}}]})

    def done():
        d = sm.describe_processing_job(ProcessingJobName=name)
        return d if d["ProcessingJobStatus"] in ("Completed", "Failed", "Stopped") else None

    d = th.wait_until(done, timeout=90, what="processing job " + name)
    assert d["ProcessingJobStatus"] == "Completed", (d.get("FailureReason"), d.get("ExitMessage"))
    body = s3.get_object(Bucket=bucket, Key="proc/%s/sub/r.txt" % name)["Body"].read()
    assert body == b"from algo-1", body
    wait_slurm_gone(name)


def test_partition_that_does_not_exist(server, sm, bucket):
    name = th.unique_name("slurm-nopart")
    sm.create_training_job(**th.training_request(
        name, bucket, Tags=[{"Key": "kiln:slurm-partition", "Value": "no-such-partition"}]))
    d = th.wait_for_status(sm, name, timeout=60, server=server)
    assert d["TrainingJobStatus"] == "Failed", d["TrainingJobStatus"]
    assert "invalid partition" in d["FailureReason"].lower(), d["FailureReason"]
    assert not slurm_jobs_named(name)


def test_pending_job_shows_slurms_reason(server, sm, bucket):
    name = th.unique_name("slurm-pend")
    sm.create_training_job(**th.training_request(
        name, bucket, Tags=[{"Key": "kiln:slurm-partition", "Value": "kdown"}]))

    def message():
        d = sm.describe_training_job(TrainingJobName=name)
        texts = [t.get("StatusMessage", "") for t in d.get("SecondaryStatusTransitions", [])]
        return [t for t in texts if "PartitionDown" in t]

    th.wait_until(message, timeout=30, what="a status message naming PartitionDown")
    sm.stop_training_job(TrainingJobName=name)
    d = th.wait_for_status(sm, name, timeout=60, server=server)
    assert d["TrainingJobStatus"] == "Stopped", (d["TrainingJobStatus"], d.get("FailureReason"))
    wait_slurm_gone(name)
