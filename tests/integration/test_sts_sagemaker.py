"""STS GetCallerIdentity and the JSON 1.1 dispatch (SageMaker/Logs/AnyScaleFrontendService)."""

import json
import subprocess

import pytest
from botocore.exceptions import ClientError

import kiln_harness as kh


def test_sts_boto3(kiln):
    ident = kiln.client("sts").get_caller_identity()
    assert ident["Account"] == kiln.credentials["account_id"] == "000000000000"
    assert ident["Arn"] == kiln.credentials["principal_arn"] == "arn:aws:iam::000000000000:user/kiln-admin"
    assert ident["UserId"] == kiln.credentials["user_id"]
    assert ident["ResponseMetadata"]["RequestId"]


def test_sts_cli(aws, kiln):
    out = json.loads(aws("sts", "get-caller-identity", "--output", "json").stdout)
    assert out["Account"] == kiln.credentials["account_id"]
    assert out["Arn"] == kiln.credentials["principal_arn"]


def test_sts_get_form_and_errors(kiln):
    status, _, body = kh.signed_request(kiln, "GET", "/?Action=GetCallerIdentity&Version=2011-06-15", service="sts")
    assert status == 200, body
    assert kh.xml_find(body, "Account") == [kiln.credentials["account_id"]]
    assert kh.xml_find(body, "RequestId")
    headers = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}
    status, _, body = kh.signed_request(kiln, "POST", "/", service="sts", headers=headers,
                                        body=b"Action=NoSuchAction&Version=2011-06-15")
    assert (status, kh.xml_error_code(body)) == (400, "InvalidAction"), body
    status, _, body = kh.signed_request(kiln, "POST", "/", service="sts", headers=headers, body=b"Version=2011-06-15")
    assert (status, kh.xml_error_code(body)) == (400, "MissingAction"), body


def test_sagemaker_list_training_jobs_through_the_front_door(kiln):
    """The SageMaker front door authenticates and dispatches to an implemented operation; an
    operation Kiln does not implement answers 400 UnknownOperationException naming it."""
    sm = kiln.client("sagemaker")
    listed = sm.list_training_jobs()
    assert isinstance(listed["TrainingJobSummaries"], list)
    assert listed["ResponseMetadata"]["HTTPHeaders"].get("x-amzn-requestid")
    with pytest.raises(ClientError) as e:
        sm.list_compilation_jobs()
    assert e.value.response["Error"]["Code"] == "UnknownOperationException"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert "ListCompilationJobs" in e.value.response["Error"]["Message"]


def test_unknown_targets(kiln):
    for target, service in [("SageMaker.NoSuchOperation", "sagemaker"), ("Bogus_2020.Whatever", "sagemaker"),
                            ("Logs_20140328.NoSuchOperation", "logs"),
                            ("AnyScaleFrontendService.NoSuchOperation", "application-autoscaling")]:
        status, headers, body = kh.json_request(kiln, target, {}, service=service)
        assert status == 400, (target, body)
        doc = json.loads(body)
        assert doc["__type"] == "UnknownOperationException", (target, body)
        assert (doc.get("message") or doc.get("Message")), body
        assert headers.get("content-type", "").startswith("application/x-amz-json-1.1")


def test_json_other_path_is_404(kiln):
    status, _, body = kh.signed_request(kiln, "POST", "/not-root", service="sagemaker",
                                        headers={"X-Amz-Target": "SageMaker.ListTrainingJobs",
                                                 "Content-Type": "application/x-amz-json-1.1"}, body=b"{}")
    assert status in (400, 404), body
