"""Application Auto Scaling for endpoint variants (issue 19; serving-contract.md §10, control-plane-api.md §12):
a target-tracking policy on SageMakerVariantInvocationsPerInstance takes a variant from 1 to 3 instances under
load and back to 1 once idle (the scaler evaluates every `autoscaling.period_seconds`, 1 s here, so AlarmHigh's 3
periods and AlarmLow's 15 take seconds); the scaling alarms in CloudWatch DescribeAlarms; the activities in
DescribeScalingActivities; register/describe/deregister, policies, scheduled actions, paging and AWS's errors
through boto3 and the AWS CLI. One module server; ~60 s on 2 cores."""

import json
import subprocess
import threading
import time

import pytest
from botocore.exceptions import ClientError

import endpoint_helpers as eh
import kiln_harness as kh
from training_helpers import sm  # noqa: F401 (module-scoped client fixture)

KILN_CONFIG = dict(eh.ENDPOINT_CONFIG, autoscaling={"period_seconds": 1})
DIMENSION = "sagemaker:variant:DesiredInstanceCount"


def resource(endpoint, variant="AllTraffic"):
    return "endpoint/%s/variant/%s" % (endpoint, variant)


def key(endpoint, variant="AllTraffic"):
    return {"ServiceNamespace": "sagemaker", "ResourceId": resource(endpoint, variant), "ScalableDimension": DIMENSION}


def error_of(fn, **kwargs):
    with pytest.raises(ClientError) as e:
        fn(**kwargs)
    return e.value.response["Error"]["Code"], e.value.response["Error"]["Message"]


@pytest.fixture(scope="module", autouse=True)
def _no_endpoint_left_behind(sm):  # noqa: F811
    yield
    eh.delete_all_endpoints(sm)


@pytest.fixture(scope="module")
def aas(module_kiln):
    return module_kiln.client("application-autoscaling")


@pytest.fixture(scope="module")
def cw(module_kiln):
    return module_kiln.client("cloudwatch")


@pytest.fixture(scope="module")
def rt(module_kiln):
    return module_kiln.client("sagemaker-runtime")


@pytest.fixture(scope="module")
def waiting_endpoint(sm):  # noqa: F811
    """An endpoint that stays Creating (its container never listens): enough to register."""
    name = eh.unique_name("as-flows")
    eh.create_model(sm, name + "-m", env={"STARTUP_DELAY_SECONDS": "600"})
    eh.create_config(sm, name + "-cfg", [("AllTraffic", name + "-m", 1, 1.0)])
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-cfg")
    return name


