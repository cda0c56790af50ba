"""Deployment guardrails (issue 20; serving-contract.md §9): UpdateEndpoint with a DeploymentConfig, driven
with boto3 (the SDK passes DeploymentConfig through only). One module server (`autoscaling.period_seconds` 1,
so CloudWatch alarms are evaluated each second); every endpoint runs `endpoints/serve_app.py` with its
VARIANT_TAG telling the fleets apart, the failing canary `endpoints/failing_app.py`.

- CANARY (25 %) whose new model fails: the InvocationModelErrors alarm goes into ALARM during the canary's
  bake, traffic returns to the old fleet (RollingBack -> InService on the old configuration, FailureReason
  naming the alarm); the reaction time from the alarm's state change to the rollback is printed.
- LINEAR (50 % steps): answers of the old and new model mixed (about half each), then only the new.
- ALL_AT_ONCE with a bake and a termination wait: all answers new while the endpoint is still Updating
  for at least the bake plus the wait, then InService.
- RollingUpdatePolicy (batches of 1 of 2 instances): mixed, then only new, no failed invocation; one whose
  first batch fails its alarm: RollingBack -> InService on the old configuration with both instances again.
- Bad input: an alarm that does not exist, sizes out of range, both policies, a timeout below the waits.
- A LINEAR shift survives kill -9 of the server in its first bake (the share and the bake deadline are
  read back from the endpoint row).
~45 s on 2 cores."""

import json
import os
import re
import threading
import time

import pytest
from botocore.exceptions import BotoCoreError, ClientError

import endpoint_helpers as eh
import kiln_harness as kh
from training_helpers import sm  # noqa: F401 (module-scoped client fixture)

KILN_CONFIG = dict(eh.ENDPOINT_CONFIG, autoscaling={"period_seconds": 1})
FAILING_IMAGE = "local:" + os.path.join(eh.HERE, "endpoints", "failing_app.py")


@pytest.fixture(scope="module", autouse=True)
def _no_endpoint_left_behind(sm):  # noqa: F811
    yield
    eh.delete_all_endpoints(sm)


@pytest.fixture(scope="module")
def rt(module_kiln):
    return module_kiln.client("sagemaker-runtime")


@pytest.fixture(scope="module")
def cw(module_kiln):
    return module_kiln.client("cloudwatch")


def model(sm, name, tag=None, image=eh.SERVE_IMAGE):  # noqa: F811
    return eh.create_model(sm, name, env={"VARIANT_TAG": tag} if tag else None, image=image)


@pytest.fixture(scope="module")
def endpoints(sm, module_kiln):  # noqa: F811
    """Four endpoints on the old ("blue") model, created at once; their new configurations."""
    base = eh.unique_name("dg")
    blue = model(sm, base + "-blue", "blue")
    green = model(sm, base + "-green", "green")
    failing = model(sm, base + "-failing", image=FAILING_IMAGE)
    out = {}
    for kind, count in (("canary", 1), ("linear", 1), ("allatonce", 1), ("rolling", 2), ("rollingback", 2),
                        ("restart", 1)):
        name = "%s-%s" % (base, kind)
        eh.create_config(sm, name + "-old", [("AllTraffic", blue, count, 1.0)])
        eh.create_config(sm, name + "-new", [("AllTraffic", failing if kind in ("canary", "rollingback") else green,
                                              count, 1.0)])
        sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-old")
        out[kind] = name
    for name in out.values():
        eh.wait_endpoint(sm, name, server=module_kiln)
    return out


class Traffic:
    """Invokes an endpoint in a loop on a thread; records (monotonic time, VARIANT_TAG or error code)."""

    def __init__(self, rt, name):
        self.rt, self.name, self.seen, self.stop = rt, name, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            try:
                body, _ = eh.invoke(self.rt, self.name)
                what = body.get("variant_env") if isinstance(body, dict) else "?"
            except ClientError as e:
                what = e.response["Error"]["Code"]
            except BotoCoreError:  # the server is down (test_a_shift_survives_a_server_kill)
                what = "unreachable"
            self.seen.append((time.monotonic(), time.time(), what))
            time.sleep(0.02)

    def finish(self):
        self.stop.set()
        self.thread.join(10)
        return self.seen


