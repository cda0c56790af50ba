"""Issue 15, the container runtime: a bring-your-own image (ENTRYPOINT + `train` / `serve` on 8080) run
through Podman's Docker-compatible socket behaves as the same program does on the process runtime.

One suite, parametrised over the runtime:
  process  the BYO program (container_images.ENTRY_PROGRAM) as `local:<dir>/entry` on a server with
           no container engine (today's behaviour)
  podman   the same program built into localhost/kiln-test-byo:<hash> (container_images.py), on a
           server whose `container_engine` has Podman's socket and `images` matching
           localhost/kiln-test-*; skipped with the reason when podman or its socket is unavailable

Both: the SageMaker SDK's Estimator(image_uri=...).fit() reading a channel and writing a model, then
Model(image_uri=...).deploy() and predict(); the failure file as FailureReason; a two-variant endpoint
updated to a new endpoint config under concurrent invoke load with no failed invoke; kill -9 of the
server while a job trains and an endpoint serves, restart on the same data dir: the job completes
with every log line once and the endpoint answers from the same instance (adopted, not relaunched);
a GPU instance type refused on this GPU-less host exactly as the process runtime refuses it.
Podman only: an image without `train`, a container that exits at once (job and endpoint), a missing
image, a name clash with a container Kiln did not create, an engine socket that does not answer (the
server keeps serving). After every test nothing of the server is left in the engine (containers
labelled kiln.server=<label>) nor on the node (bridges whose ifalias names its data dir).

Each runtime has one server for the module (network mode auto on a range of its own, shrink so that
several ml.m5.large share 2 cores, ml.m5.large declared 1 vCPU, no CPU fallback for GPU types).
"""

import collections
import ipaddress
import json
import os
import re
import subprocess
import threading
import time
import uuid

import pytest
from botocore.exceptions import ClientError

import container_images as ci
import endpoint_helpers as eh
import kiln_harness as kh
import network_helpers as nh
import sdk_helpers
import training_helpers as th

HERE = os.path.dirname(os.path.abspath(__file__))
SYS_NET = "/sys/class/net"
CIDRS = {"process": "10.241.0.0/16", "podman": "10.242.0.0/16"}
ROLE_ARN = "arn:aws:iam::000000000000:role/KilnContainerTest"


def server_config(runtime):
    config = {
        "scheduler": {"policy": "shrink", "allow_cpu_fallback": False},
        "training": {"stop_grace_seconds": 5},
        "endpoints": {"invocation_timeout_seconds": 10, "stop_grace_seconds": 5, "health_interval_seconds": 0.5},
        "network": {"mode": "auto", "cidr": CIDRS[runtime]},
        # One vCPU each, so that a job runs beside an endpoint's instance on 2 cores (training waits
        # for capacity; endpoint instances share it).
        "instance_types": [{"type": "ml.m5.large", "vcpus": 1}],
    }
    if runtime == "podman":
        config["container_engine"] = {"socket": ci.socket_uri(), "images": [ci.IMAGE_GLOB]}
    return config


class Env:
    """One runtime's server, clients, bucket and images."""

    def __init__(self, runtime, server, images):
        self.runtime = runtime
        self.server = server
        self.images = images
        self.image = images["byo"]
        self.label = ci.server_label(server.data_dir)
        self.sm = server.client("sagemaker")
        self.s3 = server.client("s3")
        self.logs = server.client("logs")
        self.rt = server.client("sagemaker-runtime")
        self.bucket = th.unique_name("ctr-" + runtime)
        self.s3.create_bucket(Bucket=self.bucket)

    @property
    def podman(self):
        return self.runtime == "podman"


@pytest.fixture(scope="module", params=["process", "podman"])
def env(request, kiln_binary, tmp_path_factory):
    runtime = request.param
    base = tmp_path_factory.mktemp("kiln-ctr-" + runtime)
    if runtime == "podman":
        ci.podman_or_skip()
        images = ci.all_images()
    else:
        images = {"byo": ci.host_program(str(base / "program"))}
    server = kh.KilnServer(str(base / "data"), config=server_config(runtime))
    server.start()
    e = Env(runtime, server, images)
    yield e
    try:
        if server.alive():
            cleanup(e)
    finally:
        if server.alive():
            rc = server.stop(timeout=60)
            assert rc == 0, "kiln server exited %s on SIGTERM; log tail:\n%s" % (rc, server.log_tail())


def cleanup(e):
    """Endpoints deleted and gone, jobs ended (instances outlive a stopped server by design)."""
    try:
        eh.delete_all_endpoints(e.sm, timeout=90)
    finally:
        stop_unfinished_jobs(e.sm)


