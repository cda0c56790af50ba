"""300 MB through `aws s3 cp` (multipart, parallel ranged downloads) and boto3
upload_file/download_file, checked by SHA-256."""

import os

import pytest

import kiln_harness as kh

SIZE = 300 * 1024 * 1024


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("big") / "300mb.bin")
    digest = kh.make_random_file(path, SIZE)
    yield path, digest
    os.unlink(path)


@pytest.mark.slow
def test_aws_cli_300mb(aws, s3, bucket, big_file, tmp_path):
    path, digest = big_file
    aws("s3", "cp", path, "s3://%s/big/cli.bin" % bucket, timeout=600)
    head = s3.head_object(Bucket=bucket, Key="big/cli.bin")
    assert head["ContentLength"] == SIZE
    assert head["ETag"].strip('"').endswith("-38"), head["ETag"]  # 8 MiB parts
    out = tmp_path / "cli.out"
    aws("s3", "cp", "s3://%s/big/cli.bin" % bucket, out, timeout=600)
    assert kh.sha256_file(str(out)) == digest
    out.unlink()
    s3.delete_object(Bucket=bucket, Key="big/cli.bin")


@pytest.mark.slow
def test_boto3_transfer_300mb(kiln, s3, bucket, big_file, tmp_path):
    from boto3.s3.transfer import TransferConfig
    path, digest = big_file
    cfg = TransferConfig(multipart_threshold=8 * 1024 * 1024, multipart_chunksize=16 * 1024 * 1024,
                         max_concurrency=8)
    s3.upload_file(path, bucket, "big/boto3.bin", Config=cfg)
    head = s3.head_object(Bucket=bucket, Key="big/boto3.bin")
    assert head["ContentLength"] == SIZE and head["ETag"].strip('"').endswith("-19")
    out = str(tmp_path / "boto3.out")
    s3.download_file(bucket, "big/boto3.bin", out, Config=cfg)
    assert kh.sha256_file(out) == digest
    os.unlink(out)
    # A ranged read in the middle matches the file.
    with open(path, "rb") as f:
        f.seek(123_456_789)
        want = f.read(1000)
    got = s3.get_object(Bucket=bucket, Key="big/boto3.bin", Range="bytes=123456789-123457788")["Body"].read()
    assert got == want
    s3.delete_object(Bucket=bucket, Key="big/boto3.bin")
