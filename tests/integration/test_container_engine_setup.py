"""Issue 15, the server side of the container engine (no jobs): the `container_engine` config
section at start (the engine named in the log, or an engine that does not answer logged without
stopping the server, a bad section refused naming the key), and `kiln images` (no engine
configured, an engine that does not answer, Podman's images as a table and as JSON). Jobs and
endpoints on container images are test_container_runtime.py's. Tests that need Podman skip with
kh.podman_socket()'s reason when it does not answer (scripts/podman-setup.sh sets it up)."""

import http.client
import json
import os
import re
import socket
import subprocess

import pytest

import kiln_harness as kh


def podman_or_skip():
    path, why = kh.podman_socket()
    if path is None:
        pytest.skip(why)
    return path


def log_lines(srv, msg):
    return [line for line in srv.log_text().splitlines() if 'msg="%s"' % msg in line]


def run_kiln(*args, timeout=60):
    return subprocess.run([kh.kiln_bin(), *args], capture_output=True, text=True, timeout=timeout)


def write_config(tmp_path, doc, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=30)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(self._path)


def engine_images(path):
    """The engine's own answer to GET /images/json, for comparing with `kiln images`."""
    conn = _UnixHTTPConnection(path)
    try:
        conn.request("GET", "/v1.41/images/json")
        response = conn.getresponse()
        assert response.status == 200
        return json.loads(response.read())
    finally:
        conn.close()


def test_server_with_an_unreachable_engine_starts_and_says_so(kiln_factory, tmp_path):
    missing = str(tmp_path / "no-engine.sock")
    srv = kiln_factory("no-engine", config={"container_engine": {"socket": missing}})
    assert srv.healthy()
    lines = log_lines(srv, "container engine unreachable")
    assert lines, srv.log_tail()
    assert "unix://" + missing in lines[0], lines[0]
    assert "podman system service" in lines[0], lines[0]
    # The rest of the server works: S3 and the SageMaker API.
    srv.client("s3").list_buckets()
    srv.client("sagemaker").list_training_jobs()


def test_server_names_the_engine_it_found(kiln_factory):
    path = podman_or_skip()
    srv = kiln_factory("podman", config=kh.container_engine_config(path))
    lines = log_lines(srv, "container engine")
    assert lines, srv.log_tail()
    line = lines[0]
    assert "address=unix://" + path in line, line
    assert re.search(r'name="?Podman Engine', line), line
    assert re.search(r"\bversion=\d+\.\d+", line), line
    assert "gpus=devices" in line, line  # auto: the device nodes on Podman (its compat API ignores CDI)
    # server_label: the first 8 hex digits of the SHA-256 of the data dir's path.
    import hashlib
    label = hashlib.sha256(os.path.realpath(srv.data_dir).encode()).hexdigest()[:8]
    assert "server_label=%s" % label in line, line
    assert not log_lines(srv, "container engine unreachable")


def test_server_without_the_section_has_no_engine(kiln):
    assert not log_lines(kiln, "container engine")
    assert not log_lines(kiln, "container engine unreachable")


def test_a_bad_container_engine_section_is_refused_naming_the_key(tmp_path):
    config = write_config(tmp_path, {"container_engine": {"socket": "/run/podman/podman.sock", "gpus": "all"}})
    p = run_kiln("server", "--listen", "127.0.0.1:%d" % kh.free_port(), "--data-dir", str(tmp_path / "data"),
                 "--config", config, timeout=30)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "container_engine.gpus must be" in p.stderr, p.stderr
    config = write_config(tmp_path, {"container_engine": {"socket": "tcp://127.0.0.1:2375"}}, "tcp.json")
    p = run_kiln("images", "--config", config)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "container_engine.socket must be a Unix socket" in p.stderr, p.stderr


def test_kiln_images_without_an_engine_says_what_to_set(tmp_path):
    p = run_kiln("images", "--data-dir", str(tmp_path / "data"))
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == ""
    assert "no container engine is configured" in p.stderr, p.stderr
    assert "container_engine.socket" in p.stderr, p.stderr


def test_kiln_images_with_an_unreachable_engine_says_where_and_how_to_start_it(tmp_path):
    missing = str(tmp_path / "no-engine.sock")
    config = write_config(tmp_path, {"container_engine": {"socket": "unix://" + missing}})
    p = run_kiln("images", "--config", config, "--data-dir", str(tmp_path / "data"))
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == ""
    assert "unix://" + missing in p.stderr, p.stderr
    assert "unreachable" in p.stderr, p.stderr
    assert "podman system service --time=0 unix://" + missing in p.stderr, p.stderr