def stop_unfinished_jobs(sm, timeout=60):
    names = []
    for status in ("InProgress", "Stopping"):
        for j in sm.list_training_jobs(StatusEquals=status, MaxResults=100)["TrainingJobSummaries"]:
            names.append(j["TrainingJobName"])
            if status == "InProgress":
                try:
                    sm.stop_training_job(TrainingJobName=j["TrainingJobName"])
                except ClientError:
                    pass
    for name in names:
        th.wait_for_status(sm, name, timeout=timeout)


def kiln_bridges_of(data_dir):
    """Links whose ifalias says Kiln made them for the server with `data_dir` ("kiln <state_dir> ...")."""
    out = []
    try:
        names = os.listdir(SYS_NET)
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(SYS_NET, name, "ifalias")) as f:
                alias = f.read().strip()
        except OSError:
            continue
        if alias.startswith("kiln ") and (" " + data_dir) in alias:
            out.append("%s (%s)" % (name, alias))
    return sorted(out)


def left_behind(e):
    what = []
    if e.podman:
        what += ["container %s (%s)" % c for c in ci.containers_of(e.label)]
    what += ["bridge " + b for b in kiln_bridges_of(e.server.data_dir)]
    return what


@pytest.fixture(autouse=True)
def nothing_leaked(env):
    """After every test: endpoints deleted, jobs ended, then nothing of the server left behind."""
    yield
    assert env.server.alive(), "the server died; log tail:\n%s" % env.server.log_tail()
    assert env.server.healthy(), "the server is unhealthy; log tail:\n%s" % env.server.log_tail()
    cleanup(env)
    deadline = time.monotonic() + 30
    while left_behind(env) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert left_behind(env) == [], "left behind after the test; server log tail:\n%s" % env.server.log_tail(30)


def podman_only(env):
    if not env.podman:
        pytest.skip("podman-only: the process runtime runs no images")


def put_channel(e, prefix, files):
    for name, text in files.items():
        e.s3.put_object(Bucket=e.bucket, Key="%s/%s" % (prefix, name), Body=text.encode())
    return "s3://%s/%s/" % (e.bucket, prefix)


def model_json(e, describe):
    files = th.model_files(e.s3, describe)
    assert "model.json" in files, sorted(files)
    return json.loads(files["model.json"])


def create_job(e, name, image=None, hyperparameters=None, channels=None, **extra):
    e.sm.create_training_job(**th.training_request(name, e.bucket, image=image or e.image,
                                                   hyperparameters=hyperparameters, channels=channels, **extra))


# ---------------------------------------------------------------------------------------------
# The SageMaker SDK: Estimator(image_uri=...).fit(), Model(image_uri=...).deploy(), predict()

SDK_SCENARIO = r'''
import json, os, sys, time
sys.path.insert(0, os.environ["KILN_TESTS_DIR"])
import sdk_helpers
args = json.load(open(sys.argv[1]))
sess = sdk_helpers.session(args["bucket"])
from sagemaker.estimator import Estimator
from sagemaker.model import Model
from sagemaker.predictor import Predictor
from sagemaker.serializers import JSONSerializer
from sagemaker.deserializers import JSONDeserializer

result = {}
t0 = time.monotonic()
data = sess.upload_data(args["data_dir"], key_prefix=args["prefix"])
est = Estimator(image_uri=args["image"], role=args["role"], instance_count=1, instance_type="ml.m5.large",
                hyperparameters={"channel": "train", "note": "from the sdk"}, sagemaker_session=sess,
                output_path="s3://%s/sdk-output" % args["bucket"], base_job_name="ctr-sdk")
est.fit({"train": data}, wait=False)        # the SDK's own wait sleeps 5 s between polls
job = est.latest_training_job.name
sess.wait_for_job(job, poll=1)
result["job"] = job
result["model_data"] = est.model_data
result["fit_seconds"] = time.monotonic() - t0

t1 = time.monotonic()
model = Model(image_uri=args["image"], model_data=est.model_data, role=args["role"], sagemaker_session=sess,
              env={"MODEL_TAG": "sdk"}, name=args["endpoint"] + "-m")
model.deploy(initial_instance_count=1, instance_type="ml.m5.large", endpoint_name=args["endpoint"],
             wait=False)                     # deploy()'s own wait polls every 30 s
sess.wait_for_endpoint(args["endpoint"], poll=1)
result["deploy_seconds"] = time.monotonic() - t1
predictor = Predictor(args["endpoint"], sagemaker_session=sess, serializer=JSONSerializer(),
                      deserializer=JSONDeserializer())
result["prediction"] = predictor.predict({"x": [1, 2, 3]})
predictor.delete_endpoint()
model.delete_model()
with open(sys.argv[2], "w") as f:
    json.dump(result, f)
'''


