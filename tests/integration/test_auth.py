"""Every authentication failure, per protocol (spec/control-plane-api.md §3.6): S3 (REST-XML),
STS (Query) and the JSON 1.1 services (SageMaker)."""

import datetime
import json

import pytest
import requests
from botocore.exceptions import ClientError

import kiln_harness as kh

SKEW = datetime.timedelta(minutes=20)
STS_BODY = b"Action=GetCallerIdentity&Version=2011-06-15"
STS_HEADERS = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}


def _json_error(body):
    doc = json.loads(body)
    return doc.get("__type", "").split("#")[-1].split(":")[0], doc


def _sts(kiln, creds=None, when=None):
    return kh.signed_request(kiln, "POST", "/", service="sts", body=STS_BODY, headers=STS_HEADERS,
                             creds=creds, when=when)


def _sm(kiln, creds=None, when=None):
    return kh.json_request(kiln, "SageMaker.ListTrainingJobs", {}, creds=creds, when=when)


# -- unknown access key --------------------------------------------------------------------------

def test_unknown_key_boto3(kiln):
    with pytest.raises(ClientError) as e:
        kiln.client("s3", access_key="AKIAUNKNOWNKEY000000").list_buckets()
    assert e.value.response["Error"]["Code"] == "InvalidAccessKeyId"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(ClientError) as e:
        kiln.client("sts", access_key="AKIAUNKNOWNKEY000000").get_caller_identity()
    assert e.value.response["Error"]["Code"] == "InvalidClientTokenId"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(ClientError) as e:
        kiln.client("sagemaker", access_key="AKIAUNKNOWNKEY000000").list_training_jobs()
    assert e.value.response["Error"]["Code"] == "UnrecognizedClientException"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_unknown_key_raw(kiln):
    bad = kh.Creds("AKIAUNKNOWNKEY000000", kiln.secret_key)
    status, headers, body = kh.signed_request(kiln, "GET", "/", creds=bad)
    assert (status, kh.xml_error_code(body)) == (403, "InvalidAccessKeyId")
    assert "date" in headers
    status, _, body = _sts(kiln, creds=bad)
    assert (status, kh.xml_error_code(body)) == (403, "InvalidClientTokenId")
    status, headers, body = _sm(kiln, creds=bad)
    assert (status, _json_error(body)[0]) == (400, "UnrecognizedClientException")
    assert "x-amzn-requestid" in headers


# -- wrong secret ---------------------------------------------------------------------------------

def test_bad_secret(kiln):
    wrong = kiln.secret_key[:-4] + "XXXX"
    with pytest.raises(ClientError) as e:
        kiln.client("s3", secret_key=wrong).list_buckets()
    assert e.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(ClientError) as e:
        kiln.client("sts", secret_key=wrong).get_caller_identity()
    assert e.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    with pytest.raises(ClientError) as e:
        kiln.client("sagemaker", secret_key=wrong).list_training_jobs()
    assert e.value.response["Error"]["Code"] == "InvalidSignatureException"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_signature_covers_body_and_headers(kiln, bucket):
    """A signed JSON request whose body is changed after signing fails; so does a changed signed header."""
    body = b'{"MaxResults": 5}'
    headers = {"X-Amz-Target": "SageMaker.ListTrainingJobs", "Content-Type": "application/x-amz-json-1.1"}
    hdrs, _, _ = kh.sign_request("POST", kiln.endpoint + "/", headers, kiln.creds(), "sagemaker", body=body)
    status, _, resp = kh.http_request("POST", kiln.endpoint + "/", hdrs, b'{"MaxResults": 6}')
    assert (status, _json_error(resp)[0]) == (400, "InvalidSignatureException")
    hdrs, _, _ = kh.sign_request("GET", kiln.endpoint + "/%s?list-type=2" % bucket, {}, kiln.creds(), "s3")
    status, _, resp = kh.http_request("GET", kiln.endpoint + "/%s?list-type=2&prefix=x" % bucket, hdrs)
    assert (status, kh.xml_error_code(resp)) == (403, "SignatureDoesNotMatch")


def test_wrong_region_or_service_scope(kiln):
    status, _, body = kh.signed_request(kiln, "GET", "/", region="xx-nowhere-9")
    assert status in (400, 403), body
    assert kh.xml_error_code(body) in ("AuthorizationHeaderMalformed", "SignatureDoesNotMatch", "AccessDenied")


# -- clock skew -----------------------------------------------------------------------------------

