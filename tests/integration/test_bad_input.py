"""Malformed and hostile input: the server answers with the right error (or closes), stores
nothing, and stays healthy."""

import base64
import hashlib
import json

import pytest
from botocore.exceptions import ClientError

import kiln_harness as kh


@pytest.fixture(autouse=True)
def _healthy_after(kiln):
    yield
    assert kiln.healthy(), "server unhealthy after bad input; log tail:\n" + kiln.log_tail()


RAW_GARBAGE = [
    b"GARBAGE\r\n\r\n",
    b"GET\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nNoColonHeader\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\nabc\r\n0\r\n\r\n",
    b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS ClientHello
    b"\x00\xff\xfe" * 1000,
    b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
]


@pytest.mark.parametrize("payload", RAW_GARBAGE, ids=range(len(RAW_GARBAGE)))
def test_malformed_http(kiln, payload):
    resp = kh.raw_exchange("127.0.0.1", kiln.port, payload, timeout=5)
    status = kh.status_of(resp)
    # Either an HTTP 4xx or a closed connection; never a 2xx or 5xx.
    assert status is None or 400 <= status < 500, resp[:300]


def test_oversize_headers_431(kiln):
    big = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(
        b"X-Filler-%d: %s\r\n" % (i, b"v" * 1000) for i in range(100)) + b"\r\n"
    resp = kh.raw_exchange("127.0.0.1", kiln.port, big, timeout=5)
    assert kh.status_of(resp) == 431, resp[:300]


def test_slow_partial_headers_then_close(kiln):
    resp = kh.raw_exchange("127.0.0.1", kiln.port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Par", timeout=1,
                           half_close=True)
    assert kh.status_of(resp) in (None, 400)


def test_many_connections_opened_and_dropped(kiln):
    import socket
    socks = [socket.create_connection(("127.0.0.1", kiln.port)) for _ in range(50)]
    for s in socks:
        s.close()


def test_complete_multipart_malformed_xml(kiln, s3, bucket):
    uid = s3.create_multipart_upload(Bucket=bucket, Key="mpx")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="mpx", UploadId=uid, PartNumber=1, Body=b"abc")
    for body in (b"<CompleteMultipartUpload><Part>", b"not xml at all", b"",
                 b"<CompleteMultipartUpload><Part><PartNumber>x</PartNumber><ETag>e</ETag></Part></CompleteMultipartUpload>"):
        status, _, resp = kh.signed_request(kiln, "POST", "/%s/mpx?uploadId=%s" % (bucket, uid), body=body)
        assert status == 400, (body, resp)
        assert kh.xml_error_code(resp) in ("MalformedXML", "InvalidPart", "InvalidArgument"), (body, resp)
        if body in (b"<CompleteMultipartUpload><Part>", b"not xml at all"):
            assert kh.xml_error_code(resp) == "MalformedXML", resp
    # The upload is intact afterwards.
    assert len(s3.list_parts(Bucket=bucket, Key="mpx", UploadId=uid)["Parts"]) == 1
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="mpx")


def test_delete_objects_malformed_xml(kiln, s3, bucket):
    s3.put_object(Bucket=bucket, Key="keepme", Body=b"x")
    for body in (b"<Delete><Object><Key>keepme</Key>", b"{\"json\": true}"):
        md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
        status, _, resp = kh.signed_request(kiln, "POST", "/%s?delete" % bucket, body=body,
                                            headers={"Content-MD5": md5})
        assert (status, kh.xml_error_code(resp)) == (400, "MalformedXML"), resp
    assert s3.get_object(Bucket=bucket, Key="keepme")["Body"].read() == b"x"


def test_delete_objects_too_many(kiln, bucket):
    body = ("<Delete>" + "".join("<Object><Key>k%d</Key></Object>" % i for i in range(1001)) + "</Delete>").encode()
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    status, _, resp = kh.signed_request(kiln, "POST", "/%s?delete" % bucket, body=body, headers={"Content-MD5": md5})
    assert status == 400 and kh.xml_error_code(resp) in ("MalformedXML", "InvalidArgument"), resp


