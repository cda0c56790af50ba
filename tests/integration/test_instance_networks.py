"""Issue 14, what per-instance networks keep apart (training-contract.md §12.1, DESIGN.md §6):

  * two jobs running at once cannot reach each other: job B cannot open a TCP connection to the
    listener job A's host runs on its address (B reaches the node through its own gateway);
  * a job with EnableNetworkIsolation cannot reach the node: not its non-loopback address, not its
    subnet's gateway, not Kiln's endpoint on 127.0.0.1 (no forward), and it has no default route;
    while a job without isolation reaches all three and uses Kiln's endpoint
    with boto3 (AWS_ENDPOINT_URL, relayed by its shim);
  * a stopped job leaves no process, namespace, veth or bridge.

Root only. One module server on 10.232.0.0/16; ml.m5.large is declared 1 vCPU (operator
`instance_types`) so that two one-host jobs run side by side on a 2-core machine."""

import ipaddress
import time

import pytest

import network_helpers as nh
import training_helpers as th
from training_helpers import sm, s3, logs  # noqa: F401 (module-scoped client fixtures)

CIDR = "10.232.0.0/16"
KILN_CONFIG = dict(nh.network_config(CIDR), instance_types=[{"type": "ml.m5.large", "vcpus": 1}])


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
    name = th.unique_name("nets")
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="module")
def node_listener():
    listener = nh.NodeListener()
    yield listener
    listener.close()


def connects(lines):
    """{target label: "ok" | "fail ..."} from the CONNECT lines a host printed."""
    out = {}
    for rest in nh.tagged(lines, "CONNECT"):
        if rest.startswith("gateway ") or rest.startswith("loopback "):
            label, target, result = rest.split(" ", 2)
            out[label] = result
        else:
            target, result = rest.split(" ", 1)
            out[target] = result
    return out


def one_host_lines(logs, name):
    streams = nh.host_streams(logs, name)
    assert sorted(streams) == ["algo-1"], sorted(streams)
    return streams["algo-1"]


def test_two_jobs_cannot_reach_each_other(module_kiln, sm, logs, bucket, node_listener):
    a = th.unique_name("net-a")
    sm.create_training_job(**th.training_request(
        a, bucket, image=nh.net_probe_image(), hyperparameters={"listen_port": "7300", "sleep": "300"}))
    th.wait_until(lambda: nh.tagged(nh.host_streams(logs, a).get("algo-1", []), "LISTENING") or None,
                  timeout=120, what="job A's listener")
    a_info = nh.netinfo(logs, a)
    a_addr = nh.check_namespaced(a_info, CIDR)["algo-1"]
    assert nh.tagged(one_host_lines(logs, a), "LISTENING") == ["%s:7300" % a_addr]

    b = th.unique_name("net-b")
    sm.create_training_job(**th.training_request(
        b, bucket, image=nh.net_probe_image(),
        hyperparameters={"connect": "%s:7300" % a_addr, "connect_gateway_port": str(node_listener.port)}))
    d = th.wait_for_status(sm, b, timeout=120, server=module_kiln)
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    b_lines = one_host_lines(logs, b)
    b_addr = nh.check_namespaced(nh.netinfo(logs, b), CIDR)["algo-1"]
    assert ipaddress.ip_network(a_info["algo-1"]["interface"]["network"]) != ipaddress.ip_network(
        nh.netinfo(logs, b)["algo-1"]["interface"]["network"]), "two jobs share one subnet"
    got = connects(b_lines)
    # B has a network (its gateway is the node, where the test listens) ...
    assert got["gateway"] == "ok", b_lines
    assert b_addr in node_listener.peers, (b_addr, node_listener.peers)
    # ... but A's host, listening on its address, is out of its reach.
    assert got["%s:7300" % a_addr].startswith("fail"), b_lines
    assert not nh.tagged(one_host_lines(logs, a), "ACCEPTED"), one_host_lines(logs, a)

    # StopTrainingJob: A is stopped and leaves nothing behind.
    footprint = nh.Footprint(module_kiln.data_dir, a)
    assert len(footprint.bridges) == 1 and len(footprint.veths) == 1, footprint.describe()
    sm.stop_training_job(TrainingJobName=a)
    d = th.wait_for_status(sm, a, timeout=60, server=module_kiln)
    assert d["TrainingJobStatus"] == "Stopped", d["TrainingJobStatus"]
    deadline = time.monotonic() + 30
    while footprint.left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert footprint.left() == {}, "left behind by the stopped job (it had %s)" % footprint.describe()


def test_isolated_job_cannot_reach_the_node(module_kiln, sm, s3, logs, bucket, node_listener):
    addr = nh.node_address()
    port = str(node_listener.port)
    hps = {"connect": "%s:%s" % (addr, port), "connect_gateway_port": port,
           "connect_loopback_port": str(module_kiln.port)}
    isolated = th.unique_name("isolated")
    open_job = th.unique_name("open")
    # One after the other, so that what the listener saw during the isolated job is its alone (the
    # second job may get the same subnet and address again).
    sm.create_training_job(**th.training_request(isolated, bucket, image=nh.net_probe_image(),
                                                 hyperparameters=hps, EnableNetworkIsolation=True))
    d = th.wait_for_status(sm, isolated, timeout=120, server=module_kiln)
    assert d["TrainingJobStatus"] == "Completed", (d.get("FailureReason"), th.job_log_lines(logs, isolated))
    seen_by_isolated = list(node_listener.peers)
    sm.create_training_job(**th.training_request(
        open_job, bucket, image=nh.net_probe_image(),
        hyperparameters=dict(hps, s3_put="s3://%s/from-the-job/%s" % (bucket, open_job))))
    d = th.wait_for_status(sm, open_job, timeout=120, server=module_kiln)
    assert d["TrainingJobStatus"] == "Completed", (d.get("FailureReason"), th.job_log_lines(logs, open_job))

    iso_info = nh.netinfo(logs, isolated)
    iso_addr = nh.check_namespaced(iso_info, CIDR, isolated=True)["algo-1"]
    open_addr = nh.check_namespaced(nh.netinfo(logs, open_job), CIDR)["algo-1"]
    iso = connects(one_host_lines(logs, isolated))
    opened = connects(one_host_lines(logs, open_job))
    target = "%s:%s" % (addr, port)
    # Without isolation: the node's address, the gateway and Kiln's endpoint (relayed) answer ...
    assert opened[target] == "ok" and opened["gateway"] == "ok" and opened["loopback"] == "ok", opened
    assert open_addr in node_listener.peers, (open_addr, node_listener.peers)
    assert s3.get_object(Bucket=bucket, Key="from-the-job/" + open_job)["Body"].read() == b"algo-1"
    # ... isolated: none of them.
    assert iso[target].startswith("fail"), iso
    assert iso["gateway"].startswith("fail"), iso
    assert iso["loopback"].startswith("fail"), iso
    assert iso_addr not in seen_by_isolated, (iso_addr, seen_by_isolated)