@pytest.mark.parametrize("direction", [-1, 1])
def test_clock_skew(kiln, direction):
    when = datetime.datetime.now(datetime.timezone.utc) + direction * SKEW
    status, headers, body = kh.signed_request(kiln, "GET", "/", when=when)
    assert (status, kh.xml_error_code(body)) == (403, "RequestTimeTooSkewed"), body
    assert "date" in headers, "errors must carry Date so SDKs can correct skew"
    status, headers, body = _sm(kiln, when=when)
    code, doc = _json_error(body)
    assert (status, code) == (400, "InvalidSignatureException"), body
    # AWS wording: "Signature expired: ..." for the past, "Signature not yet current: ..." for the future.
    expected = "Signature expired" if direction < 0 else "Signature not yet current"
    assert expected in (doc.get("message") or doc.get("Message") or ""), body
    assert "date" in headers
    status, _, body = _sts(kiln, when=when)
    assert (status, kh.xml_error_code(body)) == (403, "SignatureDoesNotMatch"), body


def test_small_skew_accepted(kiln):
    when = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=10)
    status, _, body = kh.signed_request(kiln, "GET", "/", when=when)
    assert status == 200, body


def test_skew_with_botocore_signer(kiln):
    """The same through botocore's own SigV4Auth with a manually set X-Amz-Date."""
    import botocore.auth
    import botocore.awsrequest
    import botocore.credentials
    creds = botocore.credentials.Credentials(kiln.access_key, kiln.secret_key)

    class SkewedAuth(botocore.auth.SigV4Auth):
        def add_auth(self, request):
            ts = (datetime.datetime.now(datetime.timezone.utc) - SKEW).strftime("%Y%m%dT%H%M%SZ")
            request.context["timestamp"] = ts
            self._modify_request_before_signing(request)
            request.headers["X-Amz-Date"] = ts  # what _modify_request_before_signing would set
            canonical = self.canonical_request(request)
            sts = self.string_to_sign(request, canonical)
            self._inject_signature_to_request(request, self.signature(sts, request))

    body = b"{}"
    req = botocore.awsrequest.AWSRequest(method="POST", url=kiln.endpoint + "/", data=body, headers={
        "X-Amz-Target": "SageMaker.ListTrainingJobs", "Content-Type": "application/x-amz-json-1.1"})
    SkewedAuth(creds, "sagemaker", "us-east-1").add_auth(req)
    r = requests.post(kiln.endpoint + "/", data=body, headers=dict(req.headers.items()), timeout=30)
    assert r.status_code == 400 and _json_error(r.content)[0] == "InvalidSignatureException", r.text

    class SkewedS3Auth(botocore.auth.S3SigV4Auth):
        add_auth = SkewedAuth.add_auth

    req = botocore.awsrequest.AWSRequest(method="GET", url=kiln.endpoint + "/")
    SkewedS3Auth(creds, "s3", "us-east-1").add_auth(req)
    r = requests.get(kiln.endpoint + "/", headers=dict(req.headers.items()), timeout=30)
    assert r.status_code == 403 and kh.xml_error_code(r.content) == "RequestTimeTooSkewed", r.text


# -- no credentials at all --------------------------------------------------------------------------

def test_missing_auth(kiln, bucket):
    status, _, body = kh.http_request("GET", kiln.endpoint + "/")
    assert (status, kh.xml_error_code(body)) == (403, "AccessDenied")
    status, _, body = kh.http_request("PUT", kiln.endpoint + "/%s/anon" % bucket, body=b"x")
    assert (status, kh.xml_error_code(body)) == (403, "AccessDenied")
    status, _, body = kh.http_request("POST", kiln.endpoint + "/", {
        "X-Amz-Target": "SageMaker.ListTrainingJobs", "Content-Type": "application/x-amz-json-1.1"}, b"{}")
    assert (status, _json_error(body)[0]) == (400, "MissingAuthenticationTokenException")
    status, _, body = kh.http_request("POST", kiln.endpoint + "/", dict(STS_HEADERS), STS_BODY)
    assert (status, kh.xml_error_code(body)) == (403, "MissingAuthenticationToken")
    # Nothing was written anonymously.
    status, _, _ = kh.signed_request(kiln, "HEAD", "/%s/anon" % bucket)
    assert status == 404


# -- malformed Authorization header ---------------------------------------------------------------