def test_wrong_content_md5(kiln, s3, bucket):
    wrong = base64.b64encode(hashlib.md5(b"something else").digest()).decode()
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="md5", Body=b"actual body", ContentMD5=wrong)
    assert e.value.response["Error"]["Code"] == "BadDigest"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="md5")
    assert e.value.response["Error"]["Code"] == "404"
    # Same for an upload part.
    uid = s3.create_multipart_upload(Bucket=bucket, Key="md5mp")["UploadId"]
    with pytest.raises(ClientError) as e:
        s3.upload_part(Bucket=bucket, Key="md5mp", UploadId=uid, PartNumber=1, Body=b"part", ContentMD5=wrong)
    assert e.value.response["Error"]["Code"] == "BadDigest"
    assert s3.list_parts(Bucket=bucket, Key="md5mp", UploadId=uid).get("Parts", []) == []
    # Overwriting an existing object with a bad digest keeps the old one.
    s3.put_object(Bucket=bucket, Key="md5keep", Body=b"v1")
    with pytest.raises(ClientError):
        s3.put_object(Bucket=bucket, Key="md5keep", Body=b"v2", ContentMD5=wrong)
    assert s3.get_object(Bucket=bucket, Key="md5keep")["Body"].read() == b"v1"
    # A correct one is accepted.
    right = base64.b64encode(hashlib.md5(b"good").digest()).decode()
    s3.put_object(Bucket=bucket, Key="md5ok", Body=b"good", ContentMD5=right)


def test_invalid_content_md5_syntax(kiln, bucket):
    status, _, resp = kh.signed_request(kiln, "PUT", "/%s/badmd5" % bucket, body=b"x",
                                        headers={"Content-MD5": "not-base64!!"})
    assert status == 400 and kh.xml_error_code(resp) in ("InvalidDigest", "BadDigest"), resp


def test_wrong_content_sha256(kiln, s3, bucket):
    body = b"the real body" * 1000
    declared = hashlib.sha256(b"a different body").hexdigest()
    status, _, resp = kh.signed_request(kiln, "PUT", "/%s/sha" % bucket, body=body, payload_hash=declared)
    assert (status, kh.xml_error_code(resp)) == (400, "XAmzContentSHA256Mismatch"), resp
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="sha")
    # Large enough to be streamed to disk before the mismatch is known.
    body = b"z" * (9 * 1024 * 1024)
    status, _, resp = kh.signed_request(kiln, "PUT", "/%s/sha-big" % bucket, body=body, payload_hash=declared)
    assert (status, kh.xml_error_code(resp)) == (400, "XAmzContentSHA256Mismatch"), resp
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="sha-big")
    # Not hex at all.
    status, _, resp = kh.signed_request(kiln, "PUT", "/%s/sha2" % bucket, body=b"x", payload_hash="nothex")
    assert status == 400, resp
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket)


def test_wrong_checksum_header(kiln, s3, bucket):
    import zlib
    wrong = base64.b64encode((zlib.crc32(b"other") & 0xFFFFFFFF).to_bytes(4, "big")).decode()
    status, _, resp = kh.signed_request(kiln, "PUT", "/%s/crc" % bucket, body=b"payload",
                                        headers={"x-amz-checksum-crc32": wrong})
    assert status == 400 and kh.xml_error_code(resp) in ("BadDigest", "InvalidRequest"), resp
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="crc")


def test_json_malformed_body(kiln):
    for raw in (b"{not json", b"[1,2,", b"\xff\xfe", b'{"a": }'):
        status, headers, body = kh.json_request(kiln, "SageMaker.ListTrainingJobs", None, raw_body=raw)
        assert status == 400, body
        assert json.loads(body)["__type"].split("#")[-1] == "SerializationException", body
        assert headers.get("content-type", "").startswith("application/x-amz-json-1.1")


def test_json_non_object_body(kiln):
    status, _, body = kh.json_request(kiln, "SageMaker.ListTrainingJobs", None, raw_body=b"[1, 2]")
    assert status == 400
    assert json.loads(body)["__type"] in ("SerializationException", "UnknownOperationException"), body


def test_unknown_http_method(kiln, bucket):
    status, _, resp = kh.signed_request(kiln, "PATCH", "/%s/x" % bucket, body=b"x")
    assert status in (400, 405, 501), resp
