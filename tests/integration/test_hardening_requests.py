"""Hardening regressions for request bodies and crashes (issue: hardening):

* a JSON body nested 55,000 levels deep (any valid key) answers 400 SerializationException on every
  operation that used to crash the server, and the server keeps serving;
* a 10 MB member value's error quotes a bounded prefix (the answer is small);
* 2^62 for an int member is refused as a type error, and a job with the largest int
  MaxRuntimeInSeconds runs normally;
* a fatal signal leaves the signal and a symbolised backtrace in the server log, and a restarted
  server adopts the training job that kept running meanwhile.
"""

import json
import os
import re
import signal
import time

import pytest

import kiln_harness as kh
import training_helpers as th

NESTED_OPERATIONS = ["ListTrainingJobs", "ListModels", "ListEndpoints", "ListEndpointConfigs", "CreateModel",
                     "DescribeTrainingJob", "CreateTrainingJob"]


def nested_body(depth=55000):
    # ~280 KB: {"NameContains": "x", "Unknown": {"a":{"a":...1...}}}
    return ('{"NameContains": "x", "ModelName": "m", "Unknown": ' + '{"a":' * depth + "1" + "}" * depth + "}").encode()


@pytest.mark.parametrize("operation", NESTED_OPERATIONS)
def test_deeply_nested_body_is_refused_and_server_keeps_serving(kiln, operation):
    status, headers, body = kh.json_request(kiln, "SageMaker." + operation, None, raw_body=nested_body())
    assert status == 400, body[:300]
    answer = json.loads(body)
    assert answer["__type"].endswith("SerializationException"), answer
    assert "deeper than 64 levels" in answer["message"], answer
    assert kiln.healthy()
    sm = kiln.client("sagemaker")
    assert "TrainingJobSummaries" in sm.list_training_jobs()


def test_nested_arrays_in_logs_and_deep_but_legal_bodies(kiln):
    body = ('{"logGroupName": "g", "logStreamName": "s", "logEvents": ' + "[" * 100000 + "]" * 100000 + "}").encode()
    status, _, answer = kh.json_request(kiln, "Logs_20140328.PutLogEvents", None, service="logs", raw_body=body)
    assert status == 400 and b"deeper than 64 levels" in answer, answer[:300]
    # Unknown members up to the limit are ignored as before.
    body = ('{"Unknown": ' + "[" * 60 + "]" * 60 + "}").encode()
    status, _, answer = kh.json_request(kiln, "SageMaker.ListTrainingJobs", None, raw_body=body)
    assert status == 200, answer[:300]


def test_ten_megabyte_value_error_is_small(kiln):
    payload = th.training_request("big-value", "b")
    payload["TrainingJobName"] = "n" * (10 * 1024 * 1024)
    status, _, body = kh.json_request(kiln, "SageMaker.CreateTrainingJob", payload)
    assert status == 400
    assert len(body) < 8192, len(body)
    answer = json.loads(body)
    assert answer["__type"].endswith("ValidationException")
    assert "nnn...' at 'trainingJobName'" in answer["message"]
    assert kiln.healthy()


def test_huge_int_is_refused_as_aws_does(kiln):
    payload = th.training_request(th.unique_name("overflow"), "b")
    payload["StoppingCondition"]["MaxRuntimeInSeconds"] = 2 ** 62
    status, _, body = kh.json_request(kiln, "SageMaker.CreateTrainingJob", payload)
    assert status == 400, body
    answer = json.loads(body)
    assert answer["__type"].endswith("SerializationException")
    assert answer["message"].startswith("Numeric value (4611686018427387904) out of range of int"), answer
    sm = kiln.client("sagemaker")
    with pytest.raises(sm.exceptions.ClientError, match="Requested resource not found"):
        sm.describe_training_job(TrainingJobName=payload["TrainingJobName"])


def test_largest_int_runtime_runs_normally(kiln):
    sm, s3 = kiln.client("sagemaker"), kiln.client("s3")
    bucket = th.unique_name("maxint")
    s3.create_bucket(Bucket=bucket)
    name = th.unique_name("maxint")
    sm.create_training_job(**th.training_request(name, bucket, max_runtime=2 ** 31 - 1,
                                                 hyperparameters={"ticks": "1", "tick_interval": "0"}))
    d = th.wait_for_status(sm, name, timeout=120, server=kiln)
    assert d["TrainingJobStatus"] == "Completed", (d["TrainingJobStatus"], d.get("FailureReason"))
    assert d["StoppingCondition"]["MaxRuntimeInSeconds"] == 2 ** 31 - 1


def test_fatal_signal_writes_backtrace_and_restart_adopts(kiln_factory):
    srv = kiln_factory("crash", config=th.SHRINK_CONFIG)
    sm, s3, logs = srv.client("sagemaker"), srv.client("s3"), srv.client("logs")
    bucket = th.unique_name("crash")
    s3.create_bucket(Bucket=bucket)
    name = th.unique_name("crash-survivor")
    sm.create_training_job(**th.training_request(
        name, bucket, hyperparameters={"ticks": "8", "tick_interval": "1", "write_model": "survived"}))
    th.wait_for_secondary(sm, name, "Training", timeout=120)

    os.kill(srv.proc.pid, signal.SIGSEGV)
    rc = srv.proc.wait(timeout=30)
    assert rc == -signal.SIGSEGV, rc
    log = srv.log_text()
    assert re.search(r'level=critical msg="fatal signal" signal=SIGSEGV code=-?\d+( addr=0x[0-9a-f]+)? pid=\d+ tid=\d+', log), log[-3000:]
    frames = re.findall(r'msg="backtrace" frame=\d+ at="([^"]*)"', log)
    assert len(frames) >= 3, log[-3000:]
    # Symbolised: function names from Kiln's own code, with source lines where the binary has them.
    assert any("kiln::" in f for f in frames), frames

    srv.start()  # what systemd's Restart=on-failure does
    sm = srv.client("sagemaker")
    d = th.wait_for_status(sm, name, timeout=180, server=srv)
    assert d["TrainingJobStatus"] == "Completed", (d["TrainingJobStatus"], d.get("FailureReason"), srv.log_tail(40))
    assert th.model_files(srv.client("s3"), d)["partial.txt"] == b"survived"