def run_sdk(e, tmp_path, args, timeout=240):
    lib = sdk_helpers.sdk_lib_dir()
    if lib is None:
        pytest.skip("the SageMaker Python SDK bundle is not there (set KILN_SAGEMAKER_SDK_LIB)")
    script = tmp_path / "sdk_scenario.py"
    script.write_text(SDK_SCENARIO)
    args_path, result_path = tmp_path / "args.json", tmp_path / "result.json"
    args_path.write_text(json.dumps(args))
    runner = sdk_helpers.ScenarioRunner(e.server, str(tmp_path / "sdk"), lib)
    environ = runner.env()
    environ["KILN_TESTS_DIR"] = HERE
    p = subprocess.run([sdk_helpers.SDK_PYTHON, str(script), str(args_path), str(result_path)], env=environ,
                       capture_output=True, text=True, timeout=timeout, cwd=str(tmp_path))
    if p.returncode != 0 or not result_path.exists():
        raise AssertionError("the SDK scenario exited %d; output tail:\n%s\n--- server:\n%s" % (
            p.returncode, "\n".join((p.stdout + p.stderr).splitlines()[-60:]), sdk_helpers.server_events(e.server)))
    return json.loads(result_path.read_text())


def test_sdk_fit_reads_a_channel_and_writes_a_model_then_deploy_serves_it(env, tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "a.csv").write_text("1,2\n3,4\n")
    (data_dir / "b.csv").write_text("5,6\n")
    endpoint = th.unique_name("ctr-sdk-ep")
    r = run_sdk(env, tmp_path, {"bucket": env.bucket, "data_dir": str(data_dir), "prefix": "sdk/train",
                                "image": env.image, "role": ROLE_ARN, "endpoint": endpoint})

    d = env.sm.describe_training_job(TrainingJobName=r["job"])
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    assert d["AlgorithmSpecification"]["TrainingImage"] == env.image
    assert d["ModelArtifacts"]["S3ModelArtifacts"] == r["model_data"]
    model = model_json(env, d)
    assert model["files"] == {"a.csv": "1,2\n3,4\n", "b.csv": "5,6\n"}, model
    assert model["hyperparameters"]["note"] == "from the sdk", model  # the SDK JSON-encodes them
    assert model["hostname"] == "algo-1"
    assert model["in_container"] is env.podman, model
    lines = th.job_log_lines(env.logs, r["job"])
    assert "training on 2 files of channel train" in lines and "model written" in lines, lines

    pred = r["prediction"]
    assert json.loads(pred["echo"]) == {"x": [1, 2, 3]}, pred
    assert pred["model"]["files"] == model["files"], pred
    assert pred["tag"] == "sdk" and pred["in_container"] is env.podman, pred
    th.wait_until(lambda: eh.endpoint_gone(env.sm, endpoint), timeout=60, what="endpoint %s deleted" % endpoint)
    print("%s: fit %.1f s, deploy %.1f s (SDK)" % (env.runtime, r["fit_seconds"], r["deploy_seconds"]))


def test_failure_file_is_the_failure_reason(env):
    name = th.unique_name("ctr-fail")
    text = "ValueError: the channel holds no rows (%s)" % env.runtime
    create_job(env, name, hyperparameters={"fail": "1", "failure_text": text},
               channels=[th.s3_channel("train", put_channel(env, "fail/train", {"x.csv": "1\n"}))])
    d = th.wait_for_status(env.sm, name, timeout=120, server=env.server)
    assert d["TrainingJobStatus"] == "Failed"
    assert d["FailureReason"] == text
    assert "failing as asked" in th.job_log_lines(env.logs, name)


def test_stop_training_job_delivers_sigterm_and_uploads_the_model(env):
    name = th.unique_name("ctr-stop")
    create_job(env, name, hyperparameters={"ticks": "300", "sigterm": "1"})
    th.wait_until(lambda: "tick 1" in th.job_log_lines(env.logs, name), timeout=60, what="tick 1 of %s" % name)
    env.sm.stop_training_job(TrainingJobName=name)
    d = th.wait_for_status(env.sm, name, timeout=60, server=env.server)
    assert d["TrainingJobStatus"] == "Stopped", (d["TrainingJobStatus"], d.get("FailureReason"))
    assert "caught SIGTERM" in th.job_log_lines(env.logs, name)
    files = th.model_files(env.s3, d)
    assert json.loads(files["stopped.json"]) == {"stopped": True, "hostname": "algo-1"}, sorted(files)