def statuses_until(sm, name, done, timeout=60):  # noqa: F811
    """Polls DescribeEndpoint until done(describe) is true; returns (the statuses seen in order, the last)."""
    seen, deadline = [], time.monotonic() + timeout
    while True:
        d = sm.describe_endpoint(EndpointName=name)
        if not seen or seen[-1] != d["EndpointStatus"]:
            seen.append(d["EndpointStatus"])
        if done(d):
            return seen, d
        assert time.monotonic() < deadline, "endpoint %s: statuses %s" % (name, seen)
        time.sleep(0.05)


def test_canary_rolls_back_when_its_alarm_fires(sm, rt, cw, endpoints, module_kiln):  # noqa: F811
    name = endpoints["canary"]
    alarm = name + "-errors"
    cw.put_metric_alarm(AlarmName=alarm, Namespace="AWS/SageMaker", MetricName="InvocationModelErrors",
                        Dimensions=[{"Name": "EndpointName", "Value": name}, {"Name": "VariantName", "Value": "AllTraffic"}],
                        Statistic="Sum", Period=1, EvaluationPeriods=1, Threshold=0,
                        ComparisonOperator="GreaterThanThreshold", TreatMissingData="notBreaching")
    config = {"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {
                  "Type": "CANARY", "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 25},
                  "WaitIntervalInSeconds": 60},
              "TerminationWaitInSeconds": 0, "MaximumExecutionTimeoutInSeconds": 600},
              "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": alarm}]}}
    traffic = Traffic(rt, name)
    sm.update_endpoint(EndpointName=name, EndpointConfigName=name + "-new", DeploymentConfig=config)
    seen, d = statuses_until(sm, name, lambda d: d["EndpointStatus"] != "Updating" and d.get("FailureReason"))
    seen2, d = statuses_until(sm, name, lambda d: d["EndpointStatus"] == "InService")
    time.sleep(1.0)  # answers after the rollback
    answers = traffic.finish()
    assert seen[0] == "Updating" and (seen + seen2)[-1] == "InService", seen + seen2
    assert set(seen + seen2) <= {"Updating", "RollingBack", "InService"}, seen + seen2
    assert d["EndpointConfigName"] == name + "-old", d
    assert alarm in d["FailureReason"] and d["FailureReason"].startswith(
        "UpdateEndpoint rolled back to %s-old: CloudWatch alarm %s went into ALARM" % (name, alarm)), d["FailureReason"]
    assert d["LastDeploymentConfig"] == config
    assert "PendingDeploymentSummary" not in d
    # The canary got part of the traffic (its answers fail), the rest stayed on blue throughout.
    errors = [a for a in answers if a[2] == "ModelError"]
    assert errors and all(a[2] in ("blue", "ModelError") for a in answers), sorted(set(a[2] for a in answers))
    # After the rollback only the old model answers.
    rollback = [line for line in module_kiln.log_tail(4000).splitlines()
                if "endpoint update rolling back" in line and name in line]
    assert rollback, module_kiln.log_tail(60)
    rollback_wall = int(re.search(r"wall_millis=\"?(\d+)", rollback[-1]).group(1)) / 1000.0
    assert all(a[2] == "blue" for a in answers if a[1] > rollback_wall + 0.2), "non-blue answers after rollback"
    state = cw.describe_alarms(AlarmNames=[alarm])["MetricAlarms"][0]
    assert state["StateValue"] == "ALARM", state
    alarm_at = state["StateUpdatedTimestamp"].timestamp()
    reaction = rollback_wall - alarm_at
    print("\ncanary rollback: first canary error to alarm ALARM %.0f ms (1-s periods, 1.5 s settling); alarm to "
          "traffic back on the old fleet %.0f ms; %d ModelError answers from the canary out of %d" % (
              (alarm_at - errors[0][1]) * 1000, reaction * 1000, len(errors), len(answers)))
    assert 0 <= reaction < 2.0, reaction


