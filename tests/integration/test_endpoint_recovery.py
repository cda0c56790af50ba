"""Endpoint instances outlive the server (DESIGN.md §2, the shim): after `kill -9` of `kiln server`
and a restart on the same data dir, the endpoint serves again within seconds from the very same
instances (adopted, not restarted)."""

import time

import endpoint_helpers as eh


def test_endpoint_serves_again_after_kill_9_without_restarting_instances(kiln_factory):
    srv = kiln_factory("endpoint-recovery", config=eh.ENDPOINT_CONFIG)
    sm, rt = srv.client("sagemaker"), srv.client("sagemaker-runtime")
    name = eh.unique_name("ep-survivor")
    eh.create_model(sm, name + "-m")
    eh.deploy(sm, name, [("AllTraffic", name + "-m", 2, 1.0)], server=srv)
    before = set()
    eh.wait_until(lambda: before.add(eh.invoke(rt, name)[0]["instance"]) or len(before) == 2,
                  timeout=20, what="both instances answering")

    srv.kill()
    srv.start()
    restarted = time.monotonic()
    sm, rt = srv.client("sagemaker"), srv.client("sagemaker-runtime")

    def serving():
        try:
            return eh.invoke(rt, name)[0]
        except Exception:  # noqa: BLE001 (not yet routed again)
            return None
    body = eh.wait_until(serving, timeout=20, poll=0.05, what="the endpoint serving again")
    assert time.monotonic() - restarted < 10
    after = set()
    eh.wait_until(lambda: after.add(eh.invoke(rt, name)[0]["instance"]) or len(after) == 2,
                  timeout=20, what="both instances answering after the restart")
    assert after == before  # the same instances: adopted, not replaced
    assert body["instance"] in before
    d = sm.describe_endpoint(EndpointName=name)
    assert d["EndpointStatus"] == "InService"
    assert d["ProductionVariants"][0]["CurrentInstanceCount"] == 2
    eh.delete_all_endpoints(sm)