def test_two_hosts_reach_each_other_by_name(env):
    """A two-host job: algo-2 connects to algo-1:7777 by name (the job's network; on the container
    runtime each container in its holder's namespace), both hosts' models in one model.tar.gz."""
    name = th.unique_name("ctr-2host")
    req = th.training_request(name, env.bucket, image=env.image, hyperparameters={"rendezvous": "1"})
    req["ResourceConfig"]["InstanceCount"] = 2
    env.sm.create_training_job(**req)
    d = th.wait_for_status(env.sm, name, timeout=120, server=env.server)
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    files = th.model_files(env.s3, d)
    first, second = json.loads(files["model-algo-1.json"]), json.loads(files["model-algo-2.json"])
    assert (first["hostname"], second["hostname"]) == ("algo-1", "algo-2")
    assert first["in_container"] is env.podman and second["in_container"] is env.podman
    assert first["peers"] == ["algo-2"], first
    if os.geteuid() == 0:  # namespaced: algo-1 is reached at its own address in the server's range
        assert ipaddress.ip_address(second["peers"][0]) in ipaddress.ip_network(CIDRS[env.runtime]), second


@pytest.mark.skipif(os.geteuid() != 0, reason="per-instance networks (and so isolation) need root")
def test_network_isolation_keeps_the_node_and_kiln_out_of_reach(env):
    """EnableNetworkIsolation: the program reaches neither the node (a listener on its address) nor
    Kiln's endpoint; the same probes from a job without isolation connect (on the container runtime
    the container is in its holder's isolated namespace)."""
    listener = nh.NodeListener()
    try:
        target = "%s:%d" % (nh.node_address(), listener.port)
        hps = {"probes": target, "probe_endpoint": "1"}
        names = {}
        for isolated in (True, False):
            name = th.unique_name("ctr-iso" if isolated else "ctr-open")
            req = th.training_request(name, env.bucket, image=env.image, hyperparameters=hps)
            if isolated:
                req["EnableNetworkIsolation"] = True
            env.sm.create_training_job(**req)
            names[isolated] = name
        for isolated, name in names.items():
            d = th.wait_for_status(env.sm, name, timeout=120, server=env.server)
            assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
            model = json.loads(th.model_files(env.s3, d)["model.json"])
            assert model["in_container"] is env.podman
            probes = model["probes"]
            assert len(probes) == 2, probes
            if isolated:
                assert not any(probes.values()), probes
            else:
                assert all(probes.values()), probes
    finally:
        listener.close()


CONTRACTS = {}  # runtime -> contract.json of test_the_contract_inside_matches_the_process_runtime
# Variables that are the image's or the engine's, not Kiln's contract (design: env without PATH/HOME/LANG).
NOT_CONTRACT = {"PATH", "HOME", "LANG", "HOSTNAME", "TERM", "container", "PWD", "SHLVL", "_", "LC_CTYPE"}


def test_the_contract_inside_matches_the_process_runtime(env):
    """What the training program sees (training-contract.md): the variables Kiln sets, /dev/shm, the
    rlimits, /opt/ml and its config files, the host name. On podman, compared with what the same
    program saw on the process runtime earlier in this module (when that ran)."""
    name = th.unique_name("ctr-contract")
    create_job(env, name, hyperparameters={"contract": "1"},
               channels=[th.s3_channel("train", put_channel(env, "contract/train", {"c.csv": "1\n"}))])
    d = th.wait_for_status(env.sm, name, timeout=120, server=env.server)
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    c = json.loads(th.model_files(env.s3, d)["contract.json"])
    CONTRACTS[env.runtime] = c
    assert c["hostname"] == "algo-1"
    assert c["env"].get("TRAINING_JOB_NAME") == name, sorted(c["env"])
    assert c["env"].get("AWS_ENDPOINT_URL"), sorted(c["env"])
    assert {"hyperparameters.json", "resourceconfig.json", "inputdataconfig.json"} <= set(c["config_files"]), c
    assert c["shm_bytes"] > 64 << 20, c["shm_bytes"]  # not the engine's 64 MiB default
    if not env.podman:
        return
    p = CONTRACTS.get("process")
    if p is None:
        pytest.skip("the process runtime's half did not run in this session: nothing to compare with")
    ours = {k for k in c["env"] if k not in NOT_CONTRACT}
    theirs = {k for k in p["env"] if k not in NOT_CONTRACT}
    assert ours == theirs, ("only in the container: %s; only on the process runtime: %s"
                            % (sorted(ours - theirs), sorted(theirs - ours)))
    varying = {"TRAINING_JOB_NAME", "TRAINING_JOB_ARN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "S3_ENDPOINT_URL",
               "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "KILN_RSH_TOKEN"}
    differ = {k: (c["env"][k], p["env"][k]) for k in ours if k not in varying and c["env"][k] != p["env"][k]}
    assert differ == {}, differ
    assert (c["config_files"], c["ml_dirs"], c["uid"]) == (p["config_files"], p["ml_dirs"], p["uid"]), (c, p)
    # Limits as on the process runtime, except those the server said it lowered to the engine's own
    # hard limit (crun cannot raise them; logged at start as `container ulimits differ ... hard="nproc=N"`).
    lowered = {}
    for line in env.server.log_text().splitlines():
        m = re.search(r'msg="container ulimits differ from the server\'s" hard="([^"]*)"', line)
        if m:
            lowered = {k: int(v) for k, v in (item.split("=") for item in m.group(1).split(",") if item)}
    for limit, (soft, hard) in p["limits"].items():
        if limit in lowered:
            assert c["limits"][limit][1] == lowered[limit] and lowered[limit] < (hard if hard >= 0 else 1 << 62), \
                (limit, c["limits"][limit], hard, lowered)
        else:
            assert c["limits"][limit] == [soft, hard], (limit, c["limits"][limit], [soft, hard])
    # /dev/shm: container_engine.shm_fraction (0.5) of the instance's memory (ml.m5.large: 8 GiB, not
    # shrunk on this host). (The process runtime mounts a private tmpfs of the kernel's default size,
    # half the node's RAM, so the two differ here by design.)
    assert c["shm_bytes"] == 4 << 30, c["shm_bytes"]


# ---------------------------------------------------------------------------------------------
# Endpoints


class Load:
    """`threads` clients invoking one endpoint back to back until stop(); every answer and error kept."""

    def __init__(self, server, name, threads=4):
        self.server = server
        self.name = name
        self.answers = []  # (monotonic time, variant, tag)
        self.errors = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]
        for t in self._threads:
            t.start()

    def _run(self, i):
        rt = self.server.client("sagemaker-runtime", read_timeout=30)  # retries=1: no client retry
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                r = rt.invoke_endpoint(EndpointName=self.name, Body=json.dumps({"client": i, "n": n}).encode(),
                                       ContentType="application/json")
                body = json.loads(r["Body"].read())
                ok = json.loads(body["echo"]) == {"client": i, "n": n}
                with self._lock:
                    if ok:
                        self.answers.append((time.monotonic(), r["InvokedProductionVariant"], body["tag"]))
                    else:
                        self.errors.append("wrong echo %r" % body)
            except Exception as e:  # noqa: BLE001 (every failure counts)
                with self._lock:
                    self.errors.append(repr(e))

    def since(self, t):
        with self._lock:
            return [a for a in self.answers if a[0] >= t]

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join(60)


