"""The AWS CLI's high-level `s3` commands and a few `s3api` calls against Kiln."""

import json
import os

import kiln_harness as kh


def test_mb_cp_ls_sync_rm_rb(aws, tmp_path, s3):
    b = "cli-bucket-basic"
    aws("s3", "mb", "s3://%s" % b)
    ls = aws("s3", "ls").stdout
    assert b in ls

    src = tmp_path / "src"
    (src / "sub" / "deeper").mkdir(parents=True)
    files = {
        "a.txt": b"alpha\n",
        "sub/b.bin": os.urandom(70_000),
        "sub/deeper/c with space.txt": b"gamma",
        "big.bin": os.urandom(9 * 1024 * 1024 + 17),  # above the CLI's 8 MiB multipart threshold
        "empty": b"",
    }
    for rel, data in files.items():
        (src / rel).write_bytes(data)

    aws("s3", "cp", src / "a.txt", "s3://%s/single/a.txt" % b)
    assert s3.get_object(Bucket=b, Key="single/a.txt")["Body"].read() == files["a.txt"]

    aws("s3", "sync", src, "s3://%s/synced" % b)
    listed = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket=b, Prefix="synced/")["Contents"]}
    assert listed == {"synced/" + k: len(v) for k, v in files.items()}
    head = s3.head_object(Bucket=b, Key="synced/big.bin")
    assert head["ETag"].strip('"').endswith("-2"), head["ETag"]

    # A second sync uploads nothing.
    again = aws("s3", "sync", src, "s3://%s/synced" % b).stdout
    assert "upload:" not in again, again

    out = aws("s3", "ls", "s3://%s/synced/" % b).stdout
    assert "PRE sub/" in out and "a.txt" in out and "big.bin" in out
    rec = aws("s3", "ls", "--recursive", "s3://%s/synced/" % b).stdout
    assert "synced/sub/deeper/c with space.txt" in rec

    dst = tmp_path / "dst"
    aws("s3", "sync", "s3://%s/synced" % b, dst)
    for rel, data in files.items():
        assert (dst / rel).read_bytes() == data, rel

    aws("s3", "cp", "s3://%s/synced/big.bin" % b, tmp_path / "big.copy")
    assert (tmp_path / "big.copy").read_bytes() == files["big.bin"]

    aws("s3", "rm", "s3://%s/single/a.txt" % b)
    assert "Contents" not in s3.list_objects_v2(Bucket=b, Prefix="single/")
    aws("s3", "rm", "--recursive", "s3://%s/synced/sub" % b)
    left = {o["Key"] for o in s3.list_objects_v2(Bucket=b)["Contents"]}
    assert left == {"synced/a.txt", "synced/big.bin", "synced/empty"}

    # rb refuses a non-empty bucket; rb --force empties and removes it.
    r = aws("s3", "rb", "s3://%s" % b, check=False)
    assert r.returncode != 0 and "BucketNotEmpty" in r.stderr, r.stderr
    aws("s3", "rb", "--force", "s3://%s" % b)
    assert b not in aws("s3", "ls").stdout


def test_s3api_calls(aws, tmp_path):
    b = "cli-bucket-s3api"
    aws("s3api", "create-bucket", "--bucket", b)
    r = aws("s3api", "create-bucket", "--bucket", b, check=False)
    assert r.returncode != 0 and "BucketAlreadyOwnedByYou" in r.stderr, r.stderr
    aws("s3api", "head-bucket", "--bucket", b)
    body = tmp_path / "body"
    body.write_bytes(b"0123456789")
    put = json.loads(aws("s3api", "put-object", "--bucket", b, "--key", "dir/k", "--body", body,
                         "--content-type", "text/x-kiln", "--metadata", "color=blue").stdout)
    assert put["ETag"] == '"781e5e245d69b566979b86e28d23f2c7"'  # md5("0123456789")
    head = json.loads(aws("s3api", "head-object", "--bucket", b, "--key", "dir/k").stdout)
    assert head["ContentLength"] == 10
    assert head["ContentType"] == "text/x-kiln"
    assert head["Metadata"] == {"color": "blue"}
    out = tmp_path / "out"
    got = json.loads(aws("s3api", "get-object", "--bucket", b, "--key", "dir/k", "--range", "bytes=2-4",
                         out).stdout)
    assert out.read_bytes() == b"234"
    assert got["ContentRange"] == "bytes 2-4/10"
    lst = json.loads(aws("s3api", "list-objects-v2", "--bucket", b, "--delimiter", "/").stdout)
    assert [p["Prefix"] for p in lst["CommonPrefixes"]] == ["dir/"]
    loc = json.loads(aws("s3api", "get-bucket-location", "--bucket", b).stdout)
    assert loc.get("LocationConstraint") in (None, "")
    r = aws("s3api", "get-object", "--bucket", b, "--key", "missing", tmp_path / "x", check=False)
    assert r.returncode != 0 and "NoSuchKey" in r.stderr, r.stderr
    aws("s3api", "delete-object", "--bucket", b, "--key", "dir/k")
    aws("s3api", "delete-bucket", "--bucket", b)
    r = aws("s3api", "head-bucket", "--bucket", b, check=False)
    assert r.returncode != 0 and "404" in r.stderr, r.stderr


def test_presign_command(aws, s3, bucket):
    s3.put_object(Bucket=bucket, Key="p/obj", Body=b"presigned via cli")
    url = aws("s3", "presign", "s3://%s/p/obj" % bucket, "--expires-in", "300").stdout.strip()
    status, _, body = kh.http_request("GET", url)
    assert status == 200 and body == b"presigned via cli"
