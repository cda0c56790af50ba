"""Issue 14, endpoints on per-instance networks (DESIGN.md §6, decision 7; serving-contract.md §2):
every endpoint instance runs in a network namespace of its own on the endpoint's network
`endpoint-<name>` and listens on 8080 at its own address; Kiln routes InvokeEndpoint there.

The container (endpoints/port8080_app.py) listens on 8080 only, whatever SAGEMAKER_BIND_TO_PORT
says, so two instances of it on one node serve side by side only when each has its own network.
An isolated model's instance (EnableNetworkIsolation) cannot open a connection to the node; a
non-isolated one can, and reaches Kiln at AWS_ENDPOINT_URL (the shim's loopback forward).

Root only (the server runs namespaced only with CAP_NET_ADMIN); the server uses a range of its
own (CIDR) so that other tests' networks never meet these.
"""

import ipaddress
import json
import os

import pytest

import endpoint_helpers as eh
import network_helpers as nh
from training_helpers import sm  # noqa: F401 (module-scoped fixture)

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGE = "local:" + os.path.join(HERE, "endpoints", "port8080_app.py")
CIDR = "10.237.0.0/16"
KILN_CONFIG = dict(eh.ENDPOINT_CONFIG, network={"mode": "namespaces", "cidr": CIDR})
SYS_NET = "/sys/class/net"


@pytest.fixture(scope="module", autouse=True)
def _root():
    if os.geteuid() != 0:
        pytest.skip("per-instance networks need root (CAP_NET_ADMIN)")


@pytest.fixture(scope="module", autouse=True)
def _no_endpoint_left_behind(_root, sm):
    yield
    eh.delete_all_endpoints(sm)


@pytest.fixture(scope="module")
def rt(module_kiln):
    return module_kiln.client("sagemaker-runtime")


def bridge_of(network):
    """The Kiln bridge whose ifalias names `network` ("kiln <state_dir> <network>"), or None."""
    for link in os.listdir(SYS_NET):
        try:
            with open(os.path.join(SYS_NET, link, "ifalias")) as f:
                alias = f.read().strip()
        except OSError:
            continue
        if alias.startswith("kiln ") and alias.split(" ")[-1] == network:
            return link
    return None


def deploy(sm, module_kiln, name, count, isolated=False):
    sm.create_model(ModelName=name + "-m", PrimaryContainer={"Image": IMAGE}, ExecutionRoleArn=eh.ROLE_ARN,
                    EnableNetworkIsolation=isolated)
    return eh.deploy(sm, name, [("AllTraffic", name + "-m", count, 1.0)], server=module_kiln)


def test_two_instances_listen_on_8080_side_by_side(sm, rt, module_kiln):
    name = eh.unique_name("ep-8080")
    d = deploy(sm, module_kiln, name, 2)
    assert d["ProductionVariants"][0]["CurrentInstanceCount"] == 2
    seen = {}
    for _ in range(80):
        body, r = eh.invoke(rt, name, body=b"{}")
        assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
        seen[body["instance"]] = body
        if len(seen) == 2:
            break
    assert len(seen) == 2, "InvokeEndpoint reached only %s" % sorted(seen)
    addresses = {b["address"] for b in seen.values()}
    assert len(addresses) == 2, seen
    for body in seen.values():
        assert ipaddress.ip_address(body["address"]) in ipaddress.ip_network(CIDR), body
        assert body["bind_to_port"] == "8080" and body["safe_port_range"] == "8081-8179", body
    # Both on the endpoint's one network (one subnet, one bridge).
    subnets = {ipaddress.ip_network(a + "/24", strict=False) for a in addresses}
    assert len(subnets) == 1, addresses
    bridge = bridge_of("endpoint-" + name)
    assert bridge, "no bridge for network endpoint-%s" % name

    sm.delete_endpoint(EndpointName=name)
    eh.wait_until(lambda: eh.endpoint_gone(sm, name) or None, timeout=60, what="endpoint %s deleted" % name)
    eh.wait_until(lambda: bridge_of("endpoint-" + name) is None or None, timeout=10,
                  what="the bridge of endpoint-%s removed" % name)


@pytest.fixture
def node_listener():
    listener = nh.NodeListener()
    yield listener
    listener.close()


def gateway_of(address):
    """The bridge's address of an instance's network (.1 of its /24: the default subnet_prefix)."""
    return str(ipaddress.ip_network(address + "/24", strict=False).network_address + 1)


def test_an_isolated_endpoint_cannot_reach_the_node_and_an_open_one_reaches_kiln(sm, rt, module_kiln,
                                                                               node_listener):
    node = nh.node_address()
    open_name = eh.unique_name("ep-open")
    closed_name = eh.unique_name("ep-isol")
    deploy(sm, module_kiln, open_name, 1)
    deploy(sm, module_kiln, closed_name, 1, isolated=True)  # the router still reaches it (InService)

    def ask(name, request):
        body, _ = eh.invoke(rt, name, body=json.dumps(request).encode())
        return body

    opened = ask(open_name, {"connect": [node, node_listener.port], "kiln": True})
    gateway = gateway_of(opened["address"])
    assert opened["connect"] == "ok", opened
    assert opened["kiln"] == "200", opened
    assert ask(open_name, {"connect": [gateway, node_listener.port]})["connect"] == "ok"

    closed = ask(closed_name, {"connect": [node, node_listener.port], "kiln": True})
    assert closed["connect"].startswith("fail"), closed
    assert closed["kiln"].startswith("fail"), closed  # no loopback forward into an isolated namespace
    assert ask(closed_name, {"connect": [gateway_of(closed["address"]), node_listener.port]})["connect"].startswith(
        "fail")
    # The two endpoints have networks of their own.
    assert ipaddress.ip_address(opened["address"]) not in ipaddress.ip_network(closed["address"] + "/24",
                                                                               strict=False)
    # Only the open one's connections arrived.
    assert len(node_listener.peers) == 2, node_listener.peers