def create_model(e, name, tag, model_data=None, image=None):
    container = {"Image": image or e.image, "Environment": {"MODEL_TAG": tag}}
    if model_data:
        container["ModelDataUrl"] = model_data
    e.sm.create_model(ModelName=name, PrimaryContainer=container, ExecutionRoleArn=ROLE_ARN)


def test_two_variants_then_update_endpoint_under_load_fails_no_invoke(env):
    name = th.unique_name("ctr-2v")
    models = {}
    for tag in ("a", "b", "c"):
        data = eh.put_model(env.s3, env.bucket, "models/%s/%s.tar.gz" % (name, tag),
                            {"model.json": json.dumps({"model": tag}).encode()})
        models[tag] = name + "-" + tag
        create_model(env, models[tag], tag, data)
    eh.create_config(env.sm, name + "-1", [("VA", models["a"], 1, 1.0), ("VB", models["b"], 1, 3.0)])
    env.sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-1")
    eh.wait_endpoint(env.sm, name, timeout=120, server=env.server)

    load = Load(env.server, name)
    try:
        th.wait_until(lambda: len(load.answers) >= 300 or None, timeout=120, what="300 invocations")
        if os.geteuid() == 0:  # namespaced: the endpoint's bridge is there (the leak check is not vacuous)
            assert kiln_bridges_of(env.server.data_dir), "no bridge of the server found on the node"
        first = collections.Counter((v, tag) for _, v, tag in load.since(0))
        assert set(first) == {("VA", "a"), ("VB", "b")}, first
        assert first[("VB", "b")] > first[("VA", "a")], first  # weights 1:3

        # The new config: VA keeps model a at weight 1, VB goes, VC (model c) comes at weight 1.
        eh.create_config(env.sm, name + "-2", [("VA", models["a"], 1, 1.0), ("VC", models["c"], 1, 1.0)])
        env.sm.update_endpoint(EndpointName=name, EndpointConfigName=name + "-2")
        eh.wait_endpoint(env.sm, name, statuses=("Updating",), timeout=10, poll=0.05)
        d = eh.wait_endpoint(env.sm, name, timeout=180, server=env.server)
        assert d["EndpointConfigName"] == name + "-2"
        assert sorted(v["VariantName"] for v in d["ProductionVariants"]) == ["VA", "VC"], d["ProductionVariants"]
        done = time.monotonic()
        th.wait_until(lambda: len(load.since(done)) >= 200 or None, timeout=120, what="200 invocations after")
    finally:
        load.stop()
    after = collections.Counter((v, tag) for _, v, tag in load.since(done))
    assert set(after) == {("VA", "a"), ("VC", "c")}, after
    assert load.errors == [], "%d of %d invocations failed: %s" % (
        len(load.errors), len(load.errors) + len(load.answers), load.errors[:5])
    print("%s: %d invocations across UpdateEndpoint, none failed" % (env.runtime, len(load.answers)))
    env.sm.delete_endpoint(EndpointName=name)
    th.wait_until(lambda: eh.endpoint_gone(env.sm, name), timeout=60, what="endpoint %s deleted" % name)