def test_linear_completes_with_traffic_shifting_step_by_step(sm, rt, endpoints, module_kiln):  # noqa: F811
    name = endpoints["linear"]
    config = {"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {
        "Type": "LINEAR", "LinearStepSize": {"Type": "CAPACITY_PERCENT", "Value": 50}, "WaitIntervalInSeconds": 3}}}
    traffic = Traffic(rt, name)
    sm.update_endpoint(EndpointName=name, EndpointConfigName=name + "-new", DeploymentConfig=config)
    seen, d = statuses_until(sm, name, lambda d: d["EndpointStatus"] == "InService")
    time.sleep(0.5)
    answers = traffic.finish()
    assert seen == ["Updating", "InService"] and d["EndpointConfigName"] == name + "-new", (seen, d)
    assert "FailureReason" not in d
    tags = [a[2] for a in answers]
    assert set(tags) <= {"blue", "green"}, sorted(set(tags))
    first_green = tags.index("green")
    last_blue = len(tags) - 1 - tags[::-1].index("blue")
    mixed = tags[first_green:last_blue + 1]
    # Step 1 (50 %, 3 s bake): both models answer, about half each.
    assert len(mixed) >= 30, len(mixed)
    share = mixed.count("green") / len(mixed)
    assert 0.25 < share < 0.75, share
    # Step 2 (100 %, 3 s bake) and after: only the new model.
    tail = tags[last_blue + 1:]
    assert len(tail) >= 30 and set(tail) == {"green"}, len(tail)
    print("\nlinear: %d answers before the shift, %d mixed (%.0f%% new), %d new only" % (
        first_green, len(mixed), share * 100, len(tail)))


def test_all_at_once_bakes_and_waits_before_completing(sm, rt, endpoints):  # noqa: F811
    name = endpoints["allatonce"]
    config = {"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE",
                                                                        "WaitIntervalInSeconds": 2},
                                        "TerminationWaitInSeconds": 2}}
    traffic = Traffic(rt, name)
    sm.update_endpoint(EndpointName=name, EndpointConfigName=name + "-new", DeploymentConfig=config)
    seen, d = statuses_until(sm, name, lambda d: d["EndpointStatus"] == "InService")
    done_at = time.monotonic()
    answers = traffic.finish()
    assert seen == ["Updating", "InService"] and d["EndpointConfigName"] == name + "-new", (seen, d)
    tags = [a[2] for a in answers]
    first_green = tags.index("green")
    assert set(tags[first_green:]) == {"green"}, "all traffic moves at once"
    assert set(tags[:first_green]) <= {"blue"}
    # Bake (2 s) plus termination wait (2 s) with all traffic on the new fleet, still Updating.
    assert done_at - answers[first_green][0] >= 3.8, done_at - answers[first_green][0]


def update_raw(server, **request):
    """UpdateEndpoint as a raw signed request: Debian's botocore 1.26 predates RollingUpdatePolicy."""
    status, _, body = kh.json_request(server, "SageMaker.UpdateEndpoint", request)
    return status, json.loads(body or b"{}")


