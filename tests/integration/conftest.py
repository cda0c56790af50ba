"""Fixtures for the Kiln integration suite (see README.md in this directory)."""

import os
import shutil
import subprocess
import sys
import uuid

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import kiln_harness as kh  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: large transfers (300 MB); run by default, deselect with -m 'not slow'")


@pytest.fixture(scope="session")
def kiln_binary():
    path = kh.kiln_bin()
    if not os.access(path, os.X_OK):
        pytest.exit("kiln binary not found at %s (set KILN_BIN or build the `kiln` target)" % path, returncode=2)
    return path


@pytest.fixture(scope="session")
def kiln(kiln_binary, tmp_path_factory):
    """The shared server: started once per session, stopped with SIGTERM (exit status must be 0)."""
    base = tmp_path_factory.mktemp("kiln-shared")
    server = kh.KilnServer(str(base / "data"))
    server.start()
    yield server
    if server.alive():
        rc = server.stop()
        assert rc == 0, "kiln server exited %s on SIGTERM; log tail:\n%s" % (rc, server.log_tail())


@pytest.fixture
def kiln_factory(kiln_binary, tmp_path):
    """Starts extra servers with their own data dirs; every one still running is SIGTERMed at the end."""
    servers = []

    def start(name="extra", **kwargs):
        srv = kh.KilnServer(str(tmp_path / name / "data"), **kwargs)
        srv.start()
        servers.append(srv)
        return srv

    start.servers = servers
    yield start
    for srv in servers:
        if srv.alive():
            rc = srv.stop()
            assert rc == 0, "kiln server exited %s on SIGTERM; log tail:\n%s" % (rc, srv.log_tail())


@pytest.fixture(scope="session")
def s3(kiln):
    return kiln.client("s3")


@pytest.fixture
def bucket(s3, request):
    """A fresh bucket for one test."""
    name = ("t-%s-%s" % (request.node.name[:30], uuid.uuid4().hex[:8])).lower()
    name = "".join(c if c.isalnum() or c == "-" else "-" for c in name).strip("-")
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def aws(kiln, tmp_path):
    """Runs the AWS CLI (Debian's v2 by default) against the shared server."""
    cli = kh.aws_cli()
    if not cli:
        pytest.skip("no AWS CLI found (/usr/bin/aws or aws on PATH)")
    home = tmp_path / "awshome"
    home.mkdir(exist_ok=True)
    env = kiln.aws_env(str(home))

    def run(*args, check=True, timeout=300, cwd=None):
        cmd = [cli, "--endpoint-url", kiln.endpoint, "--no-cli-pager"] + [str(a) for a in args]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        if check and p.returncode != 0:
            raise AssertionError("%s failed (%d)\nstdout:\n%s\nstderr:\n%s"
                                 % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
        return p

    run.env = env
    run.cli = cli
    return run


@pytest.fixture(autouse=True)
def _shared_server_still_healthy(request):
    """After every test that used the shared server, it must still answer health checks."""
    yield
    if "kiln" in request.fixturenames:
        srv = request.getfixturevalue("kiln")
        assert srv.alive(), "shared kiln server died; log tail:\n%s" % srv.log_tail()
        assert srv.healthy(), "shared kiln server unhealthy after test; log tail:\n%s" % srv.log_tail()


@pytest.fixture(scope="module")
def module_kiln(kiln_binary, tmp_path_factory, request):
    """A server of its own for one test module, configured with the module's KILN_CONFIG (a dict,
    passed as --config) when it has one; SIGTERMed after the module (exit status must be 0)."""
    config = getattr(request.module, "KILN_CONFIG", None)
    base = tmp_path_factory.mktemp("kiln-" + request.module.__name__.rsplit(".", 1)[-1])
    server = kh.KilnServer(str(base / "data"), config=config)
    server.start()
    yield server
    if server.alive():
        rc = server.stop(timeout=60)
        assert rc == 0, "kiln server exited %s on SIGTERM; log tail:\n%s" % (rc, server.log_tail())