# ---------------------------------------------------------------------------------------------
# kill -9 of the server: instances outlive it and the next server adopts them

TICKS = 10


def test_kill_9_mid_job_and_mid_serve_then_restart_adopts_both(env):
    endpoint = th.unique_name("ctr-adopt")
    create_model(env, endpoint + "-m", "adopted")
    eh.deploy(env.sm, endpoint, [("AllTraffic", endpoint + "-m", 1, 1.0)], server=env.server, timeout=120)
    before, _ = eh.invoke(env.rt, endpoint, body=b'{"before": 1}')

    job = th.unique_name("ctr-adopt-job")
    create_job(env, job, hyperparameters={"ticks": str(TICKS)},
               channels=[th.s3_channel("train", put_channel(env, "adopt/train", {"t.csv": "7\n"}))])
    th.wait_until(lambda: len([l for l in th.job_log_lines(env.logs, job) if l.startswith("tick ")]) >= 2,
                  timeout=60, what="two ticks of %s" % job)

    env.server.kill()
    killed_at = time.time()
    if env.podman:  # the containers run on without a server
        names = [n for n, state in ci.containers_of(env.label) if state == "running"]
        assert len(names) >= 2, ci.containers_of(env.label)
    # The instance answers on its own while no server runs (its address on the endpoint's network).
    for i in range(3):
        status, _, raw = kh.http_request("POST", "http://%s:%d/invocations" % (before["address"], before["port"]),
                                         {"Content-Type": "application/json"}, b'{"direct": 1}', timeout=5)
        assert status == 200 and json.loads(raw)["pid"] == before["pid"], (status, raw)
        time.sleep(0.5)
    env.server.start()

    d = th.wait_for_status(env.sm, job, timeout=120, server=env.server)
    assert d["TrainingJobStatus"] == "Completed", (d.get("FailureReason"), env.server.log_tail(40))
    assert d["TrainingStartTime"].timestamp() < killed_at < d["TrainingEndTime"].timestamp()
    run = (d["TrainingEndTime"] - d["TrainingStartTime"]).total_seconds()
    assert TICKS - 1 <= run < TICKS + 30, run  # ran once, not again from the start
    ticks = [l for l in th.job_log_lines(env.logs, job) if l.startswith("tick ")]
    assert ticks == ["tick %d" % i for i in range(TICKS)], ticks  # every line once
    # Stamped when printed (Podman 4.3 stamps whole seconds), not when the new server read them.
    stamps = [e["timestamp"] for s in th.job_streams(env.logs, job) for e in th.stream_events(env.logs, s)
              if e["message"].startswith("tick ")]
    assert stamps == sorted(stamps) and TICKS - 3 <= (stamps[-1] - stamps[0]) / 1000 <= TICKS + 1, stamps
    assert model_json(env, d)["files"] == {"t.csv": "7\n"}

    assert env.sm.describe_endpoint(EndpointName=endpoint)["EndpointStatus"] == "InService"
    for i in range(20):
        after, r = eh.invoke(env.rt, endpoint, body=json.dumps({"after": i}).encode())
        assert after["tag"] == "adopted"
        # The same process (container) answers: adopted, not relaunched.
        assert (after["started"], after["pid"], after["hostname"]) == (
            before["started"], before["pid"], before["hostname"]), (before, after)
    env.sm.delete_endpoint(EndpointName=endpoint)
    th.wait_until(lambda: eh.endpoint_gone(env.sm, endpoint), timeout=60, what="endpoint deleted")


# ---------------------------------------------------------------------------------------------
# A GPU shape on a host without GPUs


