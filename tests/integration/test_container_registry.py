"""Issue 15: images pulled from a registry, ECR-style URIs through the operator's mirror.

A real registry (Debian's docker-registry, the CNCF distribution server) on loopback over plain HTTP
stands in for the mirror; Podman may talk HTTP to it through a registries.conf.d entry, which an
engine reads when it starts, so the test runs a Podman service of its own started after the entry
is written. The tests' BYO image is pushed to the registry under the mirror's prefix and is not in
the engine under the ECR URI or the mirror reference, so a job on
`123456789012.dkr.ecr.us-east-1.amazonaws.com/<repo>:<tag>` makes Kiln map it to
`127.0.0.1:<port>/ecr/<repo>:<tag>` and pull it, showing the pull in the job's status message, then
train. A tag the mirror lacks fails the job with a reason naming the URI, the mirror reference and
what to do. Skipped without Podman or the docker-registry package.
"""

import os
import shutil
import socket
import subprocess
import time
import uuid

import pytest

import container_images as ci
import kiln_harness as kh
import training_helpers as th

REGISTRY = "/usr/bin/docker-registry"
ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    ci.podman_or_skip()
    if not os.access(REGISTRY, os.X_OK):
        pytest.skip("docker-registry is not installed (scripts/install-deps.sh --test installs it)")
    root = tmp_path_factory.mktemp("registry")
    port = free_port()
    config = root / "config.yml"
    config.write_text("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\n"
                      "  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:%d\n" % (root / "data", port))
    log = open(str(root / "registry.log"), "wb")
    registry = subprocess.Popen([REGISTRY, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    conf_dir = "/etc/containers/registries.conf.d"
    os.makedirs(conf_dir, exist_ok=True)
    insecure = os.path.join(conf_dir, "zz-kiln-test-%d.conf" % port)
    with open(insecure, "w") as f:
        f.write('[[registry]]\nlocation = "127.0.0.1:%d"\ninsecure = true\n' % port)
    engine = None
    try:
        th.wait_until(lambda: _answers(port), timeout=20, what="the registry on 127.0.0.1:%d" % port)
        engine = ci.PrivateEngine(str(root / "engine.sock")).start()
        yield {"port": port, "engine": engine, "prefix": "127.0.0.1:%d/ecr" % port}
    finally:
        if engine is not None:
            engine.kill()
        registry.kill()
        registry.wait()
        log.close()
        os.unlink(insecure)
        shutil.rmtree(str(root / "data"), ignore_errors=True)


def _answers(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def server(mirror, tmp_path_factory):
    base = tmp_path_factory.mktemp("kiln-registry")
    srv = kh.KilnServer(str(base / "data"), config={
        "scheduler": {"policy": "shrink", "allow_cpu_fallback": False},
        "network": {"mode": "host"},
        "container_engine": {"socket": mirror["engine"].uri, "images": [ci.IMAGE_GLOB, "*.dkr.ecr.*"],
                             "ecr_mirror": mirror["prefix"]},
    })
    srv.start()
    yield srv
    if srv.alive():
        assert srv.stop(timeout=60) == 0, srv.log_tail()


def test_an_ecr_uri_is_pulled_from_the_mirror_with_progress_and_trains(mirror, server, tmp_path):
    byo = ci.all_images()["byo"]
    repo, tag = "kiln-test-byo-pulled", uuid.uuid4().hex[:12]
    mirrored = "%s/%s:%s" % (mirror["prefix"], repo, tag)
    # The BYO image plus a layer of 64 MB of random bytes that only the registry keeps (built, pushed,
    # removed here), so that the pull really downloads and reports progress.
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Containerfile").write_text("FROM %s\nRUN head -c 64000000 /dev/urandom > /opt/ballast\n" % byo)
    local = "localhost/kiln-test-pushme:" + tag
    ci.podman("build", "-q", "-t", local, str(context))
    ci.podman("push", "-q", "--tls-verify=false", local, mirrored)
    ci.podman("rmi", local)
    assert not ci.image_exists(mirrored)
    sm, s3 = server.client("sagemaker"), server.client("s3")
    bucket = th.unique_name("registry")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="train/a.txt", Body=b"pulled")
    job = th.unique_name("ecr-pull")
    uri = "%s/%s:%s" % (ECR, repo, tag)
    try:
        sm.create_training_job(**th.training_request(job, bucket, image=uri))
        messages = []  # the current transition's StatusMessage as it changes
        deadline = time.time() + 180
        while time.time() < deadline:
            d = sm.describe_training_job(TrainingJobName=job)
            current = (d.get("SecondaryStatusTransitions") or [{}])[-1].get("StatusMessage")
            if current and (not messages or messages[-1] != current):
                messages.append(current)
            if d["TrainingJobStatus"] in ("Completed", "Failed", "Stopped"):
                break
            time.sleep(0.05)
        assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
        print("status messages:", messages)
        pulling = [m for m in messages if m.startswith("Downloading the training image " + uri)]
        assert pulling, messages
        # While it pulls, the message names the mirror's reference (then its progress: Podman 4.3's
        # compat pull reports layers, not bytes, and this pull of one 64 MB layer over loopback takes
        # under a second, the status row's write interval).
        assert any("(mirror %s/%s:%s)" % (mirror["prefix"], repo, tag) in m for m in pulling), pulling
        assert ci.image_exists(mirrored), "the engine does not have the mirror's reference after the pull"
        files = th.model_files(s3, d)
        assert "model.json" in files
    finally:
        ci.podman("rmi", "-f", mirrored, check=False)


def test_a_tag_the_mirror_lacks_fails_the_job_naming_both_references(mirror, server):
    sm, s3 = server.client("sagemaker"), server.client("s3")
    bucket = th.unique_name("registry-miss")
    s3.create_bucket(Bucket=bucket)
    job = th.unique_name("ecr-miss")
    uri = "%s/kiln-test-nowhere:%s" % (ECR, uuid.uuid4().hex[:8])
    sm.create_training_job(**th.training_request(job, bucket, image=uri))
    d = th.wait_for_status(sm, job, timeout=120, server=server)
    assert d["TrainingJobStatus"] == "Failed"
    reason = d["FailureReason"]
    assert reason.startswith("ClientError: "), reason
    assert uri in reason and mirror["prefix"] + "/kiln-test-nowhere" in reason and "mirror" in reason, reason
    print("missing in the mirror:", reason)
