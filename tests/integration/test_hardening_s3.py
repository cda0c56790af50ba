"""Issue 9 (hardening), S3 part: AWS's bucket naming rules in full (reserved prefixes and suffixes
refused by CreateBucket, as S3 refuses them), and presigned-URL expiry answered exactly as S3 does
for SigV4 (X-Amz-Expires) and SigV2 (Expires) URLs."""

import datetime
import urllib.parse

import pytest
from botocore.exceptions import ClientError

import kiln_harness as kh

RESERVED = ["xn--bucket", "sthree-bucket", "sthree-configurator", "amzn-s3-demo-bucket", "bucket-s3alias",
            "bucket--ol-s3", "bucket.mrap", "bucket--use1-az4--x-s3", "bucket--table-s3"]
LOOKALIKES = ["xn-bucket", "sthreebucket", "amzn-s3-demobucket", "bucket-s3aliasx", "bucket-ol-s3", "bucketmrap",
              "bucket-x-s3", "bucket-table-s3"]
WEEK_MESSAGE = ("X-Amz-Expires must be less than a week (in seconds); that is, the given X-Amz-Expires must be "
                "less than 604800 seconds")


def _iso(text):
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)


def _only(body, name):
    values = kh.xml_find(body, name)
    assert len(values) == 1, (name, body)
    return values[0]


# -- bucket names --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", RESERVED)
def test_reserved_bucket_names_refused(s3, name):
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket=name)
    err = e.value.response
    assert err["Error"]["Code"] == "InvalidBucketName", err
    assert err["Error"]["Message"] == "The specified bucket is not valid.", err
    assert err["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def test_reserved_name_refused_raw_with_bucket_name_element(kiln):
    status, _, body = kh.signed_request(kiln, "PUT", "/xn--raw-bucket")
    assert status == 400, body
    assert kh.xml_error_code(body) == "InvalidBucketName"
    assert _only(body, "BucketName") == "xn--raw-bucket"


def test_lookalike_names_still_accepted(s3):
    for name in LOOKALIKES:
        s3.create_bucket(Bucket=name)
        s3.put_object(Bucket=name, Key="k", Body=b"v")
        assert s3.get_object(Bucket=name, Key="k")["Body"].read() == b"v"
        s3.delete_object(Bucket=name, Key="k")
        s3.delete_bucket(Bucket=name)


# -- presigned SigV4 -----------------------------------------------------------------------------

def test_presigned_v4_expired_has_s3_details(kiln, s3, bucket):
    s3.put_object(Bucket=bucket, Key="p", Body=b"p")
    url = "%s/%s/p" % (kiln.endpoint, bucket)
    signed_at = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0) - datetime.timedelta(minutes=30)
    old = kh.presign_url("GET", url, kiln.creds(), expires=60, when=signed_at)
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    status, headers, body = kh.http_request("GET", old)
    after = datetime.datetime.now(datetime.timezone.utc)
    assert status == 403, body
    assert kh.xml_error_code(body) == "AccessDenied"
    assert _only(body, "Message") == "Request has expired"
    assert _only(body, "X-Amz-Expires") == "60"
    assert _iso(_only(body, "Expires")) == signed_at + datetime.timedelta(seconds=60)
    assert before <= _iso(_only(body, "ServerTime")) <= after
    assert headers.get("content-type", "").startswith("application/xml")


def test_presigned_v4_zero_expires_is_valid_but_already_expired(kiln, s3, bucket):
    s3.put_object(Bucket=bucket, Key="z", Body=b"z")
    url = "%s/%s/z" % (kiln.endpoint, bucket)
    when = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=5)
    status, _, body = kh.http_request("GET", kh.presign_url("GET", url, kiln.creds(), expires=0, when=when))
    assert (status, kh.xml_error_code(body), _only(body, "Message")) == (403, "AccessDenied", "Request has expired")
    assert _only(body, "X-Amz-Expires") == "0"