def test_gpu_instance_type_is_refused_on_a_gpu_less_host(env):
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("this host has a GPU")
    name = th.unique_name("ctr-gpu")
    with pytest.raises(ClientError) as info:
        create_job(env, name, instance_type="ml.p3.2xlarge")
    err = info.value.response["Error"]
    assert err["Code"] == "ResourceLimitExceeded", err
    assert err["Message"] == (
        "ml.p3.2xlarge needs 1 GPU (NVIDIA V100) per instance, but this host has no GPUs; set "
        "\"allow_cpu_fallback\": true in the scheduler section of the Kiln config to run GPU instance types "
        "on CPU"), err
    assert th.describe_error(env.sm, name)[0] == "ValidationException"

    # An endpoint variant of that type fails the same way.
    endpoint = th.unique_name("ctr-gpu-ep")
    create_model(env, endpoint + "-m", "gpu")
    env.sm.create_endpoint_config(EndpointConfigName=endpoint + "-cfg", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": endpoint + "-m", "InitialInstanceCount": 1,
        "InstanceType": "ml.p3.2xlarge"}])
    try:
        env.sm.create_endpoint(EndpointName=endpoint, EndpointConfigName=endpoint + "-cfg")
    except ClientError as e:
        reason = e.response["Error"]["Message"]
    else:
        d = eh.wait_endpoint(env.sm, endpoint, statuses=("Failed",), timeout=60)
        reason = d["FailureReason"]
    assert "ml.p3.2xlarge needs 1 GPU" in reason and "no GPUs" in reason, reason


# ---------------------------------------------------------------------------------------------
# Podman only: bad images and a bad engine


def test_image_without_train_fails_the_job_naming_the_problem(env):
    podman_only(env)
    name = th.unique_name("ctr-notrain")
    create_job(env, name, image=env.images["notrain"])
    d = th.wait_for_status(env.sm, name, timeout=120, server=env.server)
    assert d["TrainingJobStatus"] == "Failed"
    reason = d["FailureReason"]
    assert env.images["notrain"] in reason, reason
    assert "`train` not found" in reason or "train: not found" in reason, reason
    print("no train:", reason)


def test_container_that_exits_at_once(env):
    podman_only(env)
    job = th.unique_name("ctr-quits")
    create_job(env, job, image=env.images["quits"])
    d = th.wait_for_status(env.sm, job, timeout=120, server=env.server)
    assert d["TrainingJobStatus"] == "Failed"
    reason = d["FailureReason"]
    assert reason.startswith("AlgorithmError: ") and "exit code: 3" in reason, reason
    assert "quitting at once (train)" in th.job_log_lines(env.logs, job)
    print("quits (job):", d["FailureReason"])

    endpoint = th.unique_name("ctr-quits-ep")
    create_model(env, endpoint + "-m", "quits", image=env.images["quits"])
    eh.create_config(env.sm, endpoint + "-cfg", [("AllTraffic", endpoint + "-m", 1, 1.0)])
    env.sm.create_endpoint(EndpointName=endpoint, EndpointConfigName=endpoint + "-cfg")
    d = eh.wait_endpoint(env.sm, endpoint, statuses=("Failed",), timeout=120)
    assert "exited with code 3" in d["FailureReason"], d["FailureReason"]
    print("quits (endpoint):", d["FailureReason"])


def test_missing_image_names_the_image_and_what_was_tried(env):
    podman_only(env)
    image = "localhost/kiln-test-missing:%s" % uuid.uuid4().hex[:12]
    job = th.unique_name("ctr-missing")
    create_job(env, job, image=image)
    d = th.wait_for_status(env.sm, job, timeout=120, server=env.server)
    assert d["TrainingJobStatus"] == "Failed"
    reason = d["FailureReason"]
    assert reason.startswith("ClientError: ") and image in reason and "pulling" in reason, reason
    print("missing (job):", reason)

    endpoint = th.unique_name("ctr-missing-ep")
    create_model(env, endpoint + "-m", "missing", image=image)
    eh.create_config(env.sm, endpoint + "-cfg", [("AllTraffic", endpoint + "-m", 1, 1.0)])
    env.sm.create_endpoint(EndpointName=endpoint, EndpointConfigName=endpoint + "-cfg")
    d = eh.wait_endpoint(env.sm, endpoint, statuses=("Failed",), timeout=120)
    assert image in d["FailureReason"], d["FailureReason"]


def test_name_clash_with_a_foreign_container(env):
    """A container named as Kiln would name the job's instance (kiln-<server label>-training-<job>-algo-1)
    but not created by Kiln (no kiln.* labels): the job fails saying so, and the container is left
    alone."""
    podman_only(env)
    job = th.unique_name("ctr-clash")
    foreign = "kiln-%s-training-%s-algo-1" % (env.label, job)
    ci.podman("create", "--name", foreign, env.images["base"], "sleep", "1")
    try:
        create_job(env, job)
        d = th.wait_for_status(env.sm, job, timeout=120, server=env.server)
        assert d["TrainingJobStatus"] == "Failed", d.get("FailureReason")
        assert foreign in d["FailureReason"] and "was not created by this Kiln server" in d["FailureReason"], \
            d["FailureReason"]
        print("clash:", d["FailureReason"])
        exists = ci.podman("container", "exists", foreign, check=False).returncode == 0
        assert exists, "Kiln removed a container it did not create"
    finally:
        ci.podman("rm", "-f", foreign, check=False)


