"""Keys that look like paths are just keys: they round-trip literally and nothing is written
outside the data dir."""

import hashlib
import os
import urllib.parse

import pytest

import kiln_harness as kh

TRICKY = [
    "../../etc/passwd", "a//b/./c", "..", ".", "x/../../y", "./x", "a/../b", "/leading-slash",
    "../../../../../../../../../../tmp/kiln-escape-passwd", "..\\..\\windows\\passwd",
    "with space", "ünïcødé/文件", "a+b", "100%", "%2e%2e/%2e%2e/passwd", "trailing/", "a/./../passwd",
    "k" * 1024,
]


def _files_named(root, names):
    hits = []
    for d, _, files in os.walk(root):
        for f in files:
            if f in names:
                hits.append(os.path.join(d, f))
    return hits


@pytest.fixture
def deep_server(kiln_factory, tmp_path):
    # A deep data dir: any escape of a few levels still lands under tmp_path, where we can see it.
    return kiln_factory("l1/l2/l3/l4/l5/l6")


def test_traversal_keys_are_literal(deep_server, tmp_path):
    with open("/etc/passwd", "rb") as f:
        passwd_before = hashlib.sha256(f.read()).hexdigest()
    before = set(_files_named(str(tmp_path), {"passwd", "y", "b", "c", "kiln-escape-passwd"}))
    s3 = deep_server.client("s3")
    s3.create_bucket(Bucket="tricky")
    for i, k in enumerate(TRICKY):
        s3.put_object(Bucket="tricky", Key=k, Body=("body-%d:%s" % (i, k)).encode())
    for i, k in enumerate(TRICKY):
        assert s3.get_object(Bucket="tricky", Key=k)["Body"].read() == ("body-%d:%s" % (i, k)).encode(), k
        assert s3.head_object(Bucket="tricky", Key=k)["ContentLength"] == len(("body-%d:%s" % (i, k)).encode())
    listed = [o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(Bucket="tricky")
              for o in p.get("Contents", [])]
    assert listed == sorted(TRICKY, key=lambda k: k.encode())
    # Same through the v1 listing without encoding-type (raw) for the path-like ones.
    status, _, body = kh.signed_request(deep_server, "GET", "/tricky?prefix=..")
    assert status == 200
    assert kh.xml_find(body, "Key") == sorted([k for k in TRICKY if k.startswith("..")], key=lambda k: k.encode())

    # Raw requests with exactly these paths on the wire.
    status, _, body = kh.signed_request(deep_server, "GET", "/tricky/../../etc/passwd")
    assert status == 200 and body == b"body-0:../../etc/passwd"
    status, _, body = kh.signed_request(deep_server, "GET", "/tricky/%2E%2E/%2E%2E/etc/passwd")
    assert status == 200 and body == b"body-0:../../etc/passwd"
    status, _, _ = kh.signed_request(deep_server, "PUT", "/tricky/../../../../../../../../../../../etc/kiln-raw",
                                     body=b"raw")
    assert status == 200
    assert s3.get_object(Bucket="tricky", Key="../../../../../../../../../../../etc/kiln-raw")["Body"].read() == b"raw"
    assert not os.path.exists("/etc/kiln-raw")

    # Deleting works on the literal key only.
    s3.delete_object(Bucket="tricky", Key="x/../../y")
    assert s3.get_object(Bucket="tricky", Key="..")["Body"].read().startswith(b"body-2")

    after = set(_files_named(str(tmp_path), {"passwd", "y", "b", "c", "kiln-escape-passwd"}))
    assert after == before, "files appeared outside the object store's naming: %s" % (after - before)
    assert not os.path.exists("/tmp/kiln-escape-passwd")
    with open("/etc/passwd", "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == passwd_before
    # Everything the server wrote is inside its data dir (plus our log/config files beside it).
    data_dir = deep_server.data_dir
    for d, _, files in os.walk(str(tmp_path)):
        for f in files:
            p = os.path.join(d, f)
            if p.startswith(data_dir + os.sep) or p.startswith(data_dir.rstrip("/") + "."):
                continue
            pytest.fail("unexpected file outside the data dir: %s" % p)


def test_key_too_long(kiln, s3, bucket):
    from botocore.exceptions import ClientError
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="k" * 1025, Body=b"x")
    assert e.value.response["Error"]["Code"] in ("KeyTooLongError", "InvalidArgument")


def test_bucket_names_cannot_traverse(kiln):
    for path in ("/..", "/../x", "/%2E%2E/x", "/./x"):
        status, _, body = kh.signed_request(kiln, "PUT", path, body=b"")
        assert status >= 400, (path, body)