@pytest.mark.parametrize("expires,message", [
    ("604801", WEEK_MESSAGE),
    ("9223372036854775807", WEEK_MESSAGE),
    ("-1", "X-Amz-Expires must be non-negative"),
    ("abc", "X-Amz-Expires should be a number"),
    ("9223372036854775808", "X-Amz-Expires should be a number"),
])
def test_presigned_v4_bad_expires(kiln, s3, bucket, expires, message):
    url = "%s/%s/p" % (kiln.endpoint, bucket)
    status, _, body = kh.http_request("GET", kh.presign_url("GET", url, kiln.creds(), expires=expires))
    assert status == 400, body
    assert kh.xml_error_code(body) == "AuthorizationQueryParametersError"
    assert _only(body, "Message") == message


def test_presigned_v4_week_is_accepted(kiln, s3, bucket):
    s3.put_object(Bucket=bucket, Key="w", Body=b"week")
    url = "%s/%s/w" % (kiln.endpoint, bucket)
    status, _, body = kh.http_request("GET", kh.presign_url("GET", url, kiln.creds(), expires=604800))
    assert (status, body) == (200, b"week")


def test_presigned_v4_wrong_region_names_the_parameter(kiln, s3, bucket):
    url = "%s/%s/p" % (kiln.endpoint, bucket)
    status, _, body = kh.http_request("GET", kh.presign_url("GET", url, kiln.creds(), region="eu-north-9"))
    assert status == 400, body
    assert kh.xml_error_code(body) == "AuthorizationQueryParametersError"
    assert _only(body, "Message") == ("Error parsing the X-Amz-Credential parameter; the region 'eu-north-9' is "
                                      "wrong; expecting 'us-east-1'")


# -- presigned SigV2 (botocore's default for S3 with a custom endpoint in us-east-1) ---------------

def test_presigned_v2_expired_has_s3_details(kiln, s3, bucket):
    s3.put_object(Bucket=bucket, Key="v2", Body=b"v2")
    v2 = kiln.client("s3", signature_version="s3")
    url = v2.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "v2"}, ExpiresIn=-120)
    expires = int(urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["Expires"][0])
    assert "X-Amz-Signature" not in url
    status, _, body = kh.http_request("GET", url)
    assert status == 403, body
    assert kh.xml_error_code(body) == "AccessDenied"
    assert _only(body, "Message") == "Request has expired"
    assert _iso(_only(body, "Expires")) == datetime.datetime.fromtimestamp(expires, datetime.timezone.utc)
    assert _iso(_only(body, "ServerTime")) >= datetime.datetime.fromtimestamp(expires, datetime.timezone.utc)
    assert kh.xml_find(body, "X-Amz-Expires") == []
    fresh = v2.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "v2"}, ExpiresIn=60)
    status, _, body = kh.http_request("GET", fresh)
    assert (status, body) == (200, b"v2")


@pytest.mark.parametrize("expires", ["tomorrow", "-5", "4294967296"])
def test_presigned_v2_invalid_expires(kiln, s3, bucket, expires):
    v2 = kiln.client("s3", signature_version="s3")
    url = v2.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "v2"}, ExpiresIn=60)
    parts = urllib.parse.urlsplit(url)
    query = [(k, expires if k == "Expires" else v) for k, v in urllib.parse.parse_qsl(parts.query)]
    url = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
    status, _, body = kh.http_request("GET", url)
    assert status == 403, body
    assert kh.xml_error_code(body) == "AccessDenied"
    assert _only(body, "Message") == "Invalid date (should be seconds since epoch): " + expires


def test_presigned_v2_missing_parameter(kiln, s3, bucket):
    v2 = kiln.client("s3", signature_version="s3")
    url = v2.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "v2"}, ExpiresIn=60)
    parts = urllib.parse.urlsplit(url)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "Expires"]
    url = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
    status, _, body = kh.http_request("GET", url)
    assert (status, kh.xml_error_code(body)) == (403, "AccessDenied"), body
    assert _only(body, "Message") == ("Query-string authentication requires the Signature, Expires and "
                                      "AWSAccessKeyId parameters")