def test_kiln_images_lists_the_engines_images(tmp_path):
    path = podman_or_skip()
    config = write_config(tmp_path, kh.container_engine_config(path))
    def ids(images):
        return {i["Id"] if i["Id"].startswith("sha256:") else "sha256:" + i["Id"]: i for i in images}

    before = ids(engine_images(path))
    p = run_kiln("images", "--config", config, "--data-dir", str(tmp_path / "data"), "--json")
    after = ids(engine_images(path))
    assert p.returncode == 0, p.stderr
    listed = {image["id"]: image for image in json.loads(p.stdout)}
    # Other tests build and remove images meanwhile: what the engine had before and after is
    # listed, and nothing it had at neither time.
    stable = set(before) & set(after)
    assert stable <= set(listed), (sorted(stable - set(listed)), listed)
    assert set(listed) <= set(before) | set(after), sorted(set(listed) - set(before) - set(after))
    for image_id in stable:
        mine, theirs = listed[image_id], after[image_id]
        assert mine["size_bytes"] == theirs["Size"], (mine, theirs)
        assert sorted(mine["repo_tags"]) == sorted(theirs.get("RepoTags") or []), (mine, theirs)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", mine["created"]), mine
    common = [after[i] for i in stable]

    p = run_kiln("images", "--config", config, "--data-dir", str(tmp_path / "data"))
    assert p.returncode == 0, p.stderr
    rows = p.stdout.splitlines()
    assert re.fullmatch(r"REPOSITORY:TAG\s+IMAGE ID\s+SIZE\s+CREATED", rows[0]), rows[0]
    for row in rows[1:]:
        assert re.fullmatch(r"\S+:\S+\s+[0-9a-f]{12}\s+[0-9.]+[kMGT]?B\s+.* ago", row), row
    tags = {row.split()[0] for row in rows[1:]}
    for image in common:
        for tag in image.get("RepoTags") or []:
            assert tag in tags, (tag, rows)


def test_a_restart_with_the_engine_down_keeps_a_running_container_jobs_network(kiln_factory, tmp_path):
    """kill -9 of the server mid-job, then a server whose engine does not answer: the job's network
    (held by its holder) is not swept at start; with the engine back the job is stopped and its
    container and network go."""
    path = podman_or_skip()
    import container_images as ci
    import training_helpers as th
    try:
        image = ci.byo_image()
    except ci.Unavailable as e:
        pytest.skip(str(e))
    cidr = "10.247.0.0/16"  # this test's own range
    config = {"container_engine": {"socket": "unix://" + path, "images": [ci.IMAGE_GLOB]},
              "network": {"mode": "auto", "cidr": cidr}, "training": {"stop_grace_seconds": 2},
              "scheduler": {"policy": "shrink"}}
    srv = kiln_factory("engine-down", config=config)
    if log_lines(srv, "instances share the node's network"):
        pytest.skip("per-instance networks are not available here (not root?)")
    sm, s3 = srv.client("sagemaker"), srv.client("s3")
    bucket = th.unique_name("h5-engine-down")
    s3.create_bucket(Bucket=bucket)
    job = th.unique_name("h5-engine-down")
    sm.create_training_job(**th.training_request(job, bucket, image=image, hyperparameters={"ticks": "120"}))
    d = None
    try:
        th.wait_for_secondary(sm, job, ["Training"], timeout=90)
        created = [l for l in srv.log_text().splitlines() if 'msg="network created"' in l and job in l]
        assert created, srv.log_tail()
        bridge = re.search(r"bridge=(\S+)", created[0]).group(1)
        assert os.path.exists("/sys/class/net/" + bridge)
        # The container runs in the job's network, not the node's.
        names = [c[0] for c in ci.containers_of(ci.server_label(srv.data_dir)) if job in c[0]]
        assert len(names) == 1, names
        status, inspected = ci.engine_request("GET", "/v1.41/containers/%s/json" % names[0])
        assert status == 200, inspected
        pid = inspected["State"]["Pid"]
        assert os.readlink("/proc/%d/ns/net" % pid) != os.readlink("/proc/self/ns/net"), (
            "the container is on the node's network (NetworkMode %s)" % inspected["HostConfig"]["NetworkMode"])

        srv.kill()
        srv.config = dict(config, container_engine={"socket": str(tmp_path / "engine-down.sock"),
                                                    "images": [ci.IMAGE_GLOB]})
        srv.config_path = None  # rewritten from srv.config at start
        srv.start()
        start = srv.log_text().rsplit("===== start #1", 1)[1]
        assert 'msg="container engine unreachable"' in start, start[-3000:]
        swept = [l for l in start.splitlines() if 'msg="per-instance networks"' in l]
        assert swept and "swept=none" in swept[0], swept or start[-3000:]
        assert os.path.exists("/sys/class/net/" + bridge), "the running job's network was swept"
        assert srv.healthy()

        assert srv.stop() == 0
        srv.config = config
        srv.config_path = None
        srv.start()
        sm = srv.client("sagemaker")
    finally:
        if srv.alive():
            srv.client("sagemaker").stop_training_job(TrainingJobName=job)
            d = th.wait_for_status(srv.client("sagemaker"), job, timeout=90)
    assert d is not None and d["TrainingJobStatus"] == "Stopped", d
    th.wait_until(lambda: not os.path.exists("/sys/class/net/" + bridge), timeout=30, what="bridge removed")
    assert not [c for c in ci.containers_of(ci.server_label(srv.data_dir)) if job in c[0]]
