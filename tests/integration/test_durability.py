"""What survives: a clean restart keeps every object and in-progress upload; kill -9 in the
middle of an upload leaves no half-written or half-listed object; concurrent writers of one key
leave exactly one of the two versions."""

import hashlib
import os
import socket
import threading
import time

import pytest
from botocore.exceptions import ClientError

import kiln_harness as kh

MIB = 1024 * 1024


def test_restart_keeps_everything(kiln_factory):
    srv = kiln_factory("restart")
    s3 = srv.client("s3")
    s3.create_bucket(Bucket="keep")
    s3.create_bucket(Bucket="keep-empty")
    objects = {}
    for i, size in enumerate([0, 1, 100, 4096, 65537, 1 * MIB + 3, 3 * MIB]):
        key = "obj/%02d" % i
        objects[key] = os.urandom(size)
        s3.put_object(Bucket="keep", Key=key, Body=objects[key], Metadata={"i": str(i)}, ContentType="x/%d" % i)
    parts = [os.urandom(5 * MIB), os.urandom(5 * MIB), os.urandom(777)]
    uid = s3.create_multipart_upload(Bucket="keep", Key="mp/done")["UploadId"]
    etags = [s3.upload_part(Bucket="keep", Key="mp/done", UploadId=uid, PartNumber=n + 1, Body=p)["ETag"]
             for n, p in enumerate(parts)]
    s3.complete_multipart_upload(Bucket="keep", Key="mp/done", UploadId=uid, MultipartUpload={
        "Parts": [{"PartNumber": n + 1, "ETag": e} for n, e in enumerate(etags)]})
    objects["mp/done"] = b"".join(parts)
    # An upload in progress across the restart.
    pending = s3.create_multipart_upload(Bucket="keep", Key="mp/pending")["UploadId"]
    p1 = os.urandom(5 * MIB)
    e1 = s3.upload_part(Bucket="keep", Key="mp/pending", UploadId=pending, PartNumber=1, Body=p1)["ETag"]
    heads_before = {k: s3.head_object(Bucket="keep", Key=k) for k in objects}

    srv.restart()
    s3 = srv.client("s3")

    assert sorted(b["Name"] for b in s3.list_buckets()["Buckets"]) == ["keep", "keep-empty"]
    listed = {o["Key"]: o for o in s3.list_objects_v2(Bucket="keep")["Contents"]}
    assert set(listed) == set(objects)
    for k, data in objects.items():
        got = s3.get_object(Bucket="keep", Key=k)
        assert got["Body"].read() == data, k
        before = heads_before[k]
        assert got["ETag"] == before["ETag"] and got["LastModified"] == before["LastModified"]
        assert got["Metadata"] == before["Metadata"] and got["ContentType"] == before["ContentType"]
        assert listed[k]["Size"] == len(data)
    uploads = s3.list_multipart_uploads(Bucket="keep")["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [("mp/pending", pending)]
    p2 = os.urandom(1000)
    e2 = s3.upload_part(Bucket="keep", Key="mp/pending", UploadId=pending, PartNumber=2, Body=p2)["ETag"]
    s3.complete_multipart_upload(Bucket="keep", Key="mp/pending", UploadId=pending, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    assert s3.get_object(Bucket="keep", Key="mp/pending")["Body"].read() == p1 + p2


def _start_partial_put(srv, path, total, sent_bytes, extra_headers=None):
    """Opens a signed PUT declaring `total` bytes (UNSIGNED-PAYLOAD), sends `sent_bytes`, returns the socket."""
    url = srv.endpoint + path
    hdrs = {"Content-Length": str(total)}
    hdrs.update(extra_headers or {})
    hdrs, _, _ = kh.sign_request("PUT", url, hdrs, srv.creds(), "s3", payload_hash="UNSIGNED-PAYLOAD")
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    head = "PUT %s HTTP/1.1\r\n" % path + "".join("%s: %s\r\n" % kv for kv in hdrs.items()) + "\r\n"
    s.sendall(head.encode())
    chunk = os.urandom(MIB)
    left = sent_bytes
    while left:
        n = min(left, len(chunk))
        s.sendall(chunk[:n])
        left -= n
    return s


def test_kill9_mid_upload_leaves_no_partial_object(kiln_factory):
    srv = kiln_factory("kill9")
    s3 = srv.client("s3")
    s3.create_bucket(Bucket="crash")
    old = os.urandom(2 * MIB + 5)
    s3.put_object(Bucket="crash", Key="overwritten", Body=old)

    s_new = _start_partial_put(srv, "/crash/new-object", 200 * MIB, 40 * MIB)
    s_over = _start_partial_put(srv, "/crash/overwritten", 100 * MIB, 30 * MIB)
    # A multipart upload with part 1 done and part 2 half sent.
    uid = s3.create_multipart_upload(Bucket="crash", Key="mp")["UploadId"]
    e1 = s3.upload_part(Bucket="crash", Key="mp", UploadId=uid, PartNumber=1, Body=os.urandom(5 * MIB))["ETag"]
    s_part = _start_partial_put(srv, "/crash/mp?partNumber=2&uploadId=%s" % uid, 50 * MIB, 20 * MIB)
    time.sleep(0.5)  # let the server stream some of it to disk
    srv.kill()
    for s in (s_new, s_over, s_part):
        s.close()
    srv.start()
    s3 = srv.client("s3")

    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="crash").get("Contents", [])]
    assert keys == ["overwritten"]
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket="crash", Key="new-object")
    assert e.value.response["Error"]["Code"] == "404"
    assert s3.get_object(Bucket="crash", Key="overwritten")["Body"].read() == old
    # The upload may survive, but only with its complete part 1.
    try:
        parts = s3.list_parts(Bucket="crash", Key="mp", UploadId=uid).get("Parts", [])
        assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in parts] == [(1, e1, 5 * MIB)]
    except ClientError as exc:
        assert exc.response["Error"]["Code"] == "NoSuchUpload"
    # And the store is fully usable.
    s3.put_object(Bucket="crash", Key="after", Body=b"ok")
    assert s3.get_object(Bucket="crash", Key="after")["Body"].read() == b"ok"


