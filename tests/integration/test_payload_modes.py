"""S3 payload modes of spec §3.4 sent on the wire by hand: aws-chunked with per-chunk
signatures, aws-chunked with an unsigned CRC32 trailer, UNSIGNED-PAYLOAD; and their failures."""

import base64
import hashlib
import os
import zlib

import pytest
from botocore.exceptions import ClientError

import kiln_harness as kh

DATA = os.urandom(200_000 + 123)


def _crc32_b64(data):
    return base64.b64encode((zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "big")).decode()


def _crc_table(poly, width):
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C_TABLE = _crc_table(0x82F63B78, 32)
_CRC64NVME_TABLE = _crc_table(0x9A6C9329AC4BC9B5, 64)


def _reflected_crc_b64(data, table, width):
    mask = (1 << width) - 1
    c = mask
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return base64.b64encode((c ^ mask).to_bytes(width // 8, "big")).decode()


def _crc32c_b64(data):
    return _reflected_crc_b64(data, _CRC32C_TABLE, 32)


def _crc64nvme_b64(data):
    # CRC-64/NVME, the full-object checksum current AWS SDKs default to when awscrt is present.
    return _reflected_crc_b64(data, _CRC64NVME_TABLE, 64)


def _put_streaming_signed(kiln, path, data, tamper=False):
    url = kiln.endpoint + path
    # Length of the encoded body must be known before signing (Content-Length is signed by some SDKs).
    fake_ctx = {"key": b"\0" * 32, "ts": "20000101T000000Z", "scope": "x"}
    encoded_len = len(kh.aws_chunked_signed_body(fake_ctx, "0" * 64, data))
    headers = {"Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(data)),
               "Content-Length": str(encoded_len)}
    hdrs, seed, ctx = kh.sign_request("PUT", url, headers, kiln.creds(), "s3",
                                      payload_hash="STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
                                      signed_headers=["content-encoding", "content-length", "host",
                                                      "x-amz-content-sha256", "x-amz-date",
                                                      "x-amz-decoded-content-length"])
    body = kh.aws_chunked_signed_body(ctx, seed, data)
    if tamper:
        i = body.index(b"\r\n") + 10
        body = body[:i] + bytes([body[i] ^ 1]) + body[i + 1:]
    assert len(body) == encoded_len
    return kh.http_request("PUT", url, hdrs, body)


def test_streaming_signed_payload(kiln, s3, bucket):
    status, _, resp = _put_streaming_signed(kiln, "/%s/chunked-signed" % bucket, DATA)
    assert status == 200, resp
    got = s3.get_object(Bucket=bucket, Key="chunked-signed")
    assert got["Body"].read() == DATA
    assert got["ContentLength"] == len(DATA)
    assert "aws-chunked" not in got.get("ContentEncoding", "")


def test_streaming_signed_payload_bad_chunk(kiln, s3, bucket):
    status, _, resp = _put_streaming_signed(kiln, "/%s/chunked-bad" % bucket, DATA, tamper=True)
    assert (status, kh.xml_error_code(resp)) in ((403, "SignatureDoesNotMatch"), (400, "SignatureDoesNotMatch")), resp
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="chunked-bad")


@pytest.mark.parametrize("good", [True, False])
def test_unsigned_trailer_crc32(kiln, s3, bucket, good):
    key = "trailer-%s" % good
    crc = _crc32_b64(DATA if good else DATA[:-1])
    body = kh.aws_chunked_unsigned_trailer_body(DATA, "x-amz-checksum-crc32", crc, chunk_size=65536)
    headers = {"Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(DATA)),
               "x-amz-trailer": "x-amz-checksum-crc32", "Content-Length": str(len(body))}
    status, _, resp = kh.signed_request(kiln, "PUT", "/%s/%s" % (bucket, key), body=body, headers=headers,
                                        payload_hash="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    if good:
        assert status == 200, resp
        got = s3.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        assert got["Body"].read() == DATA
        # Returning a checksum is optional; returning a wrong one is not.
        crc_hdr = got["ResponseMetadata"]["HTTPHeaders"].get("x-amz-checksum-crc32")
        assert crc_hdr in (None, crc)
    else:
        assert status == 400 and kh.xml_error_code(resp) in ("BadDigest", "InvalidRequest"), resp
        with pytest.raises(ClientError):
            s3.head_object(Bucket=bucket, Key=key)


def test_http_chunked_transfer_with_aws_chunked(kiln, s3, bucket):
    """What botocore >= 1.36 sends over TLS: Transfer-Encoding: chunked carrying an aws-chunked body."""
    inner = kh.aws_chunked_unsigned_trailer_body(DATA, "x-amz-checksum-crc32", _crc32_b64(DATA), chunk_size=8192)
    outer = b"".join(b"%x\r\n" % len(inner[i:i + 50000]) + inner[i:i + 50000] + b"\r\n"
                     for i in range(0, len(inner), 50000)) + b"0\r\n\r\n"
    headers = {"Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(DATA)),
               "x-amz-trailer": "x-amz-checksum-crc32", "Transfer-Encoding": "chunked"}
    status, _, resp = kh.signed_request(kiln, "PUT", "/%s/te-chunked" % bucket, body=outer, headers=headers,
                                        payload_hash="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    assert status == 200, resp
    assert s3.get_object(Bucket=bucket, Key="te-chunked")["Body"].read() == DATA


def test_unsigned_payload(kiln, s3, bucket):
    status, _, resp = kh.signed_request(kiln, "PUT", "/%s/unsigned" % bucket, body=DATA,
                                        payload_hash="UNSIGNED-PAYLOAD")
    assert status == 200, resp
    assert s3.get_object(Bucket=bucket, Key="unsigned")["Body"].read() == DATA


def test_checksum_headers_validated_and_returned(kiln, s3, bucket):
    for algo, fn in [("sha256", lambda d: base64.b64encode(hashlib.sha256(d).digest()).decode()),
                     ("sha1", lambda d: base64.b64encode(hashlib.sha1(d).digest()).decode()),
                     ("crc32", _crc32_b64),
                     ("crc32c", _crc32c_b64),
                     ("crc64nvme", _crc64nvme_b64)]:
        key = "ck-" + algo
        status, _, resp = kh.signed_request(kiln, "PUT", "/%s/%s" % (bucket, key), body=DATA,
                                            headers={"x-amz-checksum-" + algo: fn(DATA)})
        assert status == 200, (algo, resp)
        head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        assert head["ResponseMetadata"]["HTTPHeaders"].get("x-amz-checksum-" + algo) == fn(DATA), algo
        status, _, resp = kh.signed_request(kiln, "PUT", "/%s/%s-bad" % (bucket, key), body=DATA,
                                            headers={"x-amz-checksum-" + algo: fn(b"nope")})
        assert status == 400, (algo, resp)
        with pytest.raises(ClientError):
            s3.head_object(Bucket=bucket, Key=key + "-bad")