MALFORMED = [
    "AWS4-HMAC-SHA256",
    "AWS4-HMAC-SHA256 Credential=AKIAX/20240101/us-east-1/s3/aws4_request",
    "AWS4-HMAC-SHA256 Credential=AKIAX, SignedHeaders=host, Signature=00",
    "AWS4-HMAC-SHA256 SignedHeaders=host;x-amz-date, Signature=" + "0" * 64,
    "Bearer abc",
]


@pytest.mark.parametrize("auth", MALFORMED)
def test_malformed_authorization_header(kiln, auth):
    date = kh.amz_date()
    s3_headers = {"Authorization": auth, "X-Amz-Date": date, "x-amz-content-sha256": kh.EMPTY_SHA256}
    status, _, body = kh.http_request("GET", kiln.endpoint + "/", s3_headers)
    assert status in (400, 403), body
    assert kh.xml_error_code(body) in ("AuthorizationHeaderMalformed", "InvalidArgument", "AccessDenied"), body
    status, _, body = kh.http_request("POST", kiln.endpoint + "/", {
        "Authorization": auth, "X-Amz-Date": date, "X-Amz-Target": "SageMaker.ListTrainingJobs",
        "Content-Type": "application/x-amz-json-1.1"}, b"{}")
    assert status == 400, body
    assert _json_error(body)[0] in ("IncompleteSignatureException", "MissingAuthenticationTokenException"), body


def test_malformed_authorization_exact_codes(kiln):
    """A header with the algorithm but missing parts: the spec's codes exactly."""
    auth = "AWS4-HMAC-SHA256 Credential=%s/%s/us-east-1/s3/aws4_request, SignedHeaders=host" % (
        kiln.access_key, kh.amz_date()[:8])
    date = kh.amz_date()
    status, _, body = kh.http_request("GET", kiln.endpoint + "/", {
        "Authorization": auth, "X-Amz-Date": date, "x-amz-content-sha256": kh.EMPTY_SHA256})
    assert (status, kh.xml_error_code(body)) == (400, "AuthorizationHeaderMalformed"), body
    status, _, body = kh.http_request("POST", kiln.endpoint + "/", {
        "Authorization": auth.replace("/s3/", "/sagemaker/"), "X-Amz-Date": date,
        "X-Amz-Target": "SageMaker.ListTrainingJobs", "Content-Type": "application/x-amz-json-1.1"}, b"{}")
    assert (status, _json_error(body)[0]) == (400, "IncompleteSignatureException"), body
    status, _, body = kh.http_request("POST", kiln.endpoint + "/", dict(STS_HEADERS, **{
        "Authorization": auth.replace("/s3/", "/sts/"), "X-Amz-Date": date}), STS_BODY)
    assert (status, kh.xml_error_code(body)) == (400, "IncompleteSignature"), body


def test_s3_requires_content_sha256(kiln):
    """x-amz-content-sha256 is required on every header-signed S3 request (§3.4)."""
    hdrs, _, _ = kh.sign_request("GET", kiln.endpoint + "/", {}, kiln.creds(), "s3", add_content_sha256=False)
    status, _, body = kh.http_request("GET", kiln.endpoint + "/", hdrs)
    assert status in (400, 403), body
    assert kh.xml_error_code(body) in ("InvalidRequest", "InvalidArgument", "AuthorizationHeaderMalformed",
                                       "AccessDenied", "SignatureDoesNotMatch"), body


# -- presigned -----------------------------------------------------------------------------------

def test_presigned_expired_and_bad(kiln, s3, bucket):
    s3.put_object(Bucket=bucket, Key="p", Body=b"p")
    url = "%s/%s/p" % (kiln.endpoint, bucket)
    old = kh.presign_url("GET", url, kiln.creds(), expires=60,
                         when=datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=30))
    status, _, body = kh.http_request("GET", old)
    assert (status, kh.xml_error_code(body)) == (403, "AccessDenied") and b"Request has expired" in body
    unknown = kh.presign_url("GET", url, kh.Creds("AKIAUNKNOWNKEY000000", "x"))
    status, _, body = kh.http_request("GET", unknown)
    assert (status, kh.xml_error_code(body)) == (403, "InvalidAccessKeyId")
    wrong = kh.presign_url("GET", url, kh.Creds(kiln.access_key, "wrong"))
    status, _, body = kh.http_request("GET", wrong)
    assert (status, kh.xml_error_code(body)) == (403, "SignatureDoesNotMatch")
    too_long = kh.presign_url("GET", url, kiln.creds(), expires=604801)
    status, _, body = kh.http_request("GET", too_long)
    assert status in (400, 403), body