def test_rolling_update_replaces_instances_in_batches(sm, rt, endpoints, module_kiln):  # noqa: F811
    name = endpoints["rolling"]
    config = {"RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1},
                                      "WaitIntervalInSeconds": 2}}
    traffic = Traffic(rt, name)
    status, body = update_raw(module_kiln, EndpointName=name, EndpointConfigName=name + "-new", DeploymentConfig=config)
    assert status == 200, body
    seen, d = statuses_until(sm, name, lambda d: d["EndpointStatus"] == "InService")
    time.sleep(0.5)
    answers = traffic.finish()
    assert seen == ["Updating", "InService"] and d["EndpointConfigName"] == name + "-new", (seen, d)
    assert d["ProductionVariants"][0]["CurrentInstanceCount"] == 2, d
    tags = [a[2] for a in answers]
    assert set(tags) <= {"blue", "green"}, "an invocation failed during the rolling update: %s" % sorted(set(tags))
    first_green = tags.index("green")
    last_blue = len(tags) - 1 - tags[::-1].index("blue")
    assert last_blue > first_green, "the batches overlap: old and new answered side by side"
    assert set(tags[last_blue + 1:]) == {"green"}


def test_rolling_update_rolls_back_when_its_alarm_fires(sm, rt, cw, endpoints, module_kiln):  # noqa: F811
    """Batch 1 of 2 runs a failing model: its alarm fires during the batch's bake, the old fleet (one
    instance left) takes all traffic at once, its stopped instance is launched again, then the new batch
    goes: RollingBack -> InService on the old configuration with 2 instances."""
    name = endpoints["rollingback"]
    alarm = name + "-errors"
    cw.put_metric_alarm(AlarmName=alarm, Namespace="AWS/SageMaker", MetricName="InvocationModelErrors",
                        Dimensions=[{"Name": "EndpointName", "Value": name}, {"Name": "VariantName", "Value": "AllTraffic"}],
                        Statistic="Sum", Period=1, EvaluationPeriods=1, Threshold=0,
                        ComparisonOperator="GreaterThanThreshold", TreatMissingData="notBreaching")
    config = {"RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1},
                                      "WaitIntervalInSeconds": 60,
                                      "RollbackMaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1}},
              "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": alarm}]}}
    traffic = Traffic(rt, name)
    status, body = update_raw(module_kiln, EndpointName=name, EndpointConfigName=name + "-new", DeploymentConfig=config)
    assert status == 200, body
    seen, d = statuses_until(sm, name, lambda d: d["EndpointStatus"] == "InService" and d.get("FailureReason"))
    time.sleep(0.5)
    answers = traffic.finish()
    # RollingBack lasts while the old fleet's stopped instance comes back (about a second).
    assert seen == ["Updating", "RollingBack", "InService"], seen
    assert d["EndpointConfigName"] == name + "-old", d
    assert "CloudWatch alarm %s went into ALARM" % alarm in d["FailureReason"], d["FailureReason"]
    assert d["ProductionVariants"][0]["CurrentInstanceCount"] == 2, d
    tags = [a[2] for a in answers]
    assert "ModelError" in tags and set(tags) <= {"blue", "ModelError"}, sorted(set(tags))
    last_error = len(tags) - 1 - tags[::-1].index("ModelError")
    assert len(tags) - last_error > 10 and set(tags[last_error + 1:]) == {"blue"}