def tracking(target, out_cooldown=None, in_cooldown=None):
    config = {"TargetValue": target,
              "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}}
    if out_cooldown is not None:
        config["ScaleOutCooldown"] = out_cooldown
    if in_cooldown is not None:
        config["ScaleInCooldown"] = in_cooldown
    return config


def variant_counts(sm, name):  # noqa: F811
    d = sm.describe_endpoint(EndpointName=name)
    v = d.get("ProductionVariants", [{}])[0]
    return d["EndpointStatus"], v.get("DesiredInstanceCount"), v.get("CurrentInstanceCount")


def test_load_scales_out_to_three_and_back_to_one(sm, aas, cw, rt, module_kiln):  # noqa: F811
    name = eh.unique_name("as-load")
    eh.create_model(sm, name + "-m")
    eh.deploy(sm, name, [("AllTraffic", name + "-m", 1, 1.0)], server=module_kiln)
    aas.register_scalable_target(MinCapacity=1, MaxCapacity=3, **key(name))
    policy = aas.put_scaling_policy(PolicyName="invocations", PolicyType="TargetTrackingScaling",
                                    TargetTrackingScalingPolicyConfiguration=tracking(5.0, 5, 2), **key(name))
    alarm_names = [a["AlarmName"] for a in policy["Alarms"]]
    assert alarm_names[0].startswith("TargetTracking-%s-AlarmHigh-" % resource(name)), alarm_names
    assert alarm_names[1].startswith("TargetTracking-%s-AlarmLow-" % resource(name)), alarm_names

    # ~40 invocations a second against a target of 5 per instance per 1-s period: AlarmHigh fires after
    # 3 periods and the count goes to ceil(1 × 40 / 5) clamped to MaxCapacity 3.
    stop = threading.Event()
    served = []

    def load():
        while not stop.is_set():
            try:
                eh.invoke(rt, name)
                served.append(time.monotonic())
            except ClientError:
                pass
            time.sleep(0.025)

    worker = threading.Thread(target=load, daemon=True)
    started = time.monotonic()
    worker.start()
    try:
        eh.wait_until(lambda: variant_counts(sm, name) == ("InService", 3, 3), timeout=60, poll=0.25,
                      what="3 instances InService; log tail:\n" + module_kiln.log_tail(20))
        scaled_out = time.monotonic() - started
        d = cw.describe_alarms(AlarmNames=[alarm_names[0]])["MetricAlarms"]
        assert len(d) == 1 and d[0]["StateValue"] == "ALARM", d
    finally:
        stop.set()
        worker.join(timeout=10)
    assert served, "no invocation succeeded"

    # Idle: AlarmLow after 15 periods under 4.5, then one instance per step, ScaleInCooldown (2 s) apart.
    idle = time.monotonic()
    eh.wait_until(lambda: variant_counts(sm, name) == ("InService", 1, 1), timeout=75, poll=0.5,
                  what="back to 1 instance")
    scaled_in = time.monotonic() - idle
    print("scale-out to 3 in %.1f s; back to 1 in %.1f s after the load stopped" % (scaled_out, scaled_in))

    # The last activity turns Successful at the scaler's next pass after the endpoint is InService again.
    def settled():
        listed = aas.describe_scaling_activities(ServiceNamespace="sagemaker",
                                                 ResourceId=resource(name))["ScalingActivities"]
        return listed if all(a["StatusCode"] != "InProgress" for a in listed) else None
    activities = eh.wait_until(settled, timeout=10, what="no activity InProgress")
    descriptions = [a["Description"] for a in activities]
    # The oldest: the scale-out (to 3 at once unless the host served under 10 invocations a second).
    assert descriptions[-1] in ("Setting desired instance count to 3.", "Setting desired instance count to 2."), \
        descriptions
    assert "Setting desired instance count to 3." in descriptions, descriptions
    assert "Setting desired instance count to 1." in descriptions, descriptions
    assert descriptions[0] == "Setting desired instance count to 1.", descriptions  # the newest
    for a in activities:
        assert a["StatusCode"] == "Successful", a
        assert a["StatusMessage"].startswith("Successfully set desired instance count to "), a
        assert a["EndTime"] >= a["StartTime"]
    assert activities[-1]["Cause"] == "monitor alarm %s in state ALARM triggered policy invocations" % alarm_names[0]
    assert activities[0]["Cause"] == "monitor alarm %s in state ALARM triggered policy invocations" % alarm_names[1]

    alarms = {a["AlarmName"]: a for a in cw.describe_alarms(AlarmNamePrefix="TargetTracking-%s-" % resource(name))
              ["MetricAlarms"]}
    assert sorted(alarms) == sorted(alarm_names)
    high, low = alarms[alarm_names[0]], alarms[alarm_names[1]]
    for a in (high, low):
        assert a["Namespace"] == "AWS/SageMaker" and a["MetricName"] == "InvocationsPerInstance"
        assert sorted((d["Name"], d["Value"]) for d in a["Dimensions"]) == [("EndpointName", name),
                                                                           ("VariantName", "AllTraffic")]
        assert a["Statistic"] == "Sum" and a["Period"] == 1
        assert a["AlarmActions"] == [policy["PolicyARN"]]
        assert a["StateValue"] in ("OK", "ALARM", "INSUFFICIENT_DATA")
    assert (high["ComparisonOperator"], high["Threshold"], high["EvaluationPeriods"]) == ("GreaterThanThreshold", 5.0, 3)
    assert (low["ComparisonOperator"], low["Threshold"], low["EvaluationPeriods"]) == ("LessThanThreshold", 4.5, 15)
    assert high["StateValue"] == "OK" and low["StateValue"] == "ALARM"

    # Step scaling: a CloudWatch alarm on a custom metric whose action is the step policy (as AWS wires it).
    step = aas.put_scaling_policy(PolicyName="queue-steps", PolicyType="StepScaling", StepScalingPolicyConfiguration={
        "AdjustmentType": "ChangeInCapacity", "Cooldown": 60, "MetricAggregationType": "Maximum",
        "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]}, **key(name))
    alarm = "queue-depth-" + name
    cw.put_metric_alarm(AlarmName=alarm, Namespace="Custom/Kiln", MetricName="QueueDepth",
                        Dimensions=[{"Name": "EndpointName", "Value": name}], Statistic="Maximum", Period=1,
                        EvaluationPeriods=1, Threshold=10, ComparisonOperator="GreaterThanThreshold",
                        AlarmActions=[step["PolicyARN"]])

    def queue_pushes_out():
        cw.put_metric_data(Namespace="Custom/Kiln", MetricData=[{
            "MetricName": "QueueDepth", "Dimensions": [{"Name": "EndpointName", "Value": name}], "Value": 50}])
        return variant_counts(sm, name)[1] == 2
    eh.wait_until(queue_pushes_out, timeout=20, poll=0.3, what="the step policy to add an instance")
    described = cw.describe_alarms(AlarmNames=[alarm])["MetricAlarms"]
    assert described[0]["StateValue"] == "ALARM" and described[0]["AlarmActions"] == [step["PolicyARN"]], described
    # (AlarmLow of the target-tracking policy may take it back to 1 from here on.)
    causes = [(a["Description"], a["Cause"]) for a in aas.describe_scaling_activities(
        ServiceNamespace="sagemaker", ResourceId=resource(name), MaxResults=2)["ScalingActivities"]]
    assert ("Setting desired instance count to 2.",
            "monitor alarm %s in state ALARM triggered policy queue-steps" % alarm) in causes, causes
    cw.delete_alarms(AlarmNames=[alarm])
    assert cw.describe_alarms(AlarmNames=[alarm])["MetricAlarms"] == []

    aas.deregister_scalable_target(**key(name))
    assert not cw.describe_alarms(AlarmNamePrefix="TargetTracking-%s-" % resource(name))["MetricAlarms"]
    assert aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=resource(name))["ScalingPolicies"] == []


def test_validation_errors(aas, waiting_endpoint):
    ep = waiting_endpoint
    code, message = error_of(aas.register_scalable_target, MinCapacity=1, MaxCapacity=2, **key("no-such-endpoint"))
    assert code == "ValidationException" and "no-such-endpoint does not exist" in message, message
    code, message = error_of(aas.register_scalable_target, MinCapacity=1, MaxCapacity=2, **key(ep, "Other"))
    assert code == "ValidationException" and "Other" in message, message
    code, message = error_of(aas.register_scalable_target, MinCapacity=0, MaxCapacity=2, **key(ep))
    assert code == "ValidationException" and "asynchronous" in message, message
    code, message = error_of(aas.register_scalable_target, MinCapacity=3, MaxCapacity=2, **key(ep))
    assert (code, message) == ("ValidationException",
                               "Maximum capacity cannot be less than minimum capacity (MinCapacity 3, MaxCapacity 2).")
    code, _ = error_of(aas.register_scalable_target, MinCapacity=1, **key(ep))
    assert code == "ValidationException"
    code, message = error_of(aas.register_scalable_target, ServiceNamespace="ecs", ResourceId="service/c/s",
                             ScalableDimension="ecs:service:DesiredCount", MinCapacity=1, MaxCapacity=2)
    assert code == "ValidationException" and "Unsupported service namespace" in message, message
    code, message = error_of(aas.put_scaling_policy, PolicyName="p", PolicyType="TargetTrackingScaling",
                             TargetTrackingScalingPolicyConfiguration=tracking(10.0), **key(ep))
    assert code == "ObjectNotFoundException", message
    assert message == ("No scalable target registered for service namespace: sagemaker, resource ID: %s, scalable "
                       "dimension: %s" % (resource(ep), DIMENSION))
    code, _ = error_of(aas.deregister_scalable_target, **key(ep))
    assert code == "ObjectNotFoundException"

    aas.register_scalable_target(MinCapacity=1, MaxCapacity=2, **key(ep))
    try:
        code, message = error_of(aas.put_scaling_policy, PolicyName="p", PolicyType="PredictiveScaling",
                                 **key(ep))
        assert code == "ValidationException" and "PredictiveScaling" in message, message
        bad = tracking(10.0)
        bad["PredefinedMetricSpecification"]["PredefinedMetricType"] = "ECSServiceAverageCPUUtilization"
        code, message = error_of(aas.put_scaling_policy, PolicyName="p", PolicyType="TargetTrackingScaling",
                                 TargetTrackingScalingPolicyConfiguration=bad, **key(ep))
        assert code == "ValidationException" and "SageMakerVariantInvocationsPerInstance" in message, message
        code, message = error_of(aas.put_scaling_policy, PolicyName="x" * 257, PolicyType="TargetTrackingScaling",
                                 TargetTrackingScalingPolicyConfiguration=tracking(10.0), **key(ep))
        assert code == "ValidationException" and "policyName" in message, message
        code, _ = error_of(aas.delete_scaling_policy, PolicyName="none", **key(ep))
        assert code == "ObjectNotFoundException"
        code, message = error_of(aas.put_scheduled_action, ScheduledActionName="s", Schedule="whenever",
                                 ScalableTargetAction={"MinCapacity": 1}, **key(ep))
        assert code == "ValidationException" and "Schedule" in message, message
        code, _ = error_of(aas.describe_scalable_targets, ServiceNamespace="sagemaker", NextToken="bogus")
        assert code == "InvalidNextTokenException"
    finally:
        aas.deregister_scalable_target(**key(ep))


def test_describe_page_and_delete_flows(aas, cw, module_kiln, waiting_endpoint, tmp_path):
    ep = waiting_endpoint
    # Debian's botocore (1.29) predates ScalableTargetARN and drops it from the answers; the raw answer has it.
    aas.register_scalable_target(MinCapacity=1, MaxCapacity=4, **key(ep))
    status, _, body = kh.json_request(module_kiln, "AnyScaleFrontendService.DescribeScalableTargets",
                                      {"ServiceNamespace": "sagemaker", "ResourceIds": [resource(ep)]},
                                      service="application-autoscaling")
    arn = json.loads(body)["ScalableTargets"][0]["ScalableTargetARN"]
    assert status == 200 and arn.startswith(
        "arn:aws:application-autoscaling:us-east-1:%s:scalable-target/" % module_kiln.account_id)
    aas.register_scalable_target(MaxCapacity=5, SuspendedState={"ScheduledScalingSuspended": True}, **key(ep))
    target = aas.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[resource(ep)])["ScalableTargets"]
    assert len(target) == 1
    assert (target[0]["MinCapacity"], target[0]["MaxCapacity"]) == (1, 5)
    assert target[0]["SuspendedState"] == {"DynamicScalingInSuspended": False, "DynamicScalingOutSuspended": False,
                                           "ScheduledScalingSuspended": True}

    # The AWS CLI sees the same target.
    env = module_kiln.aws_env(str(tmp_path))
    out = subprocess.run(["/usr/bin/aws", "--endpoint-url", module_kiln.endpoint, "--output", "json",
                          "application-autoscaling", "describe-scalable-targets", "--service-namespace", "sagemaker",
                          "--resource-ids", resource(ep)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [t["ResourceId"] for t in json.loads(out.stdout)["ScalableTargets"]] == [resource(ep)]

    arns = []
    for i in range(3):
        r = aas.put_scaling_policy(PolicyName="p%d" % i, PolicyType="TargetTrackingScaling",
                                   TargetTrackingScalingPolicyConfiguration=tracking(10.0 + i, 60, 120), **key(ep))
        arns.append(r["PolicyARN"])
    aas.put_scaling_policy(PolicyName="steps", PolicyType="StepScaling",
                           StepScalingPolicyConfiguration={
                               "AdjustmentType": "ChangeInCapacity", "Cooldown": 60,
                               "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]},
                           **key(ep))
    first = aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=resource(ep), MaxResults=2)
    assert [p["PolicyName"] for p in first["ScalingPolicies"]] == ["p0", "p1"]
    rest = aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=resource(ep), MaxResults=2,
                                         NextToken=first["NextToken"])
    assert [p["PolicyName"] for p in rest["ScalingPolicies"]] == ["p2", "steps"]
    assert "NextToken" not in rest
    p1 = first["ScalingPolicies"][1]
    assert p1["PolicyARN"] == arns[1] and p1["PolicyType"] == "TargetTrackingScaling"
    assert p1["TargetTrackingScalingPolicyConfiguration"]["ScaleInCooldown"] == 120
    assert len(p1["Alarms"]) == 2
    paginator = aas.get_paginator("describe_scaling_policies")
    names = [p["PolicyName"] for page in paginator.paginate(ServiceNamespace="sagemaker", ResourceId=resource(ep),
                                                            PaginationConfig={"PageSize": 1})
             for p in page["ScalingPolicies"]]
    assert names == ["p0", "p1", "p2", "steps"]
    alarms = cw.describe_alarms(AlarmNamePrefix="TargetTracking-%s-" % resource(ep))["MetricAlarms"]
    assert len(alarms) == 6
    assert {a["StateValue"] for a in alarms} <= {"OK", "ALARM", "INSUFFICIENT_DATA"}

    aas.delete_scaling_policy(PolicyName="p1", **key(ep))
    left = aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=resource(ep))["ScalingPolicies"]
    assert [p["PolicyName"] for p in left] == ["p0", "p2", "steps"]
    assert len(cw.describe_alarms(AlarmNamePrefix="TargetTracking-%s-" % resource(ep))["MetricAlarms"]) == 4

    aas.put_scheduled_action(ScheduledActionName="evening", Schedule="cron(0 18 * * ? *)",
                             ScalableTargetAction={"MinCapacity": 1, "MaxCapacity": 2}, **key(ep))
    aas.put_scheduled_action(ScheduledActionName="later", Schedule="at(2099-01-01T00:00:00)",
                             ScalableTargetAction={"MinCapacity": 2}, **key(ep))
    actions = aas.describe_scheduled_actions(ServiceNamespace="sagemaker", ResourceId=resource(ep))["ScheduledActions"]
    assert [(a["ScheduledActionName"], a["Schedule"]) for a in actions] == [
        ("evening", "cron(0 18 * * ? *)"), ("later", "at(2099-01-01T00:00:00)")]
    aas.delete_scheduled_action(ScheduledActionName="later", **key(ep))
    code, _ = error_of(aas.delete_scheduled_action, ScheduledActionName="later", **key(ep))
    assert code == "ObjectNotFoundException"

    # Deregistering takes the policies, their alarms and the scheduled actions with it.
    aas.deregister_scalable_target(**key(ep))
    assert aas.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[resource(ep)])[
        "ScalableTargets"] == []
    assert aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=resource(ep))["ScalingPolicies"] == []
    assert aas.describe_scheduled_actions(ServiceNamespace="sagemaker",
                                          ResourceId=resource(ep))["ScheduledActions"] == []
    assert cw.describe_alarms(AlarmNamePrefix="TargetTracking-%s-" % resource(ep))["MetricAlarms"] == []
