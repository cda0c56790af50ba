"""The suite's own SigV4 signer must agree with botocore's, or raw-request tests prove nothing."""

import datetime

import botocore.auth
import botocore.awsrequest
import botocore.credentials

import kiln_harness as kh

CREDS = kh.Creds("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")


def _botocore_sign(auth_cls, method, url, headers, body, service):
    creds = botocore.credentials.Credentials(CREDS.access_key, CREDS.secret_key)
    req = botocore.awsrequest.AWSRequest(method=method, url=url, headers=dict(headers), data=body)
    auth_cls(creds, service, "us-east-1").add_auth(req)
    return req


def _when(amz):
    return datetime.datetime.strptime(amz, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)


def test_s3_signature_matches_botocore():
    url = "http://127.0.0.1:9/bkt/a%20b/..%2F/c%2Bd?list-type=2&prefix=x%20y&delimiter=%2F"
    body = b"hello"
    req = _botocore_sign(botocore.auth.S3SigV4Auth, "PUT", url, {"Content-Type": "text/plain"}, body, "s3")
    ts = req.headers["X-Amz-Date"]
    names = req.headers["Authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    mine, _, _ = kh.sign_request("PUT", url, {"Content-Type": "text/plain"}, CREDS, "s3", body=body,
                                 when=_when(ts), signed_headers=names)
    assert mine["Authorization"] == req.headers["Authorization"]


def test_json_signature_matches_botocore():
    url = "http://127.0.0.1:9/"
    body = b'{"MaxResults": 5}'
    headers = {"X-Amz-Target": "SageMaker.ListTrainingJobs", "Content-Type": "application/x-amz-json-1.1"}
    req = _botocore_sign(botocore.auth.SigV4Auth, "POST", url, headers, body, "sagemaker")
    ts = req.headers["X-Amz-Date"]
    names = req.headers["Authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    mine, _, _ = kh.sign_request("POST", url, headers, CREDS, "sagemaker", body=body, when=_when(ts),
                                 signed_headers=names)
    assert mine["Authorization"] == req.headers["Authorization"]


def test_presign_matches_botocore():
    url = "http://127.0.0.1:9/bkt/some%20key"
    creds = botocore.credentials.Credentials(CREDS.access_key, CREDS.secret_key)
    req = botocore.awsrequest.AWSRequest(method="GET", url=url)
    botocore.auth.S3SigV4QueryAuth(creds, "s3", "us-east-1", expires=900).add_auth(req)
    q = dict(p.split("=", 1) for p in req.url.split("?", 1)[1].split("&"))
    mine = kh.presign_url("GET", url, CREDS, expires=900, when=_when(q["X-Amz-Date"]))
    mq = dict(p.split("=", 1) for p in mine.split("?", 1)[1].split("&"))
    assert mq["X-Amz-Signature"] == q["X-Amz-Signature"]