def test_truncated_body_then_close_creates_nothing(kiln, s3, bucket):
    s = _start_partial_put(kiln, "/%s/truncated" % bucket, 10 * MIB, 1 * MIB)
    s.close()
    uid = s3.create_multipart_upload(Bucket=bucket, Key="tmp")["UploadId"]
    s = _start_partial_put(kiln, "/%s/tmp?partNumber=1&uploadId=%s" % (bucket, uid), 10 * MIB, 3 * MIB)
    s.close()
    deadline = time.time() + 10
    while True:
        try:
            s3.head_object(Bucket=bucket, Key="truncated")
            pytest.fail("a truncated PUT created the object")
        except ClientError as e:
            assert e.response["Error"]["Code"] == "404"
        parts = s3.list_parts(Bucket=bucket, Key="tmp", UploadId=uid).get("Parts", [])
        assert parts == [], "a truncated UploadPart was stored: %s" % parts
        if time.time() > deadline:
            break
        time.sleep(1)
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket)


def test_concurrent_writers_one_key(kiln, s3, bucket):
    size = 24 * MIB
    a = os.urandom(size)
    b = os.urandom(size)
    versions = {hashlib.sha256(a).hexdigest(): "A", hashlib.sha256(b).hexdigest(): "B"}
    s3.put_object(Bucket=bucket, Key="hot", Body=a)
    read_results = []
    stop = threading.Event()
    errors = []

    def writer(data):
        try:
            c = kiln.client("s3")
            for _ in range(3):
                c.put_object(Bucket=bucket, Key="hot", Body=data)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def reader():
        c = kiln.client("s3")
        while not stop.is_set():
            body = c.get_object(Bucket=bucket, Key="hot")["Body"].read()
            read_results.append(hashlib.sha256(body).hexdigest())

    threads = [threading.Thread(target=writer, args=(d,)) for d in (a, b)]
    rt = threading.Thread(target=reader)
    rt.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    rt.join()
    assert not errors, errors
    final = hashlib.sha256(s3.get_object(Bucket=bucket, Key="hot")["Body"].read()).hexdigest()
    assert final in versions
    head = s3.head_object(Bucket=bucket, Key="hot")
    assert head["ETag"].strip('"') == hashlib.md5(a if versions[final] == "A" else b).hexdigest()
    assert read_results and all(r in versions for r in read_results), "a reader saw a torn object"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["hot"]


def test_concurrent_multipart_and_put_one_key(kiln, s3, bucket):
    """A multipart completion racing a single PUT of the same key: one whole version wins."""
    parts = [os.urandom(5 * MIB), os.urandom(5 * MIB)]
    single = os.urandom(10 * MIB)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="race")["UploadId"]
    etags = [s3.upload_part(Bucket=bucket, Key="race", UploadId=uid, PartNumber=i + 1, Body=p)["ETag"]
             for i, p in enumerate(parts)]
    barrier = threading.Barrier(2)

    def complete():
        barrier.wait()
        kiln.client("s3").complete_multipart_upload(Bucket=bucket, Key="race", UploadId=uid, MultipartUpload={
            "Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]})

    def put():
        barrier.wait()
        kiln.client("s3").put_object(Bucket=bucket, Key="race", Body=single)

    ts = [threading.Thread(target=complete), threading.Thread(target=put)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    body = s3.get_object(Bucket=bucket, Key="race")["Body"].read()
    assert body in (single, b"".join(parts))
