#!/usr/bin/env python3
"""S3 round trips through whatever boto3 the running interpreter has.

Run by test_boto3_versions.py with Debian's /usr/bin/python3 (boto3 1.26: Content-MD5, no
default checksums) and with a newer interpreter (boto3 >= 1.36: CRC32 checksums by default on
PutObject/UploadPart/DeleteObjects, and with --force-trailer the aws-chunked body with an
unsigned CRC32 trailer that botocore otherwise only sends over TLS).

Usage: s3_client_logic.py ENDPOINT ACCESS_KEY SECRET_KEY BUCKET [--force-trailer]
Prints one JSON line {"boto3": ..., "checks": [...]} and exits 0, or raises.
"""

import base64
import hashlib
import io
import json
import os
import sys
import tempfile
import urllib.request
import zlib

import boto3
import botocore
from botocore.config import Config
from botocore.exceptions import ClientError


def main():
    endpoint, ak, sk, bucket = sys.argv[1:5]
    force_trailer = "--force-trailer" in sys.argv[5:]
    if force_trailer:
        import botocore.httpchecksum as hc
        if not hasattr(hc, "_apply_request_trailer_checksum"):
            raise SystemExit("this botocore has no trailer checksums")
        real = hc.urlparse

        class _Https:
            def __init__(self, url):
                self._p = real(url)

            def __getattr__(self, name):
                return "https" if name == "scheme" else getattr(self._p, name)

        hc.urlparse = _Https  # only the "use a trailer?" decision reads it
    checks = []
    s3 = boto3.session.Session().client(
        "s3", endpoint_url=endpoint, aws_access_key_id=ak, aws_secret_access_key=sk, region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}))

    def check(name, cond, detail=""):
        if not cond:
            raise AssertionError("%s failed %s" % (name, detail))
        checks.append(name)

    s3.create_bucket(Bucket=bucket)
    small = os.urandom(1000)
    s3.put_object(Bucket=bucket, Key="small", Body=small)
    got = s3.get_object(Bucket=bucket, Key="small")
    check("put_get_small", got["Body"].read() == small)

    crc = base64.b64encode((zlib.crc32(small) & 0xFFFFFFFF).to_bytes(4, "big")).decode()
    head = s3.head_object(Bucket=bucket, Key="small", ChecksumMode="ENABLED")
    returned = head.get("ChecksumCRC32")
    check("checksum_not_wrong", returned in (None, crc), returned)

    s3.put_object(Bucket=bucket, Key="sha256", Body=small, ChecksumAlgorithm="SHA256")
    head = s3.head_object(Bucket=bucket, Key="sha256", ChecksumMode="ENABLED")
    want = base64.b64encode(hashlib.sha256(small).digest()).decode()
    check("explicit_sha256", head.get("ChecksumSHA256") in (None, want), head.get("ChecksumSHA256"))

    # Streaming body from a file object (non-bytes).
    s3.put_object(Bucket=bucket, Key="stream", Body=io.BytesIO(small * 50))
    check("put_fileobj", s3.get_object(Bucket=bucket, Key="stream")["Body"].read() == small * 50)

    rng = s3.get_object(Bucket=bucket, Key="small", Range="bytes=100-199")
    check("range", rng["Body"].read() == small[100:200] and rng["ContentRange"] == "bytes 100-199/1000")

    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "src")
        data = os.urandom(21 * 1024 * 1024 + 11)
        with open(src, "wb") as f:
            f.write(data)
        from boto3.s3.transfer import TransferConfig
        cfg = TransferConfig(multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024,
                             max_concurrency=4)
        s3.upload_file(src, bucket, "multi", Config=cfg)
        dst = os.path.join(d, "dst")
        s3.download_file(bucket, "multi", dst, Config=cfg)
        with open(dst, "rb") as f:
            check("multipart_roundtrip", f.read() == data)
        head = s3.head_object(Bucket=bucket, Key="multi")
        check("multipart_etag", head["ETag"].strip('"').endswith("-5"), head["ETag"])

    s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "small"})
    check("copy", s3.get_object(Bucket=bucket, Key="copy")["Body"].read() == small)

    keys = ["list/%02d" % i for i in range(12)] + ["list/sub/x", "list/odd key+%"]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=b"")
    pages = list(s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix="list/", Delimiter="/", PaginationConfig={"PageSize": 5}))
    listed = [o["Key"] for p in pages for o in p.get("Contents", [])]
    prefixes = [c["Prefix"] for p in pages for c in p.get("CommonPrefixes", [])]
    check("list", listed == sorted(k for k in keys if "/sub/" not in k) and prefixes == ["list/sub/"],
          (listed, prefixes))

    res = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})
    check("delete_objects", sorted(x["Key"] for x in res.get("Deleted", [])) == sorted(keys), res)

    # SigV4 presigning must be asked for: with a custom endpoint in us-east-1 botocore presigns
    # with SigV2 by default (test_s3_objects.py covers that form separately).
    v4 = boto3.session.Session().client(
        "s3", endpoint_url=endpoint, aws_access_key_id=ak, aws_secret_access_key=sk, region_name="us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
    url = v4.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "small"}, ExpiresIn=60)
    check("presigned_v4", "X-Amz-Signature=" in url and urllib.request.urlopen(url, timeout=30).read() == small)

    try:
        s3.get_object(Bucket=bucket, Key="missing")
        check("nosuchkey", False)
    except ClientError as e:
        check("nosuchkey", e.response["Error"]["Code"] == "NoSuchKey")

    for k in ("small", "sha256", "stream", "multi", "copy"):
        s3.delete_object(Bucket=bucket, Key=k)
    s3.delete_bucket(Bucket=bucket)
    print(json.dumps({"boto3": boto3.__version__, "botocore": botocore.__version__,
                      "force_trailer": force_trailer, "checks": checks}))


if __name__ == "__main__":
    main()
