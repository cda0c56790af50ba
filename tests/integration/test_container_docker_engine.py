"""Issue 15: the container runtime on a Docker Engine, as far as this machine can show it.

No Docker engine runs here. What differs for Kiln between the two engines behind the same API is what
`GET /version` says (Podman: ns:<path> network mode, device-node GPUs; Docker: neither, device
requests), so the stand-in is Podman's socket behind a proxy that answers /version as Docker Engine
28 does and passes every other call through byte for byte (Kiln connects once per call, so the first
request line of a connection says what the call is).

Shown: a server on "Docker" under network.mode auto, as root, keeps every instance on the node's
network and says why at start; a BYO training job then runs on it (algo-1 is 127.0.0.1) and an
endpoint serves; under network.mode namespaces a container job fails saying to use Podman's socket
or another mode, and nothing is left behind.
"""

import json
import os
import socket
import threading

import pytest

import container_images as ci
import endpoint_helpers as eh
import kiln_harness as kh
import training_helpers as th

DOCKER_VERSION = {
    "Platform": {"Name": "Docker Engine - Community"},
    "Components": [{"Name": "Engine", "Version": "28.2.2",
                    "Details": {"ApiVersion": "1.50", "MinAPIVersion": "1.24", "Os": "linux", "Arch": "amd64"}}],
    "Version": "28.2.2", "ApiVersion": "1.50", "MinAPIVersion": "1.24", "Os": "linux", "Arch": "amd64",
}


class DockerLookalike:
    """A Unix socket that answers /version as Docker Engine and relays everything else to Podman."""

    def __init__(self, path, upstream):
        self.path = path
        self.upstream = upstream
        self.version_calls = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(64)
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        head = b""
        while b"\r\n" not in head:
            chunk = conn.recv(65536)
            if not chunk:
                conn.close()
                return
            head += chunk
        target = head.split(b"\r\n", 1)[0].split(b" ")[1].decode()
        if target.split("?")[0].endswith("/version"):
            self.version_calls += 1
            body = json.dumps(DOCKER_VERSION).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nApi-Version: 1.50\r\n"
                         b"Server: Docker/28.2.2 (linux)\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                         % (len(body), body))
            conn.close()
            return
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.connect(self.upstream)
        except OSError:
            conn.close()
            return
        up.sendall(head)

        def pump(src, dst):
            try:
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        threading.Thread(target=pump, args=(up, conn), daemon=True).start()
        pump(conn, up)

    def close(self):
        self.closed = True
        self.sock.close()


@pytest.fixture(scope="module")
def lookalike(tmp_path_factory):
    ci.podman_or_skip()
    path = str(tmp_path_factory.mktemp("docker-lookalike") / "docker.sock")
    proxy = DockerLookalike(path, ci.socket_path())
    yield proxy
    proxy.close()


def docker_config(socket_path, mode):
    return {
        "scheduler": {"policy": "shrink", "allow_cpu_fallback": False},
        "training": {"stop_grace_seconds": 5},
        "endpoints": {"stop_grace_seconds": 5, "health_interval_seconds": 0.5},
        "network": {"mode": mode, "cidr": "10.246.0.0/16"},
        "instance_types": [{"type": "ml.m5.large", "vcpus": 1}],
        # The server reads the engine's hard limits from its socket's peer, here the proxy (this
        # Python process): nproc as an operator behind a socket proxy would set it.
        "container_engine": {"socket": "unix://" + socket_path, "images": [ci.IMAGE_GLOB],
                             "ulimits": {"nproc": [4096, 4096]}},
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="network.mode auto only picks namespaces as root")
def test_docker_engine_under_auto_runs_instances_on_the_nodes_network(lookalike, kiln_factory):
    images = ci.all_images()
    srv = kiln_factory("docker-auto", config=docker_config(lookalike.path, "auto"))
    log = srv.log_text()
    assert "cannot join a container to a network namespace" in log, log[-3000:]
    assert lookalike.version_calls >= 1
    sm, s3, rt = srv.client("sagemaker"), srv.client("s3"), srv.client("sagemaker-runtime")
    label = ci.server_label(srv.data_dir)
    bucket = th.unique_name("docker-auto")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="train/a.txt", Body=b"hello")
    job = th.unique_name("docker-auto")
    sm.create_training_job(**th.training_request(job, bucket, image=images["byo"],
                                                 hyperparameters={"rendezvous": "1"}))
    d = th.wait_for_status(sm, job, timeout=120, server=srv)
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    model = json.loads(th.model_files(s3, d)["model.json"])
    assert model["in_container"] is True and model["hostname"] == "algo-1", model

    endpoint = th.unique_name("docker-ep")
    sm.create_model(ModelName=endpoint + "-m", ExecutionRoleArn="arn:aws:iam::000000000000:role/K",
                    PrimaryContainer={"Image": images["byo"], "ModelDataUrl": d["ModelArtifacts"]["S3ModelArtifacts"]})
    eh.create_config(sm, endpoint + "-cfg", [("AllTraffic", endpoint + "-m", 1, 1.0)])
    sm.create_endpoint(EndpointName=endpoint, EndpointConfigName=endpoint + "-cfg")
    eh.wait_endpoint(sm, endpoint, timeout=120)
    out = rt.invoke_endpoint(EndpointName=endpoint, Body=b'{"x": 1}', ContentType="application/json")
    assert out["Body"].read()
    eh.delete_all_endpoints(sm, timeout=90)
    assert ci.containers_of(label) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="network.mode namespaces needs root")
def test_docker_engine_under_namespaces_refuses_container_instances_clearly(lookalike, kiln_factory):
    images = ci.all_images()
    srv = kiln_factory("docker-ns", config=docker_config(lookalike.path, "namespaces"))
    sm, s3 = srv.client("sagemaker"), srv.client("s3")
    label = ci.server_label(srv.data_dir)
    bucket = th.unique_name("docker-ns")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="train/a.txt", Body=b"hello")
    job = th.unique_name("docker-ns")
    sm.create_training_job(**th.training_request(job, bucket, image=images["byo"]))
    d = th.wait_for_status(sm, job, timeout=120, server=srv)
    assert d["TrainingJobStatus"] == "Failed"
    assert "Podman" in d["FailureReason"] and "network.mode" in d["FailureReason"], d["FailureReason"]
    print("docker + namespaces:", d["FailureReason"])
    assert ci.containers_of(label) == []