def test_unreachable_engine_socket_fails_the_job_and_the_server_keeps_serving(env, kiln_factory, tmp_path):
    podman_only(env)
    missing = str(tmp_path / "no-engine.sock")
    srv = kiln_factory("no-engine", config=dict(server_config("podman"), container_engine={
        "socket": "unix://" + missing, "images": [ci.IMAGE_GLOB]}, network={"mode": "host"}))
    sm, s3 = srv.client("sagemaker"), srv.client("s3")
    bucket = th.unique_name("ctr-noengine")
    s3.create_bucket(Bucket=bucket)
    job = th.unique_name("ctr-noengine")
    sm.create_training_job(**th.training_request(job, bucket, image=env.image))
    d = th.wait_for_status(sm, job, timeout=120, server=srv)
    assert d["TrainingJobStatus"] == "Failed"
    assert missing in d["FailureReason"] and "unreachable" in d["FailureReason"], d["FailureReason"]
    print("no engine:", d["FailureReason"])
    # The server keeps serving: S3, and a job of a host program (no engine needed).
    s3.put_object(Bucket=bucket, Key="k", Body=b"still here")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"still here"
    host = ci.host_program(str(tmp_path / "program"))
    ok = th.unique_name("ctr-noengine-ok")
    sm.create_training_job(**th.training_request(ok, bucket, image=host))
    assert th.wait_for_status(sm, ok, timeout=120, server=srv)["TrainingJobStatus"] == "Completed"
    assert srv.healthy()


def test_container_image_without_an_engine_configured_is_refused_clearly(env):
    """No container_engine section (the process runtime's server): an image URI that is neither
    `local:` nor an environment fails the job with a reason naming the image, as before issue 15."""
    if env.podman:
        pytest.skip("the podman server has a container_engine section")
    image = "localhost/kiln-test-byo:no-engine-configured"
    job = th.unique_name("ctr-nosection")
    create_job(env, job, image=image)
    d = th.wait_for_status(env.sm, job, timeout=120, server=env.server)
    assert d["TrainingJobStatus"] == "Failed"
    assert image in d["FailureReason"], d["FailureReason"]
    print("no section:", d["FailureReason"])


@pytest.fixture
def private_engine(env, tmp_path):
    podman_only(env)
    engine = ci.PrivateEngine(str(tmp_path / "engine.sock")).start()
    yield engine
    engine.kill()


def test_an_engine_that_dies_mid_job(env, kiln_factory, private_engine):
    """The engine (a Podman service of the test's own) killed while a job's container runs: back within
    container_engine.lost_after_seconds, the job completes with every line once; down for longer,
    the job fails naming the engine, the server keeps serving, and once the engine is back a
    restarted server removes the container (nothing left)."""
    srv = kiln_factory("engine-dies", config=dict(server_config("podman"), network={"mode": "host"}, container_engine={
        "socket": private_engine.uri, "images": [ci.IMAGE_GLOB], "lost_after_seconds": 4}))
    sm, s3, logs = srv.client("sagemaker"), srv.client("s3"), srv.client("logs")
    label = ci.server_label(srv.data_dir)
    bucket = th.unique_name("ctr-engine-dies")
    s3.create_bucket(Bucket=bucket)

    def ticks(job):
        return [l for l in th.job_log_lines(logs, job) if l.startswith("tick ")]

    short = th.unique_name("ctr-engine-back")
    sm.create_training_job(**th.training_request(short, bucket, image=env.image, hyperparameters={"ticks": "8"}))
    th.wait_until(lambda: len(ticks(short)) >= 2, timeout=60, what="two ticks of %s" % short)
    private_engine.kill()
    time.sleep(2)
    private_engine.start()
    d = th.wait_for_status(sm, short, timeout=120, server=srv)
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    assert ticks(short) == ["tick %d" % i for i in range(8)]

    long = th.unique_name("ctr-engine-gone")
    sm.create_training_job(**th.training_request(long, bucket, image=env.image, hyperparameters={"ticks": "300"}))
    th.wait_until(lambda: len(ticks(long)) >= 1, timeout=60, what="a tick of %s" % long)
    private_engine.kill()
    d = th.wait_for_status(sm, long, timeout=60, server=srv)
    assert d["TrainingJobStatus"] == "Failed", d
    assert private_engine.path in d["FailureReason"], d["FailureReason"]
    print("engine gone:", d["FailureReason"])
    assert srv.healthy()
    s3.put_object(Bucket=bucket, Key="k", Body=b"still serving")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"still serving"
    assert [state for _, state in ci.containers_of(label)] == ["running"]  # it could not be removed meanwhile

    private_engine.start()
    assert srv.stop() == 0
    srv.start()
    th.wait_until(lambda: ci.containers_of(label) == [], timeout=60, what="the lost job's container removed")