def test_bad_deployment_configs_are_refused(sm, endpoints, module_kiln):  # noqa: F811
    name = endpoints["canary"]
    sm_server = module_kiln

    def refused(config, config_name=None):
        with pytest.raises(ClientError) as e:
            sm.update_endpoint(EndpointName=name, EndpointConfigName=config_name or name + "-new",
                               DeploymentConfig=config)
        assert e.value.response["Error"]["Code"] == "ValidationException", e.value.response
        return e.value.response["Error"]["Message"]

    routing = {"Type": "CANARY", "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 25}, "WaitIntervalInSeconds": 1}
    message = refused({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": routing},
                       "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "no-such-alarm"}]}})
    assert "[no-such-alarm]" in message and "do not exist" in message, message
    message = refused({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": dict(
        routing, CanarySize={"Type": "CAPACITY_PERCENT", "Value": 60})}})
    assert "CanarySize 60% must be at most 50%" in message, message
    message = refused({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {
        "Type": "LINEAR", "LinearStepSize": {"Type": "INSTANCE_COUNT", "Value": 1}, "WaitIntervalInSeconds": 1}}})
    assert "LinearStepSize 1 instance (100% of 1) must be between 10% and 50%" in message, message
    status, body = update_raw(sm_server, EndpointName=name, EndpointConfigName=name + "-new", DeploymentConfig={
        "BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": routing},
        "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1}, "WaitIntervalInSeconds": 1}})
    assert status == 400 and "not both" in body["message"], body
    status, body = update_raw(sm_server, EndpointName=name, EndpointConfigName=name + "-new", DeploymentConfig={
        "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "CAPACITY_PERCENT", "Value": 100},
                                "WaitIntervalInSeconds": 1}})
    assert status == 400 and body["__type"].endswith("ValidationException"), body
    assert "MaximumBatchSize 100% must be between 5% and 50%" in body["message"], body
    message = refused({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": dict(routing, WaitIntervalInSeconds=500),
                                                 "TerminationWaitInSeconds": 200,
                                                 "MaximumExecutionTimeoutInSeconds": 900}})
    assert "MaximumExecutionTimeoutInSeconds 900 must be larger" in message, message
    # Out of the model's range (botocore checks only minimums on the client).
    message = refused({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": dict(routing, WaitIntervalInSeconds=4000)}})
    assert "waitIntervalInSeconds" in message and "less than or equal to 3600" in message, message
    # Nothing changed, and the endpoint still serves.
    assert sm.describe_endpoint(EndpointName=name)["EndpointStatus"] == "InService"


def test_a_shift_survives_a_server_kill(sm, rt, endpoints, module_kiln):  # noqa: F811
    """kill -9 of the server in the first step's bake (LINEAR 50 %, 8 s bakes): the next server adopts both
    fleets, routes them with the recorded share again (both models answer) and completes on time; runs last
    (it restarts the module's server)."""
    name = endpoints["restart"]
    config = {"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {
        "Type": "LINEAR", "LinearStepSize": {"Type": "CAPACITY_PERCENT", "Value": 50}, "WaitIntervalInSeconds": 8}}}
    traffic = Traffic(rt, name)
    sm.update_endpoint(EndpointName=name, EndpointConfigName=name + "-new", DeploymentConfig=config)
    eh.wait_until(lambda: {"blue", "green"} <= {a[2] for a in traffic.seen[-20:]}, timeout=30, poll=0.05,
                  what="both models answering")
    shifted_at = time.monotonic()
    time.sleep(3)  # into the bake: a bake that started again would end 3 s late
    module_kiln.kill()
    module_kiln.start()
    restarted = len(traffic.seen)
    assert sm.describe_endpoint(EndpointName=name)["EndpointStatus"] == "Updating"
    seen, d = statuses_until(sm, name, lambda d: d["EndpointStatus"] == "InService")
    done_at = time.monotonic()
    time.sleep(0.3)
    answers = traffic.finish()
    assert d["EndpointConfigName"] == name + "-new" and "FailureReason" not in d, d
    after = [a[2] for a in answers[restarted:]]
    assert "blue" in after, "no answer of the old model after the restart: %s" % after[:40]
    last_blue = len(after) - 1 - after[::-1].index("blue")
    assert "green" in after[:last_blue], "the restarted server did not route both fleets: %s" % after[:40]
    print("\nkill -9 in a bake: %d answers unreachable/unavailable while the server was down, both models again "
          "after the restart, InService %.1f s after the first shift (two 8-s bakes)" % (
              sum(1 for a in answers[restarted - 5:] if a[2] not in ("blue", "green")), done_at - shifted_at))
    # Two 8-s bakes from the first shift: the recorded bake went on, it did not start again.
    assert 15.0 < done_at - shifted_at < 18.5, done_at - shifted_at
